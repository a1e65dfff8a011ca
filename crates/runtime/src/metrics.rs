//! The runtime's metrics, in the Prometheus text format.
//!
//! Operation counters and latencies follow kubelet's runtime_operations_*
//! shape (label `operation_type`) under the `petrel_runtime_` prefix; event
//! counters say how many lifecycle events were published and how many were
//! lost by subscribers that fell behind.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::events::MailboxStats;

/// Labels of per-operation metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The CRI call, e.g. `CreateContainer`.
    pub operation_type: String,
}

/// Labels of per-state gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// The object's state.
    pub state: String,
}

/// Every metric of the runtime.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    ops: Family<OpLabels, Counter>,
    op_errors: Family<OpLabels, Counter>,
    op_duration: Family<OpLabels, Histogram>,
    /// Counters shared with the event mailbox.
    pub events: MailboxStats,
    /// Live event subscribers.
    pub subscribers: Gauge,
    /// Containers by state.
    pub containers: Family<StateLabels, Gauge>,
    /// Pod sandboxes by state.
    pub sandboxes: Family<StateLabels, Gauge>,
    /// NRI's (`petrel_runtime_nri_*`).
    pub nri: crate::nri::NriMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("petrel_runtime");
        let ops = Family::<OpLabels, Counter>::default();
        let op_errors = Family::<OpLabels, Counter>::default();
        let op_duration = Family::<OpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let events = MailboxStats::default();
        let subscribers = Gauge::default();
        let containers = Family::<StateLabels, Gauge>::default();
        let sandboxes = Family::<StateLabels, Gauge>::default();
        registry.register("operations", "CRI operations served", ops.clone());
        registry.register(
            "operations_errors",
            "CRI operations that failed",
            op_errors.clone(),
        );
        registry.register(
            "operations_duration_seconds",
            "Latency of CRI operations",
            op_duration.clone(),
        );
        registry.register(
            "events_published",
            "Lifecycle events offered to subscribers",
            events.published.clone(),
        );
        registry.register(
            "events_dropped",
            "Lifecycle events lost because a subscriber's queue was full",
            events.dropped.clone(),
        );
        registry.register(
            "event_subscriber_overflows",
            "Event subscribers cut off for falling behind",
            events.overflows.clone(),
        );
        registry.register(
            "event_subscribers",
            "Live event subscribers",
            subscribers.clone(),
        );
        registry.register("containers", "Containers by state", containers.clone());
        registry.register("sandboxes", "Pod sandboxes by state", sandboxes.clone());
        let nri = crate::nri::NriMetrics::default();
        nri.register(&mut registry);
        Self {
            registry,
            ops,
            op_errors,
            op_duration,
            events,
            subscribers,
            containers,
            sandboxes,
            nri,
        }
    }

    /// Records one served operation.
    pub fn observe(&self, op: &'static str, took: Duration, failed: bool) {
        let l = OpLabels {
            operation_type: op.to_string(),
        };
        self.ops.get_or_create(&l).inc();
        if failed {
            self.op_errors.get_or_create(&l).inc();
        }
        self.op_duration
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
