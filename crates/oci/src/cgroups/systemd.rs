//! The systemd cgroup driver's names: which driver the runtime uses, how a
//! slice name expands to its cgroup path (`a-b-c.slice` lives in
//! `/a.slice/a-b.slice/a-b-c.slice`), the scope a container gets, and the
//! `slice:prefix:name` form of an OCI spec's `linux.cgroupsPath` that runc
//! reads with `--systemd-cgroup`. Pure functions: the units themselves are
//! started and stopped by the runtime through its own seam.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The prefix of container scopes: `<prefix>-<container id>.scope`.
pub const SCOPE_PREFIX: &str = "petrel";

/// Longest unit name systemd takes (`UNIT_NAME_MAX`).
const UNIT_NAME_MAX: usize = 255;

/// Who manages the cgroups of pods and containers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// The runtime and runc make and remove cgroup directories themselves;
    /// a pod's cgroup parent is a path (`/kubepods/burstable/pod<uid>`).
    #[default]
    Cgroupfs,
    /// systemd does, as units: a pod's cgroup parent is a slice
    /// (`kubepods-burstable-pod<uid>.slice`), a container is a scope in it
    /// (runc `--systemd-cgroup`).
    Systemd,
}

impl CgroupDriver {
    /// Its name in the configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CgroupDriver {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
            "systemd" => Ok(CgroupDriver::Systemd),
            other => Err(format!(
                "unknown cgroup driver {other:?}: cgroupfs or systemd"
            )),
        }
    }
}

/// A name that is not a slice systemd would take, or a cgroup parent given
/// in the other driver's form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not a valid slice unit name.
    #[error("{name:?} is not a systemd slice name: {why}")]
    BadSlice {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A cgroupfs path given to the systemd driver.
    #[error(
        "{parent:?} is a cgroupfs path, but the runtime uses the systemd cgroup driver, \
         which takes a slice name such as kubepods-burstable-pod<uid>.slice \
         (set the kubelet's cgroupDriver to systemd, or run the runtime with \
         --cgroup-driver cgroupfs)"
    )]
    CgroupfsParent {
        /// The parent given.
        parent: String,
    },
    /// A slice name given to the cgroupfs driver.
    #[error(
        "{parent:?} is a systemd slice, but the runtime uses the cgroupfs cgroup driver, \
         which takes an absolute cgroup path such as /kubepods/burstable/pod<uid> \
         (set the kubelet's cgroupDriver to cgroupfs, or run the runtime with \
         --cgroup-driver systemd)"
    )]
    SliceParent {
        /// The parent given.
        parent: String,
    },
}

/// Checks a slice unit name: `<word>(-<word>)*.slice` (or the root,
/// `-.slice`), words of letters, digits, `_`, `.`, `:` and `\` escapes,
/// at most 255 characters.
pub fn check_slice(name: &str) -> Result<(), NameError> {
    let bad = |why| {
        Err(NameError::BadSlice {
            name: name.to_string(),
            why,
        })
    };
    if name.len() > UNIT_NAME_MAX {
        return bad("longer than 255 characters");
    }
    let Some(stem) = name.strip_suffix(".slice") else {
        return bad("it does not end with .slice");
    };
    if name == "-.slice" {
        return Ok(());
    }
    if stem.is_empty() {
        return bad("nothing before .slice");
    }
    if stem.contains('/') {
        return bad("it contains '/'");
    }
    for word in stem.split('-') {
        if word.is_empty() {
            return bad("a '-' at its start or end, or two in a row");
        }
        if !word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '\\'))
        {
            return bad("a character systemd does not take in a unit name");
        }
    }
    Ok(())
}

/// The cgroup path of slice `name`, from the hierarchy's root: each
/// `-`-separated prefix is a parent slice (`a-b-c.slice` →
/// `/a.slice/a-b.slice/a-b-c.slice`; `-.slice` → `/`).
pub fn expand_slice(name: &str) -> Result<String, NameError> {
    check_slice(name)?;
    if name == "-.slice" {
        return Ok("/".to_string());
    }
    let stem = name.trim_end_matches(".slice");
    let mut path = String::new();
    let mut prefix = String::new();
    for word in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(word);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
    }
    Ok(path)
}

/// The scope unit of a container: `petrel-<id>.scope`.
pub fn scope_unit(container_id: &str) -> String {
    format!("{SCOPE_PREFIX}-{container_id}.scope")
}

/// The slice a pod's expanded cgroup path (from [`pod_cgroup`]) is: its
/// last component.
pub fn slice_of(pod_cgroup: &str) -> &str {
    match pod_cgroup.trim_end_matches('/').rsplit('/').next() {
        Some(s) if !s.is_empty() => s,
        _ => "-.slice",
    }
}

/// The cgroup path of a container in a pod whose expanded path is
/// `pod_cgroup`: its scope, under the pod's slice.
pub fn container_cgroup(pod_cgroup: &str, container_id: &str) -> String {
    format!(
        "{}/{}",
        pod_cgroup.trim_end_matches('/'),
        scope_unit(container_id)
    )
}

/// The spec's `linux.cgroupsPath` for a container of that pod, in runc's
/// systemd form: `<pod slice>:petrel:<container id>`.
pub fn spec_cgroups_path(pod_cgroup: &str, container_id: &str) -> String {
    format!("{}:{SCOPE_PREFIX}:{container_id}", slice_of(pod_cgroup))
}

