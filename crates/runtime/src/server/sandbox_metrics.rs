//! ListPodSandboxMetrics: for every ready pod, its network counters
//! (pod-level) and each live container's cAdvisor-named metrics, built
//! from readings kept in memory (`crate::sample`): a reading younger than
//! [`SAMPLE_MAX_AGE`] answers without touching the cgroups, a writable
//! layer's walk younger than [`WALK_MAX_AGE`] (a stats call's included)
//! without walking it again.

use std::path::Path;
use std::sync::Arc;

use petrel_cri::api;
use petrel_oci::cgroups::CgroupMetrics;
use petrel_oci::dir_usage::{dir_usage, DirUsage};
use petrel_oci::proc_usage::{self, block_device_name};

use crate::error::{Result, RuntimeError};
use crate::records::{ContainerState, SandboxState};
use crate::sample::{ContainerSample, PodSample, SAMPLE_MAX_AGE, WALK_MAX_AGE};
use crate::server::metric_descriptors::{self as d, Desc};
use crate::service::Runtime;
use crate::state::{Container, Sandbox};
use crate::util;

const NS_PER_S: u64 = 1_000_000_000;

/// The filesystem holding the writable layers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LayerFs {
    /// The device label: the layers' directory, as the stats' `fs_id`.
    device: String,
    /// Its size in bytes.
    size: u64,
    /// Its inodes.
    inodes: u64,
    /// Its free inodes.
    inodes_free: u64,
}

/// Metrics under construction, all with the same base labels and time.
struct Out<'a> {
    labels: &'a [String],
    timestamp: i64,
    metrics: Vec<api::Metric>,
}

impl Out<'_> {
    /// Adds `desc` with `extra` label values when the value is known.
    fn put(&mut self, desc: &Desc, extra: &[&str], value: Option<u64>) {
        let Some(value) = value else { return };
        debug_assert_eq!(extra.len(), desc.extra_labels.len(), "{}", desc.name);
        self.metrics.push(api::Metric {
            name: desc.name.into(),
            timestamp: self.timestamp,
            metric_type: desc.kind as i32,
            label_values: self
                .labels
                .iter()
                .cloned()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect(),
            value: Some(api::UInt64Value { value }),
        });
    }
}

fn seconds(ns: Option<u64>) -> Option<u64> {
    ns.map(|n| n / NS_PER_S)
}

/// A container's metrics from its reading, its layer's usage and its
/// start time (ns since the epoch); `now_s` is the time of the call.
fn container_metrics(
    labels: &[String],
    sample: &ContainerSample,
    layer: Option<(&LayerFs, DirUsage)>,
    started_at: i64,
    now_s: u64,
    device_name: impl Fn(u64, u64) -> String,
) -> Vec<api::Metric> {
    let mut o = Out {
        labels,
        timestamp: sample.timestamp,
        metrics: Vec::new(),
    };
    o.put(&d::LAST_SEEN, &[], Some(now_s));
    o.put(
        &d::START_TIME,
        &[],
        u64::try_from(started_at)
            .ok()
            .filter(|t| *t > 0)
            .map(|t| t / NS_PER_S),
    );
    // Without its cgroup, the container's processes are unknown too.
    if let Some(m) = &sample.cgroup {
        cgroup_metrics(&mut o, m, sample, &device_name);
        o.put(&d::FILE_DESCRIPTORS, &[], Some(sample.procs.fds));
        o.put(&d::SOCKETS, &[], Some(sample.procs.sockets));
    }
    if let Some((fs, usage)) = layer {
        let dev = [fs.device.as_str()];
        o.put(&d::FS_USAGE, &dev, Some(usage.bytes));
        o.put(&d::FS_LIMIT, &dev, Some(fs.size));
        o.put(&d::FS_INODES_TOTAL, &dev, Some(fs.inodes));
        o.put(&d::FS_INODES_FREE, &dev, Some(fs.inodes_free));
    }
    o.metrics
}

