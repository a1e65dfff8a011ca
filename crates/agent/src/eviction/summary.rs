//! `GET /stats/summary` in kubelet's shape (stats/v1alpha1 `Summary`):
//! the node and each pod with CPU, memory (working set included),
//! filesystems (each container's writable layer and logs, each pod's
//! volumes and ephemeral storage) and processes. Built by the eviction manager from the
//! cgroups once per pass and served from that cache, so requests never
//! fan out to the runtime or the kernel.

use std::collections::HashMap;
use std::time::{Instant, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use petrel_oci::cgroups::{CgroupStats, Psi, PsiLine};
use serde::Serialize;

use super::observe::{FsStats, NodeStats};

/// The whole summary.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// The node.
    pub node: NodeSummary,
    /// Every pod with a cgroup.
    pub pods: Vec<PodSummary>,
}

/// The node's part.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    /// The node's name.
    pub node_name: String,
    /// The pods' cgroup as kubelet's `pods` system container.
    pub system_containers: Vec<ContainerSummary>,
    /// CPU of the node cgroup (or the machine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of the node.
    pub memory: MemoryStats,
    /// I/O pressure of the node cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// The agent root's filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsSummary>,
    /// The runtime's filesystems.
    pub runtime: RuntimeSummary,
    /// Process ids.
    pub rlimit: Rlimit,
}

/// The runtime's filesystems.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSummary {
    /// Where images live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsSummary>,
    /// Where writable layers live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsSummary>,
}

/// kubelet's `RlimitStats`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rlimit {
    /// When observed.
    pub time: Option<Time>,
    /// Process-id capacity.
    pub maxpid: i64,
    /// Processes now.
    pub curproc: i64,
}

/// kubelet's `CPUStats`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When observed.
    pub time: Option<Time>,
    /// Average use since the previous pass, in nanocores (absent on the
    /// first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative CPU time.
    pub usage_core_nano_seconds: u64,
    /// CPU pressure (PSI), where the kernel keeps it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// kubelet's `PSIStats`: pressure of one resource.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PsiStats {
    /// Every task stalled at once (zero where the kernel has no `full`
    /// line, as for CPU before 5.13).
    pub full: PsiData,
    /// At least one task stalled.
    pub some: PsiData,
}

/// kubelet's `PSIData`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct PsiData {
    /// Cumulative stall time, ns.
    pub total: u64,
    /// Share of the last 10 s stalled, percent.
    pub avg10: f64,
    /// Share of the last 60 s stalled, percent.
    pub avg60: f64,
    /// Share of the last 300 s stalled, percent.
    pub avg300: f64,
}

/// kubelet's `IOStats`: I/O pressure alone.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IoStats {
    /// When observed.
    pub time: Option<Time>,
    /// I/O pressure (PSI).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// A cgroup's PSI in kubelet's shape.
pub fn psi(p: Option<Psi>) -> Option<PsiStats> {
    let data = |l: PsiLine| PsiData {
        total: l.total_us.saturating_mul(1000),
        avg10: f64::from(l.avg10_centi) / 100.0,
        avg60: f64::from(l.avg60_centi) / 100.0,
        avg300: f64::from(l.avg300_centi) / 100.0,
    };
    p.map(|p| PsiStats {
        full: p.full.map(data).unwrap_or_default(),
        some: data(p.some),
    })
}

/// A cgroup's I/O pressure as kubelet's `IOStats` (none without PSI).
pub fn io(s: &CgroupStats, at: SystemTime) -> Option<IoStats> {
    s.io_psi.map(|p| IoStats {
        time: time(at),
        psi: psi(Some(p)),
    })
}

/// kubelet's `MemoryStats`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When observed.
    pub time: Option<Time>,
    /// Limit (or capacity) minus working set, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<i64>,
    /// Usage, page cache included.
    pub usage_bytes: i64,
    /// Usage minus inactive file pages.
    pub working_set_bytes: i64,
    /// Anonymous memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Major page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
    /// Memory pressure (PSI), where the kernel keeps it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// kubelet's `FsStats`: for a filesystem, its own figures; for what
