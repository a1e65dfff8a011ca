//! containerd under test, the kit's one launcher of containerd: the
//! configuration ([`ContainerdConfig`]: version 2 for containerd 1.x,
//! version 3 for 2.x), the process ([`ContainerdProcess`]: started with its
//! own directory first in PATH so that the shim beside it is used, ready
//! once CRI answers `Version`) and its sweep (pods removed through CRI,
//! containerd stopped by pid, its shims killed and reaped, runc root and
//! mounts swept). Two instances are built on it: [`Containerd`] here, and
//! [`crate::local_containerd::Containerd`] for the end-to-end suite.
//!
//! [`Containerd`] is containerd 2.x for comparison runs: the binaries
//! `make peers` builds (containerd and its runc shim, found through
//! [`crate::peers`]), or a containerd 1.x such as Debian's 1.7 that `make
//! containerd` unpacks, with its own root, state, socket, runc root, NRI
//! socket and config, `restrict_oom_score_adj = true` (root lacks
//! CAP_SYS_RESOURCE here), a CNI network, a hosts.toml mirror directory and
//! `registry.k8s.io/pause:3.9` as sandbox image.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::network::PodNetwork;
use crate::process::{self, describe, spawn_logged, stop_child};
use crate::KitError;

/// The sandbox image containerd runs for each pod (served by the kit's
/// registry through the mirror).
pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.9";

/// How long containerd may take to serve CRI.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// What a containerd instance's config says beyond its own places (root
/// `<dir>/root`, state `<dir>/state`, socket `<dir>/c.sock`, opt
/// `<dir>/opt`, runc root `<dir>/runc`).
#[derive(Debug, Clone)]
pub struct ContainerdConfig {
    /// The sandbox (pause) image.
    pub sandbox_image: String,
    /// runc's `BinaryName`; None: `runc` in PATH.
    pub runc: Option<PathBuf>,
    /// The CNI plugins' directory.
    pub cni_bin_dir: PathBuf,
    /// The CNI configuration directory.
    pub cni_conf_dir: PathBuf,
    /// A hosts.toml mirror directory (`registry.config_path`).
    pub mirrors: Option<PathBuf>,
    /// NRI's section.
    pub nri: Nri,
    /// `netns_mounts_under_state_dir`: pods' network namespaces below the
    /// state directory (swept with it) instead of /var/run/netns.
    pub netns_under_state: bool,
}

/// containerd's NRI section.
#[derive(Debug, Clone)]
pub enum Nri {
    /// No section (containerd 1.6 has no NRI).
    Absent,
    /// Disabled, its socket ours all the same.
    Disabled {
        /// `socket_path`.
        socket: PathBuf,
    },
    /// Enabled on its own socket, plugin and plugin config directories.
    Enabled(NriDirs),
}

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

impl NriDirs {
    /// NRI's places in instance directory `d`.
    pub fn in_dir(d: &Path) -> NriDirs {
        NriDirs {
            socket: d.join("nri.sock"),
            plugin_path: d.join("nri-plugins"),
            plugin_config_path: d.join("nri-conf.d"),
        }
    }
}

impl ContainerdConfig {
    /// NRI's section with table name `table` (quoted as the version wants).
    fn nri_section(&self, table: &str) -> String {
        match &self.nri {
            Nri::Absent => String::new(),
            Nri::Disabled { socket } => {
                format!("[plugins.{table}]\n  disable = true\n  socket_path = {socket:?}\n")
            }
            Nri::Enabled(n) => format!(
                "[plugins.{table}]\n  disable = false\n  socket_path = {:?}\n  plugin_path = {:?}\n  plugin_config_path = {:?}\n",
                n.socket, n.plugin_path, n.plugin_config_path
            ),
        }
    }

    /// The lines both config versions write only when set: netns mounts
    /// under the state directory, and the runc binary.
    fn optional_lines(&self) -> (&'static str, String) {
        let netns = if self.netns_under_state {
            "  netns_mounts_under_state_dir = true\n"
        } else {
            ""
        };
        let binary = match &self.runc {
            Some(r) => format!("  BinaryName = {r:?}\n"),
            None => String::new(),
        };
        (netns, binary)
    }

