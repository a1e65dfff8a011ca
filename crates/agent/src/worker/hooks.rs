//! Lifecycle hooks (postStart, preStop) and stopping one container
//! gracefully.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};
use petrel_cri::api;

use super::PodWorkers;
use crate::types::{ANNOTATION_PRE_STOP, ANNOTATION_TERMINATION_GRACE};

/// kubelet gives a container at least this long after its preStop hook.
const MIN_GRACE_AFTER_HOOK: i64 = 2;

/// The exec command of a hook, if it is an exec hook.
pub(super) fn exec_command(h: Option<&LifecycleHandler>) -> Option<Vec<String>> {
    h.and_then(|h| h.exec.as_ref())
        .and_then(|e| e.command.clone())
        .filter(|c| !c.is_empty())
}

/// The preStop command of a running container: from the spec when there
/// is one, else from the annotation written at create time.
pub(super) fn pre_stop_command(
    spec: Option<&Container>,
    status: &api::ContainerStatus,
) -> Option<Vec<String>> {
    if let Some(c) = spec {
        return exec_command(c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()));
    }
    status
        .annotations
        .get(ANNOTATION_PRE_STOP)
        .and_then(|j| serde_json::from_str::<Vec<String>>(j).ok())
        .filter(|c| !c.is_empty())
}

/// The grace period of a container: the pod's, else the annotation, else
/// 30 s.
pub(super) fn grace_seconds(spec_grace: Option<i64>, status: &api::ContainerStatus) -> i64 {
    spec_grace
        .or_else(|| {
            status
                .annotations
                .get(ANNOTATION_TERMINATION_GRACE)
                .and_then(|g| g.parse().ok())
        })
        .unwrap_or(30)
        .max(0)
}

impl PodWorkers {
    /// Stops one running container: its preStop hook (within the grace
    /// period), then StopContainer with what is left of it.
    pub(super) async fn stop_container(
        &self,
        uid: &str,
        status: &api::ContainerStatus,
        spec: Option<&Container>,
        grace: i64,
        reason: &str,
    ) -> Result<(), crate::cri::CriError> {
        let remaining = self.pre_stop(uid, status, spec, grace, reason).await;
        self.stop_after_hook(uid, status, remaining).await
    }

    /// The first half of stopping a container: logs why and runs its
    /// preStop hook (if it is running and has one) within `grace`; returns
    /// the grace period left for StopContainer.
    pub(super) async fn pre_stop(
        &self,
        uid: &str,
        status: &api::ContainerStatus,
        spec: Option<&Container>,
        grace: i64,
        reason: &str,
    ) -> i64 {
        let name = status.metadata.as_ref().map_or("", |m| m.name.as_str());
        tracing::info!(uid, container = %name, id = %status.id, grace, reason, "stopping container");
        if status.state != api::ContainerState::ContainerRunning as i32 {
            return grace;
        }
        let Some(cmd) = pre_stop_command(spec, status) else {
            return grace;
        };
        let start = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(grace.max(1) as u64),
            self.runtime.exec_sync(&status.id, cmd, grace),
        )
        .await;
        match r {
            Ok(Ok(out)) if out.exit_code != 0 => {
                tracing::warn!(uid, container = %name, exit_code = out.exit_code, "preStop hook failed")
            }
            Ok(Err(e)) => {
                tracing::warn!(uid, container = %name, error = %e, "preStop hook failed")
            }
            Err(_) => {
                tracing::warn!(uid, container = %name, "preStop hook did not finish within the grace period")
            }
            Ok(Ok(_)) => {}
        }
        let spent = start.elapsed().as_secs() as i64;
        (grace - spent).max(MIN_GRACE_AFTER_HOOK)
    }

    /// The second half: StopContainer with `grace` seconds (its probes
    /// stop first). A container already gone is stopped.
    pub(super) async fn stop_after_hook(
        &self,
        uid: &str,
        status: &api::ContainerStatus,
        grace: i64,
    ) -> Result<(), crate::cri::CriError> {
        let name = status.metadata.as_ref().map_or("", |m| m.name.as_str());
        self.probes.remove(uid, name);
        match self.runtime.stop_container(&status.id, grace).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}
