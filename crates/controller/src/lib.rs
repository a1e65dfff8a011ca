//! Petrel's controller kit: a prioritized, delaying work queue with
//! client-go's semantics, event classification, rate limiters, metrics and
//! a worker pool.
//!
//! It exists for one failure: head-of-line blocking. When a controller
//! restarts, its informer replays every object it already knew as a create,
//! and every resync period it replays them all again as updates; in a plain
//! FIFO the one event a user is waiting for queues behind thousands of these
//! (Pinterest saw queue depth spike to 10k and their latency SLI dip at each
//! resync). Here such events are [classified](classify) as background work
//! (resyncs also spread over a window), user events as urgent, and urgent
//! items are served first, while a starvation bound keeps background work
//! moving.
//!
//! # The queue's rules
//!
//! [`WorkQueue`] keeps client-go's rules:
//! * **No duplicates.** A key waiting is never queued twice. A second add
//!   merges with it: the key keeps the *higher* priority and the *earlier*
//!   ready time (an `add` of a delayed key makes it ready now).
//! * **One worker per key.** A key being processed is not handed out again;
//!   an add meanwhile marks it dirty, and [`WorkQueue::done`] queues it again
//!   (at the highest priority it was given meanwhile).
//! * **Order.** An item is served only once its ready time has come; among
//!   ready items, by tier ([`Priority::Urgent`], then `Normal`, then
//!   `Background`), then in the order they became ready.
//! * **Starvation bound.** Once a lower-tier item has been ready for longer
//!   than `max_wait` (default 5 s), every other item served is the oldest
//!   such item, whatever the higher tiers hold: a lower-tier item waits at
//!   most `max_wait` behind higher tiers (plus a worker coming free, and
//!   behind older starved items), and a starved backlog of thousands never
//!   goes all at once before a newer urgent item, which waits for at most
//!   one starved item per urgent item ahead of it.
//! * **Delays** (`add_after`, `add_rate_limited`, `add_resync`) sit in a
//!   heap; a getter sleeps until the earliest one, so an idle queue costs
//!   nothing (no ticker).
//! * **Shutdown.** [`WorkQueue::shut_down`] refuses new adds, drops waiting
//!   items and wakes every getter; [`WorkQueue::shut_down_with_drain`]
//!   refuses new adds, drops delayed items, lets workers finish what they
//!   hold and the ready items, and returns when that is done.
//!
//! Optionally ([`QueueConfig::lower_tier_limit`]) the lower tiers may use
//! at most so many workers at once, keeping a worker free for urgent items.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use petrel_controller::{
//!     classify, run_workers, Action, EventSource, Priority, QueueConfig, WorkQueue,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let queue: WorkQueue<String> = WorkQueue::new(
//!     QueueConfig::default()
//!         .name("pods")
//!         .max_wait(Duration::from_secs(5))
//!         .seed(1),
//! );
//! let mut registry = prometheus_client::registry::Registry::default();
//! queue.register(&mut registry);
//!
//! // Events as an informer would deliver them, classified.
//! let mut rng = rand::thread_rng();
//! let window = Duration::from_millis(50);
//! // A pod we knew before the restart, replayed by the initial list:
//! let d = classify(EventSource::InitialList, None, Some(&"spec-a"), true, window, &mut rng);
//! assert_eq!(d.priority, Priority::Background);
//! queue.add("default/a".to_string(), d.priority);
//! // A user changed pod b:
//! let d = classify(EventSource::Watch, Some(&"old"), Some(&"new"), true, window, &mut rng);
//! assert_eq!(d.priority, Priority::Urgent);
//! queue.add("default/b".to_string(), d.priority);
//! // A resync that changed nothing: background, after a random delay.
//! let d = classify(EventSource::Resync, Some(&"same"), Some(&"same"), true, window, &mut rng);
//! queue.add_after("default/c".to_string(), d.priority, d.delay.unwrap_or_default());
//!
//! // The urgent item comes first.
//! assert_eq!(queue.try_get().map(|i| i.key), Some("default/b".to_string()));
//! queue.done(&"default/b".to_string());
//!
//! let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
//! let workers = tokio::spawn(run_workers(queue.clone(), 2, {
//!     let seen = seen.clone();
//!     move |key: String| {
//!         let seen = seen.clone();
//!         async move {
//!             seen.lock().map_err(|e| e.to_string())?.push(key);
//!             Ok::<_, String>(Action::Done)
//!         }
//!     }
//! }));
//! // Let the delayed resync item come due and be handled (however long a
//! // busy machine makes that), then stop gracefully: a shutdown drops items
//! // whose time has not come.
//! tokio::time::timeout(Duration::from_secs(60), async {
//!     while seen.lock().expect("not poisoned").len() < 2 {
//!         tokio::time::sleep(Duration::from_millis(10)).await;
//!     }
//! })
//! .await
//! .expect("the resync item was handled");
//! queue.shut_down_with_drain().await;
//! workers.await.expect("workers ran");
//! let mut seen = seen.lock().expect("not poisoned").clone();
//! seen.sort();
//! assert_eq!(seen, ["default/a", "default/c"]);
//! # }
//! ```

#![deny(missing_docs)]

mod classify;
mod delay;
pub mod informer;
pub mod leader;
mod metrics;
mod queue;
mod ratelimit;
mod resync;
mod runner;

pub use classify::{classify, Decision, EventSource};
pub use queue::{Item, Priority, QueueConfig, WorkQueue};
pub use ratelimit::{
    default_controller_rate_limiter, ItemExponential, MaxOf, RateLimiter, TokenBucket,
};
pub use resync::spread_delay;
pub use runner::{run_per_key, run_workers, Action};
