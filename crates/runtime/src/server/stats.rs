//! ContainerStats, ListContainerStats, PodSandboxStats, ListPodSandboxStats:
//! read from the cgroups and the writable layers when asked, never sampled
//! in the background. Each walk of a writable layer is kept for the metrics
//! calls (`sandbox_metrics`).

use std::sync::Arc;

use petrel_cri::api;
use petrel_oci::dir_usage::dir_usage;

use crate::error::Result;
use crate::records::ContainerState;
use crate::server::sandbox_list::labels_match;
use crate::service::Runtime;
use crate::state::{Container, Sandbox};
use crate::util;

fn u64v(v: u64) -> Option<api::UInt64Value> {
    Some(api::UInt64Value { value: v })
}

/// What one cgroup reading gives the stats RPCs.
#[derive(Default)]
struct Usage {
    cpu: Option<api::CpuUsage>,
    memory: Option<api::MemoryUsage>,
    /// I/O pressure (the CRI's IoUsage holds only PSI).
    io: Option<api::IoUsage>,
    swap: Option<api::SwapUsage>,
    pids: Option<u64>,
}

/// The CRI's PSI from a PSI file's (µs totals, averages in hundredths).
fn psi(p: Option<petrel_oci::cgroups::Psi>) -> Option<api::PsiStats> {
    let data = |l: petrel_oci::cgroups::PsiLine| api::PsiData {
        total: l.total_us.saturating_mul(1000),
        avg10: f64::from(l.avg10_centi) / 100.0,
        avg60: f64::from(l.avg60_centi) / 100.0,
        avg300: f64::from(l.avg300_centi) / 100.0,
    };
    p.map(|p| api::PsiStats {
        some: Some(data(p.some)),
        full: p.full.map(data),
    })
}

/// CPU, memory, I/O pressure and swap of a cgroup, with the CPU rate since
/// `prev`.
fn cgroup_usage(
    rt: &Runtime,
    path: &str,
    swap: impl FnOnce((i64, u64)) -> Option<(i64, u64)>,
) -> Usage {
    let ts = util::now_ns();
    let Ok(st) = rt.cgroups.stats(path) else {
        return Usage::default();
    };
    let prev = swap((ts, st.cpu_usage_ns));
    let rate = prev.and_then(|(pts, pusage)| {
        let dt = u64::try_from(ts - pts).ok().filter(|d| *d > 0)?;
        let du = st.cpu_usage_ns.checked_sub(pusage)?;
        Some((u128::from(du) * 1_000_000_000 / u128::from(dt)) as u64)
    });
    let cpu = api::CpuUsage {
        timestamp: ts,
        usage_core_nano_seconds: u64v(st.cpu_usage_ns),
        usage_nano_cores: rate.and_then(u64v),
        psi: psi(st.cpu_psi),
    };
    let memory = api::MemoryUsage {
        timestamp: ts,
        working_set_bytes: u64v(st.memory_working_set_bytes),
        available_bytes: st
            .memory_limit_bytes
            .map(|l| l.saturating_sub(st.memory_working_set_bytes))
            .and_then(u64v),
        usage_bytes: u64v(st.memory_usage_bytes),
        rss_bytes: u64v(st.memory_rss_bytes),
        page_faults: u64v(st.page_faults),
        major_page_faults: u64v(st.major_page_faults),
        psi: psi(st.memory_psi),
    };
    let io = st.io_psi.map(|p| api::IoUsage {
        timestamp: ts,
        psi: psi(Some(p)),
    });
    let swap = st.swap_usage_bytes.map(|used| api::SwapUsage {
        timestamp: ts,
        swap_available_bytes: st
            .swap_limit_bytes
            .map(|l| l.saturating_sub(used))
            .and_then(u64v),
        swap_usage_bytes: u64v(used),
    });
    Usage {
        cpu: Some(cpu),
        memory: Some(memory),
        io,
        swap,
        pids: st.pids_current,
    }
}

