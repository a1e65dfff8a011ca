//! CRI `LinuxContainerResources` to OCI `LinuxResources`.

use std::ops::RangeInclusive;

use oci_spec::runtime::{LinuxCpu, LinuxHugepageLimit, LinuxMemory, LinuxPids, LinuxResources};
use petrel_cri::api;

use super::{invalid, HostLimits, SpecError};

/// Hugepage sizes are written `<number><unit>B`, like the kernel's hugetlb file names.
const HUGEPAGE_UNITS: &[&str] = &["KB", "MB", "GB", "TB", "PB"];

/// cpu.shares' range in the kernel (cgroup v1; runc maps it onto v2's
/// weights): a value outside it is silently clamped by the kernel, which runc
/// then reports as an error of its own.
pub const CPU_SHARES: RangeInclusive<i64> = 2..=262_144;
/// The CFS period's range in microseconds (the kernel's 1 ms and 1 s).
pub const CPU_PERIOD_US: RangeInclusive<i64> = 1_000..=1_000_000;
/// The CFS quota's range in microseconds: at least 1 ms, at most the
/// kernel's `max_cfs_runtime` (2^44 - 1 µs, about 203 days); `-1` is
/// unlimited.
pub const CPU_QUOTA_US: RangeInclusive<i64> = 1_000..=(1 << 44) - 1;
/// The smallest memory limit: runc's init is charged to the container's
/// cgroup before it runs the process (measured here: 2.2 MB in use when
/// runc applies the limit, and a 2 MiB limit fails with INTERNAL), so a
/// smaller limit can never start. Docker refuses below 6 MiB too.
pub const MIN_MEMORY: i64 = 6 << 20;
/// The largest memory limit the kernel holds: its page counters stop at
/// `i64::MAX` rounded down to a 4 KiB page; anything above is clamped.
pub const MAX_MEMORY: i64 = i64::MAX & !4095;

