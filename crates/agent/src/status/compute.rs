//! The Kubernetes status of a pod, from the runtime's view (the PLEG's
//! cache) and what the pod worker knows beyond it (waiting reasons, probe
//! results). A pure function: the same inputs give the same status.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use petrel_cri::api;

use crate::convert::{is_sidecar, qos_class, DEFAULT_TERMINATION_GRACE_SECONDS};
use crate::types::{ContainerHints, DesiredPod, PodHints, PodOrigin, PodRuntimeStatus};

/// `status.reason` of a static pod whose manifest cannot run.
pub const REASON_INVALID_MANIFEST: &str = "InvalidManifest";
/// The waiting reason of the containers of an API pod the node cannot run:
/// the API server accepted it, so what is wrong is in what the node makes
/// of it, which kubelet reports as this (with the message) and
/// `ContainersNotReady` on the pod's conditions.
pub const REASON_CONTAINER_CONFIG: &str = "CreateContainerConfigError";

/// What status computation needs beyond the pod and the runtime.
#[derive(Debug, Clone, Copy)]
pub struct StatusContext<'a> {
    /// The node's IP (status.hostIP, and podIP of hostNetwork pods).
    pub host_ip: &'a str,
    /// The runtime's name for container IDs, `<name>://<id>`.
    pub runtime_name: &'a str,
    /// The current time (when conditions change).
    pub now: SystemTime,
}

/// A runtime timestamp (nanoseconds since the epoch; 0 is unset) as a
/// Kubernetes time.
fn time_from_nanos(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok())
        .flatten()
        .map(Time)
}

/// A system time as a Kubernetes time.
pub(crate) fn time_from_system(t: SystemTime) -> Option<Time> {
    let nanos = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_nanos()).ok()?,
        Err(e) => -i128::try_from(e.duration().as_nanos()).ok()?,
    };
    Timestamp::from_nanosecond(nanos).ok().map(Time)
}

fn waiting(reason: &str, message: Option<&str>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: message.filter(|m| !m.is_empty()).map(str::to_string),
        }),
        ..Default::default()
    }
}

/// The terminated state of an exited runtime container: the runtime's
/// reason (OOMKilled, ...) when it gives one, else Completed or Error.
fn terminated(c: &api::ContainerStatus, container_id: String) -> ContainerState {
    let reason = if !c.reason.is_empty() {
        c.reason.clone()
    } else if c.exit_code == 0 {
        "Completed".to_string()
    } else {
        "Error".to_string()
    };
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            container_id: Some(container_id),
            exit_code: c.exit_code,
            reason: Some(reason),
            message: (!c.message.is_empty()).then(|| c.message.clone()),
            started_at: time_from_nanos(c.started_at),
            finished_at: time_from_nanos(c.finished_at),
            signal: None,
        }),
        ..Default::default()
    }
}

fn is(c: &api::ContainerStatus, state: api::ContainerState) -> bool {
    c.state == state as i32
}

/// One container's status and what the phase needs to know about it.
struct Computed {
    status: ContainerStatus,
    running: bool,
    /// Exited, with this exit code (the newest instance).
    exited: Option<i32>,
    /// Has ever run (an exited instance exists).
    ran_before: bool,
    /// Has any instance in the runtime.
    created: bool,
}

/// A container's status from its instances in the runtime, newest first.
fn container_status(
    spec: &Container,
    init: bool,
    instances: &[&api::ContainerStatus],
    runtime: Option<&PodRuntimeStatus>,
    hints: Option<&ContainerHints>,
    default_waiting: &str,
    ctx: &StatusContext,
) -> Computed {
    let id_of = |c: &api::ContainerStatus| format!("{}://{}", ctx.runtime_name, c.id);
    let latest = instances.first().copied();
    let hinted = hints.and_then(|h| h.waiting.as_ref());
    let running = latest.is_some_and(|c| is(c, api::ContainerState::ContainerRunning));
    let exited_latest = latest.filter(|c| is(c, api::ContainerState::ContainerExited));

    // What is shown as the current state, and which instance it came from
    // (None when it is a waiting reason that no instance reports).
    let (state, shown) = match latest {
        Some(c) if running => (
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: time_from_nanos(c.started_at),
                }),
                ..Default::default()
            },
            Some(c),
        ),
        // The worker's reason (CrashLoopBackOff, ...) wins over the last
        // exit, which then becomes lastState.
        _ if hinted.is_some() => {
            let (reason, message) = hinted
                .map(|(r, m)| (r.as_str(), m.as_str()))
                .unwrap_or_default();
            (waiting(reason, Some(message)), None)
        }
        Some(c) if is(c, api::ContainerState::ContainerExited) => {
            (terminated(c, id_of(c)), Some(c))
        }
        Some(c) if is(c, api::ContainerState::ContainerCreated) => {
            (waiting("ContainerCreating", None), Some(c))
        }
        Some(c) => (waiting("ContainerStatusUnknown", None), Some(c)),
        None => (waiting(default_waiting, None), None),
    };
    // lastState: the newest exited instance other than the one shown.
    let last = instances
        .iter()
        .copied()
        .filter(|c| shown.is_none_or(|s| s.id != c.id))
        .find(|c| is(c, api::ContainerState::ContainerExited))
        .map(|c| terminated(c, id_of(c)));
    let restart_count = latest
        .map(|c| {
            runtime
                .and_then(|r| r.container_meta.get(&c.id))
                .map(|m| m.restart_count)
                .unwrap_or(instances.len() as i32 - 1)
        })
        .unwrap_or(0);
    // A sidecar is ready as an app container is: running, and its
    // readiness probe (if any) passed.
    let ready = if init && !is_sidecar(spec) {
        exited_latest.is_some_and(|c| c.exit_code == 0)
    } else {
        running && hints.and_then(|h| h.ready).unwrap_or(true)
    };
    let started = running && hints.and_then(|h| h.started).unwrap_or(true);
    Computed {
        running,
        exited: exited_latest.map(|c| c.exit_code),
        ran_before: last.is_some() || exited_latest.is_some(),
        created: latest.is_some(),
        status: ContainerStatus {
            name: spec.name.clone(),
            image: spec.image.clone().unwrap_or_default(),
            image_id: latest.map(|c| c.image_ref.clone()).unwrap_or_default(),
            container_id: latest.map(id_of),
            state: Some(state),
            last_state: Some(last.unwrap_or_default()),
            ready,
            started: Some(started),
            restart_count,
            // What the container was made with (kubelet reports its cpu and
            // memory), once it exists.
            resources: latest.and(spec.resources.as_ref()).map(cpu_and_memory),
            allocated_resources: latest
                .and(spec.resources.as_ref())
                .and_then(|r| r.requests.clone())
                .filter(|r| !r.is_empty()),
            ..Default::default()
        },
    }
}

