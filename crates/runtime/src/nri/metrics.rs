//! NRI's metrics, registered with the runtime's: per plugin and event, call
//! latency, errors and timeouts; connected plugins and relaunches.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of per-call metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `NN-name`.
    pub plugin: String,
    /// The event, e.g. `CREATE_CONTAINER`.
    pub event: String,
}

/// Labels of per-plugin metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    /// `NN-name`.
    pub plugin: String,
}

/// Labels of the CreateContainer hook's time.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CreateLabels {
    /// Plugins subscribed to CreateContainer at the time.
    pub plugins: String,
}

/// NRI's metrics (cheap to clone: the families are shared).
#[derive(Clone, Debug)]
pub struct NriMetrics {
    calls: Family<CallLabels, Histogram>,
    create: Family<CreateLabels, Histogram>,
    create_wait: Family<CreateLabels, Histogram>,
    errors: Family<CallLabels, Counter>,
    timeouts: Family<CallLabels, Counter>,
    relaunches: Family<PluginLabels, Counter>,
    /// Plugins connected and synchronized.
    pub plugins: Gauge,
}

impl Default for NriMetrics {
    fn default() -> Self {
        NriMetrics {
            // 50 µs .. ~3 s: a local plugin answers in well under a
            // millisecond; the top buckets catch timeouts.
            calls: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(5e-5, 2.0, 17))
            }),
            // 10 µs .. ~2 s in steps of 25 %: fine enough to read a median
            // of the time NRI adds to a CreateContainer.
            create: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-5, 1.25, 56))
            }),
            // 1 µs .. ~2.5 s in steps of 25 %: the wait is often near zero.
            create_wait: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-6, 1.25, 66))
            }),
            errors: Family::default(),
            timeouts: Family::default(),
            relaunches: Family::default(),
            plugins: Gauge::default(),
        }
    }
}

impl NriMetrics {
    /// Adds the metrics to `registry` (under its prefix, then `nri_`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("nri");
        r.register(
            "plugin_call_duration_seconds",
            "Latency of calls to NRI plugins",
            self.calls.clone(),
        );
        r.register(
            "plugin_call_errors",
            "Calls to NRI plugins that failed (timeouts included)",
            self.errors.clone(),
        );
        r.register(
            "plugin_call_timeouts",
            "Calls to NRI plugins that ran into their timeout",
            self.timeouts.clone(),
        );
        r.register(
            "create_container_duration_seconds",
            "Time NRI's part of CreateContainer takes (plugin calls, merge, validation, adjustment), by the number of plugins subscribed",
            self.create.clone(),
        );
        r.register(
            "create_container_wait_seconds",
            "Time NRI adds to CreateContainer: the part of NRI's span after the rootfs is mounted (NRI runs while it is mounted from an image's second container on), by the number of plugins subscribed",
            self.create_wait.clone(),
        );
        r.register(
            "plugin_relaunches",
            "Relaunches of pre-registered NRI plugins",
            self.relaunches.clone(),
        );
        r.register(
            "plugins",
            "NRI plugins connected and synchronized",
            self.plugins.clone(),
        );
    }

    /// Records one call.
    pub fn observe(&self, plugin: &str, event: &str, took: Duration, error: bool, timeout: bool) {
        let l = CallLabels {
            plugin: plugin.to_string(),
            event: event.to_string(),
        };
        self.calls.get_or_create(&l).observe(took.as_secs_f64());
        if error {
            self.errors.get_or_create(&l).inc();
        }
        if timeout {
            self.timeouts.get_or_create(&l).inc();
        }
    }

    /// Records the NRI part of one CreateContainer.
    pub fn observe_create(&self, plugins: usize, took: Duration) {
        self.create
            .get_or_create(&CreateLabels {
                plugins: plugins.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records the time NRI added to one CreateContainer.
    pub fn observe_create_wait(&self, plugins: usize, waited: Duration) {
        self.create_wait
            .get_or_create(&CreateLabels {
                plugins: plugins.to_string(),
            })
            .observe(waited.as_secs_f64());
    }

    /// Records a relaunch of a pre-registered plugin.
    pub fn relaunched(&self, plugin: &str) {
        self.relaunches
            .get_or_create(&PluginLabels {
                plugin: plugin.to_string(),
            })
            .inc();
    }
}
