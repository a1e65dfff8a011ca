//! The CRI handlers' side of the NRI contract, on the fake host with a real
//! plugin (the SDK's stub) over NRI's socket: a pod is unseen until its
//! RunPodSandbox hook returns; a pod's stop is told once, with its
//! addresses; a container created while a late plugin synchronizes reaches
//! it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use petrel_cri::api as cri;
use petrel_nri::api;
use petrel_nri::stub::{Stub, StubHandle};
use tokio::sync::{mpsc, Notify};

use crate::error::RuntimeError;
use crate::parts::fake::{isolated_pod_config, TestRuntime};

/// A runtime whose NRI listens on a socket in its temporary directory
/// (plugin requests bounded by `request_timeout`).
fn runtime(request_timeout: Duration) -> TestRuntime {
    let t = TestRuntime::with_config(|c| {
        c.nri.socket_path = c.root.join("nri/nri.sock");
        c.nri.plugin_path = c.root.join("nri/plugins");
        c.nri.plugin_config_path = c.root.join("nri/conf.d");
        c.nri.plugin_request_timeout = request_timeout;
    });
    t.host.use_network();
    t.rt.nri.launch().unwrap_or_else(|e| panic!("{e}"));
    t
}

fn socket(t: &TestRuntime) -> std::path::PathBuf {
    t.rt.config.nri.socket_path.clone()
}

/// Runs `stub` in the background; the handle stops it.
fn spawn<S: Send + Sync + 'static>(stub: Stub<S>) -> StubHandle {
    let h = stub.handle();
    tokio::spawn(async move {
        let _ = stub.run().await;
    });
    h
}

async fn wait_plugins(t: &TestRuntime, n: usize) {
    for _ in 0..500 {
        if t.rt.nri.registry().all().len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{} plugins registered, expected {n}",
        t.rt.nri.registry().all().len()
    );
}

fn run_request(name: &str) -> cri::RunPodSandboxRequest {
    cri::RunPodSandboxRequest {
        config: Some(isolated_pod_config(name)),
        runtime_handler: String::new(),
    }
}

/// What a plugin was told, in order: `event pod-id ips`.
type Log = Arc<Mutex<Vec<String>>>;

fn note(log: &Log, event: &str, pod: Option<api::PodSandbox>) {
    let pod = pod.unwrap_or_default();
    log.lock().unwrap_or_else(|p| p.into_inner()).push(format!(
        "{event} {} {}",
        pod.id,
        pod.ips.join(",")
    ));
}

fn logged(log: &Log) -> Vec<String> {
    log.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[tokio::test]
async fn run_pod_should_keep_the_pod_unseen_until_the_nri_hook_returns() {
    let t = runtime(Duration::from_secs(5));
    let (reached_tx, mut reached) = mpsc::unbounded_channel::<String>();
    let release = Arc::new(Notify::new());
    let r = release.clone();
    let plugin = Stub::builder(())
        .name("blocker")
        .index("10")
        .socket_path(socket(&t))
        .no_reconnect()
        .on_run_pod_sandbox(move |_s, req: api::RunPodSandboxRequest| {
            let (tx, r) = (reached_tx.clone(), r.clone());
            async move {
                let _ = tx.send(req.pod.map(|p| p.id).unwrap_or_default());
                r.notified().await;
                Ok(())
            }
        })
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let h = spawn(plugin);
    wait_plugins(&t, 1).await;

    let rt = t.rt.clone();
    let running = tokio::spawn(async move { rt.run_pod_sandbox(run_request("p")).await });
    let id = tokio::time::timeout(Duration::from_secs(10), reached.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("the RunPodSandbox hook was not called"));

    // While the hook runs: not listed, no status, no container in it.
    let listed =
        t.rt.list_pod_sandbox(cri::ListPodSandboxRequest::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    assert!(listed.items.iter().all(|p| p.id != id), "{listed:?}");
    let status =
        t.rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await;
    assert!(
        matches!(status, Err(RuntimeError::NotFound { .. })),
        "{status:?}"
    );
    let created =
        t.rt.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: id.clone(),
            config: Some(crate::parts::fake::container_config("c")),
            sandbox_config: Some(isolated_pod_config("p")),
        })
        .await;
    assert!(
        created.is_err(),
        "a container was created in a pod being run"
    );
    assert!(t.rt.state.containers().is_empty());

    release.notify_one();
    let ran = running
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ran.pod_sandbox_id, id);
    let status =
        t.rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        status.status.map(|s| s.state),
        Some(cri::PodSandboxState::SandboxReady as i32)
    );
    t.create(&id, "c").await.unwrap_or_else(|e| panic!("{e}"));
    h.stop();
}

