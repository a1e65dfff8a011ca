//! A created container's start (StartContainer): its shim and `runc
//! create` (made here, not at CreateContainer, as containerd makes its task
//! at the start), NRI's StartContainer, the OCI runtime's start, `Running`
//! committed and the shim watched.
//!
//! A start that fails once the container was found `Created` leaves it
//! `Exited` with reason `StartError`, exit code 128 and the error as its
//! message (containerd's answer, which kubelet shows and restarts from per
//! policy); what the start made (shim, runc state) is undone first. The
//! rootfs and bundle stay until RemoveContainer.
//!
//! A container whose shim was started at its create (a restore) or by an
//! older version is started without a new shim.

use std::sync::Arc;

use petrel_cri::api;

use crate::error::{Result, RuntimeError};
use crate::parts::ShimWatch;
use crate::records::{ContainerRecord, ContainerState};
use crate::service::Runtime;
use crate::state::{Container, Sandbox};
use crate::util;

/// The exit code of a container whose start failed (containerd's).
pub(crate) const START_ERROR_EXIT_CODE: i32 = 128;
/// The reason of a container whose start failed (containerd's).
pub(crate) const START_ERROR_REASON: &str = "StartError";

/// A shim started by this start, to undo if the start fails.
struct Launched {
    watch: ShimWatch,
}

impl Runtime {
    /// Starts a created container (StartContainer); the caller holds no
    /// lock. See the module's doc.
    pub(crate) async fn container_start(self: &Arc<Self>, c: &Arc<Container>) -> Result<()> {
        // Holding the container's lock orders this start before the exit
        // handling of a container that dies at once: STARTED precedes STOPPED.
        let op = c.op.lock().await;
        let rec = c.record();
        if rec.state != ContainerState::Created {
            return Err(RuntimeError::FailedPrecondition(format!(
                "container {} is {:?}, not created",
                rec.id, rec.state
            )));
        }
        let sb = self.sandbox_of(c).ok_or_else(|| {
            RuntimeError::Invariant(format!("container {} has no sandbox", rec.id))
        })?;
        let t0 = std::time::Instant::now();
        let (rec, launched) = if rec.shim.is_none() {
            match self.launch(&rec, &sb).await {
                Ok((rec, l)) => (rec, Some(l)),
                Err(e) => {
                    self.record_start_error(c, &sb, &e, None);
                    return Err(e);
                }
            }
        } else {
            (rec, None)
        };
        let t_launched = t0.elapsed();
        if let Err(e) = self.start_launched(c, &sb, &rec).await {
            let undone = match launched {
                Some(l) => self.undo_launch(&rec.id, l).await,
                // A shim of the create's (a restore) or of an older version:
                // its process is killed; its watch then finds the container
                // exited already and records nothing more.
                None => self
                    .oci
                    .delete(&rec.id, true)
                    .await
                    .map_err(RuntimeError::from),
            };
            let (e, left) = match undone {
                Ok(()) => (e, None),
                Err(u) => {
                    tracing::error!(container.id = %rec.id, error = %u, "rollback of a failed StartContainer incomplete");
                    (e.with_cleanup(vec![u]), Some(&rec))
                }
            };
            self.record_start_error(c, &sb, &e, left);
            return Err(e);
        }
        if let Some(l) = launched {
            self.watch_exit(c.clone(), l.watch);
        }
        tracing::debug!(
            container.id = %rec.id,
            shim_us = t_launched.as_micros() as u64,
            start_us = (t0.elapsed() - t_launched).as_micros() as u64,
            "container started"
        );
        self.publish(&c.id, api::ContainerEventType::ContainerStartedEvent, &sb);
        drop(op);
        self.nri_started(c, &sb).await;
        Ok(())
    }

    /// NRI's StartContainer, the OCI runtime's start (none for a restored
    /// container: it runs since `runc restore`), `Running` committed with
    /// the process `rec` names.
    async fn start_launched(
        &self,
        c: &Container,
        sb: &Sandbox,
        rec: &ContainerRecord,
    ) -> Result<()> {
        // As containerd, plugins hear of the start once the process exists
        // (they see its pid), before it runs.
        self.nri_start(rec, sb).await?;
        if rec.restored_from.is_none() {
            // A pidfd on the init lets the start skip `runc start` (exec FIFO).
            let init = util::pidfd_of(rec.pid, rec.init_start_time)
                .ok()
                .flatten()
                .map(|fd| (fd, rec.pid));
            self.oci.start(&rec.id, init).await?;
        }
        let (pid, init_start_time, shim) = (rec.pid, rec.init_start_time, rec.shim);
        self.container_update(c, |r| {
            r.state = ContainerState::Running;
            r.started_at = util::now_ns();
            r.pid = pid;
            r.init_start_time = init_start_time;
            r.shim = shim;
        })?;
        Ok(())
    }

