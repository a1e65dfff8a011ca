//! A real containerd (1.7 from Debian trixie, or 1.6 from bookworm) for
//! the end-to-end tests that drive a CRI runtime other than Petrel's own
//! (containerd 2.x for comparisons is [`crate::containerd`]): unpacked by
//! `make containerd` (scripts/containerd.sh) under `build/`, started here
//! with its own root, state, socket, runc root, cgroup parent, CNI bridge
//! and config, with the busybox and pause test images imported, and torn
//! down on drop (pods removed through CRI, containerd stopped by PID, then a
//! sweep of whatever its shims, runc root, mounts, cgroups and bridge still
//! hold), also when the test fails.
//!
//! ```ignore
//! let Some(cd) = Containerd::start(Version::V17) else { return };
//! let mut c = cd.clients().await;
//! let pc = cd.pod_config("web");          // CNI network (bridge)
//! let pod = c.run_pod(pc.clone()).await;
//! let id = c.run(&pod, &pc, sh_container("app", "echo hi")).await;
//! ```
//!
//! [`Containerd::start_with_nri`] enables 1.7's NRI on a socket, plugin
//! directory and plugin config directory of the instance's own.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;

use crate::clients::Clients;
use crate::cri::{answers_version, on_thread, remove_all_pods};
use crate::process::{
    become_subreaper, kill_children_with_arg, random_suffix, remove_cgroup_tree, runc_sweep,
    unmount_under,
};
use crate::test_images::{images_dir, workspace_dir, BUSYBOX, PAUSE};

/// Set (by `make test`) to make a missing containerd a failure, not a skip.
pub const REQUIRE_ENV: &str = "PETREL_REQUIRE_CONTAINERD";

/// Which containerd to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// 1.7.x from Debian trixie: `GetContainerEvents` works.
    V17,
    /// 1.6.x from Debian bookworm: `GetContainerEvents` is UNIMPLEMENTED.
    V16,
}

impl Version {
    fn dir_name(self) -> &'static str {
        match self {
            Version::V17 => "containerd-1.7",
            Version::V16 => "containerd-1.6",
        }
    }
}

/// The workspace's `build/` directory.
fn build_dir() -> PathBuf {
    workspace_dir().join("build")
}

/// A containerd under test.
pub struct Containerd {
    pub version: Version,
    /// Everything of this instance lives here (short, under /tmp: socket
    /// paths must stay below 108 bytes).
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
    /// The CRI socket; see [`Containerd::endpoint`].
    pub socket: PathBuf,
    pub config_file: PathBuf,
    /// runc's `--root` for this instance's containers.
    pub runc_root: PathBuf,
    /// A cgroup parent of this instance only, e.g. `/petrel-test-3fa2…`.
    pub cgroup_parent: String,
    /// The Linux bridge this instance's CNI config creates for its pods.
    pub bridge: String,
    /// The pods' subnet on that bridge (no address on the host side, so no
    /// host route: it cannot clash with anything).
    pub subnet: String,
    /// containerd's `usr/bin` (containerd, ctr, the runc v2 shim).
    pub bin_dir: PathBuf,
    /// NRI's directories and socket, when enabled by
    /// [`Containerd::start_with_nri`].
    pub nri: Option<NriDirs>,
    child: Option<Child>,
}

/// What [`Containerd::start_with_nri`] runs before containerd starts.
type InstallPlugins<'a> = dyn FnOnce(&NriDirs) + 'a;

/// Where an NRI-enabled instance's NRI lives, all inside its directory.
#[derive(Clone, Debug)]
pub struct NriDirs {
    /// containerd's NRI socket, for external plugins to dial.
    pub socket: PathBuf,
    /// `plugin_path`: pre-registered plugins (`NN-name` executables) that
    /// containerd launches at start-up with their socket on fd 3.
    pub plugin_path: PathBuf,
    /// `plugin_config_path`: `NN-name.conf` / `name.conf`.
    pub plugin_config_path: PathBuf,
}

impl Containerd {
    /// Starts containerd `version` and imports the busybox and pause images.
    /// Returns `None` (after printing why) when `make containerd` has not
    /// run, unless `PETREL_REQUIRE_CONTAINERD` is set: then it panics.
    pub fn start(version: Version) -> Option<Containerd> {
        Self::start_inner(version, None)
    }

