//! StopContainer, and the handling of every container exit.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use petrel_cri::api;
use tokio::sync::watch;

use crate::container::shim;
use crate::error::{Result, RuntimeError};
use crate::records::ContainerState;
use crate::service::Runtime;
use crate::state::Container;
use crate::util;

/// How long a container may take to die after SIGKILL before the stop is
/// reported as failed (it is uninterruptible in the kernel, or its shim is
/// gone).
const KILL_WAIT: Duration = Duration::from_secs(10);

/// How long after an exit runc's record of the container is deleted.
const CLEANUP_DELAY: Duration = Duration::from_millis(20);

/// Waits for a container sent SIGKILL to exit, up to [`KILL_WAIT`].
async fn await_kill(c: &Container, mut exited: watch::Receiver<bool>) -> Result<()> {
    if tokio::time::timeout(KILL_WAIT, exited.wait_for(|v| *v))
        .await
        .is_ok()
    {
        Ok(())
    } else {
        Err(RuntimeError::DeadlineExceeded(format!(
            "container {} did not exit within {KILL_WAIT:?} of SIGKILL",
            c.id
        )))
    }
}

/// Parses an image's StopSignal ("SIGTERM", "TERM", "15"); SIGTERM by default.
pub(crate) fn parse_signal(s: &str) -> Option<i32> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let name = s.trim_start_matches("SIG");
    Some(match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "WINCH" => libc::SIGWINCH,
        "PWR" => libc::SIGPWR,
        _ => return None,
    })
}

impl Runtime {
    /// StopContainer.
    pub(crate) async fn stop_container(
        self: &Arc<Self>,
        req: api::StopContainerRequest,
    ) -> Result<api::StopContainerResponse> {
        let c = self.container(&req.container_id)?;
        self.stop_container_inner(&c, req.timeout.max(0)).await?;
        Ok(api::StopContainerResponse {})
    }

    fn stop_signal(&self, c: &Container) -> i32 {
        let image_id = c.with(|r| r.image_id.clone());
        self.images
            .get(&image_id)
            .and_then(|i| {
                i.config
                    .config()
                    .as_ref()
                    .and_then(|c| c.stop_signal().clone())
            })
            .and_then(|s| parse_signal(&s))
            .unwrap_or(libc::SIGTERM)
    }

    /// Stops a container: its stop signal, then SIGKILL after `timeout`
    /// seconds (at once when 0). Returns once the exit is recorded.
    pub(crate) async fn stop_container_inner(
        &self,
        c: &Arc<Container>,
        timeout: i64,
    ) -> Result<()> {
        let mut exited = c.exit_watch();
        let state = c.state();
        if state == ContainerState::Exited || *exited.borrow() {
            return Ok(());
        }
        if timeout > 0 && state == ContainerState::Running {
            let sig = self.stop_signal(c);
            self.signal_init(c, sig).await;
            let wait = Duration::from_secs(u64::try_from(timeout).unwrap_or(0));
            if tokio::time::timeout(wait, exited.wait_for(|v| *v))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tracing::info!(container.id = %c.id, timeout, "container ignored its stop signal; killing it");
        }
        self.kill_all(c).await;
        await_kill(c, exited).await
    }

    /// Stops containers with SIGKILL, as a pod stop does: every one is
    /// killed before any is waited for, so that their exits overlap.
    pub(crate) async fn kill_containers(&self, containers: &[Arc<Container>]) -> Result<()> {
        let mut killed = Vec::with_capacity(containers.len());
        for c in containers {
            let exited = c.exit_watch();
            if c.state() == ContainerState::Exited || *exited.borrow() {
                continue;
            }
            self.kill_all(c).await;
            killed.push((c, exited));
        }
        for (c, exited) in killed {
            await_kill(c, exited).await?;
        }
        Ok(())
    }

    /// Sends `signal` to the container's init. Directly by pidfd when its
    /// identity is known (no runc process to start), else through runc.
    async fn signal_init(&self, c: &Container, signal: i32) {
        let (pid, start_time) = c.with(|r| (r.pid, r.init_start_time));
        if start_time != 0 {
            match util::signal_process(pid, start_time, signal) {
                Ok(_) => return,
                Err(e) => {
                    tracing::debug!(container.id = %c.id, error = %e, "direct signal failed; asking runc")
                }
            }
        }
        if let Err(e) = self.runc.kill(&c.id, signal, false).await {
            tracing::debug!(container.id = %c.id, error = %e, "signal not delivered");
        }
    }

    /// SIGKILL to every process of the container, even a PID 1 without
    /// handlers. With a PID namespace of its own, killing init is enough (the
    /// kernel kills the rest of the namespace); otherwise runc signals every
    /// process in the container's cgroup.
    async fn kill_all(&self, c: &Container) {
        if c.with(|r| r.own_pid_ns) {
            self.signal_init(c, libc::SIGKILL).await;
        } else if let Err(e) = self.runc.kill(&c.id, libc::SIGKILL, true).await {
            tracing::debug!(container.id = %c.id, error = %e, "SIGKILL not delivered");
        }
    }

