//! A container's creation: its intent recorded, then its writable layer,
//! bundle, rootfs, OCI spec (adjusted by NRI) and log directory, then
//! `Created` committed. All or nothing: a failure undoes every step
//! (`container::teardown`), deletes the record and frees the name.
//!
//! As containerd's, the create only records the container: its shim and
//! `runc create` come with StartContainer (`container::start`), so a
//! created container has no process, no pid and no cgroup yet. The one
//! exception is a restore from a checkpoint (`rec.restored_from`): its
//! shim runs `runc restore`, whose process runs from the create on, and
//! is watched from then.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use petrel_cri::api;
use petrel_nri::adaptation::CreateResult;
use petrel_oci::spec::{
    self, ContainerSpecInput, ImageVolumeSources, NamespaceRef, SandboxContext,
};
use petrel_oci::user::UserDb;
use petrel_store::Table;

use crate::container::idmap::LayerIdmap;
use crate::container::rootfs::WritableLayer;
use crate::container::shim::ShimOptions;
use crate::error::{Result, RuntimeError};
use crate::parts::ShimWatch;
use crate::records::{ContainerRecord, ContainerState, SandboxRecord};
use crate::sandbox::files::SandboxFiles;
use crate::sandbox::{namespace_mode, pid_holder, Ns};
use crate::service::Runtime;
use crate::state::{Container, Sandbox};

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

/// The identity of a process as the CRI reports it (`ContainerStatus.user`):
/// what runc gives the process, NRI's adjustments included.
fn process_user(u: &oci_spec::runtime::User) -> api::LinuxContainerUser {
    api::LinuxContainerUser {
        uid: i64::from(u.uid()),
        gid: i64::from(u.gid()),
        supplemental_groups: u
            .additional_gids()
            .iter()
            .flatten()
            .map(|g| i64::from(*g))
            .collect(),
    }
}

fn ns_ref(p: &Option<PathBuf>) -> NamespaceRef {
    match p {
        Some(p) => NamespaceRef::Path(p.clone()),
        None => NamespaceRef::Host,
    }
}

impl Runtime {
    /// Creates the container `rec` describes (in state `Creating`, its
    /// name not yet reserved) in the pod `sb`, whose operation lock the
    /// caller holds shared, from `image`. Returns once it is `Created` and
    /// watched, or undone.
    pub(crate) async fn container_create(
        self: &Arc<Self>,
        sb: &Arc<Sandbox>,
        sbrec: &SandboxRecord,
        mut rec: ContainerRecord,
        image: &petrel_image::Image,
    ) -> Result<Arc<Container>> {
        let (id, name) = (rec.id.clone(), rec.name.clone());
        self.state.reserve_name(&name, &id)?;
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

        let made = match self.make_container(&mut rec, sbrec, image).await {
            // The container exists in runc but may not be recorded: undone then.
            Ok(made) => self.save_container(&c, rec.clone()).map(|()| made),
            Err(e) => Err(e),
        };
        let (restored, adjusted) = match made {
            Ok(made) => made,
            Err(e) => {
                let cleanup = self.undo_create(&rec, sb).await;
                if !cleanup.is_empty() {
                    tracing::error!(container.id = %id, errors = cleanup.len(), "rollback of a failed CreateContainer incomplete");
                }
                return Err(e.with_cleanup(cleanup));
            }
        };
        if let Some(watch) = restored {
            self.watch_exit(c.clone(), watch);
        }
        self.publish(&id, api::ContainerEventType::ContainerCreatedEvent, sb);
        self.nri_created(&c, sb, adjusted).await;
        Ok(c)
    }

    /// Undoes a create that failed after its intent was recorded: what it
    /// made on the host, its record, its place in memory and its name.
    /// Every step runs; the errors of those that failed are returned.
    async fn undo_create(&self, rec: &ContainerRecord, sb: &Sandbox) -> Vec<RuntimeError> {
        let mut errors = Vec::new();
        // Only a restore gave the container to runc during the create.
        let runc_untouched = rec.restored_from.is_none();
        if let Err(e) = self.teardown_container(rec, runc_untouched, None).await {
            errors.extend(e.into_list());
        }
        if let Err(e) = self.store.delete(Table::Containers, &rec.id) {
            errors.push(e.into());
        }
        sb.remove_container(&rec.id);
        self.state.remove_container(&rec.id);
        self.state.release_name(&rec.name, &rec.id);
        errors
    }

