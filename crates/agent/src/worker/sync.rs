//! Syncing a pod that should run: one step towards its spec per call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, PodSpec};
use petrel_controller::Action;
use petrel_cri::api;
use petrel_cri::api::{ContainerState, PodSandboxState};

use super::hooks::{exec_command, grace_seconds};
use super::init::{self, InitStep};
use super::{PodWorkers, WorkerError};
use crate::convert::{
    container_hash, container_plan, image_volume_reference, is_sidecar, prepare_volumes,
    sandbox_config, write_hosts_file, ConvertError, SubPathMount,
};
use crate::source::defaults::pull_policy_for;
use crate::subpath::Binds;
use crate::types::{DesiredPod, PodRuntimeStatus, ANNOTATION_SANDBOX_HASH};

/// How long to wait before looking again for an image that is not
/// present under pull policy Never.
const IMAGE_RETRY: Duration = Duration::from_secs(10);
/// After a failed pull, when the waiting reason turns from ErrImagePull to
/// ImagePullBackOff.
const IMAGE_BACKOFF_SHOWN: Duration = Duration::from_secs(1);
/// kubelet's image pull backoff: start and cap.
pub(super) const IMAGE_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub(super) const IMAGE_BACKOFF_MAX: Duration = Duration::from_secs(300);
/// How soon a container whose subPath was refused is tried again (the
/// volume may change: a link removed, a directory made): the crash-loop
/// backoff's start (kubelet retries a failed pod sync after 10 s), within
/// these bounds.
const SUB_PATH_RETRY_MIN: Duration = Duration::from_secs(1);
const SUB_PATH_RETRY_MAX: Duration = Duration::from_secs(10);
/// How soon a pod waiting for an API object looks again (an object that
/// appears wakes it sooner).
const OBJECTS_RETRY: Duration = Duration::from_secs(2);
/// Exited instances kept per container name (the newest is the status's
/// lastState; older ones are removed).
const KEEP_EXITED: usize = 1;
/// How soon a container waiting for the first list of services tries again.
const SERVICES_RETRY: Duration = Duration::from_secs(1);

/// The sandbox the containers run in.
struct Sandbox {
    id: String,
    created_at: i64,
    config: api::PodSandboxConfig,
    ips: Vec<String>,
}

/// What a sync decided about one container.
enum Step {
    /// Nothing to do now.
    Nothing,
    /// Retry after this long (backoff, image not present).
    RetryAfter(Duration),
}

fn state(c: &api::ContainerStatus) -> ContainerState {
    ContainerState::try_from(c.state).unwrap_or(ContainerState::ContainerUnknown)
}

fn name_of(c: &api::ContainerStatus) -> &str {
    c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("")
}

/// Should an exited container be started again?
fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

