//! A container's exit: the watch on its shim, and the recording of the
//! exit the shim wrote.
//!
//! The shim writes the exit record (`exit` in the bundle, whole, by a
//! rename) and exits; its pidfd turning readable is the notification. Then:
//! - the record is read: the exit is committed (`Exited`, code, reason);
//! - there is no record: the shim died without writing one (it was
//!   killed). The container can no longer be watched, so it is killed and
//!   recorded `Exited` with reason `Unknown` and code 255 (what containerd
//!   reports for the container of a dead shim);
//! - the record is there but cannot be read: nothing is made up. The error
//!   is logged with the file's path, the container is left as it is, and
//!   the read is tried again later (a read error may pass). From the
//!   [`ASK_OCI_FROM`]th try on, the OCI runtime is asked too: when it says
//!   the container stopped (or no longer knows it), the exit is recorded
//!   with an unknown code (255, reason `Unknown`, the message naming the
//!   unreadable file), and nothing is killed; while it says the container
//!   runs, or cannot say, the container stays as it is and is looked at
//!   again.
//!
//! When the wait for the shim's exit itself fails (the pidfd cannot be
//! registered or polled), the shim is looked at again after a growing delay
//! ([`RECHECK_FIRST`] up to [`RECHECK_MAX`]) until it is gone, rather than
//! left unwatched (and the container `Running`) until a restart.

use std::sync::Arc;
use std::time::Duration;

use petrel_cri::api;
use petrel_shim::ExitRecord;

use crate::error::{Result, RuntimeError};
use crate::parts::{ShimWatch, WaitFailed};
use crate::records::{ContainerRecord, ContainerState};
use crate::service::Runtime;
use crate::state::Container;
use crate::util;

/// How long after an exit the OCI runtime's record of the container is
/// deleted.
const CLEANUP_DELAY: Duration = Duration::from_millis(20);

/// The first delay before a shim whose exit could not be waited for is
/// looked at again; it doubles up to [`RECHECK_MAX`].
pub(crate) const RECHECK_FIRST: Duration = Duration::from_millis(50);
/// The longest delay between two looks at such a shim.
pub(crate) const RECHECK_MAX: Duration = Duration::from_secs(2);

/// The first delay before an exit that could not be recorded is tried
/// again; it grows fourfold up to [`RETRY_MAX`].
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest delay between two tries.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(60);
/// From this try on (the first is 0), an unreadable exit record is
/// weighed against what the OCI runtime says of the container.
pub(crate) const ASK_OCI_FROM: u32 = 3;

/// The exit code recorded when the real one cannot be known.
const UNKNOWN_EXIT_CODE: i32 = 255;

/// Records an exit whose code is unknown (reason `Unknown`).
fn record_unknown(rec: &mut ContainerRecord, message: String) {
    rec.exit_code = UNKNOWN_EXIT_CODE;
    rec.finished_at = util::now_ns();
    rec.reason = "Unknown".to_string();
    rec.message = message;
}

impl Runtime {
    /// Watches a container's shim and records the exit when it comes.
    pub(crate) fn watch_exit(self: &Arc<Self>, c: Arc<Container>, watch: ShimWatch) {
        let (pid, start_time) = c.with(|r| (r.pid, r.init_start_time));
        match crate::container::mount_ns::hold(pid, start_time) {
            Ok(ns) => c.hold_mount_namespace(ns),
            Err(e) => {
                tracing::debug!(container.id = %c.id, error = %e, "mount namespace not held")
            }
        }
        let rt = self.clone();
        tokio::spawn(async move {
            rt.await_shim(&c, watch).await;
            rt.record_exit(&c).await;
        });
    }

