//! A real containerd (1.7 from Debian trixie, or 1.6 from bookworm) for
//! the end-to-end tests that drive a CRI runtime other than Petrel's own
//! (containerd 2.x for comparisons is [`crate::containerd`]): unpacked by
//! `make containerd` (scripts/containerd.sh) under `build/`, started here
//! with its own root, state, socket, runc root, cgroup parent, CNI bridge
//! and config, with the busybox and pause test images imported, and torn
//! down on drop (pods removed through CRI, containerd stopped by PID, then a
//! sweep of whatever its shims, runc root, mounts, cgroups and bridge still
//! hold), also when the test fails. Config, process and sweep are the
//! kit's one containerd launcher's ([`crate::containerd::ContainerdProcess`]);
//! failures panic, as tests want them.
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
use std::process::Command;
use std::time::Duration;

use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;

use crate::clients::Clients;
pub use crate::containerd::NriDirs;
use crate::containerd::{ContainerdConfig, ContainerdProcess, Nri};
use crate::process::{kill_children_from, kit_tempdir, random_suffix, remove_cgroup_tree};
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
    process: ContainerdProcess,
}

/// What [`Containerd::start_with_nri`] runs before containerd starts.
type InstallPlugins<'a> = dyn FnOnce(&NriDirs) + 'a;

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
        let dir = kit_tempdir("pcd.").unwrap_or_else(|e| panic!("{e}"));
        let suffix = random_suffix();
        let d = dir.path();
        let nri_dirs = nri.as_ref().map(|_| NriDirs::in_dir(d));
        if let (Some(install), Some(dirs)) = (nri, &nri_dirs) {
            std::fs::create_dir_all(&dirs.plugin_path).expect("mkdir NRI plugin_path");
            std::fs::create_dir_all(&dirs.plugin_config_path)
                .expect("mkdir NRI plugin_config_path");
            install(dirs);
        }
        // Interface names are limited to 15 bytes.
        let bridge = format!("pcd{}", &suffix[..10]);
        let subnet = format!(
            "10.213.{}.0/24",
            u8::from_str_radix(&suffix[10..], 16).unwrap_or(0)
        );
        let cni_conf = write_cni_config(d, &bridge, &subnet);
        let config = ContainerdConfig {
            sandbox_image: PAUSE.to_string(),
            runc: None,
            cni_bin_dir: Self::cni_bin_dir(),
            cni_conf_dir: cni_conf,
            mirrors: None,
            nri: match (version, &nri_dirs) {
                (Version::V17, Some(n)) => Nri::Enabled(n.clone()),
                // 1.7 has NRI (off by default); keep its socket ours all the same.
                (Version::V17, None) => Nri::Disabled {
                    socket: d.join("nri.sock"),
                },
                (Version::V16, _) => Nri::Absent,
            },
            netns_under_state: false,
        };
        let process = ContainerdProcess::prepare(
            d,
            &bin_dir.join("containerd"),
            Path::new("runc"),
            &config.render_v2(d),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let cgroup_parent = format!("/petrel-test-{suffix}");
        crate::stale::record_cgroup(d, &cgroup_parent);
        let mut cd = Containerd {
            version,
            root: d.join("root"),
            state: d.join("state"),
            socket: process.socket(),
            config_file: process.config_file(),
            runc_root: process.runc_root(),
            cgroup_parent,
            bridge,
            subnet,
            bin_dir,
            nri: nri_dirs,
            process,
            dir,
        };
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

    fn spawn(&mut self) {
        if let Err(e) = self.process.spawn() {
            panic!("{e}\n{}", self.log());
        }
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
        let archives = [images.join("busybox-oci.tar"), images.join("pause-oci.tar")];
        if let Err(e) = crate::containerd::import_archives(
            &self.bin_dir,
            &self.socket,
            &archives,
            &[BUSYBOX, PAUSE],
            Duration::from_secs(10),
        ) {
            panic!("{e}\n{}", self.log());
        }
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
        self.process.pid().unwrap_or(0)
    }

    /// `kill -9` containerd (containers keep running under their shims).
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    /// SIGTERM containerd and wait until it exits (its shims and containers
    /// keep running); SIGKILL after 10 s.
    pub fn terminate(&mut self) {
        self.process.stop(Duration::from_secs(10));
    }

    /// Starts containerd again on the same root, state and config.
    pub fn restart(&mut self) {
        assert!(self.process.pid().is_none(), "stop containerd first");
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
        if self.process.pid().is_none() && self.root.exists() {
            // A test that stopped containerd: start it again to clean up.
            if let Err(e) = self.process.spawn() {
                eprintln!("petrel-testkit: containerd not restarted for cleanup: {e}");
            }
        }
        // 2. Pods, containerd, its shims, runc root, mounts.
        self.process.sweep();
        // Pre-registered NRI plugins outlive a containerd that died without
        // stopping them (they are re-parented to us): those whose executable
        // is in this instance's plugin directory.
        if let Some(nri) = &self.nri {
            kill_children_from(&nri.plugin_path);
        }
        // 3. Cgroups and the bridge.
        remove_cgroup_tree(&self.cgroup_parent);
        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            let _ = Command::new("ip")
                .args(["link", "del", "dev", &self.bridge])
                .output();
        }
        // 4. The directory goes with `self.dir`.
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Writes the CNI config of an instance in `d`: a bridge of its own
/// without a host address (isGateway false, no masquerade): pods get an
/// eth0 with an address, the host gets no route, no iptables rule and no
/// sysctl change. Returns the config directory.
fn write_cni_config(d: &Path, bridge: &str, subnet: &str) -> PathBuf {
    let cni_conf = d.join("cni");
    std::fs::create_dir_all(&cni_conf).expect("cni conf dir");
    std::fs::write(
        cni_conf.join("10-petrel-test.conflist"),
        format!(
            r#"{{"cniVersion":"0.4.0","name":"petrel-test-{bridge}","plugins":[{{"type":"bridge","bridge":"{bridge}","isGateway":false,"ipMasq":false,"hairpinMode":false,"ipam":{{"type":"host-local","ranges":[[{{"subnet":"{subnet}"}}]],"dataDir":"{ipam}"}}}}]}}"#,
            ipam = d.join("cni-ipam").display(),
        ),
    )
    .expect("write cni config");
    cni_conf
}