    /// Makes the container's files (layer, bundle, rootfs, image volumes,
    /// config.json, log directory) and, for a restore only, its shim:
    /// returns the watch on that shim and NRI's result.
    async fn make_container(
        self: &Arc<Self>,
        rec: &mut ContainerRecord,
        sbrec: &SandboxRecord,
        image: &petrel_image::Image,
    ) -> Result<(Option<ShimWatch>, Option<CreateResult>)> {
        let t0 = std::time::Instant::now();
        let userns = crate::sandbox::user_namespace(sbrec)?;
        let layer = WritableLayer::new(&rec.layer_dir);
        layer.create()?;
        // A restore's changes go into the upper directory before it is
        // mounted; its CRIU images beside it, for the shim's `runc restore`.
        let restore = match &rec.restored_from {
            Some(from) => Some(self.unpack_restore(from, &rec.layer_dir).await?),
            None => None,
        };
        petrel_fs::create_private_dir_all(&rec.bundle, petrel_fs::PRIVATE)
            .map_err(|e| RuntimeError::dir("create bundle", e))?;
        if userns.is_some() {
            crate::container::idmap::make_reachable(&rec.bundle, &self.layout.state)?;
        }
        let idmap = userns.as_ref().map(|u| LayerIdmap {
            userns: u.path.clone(),
            host_root: u.mappings.host_root(),
        });
        let lower = self.images.layer_paths(image)?;
        let rootfs_dir = rec.bundle.join("rootfs");
        let known_users = self.image_users.get(&image.id);
        // With the image's user databases known, nothing before runc needs
        // the rootfs mounted: when there are NRI plugins to ask, the mount
        // runs on a blocking thread while they are asked.
        let mounting = if known_users.is_some() && self.nri_wants_create() {
            let (lower, layer) = (lower.clone(), layer.clone());
            let (empty, target) = (self.layout.empty_lower(), rootfs_dir.clone());
            let mounter = self.rootfs.clone();
            let idmap = idmap.clone();
            Some(tokio::task::spawn_blocking(move || {
                mounter
                    .mount(&lower, &layer, &empty, &target, idmap.as_ref())
                    .map(|()| Instant::now())
            }))
        } else {
            self.rootfs.mount(
                &lower,
                &layer,
                &self.layout.empty_lower(),
                &rootfs_dir,
                idmap.as_ref(),
            )?;
            None
        };
        // Not returned early: a mount of the rootfs may still be running.
        let volumes = self.mount_image_volumes(rec);
        let t_rootfs = t0.elapsed();
        let prepared = match volumes {
            Ok(sources) => {
                self.prepare_spec(rec, sbrec, image, &rootfs_dir, known_users, &sources)
                    .await
            }
            Err(e) => Err(e),
        };
        // Never return while the mount may still be running: a rollback
        // would race it.
        let mounted = match mounting {
            Some(task) => Some(
                task.await
                    .unwrap_or_else(|e| Err(RuntimeError::task("mount rootfs", e))),
            ),
            None => None,
        };
        let (oci, adjusted, nri_span) = prepared?;
        rec.user = oci.process().as_ref().map(|p| process_user(p.user()));
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
        let mappings = userns.as_ref().map(|u| &u.mappings);
        let json = petrel_oci::spec::config_json(&oci, mappings).map_err(|source| {
            RuntimeError::Encode {
                what: "config.json",
                source,
            }
        })?;
        let cfg_path = rec.bundle.join("config.json");
        // Private: the bundle of a user-namespaced pod's container is
        // searchable by others (`idmap::make_reachable`), and the spec may
        // hold secrets in its environment.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&cfg_path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &json))
            .map_err(|e| RuntimeError::io("write", &cfg_path, e))?;

        if let Some(log) = &rec.log_path {
            if let Some(dir) = log.parent() {
                // Container output may hold secrets: what we create of the
                // log path is private (kubelet makes the pod's directory).
                petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE)
                    .map_err(|e| RuntimeError::dir("create log directory", e))?;
            }
        }
        rec.state = ContainerState::Created;
        let Some(restore) = restore else {
            tracing::debug!(
                container.id = %rec.id,
                rootfs_us = t_rootfs.as_micros() as u64,
                spec_us = (t0.elapsed() - t_rootfs).as_micros() as u64,
                "container made"
            );
            return Ok((None, adjusted));
        };
        // A restore's process runs from here on: its shim now.
        self.cgroups.warm_up_migration();
        let started = self
            .shims
            .start(&self.shim_options(rec, Some(restore.clone())))
            .await?;
        // Restored: CRIU's images are no longer needed.
        let images = restore.images;
        tokio::task::spawn_blocking(move || {
            if let Err(e) = std::fs::remove_dir_all(&images) {
                tracing::warn!(dir = %images.display(), error = %e, "restored checkpoint images not removed");
            }
        });
        rec.pid = started.init.pid;
        rec.init_start_time = started.init.start_time;
        rec.shim = Some(started.shim);
        Ok((Some(started.watch), adjusted))
    }

    /// What the container's shim is started with.
    pub(crate) fn shim_options(
        &self,
        rec: &ContainerRecord,
        restore: Option<crate::container::shim::ShimRestore>,
    ) -> ShimOptions {
        ShimOptions {
            id: rec.id.clone(),
            bundle: rec.bundle.clone(),
            runc: self.oci.binary().to_path_buf(),
            runc_root: self.oci.root().to_path_buf(),
            systemd_cgroup: self.config.cgroup_driver
                == petrel_oci::cgroups::systemd::CgroupDriver::Systemd,
            log_path: rec.log_path.clone(),
            tty: rec.config.tty,
            stdin: rec.config.stdin,
            stdin_once: rec.config.stdin_once,
            restore,
        }
    }

    /// Mounts the container's image volumes read-only under its bundle
    /// (each image's layers, as its rootfs has them but without a writable
    /// layer) and returns where, by mount index. What was mounted before a
    /// failure is unmounted by the create's rollback
    /// (`teardown::remove_container_files`).
    pub(crate) fn mount_image_volumes(&self, rec: &ContainerRecord) -> Result<ImageVolumeSources> {
        let mut sources = ImageVolumeSources::new();
        for v in &rec.image_volumes {
            let image = self.images.get(&v.image_id).ok_or_else(|| {
                RuntimeError::invalid(
                    format!("config.mounts[{}].image.image", v.mount),
                    format!("image {} not found: removed meanwhile", v.image_id),
                )
            })?;
            let lower = self.images.layer_paths(&image)?;
            let dir = v.dir(&rec.bundle);
            self.rootfs
                .mount_read_only(&lower, &self.layout.empty_lower(), &dir)?;
            let source = if v.sub_path.is_empty() {
                dir
            } else {
                crate::container::rootfs::resolve_in_image(&dir, &v.sub_path).map_err(
                    |e| match e.kind() {
                        std::io::ErrorKind::NotFound => RuntimeError::invalid(
                            format!("config.mounts[{}].image_sub_path", v.mount),
                            format!("{:?} does not exist in image {}", v.sub_path, v.image_id),
                        ),
                        _ => {
                            RuntimeError::io("resolve image_sub_path in", dir.join(&v.sub_path), e)
                        }
                    },
                )?
            };
            sources.insert(v.mount, source);
        }
        Ok(sources)
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
        image_volumes: &ImageVolumeSources,
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
            cgroup_driver: self.config.cgroup_driver,
            user: crate::sandbox::user_namespace(sbrec)?,
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
            image_volumes,
        };
        let mut oci = spec::build_container_spec(&input)?;
        let nri_start = Instant::now();
        let adjusted = self.nri_adjust(sbrec, rec, &mut oci).await?;
        let nri_span = adjusted.is_some().then(|| (nri_start, Instant::now()));
        Ok((oci, adjusted, nri_span))
    }
}

