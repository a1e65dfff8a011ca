//! CRI `LinuxContainerResources` to OCI `LinuxResources`.

use oci_spec::runtime::{LinuxCpu, LinuxHugepageLimit, LinuxMemory, LinuxPids, LinuxResources};
use petrel_cri::api;

use super::{invalid, HostLimits, SpecError};

/// Hugepage sizes are written `<number><unit>B`, like the kernel's hugetlb file names.
const HUGEPAGE_UNITS: &[&str] = &["KB", "MB", "GB", "TB", "PB"];

/// Maps CRI resources to OCI resources, for CreateContainer and
/// UpdateContainerResources alike. Zero means "not set" for every number, as in CRI;
/// `-1` means unlimited for the CPU quota, the memory limit and the swap limit; any
/// other negative value is [`SpecError::Invalid`] naming the field. `oom_score_adj`
/// is a process setting and handled by the spec builder. `unified` is copied for
/// cgroup v2, except `pids.max`, which becomes `pids.limit` (understood by v1 too).
/// Hugepage limits are checked, then left out when the host's container cgroups lack
/// the hugetlb controller ([`HostLimits::hugetlb`]).
pub fn linux_resources(
    r: &api::LinuxContainerResources,
    host: &HostLimits,
) -> Result<LinuxResources, SpecError> {
    const F: &str = "resources";
    let mut out = LinuxResources::default();

    let mut cpu = LinuxCpu::default();
    let mut cpu_set = false;
    if r.cpu_shares != 0 {
        let shares = u64::try_from(r.cpu_shares)
            .map_err(|_| negative(format!("{F}.cpu_shares"), r.cpu_shares))?;
        cpu.set_shares(Some(shares));
        cpu_set = true;
    }
    if r.cpu_quota != 0 {
        if r.cpu_quota < -1 {
            return Err(negative(format!("{F}.cpu_quota"), r.cpu_quota));
        }
        cpu.set_quota(Some(r.cpu_quota));
        cpu_set = true;
    }
    if r.cpu_period != 0 {
        let period = u64::try_from(r.cpu_period)
            .map_err(|_| negative(format!("{F}.cpu_period"), r.cpu_period))?;
        cpu.set_period(Some(period));
        cpu_set = true;
    }
    if !r.cpuset_cpus.is_empty() {
        check_list(&format!("{F}.cpuset_cpus"), &r.cpuset_cpus)?;
        cpu.set_cpus(Some(r.cpuset_cpus.clone()));
        cpu_set = true;
    }
    if !r.cpuset_mems.is_empty() {
        check_list(&format!("{F}.cpuset_mems"), &r.cpuset_mems)?;
        cpu.set_mems(Some(r.cpuset_mems.clone()));
        cpu_set = true;
    }
    if cpu_set {
        out.set_cpu(Some(cpu));
    }

    let mut memory = LinuxMemory::default();
    let mut memory_set = false;
    if r.memory_limit_in_bytes != 0 {
        if r.memory_limit_in_bytes < -1 {
            return Err(negative(
                format!("{F}.memory_limit_in_bytes"),
                r.memory_limit_in_bytes,
            ));
        }
        memory.set_limit(Some(r.memory_limit_in_bytes));
        memory_set = true;
    }
    if r.memory_swap_limit_in_bytes != 0 {
        if r.memory_swap_limit_in_bytes < -1 {
            return Err(negative(
                format!("{F}.memory_swap_limit_in_bytes"),
                r.memory_swap_limit_in_bytes,
            ));
        }
        memory.set_swap(Some(r.memory_swap_limit_in_bytes));
        memory_set = true;
    }
    if memory_set {
        out.set_memory(Some(memory));
    }

    if !r.hugepage_limits.is_empty() {
        let mut limits = Vec::with_capacity(r.hugepage_limits.len());
        for (i, h) in r.hugepage_limits.iter().enumerate() {
            if !valid_page_size(&h.page_size) {
                return Err(invalid(
                    format!("{F}.hugepage_limits[{i}].page_size"),
                    format!("{:?} is not a size like 2MB or 1GB", h.page_size),
                ));
            }
            let limit = i64::try_from(h.limit).map_err(|_| {
                invalid(
                    format!("{F}.hugepage_limits[{i}].limit"),
                    format!("{} is too large", h.limit),
                )
            })?;
            let mut l = LinuxHugepageLimit::default();
            l.set_page_size(h.page_size.clone()).set_limit(limit);
            limits.push(l);
        }
        if host.hugetlb {
            out.set_hugepage_limits(Some(limits));
        }
    }

    if !r.unified.is_empty() {
        let mut unified = r.unified.clone();
        if let Some(v) = unified.remove("pids.max") {
            let limit = match v.trim() {
                "max" => -1,
                n => n.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
                    invalid(
                        format!("{F}.unified[pids.max]"),
                        format!("{v:?} is neither a count nor \"max\""),
                    )
                })?,
            };
            let mut pids = LinuxPids::default();
            pids.set_limit(limit);
            out.set_pids(Some(pids));
        }
        if let Some(k) = unified
            .keys()
            .find(|k| k.contains('/') || k.starts_with('.'))
        {
            return Err(invalid(
                format!("{F}.unified"),
                format!("{k:?} is not a cgroup file name"),
            ));
        }
        if !unified.is_empty() {
            out.set_unified(Some(unified));
        }
    }
    Ok(out)
}

