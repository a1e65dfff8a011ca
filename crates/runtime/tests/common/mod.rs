//! A runtime in this test process (so a test can call its streaming backend
//! directly), serving CRI on its own socket on tokio threads of its own, in
//! a temporary root with its own cgroup parent. Dropping it removes every
//! pod through CRI, stops the runtime, then sweeps whatever its runc root,
//! mounts and cgroups still hold.
//!
//! Needs the `petrel-shim` binary beside the test binaries' directory
//! (`cargo build -p petrel-shim`) and runc.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, unsafe_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
use petrel_runtime::config::PodNetworkMode;
use petrel_runtime::{Runtime, RuntimeConfig, RuntimeStreams};
use tonic::transport::Channel;

pub const BUSYBOX: &str = "docker.io/petrel/busybox:latest";

/// The workspace root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The test image archives: `PETREL_TEST_IMAGES`, `build/images` (`make
/// image`), or built here on first use.
pub fn images_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PETREL_TEST_IMAGES") {
        let d = PathBuf::from(d);
        if d.join("busybox-oci.tar").is_file() {
            return d;
        }
    }
    let ws = workspace();
    if ws.join("build/images/busybox-oci.tar").is_file() {
        return ws.join("build/images");
    }
    let out = ws.join("target/petrel-test-images");
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

/// The shim binary the runtime will use, checked to be newer than the
/// shim's sources (a stale shim would lack what these tests exercise).
fn shim_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let shim = dir.join("petrel-shim");
    let built = std::fs::metadata(&shim)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} missing: cargo build -p petrel-shim", shim.display()));
    let src = workspace().join("crates/shim/src");
    let newest: SystemTime = std::fs::read_dir(&src)
        .expect("shim sources")
        .flatten()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
        .expect("shim sources");
    assert!(
        built >= newest,
        "{} is older than its sources: cargo build -p petrel-shim",
        shim.display()
    );
    shim
}

fn random_suffix() -> String {
    let mut b = [0u8; 6];
    getrandom::getrandom(&mut b).expect("random");
    hex::encode(b)
}

/// A runtime under test.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub config: RuntimeConfig,
    pub cgroup_parent: String,
    served: Option<Served>,
}

/// A running instance: its tokio threads, the runtime, the way to stop it.
struct Served {
    threads: tokio::runtime::Runtime,
    rt: Arc<Runtime>,
    stop: tokio::sync::oneshot::Sender<()>,
    done: tokio::task::JoinHandle<()>,
}

impl Daemon {
    /// Starts a runtime in a fresh temporary root.
    pub fn start() -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("petrel-st.")
            .tempdir()
            .expect("tempdir");
        let cgroup_parent = format!("/petrel-test-{}", random_suffix());
        let config = RuntimeConfig {
            root: dir.path().join("root"),
            state: dir.path().join("state"),
            shim_binary: Some(shim_binary()),
            default_cgroup_parent: cgroup_parent.clone(),
            // Loopback only: the pod's own network namespace, no CNI.
            pod_network: PodNetworkMode::Loopback,
            // NRI with this test's own socket and (empty) plugin directories.
            nri: petrel_runtime::nri::NriConfig {
                socket_path: dir.path().join("nri.sock"),
                plugin_path: dir.path().join("nri-plugins"),
                plugin_config_path: dir.path().join("nri-conf"),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut d = Daemon {
            dir,
            config,
            cgroup_parent,
            served: None,
        };
        d.serve();
        d
    }

    fn serve(&mut self) {
        let threads = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("daemon")
            .enable_all()
            .build()
            .expect("daemon runtime");
        let rt = {
            let _g = threads.enter();
            Runtime::open(self.config.clone()).expect("open runtime")
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let done = threads.spawn({
            let rt = rt.clone();
            async move {
                let shutdown = async move {
                    let _ = stopped.await;
                };
                if let Err(e) = petrel_runtime::serve_runtime(rt, shutdown).await {
                    eprintln!("runtime failed: {e}");
                }
            }
        });
        let socket = self.config.socket_path();
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "runtime did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.served = Some(Served {
            threads,
            rt,
            stop,
            done,
        });
    }

