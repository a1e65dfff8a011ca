//! The plugin SDK against the runtime-side connection, both for real, over socketpairs
//! and over a listening unix socket in a temporary directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use petrel_nri::adaptation::{
    plugin_socketpair, ConnError, ConnOptions, PluginConn, Registration, RuntimeHandler,
};
use petrel_nri::api::{self, Event, EventMask};
use petrel_nri::mux::MuxError;
use petrel_nri::stub::{Backoff, PluginError, Stub, StubError};
use petrel_nri::ttrpc::Status;
use petrel_nri::RpcError;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// Every test must finish quickly: a hang is a failure, not a stuck CI.
async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(15), f)
        .await
        .expect("test took too long")
}

/// The runtime's handler of plugin-initiated updates: records them, fails the updates
/// of containers whose id starts with "fail".
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(Registration, api::UpdateContainersRequest)>>,
}

impl RuntimeHandler for Recorder {
    fn update_containers(
        &self,
        plugin: &Registration,
        req: api::UpdateContainersRequest,
    ) -> impl Future<Output = Result<api::UpdateContainersResponse, Status>> + Send {
        let failed = req
            .update
            .iter()
            .filter(|u| u.container_id.starts_with("fail"))
            .cloned()
            .collect();
        self.seen.lock().unwrap().push((plugin.clone(), req));
        async move { Ok(api::UpdateContainersResponse { failed }) }
    }
}

/// What the test plugin saw, sent to the test as it happens.
struct Seen {
    tx: mpsc::UnboundedSender<String>,
}

impl Seen {
    fn new() -> (Seen, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Seen { tx }, rx)
    }
    fn note(&self, what: impl Into<String>) {
        let _ = self.tx.send(what.into());
    }
}

fn pod(id: &str) -> api::PodSandbox {
    api::PodSandbox {
        id: id.into(),
        name: format!("{id}-name"),
        namespace: "default".into(),
        ..Default::default()
    }
}

fn container(id: &str, pod: &str) -> api::Container {
    api::Container {
        id: id.into(),
        pod_sandbox_id: pod.into(),
        name: format!("{id}-name"),
        state: api::ContainerState::ContainerRunning as i32,
        ..Default::default()
    }
}

