//! The inotify loop: events mark files dirty, which are re-read at once;
//! after a move-away or delete a short quiet period merges bursts first
//! (an editor's rename-away-and-write-back is one change, not a removal and
//! an add).

use std::collections::{BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::time::Instant;

use super::{parse, PodSource, SourceChange};

/// How long the directory must stay quiet before dirty files are read.
const QUIET: Duration = Duration::from_millis(25);
/// A steady stream of events still gets read this often.
const MAX_DELAY: Duration = Duration::from_millis(250);
/// How long a newly created file may stay open for writing before it is
/// read anyway (a hard link gives a create with no close).
const WRITE_WAIT: Duration = Duration::from_secs(2);

/// Events on entries of the manifest directory.
fn dir_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

/// Events on the directory's own name in its parent: it being replaced.
fn parent_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::ONLYDIR
}

/// The watch loop's state.
pub(super) struct Watcher {
    source: PodSource,
    stream: EventStream<Vec<u8>>,
    watches: Watches,
    dir_wd: Option<WatchDescriptor>,
    parent_wd: Option<WatchDescriptor>,
    dir_name: Option<OsString>,
    /// Files to re-read.
    dirty: BTreeSet<OsString>,
    /// The whole directory must be read again.
    full: bool,
    /// New regular files not yet closed after writing, since when.
    writing: HashMap<OsString, Instant>,
    /// An entry was moved away or deleted since the last read: wait for
    /// quiet, it may be an editor replacing the file. Without one, a file
    /// written or moved in is read at once.
    removal: bool,
    /// When the first unprocessed event arrived.
    first_pending: Option<Instant>,
    last_event: Option<Instant>,
}

impl Watcher {
    /// Sets up inotify on the directory and its parent.
    pub(super) fn new(source: PodSource) -> std::io::Result<Self> {
        let inotify = Inotify::init()?;
        let mut watches = inotify.watches();
        let dir = source.inner.dir.clone();
        let dir_wd = Some(watches.add(&dir, dir_mask())?);
        let parent = parent_of(&dir);
        let parent_wd = match &parent {
            Some(p) => Some(watches.add(p, parent_mask())?),
            None => None,
        };
        let stream = inotify.into_event_stream(vec![0u8; 16 * 1024])?;
        let watches = stream.watches();
        Ok(Self {
            dir_name: dir.file_name().map(OsStr::to_os_string),
            source,
            stream,
            watches,
            dir_wd,
            parent_wd,
            dirty: BTreeSet::new(),
            // Whatever changed between load and now is picked up at once.
            full: true,
            writing: HashMap::new(),
            removal: false,
            first_pending: Some(Instant::now()),
            last_event: Some(Instant::now()),
        })
    }

    /// Runs until dropped (its task aborted), handing each change to
    /// `on_change`.
    pub(super) async fn run(mut self, on_change: impl Fn(SourceChange) + Send + 'static) {
        tracing::debug!(dir = %self.source.inner.dir.display(), "watching manifests");
        loop {
            let deadline = self.deadline();
            tokio::select! {
                ev = self.stream.next() => match ev {
                    Some(Ok(ev)) => self.on_event(ev.wd, ev.mask, ev.name),
                    Some(Err(e)) => {
                        // Nothing sensible to retry on a broken inotify fd.
                        tracing::error!(dir = %self.source.inner.dir.display(), error = %e, "manifest watch failed");
                        return;
                    }
                    None => return,
                },
                _ = sleep_until(deadline) => {
                    for change in self.process() {
                        on_change(change);
                    }
                }
            }
        }
    }

    /// How long to wait for quiet before reading.
    fn quiet(&self) -> Duration {
        if self.removal || self.full {
            QUIET
        } else {
            Duration::ZERO
        }
    }

