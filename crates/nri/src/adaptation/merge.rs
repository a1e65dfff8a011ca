//! Merging what plugins answer, in index order, into one result with ownership
//! tracking: [`CreateMerger`] for CreateContainer, [`UpdateMerger`] for UpdateContainer,
//! StopContainer and (through [`check_plugin_updates`]) plugin-initiated
//! UpdateContainers.
//!
//! Rules (those of containerd's NRI): an entry of a keyed field (annotation, mount by
//! destination, device by path, env by name, hugepage limit by page size, rlimit by
//! type, namespace by type, sysctl, unified cgroup file, CDI device, network device) and
//! every whole field (each CPU and memory subfield, pids, block I/O and RDT class, OOM
//! score, cgroups path, args, I/O priority, seccomp policy, scheduler, memory policy,
//! RDT settings) may be set by one plugin only; a second is a [`MergeError::Conflict`]
//! naming both. OCI hooks and cgroup device rules append. A key, path or name with the
//! `-` marker removes the entry: that never conflicts and makes the remover its owner
//! (only it may set it again). Each plugin is shown the container as the earlier plugins
//! left it ([`CreateMerger::request`], [`UpdateMerger::resources`]).
//!
//! A merger that returned an error must be dropped: the operation it served fails.

use std::collections::HashMap;

use super::owners::{mark_for_removal, qualified_name, removal_target, Claims, MergeError};
use crate::api::{self, Field};

impl From<&super::Registration> for api::PluginInstance {
    /// The plugin as merge results and validation requests name it.
    fn from(r: &super::Registration) -> Self {
        api::PluginInstance {
            name: r.name.clone(),
            index: r.index.clone(),
        }
    }
}

/// An eviction a plugin asked for, with the plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    /// Qualified name (`NN-name`) of the plugin that asked.
    pub plugin: String,
    /// The container and the reason.
    pub eviction: api::ContainerEviction,
}

/// An update marked `ignore_failure` that was dropped because it conflicted.
#[derive(Debug, Clone, PartialEq)]
pub struct RejectedUpdate {
    /// Qualified name of the plugin that sent it.
    pub plugin: String,
    /// The update as sent.
    pub update: api::ContainerUpdate,
    /// Why it was dropped.
    pub error: MergeError,
}

/// Claims ownership of every field `res` sets.
fn claim_resources(res: &api::LinuxResources, c: &mut Claims<'_>) -> Result<(), MergeError> {
    if let Some(m) = &res.memory {
        let fields = [
            (m.limit.is_some(), Field::MemLimit),
            (m.reservation.is_some(), Field::MemReservation),
            (m.swap.is_some(), Field::MemSwapLimit),
            (m.kernel.is_some(), Field::MemKernelLimit),
            (m.kernel_tcp.is_some(), Field::MemTcpLimit),
            (m.swappiness.is_some(), Field::MemSwappiness),
            (m.disable_oom_killer.is_some(), Field::MemDisableOomKiller),
            (m.use_hierarchy.is_some(), Field::MemUseHierarchy),
        ];
        for (set, field) in fields {
            if set {
                c.simple(field)?;
            }
        }
    }
    if let Some(cpu) = &res.cpu {
        let fields = [
            (cpu.shares.is_some(), Field::CpuShares),
            (cpu.quota.is_some(), Field::CpuQuota),
            (cpu.period.is_some(), Field::CpuPeriod),
            (cpu.realtime_runtime.is_some(), Field::CpuRealtimeRuntime),
            (cpu.realtime_period.is_some(), Field::CpuRealtimePeriod),
            (!cpu.cpus.is_empty(), Field::CpuSetCpUs),
            (!cpu.mems.is_empty(), Field::CpuSetMems),
        ];
        for (set, field) in fields {
            if set {
                c.simple(field)?;
            }
        }
    }
    for h in &res.hugepage_limits {
        c.compound(Field::HugepageLimits, &h.page_size)?;
    }
    // Sorted so that which conflict is reported does not depend on hash order.
    let mut unified: Vec<&String> = res.unified.keys().collect();
    unified.sort();
    for k in unified {
        c.compound(Field::CgroupsUnified, k)?;
    }
    if res.blockio_class.is_some() {
        c.simple(Field::BlockioClass)?;
    }
    if res.rdt_class.is_some() {
        c.simple(Field::RdtClass)?;
    }
    if res.pids.is_some() {
        c.simple(Field::PidsLimit)?;
    }
    Ok(())
}

