//! The systemd cgroup driver's seam: systemd owns the cgroup tree, so the
//! runtime makes and removes pod slices and container scopes as units
//! ([`SystemdUnits`], `systemctl` on the host) and only reads the files.
//! [`SystemdCgroups`] is the [`CgroupOps`] of that driver: reads go to the
//! cgroupfs implementation it wraps (the paths the runtime keeps are the
//! expanded ones, `/kubepods.slice/kubepods-pod1.slice/petrel-<id>.scope`),
//! making and removing go to systemd. runc makes and removes a container's
//! scope itself (`--systemd-cgroup`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};

use petrel_oci::cgroups::{CgroupError, CgroupMetrics, CgroupStats, CgroupVersion};

use super::cgroups::CgroupOps;

/// What the runtime asks of systemd.
pub trait SystemdUnits: Send + Sync + std::fmt::Debug {
    /// Starts slice `name` (systemd makes slices from their names alone,
    /// with their parent slices).
    fn start_slice(&self, name: &str) -> Result<(), String>;

    /// Stops unit `name` and forgets it if it failed; a unit systemd does
    /// not know is fine.
    fn stop_unit(&self, name: &str) -> Result<(), String>;

    /// The unit's `Result` (`success`, `oom-kill`, ...), if systemd knows
    /// the unit.
    fn unit_result(&self, name: &str) -> Option<String>;
}

/// `systemctl`, talking to the host's systemd.
#[derive(Debug, Clone)]
pub struct Systemctl {
    binary: PathBuf,
}

impl Default for Systemctl {
    fn default() -> Self {
        Self {
            binary: PathBuf::from("systemctl"),
        }
    }
}

/// systemctl's exit status for a unit it does not know (LSB "not
/// installed").
const NO_SUCH_UNIT: i32 = 5;

impl Systemctl {
    fn run(&self, args: &[&str], name: &str) -> Result<(i32, String, String), String> {
        // `--` first: a name is never taken for an option.
        let out = Command::new(&self.binary)
            .args(args)
            .arg("--")
            .arg(name)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run {} {}: {e}", self.binary.display(), args.join(" ")))?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

impl SystemdUnits for Systemctl {
    fn start_slice(&self, name: &str) -> Result<(), String> {
        match self.run(&["start"], name)? {
            (0, _, _) => Ok(()),
            (code, _, err) => Err(format!("systemctl start {name}: exit {code}: {err}")),
        }
    }

    fn stop_unit(&self, name: &str) -> Result<(), String> {
        match self.run(&["stop"], name)? {
            (0, _, _) | (NO_SUCH_UNIT, _, _) => {}
            (code, _, err) => return Err(format!("systemctl stop {name}: exit {code}: {err}")),
        }
        // A failed unit (an OOM kill) stays loaded until this; not failed
        // or unknown is an error that changes nothing.
        let _ = self.run(&["reset-failed"], name);
        Ok(())
    }

    fn unit_result(&self, name: &str) -> Option<String> {
        let (code, out, _) = self
            .run(&["show", "-p", "LoadState", "-p", "Result"], name)
            .ok()?;
        let value = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_string)
        };
        if code != 0 || value("LoadState").as_deref() != Some("loaded") {
            return None;
        }
        value("Result").filter(|r| !r.is_empty())
    }
}

/// The [`CgroupOps`] of the systemd driver; see the module's documentation.
#[derive(Debug)]
pub struct SystemdCgroups {
    inner: Arc<dyn CgroupOps>,
    units: Arc<dyn SystemdUnits>,
    root: PathBuf,
    /// By container cgroup: its pod's `oom_kill` count (hierarchical)
    /// when it was started.
    oom_baselines: Mutex<HashMap<String, u64>>,
}

impl SystemdCgroups {
    /// Reads through `inner`, units through `units`; `root` is the cgroup2
    /// mount (`/sys/fs/cgroup`).
    pub fn new(inner: Arc<dyn CgroupOps>, units: Arc<dyn SystemdUnits>, root: PathBuf) -> Self {
        Self {
            inner,
            units,
            root,
            oom_baselines: Mutex::new(HashMap::new()),
        }
    }

    fn baselines(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        // A map of counts stays valid after a panic elsewhere.
        self.oom_baselines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn dir(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

/// The parent of cgroup `path`.
fn parent_of(path: &str) -> &str {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((parent, _)) => parent,
    }
}

/// The unit a cgroup is: its last component, when it names a slice or a
/// scope.
fn unit_of(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    (name.ends_with(".slice") || name.ends_with(".scope")).then_some(name)
}

fn systemd_error(path: &Path, op: &'static str, why: String) -> CgroupError {
    CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source: std::io::Error::other(why),
    }
}

impl CgroupOps for SystemdCgroups {
    fn version(&self) -> CgroupVersion {
        self.inner.version()
    }

