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
    /// Runs a pass of the eviction manager at once.
    pass_trigger: std::sync::OnceLock<std::sync::Arc<tokio::sync::Notify>>,
    /// When `/stats/summary` was last asked for.
    summary_wanted: std::sync::Mutex<Option<std::time::Instant>>,
    /// Signalled when a new summary is set.
    summary_set: tokio::sync::Notify,
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
        drop(g);
        self.summary_set.notify_waiters();
    }

    /// Lets requests of `/stats/summary` run a pass at once.
    pub fn set_pass_trigger(&self, trigger: std::sync::Arc<tokio::sync::Notify>) {
        let _ = self.pass_trigger.set(trigger);
    }

    /// Whether `/stats/summary` was asked for within `window`.
    pub fn summary_wanted_within(&self, window: std::time::Duration) -> bool {
        let g = self
            .summary_wanted
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        g.is_some_and(|t| t.elapsed() < window)
    }

    /// The summary for a request: the cached one while passes build it;
    /// else (nobody asked lately) a pass is run at once and its summary
    /// awaited for up to `wait`.
    pub async fn summary_for_request(
        &self,
        wait: std::time::Duration,
    ) -> Option<std::sync::Arc<super::summary::Summary>> {
        let was_wanted = {
            let mut g = self
                .summary_wanted
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let was = g.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(240));
            *g = Some(std::time::Instant::now());
            was
        };
        if was_wanted {
            if let Some(s) = self.summary() {
                return Some(s);
            }
        }
        let trigger = self.pass_trigger.get()?;
        let set = self.summary_set.notified();
        tokio::pin!(set);
        set.as_mut().enable();
        trigger.notify_one();
        let _ = tokio::time::timeout(wait, set).await;
        self.summary()
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

    #[tokio::test]
    async fn a_summary_request_should_run_a_pass_when_nobody_asked_lately() {
        use std::sync::Arc;
        let node = Arc::new(NodeState::new());
        let trigger = Arc::new(tokio::sync::Notify::new());
        node.set_pass_trigger(Arc::clone(&trigger));
        assert!(!node.summary_wanted_within(std::time::Duration::from_secs(60)));
        // A stand-in for the manager: a pass when triggered.
        let (n, t) = (Arc::clone(&node), Arc::clone(&trigger));
        let pass = tokio::spawn(async move {
            t.notified().await;
            assert!(n.summary_wanted_within(std::time::Duration::from_secs(60)));
            n.set_summary(crate::eviction::summary::Summary {
                node: crate::eviction::summary::NodeSummary {
                    node_name: "n1".into(),
                    system_containers: Vec::new(),
                    cpu: None,
                    memory: crate::eviction::summary::MemoryStats {
                        time: None,
                        available_bytes: None,
                        usage_bytes: 1,
                        working_set_bytes: 1,
                        rss_bytes: None,
                        page_faults: None,
                        major_page_faults: None,
                        psi: None,
                    },
                    io: None,
                    fs: None,
                    runtime: crate::eviction::summary::RuntimeSummary {
                        image_fs: None,
                        container_fs: None,
                    },
                    rlimit: crate::eviction::summary::Rlimit {
                        time: None,
                        maxpid: 1,
                        curproc: 1,
                    },
                },
                pods: Vec::new(),
            });
        });
        let s = node
            .summary_for_request(std::time::Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(s.node.node_name, "n1");
        pass.await.unwrap();
        // Asked lately: the cached summary, no pass.
        let again = node
            .summary_for_request(std::time::Duration::from_millis(10))
            .await
            .unwrap();
        assert!(Arc::ptr_eq(&s, &again));
    }
}
