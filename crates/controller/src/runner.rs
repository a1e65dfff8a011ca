//! The worker pool: N workers take keys from a queue, reconcile them and
//! act on the result.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;

use crate::queue::WorkQueue;

/// What a successful reconcile asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing more to do for this key.
    Done,
    /// Look at the key again after this long (polling something outside
    /// the cluster's events, say).
    RequeueAfter(Duration),
}

/// Runs `workers` workers (at least one) on `queue` until it is shut down
/// and drained; returns once every worker has returned.
///
/// Each worker loops: take an item, call `reconcile(key)` in a task of its
/// own, then
/// * `Ok(Action::Done)`: forget the key's backoff, `done`;
/// * `Ok(Action::RequeueAfter(d))`: forget, `add_after(d)` at the item's
///   priority, `done`;
/// * `Err(e)` (or a panic): log it, `add_rate_limited` at the item's
///   priority, `done`.
///
/// So a key is never reconciled by two workers at once, a failing key backs
/// off, and a panicking reconcile costs one retry, not a worker. Stop it
/// gracefully with [`WorkQueue::shut_down_with_drain`] from another task.
pub async fn run_workers<K, F, Fut, E>(queue: WorkQueue<K>, workers: usize, reconcile: F)
where
    K: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    F: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    let reconcile = Arc::new(reconcile);
    let mut set = JoinSet::new();
    for _ in 0..workers.max(1) {
        set.spawn(worker(queue.clone(), Arc::clone(&reconcile)));
    }
    while let Some(r) = set.join_next().await {
        if let Err(e) = r {
            tracing::error!(queue = queue.name(), error = %e, "worker ended abnormally");
        }
    }
}