    /// Starts the pod's slice when it is not there (a kubelet makes its
    /// pods' slices before RunPodSandbox; a pod without a parent gets one
    /// of the runtime's); returns its directory when it was started here.
    fn ensure_dirs(&self, path: &str) -> Result<Vec<PathBuf>, CgroupError> {
        let dir = self.dir(path);
        if dir.is_dir() {
            return Ok(Vec::new());
        }
        let slice = match unit_of(&dir) {
            Some(s) if s.ends_with(".slice") => s.to_string(),
            _ => {
                return Err(CgroupError::InvalidPath {
                    path: path.to_string(),
                    reason: "the systemd driver makes slices only",
                })
            }
        };
        petrel_oci::cgroups::systemd::check_slice(&slice)
            .map_err(|e| systemd_error(&dir, "start the slice of", e.to_string()))?;
        self.units
            .start_slice(&slice)
            .map_err(|e| systemd_error(&dir, "start the slice of", e))?;
        if !dir.is_dir() {
            return Err(systemd_error(
                &dir,
                "find",
                format!("systemd started {slice} but made no such cgroup"),
            ));
        }
        Ok(vec![dir])
    }

    fn cgroup_of_dir(&self, dir: &Path) -> Option<String> {
        self.inner.cgroup_of_dir(dir)
    }

    /// Stops the units the directories are, deepest first (systemd
    /// removes their cgroups).
    fn remove_created(&self, dirs: &[PathBuf]) -> Result<(), (Vec<PathBuf>, CgroupError)> {
        for (i, dir) in dirs.iter().enumerate().rev() {
            let stopped = match unit_of(dir) {
                Some(unit) => self.units.stop_unit(unit),
                None => Err("not a systemd unit's cgroup".to_string()),
            };
            if let Err(e) = stopped {
                return Err((
                    dirs[..=i].to_vec(),
                    systemd_error(dir, "stop the unit of", e),
                ));
            }
        }
        Ok(())
    }

    /// Stops the unit the cgroup is, then removes what is left of it
    /// (missing is fine).
    fn remove(&self, path: &str) -> Result<(), CgroupError> {
        let dir = self.dir(path);
        if let Some(unit) = unit_of(&dir) {
            self.units
                .stop_unit(unit)
                .map_err(|e| systemd_error(&dir, "stop the unit of", e))?;
        }
        self.baselines().remove(path);
        self.inner.remove(path)
    }

    fn release_memory(&self, path: &str) -> Result<(), CgroupError> {
        self.inner.release_memory(path)
    }

    /// From `memory.events` while the cgroup is there. systemd removes a
    /// scope's cgroup, and forgets the scope, as soon as its last process
    /// is gone, which an OOM-killed init is: then the scope's `Result`
    /// (`oom-kill`) if systemd still has it, else whether the pod's
    /// hierarchical `oom_kill` grew since the container was started (an
    /// OOM kill in the pod, most likely this container's; unknown for a
    /// container started before the runtime's last restart). Only a
    /// fallback: an exit is decided by the shim's own finding
    /// (`ExitRecord::oom_killed`, read from the scope's `memory.events`
    /// while it was there) whenever the shim made one.
    fn oom_kill_count(&self, path: &str) -> Option<u64> {
        if let Some(n) = self.inner.oom_kill_count(path) {
            return Some(n);
        }
        let dir = self.dir(path);
        if let Some(result) = unit_of(&dir).and_then(|u| self.units.unit_result(u)) {
            return Some(u64::from(result == "oom-kill"));
        }
        let before = *self.baselines().get(path)?;
        let now = self.inner.oom_kill_count(parent_of(path))?;
        Some(u64::from(now > before))
    }

    fn container_starting(&self, path: &str) {
        let count = self.inner.oom_kill_count(parent_of(path)).unwrap_or(0);
        self.baselines().insert(path.to_string(), count);
    }

    fn stats(&self, path: &str) -> Result<CgroupStats, CgroupError> {
        self.inner.stats(path)
    }

    fn metrics(&self, path: &str) -> Result<CgroupMetrics, CgroupError> {
        self.inner.metrics(path)
    }

    fn procs(&self, path: &str) -> Result<Vec<u32>, CgroupError> {
        self.inner.procs(path)
    }

