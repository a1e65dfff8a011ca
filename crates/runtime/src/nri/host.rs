//! The runtime's side of NRI: what NRI asks of the runtime (every pod and
//! container for a Synchronize, plugin-initiated updates and evictions), and
//! the calls the CRI handlers make at each event. Every call is a no-op
//! returning at once when NRI is off or no plugin subscribed to the event.

use std::future::Future;
use std::sync::{Arc, Weak};

use oci_spec::runtime::Spec;
use petrel_cri::api as cri;
use petrel_nri::adaptation::{CreateResult, Eviction, Registration};
use petrel_nri::api::{self, Event};
use petrel_nri::ttrpc::{Code, Status};

use super::{records, spec, HookError, Nri, NriHost, Updates};
use crate::error::{Result, RuntimeError};
use crate::records::{ContainerRecord, ContainerState, SandboxRecord};
use crate::service::Runtime;
use crate::state::{Container, Sandbox};

/// How long a container evicted by a plugin gets between its stop signal
/// and SIGKILL.
const EVICTION_GRACE_SECS: i64 = 10;

/// The reason shown in the status of a container a plugin evicted.
pub const EVICTED_REASON: &str = "Evicted";

/// The runtime as NRI sees it. Weak: NRI lives inside the runtime.
#[derive(Debug)]
pub struct RuntimeHost {
    rt: Weak<Runtime>,
}

impl RuntimeHost {
    /// The host for `rt`.
    pub fn new(rt: &Arc<Runtime>) -> Self {
        Self::of(Arc::downgrade(rt))
    }

    /// The host for the runtime behind `rt` (one being made, too).
    pub(crate) fn of(rt: Weak<Runtime>) -> Self {
        RuntimeHost { rt }
    }
}

/// NRI as the runtime holds it.
pub type RuntimeNri = Nri<RuntimeHost>;

impl NriHost for RuntimeHost {
    fn snapshot(&self) -> (Vec<api::PodSandbox>, Vec<api::Container>) {
        let Some(rt) = self.rt.upgrade() else {
            return (Vec::new(), Vec::new());
        };
        let pods = rt
            .state
            .sandboxes()
            .iter()
            .map(|sb| sb.with(records::pod))
            .collect();
        // A container being created is reported by its CreateContainer
        // (creations hold the sync lock, so none is half-made here).
        let containers = rt
            .state
            .containers()
            .iter()
            .filter(|c| c.state() != ContainerState::Creating)
            .map(|c| c.with(records::container))
            .collect();
        (pods, containers)
    }

    fn update_containers(
        &self,
        plugin: &Registration,
        req: api::UpdateContainersRequest,
    ) -> impl Future<Output = std::result::Result<api::UpdateContainersResponse, Status>> + Send
    {
        let rt = self.rt.upgrade();
        let who = api::PluginInstance::from(plugin);
        let name = plugin.qualified_name();
        async move {
            let Some(rt) = rt else {
                return Err(Status::new(
                    Code::Unavailable,
                    "the runtime is shutting down",
                ));
            };
            let nri = &rt.nri;
            let checked = nri.check_updates(&who, &req).map_err(|e| {
                tracing::warn!(plugin = %name, error = %e, "nri: plugin's updates refused");
                Status::new(Code::FailedPrecondition, e.to_string())
            })?;
            let mut failed = rt.apply_nri_updates(&name, checked.updates).await;
            failed.extend(checked.rejected.into_iter().map(|r| r.update));
            nri.record_owners(&checked.owners);
            rt.nri_evict(
                req.evict
                    .into_iter()
                    .map(|eviction| Eviction {
                        plugin: name.clone(),
                        eviction,
                    })
                    .collect(),
            );
            Ok(api::UpdateContainersResponse { failed })
        }
    }
}

impl Runtime {
    /// NRI, when it runs and is not disabled.
    pub(crate) fn nri(&self) -> Option<&Arc<RuntimeNri>> {
        Some(&self.nri).filter(|n| !n.disabled())
    }