fn set<T: Clone>(dst: &mut Option<T>, src: &Option<T>) {
    if src.is_some() {
        dst.clone_from(src);
    }
}

fn set_str(dst: &mut String, src: &str) {
    if !src.is_empty() {
        *dst = src.to_string();
    }
}

/// Copies every field `res` sets onto `target`.
pub(crate) fn overlay_resources(target: &mut api::LinuxResources, res: &api::LinuxResources) {
    if let Some(m) = &res.memory {
        let t = target.memory.get_or_insert_with(Default::default);
        set(&mut t.limit, &m.limit);
        set(&mut t.reservation, &m.reservation);
        set(&mut t.swap, &m.swap);
        set(&mut t.kernel, &m.kernel);
        set(&mut t.kernel_tcp, &m.kernel_tcp);
        set(&mut t.swappiness, &m.swappiness);
        set(&mut t.disable_oom_killer, &m.disable_oom_killer);
        set(&mut t.use_hierarchy, &m.use_hierarchy);
    }
    if let Some(cpu) = &res.cpu {
        let t = target.cpu.get_or_insert_with(Default::default);
        set(&mut t.shares, &cpu.shares);
        set(&mut t.quota, &cpu.quota);
        set(&mut t.period, &cpu.period);
        set(&mut t.realtime_runtime, &cpu.realtime_runtime);
        set(&mut t.realtime_period, &cpu.realtime_period);
        set_str(&mut t.cpus, &cpu.cpus);
        set_str(&mut t.mems, &cpu.mems);
    }
    for h in &res.hugepage_limits {
        match target
            .hugepage_limits
            .iter_mut()
            .find(|x| x.page_size == h.page_size)
        {
            Some(x) => x.limit = h.limit,
            None => target.hugepage_limits.push(h.clone()),
        }
    }
    for (k, v) in &res.unified {
        target.unified.insert(k.clone(), v.clone());
    }
    target.devices.extend(res.devices.iter().cloned());
    set(&mut target.blockio_class, &res.blockio_class);
    set(&mut target.rdt_class, &res.rdt_class);
    set(&mut target.pids, &res.pids);
}

/// Merges a keyed map (annotations, sysctls, network devices): `-key` removes.
fn merge_map<V: Clone + Default>(
    c: &mut Claims<'_>,
    field: Field,
    incoming: HashMap<String, V>,
    view: &mut HashMap<String, V>,
    out: &mut HashMap<String, V>,
) -> Result<(), MergeError> {
    let mut removals = Vec::new();
    let mut sets = Vec::new();
    for (k, v) in incoming {
        match removal_target(&k).map(str::to_string) {
            Some(t) => removals.push(t),
            None => sets.push((k, v)),
        }
    }
    removals.sort();
    sets.sort_by(|a, b| a.0.cmp(&b.0));
    for key in &removals {
        c.clear_compound(field, key);
        view.remove(key);
        out.remove(key);
        out.insert(mark_for_removal(key), V::default());
    }
    for (k, v) in sets {
        c.compound(field, &k)?;
        view.insert(k.clone(), v.clone());
        out.insert(k, v);
    }
    Ok(())
}

/// How a keyed list (mounts, devices, env) is read and written.
struct KeyedList<T, V> {
    field: Field,
    key: fn(&T) -> &str,
    marker: fn(&str) -> T,
    view_key: fn(&V) -> &str,
    to_view: fn(&T) -> V,
}

impl<T: Clone, V> KeyedList<T, V> {
    fn merge(
        &self,
        c: &mut Claims<'_>,
        incoming: Vec<T>,
        view: &mut Vec<V>,
        out: &mut Vec<T>,
    ) -> Result<(), MergeError> {
        let mut removals: Vec<String> = Vec::new();
        let mut sets = Vec::new();
        for item in incoming {
            match removal_target((self.key)(&item)).map(str::to_string) {
                Some(k) => removals.push(k),
                None => sets.push(item),
            }
        }
        let set_keys: Vec<String> = sets.iter().map(|t| (self.key)(t).to_string()).collect();
        for k in &removals {
            c.clear_compound(self.field, k);
        }
        out.retain(|t| !removals.iter().any(|k| k == (self.key)(t)));
        view.retain(|v| {
            let k = (self.view_key)(v);
            !removals.iter().any(|r| r == k) && !set_keys.iter().any(|s| s == k)
        });
        for item in sets {
            c.compound(self.field, (self.key)(&item))?;
            view.push((self.to_view)(&item));
            out.push(item);
        }
        for k in &removals {
            if !set_keys.contains(k) {
                out.push((self.marker)(k));
            }
        }
        Ok(())
    }
}

