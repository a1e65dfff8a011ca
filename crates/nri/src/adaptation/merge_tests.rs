//! Unit tests of the merge rules.

use std::collections::HashMap;

use super::*;
use crate::api::{self, Field};

fn plugin(index: &str, name: &str) -> api::PluginInstance {
    api::PluginInstance {
        name: name.to_string(),
        index: index.to_string(),
    }
}

fn a() -> api::PluginInstance {
    plugin("10", "a")
}

fn b() -> api::PluginInstance {
    plugin("20", "b")
}

fn request() -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            id: "pod1".into(),
            name: "pod".into(),
            ..Default::default()
        }),
        container: Some(api::Container {
            id: "c1".into(),
            pod_sandbox_id: "pod1".into(),
            name: "ctr".into(),
            annotations: HashMap::from([
                ("keep".to_string(), "1".to_string()),
                ("drop".to_string(), "2".to_string()),
            ]),
            env: vec!["PATH=/bin".into(), "A=1".into()],
            args: vec!["sleep".into(), "1".into()],
            mounts: vec![api::Mount {
                destination: "/data".into(),
                source: "/srv/data".into(),
                r#type: "bind".into(),
                options: vec!["rbind".into()],
            }],
            linux: Some(api::LinuxContainer {
                devices: vec![api::LinuxDevice {
                    path: "/dev/fuse".into(),
                    r#type: "c".into(),
                    major: 10,
                    minor: 229,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn adjusting(f: impl FnOnce(&mut api::ContainerAdjustment)) -> api::CreateContainerResponse {
    let mut adjust = api::ContainerAdjustment::default();
    f(&mut adjust);
    api::CreateContainerResponse {
        adjust: Some(adjust),
        ..Default::default()
    }
}

fn adjusting_linux(
    f: impl FnOnce(&mut api::LinuxContainerAdjustment),
) -> api::CreateContainerResponse {
    adjusting(|adj| {
        let mut linux = api::LinuxContainerAdjustment::default();
        f(&mut linux);
        adj.linux = Some(linux);
    })
}

fn with_resources(res: api::LinuxResources) -> api::CreateContainerResponse {
    adjusting_linux(|l| l.resources = Some(res))
}

fn conflict(field: Field, key: Option<&str>) -> MergeError {
    MergeError::Conflict {
        field,
        key: key.map(str::to_string),
        first: "10-a".into(),
        second: "20-b".into(),
    }
}

/// Applies `first` from plugin a, then `second` from plugin b, returning b's result.
fn two(
    first: api::CreateContainerResponse,
    second: api::CreateContainerResponse,
) -> Result<CreateResult, MergeError> {
    let mut m = CreateMerger::new(request());
    m.apply(&a(), first)?;
    m.apply(&b(), second)?;
    Ok(m.finish())
}

fn view<'a>(m: &'a CreateMerger<'_>) -> &'a api::Container {
    m.request().container.as_ref().expect("container")
}

#[test]
fn annotation_conflict_names_both_plugins_and_the_key() {
    let set = |v: &str| {
        let v = v.to_string();
        adjusting(move |adj| {
            adj.annotations.insert("x".into(), v);
        })
    };
    let err = two(set("1"), set("2")).expect_err("conflict");
    assert_eq!(err, conflict(Field::Annotations, Some("x")));
    assert_eq!(
        err.to_string(),
        r#"plugins "10-a" and "20-b" both adjust annotation "x""#
    );
}

#[test]
fn next_plugin_sees_earlier_changes_and_original_is_kept() {
    let mut m = CreateMerger::new(request());
    m.apply(
        &a(),
        adjusting(|adj| {
            adj.annotations.insert("x".into(), "1".into());
            adj.env.push(api::KeyValue {
                key: "A".into(),
                value: "2".into(),
            });
            adj.mounts.push(api::Mount {
                destination: "/cache".into(),
                source: "/srv/cache".into(),
                ..Default::default()
            });
            adj.linux = Some(api::LinuxContainerAdjustment {
                resources: Some(api::LinuxResources {
                    cpu: Some(api::LinuxCpu {
                        shares: Some(api::OptionalUInt64 { value: 512 }),
                        cpus: "0-1".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }),
    )
    .expect("apply");
    let c = view(&m);
    assert_eq!(c.annotations.get("x").map(String::as_str), Some("1"));
    assert_eq!(c.env, vec!["PATH=/bin".to_string(), "A=2".to_string()]);
    assert!(c.mounts.iter().any(|m| m.destination == "/cache"));
    let cpu = c
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .expect("cpu");
    assert_eq!(cpu.shares, Some(api::OptionalUInt64 { value: 512 }));
    assert_eq!(cpu.cpus, "0-1");

    let r = m.finish();
    assert!(!r.original.annotations.contains_key("x"));
    assert_eq!(
        r.original.env,
        vec!["PATH=/bin".to_string(), "A=1".to_string()]
    );
    assert_eq!(r.plugins, vec![a()]);
    let owners = r.container_owners().expect("owners");
    assert_eq!(owners.compound_owner(Field::Annotations, "x"), Some("10-a"));
    assert_eq!(owners.compound_owner(Field::Env, "A"), Some("10-a"));
    assert_eq!(owners.simple_owner(Field::CpuShares), Some("10-a"));
    assert_eq!(owners.simple_owner(Field::CpuSetCpUs), Some("10-a"));
}

#[test]
fn removal_marker_removes_and_makes_the_remover_owner() {
    let mut m = CreateMerger::new(request());
    m.apply(
        &a(),
        adjusting(|adj| {
            adj.annotations.insert("-drop".into(), String::new());
        }),
    )
    .expect("apply");
    assert!(!view(&m).annotations.contains_key("drop"));
    assert!(view(&m).annotations.contains_key("keep"));
    assert_eq!(
        m.adjustment().annotations.get("-drop"),
        Some(&String::new())
    );
    let err = m
        .apply(
            &b(),
            adjusting(|adj| {
                adj.annotations.insert("drop".into(), "again".into());
            }),
        )
        .expect_err("re-adding what another plugin removed conflicts");
    assert_eq!(err, conflict(Field::Annotations, Some("drop")));
    let r = {
        let mut m = CreateMerger::new(request());
        m.apply(
            &a(),
            adjusting(|adj| {
                adj.annotations.insert("-drop".into(), String::new());
            }),
        )
        .expect("apply");
        m.finish()
    };
    assert_eq!(
        r.container_owners()
            .and_then(|o| o.compound_owner(Field::Annotations, "drop")),
        Some("-10-a")
    );
}

#[test]
fn remove_and_set_in_one_answer_overrides_an_earlier_plugin() {
    let r = two(
        adjusting(|adj| {
            adj.annotations.insert("x".into(), "1".into());
        }),
        adjusting(|adj| {
            adj.annotations.insert("-x".into(), String::new());
            adj.annotations.insert("x".into(), "2".into());
        }),
    )
    .expect("override");
    assert_eq!(
        r.container.annotations.get("x").map(String::as_str),
        Some("2")
    );
    assert_eq!(r.adjust.annotations.get("x").map(String::as_str), Some("2"));
    assert_eq!(
        r.container_owners()
            .and_then(|o| o.compound_owner(Field::Annotations, "x")),
        Some("20-b")
    );
}

#[test]
fn mounts_by_destination() {
    let mount = |dst: &str, src: &str| api::Mount {
        destination: dst.into(),
        source: src.into(),
        ..Default::default()
    };
    let m1 = mount("/cache", "/x");
    let m2 = mount("/cache", "/y");
    let err = two(
        adjusting(move |adj| adj.mounts.push(m1)),
        adjusting(move |adj| adj.mounts.push(m2)),
    )
    .expect_err("conflict");
    assert_eq!(err, conflict(Field::Mounts, Some("/cache")));

    // Replacing an original mount: one entry at its destination, with the new source.
    let mut m = CreateMerger::new(request());
    m.apply(
        &a(),
        adjusting(|adj| adj.mounts.push(mount("/data", "/new"))),
    )
    .expect("replace");
    let at: Vec<_> = view(&m)
        .mounts
        .iter()
        .filter(|x| x.destination == "/data")
        .collect();
    assert_eq!(at.len(), 1);
    assert_eq!(at[0].source, "/new");

    // Removing an original mount: gone from the view, a marker in the adjustment.
    let mut m = CreateMerger::new(request());
    m.apply(&a(), adjusting(|adj| adj.mounts.push(mount("-/data", ""))))
        .expect("remove");
    assert!(view(&m).mounts.is_empty());
    assert_eq!(m.adjustment().mounts, vec![mount("-/data", "")]);

    // Removing a mount an earlier plugin added drops it from the adjustment.
    let r = two(
        adjusting(|adj| adj.mounts.push(mount("/cache", "/x"))),
        adjusting(|adj| adj.mounts.push(mount("-/cache", ""))),
    )
    .expect("remove earlier");
    assert!(!r.adjust.mounts.iter().any(|x| x.destination == "/cache"));
    assert!(!r.container.mounts.iter().any(|x| x.destination == "/cache"));
    assert_eq!(
        r.container_owners()
            .and_then(|o| o.compound_owner(Field::Mounts, "/cache")),
        Some("-20-b")
    );
}

#[test]
fn devices_by_path() {
    let dev = |path: &str| api::LinuxDevice {
        path: path.into(),
        r#type: "c".into(),
        ..Default::default()
    };
    let err = two(
        adjusting_linux(|l| l.devices.push(dev("/dev/nvidia0"))),
        adjusting_linux(|l| l.devices.push(dev("/dev/nvidia0"))),
    )
    .expect_err("conflict");
    assert_eq!(err, conflict(Field::Devices, Some("/dev/nvidia0")));

    let r = two(
        adjusting_linux(|l| l.devices.push(dev("/dev/nvidia0"))),
        adjusting_linux(|l| l.devices.push(dev("-/dev/fuse"))),
    )
    .expect("merge");
    let devices = &r.container.linux.as_ref().expect("linux").devices;
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].path, "/dev/nvidia0");
    let adjusted: Vec<&str> = r
        .adjust
        .linux
        .as_ref()
        .expect("linux")
        .devices
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert_eq!(adjusted, vec!["/dev/nvidia0", "-/dev/fuse"]);
}

#[test]
fn env_by_name() {
    let kv = |k: &str, v: &str| api::KeyValue {
        key: k.into(),
        value: v.into(),
    };
    let err = two(
        adjusting(|adj| adj.env.push(kv("X", "1"))),
        adjusting(|adj| adj.env.push(kv("X", "2"))),
    )
    .expect_err("conflict");
    assert_eq!(err, conflict(Field::Env, Some("X")));

    let r = two(
        adjusting(|adj| adj.env.push(kv("X", "1"))),
        adjusting(|adj| adj.env.push(kv("-PATH", ""))),
    )
    .expect("merge");
    assert_eq!(r.container.env, vec!["A=1".to_string(), "X=1".to_string()]);
    assert_eq!(r.adjust.env, vec![kv("X", "1"), kv("-PATH", "")]);
}

#[test]
fn hooks_append_from_every_plugin() {
    let hook = |p: &str| api::Hook {
        path: p.into(),
        ..Default::default()
    };
    let r = two(
        adjusting(|adj| {
            adj.hooks = Some(api::Hooks {
                prestart: vec![hook("/a")],
                ..Default::default()
            })
        }),
        adjusting(|adj| {
            adj.hooks = Some(api::Hooks {
                prestart: vec![hook("/b")],
                poststop: vec![hook("/b-stop")],
                ..Default::default()
            })
        }),
    )
    .expect("hooks never conflict");
    let hooks = r.adjust.hooks.as_ref().expect("hooks");
    assert_eq!(hooks.prestart, vec![hook("/a"), hook("/b")]);
    assert_eq!(hooks.poststop, vec![hook("/b-stop")]);
    assert_eq!(
        r.container.hooks.as_ref().expect("hooks").prestart,
        vec![hook("/a"), hook("/b")]
    );
    assert_eq!(
        r.container_owners()
            .and_then(|o| o.simple_owner(Field::OciHooks)),
        Some("10-a,20-b")
    );
}

/// One LinuxResources per whole or keyed resource field, with the field it claims.
fn resource_cases() -> Vec<(Field, Option<&'static str>, api::LinuxResources)> {
    let mem = |f: fn(&mut api::LinuxMemory)| {
        let mut m = api::LinuxMemory::default();
        f(&mut m);
        api::LinuxResources {
            memory: Some(m),
            ..Default::default()
        }
    };
    let cpu = |f: fn(&mut api::LinuxCpu)| {
        let mut c = api::LinuxCpu::default();
        f(&mut c);
        api::LinuxResources {
            cpu: Some(c),
            ..Default::default()
        }
    };
    vec![
        (
            Field::MemLimit,
            None,
            mem(|m| m.limit = Some(api::OptionalInt64 { value: 1 })),
        ),
        (
            Field::MemReservation,
            None,
            mem(|m| m.reservation = Some(api::OptionalInt64 { value: 1 })),
        ),
        (
            Field::MemSwapLimit,
            None,
            mem(|m| m.swap = Some(api::OptionalInt64 { value: 1 })),
        ),
        (
            Field::MemKernelLimit,
            None,
            mem(|m| m.kernel = Some(api::OptionalInt64 { value: 1 })),
        ),
        (
            Field::MemTcpLimit,
            None,
            mem(|m| m.kernel_tcp = Some(api::OptionalInt64 { value: 1 })),
        ),
        (
            Field::MemSwappiness,
            None,
            mem(|m| m.swappiness = Some(api::OptionalUInt64 { value: 1 })),
        ),
        (
            Field::MemDisableOomKiller,
            None,
            mem(|m| m.disable_oom_killer = Some(api::OptionalBool { value: true })),
        ),
        (
            Field::MemUseHierarchy,
            None,
            mem(|m| m.use_hierarchy = Some(api::OptionalBool { value: true })),
        ),
        (
            Field::CpuShares,
            None,
            cpu(|c| c.shares = Some(api::OptionalUInt64 { value: 2 })),
        ),
        (
            Field::CpuQuota,
            None,
            cpu(|c| c.quota = Some(api::OptionalInt64 { value: 2 })),
        ),
        (
            Field::CpuPeriod,
            None,
            cpu(|c| c.period = Some(api::OptionalUInt64 { value: 2 })),
        ),
        (
            Field::CpuRealtimeRuntime,
            None,
            cpu(|c| c.realtime_runtime = Some(api::OptionalInt64 { value: 2 })),
        ),
        (
            Field::CpuRealtimePeriod,
            None,
            cpu(|c| c.realtime_period = Some(api::OptionalUInt64 { value: 2 })),
        ),
        (Field::CpuSetCpUs, None, cpu(|c| c.cpus = "1".into())),
        (Field::CpuSetMems, None, cpu(|c| c.mems = "0".into())),
        (
            Field::PidsLimit,
            None,
            api::LinuxResources {
                pids: Some(api::LinuxPids { limit: 10 }),
                ..Default::default()
            },
        ),
        (
            Field::BlockioClass,
            None,
            api::LinuxResources {
                blockio_class: Some(api::OptionalString { value: "x".into() }),
                ..Default::default()
            },
        ),
        (
            Field::RdtClass,
            None,
            api::LinuxResources {
                rdt_class: Some(api::OptionalString { value: "x".into() }),
                ..Default::default()
            },
        ),
        (
            Field::HugepageLimits,
            Some("2MB"),
            api::LinuxResources {
                hugepage_limits: vec![api::HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 1 << 21,
                }],
                ..Default::default()
            },
        ),
        (
            Field::CgroupsUnified,
            Some("memory.high"),
            api::LinuxResources {
                unified: HashMap::from([("memory.high".to_string(), "1M".to_string())]),
                ..Default::default()
            },
        ),
    ]
}

#[test]
fn every_resource_field_is_owned() {
    for (field, key, res) in resource_cases() {
        let err = two(with_resources(res.clone()), with_resources(res.clone()))
            .expect_err("resource conflict");
        assert_eq!(err, conflict(field, key), "{field:?}");
        assert!(err
            .to_string()
            .contains(r#"plugins "10-a" and "20-b" both adjust"#));
    }
    // Different subfields of one resource do not conflict.
    let cases = resource_cases();
    let r = two(
        with_resources(cases[8].2.clone()),
        with_resources(cases[9].2.clone()),
    )
    .expect("shares and quota");
    let cpu = r
        .adjust
        .linux
        .and_then(|l| l.resources)
        .and_then(|r| r.cpu)
        .expect("cpu");
    assert!(cpu.shares.is_some() && cpu.quota.is_some());
}

#[test]
fn every_other_whole_field_is_owned() {
    type Set = fn(&mut api::LinuxContainerAdjustment);
    let cases: [(Field, Set); 9] = [
        (Field::CgroupsPath, |l| l.cgroups_path = "/x".into()),
        (Field::OomScoreAdj, |l| {
            l.oom_score_adj = Some(api::OptionalInt { value: 5 })
        }),
        (Field::IoPriority, |l| {
            l.io_priority = Some(api::LinuxIoPriority {
                class: 2, // best effort
                priority: 4,
            })
        }),
        (Field::SeccompPolicy, |l| {
            l.seccomp_policy = Some(api::LinuxSeccomp {
                default_action: "SCMP_ACT_ALLOW".into(),
                ..Default::default()
            })
        }),
        (Field::LinuxSched, |l| {
            l.scheduler = Some(api::LinuxScheduler {
                nice: 5,
                ..Default::default()
            })
        }),
        (Field::MemoryPolicy, |l| {
            l.memory_policy = Some(api::LinuxMemoryPolicy {
                nodes: "0".into(),
                ..Default::default()
            })
        }),
        (Field::RdtClosId, |l| {
            l.rdt = Some(api::LinuxRdt {
                clos_id: Some(api::OptionalString { value: "c".into() }),
                ..Default::default()
            })
        }),
        (Field::RdtSchemata, |l| {
            l.rdt = Some(api::LinuxRdt {
                schemata: Some(api::OptionalRepeatedString {
                    value: vec!["L3:0=f".into()],
                }),
                ..Default::default()
            })
        }),
        (Field::RdtEnableMonitoring, |l| {
            l.rdt = Some(api::LinuxRdt {
                enable_monitoring: Some(api::OptionalBool { value: true }),
                ..Default::default()
            })
        }),
    ];
    for (field, f) in cases {
        let err = two(adjusting_linux(f), adjusting_linux(f)).expect_err("conflict");
        assert_eq!(err, conflict(field, None), "{field:?}");
    }
}

#[test]
fn keyed_linux_fields_are_owned_per_key() {
    type Set = fn(&mut api::LinuxContainerAdjustment, &str);
    let cases: [(Field, Set); 3] = [
        (Field::Namespace, |l, k| {
            l.namespaces.push(api::LinuxNamespace {
                r#type: k.into(),
                path: "/proc/1/ns/x".into(),
            })
        }),
        (Field::Sysctl, |l, k| {
            l.sysctl.insert(k.into(), "1".into());
        }),
        (Field::LinuxNetDevices, |l, k| {
            l.net_devices.insert(
                k.into(),
                api::LinuxNetDevice {
                    name: "eth9".into(),
                },
            );
        }),
    ];
    for (field, f) in cases {
        let err = two(
            adjusting_linux(|l| f(l, "k1")),
            adjusting_linux(|l| f(l, "k1")),
        )
        .expect_err("conflict");
        assert_eq!(err, conflict(field, Some("k1")), "{field:?}");
        two(
            adjusting_linux(|l| f(l, "k1")),
            adjusting_linux(|l| f(l, "k2")),
        )
        .expect("different keys");
    }
}

#[test]
fn namespace_removal_claims_the_type() {
    let ns = |t: &str| api::LinuxNamespace {
        r#type: t.into(),
        path: String::new(),
    };
    let err = two(
        adjusting_linux(|l| l.namespaces.push(ns("network"))),
        adjusting_linux(|l| l.namespaces.push(ns("-network"))),
    )
    .expect_err("removal of a claimed namespace conflicts");
    assert_eq!(err, conflict(Field::Namespace, Some("network")));
}

#[test]
fn rlimits_and_cdi_devices_per_key() {
    let rl = |t: &str, n: u64| api::PosixRlimit {
        r#type: t.into(),
        hard: n,
        soft: n,
    };
    let err = two(
        adjusting(|adj| adj.rlimits.push(rl("RLIMIT_NOFILE", 10))),
        adjusting(|adj| adj.rlimits.push(rl("RLIMIT_NOFILE", 20))),
    )
    .expect_err("conflict");
    assert_eq!(err, conflict(Field::Rlimits, Some("RLIMIT_NOFILE")));
    let r = two(
        adjusting(|adj| adj.rlimits.push(rl("RLIMIT_NOFILE", 10))),
        adjusting(|adj| adj.rlimits.push(rl("RLIMIT_NPROC", 20))),
    )
    .expect("different types");
    assert_eq!(r.container.rlimits.len(), 2);

    let cdi = |n: &str| api::CdiDevice { name: n.into() };
    let err = two(
        adjusting(|adj| adj.cdi_devices.push(cdi("vendor.com/gpu=0"))),
        adjusting(|adj| adj.cdi_devices.push(cdi("vendor.com/gpu=0"))),
    )
    .expect_err("conflict");
    assert_eq!(err, conflict(Field::CdiDevices, Some("vendor.com/gpu=0")));
}

#[test]
fn args_are_owned_and_a_leading_empty_string_takes_over() {
    let args = |v: &[&str]| {
        let v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        adjusting(move |adj| adj.args = v)
    };
    let err = two(args(&["a"]), args(&["b"])).expect_err("conflict");
    assert_eq!(err, conflict(Field::Args, None));
    let r = two(args(&["a"]), args(&["", "b", "c"])).expect("take over");
    assert_eq!(r.container.args, vec!["b".to_string(), "c".to_string()]);
    assert_eq!(r.adjust.args, vec!["b".to_string(), "c".to_string()]);
}

#[test]
fn one_plugin_setting_a_key_twice_is_refused() {
    let mut m = CreateMerger::new(request());
    let err = m
        .apply(
            &a(),
            adjusting(|adj| {
                adj.env.push(api::KeyValue {
                    key: "X".into(),
                    value: "1".into(),
                });
                adj.env.push(api::KeyValue {
                    key: "X".into(),
                    value: "2".into(),
                });
            }),
        )
        .expect_err("ambiguous");
    assert_eq!(
        err.to_string(),
        r#"plugins "10-a" and "10-a" both adjust environment variable "X""#
    );
}

fn update(id: &str, res: api::LinuxResources, ignore_failure: bool) -> api::ContainerUpdate {
    api::ContainerUpdate {
        container_id: id.into(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(res),
        }),
        ignore_failure,
    }
}

fn shares(v: u64) -> api::LinuxResources {
    api::LinuxResources {
        cpu: Some(api::LinuxCpu {
            shares: Some(api::OptionalUInt64 { value: v }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mem_limit(v: i64) -> api::LinuxResources {
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: Some(api::OptionalInt64 { value: v }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn updating(updates: Vec<api::ContainerUpdate>) -> api::CreateContainerResponse {
    api::CreateContainerResponse {
        update: updates,
        ..Default::default()
    }
}

#[test]
fn create_collects_updates_of_other_containers() {
    let r = two(
        updating(vec![update("c2", shares(100), false)]),
        updating(vec![update("c2", mem_limit(1 << 20), false)]),
    )
    .expect("merge");
    assert_eq!(r.updates.len(), 1);
    let res = r.updates[0]
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .expect("resources");
    assert!(res.cpu.is_some() && res.memory.is_some());
    assert_eq!(
        r.owners
            .container("c2")
            .and_then(|o| o.simple_owner(Field::MemLimit)),
        Some("20-b")
    );

    let err = two(
        updating(vec![update("c2", shares(100), false)]),
        updating(vec![update("c2", shares(200), false)]),
    )
    .expect_err("conflict");
    assert_eq!(err, conflict(Field::CpuShares, None));

    let mut m = CreateMerger::new(request());
    let err = m
        .apply(&a(), updating(vec![update("c1", shares(1), false)]))
        .expect_err("own container");
    assert!(matches!(err, MergeError::UpdateOfCreatedContainer { .. }));
}

#[test]
fn conflicting_update_with_ignore_failure_is_dropped_without_claims() {
    let r = two(
        updating(vec![update("c2", shares(100), false)]),
        updating(vec![update(
            "c2",
            {
                let mut res = shares(200);
                res.memory = mem_limit(5).memory;
                res
            },
            true,
        )]),
    )
    .expect("dropped, not fatal");
    assert_eq!(r.rejected.len(), 1);
    assert_eq!(r.rejected[0].plugin, "20-b");
    assert_eq!(r.rejected[0].error, conflict(Field::CpuShares, None));
    // The dropped update's memory limit was not claimed nor merged.
    let owners = r.owners.container("c2").expect("owners");
    assert_eq!(owners.simple_owner(Field::MemLimit), None);
    let res = r.updates[0]
        .linux
        .as_ref()
        .and_then(|l| l.resources.as_ref())
        .expect("resources");
    assert!(res.memory.is_none());
}

#[test]
fn create_collects_evictions() {
    let r = two(
        api::CreateContainerResponse {
            evict: vec![api::ContainerEviction {
                container_id: "c9".into(),
                reason: "make room".into(),
            }],
            ..Default::default()
        },
        api::CreateContainerResponse::default(),
    )
    .expect("merge");
    assert_eq!(r.evictions.len(), 1);
    assert_eq!(r.evictions[0].plugin, "10-a");
    assert_eq!(r.response().evict[0].container_id, "c9");
    assert_eq!(r.plugins, vec![a(), b()]);
}

fn update_request() -> api::UpdateContainerRequest {
    api::UpdateContainerRequest {
        pod: None,
        container: Some(api::Container {
            id: "c1".into(),
            ..Default::default()
        }),
        linux_resources: Some(mem_limit(1 << 30)),
    }
}

#[test]
fn update_merger_applies_target_changes_and_checks_conflicts() {
    let mut m = UpdateMerger::for_update(&update_request());
    m.apply(&a(), vec![update("c1", shares(300), false)])
        .expect("apply");
    let res = m.resources().expect("target");
    assert_eq!(
        res.cpu.as_ref().and_then(|c| c.shares),
        Some(api::OptionalUInt64 { value: 300 })
    );
    assert!(res.memory.is_some(), "requested resources are kept");
    let err = m
        .apply(&b(), vec![update("c1", shares(400), false)])
        .expect_err("conflict");
    assert_eq!(err, conflict(Field::CpuShares, None));

    let mut m = UpdateMerger::for_update(&update_request());
    m.apply(&a(), vec![update("c2", shares(1), true)])
        .expect("apply");
    let r = m.finish();
    assert_eq!(r.target_resources, None, "nobody changed the target");
    assert_eq!(r.updates.len(), 1);
    assert!(r.updates[0].ignore_failure);
}

#[test]
fn stop_merger_merges_per_container() {
    let mut m = UpdateMerger::for_stop();
    m.apply(&a(), vec![update("c2", shares(1), true)])
        .expect("a");
    m.apply(&b(), vec![update("c2", mem_limit(1), false)])
        .expect("b");
    let r = m.finish();
    assert_eq!(r.updates.len(), 1);
    assert!(
        !r.updates[0].ignore_failure,
        "one update that must not fail"
    );
    assert_eq!(r.plugins, vec![a(), b()]);
}

/// Owners as the runtime would have recorded them from a CreateContainer of c1 in
/// which plugin a set the memory limit.
fn recorded() -> api::OwningPlugins {
    let mut m = CreateMerger::new(request());
    m.apply(&a(), with_resources(mem_limit(1 << 20)))
        .expect("create");
    m.finish().owners
}

#[test]
fn plugin_updates_are_checked_against_recorded_owners() {
    let recorded = recorded();
    let req = |res| api::UpdateContainersRequest {
        update: vec![update("c1", res, false)],
        evict: Vec::new(),
    };

    let err = check_plugin_updates(&b(), &req(mem_limit(2 << 20)), &recorded)
        .expect_err("b may not change a's field");
    assert_eq!(err, conflict(Field::MemLimit, None));

    check_plugin_updates(&a(), &req(mem_limit(2 << 20)), &recorded)
        .expect("a may change its own field");

    let ok = check_plugin_updates(&b(), &req(shares(10)), &recorded).expect("free field");
    assert_eq!(
        ok.owners
            .container("c1")
            .and_then(|o| o.simple_owner(Field::CpuShares)),
        Some("20-b")
    );
    let mut recorded = recorded;
    recorded.absorb(&ok.owners);
    let err =
        check_plugin_updates(&a(), &req(shares(20)), &recorded).expect_err("now b owns the shares");
    assert_eq!(
        err,
        MergeError::Conflict {
            field: Field::CpuShares,
            key: None,
            first: "20-b".into(),
            second: "10-a".into(),
        }
    );
    // The memory limit is still a's.
    assert_eq!(
        recorded
            .container("c1")
            .and_then(|o| o.simple_owner(Field::MemLimit)),
        Some("10-a")
    );
}

#[test]
fn plugin_updates_conflicting_within_the_request() {
    let req = api::UpdateContainersRequest {
        update: vec![
            update("c1", shares(1), false),
            update("c1", shares(2), false),
        ],
        evict: Vec::new(),
    };
    let err = check_plugin_updates(&a(), &req, &api::OwningPlugins::default())
        .expect_err("twice in one request");
    assert_eq!(
        err.to_string(),
        r#"plugins "10-a" and "10-a" both adjust CPU shares"#
    );

    let req = api::UpdateContainersRequest {
        update: vec![update("c1", mem_limit(1), true)],
        evict: Vec::new(),
    };
    let r = check_plugin_updates(&b(), &req, &recorded()).expect("ignore_failure");
    assert_eq!(r.rejected.len(), 1);
    assert!(r.updates.is_empty());

    let req = api::UpdateContainersRequest {
        update: vec![update("", shares(1), false)],
        evict: Vec::new(),
    };
    assert!(matches!(
        check_plugin_updates(&a(), &req, &api::OwningPlugins::default()),
        Err(MergeError::MissingContainerId { .. })
    ));
}

#[test]
fn update_merger_checks_recorded_owners_of_the_target() {
    let recorded = recorded();
    let mut m = UpdateMerger::for_update(&update_request()).with_recorded_owners(&recorded);
    let err = m
        .apply(&b(), vec![update("c1", mem_limit(5), false)])
        .expect_err("a owns the memory limit");
    assert_eq!(err, conflict(Field::MemLimit, None));
}

#[test]
fn registration_names_the_plugin_instance() {
    let reg = crate::adaptation::Registration {
        name: "a".into(),
        index: "10".into(),
        nri_version: String::new(),
    };
    let instance = api::PluginInstance::from(&reg);
    assert_eq!(instance, a());
    assert_eq!(
        crate::adaptation::owners::qualified_name(&instance),
        reg.qualified_name()
    );
}