fn cgroup_metrics(
    o: &mut Out<'_>,
    m: &CgroupMetrics,
    sample: &ContainerSample,
    device_name: &impl Fn(u64, u64) -> String,
) {
    o.put(&d::CPU_USAGE, &[], seconds(m.cpu_usage_ns));
    o.put(&d::CPU_USER, &[], seconds(m.cpu_user_ns));
    o.put(&d::CPU_SYSTEM, &[], seconds(m.cpu_system_ns));
    o.put(&d::CFS_PERIODS, &[], m.cfs_periods);
    o.put(&d::CFS_THROTTLED_PERIODS, &[], m.cfs_throttled_periods);
    o.put(&d::CFS_THROTTLED_SECONDS, &[], seconds(m.cfs_throttled_ns));
    o.put(&d::MEMORY_USAGE, &[], m.memory_usage);
    o.put(&d::MEMORY_MAX_USAGE, &[], m.memory_max_usage);
    o.put(&d::MEMORY_WORKING_SET, &[], m.memory_working_set);
    o.put(&d::MEMORY_RSS, &[], m.memory_rss);
    o.put(&d::MEMORY_CACHE, &[], m.memory_cache);
    o.put(&d::MEMORY_MAPPED_FILE, &[], m.memory_mapped_file);
    o.put(&d::MEMORY_SWAP, &[], m.memory_swap);
    o.put(&d::MEMORY_KERNEL, &[], m.memory_kernel);
    o.put(&d::MEMORY_FAILCNT, &[], m.memory_failcnt);
    // A container's cgroup has no children: its own and its hierarchy's
    // faults are the same, reported once with the container scope.
    o.put(&d::MEMORY_FAILURES, &["pgfault", "container"], m.pgfault);
    o.put(
        &d::MEMORY_FAILURES,
        &["pgmajfault", "container"],
        m.pgmajfault,
    );
    o.put(&d::OOM_EVENTS, &[], m.oom_kills);
    for (p, waiting, stalled) in [
        (
            m.cpu_pressure,
            &d::PRESSURE_CPU_WAITING,
            &d::PRESSURE_CPU_STALLED,
        ),
        (
            m.memory_pressure,
            &d::PRESSURE_MEMORY_WAITING,
            &d::PRESSURE_MEMORY_STALLED,
        ),
        (
            m.io_pressure,
            &d::PRESSURE_IO_WAITING,
            &d::PRESSURE_IO_STALLED,
        ),
    ] {
        let us_to_ns = |us: u64| us.saturating_mul(1000);
        o.put(waiting, &[], seconds(p.map(|p| us_to_ns(p.some.total_us))));
        o.put(
            stalled,
            &[],
            seconds(p.and_then(|p| p.full).map(|f| us_to_ns(f.total_us))),
        );
    }
    o.put(&d::PROCESSES, &[], Some(sample.procs.processes));
    o.put(&d::THREADS, &[], m.tasks.or(Some(sample.procs.threads)));
    o.put(&d::THREADS_MAX, &[], m.tasks_max);
    o.put(&d::SPEC_CPU_SHARES, &[], m.cpu_shares);
    o.put(&d::SPEC_CPU_QUOTA, &[], m.cpu_quota_us);
    o.put(&d::SPEC_CPU_PERIOD, &[], m.cpu_period_us);
    o.put(&d::SPEC_MEMORY_LIMIT, &[], m.memory_limit);
    o.put(&d::SPEC_MEMORY_RESERVATION, &[], m.memory_reservation);
    o.put(&d::SPEC_MEMORY_SWAP_LIMIT, &[], m.memory_swap_limit);
    for io in &m.io {
        let name = device_name(io.major, io.minor);
        let (major, minor) = (io.major.to_string(), io.minor.to_string());
        let dev = [name.as_str()];
        o.put(&d::FS_READS_BYTES, &dev, Some(io.read_bytes));
        o.put(&d::FS_READS, &dev, Some(io.reads));
        o.put(&d::FS_WRITES_BYTES, &dev, Some(io.write_bytes));
        o.put(&d::FS_WRITES, &dev, Some(io.writes));
        for (op, v) in [("Read", io.read_bytes), ("Write", io.write_bytes)] {
            o.put(
                &d::BLKIO_DEVICE_USAGE,
                &[name.as_str(), major.as_str(), minor.as_str(), op],
                Some(v),
            );
        }
    }
}

