//! The systemd cgroup driver's side of [`CgroupHost`]: QoS and pod cgroups
//! are slice units, made, changed and stopped through systemd (behind
//! [`SystemdBus`], so the logic is tested without a bus), with the unit
//! properties runc's systemd driver gives a slice for kubelet.
//!
//! A cgroup is named by its expanded cgroupfs path (see
//! [`super::naming`]); its unit is the path's last part, its parent slice
//! the one before. What systemd does not say (whether a cgroup exists,
//! whether it still holds processes or children) is read from cgroupfs.

use std::sync::Arc;

use petrel_oci::cgroups::{CgroupVersion, Cgroups};

use super::config::ResourceConfig;
use super::host::{shares_to_weight, CgroupHost, HostCgroups, HostError};
use super::naming::slice_unit;

/// systemd's "infinity" for a `t` property (no limit).
pub const INFINITY: u64 = u64::MAX;

/// One unit property's value, in the D-Bus types systemd expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PropValue {
    /// `b`.
    Bool(bool),
    /// `t`.
    U64(u64),
    /// `s`.
    Str(String),
    /// `as`.
    StrList(Vec<String>),
}

/// A unit property: name and value.
pub type Prop = (&'static str, PropValue);

/// What went wrong talking to systemd; each names the unit.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The system bus could not be reached.
    #[error("systemd's bus at {address}: {message}")]
    Connect {
        /// The bus address.
        address: String,
        /// The D-Bus error.
        message: String,
    },
    /// A method call failed (the D-Bus error name and message).
    #[error("systemd {method} of unit {unit}: {message}")]
    Call {
        /// The Manager method.
        method: &'static str,
        /// The unit.
        unit: String,
        /// The D-Bus error.
        message: String,
    },
    /// The unit's job ended otherwise than `done`.
    #[error("systemd job {method} of unit {unit} ended with result {result:?}")]
    Job {
        /// The Manager method that queued the job.
        method: &'static str,
        /// The unit.
        unit: String,
        /// systemd's job result (`failed`, `canceled`, `timeout`...).
        result: String,
    },
    /// The unit's job did not end in time.
    #[error("systemd job {method} of unit {unit} did not end within {secs} s")]
    Timeout {
        /// The Manager method that queued the job.
        method: &'static str,
        /// The unit.
        unit: String,
        /// The wait, seconds.
        secs: u64,
    },
}

/// The calls on `org.freedesktop.systemd1.Manager` the driver makes. Each
/// that queues a job returns once the job has ended.
pub trait SystemdBus: Send + Sync {
    /// StartTransientUnit(`unit`, "replace", `props`) and waits for its
    /// job; a unit that exists already is success (as runc has it).
    fn start_unit(&self, unit: &str, props: Vec<Prop>) -> Result<(), SystemdError>;
    /// SetUnitProperties(`unit`, runtime, `props`).
    fn set_properties(&self, unit: &str, props: Vec<Prop>) -> Result<(), SystemdError>;
    /// StopUnit(`unit`, "replace") and waits for its job; a unit systemd
    /// does not know is success. A failed unit is reset.
    fn stop_unit(&self, unit: &str) -> Result<(), SystemdError>;
}

/// The properties a new slice gets beside its values (runc's for a slice
/// made for kubelet): its parent through `Wants=`, every accounting on so
/// the slice has every controller, and no default dependencies.
pub fn slice_props(parent: &str, unit: &str) -> Vec<Prop> {
    vec![
        (
            "Description",
            PropValue::Str(format!("Petrel agent's slice {unit}")),
        ),
        ("Wants", PropValue::StrList(vec![parent.to_string()])),
        ("MemoryAccounting", PropValue::Bool(true)),
        ("CPUAccounting", PropValue::Bool(true)),
        ("IOAccounting", PropValue::Bool(true)),
        ("TasksAccounting", PropValue::Bool(true)),
        ("DefaultDependencies", PropValue::Bool(false)),
    ]
}

