//! Graceful termination: a pod whose manifest is gone (or cannot run any
//! more) is stopped, container by container in parallel with its grace
//! period, then its sandboxes, then everything is removed.

use std::sync::Arc;
use std::time::SystemTime;

use futures_util::future::join_all;
use petrel_controller::Action;
use petrel_cri::api;

use super::hooks::grace_seconds;
use super::{PodWorkers, WorkerError};
use crate::types::{DesiredPod, PodRuntimeStatus};

impl PodWorkers {
    /// The manifest of `uid` is gone: terminate and forget the pod.
    pub(super) async fn terminate(
        &self,
        uid: &str,
        status: &Arc<PodRuntimeStatus>,
    ) -> Result<Action, WorkerError> {
        if status.sandboxes.is_empty() && status.containers.is_empty() {
            self.forget(uid);
            return Ok(Action::Done);
        }
        let last = self.with_state(uid, |s| {
            s.phase.terminate(SystemTime::now());
            s.last_desired.clone()
        });
        if let Some(d) = &last {
            self.publish(d, Some(status));
        }
        self.kill_pod(uid, status, last.as_ref(), true).await?;
        self.forget(uid);
        tracing::info!(uid, "pod terminated and removed");
        Ok(Action::Done)
    }

    /// Stops every running container of the pod (in parallel, each with its
    /// grace period and preStop hook), then its sandboxes; with `remove`,
    /// removes them all.
    pub(super) async fn kill_pod(
        &self,
        uid: &str,
        status: &PodRuntimeStatus,
        desired: Option<&DesiredPod>,
        remove: bool,
    ) -> Result<(), WorkerError> {
        let spec = desired.and_then(|d| d.pod.spec.as_ref());
        let spec_grace = spec.and_then(|s| s.termination_grace_period_seconds);
        // An evicted pod gets the eviction's grace period instead.
        let evict_grace = self.with_state(uid, |s| s.phase.grace_override());
        let stops = status
            .containers
            .iter()
            .filter(|c| {
                c.state == api::ContainerState::ContainerRunning as i32
                    || c.state == api::ContainerState::ContainerUnknown as i32
            })
            .map(|c| {
                let name = c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
                let cspec = spec.and_then(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                        .find(|x| x.name == name)
                });
                self.stop_container(
                    uid,
                    c,
                    cspec,
                    evict_grace.unwrap_or_else(|| grace_seconds(spec_grace, c)),
                    if evict_grace.is_some() {
                        "pod evicted"
                    } else {
                        "pod terminating"
                    },
                )
            });
        let results = join_all(stops).await;
        self.acted(uid);
        for r in results {
            r?;
        }
        for s in &status.sandboxes {
            match self.runtime.stop_pod_sandbox(&s.id).await {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.acted(uid);
        if remove {
            for c in &status.containers {
                match self.runtime.remove_container(&c.id).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            for s in &status.sandboxes {
                match self.runtime.remove_pod_sandbox(&s.id).await {
                    Ok(()) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            self.acted(uid);
        }
        Ok(())
    }
}