#[cfg(test)]
mod tests {
    use petrel_cri::api;
    use petrel_store::Table;

    use crate::error::RuntimeError;
    use crate::parts::fake::{container_config, pod_config, Call, Fault, TestRuntime, IMAGE};
    use crate::records::{ContainerRecord, ContainerState};

    /// Nothing of a failed create is left: no record, nothing in memory, no
    /// OCI container, shim, mount, container cgroup, bundle or writable
    /// layer; and its name is free again.
    async fn assert_nothing_left(t: &TestRuntime, pod: &str) {
        let sb = t.rt.sandbox(pod).expect("pod");
        assert!(sb.container_ids().is_empty(), "{:?}", sb.container_ids());
        assert!(t.rt.state.containers().is_empty());
        let stored =
            t.rt.store
                .list::<ContainerRecord>(Table::Containers)
                .expect("list");
        assert!(stored.is_empty(), "records left: {}", stored.len());
        assert!(t.host.containers().is_empty(), "{:?}", t.host.containers());
        assert!(t.host.live_shims().is_empty(), "{:?}", t.host.live_shims());
        assert!(t.host.mounts().is_empty(), "{:?}", t.host.mounts());
        let pod_cgroup = sb.with(|r| r.cgroup_parent.clone());
        let cgroups = t.host.cgroups();
        assert!(
            cgroups.iter().all(|cg| *cg == pod_cgroup),
            "cgroups left: {cgroups:?}"
        );
        for dir in [
            t.rt.layout.root.join("containers"),
            t.rt.layout.state.join("containers"),
        ] {
            let left: Vec<_> = std::fs::read_dir(&dir)
                .expect("read dir")
                .flatten()
                .map(|e| e.path())
                .collect();
            assert!(left.is_empty(), "left in {}: {left:?}", dir.display());
        }
        let again = t.create(pod, "c").await;
        assert!(again.is_ok(), "the name is still taken: {again:?}");
    }

