//! A Petrel runtime under test as its own process, for the end-to-end
//! suite: `petrel runtime` (or `petrel node`, with the agent in its
//! process) from [`crate::petrel::PetrelRuntime`], the kit's one launcher of
//! Petrel, in a temporary root (`/tmp/petrel-e2e.*`) with its own state,
//! socket, cgroup parent (`/petrel-test-<random>`) and NRI directories,
//! loopback pods unless a test asks otherwise, driven over its socket with
//! CRI [`Clients`]. Failures panic, as tests want them. Cleaned up on drop
//! even when a test fails, as the launcher does: pods removed through the
//! runtime, then a sweep of its directory, runc root and cgroup parent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;

use crate::bins::petrel_bin;
use crate::clients::Clients;
use crate::petrel::{Mode, PetrelConfig, PetrelRuntime};
use crate::process::random_suffix;

/// A runtime under test: a [`PetrelRuntime`] (its fields and methods
/// through `Deref`) with the end-to-end suite's helpers.
pub struct Node {
    rt: PetrelRuntime,
}

impl Deref for Node {
    type Target = PetrelRuntime;
    fn deref(&self) -> &PetrelRuntime {
        &self.rt
    }
}

impl DerefMut for Node {
    fn deref_mut(&mut self) -> &mut PetrelRuntime {
        &mut self.rt
    }
}

impl Node {
    /// Starts a runtime with the busybox test image imported.
    pub async fn start_with_busybox() -> Node {
        let node = Node::start();
        let mut c = node.clients().await;
        node.import_busybox(&mut c).await;
        node
    }

    /// Starts a runtime with default settings.
    pub fn start() -> Node {
        Self::start_with("")
    }

    /// Starts a runtime with extra `[cri]` settings (TOML lines).
    pub fn start_with(extra_cri: &str) -> Node {
        let mut node = Self::prepare_with(extra_cri, "");
        node.spawn();
        node
    }

    /// Starts a runtime with default settings whose OCI runtime is `runc`
    /// (`runtime_binary`; the sweeps use it too), e.g. the newer runc of the
    /// peers ([`crate::peers::peer_binary`]`("runc")`).
    pub fn start_with_runc(runc: &Path) -> Node {
        let mut node = Self::prepare(Some(runc.to_path_buf()), "", "");
        node.spawn();
        node
    }

    /// Starts a runtime whose root is a tmpfs of `size` (e.g. `16m`): a
    /// small disk to fill. The mount is swept with the test's others.
    pub fn start_on_tmpfs(size: &str) -> Node {
        let mut node = Self::prepare_with("", "");
        std::fs::create_dir_all(&node.root).expect("mkdir root");
        let data = std::ffi::CString::new(format!("size={size},mode=0700")).expect("cstring");
        rustix::mount::mount(
            "tmpfs",
            &node.root,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            data.as_c_str(),
        )
        .unwrap_or_else(|e| panic!("mount tmpfs on {}: {e}", node.root.display()));
        node.spawn();
        node
    }

    /// A runtime's directories and config with extra `[cri]` and `[nri]`
    /// settings (TOML lines; `[nri.…]` tables last), not started yet
    /// ([`Node::spawn`] starts it). NRI's socket and plugin directories are
    /// the test's own ([`Node::nri_dir`]).
    pub fn prepare_with(extra_cri: &str, extra_nri: &str) -> Node {
        Self::prepare(None, extra_cri, extra_nri)
    }

    /// Starts a runtime on the systemd cgroup driver (`cgroup_driver =
    /// "systemd"`: a host with systemd as PID 1 on cgroup v2, the systemd
    /// test VM). Its default slice, `petrele2e<random>.slice`, is
    /// [`PetrelRuntime::cgroup_parent`]; a pod's slice under it is
    /// `petrele2e<random>-<name>.slice` ([`Node::systemd_pod_config`]).
    pub fn start_systemd() -> Node {
        Self::start_systemd_with(None)
    }

