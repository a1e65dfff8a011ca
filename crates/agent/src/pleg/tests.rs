//! The PLEG's unit tests, against [`FakeRuntime`], on tokio's paused clock:
//! time moves only when every task waits, so each wait below is a point
//! of the PLEG's own schedule (its relist period, its backoff), not a
//! guess at how long a busy machine takes.

use std::sync::Arc;
use std::time::Duration;

use petrel_cri::api::{ContainerEventType as Ev, ContainerState as St};
use tokio::sync::mpsc;

use super::events::{from_cri_event, transition_events, ObjState};
use super::fake::{FakeRuntime, StreamTx};
use super::*;

const NODE: &str = "node-a";

struct Harness {
    rt: Arc<FakeRuntime>,
    cache: Arc<PodCache>,
    health: Arc<Health>,
    metrics: AgentMetrics,
    pleg: Pleg,
    rx: mpsc::UnboundedReceiver<PodLifecycleEvent>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn config(mode: PlegMode) -> PlegConfig {
    PlegConfig {
        mode,
        relist_period: Duration::from_millis(50),
        event_relist_period: Duration::from_secs(3600),
        inspect_concurrency: 4,
        node_name: NODE.into(),
    }
}

fn harness_with(rt: Arc<FakeRuntime>, cfg: PlegConfig) -> Harness {
    let cache = Arc::new(PodCache::new());
    let health = Arc::new(Health::new(Duration::from_secs(180)));
    let metrics = AgentMetrics::new();
    // The sink hands each event over for the test to look at.
    let (tx, rx) = mpsc::unbounded_channel();
    let pleg = Pleg::new(
        rt.clone(),
        cache.clone(),
        health.clone(),
        metrics.clone(),
        cfg,
        Arc::new(move |e| {
            let _ = tx.send(e);
        }),
    );
    Harness {
        rt,
        cache,
        health,
        metrics,
        pleg,
        rx,
        task: None,
    }
}

fn harness(cfg: PlegConfig) -> Harness {
    harness_with(Arc::new(FakeRuntime::new()), cfg)
}

impl Harness {
    fn start(&mut self) {
        self.task = Some(tokio::spawn(self.pleg.clone().run()));
    }

    /// Every event received so far (without waiting).
    fn drain(&mut self) -> Vec<(String, PodLifecycleEventType, String)> {
        let mut out = Vec::new();
        while let Ok(e) = self.rx.try_recv() {
            out.push((e.uid, e.kind, e.container_id));
        }
        out
    }

    /// Waits for an event matching `f`, skipping others.
    async fn wait_event(
        &mut self,
        f: impl Fn(&PodLifecycleEvent) -> bool,
    ) -> Option<PodLifecycleEvent> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(e)) if f(&e) => return Some(e),
                Ok(Some(_)) => {}
                _ => return None,
            }
        }
    }

    async fn wait_mode(&self) -> Option<PlegMode> {
        until(|| self.pleg.mode_in_use().is_some()).await;
        self.pleg.mode_in_use()
    }

    /// The cached state of container `id` of pod `uid`.
    fn cached_state(&self, uid: &str, id: &str) -> Option<i32> {
        self.cache
            .get(uid)
            .status
            .and_then(|s| s.containers.iter().find(|c| c.id == id).map(|c| c.state))
    }
}

/// Polls `f` until true (5 s at most, of the tests' paused clock).
async fn until(f: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    f()
}

use PodLifecycleEventType::{ContainerChanged, ContainerDied, ContainerRemoved, ContainerStarted};

#[test]
fn events_should_want_a_sync_unless_they_report_a_removal() {
    assert!(ContainerStarted.wants_sync());
    assert!(ContainerDied.wants_sync());
    assert!(!ContainerRemoved.wants_sync());
    assert!(!ContainerChanged.wants_sync());
}

#[test]
fn transitions_should_map_like_kubelet() {
    use ObjState::*;
    let table: &[(ObjState, ObjState, &[PodLifecycleEventType])] = &[
        (NonExistent, Running, &[ContainerStarted]),
        (Created, Running, &[ContainerStarted]),
        (Running, Exited, &[ContainerDied]),
        (NonExistent, Exited, &[ContainerDied]),
        (Running, Unknown, &[ContainerChanged]),
        (Exited, NonExistent, &[ContainerRemoved]),
        (Running, NonExistent, &[ContainerDied, ContainerRemoved]),
        (Created, NonExistent, &[ContainerDied, ContainerRemoved]),
        (Unknown, NonExistent, &[ContainerDied, ContainerRemoved]),
        (NonExistent, Created, &[]),
        (Running, Running, &[]),
        (Exited, Exited, &[]),
    ];
    for (old, new, want) in table {
        assert_eq!(transition_events(*old, *new), *want, "{old:?} -> {new:?}");
    }
    assert_eq!(ObjState::of_sandbox(0), Running);
    assert_eq!(ObjState::of_sandbox(1), Exited);
    assert_eq!(ObjState::of_container(99), Unknown);
}