/// Maps CRI resources to OCI resources, for CreateContainer and
/// UpdateContainerResources alike, refusing with [`SpecError::Invalid`]
/// (naming the field) what the kernel cannot apply as asked, before runc
/// runs. Zero means "not set" for every number, as in CRI, so kubelet's
/// values pass unchanged. The rules:
/// - `cpu_shares`: [`CPU_SHARES`]; `cpu_period`: [`CPU_PERIOD_US`];
///   `cpu_quota`: [`CPU_QUOTA_US`] or `-1` (unlimited);
/// - `memory_limit_in_bytes`: [`MIN_MEMORY`]..=[`MAX_MEMORY`] (`0`, not
///   `-1`, is "no limit" in CRI); `memory_swap_limit_in_bytes`: `-1`
///   (unlimited) or at least the memory limit, which it needs (the kernel
///   refuses a memory+swap limit below the memory limit);
/// - `cpuset_cpus`/`cpuset_mems`: lists like `0-3,7` naming only CPUs and
///   memory nodes the host has ([`HostLimits::online_cpus`],
///   [`HostLimits::online_mems`]);
/// - hugepage sizes like `2MB`; `unified` keys are file names; `pids.max`
///   becomes `pids.limit` (understood by v1 too); hugepage limits are
///   checked, then left out when the host's container cgroups lack the
///   hugetlb controller ([`HostLimits::hugetlb`]).
///
/// `oom_score_adj` is a process setting and handled by the spec builder.
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
        in_range(&format!("{F}.cpu_shares"), r.cpu_shares, &CPU_SHARES, "")?;
        cpu.set_shares(Some(shares));
        cpu_set = true;
    }
    if r.cpu_quota != 0 {
        if r.cpu_quota < -1 {
            return Err(negative(format!("{F}.cpu_quota"), r.cpu_quota));
        }
        if r.cpu_quota != -1 {
            in_range(
                &format!("{F}.cpu_quota"),
                r.cpu_quota,
                &CPU_QUOTA_US,
                " µs (or -1 for no quota)",
            )?;
        }
        cpu.set_quota(Some(r.cpu_quota));
        cpu_set = true;
    }
    if r.cpu_period != 0 {
        let period = u64::try_from(r.cpu_period)
            .map_err(|_| negative(format!("{F}.cpu_period"), r.cpu_period))?;
        in_range(
            &format!("{F}.cpu_period"),
            r.cpu_period,
            &CPU_PERIOD_US,
            " µs",
        )?;
        cpu.set_period(Some(period));
        cpu_set = true;
    }
    if !r.cpuset_cpus.is_empty() {
        check_ids(
            &format!("{F}.cpuset_cpus"),
            &r.cpuset_cpus,
            host.online_cpus.as_ref(),
            "CPU",
        )?;
        cpu.set_cpus(Some(r.cpuset_cpus.clone()));
        cpu_set = true;
    }
    if !r.cpuset_mems.is_empty() {
        check_ids(
            &format!("{F}.cpuset_mems"),
            &r.cpuset_mems,
            host.online_mems.as_ref(),
            "memory node",
        )?;
        cpu.set_mems(Some(r.cpuset_mems.clone()));
        cpu_set = true;
    }
    if cpu_set {
        out.set_cpu(Some(cpu));
    }

    let mut memory = LinuxMemory::default();
    let mut memory_set = false;
    if r.memory_limit_in_bytes != 0 {
        if r.memory_limit_in_bytes < 0 {
            return Err(invalid(
                format!("{F}.memory_limit_in_bytes"),
                format!("{} is negative (0 means no limit)", r.memory_limit_in_bytes),
            ));
        }
        in_range(
            &format!("{F}.memory_limit_in_bytes"),
            r.memory_limit_in_bytes,
            &(MIN_MEMORY..=MAX_MEMORY),
            " bytes (0 means no limit)",
        )?;
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
        if r.memory_swap_limit_in_bytes != -1
            && (r.memory_limit_in_bytes == 0
                || r.memory_swap_limit_in_bytes < r.memory_limit_in_bytes)
        {
            return Err(invalid(
                format!("{F}.memory_swap_limit_in_bytes"),
                format!(
                    "{} is not -1 and below the memory limit {} (memory plus swap needs a memory limit, and at least as much)",
                    r.memory_swap_limit_in_bytes, r.memory_limit_in_bytes
                ),
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

fn in_range(field: &str, v: i64, range: &RangeInclusive<i64>, unit: &str) -> Result<(), SpecError> {
    if range.contains(&v) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{v} is outside {}..={}{unit}", range.start(), range.end()),
        ))
    }
}

/// A set of CPU or memory node numbers, as the kernel lists them (`0-3,7`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdSet(Vec<RangeInclusive<u32>>);

impl IdSet {
    /// Parses a list like `0-3,7`; `None` if it is not one (a range must
    /// not run backwards).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        if s.is_empty() {
            return Some(Self(Vec::new()));
        }
        let num = |b: &str| {
            (!b.is_empty() && b.bytes().all(|c| c.is_ascii_digit()))
                .then(|| b.parse::<u32>().ok())
                .flatten()
        };
        let mut out = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let range = match part.split_once('-') {
                None => {
                    let n = num(part)?;
                    n..=n
                }
                Some((lo, hi)) => {
                    let (lo, hi) = (num(lo)?, num(hi)?);
                    if lo > hi {
                        return None;
                    }
                    lo..=hi
                }
            };
            out.push(range);
        }
        // Sorted and merged (touching ranges too), so that a range is in
        // the set exactly when one of these holds it whole.
        out.sort_by_key(|r| *r.start());
        let mut merged: Vec<RangeInclusive<u32>> = Vec::with_capacity(out.len());
        for r in out {
            match merged.last_mut() {
                Some(last) if u64::from(*r.start()) <= u64::from(*last.end()) + 1 => {
                    *last = *last.start()..=(*last.end()).max(*r.end());
                }
                _ => merged.push(r),
            }
        }
        Some(Self(merged))
    }

    /// Whether every number of `other` is in this set.
    pub fn contains_all(&self, other: &IdSet) -> bool {
        other.0.iter().all(|r| {
            self.0
                .iter()
                .any(|mine| mine.start() <= r.start() && r.end() <= mine.end())
        })
    }
}

