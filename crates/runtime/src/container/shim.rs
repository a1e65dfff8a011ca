//! Starting a container's shim and talking to it.
//!
//! See the `petrel-shim` crate for the protocol. The runtime starts the shim,
//! reads its one-line handshake, then watches it with a pidfd: the shim exits
//! right after writing the container's exit record, so the pidfd turning
//! readable is the exit notification. No polling, no connection per
//! container.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use petrel_shim::{Command, ExitRecord, Handshake, ACK_FIFO, CTL_FIFO, EXIT_FILE, SHIM_LOG};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::error::{Result, RuntimeError};
use crate::parts::{ExitReadError, ShimWatch, StartedShim};
use crate::records::ProcessRef;
use crate::util;

/// How long runc create may take before the create is abandoned.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a shim may take to answer a command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// What a shim needs to create a container.
#[derive(Debug, Clone)]
pub struct ShimOptions {
    /// The container id.
    pub id: String,
    /// The bundle directory (holds config.json).
    pub bundle: PathBuf,
    /// The OCI runtime binary.
    pub runc: PathBuf,
    /// runc's state directory.
    pub runc_root: PathBuf,
    /// runc manages the container's cgroup through systemd
    /// (`--systemd-cgroup`).
    pub systemd_cgroup: bool,
    /// The CRI log file, if any.
    pub log_path: Option<PathBuf>,
    /// Allocate a terminal.
    pub tty: bool,
    /// Keep stdin open.
    pub stdin: bool,
    /// Close stdin when the first attach carrying input ends.
    pub stdin_once: bool,
    /// Restore the container from a checkpoint instead of creating it.
    pub restore: Option<ShimRestore>,
}

/// A restore from a checkpoint: `runc restore` in place of `runc create`.
#[derive(Debug, Clone)]
pub struct ShimRestore {
    /// CRIU's images (the checkpoint archive's `checkpoint/`, unpacked).
    pub images: PathBuf,
    /// The CRIU binary.
    pub criu: PathBuf,
}

