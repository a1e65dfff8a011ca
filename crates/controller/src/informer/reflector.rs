//! The reflector: keeps the cache equal to the API server's state by a
//! list, then a watch from the list's resourceVersion.
//!
//! Its loop is the state machine [`State`]. What a list or a watch event
//! changes goes to [`Shared::apply`], which updates the cache and tells the
//! handlers; a re-list is compared with the cache so the handlers hear
//! only the difference: nothing twice, nothing lost, and objects deleted
//! meanwhile as deletes with their last known state.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::api::WatchEvent;
use kube::Resource;
use rand::Rng;
use tokio::time::Instant;

use super::handler::EventKind;
use super::lister_watcher::WatchError;
use super::shared::{Change, Shared};
use super::store::object_key;
use crate::classify::EventSource;

/// A watch that ends sooner than this without an event counts as a
/// failure (an API server closing every watch at once must not be
/// re-watched in a tight loop).
const SHORT_WATCH: Duration = Duration::from_secs(1);

/// The reflector's states. It starts in `Listing`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// List every page. → `Watching` from the list's resourceVersion once
    /// the list is applied (compared with the cache); → `Backoff`, then
    /// `Listing` again, if a page fails (an expired continue token restarts
    /// the list from its first page).
    Listing,
    /// Watch from `resource_version` (with bookmarks, which only move it
    /// on). Each event is applied and moves it on. → `Watching` again when
    /// the watch times out; → `Listing` on 410 Gone / `Expired` (a status
    /// or an ERROR event); → `Backoff`, then `Watching` from the same
    /// version, on any other error or a watch closed at once.
    Watching {
        /// The version to watch from.
        resource_version: String,
    },
    /// Wait the current backoff delay (exponential, with jitter; reset by a
    /// good list or watch), then → `then`.
    Backoff {
        /// The state to retry.
        then: Box<State>,
    },
}

/// Failures are logged once per episode: the first at warn, the rest at
/// debug, the recovery at info.
#[derive(Debug, Default)]
struct Episode {
    failing: bool,
}

impl Episode {
    fn fail(&mut self, name: &str, what: &str, err: &WatchError) {
        if self.failing {
            tracing::debug!(informer = %name, op = what, error = %err, "still failing");
        } else {
            tracing::warn!(informer = %name, op = what, error = %err, "failed; retrying with backoff");
            self.failing = true;
        }
    }

    fn ok(&mut self, name: &str) {
        if self.failing {
            tracing::info!(informer = %name, "recovered");
            self.failing = false;
        }
    }
}

/// Exponential backoff with jitter.
#[derive(Debug)]
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The next delay: the current step plus up to 10 % jitter.
    fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d + d.mul_f64(rand::thread_rng().gen_range(0.0..0.1))
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Runs the reflector until the informer is stopped (its task aborted).
pub(crate) async fn run_reflector<K>(shared: Arc<Shared<K>>)
where
    K: Resource + Clone + PartialEq + Send + Sync + 'static,
{
    let name = shared.config.name.clone();
    let mut backoff = Backoff::new(shared.config.backoff_initial, shared.config.backoff_max);
    let mut episode = Episode::default();
    let mut state = State::Listing;
    loop {
        state = match state {
            State::Listing => match list_all(&shared).await {
                Ok(rv) => {
                    episode.ok(&name);
                    backoff.reset();
                    State::Watching {
                        resource_version: rv,
                    }
                }
                Err(e) => {
                    episode.fail(&name, "list", &e);
                    State::Backoff {
                        then: Box::new(State::Listing),
                    }
                }
            },
            State::Watching { resource_version } => {
                watch_once(&shared, resource_version, &mut backoff, &mut episode).await
            }
            State::Backoff { then } => {
                tokio::time::sleep(backoff.step()).await;
                *then
            }
        };
    }
}

/// Lists every page and applies the difference to the cache; returns the
/// list's resourceVersion. Each page is diffed as it comes. A shared cache
/// takes the changes after the last page (they end up in it anyway, each
/// behind its `Arc`); an encoded one after each page, so that a list of
/// many objects is never all decoded at once.
async fn list_all<K>(shared: &Shared<K>) -> Result<String, WatchError>
where
    K: Resource + Clone + PartialEq + Send + Sync + 'static,
{
    let mut diff = Diff::default();
    let mut token = None;
    let per_page = shared.store.is_encoded();
    let rv = loop {
        let page = shared.lw.list(shared.config.page_size, token).await?;
        diff.page(shared, page.items);
        if per_page {
            shared.apply(std::mem::take(&mut diff.changes), false);
        }
        match page.continue_token {
            Some(t) => token = Some(t),
            None => break page.resource_version,
        }
    };
    shared.apply(diff.finish(shared), true);
    Ok(rv)
}

/// The informer's transform: what it keeps of an object it caches.
fn strip<K: Resource>(shared: &Shared<K>, obj: &mut K) {
    if shared.config.strip_managed_fields {
        obj.meta_mut().managed_fields = None;
    }
}

/// What a (re-)list changes: adds of objects the cache lacks, updates of
/// objects whose resourceVersion moved, deletes (last known state) of
/// cached objects the list no longer has; unchanged objects say nothing.
struct Diff<K> {
    seen: HashSet<String>,
    changes: Vec<Change<K>>,
}

