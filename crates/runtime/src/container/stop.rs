//! Stopping containers: the stop signal, then SIGKILL after a grace period
//! (StopContainer, evictions), or SIGKILL to many at once (pod stops). The
//! exits they cause are recorded by `container::exit`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Result, RuntimeError};
use crate::records::ContainerState;
use crate::service::Runtime;
use crate::state::Container;
use crate::util;

/// How long a container may take to die after SIGKILL before the stop is
/// reported as failed (it is uninterruptible in the kernel, or its shim is
/// gone).
const KILL_WAIT: Duration = Duration::from_secs(10);

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

/// Whether the container has a process to stop: not a created one before
/// its start.
fn has_process(c: &Container) -> bool {
    c.with(|r| r.state != ContainerState::Created || r.in_oci_runtime())
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
    /// seconds (at once when 0). Returns once the exit is recorded. A
    /// created container without a process is left as it is (containerd
    /// stops only running containers).
    pub(crate) async fn container_stop(&self, c: &Arc<Container>, timeout: i64) -> Result<()> {
        let mut exited = c.exit_watch();
        let state = c.state();
        if state == ContainerState::Exited || *exited.borrow() || !has_process(c) {
            return Ok(());
        }
        c.ask_stop();
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
    pub(crate) async fn containers_kill(&self, containers: &[Arc<Container>]) -> Result<()> {
        let mut killed = Vec::with_capacity(containers.len());
        for c in containers {
            let exited = c.exit_watch();
            if c.state() == ContainerState::Exited || *exited.borrow() || !has_process(c) {
                continue;
            }
            c.ask_stop();
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
        if let Err(e) = self.oci.kill(&c.id, signal, false).await {
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
        } else if let Err(e) = self.oci.kill(&c.id, libc::SIGKILL, true).await {
            tracing::debug!(container.id = %c.id, error = %e, "SIGKILL not delivered");
        }
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
