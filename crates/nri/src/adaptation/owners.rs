//! Which plugin adjusted which container field, in the protocol's own shape
//! ([`api::OwningPlugins`] / [`api::FieldOwners`], keyed by [`api::Field`] numbers), so
//! the record can be handed to validators unchanged and kept by the runtime to check
//! later updates against.
//!
//! Stored owner values are qualified plugin names (`NN-name`). Two special forms:
//! - `-NN-name`: the plugin removed the field or entry. Removal never conflicts, but it
//!   makes the remover the owner: the same plugin may set it again, another may not.
//! - `NN-a,NN-b`: OCI hooks, which accumulate instead of conflicting.

use std::collections::HashMap;

use crate::api::{self, Field};

/// Prefix of a key, name or path asking for that entry to be removed.
pub const REMOVAL_MARKER: char = '-';

/// The key without its removal marker, if it carries one.
pub fn removal_target(key: &str) -> Option<&str> {
    key.strip_prefix(REMOVAL_MARKER)
}

/// `key` with the removal marker.
pub fn mark_for_removal(key: &str) -> String {
    format!("{REMOVAL_MARKER}{key}")
}

/// The `NN-name` form of a plugin used as owner (just the name when it has no index).
pub fn qualified_name(plugin: &api::PluginInstance) -> String {
    if plugin.index.is_empty() {
        plugin.name.clone()
    } else {
        format!("{}-{}", plugin.index, plugin.name)
    }
}

/// Why plugin results could not be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// Two plugins (`first` earlier, `second` later) set the same owned field or entry.
    #[error("plugins {first:?} and {second:?} both adjust {}", describe(.field, .key))]
    Conflict {
        /// The contested field.
        field: Field,
        /// The entry of a keyed field (annotation key, mount destination, ...).
        key: Option<String>,
        /// The plugin that owned it first (or removed it).
        first: String,
        /// The plugin that tried to set it again.
        second: String,
    },
    /// A CreateContainer answer asked to update the very container being created.
    #[error("plugin {plugin:?} asked to update container {container:?} while it is being created (use the adjustment)")]
    UpdateOfCreatedContainer {
        /// The plugin.
        plugin: String,
        /// The container being created.
        container: String,
    },
    /// An update without a container id.
    #[error("plugin {plugin:?} sent a container update without a container id")]
    MissingContainerId {
        /// The plugin.
        plugin: String,
    },
}

/// Human name of a field, with its entry key when it has one.
fn describe(field: &Field, key: &Option<String>) -> String {
    let name = field_name(*field);
    match key {
        Some(k) => format!("{name} {k:?}"),
        None => name.to_string(),
    }
}

/// How a field is called in error messages.
pub fn field_name(field: Field) -> &'static str {
    match field {
        Field::None => "nothing",
        Field::Annotations => "annotation",
        Field::Mounts => "mount",
        Field::OciHooks => "OCI hooks",
        Field::Devices => "device",
        Field::CdiDevices => "CDI device",
        Field::Env => "environment variable",
        Field::Args => "args",
        Field::MemLimit => "memory limit",
        Field::MemReservation => "memory reservation",
        Field::MemSwapLimit => "memory swap limit",
        Field::MemKernelLimit => "kernel memory limit",
        Field::MemTcpLimit => "kernel TCP memory limit",
        Field::MemSwappiness => "memory swappiness",
        Field::MemDisableOomKiller => "memory disable_oom_killer",
        Field::MemUseHierarchy => "memory use_hierarchy",
        Field::CpuShares => "CPU shares",
        Field::CpuQuota => "CPU quota",
        Field::CpuPeriod => "CPU period",
        Field::CpuRealtimeRuntime => "CPU realtime runtime",
        Field::CpuRealtimePeriod => "CPU realtime period",
        Field::CpuSetCpUs => "cpuset CPUs",
        Field::CpuSetMems => "cpuset memory nodes",
        Field::PidsLimit => "pids limit",
        Field::HugepageLimits => "hugepage limit",
        Field::BlockioClass => "block I/O class",
        Field::RdtClass => "RDT class",
        Field::CgroupsUnified => "unified cgroup resource",
        Field::CgroupsPath => "cgroups path",
        Field::OomScoreAdj => "OOM score adjustment",
        Field::Rlimits => "rlimit",
        Field::IoPriority => "I/O priority",
        Field::SeccompPolicy => "seccomp policy",
        Field::Namespace => "namespace",
        Field::Sysctl => "sysctl",
        Field::LinuxNetDevices => "network device",
        Field::LinuxSched => "scheduler",
        Field::RdtClosId => "RDT CLOS id",
        Field::RdtSchemata => "RDT schemata",
        Field::RdtEnableMonitoring => "RDT monitoring",
        Field::MemoryPolicy => "memory policy",
    }
}

impl api::OwningPlugins {
    /// The owners recorded for one container, if any.
    pub fn container(&self, id: &str) -> Option<&api::FieldOwners> {
        self.owners.get(id)
    }

