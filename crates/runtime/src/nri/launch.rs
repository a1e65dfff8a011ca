//! Launching a pre-registered plugin: the executable runs with one end of a
//! socketpair as its fd 3 (`NRI_PLUGIN_SOCKET=3`, `NRI_PLUGIN_NAME`,
//! `NRI_PLUGIN_IDX`), as containerd launches them.

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use petrel_nri::api;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

use super::discover::PluginFile;

/// The fd a launched plugin finds its socket on.
const PLUGIN_FD: i32 = 3;

/// Relaunch delays: doubling from the first to the last, reset after a
/// plugin stayed up for [`STABLE_AFTER`].
pub const RELAUNCH_FIRST: Duration = Duration::from_millis(500);
/// Longest relaunch delay.
pub const RELAUNCH_MAX: Duration = Duration::from_secs(30);
/// A plugin up this long is healthy again: its next relaunch waits the first delay.
pub const STABLE_AFTER: Duration = Duration::from_secs(60);

/// The next relaunch delay after `prev` (none yet: the first).
pub fn next_delay(prev: Option<Duration>, up_for: Duration) -> Duration {
    match prev {
        _ if up_for >= STABLE_AFTER => RELAUNCH_FIRST,
        None => RELAUNCH_FIRST,
        Some(d) => (d * 2).min(RELAUNCH_MAX),
    }
}

/// Starts `plugin` with its socket on fd 3 and returns the child and the
/// runtime's end of the socket. The child is killed when dropped.
///
/// `unsafe` because std has no safe way to place an fd at a
/// given number in a child, and the alternative (clearing close-on-exec in
/// the parent) would leak the socket into every runc and shim spawned
/// meanwhile, keeping a dead plugin's socket open.
pub fn spawn(plugin: &PluginFile) -> std::io::Result<(Child, UnixStream)> {
    let (ours, theirs) = petrel_nri::adaptation::plugin_socketpair()?;
    let mut cmd = Command::new(&plugin.path);
    cmd.env(api::PLUGIN_SOCKET_ENV, PLUGIN_FD.to_string())
        .env(api::PLUGIN_NAME_ENV, &plugin.name)
        .env(api::PLUGIN_IDX_ENV, &plugin.index)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let fd = theirs.as_raw_fd();
    // SAFETY: between fork and exec only async-signal-safe calls are made
    // (dup2, fcntl); `theirs` stays open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if fd == PLUGIN_FD {
                // Already fd 3: only clear close-on-exec.
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, PLUGIN_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop::<OwnedFd>(theirs);
    Ok((child, ours))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relaunch_delays_should_double_to_the_cap_and_reset_when_stable() {
        let quick = Duration::from_secs(1);
        let mut d = next_delay(None, quick);
        assert_eq!(d, RELAUNCH_FIRST);
        for _ in 0..10 {
            d = next_delay(Some(d), quick);
        }
        assert_eq!(d, RELAUNCH_MAX);
        assert_eq!(next_delay(Some(d), STABLE_AFTER), RELAUNCH_FIRST);
    }
}
