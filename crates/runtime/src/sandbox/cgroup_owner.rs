//! Which pod cgroup directories the runtime owns, and when they go.
//!
//! RunPodSandbox makes the pod's cgroup (`cgroup_parent`) and whatever
//! ancestors are missing, in every hierarchy, and records the directories
//! it made, each in its own hierarchy (`SandboxRecord::created_cgroup_dirs`),
//! never one it found: a parent that kubelet (or an operator) made is not
//! ours, even where the runtime made the same path in another hierarchy.
//!
//! When a pod goes, each directory it made is removed, unless another
//! pod's cgroup is at or below it (an ancestor shared with pods still
//! there, e.g. the runtime's default parent): that one is kept and its
//! ownership moves to the store's `CgroupDirs` table, in one durable
//! transaction, so that it is removed with the last pod below it. Removal
//! and creation are serialised (`Runtime::cgroup_owners`), so a directory
//! is never removed between another pod finding it and making its own
//! cgroup inside.

use std::path::PathBuf;

use petrel_store::{encode, Op, Table};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::records::SandboxRecord;
use crate::service::Runtime;

/// A cgroup directory kept after the pod that made it went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct HeldDir {
    /// The pod that made it (for the logs).
    pub created_by: String,
}

/// What to do with cgroup directories when a pod goes.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Release {
    /// Directories to remove (deepest first is the remover's job).
    pub remove: Vec<PathBuf>,
    /// Directories the pod made that other pods still live in: recorded in
    /// the `CgroupDirs` table.
    pub hold: Vec<PathBuf>,
    /// `CgroupDirs` entries removed now: deleted from the table.
    pub forget: Vec<PathBuf>,
}

/// Whether cgroup `path` is `ancestor` or below it.
fn at_or_below(path: &str, ancestor: &str) -> bool {
    let mut p = path.split('/').filter(|c| !c.is_empty());
    ancestor
        .split('/')
        .filter(|c| !c.is_empty())
        .all(|a| p.next() == Some(a))
}

/// Decides the fate of the cgroup directories of a pod that goes: `own`
/// are those it made, `held` those the table keeps (each with its cgroup
/// path), `pod_cgroup` the pod's cgroup and `others` the cgroups of every
/// other pod.
pub(crate) fn plan_release(
    own: &[(PathBuf, String)],
    held: &[(PathBuf, String)],
    pod_cgroup: &str,
    others: &[String],
) -> Release {
    let in_use = |cg: &str| others.iter().any(|o| at_or_below(o, cg));
    let mut plan = Release::default();
    for (dir, cg) in own {
        if in_use(cg) {
            plan.hold.push(dir.clone());
        } else {
            plan.remove.push(dir.clone());
        }
    }
    for (dir, cg) in held {
        if at_or_below(pod_cgroup, cg) && !in_use(cg) && !plan.remove.contains(dir) {
            plan.remove.push(dir.clone());
            plan.forget.push(dir.clone());
        }
    }
    plan
}

impl Runtime {
    /// Makes a pod's cgroup where it is missing; returns the directories
    /// made (see the module's doc).
    pub(crate) fn make_pod_cgroup(&self, path: &str) -> Result<Vec<PathBuf>> {
        let _owners = self
            .cgroup_owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.cgroups
            .ensure_dirs(path)
            .map_err(|e| crate::error::RuntimeError::cgroup("create pod cgroup", e))
    }

