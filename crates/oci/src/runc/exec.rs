//! `runc exec` of a command whose output is collected (ExecSync).
//!
//! runc is never killed to end an exec. Killing it would orphan what it
//! started (its `runc init` stages and the exec'd process) to the runtime, a
//! child subreaper that did not spawn them and so never reaps them; and one
//! zombie left in a container's PID namespace keeps the namespace's init from
//! ever finishing its exit, so every later StopContainer times out. A timeout,
//! or a caller that gives up, kills the exec'd process instead, as soon as
//! runc has written its pid; runc then reaps it and exits by itself. Only a
//! runc that neither starts the process nor exits within [`GIVE_UP`] is
//! killed.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use oci_spec::runtime::Process;
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;
use tokio::sync::oneshot;

use super::{error_message, unique_tag, ExecOutput, Runc, RuncError};

/// How long runc may take, once the exec is abandoned, to start the process
/// (so that it can be killed) and then to exit.
const GIVE_UP: Duration = Duration::from_secs(10);

/// How often the pid file is looked for while runc sets the process up.
const PID_POLL: Duration = Duration::from_millis(10);

/// The files of one exec call, removed when it ends.
struct CallFiles {
    process: PathBuf,
    pid: PathBuf,
}

impl CallFiles {
    async fn remove(&self) {
        let _ = tokio::fs::remove_file(&self.process).await;
        let _ = tokio::fs::remove_file(&self.pid).await;
    }
}

impl Runc {
    /// Runs `process` inside the container and collects its output.
    ///
    /// `work_dir` holds the call's process file and pid file (removed
    /// afterwards). When `timeout` expires the exec'd process is killed,
    /// runc is left to reap it, and [`RuncError::Timeout`] is returned. A
    /// caller that drops the returned future has the process killed the
    /// same way, in the background.
    pub async fn exec(
        &self,
        id: &str,
        process: &Process,
        work_dir: &Path,
        timeout: Option<Duration>,
    ) -> Result<ExecOutput, RuncError> {
        let tag = unique_tag();
        let files = CallFiles {
            process: work_dir.join(format!("exec-{tag}.json")),
            pid: work_dir.join(format!("exec-{tag}.pid")),
        };
        let json = serde_json::to_vec(process).map_err(|e| RuncError::Output {
            command: "exec",
            reason: e.to_string(),
        })?;
        tokio::fs::write(&files.process, json)
            .await
            .map_err(|source| RuncError::Io {
                op: "write",
                path: files.process.clone(),
                source,
            })?;
        let mut c = self.command();
        c.kill_on_drop(false)
            .arg("exec")
            .arg("--process")
            .arg(&files.process)
            .arg("--pid-file")
            .arg(&files.pid)
            .arg(id)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = match c.spawn() {
            Ok(child) => child,
            Err(source) => {
                files.remove().await;
                return Err(RuncError::Spawn {
                    binary: self.binary.clone(),
                    source,
                });
            }
        };
        // The call is supervised by a task of its own so that it is still
        // ended properly when this future is dropped; dropping `_abandon`
        // tells the task.
        let (_abandon, abandoned) = oneshot::channel::<()>();
        let call = Call {
            id: id.to_string(),
            binary: self.binary.clone(),
            files,
            timeout,
        };
        tokio::spawn(call.supervise(child, abandoned))
            .await
            .map_err(|e| RuncError::Output {
                command: "exec",
                reason: format!("the exec's supervisor failed: {e}"),
            })?
    }
}

struct Call {
    id: String,
    binary: PathBuf,
    files: CallFiles,
    timeout: Option<Duration>,
}

