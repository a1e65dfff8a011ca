//! Pull progress: what each layer of a pull is doing, published through a
//! `tokio::sync::watch` channel. A watch channel keeps only the newest
//! snapshot, so updating it for every downloaded chunk costs a lock and a
//! few additions however slow the reader is; a reader that wants fewer
//! messages (a gRPC stream) paces itself with [`Throttle`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// What one layer of a pull is doing. The order is the usual course of a
/// layer: `Waiting` → `Downloading` → `Downloaded` → `Unpacking` → `Done`;
/// a layer the store already has is `Exists` from the start to the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LayerState {
    /// Not started: queued behind other downloads, or waiting for another
    /// pull that downloads the same blob.
    Waiting,
    /// Bytes are arriving.
    Downloading,
    /// The store has the layer already: nothing to fetch or unpack.
    Exists,
    /// The blob is complete and its size and digest are verified (by this
    /// pull, or by a concurrent pull whose file this one shares).
    Downloaded,
    /// The layer is being unpacked into the store.
    Unpacking,
    /// Unpacked and its diff id verified (or found unpacked by then); the
    /// image is committed once no layer is left in another state.
    Done,
}

impl LayerState {
    /// A short lower-case word for people.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Downloading => "downloading",
            Self::Exists => "already exists",
            Self::Downloaded => "downloaded",
            Self::Unpacking => "unpacking",
            Self::Done => "done",
        }
    }

    /// Whether nothing more will happen to the layer in this pull.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Exists | Self::Done)
    }
}

/// One layer in a [`PullProgress`] snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerProgress {
    /// The layer blob's digest (as in the manifest).
    pub digest: String,
    /// The blob's size from the manifest.
    pub size: u64,
    /// Bytes of the blob downloaded so far (`size` once downloaded or
    /// shared from another pull; 0 for a layer that exists).
    pub done: u64,
    /// What the layer is doing.
    pub state: LayerState,
}

/// A snapshot of a pull: empty until the manifest is known, then one entry
/// per layer, base layer first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullProgress {
    /// The layers of the image, base first.
    pub layers: Vec<LayerProgress>,
}

impl PullProgress {
    /// The state of every layer, in order: two snapshots with the same
    /// states differ only in byte counts.
    pub fn states(&self) -> Vec<LayerState> {
        self.layers.iter().map(|l| l.state).collect()
    }
}

/// Reports a pull's progress. The default reporter is disabled and costs
/// nothing; [`ProgressReporter::channel`] makes one whose snapshots a
/// [`watch::Receiver`] reads. Cheap to clone (all clones report to the same
/// channel).
#[derive(Debug, Clone, Default)]
pub struct ProgressReporter {
    tx: Option<Arc<watch::Sender<PullProgress>>>,
}

impl ProgressReporter {
    /// A reporter and the receiver of its snapshots.
    pub fn channel() -> (Self, watch::Receiver<PullProgress>) {
        let (tx, rx) = watch::channel(PullProgress::default());
        (
            Self {
                tx: Some(Arc::new(tx)),
            },
            rx,
        )
    }

    /// A reporter that reports nothing.
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Applies `f` to the snapshot and notifies readers if it changed
    /// anything.
    fn update(&self, f: impl FnOnce(&mut PullProgress) -> bool) {
        if let Some(tx) = &self.tx {
            tx.send_if_modified(f);
        }
    }

    /// The image's layers are known (digest and size each, base first):
    /// all start `Waiting`.
    pub fn layers(&self, layers: impl IntoIterator<Item = (String, u64)>) {
        if self.tx.is_none() {
            return;
        }
        let layers: Vec<LayerProgress> = layers
            .into_iter()
            .map(|(digest, size)| LayerProgress {
                digest,
                size,
                done: 0,
                state: LayerState::Waiting,
            })
            .collect();
        self.update(|p| {
            p.layers = layers;
            true
        });
    }