/// The adjustment the test plugin makes: a bit of everything a resource plugin sets.
fn adjustment_for(ctr: &str) -> api::CreateContainerResponse {
    let mut adjust = api::ContainerAdjustment::default();
    adjust
        .annotations
        .insert("test.petrel.dev/adjusted".into(), ctr.into());
    adjust.env.push(api::KeyValue {
        key: "PLUGIN".into(),
        value: "yes".into(),
    });
    adjust.mounts.push(api::Mount {
        destination: "/data".into(),
        r#type: "bind".into(),
        source: "/tmp".into(),
        options: vec!["rbind".into(), "ro".into()],
    });
    adjust.rlimits.push(api::PosixRlimit {
        r#type: "RLIMIT_NOFILE".into(),
        hard: 4096,
        soft: 1024,
    });
    adjust.linux = Some(api::LinuxContainerAdjustment {
        resources: Some(api::LinuxResources {
            cpu: Some(api::LinuxCpu {
                cpus: "0-1".into(),
                shares: Some(api::OptionalUInt64 { value: 512 }),
                ..Default::default()
            }),
            memory: Some(api::LinuxMemory {
                limit: Some(api::OptionalInt64 { value: 64 << 20 }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        oom_score_adj: Some(api::OptionalInt { value: 100 }),
        ..Default::default()
    });
    api::CreateContainerResponse {
        adjust: Some(adjust),
        update: vec![api::ContainerUpdate {
            container_id: "other".into(),
            linux: Some(api::LinuxContainerUpdate {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        cpus: "2-3".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            ignore_failure: true,
        }],
        evict: vec![api::ContainerEviction {
            container_id: "victim".into(),
            reason: "needs its cpus".into(),
        }],
    }
}

/// A plugin subscribed to CreateContainer, StopContainer, StartContainer and
/// RemoveContainer, with configure and synchronize handlers.
fn test_plugin(seen: Seen) -> petrel_nri::stub::StubBuilder<Seen> {
    Stub::builder(seen)
        .name("tester")
        .index("42")
        .on_configure(|s: Arc<Seen>, req: api::ConfigureRequest| async move {
            s.note(format!(
                "configure {} {} {} {}",
                req.config, req.runtime_name, req.runtime_version, req.request_timeout
            ));
            Ok(None)
        })
        .on_synchronize(
            |s: Arc<Seen>, pods: Vec<api::PodSandbox>, ctrs: Vec<api::Container>| async move {
                let in_order = ctrs
                    .iter()
                    .enumerate()
                    .all(|(i, c)| c.id == format!("c{i}"));
                s.note(format!("sync {} {} {in_order}", pods.len(), ctrs.len()));
                Ok(vec![api::ContainerUpdate {
                    container_id: "c7".into(),
                    ..Default::default()
                }])
            },
        )
        .on_create_container(
            |s: Arc<Seen>, req: api::CreateContainerRequest| async move {
                let id = req.container.map(|c| c.id).unwrap_or_default();
                s.note(format!("create {id}"));
                if id == "slow" {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                if id == "refuse" {
                    return Err(PluginError::new("not this one"));
                }
                Ok(adjustment_for(&id))
            },
        )
        .on_start_container(|s: Arc<Seen>, req: api::StartContainerRequest| async move {
            s.note(format!(
                "start {}",
                req.container.map(|c| c.id).unwrap_or_default()
            ));
            Ok(())
        })
        .on_remove_container(
            |s: Arc<Seen>, req: api::RemoveContainerRequest| async move {
                s.note(format!(
                    "remove {} of {}",
                    req.container.map(|c| c.id).unwrap_or_default(),
                    req.pod.map(|p| p.id).unwrap_or_default()
                ));
                Ok(())
            },
        )
        .on_stop_container(|s: Arc<Seen>, req: api::StopContainerRequest| async move {
            s.note(format!(
                "stop {}",
                req.container.map(|c| c.id).unwrap_or_default()
            ));
            Ok(api::StopContainerResponse::default())
        })
        .on_shutdown(|s: Arc<Seen>| async move {
            s.note("shutdown");
            Ok(())
        })
}

fn expected_mask() -> EventMask {
    EventMask::of(Event::CreateContainer)
        | EventMask::of(Event::StartContainer)
        | EventMask::of(Event::RemoveContainer)
        | EventMask::of(Event::StopContainer)
}

fn fast_options() -> ConnOptions {
    ConnOptions {
        registration_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_millis(300),
        // Small Synchronize messages, so that even a few containers are split.
        sync_message_bytes: 4096,
    }
}

/// Plugin on one end of a socketpair (as a launched plugin would be), runtime on the
/// other: registration, configuration, the derived mask, and an adjustment.
#[tokio::test]
async fn socketpair_registration_configure_and_adjustment() {
    within(async {
        let (runtime_end, plugin_fd) = plugin_socketpair().unwrap();
        let plugin_std = std::os::unix::net::UnixStream::from(plugin_fd);
        plugin_std.set_nonblocking(true).unwrap();
        let plugin_end = UnixStream::from_std(plugin_std).unwrap();

        let (seen, mut events) = Seen::new();
        let stub = test_plugin(seen).connection(plugin_end).build().unwrap();
        assert_eq!(stub.events(), expected_mask());
        let handle = stub.handle();
        let plugin = tokio::spawn(stub.run());

        let handler = Arc::new(Recorder::default());
        let conn = PluginConn::accept(runtime_end, handler, fast_options())
            .await
            .unwrap();
        assert_eq!(conn.registration().name, "tester");
        assert_eq!(conn.registration().index, "42");
        assert_eq!(conn.registration().nri_version, api::NRI_VERSION);
        assert_eq!(conn.peer_pid(), Some(std::process::id() as i32));

        let mask = conn
            .configure("some: config", "petrel", "0.1.0")
            .await
            .unwrap();
        assert_eq!(mask, expected_mask());
        assert_eq!(mask.0, 0x8 | 0x20 | 0x400 | 0x200);
        assert!(conn.subscribed(Event::CreateContainer));
        assert!(!conn.subscribed(Event::RunPodSandbox));
        assert_eq!(
            events.recv().await.unwrap(),
            "configure some: config petrel 0.1.0 300"
        );
        let info = handle.connected().await;
        assert_eq!(info.runtime_name, "petrel");
        assert_eq!(info.request_timeout, Duration::from_millis(300));
        assert_eq!(info.events, expected_mask());

        // 200 containers in 4 KiB messages: many chunks, one handler call.
        let pods = vec![pod("p1")];
        let ctrs: Vec<api::Container> = (0..200)
            .map(|i| container(&format!("c{i}"), "p1"))
            .collect();
        let updates = conn.synchronize(&pods, &ctrs).await.unwrap();
        assert_eq!(updates.len(), 1);
        assert_eq!(events.recv().await.unwrap(), "sync 1 200 true");

        let req = api::CreateContainerRequest {
            pod: Some(pod("p1")),
            container: Some(container("c1", "p1")),
        };
        let resp = conn.create_container(&req).await.unwrap();
        assert_eq!(resp, adjustment_for("c1"));
        assert_eq!(events.recv().await.unwrap(), "create c1");

        // A handler's error reaches the runtime as the call's status.
        let req = api::CreateContainerRequest {
            pod: Some(pod("p1")),
            container: Some(container("refuse", "p1")),
        };
        match conn.create_container(&req).await {
            Err(ConnError::Rpc(RpcError::Status { message, .. })) => {
                assert_eq!(message, "not this one")
            }
            other => panic!("unexpected {other:?}"),
        }

        // Shutdown reaches the handler; closing the connection then ends an inherited
        // plugin cleanly.
        conn.shutdown().await.unwrap();
        assert_eq!(events.recv().await.unwrap(), "create refuse");
        assert_eq!(events.recv().await.unwrap(), "shutdown");
        conn.close().await;
        assert_eq!(plugin.await.unwrap(), Ok(()));
    })
    .await;
}

/// An external plugin dialling a listening socket; 1000 containers that are too big
/// for one message arrive chunked and are reassembled for the handler.
#[tokio::test]
async fn listening_socket_sync_of_1000_containers_is_chunked_and_reassembled() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let listener = UnixListener::bind(&path).unwrap();

        let (seen, mut events) = Seen::new();
        let stub = test_plugin(seen).socket_path(&path).build().unwrap();
        let handle = stub.handle();
        let plugin = tokio::spawn(stub.run());

        let (stream, _) = listener.accept().await.unwrap();
        let conn = PluginConn::accept(
            stream,
            Arc::new(Recorder::default()),
            ConnOptions::default(),
        )
        .await
        .unwrap();
        conn.configure("", "petrel", "0.1.0").await.unwrap();
        assert!(events.recv().await.unwrap().starts_with("configure"));

        let pods: Vec<api::PodSandbox> = (0..100).map(|i| pod(&format!("p{i}"))).collect();
        let containers: Vec<api::Container> = (0..1000)
            .map(|i| {
                let mut c = container(&format!("c{i}"), &format!("p{}", i % 100));
                // ~5 KiB each: 5 MB in all, more than one ttRPC message may carry.
                c.annotations
                    .insert("test.petrel.dev/padding".into(), "x".repeat(5 * 1024));
                c
            })
            .collect();
        let whole = api::SynchronizeRequest {
            pods: pods.clone(),
            containers: containers.clone(),
            more: false,
        };
        use prost::Message;
        assert!(whole.encoded_len() > petrel_nri::ttrpc::MAX_MESSAGE_LEN);

        let started = Instant::now();
        let updates = conn.synchronize(&pods, &containers).await.unwrap();
        let took = started.elapsed();
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0].container_id, "c7");
        assert_eq!(events.recv().await.unwrap(), "sync 100 1000 true");
        eprintln!("synchronize of 100 pods and 1000 containers (5 MB): {took:?}");

        handle.stop();
        plugin.await.unwrap().unwrap();
    })
    .await;
}

/// Events containerd 1.7 sends through StateChange reach the handlers the dedicated
/// RPCs reach; events the plugin did not register are ignored.
#[tokio::test]
async fn state_change_reaches_the_same_handlers_as_dedicated_rpcs() {
    within(async {
        let (a, b) = UnixStream::pair().unwrap();
        let (seen, mut events) = Seen::new();
        let stub = test_plugin(seen).connection(b).build().unwrap();
        let plugin = tokio::spawn(stub.run());
        let conn = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap();
        conn.configure("", "containerd", "1.7.24").await.unwrap();
        events.recv().await.unwrap();

        // Dedicated RPC.
        conn.start_container(&api::StartContainerRequest {
            pod: Some(pod("p")),
            container: Some(container("c-new", "p")),
        })
        .await
        .unwrap();
        assert_eq!(events.recv().await.unwrap(), "start c-new");
        assert!(conn.state_change_events().is_empty());

        // The 1.7 way.
        for (event, id) in [
            (Event::StartContainer, "c-old"),
            (Event::RunPodSandbox, "ignored"),
            (Event::RemoveContainer, "c-old"),
        ] {
            conn.state_change(&api::StateChangeEvent {
                event: event as i32,
                pod: Some(pod("p")),
                container: Some(container(id, "p")),
            })
            .await
            .unwrap();
        }
        assert_eq!(events.recv().await.unwrap(), "start c-old");
        assert_eq!(events.recv().await.unwrap(), "remove c-old of p");
        conn.close().await;
        let _ = plugin.await.unwrap();
        assert!(events.try_recv().is_err(), "RunPodSandbox has no handler");
    })
    .await;
}

/// A plugin asks on its own for updates and an eviction; the runtime's handler gets
/// them with the plugin's identity, and the plugin gets back the failed updates.
#[tokio::test]
async fn plugin_initiated_update_with_eviction() {
    within(async {
        let (a, b) = UnixStream::pair().unwrap();
        let (seen, _events) = Seen::new();
        let stub = test_plugin(seen).connection(b).build().unwrap();
        let handle = stub.handle();
        let plugin = tokio::spawn(stub.run());
        let recorder = Arc::new(Recorder::default());
        let conn = PluginConn::accept(a, recorder.clone(), fast_options())
            .await
            .unwrap();
        assert_eq!(
            handle
                .update_containers(vec![], vec![])
                .await
                .err()
                .filter(|_| handle.runtime_info().is_none()),
            Some(StubError::NotConnected),
            "no updates before the plugin is configured"
        );
        conn.configure("", "petrel", "0.1.0").await.unwrap();
        handle.connected().await;

        let update = |id: &str| api::ContainerUpdate {
            container_id: id.into(),
            linux: Some(api::LinuxContainerUpdate {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        cpus: "3".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            ignore_failure: false,
        };
        let evict = api::ContainerEviction {
            container_id: "c9".into(),
            reason: "pool shrank".into(),
        };
        let failed = handle
            .update_containers(vec![update("c1"), update("fail-c2")], vec![evict.clone()])
            .await
            .unwrap();
        assert_eq!(failed, vec![update("fail-c2")]);
        let seen = recorder.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].0.qualified_name(), "42-tester");
        assert_eq!(seen[0].1.update, vec![update("c1"), update("fail-c2")]);
        assert_eq!(seen[0].1.evict, vec![evict]);
        conn.close().await;
        let _ = plugin.await.unwrap();
    })
    .await;
}

/// A plugin that hangs costs the runtime at most the request timeout per call, and the
/// connection stays usable.
#[tokio::test]
async fn hung_plugin_costs_at_most_the_timeout() {
    within(async {
        let (a, b) = UnixStream::pair().unwrap();
        let (seen, mut events) = Seen::new();
        let stub = test_plugin(seen).connection(b).build().unwrap();
        let plugin = tokio::spawn(stub.run());
        let conn = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap();
        conn.configure("", "petrel", "0.1.0").await.unwrap();
        events.recv().await.unwrap();

        let started = Instant::now();
        let err = conn
            .create_container(&api::CreateContainerRequest {
                pod: Some(pod("p")),
                container: Some(container("slow", "p")),
            })
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(err.is_timeout(), "{err:?}");
        // Not the plugin's 30 s: the timeout, plus whatever a busy host adds.
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{took:?}"
        );

        // Still connected; the next call is answered. (A host that stalls
        // longer than the 300 ms timeout may time it out too: asked again.)
        let stop = api::StopContainerRequest {
            pod: Some(pod("p")),
            container: Some(container("c1", "p")),
        };
        let mut attempts = 0;
        while let Err(e) = conn.stop_container(&stop).await {
            attempts += 1;
            assert!(e.is_timeout() && attempts < 20, "{e:?}");
        }
        assert_eq!(events.recv().await.unwrap(), "create slow");
        assert_eq!(events.recv().await.unwrap(), "stop c1");
        conn.close().await;
        let _ = plugin.await.unwrap();
    })
    .await;
}

/// A peer sending garbage is disconnected with the reason; one that never registers
/// is given up on after the registration timeout.
#[tokio::test]
async fn garbage_or_silence_from_a_plugin_is_refused() {
    within(async {
        // Frame for a connection id that does not exist.
        let (a, mut raw) = UnixStream::pair().unwrap();
        raw.write_all(&[0, 0, 0, 9, 0, 0, 0, 1, 0xFF])
            .await
            .unwrap();
        let err = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ConnError::ClosedBeforeRegistration(MuxError::UnknownConnection(9))
        );

        // Oversized length.
        let (a, mut raw) = UnixStream::pair().unwrap();
        raw.write_all(&[0, 0, 0, 2, 0x7F, 0xFF, 0xFF, 0xFF])
            .await
            .unwrap();
        let err = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ConnError::ClosedBeforeRegistration(MuxError::Oversized { conn: 2, .. })
            ),
            "{err:?}"
        );

        // A valid frame carrying a ttRPC message that is not a valid request envelope
        // is answered with an error, not a crash; then silence times out.
        let (a, mut raw) = UnixStream::pair().unwrap();
        let options = ConnOptions {
            registration_timeout: Duration::from_millis(200),
            ..fast_options()
        };
        let msg =
            petrel_nri::ttrpc::encode_message(1, petrel_nri::ttrpc::TYPE_REQUEST, &[0xFF, 0xFF]);
        raw.write_all(&petrel_nri::mux::encode_frames(2, &msg))
            .await
            .unwrap();
        let started = Instant::now();
        let err = PluginConn::accept(a, Arc::new(Recorder::default()), options)
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ConnError::RegistrationTimeout(Duration::from_millis(200))
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    })
    .await;
}

