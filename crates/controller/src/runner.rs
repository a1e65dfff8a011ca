//! Workers: take keys from a queue, reconcile them and act on the result.
//! Either a pool of N workers ([`run_workers`]) or one task per key
//! ([`run_per_key`]).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::queue::{Item, WorkQueue};

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
/// gracefully with [`WorkQueue::shut_down_with_drain`] from another task;
/// aborting the runner's task cancels the reconciles in flight too.
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
        reconcile_item(&queue, item, reconcile.as_ref()).await;
    }
}

/// Reconciles one item taken from `queue` in a task of its own, acts on
/// the outcome (see [`run_workers`]) and marks the key done.
async fn reconcile_item<K, F, Fut, E>(queue: &WorkQueue<K>, item: Item<K>, reconcile: &F)
where
    K: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    F: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    // Its own task, so a panic costs a retry, not the worker; cancelled
    // with the worker (the runner aborted), never left running detached.
    let mut task = AbortOnDrop(tokio::spawn(reconcile(item.key.clone())));
    let outcome = (&mut task.0).await;
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

/// A reconcile's task, aborted when whoever awaits it is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs one task per key of `queue` (a key's *worker*), so that keys never
/// wait for each other: a reconcile that takes minutes (a pod stopping
/// with a long grace period, say) holds nothing but its own key. Returns
/// once the queue is shut down and every key's task has finished.
///
/// One dispatcher takes items from the queue and hands each to its key's
/// task, starting the task if there is none. The queue's rules give the
/// rest: a key is handed out again only after `done`, so a key's task
/// reconciles it at most once at a time, and adds while it works are
/// merged into one later reconcile. Each reconcile is treated as in
/// [`run_workers`] (requeue, backoff, a panic costs a retry).
///
/// A key's task ends after a reconcile when `keep(&key)` is false (the
/// object is gone) and nothing is pending for it; a later item for the
/// key starts a new one. Serving order among ready keys is the queue's,
/// but there is no limit on how many keys are reconciled at once.
pub async fn run_per_key<K, F, Fut, E, P>(queue: WorkQueue<K>, reconcile: F, keep: P)
where
    K: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    F: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
    P: Fn(&K) -> bool + Send + Sync + 'static,
{
    let reconcile = Arc::new(reconcile);
    let keep = Arc::new(keep);
    let mut feeds: HashMap<K, mpsc::UnboundedSender<Item<K>>> = HashMap::new();
    let mut tasks: JoinSet<K> = JoinSet::new();
    loop {
        tokio::select! {
            item = queue.get() => {
                let Some(item) = item else { break };
                let key = item.key.clone();
                let item = match feeds.get(&key) {
                    Some(feed) => match feed.send(item) {
                        Ok(()) => continue,
                        // The key's task is ending: start another.
                        Err(mpsc::error::SendError(item)) => item,
                    },
                    None => item,
                };
                let (tx, rx) = mpsc::unbounded_channel();
                let _ = tx.send(item);
                feeds.insert(key.clone(), tx);
                tasks.spawn(key_worker(
                    key,
                    rx,
                    queue.clone(),
                    Arc::clone(&reconcile),
                    Arc::clone(&keep),
                ));
            }
            Some(ended) = tasks.join_next(), if !tasks.is_empty() => match ended {
                Ok(key) => {
                    // Only if that task's feed is the one on record (a new
                    // task may have replaced it).
                    if feeds.get(&key).is_some_and(mpsc::UnboundedSender::is_closed) {
                        feeds.remove(&key);
                    }
                }
                Err(e) => {
                    tracing::error!(queue = queue.name(), error = %e, "key worker ended abnormally");
                    feeds.retain(|_, f| !f.is_closed());
                }
            },
        }
    }
    // Shut down: the feeds close, each task finishes what it holds.
    drop(feeds);
    while let Some(r) = tasks.join_next().await {
        if let Err(e) = r {
            tracing::error!(queue = queue.name(), error = %e, "key worker ended abnormally");
        }
    }
}

