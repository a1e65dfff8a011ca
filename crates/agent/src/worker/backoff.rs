//! Crash-loop backoff, per pod and container name: 10 s doubling to 5 min
//! (kubelet's figures), forgotten once a container has run for 10 minutes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A container that ran at least this long before exiting resets its
/// backoff (kubelet: twice the maximum backoff).
pub const RESET_AFTER: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The delay to apply after the next exit.
    delay: Duration,
    /// No restart before this.
    not_before: Instant,
}

/// Backoff state of every container the agent restarts.
#[derive(Debug)]
pub struct CrashBackoff {
    initial: Duration,
    max: Duration,
    entries: Mutex<HashMap<(String, String), Entry>>,
}

impl CrashBackoff {
    /// Backoff from `initial` doubling up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long the restart of `uid/name` must still wait, given that the
    /// previous instance ran for `ran` and finished at `finished`
    /// (None: may restart now).
    pub fn remaining(
        &self,
        uid: &str,
        name: &str,
        ran: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let mut g = self.lock();
        let key = (uid.to_string(), name.to_string());
        if ran >= RESET_AFTER {
            g.remove(&key);
            return None;
        }
        let e = g.get(&key)?;
        e.not_before
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
    }

    /// Records a restart of `uid/name` at `now`; the next one waits the
    /// current delay, which then doubles.
    pub fn restarted(&self, uid: &str, name: &str, now: Instant) {
        let mut g = self.lock();
        let key = (uid.to_string(), name.to_string());
        let delay = g.get(&key).map_or(self.initial, |e| e.delay);
        g.insert(
            key,
            Entry {
                delay: (delay * 2).min(self.max),
                not_before: now + delay,
            },
        );
    }

    /// The delay the next restart of `uid/name` would wait.
    pub fn current_delay(&self, uid: &str, name: &str) -> Duration {
        self.lock()
            .get(&(uid.to_string(), name.to_string()))
            .map_or(self.initial, |e| e.delay / 2)
    }

    /// Forgets `uid/name` (it succeeded).
    pub fn forget(&self, uid: &str, name: &str) {
        self.lock().remove(&(uid.to_string(), name.to_string()));
    }

    /// Forgets everything about the pod `uid`.
    pub fn forget_pod(&self, uid: &str) {
        self.lock().retain(|(u, _), _| u != uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_should_double_to_the_cap_and_reset_after_a_long_run() {
        let b = CrashBackoff::new(Duration::from_secs(10), Duration::from_secs(40));
        let t0 = Instant::now();
        let short = Duration::from_secs(1);
        assert_eq!(b.remaining("u", "c", short, t0), None);
        b.restarted("u", "c", t0);
        assert_eq!(
            b.remaining("u", "c", short, t0),
            Some(Duration::from_secs(10))
        );
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(b.remaining("u", "c", short, t1), None);
        b.restarted("u", "c", t1);
        assert_eq!(
            b.remaining("u", "c", short, t1),
            Some(Duration::from_secs(20))
        );
        let t2 = t1 + Duration::from_secs(20);
        b.restarted("u", "c", t2);
        assert_eq!(
            b.remaining("u", "c", short, t2),
            Some(Duration::from_secs(40))
        );
        let t3 = t2 + Duration::from_secs(40);
        b.restarted("u", "c", t3);
        assert_eq!(
            b.remaining("u", "c", short, t3),
            Some(Duration::from_secs(40))
        );
        // Another container is independent.
        assert_eq!(b.remaining("u", "d", short, t3), None);
        // A long run resets.
        assert_eq!(b.remaining("u", "c", RESET_AFTER, t3), None);
        b.restarted("u", "c", t3);
        assert_eq!(
            b.remaining("u", "c", short, t3),
            Some(Duration::from_secs(10))
        );
        b.forget("u", "c");
        assert_eq!(b.remaining("u", "c", short, t3), None);
        b.restarted("u", "c", t3);
        b.forget_pod("u");
        assert_eq!(b.remaining("u", "c", short, t3), None);
    }
}
