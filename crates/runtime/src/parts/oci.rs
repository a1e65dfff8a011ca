//! The OCI runtime seam: what the runtime asks of runc (or another OCI
//! runtime later) once a container exists.
//!
//! A container is created by its shim, which runs the runtime's `create`
//! (see [`super::ShimLauncher`]); everything after that goes through
//! [`OciRuntime`]. [`Runc`] is the typed path: every operation runs runc.
//! The measured fast paths that spare a runc process (the start through
//! the exec FIFO, the delete of a stopped container by removals) are
//! another implementation, [`super::RuncFastPaths`], used only when
//! `[cri] fast_paths` is on and the runc version is one they mirror.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, SystemTime};

use oci_spec::runtime::{LinuxResources, Process};
use petrel_oci::exec_fifo::EXEC_FIFO;
use petrel_oci::runc::{CheckpointOptions, ExecOutput, Runc, RuncError, RuncState};

use crate::records::ProcessRef;
use crate::util;

/// The errors of the OCI runtime (runc's, whatever the runtime).
pub type OciError = RuncError;

/// The container's init process as found at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitSeen {
    /// Gone, or not known.
    Gone,
    /// Alive and still holding runc's exec FIFO: waiting for its start.
    AwaitingStart,
    /// Alive, the container's own process: started.
    Started,
}

/// An OCI runtime: the operations on containers that exist.
#[async_trait::async_trait]
pub trait OciRuntime: Send + Sync + std::fmt::Debug {
    /// The runtime binary (given to shims, which run its `create`, and to
    /// streaming execs).
    fn binary(&self) -> &Path;

    /// The runtime's state directory (its `--root`).
    fn root(&self) -> &Path;

    /// Starts a created container. `init` is a pidfd on its init and the
    /// init's pid, when known (the fast path needs it; runc does not).
    async fn start(&self, id: &str, init: Option<(OwnedFd, u32)>) -> Result<(), OciError>;

    /// Sends `signal` to the init, or to every process of the container
    /// with `all`.
    async fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), OciError>;

    /// Deletes the container (`force` kills it first). A container the
    /// runtime does not know is deleted already: not an error.
    async fn delete(&self, id: &str, force: bool) -> Result<(), OciError>;

    /// The container's state, `None` when the runtime does not know it.
    async fn state(&self, id: &str) -> Result<Option<RuncState>, OciError>;

    /// Every container the runtime knows.
    async fn list(&self) -> Result<Vec<RuncState>, OciError>;

    /// Applies new resource limits to a running container.
    async fn update(&self, id: &str, resources: &LinuxResources) -> Result<(), OciError>;

    /// Checkpoints a running container with CRIU, leaving it running.
    async fn checkpoint(&self, id: &str, opts: &CheckpointOptions<'_>) -> Result<(), OciError>;

    /// Runs `process` in the container and collects its output; its
    /// temporary files go to `work_dir`.
    async fn exec(
        &self,
        id: &str,
        process: &Process,
        work_dir: &Path,
        timeout: Option<Duration>,
    ) -> Result<ExecOutput, OciError>;

    /// The container's init as start-up recovery finds it; `created` says
    /// the record has it created but not started.
    fn init_seen(&self, id: &str, init: ProcessRef, created: bool) -> InitSeen;

    /// Whether the runtime still sees the container waiting for its start
    /// (runc: its exec FIFO is there).
    fn start_pending(&self, id: &str) -> bool;

    /// When the init took its start, if the runtime can tell.
    fn started_at(&self, id: &str) -> Option<SystemTime>;

    /// Clears what makes the runtime see a started container as waiting
    /// for its start (runc: removes the exec FIFO). Absent is fine.
    fn clear_start(&self, id: &str) -> io::Result<()>;
}

#[async_trait::async_trait]
impl OciRuntime for Runc {
    fn binary(&self) -> &Path {
        Runc::binary(self)
    }

    fn root(&self) -> &Path {
        Runc::root(self)
    }

    async fn start(&self, id: &str, _init: Option<(OwnedFd, u32)>) -> Result<(), OciError> {
        Runc::start(self, id).await
    }

    async fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), OciError> {
        Runc::kill(self, id, signal, all).await
    }

    async fn delete(&self, id: &str, force: bool) -> Result<(), OciError> {
        Runc::delete(self, id, force).await
    }

    async fn state(&self, id: &str) -> Result<Option<RuncState>, OciError> {
        Runc::state(self, id).await
    }

    async fn list(&self) -> Result<Vec<RuncState>, OciError> {
        Runc::list(self).await
    }

    async fn update(&self, id: &str, resources: &LinuxResources) -> Result<(), OciError> {
        Runc::update(self, id, resources).await
    }

    async fn checkpoint(&self, id: &str, opts: &CheckpointOptions<'_>) -> Result<(), OciError> {
        Runc::checkpoint(self, id, opts).await
    }

    async fn exec(
        &self,
        id: &str,
        process: &Process,
        work_dir: &Path,
        timeout: Option<Duration>,
    ) -> Result<ExecOutput, OciError> {
        Runc::exec(self, id, process, work_dir, timeout).await
    }

    fn init_seen(&self, id: &str, init: ProcessRef, created: bool) -> InitSeen {
        if !util::process_alive(init.pid, init.start_time) {
            return InitSeen::Gone;
        }
        if !created {
            return InitSeen::Started;
        }
        match petrel_oci::exec_fifo::init_awaits_start(init.pid, &Runc::root(self).join(id)) {
            Ok(false) => InitSeen::Started,
            // Unreadable: assume what the record says.
            Ok(true) | Err(_) => InitSeen::AwaitingStart,
        }
    }

    fn start_pending(&self, id: &str) -> bool {
        Runc::root(self).join(id).join(EXEC_FIFO).exists()
    }

    fn started_at(&self, id: &str) -> Option<SystemTime> {
        petrel_oci::exec_fifo::started_at(&Runc::root(self).join(id))
    }

    fn clear_start(&self, id: &str) -> io::Result<()> {
        match std::fs::remove_file(Runc::root(self).join(id).join(EXEC_FIFO)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}
