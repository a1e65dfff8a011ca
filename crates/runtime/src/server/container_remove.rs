//! RemoveContainer: stop by force if needed, undo everything, forget it.
//! Removing a container that is gone already succeeds, as CRI requires.

use std::sync::Arc;

use petrel_cri::api;
use petrel_store::Table;

use crate::error::{Result, RuntimeError};
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
        self.teardown_container(&rec, *deleted, c.release_mount_namespace())
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
}
