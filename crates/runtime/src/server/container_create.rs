//! CreateContainer: overlay rootfs, OCI spec, shim + `runc create`.
//! All or nothing: a failure undoes every step and releases the name.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use petrel_cri::api;
use petrel_nri::adaptation::CreateResult;
use petrel_oci::spec::{self, ContainerSpecInput, NamespaceRef, SandboxContext};
use petrel_oci::user::UserDb;
use petrel_store::Table;

use crate::container::mount_ns::HeldNamespace;
use crate::container::rootfs::{self, WritableLayer};
use crate::container::shim::{self, ShimOptions};
use crate::error::{non_empty, required, Result, RuntimeError};
use crate::records::{ContainerRecord, ContainerState, SandboxRecord, SandboxState};
use crate::sandbox::files::SandboxFiles;
use crate::sandbox::pid_holder;
use crate::server::sandbox_run::namespace_mode;
use crate::service::{Ns, Runtime};
use crate::state::{Container, Sandbox};
use crate::util;

/// A container's spec, NRI's result and when NRI began and ended, if it ran.
type PreparedSpec = (
    oci_spec::runtime::Spec,
    Option<CreateResult>,
    Option<(Instant, Instant)>,
);

/// The container's PID namespace mode (its own setting, else the pod's).
fn container_pid_mode(
    config: &api::ContainerConfig,
    pod: &api::PodSandboxConfig,
) -> (api::NamespaceMode, String) {
    let opts = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    match opts {
        Some(o) => (
            api::NamespaceMode::try_from(o.pid).unwrap_or(api::NamespaceMode::Container),
            o.target_id.clone(),
        ),
        None => (namespace_mode(pod, Ns::Pid), String::new()),
    }
}

fn ns_ref(p: &Option<PathBuf>) -> NamespaceRef {
    match p {
        Some(p) => NamespaceRef::Path(p.clone()),
        None => NamespaceRef::Host,
    }
}

impl Runtime {
    /// CreateContainer.
    pub(crate) async fn create_container(
        self: &Arc<Self>,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse> {
        let _sync = self.nri_block_sync().await;
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        let _pod = sb.op.read().await;
        let sbrec = sb.record();
        if sbrec.state != SandboxState::Ready {
            return Err(RuntimeError::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                sbrec.id
            )));
        }
        let config = required(req.config, "config")?;
        // Before anything is made, and before anything is named from them.
        crate::validate::container(&config, &sbrec.config, &self.host)?;
        let md = required(config.metadata.as_ref(), "config.metadata")?;
        let image_ref = non_empty(
            config
                .image
                .as_ref()
                .map(|i| i.image.as_str())
                .unwrap_or_default(),
            "config.image.image",
        )?;
        let image = self.images.get(image_ref).ok_or_else(|| {
            RuntimeError::invalid(
                "config.image.image",
                format!("image {image_ref:?} not found"),
            )
        })?;
        // Before the layers are mounted: GC spares recently used images.
        self.images.mark_used(&image.id);
        let log_path = if config.log_path.is_empty() || sbrec.config.log_directory.is_empty() {
            None
        } else {
            Some(Path::new(&sbrec.config.log_directory).join(&config.log_path))
        };
        let pod_md = sbrec.config.metadata.clone().unwrap_or_default();
        let name = format!(
            "{}_{}_{}_{}_{}",
            md.name, pod_md.name, pod_md.namespace, pod_md.uid, md.attempt
        );
        let id = util::new_id().map_err(|e| RuntimeError::internal("generate id", e))?;
        self.state.reserve_name(&name, &id)?;

