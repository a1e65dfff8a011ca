//! The static pod source: a directory of Pod manifests (YAML or JSON),
//! read into [`DesiredPod`]s and watched with inotify.
//!
//! - [`parse`]: file names that count, files into documents;
//! - [`defaults`]: the API server's defaults;
//! - [`validate`]: field checks with Kubernetes-style messages;
//! - [`uid`]: stable pod UIDs;
//! - `snapshot`: documents of all files into pods, duplicates, diffs;
//! - `watch`: the inotify loop.
//!
//! A document that cannot run still becomes a pod, marked invalid with the
//! reason, so it is shown and never started; other pods are unaffected.
//!
//! In cluster mode the same source also holds the pods the API server
//! bound to this node ([`api`]), fed by the cluster's pod informer.

pub mod api;
pub mod defaults;
pub mod parse;
mod snapshot;
pub mod uid;
pub mod validate;
mod watch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::types::{DesiredPod, PodUid};
use parse::Doc;
use snapshot::{Files, Owners, Snapshot};

/// Largest manifest file read (kubelet's file source reads at most 10 MB
/// of one too): a larger one is a broken document, never read into memory.
pub const MAX_MANIFEST_BYTES: u64 = 10 << 20;

/// Errors of the manifest source (invalid manifests are not errors: they
/// become pods marked invalid).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The manifest directory is missing or not a directory.
    #[error("manifest directory {path}: {reason}")]
    NotADirectory {
        /// The directory.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// Reading the directory failed.
    #[error("read manifest directory {path}: {source}")]
    ReadDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Setting up inotify failed.
    #[error("watch manifest directory {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// How static pods are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// As the manifest names them.
    AsWritten,
    /// `<name>-<node>` (cluster mode, as kubelet).
    NodeSuffix,
}

/// What happened to one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    /// A new pod.
    Added,
    /// The pod's desired state (pod object or validity) changed.
    Updated,
    /// The pod is gone from the manifests.
    Removed,
}

/// One pod's change, sent by the watcher.
#[derive(Debug, Clone)]
pub struct SourceChange {
    /// The pod's UID.
    pub uid: PodUid,
    /// What happened.
    pub kind: ChangeKind,
    /// The pod now (for Removed: as it was last).
    pub pod: DesiredPod,
}

#[derive(Debug, Default)]
struct State {
    files: Files,
    pods: Snapshot,
    owners: Owners,
    /// The API server's pods for this node, wanted.
    api: Snapshot,
    /// The API server's pods being deleted (stopped, then deleted).
    api_deleting: Snapshot,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    node: String,
    naming: Naming,
    state: RwLock<State>,
    /// Set by [`PodSource::withdraw_all`]: no pod is wanted any more.
    withdrawn: AtomicBool,
}

/// The desired pods from one manifest directory. Cheap to clone; clones
/// share the snapshot the watcher keeps current.
#[derive(Debug, Clone)]
pub struct PodSource {
    inner: Arc<Inner>,
}

impl PodSource {
    /// Reads `dir` once. Err if dir does not exist or is not a directory
    /// (message names the path).
    pub fn load(dir: &Path, node_name: &str) -> Result<Self, SourceError> {
        Self::load_with(dir, node_name, Naming::AsWritten)
    }

    /// [`PodSource::load`] for a node of a cluster: each static pod is
    /// named `<name>-<node>`, as kubelet names them, so that its mirror
    /// pod in the API is unique to this node.
    pub fn load_in_cluster(dir: &Path, node_name: &str) -> Result<Self, SourceError> {
        Self::load_with(dir, node_name, Naming::NodeSuffix)
    }