/// The plugin side refuses garbage from a runtime the same way.
#[tokio::test]
async fn garbage_from_the_runtime_disconnects_the_plugin() {
    within(async {
        let (mut raw, b) = UnixStream::pair().unwrap();
        let (seen, _events) = Seen::new();
        let stub = test_plugin(seen).connection(b).build().unwrap();
        let plugin = tokio::spawn(stub.run());
        raw.write_all(&[0, 0, 0, 0, 0, 0, 0, 0]).await.unwrap();
        let result = plugin.await.unwrap();
        assert!(
            matches!(
                result,
                Err(StubError::Register(RpcError::Disconnected {
                    cause: MuxError::UnknownConnection(0),
                    ..
                }))
            ),
            "{result:?}"
        );
    })
    .await;
}

/// The runtime goes away and comes back on the same socket path: a dialling plugin
/// reconnects (with backoff) and registers again.
#[tokio::test]
async fn dialling_plugin_reconnects_after_runtime_restart() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let listener = UnixListener::bind(&path).unwrap();

        let (seen, mut events) = Seen::new();
        let stub = test_plugin(seen)
            .socket_path(&path)
            .reconnect(Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(400),
            })
            .build()
            .unwrap();
        let handle = stub.handle();
        let plugin = tokio::spawn(stub.run());

        let (stream, _) = listener.accept().await.unwrap();
        let recorder = Arc::new(Recorder::default());
        let conn = PluginConn::accept(stream, recorder.clone(), fast_options())
            .await
            .unwrap();
        conn.configure("first", "petrel", "1").await.unwrap();
        assert!(events.recv().await.unwrap().starts_with("configure first"));

        // Runtime "stops": shutdown, close, socket gone for a while.
        conn.shutdown().await.unwrap();
        conn.close().await;
        drop(listener);
        std::fs::remove_file(&path).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(handle.runtime_info().is_none());

        // Runtime "starts" again.
        let listener = UnixListener::bind(&path).unwrap();
        let started = Instant::now();
        let (stream, _) = listener.accept().await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let conn = PluginConn::accept(stream, recorder.clone(), fast_options())
            .await
            .unwrap();
        assert_eq!(conn.registration().qualified_name(), "42-tester");
        conn.configure("second", "petrel", "2").await.unwrap();
        let mut configured_again = false;
        while let Some(e) = events.recv().await {
            if e.starts_with("configure second") {
                configured_again = true;
                break;
            }
        }
        assert!(configured_again);
        let info = handle.connected().await;
        assert_eq!(info.runtime_version, "2");
        let failed = handle
            .update_containers(
                vec![],
                vec![api::ContainerEviction {
                    container_id: "x".into(),
                    reason: "after restart".into(),
                }],
            )
            .await
            .unwrap();
        assert!(failed.is_empty());
        assert_eq!(recorder.seen.lock().unwrap().len(), 1);

        handle.stop();
        plugin.await.unwrap().unwrap();
    })
    .await;
}

