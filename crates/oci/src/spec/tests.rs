//! Tests of the whole spec builder (the parts have their own tests in their modules).

use super::*;
use oci_spec::image::ConfigBuilder;

struct Fixture {
    rootfs: tempfile::TempDir,
    config: api::ContainerConfig,
    sandbox_config: api::PodSandboxConfig,
    image: oci_spec::image::Config,
    sandbox: SandboxContext,
    host: HostLimits,
}

impl Fixture {
    fn new() -> Self {
        let rootfs = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(rootfs.path().join("etc")).expect("mkdir");
        std::fs::write(
            rootfs.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\nweb:x:33:33::/var/www:/bin/sh\n",
        )
        .expect("write");
        std::fs::write(rootfs.path().join("etc/group"), "root:x:0:\nweb:x:33:\n").expect("write");
        Self {
            rootfs,
            config: api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: "app".into(),
                    attempt: 0,
                }),
                image: Some(api::ImageSpec {
                    image: "sha256:abc".into(),
                    user_specified_image: "busybox:1.36".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            sandbox_config: api::PodSandboxConfig {
                metadata: Some(api::PodSandboxMetadata {
                    name: "pod".into(),
                    uid: "uid-1".into(),
                    namespace: "default".into(),
                    attempt: 0,
                }),
                ..Default::default()
            },
            image: ConfigBuilder::default()
                .cmd(vec!["/bin/sh".to_string()])
                .build()
                .expect("image config"),
            sandbox: SandboxContext {
                network: NamespaceRef::Path("/run/netns/pod".into()),
                ipc: NamespaceRef::Path("/proc/42/ns/ipc".into()),
                uts: NamespaceRef::Path("/proc/42/ns/uts".into()),
                pid: NamespaceRef::Path("/proc/42/ns/pid".into()),
                hostname: "pod-host".into(),
                etc_hostname: None,
                etc_hosts: None,
                resolv_conf: None,
                shm: None,
                cgroup_parent: "/kubepods/burstable/pod123".into(),
                cgroup_driver: Default::default(),
                user: None,
            },
            host: HostLimits {
                bounding_caps: caps_from_mask(0x0000_01ff_feff_ffff),
                min_oom_score_adj: -500,
                open_files: None,
                online_cpus: None,
                online_mems: None,
                hugetlb: true,
                recursive_read_only: true,
                user_namespaces: false,
                cgroup_namespaces: false,
            },
        }
    }

    fn sc(&mut self) -> &mut api::LinuxContainerSecurityContext {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
    }

    /// A privileged container in a privileged sandbox.
    fn privileged(&mut self) {
        self.sc().privileged = true;
        self.sandbox_config
            .linux
            .get_or_insert_with(Default::default)
            .security_context
            .get_or_insert_with(Default::default)
            .privileged = true;
    }

    fn resources(&mut self) -> &mut api::LinuxContainerResources {
        self.config
            .linux
            .get_or_insert_with(Default::default)
            .resources
            .get_or_insert_with(Default::default)
    }

    fn build(&self) -> Result<Spec, SpecError> {
        build_container_spec(&ContainerSpecInput {
            id: "c0ffee",
            config: &self.config,
            sandbox_config: &self.sandbox_config,
            image_config: Some(&self.image),
            rootfs: self.rootfs.path(),
            users: None,
            sandbox: &self.sandbox,
            host: &self.host,
            image_volumes: &Default::default(),
        })
    }
}

fn linux(spec: &Spec) -> &Linux {
    spec.linux().as_ref().expect("linux")
}

fn process(spec: &Spec) -> &Process {
    spec.process().as_ref().expect("process")
}

fn ns(spec: &Spec) -> Vec<(LinuxNamespaceType, Option<PathBuf>)> {
    linux(spec)
        .namespaces()
        .iter()
        .flatten()
        .map(|n| (n.typ(), n.path().clone()))
        .collect()
}