impl<K> Default for Diff<K> {
    fn default() -> Self {
        Self {
            seen: HashSet::new(),
            changes: Vec::new(),
        }
    }
}

impl<K> Diff<K>
where
    K: Resource + Clone + PartialEq + Send + Sync + 'static,
{
    /// Takes one page's objects.
    fn page(&mut self, shared: &Shared<K>, items: Vec<K>) {
        self.seen.reserve(items.len());
        for mut obj in items {
            strip(shared, &mut obj);
            let key = object_key(&obj);
            self.seen.insert(key.clone());
            if let Some(old) = shared.store.get(&key) {
                let same_version = old.meta().resource_version.is_some()
                    && old.meta().resource_version == obj.meta().resource_version;
                if same_version || old.as_ref() == &obj {
                    continue;
                }
            }
            self.changes.push(Change {
                kind: EventKind::Add,
                key,
                obj: Arc::new(obj),
                source: EventSource::InitialList,
                final_state_unknown: false,
            });
        }
    }

    /// The changes, with deletes of what no page had.
    fn finish(mut self, shared: &Shared<K>) -> Vec<Change<K>> {
        for key in shared.store.keys() {
            if !self.seen.contains(&key) {
                if let Some(old) = shared.store.get(&key) {
                    self.changes.push(Change {
                        kind: EventKind::Delete,
                        key,
                        obj: old,
                        source: EventSource::InitialList,
                        final_state_unknown: true,
                    });
                }
            }
        }
        self.changes
    }
}

/// One watch request, to its end; returns the next state.
async fn watch_once<K>(
    shared: &Shared<K>,
    mut rv: String,
    backoff: &mut Backoff,
    episode: &mut Episode,
) -> State
where
    K: Resource + Clone + PartialEq + Send + Sync + 'static,
{
    let name = &shared.config.name;
    let base = shared.config.watch_timeout.as_secs().max(1);
    let timeout = rand::thread_rng().gen_range(base..base * 2);
    let timeout = u32::try_from(timeout).unwrap_or(u32::MAX);
    let started = Instant::now();
    let mut stream = match shared.lw.watch(&rv, timeout).await {
        Ok(s) => s,
        Err(e) => return after_watch_error(name, rv, e, episode),
    };
    let mut events = 0u64;
    while let Some(item) = stream.next().await {
        let change = match item {
            Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => Some((EventKind::Update, o)),
            Ok(WatchEvent::Deleted(o)) => Some((EventKind::Delete, o)),
            Ok(WatchEvent::Bookmark(b)) => {
                rv = b.metadata.resource_version;
                None
            }
            Ok(WatchEvent::Error(s)) => {
                let e = WatchError::from_status(s.code, &s.reason, &s.message);
                return after_watch_error(name, rv, e, episode);
            }
            Err(e) => return after_watch_error(name, rv, e, episode),
        };
        events += 1;
        if events == 1 {
            episode.ok(name);
            backoff.reset();
        }
        if let Some((kind, mut obj)) = change {
            strip(shared, &mut obj);
            if let Some(v) = obj.meta().resource_version.clone() {
                rv = v;
            }
            let key = object_key(&obj);
            shared.apply(
                vec![Change {
                    kind,
                    key,
                    obj: Arc::new(obj),
                    source: EventSource::Watch,
                    final_state_unknown: false,
                }],
                false,
            );
        }
    }
    if events == 0 && started.elapsed() < SHORT_WATCH {
        episode.fail(
            name,
            "watch",
            &WatchError::Other("watch closed at once".into()),
        );
        return retry_watch(rv);
    }
    State::Watching {
        resource_version: rv,
    }
}

/// Where a watch that failed with `e` goes: an expired resourceVersion
/// re-lists; anything else is a failure of the episode, retried from `rv`.
fn after_watch_error(name: &str, rv: String, e: WatchError, episode: &mut Episode) -> State {
    match e {
        WatchError::Expired(m) => {
            tracing::info!(informer = %name, resource_version = %rv, reason = %m, "watch expired; re-listing");
            State::Listing
        }
        e => {
            episode.fail(name, "watch", &e);
            retry_watch(rv)
        }
    }
}

fn retry_watch(rv: String) -> State {
    State::Backoff {
        then: Box::new(State::Watching {
            resource_version: rv,
        }),
    }
}

/// Replays the cache to the handlers every `period` (the first after one
/// period), until the informer is stopped.
pub(crate) async fn run_resync<K>(shared: Arc<Shared<K>>, period: Duration)
where
    K: Resource + Clone + PartialEq + Send + Sync + 'static,
{
    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        shared.resync();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_should_double_to_its_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(800), Duration::from_secs(3));
        let steps: Vec<Duration> = (0..4).map(|_| b.step()).collect();
        let base = [800, 1600, 3000, 3000];
        for (s, ms) in steps.iter().zip(base) {
            let ms = Duration::from_millis(ms);
            assert!(*s >= ms && *s < ms.mul_f64(1.1), "{s:?} vs {ms:?}");
        }
        b.reset();
        assert!(b.step() < Duration::from_millis(880));
    }
}
