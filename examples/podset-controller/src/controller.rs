//! The controller: informers on every replica (warm standby), and while
//! leading, event handlers into a work queue and workers on it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use petrel_controller::informer::{
    CacheForm, ClassPolicy, Delay, EventClass, InformerConfig, InformerFactory, Registration,
    Selectors, SharedInformer,
};
use petrel_controller::leader::Term;
use petrel_controller::{run_workers, Priority, QueueConfig, WorkQueue};

use crate::handler::OwnerHandler;
use crate::http::Metrics;
use crate::kube_api::{pod_indexers, Caches, KubeApi};
use crate::podset::PodSet;
use crate::reconcile::Reconciler;
use crate::report::Reporter;

/// The queue's name: the `name` label of its metrics (controller-runtime
/// names it after the controller, `podset`).
pub const QUEUE: &str = "podset";

/// How the controller queues and works.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Concurrent reconciles.
    pub workers: usize,
    /// One FIFO instead of the tiered policy.
    pub fifo: bool,
    /// The informers' resync period.
    pub sync_period: Duration,
    /// The share of time background tiers may work (1: unpaced).
    pub background_share: f64,
}

/// The resync spreading window: half the period, at most 30 s (resyncs
/// are background work; spreading them keeps the queue shallow).
pub fn resync_window(sync_period: Duration) -> Duration {
    (sync_period / 2).min(Duration::from_secs(30))
}

/// The queue policy: tiered (initial list and resyncs in the background,
/// resyncs spread, user changes urgent) or one FIFO.
pub fn policy(settings: &Settings) -> ClassPolicy {
    if settings.fifo {
        let now = (Priority::Normal, Delay::Now);
        ClassPolicy::default()
            .set(EventClass::InitialList, now.0, now.1)
            .set(EventClass::NoOpResync, now.0, now.1)
            .set(EventClass::UserChange, now.0, now.1)
    } else {
        ClassPolicy::with_resync_window(resync_window(settings.sync_period))
    }
}

/// The queue of a term: named [`QUEUE`], resyncs spread over
/// [`resync_window`]; tiered, the background paced to its share and, with
/// more than one worker, one worker kept for urgent items, so a user change
/// never waits for a background reconcile to finish.
pub fn queue_config(settings: &Settings) -> QueueConfig<String> {
    let config = QueueConfig::default()
        .name(QUEUE)
        .resync_window(resync_window(settings.sync_period));
    if settings.fifo {
        return config;
    }
    let config = config.lower_tier_share(settings.background_share);
    if settings.workers > 1 {
        config.lower_tier_limit(settings.workers - 1)
    } else {
        config
    }
}

/// The PodSet controller.
#[derive(Debug)]
pub struct Controller {
    factory: InformerFactory,
    podsets: SharedInformer<PodSet>,
    pods: SharedInformer<Pod>,
    reconciler: Arc<Reconciler>,
    metrics: Metrics,
    settings: Settings,
}

impl Controller {
    /// Makes the informers (PodSets and Pods of `namespace`, all when
    /// empty); nothing runs yet.
    pub fn new(
        client: Client,
        namespace: &str,
        settings: Settings,
        report: Arc<Reporter>,
        metrics: Metrics,
    ) -> Self {
        let factory = InformerFactory::new(
            // Nothing here reads managedFields (nor in the reference,
            // whose cache drops them too). The caches are kept encoded: a
            // PodSet is about 5 KB decoded and 0.5 KB as JSON, and a
            // reconcile reads one or two objects (a decode of a few µs
            // each). With 10 000 PodSets the resident set is about 36 MB
            // against 80 MB shared decoded.
            InformerConfig::default()
                .resync_period(Some(settings.sync_period))
                .strip_managed_fields(true)
                .cache_form(CacheForm::Encoded),
        );
        let (podset_api, pod_api): (Api<PodSet>, Api<Pod>) = if namespace.is_empty() {
            (Api::all(client.clone()), Api::all(client.clone()))
        } else {
            (
                Api::namespaced(client.clone(), namespace),
                Api::namespaced(client.clone(), namespace),
            )
        };
        let podsets = factory.informer(podset_api, Selectors::default());
        let pods = factory.informer(pod_api, Selectors::default());
        pods.add_indexers(pod_indexers());
        let reconciler = Arc::new(Reconciler {
            cache: Arc::new(Caches {
                podsets: podsets.store(),
                pods: pods.store(),
            }),
            api: Arc::new(KubeApi { client }),
            report,
        });
        Self {
            factory,
            podsets,
            pods,
            reconciler,
            metrics,
            settings,
        }
    }

