//! Graceful termination: a pod whose manifest is gone (or cannot run any
//! more) is stopped, its app containers in parallel with their grace
//! period, then its sidecars in reverse order, then its sandboxes; then
//! everything is removed.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::join_all;
use petrel_controller::Action;
use petrel_cri::api;

use super::hooks::grace_seconds;
use super::{PodWorkers, WorkerError};
use crate::convert::is_sidecar;
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

    /// Stops every running container of the pod (each with its grace
    /// period and preStop hook), then its sandboxes; with `remove`,
    /// removes them all. App containers stop in parallel; sidecars after
    /// them, in reverse order (see [`PodWorkers::stop_containers`]).
    pub(super) async fn kill_pod(
        &self,
        uid: &str,
        status: &PodRuntimeStatus,
        desired: Option<&DesiredPod>,
        remove: bool,
    ) -> Result<(), WorkerError> {
        let live: Vec<&api::ContainerStatus> = status
            .containers
            .iter()
            .filter(|c| {
                c.state == api::ContainerState::ContainerRunning as i32
                    || c.state == api::ContainerState::ContainerUnknown as i32
            })
            .collect();
        let results = self.stop_containers(uid, status, &live, desired).await;
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

    /// Stops the live containers `live` of the pod, as kubelet orders a
    /// pod's termination: app containers (and anything not a sidecar) at
    /// once, in parallel; sidecars run their preStop hooks at once too, but
    /// each is stopped only after every app container and every later
    /// sidecar (in spec order) has stopped, or its grace period ran out:
    /// a sidecar serves the containers started after it to the end.
    /// Sidecars are known by the spec, else by the kind the agent wrote on
    /// them (their order then by creation, newest first).
    async fn stop_containers(
        &self,
        uid: &str,
        status: &PodRuntimeStatus,
        live: &[&api::ContainerStatus],
        desired: Option<&DesiredPod>,
    ) -> Vec<Result<(), crate::cri::CriError>> {
        let spec = desired.and_then(|d| d.pod.spec.as_ref());
        let spec_grace = spec.and_then(|s| s.termination_grace_period_seconds);
        // An evicted pod gets the eviction's grace period instead.
        let evict_grace = self.with_state(uid, |s| s.phase.grace_override());
        let reason = if evict_grace.is_some() {
            "pod evicted"
        } else {
            "pod terminating"
        };
        let name_of = |c: &api::ContainerStatus| {
            c.metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default()
        };
        let cspec = |name: &str| {
            spec.and_then(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|x| x.name == name)
            })
        };
        let grace_of =
            |c: &api::ContainerStatus| evict_grace.unwrap_or_else(|| grace_seconds(spec_grace, c));
        // A sidecar's place in the spec's init containers (None: not a
        // sidecar). Without a spec: by the kind annotation, and creation.
        let sidecar_rank = |c: &api::ContainerStatus| -> Option<i64> {
            match spec {
                Some(s) => s
                    .init_containers
                    .iter()
                    .flatten()
                    .position(|x| x.name == name_of(c) && is_sidecar(x))
                    .map(|i| i as i64),
                None => status
                    .container_meta
                    .get(&c.id)
                    .is_some_and(|m| m.sidecar)
                    .then_some(c.created_at),
            }
        };
        let mut sidecars: Vec<(i64, &api::ContainerStatus)> = Vec::new();
        let mut mains = Vec::new();
        for c in live {
            match sidecar_rank(c) {
                Some(rank) => sidecars.push((rank, c)),
                None => mains.push(*c),
            }
        }
        // Last in the spec stops first.
        sidecars.sort_by_key(|(rank, _)| std::cmp::Reverse(*rank));

        let (mains_done, mains_rx) = tokio::sync::watch::channel(false);
        let stop_mains = async {
            let stops = mains.iter().map(|c| {
                let name = name_of(c);
                let cspec = cspec(&name);
                async move {
                    self.stop_container(uid, c, cspec, grace_of(c), reason)
                        .await
                }
            });
            let r = join_all(stops).await;
            let _ = mains_done.send(true);
            r
        };
        let stop_sidecars = async {
            let mut mains_rx = mains_rx;
            // The hooks at once: each sidecar's grace period runs from now.
            let hooks = sidecars.iter().map(|(_, c)| {
                let name = name_of(c);
                let cspec = cspec(&name);
                async move {
                    let left = self.pre_stop(uid, c, cspec, grace_of(c), reason).await;
                    tokio::time::Instant::now() + Duration::from_secs(left.max(0) as u64)
                }
            });
            let deadlines = join_all(hooks).await;
            let mut results = Vec::new();
            for ((_, c), deadline) in sidecars.iter().zip(deadlines) {
                // Its turn: once the app containers stopped (the later
                // sidecars stopped before it, one by one), or its grace
                // period is over.
                let _ = tokio::time::timeout_at(deadline, mains_rx.wait_for(|d| *d)).await;
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let grace = i64::try_from(left.as_secs()).unwrap_or(i64::MAX);
                results.push(self.stop_after_hook(uid, c, grace).await);
            }
            results
        };
        let (mut results, sidecar_results) = tokio::join!(stop_mains, stop_sidecars);
        results.extend(sidecar_results);
        results
    }
}
