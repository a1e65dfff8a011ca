//! The allocation: which containers own which CPUs exclusively, and the
//! shared pool (every allowed CPU nobody owns) the other containers run on.

use std::collections::{BTreeMap, BTreeSet};

use petrel_nri::api;

/// Why a container could not be placed.
#[derive(Debug, PartialEq, Eq)]
pub struct NoRoom {
    /// CPUs asked for.
    pub want: u32,
    /// CPUs that could be given without emptying the shared pool.
    pub free: usize,
}

impl std::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} exclusive CPUs requested, {} can be given (the shared pool keeps one)",
            self.want, self.free
        )
    }
}

/// The CPU allocation of the node.
#[derive(Debug)]
pub struct Policy {
    allowed: BTreeSet<u32>,
    reserved: BTreeSet<u32>,
    exclusive: BTreeMap<String, BTreeSet<u32>>,
    shared: BTreeSet<String>,
}

impl Policy {
    /// A policy over `allowed` CPUs; `reserved` ones among them stay in the
    /// shared pool and are never given exclusively.
    pub fn new(allowed: BTreeSet<u32>, reserved: BTreeSet<u32>) -> Self {
        Policy {
            allowed,
            reserved,
            exclusive: BTreeMap::new(),
            shared: BTreeSet::new(),
        }
    }

    /// CPUs no container owns.
    pub fn shared_pool(&self) -> BTreeSet<u32> {
        let owned: BTreeSet<u32> = self.exclusive.values().flatten().copied().collect();
        self.allowed.difference(&owned).copied().collect()
    }

    /// The containers on the shared pool.
    pub fn shared_containers(&self) -> impl Iterator<Item = &String> {
        self.shared.iter()
    }

    /// The CPUs container `id` runs on, if it is known.
    pub fn cpus_of(&self, id: &str) -> Option<BTreeSet<u32>> {
        if let Some(c) = self.exclusive.get(id) {
            return Some(c.clone());
        }
        self.shared.contains(id).then(|| self.shared_pool())
    }

    /// Places container `id`: `want` exclusive CPUs, or the shared pool.
    /// `prefer` (its current CPUs, at synchronization) is kept when it is
    /// free and of the right size. Returns true if the shared pool changed.
    pub fn admit(
        &mut self,
        id: &str,
        want: Option<u32>,
        prefer: Option<&BTreeSet<u32>>,
    ) -> Result<bool, NoRoom> {
        self.release(id);
        let Some(n) = want else {
            self.shared.insert(id.to_string());
            return Ok(false);
        };
        let pool = self.shared_pool();
        let givable: BTreeSet<u32> = pool.difference(&self.reserved).copied().collect();
        // The shared pool never empties: its containers need somewhere to run.
        let free = if givable.len() < pool.len() {
            givable.len()
        } else {
            givable.len().saturating_sub(1)
        };
        if n as usize > free {
            return Err(NoRoom { want: n, free });
        }
        let pick: BTreeSet<u32> = match prefer {
            Some(p) if p.len() == n as usize && p.is_subset(&givable) && p.len() < pool.len() => {
                p.clone()
            }
            // The highest CPUs: CPU 0 carries most of the host's own work.
            _ => givable.iter().rev().take(n as usize).copied().collect(),
        };
        self.exclusive.insert(id.to_string(), pick);
        Ok(true)
    }

    /// Forgets container `id`; true if the shared pool changed.
    pub fn release(&mut self, id: &str) -> bool {
        self.shared.remove(id);
        self.exclusive.remove(id).is_some()
    }
}

