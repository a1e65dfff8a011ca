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

use crate::convert::{qos_class, DEFAULT_TERMINATION_GRACE_SECONDS};
use crate::types::{ContainerHints, DesiredPod, PodHints, PodRuntimeStatus};

/// `status.reason` of a pod whose manifest cannot run.
pub const REASON_INVALID_MANIFEST: &str = "InvalidManifest";

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
    let ready = if init {
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
            ..Default::default()
        },
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
        status.reason = Some(REASON_INVALID_MANIFEST.to_string());
        status.message = Some(err.clone());
        let shown = |c: &Container| ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            state: Some(waiting(REASON_INVALID_MANIFEST, Some(err))),
            started: Some(false),
            ..Default::default()
        };
        if !init_specs.is_empty() {
            status.init_container_statuses = Some(init_specs.iter().map(shown).collect());
        }
        status.container_statuses = Some(app_specs.iter().map(shown).collect());
        let msg = Some(err.clone());
        status.conditions = Some(vec![
            condition("Ready", false, Some(REASON_INVALID_MANIFEST), msg.clone()),
            condition("ContainersReady", false, Some(REASON_INVALID_MANIFEST), msg),
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
        match computed.exited {
            Some(0) => {}
            _ if apps_started => {}
            Some(_) if !computed.running => {
                init_failed = true;
                incomplete.push(c.name.clone());
            }
            _ => incomplete.push(c.name.clone()),
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
    let (mut running, mut waiting_n, mut stopped, mut succeeded, mut unknown) = (0, 0, 0, 0, 0);
    let mut unready = Vec::new();
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