impl Runtime {
    fn stats_of(&self, c: &Container) -> api::ContainerStats {
        let (attributes, cgroup, upper, live) = c.with(|r| {
            (
                api::ContainerAttributes {
                    id: r.id.clone(),
                    metadata: r.config.metadata.clone(),
                    labels: r.config.labels.clone(),
                    annotations: r.config.annotations.clone(),
                },
                r.cgroup_path.clone(),
                r.layer_dir.join("upper"),
                // A created container has no cgroup before its start.
                r.state == ContainerState::Running
                    || (r.state == ContainerState::Created && r.in_oci_runtime()),
            )
        });
        let usage = if live {
            cgroup_usage(self, &cgroup, |s| c.swap_cpu_sample(s))
        } else {
            Usage::default()
        };
        let layer = dir_usage(&upper);
        let walked_at = util::now_ns();
        // Kept for the metrics calls, which then need not walk again.
        c.layer_usage.put((walked_at, layer));
        let petrel_oci::dir_usage::DirUsage { bytes, inodes } = layer;
        api::ContainerStats {
            attributes: Some(attributes),
            cpu: usage.cpu,
            memory: usage.memory,
            writable_layer: Some(api::FilesystemUsage {
                timestamp: walked_at,
                fs_id: Some(api::FilesystemIdentifier {
                    mountpoint: self.layout.root.join("containers").display().to_string(),
                }),
                used_bytes: u64v(bytes),
                inodes_used: u64v(inodes),
            }),
            swap: usage.swap,
            io: usage.io,
        }
    }

    fn pod_stats_of(&self, sb: &Sandbox) -> api::PodSandboxStats {
        let (attributes, cgroup) = sb.with(|r| {
            (
                api::PodSandboxAttributes {
                    id: r.id.clone(),
                    metadata: r.config.metadata.clone(),
                    labels: r.config.labels.clone(),
                    annotations: r.config.annotations.clone(),
                },
                r.cgroup_parent.clone(),
            )
        });
        let usage = cgroup_usage(self, &cgroup, |s| sb.swap_cpu_sample(s));
        let containers = sb
            .container_ids()
            .iter()
            .filter_map(|id| self.state.container(id))
            .filter(|c| c.state() != ContainerState::Creating)
            .map(|c| self.stats_of(&c))
            .collect();
        api::PodSandboxStats {
            attributes: Some(attributes),
            linux: Some(api::LinuxPodSandboxStats {
                cpu: usage.cpu,
                memory: usage.memory,
                network: None,
                io: usage.io,
                process: Some(api::ProcessUsage {
                    timestamp: util::now_ns(),
                    process_count: usage.pids.and_then(u64v),
                }),
                containers,
            }),
            windows: None,
        }
    }

    /// ContainerStats.
    pub(crate) async fn container_stats(
        self: &Arc<Self>,
        req: api::ContainerStatsRequest,
    ) -> Result<api::ContainerStatsResponse> {
        let c = self.container(&req.container_id)?;
        Ok(api::ContainerStatsResponse {
            stats: Some(self.stats_of(&c)),
        })
    }

    /// ListContainerStats.
    pub(crate) async fn list_container_stats(
        self: &Arc<Self>,
        req: api::ListContainerStatsRequest,
    ) -> Result<api::ListContainerStatsResponse> {
        let f = req.filter.unwrap_or_default();
        let list = self
            .list_containers(api::ListContainersRequest {
                filter: Some(api::ContainerFilter {
                    id: f.id,
                    state: None,
                    pod_sandbox_id: f.pod_sandbox_id,
                    label_selector: f.label_selector,
                }),
            })
            .await?;
        let stats = list
            .containers
            .iter()
            .filter_map(|c| self.state.container(&c.id))
            .map(|c| self.stats_of(&c))
            .collect();
        Ok(api::ListContainerStatsResponse { stats })
    }

    /// PodSandboxStats.
    pub(crate) async fn pod_sandbox_stats(
        self: &Arc<Self>,
        req: api::PodSandboxStatsRequest,
    ) -> Result<api::PodSandboxStatsResponse> {
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        Ok(api::PodSandboxStatsResponse {
            stats: Some(self.pod_stats_of(&sb)),
        })
    }

    /// ListPodSandboxStats.
    pub(crate) async fn list_pod_sandbox_stats(
        self: &Arc<Self>,
        req: api::ListPodSandboxStatsRequest,
    ) -> Result<api::ListPodSandboxStatsResponse> {
        let f = req.filter.unwrap_or_default();
        let stats = self
            .state
            .sandboxes()
            .iter()
            .filter(|sb| {
                sb.with(|r| {
                    r.state != crate::records::SandboxState::Creating
                        && (f.id.is_empty() || r.id.starts_with(&f.id))
                        && labels_match(&r.config.labels, &f.label_selector)
                })
            })
            .map(|sb| self.pod_stats_of(sb))
            .collect();
        Ok(api::ListPodSandboxStatsResponse { stats })
    }
}
