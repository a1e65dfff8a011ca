//! The admin API's streaming PullImage: the same pull as CRI PullImage
//! (`Runtime::pull_and_store`), with per-layer progress snapshots sent as
//! it goes.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_cri::admin as adm;
use petrel_cri::api;
use petrel_image::registry::{LayerState, ProgressReporter, PullProgress, Throttle};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use crate::error::{Result, RuntimeError};
use crate::service::Runtime;

/// Byte counts are sent at most this often; state changes go at once.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);
/// Messages queued for a client. A client this far behind misses byte
/// updates (each snapshot is complete, so the next one makes up for it).
pub(crate) const PROGRESS_QUEUE: usize = 64;

/// The messages of one streamed pull.
pub(crate) type PullStream =
    Pin<Box<dyn Stream<Item = Result<adm::PullImageProgress, Status>> + Send + 'static>>;

/// Where the progress messages of one pull go.
pub(crate) type ProgressSender = mpsc::Sender<Result<adm::PullImageProgress, Status>>;

/// The CRI form of the admin request's credentials.
fn cri_auth(a: adm::RegistryAuth) -> api::AuthConfig {
    api::AuthConfig {
        username: a.username,
        password: a.password,
        auth: a.auth,
        server_address: a.server_address,
        identity_token: a.identity_token,
        registry_token: a.registry_token,
    }
}

fn proto_state(s: LayerState) -> adm::LayerState {
    match s {
        LayerState::Waiting => adm::LayerState::Waiting,
        LayerState::Downloading => adm::LayerState::Downloading,
        LayerState::Exists => adm::LayerState::Exists,
        LayerState::Downloaded => adm::LayerState::Downloaded,
        LayerState::Unpacking => adm::LayerState::Unpacking,
        LayerState::Done => adm::LayerState::Done,
    }
}

/// A snapshot as a message (without `image_ref`).
fn message(p: &PullProgress) -> adm::PullImageProgress {
    adm::PullImageProgress {
        layers: p
            .layers
            .iter()
            .map(|l| adm::LayerProgress {
                digest: l.digest.clone(),
                size: l.size,
                done: l.done,
                state: proto_state(l.state) as i32,
            })
            .collect(),
        image_ref: String::new(),
    }
}

/// Queues a progress message unless the client is that far behind or gone:
/// the pull never waits for a reader.
fn forward(tx: &ProgressSender, p: &PullProgress) {
    if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(Ok(message(p))) {
        tracing::debug!("pull progress reader is behind; skipping a snapshot");
    }
}

impl Runtime {
    /// Pulls `req.image` like CRI PullImage, sending throttled snapshots to
    /// `tx`, and returns the last message (final layer states and the
    /// image id). The pull runs in a task of its own, aborted when the
    /// client goes away (the stream's receiver is dropped), as a CRI
    /// PullImage whose client hung up is: downloads nobody else waits for
    /// stop at once; a commit already begun completes or fails as a whole
    /// (no partial image either way).
    pub(crate) async fn pull_image_progress(
        self: &Arc<Self>,
        req: adm::AdminPullImageRequest,
        tx: &ProgressSender,
    ) -> Result<adm::PullImageProgress> {
        let reference = req.image;
        if reference.is_empty() {
            return Err(RuntimeError::invalid("image", "must not be empty"));
        }
        let auth = req.auth.map(cri_auth);
        let (reporter, mut rx) = ProgressReporter::channel();
        let rt = self.clone();
        let what = reference.clone();
        let mut pull =
            tokio::spawn(async move { rt.pull_and_store(&reference, auth, &reporter).await });
        let _abort = super::AbortOnDrop(pull.abort_handle());
        let mut throttle = Throttle::new(PROGRESS_INTERVAL);
        let mut watching = true;
        let result = loop {
            let due = throttle.due();
            let wake = tokio::time::Instant::from_std(
                due.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)),
            );
            tokio::select! {
                biased;
                joined = &mut pull => {
                    break joined
                        .map_err(|e| RuntimeError::task("PullImage", e))
                        .and_then(|r| r);
                }
                () = tx.closed() => {
                    return Err(RuntimeError::Cancelled(format!(
                        "pull of {what} stopped: its client went away"
                    )));
                }
                changed = rx.changed(), if watching => {
                    if changed.is_err() {
                        watching = false;
                        continue;
                    }
                    let snapshot = rx.borrow_and_update().clone();
                    if throttle.offer(&snapshot, Instant::now()) {
                        forward(tx, &snapshot);
                    }
                }
                () = tokio::time::sleep_until(wake), if due.is_some() => {
                    let snapshot = rx.borrow().clone();
                    if throttle.offer(&snapshot, Instant::now()) {
                        forward(tx, &snapshot);
                    }
                }
            }
        };
        let image = result?;
        let mut last = message(&rx.borrow());
        last.image_ref = image.id;
        Ok(last)
    }
}