// The view's env is `NAME=value` strings; the list merge needs the name.
#[allow(clippy::ptr_arg)]
fn env_name(s: &String) -> &str {
    s.split_once('=').map_or(s.as_str(), |(k, _)| k)
}

fn mount_key(m: &api::Mount) -> &str {
    &m.destination
}

fn mount_marker(k: &str) -> api::Mount {
    api::Mount {
        destination: mark_for_removal(k),
        ..Default::default()
    }
}

fn device_key(d: &api::LinuxDevice) -> &str {
    &d.path
}

fn device_marker(k: &str) -> api::LinuxDevice {
    api::LinuxDevice {
        path: mark_for_removal(k),
        ..Default::default()
    }
}

fn env_key(e: &api::KeyValue) -> &str {
    &e.key
}

fn env_marker(k: &str) -> api::KeyValue {
    api::KeyValue {
        key: mark_for_removal(k),
        value: String::new(),
    }
}

fn env_string(e: &api::KeyValue) -> String {
    format!("{}={}", e.key, e.value)
}

const MOUNTS: KeyedList<api::Mount, api::Mount> = KeyedList {
    field: Field::Mounts,
    key: mount_key,
    marker: mount_marker,
    view_key: mount_key,
    to_view: api::Mount::clone,
};

const DEVICES: KeyedList<api::LinuxDevice, api::LinuxDevice> = KeyedList {
    field: Field::Devices,
    key: device_key,
    marker: device_marker,
    view_key: device_key,
    to_view: api::LinuxDevice::clone,
};

const ENV: KeyedList<api::KeyValue, String> = KeyedList {
    field: Field::Env,
    key: env_key,
    marker: env_marker,
    view_key: env_name,
    to_view: env_string,
};

/// Updates of other containers collected in one operation, one entry per container.
#[derive(Debug, Default)]
struct UpdateSet {
    updates: Vec<api::ContainerUpdate>,
    owners: api::OwningPlugins,
    rejected: Vec<RejectedUpdate>,
}

impl UpdateSet {
    /// Merges one update; when it is for `target`'s container it goes onto `target`'s
    /// resources instead of the update list. Returns whether anything was merged.
    fn merge(
        &mut self,
        plugin: &str,
        u: api::ContainerUpdate,
        earlier: Option<&api::OwningPlugins>,
        target: Option<(&str, &mut api::LinuxResources)>,
    ) -> Result<bool, MergeError> {
        if u.container_id.is_empty() {
            return Err(MergeError::MissingContainerId {
                plugin: plugin.to_string(),
            });
        }
        let Some(res) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) else {
            return Ok(false);
        };
        let id = u.container_id.as_str();
        // Claims go to a copy first so that a dropped (ignore_failure) update leaves no
        // ownership behind.
        let mut scratch = self.owners.container(id).cloned().unwrap_or_default();
        let mut claims = Claims {
            round: &mut scratch,
            earlier: earlier.and_then(|e| e.container(id)),
            plugin,
        };
        if let Err(error) = claim_resources(res, &mut claims) {
            if !u.ignore_failure {
                return Err(error);
            }
            tracing::warn!(plugin, container = id, %error, "dropping conflicting update (ignore_failure)");
            self.rejected.push(RejectedUpdate {
                plugin: plugin.to_string(),
                update: u,
                error,
            });
            return Ok(false);
        }
        *self.owners.container_mut(id) = scratch;
        match target {
            Some((tid, tres)) if tid == id => overlay_resources(tres, res),
            _ => {
                let pos = match self.updates.iter().position(|x| x.container_id == id) {
                    Some(pos) => {
                        let entry = &mut self.updates[pos];
                        entry.ignore_failure = entry.ignore_failure && u.ignore_failure;
                        pos
                    }
                    None => {
                        self.updates.push(api::ContainerUpdate {
                            container_id: id.to_string(),
                            linux: None,
                            ignore_failure: u.ignore_failure,
                        });
                        self.updates.len() - 1
                    }
                };
                let entry = &mut self.updates[pos];
                let resources = entry
                    .linux
                    .get_or_insert_with(Default::default)
                    .resources
                    .get_or_insert_with(Default::default);
                overlay_resources(resources, res);
            }
        }
        Ok(true)
    }
}