    fn warm_up_migration(&self) {
        self.inner.warm_up_migration();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// systemd as far as these tests need it: started slices get their
    /// directory under the root, stopped units lose it.
    #[derive(Debug, Default)]
    struct FakeUnits {
        root: PathBuf,
        calls: Mutex<Vec<String>>,
        results: Mutex<Vec<(String, String)>>,
        fail: Mutex<bool>,
    }

    impl FakeUnits {
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
    }

    impl SystemdUnits for FakeUnits {
        fn start_slice(&self, name: &str) -> Result<(), String> {
            self.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("start {name}"));
            if *self.fail.lock().unwrap_or_else(|e| e.into_inner()) {
                return Err("Access denied".into());
            }
            let path =
                petrel_oci::cgroups::systemd::expand_slice(name).map_err(|e| e.to_string())?;
            std::fs::create_dir_all(self.root.join(path.trim_start_matches('/')))
                .map_err(|e| e.to_string())
        }

        fn stop_unit(&self, name: &str) -> Result<(), String> {
            self.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(format!("stop {name}"));
            Ok(())
        }

        fn unit_result(&self, name: &str) -> Option<String> {
            let r = self.results.lock().unwrap_or_else(|e| e.into_inner());
            r.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
        }
    }

    fn setup() -> (
        tempfile::TempDir,
        Arc<FakeUnits>,
        Arc<crate::parts::fake::FakeHost>,
        SystemdCgroups,
    ) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let units = Arc::new(FakeUnits {
            root: dir.path().to_path_buf(),
            ..FakeUnits::default()
        });
        let host = Arc::new(crate::parts::fake::FakeHost::default());
        let cg = SystemdCgroups::new(host.clone(), units.clone(), dir.path().to_path_buf());
        (dir, units, host, cg)
    }

    #[test]
    fn ensure_dirs_should_start_a_missing_slice_and_leave_an_existing_one() {
        let (dir, units, _, cg) = setup();
        let made = cg
            .ensure_dirs("/petrel.slice/petrel-ab.slice")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(made, vec![dir.path().join("petrel.slice/petrel-ab.slice")]);
        assert_eq!(units.calls(), vec!["start petrel-ab.slice"]);
        // A kubelet's slice, there already: nothing started, nothing owned.
        std::fs::create_dir_all(dir.path().join("kubepods.slice/kubepods-pod1.slice"))
            .unwrap_or_else(|e| panic!("{e}"));
        let made = cg
            .ensure_dirs("/kubepods.slice/kubepods-pod1.slice")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(made.is_empty());
        assert_eq!(units.calls().len(), 1);
    }

    #[test]
    fn ensure_dirs_should_name_the_slice_when_systemd_refuses() {
        let (_dir, units, _, cg) = setup();
        *units.fail.lock().unwrap_or_else(|e| e.into_inner()) = true;
        let e = cg
            .ensure_dirs("/petrel.slice/petrel-ab.slice")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("petrel-ab.slice") && e.contains("Access denied"),
            "{e}"
        );
        let e = cg.ensure_dirs("/petrel/ab").unwrap_err().to_string();
        assert!(e.contains("slices only"), "{e}");
    }

    #[test]
    fn removals_should_stop_the_units() {
        let (dir, units, _, cg) = setup();
        let made = cg
            .ensure_dirs("/petrel.slice/petrel-ab.slice")
            .unwrap_or_else(|e| panic!("{e}"));
        cg.remove_created(&made)
            .unwrap_or_else(|(_, e)| panic!("{e}"));
        cg.remove("/petrel.slice/petrel-ab.slice/petrel-c1.scope")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            units.calls(),
            vec![
                "start petrel-ab.slice",
                "stop petrel-ab.slice",
                "stop petrel-c1.scope"
            ]
        );
        let e = cg.remove_created(&[dir.path().join("plain")]).unwrap_err();
        assert_eq!(e.0, vec![dir.path().join("plain")]);
    }

    #[test]
    fn oom_kills_should_come_from_the_scope_once_its_cgroup_is_gone() {
        let (_dir, units, host, cg) = setup();
        let scope = "/petrel.slice/petrel-ab.slice/petrel-c1.scope";
        assert_eq!(cg.oom_kill_count(scope), None);
        units
            .results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(("petrel-c1.scope".into(), "oom-kill".into()));
        assert_eq!(cg.oom_kill_count(scope), Some(1));
        units.results.lock().unwrap_or_else(|e| e.into_inner())[0].1 = "success".into();
        assert_eq!(cg.oom_kill_count(scope), Some(0));
        // The file wins while the cgroup is there.
        host.set_oom_kills(scope, 2);
        assert_eq!(cg.oom_kill_count(scope), Some(2));
    }

    #[test]
    fn oom_kills_should_come_from_the_pods_count_once_systemd_forgot_the_scope() {
        let (_dir, _units, host, cg) = setup();
        let pod = "/petrel.slice/petrel-ab.slice";
        let scope = "/petrel.slice/petrel-ab.slice/petrel-c1.scope";
        host.set_oom_kills(pod, 3);
        cg.container_starting(scope);
        // Started, then gone without an OOM kill in the pod.
        assert_eq!(cg.oom_kill_count(scope), Some(0));
        host.set_oom_kills(pod, 4);
        assert_eq!(cg.oom_kill_count(scope), Some(1));
        // Unknown for a container this runtime did not start.
        assert_eq!(
            cg.oom_kill_count("/petrel.slice/petrel-ab.slice/petrel-c2.scope"),
            None
        );
        assert_eq!(parent_of("/a.slice"), "/");
    }
}