    /// Starts the container's shim, which runs `runc create` on its bundle
    /// (the rootfs mounted again first when a reboot took it); returns the
    /// record with the process in it (not committed) and the shim.
    async fn launch(
        &self,
        rec: &ContainerRecord,
        sb: &Sandbox,
    ) -> Result<(ContainerRecord, Launched)> {
        // As containerd: a stopped pod's namespaces may be gone.
        if sb.with(|r| r.state) != crate::records::SandboxState::Ready {
            return Err(RuntimeError::FailedPrecondition(format!(
                "pod sandbox {} of container {} is not ready",
                sb.id, rec.id
            )));
        }
        let config = rec.bundle.join("config.json");
        if !config.is_file() {
            return Err(RuntimeError::FailedPrecondition(format!(
                "container {}: its bundle {} is gone (host rebooted?)",
                rec.id,
                rec.bundle.display()
            )));
        }
        let rootfs = rec.bundle.join("rootfs");
        if !self.rootfs.is_mounted(&rootfs) {
            tracing::info!(container.id = %rec.id, "rootfs not mounted (host rebooted?): mounting it again");
            self.remount(rec, &sb.record())?;
        }
        // A stale exit record (of a start undone at recovery) must not be
        // taken for this shim's.
        let exit = rec.bundle.join(petrel_shim::EXIT_FILE);
        if let Err(e) = std::fs::remove_file(&exit) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(RuntimeError::io("remove", &exit, e));
            }
        }
        // runc's move of the init into its cgroup is seconds away at most.
        self.cgroups.warm_up_migration();
        self.cgroups.container_starting(&rec.cgroup_path);
        let started = self.shims.start(&self.shim_options(rec, None)).await?;
        let mut rec = rec.clone();
        rec.pid = started.init.pid;
        rec.init_start_time = started.init.start_time;
        rec.shim = Some(started.shim);
        Ok((
            rec,
            Launched {
                watch: started.watch,
            },
        ))
    }

    /// Mounts a created container's rootfs and image volumes again, as
    /// its create did.
    fn remount(&self, rec: &ContainerRecord, sbrec: &crate::records::SandboxRecord) -> Result<()> {
        let image = self
            .images
            .get(&rec.image_id)
            .ok_or_else(|| RuntimeError::ImageNotFound(rec.image_id.clone()))?;
        let lower = self.images.layer_paths(&image)?;
        let idmap =
            crate::sandbox::user_namespace(sbrec)?.map(|u| crate::container::idmap::LayerIdmap {
                userns: u.path.clone(),
                host_root: u.mappings.host_root(),
            });
        self.rootfs.mount(
            &lower,
            &crate::container::rootfs::WritableLayer::new(&rec.layer_dir),
            &self.layout.empty_lower(),
            &rec.bundle.join("rootfs"),
            idmap.as_ref(),
        )?;
        self.mount_image_volumes(rec)?;
        Ok(())
    }

    /// Undoes a shim this start made: runc's container deleted (its init
    /// killed, so the shim exits), the shim reaped in the background.
    async fn undo_launch(&self, id: &str, launched: Launched) -> Result<()> {
        let deleted = self.oci.delete(id, true).await;
        let shims = self.shims.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            if let Err(e) = shims.wait_exit(launched.watch).await {
                tracing::warn!(container.id = %id, error = %e.error, "shim of a failed start not reaped");
            }
        });
        deleted.map_err(RuntimeError::from)
    }

    /// Records a start that failed: `Exited`, reason `StartError`, code
    /// 128, the error as message; STOPPED published and NRI told. `left`
    /// is the record with the process a rollback could not undo: its pid
    /// is kept, so that the removal deletes what runc may still hold. A
    /// store failure leaves it `Created` (logged).
    fn record_start_error(
        self: &Arc<Self>,
        c: &Arc<Container>,
        sb: &Sandbox,
        error: &RuntimeError,
        left: Option<&ContainerRecord>,
    ) {
        let (pid, init_start_time) = left.map_or((0, 0), |r| (r.pid, r.init_start_time));
        let message = error.to_string();
        let updated = self.container_update(c, |r| {
            r.state = ContainerState::Exited;
            r.finished_at = util::now_ns();
            r.exit_code = START_ERROR_EXIT_CODE;
            r.reason = START_ERROR_REASON.to_string();
            r.message = message;
            r.shim = None;
            r.pid = pid;
            r.init_start_time = init_start_time;
        });
        if let Err(e) = updated {
            tracing::error!(container.id = %c.id, error = %e, "failed start not recorded; the container stays created");
            return;
        }
        tracing::info!(container.id = %c.id, error = %error, "container start failed: exited with StartError");
        self.publish(&c.id, api::ContainerEventType::ContainerStoppedEvent, sb);
        self.nri_stopped(c);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use petrel_cri::api;

    use super::*;
    use crate::parts::fake::{Call, Fault, TestRuntime};
    use crate::parts::RootfsMounter;

    fn start_req(id: &str) -> api::StartContainerRequest {
        api::StartContainerRequest {
            container_id: id.to_string(),
        }
    }

    fn position(calls: &[Call], want: impl Fn(&Call) -> bool) -> Option<usize> {
        calls.iter().position(want)
    }

    #[tokio::test]
    async fn start_should_make_the_shim_then_start_and_commit_running() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        t.host.clear_calls();
        t.rt.start_container(start_req(&id)).await.expect("start");
        let calls = t.host.calls();
        let shim = position(&calls, |c| matches!(c, Call::ShimStart(i) if *i == id));
        let start = position(&calls, |c| matches!(c, Call::OciStart(i) if *i == id));
        assert!(shim.is_some() && start > shim, "{calls:?}");
        let rec = t.stored(&id).expect("record");
        assert_eq!(rec.state, ContainerState::Running);
        assert!(rec.shim.is_some() && rec.pid != 0 && rec.started_at > 0);
        assert!(t.host.containers().contains_key(&id));
        assert!(t.host.cgroups().contains(&rec.cgroup_path));
    }

    /// A start that fails: the container is Exited with StartError and
    /// code 128, its shim and runc state gone, its files kept until the
    /// removal, which then has no runc state to delete.
    async fn assert_start_error(t: &TestRuntime, id: &str, err: &RuntimeError, cause: &str) {
        assert!(err.to_string().contains(cause), "{err}");
        let rec = t.stored(id).expect("record");
        assert_eq!(t.state(id), Some(ContainerState::Exited));
        assert_eq!(
            (rec.state, rec.exit_code, rec.reason.as_str()),
            (ContainerState::Exited, 128, "StartError")
        );
        assert!(rec.message.contains(cause), "{}", rec.message);
        assert!(rec.finished_at > 0 && rec.shim.is_none() && rec.pid == 0);
        assert!(!t.host.containers().contains_key(id));
        assert!(
            t.host
                .wait_for(Duration::from_secs(5), |h| h.live_shims().is_empty())
                .await,
            "shim left: {:?}",
            t.host.live_shims()
        );
        assert!(rec.bundle.join("config.json").is_file(), "bundle removed");
        assert!(t.host.mounts().contains(&rec.bundle.join("rootfs")));
        let again =
            t.rt.start_container(start_req(id))
                .await
                .expect_err("again");
        assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again}");
        t.host.clear_calls();
        t.rt.remove_container(api::RemoveContainerRequest {
            container_id: id.to_string(),
        })
        .await
        .expect("remove");
        let calls = t.host.calls();
        assert!(
            !calls.iter().any(|c| matches!(c, Call::OciDelete { .. })),
            "{calls:?}"
        );
        assert!(t.host.mounts().is_empty() && !rec.bundle.exists());
    }

    #[tokio::test]
    async fn start_should_record_start_error_and_undo_the_shim_when_runc_start_fails() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        let mut events = t.rt.events.subscribe();
        t.host.fail(Fault::OciStart, 1);
        let err =
            t.rt.start_container(start_req(&id))
                .await
                .expect_err("start must fail");
        assert!(t.host.calls().contains(&Call::OciDelete {
            id: id.clone(),
            force: true
        }));
        let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("an event")
            .expect("open")
            .expect("not lagged");
        assert_eq!(
            ev.container_event_type,
            api::ContainerEventType::ContainerStoppedEvent as i32
        );
        assert_start_error(&t, &id, &err, "injected").await;
    }

    #[tokio::test]
    async fn start_should_record_start_error_when_the_shim_fails() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        t.host.fail(Fault::ShimStart, 1);
        let err =
            t.rt.start_container(start_req(&id))
                .await
                .expect_err("start must fail");
        assert!(!t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::OciStart(_))));
        assert_start_error(&t, &id, &err, "injected").await;
    }

    #[tokio::test]
    async fn start_should_keep_the_pid_when_its_rollback_fails_so_that_removal_deletes_it() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        t.host.fail(Fault::OciStart, 1);
        t.host.fail(Fault::OciDelete, 1);
        let err =
            t.rt.start_container(start_req(&id))
                .await
                .expect_err("fails");
        assert!(matches!(err, RuntimeError::Undone { .. }), "{err:?}");
        let rec = t.stored(&id).expect("record");
        assert_eq!(
            (rec.state, rec.reason.as_str()),
            (ContainerState::Exited, "StartError")
        );
        assert!(rec.in_oci_runtime());
        t.host.clear_calls();
        t.rt.remove_container(api::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("remove");

        assert!(t.host.calls().contains(&Call::OciDelete {
            id: id.clone(),
            force: true
        }));
        assert!(!t.host.containers().contains_key(&id));
    }

    #[tokio::test]
    async fn start_should_mount_the_rootfs_again_when_it_is_gone() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        let rootfs = t.stored(&id).expect("record").bundle.join("rootfs");
        t.host.unmount(&rootfs).expect("unmount");
        t.host.clear_calls();
        t.rt.start_container(start_req(&id)).await.expect("start");
        let calls = t.host.calls();
        let mount = position(&calls, |c| *c == Call::Mount(rootfs.clone()));
        let shim = position(&calls, |c| matches!(c, Call::ShimStart(_)));
        assert!(mount.is_some() && shim > mount, "{calls:?}");
        assert_eq!(t.state(&id), Some(ContainerState::Running));
    }

    #[tokio::test]
    async fn start_should_fail_with_start_error_when_the_bundle_is_gone() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        let bundle = t.stored(&id).expect("record").bundle;
        std::fs::remove_file(bundle.join("config.json")).expect("rm");
        let err =
            t.rt.start_container(start_req(&id))
                .await
                .expect_err("fails");
        assert!(err.to_string().contains("is gone"), "{err}");
        assert!(!t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::ShimStart(_))));
        let rec = t.stored(&id).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (128, "StartError"));
    }

    #[tokio::test]
    async fn start_should_fail_with_start_error_in_a_stopped_pod() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        t.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .expect("stop pod");
        // The pod's stop leaves a container without a process as it is.
        assert_eq!(t.state(&id), Some(ContainerState::Created));
        let err =
            t.rt.start_container(start_req(&id))
                .await
                .expect_err("fails");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
        assert!(err.to_string().contains("not ready"), "{err}");
        let rec = t.stored(&id).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (128, "StartError"));
    }

    #[tokio::test]
    async fn stop_should_leave_a_created_container_created() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        t.host.clear_calls();
        t.rt.stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .expect("stop");
        assert_eq!(t.state(&id), Some(ContainerState::Created));
        assert!(t.host.calls().is_empty(), "{:?}", t.host.calls());
        // It can still be started.
        t.rt.start_container(start_req(&id)).await.expect("start");
        assert_eq!(t.state(&id), Some(ContainerState::Running));
    }

    #[tokio::test]
    async fn remove_should_not_ask_runc_for_a_container_never_started() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        let rec = t.stored(&id).expect("record");
        t.host.clear_calls();
        t.rt.remove_container(api::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("remove");
        let calls = t.host.calls();
        assert!(
            !calls
                .iter()
                .any(|c| matches!(c, Call::OciDelete { .. } | Call::OciKill { .. })),
            "{calls:?}"
        );
        assert_eq!(t.state(&id), None);
        assert!(!rec.bundle.exists() && !rec.layer_dir.exists());
        assert!(t.host.mounts().is_empty());
    }

    #[tokio::test]
    async fn update_should_write_the_resources_of_a_created_container_into_its_config() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        let resources = api::LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            cpu_shares: 512,
            ..Default::default()
        };
        t.rt.update_container_resources(api::UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(resources.clone()),
            ..Default::default()
        })
        .await
        .expect("update");
        assert!(!t
            .host
            .calls()
            .iter()
            .any(|c| matches!(c, Call::OciUpdate(_))));
        let rec = t.stored(&id).expect("record");
        assert_eq!(rec.resources, Some(resources));
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(rec.bundle.join("config.json")).expect("read"))
                .expect("json");
        assert_eq!(config["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(config["linux"]["resources"]["cpu"]["shares"], 512);
        // Once started, updates go to runc.
        t.rt.start_container(start_req(&id)).await.expect("start");
        t.rt.update_container_resources(api::UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(api::LinuxContainerResources {
                cpu_shares: 256,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("update");
        assert!(t.host.calls().contains(&Call::OciUpdate(id.clone())));
    }

    #[tokio::test]
    async fn stats_should_answer_for_a_created_container_without_usage() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        let stats =
            t.rt.container_stats(api::ContainerStatsRequest {
                container_id: id.clone(),
            })
            .await
            .expect("stats")
            .stats
            .expect("stats");
        assert!(stats.cpu.is_none() && stats.memory.is_none());
        assert!(stats.writable_layer.is_some());
        let metrics =
            t.rt.list_pod_sandbox_metrics(api::ListPodSandboxMetricsRequest {})
                .await
                .expect("metrics");
        assert!(metrics
            .pod_metrics
            .iter()
            .all(|p| p.container_metrics.iter().all(|m| m.container_id != id)));
    }
}
