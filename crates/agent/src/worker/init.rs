//! What a pod's init containers need next, native sidecars included: a
//! pure function of the spec and of the instances in the current sandbox,
//! so the rules are tested without a runtime.
//!
//! The rules are kubelet's (computeInitContainerActions, KEP-753):
//! - init containers start in spec order; a regular one must complete (exit
//!   0) before the next starts, a sidecar (`restartPolicy: Always`) must be
//!   started (running, and its startupProbe passed if it has one);
//! - the walk goes from the last init container with an instance
//!   backwards, as a completed instance may have been removed since (the
//!   runtime's garbage collection): an instance proves that every init
//!   container before it did its part, and regular ones are never run
//!   again after that;
//! - a sidecar is kept running for the pod's whole life: started again
//!   when it exits, whatever the pod's restartPolicy, and when its instance
//!   is gone;
//! - a regular init container that fails is run again, unless the pod's
//!   restartPolicy is Never: then the pod has failed.

use k8s_openapi::api::core::v1::Container;
use petrel_cri::api::{self, ContainerState};

use crate::convert::is_sidecar;

/// One init container's next step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum InitStep<'a> {
    /// Create and start an instance: none yet in this sandbox (or a
    /// sidecar's is gone).
    Start(&'a Container),
    /// Start the instance left created.
    StartCreated(&'a Container, &'a api::ContainerStatus),
    /// Start it again after its instance exited (crash-loop backoff
    /// applies): a sidecar, or a failed regular one.
    Restart(&'a Container, &'a api::ContainerStatus),
    /// Stop the instance in an unknown state; a later sync starts it
    /// again.
    Stop(&'a Container, &'a api::ContainerStatus),
    /// A running sidecar: keep it to its spec and its probes.
    Keep(&'a Container, &'a api::ContainerStatus),
}

/// The init containers' steps, in spec order, and where the pod stands.
#[derive(Debug, Default, PartialEq)]
pub(super) struct InitPlan<'a> {
    /// What to do now.
    pub steps: Vec<InitStep<'a>>,
    /// Every init container did its part (or an app container exists): the
    /// app containers may run.
    pub initialized: bool,
    /// A regular init container failed under restartPolicy Never: the pod
    /// has failed for good.
    pub failed: bool,
}

fn state(c: &api::ContainerStatus) -> ContainerState {
    ContainerState::try_from(c.state).unwrap_or(ContainerState::ContainerUnknown)
}