/// A plugin without any event handler is refused at build time (it would be subscribed
/// to nothing, and 0 on the wire means "everything").
#[test]
fn a_plugin_without_handlers_is_refused() {
    let built = Stub::builder(())
        .name("x")
        .index("01")
        .on_synchronize(|_s, _p, _c| async { Ok(vec![]) })
        .build();
    assert!(matches!(built, Err(StubError::NoHandlers)));
}

/// containerd's Go side reads a message header through a 4096-byte buffer and its
/// multiplexer refuses (ENOMEM) a frame larger than the reader's buffer: a large
/// message must start with a frame of at most 4096 bytes, the rest following in its
/// own frame. Checked on the wire with a raw peer playing a plugin.
#[tokio::test]
async fn large_messages_are_framed_for_go_readers() {
    use prost::Message;
    use tokio::io::AsyncReadExt;
    within(async {
        let (a, mut raw) = UnixStream::pair().unwrap();
        // Register by hand: a RegisterPlugin request on connection 2, stream 1.
        let envelope = petrel_nri::ttrpc::Request {
            service: api::RUNTIME_SERVICE.into(),
            method: "RegisterPlugin".into(),
            payload: api::RegisterPluginRequest {
                plugin_name: "raw".into(),
                plugin_idx: "01".into(),
                nri_version: String::new(),
            }
            .encode_to_vec(),
            timeout_nano: 0,
            metadata: vec![],
        };
        let msg = petrel_nri::ttrpc::encode_message(
            1,
            petrel_nri::ttrpc::TYPE_REQUEST,
            &envelope.encode_to_vec(),
        );
        raw.write_all(&petrel_nri::mux::encode_frames(2, &msg))
            .await
            .unwrap();
        let conn = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap();

        let mut big = container("big", "p");
        big.env = (0..500)
            .map(|i| format!("VARIABLE_{i}=some value"))
            .collect();
        let req = api::CreateContainerRequest {
            pod: Some(pod("p")),
            container: Some(big),
        };
        let call = {
            let conn = conn.clone();
            tokio::spawn(async move { conn.create_container(&req).await })
        };

        // Read frames until the request on connection 1 is complete.
        let mut frames: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut plugin_bytes = Vec::new();
        loop {
            let mut hdr = [0u8; 8];
            raw.read_exact(&mut hdr).await.unwrap();
            let id = u32::from_be_bytes(hdr[0..4].try_into().unwrap());
            let len = u32::from_be_bytes(hdr[4..8].try_into().unwrap()) as usize;
            let mut payload = vec![0u8; len];
            raw.read_exact(&mut payload).await.unwrap();
            if id == 1 {
                plugin_bytes.extend_from_slice(&payload);
                frames.push((id, payload));
                let h = petrel_nri::ttrpc::MessageHeader::parse(&plugin_bytes).unwrap();
                if plugin_bytes.len() == 10 + h.length as usize {
                    break;
                }
            }
        }
        assert!(
            plugin_bytes.len() > 8192,
            "message of {} bytes",
            plugin_bytes.len()
        );
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].1.len(), 4096);
        assert_eq!(frames[1].1.len(), plugin_bytes.len() - 4096);
        call.abort();
    })
    .await;
}

