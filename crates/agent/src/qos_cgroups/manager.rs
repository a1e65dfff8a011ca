//! The QoS cgroup manager: kubelet's QoS and pod container managers, over
//! any [`CgroupHost`] (cgroupfs directories or systemd slices; where each
//! cgroup is comes from the [`CgroupLayout`]).
//!
//! At start it makes `kubepods`, `kubepods/burstable` and
//! `kubepods/besteffort` (with systemd: `kubepods.slice`,
//! `kubepods-burstable.slice`, `kubepods-besteffort.slice`) and writes
//! their cpu shares. Before a pod's first
//! sandbox it counts the pod in its tier (the burstable tier's shares
//! follow its pods' requests) and makes the pod's cgroup with the pod's
//! values, unless that cgroup exists already (kubelet leaves an existing
//! one as it is: an adopted pod keeps what it had). The runtime then finds
//! the cgroup there and makes nothing itself, whichever runtime it is.
//!
//! Only cgroups the agent made are removed, once the pod's sandboxes are
//! gone; each is recorded on disk (`<agent root>/pod-cgroups/<uid>`, its
//! cgroupfs path: a slice's expanded path) so a restarted agent still
//! knows them and removes those left behind. A cgroup that is still busy
//! (processes or children) is kept and tried again at each resync: like
//! kubelet, the agent removes only an empty pod cgroup's directory, and
//! unlike kubelet it kills nothing (the runtime owns the processes).
//!
//! A cgroup error never stops a pod: it is logged once per pod (the
//! runtime still makes the cgroup if the agent could not) and returned.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::config::{
    best_effort_config, burstable_config, pod_config, pod_cpu_request, top_level_config,
};
use super::host::{CgroupHost, HostError};
use super::naming::CgroupLayout;
use crate::convert::{qos_class, QosClass};
use crate::types::DesiredPod;

/// The manager. Cheap to share (`Arc`); every call is short and
/// synchronous (a few small cgroup files).
pub struct QosCgroups {
    host: Arc<dyn CgroupHost>,
    /// Where each cgroup is.
    layout: CgroupLayout,
    /// `--pod-max-pids`: positive is each pod cgroup's `pids.max`.
    pod_pids_limit: i64,
    /// Where the agent records the pod cgroups it made (None: memory only).
    records: Option<PathBuf>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The node's allocatable cpu, millicores, once started.
    allocatable_cpu: Option<i64>,
    /// Pods seen to, by UID: the pod cgroup settled for each.
    pods: HashMap<String, String>,
    /// Cgroups the agent made, by pod UID.
    owned: BTreeMap<String, Vec<String>>,
    /// Burstable pods' cpu requests (millicores), by UID.
    burstable: BTreeMap<String, i64>,
    /// The burstable tier's shares as last written.
    burstable_written: Option<u64>,
    /// Pods whose cgroup failure was logged already.
    warned: HashSet<String>,
    /// Whether a tier's failure was logged already.
    tier_warned: bool,
}

impl QosCgroups {
    /// A manager of the cgroups of `layout`, recording the pod cgroups it
    /// makes in `records` (read back now).
    pub fn new(
        host: Arc<dyn CgroupHost>,
        layout: CgroupLayout,
        pod_pids_limit: i64,
        records: Option<PathBuf>,
    ) -> Self {
        let owned = records
            .as_deref()
            .map(|dir| read_records(dir, &layout))
            .unwrap_or_default();
        Self {
            host,
            layout,
            pod_pids_limit,
            records,
            state: Mutex::new(State {
                owned,
                ..Default::default()
            }),
        }
    }

    /// `kubepods`' cgroupfs path.
    pub fn pods_cgroup(&self) -> String {
        self.layout.pods_cgroup()
    }