async fn worker<K, F, Fut, E>(queue: WorkQueue<K>, reconcile: Arc<F>)
where
    K: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    F: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    while let Some(item) = queue.get().await {
        let outcome = tokio::spawn(reconcile(item.key.clone())).await;
        match outcome {
            Ok(Ok(Action::Done)) => queue.forget(&item.key),
            Ok(Ok(Action::RequeueAfter(d))) => {
                queue.forget(&item.key);
                queue.add_after(item.key.clone(), item.priority, d);
            }
            Ok(Err(e)) => {
                tracing::warn!(
                    queue = queue.name(),
                    key = ?item.key,
                    retries = queue.num_requeues(&item.key),
                    error = %e,
                    "reconcile failed; retrying with backoff"
                );
                queue.add_rate_limited(item.key.clone(), item.priority);
            }
            Err(e) => {
                tracing::error!(
                    queue = queue.name(),
                    key = ?item.key,
                    error = %e,
                    "reconcile panicked; retrying with backoff"
                );
                queue.add_rate_limited(item.key.clone(), item.priority);
            }
        }
        queue.done(&item.key);
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use tokio::time::Instant;

    use super::*;
    use crate::queue::{Priority, QueueConfig};

    type Log = Arc<Mutex<Vec<(u32, Duration)>>>;

    fn queue() -> WorkQueue<u32> {
        WorkQueue::new(QueueConfig::default().name("runner"))
    }

    #[tokio::test(start_paused = true)]
    async fn run_workers_should_reconcile_every_key_and_return_after_drain() {
        let q = queue();
        for k in 0..20 {
            q.add(k, Priority::ALL[k as usize % 3]);
        }
        let seen = Arc::new(Mutex::new(vec![]));
        let runner = tokio::spawn(run_workers(q.clone(), 3, {
            let seen = seen.clone();
            move |k: u32| {
                let seen = seen.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    seen.lock().expect("lock").push(k);
                    Ok::<_, String>(Action::Done)
                }
            }
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
        q.shut_down_with_drain().await;
        runner.await.expect("runner");
        let mut seen = seen.lock().expect("lock").clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..20).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn run_workers_should_finish_work_in_hand_before_returning() {
        let q = queue();
        q.add(1, Priority::Normal);
        let finished = Arc::new(AtomicUsize::new(0));
        let runner = tokio::spawn(run_workers(q.clone(), 2, {
            let finished = finished.clone();
            move |_k: u32| {
                let finished = finished.clone();
                async move {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, String>(Action::Done)
                }
            }
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.shut_down_with_drain().await;
        assert_eq!(finished.load(Ordering::SeqCst), 1, "drain waited for it");
        tokio::time::timeout(Duration::from_millis(1), runner)
            .await
            .expect("workers returned once drained")
            .expect("runner");
    }

    async fn run_logged(
        q: &WorkQueue<u32>,
        outcomes: Vec<Result<Action, String>>,
    ) -> Vec<(u32, Duration)> {
        let log: Log = Arc::new(Mutex::new(vec![]));
        let outcomes = Arc::new(Mutex::new(outcomes.into_iter()));
        let t0 = Instant::now();
        let runner = tokio::spawn(run_workers(q.clone(), 1, {
            let log = log.clone();
            move |k: u32| {
                let (log, outcomes) = (log.clone(), outcomes.clone());
                async move {
                    log.lock().expect("lock").push((k, Instant::now() - t0));
                    let next = outcomes.lock().expect("lock").next();
                    next.unwrap_or(Ok(Action::Done))
                }
            }
        }));
        tokio::time::sleep(Duration::from_secs(10)).await;
        q.shut_down_with_drain().await;
        runner.await.expect("runner");
        let log = log.lock().expect("lock").clone();
        log
    }

    #[tokio::test(start_paused = true)]
    async fn run_workers_should_retry_failures_with_backoff_and_forget_on_success() {
        let q = queue();
        q.add(7, Priority::Urgent);
        let log = run_logged(
            &q,
            vec![Err("one".into()), Err("two".into()), Ok(Action::Done)],
        )
        .await;
        // client-go's default limiter: 5 ms, then 10 ms.
        let ms = Duration::from_millis;
        assert_eq!(log, [(7, ms(0)), (7, ms(5)), (7, ms(15))]);
        assert_eq!(q.num_requeues(&7), 0, "forgotten after the success");
    }

    #[tokio::test(start_paused = true)]
    async fn run_workers_should_requeue_after_the_asked_delay() {
        let q = queue();
        q.add(3, Priority::Normal);
        let log = run_logged(
            &q,
            vec![
                Err("fail".into()),
                Ok(Action::RequeueAfter(Duration::from_secs(2))),
            ],
        )
        .await;
        let ms = Duration::from_millis;
        assert_eq!(log, [(3, ms(0)), (3, ms(5)), (3, ms(2005))]);
        assert_eq!(q.num_requeues(&3), 0, "a requeue forgets the backoff");
    }

    #[tokio::test(start_paused = true)]
    async fn run_workers_should_survive_a_panicking_reconcile() {
        let q = queue();
        q.add(1, Priority::Normal);
        let calls = Arc::new(AtomicUsize::new(0));
        let runner = tokio::spawn(run_workers(q.clone(), 1, {
            let calls = calls.clone();
            move |_k: u32| {
                let calls = calls.clone();
                async move {
                    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("reconcile bug");
                    }
                    Ok::<_, String>(Action::Done)
                }
            }
        }));
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.shut_down_with_drain().await;
        runner.await.expect("runner");
        assert_eq!(calls.load(Ordering::SeqCst), 2, "retried after the panic");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn run_workers_should_never_run_one_key_on_two_workers() {
        let q = queue();
        let running: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
        let overlaps = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let runner = tokio::spawn(run_workers(q.clone(), 8, {
            let (running, overlaps, calls) = (running.clone(), overlaps.clone(), calls.clone());
            move |k: u32| {
                let (running, overlaps, calls) = (running.clone(), overlaps.clone(), calls.clone());
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    {
                        let mut r = running.lock().expect("lock");
                        let n = r.entry(k).or_insert(0);
                        *n += 1;
                        if *n > 1 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                    *running.lock().expect("lock").entry(k).or_insert(1) -= 1;
                    Ok::<_, String>(Action::Done)
                }
            }
        }));
        // Three keys added over and over while they are being processed.
        for i in 0..3000u32 {
            q.add(i % 3, Priority::ALL[(i % 7 % 3) as usize]);
            if i % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        q.shut_down_with_drain().await;
        runner.await.expect("runner");
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
        assert!(calls.load(Ordering::SeqCst) >= 3);
    }
}
