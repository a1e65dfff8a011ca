//! ContainerStatus and ListContainers.

use std::collections::HashMap;
use std::sync::Arc;

use petrel_cri::api;

use crate::error::Result;
use crate::records::ContainerState;
use crate::server::sandbox_list::labels_match;
use crate::service::Runtime;

impl Runtime {
    /// ContainerStatus.
    pub(crate) async fn container_status_rpc(
        self: &Arc<Self>,
        req: api::ContainerStatusRequest,
    ) -> Result<api::ContainerStatusResponse> {
        let c = self.container(&req.container_id)?;
        let mut info = HashMap::new();
        if req.verbose {
            let v = c.with(|r| {
                serde_json::json!({
                    "id": r.id,
                    "sandboxId": r.sandbox_id,
                    "name": r.name,
                    "pid": r.pid,
                    "shimPid": r.shim.map(|s| s.pid),
                    "bundle": r.bundle,
                    "cgroupPath": r.cgroup_path,
                    "runtime": self.runc.binary(),
                    "runtimeRoot": self.runc.root(),
                    "config": r.config,
                })
            });
            let spec: Option<serde_json::Value> =
                std::fs::read(c.with(|r| r.bundle.join("config.json")))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
            let mut v = v;
            if let (Some(obj), Some(spec)) = (v.as_object_mut(), spec) {
                obj.insert("runtimeSpec".into(), spec);
            }
            info.insert("info".to_string(), v.to_string());
        }
        Ok(api::ContainerStatusResponse {
            status: Some(self.container_status(&c)),
            info,
        })
    }

    /// ListContainers.
    pub(crate) async fn list_containers(
        self: &Arc<Self>,
        req: api::ListContainersRequest,
    ) -> Result<api::ListContainersResponse> {
        let filter = req.filter.unwrap_or_default();
        let by_id = if filter.id.is_empty() {
            None
        } else {
            match self.state.container(&filter.id) {
                Some(c) => Some(c.id.clone()),
                None => return Ok(api::ListContainersResponse::default()),
            }
        };
        let by_pod = if filter.pod_sandbox_id.is_empty() {
            None
        } else {
            match self.state.sandbox(&filter.pod_sandbox_id) {
                Some(sb) => Some(sb.id.clone()),
                None => return Ok(api::ListContainersResponse::default()),
            }
        };
        let want_state = filter.state.as_ref().map(|s| s.state);
        let mut containers: Vec<api::Container> = self
            .state
            .containers()
            .iter()
            .filter_map(|c| {
                c.with(|r| {
                    if r.state == ContainerState::Creating
                        || by_id.as_ref().is_some_and(|id| *id != r.id)
                        || by_pod.as_ref().is_some_and(|p| *p != r.sandbox_id)
                    {
                        return None;
                    }
                    let state = r.state.to_cri() as i32;
                    if want_state.is_some_and(|s| s != state)
                        || !labels_match(&r.config.labels, &filter.label_selector)
                    {
                        return None;
                    }
                    Some(api::Container {
                        id: r.id.clone(),
                        pod_sandbox_id: r.sandbox_id.clone(),
                        metadata: r.config.metadata.clone(),
                        image: r.config.image.clone(),
                        image_ref: r.image_id.clone(),
                        state,
                        created_at: r.created_at,
                        labels: r.config.labels.clone(),
                        annotations: r.config.annotations.clone(),
                        image_id: r.image_id.clone(),
                    })
                })
            })
            .collect();
        containers.sort_by_key(|c| c.created_at);
        Ok(api::ListContainersResponse { containers })
    }
}