/// Starts the shim, which runs `runc create`. On error the shim has already
/// removed the container from runc, or has been killed (no answer in time)
/// and reaped.
///
/// The shim is spawned with `std::process`, not tokio's: tokio reaps a
/// child whose handle is dropped by calling wait4 on every such child at
/// each SIGCHLD, which would make every container exit cost the runtime one
/// syscall per running container. The runtime reaps each shim itself,
/// through its pidfd ([`wait_exit`]).
pub async fn start(binary: &Path, opts: &ShimOptions) -> Result<StartedShim> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(opts.bundle.join(SHIM_LOG))
        .map_err(|e| RuntimeError::io("open", opts.bundle.join(SHIM_LOG), e))?;
    let mut cmd = std::process::Command::new(binary);
    cmd.arg("--id")
        .arg(&opts.id)
        .arg("--bundle")
        .arg(&opts.bundle)
        .arg("--runc")
        .arg(&opts.runc)
        .arg("--runc-root")
        .arg(&opts.runc_root)
        .arg("--log-path")
        .arg(opts.log_path.as_deref().unwrap_or(Path::new("")));
    if opts.systemd_cgroup {
        cmd.arg("--systemd-cgroup");
    }
    if opts.tty {
        cmd.arg("--tty");
    }
    if opts.stdin {
        cmd.arg("--stdin");
        if opts.stdin_once {
            cmd.arg("--stdin-once");
        }
    }
    if let Some(restore) = &opts.restore {
        cmd.arg("--restore-from")
            .arg(&restore.images)
            .arg("--criu")
            .arg(&restore.criu);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log));
    let mut child = cmd
        .spawn()
        .map_err(|e| RuntimeError::process(format!("start shim {}", binary.display()), e))?;
    let shim_pid = child.id();
    // Opened before anything can reap the shim, so the pidfd names the
    // right process.
    let pidfd = match util::pidfd_open(shim_pid) {
        Ok(fd) => fd,
        Err(e) => {
            if let Err(k) = child.kill() {
                tracing::warn!(shim.pid = shim_pid, error = %k, "shim without a pidfd not killed");
            }
            match tokio::task::spawn_blocking(move || child.wait()).await {
                Ok(Ok(_)) => {}
                Ok(Err(w)) => {
                    tracing::warn!(shim.pid = shim_pid, error = %w, "shim without a pidfd not reaped")
                }
                Err(w) => {
                    tracing::warn!(shim.pid = shim_pid, error = %w, "shim without a pidfd not reaped")
                }
            }
            return Err(RuntimeError::process(
                format!("pidfd_open shim {shim_pid}"),
                e,
            ));
        }
    };
    // From here on the guard kills and reaps the shim unless it is kept.
    let mut shim = Unanswered(Some(pidfd));
    let stdout = child.stdout.take();
    // A std Child does nothing when dropped: the guard and, once the shim
    // runs the container, `wait_exit` do the reaping.
    drop(child);
    let start_time = util::process_start_time(shim_pid).unwrap_or_default();
    let stdout = stdout
        .ok_or_else(|| RuntimeError::Invariant("shim stdout missing".into()))
        .and_then(|out| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(out))
                .map_err(|e| RuntimeError::process(format!("watch shim {shim_pid}'s stdout"), e))
        });
    let stdout = match stdout {
        Ok(s) => s,
        Err(e) => {
            shim.kill_and_reap().await;
            return Err(e);
        }
    };
    let mut line = String::new();
    let read = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        BufReader::new(stdout).read_line(&mut line),
    )
    .await;
    let handshake = match read {
        Ok(Ok(_)) => Handshake::parse(&line),
        Ok(Err(e)) => {
            shim.kill_and_reap().await;
            return Err(RuntimeError::process(
                format!("read shim {shim_pid}'s handshake"),
                e,
            ));
        }
        Err(_) => {
            shim.kill_and_reap().await;
            return Err(RuntimeError::DeadlineExceeded(format!(
                "container {} was not created within {HANDSHAKE_TIMEOUT:?}",
                opts.id
            )));
        }
    };
    match handshake {
        Some(Handshake::Ok { init_pid }) => Ok(StartedShim {
            shim: ProcessRef {
                pid: shim_pid,
                start_time,
            },
            init: ProcessRef {
                pid: init_pid,
                start_time: util::process_start_time(init_pid).unwrap_or(0),
            },
            watch: ShimWatch::pidfd(shim_pid, shim.keep()?),
        }),
        Some(Handshake::Error(msg)) => {
            shim.reap().await;
            Err(RuntimeError::ShimCreate {
                id: opts.id.clone(),
                message: msg,
            })
        }
        None => {
            shim.reap().await;
            let tail = log_tail(&opts.bundle.join(SHIM_LOG));
            Err(RuntimeError::ShimCreate {
                id: opts.id.clone(),
                message: format!(
                    "the shim failed without a handshake ({:?}): {tail}",
                    line.trim()
                ),
            })
        }
    }
}

/// A started shim that has not answered yet, by its pidfd. Dropped while
/// it still holds it (the start abandoned half-way), it kills the shim and
/// reaps it in the background, so no zombie is left behind.
struct Unanswered(Option<OwnedFd>);

impl Unanswered {
    /// The shim is running the container: its pidfd goes to the caller,
    /// which watches (and eventually reaps) it.
    fn keep(&mut self) -> Result<OwnedFd> {
        self.0
            .take()
            .ok_or_else(|| RuntimeError::Invariant("shim pidfd taken twice".into()))
    }

    /// Waits for the shim to exit by itself (it has answered with an error
    /// and is cleaning up) and reaps it.
    async fn reap(&mut self) {
        if let Some(fd) = self.0.take() {
            if let Err((_, e)) = wait_exit(fd).await {
                tracing::warn!(error = %e, "cannot wait for a failed shim");
            }
        }
    }

    /// Kills the shim and reaps it.
    async fn kill_and_reap(&mut self) {
        if let Some(fd) = &self.0 {
            kill_unanswered(fd);
        }
        self.reap().await;
    }
}

/// SIGKILL to a shim that did not answer; failing that is logged (its
/// reaping then waits for it to exit by itself).
fn kill_unanswered(fd: &OwnedFd) {
    if let Err(e) = util::pidfd_signal(fd, libc::SIGKILL) {
        tracing::warn!(error = %e, "shim that did not answer not killed");
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let Some(fd) = self.0.take() else {
            return;
        };
        kill_unanswered(&fd);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err((_, e)) = wait_exit(fd).await {
                        tracing::warn!(error = %e, "killed shim not reaped");
                    }
                });
            }
            Err(_) => tracing::warn!("a killed shim is left unreaped (no runtime to wait on)"),
        }
    }
}

