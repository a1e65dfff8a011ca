//! StopContainer: the container's stop signal, SIGKILL after the timeout
//! (`container::stop`). Stopping a container that is gone already succeeds,
//! as CRI requires (and containerd does).

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::service::Runtime;

impl Runtime {
    /// StopContainer.
    pub(crate) async fn stop_container(
        self: &Arc<Self>,
        req: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse> {
        let c = match self.container(&req.container_id) {
            Ok(c) => c,
            Err(RuntimeError::NotFound { .. }) => return Ok(api::StopContainerResponse {}),
            Err(e) => return Err(e),
        };
        self.container_stop(&c, req.timeout.max(0)).await?;
        Ok(api::StopContainerResponse {})
    }
}

#[cfg(test)]
mod tests {
    use petrel_cri::api;

    use crate::parts::fake::TestRuntime;

    #[tokio::test]
    async fn stop_container_should_succeed_for_an_unknown_or_removed_container() {
        let t = TestRuntime::new();
        let stop = |id: &str| api::StopContainerRequest {
            container_id: id.to_string(),
            timeout: 0,
        };
        t.rt.stop_container(stop("deadbeef"))
            .await
            .expect("unknown id");
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        t.rt.stop_container(stop(&id)).await.expect("stop");
        t.rt.stop_container(stop(&id)).await.expect("stop again");
        t.rt.remove_container(api::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("remove");
        t.rt.stop_container(stop(&id)).await.expect("stop removed");
        // An empty id is still a bad request, not an unknown one.
        assert!(t.rt.stop_container(stop("")).await.is_err());
    }
}