/// The plan for `inits` (the spec's init containers). `latest` gives a
/// container's newest instance in the current sandbox; `apps_created`
/// says whether an app container has an instance there (which proves the
/// pod initialized); `started` whether a running sidecar counts as started
/// (its startupProbe passed, or it has none).
pub(super) fn plan<'a>(
    inits: &'a [Container],
    latest: impl Fn(&str) -> Option<&'a api::ContainerStatus>,
    apps_created: bool,
    policy: &str,
    started: impl Fn(&Container, &api::ContainerStatus) -> bool,
) -> InitPlan<'a> {
    let mut out = InitPlan {
        initialized: apps_created || inits.is_empty(),
        ..Default::default()
    };
    // Walking backwards, "before" means a later init container has an
    // instance: this one did its part once.
    let mut later_has_instance = apps_created;
    // Steps are found backwards; they are returned in spec order.
    let mut steps = Vec::new();
    for (i, c) in inits.iter().enumerate().rev() {
        let sidecar = is_sidecar(c);
        let Some(inst) = latest(&c.name) else {
            if later_has_instance && sidecar {
                steps.push(InitStep::Start(c));
            }
            continue;
        };
        let last = i + 1 == inits.len();
        if later_has_instance && !sidecar {
            continue;
        }
        match state(inst) {
            ContainerState::ContainerCreated => steps.push(InitStep::StartCreated(c, inst)),
            ContainerState::ContainerRunning if sidecar => {
                // (Pushed backwards: the next one's start goes after.)
                if started(c, inst) {
                    if last {
                        out.initialized = true;
                    } else if !later_has_instance {
                        steps.push(InitStep::Start(&inits[i + 1]));
                    }
                }
                steps.push(InitStep::Keep(c, inst));
            }
            // A regular init container runs to completion.
            ContainerState::ContainerRunning => {}
            ContainerState::ContainerExited if sidecar => steps.push(InitStep::Restart(c, inst)),
            ContainerState::ContainerExited if inst.exit_code == 0 => {
                if last {
                    out.initialized = true;
                } else {
                    steps.push(InitStep::Start(&inits[i + 1]));
                }
            }
            ContainerState::ContainerExited if policy == "Never" => {
                out.failed = true;
                out.steps.clear();
                return out;
            }
            ContainerState::ContainerExited => steps.push(InitStep::Restart(c, inst)),
            ContainerState::ContainerUnknown => steps.push(InitStep::Stop(c, inst)),
        }
        later_has_instance = true;
    }
    if !later_has_instance {
        if let Some(first) = inits.first() {
            steps.push(InitStep::Start(first));
        }
    }
    steps.reverse();
    out.steps = steps;
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use ContainerState::{
        ContainerCreated as CREATED, ContainerExited as EXITED, ContainerRunning as RUNNING,
        ContainerUnknown as UNKNOWN,
    };

    /// Init containers by name; a `+` suffix makes a sidecar.
    fn inits(names: &[&str]) -> Vec<Container> {
        names
            .iter()
            .map(|n| Container {
                name: n.trim_end_matches('+').to_string(),
                restart_policy: n.ends_with('+').then(|| "Always".to_string()),
                ..Default::default()
            })
            .collect()
    }

    fn inst(name: &str, state: ContainerState, exit_code: i32) -> api::ContainerStatus {
        api::ContainerStatus {
            id: format!("id-{name}"),
            metadata: Some(api::ContainerMetadata {
                name: name.to_string(),
                attempt: 0,
            }),
            state: state as i32,
            exit_code,
            ..Default::default()
        }
    }

    /// The plan's steps as short strings (`start b`, `keep a`, ...).
    fn run(
        names: &[&str],
        have: &[(&str, ContainerState, i32)],
        apps_created: bool,
        policy: &str,
        unstarted: &[&str],
    ) -> (Vec<String>, bool, bool) {
        let specs = inits(names);
        let instances: HashMap<String, api::ContainerStatus> = have
            .iter()
            .map(|(n, s, code)| (n.to_string(), inst(n, *s, *code)))
            .collect();
        let p = plan(
            &specs,
            |n| instances.get(n),
            apps_created,
            policy,
            |c, _| !unstarted.contains(&c.name.as_str()),
        );
        let steps = p
            .steps
            .iter()
            .map(|s| match s {
                InitStep::Start(c) => format!("start {}", c.name),
                InitStep::StartCreated(c, _) => format!("start-created {}", c.name),
                InitStep::Restart(c, _) => format!("restart {}", c.name),
                InitStep::Stop(c, _) => format!("stop {}", c.name),
                InitStep::Keep(c, _) => format!("keep {}", c.name),
            })
            .collect();
        (steps, p.initialized, p.failed)
    }

    #[test]
    fn plan_should_run_regular_init_containers_one_after_another() {
        let names = ["a", "b"];
        assert_eq!(
            run(&names, &[], false, "Always", &[]),
            (vec!["start a".into()], false, false)
        );
        assert_eq!(
            run(&names, &[("a", RUNNING, 0)], false, "Always", &[]),
            (vec![], false, false)
        );
        assert_eq!(
            run(&names, &[("a", EXITED, 0)], false, "Always", &[]),
            (vec!["start b".into()], false, false)
        );
        // a's completed instance was removed since: b proves it ran.
        assert_eq!(
            run(&names, &[("b", EXITED, 0)], false, "Always", &[]),
            (vec![], true, false)
        );
        assert_eq!(
            run(&names, &[("a", CREATED, 0)], false, "Always", &[]),
            (vec!["start-created a".into()], false, false)
        );
        assert_eq!(
            run(&names, &[("a", UNKNOWN, 0)], false, "Always", &[]),
            (vec!["stop a".into()], false, false)
        );
    }

    #[test]
    fn plan_should_retry_a_failed_init_container_unless_the_policy_is_never() {
        let names = ["a", "s+", "b"];
        let have = [("a", EXITED, 0), ("s", RUNNING, 0), ("b", EXITED, 3)];
        assert_eq!(
            run(&names, &have, false, "OnFailure", &[]),
            (vec!["keep s".into(), "restart b".into()], false, false)
        );
        assert_eq!(
            run(&names, &have, false, "Never", &[]),
            (vec![], false, true)
        );
    }

    #[test]
    fn plan_should_start_the_next_init_container_once_a_sidecar_started() {
        let names = ["a", "s+", "b"];
        assert_eq!(
            run(&names, &[("a", EXITED, 0)], false, "Never", &[]),
            (vec!["start s".into()], false, false)
        );
        let have = [("a", EXITED, 0), ("s", RUNNING, 0)];
        assert_eq!(
            run(&names, &have, false, "Never", &["s"]),
            (vec!["keep s".into()], false, false),
            "its startupProbe has not passed yet"
        );
        assert_eq!(
            run(&names, &have, false, "Never", &[]),
            (vec!["keep s".into(), "start b".into()], false, false)
        );
        let have = [("a", EXITED, 0), ("s", RUNNING, 0), ("b", RUNNING, 0)];
        assert_eq!(
            run(&names, &have, false, "Never", &[]),
            (vec!["keep s".into()], false, false),
            "b runs beside the sidecar"
        );
        let have = [("a", EXITED, 0), ("s", RUNNING, 0), ("b", EXITED, 0)];
        assert_eq!(
            run(&names, &have, false, "Never", &[]),
            (vec!["keep s".into()], true, false)
        );
    }

    #[test]
    fn plan_should_count_a_last_sidecar_as_initialized_once_started() {
        let names = ["s+", "t+"];
        let have = [("s", RUNNING, 0), ("t", RUNNING, 0)];
        assert_eq!(
            run(&names, &have, false, "Always", &["t"]),
            (vec!["keep s".into(), "keep t".into()], false, false)
        );
        assert_eq!(
            run(&names, &have, false, "Always", &[]),
            (vec!["keep s".into(), "keep t".into()], true, false)
        );
    }

    #[test]
    fn plan_should_keep_sidecars_running_whatever_the_restart_policy() {
        let names = ["a", "s+", "t+"];
        // After initialization (apps exist): regular ones are left alone,
        // sidecars restarted when they exited, started when gone.
        let have = [("s", EXITED, 0), ("a", EXITED, 1)];
        assert_eq!(
            run(&names, &have, true, "Never", &[]),
            (vec!["restart s".into(), "start t".into()], true, false)
        );
        let have = [("s", RUNNING, 0), ("t", UNKNOWN, 0)];
        assert_eq!(
            run(&names, &have, true, "Never", &["s"]),
            (vec!["keep s".into(), "stop t".into()], true, false)
        );
    }
}