fn log_tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Waits until the process behind `pidfd` has exited, and reaps it when it
/// is our child (a shim this runtime started; one adopted after a restart
/// is not). Reaping through the pidfd cannot hit a reused pid. When the
/// wait itself fails, the pidfd is handed back with the error.
pub async fn wait_exit(pidfd: OwnedFd) -> Result<(), (OwnedFd, std::io::Error)> {
    // SAFETY: OwnedFd is a valid open descriptor that AsyncFd owns (and so
    // keeps open and unchanged) for its whole lifetime.
    let fd = unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts())?;
    if let Err(e) = fd.readable().await.map(drop) {
        return Err((fd.into_inner(), e));
    }
    if let Err(e) = util::try_reap(fd.get_ref()) {
        // ECHILD: a shim adopted after a restart is not our child.
        if e.raw_os_error() != Some(libc::ECHILD) {
            tracing::debug!(error = %e, "exited shim not reaped");
        }
    }
    Ok(())
}

/// Whether the process behind `pidfd` has exited (a pidfd polls readable
/// once its process has exited); does not wait.
pub fn has_exited(pidfd: &OwnedFd) -> std::io::Result<bool> {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    Ok(rustix::event::poll(&mut fds, Some(&zero))? > 0)
}

/// Whether the process behind `pidfd` exits within `within` (it is not
/// reaped: for processes that are not our children, such as the shims of a
/// runtime that died).
pub async fn exited_within(pidfd: &OwnedFd, within: Duration) -> bool {
    let Ok(dup) = pidfd.try_clone() else {
        return false;
    };
    // SAFETY: `dup` is a valid open descriptor that AsyncFd owns (and so
    // keeps open and unchanged) for its whole lifetime.
    let Ok(fd) = (unsafe { AsyncFd::register_with_interest(dup, tokio::io::Interest::READABLE) })
    else {
        return false;
    };
    matches!(tokio::time::timeout(within, fd.readable()).await, Ok(Ok(_)))
}

/// Reads the container's exit record: `None` when the shim wrote none (it
/// writes it whole, by a rename, so a file that is there is complete).
pub fn read_exit(bundle: &Path) -> Result<Option<ExitRecord>, ExitReadError> {
    let path = bundle.join(EXIT_FILE);
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ExitReadError::Io { path, source }),
    };
    let parsed = std::str::from_utf8(&text).ok().and_then(ExitRecord::parse);
    parsed.map(Some).ok_or_else(|| ExitReadError::Corrupt {
        content: String::from_utf8_lossy(&text[..text.len().min(64)]).into_owned(),
        path,
    })
}

/// Sends a command to a running shim and waits for its answer.
pub async fn send_command(bundle: &Path, command: Command) -> Result<()> {
    use tokio::net::unix::pipe;
    let ack_path = bundle.join(ACK_FIFO);
    let ctl_path = bundle.join(CTL_FIFO);
    // Open the answer FIFO first so the shim finds a reader when it replies;
    // read-write so that it never reads as EOF before the shim has written.
    let mut ack = pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&ack_path)
        .map_err(|e| RuntimeError::io("open", &ack_path, e))?;
    let mut ctl = pipe::OpenOptions::new()
        .open_sender(&ctl_path)
        .map_err(|e| {
            RuntimeError::FailedPrecondition(format!(
                "shim is not running ({}: {e})",
                ctl_path.display()
            ))
        })?;
    ctl.write_all(format!("{}\n", command.as_str()).as_bytes())
        .await
        .map_err(|e| RuntimeError::io("write a command to", &ctl_path, e))?;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(COMMAND_TIMEOUT, async {
        let mut buf = [0u8; 512];
        loop {
            match ack.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.contains(&b'\n') {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    })
    .await;
    match read {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(RuntimeError::io("read the answer from", &ack_path, e)),
        Err(_) => {
            return Err(RuntimeError::DeadlineExceeded(format!(
                "shim did not answer {}",
                command.as_str()
            )))
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    let answer = answer.trim();
    if answer == "ok" {
        Ok(())
    } else {
        Err(RuntimeError::ShimCommand {
            command: command.as_str(),
            message: answer.strip_prefix("error ").unwrap_or(answer).to_string(),
        })
    }
}
