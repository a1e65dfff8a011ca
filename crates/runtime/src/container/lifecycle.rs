//! A container's lifecycle after its creation (`container::create`): each
//! transition is one function here, and a record changes only through
//! [`Runtime::container_update`]: the store first, then memory, or neither
//! (as containerd's `UpdateSync`). Callers hold the container's `op` lock,
//! which serialises its transitions. The exit is the one change shown in
//! memory before the store has it (`container::exit`: the shim's exit file
//! is its durable record).
//!
//! ```text
//!  container_create     container_start      exit (container::exit)   container_remove
//! ─────────────────▶ Created ───────────▶ Running ──────────────────▶ Exited ────────────▶ (gone)
//!  (no process)         │  shim, runc create,                            ▲
//!                       │  NRI, runc start                               │
//!                       └── start failed: undone, StartError (128) ──────┘
//! ```
//! A created container has no process (`pid` 0, no shim, no cgroup) until
//! its start (`container::start`); StopContainer leaves it as it is (as
//! containerd), and an update of its resources goes into its config.json.
//! The exceptions, which have a process from their create on: a restored
//! container, and one created by an older version (its shim recorded).

use std::sync::Arc;

use petrel_cri::api;
use petrel_store::Table;

use crate::error::{Result, RuntimeError};
use crate::records::{ContainerRecord, ContainerState};
use crate::service::Runtime;
use crate::state::Container;

impl Runtime {
    /// Changes a container's record: `change` edits a copy, which the store
    /// commits and memory then shows; on a failure neither changes. The
    /// caller holds `c.op`.
    pub(crate) fn container_update(
        &self,
        c: &Container,
        change: impl FnOnce(&mut ContainerRecord),
    ) -> Result<ContainerRecord> {
        let mut rec = c.record();
        change(&mut rec);
        self.save_container(c, rec.clone())?;
        Ok(rec)
    }

    /// Removes a container: stopped by force if it runs, everything it has
    /// on the host undone, its record deleted, its name freed, DELETED
    /// published. A container removed meanwhile is not an error.
    pub(crate) async fn container_remove(self: &Arc<Self>, c: &Arc<Container>) -> Result<()> {
        let t0 = std::time::Instant::now();
        self.container_stop(c, 0).await?;
        let _op = c.op.lock().await;
        let t_stopped = t0.elapsed();
        if !self
            .state
            .container(&c.id)
            .is_some_and(|cur| Arc::ptr_eq(&cur, c))
        {
            return Ok(()); // removed by a concurrent call
        }
        let rec = c.record();
        let mut deleted = c.runc_deleted.lock().await;
        let t_locked = t0.elapsed();
        // Never given to runc (not started, or its failed start undone).
        let runc_gone = *deleted || !rec.in_oci_runtime();
        self.teardown_container(&rec, runc_gone, c.release_mount_namespace())
            .await?;
        *deleted = true;
        drop(deleted);
        let t_torn = t0.elapsed();
        self.store.delete(Table::Containers, &rec.id)?;
        tracing::debug!(
            container.id = %rec.id,
            stop_us = t_stopped.as_micros() as u64,
            wait_cleanup_us = (t_locked - t_stopped).as_micros() as u64,
            teardown_us = (t_torn - t_locked).as_micros() as u64,
            commit_us = (t0.elapsed() - t_torn).as_micros() as u64,
            "container removed"
        );
        let sb = self.sandbox_of(c);
        if let Some(sb) = &sb {
            sb.remove_container(&rec.id);
        }
        self.state.remove_container(&rec.id);
        self.state.release_name(&rec.name, &rec.id);
        if let Some(sb) = &sb {
            self.publish(&rec.id, api::ContainerEventType::ContainerDeletedEvent, sb);
        }
        drop(_op);
        self.nri_removed(&rec, sb.as_deref()).await;
        Ok(())
    }

