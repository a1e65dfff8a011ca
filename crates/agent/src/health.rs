//! The agent's health as `/healthz` reports it: the PLEG must have relisted
//! successfully within its threshold, and the runtime must answer.
//!
//! While the runtime's event stream is connected, relists are only a
//! safety net (every `event_relist_period`), so the threshold grows by that
//! period: the PLEG is healthy between safety-net relists, and still
//! reported when they keep failing.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shared health state, written by the PLEG and the runtime watcher.
#[derive(Debug)]
pub struct Health {
    relist_threshold: Duration,
    started: Instant,
    last_relist: Mutex<Option<Instant>>,
    runtime_error: Mutex<Option<String>>,
    /// The safety-net relist period while the event stream is connected.
    event_stream: Mutex<Option<Duration>>,
}

impl Health {
    /// Unhealthy when no relist succeeded for `relist_threshold`.
    pub fn new(relist_threshold: Duration) -> Self {
        Self {
            relist_threshold,
            started: Instant::now(),
            last_relist: Mutex::new(None),
            runtime_error: Mutex::new(None),
            event_stream: Mutex::new(None),
        }
    }

    /// Records a successful relist.
    pub fn relisted(&self) {
        *self.last_relist.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// Records whether the runtime answers (None: it does).
    pub fn set_runtime_error(&self, error: Option<String>) {
        *self.runtime_error.lock().unwrap_or_else(|p| p.into_inner()) = error;
    }

    /// Records whether the PLEG's event stream is connected: `Some(period)`
    /// (the safety-net relist period) while it is, `None` otherwise.
    pub fn set_event_stream(&self, safety_net_period: Option<Duration>) {
        *self.event_stream.lock().unwrap_or_else(|p| p.into_inner()) = safety_net_period;
    }

    /// The relist threshold in force now.
    fn threshold(&self) -> Duration {
        let extra = *self.event_stream.lock().unwrap_or_else(|p| p.into_inner());
        self.relist_threshold + extra.unwrap_or_default()
    }

    /// Ok, or the reasons the agent is unhealthy.
    pub fn check(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        let last = *self.last_relist.lock().unwrap_or_else(|p| p.into_inner());
        let since = last.unwrap_or(self.started).elapsed();
        let threshold = self.threshold();
        if since > threshold {
            problems.push(format!(
                "pleg was last seen active {:.1?} ago; threshold is {:?}",
                since, threshold
            ));
        }
        if let Some(e) = self
            .runtime_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            problems.push(format!("container runtime is down: {e}"));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_should_report_stale_relists_and_runtime_errors() {
        let h = Health::new(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(20));
        assert!(h.check().is_err());
        h.relisted();
        assert!(h.check().is_ok());
        h.set_runtime_error(Some("connection refused".into()));
        let e = h.check().err().unwrap_or_default();
        assert!(e[0].contains("runtime is down"), "{e:?}");
        h.set_runtime_error(None);
        assert!(h.check().is_ok());
    }

    #[test]
    fn health_should_extend_the_threshold_while_the_event_stream_is_connected() {
        let h = Health::new(Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(20));
        assert!(h.check().is_err());
        h.set_event_stream(Some(Duration::from_secs(300)));
        assert!(h.check().is_ok());
        h.set_event_stream(None);
        assert!(h.check().is_err());
    }
}
