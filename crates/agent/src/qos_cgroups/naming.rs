//! Where the pods' cgroups are, by cgroup driver: kubelet's `CgroupName`
//! (a list of parts: the root's, then `kubepods`, the QoS tier, `pod<uid>`)
//! turned into a cgroupfs path, or into nested systemd slices.
//!
//! With the systemd driver a name's parts are joined by `-` into one slice
//! unit (each part's own `-` becomes `_`, as kubelet escapes them), and the
//! slice's cgroup is that unit under each of its ancestors' slices:
//! `[kubepods, burstable, pod<uid>]` is the unit
//! `kubepods-burstable-pod<uid>.slice` at
//! `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`.
//! The runtime is handed the unit's name as the pod's cgroup parent, as
//! kubelet does; everything the agent reads is at the expanded path.

use serde::Deserialize;

use crate::convert::QosClass;

/// How pods' cgroups are made: kubelet's `cgroupDriver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// Directories in the cgroup filesystem, written directly.
    #[default]
    Cgroupfs,
    /// systemd slice units, made and changed through systemd's D-Bus API.
    Systemd,
}

impl std::str::FromStr for CgroupDriver {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cgroupfs" => Ok(Self::Cgroupfs),
            "systemd" => Ok(Self::Systemd),
            other => Err(format!(
                "unknown cgroup driver {other:?}: expected cgroupfs or systemd"
            )),
        }
    }
}

impl std::fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        })
    }
}

/// A cgroup root the layout cannot use.
#[derive(Debug, thiserror::Error)]
#[error("cgroup root {root:?} for the {driver} driver: {why}")]
pub struct LayoutError {
    /// The root as given.
    pub root: String,
    /// The driver.
    pub driver: CgroupDriver,
    /// What is wrong.
    pub why: &'static str,
}

/// The pods' cgroups under one root with one driver (the default: cgroupfs
/// at `/`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupLayout {
    driver: CgroupDriver,
    /// The root's parts (kubelet's `CgroupName` of `--cgroup-root`).
    root: Vec<String>,
}

/// Suffix of a slice unit.
const SLICE: &str = ".slice";

impl CgroupLayout {
    /// The layout under `root`: a cgroupfs path (`/petrel`) with either
    /// driver, or, with the systemd driver, also a slice (`petrel.slice`,
    /// `/petrel.slice/petrel-node.slice`): its unit's name gives the parts.
    pub fn new(driver: CgroupDriver, root: &str) -> Result<Self, LayoutError> {
        let err = |why| LayoutError {
            root: root.to_string(),
            driver,
            why,
        };
        if root.contains('\0') {
            return Err(err("contains a NUL byte"));
        }
        let parts: Vec<&str> = root.split('/').filter(|c| !c.is_empty()).collect();
        if parts.iter().any(|c| *c == "." || *c == "..") {
            return Err(err("contains . or .."));
        }
        let last_is_slice = parts.last().is_some_and(|p| p.ends_with(SLICE));
        let root = match driver {
            CgroupDriver::Systemd if last_is_slice => {
                let unit = parts.last().copied().unwrap_or_default();
                let name = unit.trim_end_matches(SLICE);
                if name.is_empty() || name == "-" {
                    Vec::new()
                } else {
                    let split: Vec<String> = name.split('-').map(str::to_string).collect();
                    if split.iter().any(String::is_empty) {
                        return Err(err("is not a valid slice name"));
                    }
                    // The path must be that slice's own expansion.
                    let expanded = expand_slice(&split);
                    if parts.len() > 1 && expanded != format!("/{}", parts.join("/")) {
                        return Err(err("is not the path of its slice"));
                    }
                    split
                }
            }
            CgroupDriver::Systemd => {
                if parts.iter().any(|p| p.ends_with(SLICE)) {
                    return Err(err("mixes slices and plain directories"));
                }
                parts.iter().map(|p| p.to_string()).collect()
            }
            CgroupDriver::Cgroupfs => parts.iter().map(|p| p.to_string()).collect(),
        };
        Ok(Self { driver, root })
    }

    /// The driver.
    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    fn path_of(&self, extra: &[&str]) -> String {
        let mut name = self.root.clone();
        name.extend(extra.iter().map(|s| s.to_string()));
        match self.driver {
            CgroupDriver::Cgroupfs => format!("/{}", name.join("/")),
            CgroupDriver::Systemd => expand_slice(&name),
        }
    }

