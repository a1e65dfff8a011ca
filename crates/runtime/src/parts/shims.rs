//! The shim seam: starting a container's shim (which runs the OCI
//! runtime's `create`), watching it for the container's exit, reading the
//! exit it records, sending it commands, finding shims again after a
//! restart, and the pod's PID-namespace holder (the shim binary in another
//! mode).

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use petrel_shim::{Command, ExitRecord};

use crate::container::found_shims::{self, PinnedShim};
use crate::container::shim::{self, ShimOptions};
use crate::error::Result;
use crate::records::ProcessRef;
use crate::util;

/// The container's shim as found at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShimSeen {
    /// No shim (exited, or never started).
    Gone,
    /// Still inside its create: `runc create` running, or the handshake
    /// not yet written (its standard output is still the pipe to the
    /// runtime that started it).
    InCreate,
    /// Past its handshake, serving the container.
    Serving,
}

/// A watch on a shim: a pidfd for real shims (readable once it exited).
#[derive(Debug)]
pub struct ShimWatch {
    pid: u32,
    pidfd: Option<OwnedFd>,
}

impl ShimWatch {
    /// A watch through a pidfd on the shim `pid`.
    pub fn pidfd(pid: u32, pidfd: OwnedFd) -> Self {
        Self {
            pid,
            pidfd: Some(pidfd),
        }
    }

    /// A watch without a descriptor, for launchers that track their shims
    /// otherwise (test doubles).
    pub fn without_fd(pid: u32) -> Self {
        Self { pid, pidfd: None }
    }

    /// The shim's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The pidfd, if the watch has one.
    pub fn fd(&self) -> Option<&OwnedFd> {
        self.pidfd.as_ref()
    }

    fn into_fd(self) -> Option<OwnedFd> {
        self.pidfd
    }
}

/// A wait for a shim's exit that failed; the watch is handed back so that
/// the caller can look again.
#[derive(Debug)]
pub struct WaitFailed {
    /// The watch, still valid.
    pub watch: ShimWatch,
    /// Why the wait failed.
    pub error: io::Error,
}

/// A started shim: its identity, the container's init and a watch.
#[derive(Debug)]
pub struct StartedShim {
    /// The shim process.
    pub shim: ProcessRef,
    /// The container's init process (start time 0 when unknown).
    pub init: ProcessRef,
    /// Completes once the shim has exited.
    pub watch: ShimWatch,
}

/// An exit record that is there but cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ExitReadError {
    /// The file could not be read.
    #[error("read exit record {path}: {source}")]
    Io {
        /// The exit file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The file holds something else than an exit record.
    #[error("exit record {path} is corrupt: {content:?}")]
    Corrupt {
        /// The exit file.
        path: PathBuf,
        /// Its first bytes.
        content: String,
    },
}

/// A shim found running at start-up, pinned so that its pid cannot name
/// another process meanwhile.
#[async_trait::async_trait]
pub trait FoundShim: Send + Sync + std::fmt::Debug {
    /// Its pid.
    fn pid(&self) -> u32;
    /// Where it is.
    fn seen(&self) -> ShimSeen;
    /// Kills it and every process below it.
    fn kill_tree(&self);
    /// Whether it exits within `within`.
    async fn exited_within(&self, within: Duration) -> bool;
}

/// Starts and watches shims.
#[async_trait::async_trait]
pub trait ShimLauncher: Send + Sync + std::fmt::Debug {
    /// The shim binary (for status reports).
    fn binary(&self) -> &Path;

    /// Starts a shim, which creates the container; returns once it is
    /// created. On error nothing of the shim is left (it undid the create,
    /// or was killed and reaped).
    async fn start(&self, opts: &ShimOptions) -> Result<StartedShim>;

    /// A watch on a shim found alive after a restart; `None` when it is
    /// gone (or the pid names another process).
    fn adopt(&self, shim: &ProcessRef) -> io::Result<Option<ShimWatch>>;

    /// Completes when the watched shim has exited (and reaps it when it is
    /// this process's child).
    async fn wait_exit(&self, watch: ShimWatch) -> Result<(), WaitFailed>;

    /// Whether the watched shim has exited, without waiting (reaped as by
    /// [`ShimLauncher::wait_exit`] if so).
    fn exited(&self, watch: &ShimWatch) -> io::Result<bool>;