        let mut rec = ContainerRecord {
            id: id.clone(),
            sandbox_id: sbrec.id.clone(),
            name: name.clone(),
            config,
            image_id: image.id.clone(),
            state: ContainerState::Creating,
            created_at: util::now_ns(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            pid: 0,
            init_start_time: 0,
            own_pid_ns: false,
            shim: None,
            bundle: self.layout.bundle(&id),
            layer_dir: self.layout.container_layer(&id),
            log_path,
            cgroup_path: spec::container_cgroup_path(&sbrec.cgroup_parent, &id),
            resources: None,
        };
        rec.resources = rec.config.linux.as_ref().and_then(|l| l.resources.clone());
        // Recorded before anything is made, so that a crash midway is undone
        // at the next start. Without an fsync: everything made below is
        // named by the id alone (layer, bundle, mount, shim, runc, cgroup),
        // so recovery finds and removes it whether or not this intent
        // survived (`recovery::leftovers`); the final record is durable.
        if let Err(e) = self.store.put_unsynced(Table::Containers, &id, &rec) {
            self.state.release_name(&name, &id);
            return Err(e.into());
        }
        let c = Arc::new(Container::new(rec.clone()));
        self.state.insert_container(c.clone());
        sb.add_container(&id);

        let made = self.make_container(&mut rec, &sbrec, &image).await;
        let (pidfd, adjusted) = match made {
            Ok(made) => made,
            Err(e) => {
                if let Err(undo) = self.teardown_container(&rec, false, None).await {
                    tracing::error!(container.id = %id, error = %undo, "rollback of a failed CreateContainer incomplete");
                }
                let _ = self.store.delete(Table::Containers, &id);
                sb.remove_container(&id);
                self.state.remove_container(&id);
                self.state.release_name(&name, &id);
                return Err(e);
            }
        };
        if let Err(e) = self.save_container(&c, rec.clone()) {
            // The container exists in runc but could not be recorded: undo it.
            let _ = self.teardown_container(&rec, false, None).await;
            let _ = self.store.delete(Table::Containers, &id);
            sb.remove_container(&id);
            self.state.remove_container(&id);
            self.state.release_name(&name, &id);
            return Err(e);
        }
        self.watch_exit(c.clone(), pidfd);
        self.publish(&id, api::ContainerEventType::ContainerCreatedEvent, &sb);
        self.nri_created(&c, &sb, adjusted).await;
        Ok(api::CreateContainerResponse { container_id: id })
    }