/// The runtime on the systemd driver, over the fake host: what it asks of
/// runc and what it keeps.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod driver_tests {
    use petrel_cri::api;

    use crate::config::CgroupDriver;
    use crate::parts::fake::{pod_config, TestRuntime};

    fn systemd_runtime() -> TestRuntime {
        TestRuntime::with_config(|c| {
            c.cgroup_driver = CgroupDriver::Systemd;
            c.default_cgroup_parent = crate::config::DEFAULT_CGROUP_PARENT.into();
        })
    }

    async fn pod_in(t: &TestRuntime, name: &str, parent: &str) -> crate::error::Result<String> {
        let mut config = pod_config(name);
        if let Some(l) = config.linux.as_mut() {
            l.cgroup_parent = parent.to_string();
        }
        t.rt.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .map(|r| r.pod_sandbox_id)
    }

    #[tokio::test]
    async fn runtime_config_should_say_systemd() {
        let t = systemd_runtime();
        let got =
            t.rt.runtime_config(api::RuntimeConfigRequest {})
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            got.linux.map(|l| l.cgroup_driver),
            Some(api::CgroupDriver::Systemd as i32)
        );
    }

    #[tokio::test]
    async fn a_container_should_be_a_scope_in_the_kubelets_slice() {
        let t = systemd_runtime();
        let pod = pod_in(&t, "p", "kubepods-burstable-pod1_2.slice")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let parent =
            t.rt.sandbox(&pod)
                .unwrap_or_else(|e| panic!("{e}"))
                .with(|r| r.cgroup_parent.clone());
        assert_eq!(
            parent,
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"
        );
        let id = t.create(&pod, "c").await.unwrap_or_else(|e| panic!("{e}"));
        let bundle =
            t.rt.container(&id)
                .unwrap_or_else(|e| panic!("{e}"))
                .with(|r| r.bundle.clone());
        let spec: serde_json::Value = serde_json::from_slice(
            &std::fs::read(bundle.join("config.json")).unwrap_or_else(|e| panic!("{e}")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            spec["linux"]["cgroupsPath"],
            format!("kubepods-burstable-pod1_2.slice:petrel:{id}")
        );
        let kept =
            t.rt.container(&id)
                .unwrap_or_else(|e| panic!("{e}"))
                .with(|r| r.cgroup_path.clone());
        assert_eq!(kept, format!("{parent}/petrel-{id}.scope"));
    }

    #[tokio::test]
    async fn a_pod_without_a_parent_should_get_a_slice_under_petrel_slice() {
        let t = systemd_runtime();
        let pod = pod_in(&t, "p", "").await.unwrap_or_else(|e| panic!("{e}"));
        let parent =
            t.rt.sandbox(&pod)
                .unwrap_or_else(|e| panic!("{e}"))
                .with(|r| r.cgroup_parent.clone());
        assert_eq!(parent, format!("/petrel.slice/petrel-{pod}.slice"));
    }

    #[tokio::test]
    async fn a_parent_of_the_other_drivers_form_should_be_refused_without_debris() {
        let t = systemd_runtime();
        let e = pod_in(&t, "p", "/kubepods/burstable/pod1")
            .await
            .unwrap_err();
        let status = tonic::Status::from(e);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("config.linux.cgroup_parent")
                && status.message().contains("systemd cgroup driver"),
            "{}",
            status.message()
        );
        assert!(t.rt.state.sandboxes().is_empty());
        let fs = TestRuntime::new();
        let e = pod_in(&fs, "p", "kubepods-pod1.slice").await.unwrap_err();
        let status = tonic::Status::from(e);
        assert!(
            status.message().contains("cgroupfs cgroup driver"),
            "{}",
            status.message()
        );
    }
}