    /// [`Node::start_systemd`] whose OCI runtime is `runc` (a wrapper that
    /// stalls a create, say; the sweeps use it too).
    pub fn start_systemd_with_runc(runc: &Path) -> Node {
        Self::start_systemd_with(Some(runc.to_path_buf()))
    }

    fn start_systemd_with(runc: Option<PathBuf>) -> Node {
        let parent = format!("petrele2e{}.slice", random_suffix());
        let mut node = Self::prepare_as(runc, parent, "cgroup_driver = \"systemd\"", "");
        node.spawn();
        node
    }

    /// A pod config unique to this test whose parent is its own slice
    /// under the runtime's default one (systemd driver).
    pub fn systemd_pod_config(&self, name: &str) -> api::PodSandboxConfig {
        let mut pc = self.pod_config(name);
        if let Some(l) = pc.linux.as_mut() {
            l.cgroup_parent = self.systemd_pod_slice(name);
        }
        pc
    }

    /// The slice of [`Node::systemd_pod_config`]`(name)`.
    pub fn systemd_pod_slice(&self, name: &str) -> String {
        format!(
            "{}-{name}.slice",
            self.cgroup_parent.trim_end_matches(".slice")
        )
    }

    fn prepare(runc: Option<PathBuf>, extra_cri: &str, extra_nri: &str) -> Node {
        let parent = format!("/petrel-test-{}", random_suffix());
        Self::prepare_as(runc, parent, extra_cri, extra_nri)
    }

    fn prepare_as(
        runc: Option<PathBuf>,
        cgroup_parent: String,
        extra_cri: &str,
        extra_nri: &str,
    ) -> Node {
        let config = PetrelConfig {
            dir_prefix: "petrel-e2e.",
            runc,
            shim: None,
            cgroup_parent,
            cni: None,
            mirrors: None,
            extra_cri: extra_cri.to_string(),
            extra_nri: extra_nri.to_string(),
            log_level: "debug",
        };
        let rt = PetrelRuntime::prepare(&petrel_bin(), &config).unwrap_or_else(|e| panic!("{e}"));
        Node { rt }
    }

    /// NRI's directory of this runtime: `nri.sock`, `plugins/` (the
    /// pre-registered plugins) and `conf.d/`.
    pub fn nri_dir(&self) -> PathBuf {
        self.dir.path().join("nri")
    }

    /// Starts the prepared runtime and waits until it serves.
    pub fn spawn(&mut self) {
        let cmd = self.command();
        self.spawn_as(cmd, Mode::Runtime);
    }

