//! Deleting a stopped runc container without running `runc delete`.
//!
//! For a container whose init is dead, `runc delete` (runc 1.1 and later)
//! kills what is left in the container's cgroup when the container shares
//! a PID namespace, removes the cgroup directories recorded in its
//! `state.json` (retrying while the kernel still counts exiting tasks),
//! removes its state directory and runs its poststop hooks. For a container
//! with a PID namespace of its own, no poststop hooks, no Intel RDT group
//! and cgroupfs-managed cgroups, that is two removals: done here they cost
//! a few system calls instead of runc's Go start-up (~4 ms on this machine,
//! most of RemoveContainer). Anything else (an init still alive, a shared
//! PID namespace, hooks, systemd-managed cgroups, a state file this module
//! does not understand) is left to `runc delete`.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// runc's state file in a container's state directory.
pub const STATE_FILE: &str = "state.json";

/// Where cgroupfs hierarchies are mounted; a recorded path elsewhere is
/// left to runc.
const CGROUP_ROOT: &str = "/sys/fs/cgroup/";

/// What a delete did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The container's cgroups and state directory are gone (or were
    /// never there: runc does not know the container).
    Done,
    /// Not a case this module handles: run `runc delete`.
    LeftToRunc,
}

/// The part of runc's `state.json` a delete needs.
#[derive(Debug, Deserialize)]
struct StateFile {
    init_process_pid: u32,
    init_process_start: u64,
    #[serde(default)]
    cgroup_paths: HashMap<String, String>,
    #[serde(default)]
    intel_rdt_path: String,
    config: ConfigFile,
}

#[derive(Debug, Deserialize)]
struct ConfigFile {
    #[serde(default)]
    namespaces: Vec<Namespace>,
    /// runc serializes its hooks under this (untagged) field name.
    #[serde(default, rename = "Hooks")]
    hooks: Option<HashMap<String, serde_json::Value>>,
    #[serde(default)]
    cgroups: Option<CgroupConfig>,
}

#[derive(Debug, Deserialize)]
struct Namespace {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct CgroupConfig {
    #[serde(default)]
    systemd: bool,
}

impl StateFile {
    /// True when removing the cgroups and the state directory is all
    /// `runc delete` would do.
    fn plain(&self) -> bool {
        let own_pid_ns = self
            .config
            .namespaces
            .iter()
            .any(|n| n.kind == "NEWPID" && n.path.is_empty());
        let poststop = self
            .config
            .hooks
            .as_ref()
            .and_then(|h| h.get("poststop"))
            .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()));
        let systemd = self.config.cgroups.as_ref().is_some_and(|c| c.systemd);
        own_pid_ns
            && !poststop
            && !systemd
            && self.intel_rdt_path.is_empty()
            && self
                .cgroup_paths
                .values()
                .all(|p| p.starts_with(CGROUP_ROOT) && !p.contains("/../"))
    }
}

/// Deletes the container whose runc state directory is `state_dir` when
/// its init is dead and nothing but removals is needed. Blocking (it may
/// wait up to ~150 ms for a cgroup whose last tasks are still exiting):
/// call it where blocking is allowed.
pub fn delete(state_dir: &Path) -> io::Result<Deleted> {
    let text = match std::fs::read(state_dir.join(STATE_FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // No directory: runc does not know the container. A directory
            // without a state file (an aborted create) is runc's to judge.
            return Ok(if state_dir.exists() {
                Deleted::LeftToRunc
            } else {
                Deleted::Done
            });
        }
        Err(e) => return Err(e),
    };
    let Ok(state) = serde_json::from_slice::<StateFile>(&text) else {
        return Ok(Deleted::LeftToRunc);
    };
    if !state.plain() || init_alive(state.init_process_pid, state.init_process_start) {
        return Ok(Deleted::LeftToRunc);
    }
    let paths: BTreeSet<PathBuf> = state.cgroup_paths.values().map(PathBuf::from).collect();
    if let Err((path, e)) = remove_cgroups(&paths) {
        // As runc: a cgroup that will not go is reported, and the
        // container is deleted all the same.
        tracing::warn!(cgroup = %path.display(), error = %e, "container cgroup not removed");
    }
    match std::fs::remove_dir_all(state_dir) {
        Ok(()) => Ok(Deleted::Done),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Deleted::Done),
        Err(e) => Err(e),
    }
}

/// Whether the init recorded by runc still runs: the pid exists with the
/// recorded start time and is neither a zombie nor dead (runc's own test).
fn init_alive(pid: u32, start: u64) -> bool {
    pid != 0
        && crate::proc_stat::read(pid)
            .is_some_and(|s| s.start_time == start && !matches!(s.state, 'Z' | 'X' | 'x'))
}

/// Removes each cgroup directory with any sub-cgroups, retrying (10, 20,
/// 40, 80 ms apart, as runc does) while the kernel still counts tasks that
/// are exiting. Returns the first path that would not go.
fn remove_cgroups(paths: &BTreeSet<PathBuf>) -> Result<(), (PathBuf, io::Error)> {
    const TRIES: u32 = 5;
    let mut left: Vec<&PathBuf> = paths.iter().collect();
    let mut delay = Duration::from_millis(10);
    for attempt in 0..TRIES {
        if attempt > 0 {
            std::thread::sleep(delay);
            delay *= 2;
        }
        let mut failed = None;
        left.retain(|p| match remove_cgroup(p) {
            Ok(()) => false,
            Err(e) => {
                failed.get_or_insert(e);
                true
            }
        });
        match (left.first(), failed) {
            (None, _) => return Ok(()),
            (Some(p), Some(e)) if attempt + 1 == TRIES => return Err(((*p).clone(), e)),
            _ => {}
        }
    }
    Ok(())
}

