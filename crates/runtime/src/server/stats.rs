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

/// CPU and memory usage of a cgroup, with the CPU rate since `prev`.
fn cgroup_usage(
    rt: &Runtime,
    path: &str,
    swap: impl FnOnce((i64, u64)) -> Option<(i64, u64)>,
) -> (Option<api::CpuUsage>, Option<api::MemoryUsage>, Option<u64>) {
    let ts = util::now_ns();
    let Ok(st) = rt.cgroups.stats(path) else {
        return (None, None, None);
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
        // Pressure (PSI) and IO usage are not read yet.
        psi: None,
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
        psi: None,
    };
    (Some(cpu), Some(memory), st.pids_current)
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
        let (cpu, memory, _) = if live {
            cgroup_usage(self, &cgroup, |s| c.swap_cpu_sample(s))
        } else {
            (None, None, None)
        };
        let usage = dir_usage(&upper);
        let walked_at = util::now_ns();
        // Kept for the metrics calls, which then need not walk again.
        c.layer_usage.put((walked_at, usage));
        let petrel_oci::dir_usage::DirUsage { bytes, inodes } = usage;
        api::ContainerStats {
            attributes: Some(attributes),
            cpu,
            memory,
            writable_layer: Some(api::FilesystemUsage {
                timestamp: walked_at,
                fs_id: Some(api::FilesystemIdentifier {
                    mountpoint: self.layout.root.join("containers").display().to_string(),
                }),
                used_bytes: u64v(bytes),
                inodes_used: u64v(inodes),
            }),
            swap: None,
            io: None,
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
        let (cpu, memory, pids) = cgroup_usage(self, &cgroup, |s| sb.swap_cpu_sample(s));
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
                cpu,
                memory,
                network: None,
                io: None,
                process: Some(api::ProcessUsage {
                    timestamp: util::now_ns(),
                    process_count: pids.and_then(u64v),
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