impl PodWorkers {
    pub(super) async fn sync_pod(
        &self,
        pod: &DesiredPod,
        status: &Arc<PodRuntimeStatus>,
    ) -> Result<Action, WorkerError> {
        let uid = pod.uid.as_str();
        let Some(spec) = pod.pod.spec.as_ref() else {
            self.publish(pod, Some(status));
            return Ok(Action::Done);
        };
        let policy = spec.restart_policy.as_deref().unwrap_or("Always");

        // 0. The API objects it reads (cluster mode) are watched from now
        // on; a pod not started yet waits for them, as kubelet's volume
        // manager holds a pod until its volumes are mounted. A running
        // pod runs on (its files keep their last content).
        if let Some(objects) = self.objects.get() {
            if let Err(missing) = objects.prepare(pod).await {
                if status.latest_sandbox().is_none() {
                    tracing::info!(uid, %missing, "pod waits for its API objects");
                    self.set_pod_message(uid, Some(missing));
                    self.publish(pod, Some(status));
                    return Ok(Action::RequeueAfter(OBJECTS_RETRY));
                }
                tracing::warn!(uid, %missing, "API objects of a running pod unavailable");
            }
        }

        // 1. The sandbox: the newest, if it is ready; else a new one. The
        // pod's cgroup comes first (made only if missing; a pod running
        // already is still counted in its QoS tier).
        self.ensure_pod_cgroup(pod).await;
        let latest = status.latest_sandbox();
        let ready = latest.filter(|s| s.state == PodSandboxState::SandboxReady as i32);
        let mut changed = false;
        let ready = match ready {
            Some(s) => {
                let attempt = s.metadata.as_ref().map_or(0, |m| m.attempt);
                let ips = status.ips();
                let ctx = self.convert_context(pod, ips.clone());
                let config = sandbox_config(pod, attempt, &ctx)?;
                changed = sandbox_changed(s, &config);
                if changed {
                    tracing::info!(uid, sandbox = %s.id, "pod-level spec changed; the pod gets a new sandbox");
                }
                (!changed).then(|| Sandbox {
                    id: s.id.clone(),
                    created_at: s.created_at,
                    config,
                    ips,
                })
            }
            None => None,
        };
        let sandbox = match ready {
            Some(s) => s,
            None => {
                // A pod that must not restart stays down once its sandbox
                // is gone after its containers ran: restartPolicy Never, or
                // OnFailure once every app container succeeded (the pod
                // completed, and its sandbox was stopped for it). A changed
                // spec is not a death: the pod runs again as the new spec
                // says.
                if !changed && latest.is_some() && stays_down(spec, status, policy) {
                    self.publish(pod, Some(status));
                    return Ok(Action::Done);
                }
                if latest.is_some() || !status.containers.is_empty() {
                    // Whatever still runs in the dead sandbox goes first.
                    self.kill_pod(uid, status, Some(pod), false).await?;
                }
                let attempt = latest
                    .and_then(|s| s.metadata.as_ref())
                    .map_or(0, |m| m.attempt + 1);
                match self.create_sandbox(pod, attempt).await {
                    Ok(s) => s,
                    Err(e) => {
                        let message = match &e {
                            // A volume's object: kubelet's mount failure.
                            WorkerError::Convert(ConvertError::Missing(m)) => m.clone(),
                            e => format!("Failed to create pod sandbox: {e}"),
                        };
                        self.set_pod_message(uid, Some(message));
                        self.publish(pod, Some(status));
                        return Err(e);
                    }
                }
            }
        };
        self.set_pod_message(uid, None);

        // Containers of the current sandbox, newest first.
        let current: Vec<&api::ContainerStatus> = status
            .containers
            .iter()
            .filter(|c| in_sandbox(status, c, &sandbox.id, sandbox.created_at))
            .collect();
        let latest_of = |name: &str| current.iter().copied().find(|c| name_of(c) == name);

        let mut retry: Option<Duration> = None;
        let mut note = |s: Step| {
            if let Step::RetryAfter(d) = s {
                retry = Some(retry.map_or(d, |r| r.min(d)));
            }
        };

        // 2. Init containers in order (see `init`): regular ones each to
        // completion, sidecars started and kept running. An app container
        // in this sandbox proves they did their part (apps are only created
        // then; the status reasons the same way): a regular init container
        // added to the manifest since, or whose instance is gone, must not
        // run beside the apps.
        let apps_created = spec.containers.iter().any(|c| latest_of(&c.name).is_some());
        let plan = init::plan(
            spec.init_containers.as_deref().unwrap_or_default(),
            latest_of,
            apps_created,
            policy,
            |c, inst| self.sidecar_started(uid, c, inst),
        );
        let initialized = plan.initialized;

        // A pod that is done (a regular init container failed under
        // restartPolicy Never, or every app container exited and none is to
        // be restarted) keeps nothing running, as kubelet's pods: its
        // sidecars are stopped (not restarted: they would keep it alive),
        // after the app containers and in reverse order, then its sandbox,
        // which releases its network and IP. Its status stays.
        let done = plan.failed
            || (initialized
                && spec.containers.iter().all(|c| {
                    latest_of(&c.name).is_some_and(|i| {
                        state(i) == ContainerState::ContainerExited
                            && !should_restart(policy, i.exit_code)
                    })
                }));
        if done {
            tracing::info!(uid, pod = %format!("{}/{}", pod.namespace, pod.name), "pod completed; stopping its sidecars and sandbox");
            self.kill_pod(uid, status, Some(pod), false).await?;
        } else {
            for step in &plan.steps {
                match *step {
                    InitStep::Start(c) => {
                        let rc = next_restart_count(status, &c.name);
                        note(
                            self.start_new(pod, spec, c, true, rc, status, &sandbox)
                                .await?,
                        );
                    }
                    InitStep::StartCreated(c, i) => {
                        note(self.start_created(pod, c, true, i, &sandbox).await?);
                    }
                    InitStep::Restart(c, i) => {
                        note(
                            self.restart(pod, spec, c, true, i, status, &sandbox)
                                .await?,
                        );
                    }
                    InitStep::Stop(c, i) => {
                        self.stop_container(uid, i, Some(c), 0, "state unknown")
                            .await?;
                        self.acted(uid);
                    }
                    InitStep::Keep(c, i) => {
                        note(
                            self.check_running(pod, spec, c, true, i, status, &sandbox)
                                .await?,
                        );
                    }
                }
            }

            // 3. App containers.
            if initialized {
                for c in &spec.containers {
                    let inst = latest_of(&c.name);
                    let step = match inst.map(|i| (i, state(i))) {
                        None => {
                            let rc = next_restart_count(status, &c.name);
                            self.start_new(pod, spec, c, false, rc, status, &sandbox)
                                .await?
                        }
                        Some((i, ContainerState::ContainerCreated)) => {
                            self.start_created(pod, c, false, i, &sandbox).await?
                        }
                        Some((i, ContainerState::ContainerRunning)) => {
                            self.check_running(pod, spec, c, false, i, status, &sandbox)
                                .await?
                        }
                        Some((i, ContainerState::ContainerExited)) => {
                            if should_restart(policy, i.exit_code) {
                                self.restart(pod, spec, c, false, i, status, &sandbox)
                                    .await?
                            } else {
                                Step::Nothing
                            }
                        }
                        Some((i, ContainerState::ContainerUnknown)) => {
                            self.stop_container(uid, i, Some(c), 0, "state unknown")
                                .await?;
                            self.acted(uid);
                            Step::Nothing
                        }
                    };
                    note(step);
                }
            }
        }

        // 4. Containers whose name left the spec (the manifest was edited;
        // the pod's UID stays): stopped, as kubelet does, or they would
        // run on forever.
        for c in &current {
            let live = !matches!(state(c), ContainerState::ContainerExited);
            if live && !super::pod_containers(pod).any(|x| x.name == name_of(c)) {
                let grace = grace_seconds(spec.termination_grace_period_seconds, c);
                self.stop_container(uid, c, None, grace, "not in the spec any more")
                    .await?;
                self.acted(uid);
            }
        }

        // 5. Old instances: keep the newest exited one per name.
        self.prune(uid, status).await;

        self.publish(pod, Some(status));
        self.record_start_latency(pod, status);
        Ok(match retry {
            Some(d) => Action::RequeueAfter(d),
            None => Action::Done,
        })
    }

