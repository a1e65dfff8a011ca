//! A minimal NRI plugin on the SDK: logs the runtime it is configured by, the initial
//! synchronization and every pod and container event, and adds an annotation to every
//! container it sees created.
//!
//! Run against a runtime's socket: `logger [SOCKET]` (default /var/run/nri/nri.sock), or
//! install it as `NN-logger` in the runtime's plugin directory to have it launched.

use std::sync::Arc;

use petrel_nri::api;
use petrel_nri::stub::{PluginError, Stub};

struct Logger;

fn ids(pod: &Option<api::PodSandbox>, ctr: &Option<api::Container>) -> String {
    let pod = pod.as_ref().map(|p| p.name.as_str()).unwrap_or("-");
    let ctr = ctr.as_ref().map(|c| c.name.as_str()).unwrap_or("-");
    format!("pod={pod} container={ctr}")
}

impl Logger {
    async fn create_container(
        self: Arc<Self>,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse, PluginError> {
        println!("CreateContainer {}", ids(&req.pod, &req.container));
        let mut adjust = api::ContainerAdjustment::default();
        adjust
            .annotations
            .insert("petrel.dev/nri-logger".into(), "seen".into());
        Ok(api::CreateContainerResponse {
            adjust: Some(adjust),
            ..Default::default()
        })
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let socket = std::env::args()
        .nth(1)
        .unwrap_or_else(|| api::DEFAULT_SOCKET_PATH.to_string());
    let mut builder = Stub::builder(Logger)
        .on_configure(|_s, req: api::ConfigureRequest| async move {
            println!(
                "Configure runtime={} version={} nri={:?} request_timeout={}ms config={:?}",
                req.runtime_name,
                req.runtime_version,
                req.nri_version,
                req.request_timeout,
                req.config
            );
            Ok(None)
        })
        .on_synchronize(|_s, pods, containers| async move {
            println!(
                "Synchronize pods={} containers={}",
                pods.len(),
                containers.len()
            );
            Ok(vec![])
        })
        .on_create_container(Logger::create_container)
        .on_run_pod_sandbox(|_s, req: api::RunPodSandboxRequest| async move {
            println!("RunPodSandbox {}", ids(&req.pod, &None));
            Ok(())
        })
        .on_start_container(|_s, req: api::StartContainerRequest| async move {
            println!("StartContainer {}", ids(&req.pod, &req.container));
            Ok(())
        })
        .on_post_start_container(|_s, req: api::PostStartContainerRequest| async move {
            println!("PostStartContainer {}", ids(&req.pod, &req.container));
            Ok(())
        })
        .on_stop_container(|_s, req: api::StopContainerRequest| async move {
            println!("StopContainer {}", ids(&req.pod, &req.container));
            Ok(api::StopContainerResponse::default())
        })
        .on_remove_container(|_s, req: api::RemoveContainerRequest| async move {
            println!("RemoveContainer {}", ids(&req.pod, &req.container));
            Ok(())
        })
        .on_stop_pod_sandbox(|_s, req: api::StopPodSandboxRequest| async move {
            println!("StopPodSandbox {}", ids(&req.pod, &None));
            Ok(())
        })
        .on_shutdown(|_s| async move {
            println!("Shutdown");
            Ok(())
        });
    if std::env::var_os(api::PLUGIN_NAME_ENV).is_none() {
        builder = builder.name("logger").index("10");
    }
    builder.socket_path(socket).build()?.run().await?;
    Ok(())
}