/// A pod's network metrics, one set per interface.
fn pod_metrics(labels: &[String], sample: &PodSample) -> Vec<api::Metric> {
    let mut o = Out {
        labels,
        timestamp: sample.timestamp,
        metrics: Vec::new(),
    };
    for i in &sample.interfaces {
        let n = [i.name.as_str()];
        o.put(&d::NET_RX_BYTES, &n, Some(i.rx_bytes));
        o.put(&d::NET_RX_PACKETS, &n, Some(i.rx_packets));
        o.put(&d::NET_RX_DROPPED, &n, Some(i.rx_dropped));
        o.put(&d::NET_RX_ERRORS, &n, Some(i.rx_errors));
        o.put(&d::NET_TX_BYTES, &n, Some(i.tx_bytes));
        o.put(&d::NET_TX_PACKETS, &n, Some(i.tx_packets));
        o.put(&d::NET_TX_DROPPED, &n, Some(i.tx_dropped));
        o.put(&d::NET_TX_ERRORS, &n, Some(i.tx_errors));
    }
    o.metrics
}

/// The size and inodes of the filesystem holding `dir`.
fn layer_fs(dir: &Path) -> Option<LayerFs> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(LayerFs {
        device: dir.display().to_string(),
        size: st.f_blocks.saturating_mul(st.f_frsize),
        inodes: st.f_files,
        inodes_free: st.f_ffree,
    })
}

impl Runtime {
    /// Reads a container's cgroup and processes.
    fn take_container_sample(&self, cgroup: &str) -> ContainerSample {
        let timestamp = util::now_ns();
        let Ok(metrics) = self.cgroups.metrics(cgroup) else {
            return ContainerSample {
                timestamp,
                ..ContainerSample::default()
            };
        };
        let pids = self.cgroups.procs(cgroup).unwrap_or_default();
        ContainerSample {
            timestamp,
            cgroup: Some(metrics),
            procs: proc_usage::proc_counts(Path::new("/proc"), &pids),
        }
    }

    /// Reads a pod's interfaces through one of its processes, else by
    /// joining its pinned network namespace.
    fn take_pod_sample(&self, sb: &Sandbox) -> PodSample {
        let timestamp = util::now_ns();
        let (netns, holder) = sb.with(|r| (r.netns.clone(), r.pid_holder.as_ref().map(|p| p.pid)));
        let Some(netns) = netns else {
            return PodSample {
                timestamp,
                interfaces: Vec::new(),
            };
        };
        let running = || {
            sb.container_ids().iter().find_map(|id| {
                let c = self.state.container(id)?;
                c.with(|r| (r.state == ContainerState::Running && r.pid > 0).then_some(r.pid))
            })
        };
        let by_pid = holder
            .or_else(running)
            .and_then(|pid| proc_usage::net_dev_of_pid(pid).ok());
        let interfaces = match by_pid {
            Some(i) => i,
            None => proc_usage::net_dev_in_netns(&netns).unwrap_or_else(|e| {
                tracing::debug!(sandbox.id = %sb.id, error = %e, "cannot read the pod's interfaces");
                Vec::new()
            }),
        };
        PodSample {
            timestamp,
            interfaces,
        }
    }

    /// One ready pod's metrics.
    fn sandbox_metrics(&self, sb: &Sandbox, fs: Option<&LayerFs>) -> api::PodSandboxMetrics {
        let (pod, namespace) = sb.with(|r| {
            let m = r.config.metadata.clone().unwrap_or_default();
            (m.name, m.namespace)
        });
        let pod_labels = [
            pod.clone(),
            namespace.clone(),
            String::new(),
            sb.id.clone(),
            String::new(),
        ];
        let sample = sb
            .metrics_sample
            .get_or_take(SAMPLE_MAX_AGE, || self.take_pod_sample(sb));
        let now_s = u64::try_from(util::now_ns()).unwrap_or(0) / NS_PER_S;
        let container_metrics = sb
            .container_ids()
            .iter()
            .filter_map(|id| self.state.container(id))
            // A created container has no cgroup before its start.
            .filter(|c| {
                c.with(|r| {
                    r.state == ContainerState::Running
                        || (r.state == ContainerState::Created && r.in_oci_runtime())
                })
            })
            .map(|c| self.one_container_metrics(&c, [&pod, &namespace], fs, now_s))
            .collect();
        api::PodSandboxMetrics {
            pod_sandbox_id: sb.id.clone(),
            metrics: pod_metrics(&pod_labels, &sample),
            container_metrics,
        }
    }

