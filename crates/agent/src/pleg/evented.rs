//! The runtime's events. Each names a pod (found from the payload's
//! sandbox labels, else the id map, else by asking the runtime). When the
//! payload carries the whole pod ([`payload`]), it is cached as the pod's
//! status at the event's creation time, with no call to the runtime
//! (beyond the status of a container whose payload lacks what the agent
//! needs). Otherwise the event is a hint: the pod is inspected at once,
//! unless a cached status is provably newer than the event. Bursts of
//! hints coalesce: one inspection in flight per pod, and one more if
//! events arrived during it.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use petrel_cri::api;

use super::events::from_cri_event;
use super::inspect::{node_selector, sandbox_uid};
use super::payload;
use super::seen::{Observed, PodSeen};
use super::{Pleg, PodLifecycleEvent};
use crate::cache::now_ns;
use crate::types::{PodUid, LABEL_MANAGED_BY, LABEL_POD_UID};

/// Timestamps below this cannot be nanoseconds since the epoch (they would
/// be before 1973): a runtime sending seconds or nothing gets no shortcut.
const PLAUSIBLE_NS: i64 = 100_000_000_000_000_000;

/// One event, reduced to what the PLEG keeps of it.
#[derive(Debug, Clone)]
pub(crate) struct Hint {
    /// The event to emit once the pod is inspected (None for CREATED).
    pub(crate) event: Option<PodLifecycleEvent>,
    /// The runtime's created_at, if plausible.
    pub(crate) created_at: Option<i64>,
}

/// Per pod with an inspection in flight.
#[derive(Debug, Default)]
pub(crate) struct PodWork {
    /// Events arrived that the in-flight inspection may not reflect.
    dirty: bool,
    /// When the in-flight inspection began.
    inflight_ts: i64,
    /// Events to emit after the next inspection.
    next: Vec<PodLifecycleEvent>,
    /// Events older than the in-flight inspection: emitted after it.
    covered: Vec<PodLifecycleEvent>,
}

/// Where an event's pod was found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Our pod.
    Pod(PodUid),
    /// Made by someone else: ignored.
    Foreign,
    /// Not known yet: ask the runtime.
    Unknown,
}

impl Pleg {
    /// Finds the pod of `ev` from its sandbox labels or the id map.
    pub(crate) fn route(&self, ev: &api::ContainerEventResponse) -> Route {
        if let Some(sb) = &ev.pod_sandbox_status {
            match sb.labels.get(LABEL_MANAGED_BY) {
                Some(node) if *node != self.inner.config.node_name => return Route::Foreign,
                Some(_) => {
                    let uid = sb
                        .labels
                        .get(LABEL_POD_UID)
                        .cloned()
                        .or_else(|| sb.metadata.as_ref().map(|m| m.uid.clone()))
                        .filter(|u| !u.is_empty());
                    if let Some(uid) = uid {
                        return Route::Pod(uid);
                    }
                }
                // Labelled, but not by any agent: not ours.
                None if !sb.labels.is_empty() => return Route::Foreign,
                // A runtime that sends no labels: use what we know.
                None => {}
            }
        }
        match self.inner.ids.get(&ev.container_id) {
            Some(uid) => Route::Pod(uid),
            None => Route::Unknown,
        }
    }

