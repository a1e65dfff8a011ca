//! A pod sandbox's lifecycle after its creation (`sandbox::create`): each
//! transition is one function here; a record changes through
//! `Runtime::save_sandbox` (the store first, then memory, or neither).
//! Callers need no lock: each takes the pod's `op` lock for writing.
//!
//! ```text
//!  sandbox_create        sandbox_stop           sandbox_remove
//! ────────────────▶ Ready ───────────▶ NotReady ──────────────▶ (gone)
//! ```

use std::sync::Arc;

use futures_util::future::join_all;
use petrel_cri::api;
use petrel_store::Table;

use crate::error::{Result, RuntimeError};
use crate::records::SandboxState;
use crate::service::Runtime;
use crate::state::Sandbox;

impl Runtime {
    /// Stops a pod (StopPodSandbox, RemovePodSandbox first, evictions) and,
    /// when this call is the one that stopped it, tells the NRI plugins
    /// (StopPodSandbox, once per pod however often it is stopped; sent
    /// after the pod's lock is released, so that its status stays readable
    /// while a plugin takes its time). Idempotent.
    pub(crate) async fn sandbox_stop(self: &Arc<Self>, sb: &Arc<Sandbox>) -> Result<()> {
        if self.sandbox_stop_locked(sb).await? {
            self.nri_pod_gone(sb, petrel_nri::api::Event::StopPodSandbox)
                .await;
        }
        Ok(())
    }

    /// The stop itself: its containers killed, the PID-namespace holder
    /// gone, the CNI network released (committed at once, its addresses
    /// kept for NRI's events), the network namespace released, then
    /// `NotReady` committed and STOPPED published. True when this call
    /// moved the pod from `Ready` to `NotReady`.
    async fn sandbox_stop_locked(self: &Arc<Self>, sb: &Arc<Sandbox>) -> Result<bool> {
        let _op = sb.op.write().await;
        // Containers first: they die with SIGKILL, as CRI asks of a pod stop.
        let containers: Vec<_> = sb
            .container_ids()
            .iter()
            .filter_map(|id| self.state.container(id))
            .collect();
        self.containers_kill(&containers).await?;
        let mut rec = sb.record();
        if let Some(h) = rec.pid_holder.take() {
            self.pods.kill_pid_holder(&h);
        }
        // CNI DEL before the namespace goes (also for a pod already
        // NotReady whose network a restart could not release). A failure
        // fails the stop and the pod keeps its record of the network, so
        // that the client's retry releases it (CRI: stop until it succeeds).
        if let Some(net) = &rec.network {
            self.networks.del(&rec, net).await?;
            if !net.ips.is_empty() {
                rec.released_ips = net.ips.clone();
            }
            rec.network = None;
            // Committed at once: the network is gone whatever fails next.
            self.save_sandbox(sb, rec.clone())?;
        }
        if rec.state == SandboxState::NotReady {
            return Ok(false);
        }
        if let Some(netns) = rec.netns.take() {
            self.pods
                .unpin_namespace(&netns)
                .map_err(|source| RuntimeError::Namespace {
                    op: "release network namespace",
                    source,
                })?;
        }
        rec.state = SandboxState::NotReady;
        self.save_sandbox(sb, rec)?;
        self.publish(&sb.id, api::ContainerEventType::ContainerStoppedEvent, sb);
        Ok(true)
    }

