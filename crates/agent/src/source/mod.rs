//! The static pod source: a directory of Pod manifests (YAML or JSON),
//! read into [`DesiredPod`]s and watched with inotify.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::types::{DesiredPod, PodUid};

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

/// What happened to one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeKind {
    /// A new pod.
    Added,
    /// The pod's desired state changed.
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

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    node: String,
    pods: RwLock<BTreeMap<PodUid, DesiredPod>>,
}

/// The desired pods from one manifest directory. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PodSource {
    inner: Arc<Inner>,
}

impl PodSource {
    /// Reads `dir` once. Err if dir does not exist or is not a directory
    /// (message names the path).
    pub fn load(dir: &Path, node_name: &str) -> Result<Self, SourceError> {
        let _ = (dir, node_name);
        Err(SourceError::NotADirectory {
            path: dir.to_path_buf(),
            reason: "not implemented yet".into(),
        })
    }

    /// The pod with this UID.
    pub fn get(&self, uid: &str) -> Option<DesiredPod> {
        self.read().get(uid).cloned()
    }

    /// Every pod, ordered by UID.
    pub fn all(&self) -> Vec<DesiredPod> {
        self.read().values().cloned().collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<PodUid, DesiredPod>> {
        self.inner.pods.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches the directory with inotify (no polling), re-reads changed
    /// files, updates the snapshot and sends one [`SourceChange`] per pod
    /// whose [`DesiredPod`] changed. Runs until the receiver is dropped or
    /// the task aborted.
    pub fn spawn_watch(
        &self,
        tx: tokio::sync::mpsc::UnboundedSender<SourceChange>,
    ) -> Result<tokio::task::JoinHandle<()>, SourceError> {
        let _ = (tx, &self.inner.dir, &self.inner.node);
        Err(SourceError::Watch {
            path: self.inner.dir.clone(),
            source: std::io::Error::other("not implemented yet"),
        })
    }
}