/// Exclusive CPUs container `ctr` of `pod` qualifies for: a Guaranteed pod
/// (its cgroup parent is neither burstable nor besteffort, as kubelet and
/// Petrel's agent lay them out) and an integer CPU limit equal to the request
/// (quota a multiple of period, shares that many × 1024).
pub fn exclusive_request(pod: &api::PodSandbox, ctr: &api::Container) -> Option<u32> {
    let parent = pod
        .linux
        .as_ref()
        .map(|l| l.cgroup_parent.to_ascii_lowercase())
        .unwrap_or_default();
    if parent.contains("burstable") || parent.contains("besteffort") {
        return None;
    }
    let res = ctr.linux.as_ref()?.resources.as_ref()?;
    res.memory
        .as_ref()?
        .limit
        .as_ref()
        .filter(|l| l.value > 0)?;
    let cpu = res.cpu.as_ref()?;
    let quota = cpu.quota.as_ref()?.value;
    let period = cpu.period.as_ref()?.value;
    let shares = cpu.shares.as_ref()?.value;
    let period_i = i64::try_from(period).ok().filter(|p| *p > 0)?;
    if quota <= 0 || quota % period_i != 0 {
        return None;
    }
    let n = u32::try_from(quota / period_i).ok()?;
    (shares == u64::from(n) * 1024).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(v: &[u32]) -> BTreeSet<u32> {
        v.iter().copied().collect()
    }

    #[test]
    fn exclusive_cpus_should_leave_the_shared_pool_and_come_back() {
        let mut p = Policy::new(cpus(&[0, 1, 2, 3]), BTreeSet::new());
        assert_eq!(p.admit("s1", None, None), Ok(false));
        assert_eq!(p.admit("g1", Some(2), None), Ok(true));
        assert_eq!(p.cpus_of("g1"), Some(cpus(&[2, 3])));
        assert_eq!(p.cpus_of("s1"), Some(cpus(&[0, 1])));
        // Only one more can go: the pool keeps one.
        assert_eq!(
            p.admit("g2", Some(2), None),
            Err(NoRoom { want: 2, free: 1 })
        );
        assert_eq!(p.admit("g2", Some(1), None), Ok(true));
        assert_eq!(p.shared_pool(), cpus(&[0]));
        assert!(p.release("g1"));
        assert_eq!(p.shared_pool(), cpus(&[0, 2, 3]));
        assert!(!p.release("s1"));
        assert_eq!(p.cpus_of("s1"), None);
    }

    #[test]
    fn reserved_cpus_should_stay_shared() {
        let mut p = Policy::new(cpus(&[0, 1, 2]), cpus(&[0]));
        assert_eq!(p.admit("g", Some(2), None), Ok(true));
        assert_eq!(p.cpus_of("g"), Some(cpus(&[1, 2])));
        assert_eq!(p.shared_pool(), cpus(&[0]));
        assert_eq!(
            p.admit("h", Some(1), None),
            Err(NoRoom { want: 1, free: 0 })
        );
    }

    #[test]
    fn synchronization_should_keep_a_free_current_placement() {
        let mut p = Policy::new(cpus(&[0, 1, 2, 3]), BTreeSet::new());
        assert_eq!(p.admit("g", Some(1), Some(&cpus(&[1]))), Ok(true));
        assert_eq!(p.cpus_of("g"), Some(cpus(&[1])));
        // Taken already: another is picked.
        assert_eq!(p.admit("h", Some(1), Some(&cpus(&[1]))), Ok(true));
        assert_eq!(p.cpus_of("h"), Some(cpus(&[3])));
    }

    fn pod(parent: &str) -> api::PodSandbox {
        api::PodSandbox {
            linux: Some(api::LinuxPodSandbox {
                cgroup_parent: parent.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ctr(quota: i64, period: u64, shares: u64, mem: i64) -> api::Container {
        api::Container {
            linux: Some(api::LinuxContainer {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        quota: Some(api::OptionalInt64 { value: quota }),
                        period: Some(api::OptionalUInt64 { value: period }),
                        shares: Some(api::OptionalUInt64 { value: shares }),
                        ..Default::default()
                    }),
                    memory: Some(api::LinuxMemory {
                        limit: Some(api::OptionalInt64 { value: mem }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_guaranteed_integer_cpu_containers_should_qualify() {
        let g = pod("/kubepods/podabc");
        assert_eq!(
            exclusive_request(&g, &ctr(200_000, 100_000, 2048, 1 << 30)),
            Some(2)
        );
        assert_eq!(
            exclusive_request(&g, &ctr(150_000, 100_000, 1536, 1 << 30)),
            None
        );
        assert_eq!(
            exclusive_request(&g, &ctr(100_000, 100_000, 512, 1 << 30)),
            None
        );
        assert_eq!(exclusive_request(&g, &ctr(100_000, 100_000, 1024, 0)), None);
        let b = pod("/kubepods/burstable/podabc");
        assert_eq!(
            exclusive_request(&b, &ctr(100_000, 100_000, 1024, 1 << 30)),
            None
        );
    }
}