    /// Layer `index` is now in `state`. `Downloaded` and `Done` count the
    /// whole blob as done. A change that would go back is ignored (a layer
    /// shared by two entries of one manifest may hear of both).
    pub fn set(&self, index: usize, state: LayerState) {
        self.update(|p| match p.layers.get_mut(index) {
            Some(l) if advance_allowed(l.state, state) => {
                l.state = state;
                if matches!(state, LayerState::Downloaded | LayerState::Done) && l.done < l.size {
                    l.done = l.size;
                }
                true
            }
            _ => false,
        });
    }

    /// `bytes` more of layer `index` arrived (the layer is `Downloading`).
    pub fn add_bytes(&self, index: usize, bytes: u64) {
        self.update(|p| match p.layers.get_mut(index) {
            Some(l) if matches!(l.state, LayerState::Waiting | LayerState::Downloading) => {
                l.state = LayerState::Downloading;
                l.done = l.done.saturating_add(bytes);
                true
            }
            _ => false,
        });
    }

    /// The image is committed: every layer that is not `Exists` is `Done`.
    pub fn finish(&self) {
        self.update(|p| {
            let mut changed = false;
            for l in &mut p.layers {
                if l.state != LayerState::Exists && l.state != LayerState::Done {
                    l.state = LayerState::Done;
                    l.done = l.size;
                    changed = true;
                }
            }
            changed
        });
    }
}

/// Whether a layer may go from `from` to `to`: forward along the course
/// of a download, never back, and `Exists` only from `Waiting` (a layer
/// found in the store before any byte was fetched).
fn advance_allowed(from: LayerState, to: LayerState) -> bool {
    use LayerState::*;
    match (from, to) {
        (Exists, _) | (Done, _) => false,
        (Waiting, Exists) => true,
        (_, Exists) => false,
        (from, to) => to > from,
    }
}

/// Paces a stream of snapshots: a snapshot whose layer states differ from
/// the last one sent goes at once; one that only moves byte counts goes
/// when `interval` has passed since the last send, else it is held back
/// until [`due`](Self::due) (and replaced by newer ones meanwhile).
#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    last_sent: Option<Instant>,
    last_states: Vec<LayerState>,
    held: bool,
}