    /// containerd 1.x's configuration (version 2) for an instance in `d`:
    /// no pinned images (1.7 never removes its sandbox image), one CNI
    /// plugin directory.
    pub fn render_v2(&self, d: &Path) -> String {
        let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
        let nri = self.nri_section("\"io.containerd.nri.v1.nri\"");
        let (netns, binary) = self.optional_lines();
        let registry = match &self.mirrors {
            Some(m) => format!("\n[{cri}.registry]\n  config_path = {m:?}\n"),
            None => String::new(),
        };
        format!(
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
  sandbox_image = "{sandbox}"
  enable_selinux = false
  restrict_oom_score_adj = true
{netns}  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
{binary}  Root = {runc_root:?}
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = {cni_bin:?}
  conf_dir = {cni_conf:?}
  max_conf_num = 1
{registry}"#,
            root = d.join("root"),
            state = d.join("state"),
            socket = d.join("c.sock"),
            opt = d.join("opt"),
            sandbox = self.sandbox_image,
            runc_root = d.join("runc"),
            cni_bin = self.cni_bin_dir,
            cni_conf = self.cni_conf_dir,
        )
    }

    /// containerd 2.x's configuration (version 3) for an instance in `d`.
    pub fn render_v3(&self, d: &Path) -> String {
        let nri = self.nri_section("'io.containerd.nri.v1.nri'");
        let rt = "plugins.'io.containerd.cri.v1.runtime'";
        let (netns, binary) = self.optional_lines();
        let registry = match &self.mirrors {
            Some(m) => format!(
                "\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = {m:?}\n"
            ),
            None => String::new(),
        };
        format!(
            r#"version = 3
root = {root:?}
state = {state:?}
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = {socket:?}

[plugins.'io.containerd.internal.v1.opt']
  path = {opt:?}

{nri}
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{sandbox}"
{registry}
[{rt}]
  enable_selinux = false
  restrict_oom_score_adj = true
{netns}
[{rt}.containerd]
  default_runtime_name = "runc"

[{rt}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{rt}.containerd.runtimes.runc.options]
{binary}  Root = {runc_root:?}
  SystemdCgroup = false

[{rt}.cni]
  bin_dirs = [{cni_bin:?}]
  conf_dir = {cni_conf:?}
  max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
            root = d.join("root"),
            state = d.join("state"),
            socket = d.join("c.sock"),
            opt = d.join("opt"),
            sandbox = self.sandbox_image,
            runc_root = d.join("runc"),
            cni_bin = self.cni_bin_dir,
            cni_conf = self.cni_conf_dir,
        )
    }
}

/// A containerd process of an instance directory (which its owner keeps):
/// config file `<dir>/config.toml`, socket `<dir>/c.sock`, runc root
/// `<dir>/runc`, log `<dir>/containerd.log`.
pub struct ContainerdProcess {
    dir: PathBuf,
    containerd: PathBuf,
    runc: PathBuf,
    log_level: &'static str,
    command_line: String,
    child: Option<Child>,
}

impl ContainerdProcess {
    /// Writes `text` as the config of an instance in `dir` (a
    /// [`process::kit_tempdir`]) that runs the binary `containerd` and
    /// `runc` (to sweep its root); not started yet.
    pub fn prepare(
        dir: &Path,
        containerd: &Path,
        runc: &Path,
        text: &str,
    ) -> Result<ContainerdProcess, KitError> {
        process::become_subreaper();
        let p = ContainerdProcess {
            dir: dir.to_path_buf(),
            containerd: containerd.to_path_buf(),
            runc: runc.to_path_buf(),
            log_level: "info",
            command_line: String::new(),
            child: None,
        };
        let config = p.config_file();
        std::fs::write(&config, text).map_err(|e| KitError::io("write", &config, e))?;
        // For the sweep after a hard death of this process.
        crate::stale::record_runc_root(dir, runc, &p.runc_root());
        Ok(p)
    }

    /// containerd's `--log-level` (`info` unless set): a comparison that
    /// measures containerd's CPU sets the level it is measured at.
    pub fn with_log_level(mut self, level: &'static str) -> ContainerdProcess {
        self.log_level = level;
        self
    }