    /// RunPodSandbox for `pod`, after preparing its volumes and log
    /// directory.
    async fn create_sandbox(&self, pod: &DesiredPod, attempt: u32) -> Result<Sandbox, WorkerError> {
        let ctx = self.convert_context(pod, Vec::new());
        prepare_volumes(pod, &ctx)?;
        // Container output may hold secrets: the pod's log directory is
        // private (kubelet makes it 0755; its files are 0640 either way).
        petrel_fs::create_private_dir_all(&ctx.log_dir, petrel_fs::PRIVATE)
            .map_err(|e| WorkerError::Io(format!("create log directory: {e}")))?;
        let config = sandbox_config(pod, attempt, &ctx)?;
        tracing::info!(uid = %pod.uid, pod = %format!("{}/{}", pod.namespace, pod.name), attempt, "creating pod sandbox");
        let id = self.runtime.run_pod_sandbox(config.clone()).await;
        self.acted(&pod.uid);
        let id = id?;
        let st = self.runtime.pod_sandbox_status(&id).await?;
        let mut ips = Vec::new();
        if let Some(n) = st.network.as_ref() {
            if !n.ip.is_empty() {
                ips.push(n.ip.clone());
            }
            ips.extend(n.additional_ips.iter().map(|i| i.ip.clone()));
        }
        Ok(Sandbox {
            id,
            created_at: st.created_at,
            config,
            ips,
        })
    }