/// `quota` µs per `period` µs as systemd's `CPUQuotaPerSecUSec` (runc's
/// conversion): none or ≤ 0 is infinity; else rounded up to whole 10 ms,
/// systemd's granularity (it would otherwise round down).
pub fn quota_per_sec(quota: Option<i64>, period: Option<u64>) -> u64 {
    match quota {
        Some(q) if q > 0 => {
            let period = period.filter(|p| *p > 0).unwrap_or(100_000);
            let per_sec = (q as u64).saturating_mul(1_000_000) / period;
            per_sec.div_ceil(10_000).saturating_mul(10_000)
        }
        _ => INFINITY,
    }
}

/// The unit properties `config` becomes on a host of `version`: v2's
/// `CPUWeight`/`MemoryMax`, v1's `CPUShares`/`MemoryLimit`; the quota and
/// `TasksMax` on both. A limit ≤ 0 (pids) or < 0 (memory) is infinity.
pub fn properties(version: CgroupVersion, config: &ResourceConfig) -> Vec<Prop> {
    let mut out: Vec<Prop> = Vec::new();
    let v2 = version == CgroupVersion::V2;
    if let Some(s) = config.cpu_shares {
        if v2 {
            out.push(("CPUWeight", PropValue::U64(shares_to_weight(s))));
        } else {
            out.push(("CPUShares", PropValue::U64(s)));
        }
    }
    if config.cpu_quota.is_some() || config.cpu_period.is_some() {
        if let Some(p) = config.cpu_period.filter(|p| *p > 0) {
            out.push(("CPUQuotaPeriodUSec", PropValue::U64(p)));
        }
        out.push((
            "CPUQuotaPerSecUSec",
            PropValue::U64(quota_per_sec(config.cpu_quota, config.cpu_period)),
        ));
    }
    if let Some(m) = config.memory {
        let value = u64::try_from(m).unwrap_or(INFINITY);
        let name = if v2 { "MemoryMax" } else { "MemoryLimit" };
        out.push((name, PropValue::U64(value)));
    }
    if let Some(p) = config.pids {
        let value = u64::try_from(p).ok().filter(|p| *p > 0).unwrap_or(INFINITY);
        out.push(("TasksMax", PropValue::U64(value)));
    }
    out
}

/// [`CgroupHost`] over systemd: paths are slices' expanded paths.
pub struct SystemdCgroups {
    bus: Arc<dyn SystemdBus>,
    /// Existence and busyness, read from cgroupfs.
    fs: HostCgroups,
    version: CgroupVersion,
}

impl SystemdCgroups {
    /// The calls go to `bus`; `cgroups` is read for what systemd does not
    /// say.
    pub fn new(bus: Arc<dyn SystemdBus>, cgroups: Cgroups) -> Self {
        let version = cgroups.version();
        Self {
            bus,
            fs: HostCgroups::new(cgroups),
            version,
        }
    }

    fn unit(path: &str) -> Result<(String, String), HostError> {
        slice_unit(path).ok_or_else(|| HostError::NotASlice(path.to_string()))
    }
}

impl CgroupHost for SystemdCgroups {
    fn exists(&self, path: &str) -> bool {
        self.fs.exists(path)
    }

    fn create(&self, path: &str) -> Result<(), HostError> {
        let (unit, parent) = Self::unit(path)?;
        // systemd makes the parent slices a slice's name implies.
        self.bus.start_unit(&unit, slice_props(&parent, &unit))?;
        Ok(())
    }

    fn apply(&self, path: &str, config: &ResourceConfig) -> Result<(), HostError> {
        let (unit, _) = Self::unit(path)?;
        let props = properties(self.version, config);
        if props.is_empty() {
            return Ok(());
        }
        self.bus.set_properties(&unit, props)?;
        Ok(())
    }