/// Merges CreateContainer answers. Call [`apply`](Self::apply) once per plugin that
/// answered, in index order, handing each plugin [`request`](Self::request) first.
#[derive(Debug)]
pub struct CreateMerger<'r> {
    request: api::CreateContainerRequest,
    original: api::Container,
    id: String,
    adjust: api::ContainerAdjustment,
    owners: api::OwningPlugins,
    set: UpdateSet,
    evictions: Vec<Eviction>,
    plugins: Vec<api::PluginInstance>,
    recorded: Option<&'r api::OwningPlugins>,
}

/// Everything the plugins asked for in one CreateContainer.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateResult {
    /// The pod, as in the request.
    pub pod: Option<api::PodSandbox>,
    /// The container before any plugin touched it (what validators are shown).
    pub original: api::Container,
    /// The container with every adjustment applied.
    pub container: api::Container,
    /// The merged adjustment for the runtime to apply to the OCI spec. Entries keyed
    /// with the removal marker ask the runtime to remove that entry.
    pub adjust: api::ContainerAdjustment,
    /// Merged updates of other containers, one per container.
    pub updates: Vec<api::ContainerUpdate>,
    /// Updates with `ignore_failure` that were dropped for conflicting.
    pub rejected: Vec<RejectedUpdate>,
    /// Evictions the plugins asked for.
    pub evictions: Vec<Eviction>,
    /// Who owns what, for the created container and the updated ones.
    pub owners: api::OwningPlugins,
    /// The plugins that took part, in order.
    pub plugins: Vec<api::PluginInstance>,
}

impl CreateResult {
    /// The answer in protocol form.
    pub fn response(&self) -> api::CreateContainerResponse {
        api::CreateContainerResponse {
            adjust: Some(self.adjust.clone()),
            update: self.updates.clone(),
            evict: self.evictions.iter().map(|e| e.eviction.clone()).collect(),
        }
    }

    /// The created container's owners, for the runtime to keep and check later updates
    /// against.
    pub fn container_owners(&self) -> Option<&api::FieldOwners> {
        self.owners.container(&self.original.id)
    }
}

impl CreateMerger<'static> {
    /// Starts from the request as the runtime built it.
    pub fn new(mut request: api::CreateContainerRequest) -> Self {
        let original = request
            .container
            .get_or_insert_with(Default::default)
            .clone();
        let id = original.id.clone();
        CreateMerger {
            request,
            original,
            id,
            adjust: api::ContainerAdjustment::default(),
            owners: api::OwningPlugins::default(),
            set: UpdateSet::default(),
            evictions: Vec::new(),
            plugins: Vec::new(),
            recorded: None,
        }
    }
}