/// One key's task: reconciles each item it is fed, in order, until the
/// dispatcher goes away or the key is not to be kept and nothing waits.
async fn key_worker<K, F, Fut, E, P>(
    key: K,
    mut feed: mpsc::UnboundedReceiver<Item<K>>,
    queue: WorkQueue<K>,
    reconcile: Arc<F>,
    keep: Arc<P>,
) -> K
where
    K: Eq + Hash + Clone + fmt::Debug + Send + Sync + 'static,
    F: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
    P: Fn(&K) -> bool + Send + Sync + 'static,
{
    while let Some(item) = feed.recv().await {
        reconcile_item(&queue, item, reconcile.as_ref()).await;
        if !keep(&key) {
            // Closing first: an item sent before the close is still
            // received below; one sent after fails, and the dispatcher
            // starts a new task for it.
            feed.close();
        }
    }
    key
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

    /// Runs `run_per_key` over `q` with a reconcile that logs (key, start
    /// time) and sleeps for the key's entry in `work` (default 0); keys
    /// are kept while `kept` says so.
    fn spawn_per_key(
        q: &WorkQueue<u32>,
        work: HashMap<u32, Duration>,
        kept: Arc<Mutex<bool>>,
    ) -> (Log, tokio::task::JoinHandle<()>) {
        let log: Log = Arc::new(Mutex::new(vec![]));
        let t0 = Instant::now();
        let runner = tokio::spawn(run_per_key(
            q.clone(),
            {
                let log = log.clone();
                move |k: u32| {
                    let log = log.clone();
                    let d = work.get(&k).copied().unwrap_or_default();
                    async move {
                        log.lock().expect("lock").push((k, Instant::now() - t0));
                        tokio::time::sleep(d).await;
                        Ok::<_, String>(Action::Done)
                    }
                }
            },
            move |_k: &u32| *kept.lock().expect("lock"),
        ));
        (log, runner)
    }

    #[tokio::test(start_paused = true)]
    async fn run_per_key_should_not_make_a_key_wait_for_a_slow_one() {
        let q = queue();
        // Key 1 takes 30 s (a pod stopping with its grace period); twenty
        // more slow keys besides; key 2 comes after them.
        let mut work: HashMap<u32, Duration> =
            (100..120).map(|k| (k, Duration::from_secs(30))).collect();
        work.insert(1, Duration::from_secs(30));
        let (log, runner) = spawn_per_key(&q, work, Arc::new(Mutex::new(true)));
        q.add(1, Priority::Urgent);
        for k in 100..120 {
            q.add(k, Priority::Urgent);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.add(2, Priority::Normal);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started: Vec<(u32, Duration)> = log.lock().expect("lock").clone();
        let two = started.iter().find(|(k, _)| *k == 2).map(|(_, t)| *t);
        assert_eq!(two, Some(Duration::from_millis(10)), "{started:?}");
        assert_eq!(started.len(), 22, "every key at once: {started:?}");
        q.shut_down_with_drain().await;
        runner.await.expect("runner");
    }

    #[tokio::test(start_paused = true)]
    async fn run_per_key_should_reconcile_a_key_once_at_a_time_and_merge_adds() {
        let q = queue();
        let work = HashMap::from([(1, Duration::from_secs(10))]);
        let (log, runner) = spawn_per_key(&q, work, Arc::new(Mutex::new(true)));
        q.add(1, Priority::Normal);
        // Five updates while the first reconcile runs: one more reconcile,
        // after the first ended.
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            q.add(1, Priority::Urgent);
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
        let ms = Duration::from_millis;
        assert_eq!(*log.lock().expect("lock"), [(1, ms(0)), (1, ms(10_000))]);
        q.shut_down_with_drain().await;
        runner.await.expect("runner");
    }

    #[tokio::test(start_paused = true)]
    async fn run_per_key_should_serve_a_key_again_after_its_task_ended() {
        let q = queue();
        let work = HashMap::from([(1, Duration::from_secs(1))]);
        let kept = Arc::new(Mutex::new(false));
        let (log, runner) = spawn_per_key(&q, work, kept);
        q.add(1, Priority::Normal);
        // An add while the task that will end works: handed to it before
        // it ends, or to a new task after; never lost.
        tokio::time::sleep(Duration::from_millis(500)).await;
        q.add(1, Priority::Normal);
        tokio::time::sleep(Duration::from_secs(5)).await;
        // And one long after the task ended.
        q.add(1, Priority::Normal);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let ms = Duration::from_millis;
        assert_eq!(
            *log.lock().expect("lock"),
            [(1, ms(0)), (1, ms(1000)), (1, ms(5500))]
        );
        q.shut_down_with_drain().await;
        runner.await.expect("runner");
    }

    #[tokio::test(start_paused = true)]
    async fn run_per_key_should_retry_failures_with_backoff() {
        let q = queue();
        q.add(7, Priority::Urgent);
        let calls = Arc::new(AtomicUsize::new(0));
        let t0 = Instant::now();
        let seen: Log = Arc::default();
        let runner = tokio::spawn(run_per_key(
            q.clone(),
            {
                let (calls, seen) = (calls.clone(), seen.clone());
                move |k: u32| {
                    let (calls, seen) = (calls.clone(), seen.clone());
                    async move {
                        seen.lock().expect("lock").push((k, Instant::now() - t0));
                        match calls.fetch_add(1, Ordering::SeqCst) {
                            0 => Err("one".to_string()),
                            1 => panic!("reconcile bug"),
                            _ => Ok(Action::Done),
                        }
                    }
                }
            },
            |_k: &u32| true,
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.shut_down_with_drain().await;
        runner.await.expect("runner");
        let ms = Duration::from_millis;
        assert_eq!(
            *seen.lock().expect("lock"),
            [(7, ms(0)), (7, ms(5)), (7, ms(15))]
        );
    }

    /// Sets its flag when dropped (a reconcile cancelled or finished).
    struct Dropped(Arc<AtomicUsize>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn aborted_runners_should_cancel_their_reconciles() {
        for per_key in [false, true] {
            let q = queue();
            q.add(1, Priority::Normal);
            let (started, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let reconcile = {
                let (started, dropped) = (started.clone(), dropped.clone());
                move |_k: u32| {
                    let (started, guard) = (started.clone(), Dropped(dropped.clone()));
                    async move {
                        let _guard = guard;
                        started.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        Ok::<_, String>(Action::Done)
                    }
                }
            };
            let runner = if per_key {
                tokio::spawn(run_per_key(q.clone(), reconcile, |_k: &u32| true))
            } else {
                tokio::spawn(run_workers(q.clone(), 2, reconcile))
            };
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(started.load(Ordering::SeqCst), 1);
            runner.abort();
            let _ = runner.await;
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert_eq!(dropped.load(Ordering::SeqCst), 1, "per key: {per_key}");
        }
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