    fn remove(&self, path: &str) -> Result<(), HostError> {
        let (unit, _) = Self::unit(path)?;
        // Stopping a slice stops everything in it: a slice that still has
        // processes or children (the runtime's scopes) is left alone.
        if self.fs.busy(path) {
            return Err(HostError::Busy(path.to_string()));
        }
        self.bus.stop_unit(&unit)?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::desired;
    use crate::qos_cgroups::host::tests::full;
    use crate::qos_cgroups::naming::{expand_slice, CgroupDriver, CgroupLayout};
    use crate::qos_cgroups::QosCgroups;
    use crate::types::DesiredPod;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    /// One call on the fake bus.
    #[derive(Debug, Clone, PartialEq)]
    enum Call {
        Start(String, Vec<Prop>),
        Set(String, Vec<Prop>),
        Stop(String),
    }

    /// systemd in memory: records the calls, and, as systemd would, makes
    /// a started slice's directory (and its parents') in a temporary
    /// cgroup2 tree and removes a stopped one's.
    struct FakeBus {
        root: PathBuf,
        calls: Mutex<Vec<Call>>,
        /// A D-Bus error for every call on this unit.
        refuse: Mutex<Option<String>>,
    }

    impl FakeBus {
        fn dir(&self, unit: &str) -> PathBuf {
            let parts: Vec<String> = unit
                .trim_end_matches(".slice")
                .split('-')
                .map(str::to_string)
                .collect();
            self.root.join(expand_slice(&parts).trim_start_matches('/'))
        }
        fn refused(&self, method: &'static str, unit: &str) -> Result<(), SystemdError> {
            match self.refuse.lock().unwrap().as_deref() {
                Some(u) if u == unit => Err(SystemdError::Call {
                    method,
                    unit: unit.to_string(),
                    message: "org.freedesktop.DBus.Error.AccessDenied: no".into(),
                }),
                _ => Ok(()),
            }
        }
        fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap().clone()
        }
        fn last_set(&self, unit: &str) -> Vec<Prop> {
            self.calls()
                .into_iter()
                .rev()
                .find_map(|c| match c {
                    Call::Set(u, p) if u == unit => Some(p),
                    _ => None,
                })
                .unwrap_or_default()
        }
    }

    impl SystemdBus for FakeBus {
        fn start_unit(&self, unit: &str, props: Vec<Prop>) -> Result<(), SystemdError> {
            self.refused("StartTransientUnit", unit)?;
            std::fs::create_dir_all(self.dir(unit)).unwrap();
            self.calls
                .lock()
                .unwrap()
                .push(Call::Start(unit.into(), props));
            Ok(())
        }
        fn set_properties(&self, unit: &str, props: Vec<Prop>) -> Result<(), SystemdError> {
            self.refused("SetUnitProperties", unit)?;
            self.calls
                .lock()
                .unwrap()
                .push(Call::Set(unit.into(), props));
            Ok(())
        }
        fn stop_unit(&self, unit: &str) -> Result<(), SystemdError> {
            self.refused("StopUnit", unit)?;
            let _ = std::fs::remove_dir(self.dir(unit));
            self.calls.lock().unwrap().push(Call::Stop(unit.into()));
            Ok(())
        }
    }

    struct Setup {
        _dir: tempfile::TempDir,
        root: PathBuf,
        bus: Arc<FakeBus>,
        qos: QosCgroups,
    }

