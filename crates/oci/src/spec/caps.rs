//! Linux capabilities of a container process.

use std::collections::HashSet;

use oci_spec::runtime::{Capabilities, Capability, LinuxCapabilities};
use petrel_cri::api;

use super::{invalid, HostLimits, SpecError};

/// Every capability oci-spec knows, indexed by its number in the kernel's bit masks.
const CAPS: [(&str, Capability); 41] = [
    ("CHOWN", Capability::Chown),
    ("DAC_OVERRIDE", Capability::DacOverride),
    ("DAC_READ_SEARCH", Capability::DacReadSearch),
    ("FOWNER", Capability::Fowner),
    ("FSETID", Capability::Fsetid),
    ("KILL", Capability::Kill),
    ("SETGID", Capability::Setgid),
    ("SETUID", Capability::Setuid),
    ("SETPCAP", Capability::Setpcap),
    ("LINUX_IMMUTABLE", Capability::LinuxImmutable),
    ("NET_BIND_SERVICE", Capability::NetBindService),
    ("NET_BROADCAST", Capability::NetBroadcast),
    ("NET_ADMIN", Capability::NetAdmin),
    ("NET_RAW", Capability::NetRaw),
    ("IPC_LOCK", Capability::IpcLock),
    ("IPC_OWNER", Capability::IpcOwner),
    ("SYS_MODULE", Capability::SysModule),
    ("SYS_RAWIO", Capability::SysRawio),
    ("SYS_CHROOT", Capability::SysChroot),
    ("SYS_PTRACE", Capability::SysPtrace),
    ("SYS_PACCT", Capability::SysPacct),
    ("SYS_ADMIN", Capability::SysAdmin),
    ("SYS_BOOT", Capability::SysBoot),
    ("SYS_NICE", Capability::SysNice),
    ("SYS_RESOURCE", Capability::SysResource),
    ("SYS_TIME", Capability::SysTime),
    ("SYS_TTY_CONFIG", Capability::SysTtyConfig),
    ("MKNOD", Capability::Mknod),
    ("LEASE", Capability::Lease),
    ("AUDIT_WRITE", Capability::AuditWrite),
    ("AUDIT_CONTROL", Capability::AuditControl),
    ("SETFCAP", Capability::Setfcap),
    ("MAC_OVERRIDE", Capability::MacOverride),
    ("MAC_ADMIN", Capability::MacAdmin),
    ("SYSLOG", Capability::Syslog),
    ("WAKE_ALARM", Capability::WakeAlarm),
    ("BLOCK_SUSPEND", Capability::BlockSuspend),
    ("AUDIT_READ", Capability::AuditRead),
    ("PERFMON", Capability::Perfmon),
    ("BPF", Capability::Bpf),
    ("CHECKPOINT_RESTORE", Capability::CheckpointRestore),
];

/// The capabilities a non-privileged container gets unless told otherwise
/// (containerd 1.x and Docker's default set).
pub const DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The capability called `name`, with or without `CAP_`, in any case.
pub fn capability_by_name(name: &str) -> Option<Capability> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
    CAPS.iter().find(|(n, _)| *n == bare).map(|(_, c)| *c)
}

/// The canonical `CAP_*` name of a capability.
pub fn capability_name(cap: Capability) -> String {
    let bare = CAPS
        .iter()
        .find(|(_, c)| *c == cap)
        .map_or("UNKNOWN", |(n, _)| n);
    format!("CAP_{bare}")
}

/// `CAP_*` names of the bits set in a capability mask (`CapBnd` of `/proc/<pid>/status`).
/// Bits unknown to us are left out.
pub fn caps_from_mask(mask: u64) -> Vec<String> {
    CAPS.iter()
        .enumerate()
        .filter(|(bit, _)| mask & (1u64 << bit) != 0)
        .map(|(_, (n, _))| format!("CAP_{n}"))
        .collect()
}

