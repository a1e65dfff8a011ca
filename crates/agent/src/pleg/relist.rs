//! The full relist: list everything this node made, diff it against the
//! previous relist, inspect the pods that changed (concurrently, bounded)
//! and emit kubelet's lifecycle events.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures_util::future::join_all;

use super::inspect::{inspect_listed, node_selector, sandbox_uid, PodListing};
use super::seen::{observe_locked, Observed, PodSeen};
use super::{Pleg, PodLifecycleEvent};
use crate::cache::now_ns;
use crate::cri::CriError;
use crate::metrics::ContainerStateLabels;
use crate::types::{PodRuntimeStatus, PodUid, LABEL_POD_UID};

/// The relists' own state; relists are serialised on it.
#[derive(Default)]
pub(crate) struct RelistState {
    /// A relist succeeded once (every pod counts as changed until then).
    done_once: bool,
    /// When the previous relist started.
    last_start: Option<Instant>,
}

impl Pleg {
    /// One full relist. Returns false when listing failed (nothing then
    /// changes: no events, no time advance).
    pub(crate) async fn relist(&self) -> bool {
        let inner = &self.inner;
        let mut state = inner.relist.lock().await;
        let start = Instant::now();
        if let Some(last) = state.last_start {
            inner
                .metrics
                .pleg_relist_interval
                .observe(start.duration_since(last).as_secs_f64());
        }
        state.last_start = Some(start);
        let generation = inner.ids.begin();
        // The time the listing began: everything found is at least this new.
        let ts = now_ns();

        let listed = self.list_all().await;
        let (pods, ids) = match listed {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "pleg relist failed; retrying next period");
                inner.note_runtime_error(&e);
                return false;
            }
        };
        inner.health.set_runtime_error(None);
        inner.ids.replace(generation, ids);

        // Record every pod's listing; the pods that changed (or were never
        // inspected, or failed last time) are inspected, with their events.
        let reinspect: HashSet<PodUid> = std::mem::take(&mut *inner.reinspect_lock());
        let mut changed: Vec<(PodUid, Vec<PodLifecycleEvent>)> = Vec::new();
        {
            let mut seen = inner.seen.lock();
            let uids: HashSet<PodUid> = pods.keys().chain(seen.keys()).cloned().collect();
            for uid in uids {
                let listing = pods.get(&uid);
                let observed = observe_locked(&mut seen, &uid, PodSeen::of(ts, listing));
                if listing.is_none() && seen.get(&uid).is_some_and(|p| p.ts <= ts) {
                    // Gone as of this relist: forget it.
                    seen.remove(&uid);
                }
                match observed {
                    Observed::Stale => {}
                    Observed::Fresh { changed: c, events } => {
                        if c || !state.done_once || reinspect.contains(&uid) {
                            changed.push((uid, events));
                        }
                    }
                }
            }
        }

        // Inspect the changed pods, bounded by the shared permits.
        let results = join_all(changed.into_iter().map(|(uid, events)| {
            let listing = pods.get(&uid);
            async move {
                let r = match listing {
                    Some(l) => {
                        let _permit = inner.permits.acquire().await;
                        inspect_listed(inner.runtime.as_ref(), &uid, l).await
                    }
                    // Gone: an empty status (uid only) wakes its waiters.
                    None => Ok(PodRuntimeStatus {
                        uid: uid.clone(),
                        ..Default::default()
                    }),
                };
                (uid, events, r)
            }
        }))
        .await;
        for (uid, events, r) in results {
            match r {
                Ok(status) => {
                    inner.cache.set(&uid, Ok(Arc::new(status)), ts);
                }
                Err(e) => {
                    tracing::warn!(pod.uid = %uid, error = %e, "pleg inspection failed; retrying next relist");
                    inner.cache.set(&uid, Err(e.to_string()), ts);
                    inner.reinspect_lock().insert(uid);
                }
            }
            // After the cache write, so a worker woken by the event reads
            // the status that caused it.
            for ev in events {
                inner.emitter.emit(ev);
            }
        }

        self.record_gauges();
        state.done_once = true;
        inner.cache.update_time(ts);
        inner.health.relisted();
        inner
            .metrics
            .pleg_relist_duration
            .observe(start.elapsed().as_secs_f64());
        let unix = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        inner.metrics.pleg_last_seen.set(unix);
        true
    }

    /// Lists every sandbox and container of this node, grouped by pod,
    /// with the id → pod map of what was listed.
    #[allow(clippy::type_complexity)]
    async fn list_all(
        &self,
    ) -> Result<(HashMap<PodUid, PodListing>, HashMap<String, PodUid>), CriError> {
        let rt = self.inner.runtime.as_ref();
        let node = &self.inner.config.node_name;
        let sandboxes = rt.list_pod_sandboxes(node_selector(node)).await?;
        let containers = rt.list_containers(node_selector(node)).await?;
        let mut pods: HashMap<PodUid, PodListing> = HashMap::new();
        let mut ids: HashMap<String, PodUid> = HashMap::new();
        for sb in sandboxes {
            let Some(uid) = sandbox_uid(&sb) else {
                continue;
            };
            ids.insert(sb.id.clone(), uid.clone());
            pods.entry(uid).or_default().sandboxes.push(sb);
        }
        for c in containers {
            // The pod label, else the pod of its sandbox.
            let uid = c
                .label(LABEL_POD_UID)
                .filter(|u| !u.is_empty())
                .map(str::to_string)
                .or_else(|| ids.get(&c.pod_sandbox_id).cloned());
            let Some(uid) = uid else {
                continue;
            };
            ids.insert(c.id.clone(), uid.clone());
            pods.entry(uid).or_default().containers.push(c);
        }
        Ok((pods, ids))
    }
}

impl Pleg {
    /// kubelet_running_pods and kubelet_running_containers from what was
    /// last seen.
    pub(crate) fn record_gauges(&self) {
        let m = &self.inner.metrics;
        let (pods, states) = self.inner.seen.gauges();
        m.running_pods.set(pods);
        for (name, n) in ["running", "exited", "created", "unknown"]
            .iter()
            .zip(states)
        {
            m.running_containers
                .get_or_create(&ContainerStateLabels {
                    container_state: (*name).to_string(),
                })
                .set(n);
        }
    }
}