    fn one_container_metrics(
        &self,
        c: &Container,
        [pod, namespace]: [&String; 2],
        fs: Option<&LayerFs>,
        now_s: u64,
    ) -> api::ContainerMetrics {
        let (labels, cgroup, upper, started_at) = c.with(|r| {
            let image = r
                .config
                .image
                .as_ref()
                .map(|i| {
                    if i.user_specified_image.is_empty() {
                        i.image.clone()
                    } else {
                        i.user_specified_image.clone()
                    }
                })
                .unwrap_or_default();
            let name = r
                .config
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            (
                vec![pod.clone(), namespace.clone(), name, r.id.clone(), image],
                r.cgroup_path.clone(),
                r.layer_dir.join("upper"),
                r.started_at,
            )
        });
        let sample = c
            .metrics_sample
            .get_or_take(SAMPLE_MAX_AGE, || self.take_container_sample(&cgroup));
        let layer = fs.map(|fs| {
            let (_, usage) = c
                .layer_usage
                .get_or_take(WALK_MAX_AGE, || (util::now_ns(), dir_usage(&upper)));
            (fs, usage)
        });
        api::ContainerMetrics {
            container_id: c.id.clone(),
            metrics: container_metrics(
                &labels,
                &sample,
                layer,
                started_at,
                now_s,
                block_device_name,
            ),
        }
    }

