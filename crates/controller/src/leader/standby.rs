//! Warm standby: every replica syncs its caches at once; only the leader's
//! work waits for a term.

use std::future::Future;

use super::readiness::Readiness;
use super::state::{Leadership, Term};

/// Runs a controller's leader-only part with warm standby.
///
/// The caller starts its informers (on every replica) before calling this;
/// `synced` resolves when their caches are synced (a `has_synced` wait).
/// Then `readiness` turns ready and, for each term this candidate wins,
/// `work(term)` runs — the controller's event handlers and workers — until
/// the term ends; it is dropped at that moment (fencing), whatever it was
/// doing. A leader elected before the caches are synced starts working
/// once they are (that wait counts in the ramp-up time). Returns when the
/// elector has stopped.
pub async fn run_warm<S, W, F>(
    mut leadership: Leadership,
    readiness: Readiness,
    synced: S,
    mut work: W,
) where
    S: Future<Output = ()>,
    W: FnMut(Term) -> F,
    F: Future<Output = ()>,
{
    synced.await;
    readiness.set_synced(true);
    while let Some(term) = leadership.leading().await {
        tokio::select! {
            biased;
            _ = term.lost() => {}
            _ = work(term.clone()) => term.lost().await,
        }
    }
}