    /// The CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("c.sock")
    }

    /// The config file.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    /// runc's `--root` for the instance's containers.
    pub fn runc_root(&self) -> PathBuf {
        self.dir.join("runc")
    }

    /// containerd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// The CRI endpoint.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// containerd's pid (None when stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts containerd and waits until CRI answers `Version`.
    pub fn spawn(&mut self) -> Result<(), KitError> {
        let bin_dir = self.containerd.parent().unwrap_or(Path::new("/"));
        // Its own directory first in PATH: the shim beside it is the one
        // used (runc is the configured one, or Debian's from /usr/sbin).
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            bin_dir.display()
        );
        let mut cmd = Command::new(&self.containerd);
        cmd.arg("--config")
            .arg(self.config_file())
            .args(["--log-level", self.log_level])
            .env("PATH", path);
        self.command_line = describe(&cmd);
        let log = self.log_path();
        let child = spawn_logged("containerd", &mut cmd, &log)?;
        process::write_pid_file(&self.dir, "containerd", child.id());
        let (socket, endpoint) = (self.socket(), self.endpoint());
        let c = self.child.insert(child);
        process::wait_for_socket(
            "containerd",
            c,
            &socket,
            READY_WITHIN,
            &self.command_line,
            &log,
        )?;
        // The socket exists before the CRI plugin serves.
        process::wait_until_ready(
            "containerd",
            c,
            READY_WITHIN,
            &self.command_line,
            &log,
            || crate::cri::answers_version(&endpoint),
        )
    }

    /// SIGTERM, up to `grace`, then SIGKILL (its shims and containers keep
    /// running): its exit status and whether it had to be killed.
    pub fn stop(&mut self, grace: Duration) -> Option<(ExitStatus, bool)> {
        stop_child(&mut self.child.take()?, grace)
    }

    /// SIGKILLs containerd (its shims and containers keep running).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            process::kill_child(&mut c);
        }
    }

    /// Removes every pod through CRI (if it runs), stops containerd, kills
    /// and reaps its shims (recognised by the socket on their command
    /// line), deletes what runc still has in its root and unmounts whatever
    /// is mounted below its directory.
    pub fn sweep(&mut self) {
        if self.child.is_some() {
            let _ = crate::cri::remove_all_pods(&self.endpoint());
            self.stop(Duration::from_secs(15));
        }
        let socket = self.socket().display().to_string();
        process::kill_children_with_arg(&socket);
        process::runc_sweep(&self.runc, &self.runc_root());
        // Killed shims are our children (we are their subreaper).
        let start = Instant::now();
        loop {
            process::reap_zombies_named("containerd-shim");
            let left = process::our_children()
                .iter()
                .any(|c| c.comm.starts_with("containerd-shim") && c.has_arg(&socket));
            if !left || start.elapsed() > Duration::from_secs(2) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        process::unmount_under(&self.dir);
    }
}