#[tokio::test]
async fn stop_pod_should_tell_plugins_once_with_the_pods_addresses() {
    let t = runtime(Duration::from_secs(5));
    let log: Log = Arc::default();
    let (l1, l2) = (log.clone(), log.clone());
    let plugin = Stub::builder(())
        .name("watcher")
        .index("10")
        .socket_path(socket(&t))
        .no_reconnect()
        .on_stop_pod_sandbox(move |_s, req: api::StopPodSandboxRequest| {
            note(&l1, "stop", req.pod);
            async { Ok(()) }
        })
        .on_remove_pod_sandbox(move |_s, req: api::RemovePodSandboxRequest| {
            note(&l2, "remove", req.pod);
            async { Ok(()) }
        })
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let h = spawn(plugin);
    wait_plugins(&t, 1).await;

    let id = t.isolated_pod("p").await.unwrap_or_else(|e| panic!("{e}"));
    let ip = t.host.attached()[&id].ips[0].clone();
    for _ in 0..3 {
        t.rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
    t.rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Gone: stopping and removing it again succeed and tell nobody.
    t.rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    t.rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        logged(&log),
        [format!("stop {id} {ip}"), format!("remove {id} {ip}")]
    );

    // A pod removed without a stop first is told its stop too, once.
    let id2 = t.isolated_pod("q").await.unwrap_or_else(|e| panic!("{e}"));
    let ip2 = t.host.attached()[&id2].ips[0].clone();
    t.rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id2.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        logged(&log)[2..],
        [format!("stop {id2} {ip2}"), format!("remove {id2} {ip2}")]
    );
    h.stop();
}

#[tokio::test]
async fn a_container_created_while_a_late_plugin_synchronizes_should_reach_it() {
    // Synchronize takes longer than the request timeout: it is bounded by
    // the registration timeout instead, and the plugin is kept.
    let t = runtime(Duration::from_millis(300));
    let pod = t.isolated_pod("p").await.unwrap_or_else(|e| panic!("{e}"));
    let before = t
        .create(&pod, "before")
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let seen: Log = Arc::default();
    let (s1, s2) = (seen.clone(), seen.clone());
    let (reached_tx, mut reached) = mpsc::unbounded_channel::<()>();
    let release = Arc::new(Notify::new());
    let r = release.clone();
    let plugin = Stub::builder(())
        .name("late")
        .index("20")
        .socket_path(socket(&t))
        .no_reconnect()
        .on_synchronize(move |_s, _pods, containers: Vec<api::Container>| {
            let (s1, tx, r) = (s1.clone(), reached_tx.clone(), r.clone());
            async move {
                for c in containers {
                    s1.lock().unwrap_or_else(|p| p.into_inner()).push(c.id);
                }
                let _ = tx.send(());
                r.notified().await;
                Ok(Vec::new())
            }
        })
        .on_create_container(move |_s, req: api::CreateContainerRequest| {
            s2.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(req.container.map(|c| c.id).unwrap_or_default());
            async { Ok(api::CreateContainerResponse::default()) }
        })
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let h = spawn(plugin);
    tokio::time::timeout(Duration::from_secs(10), reached.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("Synchronize was not called"));

    let rt = t.rt.clone();
    let pod2 = pod.clone();
    let during = tokio::spawn(async move {
        let sandbox_config = rt.sandbox(&pod2)?.with(|r| r.config.clone());
        rt.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod2,
            config: Some(crate::parts::fake::container_config("during")),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .map(|r| r.container_id)
    });
    // Past the request timeout, while the create waits or runs.
    tokio::time::sleep(Duration::from_millis(600)).await;
    release.notify_one();
    let during = during
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"));
    wait_plugins(&t, 1).await;
    let after = t
        .create(&pod, "after")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let seen = logged(&seen);
    for id in [&before, &during, &after] {
        assert_eq!(
            seen.iter().filter(|s| *s == id).count(),
            1,
            "container {id} reached the plugin other than once: {seen:?}"
        );
    }
    h.stop();
}
