//! Between the OCI spec the runtime builds and NRI's view of a container: the
//! container plugins are shown, and a merged adjustment applied to the spec
//! before the container is created.
//!
//! Keys marked for removal carry a leading `-` (annotations, mounts by
//! destination, env by name, devices by path, namespaces by type, sysctls).

use std::collections::HashMap;
use std::path::PathBuf;

use oci_spec::runtime::{
    Hook, LinuxDevice, LinuxDeviceType, LinuxHugepageLimit, LinuxNamespace, LinuxNamespaceType,
    LinuxPids, LinuxResources, Mount, PosixRlimitBuilder, PosixRlimitType, Spec,
};
use petrel_nri::api;

/// An adjustment the runtime cannot carry out.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApplyError {
    /// A value the OCI spec cannot hold.
    #[error("invalid {field} {value:?} in the NRI adjustment: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The value.
        value: String,
        /// Why.
        reason: String,
    },
    /// A part of NRI Petrel does not implement.
    #[error("the NRI adjustment sets {0}, which Petrel does not support")]
    Unsupported(&'static str),
}

fn invalid(field: &'static str, value: impl Into<String>, reason: impl ToString) -> ApplyError {
    ApplyError::Invalid {
        field,
        value: value.into(),
        reason: reason.to_string(),
    }
}

/// The `-` removal marker: `Some(key)` if `key` asks for removal.
fn removal(key: &str) -> Option<&str> {
    key.strip_prefix('-')
}

