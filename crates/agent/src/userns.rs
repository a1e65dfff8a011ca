//! Host id ranges of pods with `hostUsers: false`, as kubelet hands them
//! out: each such pod gets 65536 ids of its own (uids and gids alike) from
//! a range the agent owns, host ids `[65536, 2^31)`: the first 65536 are
//! the host's users, and no two pods of the node share an id.
//!
//! The range given to a pod is kept in its directory (`<agent root>/pods/
//! <uid>/userns`, JSON), so that it survives an agent restart and a new
//! sandbox of the pod gets the same one (its volumes' files stay its own).
//! Which ranges are taken is read from those files at each allocation,
//! under a lock: a pod whose directory is removed has given its range back,
//! and nothing is kept in memory that could drift from the disk.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Ids per pod (kubelet's).
pub const IDS_PER_POD: u32 = 65536;

/// The first slot the agent gives (slot 0 is the host's own users).
const FIRST_SLOT: u32 = 1;

/// One past the last slot: host ids stay below 2^31.
const END_SLOT: u32 = 1 << 15;

/// The file in a pod's directory.
const FILE: &str = "userns";

/// Why a pod got no range.
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    /// Every range is taken.
    #[error("no user namespace range left: {0} pods hold one each")]
    Exhausted(usize),
    /// Reading or writing a pod's range failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A pod's file holds what the agent never wrote.
    #[error("{path}: not a user namespace range of this agent ({reason})")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// What a pod's file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    /// The host id of the pod's root (uid and gid).
    host_id: u32,
    /// How many ids.
    length: u32,
}

/// Hands out pods' ranges from the pods directory `<agent root>/pods`.
#[derive(Debug)]
pub struct UsernsAllocator {
    pods_dir: PathBuf,
    lock: Mutex<()>,
}

impl UsernsAllocator {
    /// An allocator over the pod directories in `pods_dir`.
    pub fn new(pods_dir: PathBuf) -> Self {
        Self {
            pods_dir,
            lock: Mutex::new(()),
        }
    }

    /// The host id of the root of the pod whose directory is `pod_dir`
    /// (below the pods directory): its range's if it has one, else the
    /// first free range, recorded in it (the directory is made). Blocking
    /// (a few small reads).
    pub fn host_id(&self, pod_dir: &Path) -> Result<u32, UsernsError> {
        let _held = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let file = pod_dir.join(FILE);
        if let Some(id) = read(&file)? {
            return Ok(id);
        }
        let taken = self.taken();
        let slot = (FIRST_SLOT..END_SLOT)
            .find(|s| !taken.contains(&(s * IDS_PER_POD)))
            .ok_or(UsernsError::Exhausted(taken.len()))?;
        let host_id = slot * IDS_PER_POD;
        let io = |op, source| UsernsError::Io {
            op,
            path: file.clone(),
            source,
        };
        petrel_fs::create_private_dir_all(pod_dir, petrel_fs::PRIVATE)
            .map_err(|e| io("create the directory of", std::io::Error::other(e)))?;
        let json = serde_json::to_vec(&Stored {
            host_id,
            length: IDS_PER_POD,
        })
        .map_err(|e| io("encode", std::io::Error::other(e)))?;
        // Whole or not at all: written aside, then renamed.
        let tmp = pod_dir.join(format!("{FILE}.tmp"));
        std::fs::write(&tmp, json).map_err(|e| io("write", e))?;
        std::fs::rename(&tmp, &file).map_err(|e| io("rename into", e))?;
        Ok(host_id)
    }

    /// The host ids of the ranges the pods' files hold (an unreadable one
    /// is logged and skipped: its pod gets a refusal of its own).
    fn taken(&self) -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir(&self.pods_dir) else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| match read(&e.path().join(FILE)) {
                Ok(id) => id,
                Err(err) => {
                    tracing::warn!(error = %err, "user namespace range of a pod not read");
                    None
                }
            })
            .collect()
    }
}

/// The host id a pod's file holds; `None` when there is no file.
fn read(file: &Path) -> Result<Option<u32>, UsernsError> {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(UsernsError::Io {
                op: "read",
                path: file.to_path_buf(),
                source,
            })
        }
    };
    let corrupt = |reason: String| UsernsError::Corrupt {
        path: file.to_path_buf(),
        reason,
    };
    let s: Stored = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let slot = s.host_id / IDS_PER_POD;
    if s.length != IDS_PER_POD
        || !s.host_id.is_multiple_of(IDS_PER_POD)
        || !(FIRST_SLOT..END_SLOT).contains(&slot)
    {
        return Err(corrupt(format!(
            "host id {} length {}",
            s.host_id, s.length
        )));
    }
    Ok(Some(s.host_id))
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn host_id_should_give_each_pod_its_own_range_and_keep_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = UsernsAllocator::new(root.path().to_path_buf());
        let (p1, p2) = (root.path().join("uid-1"), root.path().join("uid-2"));
        let first = a.host_id(&p1).expect("range");
        let second = a.host_id(&p2).expect("range");
        assert_eq!(first, 65536);
        assert_eq!(second, 2 * 65536);
        assert_eq!(a.host_id(&p1).expect("range"), first, "kept");
        // A restarted agent reads the same ranges.
        let b = UsernsAllocator::new(root.path().to_path_buf());
        assert_eq!(b.host_id(&p2).expect("range"), second);
        let third = b.host_id(&root.path().join("uid-3")).expect("range");
        assert_eq!(third, 3 * 65536);
        // A removed pod gives its range back.
        std::fs::remove_dir_all(&p1).expect("rm");
        assert_eq!(b.host_id(&root.path().join("uid-4")).expect("range"), first);
    }

    #[test]
    fn host_id_should_refuse_a_file_it_did_not_write() {
        let root = tempfile::tempdir().expect("tempdir");
        let a = UsernsAllocator::new(root.path().to_path_buf());
        let p = root.path().join("uid-x");
        std::fs::create_dir(&p).expect("mkdir");
        std::fs::write(p.join(FILE), r#"{"hostId":0,"length":65536}"#).expect("write");
        let err = a.host_id(&p).expect_err("host root refused");
        assert!(matches!(err, UsernsError::Corrupt { .. }), "{err}");
        // Another pod is not held up by it.
        assert_eq!(a.host_id(&root.path().join("uid-y")).expect("range"), 65536);
    }
}