impl Throttle {
    /// A throttle sending byte-count updates at most every `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last_sent: None,
            last_states: Vec::new(),
            held: false,
        }
    }

    /// Whether `snapshot`, the newest at `now`, should be sent now. When
    /// it says yes the caller sends it; when no, the snapshot is held back
    /// and [`due`](Self::due) says when to offer the newest one again.
    pub fn offer(&mut self, snapshot: &PullProgress, now: Instant) -> bool {
        let states = snapshot.states();
        let changed = states != self.last_states;
        let waited = self
            .last_sent
            .is_none_or(|t| now.saturating_duration_since(t) >= self.interval);
        if changed || waited {
            self.last_sent = Some(now);
            self.last_states = states;
            self.held = false;
            true
        } else {
            self.held = true;
            false
        }
    }

    /// When a held-back snapshot should be offered again, if one is held.
    pub fn due(&self) -> Option<Instant> {
        match (self.held, self.last_sent) {
            (true, Some(t)) => Some(t + self.interval),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LayerState::*;

    fn two_layers() -> (ProgressReporter, watch::Receiver<PullProgress>) {
        let (r, rx) = ProgressReporter::channel();
        r.layers([("sha256:a".to_string(), 100), ("sha256:b".to_string(), 50)]);
        (r, rx)
    }

    #[test]
    fn layers_should_start_waiting_with_nothing_done() {
        let (_r, rx) = two_layers();
        let p = rx.borrow().clone();
        assert_eq!(p.states(), vec![Waiting, Waiting]);
        assert_eq!(p.layers[0].digest, "sha256:a");
        assert_eq!(p.layers[0].size, 100);
        assert!(p.layers.iter().all(|l| l.done == 0));
    }

    #[test]
    fn bytes_should_add_up_and_mark_downloading() {
        let (r, rx) = two_layers();
        r.add_bytes(0, 30);
        r.add_bytes(0, 20);
        let p = rx.borrow().clone();
        assert_eq!(p.layers[0].state, Downloading);
        assert_eq!(p.layers[0].done, 50);
        assert_eq!(p.layers[1].state, Waiting);
        r.set(0, Downloaded);
        assert_eq!(rx.borrow().layers[0].done, 100);
        // Bytes after the download is verified change nothing.
        r.add_bytes(0, 5);
        assert_eq!(rx.borrow().layers[0].done, 100);
        assert_eq!(rx.borrow().layers[0].state, Downloaded);
    }

    #[test]
    fn states_should_only_go_forward() {
        let (r, rx) = two_layers();
        r.set(0, Downloaded);
        r.set(0, Downloading);
        r.set(0, Waiting);
        assert_eq!(rx.borrow().layers[0].state, Downloaded);
        r.set(0, Exists);
        assert_eq!(rx.borrow().layers[0].state, Downloaded);
        r.set(0, Unpacking);
        r.set(0, Done);
        r.set(0, Unpacking);
        assert_eq!(rx.borrow().layers[0].state, Done);
        // Exists only from Waiting, and it is final.
        r.set(1, Exists);
        r.set(1, Done);
        r.add_bytes(1, 10);
        assert_eq!(rx.borrow().layers[1].state, Exists);
        assert_eq!(rx.borrow().layers[1].done, 0);
    }

    #[test]
    fn a_shared_download_should_go_from_waiting_to_downloaded() {
        // The pull that waits for another's download never sees bytes.
        let (r, rx) = two_layers();
        r.set(1, Downloaded);
        let l = rx.borrow().layers[1].clone();
        assert_eq!((l.state, l.done), (Downloaded, 50));
    }

    #[test]
    fn finish_should_mark_all_but_existing_layers_done() {
        let (r, rx) = two_layers();
        r.set(0, Exists);
        r.set(1, Downloaded);
        r.finish();
        assert_eq!(rx.borrow().states(), vec![Exists, Done]);
    }

    #[test]
    fn unchanged_updates_should_not_wake_readers() {
        let (r, mut rx) = two_layers();
        rx.borrow_and_update();
        r.set(0, Downloaded);
        assert!(rx.has_changed().unwrap_or(false));
        rx.borrow_and_update();
        r.set(0, Downloaded);
        r.set(5, Done);
        r.add_bytes(7, 1);
        assert!(!rx.has_changed().unwrap_or(true));
    }

    #[test]
    fn a_disabled_reporter_should_do_nothing() {
        let r = ProgressReporter::disabled();
        r.layers([("sha256:a".to_string(), 1)]);
        r.add_bytes(0, 1);
        r.set(0, Done);
        r.finish();
    }

    fn snap(states: &[LayerState], done: u64) -> PullProgress {
        PullProgress {
            layers: states
                .iter()
                .map(|s| LayerProgress {
                    digest: "sha256:x".into(),
                    size: 1000,
                    done,
                    state: *s,
                })
                .collect(),
        }
    }

    #[test]
    fn throttle_should_send_state_changes_at_once_and_bytes_at_most_per_interval() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = Throttle::new(ms(100));
        assert!(t.offer(&snap(&[Waiting], 0), t0), "the first goes");
        assert!(
            t.offer(&snap(&[Downloading], 10), t0 + ms(1)),
            "state change"
        );
        assert!(
            !t.offer(&snap(&[Downloading], 20), t0 + ms(2)),
            "bytes held"
        );
        assert!(
            !t.offer(&snap(&[Downloading], 30), t0 + ms(50)),
            "bytes held"
        );
        assert_eq!(t.due(), Some(t0 + ms(101)));
        assert!(t.offer(&snap(&[Downloading], 40), t0 + ms(101)), "due");
        assert_eq!(t.due(), None, "nothing held after a send");
        assert!(t.offer(&snap(&[Downloaded], 1000), t0 + ms(102)), "state");
        assert!(
            t.offer(&snap(&[Downloaded, Waiting], 0), t0 + ms(103)),
            "new layer"
        );
        assert!(
            t.offer(&snap(&[Downloaded], 1000), t0 + ms(300)),
            "interval"
        );
    }
}