    /// Held by the calls that create, start or remove pods and containers,
    /// before any of their own locks: a plugin being synchronized sees each
    /// object either in its Synchronize or as an event after it.
    pub(crate) async fn nri_block_sync(&self) -> Option<tokio::sync::RwLockReadGuard<'_, ()>> {
        match self.nri() {
            Some(n) => Some(n.block_sync().await),
            None => None,
        }
    }

    /// RunPodSandbox, for the pod `rec` describes once it is made (still
    /// `Creating`): a plugin may refuse the pod (the caller undoes it).
    pub(crate) async fn nri_run_pod(&self, rec: &SandboxRecord) -> Result<()> {
        match self.nri() {
            Some(n) if n.registry().any(Event::RunPodSandbox) => {
                Ok(n.run_pod_sandbox(&records::pod(rec)).await?)
            }
            _ => Ok(()),
        }
    }

    /// StopPodSandbox and RemovePodSandbox notifications.
    pub(crate) async fn nri_pod_gone(&self, sb: &Sandbox, event: Event) {
        self.nri_pod_event(event, || sb.with(records::pod)).await;
    }

    /// RemovePodSandbox for a pod whose RunPodSandbox the plugins accepted
    /// but which failed after (it is undone).
    pub(crate) async fn nri_run_pod_undone(&self, rec: &SandboxRecord) {
        self.nri_pod_event(Event::RemovePodSandbox, || records::pod(rec))
            .await;
    }

    async fn nri_pod_event(&self, event: Event, pod: impl FnOnce() -> api::PodSandbox) {
        let Some(n) = self.nri().filter(|n| n.registry().any(event)) else {
            return;
        };
        let pod = pod();
        match event {
            Event::StopPodSandbox => n.stop_pod_sandbox(&pod).await,
            Event::RemovePodSandbox => n.remove_pod_sandbox(&pod).await,
            _ => {}
        }
    }

    /// True when CreateContainer goes through NRI.
    pub(crate) fn nri_wants_create(&self) -> bool {
        self.nri().is_some_and(|n| n.wants_create())
    }

    /// Records the time NRI added to a CreateContainer (see
    /// `make_container`).
    pub(crate) fn nri_observe_create_wait(&self, waited: std::time::Duration) {
        if let Some(n) = self.nri() {
            n.metrics().observe_create_wait(
                n.registry().subscribed(Event::CreateContainer).len(),
                waited,
            );
        }
    }

    /// CreateContainer: shows the plugins the container about to be created,
    /// merges and validates their answers and applies the adjustment to
    /// `oci` (and to the record: resources, cgroup). The result is for
    /// [`Runtime::nri_created`] once the container exists.
    pub(crate) async fn nri_adjust(
        &self,
        sbrec: &SandboxRecord,
        rec: &mut ContainerRecord,
        oci: &mut Spec,
    ) -> Result<Option<CreateResult>> {
        let Some(n) = self.nri().filter(|n| n.wants_create()) else {
            return Ok(None);
        };
        let t0 = std::time::Instant::now();
        let r = self.nri_adjust_with(n, sbrec, rec, oci).await;
        n.metrics().observe_create(
            n.registry().subscribed(Event::CreateContainer).len(),
            t0.elapsed(),
        );
        r.map(Some)
    }

    async fn nri_adjust_with(
        &self,
        n: &RuntimeNri,
        sbrec: &SandboxRecord,
        rec: &mut ContainerRecord,
        oci: &mut Spec,
    ) -> Result<CreateResult> {
        let t0 = std::time::Instant::now();
        let ctr = spec::container_from_spec(
            &rec.id,
            &sbrec.id,
            rec.config
                .metadata
                .as_ref()
                .map_or(rec.name.as_str(), |m| m.name.as_str()),
            &rec.config.labels,
            Some(spec::nri_seccomp_profile(
                &petrel_oci::spec::seccomp::applied(
                    rec.config
                        .linux
                        .as_ref()
                        .and_then(|l| l.security_context.as_ref()),
                ),
            )),
            oci,
        );
        let pod = records::pod(sbrec);
        let shown = t0.elapsed();
        let result = n.create_container(&pod, ctr).await?;
        let hooked = t0.elapsed();
        spec::apply_adjustment(oci, &result.adjust).map_err(HookError::from)?;
        // Where NRI's part of a CreateContainer goes (the benchmark's P19).
        tracing::debug!(
            container.id = %rec.id,
            show_us = shown.as_micros() as u64,
            hooks_us = (hooked - shown).as_micros() as u64,
            apply_us = (t0.elapsed() - hooked).as_micros() as u64,
            "nri: create adjusted"
        );
        if let Some(l) = &result.adjust.linux {
            if !l.cgroups_path.is_empty() {
                rec.cgroup_path = l.cgroups_path.clone();
            }
            if let Some(r) = &l.resources {
                let base = rec.resources.clone().unwrap_or_default();
                // Fields CRI cannot show stay applied but unrecorded.
                if let Ok(shown) = spec::update_cri_resources(&base, r) {
                    rec.resources = Some(shown);
                }
            }
        }
        Ok(result)
    }

    /// After CreateContainer: records who set what, carries out the updates
    /// and evictions plugins asked for, and sends PostCreateContainer.
    pub(crate) async fn nri_created(
        self: &Arc<Self>,
        c: &Container,
        sb: &Sandbox,
        result: Option<CreateResult>,
    ) {
        let Some(n) = self.nri() else {
            return;
        };
        if let Some(result) = result {
            n.record_owners(&result.owners);
            let failed = self
                .apply_nri_updates("CreateContainer", result.updates)
                .await;
            if !failed.is_empty() {
                tracing::warn!(container.id = %c.id, failed = failed.len(), "nri: updates asked for in CreateContainer failed");
            }
            self.nri_evict(result.evictions);
        }
        if n.registry().any(Event::PostCreateContainer) {
            n.post_create_container(&sb.with(records::pod), &c.with(records::container))
                .await;
        }
    }

    /// StartContainer: a plugin may refuse the start.
    pub(crate) async fn nri_start(&self, rec: &ContainerRecord, sb: &Sandbox) -> Result<()> {
        match self.nri() {
            Some(n) if n.registry().any(Event::StartContainer) => Ok(n
                .start_container(&sb.with(records::pod), &records::container(rec))
                .await?),
            _ => Ok(()),
        }
    }

    /// PostStartContainer.
    pub(crate) async fn nri_started(&self, c: &Container, sb: &Sandbox) {
        if let Some(n) = self
            .nri()
            .filter(|n| n.registry().any(Event::PostStartContainer))
        {
            n.post_start_container(&sb.with(records::pod), &c.with(records::container))
                .await;
        }
    }

    /// UpdateContainer: the resources after the plugins' changes, and what
    /// they asked of other containers (for [`Runtime::nri_updated`]).
    pub(crate) async fn nri_update(
        &self,
        c: &Container,
        wanted: &cri::LinuxContainerResources,
    ) -> Result<(cri::LinuxContainerResources, Option<Updates>)> {
        let Some(n) = self
            .nri()
            .filter(|n| n.registry().any(Event::UpdateContainer))
        else {
            return Ok((wanted.clone(), None));
        };
        let Some(sb) = self.sandbox_of(c) else {
            return Ok((wanted.clone(), None));
        };
        let updates = n
            .update_container(
                &sb.with(records::pod),
                &c.with(records::container),
                records::cri_resources_to_nri(wanted),
            )
            .await?;
        let merged = match &updates.result.target_resources {
            Some(r) => spec::update_cri_resources(wanted, r).map_err(HookError::from)?,
            None => wanted.clone(),
        };
        Ok((merged, Some(updates)))
    }

    /// After UpdateContainer: the other containers' updates, evictions,
    /// owners, and PostUpdateContainer.
    pub(crate) async fn nri_updated(self: &Arc<Self>, c: &Container, updates: Option<Updates>) {
        let Some(n) = self.nri() else {
            return;
        };
        if let Some(u) = updates {
            self.apply_nri_updates("UpdateContainer", u.result.updates)
                .await;
            n.record_owners(&u.result.owners);
            self.nri_evict(u.evictions);
        }
        if n.registry().any(Event::PostUpdateContainer) {
            if let Some(sb) = self.sandbox_of(c) {
                n.post_update_container(&sb.with(records::pod), &c.with(records::container))
                    .await;
            }
        }
    }

    /// A container stopped (by StopContainer, its own exit or an eviction):
    /// StopContainer to the plugins, whose updates of the remaining
    /// containers are applied. Runs off the exit path.
    pub(crate) fn nri_stopped(self: &Arc<Self>, c: &Arc<Container>) {
        let Some(n) = self
            .nri()
            .filter(|n| n.registry().any(Event::StopContainer))
        else {
            return;
        };
        let (rt, n, c) = (self.clone(), n.clone(), c.clone());
        tokio::spawn(async move {
            let Some(sb) = rt.sandbox_of(&c) else {
                return;
            };
            let u = n
                .stop_container(&sb.with(records::pod), &c.with(records::container))
                .await;
            rt.apply_nri_updates("StopContainer", u.result.updates)
                .await;
            n.record_owners(&u.result.owners);
        });
    }

    /// RemoveContainer: the notification, and the container's owners are
    /// forgotten.
    pub(crate) async fn nri_removed(&self, rec: &ContainerRecord, sb: Option<&Sandbox>) {
        let Some(n) = self.nri() else {
            return;
        };
        n.forget_owners(&rec.id);
        if let Some(sb) = sb.filter(|_| n.registry().any(Event::RemoveContainer)) {
            n.remove_container(&sb.with(records::pod), &records::container(rec))
                .await;
        }
    }

    /// Applies plugins' resource updates to running or created containers;
    /// returns those that failed and were not marked `ignore_failure`.
    pub(crate) async fn apply_nri_updates(
        &self,
        source: &str,
        updates: Vec<api::ContainerUpdate>,
    ) -> Vec<api::ContainerUpdate> {
        let mut failed = Vec::new();
        for u in updates {
            match self.apply_nri_update(&u).await {
                Ok(()) => {
                    tracing::info!(container.id = %u.container_id, source, "nri: container updated by a plugin");
                }
                Err(e) => {
                    tracing::warn!(container.id = %u.container_id, source, error = %e, ignored = u.ignore_failure, "nri: container update failed");
                    if !u.ignore_failure {
                        failed.push(u);
                    }
                }
            }
        }
        failed
    }

    async fn apply_nri_update(&self, u: &api::ContainerUpdate) -> Result<()> {
        let c = self.container(&u.container_id)?;
        let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
            return Ok(());
        };
        let base = c.with(|rec| rec.resources.clone()).unwrap_or_default();
        let wanted = spec::update_cri_resources(&base, r)
            .map_err(|e| RuntimeError::FailedPrecondition(e.to_string()))?;
        self.container_set_resources(&c, wanted).await
    }

    /// Carries out plugins' evictions, each in its own task: the container
    /// (or every container of the pod, when the id names a pod) is marked
    /// Evicted with the plugin's reason, then stopped.
    pub(crate) fn nri_evict(self: &Arc<Self>, evictions: Vec<Eviction>) {
        for e in evictions {
            let rt = self.clone();
            tokio::spawn(async move { rt.evict(e).await });
        }
    }

    async fn evict(self: &Arc<Self>, e: Eviction) {
        let id = &e.eviction.container_id;
        let reason = if e.eviction.reason.is_empty() {
            "no reason given"
        } else {
            e.eviction.reason.as_str()
        };
        let message = format!("evicted by NRI plugin {}: {reason}", e.plugin);
        tracing::warn!(id = %id, plugin = %e.plugin, reason, "nri: eviction");
        let r = if let Some(c) = self.state.container(id) {
            self.mark_evicted(&c, &message).await;
            self.container_stop(&c, EVICTION_GRACE_SECS).await
        } else if let Some(sb) = self.state.sandbox(id) {
            for cid in sb.container_ids() {
                if let Some(c) = self.state.container(&cid) {
                    self.mark_evicted(&c, &message).await;
                }
            }
            // The containers get their grace together, then the pod stops.
            let mut stops = tokio::task::JoinSet::new();
            for cid in sb.container_ids() {
                if let Some(c) = self.state.container(&cid) {
                    let rt = self.clone();
                    stops.spawn(async move { rt.container_stop(&c, EVICTION_GRACE_SECS).await });
                }
            }
            while stops.join_next().await.is_some() {}
            self.sandbox_stop(&sb).await
        } else {
            Err(RuntimeError::NotFound {
                kind: "container or pod sandbox",
                id: id.clone(),
            })
        };
        if let Err(err) = r {
            tracing::warn!(id = %id, plugin = %e.plugin, error = %err, "nri: eviction failed");
        }
    }

    /// Records that a live container is being evicted; its exit keeps the
    /// reason (see `handle_exit`).
    async fn mark_evicted(&self, c: &Container, message: &str) {
        let _op = c.op.lock().await;
        let mut rec = c.record();
        if rec.state == ContainerState::Exited {
            return;
        }
        rec.reason = EVICTED_REASON.to_string();
        rec.message = message.to_string();
        if let Err(e) = self.save_container(c, rec) {
            tracing::warn!(container.id = %c.id, error = %e, "nri: eviction not recorded");
        }
    }
}
