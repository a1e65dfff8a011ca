//! The metrics ListPodSandboxMetrics reports, named as kubelet's
//! `/metrics/cadvisor` names them, with their help, label keys and type.
//! ListMetricDescriptors answers with this table; the metrics built in
//! `sandbox_metrics` take their name, type and label keys from it, so the
//! two never disagree.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::Result;
use crate::service::Runtime;

/// The labels every metric starts with: the pod's name and namespace, the
/// container's name, id and image (empty container and image, and the
/// sandbox id, for a pod-level metric).
pub(crate) const BASE_LABELS: [&str; 5] = ["pod", "namespace", "container", "id", "image"];

/// One metric's description.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Desc {
    /// The metric's name.
    pub name: &'static str,
    /// What it measures.
    pub help: &'static str,
    /// Labels after [`BASE_LABELS`].
    pub extra_labels: &'static [&'static str],
    /// Counter or gauge.
    pub kind: api::MetricType,
}

impl Desc {
    /// The CRI descriptor.
    fn descriptor(&self) -> api::MetricDescriptor {
        api::MetricDescriptor {
            name: self.name.into(),
            help: self.help.into(),
            label_keys: BASE_LABELS
                .iter()
                .chain(self.extra_labels)
                .map(|s| s.to_string())
                .collect(),
        }
    }
}