/// The capability sets of a container: bounding = effective = permitted; inheritable
/// and ambient hold only the requested ambient capabilities. Everything is clamped to
/// the host's bounding set, which runc cannot exceed.
pub(super) fn capabilities(
    sc: Option<&api::LinuxContainerSecurityContext>,
    host: &HostLimits,
) -> Result<LinuxCapabilities, SpecError> {
    let host_caps: HashSet<Capability> = host
        .bounding_caps
        .iter()
        .filter_map(|n| capability_by_name(n))
        .collect();
    let privileged = sc.is_some_and(|s| s.privileged);
    let requested = sc.and_then(|s| s.capabilities.as_ref());

    let mut set: HashSet<Capability> = if privileged {
        host_caps.clone()
    } else {
        DEFAULT_CAPS
            .iter()
            .filter_map(|n| capability_by_name(n))
            .collect()
    };
    let mut ambient = HashSet::new();
    if let Some(req) = requested.filter(|_| !privileged) {
        const FIELD: &str = "linux.security_context.capabilities";
        let add = parse_names(&req.add_capabilities, &format!("{FIELD}.add_capabilities"))?;
        let drop = parse_names(
            &req.drop_capabilities,
            &format!("{FIELD}.drop_capabilities"),
        )?;
        // ALL first, so that "add ALL, drop X" and "drop ALL, add X" both work.
        if add.all {
            set.extend(host_caps.iter().copied());
        }
        if drop.all {
            set.clear();
        }
        set.extend(add.caps);
        for c in &drop.caps {
            set.remove(c);
        }
        let amb = parse_names(
            &req.add_ambient_capabilities,
            &format!("{FIELD}.add_ambient_capabilities"),
        )?;
        if amb.all {
            return Err(invalid(
                format!("{FIELD}.add_ambient_capabilities"),
                "ALL is not allowed for ambient capabilities",
            ));
        }
        ambient.extend(amb.caps);
    }

    let outside: Vec<String> = set
        .iter()
        .chain(ambient.iter())
        .filter(|c| !host_caps.contains(c))
        .map(|c| capability_name(*c))
        .collect();
    if !outside.is_empty() {
        tracing::debug!(capabilities = ?outside, "dropping capabilities outside the host bounding set");
    }
    set.retain(|c| host_caps.contains(c));
    ambient.retain(|c| host_caps.contains(c) && set.contains(c));

    let set: Capabilities = set.into_iter().collect();
    let ambient: Capabilities = ambient.into_iter().collect();
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(set.clone()))
        .set_effective(Some(set.clone()))
        .set_permitted(Some(set))
        .set_inheritable(Some(ambient.clone()))
        .set_ambient(Some(ambient));
    Ok(caps)
}

/// Parsed add or drop list.
struct Names {
    all: bool,
    caps: Vec<Capability>,
}