    /// Starts containerd 1.7 with NRI enabled (`disable = false`) on its own
    /// socket, plugin and plugin config directories. `install` runs before
    /// containerd starts, to put pre-registered plugins and their configs
    /// into those directories. Skips (or panics) as [`Containerd::start`].
    pub fn start_with_nri(version: Version, install: impl FnOnce(&NriDirs)) -> Option<Containerd> {
        assert_eq!(version, Version::V17, "containerd 1.6 has no NRI");
        Self::start_inner(version, Some(Box::new(install)))
    }

    fn start_inner(version: Version, nri: Option<Box<InstallPlugins<'_>>>) -> Option<Containerd> {
        let dist = build_dir().join(version.dir_name());
        let bin_dir = dist.join("usr/bin");
        let missing: Vec<_> = ["containerd", "containerd-shim-runc-v2", "ctr"]
            .iter()
            .filter(|b| !bin_dir.join(b).is_file())
            .collect();
        if !missing.is_empty() {
            let why = format!(
                "{missing:?} not found in {} (run `make containerd`)",
                bin_dir.display()
            );
            if std::env::var_os(REQUIRE_ENV).is_some() {
                panic!("{why}; {REQUIRE_ENV} is set");
            }
            eprintln!("skipped: {why}");
            return None;
        }
        become_subreaper();

        let dir = tempfile::Builder::new()
            .prefix("pcd.")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let suffix = random_suffix();
        let d = dir.path();
        let mut cd = Containerd {
            version,
            root: d.join("root"),
            state: d.join("state"),
            socket: d.join("c.sock"),
            config_file: d.join("config.toml"),
            runc_root: d.join("runc"),
            cgroup_parent: format!("/petrel-test-{suffix}"),
            // Interface names are limited to 15 bytes.
            bridge: format!("pcd{}", &suffix[..10]),
            subnet: format!(
                "10.213.{}.0/24",
                u8::from_str_radix(&suffix[10..], 16).unwrap_or(0)
            ),
            bin_dir,
            nri: nri.as_ref().map(|_| NriDirs {
                socket: d.join("nri.sock"),
                plugin_path: d.join("nri-plugins"),
                plugin_config_path: d.join("nri-conf.d"),
            }),
            dir,
            child: None,
        };
        if let (Some(install), Some(dirs)) = (nri, cd.nri.clone()) {
            std::fs::create_dir_all(&dirs.plugin_path).expect("mkdir NRI plugin_path");
            std::fs::create_dir_all(&dirs.plugin_config_path)
                .expect("mkdir NRI plugin_config_path");
            install(&dirs);
        }
        cd.write_config();
        cd.spawn();
        cd.import_images();
        Some(cd)
    }

    /// The CRI endpoint, `unix:///tmp/pcd.…/c.sock`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// Where the CNI plugins are: those unpacked by `make containerd`, else
    /// Debian's installed ones.
    fn cni_bin_dir() -> PathBuf {
        let ours = build_dir().join("cni-plugins/usr/lib/cni");
        if ours.join("bridge").is_file() {
            ours
        } else {
            PathBuf::from("/usr/lib/cni")
        }
    }