    /// Removes the cgroup directories a pod made, and held ones only it
    /// still lived in; hands on those other pods live in. Call it while the
    /// pod's own containers are gone; the pod may still be in the state.
    pub(crate) fn release_pod_cgroups(&self, rec: &SandboxRecord) -> Result<()> {
        let _owners = self
            .cgroup_owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if rec.created_cgroup_dirs.is_empty() && !rec.created_cgroups.is_empty() {
            // A record of an older version: paths, not directories.
            for cg in rec.created_cgroups.iter().rev() {
                if let Err(e) = self.cgroups.remove(cg) {
                    tracing::debug!(sandbox.id = %rec.id, cgroup = %cg, error = %e, "pod cgroup not removed");
                }
            }
            return Ok(());
        }
        let with_path = |dir: &PathBuf| {
            let cg = self.cgroups.cgroup_of_dir(dir);
            if cg.is_none() {
                tracing::warn!(sandbox.id = %rec.id, dir = %dir.display(), "recorded cgroup directory is outside the cgroup hierarchies; left alone");
            }
            cg.map(|cg| (dir.clone(), cg))
        };
        let own: Vec<_> = rec
            .created_cgroup_dirs
            .iter()
            .filter_map(with_path)
            .collect();
        let held: Vec<_> = self
            .store
            .list::<HeldDir>(Table::CgroupDirs)?
            .into_iter()
            .filter_map(|(key, _)| with_path(&PathBuf::from(key)))
            .collect();
        let others: Vec<String> = self
            .state
            .sandboxes()
            .iter()
            .filter(|s| s.id != rec.id)
            .map(|s| s.with(|r| r.cgroup_parent.clone()))
            .collect();
        let plan = plan_release(&own, &held, &rec.cgroup_parent, &others);
        let left = match self.cgroups.remove_created(&plan.remove) {
            Ok(()) => Vec::new(),
            Err((left, e)) => {
                tracing::warn!(sandbox.id = %rec.id, left = ?left, error = %e, "pod cgroup directories not removed");
                left
            }
        };
        let mut ops = Vec::new();
        let held_by = HeldDir {
            created_by: rec.id.clone(),
        };
        for dir in &plan.hold {
            let key = dir.display().to_string();
            let value = encode(Table::CgroupDirs, &key, &held_by)?;
            ops.push(Op::Put(Table::CgroupDirs, key, value));
        }
        // A held directory that is still there stays held (a later pod's
        // removal tries again).
        for dir in plan.forget.iter().filter(|d| !left.contains(d)) {
            ops.push(Op::Delete(Table::CgroupDirs, dir.display().to_string()));
        }
        if !ops.is_empty() {
            self.store.apply(ops)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(list: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
        list.iter()
            .map(|(d, c)| (PathBuf::from(d), c.to_string()))
            .collect()
    }

    #[test]
    fn at_or_below_should_compare_whole_components() {
        assert!(at_or_below("/a/b", "/a"));
        assert!(at_or_below("/a", "/a"));
        assert!(at_or_below("/a/b/", "/a/b"));
        assert!(!at_or_below("/ab", "/a"));
        assert!(!at_or_below("/a", "/a/b"));
        assert!(at_or_below("/x", "/"));
    }

    #[test]
    fn plan_release_should_remove_what_the_pod_made_and_nobody_else_uses() {
        let own = dirs(&[
            ("/cg/memory/p", "/p"),
            ("/cg/memory/p/pod1", "/p/pod1"),
            ("/cg/cpu/p/pod1", "/p/pod1"),
        ]);
        let plan = plan_release(&own, &[], "/p/pod1", &["/q/pod2".to_string()]);
        assert_eq!(
            plan.remove,
            own.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>()
        );
        assert!(plan.hold.is_empty() && plan.forget.is_empty());
    }

    #[test]
    fn plan_release_should_hand_on_a_shared_ancestor_and_remove_it_with_the_last_pod() {
        let own = dirs(&[("/cg/memory/p", "/p"), ("/cg/memory/p/pod1", "/p/pod1")]);
        // pod2 still lives below /p: /p is kept and held.
        let plan = plan_release(&own, &[], "/p/pod1", &["/p/pod2".to_string()]);
        assert_eq!(plan.remove, vec![PathBuf::from("/cg/memory/p/pod1")]);
        assert_eq!(plan.hold, vec![PathBuf::from("/cg/memory/p")]);
        // pod2 goes last: the held /p goes with it, and leaves the table.
        let held = dirs(&[("/cg/memory/p", "/p")]);
        let own2 = dirs(&[("/cg/memory/p/pod2", "/p/pod2")]);
        let plan = plan_release(&own2, &held, "/p/pod2", &[]);
        assert_eq!(
            plan.remove,
            vec![
                PathBuf::from("/cg/memory/p/pod2"),
                PathBuf::from("/cg/memory/p")
            ]
        );
        assert_eq!(plan.forget, vec![PathBuf::from("/cg/memory/p")]);
        // A pod elsewhere does not take a held directory with it.
        let plan = plan_release(&[], &held, "/q/pod3", &[]);
        assert_eq!(plan, Release::default());
    }

    #[test]
    fn plan_release_should_never_remove_a_cgroup_the_pod_found() {
        // kubelet's pod cgroup pre-existed everywhere but one hierarchy: only
        // that one directory was made, so only it goes.
        let own = dirs(&[("/cg/freezer/kubepods/podu", "/kubepods/podu")]);
        let plan = plan_release(&own, &[], "/kubepods/podu", &[]);
        assert_eq!(
            plan.remove,
            vec![PathBuf::from("/cg/freezer/kubepods/podu")]
        );
        // Two pods sharing one parent that the first made: kept for the second.
        let own = dirs(&[("/cg/memory/shared", "/shared")]);
        let plan = plan_release(&own, &[], "/shared", &["/shared".to_string()]);
        assert!(plan.remove.is_empty());
        assert_eq!(plan.hold, vec![PathBuf::from("/cg/memory/shared")]);
    }
}