    /// Removes a pod (RemovePodSandbox): stopped, every container removed,
    /// everything it has on the host undone, its record deleted, DELETED
    /// published, its name freed.
    pub(crate) async fn sandbox_remove(self: &Arc<Self>, sb: &Arc<Sandbox>) -> Result<()> {
        self.sandbox_stop(sb).await?;
        let _op = sb.op.write().await;
        // The stop above killed every container, so what is left is teardown
        // (runc delete, unmounts, cgroups) that overlaps well: all at once,
        // each to its end, the first failure reported.
        let containers: Vec<_> = sb
            .container_ids()
            .iter()
            .filter_map(|id| self.state.container(id))
            .collect();
        let removals = containers.iter().map(|c| self.container_remove(c));
        join_all(removals)
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
        // Removed containers' cgroups are inside the pod's: the OCI
        // runtime's part of their removals is done now, not left queued.
        self.remover.finish_pod(&sb.id).await?;
        let rec = sb.record();
        self.sandbox_teardown(&rec).await?;
        self.store.delete(Table::Sandboxes, &rec.id)?;
        // The DELETED event carries the pod's last status.
        self.publish(&rec.id, api::ContainerEventType::ContainerDeletedEvent, sb);
        self.state.remove_sandbox(&rec.id);
        self.state.release_name(&rec.name, &rec.id);
        self.nri_pod_gone(sb, petrel_nri::api::Event::RemovePodSandbox)
            .await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use petrel_cri::api;
    use petrel_store::Table;

    use crate::error::RuntimeError;
    use crate::parts::fake::{Call, Fault, TestRuntime};
    use crate::records::{SandboxRecord, SandboxState};

    fn stop(id: &str) -> api::StopPodSandboxRequest {
        api::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        }
    }

    fn stored(t: &TestRuntime, id: &str) -> SandboxRecord {
        t.rt.store
            .get::<SandboxRecord>(Table::Sandboxes, id)
            .expect("read store")
            .expect("record")
    }

    #[tokio::test]
    async fn stop_pod_should_fail_and_keep_the_network_when_cni_del_fails_until_a_retry() {
        let t = TestRuntime::new();
        t.host.use_network();
        let id = t.isolated_pod("p").await.expect("run pod");
        let netns = stored(&t, &id).netns.expect("netns pinned");
        t.host.fail(Fault::NetworkDel, 1);

        let err =
            t.rt.stop_pod_sandbox(stop(&id))
                .await
                .expect_err("stop must fail");
        assert!(matches!(err, RuntimeError::Cni(_)), "{err}");
        assert!(err.to_string().contains("(DEL): injected"), "{err}");
        // The pod stays Ready with its network recorded (in memory and in
        // the store) and its netns pinned, for the client's retry.
        let rec = stored(&t, &id);
        assert_eq!(rec.state, SandboxState::Ready);
        assert!(rec.network.is_some());
        let sb = t.rt.state.sandbox(&id).expect("in memory");
        assert!(sb.with(|r| r.state == SandboxState::Ready && r.network.is_some()));
        assert!(t.host.attached().contains_key(&id));
        assert!(t.host.namespaces().contains(&netns));
        // The holder was killed all the same: a stopped pod runs nothing.
        assert!(t.host.pid_holders().is_empty());

        t.rt.stop_pod_sandbox(stop(&id))
            .await
            .expect("retried stop");
        let rec = stored(&t, &id);
        assert_eq!(rec.state, SandboxState::NotReady);
        assert!(rec.network.is_none() && rec.netns.is_none());
        assert!(t.host.attached().is_empty());
        assert!(!t.host.namespaces().contains(&netns));
        let dels = t
            .host
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::NetworkDel(_)))
            .count();
        assert_eq!(dels, 2);

        // Stopped again: nothing left to release, nothing run.
        t.rt.stop_pod_sandbox(stop(&id)).await.expect("stop again");
        let dels_after = t
            .host
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::NetworkDel(_)))
            .count();
        assert_eq!(dels_after, 2);
    }

    #[tokio::test]
    async fn remove_pod_should_fail_and_keep_the_pod_when_cni_del_fails() {
        let t = TestRuntime::new();
        t.host.use_network();
        let id = t.isolated_pod("p").await.expect("run pod");
        t.host.fail(Fault::NetworkDel, 1);
        let removed =
            t.rt.remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        assert!(removed.is_err_and(|e| e.to_string().contains("(DEL): injected")));
        assert_eq!(stored(&t, &id).state, SandboxState::Ready);
        assert!(t.host.attached().contains_key(&id));

        t.rt.remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .expect("retried remove");
        assert!(t.rt.state.sandbox(&id).is_none());
        assert!(t.host.attached().is_empty());
        assert!(t.host.namespaces().is_empty());
        assert!(t.host.cgroups().is_empty(), "{:?}", t.host.cgroups());
    }
}
