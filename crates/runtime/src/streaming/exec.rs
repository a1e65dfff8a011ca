//! Streaming exec: `runc exec --detach`, then the exec'd process's stdio
//! copied to and from the client until it exits.
//!
//! runc starts the process and exits (a failure to start — a missing binary —
//! is runc's exit status and its logged error); the process is then an
//! orphan adopted by the runtime, a child subreaper, which waits for it by
//! pidfd and reaps it, so no runc stays resident and no zombie is left to
//! hold up the container's PID namespace (and with it StopContainer).
//! Output is not read until runc has exited, so runc's own error text never
//! reaches the client's stderr.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use petrel_stream::{BackendError, ExecSpec, Reader, StreamIo, TermSize, Writer};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::mpsc;

use super::fd::{self, Terminal};
use crate::container::exec_process::exec_process;
use crate::util;

/// How long output is still copied after the exec'd process exited: a
/// process it left in the background may hold its stdout for good
/// (`sh -c 'sleep 1000 &'`), and the exec must end anyway.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);
/// Size of the copy buffers.
const CHUNK: usize = 32 * 1024;

/// The container an exec runs in.
#[derive(Debug)]
pub(super) struct Target {
    /// The container id.
    pub id: String,
    /// Its bundle (config.json; the exec's temporary files go here).
    pub bundle: PathBuf,
    /// The OCI runtime's binary (runc: `exec` is its command line).
    pub runtime: PathBuf,
    /// The OCI runtime's state directory.
    pub runtime_root: PathBuf,
}

/// Runs `spec` in the container, serving `io`, and returns the exit code.
pub(super) async fn run(
    target: Target,
    spec: ExecSpec,
    mut io: StreamIo,
) -> Result<i32, BackendError> {
    // A size the client sent before the start sizes the terminal from the
    // first byte on (so a full-screen program starts right).
    let first_size = match io.resize.as_mut() {
        Some(rx) if spec.tty => rx.try_recv().ok(),
        _ => None,
    };
    let terminal = spec
        .tty
        .then(|| first_size.map_or((0, 0), |s| (s.width, s.height)));
    let process = exec_process(
        &target.bundle.join("config.json"),
        spec.cmd.clone(),
        terminal,
    )?;
    let streams = Streams {
        stdin: spec.stdin,
        stdout: spec.stdout,
        stderr: spec.stderr && !spec.tty,
    };

    // The start runs in a task of its own: a client leaving while runc runs
    // must not leave a started process nobody kills. If the client is gone
    // by the time the process runs, dropping it kills it.
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let started = start(&target, &process, spec.tty, streams).await;
        drop(tx.send(started));
    });
    let started = rx
        .await
        .map_err(|_| BackendError::Internal("the exec's start task failed".into()))??;
    started.serve(io).await
}

/// Which of the process's standard streams the client wants.
#[derive(Debug, Clone, Copy)]
struct Streams {
    stdin: bool,
    stdout: bool,
    stderr: bool,
}

/// The process's side of the streams.
enum ProcessIo {
    Pipes {
        stdin: Option<ChildStdin>,
        stdout: Option<ChildStdout>,
        stderr: Option<ChildStderr>,
    },
    Terminal(Terminal),
}

/// A started exec.
struct Started {
    process: ExecProcess,
    io: ProcessIo,
}

/// The exec'd process, a child of the runtime. Dropped before it was
/// reaped (the client went away), it is killed and reaped in the
/// background.
struct ExecProcess {
    pidfd: Option<AsyncFd<OwnedFd>>,
}

impl Drop for ExecProcess {
    fn drop(&mut self) {
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        fd::kill(pidfd.get_ref());
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = fd::wait_child(&pidfd).await {
                        tracing::warn!(error = %e, "cannot reap a killed exec");
                    }
                });
            }
            Err(_) => {
                let pidfd = pidfd.into_inner();
                std::thread::spawn(move || reap_blocking(&pidfd));
            }
        }
    }
}

/// Waits for the killed process without a runtime to wait with.
fn reap_blocking(pidfd: &OwnedFd) {
    for _ in 0..500 {
        match crate::util::try_reap(pidfd) {
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            _ => return,
        }
    }
}

/// The files of one exec in the bundle, removed when dropped.
struct ExecFiles {
    dir: PathBuf,
    process: String,
    pid: String,
    log: String,
    console: String,
}

