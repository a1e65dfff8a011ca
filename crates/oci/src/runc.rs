//! A thin async wrapper over the runc command line.
//!
//! Every call passes `--root`, so runc's state lives in Petrel's own state
//! directory and never in the host's shared `/run/runc`. Container creation is
//! not here: the shim runs `runc create` so that it becomes the parent (as a
//! subreaper) of the container's init process and holds its stdio.

mod exec;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use oci_spec::runtime::LinuxResources;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// Errors of runc invocations.
#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    /// The runc binary could not be started.
    #[error("run {binary}: {source}")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The spawn error.
        source: std::io::Error,
    },
    /// runc ran and failed.
    #[error("runc {command} {id}: {message}")]
    Failed {
        /// The runc subcommand.
        command: &'static str,
        /// The container id.
        id: String,
        /// runc's error message.
        message: String,
    },
    /// The container is unknown to runc.
    #[error("runc: container {0} does not exist")]
    NotFound(String),
    /// runc's output could not be understood.
    #[error("runc {command}: unexpected output: {reason}")]
    Output {
        /// The runc subcommand.
        command: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A file for the call could not be written or read.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A start did not finish within its bound.
    #[error("start {id}: the container's init did not take the start within {within:?}")]
    StartTimeout {
        /// The container id.
        id: String,
        /// How long was waited.
        within: Duration,
    },
    /// An exec did not finish within its timeout; its process was killed.
    #[error("exec in {id} timed out after {timeout:?}")]
    Timeout {
        /// The container id.
        id: String,
        /// The timeout.
        timeout: Duration,
    },
}

/// A container's state as `runc state` reports it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct RuncState {
    /// The container id.
    pub id: String,
    /// The init process id (0 when stopped).
    #[serde(default)]
    pub pid: i64,
    /// `created`, `running`, `paused` or `stopped`.
    pub status: String,
    /// The bundle directory.
    #[serde(default)]
    pub bundle: String,
}

/// The result of an exec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// The process's exit code (128 + signal when killed by a signal).
    pub exit_code: i32,
    /// Everything written to standard output.
    pub stdout: Vec<u8>,
    /// Everything written to standard error.
    pub stderr: Vec<u8>,
}

/// Where a checkpoint goes and who makes it.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointOptions<'a> {
    /// The CRIU binary runc runs.
    pub criu: &'a Path,
    /// CRIU's images (the archive's `checkpoint/`).
    pub image_dir: &'a Path,
    /// CRIU's log and statistics (`dump.log`, `stats-dump`).
    pub work_dir: &'a Path,
}

/// The runc binary and its state directory.
#[derive(Debug, Clone)]
pub struct Runc {
    binary: PathBuf,
    root: PathBuf,
    systemd_cgroup: bool,
}

/// How long a start waits for the init to take it, through the exec FIFO
/// or `runc start` (which would wait for ever on a FIFO that no init will
/// open again).
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