fn negative(field: String, v: i64) -> SpecError {
    invalid(field, format!("{v} is negative"))
}

/// A cpuset list: numbers, ranges and commas (`0-3,7`).
fn check_list(field: &str, s: &str) -> Result<(), SpecError> {
    let ok = s.split(',').all(|part| {
        let mut bounds = part.trim().splitn(2, '-');
        let num = |b: Option<&str>| {
            b.is_some_and(|b| !b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()))
        };
        let lo = bounds.next();
        match bounds.next() {
            None => num(lo),
            hi => num(lo) && num(hi),
        }
    });
    if ok {
        Ok(())
    } else {
        Err(invalid(field, format!("{s:?} is not a list like 0-3,7")))
    }
}

fn valid_page_size(s: &str) -> bool {
    HUGEPAGE_UNITS.iter().any(|u| {
        s.strip_suffix(u)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostLimits {
        HostLimits {
            bounding_caps: vec![],
            min_oom_score_adj: 0,
            open_files: None,
            hugetlb: true,
        }
    }

    #[test]
    fn linux_resources_should_leave_unset_values_out() {
        let r =
            linux_resources(&api::LinuxContainerResources::default(), &host()).expect("resources");
        assert_eq!(r.cpu(), &None);
        assert_eq!(r.memory(), &None);
        assert_eq!(r.pids(), &None);
        assert_eq!(r.unified(), &None);
        assert_eq!(r.hugepage_limits(), &None);
    }

    #[test]
    fn linux_resources_should_map_cpu_and_memory() {
        let r = api::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 256 << 20,
            cpuset_cpus: "0-1,3".into(),
            cpuset_mems: "0".into(),
            ..Default::default()
        };
        let out = linux_resources(&r, &host()).expect("resources");
        let cpu = out.cpu().as_ref().expect("cpu");
        assert_eq!(cpu.period(), Some(100_000));
        assert_eq!(cpu.quota(), Some(50_000));
        assert_eq!(cpu.shares(), Some(512));
        assert_eq!(cpu.cpus().as_deref(), Some("0-1,3"));
        assert_eq!(cpu.mems().as_deref(), Some("0"));
        let mem = out.memory().as_ref().expect("memory");
        assert_eq!(mem.limit(), Some(256 << 20));
        assert_eq!(mem.swap(), None, "swap only when asked for");
    }

    #[test]
    fn linux_resources_should_pass_unlimited_values() {
        let r = api::LinuxContainerResources {
            cpu_quota: -1,
            memory_limit_in_bytes: -1,
            memory_swap_limit_in_bytes: -1,
            ..Default::default()
        };
        let out = linux_resources(&r, &host()).expect("resources");
        assert_eq!(out.cpu().as_ref().and_then(|c| c.quota()), Some(-1));
        let mem = out.memory().as_ref().expect("memory");
        assert_eq!((mem.limit(), mem.swap()), (Some(-1), Some(-1)));
    }

    #[test]
    fn linux_resources_should_reject_negative_values_naming_the_field() {
        let cases: Vec<(api::LinuxContainerResources, &str)> = vec![
            (
                api::LinuxContainerResources {
                    cpu_shares: -2,
                    ..Default::default()
                },
                "resources.cpu_shares",
            ),
            (
                api::LinuxContainerResources {
                    cpu_shares: -1,
                    ..Default::default()
                },
                "resources.cpu_shares",
            ),
            (
                api::LinuxContainerResources {
                    cpu_quota: -2,
                    ..Default::default()
                },
                "resources.cpu_quota",
            ),
            (
                api::LinuxContainerResources {
                    cpu_period: -1,
                    ..Default::default()
                },
                "resources.cpu_period",
            ),
            (
                api::LinuxContainerResources {
                    memory_limit_in_bytes: -5,
                    ..Default::default()
                },
                "resources.memory_limit_in_bytes",
            ),
            (
                api::LinuxContainerResources {
                    memory_swap_limit_in_bytes: -2,
                    ..Default::default()
                },
                "resources.memory_swap_limit_in_bytes",
            ),
            (
                api::LinuxContainerResources {
                    cpuset_cpus: "0-a".into(),
                    ..Default::default()
                },
                "resources.cpuset_cpus",
            ),
            (
                api::LinuxContainerResources {
                    cpuset_mems: "0,".into(),
                    ..Default::default()
                },
                "resources.cpuset_mems",
            ),
        ];
        for (r, want) in cases {
            match linux_resources(&r, &host()) {
                Err(SpecError::Invalid { field, .. }) => assert_eq!(field, want),
                other => panic!("{want}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn linux_resources_should_map_hugepages() {
        let r = api::LinuxContainerResources {
            hugepage_limits: vec![api::HugepageLimit {
                page_size: "2MB".into(),
                limit: 4 << 21,
            }],
            ..Default::default()
        };
        let out = linux_resources(&r, &host()).expect("resources");
        let h = &out.hugepage_limits().as_ref().expect("hugepages")[0];
        assert_eq!((h.page_size().as_str(), h.limit()), ("2MB", 4 << 21));

        let bad = api::LinuxContainerResources {
            hugepage_limits: vec![api::HugepageLimit {
                page_size: "2M".into(),
                limit: 1,
            }],
            ..Default::default()
        };
        assert!(matches!(
            linux_resources(&bad, &host()),
            Err(SpecError::Invalid { .. })
        ));
        let too_big = api::LinuxContainerResources {
            hugepage_limits: vec![api::HugepageLimit {
                page_size: "1GB".into(),
                limit: u64::MAX,
            }],
            ..Default::default()
        };
        assert!(matches!(
            linux_resources(&too_big, &host()),
            Err(SpecError::Invalid { .. })
        ));
    }

    #[test]
    fn linux_resources_should_leave_hugepages_out_without_the_hugetlb_controller() {
        let no_hugetlb = HostLimits {
            hugetlb: false,
            ..host()
        };
        let r = api::LinuxContainerResources {
            hugepage_limits: vec![api::HugepageLimit {
                page_size: "2MB".into(),
                limit: 0,
            }],
            memory_limit_in_bytes: 1 << 20,
            ..Default::default()
        };
        let out = linux_resources(&r, &no_hugetlb).expect("resources");
        assert_eq!(out.hugepage_limits(), &None);
        assert!(out.memory().is_some(), "the rest is kept");
        // Still checked: a malformed request is refused all the same.
        let bad = api::LinuxContainerResources {
            hugepage_limits: vec![api::HugepageLimit {
                page_size: "2M".into(),
                limit: 1,
            }],
            ..Default::default()
        };
        assert!(matches!(
            linux_resources(&bad, &no_hugetlb),
            Err(SpecError::Invalid { .. })
        ));
    }

    #[test]
    fn linux_resources_should_copy_unified_and_translate_pids_max() {
        let mut r = api::LinuxContainerResources::default();
        r.unified.insert("memory.high".into(), "1000000".into());
        r.unified.insert("pids.max".into(), "64".into());
        let out = linux_resources(&r, &host()).expect("resources");
        assert_eq!(out.pids().as_ref().map(|p| p.limit()), Some(64));
        let unified = out.unified().as_ref().expect("unified");
        assert_eq!(
            unified.get("memory.high").map(String::as_str),
            Some("1000000")
        );
        assert!(!unified.contains_key("pids.max"));

        let mut r = api::LinuxContainerResources::default();
        r.unified.insert("pids.max".into(), "max".into());
        let out = linux_resources(&r, &host()).expect("resources");
        assert_eq!(out.pids().as_ref().map(|p| p.limit()), Some(-1));
        assert_eq!(out.unified(), &None);

        let mut r = api::LinuxContainerResources::default();
        r.unified.insert("pids.max".into(), "-3".into());
        assert!(matches!(
            linux_resources(&r, &host()),
            Err(SpecError::Invalid { .. })
        ));
        let mut r = api::LinuxContainerResources::default();
        r.unified.insert("../memory.max".into(), "1".into());
        assert!(matches!(
            linux_resources(&r, &host()),
            Err(SpecError::Invalid { .. })
        ));
    }
}