    /// The cgroup the whole hierarchy lives in (the root's own), as a
    /// cgroupfs path.
    pub fn root_cgroup(&self) -> String {
        self.path_of(&[])
    }

    /// `kubepods`' cgroup (cgroupfs path).
    pub fn pods_cgroup(&self) -> String {
        self.path_of(&["kubepods"])
    }

    /// A QoS tier's cgroup: `kubepods` itself for Guaranteed pods.
    pub fn tier(&self, qos: QosClass) -> String {
        match qos {
            QosClass::Guaranteed => self.pods_cgroup(),
            QosClass::Burstable => self.path_of(&["kubepods", "burstable"]),
            QosClass::BestEffort => self.path_of(&["kubepods", "besteffort"]),
        }
    }

    /// Pod `uid`'s cgroup (cgroupfs path), as kubelet names it.
    pub fn pod_cgroup(&self, uid: &str, qos: QosClass) -> String {
        let pod = format!("pod{uid}");
        match qos {
            QosClass::Guaranteed => self.path_of(&["kubepods", &pod]),
            QosClass::Burstable => self.path_of(&["kubepods", "burstable", &pod]),
            QosClass::BestEffort => self.path_of(&["kubepods", "besteffort", &pod]),
        }
    }

    /// What the runtime is handed as the pod's cgroup parent: the pod's
    /// cgroupfs path, or with the systemd driver its slice unit's name.
    pub fn pod_parent(&self, uid: &str, qos: QosClass) -> String {
        let path = self.pod_cgroup(uid, qos);
        match self.driver {
            CgroupDriver::Cgroupfs => path,
            CgroupDriver::Systemd => slice_unit(&path).map(|(unit, _)| unit).unwrap_or(path),
        }
    }

    /// Pod `uid`'s cgroup in each QoS tier.
    pub fn pod_candidates(&self, uid: &str) -> [String; 3] {
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .map(|q| self.pod_cgroup(uid, q))
    }

    /// Container `id`'s cgroup in pod cgroup `pod`, given the names of the
    /// pod cgroup's children (read only with the systemd driver): cgroupfs
    /// runtimes name it by the id alone; with systemd it is a scope whose
    /// name ends in the id (`petrel-<id>.scope`, `cri-containerd-<id>.scope`,
    /// `crio-<id>.scope`), the prefix being the runtime's.
    pub fn container_cgroup<I, S>(&self, pod: &str, id: &str, children: I) -> Option<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        match self.driver {
            CgroupDriver::Cgroupfs => Some(format!("{pod}/{id}")),
            CgroupDriver::Systemd => {
                let suffix = format!("-{id}.scope");
                children
                    .into_iter()
                    .find(|c| c.as_ref().ends_with(&suffix) || c.as_ref() == id)
                    .map(|c| format!("{pod}/{}", c.as_ref()))
            }
        }
    }
}

/// The cgroupfs path of the slice named by `parts` (kubelet's `ToSystemd`
/// and systemd's slice expansion): `[a, b]` → `/a.slice/a-b.slice`; no
/// parts is the root cgroup `/`.
pub fn expand_slice(parts: &[String]) -> String {
    if parts.is_empty() {
        return "/".to_string();
    }
    let escaped: Vec<String> = parts.iter().map(|p| p.replace('-', "_")).collect();
    let mut out = String::new();
    for i in 1..=escaped.len() {
        out.push('/');
        out.push_str(&escaped[..i].join("-"));
        out.push_str(SLICE);
    }
    out
}