/// lives on one (a writable layer, logs, a volume), what that uses, with
/// the filesystem's capacity and free space when known.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FsSummary {
    /// When observed.
    pub time: Option<Time>,
    /// Free bytes for unprivileged users.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<i64>,
    /// Total bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<i64>,
    /// Bytes in use.
    pub used_bytes: i64,
    /// Free inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<i64>,
    /// Total inodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<i64>,
    /// Inodes in use.
    pub inodes_used: i64,
}

/// kubelet's `VolumeStats`: a pod volume's usage and its filesystem.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    /// The usage.
    #[serde(flatten)]
    pub fs: FsSummary,
    /// The volume's name in the pod.
    pub name: String,
}

/// A container's (or system container's) part.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSummary {
    /// Its name.
    pub name: String,
    /// CPU.
    pub cpu: CpuStats,
    /// Memory.
    pub memory: MemoryStats,
    /// I/O pressure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// The writable layer (pod containers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsSummary>,
    /// The container's logs (pod containers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsSummary>,
}

/// kubelet's `PodReference`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PodRef {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
}

/// kubelet's `ProcessStats`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessStats {
    /// Processes in the pod's cgroup.
    pub process_count: u64,
}

/// A pod's part.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSummary {
    /// Which pod.
    pub pod_ref: PodRef,
    /// Its running containers.
    pub containers: Vec<ContainerSummary>,
    /// CPU of the pod cgroup.
    pub cpu: CpuStats,
    /// Memory of the pod cgroup.
    pub memory: MemoryStats,
    /// I/O pressure of the pod cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// The pod's volumes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    /// Writable layers, logs and the volumes on the node's filesystem.
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsSummary>,
    /// Processes (kubelet spells this key in snake case).
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

fn time(t: SystemTime) -> Option<Time> {
    crate::status::compute::time_from_system(t)
}

/// Filesystem statistics in kubelet's shape.
pub fn fs_summary(fs: &FsStats, at: SystemTime) -> FsSummary {
    FsSummary {
        time: time(at),
        available_bytes: Some(fs.available),
        capacity_bytes: Some(fs.capacity),
        used_bytes: (fs.capacity - fs.available).max(0),
        inodes_free: Some(fs.inodes_free),
        inodes: Some(fs.inodes),
        inodes_used: (fs.inodes - fs.inodes_free).max(0),
    }
}

/// What something on filesystem `fs` uses (`bytes`, `inodes`), in
/// kubelet's shape.
pub fn usage_summary(bytes: i64, inodes: i64, fs: Option<&FsStats>, at: SystemTime) -> FsSummary {
    FsSummary {
        time: time(at),
        available_bytes: fs.map(|f| f.available),
        capacity_bytes: fs.map(|f| f.capacity),
        used_bytes: bytes,
        inodes_free: fs.map(|f| f.inodes_free),
        inodes: fs.map(|f| f.inodes),
        inodes_used: inodes,
    }
}

/// Turns cumulative CPU times into rates between passes.
#[derive(Debug, Default)]
pub struct CpuRates {
    last: HashMap<String, (Instant, u64)>,
}

impl CpuRates {
    /// CPU statistics of `key` with `total_ns` used so far at `now`.
    pub fn cpu(&mut self, key: &str, total_ns: u64, now: Instant, at: SystemTime) -> CpuStats {
        let rate = self.last.get(key).and_then(|(t, prev)| {
            let dt = now.saturating_duration_since(*t).as_nanos();
            (dt > 0 && total_ns >= *prev)
                .then(|| ((total_ns - prev) as u128 * 1_000_000_000 / dt) as u64)
        });
        self.last.insert(key.to_string(), (now, total_ns));
        CpuStats {
            time: time(at),
            usage_nano_cores: rate,
            usage_core_nano_seconds: total_ns,
            psi: None,
        }
    }