    /// Starts the prepared runtime with a soft open-file limit of `soft`
    /// (the hard one stays), as a service manager would.
    #[allow(unsafe_code)] // pre_exec has no safe form
    pub fn spawn_with_open_file_limit(&mut self, soft: u64) {
        use std::os::unix::process::CommandExt;
        let mut cmd = self.command();
        // SAFETY: only setrlimit(2), async-signal-safe, runs in the child.
        unsafe {
            cmd.pre_exec(move || {
                let mut l = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                l.rlim_cur = soft;
                if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        self.spawn_as(cmd, Mode::Runtime);
    }

    /// Starts the prepared runtime as `petrel node`: runtime and agent in
    /// one process, the agent configured by `agent_args` (its flags; give
    /// it its own manifests, socket, port and node name). Waits until the
    /// runtime serves; cleaned up like a runtime.
    pub fn spawn_node(&mut self, agent_args: &[&str]) {
        let cmd = self.command();
        let args = agent_args.iter().map(|a| a.to_string()).collect();
        self.spawn_as(cmd, Mode::Node(args));
    }

    fn spawn_as(&mut self, cmd: Command, mode: Mode) {
        if let Err(e) = self.rt.spawn(cmd, &mode) {
            panic!("{e}\n{}", self.log());
        }
    }

    /// The runtime's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The runtime's pid (0 when stopped).
    pub fn pid(&self) -> u32 {
        self.rt.pid().unwrap_or(0)
    }

    /// The runtime's children that are zombies (pid and name): an orphan
    /// it adopted as a child subreaper and never reaped.
    pub fn zombie_children(&self) -> Vec<String> {
        let Some(pid) = self.rt.pid() else {
            return Vec::new();
        };
        crate::process::children_of(pid)
            .into_iter()
            .filter(|c| c.state == 'Z')
            .map(|c| format!("{} ({})", c.pid, c.comm))
            .collect()
    }

    /// Waits up to `within` for the runtime to have no zombie children (its
    /// own children are reaped a moment after they exit, adopted orphans
    /// within `petrel_runtime::orphans::GRACE` twice).
    pub fn assert_no_zombie_children(&self, within: Duration) {
        let start = Instant::now();
        loop {
            let z = self.zombie_children();
            if z.is_empty() {
                return;
            }
            assert!(start.elapsed() < within, "the runtime left zombies: {z:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// runc's containers in this runtime's runc root: id → status
    /// (`created`, `running`, `stopped`...).
    pub fn runc_list(&self) -> HashMap<String, String> {
        let out = Command::new(self.runc())
            .arg("--root")
            .arg(self.state.join("runc"))
            .args(["list", "--format", "json"])
            .output()
            .expect("runc list");
        assert!(out.status.success(), "runc list: {out:?}");
        let list: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                Some((
                    c["id"].as_str()?.to_string(),
                    c["status"].as_str()?.to_string(),
                ))
            })
            .collect()
    }

    /// The live shims of this runtime's containers: container id → pid,
    /// recognised by the bundle their command line names (zombies have
    /// none).
    pub fn live_shims(&self) -> HashMap<String, u32> {
        let containers = self.state.join("containers");
        let mut found = HashMap::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let Some(i) = args.iter().position(|a| *a == b"--bundle") else {
                continue;
            };
            let Some(bundle) = args.get(i + 1).and_then(|b| std::str::from_utf8(b).ok()) else {
                continue;
            };
            let bundle = Path::new(bundle);
            if bundle.parent() == Some(containers.as_path()) {
                if let Some(id) = bundle.file_name().and_then(|n| n.to_str()) {
                    found.insert(id.to_string(), pid);
                }
            }
        }
        found
    }

    /// SIGTERM the runtime and wait for it to exit; returns its status code.
    /// Panics if it needed a SIGKILL after 20 s.
    pub fn terminate(&mut self) -> Option<i32> {
        let (st, killed) = self.stop(Duration::from_secs(20))?;
        assert!(!killed, "runtime did not stop on SIGTERM:\n{}", self.log());
        st.code()
    }

    /// Starts the runtime again on the same root and state.
    pub fn restart(&mut self) {
        assert!(!self.is_running(), "stop the runtime first");
        self.spawn();
    }

    /// Connects CRI clients.
    pub async fn clients(&self) -> Clients {
        let ch = petrel_cri::connect(&format!("unix://{}", self.socket.display()))
            .await
            .expect("connect to runtime");
        Clients {
            rt: RuntimeServiceClient::new(ch.clone()),
            img: ImageServiceClient::new(ch.clone()),
            admin: AdminClient::new(ch),
        }
    }

    /// Clients on a connection with the smallest HTTP/2 windows, so that a
    /// subscriber that stops reading is felt by the server quickly.
    pub async fn clients_small_window(&self) -> Clients {
        use hyper_util::rt::TokioIo;
        let path = self.socket.clone();
        let ch = tonic::transport::Endpoint::from_static("http://[::1]:50051")
            .initial_stream_window_size(Some(65_535))
            .initial_connection_window_size(Some(65_535))
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    tokio::net::UnixStream::connect(path)
                        .await
                        .map(TokioIo::new)
                }
            }))
            .await
            .expect("connect to runtime");
        Clients {
            rt: RuntimeServiceClient::new(ch.clone()),
            img: ImageServiceClient::new(ch.clone()),
            admin: AdminClient::new(ch),
        }
    }

    /// Imports the busybox test image; returns its id.
    pub async fn import_busybox(&self, c: &mut Clients) -> String {
        c.import_busybox().await
    }

    /// A pod config unique to this test.
    pub fn pod_config(&self, name: &str) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            labels: HashMap::from([("test".to_string(), name.to_string())]),
            ..crate::clients::test_pod_config(
                "e2e",
                name,
                &self.dir.path().join("logs"),
                &self.cgroup_parent,
            )
        }
    }

    /// The directory of cgroup `path` in the v1 `controller` hierarchy,
    /// or in the one cgroup v2 hierarchy on a v2 host.
    pub fn cgroup_dir(controller: &str, path: &str) -> PathBuf {
        if Self::cgroup_v2() {
            PathBuf::from(format!("/sys/fs/cgroup{path}"))
        } else {
            PathBuf::from(format!("/sys/fs/cgroup/{controller}{path}"))
        }
    }

    /// Whether this host is pure cgroup v2 (the test VM), not v1 or hybrid
    /// (this machine): only a v2 root has `cgroup.controllers`.
    pub fn cgroup_v2() -> bool {
        std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
    }

    /// Makes cgroup `path` in the `controller` hierarchy (v1) or in the one
    /// hierarchy with the controllers enabled on its way down (v2, where a
    /// child has only the limit files its parent's `subtree_control`
    /// gives it). Returns its directory.
    pub fn make_cgroup(controller: &str, path: &str) -> std::io::Result<PathBuf> {
        let dir = Self::cgroup_dir(controller, path);
        if !Self::cgroup_v2() {
            std::fs::create_dir_all(&dir)?;
            return Ok(dir);
        }
        let mut at = PathBuf::from("/sys/fs/cgroup");
        for part in path.split('/').filter(|p| !p.is_empty()) {
            let available = std::fs::read_to_string(at.join("cgroup.controllers"))?;
            let enable: Vec<String> = available
                .split_whitespace()
                .map(|c| format!("+{c}"))
                .collect();
            // Best effort: a controller the kernel will not enable here
            // (say, cpuset with tasks in the parent) is left off.
            for c in enable {
                let _ = std::fs::write(at.join("cgroup.subtree_control"), c);
            }
            at.push(part);
            if !at.is_dir() {
                std::fs::create_dir(&at)?;
            }
        }
        Ok(dir)
    }

    /// The file of a cgroup's memory limit: v1's or v2's.
    pub fn memory_limit_file() -> &'static str {
        if Self::cgroup_v2() {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        }
    }

    /// The `cpu.weight` runc (and kubelet) write on v2 for CPU `shares`.
    pub fn cpu_weight(shares: u64) -> u64 {
        let shares = shares.clamp(2, 262_144);
        1 + (shares - 2) * 9999 / 262_142
    }

    /// Asserts that no pod or container of this node left anything: bundles,
    /// writable layers (the trash emptied too, within 10 s), sandbox
    /// directories, mounts, and the cgroup of the
    /// pod named `pod` (its containers' cgroups are inside it).
    pub fn assert_no_debris(&self, pod: &str) {
        let count = |d: &str| {
            std::fs::read_dir(self.dir.path().join(d))
                .map(|it| it.count())
                .unwrap_or(0)
        };
        for d in ["state/containers", "state/sandboxes", "root/containers"] {
            assert_eq!(count(d), 0, "{d} not empty");
        }
        // Removed containers' files go to the trash, emptied in the
        // background: given a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for d in ["state/trash", "root/trash"] {
            while count(d) > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            assert_eq!(count(d), 0, "{d} not emptied");
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(
            !mounts.contains(&self.dir.path().display().to_string()),
            "mounts left"
        );
        let pod_cg = format!("{}/{pod}", self.cgroup_parent);
        assert!(
            !Node::cgroup_dir("memory", &pod_cg).exists(),
            "pod cgroup {pod_cg} left"
        );
    }
}

/// Reads a container's CRI log file.
pub fn read_log(node: &Node, pod: &str, container: &str) -> String {
    std::fs::read_to_string(
        node.dir
            .path()
            .join("logs")
            .join(pod)
            .join(format!("{container}.log")),
    )
    .unwrap_or_default()
}
