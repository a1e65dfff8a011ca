//! runc with its two measured fast paths: [`RuncFastPaths`], an
//! [`OciRuntime`] that is the typed [`Runc`] except for
//!
//! - **the exec-FIFO start**: `runc start` does nothing but open the
//!   container's `<root>/<id>/exec.fifo`, read the init's byte and remove
//!   the FIFO; the runtime does the same in a few system calls instead of a
//!   Go process start-up (~4 ms here, most of StartContainer);
//! - **the runc-free delete** of a stopped container whose `state.json`
//!   says removing its cgroups and state directory is all `runc delete`
//!   would do (~4 ms, most of RemoveContainer).
//!
//! Both mirror runc's state-directory layout (`exec.fifo`, `state.json`),
//! so they are used only with a runc whose version was checked against it
//! ([`verified`]); with any other OCI runtime or version, or with
//! `[cri] fast_paths = false`, the runtime drives the typed [`Runc`]
//! alone. Whatever a fast path does not handle (no FIFO, a container that
//! is not plain) goes to runc itself, so the answers are runc's.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use oci_spec::runtime::{LinuxResources, Process};
use petrel_oci::exec_fifo::FifoStartError;
use petrel_oci::runc::{CheckpointOptions, ExecOutput, Runc, RuncState, START_TIMEOUT};
use petrel_oci::stopped_delete::Deleted;

use super::oci::{InitSeen, OciError, OciRuntime};
use crate::records::ProcessRef;

/// A runc version, from `runc --version`'s first line
/// (`runc version 1.1.5+ds1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RuncVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl std::fmt::Display for RuncVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl RuncVersion {
    /// Parses `--version` output: `None` unless its first line is
    /// `runc version X.Y.Z[suffix]`.
    pub fn parse(output: &str) -> Option<Self> {
        let v = output.lines().next()?.strip_prefix("runc version ")?;
        let mut nums = v.trim().splitn(3, '.').map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        Some(Self {
            major: nums.next()??,
            minor: nums.next()??,
            patch: nums.next()??,
        })
    }
}

/// The runc versions whose state directory the fast paths were checked
/// against: 1.1 (Debian 12's 1.1.5) through 1.5 (the peers' 1.5.3), by
/// `tests/fast_paths.rs` run with each; `exec.fifo` and `state.json`
/// (`init_process_pid`, `cgroup_paths`, `config.namespaces`, `Hooks`)
/// are the same in every release between. A runc outside gets the typed
/// path until it is checked too.
pub fn verified(v: RuncVersion) -> bool {
    let lowest = RuncVersion {
        major: 1,
        minor: 1,
        patch: 0,
    };
    let beyond = RuncVersion {
        major: 1,
        minor: 6,
        patch: 0,
    };
    (lowest..beyond).contains(&v)
}

/// The first line of `binary --version`, when it runs and succeeds.
pub fn version_line(binary: &Path) -> Option<String> {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(text.lines().next().unwrap_or_default().to_string())
}

/// runc with the exec-FIFO start and the runc-free delete (see the module
/// documentation); everything else is the typed [`Runc`].
#[derive(Debug, Clone)]
pub struct RuncFastPaths {
    runc: Runc,
    version: RuncVersion,
}

impl RuncFastPaths {
    /// The fast paths over `runc`, when its `version` is [`verified`];
    /// `Err(runc)` gives the typed runc back otherwise.
    pub fn new(runc: Runc, version: RuncVersion) -> Result<Self, Box<Runc>> {
        if verified(version) {
            Ok(Self { runc, version })
        } else {
            Err(Box::new(runc))
        }
    }

    /// The runc version the fast paths mirror.
    pub fn version(&self) -> RuncVersion {
        self.version
    }

    /// The typed runc underneath.
    pub fn typed(&self) -> &Runc {
        &self.runc
    }

    fn state_dir(&self, id: &str) -> PathBuf {
        self.runc.root().join(id)
    }

    /// The exec-FIFO start: `Ok(true)` when done, `Ok(false)` when there is
    /// no FIFO (runc says why: unknown container, started already).
    pub async fn fifo_start(
        &self,
        id: &str,
        init: OwnedFd,
        init_pid: u32,
    ) -> Result<bool, OciError> {
        let dir = self.state_dir(id);
        let started = tokio::task::spawn_blocking(move || {
            petrel_oci::exec_fifo::start(&dir, &init, init_pid, START_TIMEOUT)
        })
        .await
        .map_err(|e| OciError::Failed {
            command: "start",
            id: id.to_string(),
            message: format!("exec fifo task: {e}"),
        })?;
        match started {
            Ok(()) => Ok(true),
            Err(FifoStartError::NoFifo(_)) => Ok(false),
            Err(FifoStartError::Timeout { within, .. }) => Err(OciError::StartTimeout {
                id: id.to_string(),
                within,
            }),
            Err(e) => Err(OciError::Failed {
                command: "start",
                id: id.to_string(),
                message: e.to_string(),
            }),
        }
    }