/// A configure handler may narrow the subscription, never widen it; a failing
/// configure ends the session with the reason.
#[tokio::test]
async fn configure_handler_narrows_or_fails() {
    within(async {
        // Narrow to StopContainer only.
        let (a, b) = UnixStream::pair().unwrap();
        let (seen, _events) = Seen::new();
        let stub = test_plugin(seen)
            .on_configure(|_s, _req| async { Ok(Some(EventMask::of(Event::StopContainer))) })
            .connection(b)
            .build()
            .unwrap();
        let plugin = tokio::spawn(stub.run());
        let conn = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap();
        let mask = conn.configure("", "petrel", "0").await.unwrap();
        assert_eq!(mask, EventMask::of(Event::StopContainer));
        conn.close().await;
        let _ = plugin.await.unwrap();

        // Asking for an event without a handler fails configuration on both sides.
        let (a, b) = UnixStream::pair().unwrap();
        let (seen, _events) = Seen::new();
        let stub = test_plugin(seen)
            .on_configure(|_s, _req| async { Ok(Some(EventMask::of(Event::RunPodSandbox))) })
            .connection(b)
            .build()
            .unwrap();
        let plugin = tokio::spawn(stub.run());
        let conn = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap();
        let err = conn.configure("", "petrel", "0").await.unwrap_err();
        assert!(
            matches!(err, ConnError::Rpc(RpcError::Status { .. })),
            "{err:?}"
        );
        let result = plugin.await.unwrap();
        assert!(
            matches!(&result, Err(StubError::Configure(r)) if r.contains("RUN_POD_SANDBOX")),
            "{result:?}"
        );
    })
    .await;
}

