//! What kubelet's container manager writes on the pods' cgroups, computed
//! from pods alone: no I/O here.
//!
//! Three levels, as kubelet's cgroupfs layout has them:
//! - `kubepods`: cpu shares of the node's allocatable cpu (its memory and
//!   pids limits are node allocatable's, written by the eviction manager);
//! - the QoS tiers `kubepods/burstable` (shares: the sum of its pods' cpu
//!   requests) and `kubepods/besteffort` (the minimum shares);
//! - each pod's own cgroup, from its requests and limits
//!   ([`pod_config`], kubelet's `ResourceConfigForPod`).

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::convert::{qos_class, QosClass};

/// The fewest cpu shares the kernel accepts (kubelet's `MinShares`).
pub const MIN_SHARES: u64 = 2;
/// The most cpu shares the kernel accepts (kubelet's `MaxShares`).
pub const MAX_SHARES: u64 = 262_144;
/// The CFS period kubelet uses, microseconds (`--cpu-cfs-quota-period`'s
/// default; the agent has no such flag).
pub const QUOTA_PERIOD_US: u64 = 100_000;
/// The smallest CFS quota the kernel accepts, microseconds.
const MIN_QUOTA_US: i64 = 1_000;

/// The values one cgroup gets; `None` leaves that value as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    /// Relative cpu weight, in cgroup v1 shares (v2's `cpu.weight` is
    /// derived from them).
    pub cpu_shares: Option<u64>,
    /// CFS quota per period, microseconds; -1: unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period, microseconds.
    pub cpu_period: Option<u64>,
    /// Memory limit, bytes.
    pub memory: Option<i64>,
    /// Process-id limit.
    pub pids: Option<i64>,
}

/// Millicores to cpu shares (kubelet's `MilliCPUToShares`): 1024 shares a
/// cpu, at least [`MIN_SHARES`] (no request is the minimum, not the
/// kernel's default of 1024) and at most [`MAX_SHARES`].
pub fn milli_cpu_to_shares(millis: i64) -> u64 {
    let shares = millis.max(0).saturating_mul(1024) / 1000;
    (shares.max(0) as u64).clamp(MIN_SHARES, MAX_SHARES)
}

/// Millicores to a CFS quota over `period_us` (kubelet's
/// `MilliCPUToQuota`): 0 for no limit, else at least 1 ms.
pub fn milli_cpu_to_quota(millis: i64, period_us: u64) -> i64 {
    if millis <= 0 {
        return 0;
    }
    let period = i64::try_from(period_us).unwrap_or(i64::MAX);
    (millis.saturating_mul(period) / 1000).max(MIN_QUOTA_US)
}

/// `kubepods`: shares of the node's allocatable cpu, so that pods as a
/// whole weigh what the node gives them against the system's cgroups.
pub fn top_level_config(allocatable_cpu_millis: i64) -> ResourceConfig {
    ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(allocatable_cpu_millis)),
        ..Default::default()
    }
}

/// `kubepods/besteffort`: the minimum shares, whatever its pods.
pub fn best_effort_config() -> ResourceConfig {
    ResourceConfig {
        cpu_shares: Some(MIN_SHARES),
        ..Default::default()
    }
}

/// `kubepods/burstable`: shares of the sum of its pods' cpu requests
/// (millicores), so the tier weighs what its pods asked for beside the
/// Guaranteed pods, which sit directly in `kubepods`.
pub fn burstable_config(cpu_request_millis: i64) -> ResourceConfig {
    ResourceConfig {
        cpu_shares: Some(milli_cpu_to_shares(cpu_request_millis)),
        ..Default::default()
    }
}

/// The pod's cpu request in millicores as kubelet counts it for cgroups:
/// sidecar and init container rules, pod-level requests and the pod's
/// overhead included (the same sum admission uses).
pub fn pod_cpu_request(pod: &Pod) -> i64 {
    crate::admission::pod_requests(pod)
        .get("cpu")
        .copied()
        .unwrap_or(0)
}

/// A pod's cpu and memory limits summed as kubelet's `PodLimits` does,
/// and whether every container (each init container at its point, the
/// sidecars started before it included) has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PodLimits {
    cpu_millis: i64,
    memory: i64,
    cpu_declared: bool,
    memory_declared: bool,
}

/// A container's cpu (millicores) and memory (bytes) limits; unset or
/// unreadable is 0 (the API server refuses the latter).
fn container_limits(c: &Container) -> [i64; 2] {
    let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    let get = |name: &str| {
        limits
            .and_then(|l| l.get(name))
            .and_then(|q| {
                if name == "cpu" {
                    crate::quantity::cpu_millis(&q.0).ok()
                } else {
                    crate::quantity::bytes(&q.0).ok()
                }
            })
            .unwrap_or(0)
            .max(0)
    };
    [get("cpu"), get("memory")]
}