    #[tokio::test]
    async fn create_should_keep_the_process_user_for_container_status() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let mut config = container_config("c");
        config.linux = Some(api::LinuxContainerConfig {
            security_context: Some(api::LinuxContainerSecurityContext {
                run_as_user: Some(api::Int64Value { value: 1000 }),
                run_as_group: Some(api::Int64Value { value: 3000 }),
                supplemental_groups: vec![4000, 3000],
                ..Default::default()
            }),
            ..Default::default()
        });
        let sandbox_config = t.rt.sandbox(&pod).expect("pod").with(|r| r.config.clone());
        let id =
            t.rt.create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            })
            .await
            .expect("create")
            .container_id;
        let want = api::LinuxContainerUser {
            uid: 1000,
            gid: 3000,
            supplemental_groups: vec![3000, 4000],
        };
        let status =
            t.rt.container_status_rpc(api::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await
            .expect("status")
            .status
            .expect("status");
        assert_eq!(status.user.and_then(|u| u.linux), Some(want.clone()));
        // Kept across restarts: it is in the durable record.
        assert_eq!(t.stored(&id).and_then(|r| r.user), Some(want));
    }

    #[tokio::test]
    async fn create_should_leave_nothing_when_the_intent_cannot_be_recorded() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        t.rt.store.fail_writes(0, 1);
        let err = t.create(&pod, "c").await.expect_err("create must fail");
        assert!(err.to_string().contains("injected"), "{err}");
        assert!(!t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::ShimStart(_))));
        assert_nothing_left(&t, &pod).await;
    }

    #[tokio::test]
    async fn create_should_leave_nothing_when_the_rootfs_cannot_be_mounted() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        t.host.fail(Fault::Mount, 1);
        let err = t.create(&pod, "c").await.expect_err("create must fail");
        assert!(err.to_string().contains("mount overlay"), "{err}");
        assert_nothing_left(&t, &pod).await;
    }

    #[tokio::test]
    async fn create_should_leave_nothing_when_the_spec_cannot_be_built() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let mut config = container_config("c");
        config.linux = Some(api::LinuxContainerConfig {
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    pid: api::NamespaceMode::Target as i32,
                    target_id: "nothing-runs-here".to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let err =
            t.rt.create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(config),
                sandbox_config: None,
            })
            .await
            .expect_err("create must fail");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        // The spec is built with the rootfs mounted: it was undone.
        assert!(t.host.calls().iter().any(|c| matches!(c, Call::Unmount(_))));
        assert_nothing_left(&t, &pod).await;
    }

    #[tokio::test]
    async fn create_should_leave_nothing_when_the_log_directory_cannot_be_made() {
        let t = TestRuntime::new();
        let blocker = t.dir.path().join("a-file");
        std::fs::write(&blocker, "").expect("write");
        let mut pod_cfg = pod_config("p");
        pod_cfg.log_directory = blocker.join("logs").display().to_string();
        let pod =
            t.rt.run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(pod_cfg),
                runtime_handler: String::new(),
            })
            .await
            .expect("run pod")
            .pod_sandbox_id;
        let mut config = container_config("c");
        config.log_path = "c/0.log".to_string();
        let err =
            t.rt.create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(config),
                sandbox_config: None,
            })
            .await
            .expect_err("create must fail");
        assert!(err.to_string().contains("create log directory"), "{err}");
        assert!(!t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::ShimStart(_))));
        assert_nothing_left(&t, &pod).await;
    }

    #[tokio::test]
    async fn create_should_leave_nothing_when_the_record_cannot_be_committed() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        // The intent passes, the final record fails.
        t.rt.store.fail_writes(1, 1);
        let err = t.create(&pod, "c").await.expect_err("create must fail");
        assert!(err.to_string().contains("injected write failure"), "{err}");
        // Nothing was given to runc: there is nothing of it to delete.
        let calls = t.host.calls();
        assert!(
            !calls
                .iter()
                .any(|c| matches!(c, Call::ShimStart(_) | Call::OciDelete { .. })),
            "{calls:?}"
        );
        assert_nothing_left(&t, &pod).await;
    }

    #[tokio::test]
    async fn create_should_return_its_own_error_with_the_errors_of_its_rollback() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        t.rt.store.fail_writes(1, 1);
        t.host.fail(Fault::Unmount, 1);
        let err = t.create(&pod, "c").await.expect_err("create must fail");
        let RuntimeError::Undone { error, cleanup } = &err else {
            panic!("not an error with its rollback's: {err:?}");
        };
        assert!(
            error.to_string().contains("injected write failure"),
            "{error}"
        );
        assert_eq!(err.code(), error.code());
        let cleanup: Vec<String> = cleanup.iter().map(ToString::to_string).collect();
        assert!(cleanup.iter().any(|e| e.contains("unmount")), "{cleanup:?}");
        let msg = tonic::Status::from(err).message().to_string();
        assert!(msg.contains("undoing it failed too"), "{msg}");
        // What could be undone was; the name is free for the retry.
        assert!(t.rt.state.containers().is_empty());
        assert!(t.create(&pod, "c").await.is_ok());
    }

    #[tokio::test]
    async fn create_should_record_a_created_container_without_a_process() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let mut events = t.rt.events.subscribe();
        let id = t.create(&pod, "c").await.expect("create");
        assert_eq!(t.state(&id), Some(ContainerState::Created));
        let rec = t.stored(&id).expect("record");
        assert_eq!(rec.state, ContainerState::Created);
        assert!(t.host.mounts().contains(&rec.bundle.join("rootfs")));
        assert!(rec.bundle.join("config.json").is_file());
        // No shim, no runc container, no pid, no cgroup: the start makes them.
        assert_eq!((rec.shim, rec.pid, rec.init_start_time), (None, 0, 0));
        assert!(!rec.in_oci_runtime());
        assert!(!t.host.containers().contains_key(&id));
        assert!(t.host.live_shims().is_empty());
        assert!(!t.host.cgroups().contains(&rec.cgroup_path));
        let ev = tokio::time::timeout(std::time::Duration::from_secs(5), events.recv())
            .await
            .expect("an event")
            .expect("open")
            .expect("not lagged");
        assert_eq!(
            (ev.container_id.as_str(), ev.container_event_type),
            (
                id.as_str(),
                api::ContainerEventType::ContainerCreatedEvent as i32
            )
        );
    }

    fn image_volume(image: &str) -> api::Mount {
        api::Mount {
            container_path: "/vol".into(),
            readonly: true,
            image: Some(api::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    async fn create_with(
        t: &TestRuntime,
        pod: &str,
        config: api::ContainerConfig,
    ) -> crate::error::Result<String> {
        t.rt.create_container(api::CreateContainerRequest {
            pod_sandbox_id: pod.to_string(),
            config: Some(config),
            sandbox_config: None,
        })
        .await
        .map(|r| r.container_id)
    }

    #[tokio::test]
    async fn create_should_mount_image_volumes_and_keep_their_image_until_removed() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let mut config = container_config("c");
        config.mounts = vec![image_volume(IMAGE)];
        let id = create_with(&t, &pod, config).await.expect("create");
        let rec = t.stored(&id).expect("record");
        let image_id = t.rt.images.get(IMAGE).expect("image").id;
        assert_eq!(rec.image_volumes.len(), 1);
        assert_eq!(rec.image_volumes[0].image_id, image_id);
        let dir = rec.image_volumes[0].dir(&rec.bundle);
        assert!(t.host.mounts().contains(&dir), "{:?}", t.host.mounts());

        let status =
            t.rt.container_status_rpc(api::ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await
            .expect("status")
            .status
            .expect("status");
        let spec = status.mounts[0].image.clone().expect("image spec");
        assert_eq!(spec.image, image_id);
        assert_eq!(spec.user_specified_image, IMAGE);
        assert_eq!(spec.image_ref, image_id, "the digest kubelet shows");

        // Used as a volume: neither RemoveImage nor GC takes it.
        assert!(t.rt.images_in_use().contains(&image_id));
        let remove_image = || {
            t.rt.remove_image(api::RemoveImageRequest {
                image: Some(api::ImageSpec {
                    image: image_id.clone(),
                    ..Default::default()
                }),
            })
        };
        let err = remove_image().await.expect_err("image in use");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
        assert!(err.to_string().contains(&id), "{err}");

        t.rt.remove_container(api::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("remove");
        assert!(!t.host.mounts().contains(&dir));
        assert!(!rec.bundle.exists());
        remove_image().await.expect("remove image");
    }

    #[tokio::test]
    async fn create_should_refuse_an_absent_or_writable_image_volume_naming_the_field() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        for (mount, field) in [
            (
                image_volume("nothing.local/here:1"),
                "config.mounts[0].image.image",
            ),
            (
                api::Mount {
                    readonly: false,
                    ..image_volume(IMAGE)
                },
                "mounts[0].readonly",
            ),
        ] {
            let mut config = container_config("c");
            config.mounts = vec![mount];
            let err = create_with(&t, &pod, config).await.expect_err("refused");
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
            assert!(err.to_string().contains(field), "{err}");
        }
        assert!(t.host.mounts().is_empty(), "{:?}", t.host.mounts());
        assert_nothing_left(&t, &pod).await;
    }

    #[tokio::test]
    async fn create_should_refuse_an_image_sub_path_the_image_lacks_and_unmount_the_volume() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let mut config = container_config("c");
        config.mounts = vec![api::Mount {
            image_sub_path: "no/such".into(),
            ..image_volume(IMAGE)
        }];
        let err = create_with(&t, &pod, config).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        let msg = err.to_string();
        assert!(msg.contains("config.mounts[0].image_sub_path"), "{msg}");
        assert!(msg.contains("does not exist in image"), "{msg}");
        assert!(t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Unmount(p) if p.ends_with("image-volumes/0"))));
        assert_nothing_left(&t, &pod).await;
    }

    #[tokio::test]
    async fn create_should_unmount_image_volumes_when_it_fails_after_mounting_them() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let mut config = container_config("c");
        config.mounts = vec![image_volume(IMAGE)];
        // The final record fails, after everything is made.
        t.rt.store.fail_writes(1, 1);
        let err = create_with(&t, &pod, config)
            .await
            .expect_err("create must fail");
        assert!(err.to_string().contains("injected"), "{err}");
        assert!(t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::Unmount(p) if p.ends_with("image-volumes/0"))));
        assert_nothing_left(&t, &pod).await;
    }
}