impl Call {
    async fn supervise(
        self,
        mut child: Child,
        mut abandoned: oneshot::Receiver<()>,
    ) -> Result<ExecOutput, RuncError> {
        // Known until the child is reaped, which only `run` does.
        let runc_pid = child.id();
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let run = async move {
            let (out, err, status) = tokio::join!(read_all(stdout), read_all(stderr), child.wait());
            (out, err, status)
        };
        tokio::pin!(run);
        let deadline = async {
            match self.timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let finished = tokio::select! {
            r = &mut run => Some(r),
            () = deadline => None,
            _ = &mut abandoned => None,
        };
        let result = match finished {
            Some((stdout, stderr, status)) => match status {
                Ok(status) => output(&self.id, status, stdout, stderr),
                Err(source) => Err(RuncError::Spawn {
                    binary: self.binary.clone(),
                    source,
                }),
            },
            None => {
                end_abandoned(run, runc_pid, &self.files.pid, &self.id).await;
                Err(RuncError::Timeout {
                    id: self.id.clone(),
                    timeout: self.timeout.unwrap_or_default(),
                })
            }
        };
        self.files.remove().await;
        result
    }
}

/// Kills the exec'd process once runc has started it and waits for runc to
/// exit; kills runc itself only when it does neither within [`GIVE_UP`].
async fn end_abandoned(
    mut run: std::pin::Pin<&mut impl Future>,
    runc_pid: Option<u32>,
    pid_file: &Path,
    id: &str,
) {
    let give_up = tokio::time::sleep(GIVE_UP);
    tokio::pin!(give_up);
    let mut killed = false;
    loop {
        tokio::select! {
            _ = &mut run => return,
            () = &mut give_up => break,
            () = tokio::time::sleep(PID_POLL), if !killed => {
                killed = kill_exec_process(pid_file, runc_pid);
            }
        }
    }
    tracing::warn!(container.id = %id, "runc exec neither started nor ended its process; killing runc");
    if let Some(pid) = runc_pid.and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) on our own child, not yet reaped (`run` reaps it
        // and has not finished), so the pid cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = tokio::time::timeout(GIVE_UP, run).await;
}

/// SIGKILLs the process runc wrote to `pid_file` if it is runc's child.
/// False while the pid is not known yet.
fn kill_exec_process(pid_file: &Path, runc_pid: Option<u32>) -> bool {
    let Ok(text) = std::fs::read_to_string(pid_file) else {
        return false;
    };
    // Not yet (or not wholly) written.
    let Some(pid) = text.trim().parse::<i32>().ok().and_then(Pid::from_raw) else {
        return false;
    };
    let Ok(pidfd) = pidfd_open(pid, PidfdFlags::empty()) else {
        return true; // gone already
    };
    // The pidfd holds this process; the parent check makes sure it is the
    // exec'd one and not a process that got the pid after runc reaped it.
    if runc_pid.is_some()
        && u32::try_from(pid.as_raw_nonzero().get())
            .ok()
            .and_then(crate::proc_stat::read)
            .map(|s| s.ppid)
            == runc_pid
    {
        let _ = pidfd_send_signal(&pidfd, Signal::KILL);
    }
    true
}

async fn read_all(from: Option<impl AsyncRead + Unpin>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(mut from) = from {
        // A read error ends the output; the exit status still counts.
        let _ = from.read_to_end(&mut buf).await;
    }
    buf
}

/// The exec's result from runc's exit status and output.
fn output(
    id: &str,
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
) -> Result<ExecOutput, RuncError> {
    // runc exec exits with the process's exit code; runc's own failures
    // (e.g. the binary is missing) also come back as a code with a message
    // on stderr, as with containerd and CRI-O.
    let exit_code = match status.code() {
        Some(c) => c,
        None => {
            use std::os::unix::process::ExitStatusExt;
            128 + status.signal().unwrap_or(0)
        }
    };
    if exit_code != 0 && stdout.is_empty() {
        let msg = error_message(&stderr);
        if msg.contains("does not exist") || msg.contains("cannot exec in a stopped") {
            return Err(RuncError::Failed {
                command: "exec",
                id: id.to_string(),
                message: msg,
            });
        }
    }
    Ok(ExecOutput {
        exit_code,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// A stand-in for runc: `out` prints and exits 3; any other id sets up
    /// for half a second, runs `sleep 100` as the exec'd process, writes its
    /// pid, waits for it and records the status runc itself ends with.
    const FAKE_RUNC: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root=$2; shift 2;;
    --pid-file) pidfile=$2; shift 2;;
    --process) shift 2;;
    exec) shift;;
    *) id=$1; shift;;
  esac
done
if [ "$id" = out ]; then echo hello; echo warn >&2; exit 3; fi
sleep 0.5
sleep 100 &
echo $! > "$root/child.pid"
echo $! > "$pidfile"
wait $!
echo $? > "$root/exited.tmp" && mv "$root/exited.tmp" "$root/exited"
"#;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    struct Fake {
        dir: tempfile::TempDir,
        runc: Runc,
        work: PathBuf,
    }

    fn fake() -> std::io::Result<Fake> {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir()?;
        let bin = dir.path().join("runc");
        std::fs::write(&bin, FAKE_RUNC)?;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))?;
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work)?;
        let runc = Runc::new(bin, dir.path());
        Ok(Fake { dir, runc, work })
    }

    impl Fake {
        /// What the fake runc exited with, once it has.
        async fn runc_exit(&self, within: Duration) -> Option<String> {
            let t0 = Instant::now();
            loop {
                if let Ok(s) = std::fs::read_to_string(self.dir.path().join("exited")) {
                    return Some(s.trim().to_string());
                }
                if t0.elapsed() >= within {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }

        fn child_alive(&self) -> std::io::Result<bool> {
            let pid = std::fs::read_to_string(self.dir.path().join("child.pid"))?;
            Ok(Path::new(&format!("/proc/{}", pid.trim())).exists())
        }

        fn files_left(&self) -> std::io::Result<usize> {
            Ok(std::fs::read_dir(&self.work)?.count())
        }
    }

    #[tokio::test]
    async fn exec_should_return_runcs_exit_code_and_output_and_remove_its_files() -> TestResult {
        let f = fake()?;
        let out = f
            .runc
            .exec("out", &Process::default(), &f.work, None)
            .await?;
        assert_eq!(out.exit_code, 3);
        assert_eq!(out.stdout, b"hello\n");
        assert_eq!(out.stderr, b"warn\n");
        assert_eq!(f.files_left()?, 0);
        Ok(())
    }

    #[tokio::test]
    async fn a_timeout_should_kill_the_process_once_started_and_let_runc_exit_by_itself(
    ) -> TestResult {
        let f = fake()?;
        let t0 = Instant::now();
        // The timeout expires while "runc" is still setting up.
        let r = f
            .runc
            .exec(
                "c1",
                &Process::default(),
                &f.work,
                Some(Duration::from_millis(100)),
            )
            .await;
        assert!(matches!(r, Err(RuncError::Timeout { .. })), "{r:?}");
        // runc was not killed: it saw its process die of SIGKILL and exited.
        assert_eq!(f.runc_exit(Duration::ZERO).await.as_deref(), Some("137"));
        assert!(!f.child_alive()?);
        assert!(t0.elapsed() < GIVE_UP, "{:?}", t0.elapsed());
        assert_eq!(f.files_left()?, 0);
        Ok(())
    }

    #[tokio::test]
    async fn a_dropped_call_should_have_its_process_killed_in_the_background() -> TestResult {
        let f = fake()?;
        let p = Process::default();
        let call = f.runc.exec("c1", &p, &f.work, None);
        assert!(tokio::time::timeout(Duration::from_millis(100), call)
            .await
            .is_err());
        assert_eq!(f.runc_exit(GIVE_UP).await.as_deref(), Some("137"));
        assert!(!f.child_alive()?);
        Ok(())
    }
}