/// The slice unit a cgroupfs path of slices stands for, and its parent
/// slice (`-.slice` for a top-level one): `/a.slice/a-b.slice` →
/// (`a-b.slice`, `a.slice`). None when the path's last part is no slice.
pub fn slice_unit(path: &str) -> Option<(String, String)> {
    let mut parts = path.rsplit('/').filter(|c| !c.is_empty());
    let unit = parts.next().filter(|u| u.ends_with(SLICE))?;
    let parent = parts.next().unwrap_or("-.slice");
    Some((unit.to_string(), parent.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sd(root: &str) -> CgroupLayout {
        CgroupLayout::new(CgroupDriver::Systemd, root).unwrap()
    }

    #[test]
    fn cgroupfs_layout_should_be_kubelets_directories() {
        let l = CgroupLayout::new(CgroupDriver::Cgroupfs, "/petrel/").unwrap();
        assert_eq!(l.pods_cgroup(), "/petrel/kubepods");
        assert_eq!(l.tier(QosClass::Burstable), "/petrel/kubepods/burstable");
        assert_eq!(
            l.pod_cgroup("u-1", QosClass::BestEffort),
            "/petrel/kubepods/besteffort/podu-1"
        );
        assert_eq!(
            l.pod_parent("u-1", QosClass::Guaranteed),
            "/petrel/kubepods/podu-1"
        );
        assert_eq!(
            l.container_cgroup("/p", "abc", Vec::<String>::new()),
            Some("/p/abc".to_string())
        );
        let top = CgroupLayout::new(CgroupDriver::Cgroupfs, "/").unwrap();
        assert_eq!(top.pods_cgroup(), "/kubepods");
        assert_eq!(top.root_cgroup(), "/");
    }

    #[test]
    fn systemd_layout_should_be_kubelets_slices() {
        let l = sd("/");
        assert_eq!(l.pods_cgroup(), "/kubepods.slice");
        assert_eq!(
            l.tier(QosClass::Burstable),
            "/kubepods.slice/kubepods-burstable.slice"
        );
        let uid = "6f1f-22ab";
        assert_eq!(
            l.pod_cgroup(uid, QosClass::Burstable),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6f1f_22ab.slice"
        );
        assert_eq!(
            l.pod_parent(uid, QosClass::Burstable),
            "kubepods-burstable-pod6f1f_22ab.slice"
        );
        assert_eq!(
            l.pod_parent(uid, QosClass::Guaranteed),
            "kubepods-pod6f1f_22ab.slice"
        );
        assert_eq!(l.root_cgroup(), "/");
    }

    #[test]
    fn a_systemd_root_should_be_read_as_kubelet_reads_it() {
        // A cgroupfs-style root: its parts, escaped.
        let l = sd("/petrel-test");
        assert_eq!(l.root_cgroup(), "/petrel_test.slice");
        assert_eq!(
            l.tier(QosClass::BestEffort),
            "/petrel_test.slice/petrel_test-kubepods.slice/petrel_test-kubepods-besteffort.slice"
        );
        // A slice, bare or as its path: the parts of its name.
        for root in ["petrel-node.slice", "/petrel.slice/petrel-node.slice"] {
            let l = sd(root);
            assert_eq!(
                l.pods_cgroup(),
                "/petrel.slice/petrel-node.slice/petrel-node-kubepods.slice",
                "{root}"
            );
        }
        assert_eq!(sd("-.slice").pods_cgroup(), "/kubepods.slice");
        for bad in [
            "/a.slice/b-c.slice",
            "/x/y.slice/z",
            "a--b.slice",
            "/a/../b",
            "a\0b",
        ] {
            assert!(
                CgroupLayout::new(CgroupDriver::Systemd, bad).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn slice_units_should_name_their_parent() {
        assert_eq!(
            slice_unit("/kubepods.slice"),
            Some(("kubepods.slice".into(), "-.slice".into()))
        );
        assert_eq!(
            slice_unit("/kubepods.slice/kubepods-besteffort.slice"),
            Some(("kubepods-besteffort.slice".into(), "kubepods.slice".into()))
        );
        assert_eq!(slice_unit("/petrel/kubepods"), None);
        assert_eq!(expand_slice(&[]), "/");
    }

    #[test]
    fn systemd_containers_should_be_found_by_their_scope() {
        let l = sd("/");
        let kids = ["petrel-abc.scope", "cri-containerd-def.scope", "x"];
        assert_eq!(
            l.container_cgroup("/p.slice", "abc", kids),
            Some("/p.slice/petrel-abc.scope".to_string())
        );
        assert_eq!(
            l.container_cgroup("/p.slice", "def", kids),
            Some("/p.slice/cri-containerd-def.scope".to_string())
        );
        assert_eq!(l.container_cgroup("/p.slice", "bc", kids), None);
    }

    #[test]
    fn drivers_should_parse_by_name() {
        assert_eq!("systemd".parse::<CgroupDriver>(), Ok(CgroupDriver::Systemd));
        assert_eq!(
            "cgroupfs".parse::<CgroupDriver>(),
            Ok(CgroupDriver::Cgroupfs)
        );
        assert!("sd".parse::<CgroupDriver>().unwrap_err().contains("sd"));
        assert_eq!(CgroupDriver::default().to_string(), "cgroupfs");
    }
}