/// Without reconnection, a plugin that cannot reach the runtime says so.
#[tokio::test]
async fn dialling_a_missing_socket_without_reconnect_fails() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.sock");
        let (seen, _events) = Seen::new();
        let stub = test_plugin(seen)
            .socket_path(&path)
            .no_reconnect()
            .build()
            .unwrap();
        let result = stub.run().await;
        assert!(
            matches!(&result, Err(StubError::Connect { path: p, .. }) if *p == path),
            "{result:?}"
        );
    })
    .await;
}

/// A plugin registering with an invalid index is refused, and told why.
#[tokio::test]
async fn invalid_plugin_identity_is_refused() {
    use prost::Message;
    use tokio::io::AsyncReadExt;
    within(async {
        let (a, mut raw) = UnixStream::pair().unwrap();
        let envelope = petrel_nri::ttrpc::Request {
            service: api::RUNTIME_SERVICE.into(),
            method: "RegisterPlugin".into(),
            payload: api::RegisterPluginRequest {
                plugin_name: "bad/name".into(),
                plugin_idx: "1".into(),
                nri_version: String::new(),
            }
            .encode_to_vec(),
            timeout_nano: 0,
            metadata: vec![],
        };
        let msg = petrel_nri::ttrpc::encode_message(
            1,
            petrel_nri::ttrpc::TYPE_REQUEST,
            &envelope.encode_to_vec(),
        );
        raw.write_all(&petrel_nri::mux::encode_frames(2, &msg))
            .await
            .unwrap();
        let err = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap_err();
        assert!(matches!(err, ConnError::InvalidIdentity(_)), "{err:?}");

        // The refusal was answered before the connection closed.
        let mut rest = Vec::new();
        raw.read_to_end(&mut rest).await.unwrap();
        assert!(rest.len() > 8 + 10, "no answer: {rest:?}");
        let resp = petrel_nri::ttrpc::Response::decode(&rest[18..]).unwrap();
        let status = resp.status.unwrap();
        assert_eq!(status.code, petrel_nri::ttrpc::Code::InvalidArgument as i32);
        assert!(status.message.contains("bad/name"), "{}", status.message);
    })
    .await;
}