    /// Completes once the watched shim has exited. A wait that fails is
    /// logged, and the shim looked at again after a growing delay.
    async fn await_shim(&self, c: &Container, mut watch: ShimWatch) {
        let mut delay = RECHECK_FIRST;
        let mut failures = 0u32;
        loop {
            match self.shims.wait_exit(watch).await {
                Ok(()) => return,
                Err(WaitFailed { watch: w, error }) => {
                    if failures == 0 {
                        tracing::error!(container.id = %c.id, shim.pid = w.pid(), error = %error, "cannot wait for the shim's exit; looking at it again until it is gone");
                    } else {
                        tracing::debug!(container.id = %c.id, shim.pid = w.pid(), error = %error, failures, "still cannot wait for the shim's exit");
                    }
                    failures += 1;
                    watch = w;
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(RECHECK_MAX);
            match self.shims.exited(&watch) {
                Ok(true) => {
                    tracing::info!(container.id = %c.id, shim.pid = watch.pid(), "shim seen gone by a later look");
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(container.id = %c.id, shim.pid = watch.pid(), error = %e, "cannot look at the shim")
                }
            }
        }
    }

    /// Records a container's exit (see [`Runtime::handle_exit`]). A
    /// failure is logged, and the exit tried again in the background after
    /// a growing delay, until it is recorded or the container removed.
    pub(crate) async fn record_exit(self: &Arc<Self>, c: &Arc<Container>) {
        let Err(e) = self.handle_exit(c, 0).await else {
            return;
        };
        tracing::error!(container.id = %c.id, error = %e, retry_ms = RETRY_FIRST.as_millis() as u64, "exit not recorded; trying again");
        let rt = self.clone();
        let c = c.clone();
        tokio::spawn(async move {
            let mut delay = RETRY_FIRST;
            for attempt in 1u32.. {
                tokio::time::sleep(delay).await;
                delay = (delay * 4).min(RETRY_MAX);
                match rt.handle_exit(&c, attempt).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::error!(container.id = %c.id, error = %e, attempt, retry_ms = delay.as_millis() as u64, "exit not recorded; trying again")
                    }
                }
            }
        });
    }

    /// Records a container's exit, once its shim has exited: reads the
    /// shim's exit record, decides the reason, publishes STOPPED, commits,
    /// then cleans the OCI runtime's state. `attempt` counts the earlier
    /// tries (see the module's doc). An error leaves the container as it
    /// was.
    pub(crate) async fn handle_exit(
        self: &Arc<Self>,
        c: &Arc<Container>,
        attempt: u32,
    ) -> Result<()> {
        let _op = c.op.lock().await;
        // Removed meanwhile (a created container deleted by force).
        if !self
            .state
            .container(&c.id)
            .is_some_and(|cur| Arc::ptr_eq(&cur, c))
        {
            return Ok(());
        }
        let mut rec = c.record();
        if rec.state == ContainerState::Exited {
            return Ok(());
        }
        match self.shims.read_exit(&rec.bundle) {
            Ok(Some(exit)) => self.record_known(&mut rec, exit),
            Ok(None) => {
                // The shim died without recording the exit: the container
                // cannot be watched any more. Make sure it is dead.
                if let Err(e) = self.oci.kill(&rec.id, libc::SIGKILL, true).await {
                    tracing::warn!(container.id = %rec.id, error = %e, "container of a dead shim not killed (gone already?)");
                }
                tracing::warn!(container.id = %rec.id, "shim exited without an exit record");
                record_unknown(
                    &mut rec,
                    "the container's shim exited without recording its exit".to_string(),
                );
            }
            Err(e) if attempt < ASK_OCI_FROM => {
                return Err(RuntimeError::ExitUnread {
                    id: rec.id.clone(),
                    source: e,
                })
            }
            Err(e) => match self.oci.state(&rec.id).await {
                Ok(None) => record_unknown(&mut rec, format!("exit code unknown: {e}")),
                Ok(Some(st)) if st.status == "stopped" => {
                    record_unknown(&mut rec, format!("exit code unknown: {e}"))
                }
                Ok(Some(st)) => {
                    tracing::warn!(container.id = %rec.id, oci.status = %st.status, "exit record unreadable while the OCI runtime says the container is not stopped; left as it is");
                    return Err(RuntimeError::ExitUnread {
                        id: rec.id.clone(),
                        source: e,
                    });
                }
                Err(oe) => {
                    tracing::warn!(container.id = %rec.id, error = %oe, "exit record unreadable and the OCI runtime cannot tell the container's state");
                    return Err(RuntimeError::ExitUnread {
                        id: rec.id.clone(),
                        source: e,
                    });
                }
            },
        }
        self.commit_exit(c, rec).await;
        Ok(())
    }

    /// Fills in an exit the shim recorded.
    fn record_known(&self, rec: &mut ContainerRecord, exit: ExitRecord) {
        rec.exit_code = exit.exit_code;
        rec.finished_at = exit.exited_at_ns;
        rec.reason = if exit.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
        .to_string();
        if exit.exit_code == 128 + libc::SIGKILL && self.oom_killed(rec, exit) {
            rec.reason = "OOMKilled".to_string();
        }
    }

