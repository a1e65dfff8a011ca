//! PodSandboxStatus and ListPodSandbox.

use std::collections::HashMap;
use std::sync::Arc;

use petrel_cri::api;

use crate::error::Result;
use crate::records::SandboxState;
use crate::service::Runtime;
use crate::state::Sandbox;
use crate::util;

/// Whether every `selector` label is present with the same value.
pub(crate) fn labels_match(
    labels: &HashMap<String, String>,
    selector: &HashMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl Runtime {
    /// PodSandboxStatus.
    pub(crate) async fn pod_sandbox_status(
        self: &Arc<Self>,
        req: api::PodSandboxStatusRequest,
    ) -> Result<api::PodSandboxStatusResponse> {
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        let mut info = HashMap::new();
        if req.verbose {
            info.insert("info".to_string(), self.sandbox_info(&sb));
        }
        Ok(api::PodSandboxStatusResponse {
            status: Some(self.sandbox_status(&sb)),
            info,
            containers_statuses: self.pod_container_statuses(&sb),
            timestamp: util::now_ns(),
        })
    }

    fn sandbox_info(&self, sb: &Sandbox) -> String {
        sb.with(|r| {
            serde_json::json!({
                "id": r.id,
                "name": r.name,
                "state": r.state,
                "runtimeHandler": r.runtime_handler,
                "cgroupParent": r.cgroup_parent,
                "netns": r.netns,
                "ipcns": r.ipcns,
                "utsns": r.utsns,
                "pidHolder": r.pid_holder.map(|h| h.pid),
                "sandboxDir": r.dir,
                "config": r.config,
            })
            .to_string()
        })
    }

    /// ListPodSandbox.
    pub(crate) async fn list_pod_sandbox(
        self: &Arc<Self>,
        req: api::ListPodSandboxRequest,
    ) -> Result<api::ListPodSandboxResponse> {
        let filter = req.filter.unwrap_or_default();
        let by_id = if filter.id.is_empty() {
            None
        } else {
            match self.state.sandbox(&filter.id) {
                Some(sb) => Some(sb.id.clone()),
                None => return Ok(api::ListPodSandboxResponse::default()),
            }
        };
        let mut items: Vec<api::PodSandbox> = self
            .state
            .sandboxes()
            .iter()
            .filter_map(|sb| {
                sb.with(|r| {
                    if r.state == SandboxState::Creating
                        || by_id.as_ref().is_some_and(|id| *id != r.id)
                    {
                        return None;
                    }
                    let state = match r.state {
                        SandboxState::Ready => api::PodSandboxState::SandboxReady,
                        _ => api::PodSandboxState::SandboxNotready,
                    } as i32;
                    if filter.state.as_ref().is_some_and(|s| s.state != state) {
                        return None;
                    }
                    if !labels_match(&r.config.labels, &filter.label_selector) {
                        return None;
                    }
                    Some(api::PodSandbox {
                        id: r.id.clone(),
                        metadata: r.config.metadata.clone(),
                        state,
                        created_at: r.created_at,
                        labels: r.config.labels.clone(),
                        annotations: r.config.annotations.clone(),
                        runtime_handler: r.runtime_handler.clone(),
                    })
                })
            })
            .collect();
        items.sort_by_key(|p| p.created_at);
        Ok(api::ListPodSandboxResponse { items })
    }
}
