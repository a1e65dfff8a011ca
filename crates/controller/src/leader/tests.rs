//! The electors against fake lock APIs on paused tokio time: every wait
//! is virtual, so timings are asserted exactly and nothing sleeps for real.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

use super::fake::{ConfigMapStore, FakeConfigMap, FakeLease, LeaseStore};
use super::*;

const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(500);

fn cfg(id: &str) -> LeaseConfig {
    LeaseConfig::new(id)
        .timing(LEASE, RENEW, RETRY)
        .backoff(Backoff::fixed(Duration::from_millis(250), 0.0))
        .seed(1)
}

/// A worker's log of terms: (start, end once ended).
type TermLog = Arc<Mutex<Vec<(Instant, Option<Instant>)>>>;

/// One running candidate.
struct Candidate {
    leadership: Leadership,
    metrics: LeaderMetrics,
    stop: CancellationToken,
    task: JoinHandle<()>,
    /// (term start, term end) as seen by a worker obeying the term.
    terms: TermLog,
}

impl Candidate {
    fn start(api: FakeLease, cfg: LeaseConfig) -> Self {
        let metrics = LeaderMetrics::new();
        let (elector, leadership) =
            LeaseElector::new(api, cfg, metrics.clone()).expect("valid config");
        let stop = CancellationToken::new();
        let task = tokio::spawn(elector.run(stop.clone()));
        let terms = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(record_terms(leadership.clone(), terms.clone()));
        Self {
            leadership,
            metrics,
            stop,
            task,
            terms,
        }
    }

    async fn leads_within(&self, d: Duration) -> Term {
        let mut l = self.leadership.clone();
        timeout(d, l.leading())
            .await
            .expect("leads in time")
            .expect("elector running")
    }

    fn terms(&self) -> Vec<(Instant, Option<Instant>)> {
        self.terms.lock().expect("not poisoned").clone()
    }
}

/// Lets virtual time pass in 1 ms steps, running every task that becomes
/// ready at each step (one `advance` would jump over timers armed on the
/// way).
async fn run_for(d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        let step = (end - Instant::now()).min(Duration::from_millis(1));
        tokio::time::advance(step).await;
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }
}

/// A worker: notes when each term starts and when its token is cancelled.
async fn record_terms(mut l: Leadership, log: TermLog) {
    while let Some(term) = l.leading().await {
        let i = {
            let mut log = log.lock().expect("not poisoned");
            log.push((Instant::now(), None));
            log.len() - 1
        };
        term.lost().await;
        log.lock().expect("not poisoned")[i].1 = Some(Instant::now());
    }
}