    /// Where the cgroups are.
    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    fn tier(&self, qos: QosClass) -> String {
        self.layout.tier(qos)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `kubepods` and the two QoS tiers and writes their values, for
    /// a node of `allocatable_cpu_millis`. The first error, after trying
    /// them all.
    pub fn start(&self, allocatable_cpu_millis: i64) -> Result<(), HostError> {
        let mut st = self.lock();
        st.allocatable_cpu = Some(allocatable_cpu_millis);
        st.burstable_written = None;
        self.write_tiers(&mut st)
    }

    /// Writes every tier again (kubelet does each minute: someone may have
    /// changed them) and tries again to remove the pod cgroups left busy.
    pub fn resync(&self) {
        let mut st = self.lock();
        if st.allocatable_cpu.is_some() {
            st.burstable_written = None;
            let _ = self.write_tiers(&mut st);
        }
        let left: Vec<String> = st
            .owned
            .keys()
            .filter(|uid| !st.pods.contains_key(*uid))
            .cloned()
            .collect();
        for uid in left {
            self.remove_owned(&mut st, &uid);
        }
    }

    fn write_tiers(&self, st: &mut State) -> Result<(), HostError> {
        let mut first = None;
        let mut note = |r: Result<(), HostError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        let top = self.pods_cgroup();
        let cpu = st.allocatable_cpu.unwrap_or(0);
        note(self.ensure_and_apply(&top, &top_level_config(cpu)));
        let be = self.tier(QosClass::BestEffort);
        note(self.ensure_and_apply(&be, &best_effort_config()));
        let bu = self.tier(QosClass::Burstable);
        note(self.host.create(&bu));
        note(self.update_burstable(st));
        match first {
            Some(e) => {
                if !std::mem::replace(&mut st.tier_warned, true) {
                    tracing::warn!(cgroup = %top, error = %e, "QoS cgroups not (fully) written");
                }
                Err(e)
            }
            None => {
                st.tier_warned = false;
                Ok(())
            }
        }
    }

    fn ensure_and_apply(
        &self,
        path: &str,
        config: &super::config::ResourceConfig,
    ) -> Result<(), HostError> {
        self.host.create(path)?;
        self.host.apply(path, config)
    }

    /// Writes the burstable tier's shares when its pods' sum moved.
    fn update_burstable(&self, st: &mut State) -> Result<(), HostError> {
        let sum = st
            .burstable
            .values()
            .fold(0i64, |a, v| a.saturating_add(*v));
        let config = burstable_config(sum);
        if config.cpu_shares == st.burstable_written {
            return Ok(());
        }
        self.host.apply(&self.tier(QosClass::Burstable), &config)?;
        st.burstable_written = config.cpu_shares;
        tracing::debug!(cpu_millis = sum, shares = ?config.cpu_shares, "burstable QoS cgroup updated");
        Ok(())
    }

    /// Before `pod`'s sandbox is made: counts it in its QoS tier and makes
    /// its cgroup with kubelet's values unless it exists. Cheap once done
    /// for this pod. An error is logged once per pod.
    pub fn ensure_pod(&self, pod: &DesiredPod) -> Result<(), HostError> {
        let Some(spec) = pod.pod.spec.as_ref() else {
            return Ok(());
        };
        let uid = pod.uid.as_str();
        let qos = qos_class(spec);
        let path = self.layout.pod_cgroup(uid, qos);
        let mut st = self.lock();
        // The tier first, as kubelet updates it before the pod's cgroup.
        match qos {
            QosClass::Burstable => {
                st.burstable
                    .insert(uid.to_string(), pod_cpu_request(&pod.pod));
            }
            _ => {
                st.burstable.remove(uid);
            }
        }
        let tier = if st.allocatable_cpu.is_some() {
            self.update_burstable(&mut st)
        } else {
            Ok(())
        };
        if st.pods.get(uid) == Some(&path) {
            return tier;
        }
        st.pods.insert(uid.to_string(), path.clone());
        let result = tier.and(self.make_pod_cgroup(&mut st, uid, &path, pod));
        if let Err(e) = &result {
            if st.warned.insert(uid.to_string()) {
                tracing::warn!(uid, pod = %format!("{}/{}", pod.namespace, pod.name), cgroup = %path, error = %e, "pod cgroup values not written; the pod runs without them");
            }
        }
        result
    }

    fn make_pod_cgroup(
        &self,
        st: &mut State,
        uid: &str,
        path: &str,
        pod: &DesiredPod,
    ) -> Result<(), HostError> {
        if self.host.exists(path) {
            // Made before (an adopted pod, or by the runtime): left as is.
            return Ok(());
        }
        // Recorded before it is made: a crash in between leaves a record
        // of a cgroup that may not exist, which removes as nothing.
        let owned = st.owned.entry(uid.to_string()).or_default();
        if !owned.iter().any(|p| p == path) {
            owned.push(path.to_string());
        }
        let paths = owned.clone();
        self.write_record(uid, &paths);
        if let Err(e) = self.host.create(path) {
            self.remove_owned(st, uid);
            return Err(e);
        }
        tracing::debug!(uid, cgroup = %path, "pod cgroup made");
        self.host
            .apply(path, &pod_config(&pod.pod, self.pod_pids_limit))
    }

    /// After pod `uid`'s sandboxes are gone: it leaves its tier, and the
    /// cgroups the agent made for it go (a busy one at a later resync).
    pub fn forget_pod(&self, uid: &str) {
        let mut st = self.lock();
        st.pods.remove(uid);
        st.warned.remove(uid);
        if st.burstable.remove(uid).is_some() && st.allocatable_cpu.is_some() {
            if let Err(e) = self.update_burstable(&mut st) {
                tracing::debug!(error = %e, "burstable QoS cgroup not updated");
            }
        }
        self.remove_owned(&mut st, uid);
    }

    /// Removes the cgroups the agent made for `uid`; those still busy
    /// stay owned (and recorded) for the next try.
    fn remove_owned(&self, st: &mut State, uid: &str) {
        let Some(paths) = st.owned.remove(uid) else {
            return;
        };
        let mut left = Vec::new();
        for path in paths {
            match self.host.remove(&path) {
                Ok(()) => tracing::debug!(uid, cgroup = %path, "pod cgroup removed"),
                Err(e) => {
                    tracing::debug!(uid, cgroup = %path, error = %e, "pod cgroup not removed yet");
                    left.push(path);
                }
            }
        }
        if left.is_empty() {
            self.remove_record(uid);
        } else {
            self.write_record(uid, &left);
            st.owned.insert(uid.to_string(), left);
        }
    }

    /// The pod cgroups the agent made and has not removed yet, by UID.
    pub fn owned(&self) -> BTreeMap<String, Vec<String>> {
        self.lock().owned.clone()
    }

    fn record_file(&self, uid: &str) -> Option<PathBuf> {
        let ok = !uid.is_empty() && uid != "." && uid != ".." && !uid.contains(['/', '\0']);
        self.records.as_ref().filter(|_| ok).map(|d| d.join(uid))
    }

    fn write_record(&self, uid: &str, paths: &[String]) {
        let Some(file) = self.record_file(uid) else {
            return;
        };
        let write = || -> std::io::Result<()> {
            if let Some(dir) = file.parent() {
                // Private, as every directory the agent makes.
                petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE)
                    .map_err(std::io::Error::other)?;
            }
            std::fs::write(&file, paths.join("\n"))
        };
        if let Err(e) = write() {
            tracing::warn!(uid, file = %file.display(), error = %e, "pod cgroup not recorded: a restarted agent will not remove it");
        }
    }

