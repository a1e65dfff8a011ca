//! Eviction signals: what kubelet observes, by kubelet's names, with the
//! resource each one reclaims and the node condition it drives.

use std::fmt;
use std::str::FromStr;

/// An eviction signal, spelled as in kubelet's flags (`memory.available`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Node memory capacity minus the working set of the node's memory cgroup.
    MemoryAvailable,
    /// Pod allocatable memory minus the working set of the pods' cgroup.
    AllocatableMemoryAvailable,
    /// Bytes free on the filesystem of the agent's root.
    NodeFsAvailable,
    /// Inodes free on the filesystem of the agent's root.
    NodeFsInodesFree,
    /// Bytes free on the runtime's image filesystem.
    ImageFsAvailable,
    /// Inodes free on the runtime's image filesystem.
    ImageFsInodesFree,
    /// Bytes free on the runtime's container filesystem (split image
    /// filesystem; the image filesystem when not split).
    ContainerFsAvailable,
    /// Inodes free on the runtime's container filesystem.
    ContainerFsInodesFree,
    /// Process ids left under the node's pids limit.
    PidAvailable,
}

/// The node condition a signal drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeCondition {
    /// `MemoryPressure`.
    MemoryPressure,
    /// `DiskPressure`.
    DiskPressure,
    /// `PIDPressure`.
    PidPressure,
}

impl NodeCondition {
    /// Every condition, in the order `GET /node` lists them.
    pub const ALL: [NodeCondition; 3] = [
        NodeCondition::MemoryPressure,
        NodeCondition::DiskPressure,
        NodeCondition::PidPressure,
    ];

    /// The condition type as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeCondition::MemoryPressure => "MemoryPressure",
            NodeCondition::DiskPressure => "DiskPressure",
            NodeCondition::PidPressure => "PIDPressure",
        }
    }
}

/// The resource a signal is about, which decides how pods are ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Memory bytes.
    Memory,
    /// Disk bytes (ephemeral storage).
    Disk,
    /// Inodes.
    Inodes,
    /// Process ids.
    Pids,
}

impl Signal {
    /// Every signal, in kubelet's order.
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The name used in flags, metrics and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The resource the signal measures.
    pub fn resource(self) -> Resource {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                Resource::Disk
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => Resource::Inodes,
            Signal::PidAvailable => Resource::Pids,
        }
    }

    /// The node condition the signal drives.
    pub fn condition(self) -> NodeCondition {
        match self.resource() {
            Resource::Memory => NodeCondition::MemoryPressure,
            Resource::Disk | Resource::Inodes => NodeCondition::DiskPressure,
            Resource::Pids => NodeCondition::PidPressure,
        }
    }

    /// Whether the signal is about the node's filesystem (the agent's
    /// root, where pod volumes and logs live) rather than the runtime's.
    pub fn is_nodefs(self) -> bool {
        matches!(self, Signal::NodeFsAvailable | Signal::NodeFsInodesFree)
    }

    /// Whether node-level reclaim of images can relieve the signal.
    pub fn is_runtime_fs(self) -> bool {
        matches!(
            self,
            Signal::ImageFsAvailable
                | Signal::ImageFsInodesFree
                | Signal::ContainerFsAvailable
                | Signal::ContainerFsInodesFree
        )
    }

    /// Eviction priority among thresholds met at once: memory first (it
    /// is the most urgent and the least reclaimable by the node), then the
    /// others in kubelet's order.
    pub(crate) fn eviction_priority(self) -> u8 {
        match self.resource() {
            Resource::Memory => 0,
            _ => 1,
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not an eviction signal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown eviction signal {0:?}")]
pub struct UnknownSignal(pub String);

impl FromStr for Signal {
    type Err = UnknownSignal;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Signal::ALL
            .into_iter()
            .find(|sig| sig.as_str() == s)
            .ok_or_else(|| UnknownSignal(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_should_round_trip_their_names() {
        for s in Signal::ALL {
            assert_eq!(s.as_str().parse::<Signal>(), Ok(s));
        }
        assert!("memory.Available".parse::<Signal>().is_err());
        assert!("".parse::<Signal>().is_err());
    }

    #[test]
    fn signals_should_map_to_their_conditions() {
        assert_eq!(
            Signal::AllocatableMemoryAvailable.condition(),
            NodeCondition::MemoryPressure
        );
        assert_eq!(
            Signal::ImageFsInodesFree.condition(),
            NodeCondition::DiskPressure
        );
        assert_eq!(Signal::PidAvailable.condition(), NodeCondition::PidPressure);
    }
}