/// Dropping the last handle of either end closes the connection: a dropped
/// `PluginConn` ends an inherited plugin, a stopped stub is seen by the runtime.
#[tokio::test]
async fn dropping_either_end_closes_the_connection() {
    within(async {
        let (a, b) = UnixStream::pair().unwrap();
        let (seen, _events) = Seen::new();
        let stub = test_plugin(seen).connection(b).build().unwrap();
        let plugin = tokio::spawn(stub.run());
        let conn = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap();
        conn.configure("", "petrel", "0").await.unwrap();
        drop(conn);
        let result = plugin.await.unwrap();
        assert!(
            matches!(result, Err(StubError::Disconnected(_))),
            "{result:?}"
        );

        let (a, b) = UnixStream::pair().unwrap();
        let (seen, _events) = Seen::new();
        let stub = test_plugin(seen).connection(b).build().unwrap();
        let handle = stub.handle();
        let plugin = tokio::spawn(stub.run());
        let conn = PluginConn::accept(a, Arc::new(Recorder::default()), fast_options())
            .await
            .unwrap();
        conn.configure("", "petrel", "0").await.unwrap();
        handle.connected().await;
        handle.stop();
        assert_eq!(plugin.await.unwrap(), Ok(()));
        assert_eq!(conn.closed().await, MuxError::Eof);
    })
    .await;
}

