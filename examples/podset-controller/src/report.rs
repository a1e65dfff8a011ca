//! The samples' stdout protocol (the same as the reference's), one line per
//! event, times in Unix nanoseconds:
//!
//! ```text
//! leading <t>
//! first-reconcile <t>
//! reconciled <namespace>/<name> <generation> <changed-at> <t>
//! stopped-leading <t>
//! ```

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix nanoseconds.
pub fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Writes the protocol's lines; one per event, whole lines only.
pub struct Reporter {
    out: Mutex<Box<dyn Write + Send>>,
    /// Leading, and first-reconcile not printed yet in this term.
    first_pending: AtomicBool,
    /// `namespace/name` → the last changed-at stamp printed.
    last_stamp: Mutex<HashMap<String, String>>,
    clock: fn() -> i64,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter").finish_non_exhaustive()
    }
}

impl Reporter {
    /// A reporter on stdout.
    pub fn stdout() -> Self {
        Self::new(Box::new(std::io::stdout()), unix_nanos)
    }

    /// A reporter on `out` with `clock` (tests).
    pub fn new(out: Box<dyn Write + Send>, clock: fn() -> i64) -> Self {
        Self {
            out: Mutex::new(out),
            first_pending: AtomicBool::new(false),
            last_stamp: Mutex::new(HashMap::new()),
            clock,
        }
    }

    fn line(&self, text: std::fmt::Arguments<'_>) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        // The protocol is best effort: a closed stdout must not stop the
        // controller.
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }

    /// This replica became the leader.
    pub fn leading(&self) {
        self.first_pending.store(true, Ordering::Release);
        self.line(format_args!("leading {}", (self.clock)()));
    }

    /// Called at the start of every reconcile: the first one of a term is
    /// reported. Returns whether this was it.
    pub fn reconcile_started(&self) -> bool {
        let first = self.first_pending.swap(false, Ordering::AcqRel);
        if first {
            self.line(format_args!("first-reconcile {}", (self.clock)()));
        }
        first
    }

    /// A reconcile of `key` at `generation` finished; prints the change's
    /// stamp (`changed_at`, if a valid integer) once per stamp.
    pub fn reconciled(&self, key: &str, generation: i64, changed_at: Option<&str>) {
        let Some(stamp) = changed_at.filter(|s| s.parse::<i64>().is_ok()) else {
            return;
        };
        let seen = {
            let mut last = self.last_stamp.lock().unwrap_or_else(|p| p.into_inner());
            last.insert(key.to_string(), stamp.to_string()).as_deref() == Some(stamp)
        };
        if !seen {
            self.line(format_args!(
                "reconciled {key} {generation} {stamp} {}",
                (self.clock)()
            ));
        }
    }

    /// Leadership lost or given up.
    pub fn stopped_leading(&self) {
        self.first_pending.store(false, Ordering::Release);
        self.line(format_args!("stopped-leading {}", (self.clock)()));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    /// A `Write` whose bytes the test can read.
    #[derive(Clone, Default)]
    pub(crate) struct Buf(pub(crate) Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        pub(crate) fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
        }
    }

    #[test]
    fn reporter_should_print_each_stamp_once_and_the_first_reconcile_per_term() {
        let buf = Buf::default();
        let r = Reporter::new(Box::new(buf.clone()), || 7);
        assert!(!r.reconcile_started(), "not leading yet");
        r.leading();
        assert!(r.reconcile_started());
        assert!(!r.reconcile_started());
        r.reconciled("ns/a", 1, Some("100"));
        r.reconciled("ns/a", 1, Some("100"));
        r.reconciled("ns/a", 2, Some("200"));
        r.reconciled("ns/b", 1, Some("100"));
        r.reconciled("ns/b", 1, Some("not-a-number"));
        r.reconciled("ns/b", 1, None);
        r.stopped_leading();
        assert_eq!(
            buf.text(),
            "leading 7\nfirst-reconcile 7\nreconciled ns/a 1 100 7\nreconciled ns/a 2 200 7\n\
             reconciled ns/b 1 100 7\nstopped-leading 7\n"
        );
    }
}