#[test]
fn cri_events_should_map_and_created_should_emit_nothing() {
    assert_eq!(
        from_cri_event(Ev::ContainerStartedEvent as i32),
        Some(ContainerStarted)
    );
    assert_eq!(
        from_cri_event(Ev::ContainerStoppedEvent as i32),
        Some(ContainerDied)
    );
    assert_eq!(
        from_cri_event(Ev::ContainerDeletedEvent as i32),
        Some(ContainerRemoved)
    );
    assert_eq!(from_cri_event(Ev::ContainerCreatedEvent as i32), None);
    assert_eq!(from_cri_event(42), None);
}

#[tokio::test(start_paused = true)]
async fn relist_should_emit_kubelet_events_and_fill_the_cache() {
    let mut h = harness(config(PlegMode::Relist));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c1 = h.rt.add_container(&sb, "init-a", St::ContainerExited);
    let c2 = h.rt.add_container(&sb, "app", St::ContainerRunning);
    assert!(h.pleg.relist().await);
    let mut ev = h.drain();
    ev.sort_by(|a, b| a.2.cmp(&b.2));
    assert_eq!(
        ev,
        vec![
            ("p1".into(), ContainerDied, c1.clone()),
            ("p1".into(), ContainerStarted, c2.clone()),
            ("p1".into(), ContainerStarted, sb.clone()),
        ]
    );
    let e = h.cache.get("p1");
    let s = e.status.unwrap_or_default();
    assert_eq!(s.sandboxes.len(), 1);
    assert_eq!(s.name, "pod-p1");
    // Newest first, with the agent's annotations read back.
    let ids: Vec<_> = s.containers.iter().map(|c| c.id.clone()).collect();
    assert_eq!(ids, vec![c2.clone(), c1.clone()]);
    assert!(s.container_meta.get(&c1).is_some_and(|m| m.init));
    assert!(s.container_meta.get(&c2).is_some_and(|m| !m.init));
    assert!(h.cache.global_timestamp() >= e.timestamp && e.timestamp > 0);
    assert_eq!(h.metrics.running_pods.get(), 1);

    // Nothing changed: no events, no inspection.
    let statuses = h.rt.calls("container_status");
    assert!(h.pleg.relist().await);
    assert!(h.drain().is_empty());
    assert_eq!(h.rt.calls("container_status"), statuses);

    // Exit, then removal after exit, then removal without a seen exit.
    h.rt.set_state(&c2, St::ContainerExited);
    assert!(h.pleg.relist().await);
    assert_eq!(h.drain(), vec![("p1".into(), ContainerDied, c2.clone())]);
    assert_eq!(h.cached_state("p1", &c2), Some(St::ContainerExited as i32));
    h.rt.remove(&c2);
    assert!(h.pleg.relist().await);
    assert_eq!(h.drain(), vec![("p1".into(), ContainerRemoved, c2.clone())]);
    let c3 = h.rt.add_container(&sb, "app", St::ContainerCreated);
    assert!(h.pleg.relist().await);
    assert!(h.drain().is_empty(), "created is no news");
    assert_eq!(h.cached_state("p1", &c3), Some(St::ContainerCreated as i32));
    h.rt.remove(&c3);
    assert!(h.pleg.relist().await);
    assert_eq!(
        h.drain(),
        vec![
            ("p1".into(), ContainerDied, c3.clone()),
            ("p1".into(), ContainerRemoved, c3.clone())
        ]
    );
    // A sandbox going not-ready is a death too.
    h.rt.stop_sandbox(&sb);
    assert!(h.pleg.relist().await);
    assert_eq!(h.drain(), vec![("p1".into(), ContainerDied, sb.clone())]);
    assert_eq!(h.metrics.running_pods.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn relist_should_only_see_this_nodes_pods_and_empty_vanished_ones() {
    let mut h = harness(config(PlegMode::Relist));
    let sb = h.rt.add_sandbox("mine", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    let other = h.rt.add_sandbox("theirs", "node-b");
    h.rt.add_container(&other, "app", St::ContainerRunning);
    assert!(h.pleg.relist().await);
    assert!(h.drain().iter().all(|e| e.0 == "mine"));
    assert_eq!(h.cache.uids(), vec!["mine".to_string()]);
    assert_eq!(h.rt.calls("container_status"), 1);
    assert_eq!(h.rt.calls("podsandbox_status"), 1);

    // The pod disappears: its waiters get an empty status.
    h.rt.remove(&c);
    h.rt.remove(&sb);
    let before = h.cache.get("mine").timestamp;
    let waiter = {
        let cache = h.cache.clone();
        tokio::spawn(async move { cache.get_newer_than("mine", before).await })
    };
    assert!(h.pleg.relist().await);
    let e = tokio::time::timeout(Duration::from_secs(2), waiter).await;
    let e = e.ok().and_then(|r| r.ok()).unwrap_or_default();
    let s = e.status.unwrap_or_default();
    assert_eq!(s.uid, "mine");
    assert!(s.sandboxes.is_empty() && s.containers.is_empty());
    assert_eq!(h.metrics.running_pods.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn relist_should_bound_concurrent_inspections() {
    let mut cfg = config(PlegMode::Relist);
    cfg.inspect_concurrency = 3;
    let h = harness(cfg);
    for i in 0..12 {
        let sb = h.rt.add_sandbox(&format!("p{i}"), NODE);
        h.rt.add_container(&sb, "app", St::ContainerRunning);
    }
    h.rt.delay("container_status", Duration::from_millis(30));
    h.rt.delay("podsandbox_status", Duration::from_millis(30));
    assert!(h.pleg.relist().await);
    assert_eq!(h.cache.uids().len(), 12);
    // Concurrent (three in flight at once), never above the bound. A wall
    // clock bound would say the same and fail on a stalled machine.
    assert_eq!(h.rt.max_inflight_status(), 3);
}

#[tokio::test(start_paused = true)]
async fn failed_inspection_should_be_cached_and_retried_next_relist() {
    let h = harness(config(PlegMode::Relist));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    h.rt.fail_id(&c, true);
    assert!(h.pleg.relist().await);
    let e = h.cache.get("p1");
    assert!(
        e.error.as_deref().is_some_and(|m| m.contains("injected")),
        "{e:?}"
    );
    // Nothing changed in the listing, but the pod is inspected again.
    h.rt.fail_id(&c, false);
    assert!(h.pleg.relist().await);
    let e = h.cache.get("p1");
    assert!(e.error.is_none(), "{e:?}");
    assert_eq!(h.cached_state("p1", &c), Some(St::ContainerRunning as i32));
    // And then no more.
    let n = h.rt.calls("container_status");
    assert!(h.pleg.relist().await);
    assert_eq!(h.rt.calls("container_status"), n);
}

#[tokio::test(start_paused = true)]
async fn failed_list_should_not_advance_time_and_should_report_the_runtime() {
    let h = harness(config(PlegMode::Relist));
    h.rt.add_sandbox("p1", NODE);
    h.rt.fail("list_containers", Some(tonic::Code::Unavailable));
    assert!(!h.pleg.relist().await);
    assert_eq!(h.cache.global_timestamp(), 0);
    assert!(h.cache.uids().is_empty());
    let problems = h.health.check().err().unwrap_or_default();
    assert!(
        problems.iter().any(|p| p.contains("runtime is down")),
        "{problems:?}"
    );
    h.rt.fail("list_containers", None);
    assert!(h.pleg.relist().await);
    assert!(h.cache.global_timestamp() > 0);
    assert!(h.health.check().is_ok());
}

#[tokio::test(start_paused = true)]
async fn relist_mode_should_run_periodically_and_report_its_mode() {
    let mut h = harness(config(PlegMode::Relist));
    h.start();
    assert_eq!(h.wait_mode().await, Some(PlegMode::Relist));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    assert!(h
        .wait_event(|e| e.container_id == c && e.kind == ContainerStarted)
        .await
        .is_some());
    assert_eq!(h.rt.calls("get_container_events"), 0);
}

#[tokio::test(start_paused = true)]
async fn event_should_inspect_its_pod_at_once_and_emit_after_the_cache() {
    let mut h = harness(config(PlegMode::Events));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    let tx = h.rt.script_stream();
    h.start();
    assert_eq!(h.wait_mode().await, Some(PlegMode::Events));
    h.drain();
    h.rt.set_state(&c, St::ContainerExited);
    let _ = tx.send(Ok(h.rt.event(&c, Ev::ContainerStoppedEvent)));
    let e = h.wait_event(|_| true).await;
    assert!(
        e.as_ref()
            .is_some_and(|e| e.kind == ContainerDied && e.container_id == c && e.uid == "p1"),
        "{e:?}"
    );
    // Emitted after the inspection was cached.
    assert_eq!(h.cached_state("p1", &c), Some(St::ContainerExited as i32));
    assert!(h.health.check().is_ok());
}

#[tokio::test(start_paused = true)]
async fn created_event_should_update_the_cache_but_emit_nothing() {
    let mut h = harness(config(PlegMode::Events));
    let sb = h.rt.add_sandbox("p1", NODE);
    let tx = h.rt.script_stream();
    h.start();
    h.wait_mode().await;
    h.drain();
    let c = h.rt.add_container(&sb, "app", St::ContainerCreated);
    let _ = tx.send(Ok(h.rt.event(&c, Ev::ContainerCreatedEvent)));
    assert!(until(|| h.cached_state("p1", &c).is_some()).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(h.drain().is_empty());
}

#[tokio::test(start_paused = true)]
async fn foreign_events_should_be_ignored_and_unknown_ids_looked_up() {
    let mut h = harness(config(PlegMode::Events));
    let theirs = h.rt.add_sandbox("theirs", "node-b");
    let tx = h.rt.script_stream();
    h.start();
    h.wait_mode().await;
    let calls = h.rt.total_calls();
    let tc = h.rt.add_container(&theirs, "app", St::ContainerRunning);
    let _ = tx.send(Ok(h.rt.event(&tc, Ev::ContainerStartedEvent)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.rt.total_calls(), calls, "a foreign event costs nothing");
    assert!(h.cache.get("theirs").status.is_none());

    // An event without a payload for an id made since the last relist.
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    let mut ev = h.rt.event(&c, Ev::ContainerStartedEvent);
    ev.pod_sandbox_status = None;
    let _ = tx.send(Ok(ev));
    let e = h.wait_event(|e| e.container_id == c).await;
    assert!(e.is_some_and(|e| e.uid == "p1" && e.kind == ContainerStarted));
    assert_eq!(h.cached_state("p1", &c), Some(St::ContainerRunning as i32));
}

#[tokio::test(start_paused = true)]
async fn bursts_should_coalesce_into_few_inspections() {
    let mut h = harness(config(PlegMode::Events));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    let tx = h.rt.script_stream();
    h.start();
    h.wait_mode().await;
    h.drain();
    h.rt.delay("container_status", Duration::from_millis(40));
    let before = h.rt.calls("container_status");
    for _ in 0..20 {
        let _ = tx.send(Ok(h.rt.event(&c, Ev::ContainerStartedEvent)));
    }
    // Two rounds at most (40 ms each), then the burst is reported once
    // per round at most.
    assert!(h.wait_event(|e| e.container_id == c).await.is_some());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let more = h.drain().len();
    assert!(more <= 1, "{} events for one burst", more + 1);
    let inspections = h.rt.calls("container_status") - before;
    assert!(
        (1..=2).contains(&inspections),
        "{inspections} inspections for one burst"
    );
}

#[tokio::test(start_paused = true)]
async fn reordered_duplicate_and_stale_events_should_never_move_the_cache_backwards() {
    let mut h = harness(config(PlegMode::Events));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    let tx = h.rt.script_stream();
    h.start();
    h.wait_mode().await;
    let started = h.rt.event(&c, Ev::ContainerStartedEvent);

    // A slow relist sees the container running, then it exits and a fast
    // event-triggered inspection caches the exit before the relist ends.
    h.rt.delay("container_status", Duration::from_millis(150));
    h.rt.set_state(&c, St::ContainerRunning);
    let slow = {
        let pleg = h.pleg.clone();
        tokio::spawn(async move { pleg.inspect("p1").await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.rt.delay("container_status", Duration::ZERO);
    h.rt.set_state(&c, St::ContainerExited);
    let _ = tx.send(Ok(h.rt.event(&c, Ev::ContainerStoppedEvent)));
    assert!(h.wait_event(|e| e.kind == ContainerDied).await.is_some());
    let exited_ts = h.cache.get("p1").timestamp;
    let _ = slow.await;
    assert_eq!(h.cached_state("p1", &c), Some(St::ContainerExited as i32));
    assert_eq!(h.cache.get("p1").timestamp, exited_ts);

    // A stale STARTED (created before the cached inspection) and
    // duplicates: the cache keeps the exit and only moves forward.
    let calls = h.rt.calls("container_status");
    let _ = tx.send(Ok(started));
    assert!(h.wait_event(|e| e.kind == ContainerStarted).await.is_some());
    assert_eq!(
        h.rt.calls("container_status"),
        calls,
        "a provably stale event is not inspected"
    );
    for _ in 0..3 {
        let _ = tx.send(Ok(h.rt.event(&c, Ev::ContainerStoppedEvent)));
    }
    // Duplicates coalesce: reported at least once, at most once a round.
    assert!(h.wait_event(|e| e.kind == ContainerDied).await.is_some());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(h.drain().len() <= 1);
    assert_eq!(h.cached_state("p1", &c), Some(St::ContainerExited as i32));
    assert!(h.cache.get("p1").timestamp >= exited_ts);
    assert_eq!(h.rt.state_of(&c), Some(St::ContainerExited));
}

#[tokio::test(start_paused = true)]
async fn cut_stream_should_reconnect_with_backoff_and_relist_missed_exits() {
    // No relisting while disconnected: only the reconnect's relist can
    // find the exit.
    let mut cfg = config(PlegMode::Events);
    cfg.relist_period = Duration::from_secs(3600);
    let mut h = harness(cfg);
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    let tx = h.rt.script_stream();
    h.start();
    h.wait_mode().await;
    h.drain();
    // The runtime goes away: the stream breaks, the container exits
    // unseen, and the next connects fail.
    h.rt.script_failure(tonic::Code::Unavailable);
    h.rt.script_failure(tonic::Code::Unavailable);
    h.rt.script_failure(tonic::Code::Unavailable);
    let tx2 = h.rt.script_stream();
    h.rt.set_state(&c, St::ContainerExited);
    let cut = tokio::time::Instant::now();
    let _ = tx.send(Err(crate::cri::CriError {
        operation: "get_container_events",
        code: tonic::Code::Unavailable,
        message: "transport closed".into(),
    }));
    drop(tx);
    let e = h.wait_event(|e| e.container_id == c).await;
    assert!(e.is_some_and(|e| e.kind == ContainerDied));
    // Back-off 20 + 40 + 80 + 160 ms before the fourth attempt (and not
    // much more: the reconnect's relist follows at once).
    assert!(
        cut.elapsed() >= Duration::from_millis(300) && cut.elapsed() < Duration::from_millis(350),
        "{:?}",
        cut.elapsed()
    );
    assert_eq!(h.cached_state("p1", &c), Some(St::ContainerExited as i32));
    assert_eq!(h.rt.calls("get_container_events"), 5);
    assert_eq!(h.metrics.evented_pleg_connection_successes.get(), 2);
    assert_eq!(h.metrics.evented_pleg_connection_errors.get(), 4);
    assert_eq!(h.pleg.mode_in_use(), Some(PlegMode::Events));
    // The new stream works.
    h.rt.remove(&c);
    let _ = tx2.send(Ok(h.rt.event(&c, Ev::ContainerDeletedEvent)));
    let e = h.wait_event(|e| e.container_id == c).await;
    assert!(e.is_some_and(|e| e.kind == ContainerRemoved));
}

#[tokio::test(start_paused = true)]
async fn auto_should_relist_for_good_when_events_are_unimplemented() {
    let mut h = harness(config(PlegMode::Auto));
    h.rt.script_failure(tonic::Code::Unimplemented);
    let sb = h.rt.add_sandbox("p1", NODE);
    h.start();
    assert_eq!(h.wait_mode().await, Some(PlegMode::Relist));
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    assert!(h.wait_event(|e| e.container_id == c).await.is_some());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.rt.calls("get_container_events"), 1);
    assert_eq!(h.metrics.evented_pleg_connection_errors.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn auto_should_relist_while_the_runtime_is_down_and_switch_to_events() {
    let mut h = harness(config(PlegMode::Auto));
    h.rt.script_failure(tonic::Code::Unavailable);
    h.rt.script_failure(tonic::Code::Unavailable);
    h.rt.fail("list_podsandbox", Some(tonic::Code::Unavailable));
    h.start();
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(h.pleg.mode_in_use(), None);
    assert!(h.health.check().is_err());
    h.rt.fail("list_podsandbox", None);
    let _tx = h.rt.script_stream();
    assert!(until(|| h.pleg.mode_in_use() == Some(PlegMode::Events)).await);
    assert!(h.health.check().is_ok());
    // Relisting stops once events flow.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lists = h.rt.calls("list_podsandbox");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(h.rt.calls("list_podsandbox"), lists);
    h.drain();
}

#[tokio::test(start_paused = true)]
async fn events_mode_should_make_no_calls_while_idle() {
    let mut h = harness(config(PlegMode::Events));
    for i in 0..5 {
        let sb = h.rt.add_sandbox(&format!("p{i}"), NODE);
        h.rt.add_container(&sb, "app", St::ContainerRunning);
    }
    let _tx = h.rt.script_stream();
    h.start();
    h.wait_mode().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let calls = h.rt.total_calls();
    // Ten relist periods of quiet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.rt.total_calls(), calls);
    assert!(h.health.check().is_ok());
}

#[tokio::test(start_paused = true)]
async fn events_mode_should_keep_retrying_unimplemented_and_relist_meanwhile() {
    let mut h = harness(config(PlegMode::Events));
    for _ in 0..4 {
        h.rt.script_failure(tonic::Code::Unimplemented);
    }
    h.start();
    assert_eq!(h.wait_mode().await, Some(PlegMode::Events));
    let sb = h.rt.add_sandbox("p1", NODE);
    assert!(h.wait_event(|e| e.container_id == sb).await.is_some());
    // Never given up: it connects once the runtime serves events.
    let _tx = h.rt.script_stream();
    assert!(until(|| h.metrics.evented_pleg_connection_successes.get() == 1).await);
}

#[tokio::test(start_paused = true)]
async fn inspect_should_cache_a_status_newer_than_the_call() {
    let h = harness(config(PlegMode::Relist));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerCreated);
    let before = crate::cache::now_ns();
    assert!(h.pleg.inspect("p1").await.is_ok());
    let e = h.cache.get("p1");
    assert!(e.timestamp >= before);
    assert_eq!(h.cached_state("p1", &c), Some(St::ContainerCreated as i32));
    h.rt.fail("list_containers", Some(tonic::Code::Internal));
    assert!(h.pleg.inspect("p1").await.is_err());
    assert!(h.cache.get("p1").error.is_some());
}

#[tokio::test(start_paused = true)]
async fn changes_seen_by_events_should_not_be_reported_again_by_the_relist() {
    let mut h = harness(config(PlegMode::Events));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c1 = h.rt.add_container(&sb, "a", St::ContainerRunning);
    let c2 = h.rt.add_container(&sb, "b", St::ContainerRunning);
    let tx = h.rt.script_stream();
    h.start();
    h.wait_mode().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.drain();
    // Both exit, but the runtime loses c2's event: the inspection that
    // c1's event triggers reports both.
    h.rt.set_state(&c1, St::ContainerExited);
    h.rt.set_state(&c2, St::ContainerExited);
    let _ = tx.send(Ok(h.rt.event(&c1, Ev::ContainerStoppedEvent)));
    assert!(h
        .wait_event(|e| e.container_id == c1 && e.kind == ContainerDied)
        .await
        .is_some());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let rest = h.drain();
    assert_eq!(rest, vec![("p1".into(), ContainerDied, c2.clone())]);
    // The safety-net relist finds nothing new: no events, no inspection.
    let statuses = h.rt.calls("container_status");
    assert!(h.pleg.relist().await);
    assert!(h.drain().is_empty());
    assert_eq!(h.rt.calls("container_status"), statuses);
    assert_eq!(
        h.metrics
            .running_containers
            .get_or_create(&crate::metrics::ContainerStateLabels {
                container_state: "exited".into()
            })
            .get(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn inspect_should_report_the_changes_it_finds() {
    let mut h = harness(config(PlegMode::Relist));
    let sb = h.rt.add_sandbox("p1", NODE);
    let c = h.rt.add_container(&sb, "app", St::ContainerRunning);
    assert!(h.pleg.relist().await);
    h.drain();
    h.rt.set_state(&c, St::ContainerExited);
    assert!(h.pleg.inspect("p1").await.is_ok());
    assert_eq!(h.drain(), vec![("p1".into(), ContainerDied, c.clone())]);
    // Already reported: the relist stays quiet.
    assert!(h.pleg.relist().await);
    assert!(h.drain().is_empty());
}

/// A harness in events mode with pod p1 (a sandbox and `names`, running)
/// seen by the first relist; the stream's sender and the ids.
async fn events_harness(names: &[&str]) -> (Harness, StreamTx, String, Vec<String>) {
    let mut h = harness(config(PlegMode::Events));
    let sb = h.rt.add_sandbox("p1", NODE);
    let ids = names
        .iter()
        .map(|n| h.rt.add_container(&sb, n, St::ContainerRunning))
        .collect();
    let tx = h.rt.script_stream();
    h.start();
    h.wait_mode().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    h.drain();
    (h, tx, sb, ids)
}

#[tokio::test(start_paused = true)]
async fn full_payload_should_become_the_cached_status_without_calls() {
    let (mut h, tx, sb, ids) = events_harness(&["app"]).await;
    let c = &ids[0];
    let calls = h.rt.total_calls();
    h.rt.exit(c, 3);
    let ev = h.rt.event_full(c, Ev::ContainerStoppedEvent);
    let created_at = ev.created_at;
    let _ = tx.send(Ok(ev));
    let e = h.wait_event(|_| true).await;
    assert!(
        e.as_ref()
            .is_some_and(|e| e.kind == ContainerDied && &e.container_id == c && e.uid == "p1"),
        "{e:?}"
    );
    assert_eq!(h.rt.total_calls(), calls, "the payload was the inspection");
    // Cached before the event was emitted, stamped with its creation.
    let entry = h.cache.get("p1");
    assert_eq!(entry.timestamp, created_at);
    let status = entry.status.unwrap();
    let cs = status.containers.iter().find(|s| &s.id == c).unwrap();
    assert_eq!((cs.state, cs.exit_code), (St::ContainerExited as i32, 3));
    assert_eq!(cs.log_path, "app/0.log");
    assert_eq!(status.container_meta[c].sandbox_id, sb);
    assert_eq!(
        (status.name.as_str(), status.namespace.as_str()),
        ("pod-p1", "default")
    );
    // The same as an inspection finds.
    assert!(h.pleg.inspect("p1").await.is_ok());
    assert!(h.drain().is_empty(), "an inspection finds nothing new");
    let again = h.cache.get("p1").status.unwrap();
    assert_eq!(again.containers, status.containers);
    assert_eq!(again.sandboxes, status.sandboxes);
    assert_eq!(again.container_meta, status.container_meta);
    // The relist agrees: nothing to report or inspect.
    let statuses = h.rt.calls("container_status");
    assert!(h.pleg.relist().await);
    assert!(h.drain().is_empty());
    assert_eq!(h.rt.calls("container_status"), statuses);
}

#[tokio::test(start_paused = true)]
async fn stale_payload_should_be_ignored() {
    let (mut h, tx, _sb, ids) = events_harness(&["app"]).await;
    let c = &ids[0];
    let old = h.rt.event_full(c, Ev::ContainerStartedEvent);
    tokio::time::sleep(Duration::from_millis(1)).await;
    h.rt.exit(c, 0);
    let _ = tx.send(Ok(h.rt.event_full(c, Ev::ContainerStoppedEvent)));
    assert!(h.wait_event(|e| e.kind == ContainerDied).await.is_some());
    let exited_ts = h.cache.get("p1").timestamp;
    let calls = h.rt.total_calls();
    // Delivered late: older than the cache, it changes nothing and costs
    // nothing.
    let _ = tx.send(Ok(old));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(h.rt.total_calls(), calls);
    assert_eq!(h.cache.get("p1").timestamp, exited_ts);
    assert_eq!(h.cached_state("p1", c), Some(St::ContainerExited as i32));
    assert!(!h.drain().iter().any(|e| e.1 == ContainerDied));
}

#[tokio::test(start_paused = true)]
async fn incomplete_payload_should_fall_back_to_inspection() {
    type Spoil = fn(&mut petrel_cri::api::ContainerEventResponse, &str);
    let cases: [(&str, Spoil); 6] = [
        ("no container statuses", |ev, _| {
            ev.containers_statuses.clear()
        }),
        ("no sandbox status", |ev, _| ev.pod_sandbox_status = None),
        ("a seen container missing", |ev, other| {
            ev.containers_statuses.retain(|c| c.id != other)
        }),
        ("no timestamp", |ev, _| ev.created_at = 0),
        ("a container without metadata", |ev, _| {
            ev.containers_statuses[0].metadata = None
        }),
        ("the sandbox's own event", |ev, _| {
            ev.container_id = ev.pod_sandbox_status.as_ref().unwrap().id.clone()
        }),
    ];
    for (what, spoil) in cases {
        let (mut h, tx, _sb, ids) = events_harness(&["app", "other"]).await;
        let (c, other) = (&ids[0], &ids[1]);
        let statuses = h.rt.calls("container_status");
        h.rt.exit(c, 1);
        let mut ev = h.rt.event_full(c, Ev::ContainerStoppedEvent);
        spoil(&mut ev, other);
        let _ = tx.send(Ok(ev));
        assert!(
            h.wait_event(|e| &e.container_id == c && e.kind == ContainerDied)
                .await
                .is_some(),
            "{what}"
        );
        assert!(
            h.rt.calls("container_status") >= statuses + 2,
            "{what}: the pod was inspected"
        );
        assert_eq!(
            h.cached_state("p1", c),
            Some(St::ContainerExited as i32),
            "{what}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn payload_of_a_pod_with_two_sandboxes_should_fall_back_to_inspection() {
    let (mut h, tx, sb1, _) = events_harness(&["app"]).await;
    // The pod's sandbox is replaced; the old one is still there.
    h.rt.stop_sandbox(&sb1);
    let sb2 = h.rt.add_sandbox("p1", NODE);
    assert!(h.pleg.relist().await);
    h.drain();
    let c = h.rt.add_container(&sb2, "app", St::ContainerRunning);
    let statuses = h.rt.calls("podsandbox_status");
    let _ = tx.send(Ok(h.rt.event_full(&c, Ev::ContainerStartedEvent)));
    assert!(h.wait_event(|e| e.container_id == c).await.is_some());
    assert_eq!(h.rt.calls("podsandbox_status"), statuses + 2);
    let st = h.cache.get("p1").status.unwrap();
    assert_eq!(st.sandboxes.len(), 2, "both sandboxes stay in the status");
}

#[tokio::test(start_paused = true)]
async fn payload_without_the_agents_annotations_should_fetch_only_that_container() {
    let (mut h, tx, _sb, ids) = events_harness(&["app", "other"]).await;
    let (c, other) = (&ids[0], &ids[1]);
    h.rt.exit(c, 2);
    let mut ev = h.rt.event_full(c, Ev::ContainerStoppedEvent);
    for s in &mut ev.containers_statuses {
        if &s.id == c {
            s.annotations.clear();
            s.log_path.clear();
        }
    }
    let (lists, sandboxes) = (
        h.rt.calls("list_containers"),
        h.rt.calls("podsandbox_status"),
    );
    let statuses = h.rt.calls("container_status");
    let _ = tx.send(Ok(ev));
    assert!(h.wait_event(|e| e.kind == ContainerDied).await.is_some());
    assert_eq!(h.rt.calls("container_status"), statuses + 1);
    assert_eq!(h.rt.calls("list_containers"), lists);
    assert_eq!(h.rt.calls("podsandbox_status"), sandboxes);
    let st = h.cache.get("p1").status.unwrap();
    let cs = st.containers.iter().find(|s| &s.id == c).unwrap();
    assert_eq!(cs.log_path, "app/0.log");
    assert!(!st.container_meta[c].init);
    assert!(st.containers.iter().any(|s| &s.id == other));
}

#[tokio::test(start_paused = true)]
async fn deleted_event_should_fall_back_to_inspection() {
    let (mut h, tx, _sb, ids) = events_harness(&["app", "other"]).await;
    let c = &ids[0];
    h.rt.exit(c, 0);
    let _ = tx.send(Ok(h.rt.event_full(c, Ev::ContainerStoppedEvent)));
    assert!(h.wait_event(|e| e.kind == ContainerDied).await.is_some());
    let ev = h.rt.event_full(c, Ev::ContainerDeletedEvent);
    h.rt.remove(c);
    let lists = h.rt.calls("list_containers");
    let _ = tx.send(Ok(ev));
    assert!(h.wait_event(|e| e.kind == ContainerRemoved).await.is_some());
    assert_eq!(h.rt.calls("list_containers"), lists + 1);
    assert_eq!(h.cached_state("p1", c), None);
}

#[tokio::test(start_paused = true)]
async fn bursts_of_full_payloads_should_cost_nothing_and_report_once() {
    let (mut h, tx, _sb, ids) = events_harness(&["app"]).await;
    let c = &ids[0];
    let calls = h.rt.total_calls();
    for _ in 0..20 {
        let _ = tx.send(Ok(h.rt.event_full(c, Ev::ContainerStartedEvent)));
    }
    h.rt.exit(c, 1);
    for _ in 0..20 {
        let _ = tx.send(Ok(h.rt.event_full(c, Ev::ContainerStoppedEvent)));
    }
    assert!(h.wait_event(|e| e.kind == ContainerDied).await.is_some());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(h.drain().is_empty(), "the exit is reported once");
    assert_eq!(h.rt.total_calls(), calls);
    assert_eq!(h.cached_state("p1", c), Some(St::ContainerExited as i32));
}

#[tokio::test(start_paused = true)]
async fn payload_newer_than_an_inspection_in_flight_should_win() {
    let (mut h, tx, _sb, ids) = events_harness(&["app"]).await;
    let c = &ids[0];
    // A slow inspection lists the container running...
    let statuses = h.rt.calls("container_status");
    h.rt.delay("container_status", Duration::from_millis(100));
    let slow = {
        let pleg = h.pleg.clone();
        tokio::spawn(async move { pleg.inspect("p1").await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // ...while the container exits and the event's payload says so.
    h.rt.exit(c, 1);
    let _ = tx.send(Ok(h.rt.event_full(c, Ev::ContainerStoppedEvent)));
    assert!(h.wait_event(|e| e.kind == ContainerDied).await.is_some());
    let ts = h.cache.get("p1").timestamp;
    let _ = slow.await;
    assert_eq!(h.cache.get("p1").timestamp, ts, "the older inspection lost");
    assert_eq!(
        h.rt.calls("container_status"),
        statuses + 1,
        "the payload needed no inspection of its own"
    );
    assert_eq!(h.cached_state("p1", c), Some(St::ContainerExited as i32));
}
