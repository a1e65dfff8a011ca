//! Container resources: cpu shares, quota and memory limit from requests
//! and limits, and the OOM score adjustment from the QoS class.

use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Container;
use petrel_cri::api;

use super::qos::{effective_request, limit};
use super::QosClass;

/// The CFS period kubelet uses, in microseconds.
pub(crate) const CPU_PERIOD_US: i64 = 100_000;
/// The smallest quota the kernel accepts, in microseconds.
const MIN_CPU_QUOTA_US: i64 = 1_000;
/// cgroup v1 cpu.shares bounds.
const MIN_CPU_SHARES: i64 = 2;
const MAX_CPU_SHARES: i64 = 262_144;
/// OOM score adjustments per QoS class.
const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;

/// The node's memory in bytes (MemTotal of /proc/meminfo), read once; 0
/// when it cannot be read.
pub fn node_memory_bytes() -> i64 {
    static TOTAL: OnceLock<i64> = OnceLock::new();
    *TOTAL.get_or_init(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|s| parse_mem_total(&s))
            .unwrap_or(0)
    })
}

/// MemTotal from the text of /proc/meminfo, in bytes.
fn parse_mem_total(meminfo: &str) -> Option<i64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let value: i64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// The OOM score adjustment of a container: the kernel should kill
/// BestEffort containers first and Guaranteed ones last; a Burstable
/// container is protected in proportion to the share of the node's memory
/// it requested, staying strictly between the two other classes.
pub fn oom_score_adj(qos: QosClass, memory_request: i64, node_memory: i64) -> i64 {
    match qos {
        QosClass::Guaranteed => GUARANTEED_OOM_SCORE_ADJ,
        QosClass::BestEffort => BEST_EFFORT_OOM_SCORE_ADJ,
        QosClass::Burstable => {
            let upper = BEST_EFFORT_OOM_SCORE_ADJ - 1;
            let lower = 1000 + GUARANTEED_OOM_SCORE_ADJ;
            if node_memory <= 0 {
                // Unknown capacity: no basis to protect it more.
                return upper;
            }
            let share = (1000i128 * i128::from(memory_request.max(0))) / i128::from(node_memory);
            let adj = 1000i128 - share;
            adj.clamp(i128::from(lower), i128::from(upper)) as i64
        }
    }
}

/// cpu.shares for a cpu request in millicores (none: the minimum).
pub(crate) fn cpu_shares(request_millis: Option<i64>) -> i64 {
    match request_millis {
        Some(m) => (m.saturating_mul(1024) / 1000).clamp(MIN_CPU_SHARES, MAX_CPU_SHARES),
        None => MIN_CPU_SHARES,
    }
}

/// The CFS quota for a cpu limit in millicores, over [`CPU_PERIOD_US`].
pub(crate) fn cpu_quota(limit_millis: i64) -> i64 {
    (limit_millis.saturating_mul(CPU_PERIOD_US) / 1000).max(MIN_CPU_QUOTA_US)
}

