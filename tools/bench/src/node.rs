//! The runtime under test: a `petrel runtime` process in the bench's own
//! directory, and CRI clients on its socket.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
use rustix::process::{Pid, Signal};
use tonic::transport::Channel;

/// The image the bench runs (built by `make image`).
pub const BUSYBOX: &str = "docker.io/petrel/busybox:latest";

/// A `petrel runtime` started by the bench.
pub struct Node {
    /// `<work>/root`: persistent data (on the same disk as /var/lib).
    pub root: PathBuf,
    /// `<work>/state`: volatile state, on a tmpfs as `/run` is on a standard
    /// host; the socket is `<state>/petrel.sock`.
    pub state: PathBuf,
    /// The runtime's log file.
    pub log: PathBuf,
    child: Option<Child>,
}

impl Node {
    /// Starts `petrel runtime` (pods get loopback only) and waits until
    /// its socket accepts.
    pub fn start(
        petrel: &Path,
        shim: Option<&Path>,
        work: &Path,
        cgroup_parent: &str,
    ) -> Result<Node> {
        // The bench's pods measure the runtime, not a CNI network.
        Self::start_with(
            petrel,
            shim,
            work,
            cgroup_parent,
            &["--pod-network", "loopback"],
        )
    }

    /// Starts `petrel runtime` with `extra` flags (e.g. a CNI network) and
    /// waits until its socket accepts.
    pub fn start_with(
        petrel: &Path,
        shim: Option<&Path>,
        work: &Path,
        cgroup_parent: &str,
        extra: &[&str],
    ) -> Result<Node> {
        let root = work.join("root");
        let state = work.join("state");
        crate::sweep::volatile_dir(&state)?;
        let log = work.join("runtime.log");
        let log_file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("open {}", log.display()))?;
        let mut cmd = Command::new(petrel);
        cmd.arg("runtime")
            .arg("--root")
            .arg(&root)
            .arg("--state")
            .arg(&state)
            .arg("--default-cgroup-parent")
            .arg(cgroup_parent)
            .arg("--nri-socket")
            .arg(work.join("nri.sock"))
            .arg("--nri-plugin-path")
            .arg(work.join("nri-plugins"))
            .arg("--nri-plugin-config-path")
            .arg(work.join("nri-conf"))
            .args(extra);
        if let Some(shim) = shim {
            cmd.arg("--shim-binary").arg(shim);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("start {}", petrel.display()))?;
        std::fs::write(work.join("runtime.pid"), child.id().to_string())
            .with_context(|| format!("write {}", work.join("runtime.pid").display()))?;
        let mut node = Node {
            root,
            state,
            log,
            child: Some(child),
        };
        node.wait_ready()?;
        Ok(node)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let socket = self.socket();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut() {
                if let Some(st) = c.try_wait().context("wait for the runtime")? {
                    bail!("runtime exited at start ({st}):\n{}", self.log_tail());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("runtime did not start within 30 s:\n{}", self.log_tail())
    }

    /// The CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.state.join("petrel.sock")
    }

    /// The runtime's pid (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// The last lines of the runtime's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Connects CRI and admin clients on one connection.
    pub async fn connect(&self) -> Result<Clients> {
        let endpoint = format!("unix://{}", self.socket().display());
        let ch = petrel_cri::connect(&endpoint)
            .await
            .with_context(|| format!("connect to {endpoint}"))?;
        Ok(Clients {
            rt: RuntimeServiceClient::new(ch.clone()),
            img: ImageServiceClient::new(ch.clone()),
            admin: AdminClient::new(ch),
        })
    }