    /// StartContainer for a container left created (e.g. the agent died
    /// between create and start). Its subPaths are bound again first: a
    /// runtime that makes the mounts at start (containerd) needs them.
    async fn start_created(
        &self,
        pod: &DesiredPod,
        c: &Container,
        init: bool,
        inst: &api::ContainerStatus,
        sandbox: &Sandbox,
    ) -> Result<Step, WorkerError> {
        let uid = pod.uid.as_str();
        let ctx = self.convert_context(pod, sandbox.ips.clone());
        // A spec that no longer converts made this container earlier: it
        // starts as it was made.
        let subs =
            container_plan(pod, c, init, 0, &ctx).map_or_else(|_| Vec::new(), |p| p.sub_paths);
        let Some(binds) = self.bind_sub_paths(uid, &subs) else {
            return Ok(Step::RetryAfter(self.sub_path_retry()));
        };
        let r = self.runtime.start_container(&inst.id).await;
        drop(binds);
        self.acted(uid);
        if let Err(e) = r {
            self.set_waiting(uid, &c.name, "RunContainerError", e.message.clone());
            return Err(e.into());
        }
        self.clear_waiting(uid, &c.name);
        Ok(Step::Nothing)
    }

    fn sub_path_retry(&self) -> Duration {
        self.config
            .backoff_initial
            .clamp(SUB_PATH_RETRY_MIN, SUB_PATH_RETRY_MAX)
    }

    /// Binds each subPath of a container about to be created (or
    /// started) on its mount point; None, with the container waiting in
    /// CreateContainerConfigError (kubelet's reason), when one cannot be:
    /// it leads outside its volume, or the volume cannot be opened.
    fn bind_sub_paths(&self, uid: &str, subs: &[SubPathMount]) -> Option<Binds> {
        let mut binds = Binds::new();
        for s in subs {
            let bound = crate::subpath::open_beneath(&s.volume_dir, &s.relative, &s.sub_path)
                .and_then(|fd| binds.bind(std::os::fd::AsFd::as_fd(&fd), &s.mount_point));
            if let Err(e) = bound {
                tracing::warn!(uid, container = %s.container, volume = %s.volume, error = %e, "subPath refused");
                // Host paths stay out of the status (kubelet's caution);
                // the log has them.
                let why = match &e {
                    crate::subpath::SubPathError::Io { op, source, .. } => {
                        format!("{op}: {source}")
                    }
                    other => other.to_string(),
                };
                self.set_waiting(
                    uid,
                    &s.container,
                    "CreateContainerConfigError",
                    format!(
                        "failed to prepare subPath for volumeMount {:?} of container {:?}: {why}",
                        s.volume, s.container
                    ),
                );
                return None;
            }
        }
        Some(binds)
    }

    /// A running container (an app container or a sidecar): restart it if
    /// its spec changed or a liveness or startup probe failed; keep its
    /// probes running.
    #[allow(clippy::too_many_arguments)]
    async fn check_running(
        &self,
        pod: &DesiredPod,
        spec: &PodSpec,
        c: &Container,
        init: bool,
        inst: &api::ContainerStatus,
        status: &PodRuntimeStatus,
        sandbox: &Sandbox,
    ) -> Result<Step, WorkerError> {
        let uid = pod.uid.as_str();
        let grace = grace_seconds(spec.termination_grace_period_seconds, inst);
        let hash = container_hash(c);
        let recorded = status.container_meta.get(&inst.id).map(|m| m.hash.as_str());
        if recorded.is_some_and(|h| h != hash) {
            tracing::info!(uid, container = %c.name, "container spec changed; restarting it");
            self.stop_container(uid, inst, Some(c), grace, "spec changed")
                .await?;
            self.acted(uid);
            // The replacement starts at once, with no backoff.
            let rc = status
                .container_meta
                .get(&inst.id)
                .map_or(0, |m| m.restart_count + 1);
            return self
                .start_new(pod, spec, c, init, rc, status, sandbox)
                .await;
        }
        let host = self.probe_host(spec, sandbox);
        self.probes.ensure(uid, c, &inst.id, host);
        if let Some(why) = self.probes.results(uid, &c.name, &inst.id).kill_reason {
            tracing::info!(uid, container = %c.name, reason = %why, "container failed its probe; restarting it");
            self.stop_container(uid, inst, Some(c), grace, "probe failed")
                .await?;
            self.acted(uid);
        }
        Ok(Step::Nothing)
    }