    /// Starts the informers (every replica: a standby's cache is warm).
    pub fn start_informers(&self) {
        self.factory.start();
    }

    /// Resolves once every informer has synced.
    pub async fn wait_for_sync(&self) {
        self.podsets.wait_for_sync().await;
        self.pods.wait_for_sync().await;
    }

    /// One term of leadership: handlers into a new queue and the workers on
    /// it. Runs until dropped (the term ended: fencing): dropping it
    /// removes the handlers, shuts the queue down and aborts the reconciles
    /// in flight. The first reconcile is told to the `term` (ramp-up time).
    pub async fn lead(&self, term: Option<Term>) {
        let queue: WorkQueue<String> = WorkQueue::new(queue_config(&self.settings));
        self.metrics.set_queue(&queue);
        let policy = policy(&self.settings);
        let _term = TermGuard {
            podsets: self.podsets.clone(),
            pods: self.pods.clone(),
            // Handlers get the cache as initial-list adds first.
            podset_reg: self.podsets.add_queue_handler(queue.clone(), policy),
            pod_reg: self
                .pods
                .add_handler(OwnerHandler::new(queue.clone(), policy)),
            queue: queue.clone(),
        };
        let reconciler = self.reconciler.clone();
        run_workers(queue, self.settings.workers, move |key: String| {
            let r = reconciler.clone();
            let term = term.clone();
            async move {
                let done = r.reconcile(&key).await;
                if let Some(t) = term {
                    t.reconciled();
                }
                done
            }
        })
        .await;
    }
}

/// A term's handlers and queue, undone on drop.
struct TermGuard {
    podsets: SharedInformer<PodSet>,
    pods: SharedInformer<Pod>,
    podset_reg: Registration,
    pod_reg: Registration,
    queue: WorkQueue<String>,
}

impl Drop for TermGuard {
    fn drop(&mut self) {
        self.podsets.remove_handler(&self.podset_reg);
        self.pods.remove_handler(&self.pod_reg);
        self.queue.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn queue_config_should_keep_a_worker_for_urgent_items_when_there_are_two() {
        let s = |workers, fifo| Settings {
            workers,
            fifo,
            sync_period: Duration::from_secs(60),
            background_share: 0.5,
        };
        let limit = |settings: Settings| format!("{:?}", queue_config(&settings));
        assert!(limit(s(1, false)).contains("lower_tier_limit: None"));
        assert!(limit(s(3, false)).contains("lower_tier_limit: Some(2)"));
        assert!(limit(s(3, true)).contains("lower_tier_limit: None"), "FIFO");
        assert!(limit(s(3, false)).contains("lower_tier_share: 0.5"));
        assert!(limit(s(3, true)).contains("lower_tier_share: 1.0"), "FIFO");
    }

    #[test]
    fn policy_should_tier_by_class_or_keep_one_fifo() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let s = Settings {
            workers: 1,
            fifo: false,
            sync_period: Duration::from_secs(60),
            background_share: 1.0,
        };
        let tiered = policy(&s);
        let d = tiered.decide(EventClass::UserChange, &mut rng);
        assert_eq!((d.priority, d.delay), (Priority::Urgent, None));
        let d = tiered.decide(EventClass::InitialList, &mut rng);
        assert_eq!(d.priority, Priority::Background);
        let d = tiered.decide(EventClass::NoOpResync, &mut rng);
        assert_eq!(d.priority, Priority::Background);
        assert!(d.delay.is_some_and(|d| d < Duration::from_secs(30)));
        let fifo = policy(&Settings { fifo: true, ..s });
        for class in [
            EventClass::UserChange,
            EventClass::InitialList,
            EventClass::NoOpResync,
        ] {
            let d = fifo.decide(class, &mut rng);
            assert_eq!((d.priority, d.delay), (Priority::Normal, None), "{class:?}");
        }
    }
}