fn parse_names(names: &[String], field: &str) -> Result<Names, SpecError> {
    let mut out = Names {
        all: false,
        caps: Vec::new(),
    };
    for (i, n) in names.iter().enumerate() {
        if n.eq_ignore_ascii_case("ALL") {
            out.all = true;
        } else {
            let cap = capability_by_name(n).ok_or_else(|| {
                invalid(format!("{field}[{i}]"), format!("unknown capability {n:?}"))
            })?;
            out.caps.push(cap);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's bounding set: everything but CAP_SYS_RESOURCE.
    fn host() -> HostLimits {
        HostLimits {
            bounding_caps: caps_from_mask(0x0000_01ff_feff_ffff),
            min_oom_score_adj: 0,
            open_files: None,
            online_cpus: None,
            online_mems: None,
            hugetlb: true,
            recursive_read_only: true,
            user_namespaces: false,
            cgroup_namespaces: false,
        }
    }

    fn sc(add: &[&str], drop: &[&str]) -> api::LinuxContainerSecurityContext {
        api::LinuxContainerSecurityContext {
            capabilities: Some(api::Capability {
                add_capabilities: add.iter().map(|s| s.to_string()).collect(),
                drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
                add_ambient_capabilities: vec![],
            }),
            ..Default::default()
        }
    }

    fn names(set: &Option<Capabilities>) -> Vec<String> {
        let mut v: Vec<String> = set.iter().flatten().map(|c| capability_name(*c)).collect();
        v.sort();
        v
    }

    fn sorted(v: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn caps_from_mask_should_decode_this_machines_bounding_set() {
        let caps = caps_from_mask(0x0000_01ff_feff_ffff);
        assert_eq!(caps.len(), 40);
        assert!(!caps.contains(&"CAP_SYS_RESOURCE".to_string()));
        assert_eq!(caps[0], "CAP_CHOWN");
        assert_eq!(caps[39], "CAP_CHECKPOINT_RESTORE");
    }

    #[test]
    fn capability_by_name_should_accept_any_case_with_or_without_prefix() {
        assert_eq!(capability_by_name("net_admin"), Some(Capability::NetAdmin));
        assert_eq!(
            capability_by_name("CAP_SYS_ADMIN"),
            Some(Capability::SysAdmin)
        );
        assert_eq!(capability_by_name("cap_bpf"), Some(Capability::Bpf));
        assert_eq!(capability_by_name("FLY"), None);
    }

    #[test]
    fn capabilities_should_default_to_the_containerd_set() {
        let caps = capabilities(None, &host()).expect("caps");
        assert_eq!(names(caps.bounding()), sorted(&DEFAULT_CAPS));
        assert_eq!(caps.bounding(), caps.effective());
        assert_eq!(caps.bounding(), caps.permitted());
        assert!(names(caps.inheritable()).is_empty());
        assert!(names(caps.ambient()).is_empty());
    }

    #[test]
    fn capabilities_should_add_and_drop_named_caps() {
        let s = sc(&["NET_ADMIN", "CAP_sys_time"], &["cap_chown", "KILL"]);
        let got = names(capabilities(Some(&s), &host()).expect("caps").effective());
        assert!(got.contains(&"CAP_NET_ADMIN".to_string()));
        assert!(got.contains(&"CAP_SYS_TIME".to_string()));
        assert!(!got.contains(&"CAP_CHOWN".to_string()));
        assert!(!got.contains(&"CAP_KILL".to_string()));
        assert_eq!(got.len(), DEFAULT_CAPS.len());
    }

    #[test]
    fn capabilities_should_drop_all_then_add() {
        let s = sc(&["NET_BIND_SERVICE"], &["ALL"]);
        let got = names(capabilities(Some(&s), &host()).expect("caps").bounding());
        assert_eq!(got, ["CAP_NET_BIND_SERVICE"]);
    }

    #[test]
    fn capabilities_should_add_all_then_drop() {
        let s = sc(&["all"], &["SYS_ADMIN"]);
        let got = names(capabilities(Some(&s), &host()).expect("caps").bounding());
        assert_eq!(got.len(), 39, "all 40 host caps minus SYS_ADMIN");
        assert!(!got.contains(&"CAP_SYS_ADMIN".to_string()));
        assert!(!got.contains(&"CAP_SYS_RESOURCE".to_string()));
    }

    #[test]
    fn capabilities_should_reject_unknown_names_with_their_field() {
        let s = sc(&["NET_ADMIN", "NOT_A_CAP"], &[]);
        let err = capabilities(Some(&s), &host()).expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, .. }
                if field == "linux.security_context.capabilities.add_capabilities[1]"),
            "{err}"
        );
    }

    #[test]
    fn capabilities_should_clamp_to_the_host_bounding_set() {
        let s = sc(&["SYS_RESOURCE", "SYS_NICE"], &[]);
        let got = names(capabilities(Some(&s), &host()).expect("caps").permitted());
        assert!(!got.contains(&"CAP_SYS_RESOURCE".to_string()));
        assert!(got.contains(&"CAP_SYS_NICE".to_string()));
    }

    #[test]
    fn capabilities_should_grant_the_host_bounding_set_when_privileged() {
        let mut s = sc(&[], &["ALL"]);
        s.privileged = true;
        let caps = capabilities(Some(&s), &host()).expect("caps");
        assert_eq!(names(caps.bounding()).len(), 40);
        assert!(!names(caps.bounding()).contains(&"CAP_SYS_RESOURCE".to_string()));
        let small = HostLimits {
            bounding_caps: vec!["CAP_KILL".into(), "CAP_CHOWN".into()],
            min_oom_score_adj: 0,
            open_files: None,
            online_cpus: None,
            online_mems: None,
            hugetlb: true,
            recursive_read_only: true,
            user_namespaces: false,
            cgroup_namespaces: false,
        };
        let caps = capabilities(Some(&s), &small).expect("caps");
        assert_eq!(names(caps.effective()), ["CAP_CHOWN", "CAP_KILL"]);
    }

    #[test]
    fn capabilities_should_raise_requested_ambient_caps() {
        let mut s = sc(&["NET_ADMIN"], &[]);
        if let Some(c) = s.capabilities.as_mut() {
            c.add_ambient_capabilities = vec!["NET_ADMIN".into(), "SYS_RESOURCE".into()];
        }
        let caps = capabilities(Some(&s), &host()).expect("caps");
        assert_eq!(names(caps.ambient()), ["CAP_NET_ADMIN"]);
        assert_eq!(names(caps.inheritable()), ["CAP_NET_ADMIN"]);
    }
}