    /// Handles one event from the stream. A payload that stands for an
    /// inspection is cached at once, its events emitted, and nothing is
    /// returned. Otherwise returns a task to spawn when the event needs
    /// work beyond bookkeeping (an inspection, a lookup or the statuses
    /// the payload lacks), so the stream loop never waits on the runtime.
    pub(crate) fn on_event(
        &self,
        ev: api::ContainerEventResponse,
    ) -> Option<BoxFuture<'static, ()>> {
        let now = now_ns();
        let created_at = Some(ev.created_at).filter(|t| *t >= PLAUSIBLE_NS && *t <= now);
        if let Some(t) = created_at {
            self.inner
                .metrics
                .evented_pleg_connection_latency
                .observe((now - t) as f64 / 1e9);
        }
        let route = self.route(&ev);
        let view = match &route {
            // The lock is held for this statement only.
            Route::Pod(uid) => payload::read(uid, &ev, created_at, self.inner.seen.lock().get(uid)),
            _ => Err(payload::Gap::OtherPod),
        };
        let kind = from_cri_event(ev.container_event_type);
        let is_delete = kind == Some(super::PodLifecycleEventType::ContainerRemoved);
        let id = ev.container_id;
        let event_id = id.clone();
        let make_hint = move |uid: &str| Hint {
            event: kind.map(|kind| PodLifecycleEvent {
                uid: uid.to_string(),
                kind,
                container_id: event_id.clone(),
            }),
            created_at,
        };
        match route {
            Route::Foreign => None,
            Route::Pod(uid) => {
                let hint = make_hint(&uid);
                match (view, created_at) {
                    (Ok(view), Some(ts)) if view.fetch.is_empty() => {
                        if self.apply_payload(&uid, view, ts) {
                            return None;
                        }
                    }
                    (Ok(view), Some(ts)) => {
                        let pleg = self.clone();
                        return Some(
                            async move { pleg.complete_payload(uid, view, ts, hint).await }.boxed(),
                        );
                    }
                    (Err(gap), _) => {
                        tracing::trace!(pod.uid = %uid, container.id = %id, ?gap, "pleg event payload not used; inspecting");
                    }
                    (Ok(_), None) => {}
                }
                if self.enqueue(&uid, hint) {
                    let pleg = self.clone();
                    Some(async move { pleg.drive(uid).await }.boxed())
                } else {
                    None
                }
            }
            // Deleted before we ever saw it: nothing of ours to update.
            Route::Unknown if is_delete => None,
            Route::Unknown => {
                let pleg = self.clone();
                Some(
                    async move {
                        let Some(uid) = pleg.lookup(&id).await else {
                            return;
                        };
                        let hint = make_hint(&uid);
                        if pleg.enqueue(&uid, hint) {
                            pleg.drive(uid).await;
                        }
                    }
                    .boxed(),
                )
            }
        }
    }

    /// Caches `view`, a payload created at `ts` that stands for an
    /// inspection of `uid`, and emits the changes it shows since the pod
    /// was last seen. The event's own news is among them unless another
    /// path reported it first (a container's states only move forward, so
    /// the difference of two listings misses nothing). False (nothing
    /// done) when something newer is cached or seen: the caller treats the
    /// event as a hint then.
    pub(crate) fn apply_payload(&self, uid: &str, view: payload::PodView, ts: i64) -> bool {
        let inner = &self.inner;
        if inner.cache.get(uid).timestamp > ts {
            return false;
        }
        let status = view.into_status(uid);
        let events = match inner.seen.observe(uid, PodSeen::of_status(ts, &status)) {
            Observed::Stale => return false,
            Observed::Fresh { changed, events } => {
                if changed {
                    self.record_gauges();
                }
                events
            }
        };
        inner.ids.insert(
            uid,
            status
                .sandboxes
                .iter()
                .map(|s| s.id.as_str())
                .chain(status.containers.iter().map(|c| c.id.as_str())),
        );
        // An inspection that began after `ts` may have won the race: the
        // cache keeps it, and the events stand (they are in the runtime's
        // order).
        inner.cache.set(uid, Ok(Arc::new(status)), ts);
        for ev in events {
            inner.emitter.emit(ev);
        }
        true
    }

    /// Asks for the statuses `view` lacks (only those containers), then
    /// caches it; falls back to inspecting the pod when a call fails or
    /// something newer was cached meanwhile.
    async fn complete_payload(&self, uid: PodUid, mut view: payload::PodView, ts: i64, hint: Hint) {
        let complete = {
            let _permit = self.inner.permits.acquire().await;
            let mut complete = true;
            for id in std::mem::take(&mut view.fetch) {
                match self.inner.runtime.container_status(&id).await {
                    Ok(s) => view.fetched(s),
                    Err(e) => {
                        tracing::debug!(pod.uid = %uid, container.id = %id, error = %e, "pleg payload completion failed; inspecting");
                        complete = false;
                        break;
                    }
                }
            }
            complete
        };
        if complete && self.apply_payload(&uid, view, ts) {
            return;
        }
        if self.enqueue(&uid, hint) {
            self.drive(uid).await;
        }
    }

    /// Asks the runtime which of our pods `id` belongs to (a container or
    /// sandbox made since the last relist). None when it is not ours or
    /// already gone; a failed listing asks for a full relist instead.
    async fn lookup(&self, id: &str) -> Option<PodUid> {
        let rt = self.inner.runtime.as_ref();
        let node = &self.inner.config.node_name;
        let containers = match rt.list_containers(node_selector(node)).await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(container.id = %id, error = %e, "pleg event lookup failed; relisting");
                self.inner.relist_wanted.notify_one();
                return None;
            }
        };
        let mut sandbox_of = None;
        for c in &containers {
            if c.id == id {
                if let Some(uid) = c.label(LABEL_POD_UID).filter(|u| !u.is_empty()) {
                    self.inner.ids.insert(uid, [id]);
                    return Some(uid.to_string());
                }
                sandbox_of = Some(c.pod_sandbox_id.clone());
            }
        }
        // A sandbox's own event, or a container without the pod label.
        let want = sandbox_of.unwrap_or_else(|| id.to_string());
        let sandboxes = match rt.list_pod_sandboxes(node_selector(node)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(container.id = %id, error = %e, "pleg event lookup failed; relisting");
                self.inner.relist_wanted.notify_one();
                return None;
            }
        };
        let uid = sandboxes
            .iter()
            .find(|s| s.id == want)
            .and_then(sandbox_uid)?;
        self.inner.ids.insert(&uid, [id, want.as_str()]);
        Some(uid)
    }

    /// Records a hint for `uid`. Returns true when the caller must run
    /// [`Pleg::drive`] for it (no inspection in flight and none skipped).
    pub(crate) fn enqueue(&self, uid: &str, hint: Hint) -> bool {
        let mut work = self.inner.work_lock();
        if let Some(w) = work.get_mut(uid) {
            // An inspection that began after the event reflects it.
            match (hint.created_at, hint.event) {
                (Some(t), Some(ev)) if t < w.inflight_ts => w.covered.push(ev),
                (Some(t), None) if t < w.inflight_ts => {}
                (_, ev) => {
                    w.dirty = true;
                    w.next.extend(ev);
                }
            }
            return false;
        }
        // The cached status is from an inspection that began after the
        // event was created: it is provably newer, skip the inspection.
        if let Some(t) = hint.created_at {
            let cached = self.inner.cache.get(uid);
            if cached.error.is_none() && cached.status.is_some() && cached.timestamp > t {
                if let Some(ev) = hint.event {
                    self.inner.emitter.emit(ev);
                }
                return false;
            }
        }
        work.insert(
            uid.to_string(),
            PodWork {
                dirty: true,
                next: hint.event.into_iter().collect(),
                ..Default::default()
            },
        );
        true
    }

    /// Inspects `uid` until no event arrived during the last inspection,
    /// emitting each event after the inspection that reflects it.
    pub(crate) async fn drive(&self, uid: PodUid) {
        loop {
            let permit = self.inner.permits.acquire().await;
            let ts = now_ns();
            let batch = {
                let mut work = self.inner.work_lock();
                let Some(w) = work.get_mut(&uid) else {
                    return;
                };
                w.dirty = false;
                w.inflight_ts = ts;
                std::mem::take(&mut w.next)
            };
            let (found, result) = self.inspect_at(&uid, ts).await;
            if let Err(e) = result {
                tracing::debug!(pod.uid = %uid, error = %e, "pleg event inspection failed");
            }
            drop(permit);
            // The changes the inspection found, then the events' own news
            // where the listing did not report it already (CREATED brings
            // none; a DELETED of a container never listed does).
            let mut out = found;
            for ev in batch {
                push_unique(&mut out, ev);
            }
            let done = {
                let mut work = self.inner.work_lock();
                let done = match work.get_mut(&uid) {
                    Some(w) => {
                        for ev in w.covered.drain(..) {
                            push_unique(&mut out, ev);
                        }
                        !w.dirty
                    }
                    None => true,
                };
                if done {
                    work.remove(&uid);
                }
                done
            };
            for ev in out {
                self.inner.emitter.emit(ev);
            }
            if done {
                return;
            }
        }
    }
}

/// Adds `ev` unless the same news (kind and container) is already there:
/// a burst of events about one container is reported once.
fn push_unique(out: &mut Vec<PodLifecycleEvent>, ev: PodLifecycleEvent) {
    if !out
        .iter()
        .any(|o| o.kind == ev.kind && o.container_id == ev.container_id)
    {
        out.push(ev);
    }
}

/// The work map's type.
pub(crate) type WorkMap = HashMap<PodUid, PodWork>;
