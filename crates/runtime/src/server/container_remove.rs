//! RemoveContainer: stop by force if needed, undo everything, forget it.
//! Removing a container that is gone already succeeds, as CRI requires.

use std::sync::Arc;

use petrel_cri::api;
use petrel_store::Table;

use crate::container::mount_ns::HeldNamespace;
use crate::error::{Result, RuntimeError};
use crate::records::{ContainerRecord, ContainerState};
use crate::server::container_create::remove_container_files;
use crate::service::Runtime;
use crate::state::Container;

impl Runtime {
    /// RemoveContainer.
    pub(crate) async fn remove_container(
        self: &Arc<Self>,
        req: api::RemoveContainerRequest,
    ) -> Result<api::RemoveContainerResponse> {
        let _sync = self.nri_block_sync().await;
        let c = match self.container(&req.container_id) {
            Ok(c) => c,
            Err(RuntimeError::NotFound { .. }) => return Ok(api::RemoveContainerResponse {}),
            Err(e) => return Err(e),
        };
        self.remove_container_inner(&c).await?;
        Ok(api::RemoveContainerResponse {})
    }

    pub(crate) async fn remove_container_inner(self: &Arc<Self>, c: &Arc<Container>) -> Result<()> {
        let t0 = std::time::Instant::now();
        self.stop_container_inner(c, 0).await?;
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
        if rec.state == ContainerState::Exited {
            self.remove_exited(&rec, *deleted, c.release_mount_namespace())
                .await?;
        } else {
            self.teardown_container(&rec, *deleted, c.release_mount_namespace())
                .await?;
        }
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

    /// Removes an exited container from runc, and its cgroup, before the
    /// call returns; its rootfs and directories go on a blocking thread
    /// that the call does not wait for. Unmounting an overlay syncs the
    /// file system under its upper directory, and removing the writable
    /// layer is more disk work: together 2 ms at the median and over 10 ms
    /// in the tail here, work no client waits on. The container is dead and
    /// its id is never reused; a crash before the files are gone leaves
    /// unnamed directories that start-up's sweep removes, and a graceful
    /// shutdown waits for them (`enter_background`).
    async fn remove_exited(
        self: &Arc<Self>,
        rec: &ContainerRecord,
        runc_deleted: bool,
        mount_ns: Option<HeldNamespace>,
    ) -> Result<()> {
        let guard = self.enter_background();
        let (id, bundle, layer) = (rec.id.clone(), rec.bundle.clone(), rec.layer_dir.clone());
        tokio::task::spawn_blocking(move || {
            // The namespace's teardown (its copy of the rootfs mount among
            // the rest) comes before the rootfs is removed.
            drop(mount_ns);
            if let Err(e) = remove_container_files(&bundle, &layer) {
                tracing::error!(container.id = %id, error = %e, "files of a removed container not removed; start-up's sweep will retry");
            }
            drop(guard);
        });
        if !runc_deleted {
            self.runc.delete(&rec.id, true).await?;
        }
        // runc removes the container's own cgroup; a container that never
        // reached runc may still have left an empty one.
        let _ = self.cgroups.remove(&rec.cgroup_path);
        Ok(())
    }
}