/// The cpu and memory of `r`, as kubelet shows a container's resources.
fn cpu_and_memory(
    r: &k8s_openapi::api::core::v1::ResourceRequirements,
) -> k8s_openapi::api::core::v1::ResourceRequirements {
    let keep = |m: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        m.as_ref()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| *k == "cpu" || *k == "memory")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<std::collections::BTreeMap<_, _>>()
            })
            .filter(|m| !m.is_empty())
    };
    k8s_openapi::api::core::v1::ResourceRequirements {
        limits: keep(&r.limits),
        requests: keep(&r.requests),
        claims: None,
    }
}

fn condition(kind: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: kind.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
}

/// kubelet's message form: "containers with <what> status: [a b]".
fn names_message(what: &str, names: &[String]) -> String {
    format!("containers with {what} status: [{}]", names.join(" "))
}

/// The pod's Kubernetes status. Conditions carry no transition times: see
/// [`carry_transition_times`].
pub fn compute_pod_status(
    pod: &DesiredPod,
    runtime: Option<&PodRuntimeStatus>,
    hints: &PodHints,
    ctx: &StatusContext,
) -> PodStatus {
    let spec = pod.pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network) == Some(true);
    let mut status = PodStatus {
        qos_class: spec.map(|s| qos_class(s).as_str().to_string()),
        start_time: hints.start_time.and_then(time_from_system),
        message: hints.message.clone(),
        ..Default::default()
    };
    if !ctx.host_ip.is_empty() {
        status.host_ip = Some(ctx.host_ip.to_string());
        status.host_ips = Some(vec![HostIP {
            ip: ctx.host_ip.to_string(),
        }]);
    }
    let ips = if host_network {
        if ctx.host_ip.is_empty() {
            Vec::new()
        } else {
            vec![ctx.host_ip.to_string()]
        }
    } else {
        runtime.map(|r| r.ips()).unwrap_or_default()
    };
    if let Some(first) = ips.first() {
        status.pod_ip = Some(first.clone());
        status.pod_ips = Some(ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect());
    }
    let scheduled = condition("PodScheduled", true, None, None);

    let empty = Vec::new();
    let init_specs = spec
        .and_then(|s| s.init_containers.as_ref())
        .unwrap_or(&empty);
    let app_specs = spec.map(|s| &s.containers).unwrap_or(&empty);

    if let Some(err) = &pod.invalid {
        status.phase = Some("Pending".to_string());
        // A static pod's manifest is the node's own input: the pod says
        // it is invalid. An API pod passed the API server's validation:
        // its containers say the node cannot make their configuration.
        let (waiting_reason, condition_reason, condition_message) = match pod.source {
            PodOrigin::Api => {
                let names: Vec<&str> = app_specs.iter().map(|c| c.name.as_str()).collect();
                (
                    REASON_CONTAINER_CONFIG,
                    "ContainersNotReady",
                    format!("containers with unready status: [{}]", names.join(" ")),
                )
            }
            PodOrigin::File(_) => {
                status.reason = Some(REASON_INVALID_MANIFEST.to_string());
                status.message = Some(err.clone());
                (
                    REASON_INVALID_MANIFEST,
                    REASON_INVALID_MANIFEST,
                    err.clone(),
                )
            }
        };
        let shown = |c: &Container| ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            state: Some(waiting(waiting_reason, Some(err))),
            started: Some(false),
            ..Default::default()
        };
        if !init_specs.is_empty() {
            status.init_container_statuses = Some(init_specs.iter().map(shown).collect());
        }
        status.container_statuses = Some(app_specs.iter().map(shown).collect());
        let msg = Some(condition_message);
        status.conditions = Some(vec![
            condition("Ready", false, Some(condition_reason), msg.clone()),
            condition("ContainersReady", false, Some(condition_reason), msg),
            scheduled,
        ]);
        return status;
    }

    let instances = |name: &str| -> Vec<&api::ContainerStatus> {
        runtime
            .map(|r| {
                r.containers
                    .iter()
                    .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
                    .collect()
            })
            .unwrap_or_default()
    };
    let restart_policy = spec
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");

    // Once any app container exists the init containers are done, even
    // if their own containers have been removed since.
    let apps_started = app_specs.iter().any(|c| !instances(&c.name).is_empty());

    // The phase's counts, as kubelet's: regular init containers hold the
    // pod Pending until they completed; a running sidecar counts as a
    // running container (and holds initialization until it started); a
    // sidecar that stopped does not count (it is restarted, or the pod is
    // done).
    let (mut running, mut waiting_n, mut stopped, mut succeeded, mut unknown) = (0, 0, 0, 0, 0);
    let mut unready = Vec::new();
    let mut init_failed = false;
    let mut incomplete = Vec::new();
    let mut init_statuses = Vec::new();
    for c in init_specs {
        let computed = container_status(
            c,
            true,
            &instances(&c.name),
            runtime,
            hints.containers.get(&c.name),
            "PodInitializing",
            ctx,
        );
        if is_sidecar(c) {
            let started = computed.running && computed.status.started == Some(true);
            if computed.running {
                running += 1;
            } else if computed.exited.is_none() && !computed.ran_before {
                waiting_n += 1;
            }
            if !started && !apps_started {
                incomplete.push(c.name.clone());
            }
            if !computed.status.ready {
                unready.push(c.name.clone());
            }
        } else {
            match computed.exited {
                Some(0) => {}
                _ if apps_started => {}
                Some(_) if !computed.running => {
                    init_failed = true;
                    incomplete.push(c.name.clone());
                }
                _ => incomplete.push(c.name.clone()),
            }
        }
        init_statuses.push(computed.status);
    }
    let initialized = apps_started || incomplete.is_empty();
    // A failed init container is retried unless the policy is Never.
    let init_failed_for_good = init_failed && restart_policy == "Never";

    let app_default = if initialized {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let mut app_statuses = Vec::new();
    for c in app_specs {
        let computed = container_status(
            c,
            false,
            &instances(&c.name),
            runtime,
            hints.containers.get(&c.name),
            app_default,
            ctx,
        );
        if computed.running {
            running += 1;
        } else if let Some(code) = computed.exited {
            // Also when the exit is shown as lastState behind a waiting
            // reason (backoff): the container has run and stopped.
            stopped += 1;
            if code == 0 {
                succeeded += 1;
            }
        } else if computed.ran_before {
            stopped += 1;
        } else if computed.created
            || hints
                .containers
                .get(&c.name)
                .is_some_and(|h| h.waiting.is_some())
        {
            waiting_n += 1;
        } else {
            unknown += 1;
        }
        if !computed.status.ready {
            unready.push(c.name.clone());
        }
        app_statuses.push(computed.status);
    }

    let terminal = |all_succeeded: bool| if all_succeeded { "Succeeded" } else { "Failed" };
    let phase = if init_failed_for_good && !apps_started {
        "Failed"
    } else if !initialized || waiting_n > 0 {
        "Pending"
    } else if running > 0 && unknown == 0 {
        "Running"
    } else if running == 0 && stopped > 0 && unknown == 0 {
        match restart_policy {
            // Restarted forever: terminal only once the pod is going away.
            "Always" if !hints.terminating => "Running",
            "Always" => terminal(stopped == succeeded),
            "Never" => terminal(stopped == succeeded),
            // OnFailure: done when all succeeded, else restarting.
            _ if stopped == succeeded => "Succeeded",
            _ if hints.terminating => "Failed",
            _ => "Running",
        }
    } else {
        "Pending"
    };
    status.phase = Some(phase.to_string());

    let sandbox_ready = runtime
        .and_then(|r| r.latest_sandbox())
        .is_some_and(|s| s.state == api::PodSandboxState::SandboxReady as i32);
    let completed = matches!(phase, "Succeeded" | "Failed");
    let ready_cond = |kind: &str| {
        if completed {
            condition(kind, false, Some("PodCompleted"), None)
        } else if unready.is_empty() {
            condition(kind, true, None, None)
        } else {
            condition(
                kind,
                false,
                Some("ContainersNotReady"),
                Some(names_message("unready", &unready)),
            )
        }
    };
    status.conditions = Some(vec![
        condition("PodReadyToStartContainers", sandbox_ready, None, None),
        if initialized {
            condition("Initialized", true, None, None)
        } else {
            condition(
                "Initialized",
                false,
                Some("ContainersNotInitialized"),
                Some(names_message("incomplete", &incomplete)),
            )
        },
        ready_cond("Ready"),
        ready_cond("ContainersReady"),
        scheduled,
    ]);
    if !init_statuses.is_empty() {
        status.init_container_statuses = Some(init_statuses);
    }
    status.container_statuses = Some(app_statuses);
    status
}