/// Many calls at once: ttRPC servers (Go's and ours) refuse a stream id lower than one
/// already seen, so ids must reach the wire in order however the calls race.
#[tokio::test]
async fn concurrent_calls_are_all_answered() {
    within(async {
        let (a, b) = UnixStream::pair().unwrap();
        let (seen, _events) = Seen::new();
        let stub = test_plugin(seen).connection(b).build().unwrap();
        let plugin = tokio::spawn(stub.run());
        let conn = PluginConn::accept(
            a,
            Arc::new(Recorder::default()),
            ConnOptions {
                // Ordering is under test, not speed: 200 calls on a loaded machine may take
                // longer than the usual short test timeout.
                request_timeout: Duration::from_secs(10),
                ..fast_options()
            },
        )
        .await
        .unwrap();
        conn.configure("", "petrel", "0").await.unwrap();
        let calls: Vec<_> = (0..200)
            .map(|i| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    let id = format!("c{i}");
                    let req = api::CreateContainerRequest {
                        pod: Some(pod("p")),
                        container: Some(container(&id, "p")),
                    };
                    conn.create_container(&req).await.map(|r| (id, r))
                })
            })
            .collect();
        for call in calls {
            let (id, resp) = call.await.unwrap().unwrap();
            assert_eq!(resp, adjustment_for(&id));
        }
        conn.close().await;
        let _ = plugin.await.unwrap();
    })
    .await;
}
