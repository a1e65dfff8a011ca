//! The queue's Prometheus metrics, with client-go's names.
//!
//! Every metric carries the label `name` (the queue's name, added by a
//! sub-registry); those about waiting items also carry `priority`. The
//! handles are created once with the queue, so the hot path only touches
//! atomics (and the histograms' short locks), never a label lookup. The two
//! in-flight gauges are computed when scraped, from the set of items being
//! processed: no ticker updates them.

use std::sync::{Arc, Weak};
use std::time::Duration;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::queue::Priority;

impl EncodeLabelValue for Priority {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        std::fmt::Write::write_str(encoder, self.as_str())
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PriorityLabel {
    priority: Priority,
}

type HistogramFamily = Family<PriorityLabel, Histogram, fn() -> Histogram>;

/// client-go's buckets: 10 ns to 10 s, one per decade.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

/// What the scrape-time gauges read: the items being processed.
pub(crate) trait InFlight: Send + Sync {
    /// (sum of the running times, longest running time) of the items
    /// being processed now.
    fn in_flight(&self) -> (Duration, Duration);
}

/// The metric handles of one queue.
#[derive(Debug)]
pub(crate) struct Metrics {
    depth_family: Family<PriorityLabel, Gauge>,
    adds_family: Family<PriorityLabel, Counter>,
    queue_duration_family: HistogramFamily,
    /// By tier index (see `Priority::index`).
    depth: [Gauge; 3],
    adds: [Counter; 3],
    queue_duration: [Histogram; 3],
    work_duration: Histogram,
    retries: Counter,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let depth_family = Family::<PriorityLabel, Gauge>::default();
        let adds_family = Family::<PriorityLabel, Counter>::default();
        let queue_duration_family: HistogramFamily =
            Family::new_with_constructor(duration_histogram as fn() -> Histogram);
        let label = |p: Priority| PriorityLabel { priority: p };
        Self {
            depth: Priority::ALL.map(|p| depth_family.get_or_create(&label(p)).clone()),
            adds: Priority::ALL.map(|p| adds_family.get_or_create(&label(p)).clone()),
            queue_duration: Priority::ALL
                .map(|p| queue_duration_family.get_or_create(&label(p)).clone()),
            depth_family,
            adds_family,
            queue_duration_family,
            work_duration: duration_histogram(),
            retries: Counter::default(),
        }
    }

    pub(crate) fn depth_inc(&self, p: Priority) {
        self.depth[p.index()].inc();
    }

    pub(crate) fn depth_dec(&self, p: Priority) {
        self.depth[p.index()].dec();
    }

    pub(crate) fn depth_reset(&self) {
        for g in &self.depth {
            g.set(0);
        }
    }

    pub(crate) fn add(&self, p: Priority) {
        self.adds[p.index()].inc();
    }

    pub(crate) fn queued(&self, p: Priority, waited: Duration) {
        self.queue_duration[p.index()].observe(waited.as_secs_f64());
    }

    pub(crate) fn worked(&self, d: Duration) {
        self.work_duration.observe(d.as_secs_f64());
    }

    pub(crate) fn retry(&self) {
        self.retries.inc();
    }

    /// Registers every metric under `registry` with the label
    /// `name=<name>`; `in_flight` feeds the scrape-time gauges.
    pub(crate) fn register(
        &self,
        registry: &mut Registry,
        name: &str,
        in_flight: Weak<dyn InFlight>,
    ) {
        let r = registry.sub_registry_with_label(("name".into(), name.to_owned().into()));
        r.register(
            "workqueue_depth",
            "Items ready and waiting for a worker, by priority",
            self.depth_family.clone(),
        );
        r.register(
            "workqueue_adds",
            "Items added (a duplicate of a waiting item is not counted; a delayed add is counted when it becomes due)",
            self.adds_family.clone(),
        );
        r.register_with_unit(
            "workqueue_queue_duration",
            "How long an item waited, ready, before a worker took it, by the priority it was served at",
            Unit::Seconds,
            self.queue_duration_family.clone(),
        );
        r.register_with_unit(
            "workqueue_work_duration",
            "How long processing an item took (get to done)",
            Unit::Seconds,
            self.work_duration.clone(),
        );
        r.register_with_unit(
            "workqueue_unfinished_work",
            "Sum of how long every item being processed has been running",
            Unit::Seconds,
            ScrapeGauge {
                source: in_flight.clone(),
                longest: false,
            },
        );
        r.register_with_unit(
            "workqueue_longest_running_processor",
            "How long the longest-running item being processed has been running",
            Unit::Seconds,
            ScrapeGauge {
                source: in_flight,
                longest: true,
            },
        );
        r.register(
            "workqueue_retries",
            "Rate-limited re-adds (add_rate_limited)",
            self.retries.clone(),
        );
    }
}

