//! containerd 2.x under test, for comparison runs: the binaries `make peers`
//! builds (containerd and its runc shim, found through [`crate::peers`]),
//! with its own root, state, socket, runc root, NRI socket and config
//! (version 3; version 2 for a containerd 1.x such as Debian's 1.7 that
//! `make containerd` unpacks), `restrict_oom_score_adj = true` (root lacks
//! CAP_SYS_RESOURCE here), a CNI network, a hosts.toml mirror directory and
//! `registry.k8s.io/pause:3.9` as sandbox image. On drop: pods removed
//! through CRI, containerd stopped by pid, its shims killed and reaped,
//! then runc root, mounts and netns files swept.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::network::PodNetwork;
use crate::process::{self, describe, spawn_logged, stop_child};
use crate::KitError;

/// The sandbox image containerd runs for each pod (served by the kit's
/// registry through the mirror).
pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.9";

/// A running containerd.
pub struct Containerd {
    dir: tempfile::TempDir,
    /// The CRI socket.
    pub socket: PathBuf,
    /// NRI's socket.
    pub nri_socket: PathBuf,
    runc: PathBuf,
    /// `containerd --version`'s version field (`v2.4.2`, `1.7.24~ds1`).
    version: String,
    /// `/sys/fs/cgroup/*/k8s.io` directories that did not exist at start.
    k8s_io_before: Vec<PathBuf>,
    child: Option<Child>,
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

impl Containerd {
    /// Starts `containerd` (its shim beside it) using OCI runtime `runc`,
    /// pods on `net`, pulls through the hosts.toml directory `mirrors`.
    pub fn start(
        containerd: &Path,
        runc: &Path,
        net: &PodNetwork,
        mirrors: &Path,
    ) -> Result<Containerd, KitError> {
        process::become_subreaper();
        let dir = process::kit_tempdir("pkc.")?;
        let d = dir.path();
        let socket = d.join("c.sock");
        let nri_socket = d.join("nri.sock");
        let config = d.join("config.toml");
        let version = version_of(containerd);
        let text = if major_version(&version) == Some(1) {
            config_v2(d, &socket, &nri_socket, runc, net, mirrors)
        } else {
            config_v3(d, &socket, &nri_socket, runc, net, mirrors)
        };
        std::fs::write(&config, text).map_err(|e| KitError::io("write", &config, e))?;
        let log = d.join("containerd.log");
        let bin_dir = containerd.parent().unwrap_or(Path::new("/"));
        // Its own directory first in PATH: the shim beside it is the one used.
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            bin_dir.display()
        );
        let mut cmd = Command::new(containerd);
        cmd.arg("--config")
            .arg(&config)
            .args(["--log-level", "info"])
            .env("PATH", path);
        let command = describe(&cmd);
        let child = spawn_logged("containerd", &mut cmd, &log)?;
        process::write_pid_file(d, "containerd", child.id());
        let mut cd = Containerd {
            socket,
            nri_socket,
            runc: runc.to_path_buf(),
            version,
            k8s_io_before: default_pod_cgroups(),
            dir,
            child: Some(child),
        };
        if let Some(c) = cd.child.as_mut() {
            process::wait_for_socket(
                "containerd",
                c,
                &cd.socket,
                Duration::from_secs(30),
                &command,
                &log,
            )?;
        }
        // The socket exists before the CRI plugin serves.
        let start = Instant::now();
        while !crate::cri::answers_version(&cd.endpoint()) {
            if start.elapsed() > Duration::from_secs(30) {
                return Err(KitError::Start {
                    component: "containerd".into(),
                    command,
                    log,
                    detail: "CRI did not answer Version within 30 s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(cd)
    }

    /// The CRI endpoint.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// containerd's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("containerd.log")
    }

    /// Its version as `containerd --version` names it (`v2.4.2`,
    /// `1.7.24~ds1`; empty if it did not say).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// containerd's pid (None once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Reaps shims of any containerd that exited meanwhile (they are our
    /// adopted children): call now and then during a long run.
    pub fn reap_exited_shims(&self) {
        process::reap_zombies_named("containerd-shim");
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

/// containerd 1.x's configuration (version 2), the same settings as
/// [`config_v3`] where 1.x has them: no pinned images (1.7 never removes
/// its sandbox image), one CNI plugin directory.
pub fn config_v2(
    d: &Path,
    socket: &Path,
    nri_socket: &Path,
    runc: &Path,
    net: &PodNetwork,
    mirrors: &Path,
) -> String {
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"version = 2
root = {root:?}
state = {state:?}
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = {socket:?}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt:?}

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = {nri_socket:?}
  plugin_path = {nri_plugins:?}
  plugin_config_path = {nri_conf:?}

[{cri}]
  sandbox_image = "{SANDBOX_IMAGE}"
  enable_selinux = false
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = {runc:?}
  Root = {runc_root:?}
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = {cni_bin:?}
  conf_dir = {cni_conf:?}
  max_conf_num = 1

[{cri}.registry]
  config_path = {mirrors:?}
"#,
        root = d.join("root"),
        state = d.join("state"),
        opt = d.join("opt"),
        nri_plugins = d.join("nri-plugins"),
        nri_conf = d.join("nri-conf.d"),
        runc_root = d.join("runc"),
        cni_bin = net.bin_dir,
        cni_conf = net.conf_dir,
    )
}

/// containerd's configuration (version 3) with everything in `d`.
pub fn config_v3(
    d: &Path,
    socket: &Path,
    nri_socket: &Path,
    runc: &Path,
    net: &PodNetwork,
    mirrors: &Path,
) -> String {
    format!(
        r#"version = 3
root = {root:?}
state = {state:?}
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = {socket:?}

[plugins.'io.containerd.internal.v1.opt']
  path = {opt:?}

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = {nri_socket:?}
  plugin_path = {nri_plugins:?}
  plugin_config_path = {nri_conf:?}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{SANDBOX_IMAGE}"

[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = {mirrors:?}

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = {runc:?}
  Root = {runc_root:?}
  SystemdCgroup = false

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [{cni_bin:?}]
  conf_dir = {cni_conf:?}
  max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        root = d.join("root"),
        state = d.join("state"),
        opt = d.join("opt"),
        nri_plugins = d.join("nri-plugins"),
        nri_conf = d.join("nri-conf.d"),
        runc_root = d.join("runc"),
        cni_bin = net.bin_dir,
        cni_conf = net.conf_dir,
    )
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = crate::cri::remove_all_pods(&self.endpoint());
            stop_child(&mut c, Duration::from_secs(15));
        }
        // Shims of this instance name its socket on their command line.
        process::kill_children_with_arg(&self.socket.display().to_string());
        process::runc_sweep(&self.runc, &self.dir.path().join("runc"));
        std::thread::sleep(Duration::from_millis(100));
        process::reap_zombies_named("containerd-shim");
        process::unmount_under(self.dir.path());
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

    #[test]
    fn config_v2_should_be_toml_with_the_cri_plugins_settings() {
        let net = PodNetwork::new().expect("network");
        let d = Path::new("/t/pkc.x");
        let text = config_v2(
            d,
            &d.join("c.sock"),
            &d.join("nri.sock"),
            Path::new("/usr/sbin/runc"),
            &net,
            Path::new("/t/mirrors"),
        );
        let v: toml::Value = toml::from_str(&text).expect("toml");
        assert_eq!(v["version"].as_integer(), Some(2));
        let cri = &v["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["sandbox_image"].as_str(), Some(SANDBOX_IMAGE));
        assert_eq!(cri["restrict_oom_score_adj"].as_bool(), Some(true));
        assert_eq!(cri["registry"]["config_path"].as_str(), Some("/t/mirrors"));
        assert_eq!(
            cri["containerd"]["runtimes"]["runc"]["options"]["Root"].as_str(),
            Some("/t/pkc.x/runc")
        );
    }
}