/// The container's Linux resources: shares from the cpu request (the limit
/// when only that is set), quota and period from the cpu limit, the memory
/// limit, and the OOM score adjustment of the pod's QoS class.
pub fn linux_resources(
    container: &Container,
    qos: QosClass,
    node_memory: i64,
) -> api::LinuxContainerResources {
    let mut r = api::LinuxContainerResources {
        cpu_shares: cpu_shares(effective_request(container, "cpu")),
        oom_score_adj: oom_score_adj(
            qos,
            effective_request(container, "memory").unwrap_or(0),
            node_memory,
        ),
        ..Default::default()
    };
    if let Some(millis) = limit(container, "cpu") {
        r.cpu_period = CPU_PERIOD_US;
        r.cpu_quota = cpu_quota(millis);
    }
    if let Some(bytes) = limit(container, "memory") {
        r.memory_limit_in_bytes = bytes;
    }
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::container_with;

    #[test]
    fn cpu_shares_should_follow_requests_with_a_floor() {
        assert_eq!(cpu_shares(None), 2);
        assert_eq!(cpu_shares(Some(1)), 2);
        assert_eq!(cpu_shares(Some(100)), 102);
        assert_eq!(cpu_shares(Some(1000)), 1024);
        assert_eq!(cpu_shares(Some(2500)), 2560);
        assert_eq!(cpu_shares(Some(1_000_000)), 262_144);
    }

    #[test]
    fn cpu_quota_should_scale_with_the_limit_with_a_floor() {
        assert_eq!(cpu_quota(500), 50_000);
        assert_eq!(cpu_quota(2000), 200_000);
        assert_eq!(cpu_quota(1), 1000);
        assert_eq!(cpu_quota(10), 1000);
        assert_eq!(cpu_quota(11), 1100);
    }

    #[test]
    fn oom_score_adj_should_order_the_classes() {
        let gib = 1i64 << 30;
        assert_eq!(oom_score_adj(QosClass::Guaranteed, gib, 8 * gib), -997);
        assert_eq!(oom_score_adj(QosClass::BestEffort, 0, 8 * gib), 1000);
        assert_eq!(oom_score_adj(QosClass::Burstable, 2 * gib, 8 * gib), 750);
        assert_eq!(oom_score_adj(QosClass::Burstable, 0, 8 * gib), 999);
        assert_eq!(oom_score_adj(QosClass::Burstable, 8 * gib, 8 * gib), 3);
        assert_eq!(oom_score_adj(QosClass::Burstable, 100 * gib, 8 * gib), 3);
        assert_eq!(oom_score_adj(QosClass::Burstable, gib, 0), 999);
    }

    #[test]
    fn mem_total_should_parse_from_meminfo() {
        let text = "MemTotal:        8038176 kB\nMemFree:          123 kB\n";
        assert_eq!(parse_mem_total(text), Some(8038176 * 1024));
        assert_eq!(parse_mem_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total("MemTotal: x kB\n"), None);
        assert!(node_memory_bytes() > 0);
    }

    #[test]
    fn linux_resources_should_map_requests_and_limits() {
        let c = container_with(
            &[("cpu", "250m"), ("memory", "64Mi")],
            &[("cpu", "500m"), ("memory", "128Mi")],
        );
        let r = linux_resources(&c, QosClass::Burstable, 1 << 30);
        assert_eq!(r.cpu_shares, 256);
        assert_eq!(r.cpu_period, 100_000);
        assert_eq!(r.cpu_quota, 50_000);
        assert_eq!(r.memory_limit_in_bytes, 128 << 20);
        assert_eq!(r.oom_score_adj, 1000 - 1000 * (64 << 20) / (1 << 30));
        assert!(r.hugepage_limits.is_empty());
    }

    #[test]
    fn linux_resources_should_default_the_request_to_the_limit() {
        let c = container_with(&[], &[("cpu", "2"), ("memory", "1Gi")]);
        let r = linux_resources(&c, QosClass::Guaranteed, 8 << 30);
        assert_eq!(r.cpu_shares, 2048);
        assert_eq!(r.cpu_quota, 200_000);
        assert_eq!(r.memory_limit_in_bytes, 1 << 30);
        assert_eq!(r.oom_score_adj, -997);
    }

    #[test]
    fn linux_resources_should_leave_unlimited_fields_unset() {
        let c = container_with(&[], &[]);
        let r = linux_resources(&c, QosClass::BestEffort, 8 << 30);
        assert_eq!(r.cpu_shares, 2);
        assert_eq!(r.cpu_period, 0);
        assert_eq!(r.cpu_quota, 0);
        assert_eq!(r.memory_limit_in_bytes, 0);
        assert_eq!(r.oom_score_adj, 1000);
        let c = container_with(&[("cpu", "100m")], &[]);
        let r = linux_resources(&c, QosClass::Burstable, 8 << 30);
        assert_eq!(r.cpu_shares, 102);
        assert_eq!(r.cpu_quota, 0);
    }
}