impl Runc {
    /// A runc wrapper using `binary` and keeping its state under `root`.
    pub fn new(binary: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
            root: root.into(),
            systemd_cgroup: false,
        }
    }

    /// The same, with runc managing cgroups through systemd
    /// (`--systemd-cgroup` on every call) when `on`.
    pub fn with_systemd_cgroup(mut self, on: bool) -> Self {
        self.systemd_cgroup = on;
        self
    }

    /// The runc binary.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// runc's state directory (`--root`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.binary);
        c.arg("--root").arg(&self.root);
        if self.systemd_cgroup {
            c.arg("--systemd-cgroup");
        }
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    async fn run(
        &self,
        command: &'static str,
        id: &str,
        mut c: Command,
    ) -> Result<Vec<u8>, RuncError> {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = c.output().await.map_err(|source| RuncError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let message = error_message(&out.stderr);
        if message.contains("does not exist") || message.contains("container not found") {
            return Err(RuncError::NotFound(id.to_string()));
        }
        Err(RuncError::Failed {
            command,
            id: id.to_string(),
            message,
        })
    }

    /// Starts a created container with `runc start`, bounded by
    /// [`START_TIMEOUT`]. (The runtime's fast path writes the exec FIFO
    /// itself instead: see `exec_fifo`.)
    pub async fn start(&self, id: &str) -> Result<(), RuncError> {
        let mut c = self.command();
        c.arg("start").arg(id);
        // runc is killed (kill_on_drop) when the bound passes.
        match tokio::time::timeout(START_TIMEOUT, self.run("start", id, c)).await {
            Ok(done) => done.map(drop),
            Err(_) => Err(RuncError::StartTimeout {
                id: id.to_string(),
                within: START_TIMEOUT,
            }),
        }
    }

    /// Sends `signal` to the container's init process, or to every process of
    /// the container with `all`.
    pub async fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), RuncError> {
        let mut c = self.command();
        c.arg("kill");
        if all {
            c.arg("--all");
        }
        c.arg(id).arg(signal.to_string());
        self.run("kill", id, c).await.map(drop)
    }

    /// Deletes the container from runc (`--force` kills it first). A
    /// container runc does not know is already deleted: not an error.
    pub async fn delete(&self, id: &str, force: bool) -> Result<(), RuncError> {
        let mut c = self.command();
        c.arg("delete");
        if force {
            c.arg("--force");
        }
        c.arg(id);
        match self.run("delete", id, c).await {
            Err(RuncError::NotFound(_)) => Ok(()),
            other => other.map(drop),
        }
    }

    /// The container's state, or `None` when runc does not know it.
    pub async fn state(&self, id: &str) -> Result<Option<RuncState>, RuncError> {
        let mut c = self.command();
        c.arg("state").arg(id);
        match self.run("state", id, c).await {
            Ok(out) => serde_json::from_slice(&out)
                .map(Some)
                .map_err(|e| RuncError::Output {
                    command: "state",
                    reason: e.to_string(),
                }),
            Err(RuncError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every container in runc's state directory.
    pub async fn list(&self) -> Result<Vec<RuncState>, RuncError> {
        let mut c = self.command();
        c.args(["list", "--format", "json"]);
        let out = self.run("list", "", c).await?;
        let trimmed = String::from_utf8_lossy(&out);
        let trimmed = trimmed.trim();
        if trimmed.is_empty() || trimmed == "null" {
            return Ok(Vec::new());
        }
        serde_json::from_str(trimmed).map_err(|e| RuncError::Output {
            command: "list",
            reason: e.to_string(),
        })
    }

    /// Checkpoints a running container with CRIU and leaves it running
    /// (`runc checkpoint --leave-running`): CRIU's images go to
    /// `opts.image_dir`, its log (`dump.log`) and statistics to
    /// `opts.work_dir`. Not to be cut short: runc is killed if the future
    /// is dropped, and CRIU dying with it mid-dump can leave the container
    /// seized or frozen; callers that bound the call let it finish.
    pub async fn checkpoint(
        &self,
        id: &str,
        opts: &CheckpointOptions<'_>,
    ) -> Result<(), RuncError> {
        let mut c = self.command();
        c.arg("--criu")
            .arg(opts.criu)
            .arg("checkpoint")
            .arg("--image-path")
            .arg(opts.image_dir)
            .arg("--work-path")
            .arg(opts.work_dir)
            .arg("--leave-running")
            .arg(id);
        self.run("checkpoint", id, c).await.map(drop)
    }

    /// Applies new resource limits to a running container (`runc update`).
    pub async fn update(&self, id: &str, resources: &LinuxResources) -> Result<(), RuncError> {
        let json = serde_json::to_vec(resources).map_err(|e| RuncError::Output {
            command: "update",
            reason: e.to_string(),
        })?;
        let mut c = self.command();
        c.args(["update", "--resources", "-", id])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|source| RuncError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        if let Some(mut stdin) = child.stdin.take() {
            // A write error surfaces as runc's own failure below.
            let _ = stdin.write_all(&json).await;
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|source| RuncError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        if out.status.success() {
            return Ok(());
        }
        let message = error_message(&out.stderr);
        if message.contains("does not exist") {
            return Err(RuncError::NotFound(id.to_string()));
        }
        Err(RuncError::Failed {
            command: "update",
            id: id.to_string(),
            message,
        })
    }
}

fn unique_tag() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Extracts the message of runc's last error line.
///
/// runc logs `time="..." level=error msg="..."` (text) or
/// `{"level":"error","msg":"..."}` (JSON); anything else is returned trimmed.
pub fn error_message(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let mut last = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            if let Some(m) = v.get("msg").and_then(|m| m.as_str()) {
                last = Some(m.to_string());
                continue;
            }
        }
        if let Some(idx) = line.find("msg=") {
            let rest = &line[idx + 4..];
            let msg = if let Some(stripped) = rest.strip_prefix('"') {
                unquote(stripped)
            } else {
                rest.split_whitespace().next().unwrap_or("").to_string()
            };
            last = Some(msg);
            continue;
        }
        last = Some(line.to_string());
    }
    last.unwrap_or_else(|| "runc failed without a message".to_string())
}

/// Reads a Go-quoted string body (after the opening quote) up to its closing quote.
fn unquote(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => break,
            },
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_message_should_read_text_and_json_logs() {
        let text = b"time=\"2026-01-01T00:00:00Z\" level=error msg=\"container \\\"x\\\" does not exist\"\n";
        assert_eq!(error_message(text), "container \"x\" does not exist");
        let json =
            b"{\"level\":\"warning\",\"msg\":\"w\"}\n{\"level\":\"error\",\"msg\":\"boom\"}\n";
        assert_eq!(error_message(json), "boom");
        assert_eq!(error_message(b"plain failure\n"), "plain failure");
        assert_eq!(error_message(b""), "runc failed without a message");
    }
}
