//! The runtime under test: the test kit's `petrel runtime`
//! ([`PetrelRuntime`]) with the bench's own cgroup parent and its volatile
//! state on a tmpfs, as `/run` is on a standard host, and CRI clients on
//! its socket.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
use petrel_testkit::petrel::{CniDirs, Mode, PetrelConfig, PetrelRuntime};
use tonic::transport::Channel;

/// The image the bench runs (built by `make image`).
pub const BUSYBOX: &str = "docker.io/petrel/busybox:latest";

/// A `petrel runtime` started by the bench: the kit's runtime (its
/// directory under `PETREL_KIT_TMPDIR`, which scripts/bench.sh points into
/// the bench's work directory), read through [`Deref`] (`root`, `state`,
/// `socket`, `endpoint()`, `log_path()`...). On `shutdown()`
/// ([`PetrelRuntime::shutdown`]) or drop its pods are removed through CRI,
/// the process stopped and its runc root, mounts and cgroup parent swept.
pub struct Node(PetrelRuntime);

impl Node {
    /// Starts `petrel runtime` with pods under `cgroup_parent` (loopback
    /// only: the bench's pods measure the runtime, not a CNI network) and
    /// waits until its socket accepts. `shim`: the shim binary, None for
    /// the one beside `petrel`.
    pub fn start(petrel: &Path, shim: Option<&Path>, cgroup_parent: &str) -> Result<Node> {
        Self::start_on(petrel, shim, cgroup_parent, None)
    }

    /// Like [`Node::start`], with pods on the CNI network `cni`.
    pub fn start_on(
        petrel: &Path,
        shim: Option<&Path>,
        cgroup_parent: &str,
        cni: Option<CniDirs>,
    ) -> Result<Node> {
        let config = PetrelConfig {
            dir_prefix: "pbr.",
            runc: None,
            shim: shim.map(Path::to_path_buf),
            cgroup_parent: cgroup_parent.to_string(),
            cni,
            mirrors: None,
            extra_cri: String::new(),
            extra_nri: String::new(),
            log_level: "info",
        };
        let mut rt = PetrelRuntime::prepare(petrel, &config)?;
        crate::sweep::volatile_dir(&rt.state)?;
        let cmd = rt.command();
        rt.spawn(cmd, &Mode::Runtime)?;
        Ok(Node(rt))
    }

    /// The runtime's pid (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.0.pid().unwrap_or(0)
    }

    /// Connects CRI and admin clients on one connection.
    pub async fn connect(&self) -> Result<Clients> {
        Clients::connect(&self.endpoint()).await
    }
}

impl Deref for Node {
    type Target = PetrelRuntime;

    fn deref(&self) -> &PetrelRuntime {
        &self.0
    }
}

impl DerefMut for Node {
    fn deref_mut(&mut self) -> &mut PetrelRuntime {
        &mut self.0
    }
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
