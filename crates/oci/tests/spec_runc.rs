//! Specs built by `build_container_spec` run under the host's runc (root only).
//!
//! Each test uses its own temporary bundle, runc root, container id and cgroup parent
//! (`/petrel-test-<random>`), and removes them all on every path.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use petrel_cri::api;
use petrel_oci::cgroups::Cgroups;
use petrel_oci::spec::{
    build_container_spec, ContainerSpecInput, HostLimits, NamespaceRef, SandboxContext,
};

const RUNC: &str = "runc";
const BUSYBOX: &str = "/bin/busybox";

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

/// Skips (returning `None`) when not root or when runc/busybox are missing.
fn prerequisites() -> Option<()> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return None;
    }
    let runc = Command::new(RUNC).arg("--version").output();
    if runc.map(|o| !o.status.success()).unwrap_or(true) || !Path::new(BUSYBOX).exists() {
        eprintln!("skipped: needs runc and {BUSYBOX}");
        return None;
    }
    Some(())
}

/// Deletes the container and removes the cgroup parent, whatever happened.
struct Guard {
    runc_root: PathBuf,
    id: String,
    cgroup_parent: String,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new(RUNC)
            .arg("--root")
            .arg(&self.runc_root)
            .args(["delete", "--force", &self.id])
            .output();
        if let Ok(cg) = Cgroups::detect() {
            let _ = cg.remove(&format!("{}/{}", self.cgroup_parent, self.id));
            let _ = cg.remove(&self.cgroup_parent);
        }
    }
}

struct Bundle {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    rootfs: PathBuf,
    runc_root: PathBuf,
    host_dir: PathBuf,
    hosts: PathBuf,
}

fn bundle() -> Bundle {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("bundle");
    let rootfs = dir.join("rootfs");
    for d in ["bin", "etc", "tmp", "proc", "sys", "dev"] {
        std::fs::create_dir_all(rootfs.join(d)).expect("mkdir");
    }
    std::fs::copy(BUSYBOX, rootfs.join("bin/busybox")).expect("copy busybox");
    for applet in ["sh", "id", "cat", "grep", "hostname", "touch", "ls", "echo"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).expect("symlink");
    }
    std::fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/tmp:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(
        rootfs.join("etc/group"),
        "root:x:0:\napp:x:1000:\nstaff:x:50:app\n",
    )
    .expect("group");
    let runc_root = tmp.path().join("runc");
    std::fs::create_dir(&runc_root).expect("mkdir");
    let host_dir = tmp.path().join("data");
    std::fs::create_dir(&host_dir).expect("mkdir");
    let hosts = tmp.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost petrel-spec-test\n").expect("hosts");
    Bundle {
        dir,
        rootfs,
        runc_root,
        host_dir,
        hosts,
        _tmp: tmp,
    }
}

fn sandbox(b: &Bundle, cgroup_parent: &str) -> SandboxContext {
    SandboxContext {
        network: NamespaceRef::New,
        ipc: NamespaceRef::New,
        uts: NamespaceRef::New,
        pid: NamespaceRef::New,
        hostname: "petrel-spec-test".into(),
        etc_hostname: None,
        etc_hosts: Some(b.hosts.clone()),
        resolv_conf: None,
        shm: None,
        cgroup_parent: cgroup_parent.into(),
        cgroup_driver: Default::default(),
        user: None,
    }
}

