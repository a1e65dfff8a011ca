//! End-to-end test harness: a real `petrel runtime` in a temporary root,
//! driven over its socket with CRI clients, cleaned up even when a test
//! fails (pods removed through the runtime, then a sweep of whatever the
//! test's own directories, runc root and cgroup parent still hold).

#![allow(dead_code, unsafe_code, clippy::unwrap_used, clippy::expect_used)]

pub mod agent;
pub mod cni;
pub mod containerd;
pub mod h2raw;
pub mod oci_layout;
pub mod registry;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

pub const BUSYBOX: &str = "docker.io/petrel/busybox:latest";

/// The `petrel` binary under test.
pub fn petrel_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_petrel"))
}

/// The test image archives: built by `make image` (PETREL_TEST_IMAGES), or
/// here on first use.
pub fn images_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PETREL_TEST_IMAGES") {
        let d = PathBuf::from(d);
        if d.join("busybox-oci.tar").is_file() {
            return d;
        }
    }
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = ws.join("target/petrel-test-images");
    // Build into a private directory and rename, so concurrent test
    // processes never see a half-written archive.
    if !out.join("busybox-oci.tar").is_file() {
        let tmp = ws.join(format!("target/petrel-test-images.{}", std::process::id()));
        let st = Command::new(ws.join("scripts/build-test-image.sh"))
            .arg(&tmp)
            .status()
            .expect("run scripts/build-test-image.sh");
        assert!(st.success(), "building the test image failed");
        if std::fs::rename(&tmp, &out).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    out
}

pub fn random_suffix() -> String {
    let mut b = [0u8; 6];
    getrandom::getrandom(&mut b).expect("random");
    hex::encode(b)
}

/// CRI clients on one connection.
#[derive(Clone)]
pub struct Clients {
    pub rt: RuntimeServiceClient<Channel>,
    pub img: ImageServiceClient<Channel>,
    pub admin: AdminClient<Channel>,
}

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
        let src = std::ffi::CString::new("tmpfs").expect("cstring");
        let target = std::ffi::CString::new(node.root.display().to_string()).expect("cstring");
        let data = std::ffi::CString::new(format!("size={size},mode=0700")).expect("cstring");
        // SAFETY: mount(2) with valid C strings.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                src.as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
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
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
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

    /// Imports the busybox test image.
    pub async fn import_busybox(&self, c: &mut Clients) -> String {
        let path = images_dir().join("busybox-oci.tar");
        let r = c
            .admin
            .import_image(petrel_cri::admin::ImportImageRequest {
                path: path.display().to_string(),
                tags: vec![],
            })
            .await
            .expect("import busybox")
            .into_inner();
        r.images[0].id.clone()
    }

    /// A pod config unique to this test.
    pub fn pod_config(&self, name: &str) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.to_string(),
                namespace: "e2e".to_string(),
                uid: format!("uid-{name}"),
                attempt: 0,
            }),
            hostname: name.to_string(),
            log_directory: self
                .dir
                .path()
                .join("logs")
                .join(name)
                .display()
                .to_string(),
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: format!("{}/{name}", self.cgroup_parent),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(api::NamespaceOption {
                        network: api::NamespaceMode::Pod as i32,
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
            let socket = self.socket.clone();
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .ok()?;
                rt.block_on(async move {
                    let ch = petrel_cri::connect(&format!("unix://{}", socket.display()))
                        .await
                        .ok()?;
                    let mut c = RuntimeServiceClient::new(ch);
                    let pods = c
                        .list_pod_sandbox(api::ListPodSandboxRequest::default())
                        .await
                        .ok()?
                        .into_inner();
                    for p in pods.items {
                        let _ = c
                            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                                pod_sandbox_id: p.id,
                            })
                            .await;
                    }
                    Some(())
                })
            })
            .join();
            if let Some(mut c) = self.child.take() {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
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
        let runc_root = self.state.join("runc");
        if let Ok(out) = Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(["list", "-q"])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = Command::new("runc")
                    .arg("--root")
                    .arg(&runc_root)
                    .args(["delete", "--force", id])
                    .output();
            }
        }
        let mut mounts = mounts_under(self.dir.path());
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = rustix_umount(&m);
        }
        remove_cgroup_tree(&self.cgroup_parent);
    }
}

/// Mount points at or below `dir` (by path prefix), from /proc/self/mountinfo.
pub fn mounts_under(dir: &std::path::Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

fn rustix_umount(path: &str) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path).map_err(std::io::Error::other)?;
    // SAFETY: umount2 with a valid C string.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Removes a test's cgroup tree in every hierarchy (deepest first).
pub fn remove_cgroup_tree(path: &str) {
    let Ok(ctrls) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for c in ctrls.flatten() {
        let top = c.path().join(path.trim_start_matches('/'));
        if !top.is_dir() {
            continue;
        }
        let mut dirs = vec![];
        let mut stack = vec![top.clone()];
        while let Some(d) = stack.pop() {
            if let Ok(it) = std::fs::read_dir(&d) {
                for e in it.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        stack.push(e.path());
                    }
                }
            }
            dirs.push(d);
        }
        for d in dirs.into_iter().rev() {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

/// Lists cgroup directories left under a test's parent in any hierarchy.
pub fn cgroup_leftovers(path: &str) -> Vec<PathBuf> {
    let mut out = vec![];
    if let Ok(ctrls) = std::fs::read_dir("/sys/fs/cgroup") {
        for c in ctrls.flatten() {
            let top = c.path().join(path.trim_start_matches('/'));
            if top.is_dir() {
                out.push(top);
            }
        }
    }
    out
}

impl Drop for Node {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// A container config running `sh -c script` in the busybox image.
pub fn sh_container(name: &str, script: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: BUSYBOX.to_string(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), script.to_string()],
        log_path: format!("{name}.log"),
        labels: HashMap::from([("container".to_string(), name.to_string())]),
        ..Default::default()
    }
}

