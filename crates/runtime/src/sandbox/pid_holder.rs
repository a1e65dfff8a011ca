//! The holder of a pod's shared PID namespace.
//!
//! A PID namespace dies with its first process, so pods whose containers
//! share one (`NamespaceMode::POD`) need a process to live as long as the
//! pod. It is `petrel-shim --pid-holder`: it unshares a PID namespace and
//! forks the namespace's init, which only reaps orphans and otherwise sleeps
//! in `wait`. It is the only process an idle pod may cost, and only in this
//! mode.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncReadExt;

use crate::error::{Result, RuntimeError};
use crate::records::ProcessRef;
use crate::util;

/// Starts a holder, in the pod's user namespace `userns` when it has one,
/// and returns the namespace init's identity.
pub async fn spawn(shim: &Path, userns: Option<&Path>) -> Result<ProcessRef> {
    let mut child = tokio::process::Command::new(shim)
        .arg("--pid-holder")
        .args(userns)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| RuntimeError::process(format!("start pid holder {}", shim.display()), e))?;
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout
            .read_to_string(&mut out)
            .await
            .map_err(|e| RuntimeError::process("read pid holder handshake", e))?;
    }
    let status = child
        .wait()
        .await
        .map_err(|e| RuntimeError::process("wait for pid holder", e))?;
    let pid: u32 = out.trim().parse().map_err(|_| {
        RuntimeError::process(
            format!("pid holder answered {:?}", out.trim()),
            std::io::Error::other(format!("it failed ({status})")),
        )
    })?;
    let start_time = util::process_start_time(pid).ok_or_else(|| {
        RuntimeError::process(
            format!("pid holder {pid}"),
            std::io::Error::other("it died at once"),
        )
    })?;
    Ok(ProcessRef { pid, start_time })
}

/// The holder's PID namespace, for containers to join.
pub fn ns_path(holder: &ProcessRef) -> PathBuf {
    PathBuf::from(format!("/proc/{}/ns/pid", holder.pid))
}

/// Kills the holder (and so every process left in the namespace), if it is
/// still the process we started, and reaps it: the runtime is a child
/// subreaper, so the orphaned holder is its child.
pub fn kill(holder: &ProcessRef) {
    if !util::process_alive(holder.pid, holder.start_time) {
        return;
    }
    let Ok(pid) = libc::pid_t::try_from(holder.pid) else {
        return;
    };
    // SAFETY: kill(2) on a pid verified by its start time to be ours.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let mut status = 0;
    // SAFETY: waitpid on that pid; returns at once with ECHILD when it is not
    // our child (a holder adopted by init after a runtime restart), else as
    // soon as the SIGKILLed process is gone.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

/// Makes this process the reaper of its orphaned descendants (the holders'
/// namespace inits), so none is left a zombie on hosts whose init does not
/// reap.
pub fn become_subreaper() {
    // SAFETY: prctl with an integer argument; affects only this process.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if r != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot become a child subreaper");
    }
}