    async fn make_container(
        self: &Arc<Self>,
        rec: &mut ContainerRecord,
        sbrec: &SandboxRecord,
        image: &petrel_image::Image,
    ) -> Result<(std::os::fd::OwnedFd, Option<CreateResult>)> {
        let t0 = std::time::Instant::now();
        // runc's move of the init into its cgroup is seconds away at most.
        self.migration_warmup.start();
        let layer = WritableLayer::new(&rec.layer_dir);
        layer.create()?;
        petrel_fs::create_private_dir_all(&rec.bundle, petrel_fs::PRIVATE)
            .map_err(|e| RuntimeError::Internal(e.to_string()))?;
        let lower = self
            .images
            .layer_paths(image)
            .map_err(|e| RuntimeError::internal(format!("layers of {}", image.id), e))?;
        let rootfs_dir = rec.bundle.join("rootfs");
        let known_users = self.image_users.get(&image.id);
        // With the image's user databases known, nothing before runc needs
        // the rootfs mounted: when there are NRI plugins to ask, the mount
        // runs on a blocking thread while they are asked.
        let mounting = if known_users.is_some() && self.nri_wants_create() {
            let (lower, layer) = (lower.clone(), layer.clone());
            let (empty, target) = (self.layout.empty_lower(), rootfs_dir.clone());
            Some(tokio::task::spawn_blocking(move || {
                rootfs::mount(&lower, &layer, &empty, &target).map(|()| Instant::now())
            }))
        } else {
            rootfs::mount(&lower, &layer, &self.layout.empty_lower(), &rootfs_dir)?;
            None
        };
        let t_rootfs = t0.elapsed();
        let prepared = self
            .prepare_spec(rec, sbrec, image, &rootfs_dir, known_users)
            .await;
        // Never return while the mount may still be running: a rollback
        // would race it.
        let mounted = match mounting {
            Some(task) => Some(
                task.await
                    .unwrap_or_else(|e| Err(RuntimeError::internal("mount rootfs", e))),
            ),
            None => None,
        };
        let (oci, adjusted, nri_span) = prepared?;
        if let Some(mounted) = mounted {
            let done = mounted?;
            // What NRI added to the create: the part of its span after the
            // mount was done.
            if let Some((start, end)) = nri_span {
                self.nri_observe_create_wait(end.saturating_duration_since(done.max(start)));
            }
        } else if let Some((start, end)) = nri_span {
            self.nri_observe_create_wait(end - start);
        }
        let json = serde_json::to_vec(&oci)
            .map_err(|e| RuntimeError::internal("encode config.json", e))?;
        let cfg_path = rec.bundle.join("config.json");
        std::fs::write(&cfg_path, json)
            .map_err(|e| RuntimeError::internal(format!("write {}", cfg_path.display()), e))?;

        if let Some(log) = &rec.log_path {
            if let Some(dir) = log.parent() {
                // Container output may hold secrets: what we create of the
                // log path is private (kubelet makes the pod's directory).
                petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE).map_err(|e| {
                    RuntimeError::internal(format!("create log directory {}", dir.display()), e)
                })?;
            }
        }
        let t_spec = t0.elapsed();
        let started = shim::start(&ShimOptions {
            binary: self.shim_binary.clone(),
            id: rec.id.clone(),
            bundle: rec.bundle.clone(),
            runc: self.runc.binary().to_path_buf(),
            runc_root: self.runc.root().to_path_buf(),
            log_path: rec.log_path.clone(),
            tty: rec.config.tty,
            stdin: rec.config.stdin,
            stdin_once: rec.config.stdin_once,
        })
        .await?;
        tracing::debug!(
            container.id = %rec.id,
            rootfs_us = t_rootfs.as_micros() as u64,
            spec_us = (t_spec - t_rootfs).as_micros() as u64,
            shim_us = (t0.elapsed() - t_spec).as_micros() as u64,
            "container made"
        );
        rec.pid = started.init_pid;
        rec.init_start_time = util::process_start_time(started.init_pid).unwrap_or(0);
        rec.shim = Some(started.shim);
        rec.state = ContainerState::Created;
        Ok((started.pidfd, adjusted))
    }

    /// Builds the container's OCI spec and lets the NRI plugins adjust it.
    /// The rootfs is read only when `known_users` is `None` (the image's
    /// first container; its databases are then remembered), and must be
    /// mounted then. Returns the spec, NRI's result and when NRI began and
    /// ended, if it ran.
    async fn prepare_spec(
        self: &Arc<Self>,
        rec: &mut ContainerRecord,
        sbrec: &SandboxRecord,
        image: &petrel_image::Image,
        rootfs_dir: &Path,
        known_users: Option<Arc<UserDb>>,
    ) -> Result<PreparedSpec> {
        let users = match known_users {
            Some(users) => users,
            None => {
                let users =
                    Arc::new(UserDb::load(rootfs_dir).map_err(petrel_oci::spec::SpecError::User)?);
                self.image_users.insert(&image.id, users.clone());
                users
            }
        };
        let files = SandboxFiles::new(&sbrec.dir);
        let (pid_mode, target) = container_pid_mode(&rec.config, &sbrec.config);
        let pid = match pid_mode {
            api::NamespaceMode::Node => NamespaceRef::Host,
            api::NamespaceMode::Pod => match &sbrec.pid_holder {
                Some(h) => NamespaceRef::Path(pid_holder::ns_path(h)),
                None => {
                    return Err(RuntimeError::FailedPrecondition(format!(
                        "pod sandbox {} has no shared PID namespace",
                        sbrec.id
                    )))
                }
            },
            api::NamespaceMode::Target => {
                let t = self
                    .state
                    .container(&target)
                    .filter(|t| {
                        t.state() == ContainerState::Running && t.with(|r| r.sandbox_id == sbrec.id)
                    })
                    .ok_or_else(|| {
                        RuntimeError::invalid(
                            "config.linux.security_context.namespace_options.target_id",
                            format!("{target:?} is not a running container of this pod"),
                        )
                    })?;
                NamespaceRef::Path(PathBuf::from(format!("/proc/{}/ns/pid", t.with(|r| r.pid))))
            }
            api::NamespaceMode::Container => NamespaceRef::New,
        };
        rec.own_pid_ns = matches!(pid, NamespaceRef::New);
        let ctx = SandboxContext {
            network: ns_ref(&sbrec.netns),
            ipc: ns_ref(&sbrec.ipcns),
            uts: ns_ref(&sbrec.utsns),
            pid,
            hostname: std::fs::read_to_string(&files.hostname)
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            etc_hostname: Some(files.hostname.clone()),
            etc_hosts: Some(files.hosts.clone()),
            resolv_conf: Some(files.resolv_conf.clone()),
            shm: Some(if sbrec.shm_mounted {
                files.shm.clone()
            } else {
                PathBuf::from("/dev/shm")
            }),
            cgroup_parent: sbrec.cgroup_parent.clone(),
        };
        let image_config = image.config.config().clone();
        let input = ContainerSpecInput {
            id: &rec.id,
            config: &rec.config,
            sandbox_config: &sbrec.config,
            image_config: image_config.as_ref(),
            rootfs: rootfs_dir,
            users: Some(&users),
            sandbox: &ctx,
            host: &self.host,
        };
        let mut oci = spec::build_container_spec(&input)?;
        let nri_start = Instant::now();
        let adjusted = self.nri_adjust(sbrec, rec, &mut oci).await?;
        let nri_span = adjusted.is_some().then(|| (nri_start, Instant::now()));
        Ok((oci, adjusted, nri_span))
    }

    /// Undoes whatever a container has on the host: runc state (killing
    /// its init, which makes the shim exit) unless `runc_deleted` says it is
    /// gone already, the rootfs mount, the bundle and the writable layer.
    /// Best effort; the first error is returned.
    pub(crate) async fn teardown_container(
        &self,
        rec: &ContainerRecord,
        runc_deleted: bool,
        mount_ns: Option<HeldNamespace>,
    ) -> Result<()> {
        let t0 = std::time::Instant::now();
        let runc = async {
            if runc_deleted {
                return Ok(());
            }
            self.runc
                .delete(&rec.id, true)
                .await
                .map_err(RuntimeError::from)
        };
        let (bundle, layer) = (rec.bundle.clone(), rec.layer_dir.clone());
        let (runc, files) = if rec.state == ContainerState::Exited {
            // Its init is dead, so runc's record and the files are
            // independent: `runc delete` (a process of its own) and the
            // unmount and removal of the rootfs run side by side.
            let files = tokio::task::spawn_blocking(move || {
                // The namespace's teardown (its copy of the rootfs mount
                // among the rest) comes before the rootfs is removed.
                drop(mount_ns);
                remove_container_files(&bundle, &layer)
            });
            let (runc, files) = tokio::join!(runc, files);
            let files =
                files.unwrap_or_else(|e| Err(RuntimeError::internal("remove container files", e)));
            (runc, files)
        } else {
            // A live init is killed first: its files go once it is dead.
            let runc = runc.await;
            drop(mount_ns);
            (runc, remove_container_files(&bundle, &layer))
        };
        // runc removes the container's own cgroup; a container that never
        // reached runc may still have left an empty one.
        let _ = self.cgroups.remove(&rec.cgroup_path);
        tracing::debug!(
            container.id = %rec.id,
            teardown_us = t0.elapsed().as_micros() as u64,
            "container torn down"
        );
        runc.and(files)
    }

    /// The sandbox a container belongs to (it always exists while the
    /// container does).
    pub(crate) fn sandbox_of(&self, c: &Container) -> Option<Arc<Sandbox>> {
        self.state.sandbox(&c.with(|r| r.sandbox_id.clone()))
    }
}

/// Unmounts a container's rootfs and removes its bundle and writable layer;
/// every step runs, the first error is returned.
pub(crate) fn remove_container_files(bundle: &Path, layer: &Path) -> Result<()> {
    let unmounted = rootfs::unmount(&bundle.join("rootfs"));
    let bundle_removed = crate::server::sandbox_run::remove_dir(bundle);
    let layer_removed = crate::server::sandbox_run::remove_dir(layer);
    unmounted.and(bundle_removed).and(layer_removed)
}