impl<'r> CreateMerger<'r> {
    /// Also checks the plugins' updates of other containers against the owners the
    /// runtime recorded for them (a plugin may not update a field another plugin set).
    pub fn with_recorded_owners<'s>(self, recorded: &'s api::OwningPlugins) -> CreateMerger<'s> {
        CreateMerger {
            request: self.request,
            original: self.original,
            id: self.id,
            adjust: self.adjust,
            owners: self.owners,
            set: self.set,
            evictions: self.evictions,
            plugins: self.plugins,
            recorded: Some(recorded),
        }
    }

    /// The request for the next plugin: the container as the earlier plugins left it.
    pub fn request(&self) -> &api::CreateContainerRequest {
        &self.request
    }

    /// The adjustment merged so far.
    pub fn adjustment(&self) -> &api::ContainerAdjustment {
        &self.adjust
    }

    /// Records that a plugin took part without answering anything to merge (it is not
    /// subscribed to CreateContainer). Required-plugin checks count it as present.
    /// Plugins that failed or timed out must not be recorded.
    pub fn note_plugin(&mut self, plugin: &api::PluginInstance) {
        if !self.plugins.contains(plugin) {
            self.plugins.push(plugin.clone());
        }
    }

    /// Merges one plugin's answer.
    pub fn apply(
        &mut self,
        plugin: &api::PluginInstance,
        response: api::CreateContainerResponse,
    ) -> Result<(), MergeError> {
        self.note_plugin(plugin);
        let name = qualified_name(plugin);
        if let Some(adjust) = response.adjust {
            self.adjust_container(&name, adjust)?;
        }
        for u in response.update {
            if u.container_id == self.id {
                return Err(MergeError::UpdateOfCreatedContainer {
                    plugin: name,
                    container: u.container_id,
                });
            }
            self.set.merge(&name, u, self.recorded, None)?;
        }
        self.evictions
            .extend(response.evict.into_iter().map(|eviction| Eviction {
                plugin: name.clone(),
                eviction,
            }));
        Ok(())
    }

    fn adjust_container(
        &mut self,
        plugin: &str,
        adj: api::ContainerAdjustment,
    ) -> Result<(), MergeError> {
        let view = self.request.container.get_or_insert_with(Default::default);
        let out = &mut self.adjust;
        let mut c = Claims {
            round: self.owners.container_mut(&self.id),
            earlier: None,
            plugin,
        };

        merge_map(
            &mut c,
            Field::Annotations,
            adj.annotations,
            &mut view.annotations,
            &mut out.annotations,
        )?;
        MOUNTS.merge(&mut c, adj.mounts, &mut view.mounts, &mut out.mounts)?;
        ENV.merge(&mut c, adj.env, &mut view.env, &mut out.env)?;

        if !adj.args.is_empty() {
            let mut args = adj.args;
            // A leading empty string means "replace whatever an earlier plugin set".
            if args.first().is_some_and(String::is_empty) {
                c.clear_simple(Field::Args);
                args.remove(0);
            }
            c.simple(Field::Args)?;
            view.args.clone_from(&args);
            out.args = args;
        }

        if let Some(h) = adj.hooks {
            let vh = view.hooks.get_or_insert_with(Default::default);
            let oh = out.hooks.get_or_insert_with(Default::default);
            let mut any = false;
            for (src, v, o) in [
                (h.prestart, &mut vh.prestart, &mut oh.prestart),
                (
                    h.create_runtime,
                    &mut vh.create_runtime,
                    &mut oh.create_runtime,
                ),
                (
                    h.create_container,
                    &mut vh.create_container,
                    &mut oh.create_container,
                ),
                (
                    h.start_container,
                    &mut vh.start_container,
                    &mut oh.start_container,
                ),
                (h.poststart, &mut vh.poststart, &mut oh.poststart),
                (h.poststop, &mut vh.poststop, &mut oh.poststop),
            ] {
                any |= !src.is_empty();
                v.extend(src.iter().cloned());
                o.extend(src);
            }
            if any {
                c.accumulate(Field::OciHooks);
            }
        }

        if let Some(linux) = adj.linux {
            let vl = view.linux.get_or_insert_with(Default::default);
            let ol = out.linux.get_or_insert_with(Default::default);
            DEVICES.merge(&mut c, linux.devices, &mut vl.devices, &mut ol.devices)?;
            if let Some(res) = &linux.resources {
                claim_resources(res, &mut c)?;
                overlay_resources(vl.resources.get_or_insert_with(Default::default), res);
                overlay_resources(ol.resources.get_or_insert_with(Default::default), res);
            }
            if !linux.cgroups_path.is_empty() {
                c.simple(Field::CgroupsPath)?;
                vl.cgroups_path.clone_from(&linux.cgroups_path);
                ol.cgroups_path = linux.cgroups_path;
            }
            if linux.oom_score_adj.is_some() {
                c.simple(Field::OomScoreAdj)?;
                vl.oom_score_adj.clone_from(&linux.oom_score_adj);
                ol.oom_score_adj = linux.oom_score_adj;
            }
            if linux.io_priority.is_some() {
                c.simple(Field::IoPriority)?;
                vl.io_priority.clone_from(&linux.io_priority);
                ol.io_priority = linux.io_priority;
            }
            if linux.seccomp_policy.is_some() {
                c.simple(Field::SeccompPolicy)?;
                vl.seccomp_policy.clone_from(&linux.seccomp_policy);
                ol.seccomp_policy = linux.seccomp_policy;
            }
            for ns in linux.namespaces {
                // Setting and removing a namespace both claim it.
                let (key, removing) = match removal_target(&ns.r#type) {
                    Some(t) => (t.to_string(), true),
                    None => (ns.r#type.clone(), false),
                };
                c.compound(Field::Namespace, &key)?;
                vl.namespaces.retain(|x| x.r#type != key);
                if !removing {
                    vl.namespaces.push(ns.clone());
                }
                ol.namespaces.push(ns);
            }
            merge_map(
                &mut c,
                Field::Sysctl,
                linux.sysctl,
                &mut vl.sysctl,
                &mut ol.sysctl,
            )?;
            merge_map(
                &mut c,
                Field::LinuxNetDevices,
                linux.net_devices,
                &mut vl.net_devices,
                &mut ol.net_devices,
            )?;
            if linux.scheduler.is_some() {
                c.simple(Field::LinuxSched)?;
                vl.scheduler.clone_from(&linux.scheduler);
                ol.scheduler = linux.scheduler;
            }
            if let Some(rdt) = linux.rdt {
                let orr = ol.rdt.get_or_insert_with(Default::default);
                let vr = vl.rdt.get_or_insert_with(Default::default);
                if rdt.remove {
                    for f in [
                        Field::RdtClosId,
                        Field::RdtSchemata,
                        Field::RdtEnableMonitoring,
                    ] {
                        c.clear_simple(f);
                    }
                    *orr = api::LinuxRdt {
                        remove: true,
                        ..Default::default()
                    };
                    *vr = api::LinuxRdt::default();
                }
                if rdt.clos_id.is_some() {
                    c.simple(Field::RdtClosId)?;
                    set(&mut orr.clos_id, &rdt.clos_id);
                    set(&mut vr.clos_id, &rdt.clos_id);
                    orr.remove = false;
                }
                if rdt.schemata.is_some() {
                    c.simple(Field::RdtSchemata)?;
                    set(&mut orr.schemata, &rdt.schemata);
                    set(&mut vr.schemata, &rdt.schemata);
                    orr.remove = false;
                }
                if rdt.enable_monitoring.is_some() {
                    c.simple(Field::RdtEnableMonitoring)?;
                    set(&mut orr.enable_monitoring, &rdt.enable_monitoring);
                    set(&mut vr.enable_monitoring, &rdt.enable_monitoring);
                    orr.remove = false;
                }
            }
            if linux.memory_policy.is_some() {
                // The container view has no memory policy field: only the adjustment
                // carries it.
                c.simple(Field::MemoryPolicy)?;
                ol.memory_policy = linux.memory_policy;
            }
        }

        for l in adj.rlimits {
            c.compound(Field::Rlimits, &l.r#type)?;
            view.rlimits.retain(|x| x.r#type != l.r#type);
            view.rlimits.push(l.clone());
            out.rlimits.push(l);
        }
        for d in adj.cdi_devices {
            c.compound(Field::CdiDevices, &d.name)?;
            view.cdi_devices.push(d.clone());
            out.cdi_devices.push(d);
        }
        Ok(())
    }

    /// Ends the merge.
    pub fn finish(self) -> CreateResult {
        let mut owners = self.owners;
        owners.absorb(&self.set.owners);
        CreateResult {
            container: self.request.container.unwrap_or_default(),
            pod: self.request.pod,
            original: self.original,
            adjust: self.adjust,
            updates: self.set.updates,
            rejected: self.set.rejected,
            evictions: self.evictions,
            owners,
            plugins: self.plugins,
        }
    }
}

/// Merges UpdateContainer or StopContainer answers (lists of container updates), and
/// plugin-initiated updates through [`check_plugin_updates`].
#[derive(Debug)]
pub struct UpdateMerger<'r> {
    target: Option<(String, api::LinuxResources)>,
    target_changed: bool,
    set: UpdateSet,
    plugins: Vec<api::PluginInstance>,
    recorded: Option<&'r api::OwningPlugins>,
}

/// The merged updates of one operation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpdateResult {
    /// For UpdateContainer: the container's resources with the plugins' changes, if any
    /// plugin changed them.
    pub target_resources: Option<api::LinuxResources>,
    /// Updates of (other) containers, one per container, in first-seen order.
    pub updates: Vec<api::ContainerUpdate>,
    /// Updates with `ignore_failure` that were dropped for conflicting.
    pub rejected: Vec<RejectedUpdate>,
    /// What each plugin claimed, per container. Absorb it into the recorded owners
    /// ([`api::OwningPlugins::absorb`]) once the updates are applied.
    pub owners: api::OwningPlugins,
    /// The plugins that took part.
    pub plugins: Vec<api::PluginInstance>,
}

impl UpdateMerger<'static> {
    /// For an UpdateContainer: plugins' updates of the updated container go onto the
    /// requested resources.
    pub fn for_update(request: &api::UpdateContainerRequest) -> Self {
        let id = request
            .container
            .as_ref()
            .map(|c| c.id.clone())
            .unwrap_or_default();
        let resources = request.linux_resources.clone().unwrap_or_default();
        UpdateMerger {
            target: Some((id, resources)),
            target_changed: false,
            set: UpdateSet::default(),
            plugins: Vec::new(),
            recorded: None,
        }
    }

    /// For a StopContainer (or any list of updates without a target container).
    pub fn for_stop() -> Self {
        UpdateMerger {
            target: None,
            target_changed: false,
            set: UpdateSet::default(),
            plugins: Vec::new(),
            recorded: None,
        }
    }
}

