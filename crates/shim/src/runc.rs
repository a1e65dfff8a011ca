//! Running runc, and making sense of its errors.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use petrel_shim::{CONSOLE_SOCKET, INIT_PID_FILE};

/// Longest runc error message passed on in the handshake.
const MAX_MESSAGE: usize = 2048;
/// How much of the end of runc's log is searched for its error.
const LOG_TAIL: u64 = 64 * 1024;

/// How to call runc for one container.
#[derive(Debug)]
pub struct Runc<'a> {
    /// The runc binary.
    pub bin: &'a Path,
    /// runc's state directory.
    pub root: &'a Path,
    /// The file runc appends its JSON log lines to.
    pub log: PathBuf,
    /// runc manages the cgroup through systemd (`--systemd-cgroup`).
    pub systemd_cgroup: bool,
}

/// The standard streams given to `runc create` (and so to the container).
#[derive(Debug)]
pub struct CreateStdio {
    /// Standard input.
    pub stdin: Stdio,
    /// Standard output.
    pub stdout: Stdio,
    /// Standard error.
    pub stderr: Stdio,
}

impl Runc<'_> {
    fn command(&self) -> Command {
        let mut cmd = Command::new(self.bin);
        cmd.arg("--root")
            .arg(self.root)
            .arg("--log")
            .arg(&self.log)
            .args(["--log-format", "json"]);
        if self.systemd_cgroup {
            cmd.arg("--systemd-cgroup");
        }
        // SAFETY: the hook runs in the forked child before exec and makes
        // only raw rt_sigaction system calls, which are async-signal-safe.
        unsafe { cmd.pre_exec(reset_signal_dispositions) };
        cmd
    }

    /// Runs `runc create` and waits for it; the container's init lives on,
    /// blocked until `runc start`.
    pub fn create(
        &self,
        bundle: &Path,
        id: &OsStr,
        console: bool,
        stdio: CreateStdio,
    ) -> io::Result<ExitStatus> {
        let mut cmd = self.command();
        cmd.arg("create")
            .arg("--bundle")
            .arg(bundle)
            .arg("--pid-file")
            .arg(bundle.join(INIT_PID_FILE));
        if console {
            cmd.args(["--console-socket", CONSOLE_SOCKET]);
        }
        cmd.arg(id);
        run_with_stdio(cmd, stdio)
    }

    /// Runs `runc restore --detach` from the CRIU images in `images` and
    /// waits for it; the restored init runs on, reparented to the shim
    /// (a child subreaper) when runc exits. CRIU's own log goes to
    /// `work/restore.log`. The restored process's standard streams are
    /// `stdio`: runc hands them to CRIU in place of the ones the
    /// checkpointed process had.
    pub fn restore(
        &self,
        bundle: &Path,
        id: &OsStr,
        restore: &Restore<'_>,
        stdio: CreateStdio,
    ) -> io::Result<ExitStatus> {
        let mut cmd = self.command();
        if let Some(criu) = restore.criu {
            cmd.arg("--criu").arg(criu);
        }
        cmd.args(["restore", "--detach"])
            .arg("--bundle")
            .arg(bundle)
            .arg("--pid-file")
            .arg(bundle.join(INIT_PID_FILE))
            .arg("--image-path")
            .arg(restore.images)
            .arg("--work-path")
            .arg(restore.work)
            .arg(id);
        run_with_stdio(cmd, stdio)
    }

    /// Runs `runc delete --force` so that nothing of a failed container
    /// remains; runc's own complaints go to the shim's log.
    pub fn delete_force(&self, id: &OsStr) -> io::Result<ExitStatus> {
        self.command()
            .args(["delete", "--force"])
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
    }
}

/// What a restore needs besides the bundle.
#[derive(Debug)]
pub struct Restore<'a> {
    /// CRIU's images (the checkpoint archive's `checkpoint/`).
    pub images: &'a Path,
    /// CRIU's work directory (its `restore.log`).
    pub work: &'a Path,
    /// The CRIU binary, if not runc's own lookup.
    pub criu: Option<&'a Path>,
}

/// Runs `cmd` with the container's standard streams and waits for it.
fn run_with_stdio(mut cmd: Command, stdio: CreateStdio) -> io::Result<ExitStatus> {
    cmd.stdin(stdio.stdin)
        .stdout(stdio.stdout)
        .stderr(stdio.stderr);
    let mut child = cmd.spawn()?;
    // Close our copies of the container's ends of the stdio pipes.
    drop(cmd);
    child.wait()
}

/// The last error line of CRIU's log `log` (`... Error (file:line): ...`),
/// which says why a restore failed where runc only says that it did.
pub fn last_criu_error(log: &Path) -> Option<String> {
    let mut file = File::open(log).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL)))
        .ok()?;
    let mut text = Vec::new();
    file.read_to_end(&mut text).ok()?;
    let text = String::from_utf8_lossy(&text);
    let line = text.lines().rfind(|l| l.contains("Error ("))?;
    Some(truncate(line.trim().to_owned()))
}