    /// The exit the shim recorded in `bundle`: `None` when it recorded
    /// none.
    fn read_exit(&self, bundle: &Path) -> Result<Option<ExitRecord>, ExitReadError>;

    /// Sends a command to the container's running shim and waits for its
    /// answer.
    async fn send_command(&self, bundle: &Path, command: Command) -> Result<()>;

    /// The live shims of the bundles in `containers`, by container id.
    fn find(&self, containers: &Path) -> HashMap<String, u32>;

    /// Pins the shim `pid` found for `id`; `None` when it is gone.
    fn pin(&self, id: &str, pid: u32, containers: &Path) -> Option<Box<dyn FoundShim>>;

    /// Starts the holder of a pod's shared PID namespace, owned by the
    /// pod's user namespace `userns` when it has one; returns the namespace
    /// init's identity.
    async fn spawn_pid_holder(&self, userns: Option<&Path>) -> Result<ProcessRef>;
}

/// `petrel-shim` processes.
#[derive(Debug, Clone)]
pub struct ProcessShims {
    binary: PathBuf,
}

impl ProcessShims {
    /// Shims run from `binary`.
    pub fn new(binary: PathBuf) -> Self {
        Self { binary }
    }
}

#[async_trait::async_trait]
impl FoundShim for PinnedShim {
    fn pid(&self) -> u32 {
        PinnedShim::pid(self)
    }

    fn seen(&self) -> ShimSeen {
        PinnedShim::seen(self)
    }

    fn kill_tree(&self) {
        PinnedShim::kill_tree(self)
    }

    async fn exited_within(&self, within: Duration) -> bool {
        PinnedShim::exited_within(self, within).await
    }
}

#[async_trait::async_trait]
impl ShimLauncher for ProcessShims {
    fn binary(&self) -> &Path {
        &self.binary
    }

    async fn start(&self, opts: &ShimOptions) -> Result<StartedShim> {
        shim::start(&self.binary, opts).await
    }

    fn adopt(&self, s: &ProcessRef) -> io::Result<Option<ShimWatch>> {
        Ok(util::pidfd_of(s.pid, s.start_time)?.map(|fd| ShimWatch::pidfd(s.pid, fd)))
    }

    async fn wait_exit(&self, watch: ShimWatch) -> Result<(), WaitFailed> {
        let pid = watch.pid();
        let Some(fd) = watch.into_fd() else {
            return Err(WaitFailed {
                watch: ShimWatch::without_fd(pid),
                error: io::Error::new(io::ErrorKind::InvalidInput, "no pidfd to wait on"),
            });
        };
        shim::wait_exit(fd).await.map_err(|(fd, error)| WaitFailed {
            watch: ShimWatch::pidfd(pid, fd),
            error,
        })
    }

    fn exited(&self, watch: &ShimWatch) -> io::Result<bool> {
        let fd = watch
            .fd()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no pidfd to look at"))?;
        if !shim::has_exited(fd)? {
            return Ok(false);
        }
        if let Err(e) = util::try_reap(fd) {
            // ECHILD: a shim adopted after a restart is not our child.
            if e.raw_os_error() != Some(libc::ECHILD) {
                tracing::debug!(shim.pid = watch.pid(), error = %e, "exited shim not reaped");
            }
        }
        Ok(true)
    }

    fn read_exit(&self, bundle: &Path) -> Result<Option<ExitRecord>, ExitReadError> {
        shim::read_exit(bundle)
    }

    async fn send_command(&self, bundle: &Path, command: Command) -> Result<()> {
        shim::send_command(bundle, command).await
    }

    fn find(&self, containers: &Path) -> HashMap<String, u32> {
        found_shims::find_shims(containers)
    }

    fn pin(&self, id: &str, pid: u32, containers: &Path) -> Option<Box<dyn FoundShim>> {
        PinnedShim::pin(pid, id, containers).map(|s| Box::new(s) as Box<dyn FoundShim>)
    }

    async fn spawn_pid_holder(&self, userns: Option<&Path>) -> Result<ProcessRef> {
        crate::sandbox::pid_holder::spawn(&self.binary, userns).await
    }
}
