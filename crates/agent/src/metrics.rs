//! The agent's metrics, with kubelet's names (prefix `kubelet_`) so existing
//! dashboards and alerts work, plus the work queue's `workqueue_*` family.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Label `operation_type` (the CRI call).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// e.g. `create_container`.
    pub operation_type: String,
}

/// Label `container_state` of kubelet_running_containers.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerStateLabels {
    /// `running`, `exited`, `created`, `unknown`.
    pub container_state: String,
}

/// Label `eviction_signal` of the eviction metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// e.g. `memory.available`.
    pub eviction_signal: String,
}

/// Every metric the agent exports. Cheap to clone (all handles).
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    /// kubelet_pleg_relist_duration_seconds.
    pub pleg_relist_duration: Histogram,
    /// kubelet_pleg_relist_interval_seconds.
    pub pleg_relist_interval: Histogram,
    /// kubelet_pleg_last_seen_seconds: unix time of the last successful
    /// relist.
    pub pleg_last_seen: Gauge<f64, AtomicU64>,
    /// kubelet_pleg_discard_events. Counts, but exposed as a gauge: an
    /// OpenMetrics counter must end in `_total`, and dashboards written for
    /// kubelet use the name without it. Always 0: the PLEG hands its events
    /// straight to the work queue, which drops none (kept for dashboards
    /// written for kubelet).
    pub pleg_discard_events: Gauge,
    /// kubelet_evented_pleg_connection_error_count (a gauge, as above).
    pub evented_pleg_connection_errors: Gauge,
    /// kubelet_evented_pleg_connection_success_count (a gauge, as above).
    pub evented_pleg_connection_successes: Gauge,
    /// kubelet_evented_pleg_connection_latency_seconds: event created_at
    /// to receipt.
    pub evented_pleg_connection_latency: Histogram,
    /// kubelet_running_pods.
    pub running_pods: Gauge,
    /// kubelet_running_containers{container_state}.
    pub running_containers: Family<ContainerStateLabels, Gauge>,
    /// kubelet_runtime_operations_total{operation_type}.
    pub runtime_operations: Family<OperationLabels, Counter>,
    /// kubelet_runtime_operations_duration_seconds{operation_type}.
    pub runtime_operations_duration: Family<OperationLabels, Histogram>,
    /// kubelet_runtime_operations_errors_total{operation_type}.
    pub runtime_operations_errors: Family<OperationLabels, Counter>,
    /// kubelet_pod_start_duration_seconds: pod first seen to all
    /// containers running.
    pub pod_start_duration: Histogram,
    /// kubelet_evictions{eviction_signal}: pods evicted per signal (a
    /// gauge that only grows, to keep kubelet's name without `_total`).
    pub evictions: Family<EvictionLabels, Gauge>,
    /// kubelet_eviction_stats_age_seconds{eviction_signal}: age of the
    /// statistics an eviction was decided on.
    pub eviction_stats_age: Family<EvictionLabels, Histogram>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentMetrics {
    /// Creates the metrics (unregistered).
    pub fn new() -> Self {
        Self {
            pleg_relist_duration: Histogram::new(exponential_buckets(0.005, 2.0, 12)),
            pleg_relist_interval: Histogram::new(exponential_buckets(0.005, 2.0, 16)),
            pleg_last_seen: Gauge::default(),
            pleg_discard_events: Gauge::default(),
            evented_pleg_connection_errors: Gauge::default(),
            evented_pleg_connection_successes: Gauge::default(),
            evented_pleg_connection_latency: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            running_pods: Gauge::default(),
            running_containers: Family::default(),
            runtime_operations: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0005, 2.0, 16))
            }),
            runtime_operations_errors: Family::default(),
            pod_start_duration: Histogram::new(exponential_buckets(0.05, 2.0, 12)),
            evictions: Family::default(),
            eviction_stats_age: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
        }
    }

    /// Registers everything under kubelet's names in `registry` (which
    /// should have no prefix; the `kubelet_` prefix is added here).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("kubelet");
        r.register(
            "pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG",
            self.pleg_relist_duration.clone(),
        );
        r.register(
            "pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG",
            self.pleg_relist_interval.clone(),
        );
        r.register(
            "pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active",
            self.pleg_last_seen.clone(),
        );
        r.register(
            "pleg_discard_events",
            "The number of discard events in PLEG",
            self.pleg_discard_events.clone(),
        );
        r.register(
            "evented_pleg_connection_error_count",
            "The number of errors encountered while establishing the event stream with the runtime",
            self.evented_pleg_connection_errors.clone(),
        );
        r.register(
            "evented_pleg_connection_success_count",
            "The number of times the event stream was established with the runtime",
            self.evented_pleg_connection_successes.clone(),
        );
        r.register(
            "evented_pleg_connection_latency_seconds",
            "Latency from an event's creation in the runtime to its receipt by the agent",
            self.evented_pleg_connection_latency.clone(),
        );
        r.register(
            "running_pods",
            "Number of pods that have a running pod sandbox",
            self.running_pods.clone(),
        );
        r.register(
            "running_containers",
            "Number of containers currently running",
            self.running_containers.clone(),
        );
        r.register(
            "runtime_operations",
            "Cumulative number of runtime operations by operation type",
            self.runtime_operations.clone(),
        );
        r.register(
            "runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations by operation type",
            self.runtime_operations_duration.clone(),
        );
        r.register(
            "runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type",
            self.runtime_operations_errors.clone(),
        );
        r.register(
            "pod_start_duration_seconds",
            "Duration in seconds from the agent seeing a pod to all its containers running",
            self.pod_start_duration.clone(),
        );
        r.register(
            "evictions",
            "Cumulative number of pod evictions by eviction signal",
            self.evictions.clone(),
        );
        r.register(
            "eviction_stats_age_seconds",
            "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
            self.eviction_stats_age.clone(),
        );
    }
}