    /// The runc-free delete: `Ok(true)` when done, `Ok(false)` when the
    /// container is not one it handles (left to `runc delete`).
    pub async fn removal_delete(&self, id: &str) -> Result<bool, OciError> {
        let dir = self.state_dir(id);
        let task_dir = dir.clone();
        let deleted =
            tokio::task::spawn_blocking(move || petrel_oci::stopped_delete::delete(&task_dir))
                .await
                .map_err(|e| OciError::Failed {
                    command: "delete",
                    id: id.to_string(),
                    message: format!("delete task: {e}"),
                })?;
        match deleted {
            Ok(Deleted::Done) => Ok(true),
            Ok(Deleted::LeftToRunc) => Ok(false),
            Err(source) => Err(OciError::Io {
                op: "delete",
                path: dir,
                source,
            }),
        }
    }
}

#[async_trait::async_trait]
impl OciRuntime for RuncFastPaths {
    fn binary(&self) -> &Path {
        self.runc.binary()
    }

    fn root(&self) -> &Path {
        self.runc.root()
    }

    async fn start(&self, id: &str, init: Option<(OwnedFd, u32)>) -> Result<(), OciError> {
        if let Some((init, pid)) = init {
            if self.fifo_start(id, init, pid).await? {
                return Ok(());
            }
        }
        OciRuntime::start(&self.runc, id, None).await
    }

    async fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), OciError> {
        self.runc.kill(id, signal, all).await
    }

    async fn delete(&self, id: &str, force: bool) -> Result<(), OciError> {
        if self.removal_delete(id).await? {
            return Ok(());
        }
        self.runc.delete(id, force).await
    }

    async fn state(&self, id: &str) -> Result<Option<RuncState>, OciError> {
        self.runc.state(id).await
    }

    async fn list(&self) -> Result<Vec<RuncState>, OciError> {
        self.runc.list().await
    }

    async fn update(&self, id: &str, resources: &LinuxResources) -> Result<(), OciError> {
        self.runc.update(id, resources).await
    }

    async fn checkpoint(&self, id: &str, opts: &CheckpointOptions<'_>) -> Result<(), OciError> {
        self.runc.checkpoint(id, opts).await
    }

    async fn exec(
        &self,
        id: &str,
        process: &Process,
        work_dir: &Path,
        timeout: Option<Duration>,
    ) -> Result<ExecOutput, OciError> {
        self.runc.exec(id, process, work_dir, timeout).await
    }

    fn init_seen(&self, id: &str, init: ProcessRef, created: bool) -> InitSeen {
        self.runc.init_seen(id, init, created)
    }

    fn start_pending(&self, id: &str) -> bool {
        self.runc.start_pending(id)
    }

    fn started_at(&self, id: &str) -> Option<SystemTime> {
        self.runc.started_at(id)
    }

    fn clear_start(&self, id: &str) -> io::Result<()> {
        self.runc.clear_start(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, patch: u32) -> RuncVersion {
        RuncVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn runc_version_should_parse_release_and_distribution_lines() {
        let table = [
            ("runc version 1.1.5+ds1\ncommit: x\n", Some(v(1, 1, 5))),
            ("runc version 1.5.3\n", Some(v(1, 5, 3))),
            ("runc version 1.2.0-rc.1\n", Some(v(1, 2, 0))),
            ("runc version 1.1\n", None),
            ("crun version 1.8.1\n", None),
            ("", None),
            ("runc version x.y.z\n", None),
        ];
        for (line, want) in table {
            assert_eq!(RuncVersion::parse(line), want, "{line:?}");
        }
    }

    #[test]
    fn fast_paths_should_be_enabled_only_for_verified_runc_versions() {
        for (version, want) in [
            (v(1, 0, 3), false),
            (v(1, 1, 0), true),
            (v(1, 1, 5), true),
            (v(1, 3, 2), true),
            (v(1, 5, 3), true),
            (v(1, 6, 0), false),
            (v(2, 0, 0), false),
        ] {
            assert_eq!(verified(version), want, "{version}");
            let runc = Runc::new("/bin/runc", "/run/x");
            assert_eq!(RuncFastPaths::new(runc, version).is_ok(), want, "{version}");
        }
    }
}