    fn setup(version: CgroupVersion, records: Option<&Path>) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cg");
        std::fs::create_dir_all(&root).unwrap();
        let cgroups = match version {
            CgroupVersion::V2 => {
                std::fs::write(root.join("cgroup.controllers"), "cpu memory pids").unwrap();
                Cgroups::v2_at(&root)
            }
            CgroupVersion::V1 => {
                // One hierarchy holding them all, enough to find paths.
                let info = format!(
                    "30 1 0:30 / {} rw - cgroup cgroup rw,cpu,memory,pids\n",
                    root.display()
                );
                Cgroups::v1_from_mountinfo(&info).unwrap()
            }
        };
        let bus = Arc::new(FakeBus {
            root: root.clone(),
            calls: Mutex::new(Vec::new()),
            refuse: Mutex::new(None),
        });
        let host = Arc::new(SystemdCgroups::new(bus.clone(), cgroups));
        let layout = CgroupLayout::new(CgroupDriver::Systemd, "/").unwrap();
        let qos = QosCgroups::new(host, layout, 100, records.map(Path::to_path_buf));
        Setup {
            _dir: dir,
            root,
            bus,
            qos,
        }
    }

    fn pod(uid: &str, resources: &str) -> DesiredPod {
        let mut d = desired(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p-{uid}, namespace: default}}\nspec:\n  containers:\n  - name: c\n    image: busybox\n{resources}"
        ));
        d.uid = uid.to_string();
        d
    }

    const GUARANTEED: &str = "    resources: {limits: {cpu: 500m, memory: 64Mi}}\n";
    const BURSTABLE: &str =
        "    resources: {requests: {cpu: 200m, memory: 16Mi}, limits: {memory: 32Mi}}\n";

    fn get(props: &[Prop], name: &str) -> Option<PropValue> {
        props
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    }

    #[test]
    fn qos_slices_should_be_started_with_their_weights() {
        let s = setup(CgroupVersion::V2, None);
        s.qos.start(2000).unwrap();
        let starts: Vec<(String, Option<PropValue>)> = s
            .bus
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Start(u, p) => Some((u, get(&p, "Wants"))),
                _ => None,
            })
            .collect();
        let wants = |p: &str| Some(PropValue::StrList(vec![p.to_string()]));
        assert_eq!(
            starts,
            vec![
                ("kubepods.slice".to_string(), wants("-.slice")),
                (
                    "kubepods-besteffort.slice".to_string(),
                    wants("kubepods.slice")
                ),
                (
                    "kubepods-burstable.slice".to_string(),
                    wants("kubepods.slice")
                ),
            ]
        );
        // 2 cpus: 2048 shares, weight 79; the tiers the minimum.
        assert_eq!(
            s.bus.last_set("kubepods.slice"),
            vec![("CPUWeight", PropValue::U64(79))]
        );
        assert_eq!(
            s.bus.last_set("kubepods-besteffort.slice"),
            vec![("CPUWeight", PropValue::U64(1))]
        );
        assert_eq!(
            s.bus.last_set("kubepods-burstable.slice"),
            vec![("CPUWeight", PropValue::U64(1))]
        );
        assert!(s
            .root
            .join("kubepods.slice/kubepods-burstable.slice")
            .is_dir());
    }

    #[test]
    fn pod_slices_should_get_each_qos_class_values() {
        let s = setup(CgroupVersion::V2, None);
        s.qos.start(2000).unwrap();
        s.qos.ensure_pod(&pod("g-1", GUARANTEED)).unwrap();
        s.qos.ensure_pod(&pod("b-1", BURSTABLE)).unwrap();
        s.qos.ensure_pod(&pod("e-1", "")).unwrap();
        // Guaranteed: in kubepods.slice, shares, quota, memory and pids.
        let g = s.bus.last_set("kubepods-podg_1.slice");
        assert_eq!(get(&g, "CPUWeight"), Some(PropValue::U64(20)));
        assert_eq!(get(&g, "CPUQuotaPerSecUSec"), Some(PropValue::U64(500_000)));
        assert_eq!(get(&g, "MemoryMax"), Some(PropValue::U64(64 << 20)));
        assert_eq!(get(&g, "TasksMax"), Some(PropValue::U64(100)));
        // Burstable: its memory limit, no quota (no cpu limit).
        let b = s.bus.last_set("kubepods-burstable-podb_1.slice");
        assert_eq!(get(&b, "CPUWeight"), Some(PropValue::U64(8)));
        assert_eq!(get(&b, "CPUQuotaPerSecUSec"), None);
        assert_eq!(get(&b, "MemoryMax"), Some(PropValue::U64(32 << 20)));
        // BestEffort: the minimum weight.
        let e = s.bus.last_set("kubepods-besteffort-pode_1.slice");
        assert_eq!(get(&e, "CPUWeight"), Some(PropValue::U64(1)));
        assert_eq!(get(&e, "MemoryMax"), None);
        // The burstable tier weighs its pod's request; the pod's slice
        // wants its tier and is where the runtime will find it.
        assert_eq!(
            s.bus.last_set("kubepods-burstable.slice"),
            vec![("CPUWeight", PropValue::U64(8))]
        );
        assert!(s.bus.calls().contains(&Call::Start(
            "kubepods-burstable-podb_1.slice".into(),
            slice_props(
                "kubepods-burstable.slice",
                "kubepods-burstable-podb_1.slice"
            )
        )));
        assert!(s
            .root
            .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb_1.slice")
            .is_dir());
    }

    #[test]
    fn v1_slices_should_get_shares_and_memory_limit() {
        let s = setup(CgroupVersion::V1, None);
        s.qos.start(1000).unwrap();
        s.qos.ensure_pod(&pod("g", GUARANTEED)).unwrap();
        assert_eq!(
            s.bus.last_set("kubepods.slice"),
            vec![("CPUShares", PropValue::U64(1024))]
        );
        let g = s.bus.last_set("kubepods-podg.slice");
        assert_eq!(get(&g, "CPUShares"), Some(PropValue::U64(512)));
        assert_eq!(get(&g, "MemoryLimit"), Some(PropValue::U64(64 << 20)));
        assert_eq!(get(&g, "MemoryMax"), None);
    }

    #[test]
    fn a_pod_slice_should_be_stopped_after_the_pod_and_never_while_busy() {
        let s = setup(CgroupVersion::V2, None);
        s.qos.start(2000).unwrap();
        s.qos.ensure_pod(&pod("e", "")).unwrap();
        let unit = "kubepods-besteffort-pode.slice";
        let dir = s
            .root
            .join("kubepods.slice/kubepods-besteffort.slice")
            .join(unit);
        // The runtime's container scope inside: the slice is busy.
        std::fs::create_dir(dir.join("petrel-abc.scope")).unwrap();
        s.qos.forget_pod("e");
        assert!(!s.bus.calls().contains(&Call::Stop(unit.into())));
        assert!(dir.is_dir());
        std::fs::remove_dir(dir.join("petrel-abc.scope")).unwrap();
        s.qos.resync();
        assert!(s.bus.calls().contains(&Call::Stop(unit.into())));
        assert!(!dir.exists());
        assert!(s.qos.owned().is_empty());
        // The tiers stay.
        assert!(!s
            .bus
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Stop(u) if u == "kubepods-besteffort.slice")));
    }

    #[test]
    fn a_restarted_agent_should_stop_the_slices_it_recorded() {
        let records = tempfile::tempdir().unwrap();
        let s = setup(CgroupVersion::V2, Some(records.path()));
        s.qos.start(2000).unwrap();
        s.qos.ensure_pod(&pod("b", BURSTABLE)).unwrap();
        let recorded = std::fs::read_to_string(records.path().join("b")).unwrap();
        assert_eq!(
            recorded,
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podb.slice"
        );
        // A new agent over the same bus: the pod is gone meanwhile.
        let host = Arc::new(SystemdCgroups::new(s.bus.clone(), Cgroups::v2_at(&s.root)));
        let layout = CgroupLayout::new(CgroupDriver::Systemd, "/").unwrap();
        let again = QosCgroups::new(host, layout, -1, Some(records.path().to_path_buf()));
        assert_eq!(again.owned().len(), 1);
        again.start(2000).unwrap();
        again.resync();
        assert!(s
            .bus
            .calls()
            .contains(&Call::Stop("kubepods-burstable-podb.slice".into())));
        assert!(!records.path().join("b").exists());
        // A record of the cgroupfs layout names nothing to stop here.
        std::fs::write(records.path().join("x"), "/kubepods/besteffort/podx").unwrap();
        let host = Arc::new(SystemdCgroups::new(s.bus.clone(), Cgroups::v2_at(&s.root)));
        let layout = CgroupLayout::new(CgroupDriver::Systemd, "/").unwrap();
        assert!(
            QosCgroups::new(host, layout, -1, Some(records.path().to_path_buf()))
                .owned()
                .is_empty()
        );
    }

    #[test]
    fn systemd_errors_should_name_the_unit_and_carry_the_dbus_error() {
        let s = setup(CgroupVersion::V2, None);
        s.qos.start(2000).unwrap();
        *s.bus.refuse.lock().unwrap() = Some("kubepods-podg.slice".into());
        let err = s
            .qos
            .ensure_pod(&pod("g", GUARANTEED))
            .unwrap_err()
            .to_string();
        assert!(err.contains("kubepods-podg.slice"), "{err}");
        assert!(err.contains("AccessDenied"), "{err}");
        assert!(err.contains("StartTransientUnit"), "{err}");
        // A path that is no slice is refused before any call.
        let host = SystemdCgroups::new(s.bus.clone(), Cgroups::v2_at(&s.root));
        let before = s.bus.calls().len();
        let err = host.create("/petrel/kubepods").unwrap_err().to_string();
        assert!(err.contains("/petrel/kubepods"), "{err}");
        assert_eq!(s.bus.calls().len(), before);
    }

    #[test]
    fn quota_should_be_per_second_rounded_up_to_10ms() {
        assert_eq!(quota_per_sec(Some(25_000), Some(100_000)), 250_000);
        assert_eq!(quota_per_sec(Some(1_000), Some(100_000)), 10_000);
        assert_eq!(quota_per_sec(Some(1_500), Some(100_000)), 20_000);
        assert_eq!(quota_per_sec(Some(50_000), None), 500_000);
        assert_eq!(quota_per_sec(Some(-1), Some(100_000)), INFINITY);
        assert_eq!(quota_per_sec(None, Some(100_000)), INFINITY);
    }

    #[test]
    fn v2_properties_should_be_runcs() {
        assert_eq!(
            properties(CgroupVersion::V2, &full()),
            vec![
                ("CPUWeight", PropValue::U64(39)),
                ("CPUQuotaPeriodUSec", PropValue::U64(100_000)),
                ("CPUQuotaPerSecUSec", PropValue::U64(500_000)),
                ("MemoryMax", PropValue::U64(64 << 20)),
                ("TasksMax", PropValue::U64(100)),
            ]
        );
        let open = ResourceConfig {
            memory: Some(-1),
            pids: Some(0),
            cpu_quota: Some(-1),
            ..Default::default()
        };
        assert_eq!(
            properties(CgroupVersion::V2, &open),
            vec![
                ("CPUQuotaPerSecUSec", PropValue::U64(INFINITY)),
                ("MemoryMax", PropValue::U64(INFINITY)),
                ("TasksMax", PropValue::U64(INFINITY)),
            ]
        );
        assert!(properties(CgroupVersion::V2, &ResourceConfig::default()).is_empty());
    }

    #[test]
    fn v1_properties_should_be_shares_and_memory_limit() {
        let names: Vec<&str> = properties(CgroupVersion::V1, &full())
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names,
            [
                "CPUShares",
                "CPUQuotaPeriodUSec",
                "CPUQuotaPerSecUSec",
                "MemoryLimit",
                "TasksMax"
            ]
        );
    }

    #[test]
    fn a_slice_should_want_its_parent_and_account_everything() {
        let p = slice_props("kubepods.slice", "kubepods-besteffort.slice");
        assert!(p.contains(&("Wants", PropValue::StrList(vec!["kubepods.slice".into()]))));
        for a in [
            "MemoryAccounting",
            "CPUAccounting",
            "IOAccounting",
            "TasksAccounting",
        ] {
            assert!(p.contains(&(a, PropValue::Bool(true))), "{a}");
        }
        assert!(p.contains(&("DefaultDependencies", PropValue::Bool(false))));
    }
}