    /// When pending work is due, if any.
    fn deadline(&self) -> Option<Instant> {
        let settle = match (self.first_pending, self.last_event) {
            (Some(first), Some(last)) => Some((last + self.quiet()).min(first + MAX_DELAY)),
            _ => None,
        };
        let write = self.writing.values().min().map(|t| *t + WRITE_WAIT);
        match (settle, write) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_event(&mut self, wd: WatchDescriptor, mask: EventMask, name: Option<OsString>) {
        let now = Instant::now();
        let mut pending = true;
        if mask.contains(EventMask::Q_OVERFLOW) {
            tracing::warn!("inotify queue overflowed; reading the manifest directory again");
            self.full = true;
        } else if Some(&wd) == self.parent_wd.as_ref() {
            if name.is_some() && name == self.dir_name {
                // The directory was replaced (moved, deleted, a symlink
                // swapped): drop the old watch, watch whatever is there now.
                self.forget_dir_watch();
                self.full = true;
            } else {
                pending = false;
            }
        } else if Some(&wd) == self.dir_wd.as_ref() {
            if mask.intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED) {
                self.forget_dir_watch();
                self.full = true;
            } else if let Some(name) = name {
                pending = self.on_entry(name, mask);
            }
        } else {
            // A watch we already dropped.
            pending = false;
        }
        if pending {
            self.first_pending.get_or_insert(now);
            self.last_event = Some(now);
        }
    }

    /// An event on a directory entry; whether it needs a read.
    fn on_entry(&mut self, name: OsString, mask: EventMask) -> bool {
        let text = name.to_string_lossy();
        if text.starts_with("..") {
            // ConfigMap-style atomic updates swap `..data`; the manifests
            // are links through it, so every one may have changed.
            self.full = true;
            return true;
        }
        if !parse::is_manifest_name(&text) || mask.contains(EventMask::ISDIR) {
            return false;
        }
        if mask.contains(EventMask::CREATE) {
            let path = self.source.inner.dir.join(&name);
            let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file());
            if is_file {
                // Its writer holds it open: read it on close, not half-written.
                self.writing.insert(name, Instant::now());
                return false;
            }
        } else {
            self.writing.remove(&name);
        }
        if mask.intersects(EventMask::MOVED_FROM | EventMask::DELETE) {
            self.removal = true;
        }
        self.dirty.insert(name);
        true
    }

    fn forget_dir_watch(&mut self) {
        if let Some(wd) = self.dir_wd.take() {
            // Fails when the kernel already dropped it (directory deleted).
            let _ = self.watches.remove(wd);
        }
    }

    /// Re-reads what is dirty and returns the changes.
    fn process(&mut self) -> Vec<SourceChange> {
        let now = Instant::now();
        let mut overdue = Vec::new();
        self.writing.retain(|name, since| {
            let keep = now < *since + WRITE_WAIT;
            if !keep {
                overdue.push(name.clone());
            }
            keep
        });
        self.dirty.extend(overdue);
        let settled = match (self.first_pending, self.last_event) {
            (Some(f), Some(l)) => now >= (l + self.quiet()).min(f + MAX_DELAY),
            _ => true,
        };
        if !settled {
            return Vec::new();
        }
        self.removal = false;
        self.first_pending = None;
        self.last_event = None;
        let changes = if self.full {
            self.full = false;
            self.dirty.clear();
            if self.dir_wd.is_none() {
                self.rewatch_dir();
            }
            self.source.refresh(None)
        } else if self.dirty.is_empty() {
            Vec::new()
        } else {
            let names: Vec<OsString> = std::mem::take(&mut self.dirty).into_iter().collect();
            self.source.refresh(Some(&names))
        };
        if !changes.is_empty() {
            tracing::info!(
                dir = %self.source.inner.dir.display(),
                changes = changes.len(),
                "manifests changed"
            );
        }
        changes
    }

    /// Watches the directory again after it was replaced; before reading
    /// it, so nothing written in between is missed.
    fn rewatch_dir(&mut self) {
        let dir = self.source.inner.dir.clone();
        match self.watches.add(&dir, dir_mask()) {
            Ok(wd) => self.dir_wd = Some(wd),
            // Gone for now; the parent's watch tells when it is back.
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "manifest directory not watchable")
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The parent directory, absolute, if any (`.` for a bare relative name).
fn parent_of(dir: &std::path::Path) -> Option<PathBuf> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir().ok()?.join(dir)
    };
    abs.parent().map(|p| p.to_path_buf())
}
