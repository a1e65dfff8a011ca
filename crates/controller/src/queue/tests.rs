use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::*;
use crate::ratelimit::ItemExponential;

const MS: Duration = Duration::from_millis(1);

fn queue<K: Eq + Hash + Clone + Send + Sync + 'static>() -> WorkQueue<K> {
    WorkQueue::new(QueueConfig::default().name("test").seed(1))
}

fn keys<K>(q: &WorkQueue<K>) -> Vec<K>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    // Takes every ready item and finishes it, in serving order.
    std::iter::from_fn(|| {
        let i = q.try_get()?;
        q.done(&i.key);
        Some(i.key)
    })
    .collect()
}

#[test]
fn add_should_not_queue_a_waiting_key_twice() {
    let q = queue();
    q.add("a", Priority::Normal);
    q.add("a", Priority::Normal);
    q.add("a", Priority::Background);
    assert_eq!(q.len(), 1);
    assert_eq!(keys(&q), ["a"]);
    assert!(q.try_get().is_none());
}

#[test]
fn add_should_keep_the_highest_priority_of_a_waiting_key() {
    let q = queue();
    q.add("n", Priority::Normal);
    q.add("a", Priority::Background);
    q.add("a", Priority::Urgent);
    q.add("a", Priority::Background);
    assert_eq!(q.depth(Priority::Urgent), 1);
    assert_eq!(q.depth(Priority::Background), 0);
    let first = q.try_get().expect("an item");
    assert_eq!((first.key, first.priority), ("a", Priority::Urgent));
}

#[test]
fn raising_a_priority_should_keep_the_place_by_ready_time() {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
        .block_on(async {
            let q = queue();
            q.add("old", Priority::Background);
            tokio::time::advance(MS).await;
            q.add("new", Priority::Normal);
            q.add("old", Priority::Normal);
            assert_eq!(keys(&q), ["old", "new"]);
        });
}

#[test]
fn get_should_serve_by_tier_then_arrival() {
    let q = queue();
    q.add(1, Priority::Background);
    q.add(2, Priority::Normal);
    q.add(3, Priority::Urgent);
    q.add(4, Priority::Background);
    q.add(5, Priority::Urgent);
    q.add(6, Priority::Normal);
    assert_eq!(keys(&q), [3, 5, 2, 6, 1, 4]);
}