fn pod_limits(spec: &PodSpec) -> PodLimits {
    let mut sum = [0i64; 2];
    let mut declared = [true; 2];
    let mut note = |l: &[i64; 2]| {
        for i in 0..2 {
            if l[i] == 0 {
                declared[i] = false;
            }
        }
    };
    for c in &spec.containers {
        let l = container_limits(c);
        note(&l);
        for i in 0..2 {
            sum[i] = sum[i].saturating_add(l[i]);
        }
    }
    // Init containers: a sidecar runs beside everything after it; a
    // regular one beside the sidecars before it. The pod needs the
    // largest of those moments, or what its running containers need.
    let mut sidecars = [0i64; 2];
    let mut init_peak = [0i64; 2];
    for c in spec.init_containers.iter().flatten() {
        let own = container_limits(c);
        let at_its_point = if c.restart_policy.as_deref() == Some("Always") {
            for i in 0..2 {
                sum[i] = sum[i].saturating_add(own[i]);
                sidecars[i] = sidecars[i].saturating_add(own[i]);
            }
            sidecars
        } else {
            [
                own[0].saturating_add(sidecars[0]),
                own[1].saturating_add(sidecars[1]),
            ]
        };
        note(&at_its_point);
        for i in 0..2 {
            init_peak[i] = init_peak[i].max(at_its_point[i]);
        }
    }
    for i in 0..2 {
        sum[i] = sum[i].max(init_peak[i]);
    }
    // Pod-level limits replace the containers' (and declare the limit).
    if let Some(pod_level) = spec.resources.as_ref() {
        let c = Container {
            resources: Some(pod_level.clone()),
            ..Default::default()
        };
        let l = container_limits(&c);
        for i in 0..2 {
            if l[i] > 0 {
                sum[i] = l[i];
                declared[i] = true;
            }
        }
    }
    // The overhead counts only where there is a limit to add it to.
    if let Some(overhead) = spec.overhead.as_ref() {
        let c = Container {
            resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                limits: Some(overhead.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let o = container_limits(&c);
        for i in 0..2 {
            if sum[i] > 0 {
                sum[i] = sum[i].saturating_add(o[i]);
            }
        }
    }
    PodLimits {
        cpu_millis: sum[0],
        memory: sum[1],
        cpu_declared: declared[0],
        memory_declared: declared[1],
    }
}

/// The pod cgroup's values (kubelet's `ResourceConfigForPod` with cfs
/// quota enforced): shares from the pod's cpu request; for a Guaranteed
/// pod, quota and memory limit from its limits; for a Burstable one, each
/// only if every container has that limit; for a BestEffort one, the
/// minimum shares only. `pod_pids_limit` (`--pod-max-pids`) applies when
/// positive.
pub fn pod_config(pod: &Pod, pod_pids_limit: i64) -> ResourceConfig {
    let Some(spec) = pod.spec.as_ref() else {
        return ResourceConfig::default();
    };
    let limits = pod_limits(spec);
    let shares = milli_cpu_to_shares(pod_cpu_request(pod));
    let quota = milli_cpu_to_quota(limits.cpu_millis, QUOTA_PERIOD_US);
    let mut r = ResourceConfig::default();
    match qos_class(spec) {
        QosClass::Guaranteed => {
            r.cpu_shares = Some(shares);
            r.cpu_quota = Some(quota);
            r.cpu_period = Some(QUOTA_PERIOD_US);
            r.memory = Some(limits.memory);
        }
        QosClass::Burstable => {
            r.cpu_shares = Some(shares);
            if limits.cpu_declared {
                r.cpu_quota = Some(quota);
                r.cpu_period = Some(QUOTA_PERIOD_US);
            }
            if limits.memory_declared {
                r.memory = Some(limits.memory);
            }
        }
        QosClass::BestEffort => r.cpu_shares = Some(MIN_SHARES),
    }
    if pod_pids_limit > 0 {
        r.pids = Some(pod_pids_limit);
    }
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::container_with;

    const MI: i64 = 1024 * 1024;

    fn pod(init: Vec<Container>, apps: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: (!init.is_empty()).then_some(init),
                containers: apps,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sidecar(mut c: Container) -> Container {
        c.restart_policy = Some("Always".into());
        c
    }

    #[test]
    fn shares_should_follow_kubelets_conversion() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(250), 256);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(2000), 2048);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_shares(-5), 2);
    }

    #[test]
    fn quota_should_follow_kubelets_conversion() {
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD_US), 0);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD_US), 1000, "1 ms floor");
        assert_eq!(milli_cpu_to_quota(10, QUOTA_PERIOD_US), 1000);
        assert_eq!(milli_cpu_to_quota(250, QUOTA_PERIOD_US), 25_000);
        assert_eq!(milli_cpu_to_quota(1500, QUOTA_PERIOD_US), 150_000);
    }

    #[test]
    fn tiers_should_get_kubelets_shares() {
        assert_eq!(top_level_config(2000).cpu_shares, Some(2048));
        assert_eq!(top_level_config(1500).cpu_shares, Some(1536));
        assert_eq!(best_effort_config().cpu_shares, Some(2));
        assert_eq!(burstable_config(0).cpu_shares, Some(2));
        assert_eq!(burstable_config(350).cpu_shares, Some(358));
        assert_eq!(burstable_config(350).memory, None);
    }

    #[test]
    fn guaranteed_pod_should_get_shares_quota_and_memory() {
        let g = || container_with(&[], &[("cpu", "500m"), ("memory", "64Mi")]);
        let p = pod(vec![], vec![g(), g()]);
        assert_eq!(
            pod_config(&p, -1),
            ResourceConfig {
                cpu_shares: Some(1024),
                cpu_quota: Some(100_000),
                cpu_period: Some(100_000),
                memory: Some(128 * MI),
                pids: None,
            }
        );
        assert_eq!(pod_config(&p, 1024).pids, Some(1024));
    }

    #[test]
    fn burstable_pod_should_get_each_limit_only_when_every_container_has_it() {
        let limited = container_with(
            &[("cpu", "100m"), ("memory", "32Mi")],
            &[("cpu", "200m"), ("memory", "64Mi")],
        );
        let cpu_only = container_with(&[("cpu", "100m")], &[("cpu", "300m")]);
        let p = pod(vec![], vec![limited.clone(), cpu_only]);
        let r = pod_config(&p, 0);
        assert_eq!(r.cpu_shares, Some(204));
        assert_eq!(r.cpu_quota, Some(50_000));
        assert_eq!(r.cpu_period, Some(100_000));
        assert_eq!(r.memory, None, "one container has no memory limit");
        assert_eq!(r.pids, None, "0 is no limit");

        let p = pod(vec![], vec![limited, container_with(&[], &[])]);
        let r = pod_config(&p, -1);
        assert_eq!((r.cpu_quota, r.memory), (None, None));
        assert_eq!(r.cpu_shares, Some(102));
    }

    #[test]
    fn best_effort_pod_should_get_the_minimum_shares_only() {
        let p = pod(vec![], vec![container_with(&[], &[])]);
        assert_eq!(
            pod_config(&p, -1),
            ResourceConfig {
                cpu_shares: Some(2),
                ..Default::default()
            }
        );
    }

    #[test]
    fn init_containers_and_sidecars_should_count_as_kubelet_counts_them() {
        // Apps 200m; a sidecar 100m runs beside them; a regular init
        // container 1 cpu runs beside the sidecar before it: peak 1100m.
        let app = container_with(
            &[("cpu", "200m"), ("memory", "64Mi")],
            &[("cpu", "200m"), ("memory", "64Mi")],
        );
        let side = sidecar(container_with(
            &[("cpu", "100m"), ("memory", "16Mi")],
            &[("cpu", "100m"), ("memory", "16Mi")],
        ));
        let init = container_with(
            &[("cpu", "1"), ("memory", "8Mi")],
            &[("cpu", "1"), ("memory", "8Mi")],
        );
        let p = pod(vec![side, init], vec![app]);
        let r = pod_config(&p, -1);
        assert_eq!(r.cpu_shares, Some(1126), "max(300m, 1100m) requested");
        assert_eq!(r.cpu_quota, Some(110_000));
        assert_eq!(r.memory, Some(80 * MI), "max(80Mi, 24Mi)");

        // An init container without a memory limit: not every container
        // has one, so a Burstable pod gets no memory limit.
        let app = container_with(&[("cpu", "200m")], &[("cpu", "200m"), ("memory", "64Mi")]);
        let init = container_with(&[], &[("cpu", "100m")]);
        let r = pod_config(&pod(vec![init], vec![app]), -1);
        assert_eq!(r.memory, None);
        assert_eq!(r.cpu_quota, Some(20_000));
    }

    #[test]
    fn overhead_should_add_to_requests_and_to_limits_that_exist() {
        let mut p = pod(
            vec![],
            vec![container_with(&[("cpu", "100m")], &[("memory", "64Mi")])],
        );
        if let Some(s) = p.spec.as_mut() {
            s.overhead = Some(
                [
                    (
                        "cpu".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("50m".into()),
                    ),
                    (
                        "memory".to_string(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity("10Mi".into()),
                    ),
                ]
                .into(),
            );
        }
        let r = pod_config(&p, -1);
        assert_eq!(r.cpu_shares, Some(153), "150m requested");
        assert_eq!(r.cpu_quota, None, "no cpu limit to add the overhead to");
        assert_eq!(r.memory, Some(74 * MI));
    }

    #[test]
    fn pod_cpu_request_should_default_to_the_limit() {
        let p = pod(vec![], vec![container_with(&[], &[("cpu", "300m")])]);
        assert_eq!(pod_cpu_request(&p), 300);
        assert_eq!(pod_config(&Pod::default(), 5), ResourceConfig::default());
    }
}