/// Gives runc, and so the container, default handling of every signal.
///
/// Ignored signals survive exec: the shim itself may have been started with
/// some (glibc's posix_spawn leaves its two internal real-time signals
/// ignored in every child it starts), and the container must not inherit
/// them. glibc refuses to touch those two, hence the raw system call.
fn reset_signal_dispositions() -> io::Result<()> {
    // The kernel's struct sigaction with SIG_DFL (0), no flags, no restorer
    // and an empty mask is all zeros, whatever the architecture's layout.
    let default_action = [0u64; 4];
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads the zeroed action above (larger than
        // any layout of the kernel's struct) and writes no old action.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                default_action.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize, // sizeof(kernel sigset_t)
            )
        };
    }
    Ok(())
}

/// The last error runc logged to `log` after byte offset `from`.
pub fn last_logged_error(log: &Path, from: u64) -> Option<String> {
    let mut file = File::open(log).ok()?;
    let len = file.metadata().ok()?.len();
    let start = from.max(len.saturating_sub(LOG_TAIL));
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut text = Vec::new();
    file.take(LOG_TAIL).read_to_end(&mut text).ok()?;
    last_error_in(&String::from_utf8_lossy(&text))
}

/// The message of the last error-level line of runc's log output, in JSON
/// (`{"level":"error","msg":"..."}`) or logfmt (`level=error msg="..."`).
pub fn last_error_in(text: &str) -> Option<String> {
    text.lines().rev().find_map(|line| {
        let level = field(line, "level")?;
        if level != "error" && level != "fatal" {
            return None;
        }
        field(line, "msg").filter(|m| !m.is_empty()).map(truncate)
    })
}

/// The last non-empty line of `text` (runc also prints its error, bare, to
/// its standard error), or its logfmt message.
pub fn last_line(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    Some(truncate(
        field(line, "msg").unwrap_or_else(|| line.to_owned()),
    ))
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// The value of `key` in a JSON object line or a logfmt line; quoted values
/// are unescaped.
fn field(line: &str, key: &str) -> Option<String> {
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(pos) = line[from..].find(key) {
        let start = from + pos;
        let end = start + key.len();
        from = end;
        let before = start.checked_sub(1).map(|i| bytes[i]);
        let rest = &line[end..];
        // JSON: "key":value
        if before == Some(b'"') {
            if let Some(value) = rest.strip_prefix("\":") {
                return value_at(value.trim_start());
            }
            continue;
        }
        // logfmt: key=value at the start of a token.
        if matches!(before, None | Some(b' ')) {
            if let Some(value) = rest.strip_prefix('=') {
                return value_at(value);
            }
        }
    }
    None
}

/// A quoted string (unescaped) or a bare word at the start of `s`.
fn value_at(s: &str) -> Option<String> {
    let Some(quoted) = s.strip_prefix('"') else {
        let end = s.find([' ', ',', '}']).unwrap_or(s.len());
        return Some(s[..end].to_owned());
    };
    let mut out = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    let code = u32::from_str_radix(&hex, 16).ok()?;
                    out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    // Unterminated: keep what there is.
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_in_should_take_the_last_json_error() {
        let log = concat!(
            r#"{"level":"warning","msg":"a warning","time":"2026-01-01T00:00:00Z"}"#,
            "\n",
            r#"{"level":"error","msg":"first","time":"2026-01-01T00:00:00Z"}"#,
            "\n",
            r#"{"level":"error","msg":"runc create failed: unable to start container process: exec: \"/nope\": stat /nope: no such file or directory","time":"2026-01-01T00:00:00Z"}"#,
            "\n",
            r#"{"level":"info","msg":"later info","time":"2026-01-01T00:00:00Z"}"#,
            "\n",
        );
        assert_eq!(
            last_error_in(log).as_deref(),
            Some(
                "runc create failed: unable to start container process: \
                 exec: \"/nope\": stat /nope: no such file or directory"
            )
        );
    }

    #[test]
    fn last_error_in_should_read_logfmt_and_escapes() {
        let log = "time=\"x\" level=error msg=\"bad \\\"config\\\"\\nline \\u00e9\"\n";
        assert_eq!(
            last_error_in(log).as_deref(),
            Some("bad \"config\"\nline \u{e9}")
        );
    }

    #[test]
    fn last_error_in_should_ignore_other_levels_and_noise() {
        assert_eq!(last_error_in(""), None);
        assert_eq!(last_error_in("not json at all\n"), None);
        assert_eq!(
            last_error_in(r#"{"level":"info","msg":"fine"}"#),
            None,
            "info is not an error"
        );
        // "msg" inside another value is not the field.
        assert_eq!(
            last_error_in(r#"{"note":"\"msg\":\"fake\"","level":"error","msg":"real"}"#).as_deref(),
            Some("real")
        );
    }

    #[test]
    fn last_line_should_skip_blank_lines() {
        assert_eq!(
            last_line("first\nthe error\n\n  \n").as_deref(),
            Some("the error")
        );
        assert_eq!(last_line("\n"), None);
    }

    #[test]
    fn truncate_should_cut_long_messages_on_a_char_boundary() {
        let long = "é".repeat(MAX_MESSAGE);
        let cut = truncate(long);
        assert!(cut.len() <= MAX_MESSAGE + 3);
        assert!(cut.ends_with("..."));
    }

    #[test]
    fn last_logged_error_should_only_read_after_the_offset() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("shim.log");
        let old = "{\"level\":\"error\",\"msg\":\"old failure\"}\n";
        std::fs::write(&path, old)?;
        assert_eq!(last_logged_error(&path, 0).as_deref(), Some("old failure"));
        assert_eq!(last_logged_error(&path, old.len() as u64), None);
        Ok(())
    }
}