/// Reason of an evicted pod (kubelet's).
pub const REASON_EVICTED: &str = "Evicted";

/// Marks `status` as an evicted pod's, as kubelet does: phase Failed,
/// reason Evicted, `message` (the signal and usage), a DisruptionTarget
/// condition (reason TerminationByKubelet), and not ready.
pub fn mark_evicted(status: &mut PodStatus, message: &str) {
    status.phase = Some("Failed".to_string());
    status.reason = Some(REASON_EVICTED.to_string());
    status.message = Some(message.to_string());
    let conds = status.conditions.get_or_insert_with(Vec::new);
    for c in conds.iter_mut() {
        if c.type_ == "Ready" || c.type_ == "ContainersReady" {
            *c = condition(&c.type_.clone(), false, Some("PodCompleted"), None);
        }
    }
    conds.retain(|c| c.type_ != "DisruptionTarget");
    conds.push(condition(
        "DisruptionTarget",
        true,
        Some("TerminationByKubelet"),
        Some(message.to_string()),
    ));
}

/// Marks `status` as the status of a pod refused admission, as kubelet
/// writes one: phase Failed with the refusal's `reason` and `message`, its
/// QoS class and start time, and nothing of containers, IPs or readiness
/// (nothing of it ever ran); PodScheduled stays, as it was true.
pub fn mark_rejected(status: &mut PodStatus, reason: &str, message: &str) {
    let scheduled = status
        .conditions
        .iter()
        .flatten()
        .filter(|c| c.type_ == "PodScheduled")
        .cloned()
        .collect::<Vec<_>>();
    *status = PodStatus {
        phase: Some("Failed".to_string()),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        qos_class: status.qos_class.take(),
        start_time: status.start_time.take(),
        observed_generation: status.observed_generation.take(),
        conditions: (!scheduled.is_empty()).then_some(scheduled),
        ..Default::default()
    };
}