#[test]
fn item_should_carry_its_priority_and_waiting_time() {
    let q = queue();
    q.add("k", Priority::Normal);
    let i = q.try_get().expect("an item");
    assert_eq!(i.priority, Priority::Normal);
    assert!(i.waited < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn add_after_should_not_serve_before_the_ready_time() {
    let q = queue();
    q.add_after("late", Priority::Urgent, 10 * MS);
    q.add_after("early", Priority::Background, 5 * MS);
    assert!(q.try_get().is_none());
    assert_eq!(q.len(), 0);
    tokio::time::advance(5 * MS).await;
    assert_eq!(keys(&q), ["early"]);
    tokio::time::advance(5 * MS).await;
    assert_eq!(keys(&q), ["late"]);
}

#[tokio::test(start_paused = true)]
async fn add_after_should_order_items_due_together_by_ready_time() {
    let q = queue();
    q.add_after(2, Priority::Normal, 2 * MS);
    q.add_after(1, Priority::Normal, MS);
    tokio::time::advance(2 * MS).await;
    q.add(3, Priority::Normal);
    assert_eq!(keys(&q), [1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn add_after_should_keep_the_earliest_ready_time() {
    let q = queue();
    q.add_after("a", Priority::Normal, 10 * MS);
    q.add_after("a", Priority::Normal, 2 * MS);
    q.add_after("b", Priority::Normal, 2 * MS);
    q.add_after("b", Priority::Normal, 10 * MS);
    tokio::time::advance(2 * MS).await;
    let mut got = keys(&q);
    got.sort_unstable();
    assert_eq!(got, ["a", "b"]);
    tokio::time::advance(20 * MS).await;
    assert!(
        q.try_get().is_none(),
        "the later ready times were merged away"
    );
}

#[tokio::test(start_paused = true)]
async fn add_should_make_a_delayed_key_ready_now_at_the_higher_priority() {
    let q = queue();
    q.add_after("k", Priority::Urgent, Duration::from_secs(60));
    q.add("other", Priority::Normal);
    q.add("k", Priority::Background);
    let i = q.try_get().expect("an item");
    assert_eq!((i.key, i.priority), ("k", Priority::Urgent));
    q.done(&"k");
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(keys(&q), ["other"], "the delayed copy is gone");
}

#[test]
fn add_should_mark_a_key_being_processed_dirty_and_requeue_it_on_done() {
    let q = queue();
    q.add("k", Priority::Normal);
    let i = q.try_get().expect("an item");
    q.add("k", Priority::Normal);
    assert!(q.try_get().is_none(), "never handed out twice at once");
    assert_eq!(q.len(), 0);
    q.done(&i.key);
    assert_eq!(q.len(), 1);
    assert_eq!(keys(&q), ["k"]);
    assert!(q.try_get().is_none());
}

#[test]
fn done_should_requeue_a_dirty_key_at_the_highest_priority_given_meanwhile() {
    let q = queue();
    q.add("k", Priority::Background);
    let i = q.try_get().expect("an item");
    q.add("k", Priority::Background);
    q.add("k", Priority::Urgent);
    q.add("k", Priority::Normal);
    q.add("n", Priority::Normal);
    q.done(&i.key);
    let i = q.try_get().expect("an item");
    assert_eq!((i.key, i.priority), ("k", Priority::Urgent));
}

#[test]
fn done_should_ignore_a_key_not_being_processed() {
    let q = queue();
    q.done(&"nobody");
    q.add("k", Priority::Normal);
    q.done(&"k");
    assert_eq!(q.len(), 1, "a waiting key is not touched by done");
    assert_eq!(keys(&q), ["k"]);
}

#[tokio::test(start_paused = true)]
async fn delayed_add_due_while_processing_should_requeue_on_done() {
    let q = queue();
    q.add("k", Priority::Normal);
    let i = q.try_get().expect("an item");
    q.add_after("k", Priority::Urgent, 5 * MS);
    tokio::time::advance(10 * MS).await;
    assert!(q.try_get().is_none());
    q.done(&i.key);
    let i = q.try_get().expect("requeued");
    assert_eq!((i.key, i.priority), ("k", Priority::Urgent));
}

#[tokio::test(start_paused = true)]
async fn delayed_add_not_due_at_done_should_wait_for_its_time() {
    let q = queue();
    q.add("k", Priority::Normal);
    let i = q.try_get().expect("an item");
    q.add_after("k", Priority::Normal, 50 * MS);
    q.done(&i.key);
    assert!(q.try_get().is_none());
    tokio::time::advance(50 * MS).await;
    assert_eq!(keys(&q), ["k"]);
}

#[tokio::test(start_paused = true)]
async fn get_should_sleep_until_the_earliest_ready_time() {
    let q = queue();
    let t0 = Instant::now();
    q.add_after("k", Priority::Normal, Duration::from_secs(3));
    let i = q.get().await.expect("an item");
    assert_eq!(i.key, "k");
    assert_eq!(Instant::now() - t0, Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn get_should_wake_for_an_earlier_delay_added_while_sleeping() {
    let q = queue();
    let t0 = Instant::now();
    q.add_after("late", Priority::Normal, Duration::from_secs(10));
    let getter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await.map(|i| (i.key, Instant::now())) }
    });
    tokio::time::sleep(MS).await;
    q.add_after("soon", Priority::Normal, Duration::from_secs(1));
    let (key, at) = getter.await.expect("getter").expect("an item");
    assert_eq!(key, "soon");
    assert_eq!(at - t0, Duration::from_secs(1) + MS);
}

#[tokio::test(start_paused = true)]
async fn idle_getters_should_each_get_a_delayed_item_at_its_time() {
    let q: WorkQueue<u32> = queue();
    let mut getters = vec![];
    for _ in 0..3 {
        let q = q.clone();
        getters.push(tokio::spawn(async move {
            let i = q.get().await.expect("an item");
            (i.key, Instant::now())
        }));
    }
    tokio::time::sleep(MS).await;
    let t0 = Instant::now();
    for k in 1..=3 {
        q.add_after(k, Priority::Normal, Duration::from_secs(u64::from(k)));
    }
    let mut got = vec![];
    for g in getters {
        let (k, at) = g.await.expect("getter");
        got.push((k, at - t0));
    }
    got.sort_unstable();
    assert_eq!(
        got,
        (1..=3)
            .map(|k| (k, Duration::from_secs(u64::from(k))))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn get_should_lose_nothing_when_cancelled_while_owning_the_timer() {
    let q = queue();
    q.add_after("k", Priority::Normal, Duration::from_secs(1));
    let first = tokio::time::timeout(100 * MS, q.get()).await;
    assert!(first.is_err(), "nothing ready within 100 ms");
    let i = q.get().await.expect("the timer was handed on");
    assert_eq!(i.key, "k");
}

#[tokio::test(start_paused = true)]
async fn cancelled_timer_owner_should_hand_the_timer_to_a_waiting_getter() {
    let q = queue();
    q.add_after("k", Priority::Normal, Duration::from_secs(1));
    // The first getter takes the timer, the second waits for a notification.
    let owner = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    tokio::time::sleep(MS).await;
    let other = tokio::spawn({
        let q = q.clone();
        async move { q.get().await.map(|i| i.key) }
    });
    tokio::time::sleep(MS).await;
    owner.abort();
    let got = tokio::time::timeout(Duration::from_secs(5), other).await;
    assert_eq!(
        got.expect("served in time").expect("getter"),
        Some("k"),
        "the waiting getter took the timer over"
    );
}

#[tokio::test(start_paused = true)]
async fn get_should_serve_a_starved_item_before_higher_tiers() {
    let q = WorkQueue::new(QueueConfig::default().max_wait(Duration::from_secs(2)));
    q.add("bg", Priority::Background);
    tokio::time::advance(Duration::from_secs(1)).await;
    q.add("u1", Priority::Urgent);
    assert_eq!(q.try_get().map(|i| i.key), Some("u1"), "not starved yet");
    tokio::time::advance(Duration::from_secs(1)).await;
    q.add("u2", Priority::Urgent);
    let i = q.try_get().expect("an item");
    assert_eq!(i.key, "bg", "ready for max_wait: served first");
    assert_eq!(i.priority, Priority::Background);
    assert_eq!(i.waited, Duration::from_secs(2));
}

#[tokio::test(start_paused = true)]
async fn get_should_alternate_starved_items_oldest_first_with_higher_tiers() {
    let q = WorkQueue::new(QueueConfig::default().max_wait(Duration::from_secs(1)));
    q.add("normal", Priority::Normal);
    tokio::time::advance(MS).await;
    q.add("bg", Priority::Background);
    tokio::time::advance(Duration::from_secs(2)).await;
    q.add("u1", Priority::Urgent);
    q.add("u2", Priority::Urgent);
    assert_eq!(keys(&q), ["normal", "u1", "bg", "u2"]);
}

#[tokio::test(start_paused = true)]
async fn a_starved_backlog_should_not_go_before_every_newer_urgent_item() {
    let q = WorkQueue::new(QueueConfig::default().max_wait(Duration::from_secs(1)));
    for i in 0..1000 {
        q.add(format!("bg{i}"), Priority::Background);
    }
    tokio::time::advance(Duration::from_secs(2)).await;
    q.add("user".to_string(), Priority::Urgent);
    // One starved item, then the user's: not a thousand.
    let first: Vec<String> = (0..2).filter_map(|_| q.try_get().map(|i| i.key)).collect();
    assert_eq!(first, ["bg0", "user"]);
}

/// The starvation bound under a saturating urgent load: a producer keeps
/// the urgent tier from ever emptying (it adds faster than the workers
/// take), yet the background item is served within max_wait plus one
/// reconcile. Returns when it was served (`None`: not within the test's
/// horizon).
async fn background_wait_under_urgent_flood(max_wait: Duration) -> Option<Duration> {
    let q: WorkQueue<u64> = WorkQueue::new(QueueConfig::default().max_wait(max_wait));
    let reconcile = 10 * MS;
    let horizon = Duration::from_secs(20);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = tokio::spawn({
        let (q, stop) = (q.clone(), stop.clone());
        async move {
            let mut k = 1_000u64;
            while !stop.load(Ordering::Relaxed) {
                // 4 workers take 400 per second; 1000 per second arrive.
                for _ in 0..10 {
                    q.add(k, Priority::Urgent);
                    k += 1;
                }
                tokio::time::sleep(10 * MS).await;
            }
        }
    });
    tokio::time::sleep(50 * MS).await;
    assert!(q.depth(Priority::Urgent) > 0, "the flood has started");
    let t0 = Instant::now();
    q.add(0, Priority::Background);
    let served = Arc::new(Mutex::new(None));
    let min_urgent_depth = Arc::new(AtomicUsize::new(usize::MAX));
    let mut workers = vec![];
    for _ in 0..4 {
        let (q, served, min_depth) = (q.clone(), served.clone(), min_urgent_depth.clone());
        workers.push(tokio::spawn(async move {
            while let Some(i) = q.get().await {
                min_depth.fetch_min(q.depth(Priority::Urgent), Ordering::Relaxed);
                if i.key == 0 {
                    *served.lock().expect("lock") = Some(Instant::now() - t0);
                }
                tokio::time::sleep(reconcile).await;
                q.done(&i.key);
            }
        }));
    }
    let deadline = t0 + horizon;
    while served.lock().expect("lock").is_none() && Instant::now() < deadline {
        tokio::time::sleep(10 * MS).await;
    }
    stop.store(true, Ordering::Relaxed);
    q.shut_down();
    producer.await.expect("producer");
    for w in workers {
        w.await.expect("worker");
    }
    assert!(
        min_urgent_depth.load(Ordering::Relaxed) > 0,
        "the urgent tier never emptied: the load saturated the workers"
    );
    let served = *served.lock().expect("lock");
    served
}

#[tokio::test(start_paused = true)]
async fn starvation_bound_should_hold_under_a_saturating_urgent_load() {
    let max_wait = Duration::from_secs(2);
    let waited = background_wait_under_urgent_flood(max_wait)
        .await
        .expect("the background item was served");
    // Served by the first worker to come free after max_wait.
    assert!(waited >= max_wait, "{waited:?}");
    assert!(waited <= max_wait + 10 * MS, "{waited:?}");
}

#[tokio::test(start_paused = true)]
async fn without_a_bound_a_saturating_urgent_load_should_starve_background() {
    // The control for the test above: with the bound out of reach the same
    // load starves the item for the whole horizon, so the test above
    // measures the bound and not a lull in the load.
    let waited = background_wait_under_urgent_flood(Duration::from_secs(3600)).await;
    assert_eq!(waited, None);
}

#[tokio::test(start_paused = true)]
async fn lower_tier_limit_should_keep_a_worker_for_urgent_items() {
    let q = WorkQueue::new(QueueConfig::default().lower_tier_limit(2));
    for k in 0..5 {
        q.add(k, Priority::Background);
    }
    let a = q.try_get().expect("first background");
    let b = q.try_get().expect("second background");
    assert!(q.try_get().is_none(), "the third worker is kept for urgent");
    let waiter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await.map(|i| (i.key, i.priority)) }
    });
    tokio::time::sleep(MS).await;
    assert!(!waiter.is_finished());
    q.add(100, Priority::Urgent);
    assert_eq!(waiter.await.expect("getter"), Some((100, Priority::Urgent)));
    assert!(q.try_get().is_none());
    // A lower-tier slot coming free wakes a getter for background work.
    let waiter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await.map(|i| i.key) }
    });
    tokio::time::sleep(MS).await;
    q.done(&a.key);
    assert_eq!(waiter.await.expect("getter"), Some(2));
    q.done(&b.key);
}