/// The cgroup path a spec's systemd-form `cgroupsPath` names (the inverse
/// of [`spec_cgroups_path`], for any prefix); `None` for another form.
pub fn cgroup_of_spec_path(spec_path: &str) -> Option<String> {
    let mut parts = spec_path.split(':');
    let (slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || name.is_empty() {
        return None;
    }
    let slice = if slice.is_empty() { "-.slice" } else { slice };
    let parent = expand_slice(slice).ok()?;
    let unit = if name.ends_with(".slice") {
        name.to_string()
    } else if prefix.is_empty() {
        format!("{name}.scope")
    } else {
        format!("{prefix}-{name}.scope")
    };
    Some(format!("{}/{unit}", parent.trim_end_matches('/')))
}

/// A pod's cgroup path from the `cgroup_parent` its RunPodSandbox gave,
/// checked against the driver; `None` when none was given.
///
/// cgroupfs: the absolute path itself (a bare slice name is refused);
/// systemd: the slice's expanded path (a path with `/` is refused).
pub fn pod_cgroup(driver: CgroupDriver, parent: &str) -> Result<Option<String>, NameError> {
    let parent = parent.trim_end_matches('/');
    if parent.is_empty() {
        return Ok(None);
    }
    match driver {
        CgroupDriver::Cgroupfs => {
            if !parent.contains('/') && parent.ends_with(".slice") {
                return Err(NameError::SliceParent {
                    parent: parent.to_string(),
                });
            }
            Ok(Some(parent.to_string()))
        }
        CgroupDriver::Systemd => {
            if parent.contains('/') {
                return Err(NameError::CgroupfsParent {
                    parent: parent.to_string(),
                });
            }
            expand_slice(parent).map(Some)
        }
    }
}

/// The slice of a pod that names no parent, under the default slice
/// `default` (`petrel.slice` → `petrel-<sandbox id>.slice`, in
/// `/petrel.slice/`), as the cgroupfs driver puts it in
/// `<default>/<sandbox id>`.
pub fn default_pod_slice(default: &str, sandbox_id: &str) -> Result<String, NameError> {
    check_slice(default)?;
    let name = if default == "-.slice" {
        format!("{sandbox_id}.slice")
    } else {
        format!("{}-{sandbox_id}.slice", default.trim_end_matches(".slice"))
    };
    check_slice(&name)?;
    Ok(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn expand_slice_should_nest_each_dash_prefix() {
        assert_eq!(
            expand_slice("kubepods-burstable-pod1_2.slice").unwrap(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"
        );
        assert_eq!(expand_slice("system.slice").unwrap(), "/system.slice");
        assert_eq!(expand_slice("-.slice").unwrap(), "/");
    }

    #[test]
    fn check_slice_should_refuse_what_systemd_would() {
        for bad in [
            "kubepods",
            ".slice",
            "-a.slice",
            "a-.slice",
            "a--b.slice",
            "a/b.slice",
            "a b.slice",
            "a$b.slice",
        ] {
            let e = check_slice(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        let long = format!("{}.slice", "a".repeat(250));
        assert!(check_slice(&long).is_err());
        assert!(check_slice("kubepods-besteffort-pod0a_b.slice").is_ok());
    }

    #[test]
    fn a_container_should_be_a_scope_in_its_pods_slice() {
        let pod = "/kubepods.slice/kubepods-pod1.slice";
        assert_eq!(
            container_cgroup(pod, "abc"),
            "/kubepods.slice/kubepods-pod1.slice/petrel-abc.scope"
        );
        assert_eq!(
            spec_cgroups_path(pod, "abc"),
            "kubepods-pod1.slice:petrel:abc"
        );
        assert_eq!(
            cgroup_of_spec_path(&spec_cgroups_path(pod, "abc")).as_deref(),
            Some(container_cgroup(pod, "abc").as_str())
        );
        assert_eq!(
            cgroup_of_spec_path(":crio:x").as_deref(),
            Some("/crio-x.scope")
        );
        assert_eq!(cgroup_of_spec_path("/kubepods/pod1/abc"), None);
        assert_eq!(cgroup_of_spec_path("a.slice:p:"), None);
        assert_eq!(slice_of("/"), "-.slice");
    }

    #[test]
    fn pod_cgroup_should_refuse_the_other_drivers_form() {
        let sd = CgroupDriver::Systemd;
        let fs = CgroupDriver::Cgroupfs;
        assert_eq!(
            pod_cgroup(sd, "kubepods-pod1.slice").unwrap().as_deref(),
            Some("/kubepods.slice/kubepods-pod1.slice")
        );
        let e = pod_cgroup(sd, "/kubepods/pod1").unwrap_err().to_string();
        assert!(
            e.contains("cgroupfs path") && e.contains("/kubepods/pod1"),
            "{e}"
        );
        let e = pod_cgroup(fs, "kubepods-pod1.slice")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("systemd slice") && e.contains("kubepods-pod1.slice"),
            "{e}"
        );
        assert_eq!(
            pod_cgroup(fs, "/kubepods/pod1/").unwrap().as_deref(),
            Some("/kubepods/pod1")
        );
        assert_eq!(pod_cgroup(sd, "").unwrap(), None);
        assert!(pod_cgroup(sd, "kubepods").is_err());
    }

    #[test]
    fn default_pod_slice_should_nest_under_the_default() {
        assert_eq!(
            default_pod_slice("petrel.slice", "ab12").unwrap(),
            "petrel-ab12.slice"
        );
        assert_eq!(default_pod_slice("-.slice", "ab12").unwrap(), "ab12.slice");
        assert!(default_pod_slice("/petrel", "ab12").is_err());
    }

    #[test]
    fn drivers_should_parse_by_name() {
        assert_eq!("systemd".parse(), Ok(CgroupDriver::Systemd));
        assert_eq!("cgroupfs".parse(), Ok(CgroupDriver::Cgroupfs));
        assert!("Systemd".parse::<CgroupDriver>().is_err());
        assert_eq!(CgroupDriver::default().to_string(), "cgroupfs");
    }
}