    /// Whether the OOM killer killed in the container's cgroup. The shim's
    /// finding first: it watched the container's own cgroup for as long as
    /// the container ran, and its record outlives a runtime restart. Only
    /// when the shim could not tell (cgroup v1, where the cgroup stays
    /// until runc deletes it and is read here; a cgroup gone before the
    /// shim read it; a shim older than the finding) the cgroup driver's
    /// count: on v1 and with cgroupfs exact, with the systemd driver an
    /// inference from the pod slice once the scope is gone (see
    /// `parts::systemd`).
    fn oom_killed(&self, rec: &ContainerRecord, exit: ExitRecord) -> bool {
        exit.oom_killed
            .unwrap_or_else(|| self.cgroups.oom_kill_count(&rec.cgroup_path).unwrap_or(0) > 0)
    }

    /// Shows, publishes and commits an exit filled in `rec`, then cleans
    /// up after the container in the background.
    async fn commit_exit(self: &Arc<Self>, c: &Arc<Container>, mut rec: ContainerRecord) {
        // An eviction's reason outlives the exit it causes.
        let evicted =
            c.with(|r| (r.reason == crate::nri::host::EVICTED_REASON).then(|| r.message.clone()));
        if let Some(message) = evicted {
            rec.reason = crate::nri::host::EVICTED_REASON.to_string();
            rec.message = message;
        }
        if rec.started_at == 0 && rec.state == ContainerState::Running {
            rec.started_at = rec.finished_at;
        }
        rec.state = ContainerState::Exited;
        rec.shim = None;
        // The exit is durable already (the shim's exit file, kept until the
        // container is removed), so subscribers hear of it before the store
        // commit: recovery would find the same exit after a crash.
        c.set(rec.clone());
        if let Some(sb) = self.sandbox_of(c) {
            self.publish(&c.id, api::ContainerEventType::ContainerStoppedEvent, &sb);
        }
        // Let the event leave before the commit waits for the disk: tokio
        // runs the subscribers' streams woken here on this same thread, but
        // only once this task yields.
        tokio::task::yield_now().await;
        // The exit of a container asked to stop is usually followed at once
        // by its removal (kubelet's kill, critest): its commit waits for the
        // cleanup below and is dropped if the removal's deletion of the
        // record came first, so that RemoveContainer does not wait for one
        // fsync before making its own.
        let commit_later = c.stop_asked();
        if !commit_later {
            self.commit_exited(&rec);
        }
        self.nri_stopped(c);
        self.clean_up_after_exit(c, rec.cgroup_path, commit_later);
    }

    /// Commits an exited container's record; a failure is logged (the
    /// shim's exit file, kept until the container is removed, is read
    /// again by recovery).
    fn commit_exited(&self, rec: &ContainerRecord) {
        if let Err(e) = self
            .store
            .put(petrel_store::Table::Containers, &rec.id, rec)
        {
            tracing::error!(container.id = %rec.id, error = %e, "exit not committed; recovery will read it again");
        }
    }