/// Builds the spec, runs the container in the foreground and returns (status, stdout).
fn run(
    b: &Bundle,
    config: &api::ContainerConfig,
    sandbox_config: &api::PodSandboxConfig,
) -> (bool, String, String) {
    let id = unique("petrel-spec");
    let cgroup_parent = unique("/petrel-test");
    let _guard = Guard {
        runc_root: b.runc_root.clone(),
        id: id.clone(),
        cgroup_parent: cgroup_parent.clone(),
    };
    let host = HostLimits::detect().expect("host limits");
    let sb = sandbox(b, &cgroup_parent);
    let spec = build_container_spec(&ContainerSpecInput {
        id: &id,
        config,
        sandbox_config,
        image_config: None,
        rootfs: &b.rootfs,
        users: None,
        sandbox: &sb,
        host: &host,
        image_volumes: &Default::default(),
    })
    .expect("spec");
    spec.save(b.dir.join("config.json")).expect("save spec");
    let out = Command::new(RUNC)
        .arg("--root")
        .arg(&b.runc_root)
        .arg("run")
        .arg("--bundle")
        .arg(&b.dir)
        .arg(&id)
        .output()
        .expect("runc run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn script(s: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), s.into()]
}

#[test]
fn spec_should_run_a_restricted_container_under_runc() {
    if prerequisites().is_none() {
        return;
    }
    let b = bundle();
    let config = api::ContainerConfig {
        command: script(
            "id; grep CapEff /proc/self/status; cat /proc/self/oom_score_adj; hostname; \
             echo FOO=$FOO; cat /etc/hosts; \
             touch /data/x 2>/dev/null && echo data=rw || echo data=ro; \
             cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max",
        ),
        envs: vec![api::KeyValue {
            key: "FOO".into(),
            value: "bar".into(),
        }],
        mounts: vec![api::Mount {
            container_path: "/data".into(),
            host_path: b.host_dir.display().to_string(),
            readonly: true,
            ..Default::default()
        }],
        linux: Some(api::LinuxContainerConfig {
            resources: Some(api::LinuxContainerResources {
                memory_limit_in_bytes: 64 << 20,
                cpu_shares: 512,
                oom_score_adj: -999,
                ..Default::default()
            }),
            security_context: Some(api::LinuxContainerSecurityContext {
                run_as_username: "app".into(),
                capabilities: Some(api::Capability {
                    add_capabilities: vec!["NET_ADMIN".into(), "SYS_RESOURCE".into()],
                    drop_capabilities: vec!["MKNOD".into()],
                    ..Default::default()
                }),
                no_new_privs: true,
                namespace_options: Some(api::NamespaceOption {
                    pid: api::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    let (ok, out, err) = run(&b, &config, &api::PodSandboxConfig::default());
    assert!(ok, "runc failed\nstdout:\n{out}\nstderr:\n{err}");
    let own_oom: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
        .expect("read")
        .trim()
        .parse()
        .expect("number");
    // The kernel sorts supplementary groups.
    assert!(
        out.contains("uid=1000(app) gid=1000(app) groups=50(staff),1000(app)\n"),
        "{out}"
    );
    // A non-root user has no effective capabilities.
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim() == own_oom.max(-999).to_string()),
        "{out}"
    );
    assert!(out.contains("petrel-spec-test\n"), "{out}");
    assert!(out.contains("FOO=bar"), "{out}");
    assert!(
        out.contains("127.0.0.1 localhost petrel-spec-test"),
        "{out}"
    );
    assert!(out.contains("data=ro"), "{out}");
    assert!(out.contains(&(64u64 << 20).to_string()), "{out}");
    assert!(!b.host_dir.join("x").exists());
}

#[test]
fn spec_should_run_a_privileged_container_under_runc() {
    if prerequisites().is_none() {
        return;
    }
    let b = bundle();
    let config = api::ContainerConfig {
        command: script("grep -E '^Cap(Eff|Bnd)' /proc/self/status; ls /dev/null && echo done"),
        linux: Some(api::LinuxContainerConfig {
            resources: None,
            security_context: Some(api::LinuxContainerSecurityContext {
                privileged: true,
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    let sandbox_config = api::PodSandboxConfig {
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                privileged: true,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (ok, out, err) = run(&b, &config, &sandbox_config);
    assert!(ok, "runc failed\nstdout:\n{out}\nstderr:\n{err}");
    let own_bnd = std::fs::read_to_string("/proc/self/status")
        .expect("status")
        .lines()
        .find(|l| l.starts_with("CapBnd:"))
        .map(str::to_string)
        .expect("CapBnd");
    // The container gets exactly our bounding set (as far as oci-spec knows the caps).
    assert!(out.contains(&own_bnd), "{out}");
    assert!(out.contains("done"), "{out}");
}