    /// An exited container that the restart policy wants back: restart it
    /// unless it is in crash-loop backoff.
    #[allow(clippy::too_many_arguments)]
    async fn restart(
        &self,
        pod: &DesiredPod,
        spec: &PodSpec,
        c: &Container,
        init: bool,
        inst: &api::ContainerStatus,
        status: &PodRuntimeStatus,
        sandbox: &Sandbox,
    ) -> Result<Step, WorkerError> {
        let uid = pod.uid.as_str();
        let ran = Duration::from_nanos(
            u64::try_from(inst.finished_at.saturating_sub(inst.started_at)).unwrap_or(0),
        );
        let now = Instant::now();
        if let Some(wait) = self.backoff.remaining(uid, &c.name, ran, now) {
            let delay = self.backoff.current_delay(uid, &c.name);
            self.set_waiting(
                uid,
                &c.name,
                "CrashLoopBackOff",
                format!(
                    "back-off {}s restarting failed container={} pod={}_{}({})",
                    delay.as_secs(),
                    c.name,
                    pod.name,
                    pod.namespace,
                    uid
                ),
            );
            return Ok(Step::RetryAfter(wait));
        }
        self.backoff.restarted(uid, &c.name, now);
        let rc = status.container_meta.get(&inst.id).map_or_else(
            || next_restart_count(status, &c.name),
            |m| m.restart_count + 1,
        );
        self.start_new(pod, spec, c, init, rc, status, sandbox)
            .await
    }