/// Gives each condition of `next` its time of last transition: kept from
/// `prev` when its status did not change, else `now`. The publisher calls
/// it with the previously published status, so an unchanged status stays
/// byte-for-byte the same and watchers see no spurious changes.
pub fn carry_transition_times(prev: Option<&PodStatus>, next: &mut PodStatus, now: SystemTime) {
    let now = time_from_system(now);
    for c in next.conditions.iter_mut().flatten() {
        let kept = prev
            .and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|p| p.type_ == c.type_))
            .filter(|p| p.status == c.status)
            .and_then(|p| p.last_transition_time.clone());
        c.last_transition_time = kept.or_else(|| now.clone());
    }
}

/// The pod as published at `/pods`: its metadata (uid, namespace, a
/// creation time; deletion time and grace while terminating), the spec
/// from the manifest and `status`. kind and apiVersion are written by the
/// type's serializer.
pub fn published_pod(
    pod: &DesiredPod,
    status: PodStatus,
    terminating_since: Option<SystemTime>,
) -> Pod {
    let mut metadata = pod.pod.metadata.clone();
    metadata.uid = Some(pod.uid.clone());
    metadata.name = Some(pod.name.clone());
    metadata.namespace = Some(pod.namespace.clone());
    if metadata.creation_timestamp.is_none() {
        metadata.creation_timestamp = status.start_time.clone();
    }
    if let Some(since) = terminating_since {
        metadata.deletion_timestamp = time_from_system(since);
        metadata.deletion_grace_period_seconds = Some(
            pod.pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(DEFAULT_TERMINATION_GRACE_SECONDS),
        );
    }
    Pod {
        metadata,
        spec: pod.pod.spec.clone(),
        status: Some(status),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;
    use crate::convert::test_support::desired;
    use crate::types::ContainerMeta;

    const SEC: i64 = 1_000_000_000;

    fn ctx() -> StatusContext<'static> {
        StatusContext {
            host_ip: "192.168.1.10",
            runtime_name: "petrel",
            now: SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000),
        }
    }

    /// A runtime container: state, created second, exit code.
    fn rc(
        name: &str,
        id: &str,
        state: api::ContainerState,
        created: i64,
        exit: i32,
    ) -> api::ContainerStatus {
        let exited = state == api::ContainerState::ContainerExited;
        api::ContainerStatus {
            id: id.to_string(),
            metadata: Some(api::ContainerMetadata {
                name: name.to_string(),
                attempt: 0,
            }),
            state: state as i32,
            created_at: created * SEC,
            started_at: if state == api::ContainerState::ContainerCreated {
                0
            } else {
                (created + 1) * SEC
            },
            finished_at: if exited { (created + 5) * SEC } else { 0 },
            exit_code: exit,
            image_ref: format!("sha256:{name}"),
            ..Default::default()
        }
    }

    use api::ContainerState::{
        ContainerCreated as CREATED, ContainerExited as EXITED, ContainerRunning as RUNNING,
    };

    fn runtime(containers: Vec<api::ContainerStatus>) -> PodRuntimeStatus {
        let mut containers = containers;
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        PodRuntimeStatus {
            uid: "uid-p".into(),
            name: "p".into(),
            namespace: "default".into(),
            sandboxes: vec![api::PodSandboxStatus {
                id: "sb".into(),
                state: api::PodSandboxState::SandboxReady as i32,
                network: Some(api::PodSandboxNetworkStatus {
                    ip: "10.1.0.7".into(),
                    additional_ips: vec![api::PodIp {
                        ip: "fd00::7".into(),
                    }],
                }),
                ..Default::default()
            }],
            containers,
            container_meta: HashMap::new(),
        }
    }

    fn with_meta(mut r: PodRuntimeStatus, id: &str, restart_count: i32) -> PodRuntimeStatus {
        r.container_meta.insert(
            id.into(),
            ContainerMeta {
                restart_count,
                ..Default::default()
            },
        );
        r
    }

    fn pod(policy: &str, inits: &[&str], apps: &[&str]) -> DesiredPod {
        let list = |names: &[&str]| {
            names
                .iter()
                .map(|n| format!("{{name: {n}, image: img-{n}}}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        desired(&format!(
            "metadata: {{name: p}}\nspec:\n  restartPolicy: {policy}\n  initContainers: [{}]\n  containers: [{}]\n",
            list(inits),
            list(apps)
        ))
    }

    fn cond<'a>(s: &'a PodStatus, kind: &str) -> &'a PodCondition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == kind)
            .unwrap()
    }

    fn app<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
        s.container_statuses
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.name == name)
            .unwrap()
    }

    fn init<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
        s.init_container_statuses
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.name == name)
            .unwrap()
    }

    fn waiting_reason(c: &ContainerStatus) -> Option<&str> {
        c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
    }

    fn phase(s: &PodStatus) -> &str {
        s.phase.as_deref().unwrap()
    }

    fn compute(p: &DesiredPod, r: Option<&PodRuntimeStatus>) -> PodStatus {
        compute_pod_status(p, r, &PodHints::default(), &ctx())
    }

    #[test]
    fn status_should_be_pending_before_anything_runs() {
        let p = pod("Always", &[], &["a", "b"]);
        let hints = PodHints {
            start_time: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            ..Default::default()
        };
        let s = compute_pod_status(&p, None, &hints, &ctx());
        assert_eq!(phase(&s), "Pending");
        assert_eq!(waiting_reason(app(&s, "a")), Some("ContainerCreating"));
        assert_eq!(app(&s, "a").image, "img-a");
        assert_eq!(app(&s, "a").container_id, None);
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "False");
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(cond(&s, "PodScheduled").status, "True");
        let ready = cond(&s, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("ContainersNotReady"))
        );
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [a b]")
        );
        assert_eq!(cond(&s, "ContainersReady").message, ready.message);
        assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(s.host_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(s.host_ips.as_ref().unwrap()[0].ip, "192.168.1.10");
        assert_eq!(s.pod_ip, None);
        assert_eq!(s.start_time.unwrap().0.as_second(), 1_700_000_000);
        assert!(s.init_container_statuses.is_none());
        let types: Vec<_> = s
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            [
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled"
            ]
        );
    }

    #[test]
    fn status_should_be_running_and_ready_when_all_run() {
        let p = pod("Always", &[], &["a", "b"]);
        let r = runtime(vec![
            rc("a", "ida", RUNNING, 100, 0),
            rc("b", "idb", RUNNING, 101, 0),
        ]);
        let s = compute(&p, Some(&r));
        assert_eq!(phase(&s), "Running");
        for kind in [
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
        ] {
            assert_eq!(cond(&s, kind).status, "True", "{kind}");
        }
        let a = app(&s, "a");
        assert!(a.ready);
        assert_eq!(a.started, Some(true));
        assert_eq!(a.container_id.as_deref(), Some("petrel://ida"));
        assert_eq!(a.image_id, "sha256:a");
        assert_eq!(a.restart_count, 0);
        let running = a.state.as_ref().unwrap().running.as_ref().unwrap();
        assert_eq!(running.started_at.as_ref().unwrap().0.as_second(), 101);
        assert_eq!(a.last_state, Some(ContainerState::default()));
        assert_eq!(s.pod_ip.as_deref(), Some("10.1.0.7"));
        let ips: Vec<_> = s
            .pod_ips
            .as_ref()
            .unwrap()
            .iter()
            .map(|i| i.ip.as_str())
            .collect();
        assert_eq!(ips, ["10.1.0.7", "fd00::7"]);
    }

    #[test]
    fn status_should_be_pending_while_some_container_is_missing_or_created() {
        let p = pod("Always", &[], &["a", "b"]);
        let s = compute(&p, Some(&runtime(vec![rc("a", "ida", RUNNING, 100, 0)])));
        assert_eq!(phase(&s), "Pending");
        assert_eq!(waiting_reason(app(&s, "b")), Some("ContainerCreating"));
        let s = compute(
            &p,
            Some(&runtime(vec![
                rc("a", "ida", RUNNING, 100, 0),
                rc("b", "idb", CREATED, 101, 0),
            ])),
        );
        assert_eq!(phase(&s), "Pending");
        assert_eq!(waiting_reason(app(&s, "b")), Some("ContainerCreating"));
        assert_eq!(app(&s, "b").container_id.as_deref(), Some("petrel://idb"));
        assert_eq!(
            cond(&s, "Ready").message.as_deref(),
            Some("containers with unready status: [b]")
        );
    }

    #[test]
    fn status_should_wait_for_init_containers() {
        let p = pod("Always", &["i1", "i2"], &["a"]);
        let s = compute(&p, Some(&runtime(vec![rc("i1", "id1", RUNNING, 100, 0)])));
        assert_eq!(phase(&s), "Pending");
        let c = cond(&s, "Initialized");
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("ContainersNotInitialized"))
        );
        assert_eq!(
            c.message.as_deref(),
            Some("containers with incomplete status: [i1 i2]")
        );
        assert_eq!(waiting_reason(init(&s, "i2")), Some("PodInitializing"));
        assert_eq!(waiting_reason(app(&s, "a")), Some("PodInitializing"));
        assert!(!init(&s, "i1").ready);

        let s = compute(
            &p,
            Some(&runtime(vec![
                rc("i1", "id1", EXITED, 100, 0),
                rc("i2", "id2", EXITED, 110, 0),
            ])),
        );
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert!(init(&s, "i1").ready && init(&s, "i2").ready);
        let t = init(&s, "i2")
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!(t.reason.as_deref(), Some("Completed"));
        assert_eq!(waiting_reason(app(&s, "a")), Some("ContainerCreating"));
        assert_eq!(phase(&s), "Pending");
    }

    #[test]
    fn status_should_treat_inits_as_done_once_apps_exist() {
        let p = pod("Always", &["i1"], &["a"]);
        let s = compute(&p, Some(&runtime(vec![rc("a", "ida", RUNNING, 200, 0)])));
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(phase(&s), "Running");
    }

    #[test]
    fn status_should_fail_on_a_failed_init_only_with_restart_never() {
        let r = runtime(vec![rc("i1", "id1", EXITED, 100, 3)]);
        let s = compute(&pod("OnFailure", &["i1"], &["a"]), Some(&r));
        assert_eq!(phase(&s), "Pending");
        assert!(!init(&s, "i1").ready);
        let t = init(&s, "i1")
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
        let s = compute(&pod("Never", &["i1"], &["a"]), Some(&r));
        assert_eq!(phase(&s), "Failed");
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
    }

    /// A pod with init containers `setup` and the sidecar `proxy`, and the
    /// app `main`.
    fn sidecar_pod(policy: &str) -> DesiredPod {
        desired(&format!(
            "metadata: {{name: p}}\nspec:\n  restartPolicy: {policy}\n  initContainers:\n  - {{name: setup, image: i}}\n  - {{name: proxy, image: i, restartPolicy: Always}}\n  containers: [{{name: main, image: i}}]\n"
        ))
    }

    #[test]
    fn status_should_show_a_running_sidecar_as_an_init_container_that_is_ready() {
        let p = sidecar_pod("Always");
        let r = runtime(vec![
            rc("setup", "ids", EXITED, 100, 0),
            rc("proxy", "idp", RUNNING, 110, 0),
        ]);
        let s = compute(&p, Some(&r));
        let proxy = init(&s, "proxy");
        assert!(proxy.state.as_ref().unwrap().running.is_some());
        assert!(proxy.ready && proxy.started == Some(true));
        assert_eq!(cond(&s, "Initialized").status, "True");
        assert_eq!(waiting_reason(app(&s, "main")), Some("ContainerCreating"));
        assert_eq!(phase(&s), "Pending", "main is not created yet");

        let mut r = r;
        r.containers.insert(0, rc("main", "idm", RUNNING, 120, 0));
        let s = compute(&p, Some(&r));
        assert_eq!(phase(&s), "Running");
        assert_eq!(cond(&s, "Ready").status, "True");
        // The sidecar's readiness is the pod's too.
        let mut hints = PodHints::default();
        hints.containers.insert(
            "proxy".into(),
            ContainerHints {
                ready: Some(false),
                ..Default::default()
            },
        );
        let s = compute_pod_status(&p, Some(&r), &hints, &ctx());
        assert_eq!(
            cond(&s, "ContainersReady").message.as_deref(),
            Some("containers with unready status: [proxy]")
        );
        assert_eq!(phase(&s), "Running");
    }

    #[test]
    fn status_should_hold_initialization_until_a_sidecar_started() {
        let p = sidecar_pod("Always");
        let r = runtime(vec![
            rc("setup", "ids", EXITED, 100, 0),
            rc("proxy", "idp", RUNNING, 110, 0),
        ]);
        let mut hints = PodHints::default();
        hints.containers.insert(
            "proxy".into(),
            ContainerHints {
                started: Some(false),
                ..Default::default()
            },
        );
        let s = compute_pod_status(&p, Some(&r), &hints, &ctx());
        assert_eq!(phase(&s), "Pending");
        let c = cond(&s, "Initialized");
        assert_eq!(
            c.message.as_deref(),
            Some("containers with incomplete status: [proxy]")
        );
        assert_eq!(waiting_reason(app(&s, "main")), Some("PodInitializing"));
        assert_eq!(init(&s, "proxy").started, Some(false));
    }

    #[test]
    fn status_should_complete_a_pod_whatever_its_stopped_sidecars() {
        for (code, want) in [(0, "Succeeded"), (1, "Failed")] {
            let p = sidecar_pod("Never");
            let setup = || rc("setup", "ids", EXITED, 100, 0);
            let main = || rc("main", "idm", EXITED, 120, code);
            let r = runtime(vec![setup(), rc("proxy", "idp", RUNNING, 110, 0), main()]);
            assert_eq!(phase(&compute(&p, Some(&r))), "Running", "the sidecar runs");
            // Stopped by the agent: killed, 137, which does not count.
            let r = runtime(vec![setup(), rc("proxy", "idp", EXITED, 110, 137), main()]);
            let s = compute(&p, Some(&r));
            assert_eq!(phase(&s), want);
            assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
            let t = init(&s, "proxy").state.as_ref().unwrap().terminated.clone();
            assert_eq!(t.unwrap().exit_code, 137);
        }
    }

    #[test]
    fn status_should_reach_terminal_phases_by_restart_policy() {
        let ok = || rc("a", "ida", EXITED, 100, 0);
        let bad = || rc("b", "idb", EXITED, 100, 1);
        let both_ok = runtime(vec![ok(), rc("b", "idb", EXITED, 100, 0)]);
        let one_bad = runtime(vec![ok(), bad()]);
        let cases = [
            ("Never", &both_ok, false, "Succeeded"),
            ("Never", &one_bad, false, "Failed"),
            ("OnFailure", &both_ok, false, "Succeeded"),
            ("OnFailure", &one_bad, false, "Running"),
            ("OnFailure", &one_bad, true, "Failed"),
            ("Always", &both_ok, false, "Running"),
            ("Always", &one_bad, false, "Running"),
            ("Always", &both_ok, true, "Succeeded"),
            ("Always", &one_bad, true, "Failed"),
        ];
        for (policy, r, terminating, want) in cases {
            let hints = PodHints {
                terminating,
                ..Default::default()
            };
            let s = compute_pod_status(&pod(policy, &[], &["a", "b"]), Some(r), &hints, &ctx());
            assert_eq!(phase(&s), want, "{policy} terminating={terminating}");
        }
        let s = compute(&pod("Never", &[], &["a", "b"]), Some(&both_ok));
        for kind in ["Ready", "ContainersReady"] {
            let c = cond(&s, kind);
            assert_eq!(
                (c.status.as_str(), c.reason.as_deref()),
                ("False", Some("PodCompleted"))
            );
        }
        let t = app(&s, "a")
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!(t.started_at.as_ref().unwrap().0.as_second(), 101);
        assert_eq!(t.finished_at.as_ref().unwrap().0.as_second(), 105);
        assert_eq!(t.container_id.as_deref(), Some("petrel://ida"));
    }

    #[test]
    fn status_should_show_crash_loop_backoff_with_the_last_exit() {
        let p = pod("Always", &[], &["a"]);
        let r = with_meta(
            runtime(vec![
                rc("a", "old", EXITED, 100, 1),
                rc("a", "new", EXITED, 200, 2),
            ]),
            "new",
            4,
        );
        let mut hints = PodHints::default();
        hints.containers.insert(
            "a".into(),
            ContainerHints {
                waiting: Some((
                    "CrashLoopBackOff".into(),
                    "back-off 40s restarting failed container".into(),
                )),
                ..Default::default()
            },
        );
        let s = compute_pod_status(&p, Some(&r), &hints, &ctx());
        let a = app(&s, "a");
        let w = a.state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
        assert_eq!(
            w.message.as_deref(),
            Some("back-off 40s restarting failed container")
        );
        let last = a.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (last.exit_code, last.container_id.as_deref()),
            (2, Some("petrel://new"))
        );
        assert_eq!(a.restart_count, 4);
        assert!(!a.ready);
        assert_eq!(phase(&s), "Running", "restarting, not pending");
    }

    #[test]
    fn status_should_show_the_previous_instance_as_last_state() {
        let p = pod("Always", &[], &["a"]);
        let r = runtime(vec![
            rc("a", "old", EXITED, 100, 137),
            rc("a", "mid", EXITED, 150, 1),
            rc("a", "new", RUNNING, 200, 0),
        ]);
        let s = compute(&p, Some(&r));
        let a = app(&s, "a");
        assert_eq!(a.restart_count, 2, "instances - 1 without the annotation");
        let last = a.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(last.container_id.as_deref(), Some("petrel://mid"));
        assert_eq!(a.container_id.as_deref(), Some("petrel://new"));
        let s = compute(&p, Some(&with_meta(r, "new", 7)));
        assert_eq!(app(&s, "a").restart_count, 7, "the annotation wins");
    }

    #[test]
    fn status_should_keep_the_runtimes_termination_reason() {
        let p = pod("Never", &[], &["a"]);
        let mut c = rc("a", "ida", EXITED, 100, 137);
        c.reason = "OOMKilled".into();
        c.message = "memory limit".into();
        let s = compute(&p, Some(&runtime(vec![c])));
        let t = app(&s, "a")
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap();
        assert_eq!(
            (t.reason.as_deref(), t.message.as_deref(), t.exit_code),
            (Some("OOMKilled"), Some("memory limit"), 137)
        );
        assert_eq!(phase(&s), "Failed");
    }

    #[test]
    fn status_should_follow_probe_hints() {
        let p = pod("Always", &[], &["a"]);
        let r = runtime(vec![rc("a", "ida", RUNNING, 100, 0)]);
        let mut hints = PodHints {
            message: Some("probing".into()),
            ..Default::default()
        };
        hints.containers.insert(
            "a".into(),
            ContainerHints {
                ready: Some(false),
                started: Some(false),
                waiting: None,
            },
        );
        let s = compute_pod_status(&p, Some(&r), &hints, &ctx());
        let a = app(&s, "a");
        assert!(!a.ready);
        assert_eq!(a.started, Some(false));
        assert!(
            a.state.as_ref().unwrap().running.is_some(),
            "a waiting hint is ignored while running"
        );
        assert_eq!(cond(&s, "Ready").status, "False");
        assert_eq!(phase(&s), "Running");
        assert_eq!(s.message.as_deref(), Some("probing"));
    }

    #[test]
    fn status_should_show_worker_waiting_reasons_for_never_created_containers() {
        let p = pod("Always", &[], &["a"]);
        let mut hints = PodHints::default();
        hints.containers.insert(
            "a".into(),
            ContainerHints {
                waiting: Some(("ErrImageNeverPull".into(), "image x not present".into())),
                ..Default::default()
            },
        );
        let s = compute_pod_status(&p, None, &hints, &ctx());
        assert_eq!(waiting_reason(app(&s, "a")), Some("ErrImageNeverPull"));
        assert_eq!(phase(&s), "Pending");
    }

    #[test]
    fn status_should_report_invalid_manifests() {
        let mut p = pod("Always", &["i"], &["a"]);
        p.invalid = Some("spec.containers[a].image: missing".into());
        let s = compute(&p, None);
        assert_eq!(phase(&s), "Pending");
        assert_eq!(s.reason.as_deref(), Some("InvalidManifest"));
        assert_eq!(
            s.message.as_deref(),
            Some("spec.containers[a].image: missing")
        );
        assert_eq!(waiting_reason(app(&s, "a")), Some("InvalidManifest"));
        assert_eq!(waiting_reason(init(&s, "i")), Some("InvalidManifest"));
        assert_eq!(cond(&s, "Ready").status, "False");
        assert_eq!(cond(&s, "PodScheduled").status, "True");
    }

    #[test]
    fn status_should_report_an_api_pod_it_cannot_run_as_kubelet_does() {
        let mut p = pod("Always", &["i"], &["a", "b"]);
        p.source = PodOrigin::Api;
        p.invalid = Some("spec.volumes[v]: Unsupported value: \"configMap\"".into());
        let s = compute(&p, None);
        assert_eq!(phase(&s), "Pending");
        assert_eq!(s.reason, None);
        let a = app(&s, "a");
        assert_eq!(waiting_reason(a), Some("CreateContainerConfigError"));
        let msg = a
            .state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .message
            .as_deref();
        assert!(msg.unwrap().contains("configMap"), "{msg:?}");
        assert_eq!(
            waiting_reason(init(&s, "i")),
            Some("CreateContainerConfigError")
        );
        let ready = cond(&s, "Ready");
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [a b]")
        );
    }

    #[test]
    fn status_should_use_the_host_ip_for_host_network_pods() {
        let p = desired("metadata: {name: p}\nspec:\n  hostNetwork: true\n  containers: [{name: a, image: x, resources: {limits: {cpu: '1', memory: 1Gi}}}]\n");
        let mut r = runtime(vec![rc("a", "ida", RUNNING, 100, 0)]);
        r.sandboxes[0].network = None;
        let s = compute(&p, Some(&r));
        assert_eq!(s.pod_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(s.pod_ips.as_ref().unwrap().len(), 1);
        assert_eq!(s.qos_class.as_deref(), Some("Guaranteed"));
        // A created container shows the cpu and memory it was made with.
        let cs = &s.container_statuses.as_ref().unwrap()[0];
        let res = cs.resources.as_ref().unwrap();
        assert_eq!(res.limits.as_ref().unwrap()["memory"].0, "1Gi");
        assert_eq!(res.limits.as_ref().unwrap()["cpu"].0, "1");
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "True");
        r.sandboxes[0].state = api::PodSandboxState::SandboxNotready as i32;
        assert_eq!(
            cond(&compute(&p, Some(&r)), "PodReadyToStartContainers").status,
            "False"
        );
    }

    #[test]
    fn carry_transition_times_should_keep_unchanged_conditions() {
        let p = pod("Always", &[], &["a"]);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let t1 = SystemTime::UNIX_EPOCH + Duration::from_secs(2000);
        let mut first = compute(&p, None);
        carry_transition_times(None, &mut first, t0);
        assert!(first.conditions.iter().flatten().all(|c| c
            .last_transition_time
            .as_ref()
            .unwrap()
            .0
            .as_second()
            == 1000));
        let mut second = compute(&p, Some(&runtime(vec![rc("a", "ida", RUNNING, 100, 0)])));
        carry_transition_times(Some(&first), &mut second, t1);
        let at = |s: &PodStatus, k: &str| {
            cond(s, k)
                .last_transition_time
                .as_ref()
                .unwrap()
                .0
                .as_second()
        };
        assert_eq!(at(&second, "PodScheduled"), 1000);
        assert_eq!(at(&second, "Initialized"), 1000);
        assert_eq!(at(&second, "Ready"), 2000);
        assert_eq!(at(&second, "PodReadyToStartContainers"), 2000);
    }

    #[test]
    fn published_pod_should_carry_metadata_spec_and_status() {
        let p = pod("Always", &[], &["a"]);
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let hints = PodHints {
            start_time: Some(start),
            ..Default::default()
        };
        let status = compute_pod_status(&p, None, &hints, &ctx());
        let out = published_pod(&p, status.clone(), None);
        assert_eq!(out.metadata.uid.as_deref(), Some("uid-p"));
        assert_eq!(out.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(out.metadata.creation_timestamp, status.start_time);
        assert!(out.metadata.deletion_timestamp.is_none());
        assert_eq!(out.spec, p.pod.spec);
        assert_eq!(out.status.as_ref(), Some(&status));
        let json = serde_json::to_value(&out).unwrap();
        assert_eq!(json["kind"], "Pod");
        assert_eq!(json["apiVersion"], "v1");
        assert_eq!(json["status"]["startTime"], "2023-11-14T22:13:20Z");

        let out = published_pod(&p, status, Some(start + Duration::from_secs(5)));
        assert_eq!(
            out.metadata.deletion_timestamp.unwrap().0.as_second(),
            1_700_000_005
        );
        assert_eq!(out.metadata.deletion_grace_period_seconds, Some(30));
    }

    #[test]
    fn times_should_convert_from_nanoseconds() {
        assert_eq!(time_from_nanos(0), None);
        assert_eq!(time_from_nanos(-5), None);
        let t = time_from_nanos(1_700_000_000 * SEC + 500).unwrap();
        assert_eq!(t.0.as_nanosecond(), 1_700_000_000_000_000_500);
    }
}