const fn counter(name: &'static str, help: &'static str) -> Desc {
    Desc {
        name,
        help,
        extra_labels: &[],
        kind: api::MetricType::Counter,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Desc {
    Desc {
        name,
        help,
        extra_labels: &[],
        kind: api::MetricType::Gauge,
    }
}

const fn with(d: Desc, extra_labels: &'static [&'static str]) -> Desc {
    Desc { extra_labels, ..d }
}

const NET: &[&str] = &["interface"];
const DEV: &[&str] = &["device"];

pub(crate) const CPU_USAGE: Desc = counter(
    "container_cpu_usage_seconds_total",
    "CPU time the container used, user and system, in whole seconds.",
);
pub(crate) const CPU_USER: Desc = counter(
    "container_cpu_user_seconds_total",
    "CPU time the container used in user mode, in whole seconds.",
);
pub(crate) const CPU_SYSTEM: Desc = counter(
    "container_cpu_system_seconds_total",
    "CPU time the container used in kernel mode, in whole seconds.",
);
pub(crate) const CFS_PERIODS: Desc = counter(
    "container_cpu_cfs_periods_total",
    "CFS enforcement periods that have elapsed.",
);
pub(crate) const CFS_THROTTLED_PERIODS: Desc = counter(
    "container_cpu_cfs_throttled_periods_total",
    "CFS enforcement periods in which the container was throttled.",
);
pub(crate) const CFS_THROTTLED_SECONDS: Desc = counter(
    "container_cpu_cfs_throttled_seconds_total",
    "Time the container spent throttled by its CPU quota, in whole seconds.",
);
pub(crate) const MEMORY_USAGE: Desc = gauge(
    "container_memory_usage_bytes",
    "Memory charged to the container, page cache included, in bytes.",
);
pub(crate) const MEMORY_MAX_USAGE: Desc = gauge(
    "container_memory_max_usage_bytes",
    "The highest memory usage recorded for the container, in bytes.",
);
pub(crate) const MEMORY_WORKING_SET: Desc = gauge(
    "container_memory_working_set_bytes",
    "Memory usage minus inactive file pages, in bytes (what eviction watches).",
);
pub(crate) const MEMORY_RSS: Desc = gauge(
    "container_memory_rss",
    "Anonymous and swap-cache memory of the container, in bytes.",
);
pub(crate) const MEMORY_CACHE: Desc = gauge(
    "container_memory_cache",
    "Page cache charged to the container, in bytes.",
);
pub(crate) const MEMORY_MAPPED_FILE: Desc = gauge(
    "container_memory_mapped_file",
    "Memory-mapped files of the container, in bytes.",
);
pub(crate) const MEMORY_SWAP: Desc = gauge(
    "container_memory_swap",
    "Swap the container uses, in bytes.",
);
pub(crate) const MEMORY_KERNEL: Desc = gauge(
    "container_memory_kernel_usage",
    "Kernel memory charged to the container, in bytes.",
);
pub(crate) const MEMORY_FAILCNT: Desc = counter(
    "container_memory_failcnt",
    "Times the container's memory usage hit its limit.",
);
pub(crate) const MEMORY_FAILURES: Desc = with(
    counter(
        "container_memory_failures_total",
        "Page faults of the container, by type (pgfault, pgmajfault) and scope.",
    ),
    &["failure_type", "scope"],
);
pub(crate) const OOM_EVENTS: Desc = counter(
    "container_oom_events_total",
    "Processes of the container the OOM killer killed.",
);
pub(crate) const PRESSURE_CPU_WAITING: Desc = counter(
    "container_pressure_cpu_waiting_seconds_total",
    "Time at least one task of the container waited for a CPU (PSI some), in whole seconds.",
);
pub(crate) const PRESSURE_CPU_STALLED: Desc = counter(
    "container_pressure_cpu_stalled_seconds_total",
    "Time no task of the container could run for want of a CPU (PSI full), in whole seconds.",
);
pub(crate) const PRESSURE_MEMORY_WAITING: Desc = counter(
    "container_pressure_memory_waiting_seconds_total",
    "Time at least one task of the container waited for memory (PSI some), in whole seconds.",
);
pub(crate) const PRESSURE_MEMORY_STALLED: Desc = counter(
    "container_pressure_memory_stalled_seconds_total",
    "Time every task of the container waited for memory (PSI full), in whole seconds.",
);
pub(crate) const PRESSURE_IO_WAITING: Desc = counter(
    "container_pressure_io_waiting_seconds_total",
    "Time at least one task of the container waited for I/O (PSI some), in whole seconds.",
);
pub(crate) const PRESSURE_IO_STALLED: Desc = counter(
    "container_pressure_io_stalled_seconds_total",
    "Time every task of the container waited for I/O (PSI full), in whole seconds.",
);
pub(crate) const PROCESSES: Desc =
    gauge("container_processes", "Processes running in the container.");
pub(crate) const THREADS: Desc = gauge("container_threads", "Threads running in the container.");
pub(crate) const THREADS_MAX: Desc = gauge(
    "container_threads_max",
    "The container's task limit; 0 when unlimited.",
);
pub(crate) const FILE_DESCRIPTORS: Desc = gauge(
    "container_file_descriptors",
    "File descriptors the container's processes hold open.",
);
pub(crate) const SOCKETS: Desc = gauge(
    "container_sockets",
    "Sockets the container's processes hold open.",
);
pub(crate) const SPEC_CPU_SHARES: Desc =
    gauge("container_spec_cpu_shares", "The container's CPU shares.");
pub(crate) const SPEC_CPU_QUOTA: Desc = gauge(
    "container_spec_cpu_quota",
    "The container's CFS quota per period, in microseconds (absent when unlimited).",
);
pub(crate) const SPEC_CPU_PERIOD: Desc = gauge(
    "container_spec_cpu_period",
    "The container's CFS period, in microseconds.",
);
pub(crate) const SPEC_MEMORY_LIMIT: Desc = gauge(
    "container_spec_memory_limit_bytes",
    "The container's memory limit in bytes; 0 when unlimited.",
);
pub(crate) const SPEC_MEMORY_RESERVATION: Desc = gauge(
    "container_spec_memory_reservation_limit_bytes",
    "The container's memory reservation (soft limit) in bytes; 0 when none.",
);
pub(crate) const SPEC_MEMORY_SWAP_LIMIT: Desc = gauge(
    "container_spec_memory_swap_limit_bytes",
    "The container's swap limit in bytes (memory plus swap on cgroup v1); 0 when unlimited.",
);
pub(crate) const FS_USAGE: Desc = with(
    gauge(
        "container_fs_usage_bytes",
        "Bytes the container's writable layer takes on its filesystem.",
    ),
    DEV,
);
pub(crate) const FS_LIMIT: Desc = with(
    gauge(
        "container_fs_limit_bytes",
        "Size of the filesystem holding the container's writable layer, in bytes.",
    ),
    DEV,
);
pub(crate) const FS_INODES_TOTAL: Desc = with(
    gauge(
        "container_fs_inodes_total",
        "Inodes of the filesystem holding the container's writable layer.",
    ),
    DEV,
);
pub(crate) const FS_INODES_FREE: Desc = with(
    gauge(
        "container_fs_inodes_free",
        "Free inodes of the filesystem holding the container's writable layer.",
    ),
    DEV,
);
pub(crate) const FS_READS_BYTES: Desc = with(
    counter(
        "container_fs_reads_bytes_total",
        "Bytes the container read from a block device.",
    ),
    DEV,
);
pub(crate) const FS_READS: Desc = with(
    counter(
        "container_fs_reads_total",
        "Reads the container completed on a block device.",
    ),
    DEV,
);
pub(crate) const FS_WRITES_BYTES: Desc = with(
    counter(
        "container_fs_writes_bytes_total",
        "Bytes the container wrote to a block device.",
    ),
    DEV,
);
pub(crate) const FS_WRITES: Desc = with(
    counter(
        "container_fs_writes_total",
        "Writes the container completed on a block device.",
    ),
    DEV,
);
pub(crate) const BLKIO_DEVICE_USAGE: Desc = with(
    counter(
        "container_blkio_device_usage_total",
        "Bytes of block I/O by device and operation (Read, Write).",
    ),
    &["device", "major", "minor", "operation"],
);
pub(crate) const LAST_SEEN: Desc = gauge(
    "container_last_seen",
    "When the runtime last read the container's figures, in seconds since the epoch.",
);
pub(crate) const START_TIME: Desc = gauge(
    "container_start_time_seconds",
    "When the container started, in seconds since the epoch.",
);
pub(crate) const NET_RX_BYTES: Desc = with(
    counter(
        "container_network_receive_bytes_total",
        "Bytes the pod received on an interface.",
    ),
    NET,
);
pub(crate) const NET_RX_PACKETS: Desc = with(
    counter(
        "container_network_receive_packets_total",
        "Packets the pod received on an interface.",
    ),
    NET,
);
pub(crate) const NET_RX_DROPPED: Desc = with(
    counter(
        "container_network_receive_packets_dropped_total",
        "Packets dropped while receiving on an interface.",
    ),
    NET,
);
pub(crate) const NET_RX_ERRORS: Desc = with(
    counter(
        "container_network_receive_errors_total",
        "Errors while receiving on an interface.",
    ),
    NET,
);
pub(crate) const NET_TX_BYTES: Desc = with(
    counter(
        "container_network_transmit_bytes_total",
        "Bytes the pod sent on an interface.",
    ),
    NET,
);
pub(crate) const NET_TX_PACKETS: Desc = with(
    counter(
        "container_network_transmit_packets_total",
        "Packets the pod sent on an interface.",
    ),
    NET,
);
pub(crate) const NET_TX_DROPPED: Desc = with(
    counter(
        "container_network_transmit_packets_dropped_total",
        "Packets dropped while sending on an interface.",
    ),
    NET,
);
pub(crate) const NET_TX_ERRORS: Desc = with(
    counter(
        "container_network_transmit_errors_total",
        "Errors while sending on an interface.",
    ),
    NET,
);

/// Every metric ListPodSandboxMetrics can report.
pub(crate) const ALL: &[&Desc] = &[
    &CPU_USAGE,
    &CPU_USER,
    &CPU_SYSTEM,
    &CFS_PERIODS,
    &CFS_THROTTLED_PERIODS,
    &CFS_THROTTLED_SECONDS,
    &MEMORY_USAGE,
    &MEMORY_MAX_USAGE,
    &MEMORY_WORKING_SET,
    &MEMORY_RSS,
    &MEMORY_CACHE,
    &MEMORY_MAPPED_FILE,
    &MEMORY_SWAP,
    &MEMORY_KERNEL,
    &MEMORY_FAILCNT,
    &MEMORY_FAILURES,
    &OOM_EVENTS,
    &PRESSURE_CPU_WAITING,
    &PRESSURE_CPU_STALLED,
    &PRESSURE_MEMORY_WAITING,
    &PRESSURE_MEMORY_STALLED,
    &PRESSURE_IO_WAITING,
    &PRESSURE_IO_STALLED,
    &PROCESSES,
    &THREADS,
    &THREADS_MAX,
    &FILE_DESCRIPTORS,
    &SOCKETS,
    &SPEC_CPU_SHARES,
    &SPEC_CPU_QUOTA,
    &SPEC_CPU_PERIOD,
    &SPEC_MEMORY_LIMIT,
    &SPEC_MEMORY_RESERVATION,
    &SPEC_MEMORY_SWAP_LIMIT,
    &FS_USAGE,
    &FS_LIMIT,
    &FS_INODES_TOTAL,
    &FS_INODES_FREE,
    &FS_READS_BYTES,
    &FS_READS,
    &FS_WRITES_BYTES,
    &FS_WRITES,
    &BLKIO_DEVICE_USAGE,
    &LAST_SEEN,
    &START_TIME,
    &NET_RX_BYTES,
    &NET_RX_PACKETS,
    &NET_RX_DROPPED,
    &NET_RX_ERRORS,
    &NET_TX_BYTES,
    &NET_TX_PACKETS,
    &NET_TX_DROPPED,
    &NET_TX_ERRORS,
];

impl Runtime {
    /// ListMetricDescriptors: the table above.
    pub(crate) async fn list_metric_descriptors(
        self: &Arc<Self>,
        _req: api::ListMetricDescriptorsRequest,
    ) -> Result<api::ListMetricDescriptorsResponse> {
        Ok(api::ListMetricDescriptorsResponse {
            descriptors: ALL.iter().map(|d| d.descriptor()).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_should_be_unique_typed_by_name_and_described() {
        let mut names: Vec<&str> = ALL.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "a name appears twice");
        for d in ALL {
            assert!(!d.help.is_empty());
            // Prometheus' convention: counters, and only they, end in _total;
            // cAdvisor's two exceptions are kept as kubelet names them.
            let counter = match d.name {
                "container_memory_failcnt" => true,
                "container_fs_inodes_total" => false,
                n => n.ends_with("_total"),
            };
            assert_eq!(counter, d.kind == api::MetricType::Counter, "{}", d.name);
            assert_eq!(
                d.descriptor().label_keys.len(),
                BASE_LABELS.len() + d.extra_labels.len()
            );
        }
    }
}