/// Imports OCI `archives` into the `k8s.io` namespace of the containerd
/// serving `socket` with `ctr` (from containerd's own `bin_dir`), then
/// waits up to `within` until its CRI sees every image of `refs`: CRI
/// learns of imported images from containerd's events, shortly after.
pub fn import_archives(
    bin_dir: &Path,
    socket: &Path,
    archives: &[PathBuf],
    refs: &[&str],
    within: Duration,
) -> Result<(), KitError> {
    let log = socket.with_file_name("containerd.log");
    let failed = |detail: String| KitError::Run {
        component: "ctr images import".into(),
        detail,
        log: log.clone(),
    };
    let ctr = bin_dir.join("ctr");
    for archive in archives {
        let out = Command::new(&ctr)
            .arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .args(["--snapshotter", "overlayfs"])
            .arg(archive)
            .output()
            .map_err(|e| KitError::io("run", &ctr, e))?;
        if !out.status.success() {
            return Err(failed(format!(
                "{}: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let endpoint = format!("unix://{}", socket.display());
    let wanted: Vec<String> = refs.iter().map(|r| r.to_string()).collect();
    let seen = crate::cri::on_thread(move || async move {
        let ch = petrel_cri::connect(&endpoint).await.ok()?;
        let mut img = petrel_cri::api::image_service_client::ImageServiceClient::new(ch);
        let start = Instant::now();
        while start.elapsed() < within {
            let mut all = true;
            for r in &wanted {
                let st = img
                    .image_status(petrel_cri::api::ImageStatusRequest {
                        image: Some(petrel_cri::api::ImageSpec {
                            image: r.clone(),
                            ..Default::default()
                        }),
                        verbose: false,
                    })
                    .await
                    .ok()?
                    .into_inner();
                all &= st.image.is_some();
            }
            if all {
                return Some(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    });
    seen.ok_or_else(|| failed(format!("CRI does not see {refs:?} after the import")))
}

/// The cgroup containerd puts pods under when they name no parent (as
/// critest's do with the cgroupfs driver): its namespace's name.
const DEFAULT_POD_CGROUP: &str = "k8s.io";

/// `/sys/fs/cgroup/<hierarchy>/k8s.io` directories that exist now.
fn default_pod_cgroups() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|it| {
            it.flatten()
                .map(|e| e.path().join(DEFAULT_POD_CGROUP))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

/// containerd's binaries: `containerd` and, beside it,
/// `containerd-shim-runc-v2`.
pub fn binaries() -> Result<PathBuf, KitError> {
    let containerd = crate::peers::peer_binary("containerd")?;
    let dir = containerd
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let shim = dir.join("containerd-shim-runc-v2");
    if !shim.is_file() {
        return Err(KitError::Missing {
            component: "containerd-shim-runc-v2".into(),
            path: shim,
            hint: "it must sit beside containerd (`make peers`)".into(),
        });
    }
    Ok(containerd)
}

/// A running containerd for comparison runs.
pub struct Containerd {
    /// Its directory (owned here, removed after the sweep).
    _dir: tempfile::TempDir,
    process: ContainerdProcess,
    /// The CRI socket.
    pub socket: PathBuf,
    /// NRI's socket.
    pub nri_socket: PathBuf,
    /// `containerd --version`'s version field (`v2.4.2`, `1.7.24~ds1`).
    version: String,
    /// `/sys/fs/cgroup/*/k8s.io` directories that did not exist at start.
    k8s_io_before: Vec<PathBuf>,
}

impl Containerd {
    /// Starts `containerd` (its shim beside it) using OCI runtime `runc`,
    /// pods on `net`, pulls through the hosts.toml directory `mirrors`.
    pub fn start(
        containerd: &Path,
        runc: &Path,
        net: &PodNetwork,
        mirrors: &Path,
    ) -> Result<Containerd, KitError> {
        let dir = process::kit_tempdir("pkc.")?;
        let d = dir.path();
        let version = version_of(containerd);
        let nri = NriDirs::in_dir(d);
        let text = peer_config(d, runc, net, mirrors, major_version(&version));
        let process = ContainerdProcess::prepare(d, containerd, runc, &text)?;
        let mut cd = Containerd {
            socket: process.socket(),
            nri_socket: nri.socket,
            process,
            version,
            k8s_io_before: default_pod_cgroups(),
            _dir: dir,
        };
        cd.process.spawn()?;
        Ok(cd)
    }

    /// The CRI endpoint.
    pub fn endpoint(&self) -> String {
        self.process.endpoint()
    }

    /// containerd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path()
    }

    /// Its version as `containerd --version` names it (`v2.4.2`,
    /// `1.7.24~ds1`; empty if it did not say).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// containerd's pid (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Reaps shims of any containerd that exited meanwhile (they are our
    /// adopted children): call now and then during a long run.
    pub fn reap_exited_shims(&self) {
        process::reap_zombies_named("containerd-shim");
    }
}

/// The config of a comparison run's containerd in `d` (version 2 for a
/// containerd 1.x, else 3): NRI on, network namespaces under its state,
/// the kit's sandbox image, `runc` and mirrors as given.
fn peer_config(
    d: &Path,
    runc: &Path,
    net: &PodNetwork,
    mirrors: &Path,
    major: Option<u32>,
) -> String {
    let c = ContainerdConfig {
        sandbox_image: SANDBOX_IMAGE.to_string(),
        runc: Some(runc.to_path_buf()),
        cni_bin_dir: net.bin_dir.clone(),
        cni_conf_dir: net.conf_dir.clone(),
        mirrors: Some(mirrors.to_path_buf()),
        nri: Nri::Enabled(NriDirs::in_dir(d)),
        netns_under_state: true,
    };
    if major == Some(1) {
        c.render_v2(d)
    } else {
        c.render_v3(d)
    }
}

/// The version field of `<containerd> --version` ("containerd
/// github.com/containerd/containerd/v2 v2.4.2 COMMIT"), or empty.
pub fn version_of(containerd: &Path) -> String {
    Command::new(containerd)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(2)
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// The major version of a version field (`v2.4.2` → 2, `1.7.24~ds1` → 1).
pub fn major_version(version: &str) -> Option<u32> {
    version
        .trim_start_matches('v')
        .split('.')
        .next()?
        .parse()
        .ok()
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.process.sweep();
        // runc leaves parent cgroups behind: remove the default pod cgroup
        // where this run made it (it fails harmlessly if another
        // containerd has pods in it now).
        for d in default_pod_cgroups() {
            if !self.k8s_io_before.contains(&d) {
                let _ = std::fs::remove_dir(&d);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn major_version_should_read_upstream_and_debian_versions() {
        assert_eq!(major_version("v2.4.2"), Some(2));
        assert_eq!(major_version("1.7.24~ds1"), Some(1));
        assert_eq!(major_version(""), None);
    }

    fn toml_of(text: &str) -> toml::Value {
        toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn peer_config_should_be_v2_toml_with_the_cri_plugins_settings() {
        let net = PodNetwork::new().expect("network");
        let d = Path::new("/t/pkc.x");
        let text = peer_config(
            d,
            Path::new("/usr/sbin/runc"),
            &net,
            Path::new("/t/mirrors"),
            Some(1),
        );
        let v = toml_of(&text);
        assert_eq!(v["version"].as_integer(), Some(2));
        let cri = &v["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["sandbox_image"].as_str(), Some(SANDBOX_IMAGE));
        assert_eq!(cri["restrict_oom_score_adj"].as_bool(), Some(true));
        assert_eq!(cri["netns_mounts_under_state_dir"].as_bool(), Some(true));
        assert_eq!(cri["registry"]["config_path"].as_str(), Some("/t/mirrors"));
        let runc = &cri["containerd"]["runtimes"]["runc"]["options"];
        assert_eq!(runc["Root"].as_str(), Some("/t/pkc.x/runc"));
        assert_eq!(runc["BinaryName"].as_str(), Some("/usr/sbin/runc"));
        let nri = &v["plugins"]["io.containerd.nri.v1.nri"];
        assert_eq!(nri["disable"].as_bool(), Some(false));
        assert_eq!(nri["socket_path"].as_str(), Some("/t/pkc.x/nri.sock"));
    }

    #[test]
    fn peer_config_should_be_v3_toml_for_containerd_2() {
        let net = PodNetwork::new().expect("network");
        let d = Path::new("/t/pkc.x");
        let text = peer_config(d, Path::new("/r"), &net, Path::new("/m"), Some(2));
        let v = toml_of(&text);
        assert_eq!(v["version"].as_integer(), Some(3));
        let images = &v["plugins"]["io.containerd.cri.v1.images"];
        assert_eq!(
            images["pinned_images"]["sandbox"].as_str(),
            Some(SANDBOX_IMAGE)
        );
        assert_eq!(images["registry"]["config_path"].as_str(), Some("/m"));
        let rt = &v["plugins"]["io.containerd.cri.v1.runtime"];
        assert_eq!(rt["restrict_oom_score_adj"].as_bool(), Some(true));
        assert_eq!(
            rt["containerd"]["runtimes"]["runc"]["options"]["Root"].as_str(),
            Some("/t/pkc.x/runc")
        );
        assert_eq!(
            v["plugins"]["io.containerd.nri.v1.nri"]["socket_path"].as_str(),
            Some("/t/pkc.x/nri.sock")
        );
    }

    #[test]
    fn render_v2_should_leave_out_what_an_e2e_instance_does_not_set() {
        let d = Path::new("/t/pcd.x");
        let mut c = ContainerdConfig {
            sandbox_image: "docker.io/petrel/pause:latest".into(),
            runc: None,
            cni_bin_dir: "/usr/lib/cni".into(),
            cni_conf_dir: d.join("cni"),
            mirrors: None,
            nri: Nri::Absent,
            netns_under_state: false,
        };
        let v = toml_of(&c.render_v2(d));
        let cri = &v["plugins"]["io.containerd.grpc.v1.cri"];
        assert!(cri.get("registry").is_none());
        assert!(cri.get("netns_mounts_under_state_dir").is_none());
        assert!(cri["containerd"]["runtimes"]["runc"]["options"]
            .get("BinaryName")
            .is_none());
        assert!(v["plugins"].get("io.containerd.nri.v1.nri").is_none());
        c.nri = Nri::Disabled {
            socket: d.join("nri.sock"),
        };
        let v = toml_of(&c.render_v2(d));
        assert_eq!(
            v["plugins"]["io.containerd.nri.v1.nri"]["disable"].as_bool(),
            Some(true)
        );
    }
}