#[tokio::test(start_paused = true)]
async fn lower_tier_share_should_rest_lower_tiers_in_proportion_to_their_work() {
    let q = WorkQueue::new(QueueConfig::default().lower_tier_share(0.25));
    for k in 0..3 {
        q.add(k, Priority::Background);
    }
    let a = q.try_get().expect("first background");
    tokio::time::advance(10 * MS).await;
    q.done(&a.key);
    // 10 ms of work at a quarter share: 30 ms of rest for lower tiers.
    assert!(q.try_get().is_none(), "resting");
    q.add(100, Priority::Urgent);
    assert_eq!(q.try_get().map(|i| i.key), Some(100), "urgent never rests");
    q.done(&100);
    tokio::time::advance(29 * MS).await;
    assert!(q.try_get().is_none(), "still resting");
    tokio::time::advance(MS).await;
    let b = q.try_get().expect("rest over");
    assert_eq!(b.key, 1);
    // A reconcile with nothing to do earns next to no rest.
    q.done(&b.key);
    assert_eq!(q.try_get().map(|i| i.key), Some(2));
}

#[tokio::test(start_paused = true)]
async fn lower_tier_rests_should_add_up_across_concurrent_items() {
    let q = WorkQueue::new(QueueConfig::default().lower_tier_share(0.5));
    for k in 0..3 {
        q.add(k, Priority::Normal);
    }
    let a = q.try_get().expect("a");
    let b = q.try_get().expect("b");
    tokio::time::advance(20 * MS).await;
    q.done(&a.key);
    q.done(&b.key);
    // Two items of 20 ms at half share: 40 ms of rest, not 20.
    tokio::time::advance(39 * MS).await;
    assert!(q.try_get().is_none());
    tokio::time::advance(MS).await;
    assert_eq!(q.try_get().map(|i| i.key), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_getter_should_wake_when_the_lower_tiers_rest_ends() {
    let q = WorkQueue::new(QueueConfig::default().lower_tier_share(0.5));
    q.add(1, Priority::Background);
    q.add(2, Priority::Background);
    let waiter = tokio::spawn({
        let q = q.clone();
        async move {
            let mut got = vec![];
            while let Some(i) = q.get().await {
                got.push((i.key, Instant::now()));
                tokio::time::sleep(50 * MS).await;
                q.done(&i.key);
                if got.len() == 2 {
                    return got;
                }
            }
            got
        }
    });
    let t0 = Instant::now();
    let got = waiter.await.expect("getter");
    let at: Vec<(u32, Duration)> = got.into_iter().map(|(k, t)| (k, t - t0)).collect();
    // 50 ms of work, then 50 ms of rest before the second item.
    assert_eq!(at, [(1, Duration::ZERO), (2, 100 * MS)]);
}

#[tokio::test(start_paused = true)]
async fn shut_down_with_drain_should_not_pace_lower_tiers() {
    let q: WorkQueue<u32> = WorkQueue::new(QueueConfig::default().lower_tier_share(0.1));
    for k in 0..3 {
        q.add(k, Priority::Background);
    }
    let worker = tokio::spawn({
        let q = q.clone();
        async move {
            while let Some(i) = q.get().await {
                tokio::time::sleep(10 * MS).await;
                q.done(&i.key);
            }
        }
    });
    tokio::time::sleep(MS).await;
    let t0 = Instant::now();
    q.shut_down_with_drain().await;
    // The first item's 10 ms, then the two others without rests.
    assert_eq!(Instant::now() - t0, 29 * MS);
    worker.await.expect("worker");
}

#[test]
fn len_and_depth_should_count_ready_items_per_tier() {
    let q = queue();
    q.add(1, Priority::Urgent);
    q.add(2, Priority::Background);
    q.add(3, Priority::Background);
    q.add_after(4, Priority::Urgent, Duration::from_secs(60));
    assert_eq!(q.len(), 3);
    assert!(!q.is_empty());
    assert_eq!(
        Priority::ALL.map(|p| q.depth(p)),
        [1, 0, 2],
        "urgent, normal, background; delayed items are not counted"
    );
    let _ = q.try_get();
    assert_eq!(q.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn add_rate_limited_should_back_off_until_forgotten() {
    let q: WorkQueue<&str> = WorkQueue::new(
        QueueConfig::default().rate_limiter(ItemExponential::new(10 * MS, Duration::from_secs(1))),
    );
    q.add_rate_limited("k", Priority::Normal);
    assert_eq!(q.num_requeues(&"k"), 1);
    tokio::time::advance(9 * MS).await;
    assert!(q.try_get().is_none());
    tokio::time::advance(MS).await;
    let i = q.try_get().expect("after 10 ms");
    q.add_rate_limited("k", Priority::Normal);
    q.done(&i.key);
    tokio::time::advance(19 * MS).await;
    assert!(q.try_get().is_none(), "second retry waits 20 ms");
    tokio::time::advance(MS).await;
    let i = q.try_get().expect("after 20 ms");
    q.done(&i.key);
    assert_eq!(q.num_requeues(&"k"), 2);
    q.forget(&"k");
    assert_eq!(q.num_requeues(&"k"), 0);
    q.add_rate_limited("k", Priority::Normal);
    tokio::time::advance(10 * MS).await;
    assert!(q.try_get().is_some(), "back to the first step");
}

#[tokio::test(start_paused = true)]
async fn add_resync_should_spread_background_items_over_the_window() {
    let window = Duration::from_secs(10);
    let q = WorkQueue::new(QueueConfig::default().resync_window(window).seed(9));
    for k in 0..1000u32 {
        q.add_resync(k);
    }
    assert_eq!(q.len(), 0, "nothing is ready at once");
    let mut per_second = vec![];
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(1)).await;
        let got = keys(&q);
        per_second.push(got.len());
    }
    assert_eq!(per_second.iter().sum::<usize>(), 1000);
    assert!(
        per_second.iter().all(|n| (50..150).contains(n)),
        "{per_second:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn add_resync_should_mark_items_background() {
    let q = WorkQueue::new(QueueConfig::default().resync_window(MS).seed(2));
    q.add_resync("k");
    tokio::time::advance(MS).await;
    let i = q.try_get().expect("due");
    assert_eq!(i.priority, Priority::Background);
}

#[tokio::test(start_paused = true)]
async fn shut_down_should_drop_waiting_items_and_wake_getters() {
    let q = queue();
    let getter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await.map(|i| i.key) }
    });
    tokio::time::sleep(MS).await;
    q.add_after("later", Priority::Normal, Duration::from_secs(1));
    q.add("x", Priority::Normal);
    assert_eq!(getter.await.expect("getter"), Some("x"));
    q.add("y", Priority::Normal);
    let waiting = tokio::spawn({
        let q = q.clone();
        async move {
            // Takes y, then waits until the shutdown.
            let first = q.get().await.map(|i| i.key);
            (first, q.get().await.map(|i| i.key))
        }
    });
    tokio::time::sleep(MS).await;
    q.shut_down();
    assert_eq!(waiting.await.expect("getter"), (Some("y"), None));
    assert!(q.is_shutting_down());
    assert_eq!(q.len(), 0);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(q.get().await.is_none(), "the delayed item was dropped");
}