    /// The OCI runtime's record of a stopped container only holds its
    /// cgroup; it is dropped a little later, so that starting runc does not
    /// compete with the event on its way out. A removal that comes first
    /// does it instead.
    ///
    /// Before the cgroup goes, what the container left in it (page cache) is
    /// uncharged, or it lives on in the kernel as a dying cgroup. Only here,
    /// never on a CRI call's path: it can take long on a busy host, and a
    /// RemoveContainer deleting the cgroup meanwhile would wait for it
    /// (removing a cgroup waits for writes to its files). A container
    /// removed within [`CLEANUP_DELAY`] of its exit is not uncharged.
    fn clean_up_after_exit(self: &Arc<Self>, c: &Arc<Container>, cgroup: String, commit: bool) {
        let rt = self.clone();
        let c = c.clone();
        tokio::spawn(async move {
            tokio::time::sleep(CLEANUP_DELAY).await;
            if commit {
                // Under the container's lock: a removal either deleted the
                // record already (the container is gone from memory too) or
                // waits for this commit.
                let _op = c.op.lock().await;
                if rt
                    .state
                    .container(&c.id)
                    .is_some_and(|cur| Arc::ptr_eq(&cur, &c))
                {
                    rt.commit_exited(&c.record());
                }
            }
            let mut deleted = c.runc_deleted.lock().await;
            if *deleted {
                return;
            }
            let cgroups = rt.cgroups.clone();
            let id = c.id.clone();
            let mount_ns = c.release_mount_namespace();
            let released = tokio::task::spawn_blocking(move || {
                // The kernel tears the namespace down here.
                drop(mount_ns);
                if let Err(e) = cgroups.release_memory(&cgroup) {
                    tracing::debug!(container.id = %id, error = %e, "container memory not released");
                }
            })
            .await;
            if let Err(e) = released {
                tracing::warn!(container.id = %c.id, error = %e, "release of a container's memory failed");
            }
            match rt.oci.delete(&c.id, true).await {
                Ok(()) => *deleted = true,
                Err(e) => {
                    tracing::debug!(container.id = %c.id, error = %e, "runc delete after exit")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use petrel_cri::api;

    use super::*;
    use crate::parts::fake::{Call, ExitFile, Fault, TestRuntime};

    fn killed(calls: &[Call], id: &str) -> bool {
        calls
            .iter()
            .any(|c| matches!(c, Call::OciKill { id: k, .. } if k == id))
    }

    #[tokio::test]
    async fn exit_should_be_recorded_with_the_code_the_shim_wrote() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        let mut events = t.rt.events.subscribe();
        t.host.exit(&id, ExitFile::Code(3));
        assert!(t.wait_state(&id, ContainerState::Exited).await);
        let rec = t.stored(&id).expect("record");
        assert_eq!(rec.state, ContainerState::Exited);
        assert_eq!((rec.exit_code, rec.reason.as_str()), (3, "Error"));
        assert_eq!(rec.finished_at, 1_000);
        assert_eq!(rec.shim, None);
        let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("an event")
            .expect("open")
            .expect("not lagged");
        assert_eq!(ev.container_id, id);
        assert_eq!(
            ev.container_event_type,
            api::ContainerEventType::ContainerStoppedEvent as i32
        );
        // The OCI runtime's record goes a little later.
        let host = t.host.clone();
        let gone = t
            .host
            .wait_for(Duration::from_secs(5), |h| {
                !h.containers().contains_key(&id)
            })
            .await;
        assert!(gone, "{:?}", host.calls());
        assert!(host.calls().contains(&Call::ReleaseMemory(rec.cgroup_path)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_containers_exit_should_be_committed_late_and_never_after_its_removal() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let kept = t.run(&pod, "kept").await;
        let removed = t.run(&pod, "removed").await;
        for id in [&kept, &removed] {
            t.rt.stop_container(api::StopContainerRequest {
                container_id: id.clone(),
                timeout: 0,
            })
            .await
            .expect("stop");
        }
        // Stopped: shown at once, committed after the cleanup's delay.
        assert_eq!(t.state(&kept), Some(ContainerState::Exited));
        t.rt.remove_container(api::RemoveContainerRequest {
            container_id: removed.clone(),
        })
        .await
        .expect("remove");
        tokio::time::sleep(CLEANUP_DELAY * 5).await;
        assert_eq!(
            t.stored(&kept).expect("record").state,
            ContainerState::Exited
        );
        assert!(t.stored(&removed).is_none(), "removed record written back");
    }

    #[tokio::test]
    async fn exit_should_say_oomkilled_when_the_cgroup_saw_an_oom_kill() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        let cgroup = t.stored(&id).expect("record").cgroup_path;
        t.host.set_oom_kills(&cgroup, 1);
        t.host.exit(&id, ExitFile::Code(128 + libc::SIGKILL));
        assert!(t.wait_state(&id, ContainerState::Exited).await);
        let rec = t.stored(&id).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (137, "OOMKilled"));
    }

    #[tokio::test]
    async fn exit_should_take_the_shims_oom_finding_over_the_cgroups_count() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let killed_otherwise = t.run(&pod, "sibling").await;
        let hog = t.run(&pod, "hog").await;
        // The cgroups' counts say OOM for both (the systemd driver's
        // inference from the pod, a sibling OOM-killed); the shims know.
        for id in [&killed_otherwise, &hog] {
            let cgroup = t.stored(id).expect("record").cgroup_path;
            t.host.set_oom_kills(&cgroup, 1);
        }
        t.host.exit(
            &killed_otherwise,
            ExitFile::CodeOom(128 + libc::SIGKILL, false),
        );
        assert!(
            t.wait_state(&killed_otherwise, ContainerState::Exited)
                .await
        );
        let rec = t.stored(&killed_otherwise).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (137, "Error"));

        // And an OOM kill the cgroup no longer shows (scope gone).
        let cgroup = t.stored(&hog).expect("record").cgroup_path;
        t.host.set_oom_kills(&cgroup, 0);
        t.host
            .exit(&hog, ExitFile::CodeOom(128 + libc::SIGKILL, true));
        assert!(t.wait_state(&hog, ContainerState::Exited).await);
        let rec = t.stored(&hog).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (137, "OOMKilled"));
    }

    #[tokio::test]
    async fn a_shim_dead_without_an_exit_record_should_have_its_container_killed() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        t.host.kill_shim(&id);
        assert!(t.wait_state(&id, ContainerState::Exited).await);
        let rec = t.stored(&id).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (255, "Unknown"));
        assert!(rec.message.contains("without recording"), "{}", rec.message);
        assert!(t.host.calls().contains(&Call::OciKill {
            id: id.clone(),
            signal: libc::SIGKILL,
            all: true
        }));
    }

    #[tokio::test]
    async fn an_unreadable_exit_record_should_be_read_again_and_no_exit_made_up() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        let bundle = t.stored(&id).expect("record").bundle;
        t.host.clear_calls();
        t.host.exit(&id, ExitFile::Unreadable);
        // The first try fails: the container is left as it was.
        tokio::time::sleep(RETRY_FIRST / 2).await;
        assert_eq!(t.state(&id), Some(ContainerState::Running));
        assert_eq!(
            t.stored(&id).expect("record").state,
            ContainerState::Running
        );
        // The record becomes readable: the real exit is recorded.
        t.host.rewrite_exit(&bundle, ExitFile::Code(7));
        assert!(t.wait_state(&id, ContainerState::Exited).await);
        let rec = t.stored(&id).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (7, "Error"));
        assert!(!killed(&t.host.calls(), &id), "{:?}", t.host.calls());
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_record_that_stays_unreadable_should_be_recorded_unknown_once_stopped() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        t.host.clear_calls();
        t.host.exit(&id, ExitFile::Corrupt);
        assert!(t.wait_state(&id, ContainerState::Exited).await);
        let rec = t.stored(&id).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (255, "Unknown"));
        assert!(rec.message.contains("corrupt"), "{}", rec.message);
        let calls = t.host.calls();
        assert!(calls.contains(&Call::OciState(id.clone())), "{calls:?}");
        assert!(!killed(&calls, &id), "{calls:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreadable_exit_record_should_not_end_a_container_the_oci_runtime_sees_running() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        let bundle = t.stored(&id).expect("record").bundle;
        // The shim is gone and its record unreadable, yet runc sees the
        // container running (its state cannot be trusted either way).
        t.host.rewrite_exit(&bundle, ExitFile::Unreadable);
        t.host.kill_shim(&id);
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(t.state(&id), Some(ContainerState::Running));
        let calls = t.host.calls();
        assert!(calls.contains(&Call::OciState(id.clone())), "{calls:?}");
        assert!(!killed(&calls, &id), "{calls:?}");
    }

    #[tokio::test]
    async fn a_failed_wait_for_the_shim_should_not_leave_the_exit_unrecorded() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        t.host.fail(Fault::WaitExit, u32::MAX);
        let id = t.run(&pod, "c").await;
        t.host.exit(&id, ExitFile::Code(0));
        assert!(t.wait_state(&id, ContainerState::Exited).await);
        let rec = t.stored(&id).expect("record");
        assert_eq!((rec.exit_code, rec.reason.as_str()), (0, "Completed"));
    }

    #[tokio::test]
    async fn a_wait_that_fails_once_should_be_made_again() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        t.host.fail(Fault::WaitExit, 1);
        let id = t.run(&pod, "c").await;
        // Past the first look: the watch is a wait again.
        tokio::time::sleep(RECHECK_FIRST * 3).await;
        t.host.exit(&id, ExitFile::Code(1));
        assert!(t.wait_state(&id, ContainerState::Exited).await);
        assert_eq!(t.stored(&id).expect("record").exit_code, 1);
    }

    #[tokio::test]
    async fn an_evicted_containers_exit_should_keep_its_reason() {
        let t = TestRuntime::new();
        let pod = t.pod("p").await;
        let id = t.run(&pod, "c").await;
        let c = t.rt.state.container(&id).expect("container");
        let mut rec = c.record();
        rec.reason = crate::nri::host::EVICTED_REASON.to_string();
        rec.message = "evicted by a plugin".to_string();
        t.rt.save_container(&c, rec).expect("save");
        t.host.exit(&id, ExitFile::Code(137));
        assert!(t.wait_state(&id, ContainerState::Exited).await);
        let rec = t.stored(&id).expect("record");
        assert_eq!(rec.reason, crate::nri::host::EVICTED_REASON);
        assert_eq!(rec.message, "evicted by a plugin");
        assert_eq!(rec.exit_code, 137);
    }
}