/// Removes one cgroup directory, its sub-cgroups first. A cgroup directory
/// holds only the kernel's control files, which rmdir takes with it.
fn remove_cgroup(path: &Path) -> io::Result<()> {
    match std::fs::remove_dir(path) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(_) => {}
    }
    for entry in std::fs::read_dir(path)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_cgroup(&entry.path())?;
        }
    }
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(namespaces: &str, hooks: &str, rdt: &str, cgroups: &str) -> StateFile {
        let text = format!(
            r#"{{"id":"c","init_process_pid":1,"init_process_start":5,"created":"x",
            "config":{{"namespaces":{namespaces},"Hooks":{hooks},"cgroups":{cgroups}}},
            "rootless":false,"cgroup_paths":{{"memory":"/sys/fs/cgroup/memory/p/c","":"/sys/fs/cgroup/unified/p/c"}},
            "namespace_paths":{{}},"intel_rdt_path":"{rdt}"}}"#
        );
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    const OWN_PID: &str = r#"[{"type":"NEWNS","path":""},{"type":"NEWPID","path":""}]"#;
    const SHARED_PID: &str =
        r#"[{"type":"NEWNS","path":""},{"type":"NEWPID","path":"/proc/7/ns/pid"}]"#;
    const CGROUPFS: &str = r#"{"path":"/p/c","systemd":false}"#;

    #[test]
    fn plain_should_hold_only_for_an_own_pid_namespace_without_hooks_or_rdt() {
        assert!(state(OWN_PID, "null", "", CGROUPFS).plain());
        assert!(state(OWN_PID, r#"{"poststop":[]}"#, "", CGROUPFS).plain());
        assert!(state(OWN_PID, r#"{"prestart":[{"path":"/x"}]}"#, "", CGROUPFS).plain());
        assert!(!state(SHARED_PID, "null", "", CGROUPFS).plain());
        assert!(!state(r#"[{"type":"NEWNS","path":""}]"#, "null", "", CGROUPFS).plain());
        assert!(!state(OWN_PID, r#"{"poststop":[{"path":"/x"}]}"#, "", CGROUPFS).plain());
        assert!(!state(OWN_PID, "null", "/sys/fs/resctrl/c", CGROUPFS).plain());
        assert!(!state(OWN_PID, "null", "", r#"{"systemd":true}"#).plain());
    }

    #[test]
    fn plain_should_refuse_cgroup_paths_outside_the_cgroup_mounts() {
        let mut s = state(OWN_PID, "null", "", CGROUPFS);
        s.cgroup_paths.insert("pids".into(), "/tmp/x".into());
        assert!(!s.plain());
        let mut s = state(OWN_PID, "null", "", CGROUPFS);
        s.cgroup_paths
            .insert("pids".into(), "/sys/fs/cgroup/pids/../../../etc".into());
        assert!(!s.plain());
    }

    fn my_start_time() -> u64 {
        crate::proc_stat::read(std::process::id()).map_or(0, |s| s.start_time)
    }

    #[test]
    fn init_alive_should_know_this_process_and_reject_other_start_times() {
        let me = std::process::id();
        let start = my_start_time();
        assert!(start > 0);
        assert!(init_alive(me, start));
        assert!(!init_alive(me, start + 1));
        assert!(!init_alive(0, 0));
    }

    #[test]
    fn delete_should_leave_unknown_state_to_runc_and_treat_a_missing_dir_as_done() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let missing = dir.path().join("gone");
        assert_eq!(delete(&missing).ok(), Some(Deleted::Done));
        // A directory without a state file: an aborted create, runc's call.
        let bare = dir.path().join("bare");
        std::fs::create_dir(&bare).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(delete(&bare).ok(), Some(Deleted::LeftToRunc));
        // A state file of another shape.
        std::fs::write(bare.join(STATE_FILE), b"{\"id\":1}").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(delete(&bare).ok(), Some(Deleted::LeftToRunc));
        assert!(bare.exists());
    }

    #[test]
    fn delete_should_remove_the_state_dir_of_a_dead_init() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let c = dir.path().join("c");
        std::fs::create_dir(&c).unwrap_or_else(|e| panic!("{e}"));
        // pid 0 is never alive; no cgroups recorded.
        let text = format!(
            r#"{{"init_process_pid":0,"init_process_start":0,"cgroup_paths":{{}},
            "intel_rdt_path":"","config":{{"namespaces":{OWN_PID}}}}}"#
        );
        std::fs::write(c.join(STATE_FILE), text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(delete(&c).ok(), Some(Deleted::Done));
        assert!(!c.exists());
    }

    #[test]
    fn delete_should_leave_a_live_init_to_runc() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let c = dir.path().join("c");
        std::fs::create_dir(&c).unwrap_or_else(|e| panic!("{e}"));
        let (me, start) = (std::process::id(), my_start_time());
        let text = format!(
            r#"{{"init_process_pid":{me},"init_process_start":{start},"cgroup_paths":{{}},
            "intel_rdt_path":"","config":{{"namespaces":{OWN_PID}}}}}"#
        );
        std::fs::write(c.join(STATE_FILE), text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(delete(&c).ok(), Some(Deleted::LeftToRunc));
        assert!(c.exists());
    }
}