#[test]
fn build_container_spec_should_produce_a_runnable_default_spec() {
    let f = Fixture::new();
    let spec = f.build().expect("spec");
    assert_eq!(spec.version(), "1.0.2");
    let p = process(&spec);
    assert_eq!(p.args().as_deref(), Some(&["/bin/sh".to_string()][..]));
    assert_eq!(p.cwd(), Path::new("/"));
    assert_eq!((p.user().uid(), p.user().gid()), (0, 0));
    assert_eq!(p.terminal(), Some(false));
    assert_eq!(p.no_new_privileges(), Some(false));
    assert_eq!(p.rlimits(), &None);
    assert_eq!(p.oom_score_adj(), None, "no resources, no oom_score_adj");
    let root = spec.root().as_ref().expect("root");
    assert_eq!(root.path(), f.rootfs.path());
    assert_eq!(root.readonly(), Some(false));
    assert_eq!(spec.hostname().as_deref(), Some("pod-host"));
    assert_eq!(linux(&spec).seccomp(), &None);
    // It serialises to what runc reads.
    let json = serde_json::to_value(&spec).expect("json");
    assert_eq!(
        json["linux"]["cgroupsPath"],
        "/kubepods/burstable/pod123/c0ffee"
    );
    assert_eq!(
        json["process"]["user"]["additionalGids"],
        serde_json::json!([0])
    );
}

#[test]
fn build_container_spec_should_join_sandbox_namespaces_by_path() {
    let f = Fixture::new();
    let spec = f.build().expect("spec");
    assert_eq!(
        ns(&spec),
        [
            (LinuxNamespaceType::Pid, Some("/proc/42/ns/pid".into())),
            (LinuxNamespaceType::Network, Some("/run/netns/pod".into())),
            (LinuxNamespaceType::Ipc, Some("/proc/42/ns/ipc".into())),
            (LinuxNamespaceType::Uts, Some("/proc/42/ns/uts".into())),
            (LinuxNamespaceType::Mount, None),
        ]
    );
}

#[test]
fn build_container_spec_should_map_pid_modes() {
    let mut f = Fixture::new();
    f.sc().namespace_options = Some(api::NamespaceOption {
        pid: api::NamespaceMode::Container as i32,
        ..Default::default()
    });
    let spec = f.build().expect("spec");
    assert_eq!(ns(&spec)[0], (LinuxNamespaceType::Pid, None));

    f.sc().namespace_options = Some(api::NamespaceOption {
        pid: api::NamespaceMode::Node as i32,
        ..Default::default()
    });
    let spec = f.build().expect("spec");
    assert!(!ns(&spec).iter().any(|(t, _)| *t == LinuxNamespaceType::Pid));

    f.sc().namespace_options = Some(api::NamespaceOption {
        pid: api::NamespaceMode::Target as i32,
        target_id: "other".into(),
        ..Default::default()
    });
    let err = f.build().expect_err("should fail");
    assert!(
        matches!(&err, SpecError::Invalid { field, .. }
            if field == "linux.security_context.namespace_options.pid"),
        "{err}"
    );
}

#[test]
fn build_container_spec_should_omit_host_namespaces_and_hostname() {
    let mut f = Fixture::new();
    f.sandbox.network = NamespaceRef::Host;
    f.sandbox.uts = NamespaceRef::Host;
    f.sandbox.ipc = NamespaceRef::New;
    let spec = f.build().expect("spec");
    let types: Vec<_> = ns(&spec).into_iter().collect();
    assert_eq!(
        types,
        [
            (LinuxNamespaceType::Pid, Some("/proc/42/ns/pid".into())),
            (LinuxNamespaceType::Ipc, None),
            (LinuxNamespaceType::Mount, None),
        ]
    );
    assert_eq!(spec.hostname(), &None);
}

#[test]
fn build_container_spec_should_give_a_cgroup_namespace_on_v2_except_when_privileged() {
    let mut f = Fixture::new();
    let has_cgroupns =
        |spec: &Spec| ns(spec).contains(&(LinuxNamespaceType::Cgroup, None::<PathBuf>));
    assert!(!has_cgroupns(&f.build().expect("spec")), "v1: none");
    f.host.cgroup_namespaces = true;
    assert!(has_cgroupns(&f.build().expect("spec")), "v2: its own");
    f.privileged();
    assert!(
        !has_cgroupns(&f.build().expect("spec")),
        "privileged: the host's"
    );
}