impl Clients {
    /// The runtime's metrics in the Prometheus text format (Admin.Metrics).
    pub async fn metrics(&mut self) -> String {
        self.admin
            .metrics(petrel_cri::admin::MetricsRequest {})
            .await
            .expect("Metrics")
            .into_inner()
            .text
    }

    /// ExecSync of `sh -c script` in container `id` with a timeout in
    /// seconds; the call itself must succeed (the script may fail).
    pub async fn exec_sh(&mut self, id: &str, script: &str, timeout: i64) -> api::ExecSyncResponse {
        self.rt
            .exec_sync(api::ExecSyncRequest {
                container_id: id.to_string(),
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                timeout,
            })
            .await
            .expect("ExecSync")
            .into_inner()
    }

    /// RunPodSandbox, returning the id.
    pub async fn run_pod(&mut self, config: api::PodSandboxConfig) -> String {
        self.rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .expect("RunPodSandbox")
            .into_inner()
            .pod_sandbox_id
    }

    /// CreateContainer, returning the id.
    pub async fn create(
        &mut self,
        pod: &str,
        pod_config: &api::PodSandboxConfig,
        config: api::ContainerConfig,
    ) -> Result<String, tonic::Status> {
        self.rt
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.to_string(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    /// CreateContainer + StartContainer.
    pub async fn run(
        &mut self,
        pod: &str,
        pod_config: &api::PodSandboxConfig,
        config: api::ContainerConfig,
    ) -> String {
        let id = self
            .create(pod, pod_config, config)
            .await
            .expect("CreateContainer");
        self.start(&id).await.expect("StartContainer");
        id
    }

    pub async fn start(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .start_container(api::StartContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .map(drop)
    }

    /// The `info` of a verbose ContainerStatus (pid, runtime spec, ...).
    pub async fn verbose_info(&mut self, id: &str) -> serde_json::Value {
        let r = self
            .rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            })
            .await
            .expect("ContainerStatus")
            .into_inner();
        serde_json::from_str(&r.info["info"]).expect("verbose info is JSON")
    }

    /// The pid of a running container's init (from its verbose status).
    pub async fn init_pid(&mut self, id: &str) -> u64 {
        self.verbose_info(id).await["pid"]
            .as_u64()
            .expect("pid in verbose info")
    }

    /// Asserts that ContainerStatus of `id` answers NOT_FOUND.
    pub async fn assert_container_gone(&mut self, id: &str) {
        let err = self
            .rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .expect_err("ContainerStatus of a removed container");
        assert_eq!(err.code(), tonic::Code::NotFound, "{id}");
    }

    pub async fn status(&mut self, id: &str) -> api::ContainerStatus {
        self.rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .status
            .expect("status")
    }

    /// Waits until the container reaches `state`.
    pub async fn wait_state(
        &mut self,
        id: &str,
        state: api::ContainerState,
        within: Duration,
    ) -> api::ContainerStatus {
        let start = Instant::now();
        loop {
            let s = self.status(id).await;
            if s.state == state as i32 {
                return s;
            }
            assert!(
                start.elapsed() < within,
                "container {id} did not reach {state:?}: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(&mut self, id: &str, timeout: i64) -> Result<(), tonic::Status> {
        self.rt
            .stop_container(api::StopContainerRequest {
                container_id: id.to_string(),
                timeout,
            })
            .await
            .map(drop)
    }

    pub async fn remove(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .remove_container(api::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .map(drop)
    }

    pub async fn remove_pod(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.rt
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .map(drop)
    }
}

/// The namespace options of a pod config made by [`Node::pod_config`].
pub fn pod_namespaces(pc: &mut api::PodSandboxConfig) -> &mut api::NamespaceOption {
    pc.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options
        .get_or_insert_with(Default::default)
}

/// `cfg` with its own namespace options set to `opts`.
pub fn with_namespaces(
    mut cfg: api::ContainerConfig,
    opts: api::NamespaceOption,
) -> api::ContainerConfig {
    cfg.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .namespace_options = Some(opts);
    cfg
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

/// Waits until `f` holds.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// Runs `petrel ctl ARGS` against the node's socket.
pub fn ctl(node: &Node, args: &[&str]) -> std::process::Output {
    std::process::Command::new(petrel_bin())
        .arg("ctl")
        .arg("--endpoint")
        .arg(format!("unix://{}", node.socket.display()))
        .args(args)
        .output()
        .expect("run petrel ctl")
}

/// Runs `petrel ctl ARGS`, asserts success and returns its stdout.
pub fn ok(node: &Node, args: &[&str]) -> String {
    let o = ctl(node, args);
    assert!(
        o.status.success(),
        "petrel ctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