/// A cpuset list that the host can apply: well formed, and naming only
/// CPUs (or memory nodes) in `host` when the host's are known.
fn check_ids(field: &str, s: &str, host: Option<&IdSet>, what: &str) -> Result<(), SpecError> {
    let shown = super::shown(s);
    let Some(ids) = IdSet::parse(s) else {
        return Err(invalid(field, format!("{shown} is not a list like 0-3,7")));
    };
    if let Some(host) = host {
        if !host.contains_all(&ids) {
            return Err(invalid(
                field,
                format!("{shown} names a {what} this host does not have"),
            ));
        }
    }
    Ok(())
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
            online_cpus: None,
            online_mems: None,
            hugetlb: true,
            recursive_read_only: false,
            user_namespaces: false,
            cgroup_namespaces: false,
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
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: -1,
            ..Default::default()
        };
        let out = linux_resources(&r, &host()).expect("resources");
        assert_eq!(out.cpu().as_ref().and_then(|c| c.quota()), Some(-1));
        let mem = out.memory().as_ref().expect("memory");
        assert_eq!((mem.limit(), mem.swap()), (Some(64 << 20), Some(-1)));
    }

    #[test]
    fn linux_resources_should_refuse_what_the_kernel_cannot_apply() {
        let host = HostLimits {
            online_cpus: IdSet::parse("0-1"),
            online_mems: IdSet::parse("0"),
            ..host()
        };
        let r = |f: fn(&mut api::LinuxContainerResources)| {
            let mut r = api::LinuxContainerResources::default();
            f(&mut r);
            r
        };
        let cases: Vec<(api::LinuxContainerResources, &str)> = vec![
            (
                r(|r| r.memory_limit_in_bytes = -1),
                "resources.memory_limit_in_bytes",
            ),
            (
                r(|r| r.memory_limit_in_bytes = i64::MAX),
                "resources.memory_limit_in_bytes",
            ),
            (
                r(|r| r.memory_limit_in_bytes = 4096),
                "resources.memory_limit_in_bytes",
            ),
            (
                r(|r| r.memory_limit_in_bytes = MIN_MEMORY - 1),
                "resources.memory_limit_in_bytes",
            ),
            (r(|r| r.cpu_period = 1), "resources.cpu_period"),
            (r(|r| r.cpu_period = 999), "resources.cpu_period"),
            (r(|r| r.cpu_period = 1_000_001), "resources.cpu_period"),
            (r(|r| r.cpu_quota = 999), "resources.cpu_quota"),
            (r(|r| r.cpu_quota = 1 << 44), "resources.cpu_quota"),
            (r(|r| r.cpu_shares = 1), "resources.cpu_shares"),
            (r(|r| r.cpu_shares = 1 << 62), "resources.cpu_shares"),
            (r(|r| r.cpu_shares = 262_145), "resources.cpu_shares"),
            (r(|r| r.cpuset_cpus = "2".into()), "resources.cpuset_cpus"),
            (
                r(|r| r.cpuset_cpus = "0-4095".into()),
                "resources.cpuset_cpus",
            ),
            (r(|r| r.cpuset_cpus = "1-0".into()), "resources.cpuset_cpus"),
            (
                r(|r| r.cpuset_cpus = "99999999999".into()),
                "resources.cpuset_cpus",
            ),
            (r(|r| r.cpuset_mems = "1".into()), "resources.cpuset_mems"),
            (
                r(|r| r.memory_swap_limit_in_bytes = 64 << 20),
                "resources.memory_swap_limit_in_bytes",
            ),
            (
                r(|r| {
                    r.memory_limit_in_bytes = 64 << 20;
                    r.memory_swap_limit_in_bytes = 32 << 20;
                }),
                "resources.memory_swap_limit_in_bytes",
            ),
        ];
        for (r, want) in cases {
            match linux_resources(&r, &host) {
                Err(SpecError::Invalid { field, reason }) => {
                    assert_eq!(field, want, "{reason}")
                }
                other => panic!("{want}: expected Invalid, got {other:?} for {r:?}"),
            }
        }
        // The edges of every range pass; kubelet's values too.
        let ok = [
            r(|r| r.cpu_shares = 2),
            r(|r| r.cpu_shares = 262_144),
            r(|r| r.cpu_period = 1000),
            r(|r| r.cpu_period = 1_000_000),
            r(|r| r.cpu_quota = 1000),
            r(|r| r.memory_limit_in_bytes = MIN_MEMORY),
            r(|r| r.memory_limit_in_bytes = MAX_MEMORY),
            r(|r| r.cpuset_cpus = "0-1".into()),
            r(|r| r.cpuset_cpus = "1,0".into()),
            r(|r| r.cpuset_mems = "0".into()),
            r(|r| {
                r.memory_limit_in_bytes = 64 << 20;
                r.memory_swap_limit_in_bytes = 64 << 20;
            }),
        ];
        for r in ok {
            linux_resources(&r, &host).unwrap_or_else(|e| panic!("{r:?}: {e}"));
        }
    }

    #[test]
    fn id_sets_should_parse_merge_and_compare() {
        let host = IdSet::parse("0-3,4-5,8").expect("host");
        assert!(host.contains_all(&IdSet::parse("0-5").expect("0-5")));
        assert!(host.contains_all(&IdSet::parse("2,8").expect("2,8")));
        assert!(!host.contains_all(&IdSet::parse("5-8").expect("5-8")));
        assert!(!host.contains_all(&IdSet::parse("0-4294967295").expect("all")));
        for bad in ["a", "1-", "-1", "3-2", "1,,2", "4294967296"] {
            assert_eq!(IdSet::parse(bad), None, "{bad}");
        }
        assert_eq!(IdSet::parse("0-1\n"), IdSet::parse("0,1"));
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
            memory_limit_in_bytes: 64 << 20,
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
