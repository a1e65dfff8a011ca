//! What the eviction manager publishes about the node: its pressure
//! conditions (for `GET /node` and admission) and the last observation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::RwLock;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Node, NodeCondition as K8sCondition, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::observe::NodeStats;
use super::signals::NodeCondition;

#[derive(Debug, Default)]
struct Inner {
    conditions: BTreeSet<NodeCondition>,
    transitions: BTreeMap<NodeCondition, SystemTime>,
    heartbeat: Option<SystemTime>,
    stats: Option<NodeStats>,
    summary: Option<std::sync::Arc<super::summary::Summary>>,
}

/// The node's pressure, shared by the eviction manager (writer), the
/// server and the pod workers' admission (readers).
#[derive(Debug, Default)]
pub struct NodeState {
    inner: RwLock<Inner>,
}

fn time(t: SystemTime) -> Time {
    crate::status::compute::time_from_system(t).unwrap_or_else(|| Time(Default::default()))
}

impl NodeState {
    /// A node without pressure, not observed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a pass: the conditions that hold and what was observed.
    pub fn update(&self, conditions: BTreeSet<NodeCondition>, stats: Option<NodeStats>) {
        let now = SystemTime::now();
        let mut g = self.inner.write().unwrap_or_else(|p| p.into_inner());
        for c in NodeCondition::ALL {
            let was = g.conditions.contains(&c);
            let is = conditions.contains(&c);
            if was != is || !g.transitions.contains_key(&c) {
                g.transitions.insert(c, now);
            }
        }
        g.conditions = conditions;
        g.heartbeat = Some(now);
        if stats.is_some() {
            g.stats = stats;
        }
    }

    /// Replaces the cached `/stats/summary`.
    pub fn set_summary(&self, summary: super::summary::Summary) {
        let mut g = self.inner.write().unwrap_or_else(|p| p.into_inner());
        g.summary = Some(std::sync::Arc::new(summary));
    }

    /// The summary of the last pass (None before the first).
    pub fn summary(&self) -> Option<std::sync::Arc<super::summary::Summary>> {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        g.summary.clone()
    }

    /// Whether `c` holds.
    pub fn under(&self, c: NodeCondition) -> bool {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        g.conditions.contains(&c)
    }

    /// The conditions that hold.
    pub fn conditions(&self) -> BTreeSet<NodeCondition> {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        g.conditions.clone()
    }

    /// The last observation.
    pub fn stats(&self) -> Option<NodeStats> {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        g.stats.clone()
    }

    /// The node as `GET /node` shows it: name, pressure conditions with
    /// kubelet's reasons and messages, memory capacity.
    pub fn node(&self, name: &str) -> Node {
        let g = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let conditions = NodeCondition::ALL
            .iter()
            .map(|c| {
                let on = g.conditions.contains(c);
                let (reason, message) = match (c, on) {
                    (NodeCondition::MemoryPressure, false) => (
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    (NodeCondition::MemoryPressure, true) => (
                        "KubeletHasInsufficientMemory",
                        "kubelet has insufficient memory available",
                    ),
                    (NodeCondition::DiskPressure, false) => {
                        ("KubeletHasNoDiskPressure", "kubelet has no disk pressure")
                    }
                    (NodeCondition::DiskPressure, true) => {
                        ("KubeletHasDiskPressure", "kubelet has disk pressure")
                    }
                    (NodeCondition::PidPressure, false) => (
                        "KubeletHasSufficientPID",
                        "kubelet has sufficient PID available",
                    ),
                    (NodeCondition::PidPressure, true) => (
                        "KubeletHasInsufficientPID",
                        "kubelet has insufficient PID available",
                    ),
                };
                K8sCondition {
                    type_: c.as_str().to_string(),
                    status: if on { "True" } else { "False" }.to_string(),
                    reason: Some(reason.to_string()),
                    message: Some(message.to_string()),
                    last_heartbeat_time: g.heartbeat.map(time),
                    last_transition_time: g.transitions.get(c).copied().map(time),
                }
            })
            .collect();
        let mut capacity = BTreeMap::new();
        let mut allocatable = BTreeMap::new();
        if let Some(s) = &g.stats {
            capacity.insert(
                "memory".to_string(),
                Quantity(s.memory.capacity.to_string()),
            );
            allocatable.insert(
                "memory".to_string(),
                Quantity(s.allocatable_memory.capacity.to_string()),
            );
            if s.pids_capacity > 0 {
                capacity.insert("pid".to_string(), Quantity(s.pids_capacity.to_string()));
            }
            if let Some(fs) = s.nodefs {
                capacity.insert(
                    "ephemeral-storage".to_string(),
                    Quantity(fs.capacity.to_string()),
                );
            }
        }
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            spec: None,
            status: Some(NodeStatus {
                conditions: Some(conditions),
                capacity: (!capacity.is_empty()).then_some(capacity),
                allocatable: (!allocatable.is_empty()).then_some(allocatable),
                ..Default::default()
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_node_should_show_every_pressure_condition() {
        let s = NodeState::new();
        s.update(BTreeSet::from([NodeCondition::DiskPressure]), None);
        assert!(s.under(NodeCondition::DiskPressure));
        assert!(!s.under(NodeCondition::MemoryPressure));
        let n = s.node("n1");
        let conds = n.status.unwrap().conditions.unwrap();
        let disk = conds.iter().find(|c| c.type_ == "DiskPressure").unwrap();
        assert_eq!(disk.status, "True");
        assert_eq!(disk.reason.as_deref(), Some("KubeletHasDiskPressure"));
        let pid = conds.iter().find(|c| c.type_ == "PIDPressure").unwrap();
        assert_eq!(pid.status, "False");
        assert!(pid.last_transition_time.is_some());
    }
}