impl ExecFiles {
    fn new(dir: &Path) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tag = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        Self {
            dir: dir.to_path_buf(),
            process: format!("exec-{tag}.json"),
            pid: format!("exec-{tag}.pid"),
            log: format!("exec-{tag}.log"),
            // Short and relative: runc runs in the bundle and dials it there.
            console: format!("exec-{tag}.sock"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for ExecFiles {
    fn drop(&mut self) {
        for name in [&self.process, &self.pid, &self.log, &self.console] {
            crate::util::remove_file_logged(&self.dir.join(name), "exec file");
        }
    }
}

fn internal(context: impl std::fmt::Display, e: impl std::fmt::Display) -> BackendError {
    BackendError::Internal(format!("{context}: {e}"))
}

/// Starts the process through `runc exec --detach`.
async fn start(
    t: &Target,
    process: &oci_spec::runtime::Process,
    tty: bool,
    streams: Streams,
) -> Result<Started, BackendError> {
    // runc runs in the bundle (for the relative console socket): every
    // other path it gets must not depend on the working directory.
    let bundle = std::path::absolute(&t.bundle)
        .map_err(|e| internal(format!("resolve {}", t.bundle.display()), e))?;
    let runc_root = std::path::absolute(&t.runtime_root)
        .map_err(|e| internal(format!("resolve {}", t.runtime_root.display()), e))?;
    let files = ExecFiles::new(&bundle);
    let json = serde_json::to_vec(process).map_err(|e| internal("encode exec process", e))?;
    tokio::fs::write(files.path(&files.process), json)
        .await
        .map_err(|e| internal(format!("write {}", files.path(&files.process).display()), e))?;
    // Bound before runc starts and removed only after runc has exited, so
    // runc always finds it.
    let console = if tty {
        Some(
            fd::bind_in(&bundle, &files.console)
                .map_err(|e| internal("bind the exec's console socket", e))?,
        )
    } else {
        None
    };

    let pipe = |wanted: bool| {
        if wanted && !tty {
            Stdio::piped()
        } else {
            Stdio::null()
        }
    };
    let mut cmd = tokio::process::Command::new(&t.runtime);
    cmd.arg("--root")
        .arg(&runc_root)
        .arg("--log")
        .arg(files.path(&files.log))
        .args(["--log-format", "json", "exec", "--detach", "--process"])
        .arg(files.path(&files.process))
        .arg("--pid-file")
        .arg(files.path(&files.pid));
    if tty {
        cmd.args(["--tty", "--console-socket", files.console.as_str()])
            .current_dir(&bundle);
    }
    cmd.arg(&t.id)
        .stdin(pipe(streams.stdin))
        .stdout(pipe(streams.stdout))
        .stderr(pipe(streams.stderr))
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .map_err(|e| internal(format!("run {}", t.runtime.display()), e))?;
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let status = child
        .wait()
        .await
        .map_err(|e| internal("wait for runc exec", e))?;
    if !status.success() {
        let log = tokio::fs::read(files.path(&files.log))
            .await
            .unwrap_or_default();
        let message = petrel_oci::runc::error_message(&log);
        return Err(runc_failure(&t.id, status.code(), message));
    }

    let pid_text = tokio::fs::read_to_string(files.path(&files.pid))
        .await
        .map_err(|e| internal("read the exec's pid file", e))?;
    let pid: u32 = pid_text
        .trim()
        .parse()
        .map_err(|_| BackendError::Internal(format!("runc wrote a bad pid {pid_text:?}")))?;
    // The process cannot have been reaped meanwhile: it is our child now
    // (runc has exited) and only this code waits for it.
    let pidfd = util::pidfd_open(pid)
        .and_then(fd::async_pidfd)
        .map_err(|e| internal(format!("watch exec'd process {pid}"), e))?;
    let process = ExecProcess { pidfd: Some(pidfd) };

    let io = match console {
        Some(listener) => {
            let (conn, _) = listener
                .accept()
                .map_err(|e| internal("runc did not hand over the exec's terminal", e))?;
            let master = petrel_shim::fdpass::receive_fd(&conn)
                .and_then(Terminal::new)
                .map_err(|e| internal("receive the exec's terminal", e))?;
            ProcessIo::Terminal(master)
        }
        None => ProcessIo::Pipes {
            stdin,
            stdout,
            stderr,
        },
    };
    Ok(Started { process, io })
}

/// The error for a `runc exec` that failed: the command could not be
/// started (reported like a shell would, 127 for a missing binary, 126 for
/// one that cannot be run), or the container is not there or not running.
fn runc_failure(id: &str, code: Option<i32>, message: String) -> BackendError {
    let lower = message.to_ascii_lowercase();
    if lower.contains("executable file not found") || lower.contains("no such file or directory") {
        BackendError::CommandFailed {
            message,
            exit_code: 127,
        }
    } else if lower.contains("permission denied") || lower.contains("exec format error") {
        BackendError::CommandFailed {
            message,
            exit_code: 126,
        }
    } else if lower.contains("stopped") || lower.contains("not running") {
        BackendError::FailedPrecondition(format!("container {id} is not running: {message}"))
    } else if lower.contains("does not exist") || lower.contains("container not found") {
        BackendError::NotFound(format!("container {id} not found: {message}"))
    } else if lower.starts_with("exec failed") {
        BackendError::CommandFailed {
            message,
            exit_code: code.unwrap_or(126),
        }
    } else {
        BackendError::Internal(format!("runc exec in {id}: {message}"))
    }
}

impl Started {
    /// Copies the streams until the process has exited and its output is
    /// written; returns its exit code.
    async fn serve(self, io: StreamIo) -> Result<i32, BackendError> {
        let Started {
            mut process,
            io: pio,
        } = self;
        let StreamIo {
            stdin,
            stdout,
            stderr,
            resize,
        } = io;
        match pio {
            ProcessIo::Pipes {
                stdin: p_in,
                stdout: p_out,
                stderr: p_err,
            } => {
                let output = async {
                    tokio::join!(copy_out(p_out, stdout), copy_out(p_err, stderr));
                };
                let input = copy_in(stdin, p_in);
                supervise(&mut process, output, input).await
            }
            ProcessIo::Terminal(terminal) => {
                let output = copy_out_terminal(&terminal, stdout);
                let input = async {
                    tokio::join!(
                        copy_in_terminal(stdin, &terminal),
                        apply_resizes(resize, &terminal)
                    );
                };
                supervise(&mut process, output, input).await
            }
        }
    }
}

/// Runs `output` and `input` until the process exits, then lets `output`
/// finish for a moment; returns the exit code (the process is reaped).
async fn supervise(
    process: &mut ExecProcess,
    output: impl std::future::Future<Output = ()>,
    input: impl std::future::Future<Output = ()>,
) -> Result<i32, BackendError> {
    tokio::pin!(output);
    tokio::pin!(input);
    let mut output_done = false;
    let exited = {
        let Some(pidfd) = process.pidfd.as_ref() else {
            return Err(BackendError::Internal(
                "exec'd process already reaped".into(),
            ));
        };
        let exit = fd::wait_child(pidfd);
        tokio::pin!(exit);
        let mut input_done = false;
        loop {
            tokio::select! {
                () = &mut output, if !output_done => output_done = true,
                () = &mut input, if !input_done => input_done = true,
                r = &mut exit => break r,
            }
        }
    };
    let code = match exited {
        Ok(code) => {
            // Reaped: nothing left to kill.
            process.pidfd = None;
            code
        }
        Err(e) => {
            return Err(internal(
                "wait for the exec'd process (is the runtime a child subreaper?)",
                e,
            ))
        }
    };
    if !output_done {
        let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut output).await;
    }
    Ok(code)
}

/// Copies a process output pipe to the client until EOF. A client stream
/// that fails is dropped, the pipe still drained (the process must never
/// block on output nobody reads).
async fn copy_out(from: Option<impl AsyncRead + Unpin>, mut to: Option<Writer>) {
    let Some(mut from) = from else {
        return;
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        write_client(&mut to, &buf[..n]).await;
    }
}

/// Writes to the client and flushes (the exec may end any time after); a
/// failing client stream is dropped.
async fn write_client(to: &mut Option<Writer>, data: &[u8]) {
    if let Some(w) = to.as_mut() {
        let ok = w.write_all(data).await.is_ok() && w.flush().await.is_ok();
        if !ok {
            *to = None;
        }
    }
}

/// Copies the client's input to the process's stdin; the end of the input
/// closes the pipe, so the process reads EOF.
async fn copy_in(from: Option<Reader>, to: Option<impl AsyncWrite + Unpin>) {
    let (Some(mut from), Some(mut to)) = (from, to) else {
        return;
    };
    // Either end may go first (the client hangs up, the process exits):
    // nothing to report but to the log.
    if let Err(e) = tokio::io::copy(&mut from, &mut to).await {
        tracing::debug!(error = %e, "exec input not copied to its end");
    }
    if let Err(e) = to.shutdown().await {
        tracing::debug!(error = %e, "exec stdin not closed");
    }
}

/// Copies the terminal's output to the client until it hangs up.
async fn copy_out_terminal(from: &Terminal, mut to: Option<Writer>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        write_client(&mut to, &buf[..n]).await;
    }
}

/// Types the client's input on the terminal. The end of the input does not
/// end the terminal (a terminal has no EOF of its own; the client ends an
/// interactive session by leaving, which kills the process).
async fn copy_in_terminal(from: Option<Reader>, to: &Terminal) {
    let Some(mut from) = from else {
        return;
    };
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Applies the client's terminal size changes.
async fn apply_resizes(rx: Option<mpsc::Receiver<TermSize>>, to: &Terminal) {
    let Some(mut rx) = rx else {
        return;
    };
    while let Some(size) = rx.recv().await {
        if let Err(e) = to.resize(size.width, size.height) {
            tracing::debug!(error = %e, "resize exec terminal");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_failure_should_report_missing_binaries_like_a_shell() {
        let msg = "exec failed: unable to start container process: exec: \"nope\": \
                   executable file not found in $PATH";
        match runc_failure("c", Some(255), msg.into()) {
            BackendError::CommandFailed { message, exit_code } => {
                assert_eq!(exit_code, 127);
                assert!(message.contains("nope"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            runc_failure("c", Some(255), "exec failed: ... permission denied".into()),
            BackendError::CommandFailed { exit_code: 126, .. }
        ));
        assert!(matches!(
            runc_failure("c", Some(1), "cannot exec in a stopped state".into()),
            BackendError::FailedPrecondition(_)
        ));
        assert!(matches!(
            runc_failure("c", Some(1), "container \"c\" does not exist".into()),
            BackendError::NotFound(_)
        ));
        assert!(matches!(
            runc_failure("c", Some(1), "something else".into()),
            BackendError::Internal(_)
        ));
    }
}