    /// The owners of one container, created empty if missing.
    pub fn container_mut(&mut self, id: &str) -> &mut api::FieldOwners {
        self.owners.entry(id.to_string()).or_default()
    }

    /// Adds `other`'s claims to this record, `other` winning where both name an owner.
    /// The runtime uses it to keep what a later, accepted update claimed.
    pub fn absorb(&mut self, other: &api::OwningPlugins) {
        for (id, theirs) in &other.owners {
            let mine = self.container_mut(id);
            for (field, owner) in &theirs.simple {
                mine.simple.insert(*field, owner.clone());
            }
            for (field, entries) in &theirs.compound {
                let m = mine.compound.entry(*field).or_default();
                for (k, owner) in &entries.owners {
                    m.owners.insert(k.clone(), owner.clone());
                }
            }
        }
    }

    /// Drops what is recorded for a container (when it is removed).
    pub fn forget(&mut self, id: &str) {
        self.owners.remove(id);
    }
}

impl api::FieldOwners {
    /// Owner of a whole field (`-NN-name` if that plugin removed it; a comma-separated
    /// list for OCI hooks).
    pub fn simple_owner(&self, field: Field) -> Option<&str> {
        self.simple.get(&(field as i32)).map(String::as_str)
    }

    /// Owner of one entry of a keyed field.
    pub fn compound_owner(&self, field: Field, key: &str) -> Option<&str> {
        self.compound
            .get(&(field as i32))
            .and_then(|m| m.owners.get(key))
            .map(String::as_str)
    }

    /// Every entry of a keyed field with its owner.
    pub fn compound_owners(&self, field: Field) -> Option<&HashMap<String, String>> {
        self.compound.get(&(field as i32)).map(|m| &m.owners)
    }
}

/// Ownership claims of one merge round for one container, checked against what the
/// round already claimed and, optionally, against an earlier round's record.
pub(crate) struct Claims<'a> {
    pub(crate) round: &'a mut api::FieldOwners,
    pub(crate) earlier: Option<&'a api::FieldOwners>,
    pub(crate) plugin: &'a str,
}

impl Claims<'_> {
    /// Is `current` (an owner value) in the way of `self.plugin`? Within a round any
    /// earlier claim is, even the plugin's own (one answer setting a field twice is
    /// ambiguous), except a removal by the same plugin.
    fn blocker(&self, current: &str, same_round: bool) -> Option<String> {
        match removal_target(current) {
            Some(remover) if remover == self.plugin => None,
            Some(remover) => Some(remover.to_string()),
            None if !same_round && current == self.plugin => None,
            None => Some(current.to_string()),
        }
    }

    fn conflict(&self, field: Field, key: Option<&str>, first: String) -> MergeError {
        MergeError::Conflict {
            field,
            key: key.map(str::to_string),
            first,
            second: self.plugin.to_string(),
        }
    }

    /// Claims a whole field.
    pub(crate) fn simple(&mut self, field: Field) -> Result<(), MergeError> {
        let f = field as i32;
        if let Some(cur) = self.round.simple.get(&f) {
            if let Some(other) = self.blocker(cur, true) {
                return Err(self.conflict(field, None, other));
            }
        } else if let Some(cur) = self.earlier.and_then(|e| e.simple.get(&f)) {
            if let Some(other) = self.blocker(cur, false) {
                return Err(self.conflict(field, None, other));
            }
        }
        self.round.simple.insert(f, self.plugin.to_string());
        Ok(())
    }

    /// Claims one entry of a keyed field.
    pub(crate) fn compound(&mut self, field: Field, key: &str) -> Result<(), MergeError> {
        let f = field as i32;
        if let Some(cur) = self.round.compound_owner(field, key) {
            if let Some(other) = self.blocker(cur, true) {
                return Err(self.conflict(field, Some(key), other));
            }
        } else if let Some(cur) = self.earlier.and_then(|e| e.compound_owner(field, key)) {
            if let Some(other) = self.blocker(cur, false) {
                return Err(self.conflict(field, Some(key), other));
            }
        }
        self.round
            .compound
            .entry(f)
            .or_default()
            .owners
            .insert(key.to_string(), self.plugin.to_string());
        Ok(())
    }

    /// Records that the plugin removed a whole field.
    pub(crate) fn clear_simple(&mut self, field: Field) {
        self.round
            .simple
            .insert(field as i32, mark_for_removal(self.plugin));
    }

    /// Records that the plugin removed one entry of a keyed field.
    pub(crate) fn clear_compound(&mut self, field: Field, key: &str) {
        self.round
            .compound
            .entry(field as i32)
            .or_default()
            .owners
            .insert(key.to_string(), mark_for_removal(self.plugin));
    }

    /// Adds the plugin to an accumulating field (OCI hooks).
    pub(crate) fn accumulate(&mut self, field: Field) {
        let f = field as i32;
        let value = match self.round.simple.get(&f) {
            Some(cur) if !cur.is_empty() => format!("{cur},{}", self.plugin),
            _ => self.plugin.to_string(),
        };
        self.round.simple.insert(f, value);
    }
}