/// Fails if any term of `a` overlaps any term of `b` (open terms run to
/// now).
fn assert_never_both(a: &[(Instant, Option<Instant>)], b: &[(Instant, Option<Instant>)]) {
    let now = Instant::now();
    for &(s1, e1) in a {
        for &(s2, e2) in b {
            let (e1, e2) = (e1.unwrap_or(now), e2.unwrap_or(now));
            assert!(
                e1 <= s2 || e2 <= s1,
                "terms overlap: {s1:?}..{e1:?} and {s2:?}..{e2:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn lease_elector_should_create_lease_and_lead_when_absent() {
    let store = LeaseStore::new();
    let a = Candidate::start(store.handle("a"), cfg("a"));
    let term = a.leads_within(Duration::from_millis(10)).await;
    assert_eq!(term.number(), 1);
    let r = store.record().expect("lease created");
    assert_eq!(r.holder, "a");
    assert_eq!(r.lease_duration_seconds, 4);
    assert_eq!(r.transitions, 0);
    assert!(r.acquire_time.is_some() && r.renew_time.is_some());
    assert!(a.metrics.is_leader());
    assert_eq!(a.leadership.status().leader.as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn lease_elector_should_renew_every_retry_period_keeping_acquire_time() {
    let store = LeaseStore::new();
    let api = store.handle("a");
    let calls = api.calls.clone();
    let a = Candidate::start(api, cfg("a"));
    a.leads_within(Duration::from_millis(10)).await;
    let first = store.record().expect("lease");
    let before = calls.load(Ordering::Relaxed);
    run_for(RETRY * 10 + Duration::from_millis(1)).await;
    let after = calls.load(Ordering::Relaxed);
    // One update per retry period on the fast path.
    assert_eq!(after - before, 10, "renewals in 10 retry periods");
    let now = store.record().expect("lease");
    assert_eq!(now.acquire_time, first.acquire_time);
    assert_eq!(now.transitions, 0);
    assert!(now.renew_time > first.renew_time);
    assert!(a.leadership.is_leader());
}

#[tokio::test(start_paused = true)]
async fn lease_standby_should_take_over_after_expiry_measured_on_its_own_clock() {
    let store = LeaseStore::new();
    let a = Candidate::start(store.handle("a"), cfg("a"));
    a.leads_within(Duration::from_millis(10)).await;
    let b = Candidate::start(store.handle("b"), cfg("b"));
    run_for(Duration::from_secs(3)).await;
    assert_eq!(b.leadership.state(), LeadershipState::Standby);
    // Crash: no release, no more renewals.
    a.task.abort();
    let crashed = Instant::now();
    let last_renewal = store.record().expect("lease");
    b.leads_within(LEASE + RETRY).await;
    let took = crashed.elapsed();
    // B saw A's last renewal at most one retry period before the crash
    // and waits a full lease duration from then.
    assert!(took >= LEASE - RETRY && took <= LEASE, "took {took:?}");
    let r = store.record().expect("lease");
    assert_eq!(r.holder, "b");
    assert_eq!(r.transitions, last_renewal.transitions + 1);
    assert_ne!(r.acquire_time, last_renewal.acquire_time);
}

#[tokio::test(start_paused = true)]
async fn lease_candidates_should_never_both_lead_when_racing_for_absent_lease() {
    let store = LeaseStore::new();
    let cands: Vec<_> = (0..3)
        .map(|i| {
            let id = format!("c{i}");
            Candidate::start(store.handle(&id), cfg(&id).seed(i))
        })
        .collect();
    run_for(Duration::from_secs(10)).await;
    let leaders: Vec<_> = cands.iter().filter(|c| c.leadership.is_leader()).collect();
    assert_eq!(leaders.len(), 1, "exactly one leader");
    for (i, a) in cands.iter().enumerate() {
        for b in &cands[i + 1..] {
            assert_never_both(&a.terms(), &b.terms());
        }
    }
    let holder = store.record().expect("lease").holder;
    assert!(leaders[0].leadership.status().leader.as_deref() == Some(holder.as_str()));
}

#[tokio::test(start_paused = true)]
async fn lease_leader_should_release_on_shutdown_so_standby_leads_at_once() {
    let store = LeaseStore::new();
    // A long backoff: only the change notification can explain a fast
    // takeover.
    let slow = Backoff::fixed(Duration::from_secs(60), 0.0);
    let mut a = Candidate::start(store.handle("a"), cfg("a"));
    a.leads_within(Duration::from_millis(10)).await;
    let b = Candidate::start(store.handle("b"), cfg("b").backoff(slow));
    run_for(Duration::from_secs(5)).await;
    assert!(!b.leadership.is_leader());
    let released_at = Instant::now();
    a.stop.cancel();
    (&mut a.task).await.expect("a stops");
    assert_eq!(a.leadership.state(), LeadershipState::Stopped);
    let released = store
        .history()
        .into_iter()
        .find(|r| r.holder.is_empty())
        .expect("a wrote an empty holder");
    assert_eq!(released.lease_duration_seconds, 1);
    b.leads_within(Duration::from_millis(1)).await;
    assert!(released_at.elapsed() < Duration::from_millis(1));
    assert_eq!(store.record().expect("lease").holder, "b");
    assert_never_both(&a.terms(), &b.terms());
    assert_eq!(a.metrics.count(super::metrics::TermEnd::released), 1);
}

#[tokio::test(start_paused = true)]
async fn lease_leader_should_stop_workers_before_its_lease_can_expire_elsewhere() {
    let store = LeaseStore::new();
    let api_a = store.handle("a");
    let down = api_a.down.clone();
    let a = Candidate::start(api_a, cfg("a"));
    a.leads_within(Duration::from_millis(10)).await;
    let b = Candidate::start(store.handle("b"), cfg("b"));
    run_for(Duration::from_millis(1700)).await;
    // A is cut off from the API server; B still sees it.
    down.store(true, Ordering::Release);
    b.leads_within(LEASE + RETRY * 2).await;
    let a_terms = a.terms();
    let b_terms = b.terms();
    let a_end = a_terms[0].1.expect("a's term ended");
    assert!(
        a_end < b_terms[0].0,
        "a stopped at {a_end:?}, b began at {:?}",
        b_terms[0].0
    );
    assert_eq!(a.metrics.count(super::metrics::TermEnd::fenced), 1);
    assert_ne!(a.leadership.state(), LeadershipState::Leading);
}

#[tokio::test(start_paused = true)]
async fn lease_standby_should_ignore_holder_clock_skew() {
    for skew in [-30i64, 30] {
        let store = LeaseStore::new();
        let mut api_a = store.handle("a");
        api_a.skew_secs = skew;
        let a = Candidate::start(api_a, cfg("a"));
        a.leads_within(Duration::from_millis(10)).await;
        let b = Candidate::start(store.handle("b"), cfg("b"));
        // A renews with timestamps 30 s off: B neither takes over early
        // (renewTime "long ago") nor late (renewTime "in the future").
        run_for(Duration::from_secs(20)).await;
        assert!(a.leadership.is_leader(), "skew {skew}: a keeps leading");
        assert!(!b.leadership.is_leader());
        a.task.abort();
        let crashed = Instant::now();
        b.leads_within(LEASE + RETRY).await;
        assert!(crashed.elapsed() <= LEASE, "skew {skew}");
        assert!(crashed.elapsed() >= LEASE - RETRY, "skew {skew}");
        b.stop.cancel();
    }
}

#[tokio::test(start_paused = true)]
async fn lease_leader_should_stop_at_once_when_lease_is_taken_by_an_edit() {
    let store = LeaseStore::new();
    let a = Candidate::start(store.handle("a"), cfg("a"));
    let term = a.leads_within(Duration::from_millis(10)).await;
    store.edit(|r| r.holder = "intruder".into());
    let edited = Instant::now();
    timeout(RETRY + Duration::from_millis(1), term.lost())
        .await
        .expect("term ends at the next renewal");
    assert!(edited.elapsed() <= RETRY);
    assert_eq!(a.metrics.count(super::metrics::TermEnd::lost), 1);
    // The intruder's record is respected until it expires, then taken.
    let term = a.leads_within(LEASE + RETRY).await;
    assert_eq!(term.number(), 2);
    assert!(edited.elapsed() >= LEASE);
    assert_eq!(store.record().expect("lease").holder, "a");
}

#[tokio::test(start_paused = true)]
async fn lease_elector_should_cancel_its_term_when_its_task_is_aborted() {
    let store = LeaseStore::new();
    let a = Candidate::start(store.handle("a"), cfg("a"));
    let term = a.leads_within(Duration::from_millis(10)).await;
    a.task.abort();
    timeout(Duration::from_millis(1), term.lost())
        .await
        .expect("workers stop with the elector");
    assert_eq!(a.leadership.state(), LeadershipState::Stopped);
    // No release: the Lease still names a (a crash, as others see it).
    assert_eq!(store.record().expect("lease").holder, "a");
}

#[tokio::test(start_paused = true)]
async fn lease_leader_should_keep_leading_when_only_labels_changed() {
    let store = LeaseStore::new();
    let a = Candidate::start(store.handle("a"), cfg("a"));
    let term = a.leads_within(Duration::from_millis(10)).await;
    // A write that changes the resourceVersion but not the holder.
    store.edit(|_| {});
    run_for(RETRY * 4).await;
    assert!(term.is_live());
    assert_eq!(store.record().expect("lease").holder, "a");
}

#[tokio::test(start_paused = true)]
async fn lease_standby_should_retry_failures_with_the_configured_backoff() {
    let count = |backoff: Backoff| async move {
        let store = LeaseStore::new();
        store.set_notify(false);
        let api = store.handle("a");
        api.failing.store(true, Ordering::Release);
        let calls = api.calls.clone();
        let c = Candidate::start(api, cfg("a").backoff(backoff));
        run_for(Duration::from_millis(15_500)).await;
        c.stop.cancel();
        calls.load(Ordering::Relaxed)
    };
    // 1 s doubling to 4 s: attempts at 0, 1, 3, 7, 11, 15 s.
    let exp = Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(4),
        factor: 2.0,
        jitter: 0.0,
    };
    assert_eq!(count(exp).await, 6);
    // A fixed 500 ms: attempts at 0, 0.5, ..., 15 s.
    assert_eq!(
        count(Backoff::fixed(Duration::from_millis(500), 0.0)).await,
        31
    );
}

#[tokio::test(start_paused = true)]
async fn lease_config_should_reject_deadline_not_below_duration() {
    let bad = LeaseConfig::new("a").timing(
        Duration::from_secs(4),
        Duration::from_secs(4),
        Duration::from_secs(1),
    );
    let err = bad.check().expect_err("invalid");
    assert!(err.to_string().contains("renew_deadline"), "{err}");
    let bad = LeaseConfig::new("").timing(LEASE, RENEW, RETRY);
    assert!(bad
        .check()
        .expect_err("invalid")
        .to_string()
        .contains("identity"));
    assert_eq!(cfg("a").check(), Ok(()));
}

fn pod(n: u32) -> PodRef {
    PodRef {
        name: format!("pod-{n}"),
        namespace: "default".into(),
        uid: format!("uid-{n}"),
    }
}

fn for_life(store: &ConfigMapStore, n: u32) -> (Leadership, CancellationToken, JoinHandle<()>) {
    let cfg = ForLifeConfig::new(pod(n))
        .backoff(Backoff::fixed(Duration::from_secs(60), 0.0))
        .check_period(Duration::from_secs(1))
        .seed(u64::from(n));
    let (e, l) = ForLifeElector::new(
        FakeConfigMap {
            store: store.clone(),
        },
        cfg,
        LeaderMetrics::new(),
    )
    .expect("valid config");
    let stop = CancellationToken::new();
    let task = tokio::spawn(e.run(stop.clone()));
    (l, stop, task)
}

#[tokio::test(start_paused = true)]
async fn for_life_leader_should_own_lock_and_delete_it_on_release() {
    let store = ConfigMapStore::new();
    let (mut l1, stop1, task1) = for_life(&store, 1);
    timeout(Duration::from_millis(10), l1.leading())
        .await
        .expect("leads")
        .expect("running");
    assert_eq!(
        store.object().expect("lock").owner_uid.as_deref(),
        Some("uid-1")
    );
    let (mut l2, _stop2, _task2) = for_life(&store, 2);
    run_for(Duration::from_secs(30)).await;
    assert!(!l2.is_leader(), "the lock is held for life");
    stop1.cancel();
    task1.await.expect("stops");
    // The 60 s backoff cannot explain this: the deletion woke it.
    timeout(Duration::from_millis(1), l2.leading())
        .await
        .expect("leads at once")
        .expect("running");
    assert_eq!(
        store.object().expect("lock").owner_uid.as_deref(),
        Some("uid-2")
    );
}

#[tokio::test(start_paused = true)]
async fn for_life_leader_should_stop_when_its_lock_is_deleted() {
    let store = ConfigMapStore::new();
    let (mut l1, _stop, _task) = for_life(&store, 1);
    let term = timeout(Duration::from_millis(10), l1.leading())
        .await
        .expect("leads")
        .expect("running");
    // Garbage collection (or a user) removes the lock; with nobody else
    // around the old leader takes it again, in a new term.
    store.remove();
    timeout(Duration::from_millis(1), term.lost())
        .await
        .expect("term ends at once");
    let again = timeout(Duration::from_secs(61), l1.leading())
        .await
        .expect("leads")
        .expect("running");
    assert_eq!(again.number(), 2);
}

#[tokio::test(start_paused = true)]
async fn warm_standby_should_sync_first_and_work_only_while_leading() {
    let store = LeaseStore::new();
    let a = Candidate::start(store.handle("a"), cfg("a"));
    let readiness = Readiness::new();
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<()>();
    let worked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let runner = tokio::spawn(run_warm(
        a.leadership.clone(),
        readiness.clone(),
        async move {
            let _ = synced_rx.await;
        },
        {
            let worked = worked.clone();
            move |term: Term| {
                let worked = worked.clone();
                async move {
                    worked.lock().expect("not poisoned").push(term.number());
                    term.reconciled();
                    std::future::pending::<()>().await;
                }
            }
        },
    ));
    a.leads_within(Duration::from_millis(10)).await;
    run_for(Duration::from_secs(1)).await;
    assert!(!readiness.is_ready(), "not synced yet");
    assert!(
        worked.lock().expect("not poisoned").is_empty(),
        "leader waits for sync"
    );
    synced_tx.send(()).expect("runner waits");
    run_for(Duration::from_millis(1)).await;
    assert!(readiness.is_ready());
    assert_eq!(*worked.lock().expect("not poisoned"), [1]);
    let mut reg = prometheus_client::registry::Registry::default();
    a.metrics.register(&mut reg, "x");
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg).expect("encodes");
    // Ramp-up (became leader → first reconcile) included the sync wait.
    assert!(
        out.contains("leader_election_ramp_up_seconds_sum{name=\"x\"} 1.0"),
        "{out}"
    );
    a.stop.cancel();
    timeout(Duration::from_secs(1), runner)
        .await
        .expect("runner ends")
        .expect("joins");
}