    fn write_config(&self) {
        let d = self.dir.path();
        let cni_conf = d.join("cni");
        std::fs::create_dir_all(&cni_conf).expect("cni conf dir");
        // A bridge of our own without a host address (isGateway false, no
        // masquerade): pods get an eth0 with an address, the host gets no
        // route, no iptables rule and no sysctl change.
        std::fs::write(
            cni_conf.join("10-petrel-test.conflist"),
            format!(
                r#"{{"cniVersion":"0.4.0","name":"petrel-test-{bridge}","plugins":[{{"type":"bridge","bridge":"{bridge}","isGateway":false,"ipMasq":false,"hairpinMode":false,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"{subnet}"}}]],"dataDir":"{ipam}"}}}}]}}"#,
                bridge = self.bridge,
                subnet = self.subnet,
                ipam = d.join("cni-ipam").display(),
            ),
        )
        .expect("write cni config");
        let nri = match (self.version, &self.nri) {
            (Version::V17, Some(nri)) => format!(
                "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  socket_path = {:?}\n  plugin_path = {:?}\n  plugin_config_path = {:?}\n",
                nri.socket, nri.plugin_path, nri.plugin_config_path
            ),
            // 1.7 has NRI (off by default); keep its socket ours all the same.
            (Version::V17, None) => format!(
                "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n  socket_path = {:?}\n",
                d.join("nri.sock")
            ),
            (Version::V16, _) => String::new(),
        };
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        let config = format!(
            r#"version = 2
root = {root:?}
state = {state:?}
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = {socket:?}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt:?}

{nri}
[{cri}]
  sandbox_image = "{PAUSE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = {runc_root:?}

[{cri}.cni]
  bin_dir = {cni_bin:?}
  conf_dir = {cni_conf:?}
  max_conf_num = 1
"#,
            root = self.root,
            state = self.state,
            socket = self.socket,
            opt = d.join("opt"),
            runc_root = self.runc_root,
            cni_bin = Self::cni_bin_dir(),
            cni_conf = cni_conf,
        );
        std::fs::write(&self.config_file, config).expect("write containerd config");
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("containerd.log"))
            .expect("containerd log");
        // containerd's own bin first, so that its shim is the one used; runc
        // is Debian's, from /usr/sbin.
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            self.bin_dir.display()
        );
        let child = Command::new(self.bin_dir.join("containerd"))
            .arg("--config")
            .arg(&self.config_file)
            .args(["--log-level", "info"])
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Waits until the CRI socket answers `Version`.
    fn wait_ready(&mut self) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if self.socket.exists() && answers_version(&self.endpoint()) {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("containerd exited at start ({st}):\n{}", self.log());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("containerd did not answer Version:\n{}", self.log());
    }

    /// Imports the busybox and pause images into the `k8s.io` namespace and
    /// waits until CRI sees both.
    fn import_images(&self) {
        let images = images_dir();
        if !images.join("pause-oci.tar").is_file() {
            // An image directory from before the pause image existed: the
            // script rebuilds every archive atomically.
            crate::test_images::build(&images);
        }
        for tar in ["busybox-oci.tar", "pause-oci.tar"] {
            let out = self
                .ctr()
                .args(["images", "import", "--snapshotter", "overlayfs"])
                .arg(images.join(tar))
                .output()
                .expect("run ctr images import");
            assert!(
                out.status.success(),
                "ctr images import {tar}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        // CRI learns of imported images from containerd's events, shortly.
        let endpoint = self.endpoint();
        let seen = on_thread(move || async move {
            let ch = petrel_cri::connect(&endpoint).await.ok()?;
            let mut img = ImageServiceClient::new(ch);
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                let mut all = true;
                for r in [BUSYBOX, PAUSE] {
                    let s = img
                        .image_status(api::ImageStatusRequest {
                            image: Some(api::ImageSpec {
                                image: r.to_string(),
                                ..Default::default()
                            }),
                            verbose: false,
                        })
                        .await
                        .ok()?
                        .into_inner();
                    all &= s.image.is_some();
                }
                if all {
                    return Some(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            None
        });
        assert!(
            seen.is_some(),
            "CRI does not see the imported images:\n{}",
            self.log()
        );
    }

    /// `ctr` on this instance's socket, in the `k8s.io` namespace.
    pub fn ctr(&self) -> Command {
        let mut c = Command::new(self.bin_dir.join("ctr"));
        c.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"]);
        c
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// containerd's pid (0 when stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// `kill -9` containerd (containers keep running under their shims).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM containerd and wait until it exits (its shims and containers
    /// keep running).
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            crate::process::signal(c.id(), rustix::process::Signal::TERM);
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts containerd again on the same root, state and config.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop containerd first");
        self.spawn();
    }

    /// CRI clients on one connection (`admin` is Petrel's own API: every
    /// call on it fails with containerd).
    pub async fn clients(&self) -> Clients {
        let ch = petrel_cri::connect(&self.endpoint())
            .await
            .expect("connect to containerd");
        Clients {
            rt: RuntimeServiceClient::new(ch.clone()),
            img: ImageServiceClient::new(ch.clone()),
            admin: AdminClient::new(ch),
        }
    }

    /// A pod config unique to this instance, on the CNI bridge.
    pub fn pod_config(&self, name: &str) -> api::PodSandboxConfig {
        self.pod_config_with(name, api::NamespaceMode::Pod)
    }

    /// A pod config unique to this instance, in the host's network (and
    /// UTS namespace: no hostname).
    pub fn host_network_pod_config(&self, name: &str) -> api::PodSandboxConfig {
        self.pod_config_with(name, api::NamespaceMode::Node)
    }

    fn pod_config_with(&self, name: &str, network: api::NamespaceMode) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.to_string(),
                namespace: "e2e".to_string(),
                uid: format!("uid-{name}"),
                attempt: 0,
            }),
            // As kubelet does: a pod in the host's network keeps the host's
            // UTS namespace, where runc refuses to set a hostname.
            hostname: if network == api::NamespaceMode::Node {
                String::new()
            } else {
                name.to_string()
            },
            log_directory: self.log_dir(name).display().to_string(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/{name}", self.cgroup_parent),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        network: network as i32,
                        pid: api::NamespaceMode::Container as i32,
                        ipc: api::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            labels: HashMap::from([("test".to_string(), name.to_string())]),
            ..Default::default()
        }
    }

    /// The log directory of the pods [`Containerd::pod_config`] makes.
    pub fn log_dir(&self, pod_name: &str) -> PathBuf {
        self.dir.path().join("logs").join(pod_name)
    }

    /// A container's CRI log file, as written so far (containers made with
    /// `sh_container` log to `<name>.log` in the pod's log directory).
    pub fn read_log(&self, pod_name: &str, container: &str) -> String {
        std::fs::read_to_string(self.log_dir(pod_name).join(format!("{container}.log")))
            .unwrap_or_default()
    }

    fn cleanup(&mut self) {
        // 1. Through CRI: containerd knows every pod (and its network
        //    namespace under /var/run/netns) that it made.
        if self.child.is_none() && self.root.exists() {
            // A test that stopped containerd: start it again to clean up.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.spawn()));
        }
        if self.child.is_some() {
            let _ = remove_all_pods(&self.endpoint());
            self.terminate();
        }
        // 2. Shims still running for this instance (orphans re-parented to
        //    us, see `become_subreaper`): kill them by pid, then whatever
        //    runc still has in this instance's root.
        kill_children_with_arg(&self.socket.display().to_string());
        runc_sweep(Path::new("runc"), &self.runc_root);
        reap_shims(&self.socket);
        // Pre-registered NRI plugins outlive a containerd that died without
        // stopping them (they are re-parented to us): those whose executable
        // is in this instance's plugin directory.
        if let Some(nri) = &self.nri {
            stop_children_from(&nri.plugin_path);
        }
        // 3. Mounts (rootfs overlays, shm) under our directory.
        unmount_under(self.dir.path());
        // 4. Cgroups and the bridge.
        remove_cgroup_tree(&self.cgroup_parent);
        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            let _ = Command::new("ip")
                .args(["link", "del", "dev", &self.bridge])
                .output();
        }
        // 5. The directory goes with `self.dir`.
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Our children that are containerd shims (as `comm` names them).
fn shim_children() -> Vec<(i32, String)> {
    let me = std::process::id().to_string();
    let mut out = vec![];
    let Ok(it) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in it.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
        let Some((head, tail)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map(|(_, c)| c).unwrap_or("");
        let ppid = tail.split_whitespace().nth(1).unwrap_or("");
        if ppid == me && comm.starts_with("containerd-shim") {
            out.push((
                pid,
                tail.split_whitespace().next().unwrap_or("").to_string(),
            ));
        }
    }
    out
}

/// Kills (by pid) and reaps our children whose executable lies in `dir`.
fn stop_children_from(dir: &Path) {
    let me = std::process::id().to_string();
    let Ok(it) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in it.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let ours = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                let (_, tail) = s.rsplit_once(')')?;
                Some(tail.split_whitespace().nth(1)? == me)
            })
            .unwrap_or(false);
        // A zombie has no exe link any more: it is left to the test
        // process's exit, as it may be another part of the test's to wait for.
        let from_dir = std::fs::read_link(e.path().join("exe"))
            .map(|x| x.starts_with(dir))
            .unwrap_or(false);
        if ours && from_dir {
            // Our own child, started from this instance's directory.
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::empty());
            }
        }
    }
}

/// Live shims of the containerd listening on `socket`.
fn shims_of(socket: &Path) -> Vec<i32> {
    let address = socket.display().to_string();
    shim_children()
        .into_iter()
        .filter(|(_, state)| state != "Z")
        .filter(|(pid, _)| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| c.split(|b| *b == 0).any(|a| a == address.as_bytes()))
                .unwrap_or(false)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Reaps exited shims among our children, waiting briefly for those of the
/// containerd on `socket` to exit.
fn reap_shims(socket: &Path) {
    let start = Instant::now();
    loop {
        crate::process::reap_zombies_named("containerd-shim");
        if shims_of(socket).is_empty() || start.elapsed() > Duration::from_secs(2) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