    /// The streaming backend of the running instance.
    pub fn streams(&self) -> RuntimeStreams {
        RuntimeStreams::new(&self.served.as_ref().expect("running").rt)
    }

    /// Stops the runtime (containers keep running under their shims) and
    /// drops everything it held, as a process exit would.
    pub fn stop(&mut self) {
        let Some(s) = self.served.take() else {
            return;
        };
        let _ = s.stop.send(());
        let _ = s
            .threads
            .block_on(async { tokio::time::timeout(Duration::from_secs(15), s.done).await });
        s.threads.shutdown_timeout(Duration::from_secs(5));
        assert_eq!(
            Arc::strong_count(&s.rt),
            1,
            "something still holds the stopped runtime"
        );
    }

    /// Stops the runtime and starts it again on the same root and state.
    pub fn restart(&mut self) {
        self.stop();
        self.serve();
    }

    /// CRI clients (call from a tokio runtime of the test's own).
    pub async fn clients(&self) -> Clients {
        let ch = petrel_cri::connect(&format!("unix://{}", self.config.socket_path().display()))
            .await
            .expect("connect to runtime");
        Clients {
            rt: RuntimeServiceClient::new(ch.clone()),
            admin: AdminClient::new(ch),
        }
    }

    /// A pod config unique to this test: own network namespace, own cgroup.
    pub fn pod_config(&self, name: &str) -> api::PodSandboxConfig {
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.to_string(),
                namespace: "streaming".to_string(),
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
            ..Default::default()
        }
    }

    fn cleanup(&mut self) {
        if self.served.is_none() && self.config.root.join("meta.redb").exists() {
            // A test that stopped the runtime: start it again to clean up.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
        }
        if self.served.is_some() {
            let socket = self.config.socket_path();
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
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.stop()));
        }
        // Sweep what is left in this test's own places.
        let runc_root = self.config.state.join("runc");
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
        let prefix = self.dir.path().display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| m.starts_with(&prefix))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            if let Ok(c) = std::ffi::CString::new(m) {
                // SAFETY: umount2 with a valid C string.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        remove_cgroup_tree(&self.cgroup_parent);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Removes a test's cgroup tree in every hierarchy (deepest first).
fn remove_cgroup_tree(path: &str) {
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

/// CRI clients on one connection.
#[derive(Clone)]
pub struct Clients {
    pub rt: RuntimeServiceClient<Channel>,
    pub admin: AdminClient<Channel>,
}

impl Clients {
    /// Imports the busybox test image.
    pub async fn import_busybox(&mut self) {
        let path = images_dir().join("busybox-oci.tar");
        self.admin
            .import_image(petrel_cri::admin::ImportImageRequest {
                path: path.display().to_string(),
                tags: vec![],
            })
            .await
            .expect("import busybox");
    }

    /// RunPodSandbox, returning the id.
    pub async fn run_pod(&mut self, config: &api::PodSandboxConfig) -> String {
        self.rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config.clone()),
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
    ) -> String {
        self.rt
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.to_string(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .expect("CreateContainer")
            .into_inner()
            .container_id
    }

    /// CreateContainer + StartContainer.
    pub async fn run(
        &mut self,
        pod: &str,
        pod_config: &api::PodSandboxConfig,
        config: api::ContainerConfig,
    ) -> String {
        let id = self.create(pod, pod_config, config).await;
        self.rt
            .start_container(api::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .expect("StartContainer");
        id
    }

    /// The container's CRI state.
    pub async fn state(&mut self, id: &str) -> api::ContainerState {
        let s = self
            .rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .status
            .expect("status");
        api::ContainerState::try_from(s.state).expect("state")
    }

    /// Waits until the container reaches `state`.
    pub async fn wait_state(&mut self, id: &str, state: api::ContainerState, within: Duration) {
        let start = Instant::now();
        loop {
            let s = self.state(id).await;
            if s == state {
                return;
            }
            assert!(
                start.elapsed() < within,
                "container {id} is {s:?}, not {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

/// A tokio runtime for the test's own side (clients, backend calls).
pub fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("client runtime")
}