    /// Pulls (per policy), creates and starts a new instance of `c`, runs
    /// its postStart hook and starts its probes.
    #[allow(clippy::too_many_arguments)]
    async fn start_new(
        &self,
        pod: &DesiredPod,
        spec: &PodSpec,
        c: &Container,
        init: bool,
        restart_count: i32,
        _status: &PodRuntimeStatus,
        sandbox: &Sandbox,
    ) -> Result<Step, WorkerError> {
        let uid = pod.uid.as_str();
        let image = c.image.clone().unwrap_or_default();
        let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        if let Some(step) = self.ensure_image(pod, c, &image, policy, sandbox).await? {
            return Ok(step);
        }
        // Image volumes (KEP-4639): the runtime mounts them from its
        // images, so each one the container mounts is pulled like the
        // container's own image, with the same waiting reasons.
        for (reference, policy) in image_volumes(spec, c) {
            if let Some(step) = self
                .ensure_image(pod, c, &reference, &policy, sandbox)
                .await?
            {
                return Ok(step);
            }
        }
        let mut ctx = self.convert_context(pod, sandbox.ips.clone());
        ctx.service_env = match self.service_env_of(pod) {
            Ok(env) => env,
            Err(why) => {
                // kubelet's rule: not before the services were listed once.
                self.set_waiting(uid, &c.name, "CreateContainerConfigError", why);
                return Ok(Step::RetryAfter(SERVICES_RETRY));
            }
        };
        // The pod's /etc/hosts, as kubelet writes it before each container.
        if let Err(e) = write_hosts_file(pod, &ctx) {
            self.set_waiting(uid, &c.name, "CreateContainerConfigError", e.to_string());
            return Err(e.into());
        }
        let plan = match container_plan(pod, c, init, restart_count, &ctx) {
            Ok(plan) => plan,
            Err(ConvertError::Missing(m)) => {
                // An object or key its environment reads is not there:
                // tried again (sooner when the object changes).
                self.set_waiting(uid, &c.name, "CreateContainerConfigError", m);
                return Ok(Step::RetryAfter(OBJECTS_RETRY));
            }
            Err(e) => {
                // A spec problem: retrying cannot help until it changes.
                self.set_waiting(uid, &c.name, "CreateContainerConfigError", e.to_string());
                return Ok(Step::Nothing);
            }
        };
        // The subPaths are bound just before the runtime needs them, and
        // unbound once it made its own mounts (create, or start for
        // runtimes that mount then).
        let Some(binds) = self.bind_sub_paths(uid, &plan.sub_paths) else {
            return Ok(Step::RetryAfter(self.sub_path_retry()));
        };
        tracing::info!(uid, container = %c.name, restart_count, "creating container");
        let created = self
            .runtime
            .create_container(&sandbox.id, plan.config, sandbox.config.clone())
            .await;
        self.acted(uid);
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                self.set_waiting(uid, &c.name, "CreateContainerError", e.message.clone());
                return Err(e.into());
            }
        };
        let started = self.runtime.start_container(&id).await;
        drop(binds);
        self.acted(uid);
        if let Err(e) = started {
            self.set_waiting(uid, &c.name, "RunContainerError", e.message.clone());
            return Err(e.into());
        }
        self.clear_waiting(uid, &c.name);
        if let Some(cmd) = exec_command(c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref())) {
            let out = self.runtime.exec_sync(&id, cmd, 30).await;
            let failed = match out {
                Ok(o) if o.exit_code == 0 => None,
                Ok(o) => Some(format!(
                    "exited with {}: {}",
                    o.exit_code,
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = failed {
                tracing::warn!(uid, container = %c.name, %why, "postStart hook failed; killing the container");
                let st = self.runtime.container_status(&id).await?;
                let grace = grace_seconds(spec.termination_grace_period_seconds, &st);
                self.stop_container(uid, &st, Some(c), grace, "postStart hook failed")
                    .await?;
                self.acted(uid);
                self.set_waiting(uid, &c.name, "PostStartHookError", why);
                return Ok(Step::Nothing);
            }
        }
        // App containers and sidecars are probed; init containers that run
        // to completion have no probes.
        if !init || is_sidecar(c) {
            let host = self.probe_host(spec, sandbox);
            self.probes.ensure(uid, c, &id, host);
        }
        Ok(Step::Nothing)
    }

    /// Makes `image` present for container `c` by `policy` (Always,
    /// IfNotPresent, Never), as kubelet's image puller does: `Some(step)`
    /// when the container must wait (ErrImageNeverPull, ErrImagePull,
    /// ImagePullBackOff, set as its waiting reason), `None` when the image
    /// is there.
    async fn ensure_image(
        &self,
        pod: &DesiredPod,
        c: &Container,
        image: &str,
        policy: &str,
        sandbox: &Sandbox,
    ) -> Result<Option<Step>, WorkerError> {
        let uid = pod.uid.as_str();
        let present = match policy {
            "Always" => false,
            _ => self.runtime.image_status(image).await?.is_some(),
        };
        if !present {
            if policy == "Never" {
                self.set_waiting(
                    uid,
                    &c.name,
                    "ErrImageNeverPull",
                    format!("Container image \"{image}\" is not present with pull policy of Never"),
                );
                return Ok(Some(Step::RetryAfter(IMAGE_RETRY)));
            }
            // kubelet's image backoff: per pod and image, 10 s doubling
            // to 5 min; ErrImagePull right after a failure, then
            // ImagePullBackOff until the next attempt.
            let key = format!("{}\0{image}", c.name);
            let now = Instant::now();
            if let Some(wait) = self.pull_backoff.remaining(uid, &key, Duration::ZERO, now) {
                let last = self.waiting_message(uid, &c.name).unwrap_or_default();
                let why = last
                    .strip_prefix(&format!("Back-off pulling image \"{image}\": "))
                    .unwrap_or(&last)
                    .to_string();
                self.set_waiting(
                    uid,
                    &c.name,
                    "ImagePullBackOff",
                    format!("Back-off pulling image \"{image}\": {why}"),
                );
                return Ok(Some(Step::RetryAfter(wait)));
            }
            tracing::info!(uid, container = %c.name, image, policy, "pulling image");
            // With the pod's pull secrets' credentials for the image's
            // registry, each in turn, as kubelet pulls.
            let pulled = crate::pull_credentials::pull_for_pod(
                self.pull_secrets.get().map(|r| r.as_ref()),
                &pod.pod,
                image,
                |auth| {
                    self.runtime
                        .pull_image(image, auth, Some(sandbox.config.clone()))
                },
            )
            .await;
            match pulled {
                Ok(_) => self.pull_backoff.forget(uid, &key),
                Err(e) => {
                    let message = e.to_string();
                    tracing::warn!(uid, container = %c.name, image, error = %message, "image pull failed");
                    self.pull_backoff.restarted(uid, &key, now);
                    self.set_waiting(uid, &c.name, "ErrImagePull", message);
                    // Back soon to show the backoff, as kubelet's next
                    // sync would.
                    return Ok(Some(Step::RetryAfter(IMAGE_BACKOFF_SHOWN)));
                }
            }
        }
        Ok(None)
    }

    /// Whether the running sidecar `inst` counts as started, for the next
    /// init container: its startupProbe passed (kubelet waits for the
    /// probe's first result too), or it has none.
    fn sidecar_started(&self, uid: &str, c: &Container, inst: &api::ContainerStatus) -> bool {
        c.startup_probe.is_none()
            || self.probes.results(uid, &c.name, &inst.id).started == Some(true)
    }

    /// The address HTTP and TCP probes use.
    fn probe_host(&self, spec: &PodSpec, sandbox: &Sandbox) -> Option<String> {
        if spec.host_network == Some(true) {
            return Some("127.0.0.1".to_string());
        }
        sandbox.ips.first().cloned()
    }

    /// Removes exited instances beyond the newest per name, and dead
    /// sandboxes other than the newest that hold no containers.
    async fn prune(&self, uid: &str, status: &PodRuntimeStatus) {
        let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for c in &status.containers {
            let n = seen.entry(name_of(c)).or_default();
            if state(c) == ContainerState::ContainerExited {
                *n += 1;
                if *n > KEEP_EXITED {
                    // Its log goes with it, as kubelet's container GC does.
                    let logs = self.config.root.join("logs");
                    let removed = crate::eviction::local::remove_container_with_log(
                        self.runtime.as_ref(),
                        &c.id,
                        &logs,
                    );
                    if let Err(e) = removed.await {
                        tracing::debug!(uid, id = %c.id, error = %e, "removing an old container failed");
                    }
                }
            }
        }
        let newest = latest_id(status);
        for s in status.sandboxes.iter().filter(|s| s.id != newest) {
            if s.state == PodSandboxState::SandboxNotready as i32 {
                let holds = status.containers.iter().any(|c| {
                    in_sandbox(status, c, &s.id, s.created_at)
                        && state(c) == ContainerState::ContainerRunning
                });
                if !holds {
                    if let Err(e) = self.runtime.remove_pod_sandbox(&s.id).await {
                        tracing::debug!(uid, id = %s.id, error = %e, "removing an old sandbox failed");
                    }
                }
            }
        }
    }

    fn record_start_latency(&self, pod: &DesiredPod, status: &PodRuntimeStatus) {
        let Some(spec) = pod.pod.spec.as_ref() else {
            return;
        };
        let all_running = spec.containers.iter().all(|c| {
            status
                .latest_container(&c.name)
                .is_some_and(|i| state(i) == ContainerState::ContainerRunning)
        });
        if !all_running {
            return;
        }
        let first = self.with_state(&pod.uid, |s| {
            if s.start_recorded {
                None
            } else {
                s.start_recorded = true;
                s.first_seen
            }
        });
        if let Some(t) = first {
            self.metrics
                .pod_start_duration
                .observe(t.elapsed().as_secs_f64());
        }
    }
}

/// Does container `c` belong to the sandbox `id` (created at
/// `created_at`)? By the sandbox id the listing gave; for a runtime that
/// gives none, by creation time within the newest sandbox.
/// Was the running sandbox made from another pod-level spec? A sandbox
/// without the hash (made by an older agent) is taken as it is.
fn sandbox_changed(running: &api::PodSandboxStatus, wanted: &api::PodSandboxConfig) -> bool {
    match (
        running.annotations.get(ANNOTATION_SANDBOX_HASH),
        wanted.annotations.get(ANNOTATION_SANDBOX_HASH),
    ) {
        (Some(have), Some(want)) => have != want,
        _ => false,
    }
}

fn in_sandbox(
    status: &PodRuntimeStatus,
    c: &api::ContainerStatus,
    id: &str,
    created_at: i64,
) -> bool {
    match status
        .container_meta
        .get(&c.id)
        .map(|m| m.sandbox_id.as_str())
    {
        Some(sid) if !sid.is_empty() => sid == id,
        _ => c.created_at >= created_at && id == latest_id(status),
    }
}

/// The id of the newest sandbox ("" if none).
fn latest_id(status: &PodRuntimeStatus) -> String {
    status
        .latest_sandbox()
        .map(|s| s.id.clone())
        .unwrap_or_default()
}

/// Whether a pod whose sandbox is gone stays down: its containers ran and
/// the restart policy wants none back (kubelet makes no new sandbox then).
fn stays_down(spec: &PodSpec, status: &PodRuntimeStatus, policy: &str) -> bool {
    match policy {
        "Never" => !status.containers.is_empty(),
        "OnFailure" => spec.containers.iter().all(|c| {
            status
                .latest_container(&c.name)
                .is_some_and(|i| state(i) == ContainerState::ContainerExited && i.exit_code == 0)
        }),
        _ => false,
    }
}

/// The restart count of a new instance of `name`: one more than the newest
/// previous instance's, 0 for the first.
fn next_restart_count(status: &PodRuntimeStatus, name: &str) -> i32 {
    status.latest_container(name).map_or(0, |i| {
        status
            .container_meta
            .get(&i.id)
            .map_or(0, |m| m.restart_count)
            + 1
    })
}

/// The image volumes `c` mounts, as (reference, pull policy); the policy
/// defaults as the API server's does for container images. Volumes
/// without a reference are left to the conversion, which refuses them.
fn image_volumes(spec: &PodSpec, c: &Container) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(v) = spec.volumes.iter().flatten().find(|v| v.name == m.name) else {
            continue;
        };
        let Ok(Some(reference)) = image_volume_reference(v) else {
            continue;
        };
        let policy = v
            .image
            .as_ref()
            .and_then(|i| i.pull_policy.as_deref())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| pull_policy_for(reference));
        let entry = (reference.to_string(), policy.to_string());
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::desired;

    #[test]
    fn image_volumes_should_list_the_mounted_ones_with_their_policies() {
        let pod = desired(
            "metadata: {name: p}\nspec:\n  volumes: [{name: a, image: {reference: 'reg/a'}}, {name: b, image: {reference: 'reg/b:1', pullPolicy: Never}}, {name: c, image: {reference: 'reg/c:1'}}, {name: d, emptyDir: {}}, {name: e, image: {}}]\n  containers: [{name: x, image: i, volumeMounts: [{name: a, mountPath: /a}, {name: a, mountPath: /a2, subPath: s}, {name: b, mountPath: /b}, {name: d, mountPath: /d}, {name: e, mountPath: /e}]}]\n",
        );
        let spec = pod.pod.spec.as_ref().unwrap();
        let got = image_volumes(spec, &spec.containers[0]);
        let want = [("reg/a", "Always"), ("reg/b:1", "Never")];
        // Each image once; unmounted (c), non-image (d) and reference-less
        // (e, refused by the conversion) volumes are left out.
        assert_eq!(
            got,
            want.map(|(r, p)| (r.to_string(), p.to_string())).to_vec()
        );
    }
}