    /// Removes every pod through the runtime (from a thread of its own, so
    /// it works from inside or outside an async context), then stops the
    /// runtime with SIGTERM (SIGKILL after 15 s). Containers whose pods
    /// could not be removed keep running under their shims; the caller
    /// sweeps the runc root afterwards.
    pub fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            let socket = self.socket();
            let removed = std::thread::spawn(move || remove_all_pods(&socket)).join();
            if !matches!(removed, Ok(Ok(()))) {
                eprintln!("petrel-bench: removing pods through the runtime failed: {removed:?}");
            }
            if let Some(pid) = Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process(pid, Signal::TERM);
            }
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(15) {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Our own child, by its handle: a no-op if it already exited.
        let _ = child.kill();
        let _ = child.wait();
        // The state tmpfs goes with the runtime, unless shims still use it
        // (then the work directory's sweep takes it at the end).
        if crate::procfs::shims_of(&self.state).is_ok_and(|s| s.is_empty()) {
            petrel_testkit::process::unmount_under(&self.state);
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn remove_all_pods(socket: &Path) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("build a tokio runtime for clean-up")?;
    rt.block_on(async {
        let ch = petrel_cri::connect(&format!("unix://{}", socket.display())).await?;
        let mut c = RuntimeServiceClient::new(ch);
        let pods = c
            .list_pod_sandbox(api::ListPodSandboxRequest::default())
            .await?
            .into_inner()
            .items;
        for p in pods {
            if let Err(e) = c
                .remove_pod_sandbox(api::RemovePodSandboxRequest {
                    pod_sandbox_id: p.id.clone(),
                })
                .await
            {
                eprintln!("petrel-bench: RemovePodSandbox {}: {e}", p.id);
            }
        }
        Ok(())
    })
}

/// CRI clients on one connection.
#[derive(Clone)]
pub struct Clients {
    /// RuntimeService.
    pub rt: RuntimeServiceClient<Channel>,
    /// ImageService.
    pub img: ImageServiceClient<Channel>,
    /// Petrel's admin API.
    pub admin: AdminClient<Channel>,
}

impl Clients {
    /// CRI clients on one new connection to `endpoint` (`unix:///path`);
    /// the admin client only works with Petrel's runtime.
    pub async fn connect(endpoint: &str) -> Result<Clients> {
        let ch = petrel_cri::connect(endpoint)
            .await
            .with_context(|| format!("connect to {endpoint}"))?;
        Ok(Clients {
            rt: RuntimeServiceClient::new(ch.clone()),
            img: ImageServiceClient::new(ch.clone()),
            admin: AdminClient::new(ch),
        })
    }

    /// Imports an image archive through the admin API.
    pub async fn import(&mut self, archive: &Path) -> Result<()> {
        let path = std::fs::canonicalize(archive)
            .with_context(|| format!("resolve {}", archive.display()))?;
        self.admin
            .import_image(petrel_cri::admin::ImportImageRequest {
                path: path.display().to_string(),
                tags: vec![],
            })
            .await
            .with_context(|| format!("import {}", path.display()))?;
        let st = self
            .img
            .image_status(api::ImageStatusRequest {
                image: Some(api::ImageSpec {
                    image: BUSYBOX.to_string(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .context("ImageStatus")?
            .into_inner();
        if st.image.is_none() {
            bail!("{} did not provide {BUSYBOX}", path.display());
        }
        Ok(())
    }

    /// RunPodSandbox.
    pub async fn run_pod(&mut self, config: &api::PodSandboxConfig) -> Result<String> {
        let name = config.metadata.as_ref().map(|m| m.name.clone());
        Ok(self
            .rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .with_context(|| format!("RunPodSandbox {name:?}"))?
            .into_inner()
            .pod_sandbox_id)
    }

    /// CreateContainer.
    pub async fn create(
        &mut self,
        pod: &str,
        pod_config: &api::PodSandboxConfig,
        config: api::ContainerConfig,
    ) -> Result<String> {
        Ok(self
            .rt
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.to_string(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            })
            .await
            .with_context(|| format!("CreateContainer in pod {pod}"))?
            .into_inner()
            .container_id)
    }

    /// StartContainer.
    pub async fn start(&mut self, id: &str) -> Result<()> {
        self.rt
            .start_container(api::StartContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .with_context(|| format!("StartContainer {id}"))?;
        Ok(())
    }

    /// StopContainer.
    pub async fn stop(&mut self, id: &str, timeout: i64) -> Result<()> {
        self.rt
            .stop_container(api::StopContainerRequest {
                container_id: id.to_string(),
                timeout,
            })
            .await
            .with_context(|| format!("StopContainer {id}"))?;
        Ok(())
    }

    /// RemoveContainer.
    pub async fn remove(&mut self, id: &str) -> Result<()> {
        self.rt
            .remove_container(api::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
            .with_context(|| format!("RemoveContainer {id}"))?;
        Ok(())
    }

    /// StopPodSandbox.
    pub async fn stop_pod(&mut self, id: &str) -> Result<()> {
        self.rt
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .with_context(|| format!("StopPodSandbox {id}"))?;
        Ok(())
    }

    /// RemovePodSandbox.
    pub async fn remove_pod(&mut self, id: &str) -> Result<()> {
        self.rt
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .with_context(|| format!("RemovePodSandbox {id}"))?;
        Ok(())
    }

    /// The pid of a container's init and its bundle directory, from the
    /// verbose ContainerStatus.
    pub async fn init_pid(&mut self, id: &str) -> Result<(u32, PathBuf)> {
        let r = self
            .rt
            .container_status(api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            })
            .await
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner();
        let info = r
            .info
            .get("info")
            .with_context(|| format!("ContainerStatus {id}: no verbose info"))?;
        let v: serde_json::Value = serde_json::from_str(info)
            .with_context(|| format!("ContainerStatus {id}: verbose info is not JSON"))?;
        let bundle = PathBuf::from(
            v.get("bundle")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default(),
        );
        match v.get("pid").and_then(serde_json::Value::as_u64) {
            Some(pid) if pid > 0 => Ok((
                u32::try_from(pid).with_context(|| format!("container {id}: pid {pid}"))?,
                bundle,
            )),
            _ => bail!("container {id}: no pid in the verbose status"),
        }
    }
}

/// The config of bench pod `name`, in cgroup `<cgroup_parent>/<name>` and
/// with its log directory in the bench's work directory.
pub fn pod_config(name: &str, cgroup_parent: &str, work: &Path) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_string(),
            namespace: "bench".to_string(),
            uid: format!("uid-{name}"),
            attempt: 0,
        }),
        hostname: name.to_string(),
        log_directory: work.join("logs").join(name).display().to_string(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: format!("{cgroup_parent}/{name}"),
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

/// A busybox container running `sleep 3600`.
pub fn sleep_container(name: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: BUSYBOX.to_string(),
            ..Default::default()
        }),
        command: vec!["sleep".into(), "3600".into()],
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}