#[test]
fn build_container_spec_should_reject_user_namespaces() {
    let mut f = Fixture::new();
    f.sc().namespace_options = Some(api::NamespaceOption {
        userns_options: Some(api::UserNamespace {
            mode: api::NamespaceMode::Pod as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(matches!(f.build(), Err(SpecError::Invalid { .. })));
    // NODE (the host's user namespace) is what kubelet sends by default.
    f.sc().namespace_options = Some(api::NamespaceOption {
        userns_options: Some(api::UserNamespace {
            mode: api::NamespaceMode::Node as i32,
            ..Default::default()
        }),
        pid: api::NamespaceMode::Container as i32,
        ..Default::default()
    });
    f.build().expect("spec");
}

#[test]
fn build_container_spec_should_clamp_oom_score_adj_to_ours() {
    let mut f = Fixture::new();
    f.resources().oom_score_adj = -998;
    let spec = f.build().expect("spec");
    assert_eq!(process(&spec).oom_score_adj(), Some(-500));
    f.resources().oom_score_adj = 1000;
    let spec = f.build().expect("spec");
    assert_eq!(process(&spec).oom_score_adj(), Some(1000));
    f.resources().oom_score_adj = 1001;
    assert!(matches!(f.build(), Err(SpecError::Invalid { .. })));
}

#[test]
fn build_container_spec_should_give_the_process_the_hosts_open_file_limit() {
    let mut f = Fixture::new();
    let spec = f.build().expect("spec");
    assert_eq!(process(&spec).rlimits(), &None);
    f.host.open_files = Some(OpenFileLimit {
        soft: 1024,
        hard: 524_288,
    });
    let spec = f.build().expect("spec");
    let limits = process(&spec).rlimits().clone().expect("rlimits");
    assert_eq!(limits.len(), 1);
    assert_eq!(limits[0].typ(), PosixRlimitType::RlimitNofile);
    assert_eq!((limits[0].soft(), limits[0].hard()), (1024, 524_288));
}

#[test]
fn build_container_spec_should_set_resources_and_default_device_rules() {
    let mut f = Fixture::new();
    f.resources().memory_limit_in_bytes = 64 << 20;
    f.resources().cpu_shares = 256;
    let spec = f.build().expect("spec");
    let res = linux(&spec).resources().as_ref().expect("resources");
    assert_eq!(
        res.memory().as_ref().and_then(|m| m.limit()),
        Some(64 << 20)
    );
    assert_eq!(res.cpu().as_ref().and_then(|c| c.shares()), Some(256));
    let rules = res.devices().as_ref().expect("device rules");
    assert!(!rules[0].allow());
    assert!(rules.len() > 5);

    f.resources().cpu_shares = -3;
    let err = f.build().expect_err("should fail");
    assert!(
        matches!(&err, SpecError::Invalid { field, .. } if field == "resources.cpu_shares"),
        "{err}"
    );
}

#[test]
fn build_container_spec_should_mask_default_paths_unless_overridden() {
    let mut f = Fixture::new();
    let spec = f.build().expect("spec");
    let masked = linux(&spec).masked_paths().clone().expect("masked");
    assert!(masked.contains(&"/proc/kcore".to_string()));
    assert!(masked.contains(&"/sys/firmware".to_string()));
    let ro = linux(&spec).readonly_paths().clone().expect("readonly");
    assert!(ro.contains(&"/proc/sys".to_string()));

    f.sc().masked_paths = vec!["/proc/custom".into()];
    f.sc().readonly_paths = vec!["/proc/ro".into()];
    let spec = f.build().expect("spec");
    assert_eq!(
        linux(&spec).masked_paths().as_deref(),
        Some(&["/proc/custom".to_string()][..])
    );
    assert_eq!(
        linux(&spec).readonly_paths().as_deref(),
        Some(&["/proc/ro".to_string()][..])
    );
}

#[test]
fn build_container_spec_should_open_up_privileged_containers() {
    let mut f = Fixture::new();
    f.sc().privileged = true;
    let err = f.build().expect_err("should fail");
    assert!(
        matches!(&err, SpecError::Invalid { field, .. } if field == "linux.security_context.privileged"),
        "{err}"
    );

    f.sandbox_config.linux = Some(api::LinuxPodSandboxConfig {
        security_context: Some(api::LinuxSandboxSecurityContext {
            privileged: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    let spec = f.build().expect("spec");
    let l = linux(&spec);
    assert_eq!(l.masked_paths().as_deref(), Some(&[][..]));
    assert_eq!(l.readonly_paths().as_deref(), Some(&[][..]));
    let rules = l
        .resources()
        .as_ref()
        .and_then(|r| r.devices().clone())
        .expect("rules");
    assert_eq!(rules.len(), 1);
    assert!(rules[0].allow());
    let caps = process(&spec).capabilities().as_ref().expect("caps");
    let bounding = caps.bounding().as_ref().expect("bounding");
    assert_eq!(bounding.len(), 40);
    assert!(!bounding.contains(&oci_spec::runtime::Capability::SysResource));
    assert!(l.devices().as_ref().is_some_and(|d| !d.is_empty()));
    let sys = spec
        .mounts()
        .iter()
        .flatten()
        .find(|m| m.destination() == Path::new("/sys"))
        .expect("sys");
    assert!(sys.options().iter().flatten().any(|o| o == "rw"));
}

#[test]
fn build_container_spec_should_apply_security_context_flags() {
    let mut f = Fixture::new();
    f.sc().readonly_rootfs = true;
    f.sc().no_new_privs = true;
    f.sc().run_as_username = "web".into();
    f.config.tty = true;
    let spec = f.build().expect("spec");
    assert_eq!(spec.root().as_ref().and_then(|r| r.readonly()), Some(true));
    let p = process(&spec);
    assert_eq!(p.no_new_privileges(), Some(true));
    assert_eq!(p.terminal(), Some(true));
    assert_eq!((p.user().uid(), p.user().gid()), (33, 33));
}

#[test]
fn build_container_spec_should_copy_sysctls_and_refuse_host_namespaced_ones() {
    let mut f = Fixture::new();
    let mut sysctls = HashMap::new();
    sysctls.insert(
        "net.ipv4.ip_unprivileged_port_start".to_string(),
        "0".to_string(),
    );
    sysctls.insert("kernel.shm_rmid_forced".to_string(), "1".to_string());
    f.sandbox_config.linux = Some(api::LinuxPodSandboxConfig {
        sysctls,
        ..Default::default()
    });
    let spec = f.build().expect("spec");
    let got = linux(&spec).sysctl().clone().expect("sysctl");
    assert_eq!(
        got.get("kernel.shm_rmid_forced").map(String::as_str),
        Some("1")
    );
    assert_eq!(got.len(), 2);

    f.sandbox.network = NamespaceRef::Host;
    let err = f.build().expect_err("should fail");
    assert!(
        err.to_string()
            .contains("net.ipv4.ip_unprivileged_port_start"),
        "{err}"
    );
}

#[test]
fn build_container_spec_should_copy_annotations_and_add_cri_keys() {
    let mut f = Fixture::new();
    f.config
        .annotations
        .insert("io.kubernetes.container.hash".into(), "abc".into());
    let spec = f.build().expect("spec");
    let a = spec.annotations().as_ref().expect("annotations");
    let get = |k: &str| a.get(k).map(String::as_str);
    assert_eq!(get("io.kubernetes.container.hash"), Some("abc"));
    assert_eq!(get(annotations::CONTAINER_TYPE), Some("container"));
    assert_eq!(get(annotations::CONTAINER_NAME), Some("app"));
    assert_eq!(get(annotations::IMAGE_NAME), Some("busybox:1.36"));
    assert_eq!(get(annotations::SANDBOX_NAME), Some("pod"));
    assert_eq!(get(annotations::SANDBOX_NAMESPACE), Some("default"));
    assert_eq!(get(annotations::SANDBOX_UID), Some("uid-1"));
}

#[test]
fn build_container_spec_should_apply_the_runtime_default_profile() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(api::SecurityProfile {
        profile_type: api::security_profile::ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    let spec = f.build().expect("spec");
    let s = linux(&spec).seccomp().as_ref().expect("seccomp");
    assert_eq!(
        s.default_action(),
        oci_spec::runtime::LinuxSeccompAction::ScmpActErrno
    );
    // The default capability set lacks SYS_ADMIN: unshare is not allowed.
    assert!(!s
        .syscalls()
        .iter()
        .flatten()
        .any(|r| r.names().iter().any(|n| n == "unshare")));
    // Adding SYS_ADMIN allows it (the profile follows the bounding set).
    f.sc().capabilities = Some(api::Capability {
        add_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    let spec = f.build().expect("spec");
    let s = linux(&spec).seccomp().as_ref().expect("seccomp");
    assert!(s
        .syscalls()
        .iter()
        .flatten()
        .any(|r| r.names().iter().any(|n| n == "unshare")));
}

#[test]
fn build_container_spec_should_apply_a_localhost_profile_unless_privileged() {
    let mut f = Fixture::new();
    let profile = f.rootfs.path().join("profile.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir"],"action":"SCMP_ACT_ERRNO"}]}"#,
    )
    .expect("write");
    #[allow(deprecated)]
    {
        f.sc().seccomp_profile_path = format!("localhost/{}", profile.display());
    }
    let spec = f.build().expect("spec");
    let s = linux(&spec).seccomp().as_ref().expect("seccomp");
    assert_eq!(
        s.default_action(),
        oci_spec::runtime::LinuxSeccompAction::ScmpActAllow
    );
    assert_eq!(s.syscalls().as_ref().map(Vec::len), Some(1));
    f.privileged();
    let spec = f.build().expect("spec");
    assert_eq!(linux(&spec).seccomp(), &None);
}

#[test]
fn build_container_spec_should_refuse_a_missing_profile_naming_the_field() {
    let mut f = Fixture::new();
    f.sc().seccomp = Some(api::SecurityProfile {
        profile_type: api::security_profile::ProfileType::Localhost as i32,
        localhost_ref: "/nonexistent/petrel-profile.json".into(),
    });
    match f.build() {
        Err(SpecError::Invalid { field, reason }) => {
            assert_eq!(field, "linux.security_context.seccomp.localhost_ref");
            assert!(
                reason.contains("/nonexistent/petrel-profile.json"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        check_container(&f.config, &f.sandbox_config, &f.host),
        Err(SpecError::Invalid { .. })
    ));
}

#[test]
fn build_container_spec_should_reject_cdi_devices() {
    let mut f = Fixture::new();
    f.config.cdi_devices = vec![api::CdiDevice {
        name: "vendor.com/gpu=0".into(),
    }];
    assert!(matches!(f.build(), Err(SpecError::Invalid { .. })));
}

#[test]
fn container_cgroup_path_should_join_parent_and_id() {
    assert_eq!(
        container_cgroup_path("/kubepods/pod1", "abc"),
        "/kubepods/pod1/abc"
    );
    assert_eq!(
        container_cgroup_path("/petrel/sb/", "abc"),
        "/petrel/sb/abc"
    );
    assert_eq!(container_cgroup_path("kubepods", "abc"), "/kubepods/abc");
    assert_eq!(container_cgroup_path("", "abc"), "/abc");
    assert_eq!(container_cgroup_path("/", "abc"), "/abc");
}

#[test]
fn host_limits_should_detect_this_process() {
    let h = HostLimits::detect().expect("detect");
    assert!(h.bounding_caps.iter().all(|c| c.starts_with("CAP_")));
    let own: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .expect("read")
        .trim()
        .parse()
        .expect("number");
    assert_eq!(h.min_oom_score_adj, own);
    assert_eq!(h.open_files, Some(OpenFileLimit::current()));
    let l = OpenFileLimit::current();
    assert!(l.soft > 0 && l.soft <= l.hard, "{l:?}");
}

fn pod_userns() -> api::UserNamespace {
    let map = |host_id| api::IdMapping {
        container_id: 0,
        host_id,
        length: 65536,
    };
    api::UserNamespace {
        mode: api::NamespaceMode::Pod as i32,
        uids: vec![map(100_000)],
        gids: vec![map(200_000)],
    }
}

fn with_pod_userns(f: &mut Fixture) -> UserMappings {
    let mappings = crate::userns::requested(Some(&pod_userns()), "f")
        .expect("valid")
        .expect("a userns");
    f.sandbox.user = Some(PodUserNamespace {
        path: "/run/petrel/sandboxes/sb/user".into(),
        mappings,
    });
    mappings
}

#[test]
fn build_container_spec_should_join_the_pods_user_namespace_with_its_mappings() {
    let mut f = Fixture::new();
    let volume = tempfile::tempdir().expect("tempdir");
    f.config.mounts.push(api::Mount {
        container_path: "/data".into(),
        host_path: volume.path().display().to_string(),
        ..Default::default()
    });
    let mappings = with_pod_userns(&mut f);
    let spec = f.build().expect("spec");
    let namespaces = ns(&spec);
    assert_eq!(
        namespaces[0],
        (
            LinuxNamespaceType::User,
            Some(PathBuf::from("/run/petrel/sandboxes/sb/user"))
        )
    );
    let l = linux(&spec);
    assert_eq!(
        l.uid_mappings().as_deref(),
        Some(&[mappings.uids.oci()][..])
    );
    assert_eq!(
        l.gid_mappings().as_deref(),
        Some(&[mappings.gids.oci()][..])
    );
    // The volume is idmapped; config.json carries the mappings on it only.
    let json: serde_json::Value =
        serde_json::from_slice(&config_json(&spec, Some(&mappings)).expect("json")).expect("parse");
    let mounts = json["mounts"].as_array().expect("mounts");
    let data = mounts
        .iter()
        .find(|m| m["destination"] == "/data")
        .expect("the volume");
    assert!(data["options"]
        .as_array()
        .is_some_and(|o| o.iter().any(|x| x == IDMAP_OPTION)));
    assert_eq!(data["uidMappings"][0]["hostID"], 100_000);
    assert_eq!(data["gidMappings"][0]["hostID"], 200_000);
    assert_eq!(data["gidMappings"][0]["size"], 65536);
    let proc_mount = mounts
        .iter()
        .find(|m| m["destination"] == "/proc")
        .expect("/proc");
    assert!(proc_mount.get("uidMappings").is_none());
    // Without a user namespace, nothing is idmapped.
    f.sandbox.user = None;
    let plain = f.build().expect("spec");
    assert!(!ns(&plain)
        .iter()
        .any(|(t, _)| *t == LinuxNamespaceType::User));
    let json = String::from_utf8(config_json(&plain, None).expect("json")).expect("utf-8");
    assert!(
        !json.contains("uidMappings") && !json.contains(IDMAP_OPTION),
        "{json}"
    );
}

#[test]
fn build_container_spec_should_accept_the_pods_user_namespace_repeated_by_the_container() {
    let mut f = Fixture::new();
    with_pod_userns(&mut f);
    f.sc()
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(pod_userns());
    assert!(f.build().is_ok());
}

#[test]
fn build_container_spec_should_refuse_a_user_namespace_other_than_the_pods() {
    const FIELD: &str = "linux.security_context.namespace_options.userns_options";
    let refused = |f: &Fixture| match f.build() {
        Err(SpecError::Invalid { field, reason }) => (field, reason),
        other => panic!("not refused: {other:?}"),
    };
    // The pod has none: the container may not ask for one.
    let mut f = Fixture::new();
    f.sc()
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(pod_userns());
    let (field, reason) = refused(&f);
    assert_eq!(field, FIELD);
    assert!(reason.contains("no user namespace"), "{reason}");
    // The pod has one: other mappings, or the host's, are refused.
    with_pod_userns(&mut f);
    let mut other = pod_userns();
    other.uids[0].host_id = 300_000;
    f.sc()
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(other);
    assert_eq!(refused(&f).0, FIELD);
    f.sc()
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(api::UserNamespace {
        mode: api::NamespaceMode::Node as i32,
        ..Default::default()
    });
    assert!(refused(&f).1.contains("pod's user namespace"));
    // CONTAINER mode is refused by name.
    f.sc()
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(api::UserNamespace {
        mode: api::NamespaceMode::Container as i32,
        ..Default::default()
    });
    assert_eq!(refused(&f).0, format!("{FIELD}.mode"));
}