impl<'r> UpdateMerger<'r> {
    /// Also checks every claim against the owners the runtime recorded (at creation and
    /// from earlier accepted updates): a plugin may not change a field another plugin
    /// owns.
    pub fn with_recorded_owners<'s>(self, recorded: &'s api::OwningPlugins) -> UpdateMerger<'s> {
        UpdateMerger {
            target: self.target,
            target_changed: self.target_changed,
            set: self.set,
            plugins: self.plugins,
            recorded: Some(recorded),
        }
    }

    /// The updated container's resources as the earlier plugins left them, for the
    /// next plugin's UpdateContainerRequest (None for a stop).
    pub fn resources(&self) -> Option<&api::LinuxResources> {
        self.target.as_ref().map(|(_, r)| r)
    }

    /// Merges one plugin's updates.
    pub fn apply(
        &mut self,
        plugin: &api::PluginInstance,
        updates: Vec<api::ContainerUpdate>,
    ) -> Result<(), MergeError> {
        if !self.plugins.contains(plugin) {
            self.plugins.push(plugin.clone());
        }
        let name = qualified_name(plugin);
        for u in updates {
            let target = self.target.as_mut().map(|(id, res)| (id.as_str(), res));
            let is_target = target.as_ref().is_some_and(|(id, _)| *id == u.container_id);
            let merged = self.set.merge(&name, u, self.recorded, target)?;
            self.target_changed |= merged && is_target;
        }
        Ok(())
    }

    /// Ends the merge.
    pub fn finish(self) -> UpdateResult {
        let target_changed = self.target_changed;
        UpdateResult {
            target_resources: self.target.and_then(|(_, r)| target_changed.then_some(r)),
            updates: self.set.updates,
            rejected: self.set.rejected,
            owners: self.set.owners,
            plugins: self.plugins,
        }
    }
}

/// Checks a plugin-initiated UpdateContainers request the way answers to events are
/// checked: no field set twice within it and, against `recorded` (the owners the
/// runtime kept from CreateContainer and earlier accepted updates), no field another
/// plugin owns. Conflicting updates marked `ignore_failure` come back in `rejected`
/// (for the response's `failed` list); any other conflict refuses the whole request.
/// `recorded` is not changed: absorb the result's `owners` once the updates are applied.
pub fn check_plugin_updates(
    plugin: &api::PluginInstance,
    request: &api::UpdateContainersRequest,
    recorded: &api::OwningPlugins,
) -> Result<UpdateResult, MergeError> {
    let mut merger = UpdateMerger::for_stop().with_recorded_owners(recorded);
    merger.apply(plugin, request.update.clone())?;
    Ok(merger.finish())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "merge_tests.rs"]
mod tests;