    /// Forgets every key not in `keep` (pods and containers gone).
    pub fn retain(&mut self, keep: &std::collections::HashSet<String>) {
        self.last.retain(|k, _| keep.contains(k));
    }
}

/// Memory statistics of a cgroup in kubelet's shape; `limit` gives
/// availableBytes.
pub fn cgroup_memory(s: &CgroupStats, limit: Option<i64>, at: SystemTime) -> MemoryStats {
    let ws = s.memory_working_set_bytes as i64;
    MemoryStats {
        time: time(at),
        available_bytes: limit
            .or(s.memory_limit_bytes.map(|l| l as i64))
            .map(|l| (l - ws).max(0)),
        usage_bytes: s.memory_usage_bytes as i64,
        working_set_bytes: ws,
        rss_bytes: Some(s.memory_rss_bytes),
        page_faults: Some(s.page_faults),
        major_page_faults: Some(s.major_page_faults),
        psi: psi(s.memory_psi),
    }
}

/// The node's memory in kubelet's shape.
pub fn node_memory(stats: &NodeStats) -> MemoryStats {
    MemoryStats {
        time: time(stats.timestamp),
        available_bytes: Some(stats.memory.available()),
        usage_bytes: stats.memory.usage,
        working_set_bytes: stats.memory.working_set,
        rss_bytes: None,
        page_faults: None,
        major_page_faults: None,
        psi: None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn cpu_rates_should_come_from_two_samples() {
        let mut r = CpuRates::default();
        let t0 = Instant::now();
        let at = SystemTime::now();
        assert_eq!(r.cpu("p", 1_000, t0, at).usage_nano_cores, None);
        // 0.5 s of CPU in 1 s: half a core.
        let c = r.cpu("p", 500_001_000, t0 + Duration::from_secs(1), at);
        assert_eq!(c.usage_nano_cores, Some(500_000_000));
        r.retain(&Default::default());
        assert_eq!(
            r.cpu("p", 600_000_000, t0 + Duration::from_secs(2), at)
                .usage_nano_cores,
            None
        );
    }

    #[test]
    fn psi_should_be_in_nanoseconds_and_percent_with_a_zero_full_when_absent() {
        let line = |total_us, avg10_centi| PsiLine {
            total_us,
            avg10_centi,
            ..PsiLine::default()
        };
        let p = psi(Some(Psi {
            some: line(7, 125),
            full: None,
        }))
        .unwrap();
        let v = serde_json::to_value(p).unwrap();
        assert_eq!(v["some"]["total"], 7000);
        assert_eq!(v["some"]["avg10"], 1.25);
        assert_eq!(v["full"]["total"], 0);
        assert_eq!(psi(None), None);
    }

    #[test]
    fn summaries_should_use_kubelets_field_names() {
        let fs = fs_summary(
            &FsStats {
                capacity: 100,
                available: 40,
                inodes: 10,
                inodes_free: 4,
            },
            SystemTime::now(),
        );
        let v = serde_json::to_value(&fs).unwrap();
        assert_eq!(v["usedBytes"], 60);
        assert_eq!(v["inodesUsed"], 6);
        assert!(v["time"].is_string());
        let p = ProcessStats { process_count: 3 };
        assert_eq!(serde_json::to_value(&p).unwrap()["process_count"], 3);
        let v = serde_json::to_value(VolumeStats {
            fs: usage_summary(5, 2, None, SystemTime::now()),
            name: "scratch".into(),
        })
        .unwrap();
        assert_eq!(v["name"], "scratch");
        assert_eq!(v["usedBytes"], 5);
        assert_eq!(v["inodesUsed"], 2);
        assert!(v.get("capacityBytes").is_none(), "{v}");
    }
}
