//! The contract between the Petrel runtime and `petrel-shim`.
//!
//! The shim is one small process per container. The runtime starts it as
//!
//! ```text
//! petrel-shim --id ID --bundle DIR --runc PATH --runc-root DIR --log-path PATH [--tty] [--stdin [--stdin-once]]
//!             [--restore-from DIR [--criu PATH]]
//! ```
//!
//! with standard output a pipe (the handshake, see [`Handshake`]) and standard
//! error appended to `DIR/shim.log`. The shim works inside the bundle
//! directory (`DIR`, which holds `config.json`, written by the runtime):
//!
//! 1. it leaves the runtime's session, becomes a child subreaper and runs
//!    `runc create` with the container's stdio connected to pipes it holds
//!    (or a pseudo-terminal received on [`CONSOLE_SOCKET`] with `--tty`);
//!    with `--restore-from`, `runc restore --detach` from the CRIU images in
//!    that directory instead (the restored process gets the same pipes; it
//!    runs at once, there is no exec FIFO; no terminal);
//! 2. it answers the handshake with `ok <init pid>` or `error <message>` and
//!    closes standard output, so the runtime can return from CreateContainer;
//! 3. it copies the container's output into the CRI log file
//!    (`<RFC3339Nano> <stdout|stderr> <P|F> <content>`), serves commands on the
//!    [`CTL_FIFO`] (see [`Command`]), and reaps the container's init process;
//!    It also serves attach clients on [`ATTACH_SOCKET`] (see [`attach`]):
//!    the container's output goes to every client too, a client's input to
//!    the container's stdin or terminal;
//! 4. on cgroup v2 it watches the `oom_kill` count in its container's own
//!    cgroup's `memory.events` while the container runs (inotify, and a
//!    last read when init exits, before systemd may drop the scope);
//! 5. when init exits it writes the [`ExitRecord`] to [`EXIT_FILE`] atomically
//!    (write, rename), with whether an OOM kill was seen, and exits itself. The runtime learns of the exit
//!    from a pidfd on the shim: no polling anywhere.
//!
//! The shim never dies with the runtime: it lives in its own session and keeps
//! the container's stdio, so a runtime crash or restart loses nothing.

use std::fmt;
use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

pub mod attach;
pub mod fdpass;
pub mod time;

/// File in the bundle where the shim records the container's exit.
pub const EXIT_FILE: &str = "exit";
/// FIFO in the bundle on which the shim reads [`Command`]s, one per line.
pub const CTL_FIFO: &str = "ctl";
/// FIFO in the bundle on which the shim answers each command with one line,
/// `ok` or `error <message>`, when a reader has it open.
pub const ACK_FIFO: &str = "ack";
/// Temporary name of [`EXIT_FILE`] while the shim writes it; renamed once
/// complete and synced.
pub const EXIT_TMP_FILE: &str = "exit.tmp";
/// Descriptor at which a shim started with `--stdin` (and without `--tty`)
/// holds the write end of the container's stdin pipe (attach clients' input
/// is written there). [`Command::CloseStdin`] closes the shim's end (the
/// container then sees EOF once every other writer has closed too).
pub const STDIN_FD: i32 = 3;
/// The only argument of `petrel-shim --pid-holder`, which holds a pod's
/// shared PID namespace: it unshares a PID namespace, forks the namespace's
/// init (which reaps orphans and otherwise sleeps, with /dev/null as stdio,
/// in its own session), prints the init's pid and a newline on standard
/// output and exits 0. The runtime joins `/proc/<pid>/ns/pid` and ends the
/// namespace with SIGKILL to the init. The init's parent has exited, so the
/// caller must be a child subreaper (or accept a zombie) to reap it.
pub const PID_HOLDER_FLAG: &str = "--pid-holder";
/// File in the bundle where runc writes the container's init pid.
pub const INIT_PID_FILE: &str = "init.pid";
/// The shim's own diagnostics (and runc's log) inside the bundle.
pub const SHIM_LOG: &str = "shim.log";
/// Socket (relative to the bundle, which is runc's working directory) on which
/// runc hands over the pseudo-terminal master of a `--tty` container.
pub const CONSOLE_SOCKET: &str = "console.sock";
/// Socket (relative to the bundle) on which the shim serves attach clients;
/// see [`attach`] for the protocol. Relative for the same reason as
/// [`CONSOLE_SOCKET`]: a client connects through the bundle directory's
/// descriptor, clear of the 108-byte limit on socket paths.
pub const ATTACH_SOCKET: &str = "attach.sock";
/// Longest log line content written as one record; longer lines are split
/// into partial (`P`) records, like containerd's default of 16 KiB.
pub const MAX_LOG_LINE: usize = 16 * 1024;

/// The record of a container's exit, written once by the shim.
///
/// Text format, one line: `<exit code> <exited at, ns since the epoch>
/// [oom=<0|1>]\n`. A process killed by signal N has exit code 128 + N, as
/// runc and containerd report it. The third field is the shim's own
/// finding on OOM kills in the container's cgroup (see
/// [`ExitRecord::oom_killed`]); a record without it (a shim that could
/// not tell, or one older than the field) leaves the question to the
/// runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitRecord {
    /// The exit status, or 128 + signal number.
    pub exit_code: i32,
    /// When the shim reaped the container's init process.
    pub exited_at_ns: i64,
    /// Whether the OOM killer killed in the container's cgroup while the
    /// container ran: the cgroup v2 `memory.events` `oom_kill` count the
    /// shim watched grew. `None` when the shim could not tell (cgroup v1,
    /// or the cgroup gone before the shim read it at the exit).
    pub oom_killed: Option<bool>,
}