    /// ListPodSandboxMetrics.
    pub(crate) async fn list_pod_sandbox_metrics(
        self: &Arc<Self>,
        _req: api::ListPodSandboxMetricsRequest,
    ) -> Result<api::ListPodSandboxMetricsResponse> {
        let rt = self.clone();
        // Readings touch cgroup files, /proc and perhaps a namespace-joining
        // thread: off the async workers.
        tokio::task::spawn_blocking(move || {
            let fs = layer_fs(&rt.layout.root.join("containers"));
            let pod_metrics = rt
                .state
                .sandboxes()
                .iter()
                .filter(|sb| sb.with(|r| r.state == SandboxState::Ready))
                .map(|sb| rt.sandbox_metrics(sb, fs.as_ref()))
                .collect();
            api::ListPodSandboxMetricsResponse { pod_metrics }
        })
        .await
        .map_err(|e| RuntimeError::task("list pod sandbox metrics", e))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use petrel_oci::cgroups::{DeviceIo, Psi, PsiLine};
    use petrel_oci::proc_usage::{InterfaceCounters, ProcCounts};

    use super::*;
    use crate::server::metric_descriptors::{ALL, BASE_LABELS};

    fn labels() -> Vec<String> {
        ["web", "default", "app", "c1", "busybox:latest"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn psi(some_us: u64, full_us: u64) -> Psi {
        let line = |total_us| PsiLine {
            total_us,
            ..PsiLine::default()
        };
        Psi {
            some: line(some_us),
            full: Some(line(full_us)),
        }
    }

    fn full_sample() -> ContainerSample {
        ContainerSample {
            timestamp: 42,
            cgroup: Some(CgroupMetrics {
                cpu_usage_ns: Some(3_500_000_000),
                cpu_user_ns: Some(2_000_000_000),
                cpu_system_ns: Some(1_500_000_000),
                cfs_periods: Some(10),
                cfs_throttled_periods: Some(2),
                cfs_throttled_ns: Some(4_000_000_000),
                memory_usage: Some(100),
                memory_max_usage: Some(200),
                memory_working_set: Some(90),
                memory_rss: Some(50),
                memory_cache: Some(40),
                memory_mapped_file: Some(5),
                memory_swap: Some(0),
                memory_kernel: Some(7),
                memory_failcnt: Some(1),
                pgfault: Some(1000),
                pgmajfault: Some(3),
                oom_kills: Some(0),
                tasks: Some(4),
                tasks_max: Some(0),
                cpu_shares: Some(1024),
                cpu_quota_us: Some(20000),
                cpu_period_us: Some(100_000),
                memory_limit: Some(64 << 20),
                memory_reservation: Some(0),
                memory_swap_limit: Some(64 << 20),
                io: vec![DeviceIo {
                    major: 254,
                    minor: 0,
                    read_bytes: 4096,
                    write_bytes: 8192,
                    reads: 1,
                    writes: 2,
                }],
                cpu_pressure: Some(psi(2_500_000, 1_000_000)),
                memory_pressure: Some(psi(0, 0)),
                io_pressure: Some(psi(0, 0)),
            }),
            procs: ProcCounts {
                processes: 2,
                threads: 3,
                fds: 9,
                sockets: 1,
            },
        }
    }

    fn fs() -> LayerFs {
        LayerFs {
            device: "/var/lib/petrel/containers".into(),
            size: 1 << 30,
            inodes: 1000,
            inodes_free: 900,
        }
    }

    fn all_metrics() -> Vec<api::Metric> {
        let usage = DirUsage {
            bytes: 8192,
            inodes: 12,
        };
        let mut m = container_metrics(
            &labels(),
            &full_sample(),
            Some((&fs(), usage)),
            5_000_000_000,
            77,
            |a, b| format!("/dev/{a}-{b}"),
        );
        let pod = PodSample {
            timestamp: 43,
            interfaces: vec![InterfaceCounters {
                name: "eth0".into(),
                rx_bytes: 10,
                ..Default::default()
            }],
        };
        m.extend(pod_metrics(&labels(), &pod));
        m
    }

    #[test]
    fn every_descriptor_should_be_produced_with_its_labels_and_type() {
        let metrics = all_metrics();
        for desc in ALL {
            let found: Vec<&api::Metric> = metrics.iter().filter(|m| m.name == desc.name).collect();
            assert!(!found.is_empty(), "{} never produced", desc.name);
            for m in found {
                assert_eq!(m.metric_type, desc.kind as i32, "{}", desc.name);
                assert_eq!(
                    m.label_values.len(),
                    BASE_LABELS.len() + desc.extra_labels.len(),
                    "{}",
                    desc.name
                );
            }
        }
        // And nothing outside the table.
        for m in &metrics {
            assert!(
                ALL.iter().any(|d| d.name == m.name),
                "{} has no descriptor",
                m.name
            );
        }
    }

    #[test]
    fn container_metrics_should_map_units_and_labels() {
        let metrics = all_metrics();
        let one = |name: &str, extra: &[&str]| -> u64 {
            let want: Vec<String> = labels()
                .into_iter()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect();
            metrics
                .iter()
                .find(|m| m.name == name && m.label_values == want)
                .and_then(|m| m.value.as_ref())
                .map(|v| v.value)
                .unwrap_or_else(|| panic!("{name} {extra:?} missing"))
        };
        // CPU time in whole seconds (the CRI value is an integer).
        assert_eq!(one("container_cpu_usage_seconds_total", &[]), 3);
        assert_eq!(one("container_cpu_cfs_throttled_seconds_total", &[]), 4);
        assert_eq!(one("container_start_time_seconds", &[]), 5);
        assert_eq!(one("container_last_seen", &[]), 77);
        assert_eq!(one("container_pressure_cpu_waiting_seconds_total", &[]), 2);
        assert_eq!(one("container_pressure_cpu_stalled_seconds_total", &[]), 1);
        assert_eq!(
            one(
                "container_memory_failures_total",
                &["pgmajfault", "container"]
            ),
            3
        );
        assert_eq!(one("container_threads", &[]), 4);
        assert_eq!(one("container_processes", &[]), 2);
        assert_eq!(
            one("container_fs_usage_bytes", &["/var/lib/petrel/containers"]),
            8192
        );
        assert_eq!(
            one("container_fs_writes_bytes_total", &["/dev/254-0"]),
            8192
        );
        assert_eq!(
            one(
                "container_blkio_device_usage_total",
                &["/dev/254-0", "254", "0", "Read"]
            ),
            4096
        );
        assert_eq!(one("container_network_receive_bytes_total", &["eth0"]), 10);
        let ts: HashMap<&str, i64> = metrics
            .iter()
            .map(|m| (m.name.as_str(), m.timestamp))
            .collect();
        assert_eq!(ts["container_memory_rss"], 42);
        assert_eq!(ts["container_network_receive_bytes_total"], 43);
    }

    #[test]
    fn container_metrics_should_leave_out_what_was_not_read() {
        let sample = ContainerSample {
            timestamp: 1,
            cgroup: None,
            procs: ProcCounts::default(),
        };
        let names: Vec<String> =
            container_metrics(&labels(), &sample, None, 0, 9, |_, _| String::new())
                .into_iter()
                .map(|m| m.name)
                .collect();
        assert_eq!(names, ["container_last_seen"]);
        // A host-network pod has no interfaces of its own.
        assert!(pod_metrics(&labels(), &PodSample::default()).is_empty());
    }
}
