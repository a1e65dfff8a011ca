//! NRI core against real plugins built on the SDK, over a real socket: admission
//! (Configure, Synchronize), ordering, vetoes, timeouts, updates from
//! Synchronize, disconnection. The host is a recorder standing in for the
//! runtime (the CRI wiring has its own end-to-end tests).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use petrel_nri::adaptation::Registration;
use petrel_nri::api;
use petrel_nri::stub::{Backoff, PluginError, Stub, StubHandle};
use petrel_nri::ttrpc::Status;

use super::config::{NriConfig, PluginOverride};
use super::{Nri, NriHost, NriMetrics};

#[derive(Default)]
struct Recorder {
    pods: Vec<api::PodSandbox>,
    containers: Vec<api::Container>,
    updates: Mutex<Vec<(String, api::UpdateContainersRequest)>>,
}

impl NriHost for Recorder {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        (self.pods.clone(), self.containers.clone())
    }

    fn update_containers(
        &self,
        plugin: &Registration,
        req: api::UpdateContainersRequest,
    ) -> impl std::future::Future<Output = Result<api::UpdateContainersResponse, Status>> + Send
    {
        self.updates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((plugin.qualified_name(), req));
        async { Ok(api::UpdateContainersResponse::default()) }
    }
}

fn config(dir: &Path) -> NriConfig {
    NriConfig {
        plugin_path: dir.join("plugins"),
        plugin_config_path: dir.join("conf.d"),
        socket_path: dir.join("nri/nri.sock"),
        plugin_request_timeout: Duration::from_millis(300),
        ..Default::default()
    }
}

/// Runs `stub` in the background; the handle stops it.
fn spawn<S: Send + Sync + 'static>(stub: Stub<S>) -> StubHandle {
    let h = stub.handle();
    tokio::spawn(async move {
        let _ = stub.run().await;
    });
    h
}

async fn wait_for(nri: &Nri<Recorder>, n: usize) {
    for _ in 0..200 {
        if nri.registry().all().len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{} plugins registered, expected {n}",
        nri.registry().all().len()
    );
}

fn pod(id: &str) -> api::PodSandbox {
    api::PodSandbox {
        id: id.into(),
        name: format!("{id}-name"),
        ..Default::default()
    }
}

#[tokio::test]
async fn plugins_should_be_synchronized_called_in_order_and_allowed_to_veto() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let host = Arc::new(Recorder {
        pods: vec![pod("p0")],
        containers: vec![api::Container {
            id: "c0".into(),
            pod_sandbox_id: "p0".into(),
            ..Default::default()
        }],
        ..Default::default()
    });
    let cfg = config(dir.path());
    let socket = cfg.socket_path.clone();
    let nri = Nri::start(cfg, host.clone(), NriMetrics::default(), "petrel", "test")
        .unwrap_or_else(|e| panic!("{e}"));
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));

    // Plugin 20 refuses pods named "bad-name"; plugin 10 records order and
    // asks, at synchronization, to update the container it was shown.
    let s = seen.clone();
    let first = Stub::builder(())
        .name("first")
        .index("10")
        .socket_path(&socket)
        .reconnect(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
        })
        .on_synchronize(|_s, _pods, containers: Vec<api::Container>| async move {
            Ok(containers
                .iter()
                .map(|c| api::ContainerUpdate {
                    container_id: c.id.clone(),
                    ..Default::default()
                })
                .collect())
        })
        .on_run_pod_sandbox(move |_s, req: api::RunPodSandboxRequest| {
            let s = s.clone();
            async move {
                let name = req.pod.map(|p| p.name).unwrap_or_default();
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("10:{name}"));
                Ok(())
            }
        })
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let s = seen.clone();
    let second = Stub::builder(())
        .name("second")
        .index("20")
        .socket_path(&socket)
        .on_run_pod_sandbox(move |_s, req: api::RunPodSandboxRequest| {
            let s = s.clone();
            async move {
                let name = req.pod.map(|p| p.name).unwrap_or_default();
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!("20:{name}"));
                if name == "bad-name" {
                    return Err(PluginError::new("bad pods are not welcome"));
                }
                Ok(())
            }
        })
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    // The second registers first: order comes from the index, not arrival.
    let h2 = spawn(second);
    wait_for(&nri, 1).await;
    let h1 = spawn(first);
    wait_for(&nri, 2).await;

    let updates = host
        .updates
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    assert_eq!(updates.len(), 1, "{updates:?}");
    assert_eq!(updates[0].0, "10-first");
    assert_eq!(updates[0].1.update[0].container_id, "c0");

    nri.run_pod_sandbox(&pod("ok"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let err = nri
        .run_pod_sandbox(&pod("bad"))
        .await
        .err()
        .map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(
        err.contains("20-second") && err.contains("bad pods are not welcome"),
        "{err}"
    );
    assert_eq!(
        *seen.lock().unwrap_or_else(|p| p.into_inner()),
        ["10:ok-name", "20:ok-name", "10:bad-name", "20:bad-name"]
    );
    let stats = nri.registry().all();
    assert_eq!(
        stats[1]
            .stats
            .errors
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // A plugin that goes away leaves the registry.
    h2.stop();
    wait_for(&nri, 1).await;
    h1.stop();
    wait_for(&nri, 0).await;
    nri.shutdown().await;
}

#[tokio::test]
async fn a_hanging_plugin_should_cost_its_timeout_and_be_cut_off_only_if_fatal() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = config(dir.path());
    cfg.plugins.insert(
        "slow-fatal".into(),
        PluginOverride {
            timeout_fatal: true,
            ..Default::default()
        },
    );
    let socket = cfg.socket_path.clone();
    let nri = Nri::start(
        cfg,
        Arc::new(Recorder::default()),
        NriMetrics::default(),
        "petrel",
        "test",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let hang = |name: &str, idx: &str| {
        Stub::builder(())
            .name(name)
            .index(idx)
            .socket_path(&socket)
            .no_reconnect()
            .on_run_pod_sandbox(|_s, _req: api::RunPodSandboxRequest| async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(())
            })
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let _a = spawn(hang("slow", "10"));
    wait_for(&nri, 1).await;
    let t0 = std::time::Instant::now();
    nri.run_pod_sandbox(&pod("x"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(
        nri.registry().all().len(),
        1,
        "a non-fatal timeout keeps the plugin"
    );

    let _b = spawn(hang("slow-fatal", "20"));
    wait_for(&nri, 2).await;
    let err = nri
        .run_pod_sandbox(&pod("y"))
        .await
        .err()
        .map(|e| e.to_string());
    let err = err.unwrap_or_default();
    assert!(
        err.contains("20-slow-fatal") && err.contains("did not answer"),
        "{err}"
    );
    wait_for(&nri, 1).await;
    nri.shutdown().await;
}

#[tokio::test]
async fn a_live_socket_of_another_runtime_should_not_be_taken() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = config(dir.path());
    let first = Nri::start(
        cfg.clone(),
        Arc::new(Recorder::default()),
        NriMetrics::default(),
        "petrel",
        "a",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let err = Nri::start(
        cfg.clone(),
        Arc::new(Recorder::default()),
        NriMetrics::default(),
        "petrel",
        "b",
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("another runtime is listening"), "{err}");
    first.shutdown().await;
    let disabled = NriConfig {
        disable: true,
        ..cfg
    };
    let off = Nri::start(
        disabled,
        Arc::new(Recorder::default()),
        NriMetrics::default(),
        "petrel",
        "c",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(off.registry().all().is_empty());
    off.run_pod_sandbox(&pod("z"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}