impl ExitRecord {
    /// Parses the exit file's content.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.split_ascii_whitespace();
        let exit_code = it.next()?.parse().ok()?;
        let exited_at_ns = it.next()?.parse().ok()?;
        let oom_killed = match it.next() {
            None => None,
            Some("oom=1") => Some(true),
            Some("oom=0") => Some(false),
            Some(_) => return None,
        };
        if it.next().is_some() {
            return None;
        }
        Some(Self {
            exit_code,
            exited_at_ns,
            oom_killed,
        })
    }
}

impl fmt::Display for ExitRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.exit_code, self.exited_at_ns)?;
        match self.oom_killed {
            Some(oom) => writeln!(f, " oom={}", u8::from(oom)),
            None => writeln!(f),
        }
    }
}

/// The first and only line the shim writes to its standard output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handshake {
    /// The container is created (runc create succeeded); its init pid.
    Ok {
        /// The container's init process id.
        init_pid: u32,
    },
    /// Creation failed; nothing of the container remains (the shim deleted it
    /// from runc before answering).
    Error(String),
}

impl Handshake {
    /// Parses one handshake line (without the newline).
    pub fn parse(line: &str) -> Option<Self> {
        let line = line.trim_end_matches('\n');
        if let Some(rest) = line.strip_prefix("ok ") {
            return rest
                .trim()
                .parse()
                .ok()
                .map(|init_pid| Self::Ok { init_pid });
        }
        line.strip_prefix("error ")
            .map(|msg| Self::Error(msg.to_string()))
    }
}

impl fmt::Display for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Messages are kept on one line so the runtime reads exactly one.
            Self::Ok { init_pid } => writeln!(f, "ok {init_pid}"),
            Self::Error(msg) => writeln!(f, "error {}", msg.replace('\n', " ")),
        }
    }
}

/// Commands the runtime writes to [`CTL_FIFO`], one per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Close and reopen the log file at the log path (after rotation).
    ReopenLog,
    /// Close the container's stdin (for `stdin_once` after the attach ends).
    CloseStdin,
}

impl Command {
    /// The wire form, without the newline.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReopenLog => "reopen-log",
            Self::CloseStdin => "close-stdin",
        }
    }

    /// Parses a line (without the newline).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "reopen-log" => Some(Self::ReopenLog),
            "close-stdin" => Some(Self::CloseStdin),
            _ => None,
        }
    }
}

/// Sends `command` to the shim serving `bundle` and waits up to `timeout`
/// for its answer: `Ok` for `ok`, an error carrying the shim's message for
/// `error <message>`, `NotConnected` when no shim reads the control FIFO
/// (it has exited), `TimedOut` without an answer.
///
/// Blocking; commands to one shim must not be sent concurrently (answers
/// share the acknowledgement FIFO).
pub fn send_command(bundle: &Path, command: Command, timeout: Duration) -> io::Result<()> {
    let deadline = Instant::now() + timeout;
    // Open the answer FIFO first: the shim only answers a present reader.
    let mut ack = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(bundle.join(ACK_FIFO))?;
    let mut ctl = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(bundle.join(CTL_FIFO))
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => io::Error::new(io::ErrorKind::NotConnected, "shim is not running"),
            _ => e,
        })?;
    let mut line = command.as_str().as_bytes().to_vec();
    line.push(b'\n');
    ctl.write_all(&line)?;
    drop(ctl);

    let mut answer = Vec::new();
    loop {
        let mut chunk = [0u8; 512];
        match ack.read(&mut chunk) {
            Ok(0) if !answer.is_empty() => break,
            Ok(n) if n > 0 => {
                answer.extend_from_slice(&chunk[..n]);
                if answer.ends_with(b"\n") {
                    break;
                }
                continue;
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no answer from shim",
            ));
        }
        let mut pfd = libc::pollfd {
            fd: ack.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: poll reads and writes the one pollfd we own.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no answer from shim",
            ));
        } else if pfd.revents & libc::POLLIN == 0 {
            // A writer came and went without a word.
            return Err(io::Error::other("shim closed the answer without a reply"));
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    let answer = answer.trim_end();
    if answer == "ok" {
        return Ok(());
    }
    Err(io::Error::other(
        answer.strip_prefix("error ").unwrap_or(answer).to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_record_should_round_trip() {
        for oom_killed in [None, Some(false), Some(true)] {
            let r = ExitRecord {
                exit_code: 137,
                exited_at_ns: 1_700_000_000_123_456_789,
                oom_killed,
            };
            assert_eq!(ExitRecord::parse(&r.to_string()), Some(r));
        }
        // The form of a shim older than the OOM field still reads.
        assert_eq!(ExitRecord::parse("1 2\n").map(|r| r.oom_killed), Some(None));
        assert_eq!(ExitRecord::parse("x 1"), None);
        assert_eq!(ExitRecord::parse("1"), None);
        assert_eq!(ExitRecord::parse("1 2 3"), None);
        assert_eq!(ExitRecord::parse("1 2 oom=1 4"), None);
    }

    #[test]
    fn handshake_should_round_trip() {
        let ok = Handshake::Ok { init_pid: 42 };
        assert_eq!(Handshake::parse(&ok.to_string()), Some(ok));
        let err = Handshake::Error("exec: \"nope\"\nnot found".into());
        assert_eq!(
            Handshake::parse(&err.to_string()),
            Some(Handshake::Error("exec: \"nope\" not found".into()))
        );
        assert_eq!(Handshake::parse("garbage"), None);
    }

    #[test]
    fn command_should_round_trip() {
        for c in [Command::ReopenLog, Command::CloseStdin] {
            assert_eq!(Command::parse(c.as_str()), Some(c));
        }
        assert_eq!(Command::parse("bogus"), None);
    }
}