/// A gauge computed when scraped.
struct ScrapeGauge {
    source: Weak<dyn InFlight>,
    longest: bool,
}

impl std::fmt::Debug for ScrapeGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeGauge")
            .field("longest", &self.longest)
            .finish()
    }
}

impl EncodeMetric for ScrapeGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // A queue that is gone has nothing in flight.
        let (sum, longest) = self
            .source
            .upgrade()
            .map(|s| s.in_flight())
            .unwrap_or_default();
        let v = if self.longest { longest } else { sum };
        encoder.encode_gauge(&v.as_secs_f64())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}

/// A weak handle on a queue's in-flight set, for the scrape-time gauges.
pub(crate) fn downgrade<T: InFlight + 'static>(a: &Arc<T>) -> Weak<dyn InFlight> {
    let w: Weak<T> = Arc::downgrade(a);
    w
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::time::Duration;

    use prometheus_client::registry::Registry;

    use crate::queue::{Priority, QueueConfig, WorkQueue};
    use crate::ratelimit::ItemExponential;

    fn scrape(r: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, r).expect("encode");
        out
    }

    /// The value of the sample whose line starts with `series` exactly.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .parse()
            .expect("a number")
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_should_count_adds_depth_durations_and_retries() {
        let q: WorkQueue<&str> = WorkQueue::new(QueueConfig::default().name("pods").rate_limiter(
            ItemExponential::new(Duration::from_millis(1), Duration::from_secs(1)),
        ));
        let mut r = Registry::default();
        q.register(&mut r);
        q.add("a", Priority::Urgent);
        q.add("a", Priority::Urgent); // a duplicate: not counted
        q.add("b", Priority::Background);
        q.add("c", Priority::Background);
        q.add_after("d", Priority::Normal, Duration::from_secs(60)); // not due: not counted yet
        let t = scrape(&r);
        assert_eq!(
            value(&t, r#"workqueue_adds_total{name="pods",priority="urgent"}"#),
            1.0
        );
        assert_eq!(
            value(
                &t,
                r#"workqueue_adds_total{name="pods",priority="background"}"#
            ),
            2.0
        );
        assert_eq!(
            value(&t, r#"workqueue_adds_total{name="pods",priority="normal"}"#),
            0.0
        );
        assert_eq!(
            value(&t, r#"workqueue_depth{name="pods",priority="urgent"}"#),
            1.0
        );
        assert_eq!(
            value(&t, r#"workqueue_depth{name="pods",priority="background"}"#),
            2.0
        );

        tokio::time::advance(Duration::from_millis(300)).await;
        let a = q.try_get().expect("a");
        let b = q.try_get().expect("b");
        tokio::time::advance(Duration::from_secs(2)).await;
        q.done(&a.key);
        tokio::time::advance(Duration::from_secs(1)).await;
        // b has run for 3 s, nothing else is in flight.
        q.add_rate_limited("x", Priority::Normal);
        q.add_rate_limited("y", Priority::Normal);
        let t = scrape(&r);
        assert_eq!(
            value(&t, r#"workqueue_depth{name="pods",priority="urgent"}"#),
            0.0
        );
        assert_eq!(
            value(&t, r#"workqueue_depth{name="pods",priority="background"}"#),
            1.0
        );
        assert_eq!(
            value(&t, r#"workqueue_unfinished_work_seconds{name="pods"}"#),
            3.0
        );
        assert_eq!(
            value(
                &t,
                r#"workqueue_longest_running_processor_seconds{name="pods"}"#
            ),
            3.0
        );
        assert_eq!(value(&t, r#"workqueue_retries_total{name="pods"}"#), 2.0);
        // a waited 0.3 s (in the 1 s bucket, not the 0.1 s one) and ran 2 s.
        let qd = r#"workqueue_queue_duration_seconds"#;
        assert_eq!(
            value(
                &t,
                &format!(r#"{qd}_count{{name="pods",priority="urgent"}}"#)
            ),
            1.0
        );
        assert_eq!(
            value(&t, &format!(r#"{qd}_sum{{name="pods",priority="urgent"}}"#)),
            0.3
        );
        assert_eq!(
            value(
                &t,
                &format!(r#"{qd}_bucket{{name="pods",le="0.1",priority="urgent"}}"#)
            ),
            0.0
        );
        assert_eq!(
            value(
                &t,
                &format!(r#"{qd}_bucket{{name="pods",le="1.0",priority="urgent"}}"#)
            ),
            1.0
        );
        assert_eq!(
            value(
                &t,
                &format!(r#"{qd}_count{{name="pods",priority="background"}}"#)
            ),
            1.0
        );
        assert_eq!(
            value(&t, r#"workqueue_work_duration_seconds_count{name="pods"}"#),
            1.0
        );
        assert_eq!(
            value(&t, r#"workqueue_work_duration_seconds_sum{name="pods"}"#),
            2.0
        );

        q.done(&b.key);
        let t = scrape(&r);
        assert_eq!(
            value(&t, r#"workqueue_unfinished_work_seconds{name="pods"}"#),
            0.0
        );
        assert_eq!(
            value(
                &t,
                r#"workqueue_longest_running_processor_seconds{name="pods"}"#
            ),
            0.0
        );
        assert_eq!(
            value(&t, r#"workqueue_work_duration_seconds_sum{name="pods"}"#),
            5.0
        );
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_should_sum_every_item_in_flight() {
        let q: WorkQueue<u8> = WorkQueue::new(QueueConfig::default().name("n"));
        let mut r = Registry::default();
        q.register(&mut r);
        q.add(1, Priority::Normal);
        q.add(2, Priority::Normal);
        let _one = q.try_get();
        tokio::time::advance(Duration::from_secs(1)).await;
        let _two = q.try_get();
        tokio::time::advance(Duration::from_secs(1)).await;
        let t = scrape(&r);
        assert_eq!(
            value(&t, r#"workqueue_unfinished_work_seconds{name="n"}"#),
            3.0
        );
        assert_eq!(
            value(
                &t,
                r#"workqueue_longest_running_processor_seconds{name="n"}"#
            ),
            2.0
        );
    }

    #[test]
    fn metrics_should_count_a_delayed_add_when_it_comes_due() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async {
            let q: WorkQueue<u8> = WorkQueue::new(QueueConfig::default().name("d"));
            let mut r = Registry::default();
            q.register(&mut r);
            q.add_after(1, Priority::Normal, Duration::from_secs(1));
            let series = r#"workqueue_adds_total{name="d",priority="normal"}"#;
            assert_eq!(value(&scrape(&r), series), 0.0);
            tokio::time::advance(Duration::from_secs(1)).await;
            assert_eq!(q.len(), 1);
            assert_eq!(value(&scrape(&r), series), 1.0);
            assert_eq!(
                value(
                    &scrape(&r),
                    r#"workqueue_depth{name="d",priority="normal"}"#
                ),
                1.0
            );
        });
    }

    #[test]
    fn metrics_should_read_zero_in_flight_once_the_queue_is_gone() {
        let mut r = Registry::default();
        {
            let q: WorkQueue<u8> = WorkQueue::new(QueueConfig::default().name("gone"));
            q.register(&mut r);
            q.add(1, Priority::Normal);
            let _ = q.try_get();
        }
        let t = scrape(&r);
        assert_eq!(
            value(&t, r#"workqueue_unfinished_work_seconds{name="gone"}"#),
            0.0
        );
    }
}
