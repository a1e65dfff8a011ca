//! CRI calls the kit makes itself: readiness and the final sweep of pods a
//! run left behind (critest removes its own; an interrupted run does not).

use std::time::Duration;

use petrel_cri::api;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;

/// Runs `f`'s future on a current-thread runtime of its own thread, so that
/// it works from sync code and from inside a caller's runtime alike.
pub(crate) fn on_thread<F, Fut, T>(f: F) -> Option<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Option<T>>,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(f())
    })
    .join()
    .ok()
    .flatten()
}

/// Whether the runtime at `endpoint` answers `Version` within 5 s.
pub fn answers_version(endpoint: &str) -> bool {
    let endpoint = endpoint.to_string();
    on_thread(move || async move {
        let ch = petrel_cri::connect(&endpoint).await.ok()?;
        tokio::time::timeout(
            Duration::from_secs(5),
            RuntimeServiceClient::new(ch).version(api::VersionRequest::default()),
        )
        .await
        .ok()?
        .ok()
    })
    .is_some()
}

/// Stops and removes every pod of the runtime at `endpoint`; returns how
/// many there were (None when the runtime did not answer).
pub fn remove_all_pods(endpoint: &str) -> Option<usize> {
    let endpoint = endpoint.to_string();
    on_thread(move || async move {
        let ch = petrel_cri::connect(&endpoint).await.ok()?;
        let mut c = RuntimeServiceClient::new(ch);
        let pods = tokio::time::timeout(
            Duration::from_secs(10),
            c.list_pod_sandbox(api::ListPodSandboxRequest::default()),
        )
        .await
        .ok()?
        .ok()?
        .into_inner()
        .items;
        let n = pods.len();
        for p in pods {
            let _ = tokio::time::timeout(
                Duration::from_secs(30),
                c.stop_pod_sandbox(api::StopPodSandboxRequest {
                    pod_sandbox_id: p.id.clone(),
                }),
            )
            .await;
            let _ = tokio::time::timeout(
                Duration::from_secs(30),
                c.remove_pod_sandbox(api::RemovePodSandboxRequest {
                    pod_sandbox_id: p.id,
                }),
            )
            .await;
        }
        Some(n)
    })
}