    fn load_with(dir: &Path, node_name: &str, naming: Naming) -> Result<Self, SourceError> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(SourceError::NotADirectory {
                    path: dir.to_path_buf(),
                    reason: "not a directory".into(),
                })
            }
            Err(e) => {
                return Err(SourceError::NotADirectory {
                    path: dir.to_path_buf(),
                    reason: e.to_string(),
                })
            }
        }
        let files = scan(dir).map_err(|source| SourceError::ReadDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let (pods, owners) = snapshot::build(&files, node_name, naming);
        tracing::info!(
            dir = %dir.display(),
            pods = pods.len(),
            invalid = pods.values().filter(|p| p.invalid.is_some()).count(),
            "manifests loaded"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                node: node_name.to_string(),
                naming,
                state: RwLock::new(State {
                    files,
                    pods,
                    owners,
                    api: Snapshot::new(),
                    api_deleting: Snapshot::new(),
                }),
                withdrawn: AtomicBool::new(false),
            }),
        })
    }

    /// The pod with this UID.
    pub fn get(&self, uid: &str) -> Option<DesiredPod> {
        if self.is_withdrawn() {
            return None;
        }
        let st = self.read();
        st.pods.get(uid).or_else(|| st.api.get(uid)).cloned()
    }

    /// Every pod, ordered by UID.
    pub fn all(&self) -> Vec<DesiredPod> {
        if self.is_withdrawn() {
            return Vec::new();
        }
        let st = self.read();
        let mut all: Vec<DesiredPod> = st.pods.values().chain(st.api.values()).cloned().collect();
        all.sort_by(|a, b| a.uid.cmp(&b.uid));
        all
    }

    /// From now on no pod is wanted, whatever the manifests say: the node
    /// is draining ([`AgentConfig::drain_on_exit`](crate::AgentConfig)),
    /// and its pod workers terminate every pod as if its manifest were
    /// deleted. There is no way back: the agent exits after the drain.
    pub fn withdraw_all(&self) {
        self.inner.withdrawn.store(true, Ordering::Release);
    }

    fn is_withdrawn(&self) -> bool {
        self.inner.withdrawn.load(Ordering::Acquire)
    }

    /// The pod that owns `namespace/name`: the first defined, in path
    /// order. A later duplicate is a pod of its own (invalid, own UID) and
    /// must not be published over the owner's status.
    pub fn owner(&self, namespace: &str, name: &str) -> Option<PodUid> {
        if self.is_withdrawn() {
            return None;
        }
        let st = self.read();
        let key = (namespace.to_string(), name.to_string());
        st.owners.get(&key).cloned().or_else(|| {
            st.api
                .values()
                .find(|d| d.namespace == namespace && d.name == name)
                .map(|d| d.uid.clone())
        })
    }

    /// The watched directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.inner.state.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The watch of the directory, to run as a task: inotify (no polling),
    /// changed files re-read, the snapshot updated and `on_change` called
    /// with one [`SourceChange`] per pod whose [`DesiredPod`] changed
    /// (touching a file changes nothing), from the watch's task (it must
    /// not block). Handles editors' rename-into-place, deletes, new files
    /// and the directory being replaced. Runs until its task is aborted.
    pub fn watch(
        &self,
        on_change: impl Fn(SourceChange) + Send + 'static,
    ) -> Result<impl std::future::Future<Output = ()> + Send + 'static, SourceError> {
        let watcher = watch::Watcher::new(self.clone()).map_err(|source| SourceError::Watch {
            path: self.inner.dir.clone(),
            source,
        })?;
        Ok(watcher.run(on_change))
    }

    /// Re-reads the named files (names inside the directory), or the whole
    /// directory when `names` is None, and returns the changes.
    fn refresh(&self, names: Option<&[std::ffi::OsString]>) -> Vec<SourceChange> {
        let dir = &self.inner.dir;
        // Read outside the lock: readers of the snapshot never wait on I/O.
        let update: Result<Files, std::io::Error> = match names {
            None => scan(dir),
            Some(names) => Ok(names
                .iter()
                .filter_map(|n| {
                    let path = dir.join(n);
                    read_manifest(&path).map(|docs| (path, docs))
                })
                .collect()),
        };
        let mut st = self.inner.state.write().unwrap_or_else(|p| p.into_inner());
        match (names, update) {
            (None, Ok(files)) => st.files = files,
            (None, Err(e)) => {
                // A directory that is gone holds no pods; it may come back.
                tracing::warn!(dir = %dir.display(), error = %e, "manifest directory unreadable");
                st.files.clear();
            }
            (Some(names), Ok(mut read)) => {
                for n in names {
                    let path = dir.join(n);
                    match read.remove(&path) {
                        Some(docs) => st.files.insert(path, docs),
                        None => st.files.remove(&path),
                    };
                }
            }
            (Some(_), Err(_)) => {}
        }
        let (mut pods, owners) = snapshot::build(&st.files, &self.inner.node, self.inner.naming);
        snapshot::keep_unchanged(&st.pods, &mut pods);
        let changes = snapshot::diff(&st.pods, &pods);
        st.pods = pods;
        st.owners = owners;
        changes
    }
}

/// Reads every manifest file of `dir`.
fn scan(dir: &Path) -> Result<Files, std::io::Error> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if !name.to_str().is_some_and(parse::is_manifest_name) {
            continue;
        }
        let path = entry.path();
        if let Some(docs) = read_manifest(&path) {
            files.insert(path, docs);
        }
    }
    Ok(files)
}

/// The documents of one manifest file; None when it is not a manifest (a
/// directory, gone, an ignored name). A file that cannot be read is one
/// broken document, shown with the reason.
fn read_manifest(path: &Path) -> Option<Vec<Doc>> {
    let name = path.file_name()?.to_str()?;
    if !parse::is_manifest_name(name) {
        return None;
    }
    // Follows symlinks: a linked manifest counts as its target.
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        _ => return None,
    }
    match read_at_most(path, MAX_MANIFEST_BYTES) {
        Ok(Some(bytes)) => match String::from_utf8(bytes) {
            Ok(text) => Some(parse::parse(path, &text)),
            Err(_) => Some(vec![Doc::broken("not UTF-8 text".into())]),
        },
        Ok(None) => Some(vec![Doc::broken(format!(
            "{} is larger than {MAX_MANIFEST_BYTES} bytes; not read",
            path.display()
        ))]),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(vec![Doc::broken(format!("read {}: {e}", path.display()))]),
    }
}

/// The content of `path`, or `None` when it holds more than `limit`
/// bytes: at most `limit + 1` bytes are read, whatever its size says (a
/// file may grow while it is read).
fn read_at_most(path: &Path, limit: u64) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    if f.metadata()?.len() > limit {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    f.take(limit + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= limit).then_some(bytes))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