#[test]
fn shut_down_should_refuse_new_adds() {
    let q = queue();
    q.shut_down();
    q.add("k", Priority::Urgent);
    q.add_after("k", Priority::Urgent, MS);
    q.add_rate_limited("k", Priority::Urgent);
    q.add_resync("k");
    assert_eq!(q.len(), 0);
    assert!(q.try_get().is_none());
}

#[test]
fn done_after_shut_down_should_not_requeue_a_dirty_key() {
    let q = queue();
    q.add("k", Priority::Normal);
    let i = q.try_get().expect("an item");
    q.add("k", Priority::Normal);
    q.shut_down();
    q.done(&i.key);
    assert_eq!(q.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn shut_down_with_drain_should_finish_in_flight_and_ready_items_then_return() {
    let q: WorkQueue<u32> = queue();
    let processed = Arc::new(Mutex::new(vec![]));
    for k in 0..5 {
        q.add(k, Priority::Normal);
    }
    q.add_after(99, Priority::Urgent, Duration::from_secs(60));
    let mut workers = vec![];
    for _ in 0..2 {
        let (q, processed) = (q.clone(), processed.clone());
        workers.push(tokio::spawn(async move {
            while let Some(i) = q.get().await {
                tokio::time::sleep(100 * MS).await;
                processed.lock().expect("lock").push(i.key);
                q.done(&i.key);
            }
        }));
    }
    tokio::time::sleep(10 * MS).await;
    // Added while being processed, before the shutdown: queued again.
    q.add(0, Priority::Normal);
    tokio::time::sleep(40 * MS).await;
    let t0 = Instant::now();
    q.shut_down_with_drain().await;
    let drained_after = Instant::now() - t0;
    q.add(7, Priority::Urgent);
    assert_eq!(q.len(), 0, "adds are refused once draining");
    for w in workers {
        w.await.expect("worker");
    }
    let mut got = processed.lock().expect("lock").clone();
    got.sort_unstable();
    // 0..5, and 0 again; the delayed 99 is dropped. Two workers, 100 ms
    // each: the last two finish 300 ms after the start.
    assert_eq!(got, [0, 0, 1, 2, 3, 4]);
    assert_eq!(drained_after, 250 * MS);
}

#[tokio::test(start_paused = true)]
async fn shut_down_with_drain_should_return_at_once_when_idle() {
    let q: WorkQueue<u32> = queue();
    q.add_after(1, Priority::Normal, Duration::from_secs(60));
    tokio::time::timeout(MS, q.shut_down_with_drain())
        .await
        .expect("nothing to drain");
}

#[test]
fn many_keys_should_come_out_once_each() {
    let q = queue();
    for round in 0..3 {
        for k in 0..1000u32 {
            q.add(k, Priority::ALL[(k as usize + round) % 3]);
        }
    }
    let got = keys(&q);
    assert_eq!(got.len(), 1000);
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 1000);
}

mod model {
    //! Property test: random operations against a simple model of the
    //! queue's rules.

    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Add(u8, Priority),
        AddAfter(u8, Priority, u16),
        Get,
        Done(usize),
        Advance(u16),
    }

    fn prio() -> impl Strategy<Value = Priority> {
        prop_oneof![
            Just(Priority::Urgent),
            Just(Priority::Normal),
            Just(Priority::Background)
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u8..6, prio()).prop_map(|(k, p)| Op::Add(k, p)),
            2 => (0u8..6, prio(), 1u16..40).prop_map(|(k, p, d)| Op::AddAfter(k, p, d)),
            3 => Just(Op::Get),
            2 => (0usize..4).prop_map(Op::Done),
            1 => (0u16..30).prop_map(Op::Advance),
        ]
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum MWait {
        No,
        Ready {
            prio: Priority,
            since: u64,
            seq: u64,
        },
        Delayed {
            prio: Priority,
            at: u64,
            seq: u64,
        },
        Dirty {
            prio: Priority,
        },
    }

    #[derive(Debug, Clone, Copy)]
    struct MEntry {
        wait: MWait,
        processing: Option<Priority>,
        started: u64,
    }

    /// The rules, written as plainly as possible: every item is looked at
    /// every time (times in ms since the start).
    #[derive(Debug, Default)]
    struct Model {
        entries: HashMap<u8, MEntry>,
        seq: u64,
        max_wait: u64,
        limit: usize,
        starved_turn: bool,
        /// Pacing at share 1/2: rest = work (0: unpaced).
        rest_ratio: u64,
        rest_until: u64,
    }

    impl Model {
        fn next_seq(&mut self) -> u64 {
            self.seq += 1;
            self.seq
        }

        fn promote(&mut self, now: u64) {
            for e in self.entries.values_mut() {
                if let MWait::Delayed { prio, at, seq } = e.wait {
                    if at <= now {
                        e.wait = if e.processing.is_some() {
                            MWait::Dirty { prio }
                        } else {
                            MWait::Ready {
                                prio,
                                since: at,
                                seq,
                            }
                        };
                    }
                }
            }
        }

        fn add(&mut self, key: u8, p: Priority, delay: u64, now: u64) {
            self.promote(now);
            let at = (delay > 0).then_some(now + delay);
            let seq = self.seq + 1;
            let e = self.entries.entry(key).or_insert(MEntry {
                wait: MWait::No,
                processing: None,
                started: 0,
            });
            let busy = e.processing.is_some();
            let mut used_seq = false;
            e.wait = match (e.wait, at) {
                (MWait::Ready { prio, since, seq }, _) => MWait::Ready {
                    prio: prio.max(p),
                    since,
                    seq,
                },
                (MWait::Dirty { prio }, _) => MWait::Dirty { prio: prio.max(p) },
                (MWait::No, None) if busy => MWait::Dirty { prio: p },
                (MWait::No, None) => {
                    used_seq = true;
                    MWait::Ready {
                        prio: p,
                        since: now,
                        seq,
                    }
                }
                (MWait::No, Some(at)) => {
                    used_seq = true;
                    MWait::Delayed { prio: p, at, seq }
                }
                (MWait::Delayed { prio, .. }, None) if busy => MWait::Dirty { prio: prio.max(p) },
                (MWait::Delayed { prio, .. }, None) => {
                    used_seq = true;
                    MWait::Ready {
                        prio: prio.max(p),
                        since: now,
                        seq,
                    }
                }
                (
                    MWait::Delayed {
                        prio,
                        at: at0,
                        seq: s0,
                    },
                    Some(at),
                ) => {
                    if at < at0 {
                        used_seq = true;
                        MWait::Delayed {
                            prio: prio.max(p),
                            at,
                            seq,
                        }
                    } else {
                        MWait::Delayed {
                            prio: prio.max(p),
                            at: at0,
                            seq: s0,
                        }
                    }
                }
            };
            if used_seq {
                self.next_seq();
            }
        }

        fn lower_busy(&self) -> usize {
            self.entries
                .values()
                .filter(|e| matches!(e.processing, Some(p) if p != Priority::Urgent))
                .count()
        }

        fn get(&mut self, now: u64) -> Option<(u8, Priority, u64)> {
            self.promote(now);
            let allow_lower = self.lower_busy() < self.limit && now >= self.rest_until;
            let ready = self.entries.iter().filter_map(|(k, e)| match e.wait {
                MWait::Ready { prio, since, seq } if allow_lower || prio == Priority::Urgent => {
                    Some((*k, prio, since, seq))
                }
                _ => None,
            });
            let ready: Vec<_> = ready.collect();
            let starved = ready
                .iter()
                .filter(|r| now - r.2 >= self.max_wait)
                .min_by_key(|r| (r.2, r.3));
            let best = ready
                .iter()
                .min_by_key(|r| (std::cmp::Reverse(r.1), r.2, r.3))?;
            // A starved item of a lower tier gets every other turn.
            let pick = match starved {
                Some(s) if s.1 != best.1 && !self.starved_turn => {
                    self.starved_turn = true;
                    s
                }
                _ => {
                    self.starved_turn = false;
                    best
                }
            };
            let (k, prio, since, _) = *pick;
            let e = self.entries.get_mut(&k)?;
            e.wait = MWait::No;
            e.processing = Some(prio);
            e.started = now;
            Some((k, prio, now - since))
        }

        fn done(&mut self, key: u8, now: u64) {
            self.promote(now);
            let seq = self.seq + 1;
            let Some(e) = self.entries.get_mut(&key) else {
                return;
            };
            let Some(tier) = e.processing.take() else {
                return;
            };
            if tier != Priority::Urgent && self.rest_ratio > 0 {
                let rest = (now - e.started) * self.rest_ratio;
                self.rest_until = self.rest_until.max(now) + rest;
            }
            match e.wait {
                MWait::Dirty { prio } => {
                    e.wait = MWait::Ready {
                        prio,
                        since: now,
                        seq,
                    };
                    self.next_seq();
                }
                MWait::No => {
                    self.entries.remove(&key);
                }
                _ => {}
            }
        }

        fn depth(&self, p: Priority) -> usize {
            self.entries
                .values()
                .filter(|e| matches!(e.wait, MWait::Ready { prio, .. } if prio == p))
                .count()
        }

        /// Keys waiting in any form (ready, delayed, dirty), each once.
        fn waiting(&self) -> Vec<u8> {
            let mut v: Vec<u8> = self
                .entries
                .iter()
                .filter(|(_, e)| e.wait != MWait::No)
                .map(|(k, _)| *k)
                .collect();
            v.sort_unstable();
            v
        }
    }

    fn run(
        ops: Vec<Op>,
        max_wait_ms: u64,
        limit: Option<usize>,
        paced: bool,
    ) -> Result<(), TestCaseError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut config = QueueConfig::default().max_wait(Duration::from_millis(max_wait_ms));
            if let Some(l) = limit {
                config = config.lower_tier_limit(l);
            }
            if paced {
                config = config.lower_tier_share(0.5);
            }
            let q: WorkQueue<u8> = WorkQueue::new(config);
            let mut m = Model {
                max_wait: max_wait_ms,
                limit: limit.unwrap_or(usize::MAX),
                rest_ratio: u64::from(paced),
                ..Default::default()
            };
            let t0 = Instant::now();
            let now = || u64::try_from((Instant::now() - t0).as_millis()).unwrap_or(u64::MAX);
            let mut held: Vec<u8> = vec![];
            for op in ops {
                match op {
                    Op::Add(k, p) => {
                        q.add(k, p);
                        m.add(k, p, 0, now());
                    }
                    Op::AddAfter(k, p, d) => {
                        q.add_after(k, p, Duration::from_millis(u64::from(d)));
                        m.add(k, p, u64::from(d), now());
                    }
                    Op::Get => {
                        let got = q.try_get().map(|i| {
                            (
                                i.key,
                                i.priority,
                                u64::try_from(i.waited.as_millis()).unwrap_or(0),
                            )
                        });
                        let want = m.get(now());
                        prop_assert_eq!(got, want);
                        if let Some((k, _, _)) = got {
                            prop_assert!(!held.contains(&k), "key {} handed out twice", k);
                            held.push(k);
                        }
                    }
                    Op::Done(i) => {
                        if !held.is_empty() {
                            let k = held.remove(i % held.len());
                            q.done(&k);
                            m.done(k, now());
                        }
                    }
                    Op::Advance(ms) => {
                        tokio::time::advance(Duration::from_millis(u64::from(ms))).await;
                    }
                }
                m.promote(now());
                for p in Priority::ALL {
                    prop_assert_eq!(q.depth(p), m.depth(p), "depth of {:?}", p);
                }
            }
            // Nothing lost, nothing doubled: finish what is held, let every
            // delay come due, and drain; each waiting key comes out once
            // (a dirty key once after its done).
            let mut expected = m.waiting();
            for k in held.drain(..) {
                q.done(&k);
            }
            // Long enough for every delay and every pacing rest.
            tokio::time::advance(Duration::from_secs(3600)).await;
            let mut drained = vec![];
            while let Some(i) = q.try_get() {
                drained.push(i.key);
                q.done(&i.key);
            }
            drained.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(drained, expected);
            prop_assert!(q.is_empty());
            Ok(())
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn queue_should_follow_the_model_without_starvation(
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            run(ops, 3_600_000, None, false)?;
        }

        #[test]
        fn queue_should_follow_the_model_with_a_short_starvation_bound(
            ops in proptest::collection::vec(op(), 1..120),
            max_wait in 0u64..60,
        ) {
            run(ops, max_wait, None, false)?;
        }

        #[test]
        fn queue_should_follow_the_model_with_a_lower_tier_limit(
            ops in proptest::collection::vec(op(), 1..120),
            max_wait in 0u64..60,
            limit in 1usize..3,
        ) {
            run(ops, max_wait, Some(limit), false)?;
        }

        #[test]
        fn queue_should_follow_the_model_with_pacing(
            ops in proptest::collection::vec(op(), 1..120),
            max_wait in 0u64..60,
            limit in proptest::option::of(1usize..3),
        ) {
            run(ops, max_wait, limit, true)?;
        }
    }
}
