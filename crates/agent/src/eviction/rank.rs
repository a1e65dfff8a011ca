//! Ranking pods for eviction, kubelet's way, as pure functions.
//!
//! - memory: pods using more than they requested first, then lower
//!   priority, then more usage above the request;
//! - pids: lower priority, then more processes;
//! - disk and inodes: pods using more than they requested first, then
//!   lower priority, then more usage above the request.
//!
//! As in kubelet, a pod without statistics ranks before any pod with
//! them. Critical and static pods rank after every other pod, so they are
//! evicted only when nothing else is left.

use std::cmp::Ordering;

use super::signals::Resource;

/// Priority at and above which a pod is critical (kubelet's
/// `SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// What ranking needs to know of one pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Candidate {
    /// The pod's UID.
    pub uid: String,
    /// `namespace/name`, for messages.
    pub name: String,
    /// spec.priority (0 when unset).
    pub priority: i32,
    /// Critical (a system priority class, or priority ≥ 2e9).
    pub critical: bool,
    /// From a static source whose pods kubelet would not evict while
    /// others remain (a manifest directory, when pods also come from an
    /// API server).
    pub static_pod: bool,
    /// Sum of the containers' memory requests, bytes.
    pub memory_request: i64,
    /// Sum of the containers' ephemeral-storage requests, bytes.
    pub disk_request: i64,
    /// Memory working set, bytes (None: no statistics).
    pub memory_usage: Option<i64>,
    /// Local storage in use (writable layers, logs, emptyDirs), bytes.
    pub disk_usage: Option<i64>,
    /// Inodes in use by the same.
    pub inodes_usage: Option<i64>,
    /// Processes (threads included, as pids.current counts them).
    pub processes: Option<i64>,
}

impl Candidate {
    /// Usage and request of `resource`.
    pub fn usage(&self, resource: Resource) -> (Option<i64>, i64) {
        match resource {
            Resource::Memory => (self.memory_usage, self.memory_request),
            Resource::Disk => (self.disk_usage, self.disk_request),
            Resource::Inodes => (self.inodes_usage, 0),
            Resource::Pids => (self.processes, 0),
        }
    }

    fn spared(&self) -> bool {
        self.critical || self.static_pod
    }
}

/// Pods without statistics first, then those above their request.
fn exceeds_request(a: &Candidate, b: &Candidate, r: Resource) -> Ordering {
    let (ua, ra) = a.usage(r);
    let (ub, rb) = b.usage(r);
    match (ua, ub) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(ua), Some(ub)) => (ub > rb).cmp(&(ua > ra)),
    }
}

/// Lower priority first.
fn priority(a: &Candidate, b: &Candidate) -> Ordering {
    a.priority.cmp(&b.priority)
}

/// More usage above the request first.
fn above_request(a: &Candidate, b: &Candidate, r: Resource) -> Ordering {
    let (ua, ra) = a.usage(r);
    let (ub, rb) = b.usage(r);
    match (ua, ub) {
        (Some(ua), Some(ub)) => (ub - rb).cmp(&(ua - ra)),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

/// Sorts `pods` into eviction order for pressure on `resource`: the first
/// is evicted first. The sort is stable.
pub fn rank(pods: &mut [Candidate], resource: Resource) {
    pods.sort_by(|a, b| {
        a.spared().cmp(&b.spared()).then_with(|| match resource {
            Resource::Pids => priority(a, b).then_with(|| above_request(a, b, resource)),
            _ => exceeds_request(a, b, resource)
                .then_with(|| priority(a, b))
                .then_with(|| above_request(a, b, resource)),
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: i64 = 1 << 20;

    fn pod(name: &str) -> Candidate {
        Candidate {
            uid: name.to_string(),
            name: name.to_string(),
            ..Default::default()
        }
    }

    fn order(pods: &[Candidate]) -> Vec<&str> {
        pods.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn memory_should_rank_pods_over_their_requests_first() {
        let best_effort = Candidate {
            memory_usage: Some(50 * MI),
            ..pod("besteffort")
        };
        let guaranteed_big = Candidate {
            memory_request: 500 * MI,
            memory_usage: Some(400 * MI),
            ..pod("guaranteed")
        };
        let burstable_over = Candidate {
            memory_request: 10 * MI,
            memory_usage: Some(30 * MI),
            ..pod("burstable")
        };
        let mut pods = vec![guaranteed_big, burstable_over, best_effort];
        rank(&mut pods, Resource::Memory);
        // Both over their requests; the BestEffort pod is 50Mi over, the
        // Burstable one 20Mi; the Guaranteed pod is within its request.
        assert_eq!(order(&pods), ["besteffort", "burstable", "guaranteed"]);
    }

    #[test]
    fn memory_should_prefer_lower_priority_among_pods_over_requests() {
        let low = Candidate {
            priority: -10,
            memory_usage: Some(MI),
            ..pod("low")
        };
        let high = Candidate {
            priority: 1000,
            memory_usage: Some(900 * MI),
            ..pod("high")
        };
        let mut pods = vec![high, low];
        rank(&mut pods, Resource::Memory);
        assert_eq!(order(&pods), ["low", "high"]);
    }

    #[test]
    fn pods_without_statistics_should_rank_first() {
        let mut pods = vec![
            Candidate {
                memory_usage: Some(900 * MI),
                ..pod("measured")
            },
            pod("unmeasured"),
        ];
        rank(&mut pods, Resource::Memory);
        assert_eq!(order(&pods), ["unmeasured", "measured"]);
    }

    #[test]
    fn pids_should_rank_by_priority_then_processes() {
        let mut pods = vec![
            Candidate {
                processes: Some(5),
                ..pod("few")
            },
            Candidate {
                processes: Some(500),
                priority: 10,
                ..pod("many-high")
            },
            Candidate {
                processes: Some(50),
                ..pod("some")
            },
        ];
        rank(&mut pods, Resource::Pids);
        assert_eq!(order(&pods), ["some", "few", "many-high"]);
    }

    #[test]
    fn disk_should_rank_over_requests_then_priority_then_usage() {
        let mut pods = vec![
            Candidate {
                disk_request: 10 * MI,
                disk_usage: Some(5 * MI),
                ..pod("within")
            },
            Candidate {
                disk_usage: Some(MI),
                ..pod("small")
            },
            Candidate {
                disk_usage: Some(80 * MI),
                disk_request: 20 * MI,
                ..pod("big")
            },
        ];
        rank(&mut pods, Resource::Disk);
        assert_eq!(order(&pods), ["big", "small", "within"]);
    }

    #[test]
    fn critical_and_static_pods_should_be_spared_while_others_remain() {
        let mut pods = vec![
            Candidate {
                critical: true,
                memory_usage: Some(900 * MI),
                ..pod("critical")
            },
            Candidate {
                static_pod: true,
                memory_usage: Some(800 * MI),
                ..pod("static")
            },
            Candidate {
                memory_request: 10 * MI,
                memory_usage: Some(MI),
                priority: 100,
                ..pod("ordinary")
            },
        ];
        rank(&mut pods, Resource::Memory);
        assert_eq!(order(&pods), ["ordinary", "critical", "static"]);
    }
}