    /// Watches a container's shim and records the exit when it comes.
    pub(crate) fn watch_exit(self: &Arc<Self>, c: Arc<Container>, pidfd: OwnedFd) {
        let (pid, start_time) = c.with(|r| (r.pid, r.init_start_time));
        match crate::container::mount_ns::hold(pid, start_time) {
            Ok(ns) => c.hold_mount_namespace(ns),
            Err(e) => {
                tracing::debug!(container.id = %c.id, error = %e, "mount namespace not held")
            }
        }
        let rt = self.clone();
        tokio::spawn(async move {
            if let Err(e) = shim::wait_exit(pidfd).await {
                tracing::error!(container.id = %c.id, error = %e, "cannot watch shim; exit will be noticed at restart");
                return;
            }
            rt.handle_exit(&c).await;
        });
    }

    /// Records a container's exit: reads the shim's exit record, decides the
    /// reason, publishes STOPPED, commits, then cleans runc's state.
    pub(crate) async fn handle_exit(self: &Arc<Self>, c: &Arc<Container>) {
        let _op = c.op.lock().await;
        // Removed meanwhile (a created container deleted by force).
        if !self
            .state
            .container(&c.id)
            .is_some_and(|cur| Arc::ptr_eq(&cur, c))
        {
            return;
        }
        let mut rec = c.record();
        if rec.state == ContainerState::Exited {
            return;
        }
        // An eviction's reason outlives the exit it causes.
        let evicted = (rec.reason == crate::nri::host::EVICTED_REASON)
            .then(|| std::mem::take(&mut rec.message));
        match shim::read_exit(&rec.bundle) {
            Some(exit) => {
                rec.exit_code = exit.exit_code;
                rec.finished_at = exit.exited_at_ns;
                rec.reason = if exit.exit_code == 0 {
                    "Completed"
                } else {
                    "Error"
                }
                .to_string();
                if exit.exit_code == 128 + libc::SIGKILL
                    && self.cgroups.oom_kill_count(&rec.cgroup_path).unwrap_or(0) > 0
                {
                    rec.reason = "OOMKilled".to_string();
                }
            }
            None => {
                // The shim died without recording the exit: the container
                // cannot be watched any more. Make sure it is dead.
                let _ = self.runc.kill(&rec.id, libc::SIGKILL, true).await;
                rec.exit_code = 255;
                rec.finished_at = util::now_ns();
                rec.reason = "Unknown".to_string();
                rec.message = "the container's shim exited without recording its exit".to_string();
                tracing::warn!(container.id = %rec.id, "shim exited without an exit record");
            }
        }
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
        if let Err(e) = self
            .store
            .put(petrel_store::Table::Containers, &rec.id, &rec)
        {
            tracing::error!(container.id = %rec.id, error = %e, "exit not committed; recovery will read it again");
        }
        self.nri_stopped(c);
        // runc's record of a stopped container only holds its cgroup; drop
        // it a little later, so that starting runc does not compete with the
        // event on its way out. A removal that comes first does it instead.
        //
        // Before the cgroup goes, uncharge what the container left in it
        // (page cache), or it lives on in the kernel as a dying cgroup. Only
        // here, never on a CRI call's path: it can take long on a busy host,
        // and a RemoveContainer deleting the cgroup meanwhile would wait for
        // it (removing a cgroup waits for writes to its files). A container
        // removed within CLEANUP_DELAY of its exit is not uncharged.
        let rt = self.clone();
        let c = c.clone();
        let cgroup = rec.cgroup_path.clone();
        tokio::spawn(async move {
            tokio::time::sleep(CLEANUP_DELAY).await;
            let mut deleted = c.runc_deleted.lock().await;
            if *deleted {
                return;
            }
            let cgroups = rt.cgroups.clone();
            let id = c.id.clone();
            let mount_ns = c.release_mount_namespace();
            let _ = tokio::task::spawn_blocking(move || {
                // The kernel tears the namespace down here.
                drop(mount_ns);
                if let Err(e) = cgroups.release_memory(&cgroup) {
                    tracing::debug!(container.id = %id, error = %e, "container memory not released");
                }
            })
            .await;
            match rt.runc.delete(&c.id, true).await {
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
    use super::*;

    #[test]
    fn parse_signal_should_accept_names_and_numbers() {
        assert_eq!(parse_signal("SIGTERM"), Some(libc::SIGTERM));
        assert_eq!(parse_signal("QUIT"), Some(libc::SIGQUIT));
        assert_eq!(parse_signal("9"), Some(9));
        assert_eq!(parse_signal("0"), None);
        assert_eq!(parse_signal("SIGBOGUS"), None);
        assert_eq!(parse_signal(""), None);
    }
}
