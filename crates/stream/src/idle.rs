//! Closing connections on which nothing moved for a while (kubelet's
//! stream idle timeout): readers and writers mark activity; a timer task
//! fires a token once the connection has been idle for the timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A connection's last activity.
pub(crate) struct Activity {
    base: Instant,
    /// Milliseconds after `base`.
    last: AtomicU64,
}

impl Activity {
    /// Something was read or written.
    pub(crate) fn touch(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last.store(ms, Ordering::Relaxed);
    }
}

/// Starts watching a connection: the returned token fires after `timeout`
/// without activity (never, without a timeout). The watch ends with `done`.
pub(crate) fn watch(
    timeout: Option<Duration>,
    done: CancellationToken,
) -> (Arc<Activity>, CancellationToken) {
    let activity = Arc::new(Activity {
        base: Instant::now(),
        last: AtomicU64::new(0),
    });
    let expired = CancellationToken::new();
    if let Some(timeout) = timeout {
        let (a, e) = (activity.clone(), expired.clone());
        tokio::spawn(async move {
            loop {
                let last = Duration::from_millis(a.last.load(Ordering::Relaxed));
                tokio::select! {
                    _ = tokio::time::sleep_until(a.base + last + timeout) => {}
                    _ = done.cancelled() => return,
                }
                let last = Duration::from_millis(a.last.load(Ordering::Relaxed));
                if a.base.elapsed() >= last + timeout {
                    tracing::debug!(?timeout, "closing an idle streaming connection");
                    e.cancel();
                    return;
                }
            }
        });
    }
    (activity, expired)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_only_after_a_quiet_timeout() {
        let done = CancellationToken::new();
        let (a, expired) = watch(Some(Duration::from_secs(10)), done.clone());
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            a.touch();
            assert!(!expired.is_cancelled(), "active connection cut");
        }
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(expired.is_cancelled());
        let (_, never) = watch(None, done.clone());
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!never.is_cancelled());
        done.cancel();
    }
}