    /// Applies resources to a created or running container and records
    /// them (UpdateContainerResources, and updates NRI plugins ask for):
    /// live through runc, or into the config.json of a created container
    /// that has no process yet.
    pub(crate) async fn container_set_resources(
        &self,
        c: &Container,
        linux: api::LinuxContainerResources,
    ) -> Result<()> {
        let oci = petrel_oci::spec::linux_resources(&linux, &self.host)?;
        let _op = c.op.lock().await;
        let rec = c.record();
        match rec.state {
            // No process yet: its start creates it with these.
            ContainerState::Created if !rec.in_oci_runtime() => {
                crate::container::config_update::set_resources(&rec.bundle, &oci)?;
            }
            ContainerState::Created | ContainerState::Running => {
                self.oci.update(&rec.id, &oci).await?;
            }
            ContainerState::Exited => {
                return Err(RuntimeError::FailedPrecondition(format!(
                    "container {} has exited",
                    rec.id
                )));
            }
            ContainerState::Creating => {
                return Err(RuntimeError::FailedPrecondition(format!(
                    "container {} is being created",
                    rec.id
                )));
            }
        }
        self.container_update(c, |r| r.resources = Some(linux))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use petrel_cri::api;

    use super::*;
    use crate::parts::fake::{Call, TestRuntime};

    #[tokio::test]
    async fn container_update_should_change_neither_store_nor_memory_when_the_store_refuses() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        let c = t.rt.state.container(&id).expect("container");
        t.rt.store.fail_writes(0, 1);
        let updated = t.rt.container_update(&c, |r| r.reason = "changed".into());
        assert!(updated.is_err());
        assert_eq!(c.with(|r| r.reason.clone()), "");
        assert_eq!(t.stored(&id).expect("record").reason, "");
        let updated = t.rt.container_update(&c, |r| r.reason = "changed".into());
        assert!(updated.is_ok());
        assert_eq!(c.with(|r| r.reason.clone()), "changed");
        assert_eq!(t.stored(&id).expect("record").reason, "changed");
    }

    #[tokio::test]
    async fn container_start_should_commit_running_once() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.create(&pod, "c").await.expect("create");
        let c = t.rt.state.container(&id).expect("container");
        t.rt.container_start(&c).await.expect("start");
        let rec = t.stored(&id).expect("record");
        assert_eq!(rec.state, ContainerState::Running);
        assert!(rec.started_at > 0);
        let again = t.rt.container_start(&c).await.expect_err("started twice");
        assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    }

    #[tokio::test]
    async fn container_remove_should_stop_undo_and_forget_a_running_container() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        let rec = t.stored(&id).expect("record");
        t.rt.remove_container(api::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("remove");
        assert!(t.host.calls().iter().any(|c| matches!(
            c,
            Call::OciKill { id: k, signal, .. } if *k == id && *signal == libc::SIGKILL
        )));
        assert_eq!(t.state(&id), None);
        assert!(t.stored(&id).is_none());
        assert!(!t.host.containers().contains_key(&id));
        assert!(!t.host.mounts().contains(&rec.bundle.join("rootfs")));
        assert!(!rec.bundle.exists() && !rec.layer_dir.exists());
        // Gone already: removing again succeeds, as CRI asks.
        t.rt.remove_container(api::RemoveContainerRequest { container_id: id })
            .await
            .expect("remove again");
        // Its name is free.
        assert!(t.create(&pod, "c").await.is_ok());
    }

    #[tokio::test]
    async fn sandbox_remove_should_remove_its_containers_and_its_cgroup() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let cgroup =
            t.rt.sandbox(&pod)
                .expect("pod")
                .with(|r| r.cgroup_parent.clone());
        let running = t.run(&pod, "a").await;
        let created = t.create(&pod, "b").await.expect("create");
        t.rt.remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .expect("remove pod");
        for id in [&running, &created] {
            assert_eq!(t.state(id), None);
            assert!(t.stored(id).is_none());
        }
        assert!(t.rt.state.sandbox(&pod).is_none());
        assert!(t.host.containers().is_empty());
        assert!(
            !t.host.cgroups().contains(&cgroup),
            "{:?}",
            t.host.cgroups()
        );
        assert!(t.host.cgroups().is_empty(), "{:?}", t.host.cgroups());
    }
}
