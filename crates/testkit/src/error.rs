//! The kit's errors: each names the component, the path or command, and
//! where to look next.

use std::path::PathBuf;

/// What went wrong while preparing or running a peer.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// A binary, image set or file the run needs is not there.
    #[error("{component} not found at {path} ({hint})")]
    Missing {
        /// What is missing (`critest`, `conformance images`, ...).
        component: String,
        /// Where it was looked for.
        path: PathBuf,
        /// How to get it.
        hint: String,
    },
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation (`write`, `create directory`, ...).
        op: &'static str,
        /// The path it was done on.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A peer did not start or did not become ready.
    #[error("{component} failed to start: {detail}; command: {command}; log: {log}")]
    Start {
        /// The peer (`petrel runtime`, `containerd`, `docker-registry`).
        component: String,
        /// The command line it was started with.
        command: String,
        /// Its log file.
        log: PathBuf,
        /// What was seen (exit status, timeout).
        detail: String,
    },
    /// A run produced no usable result.
    #[error("{component}: {detail}; log: {log}")]
    Run {
        /// The peer that ran (`critest`).
        component: String,
        /// What was wrong.
        detail: String,
        /// Its log file.
        log: PathBuf,
    },
    /// An expected list could not be read.
    #[error("expected list {path} line {line}: {detail}")]
    Expected {
        /// The list's path.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        detail: String,
    },
}

impl KitError {
    /// An I/O error of `op` on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> KitError {
        KitError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
