//! A Petrel runtime under test as its own process: `petrel runtime` (or
//! `petrel node`, with the agent in its process) in a temporary root, its
//! own state, socket, cgroup parent (`/petrel-test-<random>`) and NRI
//! directories, driven over its socket with CRI [`Clients`]. Cleaned up on
//! drop even when a test fails: pods removed through the runtime, then a
//! sweep ([`crate::process`]) of whatever the test's own directories, runc
//! root and cgroup parent still hold.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;

use crate::bins::petrel_bin;
use crate::clients::Clients;
use crate::process::{random_suffix, remove_cgroup_tree, runc_sweep, unmount_under};

/// A runtime under test.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub config_file: PathBuf,
    /// A cgroup parent of this test only, e.g. `/petrel-test-3fa2…`.
    pub cgroup_parent: String,
    child: Option<Child>,
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
        let mut node = Self::prepare(extra_cri);
        node.spawn();
        node
    }

    /// Starts a runtime whose root is a tmpfs of `size` (e.g. `16m`): a
    /// small disk to fill. The mount is swept with the test's others.
    pub fn start_on_tmpfs(size: &str) -> Node {
        let mut node = Self::prepare("");
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

    /// A runtime's directories and config, not started yet.
    fn prepare(extra_cri: &str) -> Node {
        Self::prepare_with(extra_cri, "")
    }

    /// A runtime's directories and config with extra `[cri]` and `[nri]`
    /// settings (TOML lines; `[nri.…]` tables last), not started yet
    /// ([`Node::spawn`] starts it). NRI's socket and plugin directories are
    /// the test's own ([`Node::nri_dir`]).
    pub fn prepare_with(extra_cri: &str, extra_nri: &str) -> Node {
        let dir = tempfile::Builder::new()
            .prefix("petrel-e2e.")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().join("root");
        let state = dir.path().join("state");
        let socket = state.join("petrel.sock");
        let cgroup_parent = format!("/petrel-test-{}", random_suffix());
        let config_file = dir.path().join("config.toml");
        let nri_dir = dir.path().join("nri");
        // Pods get loopback only unless a test sets up a CNI network.
        let network = if extra_cri.contains("pod_network") {
            ""
        } else {
            "pod_network = \"loopback\"\n"
        };
        std::fs::write(
            &config_file,
            format!(
                "[cri]\nroot = {:?}\nstate = {:?}\ndefault_cgroup_parent = {:?}\n{network}{extra_cri}\n\
                 [nri]\nsocket_path = {:?}\nplugin_path = {:?}\nplugin_config_path = {:?}\n{extra_nri}\n",
                root,
                state,
                cgroup_parent,
                nri_dir.join("nri.sock"),
                nri_dir.join("plugins"),
                nri_dir.join("conf.d"),
            ),
        )
        .expect("write config");
        Node {
            dir,
            root,
            state,
            socket,
            config_file,
            cgroup_parent,
            child: None,
        }
    }

    /// NRI's directory of this runtime: `nri.sock`, `plugins/` (the
    /// pre-registered plugins) and `conf.d/`.
    pub fn nri_dir(&self) -> PathBuf {
        self.dir.path().join("nri")
    }

    /// Starts the prepared runtime and waits until it serves.
    pub fn spawn(&mut self) {
        self.spawn_command(Command::new(petrel_bin()));
    }

    /// Starts the prepared runtime with a soft open-file limit of `soft`
    /// (the hard one stays), as a service manager would.
    #[allow(unsafe_code)] // pre_exec has no safe form
    pub fn spawn_with_open_file_limit(&mut self, soft: u64) {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(petrel_bin());
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
        self.spawn_command(cmd);
    }

    fn spawn_command(&mut self, cmd: Command) {
        self.spawn_as(cmd, "runtime", &[]);
    }

    /// Starts the prepared runtime as `petrel node`: runtime and agent in
    /// one process, the agent configured by `agent_args` (its flags; give
    /// it its own manifests, socket, port and node name). Waits until the
    /// runtime serves; cleaned up like a runtime.
    pub fn spawn_node(&mut self, agent_args: &[&str]) {
        self.spawn_as(Command::new(petrel_bin()), "node", agent_args);
    }

    fn spawn_as(&mut self, mut cmd: Command, sub: &str, extra: &[&str]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("runtime.log"))
            .expect("runtime log");
        let child = cmd
            .args([sub, "--config"])
            .arg(&self.config_file)
            .args(["--log-level", "debug"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start petrel {sub}: {e}"));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("runtime exited at start ({st}):\n{}", self.log());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("runtime did not start:\n{}", self.log());
    }

    /// The runtime's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("runtime.log")).unwrap_or_default()
    }

    /// The runtime's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The runtime's children that are zombies (pid and name): an orphan
    /// it adopted as a child subreaper and never reaped.
    pub fn zombie_children(&self) -> Vec<String> {
        let me = self.pid().to_string();
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let Some(close) = stat.rfind(')') else {
                continue;
            };
            let mut f = stat[close + 1..].split_whitespace();
            if f.next() == Some("Z") && f.next() == Some(me.as_str()) {
                found.push(stat[..=close].to_string());
            }
        }
        found
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
        let out = Command::new("runc")
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

    /// `kill -9` the runtime (containers keep running under their shims).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM the runtime and wait for it to exit; returns its status code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        crate::process::signal(c.id(), rustix::process::Signal::TERM);
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st.code();
            }
            if start.elapsed() > Duration::from_secs(20) {
                let _ = c.kill();
                let _ = c.wait();
                panic!("runtime did not stop on SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the runtime again on the same root and state.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the runtime first");
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

    /// The directory of cgroup `path` in the v1 `controller` hierarchy.
    pub fn cgroup_dir(controller: &str, path: &str) -> PathBuf {
        PathBuf::from(format!("/sys/fs/cgroup/{controller}{path}"))
    }

    /// Asserts that no pod or container of this node left anything: bundles,
    /// writable layers, sandbox directories, mounts, and the cgroup of the
    /// pod named `pod` (its containers' cgroups are inside it).
    pub fn assert_no_debris(&self, pod: &str) {
        for d in ["state/containers", "state/sandboxes", "root/containers"] {
            let n = std::fs::read_dir(self.dir.path().join(d))
                .map(|it| it.count())
                .unwrap_or(0);
            assert_eq!(n, 0, "{d} not empty");
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

    fn cleanup(&mut self) {
        // 1. Through the runtime: it knows every pod it made.
        if self.child.is_none() && self.root.join("meta.redb").exists() {
            // A test that killed the runtime: start it again to clean up.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.spawn()));
        }
        if self.child.is_some() {
            let _ = crate::cri::remove_all_pods(&format!("unix://{}", self.socket.display()));
            if let Some(mut c) = self.child.take() {
                crate::process::signal(c.id(), rustix::process::Signal::TERM);
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(10) {
                    if let Ok(Some(_)) = c.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // 2. Sweep what is left in this test's own places.
        runc_sweep(Path::new("runc"), &self.state.join("runc"));
        unmount_under(self.dir.path());
        remove_cgroup_tree(&self.cgroup_parent);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.cleanup();
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
