//! Leadership metrics (Pinterest's leadership-switch phases): whether this
//! candidate leads, how terms begin and end, how long the lock was seen
//! without a leader, and the ramp-up from becoming leader to the first
//! reconcile.

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// Why a term began or ended (the `event` label of
/// `leader_election_transitions`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // label values as Prometheus shows them
pub(crate) enum TermEnd {
    /// Became leader.
    acquired,
    /// Gave the lock up on shutdown.
    released,
    /// Could not renew within the renew deadline.
    fenced,
    /// Found the lock held by someone else, or gone.
    lost,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EventLabel {
    event: TermEnd,
}

/// One candidate's leadership metrics. Cheap to clone (handles share the
/// values).
#[derive(Debug, Clone)]
pub struct LeaderMetrics {
    is_leader: Gauge,
    transitions: Family<EventLabel, Counter>,
    leaderless: Histogram,
    ramp_up: Histogram,
}

impl Default for LeaderMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// 10 ms to ~160 s, doubling: handovers range from milliseconds
/// (released) to a lease duration and more (crash, backoff).
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

impl LeaderMetrics {
    /// Fresh, unregistered metrics.
    pub fn new() -> Self {
        Self {
            is_leader: Gauge::default(),
            transitions: Family::default(),
            leaderless: seconds_histogram(),
            ramp_up: seconds_histogram(),
        }
    }

    /// Registers the metrics with the label `name=<name>` (the lock's name,
    /// as client-go's `leader_election_master_status` does).
    pub fn register(&self, registry: &mut Registry, name: &str) {
        let r = registry.sub_registry_with_label(("name".into(), name.to_owned().into()));
        r.register(
            "leader_election_is_leader",
            "1 while this candidate leads, else 0",
            self.is_leader.clone(),
        );
        r.register(
            "leader_election_transitions",
            "Terms of this candidate begun (event=acquired) and ended (released, fenced, lost)",
            self.transitions.clone(),
        );
        r.register_with_unit(
            "leader_election_leaderless",
            "Episodes this candidate observed the lock without a valid holder, from first seeing it free to seeing or taking a new holder",
            Unit::Seconds,
            self.leaderless.clone(),
        );
        r.register_with_unit(
            "leader_election_ramp_up",
            "From becoming leader to the controller's first reconcile of the term",
            Unit::Seconds,
            self.ramp_up.clone(),
        );
    }

    /// Whether the gauge says this candidate leads.
    pub fn is_leader(&self) -> bool {
        self.is_leader.get() == 1
    }

    /// How many terms ended (or began) for this reason.
    #[cfg(test)]
    pub(crate) fn count(&self, event: TermEnd) -> u64 {
        self.transitions.get_or_create(&EventLabel { event }).get()
    }

    pub(crate) fn started_leading(&self) {
        self.is_leader.set(1);
        self.transitions
            .get_or_create(&EventLabel {
                event: TermEnd::acquired,
            })
            .inc();
    }

    pub(crate) fn stopped_leading(&self, why: TermEnd) {
        self.is_leader.set(0);
        self.transitions
            .get_or_create(&EventLabel { event: why })
            .inc();
    }

    pub(crate) fn leaderless(&self, d: Duration) {
        self.leaderless.observe(d.as_secs_f64());
    }

    pub(crate) fn ramp_up(&self, d: Duration) {
        self.ramp_up.observe(d.as_secs_f64());
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn leader_metrics_should_encode_with_name_label() {
        let m = LeaderMetrics::new();
        let mut reg = Registry::default();
        m.register(&mut reg, "lock-a");
        m.started_leading();
        m.ramp_up(Duration::from_millis(30));
        m.stopped_leading(TermEnd::fenced);
        m.leaderless(Duration::from_millis(300));
        let mut out = String::new();
        encode(&mut out, &reg).expect("encodes to a string");
        assert!(
            out.contains("leader_election_is_leader{name=\"lock-a\"} 0"),
            "{out}"
        );
        assert!(
            out.contains("leader_election_transitions_total{name=\"lock-a\",event=\"fenced\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("leader_election_ramp_up_seconds_count{name=\"lock-a\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("leader_election_leaderless_seconds_sum{name=\"lock-a\"} 0.3"),
            "{out}"
        );
        assert_eq!(m.count(TermEnd::acquired), 1);
    }
}