/// Sets `changes` into `map`; a key with the removal marker removes the entry.
fn merge_keyed(map: &mut HashMap<String, String>, changes: &HashMap<String, String>) {
    for (k, v) in changes {
        match removal(k) {
            Some(key) => {
                map.remove(key);
            }
            None => {
                map.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Resource fields Petrel cannot apply (no blockio/RDT classes, device rules
/// come from the device list).
fn refuse_unsupported_resources(r: &api::LinuxResources) -> Result<(), ApplyError> {
    if r.blockio_class.is_some() {
        return Err(ApplyError::Unsupported("blockio_class"));
    }
    if r.rdt_class.is_some() {
        return Err(ApplyError::Unsupported("rdt_class"));
    }
    if !r.devices.is_empty() {
        return Err(ApplyError::Unsupported("device cgroup rules"));
    }
    Ok(())
}

fn opt_i64(v: Option<i64>) -> Option<api::OptionalInt64> {
    v.map(|value| api::OptionalInt64 { value })
}

fn opt_u64(v: Option<u64>) -> Option<api::OptionalUInt64> {
    v.map(|value| api::OptionalUInt64 { value })
}

fn opt_bool(v: Option<bool>) -> Option<api::OptionalBool> {
    v.map(|value| api::OptionalBool { value })
}

/// OCI namespace type as NRI names it (`network`, `pid`, ...).
fn namespace_name(t: LinuxNamespaceType) -> String {
    serde_json::to_value(t)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The spec's cgroup resources as NRI shows them.
pub fn resources_to_nri(r: &LinuxResources) -> api::LinuxResources {
    let memory = r.memory().as_ref().map(|m| api::LinuxMemory {
        limit: opt_i64(m.limit()),
        reservation: opt_i64(m.reservation()),
        swap: opt_i64(m.swap()),
        kernel: opt_i64(m.kernel()),
        kernel_tcp: opt_i64(m.kernel_tcp()),
        swappiness: opt_u64(m.swappiness()),
        disable_oom_killer: opt_bool(m.disable_oom_killer()),
        use_hierarchy: opt_bool(m.use_hierarchy()),
    });
    let cpu = r.cpu().as_ref().map(|c| api::LinuxCpu {
        shares: opt_u64(c.shares()),
        quota: opt_i64(c.quota()),
        period: opt_u64(c.period()),
        realtime_runtime: opt_i64(c.realtime_runtime()),
        realtime_period: opt_u64(c.realtime_period()),
        cpus: c.cpus().clone().unwrap_or_default(),
        mems: c.mems().clone().unwrap_or_default(),
    });
    api::LinuxResources {
        memory,
        cpu,
        hugepage_limits: r
            .hugepage_limits()
            .iter()
            .flatten()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size().clone(),
                limit: u64::try_from(h.limit()).unwrap_or(0),
            })
            .collect(),
        unified: r
            .unified()
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        pids: r
            .pids()
            .as_ref()
            .map(|p| api::LinuxPids { limit: p.limit() }),
        ..Default::default()
    }
}

/// The container plugins see in CreateContainer: from the record and the
/// spec about to be written.
pub fn container_from_spec(
    id: &str,
    pod_id: &str,
    name: &str,
    labels: &HashMap<String, String>,
    seccomp_profile: Option<api::SecurityProfile>,
    spec: &Spec,
) -> api::Container {
    let process = spec.process().as_ref();
    let linux = spec.linux().as_ref();
    api::Container {
        id: id.to_string(),
        pod_sandbox_id: pod_id.to_string(),
        name: name.to_string(),
        state: api::ContainerState::ContainerCreated as i32,
        labels: labels.clone(),
        annotations: spec.annotations().clone().unwrap_or_default(),
        args: process.and_then(|p| p.args().clone()).unwrap_or_default(),
        env: process.and_then(|p| p.env().clone()).unwrap_or_default(),
        mounts: spec
            .mounts()
            .iter()
            .flatten()
            .map(|m| api::Mount {
                destination: m.destination().display().to_string(),
                r#type: m.typ().clone().unwrap_or_default(),
                source: m
                    .source()
                    .as_ref()
                    .map(|s| s.display().to_string())
                    .unwrap_or_default(),
                options: m.options().clone().unwrap_or_default(),
            })
            .collect(),
        rlimits: process
            .and_then(|p| p.rlimits().clone())
            .unwrap_or_default()
            .iter()
            .map(|r| api::PosixRlimit {
                r#type: r.typ().to_string(),
                hard: r.hard(),
                soft: r.soft(),
            })
            .collect(),
        linux: linux.map(|l| api::LinuxContainer {
            namespaces: l
                .namespaces()
                .iter()
                .flatten()
                .map(|n| api::LinuxNamespace {
                    r#type: namespace_name(n.typ()),
                    path: n
                        .path()
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                })
                .collect(),
            devices: l
                .devices()
                .iter()
                .flatten()
                .map(|d| api::LinuxDevice {
                    path: d.path().display().to_string(),
                    r#type: d.typ().as_str().to_string(),
                    major: d.major(),
                    minor: d.minor(),
                    file_mode: d.file_mode().map(|value| api::OptionalFileMode { value }),
                    uid: d.uid().map(|value| api::OptionalUInt32 { value }),
                    gid: d.gid().map(|value| api::OptionalUInt32 { value }),
                })
                .collect(),
            resources: l.resources().as_ref().map(resources_to_nri),
            oom_score_adj: process
                .and_then(|p| p.oom_score_adj())
                .map(|v| api::OptionalInt {
                    value: i64::from(v),
                }),
            cgroups_path: l
                .cgroups_path()
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            sysctl: l.sysctl().clone().unwrap_or_default(),
            seccomp_profile,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The NRI form of the seccomp profile a container runs under (what the
/// validator's `reject_*_seccomp_adjustment` options look at).
pub fn nri_seccomp_profile(
    req: &petrel_oci::spec::seccomp::SeccompRequest,
) -> api::SecurityProfile {
    use api::security_profile::ProfileType;
    use petrel_oci::spec::seccomp::SeccompRequest as R;
    let (ty, localhost_ref) = match req {
        R::Unconfined => (ProfileType::Unconfined, String::new()),
        R::RuntimeDefault => (ProfileType::RuntimeDefault, String::new()),
        R::Localhost(p) => (ProfileType::Localhost, p.display().to_string()),
    };
    api::SecurityProfile {
        profile_type: ty as i32,
        localhost_ref,
    }
}

/// A plugin's seccomp policy as OCI `linux.seccomp`, checked by the same
/// rules as a `Localhost` profile file (it replaces the container's
/// filter, as in containerd).
fn seccomp_policy(p: &api::LinuxSeccomp) -> Result<oci_spec::runtime::LinuxSeccomp, ApplyError> {
    use serde_json::{json, Map, Value};
    let mut top = Map::new();
    top.insert("defaultAction".into(), json!(p.default_action));
    if let Some(e) = &p.default_errno {
        top.insert("defaultErrnoRet".into(), json!(e.value));
    }
    if !p.architectures.is_empty() {
        top.insert("architectures".into(), json!(p.architectures));
    }
    if !p.flags.is_empty() {
        top.insert("flags".into(), json!(p.flags));
    }
    if !p.listener_path.is_empty() {
        top.insert("listenerPath".into(), json!(p.listener_path));
    }
    let syscalls: Vec<Value> = p
        .syscalls
        .iter()
        .map(|s| {
            let mut o = Map::new();
            o.insert("names".into(), json!(s.names));
            o.insert("action".into(), json!(s.action));
            if let Some(e) = &s.errno_ret {
                o.insert("errnoRet".into(), json!(e.value));
            }
            let args: Vec<Value> = s
                .args
                .iter()
                .map(|a| json!({"index": a.index, "value": a.value, "valueTwo": a.value_two, "op": a.op}))
                .collect();
            if !args.is_empty() {
                o.insert("args".into(), Value::Array(args));
            }
            Value::Object(o)
        })
        .collect();
    top.insert("syscalls".into(), Value::Array(syscalls));
    petrel_oci::spec::seccomp::parse_profile(&Value::Object(top))
        .map_err(|e| invalid("seccomp_policy", String::new(), e))
}

/// Applies a merged adjustment to `spec`.
pub fn apply_adjustment(spec: &mut Spec, adj: &api::ContainerAdjustment) -> Result<(), ApplyError> {
    if !adj.cdi_devices.is_empty() {
        return Err(ApplyError::Unsupported("CDI devices"));
    }
    if !adj.annotations.is_empty() {
        let mut a = spec.annotations().clone().unwrap_or_default();
        merge_keyed(&mut a, &adj.annotations);
        spec.set_annotations(Some(a));
    }
    if !adj.mounts.is_empty() {
        let mut mounts = spec.mounts().clone().unwrap_or_default();
        for m in &adj.mounts {
            if let Some(dest) = removal(&m.destination) {
                mounts.retain(|x| x.destination() != &PathBuf::from(dest));
                continue;
            }
            if !m.destination.starts_with('/') {
                return Err(invalid("mount destination", &m.destination, "not absolute"));
            }
            let mut mount = Mount::default();
            mount
                .set_destination(PathBuf::from(&m.destination))
                .set_typ((!m.r#type.is_empty()).then(|| m.r#type.clone()))
                .set_source((!m.source.is_empty()).then(|| PathBuf::from(&m.source)))
                .set_options((!m.options.is_empty()).then(|| m.options.clone()));
            // A mount for a destination already mounted replaces it.
            mounts.retain(|x| x.destination() != mount.destination());
            mounts.push(mount);
        }
        // Parents before children, so a new mount is not hidden by its parent.
        mounts.sort_by_key(|m| m.destination().components().count());
        spec.set_mounts(Some(mounts));
    }
    let needs_process = !adj.env.is_empty() || !adj.args.is_empty() || !adj.rlimits.is_empty();
    if needs_process {
        let mut process = spec.process().clone().unwrap_or_default();
        if !adj.env.is_empty() {
            let mut env = process.env().clone().unwrap_or_default();
            for kv in &adj.env {
                let (key, remove) = match removal(&kv.key) {
                    Some(k) => (k, true),
                    None => (kv.key.as_str(), false),
                };
                if key.is_empty() || key.contains('=') {
                    return Err(invalid("env name", &kv.key, "empty or contains '='"));
                }
                let prefix = format!("{key}=");
                env.retain(|e| !e.starts_with(&prefix) && e != key);
                if !remove {
                    env.push(format!("{key}={}", kv.value));
                }
            }
            process.set_env(Some(env));
        }
        if !adj.args.is_empty() {
            // An empty first argument is upstream's way of saying "replace".
            let args: Vec<String> = adj.args.iter().filter(|a| !a.is_empty()).cloned().collect();
            if args.is_empty() {
                return Err(invalid("args", "", "no command left"));
            }
            process.set_args(Some(args));
        }
        if !adj.rlimits.is_empty() {
            let mut rlimits = process.rlimits().clone().unwrap_or_default();
            for r in &adj.rlimits {
                let typ: PosixRlimitType = r
                    .r#type
                    .parse()
                    .map_err(|e| invalid("rlimit type", &r.r#type, e))?;
                if r.soft > r.hard {
                    return Err(invalid(
                        "rlimit",
                        &r.r#type,
                        format!("soft {} above hard {}", r.soft, r.hard),
                    ));
                }
                rlimits.retain(|x| x.typ() != typ);
                let limit = PosixRlimitBuilder::default()
                    .typ(typ)
                    .hard(r.hard)
                    .soft(r.soft)
                    .build()
                    .map_err(|e| invalid("rlimit", &r.r#type, e))?;
                rlimits.push(limit);
            }
            process.set_rlimits(Some(rlimits));
        }
        spec.set_process(Some(process));
    }
    if let Some(hooks) = &adj.hooks {
        apply_hooks(spec, hooks)?;
    }
    if let Some(l) = &adj.linux {
        apply_linux(spec, l)?;
    }
    Ok(())
}

fn oci_hooks(list: &[api::Hook]) -> Result<Vec<Hook>, ApplyError> {
    list.iter()
        .map(|h| {
            if !h.path.starts_with('/') {
                return Err(invalid("hook path", &h.path, "not absolute"));
            }
            let mut hook = Hook::default();
            hook.set_path(PathBuf::from(&h.path))
                .set_args((!h.args.is_empty()).then(|| h.args.clone()))
                .set_env((!h.env.is_empty()).then(|| h.env.clone()))
                .set_timeout(h.timeout.as_ref().map(|t| t.value));
            Ok(hook)
        })
        .collect()
}

/// OCI hooks are appended, never replaced.
fn apply_hooks(spec: &mut Spec, h: &api::Hooks) -> Result<(), ApplyError> {
    let mut hooks = spec.hooks().clone().unwrap_or_default();
    let add =
        |cur: &Option<Vec<Hook>>, more: &[api::Hook]| -> Result<Option<Vec<Hook>>, ApplyError> {
            let mut all = cur.clone().unwrap_or_default();
            all.extend(oci_hooks(more)?);
            Ok((!all.is_empty()).then_some(all))
        };
    let prestart = add(hooks.prestart(), &h.prestart)?;
    let create_runtime = add(hooks.create_runtime(), &h.create_runtime)?;
    let create_container = add(hooks.create_container(), &h.create_container)?;
    let start_container = add(hooks.start_container(), &h.start_container)?;
    let poststart = add(hooks.poststart(), &h.poststart)?;
    let poststop = add(hooks.poststop(), &h.poststop)?;
    hooks
        .set_prestart(prestart)
        .set_create_runtime(create_runtime)
        .set_create_container(create_container)
        .set_start_container(start_container)
        .set_poststart(poststart)
        .set_poststop(poststop);
    spec.set_hooks(Some(hooks));
    Ok(())
}

fn apply_linux(spec: &mut Spec, l: &api::LinuxContainerAdjustment) -> Result<(), ApplyError> {
    if l.io_priority.is_some() {
        return Err(ApplyError::Unsupported("io_priority"));
    }
    let policy = l.seccomp_policy.as_ref().map(seccomp_policy).transpose()?;
    if !l.net_devices.is_empty() {
        return Err(ApplyError::Unsupported("net_devices"));
    }
    if l.scheduler.is_some() {
        return Err(ApplyError::Unsupported("scheduler"));
    }
    if l.rdt.is_some() {
        return Err(ApplyError::Unsupported("rdt"));
    }
    if l.memory_policy.is_some() {
        return Err(ApplyError::Unsupported("memory_policy"));
    }
    if let Some(adj) = &l.oom_score_adj {
        let v = i32::try_from(adj.value)
            .ok()
            .filter(|v| (-1000..=1000).contains(v))
            .ok_or_else(|| {
                invalid(
                    "oom_score_adj",
                    adj.value.to_string(),
                    "outside -1000..1000",
                )
            })?;
        let mut process = spec.process().clone().unwrap_or_default();
        process.set_oom_score_adj(Some(v));
        spec.set_process(Some(process));
    }
    let mut linux = spec.linux().clone().unwrap_or_default();
    if policy.is_some() {
        linux.set_seccomp(policy);
    }
    if !l.devices.is_empty() {
        let mut devices = linux.devices().clone().unwrap_or_default();
        for d in &l.devices {
            if let Some(path) = removal(&d.path) {
                devices.retain(|x| x.path() != &PathBuf::from(path));
                continue;
            }
            let typ = match d.r#type.as_str() {
                "c" | "u" => LinuxDeviceType::C,
                "b" => LinuxDeviceType::B,
                "p" => LinuxDeviceType::P,
                other => return Err(invalid("device type", other, "not c, u, b or p")),
            };
            if !d.path.starts_with("/dev/") {
                return Err(invalid("device path", &d.path, "not under /dev"));
            }
            let mut dev = LinuxDevice::default();
            dev.set_path(PathBuf::from(&d.path))
                .set_typ(typ)
                .set_major(d.major)
                .set_minor(d.minor)
                .set_file_mode(d.file_mode.as_ref().map(|m| m.value))
                .set_uid(d.uid.as_ref().map(|u| u.value))
                .set_gid(d.gid.as_ref().map(|g| g.value));
            devices.retain(|x| x.path() != dev.path());
            devices.push(dev);
        }
        linux.set_devices(Some(devices));
    }
    if !l.cgroups_path.is_empty() {
        linux.set_cgroups_path(Some(PathBuf::from(&l.cgroups_path)));
    }
    if !l.namespaces.is_empty() {
        let mut namespaces = linux.namespaces().clone().unwrap_or_default();
        for n in &l.namespaces {
            let (name, remove) = match removal(&n.r#type) {
                Some(t) => (t, true),
                None => (n.r#type.as_str(), false),
            };
            let typ = LinuxNamespaceType::try_from(name)
                .map_err(|e| invalid("namespace type", name, e))?;
            namespaces.retain(|x| x.typ() != typ);
            if !remove {
                let mut ns = LinuxNamespace::default();
                ns.set_typ(typ)
                    .set_path((!n.path.is_empty()).then(|| PathBuf::from(&n.path)));
                namespaces.push(ns);
            }
        }
        linux.set_namespaces(Some(namespaces));
    }
    if !l.sysctl.is_empty() {
        let mut sysctl = linux.sysctl().clone().unwrap_or_default();
        merge_keyed(&mut sysctl, &l.sysctl);
        linux.set_sysctl(Some(sysctl));
    }
    if let Some(r) = &l.resources {
        let mut res = linux.resources().clone().unwrap_or_default();
        apply_resources(&mut res, r)?;
        linux.set_resources(Some(res));
    }
    spec.set_linux(Some(linux));
    Ok(())
}

/// Applies NRI resources over `res` (set fields win, unset ones stay): for
/// an adjustment at creation and for updates.
pub fn apply_resources(
    res: &mut LinuxResources,
    r: &api::LinuxResources,
) -> Result<(), ApplyError> {
    refuse_unsupported_resources(r)?;
    if let Some(m) = &r.memory {
        let mut mem = (*res.memory()).unwrap_or_default();
        if let Some(v) = &m.limit {
            mem.set_limit(Some(v.value));
        }
        if let Some(v) = &m.reservation {
            mem.set_reservation(Some(v.value));
        }
        if let Some(v) = &m.swap {
            mem.set_swap(Some(v.value));
        }
        if let Some(v) = &m.kernel {
            mem.set_kernel(Some(v.value));
        }
        if let Some(v) = &m.kernel_tcp {
            mem.set_kernel_tcp(Some(v.value));
        }
        if let Some(v) = &m.swappiness {
            if v.value > 100 {
                return Err(invalid(
                    "memory swappiness",
                    v.value.to_string(),
                    "above 100",
                ));
            }
            mem.set_swappiness(Some(v.value));
        }
        if let Some(v) = &m.disable_oom_killer {
            mem.set_disable_oom_killer(Some(v.value));
        }
        if let Some(v) = &m.use_hierarchy {
            mem.set_use_hierarchy(Some(v.value));
        }
        res.set_memory(Some(mem));
    }
    if let Some(c) = &r.cpu {
        let mut cpu = res.cpu().clone().unwrap_or_default();
        if let Some(v) = &c.shares {
            cpu.set_shares(Some(v.value));
        }
        if let Some(v) = &c.quota {
            cpu.set_quota(Some(v.value));
        }
        if let Some(v) = &c.period {
            cpu.set_period(Some(v.value));
        }
        if let Some(v) = &c.realtime_runtime {
            cpu.set_realtime_runtime(Some(v.value));
        }
        if let Some(v) = &c.realtime_period {
            cpu.set_realtime_period(Some(v.value));
        }
        if !c.cpus.is_empty() {
            check_cpuset("cpus", &c.cpus)?;
            cpu.set_cpus(Some(c.cpus.clone()));
        }
        if !c.mems.is_empty() {
            check_cpuset("mems", &c.mems)?;
            cpu.set_mems(Some(c.mems.clone()));
        }
        res.set_cpu(Some(cpu));
    }
    if !r.hugepage_limits.is_empty() {
        let mut limits = res.hugepage_limits().clone().unwrap_or_default();
        for h in &r.hugepage_limits {
            let limit = i64::try_from(h.limit)
                .map_err(|_| invalid("hugepage limit", h.limit.to_string(), "too large"))?;
            limits.retain(|x| x.page_size() != &h.page_size);
            let mut l = LinuxHugepageLimit::default();
            l.set_page_size(h.page_size.clone()).set_limit(limit);
            limits.push(l);
        }
        res.set_hugepage_limits(Some(limits));
    }
    if !r.unified.is_empty() {
        let mut unified = res.unified().clone().unwrap_or_default();
        for (k, v) in &r.unified {
            if k.contains('/') {
                return Err(invalid("unified key", k, "contains '/'"));
            }
            unified.insert(k.clone(), v.clone());
        }
        res.set_unified(Some(unified));
    }
    if let Some(p) = &r.pids {
        let mut pids = LinuxPids::default();
        pids.set_limit(p.limit);
        res.set_pids(Some(pids));
    }
    Ok(())
}

/// A container's CRI resources with an NRI update laid over them (set fields
/// win): how a plugin's update reaches UpdateContainerResources. Fields CRI
/// cannot carry are refused by name.
pub fn update_cri_resources(
    base: &petrel_cri::api::LinuxContainerResources,
    r: &api::LinuxResources,
) -> Result<petrel_cri::api::LinuxContainerResources, ApplyError> {
    refuse_unsupported_resources(r)?;
    let mut out = base.clone();
    if let Some(m) = &r.memory {
        if let Some(v) = &m.limit {
            out.memory_limit_in_bytes = v.value;
        }
        if let Some(v) = &m.swap {
            out.memory_swap_limit_in_bytes = v.value;
        }
        if m.reservation.is_some()
            || m.kernel.is_some()
            || m.kernel_tcp.is_some()
            || m.swappiness.is_some()
            || m.disable_oom_killer.is_some()
            || m.use_hierarchy.is_some()
        {
            return Err(ApplyError::Unsupported(
                "memory fields other than limit and swap in an update",
            ));
        }
    }
    if let Some(c) = &r.cpu {
        if let Some(v) = &c.shares {
            out.cpu_shares = i64::try_from(v.value)
                .map_err(|_| invalid("cpu shares", v.value.to_string(), "too large"))?;
        }
        if let Some(v) = &c.quota {
            out.cpu_quota = v.value;
        }
        if let Some(v) = &c.period {
            out.cpu_period = i64::try_from(v.value)
                .map_err(|_| invalid("cpu period", v.value.to_string(), "too large"))?;
        }
        if c.realtime_runtime.is_some() || c.realtime_period.is_some() {
            return Err(ApplyError::Unsupported("realtime CPU in an update"));
        }
        if !c.cpus.is_empty() {
            check_cpuset("cpus", &c.cpus)?;
            out.cpuset_cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            check_cpuset("mems", &c.mems)?;
            out.cpuset_mems = c.mems.clone();
        }
    }
    for h in &r.hugepage_limits {
        out.hugepage_limits.retain(|x| x.page_size != h.page_size);
        out.hugepage_limits.push(petrel_cri::api::HugepageLimit {
            page_size: h.page_size.clone(),
            limit: h.limit,
        });
    }
    for (k, v) in &r.unified {
        out.unified.insert(k.clone(), v.clone());
    }
    if r.pids.is_some() {
        return Err(ApplyError::Unsupported("pids limit in an update"));
    }
    Ok(out)
}

/// A cpuset list: `0-3,6`.
fn check_cpuset(field: &'static str, s: &str) -> Result<(), ApplyError> {
    let ok = s.split(',').all(|part| {
        let mut ends = part.splitn(2, '-');
        let a = ends.next().map(|x| x.trim().parse::<u32>());
        let b = ends.next().map(|x| x.trim().parse::<u32>());
        match (a, b) {
            (Some(Ok(_)), None) => true,
            (Some(Ok(lo)), Some(Ok(hi))) => lo <= hi,
            _ => false,
        }
    });
    if ok {
        Ok(())
    } else {
        Err(invalid(
            if field == "cpus" {
                "cpuset cpus"
            } else {
                "cpuset mems"
            },
            s,
            "not a list like 0-3,6",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Spec {
        let mut spec = Spec::default();
        let mut process = spec.process().clone().unwrap_or_default();
        process.set_env(Some(vec![
            "PATH=/bin".into(),
            "KEEP=1".into(),
            "DROP=1".into(),
        ]));
        process.set_args(Some(vec!["sleep".into(), "1".into()]));
        spec.set_process(Some(process));
        spec
    }

    #[test]
    fn adjustment_should_add_replace_and_remove_entries() {
        let mut spec = base();
        let adj = api::ContainerAdjustment {
            annotations: HashMap::from([
                ("a".to_string(), "1".to_string()),
                ("-b".to_string(), String::new()),
            ]),
            env: vec![
                api::KeyValue {
                    key: "NEW".into(),
                    value: "x".into(),
                },
                api::KeyValue {
                    key: "-DROP".into(),
                    value: String::new(),
                },
                api::KeyValue {
                    key: "KEEP".into(),
                    value: "2".into(),
                },
            ],
            mounts: vec![api::Mount {
                destination: "/data".into(),
                r#type: "bind".into(),
                source: "/tmp".into(),
                options: vec!["rbind".into(), "ro".into()],
            }],
            rlimits: vec![api::PosixRlimit {
                r#type: "RLIMIT_NOFILE".into(),
                hard: 2048,
                soft: 1024,
            }],
            linux: Some(api::LinuxContainerAdjustment {
                resources: Some(api::LinuxResources {
                    memory: Some(api::LinuxMemory {
                        limit: Some(api::OptionalInt64 { value: 64 << 20 }),
                        ..Default::default()
                    }),
                    cpu: Some(api::LinuxCpu {
                        cpus: "0".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                oom_score_adj: Some(api::OptionalInt { value: 500 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut annotations = HashMap::new();
        annotations.insert("b".to_string(), "gone".to_string());
        spec.set_annotations(Some(annotations));
        apply_adjustment(&mut spec, &adj).unwrap_or_else(|e| panic!("{e}"));

        let a = spec.annotations().clone().unwrap_or_default();
        assert_eq!(a.get("a").map(String::as_str), Some("1"));
        assert!(!a.contains_key("b"));
        let p = spec.process().clone().unwrap_or_default();
        let env = p.env().clone().unwrap_or_default();
        assert_eq!(env, ["PATH=/bin", "NEW=x", "KEEP=2"]);
        assert_eq!(p.oom_score_adj(), Some(500));
        let rl = p.rlimits().clone().unwrap_or_default();
        assert_eq!(rl.len(), 1);
        assert_eq!((rl[0].hard(), rl[0].soft()), (2048, 1024));
        let m = spec.mounts().clone().unwrap_or_default();
        assert!(m.iter().any(|m| m.destination() == &PathBuf::from("/data")));
        let res = spec
            .linux()
            .as_ref()
            .and_then(|l| l.resources().clone())
            .unwrap_or_default();
        assert_eq!(
            res.memory().as_ref().and_then(|m| m.limit()),
            Some(64 << 20)
        );
        assert_eq!(
            res.cpu().as_ref().and_then(|c| c.cpus().clone()).as_deref(),
            Some("0")
        );

        // The view plugins get shows the result.
        let c = container_from_spec("c1", "p1", "web", &HashMap::new(), None, &spec);
        assert_eq!(c.env, ["PATH=/bin", "NEW=x", "KEEP=2"]);
        assert_eq!(c.annotations.get("a").map(String::as_str), Some("1"));
        let r = c.linux.and_then(|l| l.resources).unwrap_or_default();
        assert_eq!(
            r.memory.and_then(|m| m.limit).map(|v| v.value),
            Some(64 << 20)
        );
    }

    fn with_policy(policy: api::LinuxSeccomp) -> api::ContainerAdjustment {
        api::ContainerAdjustment {
            linux: Some(api::LinuxContainerAdjustment {
                seccomp_policy: Some(policy),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn apply_adjustment_should_replace_the_seccomp_filter_with_a_plugins_policy() {
        let mut spec = base();
        let policy = api::LinuxSeccomp {
            default_action: "SCMP_ACT_ALLOW".into(),
            architectures: vec!["SCMP_ARCH_X86_64".into()],
            syscalls: vec![api::LinuxSyscall {
                names: vec!["mkdir".into()],
                action: "SCMP_ACT_ERRNO".into(),
                errno_ret: Some(api::OptionalUInt32 { value: 13 }),
                args: vec![api::LinuxSeccompArg {
                    index: 1,
                    value: 0o700,
                    value_two: 0,
                    op: "SCMP_CMP_EQ".into(),
                }],
            }],
            ..Default::default()
        };
        apply_adjustment(&mut spec, &with_policy(policy)).expect("apply");
        let s = spec
            .linux()
            .as_ref()
            .and_then(|l| l.seccomp().clone())
            .expect("seccomp");
        assert_eq!(
            s.default_action(),
            oci_spec::runtime::LinuxSeccompAction::ScmpActAllow
        );
        let rules = s.syscalls().clone().unwrap_or_default();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].errno_ret(), Some(13));
        let a = rules[0].args().clone().unwrap_or_default();
        assert_eq!((a[0].index(), a[0].value()), (1, 0o700));
    }

    #[test]
    fn apply_adjustment_should_refuse_a_policy_a_profile_file_could_not_have() {
        for (policy, want) in [
            (
                api::LinuxSeccomp {
                    default_action: "SCMP_ACT_SOMETIMES".into(),
                    ..Default::default()
                },
                "SCMP_ACT_SOMETIMES",
            ),
            (
                api::LinuxSeccomp {
                    default_action: "SCMP_ACT_ALLOW".into(),
                    listener_path: "/run/agent.sock".into(),
                    ..Default::default()
                },
                "listenerPath",
            ),
        ] {
            let mut spec = base();
            let before = spec.clone();
            let err = apply_adjustment(&mut spec, &with_policy(policy)).expect_err(want);
            assert!(
                matches!(
                    &err,
                    ApplyError::Invalid {
                        field: "seccomp_policy",
                        ..
                    }
                ),
                "{err:?}"
            );
            assert!(err.to_string().contains(want), "{err}");
            assert_eq!(spec, before, "a refused adjustment changed the spec");
        }
    }

    #[test]
    fn container_from_spec_should_show_the_seccomp_profile() {
        use petrel_oci::spec::seccomp::SeccompRequest;
        let p = nri_seccomp_profile(&SeccompRequest::Localhost("/p.json".into()));
        let c = container_from_spec("c1", "p1", "web", &HashMap::new(), Some(p.clone()), &base());
        assert_eq!(c.linux.and_then(|l| l.seccomp_profile), Some(p));
        let rd = nri_seccomp_profile(&SeccompRequest::RuntimeDefault);
        assert_eq!(
            rd.profile_type,
            api::security_profile::ProfileType::RuntimeDefault as i32
        );
    }

    #[test]
    fn updates_should_lay_over_cri_resources() {
        let base = petrel_cri::api::LinuxContainerResources {
            cpu_shares: 1024,
            memory_limit_in_bytes: 1 << 30,
            cpuset_cpus: "0-1".into(),
            ..Default::default()
        };
        let upd = api::LinuxResources {
            cpu: Some(api::LinuxCpu {
                cpus: "1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = update_cri_resources(&base, &upd).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.cpuset_cpus, "1");
        assert_eq!(out.cpu_shares, 1024);
        assert_eq!(out.memory_limit_in_bytes, 1 << 30);
        let bad = api::LinuxResources {
            pids: Some(api::LinuxPids { limit: 10 }),
            ..Default::default()
        };
        assert_eq!(
            update_cri_resources(&base, &bad),
            Err(ApplyError::Unsupported("pids limit in an update"))
        );
    }

    #[test]
    fn invalid_or_unsupported_adjustments_should_be_refused_by_name() {
        let cases = [
            api::ContainerAdjustment {
                env: vec![api::KeyValue {
                    key: "A=B".into(),
                    value: "x".into(),
                }],
                ..Default::default()
            },
            api::ContainerAdjustment {
                rlimits: vec![api::PosixRlimit {
                    r#type: "RLIMIT_BOGUS".into(),
                    hard: 1,
                    soft: 1,
                }],
                ..Default::default()
            },
            api::ContainerAdjustment {
                linux: Some(api::LinuxContainerAdjustment {
                    resources: Some(api::LinuxResources {
                        cpu: Some(api::LinuxCpu {
                            cpus: "3-1".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            api::ContainerAdjustment {
                linux: Some(api::LinuxContainerAdjustment {
                    oom_score_adj: Some(api::OptionalInt { value: 5000 }),
                    ..Default::default()
                }),
                ..Default::default()
            },
            api::ContainerAdjustment {
                cdi_devices: vec![api::CdiDevice {
                    name: "vendor.com/gpu=0".into(),
                }],
                ..Default::default()
            },
        ];
        for adj in cases {
            let mut spec = base();
            assert!(
                apply_adjustment(&mut spec, &adj).is_err(),
                "{adj:?} accepted"
            );
        }
    }
}