    fn remove_record(&self, uid: &str) {
        if let Some(file) = self.record_file(uid) {
            match std::fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(uid, file = %file.display(), error = %e, "pod cgroup record not removed")
                }
            }
        }
    }
}

/// The records in `dir`: for each pod UID, the cgroups the agent made.
/// Only a path that is that pod's cgroup in `layout` is believed: a
/// damaged record (or one of another driver or root) never names another
/// cgroup to remove.
fn read_records(dir: &std::path::Path, layout: &CgroupLayout) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let Some(uid) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let candidates = layout.pod_candidates(&uid);
        let paths: Vec<String> = text
            .lines()
            .filter(|l| candidates.iter().any(|c| c == l))
            .map(str::to_string)
            .collect();
        if !paths.is_empty() {
            out.insert(uid, paths);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::config::ResourceConfig;
    use super::*;
    use crate::convert::test_support::desired;

    /// Cgroups in memory: which exist, what was written, which are busy.
    #[derive(Default)]
    struct Fake {
        existing: Mutex<HashSet<String>>,
        written: Mutex<Vec<(String, ResourceConfig)>>,
        busy: Mutex<HashSet<String>>,
        fail_apply: Mutex<bool>,
    }

    impl Fake {
        fn has(&self, p: &str) -> bool {
            self.existing.lock().unwrap().contains(p)
        }
        fn last(&self, p: &str) -> Option<ResourceConfig> {
            self.written
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|(q, _)| q == p)
                .map(|(_, c)| *c)
        }
        fn writes(&self, p: &str) -> usize {
            self.written
                .lock()
                .unwrap()
                .iter()
                .filter(|(q, _)| q == p)
                .count()
        }
    }

    impl CgroupHost for Fake {
        fn exists(&self, path: &str) -> bool {
            self.has(path)
        }
        fn create(&self, path: &str) -> Result<(), HostError> {
            let mut e = self.existing.lock().unwrap();
            let mut p = String::new();
            for c in path.split('/').filter(|c| !c.is_empty()) {
                p = format!("{p}/{c}");
                e.insert(p.clone());
            }
            Ok(())
        }
        fn apply(&self, path: &str, config: &ResourceConfig) -> Result<(), HostError> {
            if *self.fail_apply.lock().unwrap() {
                return Err(HostError::Cgroup(
                    petrel_oci::cgroups::CgroupError::NotFound { path: path.into() },
                ));
            }
            self.written
                .lock()
                .unwrap()
                .push((path.to_string(), *config));
            Ok(())
        }
        fn remove(&self, path: &str) -> Result<(), HostError> {
            if self.busy.lock().unwrap().contains(path) {
                return Err(HostError::Busy(path.into()));
            }
            self.existing.lock().unwrap().remove(path);
            Ok(())
        }
    }

    fn cgroupfs(root: &str) -> CgroupLayout {
        CgroupLayout::new(super::super::naming::CgroupDriver::Cgroupfs, root).unwrap()
    }

    fn pod(uid: &str, resources: &str) -> DesiredPod {
        let mut d = desired(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p-{uid}, namespace: default}}\nspec:\n  containers:\n  - name: c\n    image: busybox\n{resources}"
        ));
        d.uid = uid.to_string();
        d
    }

    const GUARANTEED: &str = "    resources: {limits: {cpu: 500m, memory: 64Mi}}\n";
    const BURSTABLE_200: &str = "    resources: {requests: {cpu: 200m}}\n";
    const BURSTABLE_100: &str = "    resources: {requests: {cpu: 100m}, limits: {cpu: 1}}\n";

    fn manager(dir: Option<PathBuf>) -> (Arc<Fake>, QosCgroups) {
        let fake = Arc::new(Fake::default());
        let m = QosCgroups::new(fake.clone(), cgroupfs("/petrel/"), 100, dir);
        (fake, m)
    }

    #[test]
    fn start_should_make_the_tiers_with_kubelets_shares() {
        let (f, m) = manager(None);
        m.start(1500).unwrap();
        assert_eq!(f.last("/petrel/kubepods").unwrap().cpu_shares, Some(1536));
        assert_eq!(
            f.last("/petrel/kubepods/besteffort").unwrap().cpu_shares,
            Some(2)
        );
        assert_eq!(
            f.last("/petrel/kubepods/burstable").unwrap().cpu_shares,
            Some(2)
        );
        assert!(f.has("/petrel/kubepods/burstable"));
    }

    #[test]
    fn burstable_shares_should_follow_its_pods() {
        let (f, m) = manager(None);
        m.start(2000).unwrap();
        m.ensure_pod(&pod("a", BURSTABLE_200)).unwrap();
        m.ensure_pod(&pod("b", BURSTABLE_100)).unwrap();
        m.ensure_pod(&pod("g", GUARANTEED)).unwrap();
        m.ensure_pod(&pod("e", "")).unwrap();
        let tier = "/petrel/kubepods/burstable";
        assert_eq!(f.last(tier).unwrap().cpu_shares, Some(307), "300m");
        // Syncing again writes nothing more.
        let writes = f.writes(tier);
        m.ensure_pod(&pod("a", BURSTABLE_200)).unwrap();
        assert_eq!(f.writes(tier), writes);
        m.forget_pod("a");
        assert_eq!(f.last(tier).unwrap().cpu_shares, Some(102), "100m");
        m.forget_pod("g");
        assert_eq!(
            f.writes(tier),
            writes + 1,
            "a Guaranteed pod is not in the tier"
        );
    }

    #[test]
    fn pod_cgroups_should_be_made_with_the_pods_values_in_their_tier() {
        let (f, m) = manager(None);
        m.start(2000).unwrap();
        m.ensure_pod(&pod("g", GUARANTEED)).unwrap();
        m.ensure_pod(&pod("b", BURSTABLE_100)).unwrap();
        m.ensure_pod(&pod("e", "")).unwrap();
        let g = f.last("/petrel/kubepods/podg").unwrap();
        assert_eq!(
            (g.cpu_shares, g.cpu_quota, g.memory, g.pids),
            (Some(512), Some(50_000), Some(64 << 20), Some(100))
        );
        let b = f.last("/petrel/kubepods/burstable/podb").unwrap();
        assert_eq!(
            (b.cpu_shares, b.cpu_quota, b.memory),
            (Some(102), Some(100_000), None)
        );
        let e = f.last("/petrel/kubepods/besteffort/pode").unwrap();
        assert_eq!((e.cpu_shares, e.cpu_quota), (Some(2), None));
    }

    #[test]
    fn an_existing_pod_cgroup_should_be_left_alone_and_never_removed() {
        let (f, m) = manager(None);
        m.start(2000).unwrap();
        f.create("/petrel/kubepods/podg").unwrap();
        m.ensure_pod(&pod("g", GUARANTEED)).unwrap();
        assert_eq!(f.writes("/petrel/kubepods/podg"), 0);
        m.forget_pod("g");
        assert!(f.has("/petrel/kubepods/podg"), "not the agent's");
    }

    #[test]
    fn made_pod_cgroups_should_go_with_the_pod_a_busy_one_later() {
        let (f, m) = manager(None);
        m.start(2000).unwrap();
        m.ensure_pod(&pod("g", GUARANTEED)).unwrap();
        m.ensure_pod(&pod("e", "")).unwrap();
        m.forget_pod("g");
        assert!(!f.has("/petrel/kubepods/podg"));
        assert!(f.has("/petrel/kubepods"), "the tiers stay");
        f.busy
            .lock()
            .unwrap()
            .insert("/petrel/kubepods/besteffort/pode".into());
        m.forget_pod("e");
        assert!(f.has("/petrel/kubepods/besteffort/pode"));
        assert_eq!(m.owned().len(), 1);
        m.resync();
        assert!(f.has("/petrel/kubepods/besteffort/pode"), "still busy");
        f.busy.lock().unwrap().clear();
        m.resync();
        assert!(!f.has("/petrel/kubepods/besteffort/pode"));
        assert!(m.owned().is_empty());
    }

    #[test]
    fn records_should_let_a_restarted_agent_remove_what_it_made() {
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("pod-cgroups");
        let (f, m) = manager(Some(records.clone()));
        m.start(2000).unwrap();
        m.ensure_pod(&pod("g", GUARANTEED)).unwrap();
        assert!(records.join("g").exists());
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&records).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "records are private");
        // A damaged record names nothing the agent would remove.
        std::fs::write(records.join("x"), "/petrel/kubepods\n/etc").unwrap();
        let again = QosCgroups::new(f.clone(), cgroupfs("/petrel"), -1, Some(records.clone()));
        assert_eq!(
            again.owned(),
            BTreeMap::from([("g".to_string(), vec!["/petrel/kubepods/podg".to_string()])])
        );
        // The adopted pod's cgroup exists: left as is, still the agent's.
        again.start(2000).unwrap();
        again.ensure_pod(&pod("g", GUARANTEED)).unwrap();
        again.forget_pod("g");
        assert!(!f.has("/petrel/kubepods/podg"));
        assert!(!records.join("g").exists());
    }

    #[test]
    fn write_errors_should_be_returned_never_fatal() {
        let (f, m) = manager(None);
        m.start(2000).unwrap();
        *f.fail_apply.lock().unwrap() = true;
        assert!(m.ensure_pod(&pod("g", GUARANTEED)).is_err());
        assert!(f.has("/petrel/kubepods/podg"), "made, values missing");
        // Once settled, a pod is not tried again each sync.
        assert!(m.ensure_pod(&pod("g", GUARANTEED)).is_ok());
        assert!(m.start(2000).is_err());
    }
}
