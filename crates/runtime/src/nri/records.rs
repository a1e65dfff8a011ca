//! NRI's view of the runtime's pods and containers, built from their records
//! (for Synchronize and the events after creation; CreateContainer shows the
//! container from its OCI spec instead, see [`super::spec`]).

use petrel_cri::api as cri;
use petrel_nri::api;

use crate::records::{ContainerRecord, ContainerState, SandboxRecord};

/// CRI resources as NRI shows them (unset CRI zeros stay unset).
pub fn cri_resources_to_nri(r: &cri::LinuxContainerResources) -> api::LinuxResources {
    let i64_opt = |v: i64| (v != 0).then_some(api::OptionalInt64 { value: v });
    let u64_opt = |v: i64| {
        u64::try_from(v)
            .ok()
            .filter(|v| *v != 0)
            .map(|value| api::OptionalUInt64 { value })
    };
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: i64_opt(r.memory_limit_in_bytes),
            swap: i64_opt(r.memory_swap_limit_in_bytes),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: u64_opt(r.cpu_shares),
            quota: i64_opt(r.cpu_quota),
            period: u64_opt(r.cpu_period),
            cpus: r.cpuset_cpus.clone(),
            mems: r.cpuset_mems.clone(),
            ..Default::default()
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        unified: r.unified.clone(),
        ..Default::default()
    }
}

/// A pod as plugins see it.
pub fn pod(rec: &SandboxRecord) -> api::PodSandbox {
    let meta = rec.config.metadata.clone().unwrap_or_default();
    let linux = rec.config.linux.as_ref();
    let mut namespaces = Vec::new();
    for (typ, path) in [
        ("network", &rec.netns),
        ("ipc", &rec.ipcns),
        ("uts", &rec.utsns),
        ("user", &rec.userns),
    ] {
        if let Some(p) = path {
            namespaces.push(api::LinuxNamespace {
                r#type: typ.to_string(),
                path: p.display().to_string(),
            });
        }
    }
    api::PodSandbox {
        id: rec.id.clone(),
        name: meta.name,
        uid: meta.uid,
        namespace: meta.namespace,
        labels: rec.config.labels.clone(),
        annotations: rec.config.annotations.clone(),
        runtime_handler: rec.runtime_handler.clone(),
        linux: Some(api::LinuxPodSandbox {
            cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
            cgroups_path: rec.cgroup_parent.clone(),
            namespaces,
            pod_overhead: linux
                .and_then(|l| l.overhead.as_ref())
                .map(cri_resources_to_nri),
            pod_resources: linux
                .and_then(|l| l.resources.as_ref())
                .map(cri_resources_to_nri),
            ..Default::default()
        }),
        pid: rec.pid_holder.map(|h| h.pid).unwrap_or(0),
        // A stopped pod's addresses are those it had: plugins told of the
        // stop or the removal learn which addresses went.
        ips: rec
            .network
            .as_ref()
            .map_or_else(|| rec.released_ips.clone(), |n| n.ips.clone()),
    }
}

/// NRI's state of a container.
pub fn state(s: ContainerState) -> api::ContainerState {
    match s {
        ContainerState::Creating | ContainerState::Created => api::ContainerState::ContainerCreated,
        ContainerState::Running => api::ContainerState::ContainerRunning,
        ContainerState::Exited => api::ContainerState::ContainerStopped,
    }
}

/// A container as plugins see it after its creation.
pub fn container(rec: &ContainerRecord) -> api::Container {
    let cfg = &rec.config;
    let mut args = cfg.command.clone();
    args.extend(cfg.args.iter().cloned());
    api::Container {
        id: rec.id.clone(),
        pod_sandbox_id: rec.sandbox_id.clone(),
        // The container's own name, as CreateContainer showed it (not the
        // runtime's unique name).
        name: cfg
            .metadata
            .as_ref()
            .map_or_else(|| rec.name.clone(), |m| m.name.clone()),
        state: state(rec.state) as i32,
        labels: cfg.labels.clone(),
        annotations: cfg.annotations.clone(),
        args,
        env: cfg
            .envs
            .iter()
            .map(|kv| format!("{}={}", kv.key, String::from_utf8_lossy(&kv.value)))
            .collect(),
        mounts: cfg
            .mounts
            .iter()
            .map(|m| api::Mount {
                destination: m.container_path.clone(),
                r#type: "bind".to_string(),
                source: m.host_path.clone(),
                options: if m.readonly {
                    vec!["rbind".into(), "ro".into()]
                } else {
                    vec!["rbind".into(), "rw".into()]
                },
            })
            .collect(),
        linux: Some(api::LinuxContainer {
            resources: rec.resources.as_ref().map(cri_resources_to_nri),
            cgroups_path: rec.cgroup_path.clone(),
            ..Default::default()
        }),
        pid: rec.pid,
        created_at: rec.created_at,
        started_at: rec.started_at,
        finished_at: rec.finished_at,
        exit_code: rec.exit_code,
        status_reason: rec.reason.clone(),
        status_message: rec.message.clone(),
        ..Default::default()
    }
}
