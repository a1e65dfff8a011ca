//! The real `petrel-shim` binary driving the real runc with busybox
//! containers. Run as root. Every test owns its temporary directory, runc
//! root, container id and cgroup parent, and cleans them up on every path.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{symlink, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use petrel_shim::{
    send_command, ExitRecord, Handshake, ACK_FIFO, CTL_FIFO, EXIT_FILE, EXIT_TMP_FILE,
    INIT_PID_FILE, MAX_LOG_LINE, SHIM_LOG, STDIN_FD,
};

const SHIM: &str = env!("CARGO_BIN_EXE_petrel-shim");
const RUNC: &str = "/usr/sbin/runc";
const BUSYBOX: &str = "/bin/busybox";
const APPLETS: [&str; 11] = [
    "sh", "echo", "sleep", "cat", "printf", "head", "tr", "yes", "dd", "kill", "true",
];
const WAIT: Duration = Duration::from_secs(20);

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

fn require_root() {
    // SAFETY: geteuid has no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "these tests drive runc and must run as root");
}

fn unique_suffix() -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut bytes = [0u8; 4];
    if let Ok(mut f) = File::open("/dev/urandom") {
        let _ = f.read_exact(&mut bytes);
    }
    format!(
        "{}-{}-{:08x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        u32::from_ne_bytes(bytes)
    )
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// What a test container looks like.
struct Spec<'a> {
    args: &'a [&'a str],
    tty: bool,
    stdin: bool,
    /// Whether the container gets a log file (`--log-path ""` otherwise).
    log: bool,
}

impl<'a> Spec<'a> {
    fn new(args: &'a [&'a str]) -> Self {
        Self {
            args,
            tty: false,
            stdin: false,
            log: true,
        }
    }
}

/// One container's world: temporary directory (bundle, rootfs, runc root,
/// log), container id, cgroup parent, and the shim process. Dropping it
/// deletes the container, reaps the shim and removes the cgroups and files.
struct Fixture {
    id: String,
    bundle: PathBuf,
    runc_root: PathBuf,
    log_path: PathBuf,
    runc_bin: PathBuf,
    cgroup_parent: String,
    tty: bool,
    stdin: bool,
    log: bool,
    shim: Option<Child>,
    // Last: removed after everything else is cleaned up.
    _tmp: tempfile::TempDir,
}

impl Fixture {
    fn new(spec: Spec<'_>) -> Result<Self> {
        require_root();
        let suffix = unique_suffix();
        let tmp = tempfile::Builder::new().prefix("petrel-shim-").tempdir()?;
        let bundle = tmp.path().join("bundle");
        let bin = bundle.join("rootfs/bin");
        fs::create_dir_all(&bin)?;
        fs::copy(BUSYBOX, bin.join("busybox"))?;
        for applet in APPLETS {
            symlink("busybox", bin.join(applet))?;
        }
        fs::create_dir_all(tmp.path().join("logs"))?;
        let fixture = Self {
            id: format!("shim-test-{suffix}"),
            runc_root: tmp.path().join("runc"),
            log_path: tmp.path().join("logs/0.log"),
            runc_bin: RUNC.into(),
            cgroup_parent: format!("petrel-test-{suffix}"),
            bundle,
            tty: spec.tty,
            stdin: spec.stdin,
            log: spec.log,
            shim: None,
            _tmp: tmp,
        };
        fixture.write_config(spec.args)?;
        Ok(fixture)
    }

    fn write_config(&self, args: &[&str]) -> Result {
        let args: Vec<String> = args.iter().map(|a| json_string(a)).collect();
        let caps = r#"["CAP_KILL","CAP_AUDIT_WRITE","CAP_NET_BIND_SERVICE"]"#;
        let config = format!(
            r#"{{
  "ociVersion": "1.0.2",
  "process": {{
    "terminal": {tty},
    "user": {{"uid": 0, "gid": 0}},
    "args": [{args}],
    "env": ["PATH=/bin", "TERM=xterm"],
    "cwd": "/",
    "capabilities": {{"bounding": {caps}, "effective": {caps}, "permitted": {caps}}},
    "noNewPrivileges": true
  }},
  "root": {{"path": "rootfs", "readonly": false}},
  "hostname": "shim-test",
  "mounts": [
    {{"destination": "/proc", "type": "proc", "source": "proc"}},
    {{"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
      "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}},
    {{"destination": "/dev/pts", "type": "devpts", "source": "devpts",
      "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}},
    {{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]}}
  ],
  "linux": {{
    "cgroupsPath": {cgroup},
    "namespaces": [{{"type": "pid"}}, {{"type": "ipc"}}, {{"type": "uts"}},
                   {{"type": "mount"}}, {{"type": "network"}}]
  }}
}}"#,
            tty = self.tty,
            args = args.join(", "),
            cgroup = json_string(&format!("/{}/{}", self.cgroup_parent, self.id)),
        );
        fs::write(self.bundle.join("config.json"), config)?;
        Ok(())
    }

    fn shim_command(&self) -> Result<Command> {
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.bundle.join(SHIM_LOG))?;
        let mut cmd = Command::new(SHIM);
        cmd.arg("--id")
            .arg(&self.id)
            .arg("--bundle")
            .arg(&self.bundle)
            .arg("--runc")
            .arg(&self.runc_bin)
            .arg("--runc-root")
            .arg(&self.runc_root)
            .arg("--log-path")
            .arg(if self.log {
                self.log_path.as_os_str()
            } else {
                "".as_ref()
            })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        if self.tty {
            cmd.arg("--tty");
        }
        if self.stdin {
            cmd.arg("--stdin");
        }
        Ok(cmd)
    }

    /// Starts the shim and returns its handshake.
    fn spawn_shim(&mut self) -> Result<Handshake> {
        let mut child = self.shim_command()?.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        self.shim = Some(child);
        let text = read_to_eof(stdout.into(), WAIT)?;
        Ok(Handshake::parse(&text).ok_or_else(|| format!("bad handshake {text:?}"))?)
    }

    /// Starts the shim, expects `ok <pid>`, and returns the init pid.
    fn create(&mut self) -> Result<u32> {
        match self.spawn_shim()? {
            Handshake::Ok { init_pid } => Ok(init_pid),
            Handshake::Error(msg) => {
                Err(format!("create failed: {msg}; {}", self.shim_log()).into())
            }
        }
    }

    fn shim_pid(&self) -> Result<libc::pid_t> {
        let shim = self.shim.as_ref().ok_or("no shim")?;
        Ok(libc::pid_t::try_from(shim.id())?)
    }

    fn runc(&self, args: &[&str]) -> Result<Output> {
        Ok(Command::new(RUNC)
            .arg("--root")
            .arg(&self.runc_root)
            .args(args)
            .stdin(Stdio::null())
            .output()?)
    }

    fn runc_ok(&self, args: &[&str]) -> Result {
        let out = self.runc(args)?;
        if !out.status.success() {
            return Err(format!(
                "runc {args:?}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(())
    }

    fn start(&self) -> Result {
        self.runc_ok(&["start", &self.id])
    }

    /// Waits for the shim to exit and reaps it.
    fn wait_shim(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let shim = self.shim.as_mut().ok_or("no shim")?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = shim.try_wait()? {
                self.shim = None;
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err("shim did not exit in time".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn shim_alive(&mut self) -> Result<bool> {
        let shim = self.shim.as_mut().ok_or("no shim")?;
        Ok(shim.try_wait()?.is_none())
    }

    fn exit_record(&self) -> Result<ExitRecord> {
        let text = fs::read_to_string(self.bundle.join(EXIT_FILE))?;
        Ok(ExitRecord::parse(&text).ok_or_else(|| format!("bad exit record {text:?}"))?)
    }

    fn shim_log(&self) -> String {
        fs::read_to_string(self.bundle.join(SHIM_LOG)).unwrap_or_default()
    }

    fn log_text(&self, path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_default()
    }

    /// Waits until the log at `path` satisfies `done`.
    fn wait_log(&self, path: &Path, done: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = self.log_text(path);
            if done(&text) {
                return Ok(text);
            }
            if Instant::now() > deadline {
                return Err(format!("log never matched; it holds {text:?}").into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn container_listed(&self) -> Result<bool> {
        let out = self.runc(&["list", "-q"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == self.id))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Kill and delete the container; its shim then exits on its own.
        let _ = self.runc(&["delete", "--force", &self.id]);
        if let Some(mut shim) = self.shim.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match shim.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = shim.kill();
                        let _ = shim.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        // runc removes the container's cgroups but leaves our parent behind,
        // in every hierarchy (v1 controllers, the v2 mount, or v2 alone).
        let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
        if let Ok(entries) = fs::read_dir("/sys/fs/cgroup") {
            roots.extend(entries.flatten().map(|e| e.path()));
        }
        for root in roots {
            let parent = root.join(&self.cgroup_parent);
            for dir in [parent.join(&self.id), parent] {
                for _ in 0..50 {
                    match fs::remove_dir(&dir) {
                        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        _ => break,
                    }
                }
            }
        }
    }
}

/// Reads a pipe to its end, failing after `timeout`.
fn read_to_eof(fd: OwnedFd, timeout: Duration) -> Result<String> {
    let mut file = File::from(fd);
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no EOF in time; read {:?}", String::from_utf8_lossy(&out)).into());
        }
        let mut pfd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one pollfd we own.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis() as libc::c_int) };
        if n <= 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match file.read(&mut buf)? {
            0 => return Ok(String::from_utf8(out)?),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// One CRI log record.
#[derive(Debug, PartialEq)]
struct Record {
    stream: String,
    tag: String,
    content: String,
}

fn is_rfc3339_nano_utc(ts: &str) -> bool {
    let b = ts.as_bytes();
    b.len() == 30
        && b.iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'.',
            29 => c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// Parses a CRI log, checking every line's shape.
fn records(text: &str) -> Vec<Record> {
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "log ends mid-line: {text:?}"
    );
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let (ts, stream, tag) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            let content = parts.next();
            assert!(is_rfc3339_nano_utc(ts), "bad timestamp in {line:?}");
            assert!(
                stream == "stdout" || stream == "stderr",
                "bad stream in {line:?}"
            );
            assert!(tag == "P" || tag == "F", "bad tag in {line:?}");
            let content = content.unwrap_or_else(|| panic!("no content separator in {line:?}"));
            Record {
                stream: stream.into(),
                tag: tag.into(),
                content: content.into(),
            }
        })
        .collect()
}

fn rec(stream: &str, tag: &str, content: &str) -> Record {
    Record {
        stream: stream.into(),
        tag: tag.into(),
        content: content.into(),
    }
}

fn of_stream(records: &[Record], stream: &str) -> Vec<(String, String)> {
    records
        .iter()
        .filter(|r| r.stream == stream)
        .map(|r| (r.tag.clone(), r.content.clone()))
        .collect()
}

fn pair(tag: &str, content: &str) -> (String, String) {
    (tag.into(), content.into())
}

/// Runs a container to completion and returns the exit record.
fn run_to_exit(fx: &mut Fixture) -> Result<ExitRecord> {
    fx.create()?;
    fx.start()?;
    let status = fx.wait_shim(WAIT)?;
    assert!(status.success(), "shim exited {status}; {}", fx.shim_log());
    fx.exit_record()
}

#[test]
fn shim_should_log_stdout_and_stderr_in_cri_format() -> Result {
    let script = "echo out1; echo err1 >&2; echo; echo out2; echo err2 >&2; printf partial";
    let mut fx = Fixture::new(Spec::new(&["sh", "-c", script]))?;
    let init_pid = fx.create()?;
    assert!(init_pid > 1);
    assert_eq!(
        fs::read_to_string(fx.bundle.join(INIT_PID_FILE))?.trim(),
        init_pid.to_string()
    );
    for fifo in [CTL_FIFO, ACK_FIFO] {
        use std::os::unix::fs::FileTypeExt;
        assert!(fs::metadata(fx.bundle.join(fifo))?.file_type().is_fifo());
    }
    // Nothing runs before runc start.
    assert_eq!(fx.log_text(&fx.log_path), "");
    fx.start()?;
    let status = fx.wait_shim(WAIT)?;
    assert!(status.success());
    assert_eq!(fx.exit_record()?.exit_code, 0);

    let text = fx.log_text(&fx.log_path);
    let records = records(&text);
    assert_eq!(
        of_stream(&records, "stdout"),
        vec![
            pair("F", "out1"),
            pair("F", ""),
            pair("F", "out2"),
            pair("P", "partial")
        ],
        "{text}"
    );
    assert_eq!(
        of_stream(&records, "stderr"),
        vec![pair("F", "err1"), pair("F", "err2")],
        "{text}"
    );
    Ok(())
}

#[test]
fn shim_should_split_long_lines_into_partial_records() -> Result {
    // 40000 'a's and a newline, then a short line.
    let script = "head -c 40000 /dev/zero | tr '\\0' a; echo; echo short";
    let mut fx = Fixture::new(Spec::new(&["sh", "-c", script]))?;
    run_to_exit(&mut fx)?;
    let records = records(&fx.log_text(&fx.log_path));
    let tail = 40_000 - 2 * MAX_LOG_LINE;
    let expected = vec![
        rec("stdout", "P", &"a".repeat(MAX_LOG_LINE)),
        rec("stdout", "P", &"a".repeat(MAX_LOG_LINE)),
        rec("stdout", "F", &"a".repeat(tail)),
        rec("stdout", "F", "short"),
    ];
    assert_eq!(records.len(), expected.len());
    for (got, want) in records.iter().zip(&expected) {
        assert_eq!(
            (
                got.tag.as_str(),
                got.content.len(),
                got.content == want.content
            ),
            (want.tag.as_str(), want.content.len(), true)
        );
    }
    Ok(())
}

#[test]
fn shim_should_record_the_exit_code_and_time() -> Result {
    let mut fx = Fixture::new(Spec::new(&["sh", "-c", "exit 3"]))?;
    fx.create()?;
    let before = now_ns();
    fx.start()?;
    let status = fx.wait_shim(WAIT)?;
    let after = now_ns();
    assert!(status.success());
    let record = fx.exit_record()?;
    assert_eq!(record.exit_code, 3);
    assert!(
        (before..=after).contains(&record.exited_at_ns),
        "{before} <= {} <= {after}",
        record.exited_at_ns
    );
    assert!(!fx.bundle.join(EXIT_TMP_FILE).exists());
    Ok(())
}

#[test]
fn shim_should_record_sigkill_as_137() -> Result {
    let mut fx = Fixture::new(Spec::new(&["sleep", "1000"]))?;
    fx.create()?;
    fx.start()?;
    fx.runc_ok(&["kill", &fx.id, "KILL"])?;
    assert!(fx.wait_shim(WAIT)?.success());
    assert_eq!(fx.exit_record()?.exit_code, 137);
    Ok(())
}

fn pidfd_open(pid: libc::pid_t) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[test]
fn exit_file_should_be_complete_when_the_shim_exits() -> Result {
    // As the runtime does: a pidfd on the shim; when it is readable the
    // shim is dead and the exit file must be whole.
    let mut fx = Fixture::new(Spec::new(&["sh", "-c", "echo bye; exit 7"]))?;
    fx.create()?;
    let pidfd = pidfd_open(fx.shim_pid()?)?;
    assert!(!fx.bundle.join(EXIT_FILE).exists());
    fx.start()?;
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd we own.
    let n = unsafe { libc::poll(&mut pfd, 1, WAIT.as_millis() as libc::c_int) };
    assert_eq!(n, 1, "shim did not exit");
    // Read before reaping: the shim is a zombie now, nothing can still write.
    let record = fx.exit_record()?;
    assert_eq!(record.exit_code, 7);
    assert!(!fx.bundle.join(EXIT_TMP_FILE).exists());
    assert!(fx.wait_shim(WAIT)?.success());
    Ok(())
}

/// Writes a raw line to the control FIFO and returns the answer.
fn raw_command(bundle: &Path, line: &[u8]) -> Result<String> {
    let ack = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(bundle.join(ACK_FIFO))?;
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(bundle.join(CTL_FIFO))?
        .write_all(line)?;
    read_to_eof(ack.into(), WAIT)
}

#[test]
fn reopen_log_should_switch_to_the_new_file_and_close_stdin_should_end_cat() -> Result {
    let mut spec = Spec::new(&["cat"]);
    spec.stdin = true;
    let mut fx = Fixture::new(spec)?;
    fx.create()?;
    fx.start()?;
    // Attach to stdin the way the runtime does.
    let stdin_path = format!("/proc/{}/fd/{STDIN_FD}", fx.shim_pid()?);
    let mut stdin = OpenOptions::new().write(true).open(&stdin_path)?;
    stdin.write_all(b"before\n")?;
    let log = fx.log_path.clone();
    fx.wait_log(&log, |t| t.contains("before"))?;

    let rotated = log.with_extension("log.1");
    fs::rename(&log, &rotated)?;
    send_command(&fx.bundle, petrel_shim::Command::ReopenLog, WAIT)?;
    assert!(log.exists(), "reopen-log did not create the new file");
    stdin.write_all(b"after\n")?;
    let new = fx.wait_log(&log, |t| t.contains("after"))?;
    assert_eq!(records(&new), vec![rec("stdout", "F", "after")]);
    assert_eq!(
        records(&fx.log_text(&rotated)),
        vec![rec("stdout", "F", "before")]
    );

    // Unknown and overlong commands are refused, the shim carries on.
    assert_eq!(
        raw_command(&fx.bundle, b"bogus\n")?,
        "error unknown command\n"
    );
    let long = [b'x'; 200];
    assert_eq!(
        raw_command(&fx.bundle, &[&long[..], b"\n"].concat())?,
        "error command too long\n"
    );

    // cat ends at EOF once both we and the shim closed stdin.
    drop(stdin);
    assert!(fx.shim_alive()?);
    send_command(&fx.bundle, petrel_shim::Command::CloseStdin, WAIT)?;
    assert!(fx.wait_shim(WAIT)?.success());
    assert_eq!(fx.exit_record()?.exit_code, 0);
    // The shim is gone: commands fail fast rather than hang.
    let err = send_command(&fx.bundle, petrel_shim::Command::ReopenLog, WAIT)
        .expect_err("no shim to answer");
    assert_eq!(err.kind(), io::ErrorKind::NotConnected);
    Ok(())
}

#[test]
fn shim_should_survive_sigterm_sigint_and_sighup() -> Result {
    let mut fx = Fixture::new(Spec::new(&["sleep", "1000"]))?;
    fx.create()?;
    fx.start()?;
    let pid = fx.shim_pid()?;
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGPIPE] {
        // SAFETY: kill(2) to our own child, which is not reaped yet.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(fx.shim_alive()?, "shim died of a signal");
    assert!(
        fx.shim_log().contains("ignoring signal 15"),
        "{}",
        fx.shim_log()
    );
    // Its own session: the runtime's process group can die without it.
    // SAFETY: getsid on a pid we own.
    assert_eq!(unsafe { libc::getsid(pid) }, pid);
    fx.runc_ok(&["kill", &fx.id, "KILL"])?;
    assert!(fx.wait_shim(WAIT)?.success());
    assert_eq!(fx.exit_record()?.exit_code, 137);
    Ok(())
}

#[test]
fn container_should_start_with_default_signal_handling() -> Result {
    // The shim blocks signals; its children must not inherit that.
    let mut fx = Fixture::new(Spec::new(&["sleep", "1000"]))?;
    let init_pid = fx.create()?;
    fx.start()?;
    let status = fs::read_to_string(format!("/proc/{init_pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .map(str::to_owned)
    };
    assert_eq!(field("SigBlk:").as_deref(), Some("0000000000000000"));
    assert_eq!(field("SigIgn:").as_deref(), Some("0000000000000000"));
    Ok(())
}

fn assert_nothing_left(fx: &Fixture) -> Result {
    assert!(!fx.container_listed()?, "runc still lists {}", fx.id);
    assert!(!fx.bundle.join(INIT_PID_FILE).exists());
    Ok(())
}

#[test]
fn failed_create_should_answer_error_and_leave_nothing() -> Result {
    let mut fx = Fixture::new(Spec::new(&["/no/such/binary"]))?;
    let handshake = fx.spawn_shim()?;
    let Handshake::Error(msg) = handshake else {
        return Err(format!("expected an error, got {handshake:?}").into());
    };
    assert!(msg.contains("/no/such/binary"), "{msg}");
    assert!(msg.contains("no such file"), "{msg}");
    let status = fx.wait_shim(WAIT)?;
    assert_eq!(status.code(), Some(1));
    assert_nothing_left(&fx)
}

#[test]
fn a_shim_whose_runtime_is_gone_should_undo_the_create_and_exit() -> Result {
    let mut fx = Fixture::new(Spec::new(&["sleep", "1000"]))?;
    // The runtime dies before it reads the answer: the read end is closed
    // while runc create runs.
    let mut child = fx.shim_command()?.spawn()?;
    drop(child.stdout.take());
    fx.shim = Some(child);
    let status = fx.wait_shim(WAIT)?;
    assert_eq!(status.code(), Some(1), "{}", fx.shim_log());
    assert!(
        fx.shim_log().contains("write handshake"),
        "{}",
        fx.shim_log()
    );
    assert!(!fx.bundle.join(EXIT_FILE).exists(), "no exit is recorded");
    assert_nothing_left(&fx)
}

#[test]
fn bad_config_should_answer_error_and_leave_nothing() -> Result {
    let mut fx = Fixture::new(Spec::new(&["true"]))?;
    fs::write(fx.bundle.join("config.json"), "{ not json")?;
    let Handshake::Error(msg) = fx.spawn_shim()? else {
        return Err("expected an error".into());
    };
    // runc's own words for a config.json that does not parse.
    assert!(msg.contains("invalid character"), "{msg}");
    assert_eq!(fx.wait_shim(WAIT)?.code(), Some(1));
    assert_nothing_left(&fx)
}

#[test]
fn missing_runc_should_answer_error() -> Result {
    let mut fx = Fixture::new(Spec::new(&["true"]))?;
    fx.runc_bin = "/no/runc".into();
    let Handshake::Error(msg) = fx.spawn_shim()? else {
        return Err("expected an error".into());
    };
    assert!(msg.starts_with("run /no/runc: "), "{msg}");
    assert_eq!(fx.wait_shim(WAIT)?.code(), Some(1));
    Ok(())
}

#[test]
fn unopenable_log_should_fail_before_create() -> Result {
    let mut fx = Fixture::new(Spec::new(&["true"]))?;
    fx.log_path = fx.bundle.join("missing-dir/0.log");
    let Handshake::Error(msg) = fx.spawn_shim()? else {
        return Err("expected an error".into());
    };
    assert!(msg.starts_with("open log file"), "{msg}");
    assert!(msg.contains("missing-dir"), "{msg}");
    assert_eq!(fx.wait_shim(WAIT)?.code(), Some(1));
    assert_nothing_left(&fx)?;
    // runc was never asked: it has not even made its state directory.
    assert!(!fx.runc_root.join(&fx.id).exists());
    Ok(())
}

#[test]
fn bad_arguments_should_exit_2() -> Result {
    let out = Command::new(SHIM)
        .args(["--id", "x", "--bogus"])
        .stdin(Stdio::null())
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown argument \"--bogus\""), "{stderr}");
    assert!(stderr.contains("usage:"), "{stderr}");
    let out = Command::new(SHIM).stdin(Stdio::null()).output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing required option --id"));
    Ok(())
}

#[test]
fn tty_output_should_be_logged_as_stdout() -> Result {
    let mut spec = Spec::new(&["sh", "-c", "echo hello-tty; echo err-tty >&2; printf end"]);
    spec.tty = true;
    let mut fx = Fixture::new(spec)?;
    run_to_exit(&mut fx)?;
    let records = records(&fx.log_text(&fx.log_path));
    assert_eq!(
        records,
        vec![
            rec("stdout", "F", "hello-tty"),
            rec("stdout", "F", "err-tty"),
            rec("stdout", "P", "end"),
        ]
    );
    assert!(!fx.bundle.join(petrel_shim::CONSOLE_SOCKET).exists());
    Ok(())
}

/// (utime + stime, voluntary + involuntary context switches) of a process.
fn cpu_and_wakeups(pid: libc::pid_t) -> Result<(u64, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which ends with the last ')').
    let rest = &stat[stat.rfind(')').ok_or("bad stat")? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let cpu = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mut switches = 0;
    for line in status.lines() {
        if let Some(v) = line
            .strip_prefix("voluntary_ctxt_switches:")
            .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
        {
            switches += v.trim().parse::<u64>()?;
        }
    }
    Ok((cpu, switches))
}

#[test]
fn idle_shim_should_not_use_cpu_or_wake_up() -> Result {
    let mut fx = Fixture::new(Spec::new(&["sleep", "1000"]))?;
    fx.create()?;
    fx.start()?;
    let pid = fx.shim_pid()?;
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_and_wakeups(pid)?;
    std::thread::sleep(Duration::from_millis(1500));
    let after = cpu_and_wakeups(pid)?;
    assert_eq!(before.0, after.0, "cpu ticks grew while idle");
    assert_eq!(before.1, after.1, "the shim woke up while idle");
    let rss = fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    eprintln!("idle shim (debug build):\n{rss}");
    Ok(())
}

#[test]
fn deleting_a_created_container_should_end_the_shim() -> Result {
    let mut fx = Fixture::new(Spec::new(&["sleep", "1000"]))?;
    fx.create()?;
    // Never started: the runtime removes it.
    fx.runc_ok(&["delete", "--force", &fx.id])?;
    assert!(fx.wait_shim(WAIT)?.success());
    assert_eq!(fx.exit_record()?.exit_code, 137);
    Ok(())
}

#[test]
fn output_held_open_should_delay_the_exit_at_most_a_second() -> Result {
    let mut fx = Fixture::new(Spec::new(&["sleep", "1000"]))?;
    let init_pid = fx.create()?;
    fx.start()?;
    // Hold the container's stdout pipe open, as an escaped process would.
    let mut holder = OpenOptions::new()
        .write(true)
        .open(format!("/proc/{init_pid}/fd/1"))?;
    // Timed from before the kill: init may die well before a slow `runc
    // kill` returns, and the shim's drain second starts at the death.
    let killed = Instant::now();
    fx.runc_ok(&["kill", &fx.id, "KILL"])?;
    // Output after init's death is still logged while the shim drains.
    std::thread::sleep(Duration::from_millis(100));
    holder.write_all(b"late line\nunterminated")?;
    let status = fx.wait_shim(Duration::from_secs(5))?;
    let waited = killed.elapsed();
    drop(holder);
    assert!(status.success());
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(2500),
        "shim exited {waited:?} after the kill"
    );
    assert_eq!(fx.exit_record()?.exit_code, 137);
    assert_eq!(
        records(&fx.log_text(&fx.log_path)),
        vec![
            rec("stdout", "F", "late line"),
            rec("stdout", "P", "unterminated")
        ]
    );
    Ok(())
}

#[test]
fn shim_without_log_should_drain_and_discard_output() -> Result {
    let script = "yes 0123456789abcdef | head -c 4000000; echo done >&2";
    let args = ["sh", "-c", script];
    let mut spec = Spec::new(&args);
    spec.log = false;
    let mut fx = Fixture::new(spec)?;
    assert_eq!(run_to_exit(&mut fx)?.exit_code, 0);
    assert!(!fx.log_path.exists());
    Ok(())
}

/// Kills and reaps a pid-holder init on every path.
struct Holder(libc::pid_t);

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: kill and waitpid on the one pid this guard owns; we are its
        // reaper (child subreaper), so waitpid returns once it is dead.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

#[test]
fn pid_holder_should_hold_a_pid_namespace_and_reap_its_orphans() -> Result {
    require_root();
    // The holder's init outlives its parent: be its reaper so the test can
    // reap it (PID 1 of this machine does not).
    // SAFETY: prctl with integer arguments.
    assert_eq!(
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) },
        0
    );
    let mut parent = Command::new(SHIM)
        .arg(petrel_shim::PID_HOLDER_FLAG)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = parent.stdout.take().ok_or("no stdout")?;
    let text = read_to_eof(stdout.into(), WAIT)?;
    assert!(parent.wait()?.success());
    let holder = Holder(text.trim().parse()?);
    let pid = holder.0;

    // pid 1 of its own namespace, in its own session.
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .ok_or("no NSpid")?;
    assert_eq!(
        nspid.split_whitespace().collect::<Vec<_>>(),
        vec!["NSpid:", &pid.to_string(), "1"]
    );
    // SAFETY: getsid on a live pid.
    assert_eq!(unsafe { libc::getsid(pid) }, pid);

    // A process entering the namespace leaves an orphan, which the holder reaps.
    let entered = Command::new("nsenter")
        .args([
            "--target",
            &pid.to_string(),
            "--pid",
            "--",
            BUSYBOX,
            "sh",
            "-c",
        ])
        .arg(format!("{BUSYBOX} sleep 0.2 & exit 0"))
        .status()?;
    assert!(entered.success());
    let children = format!("/proc/{pid}/task/{pid}/children");
    assert_ne!(
        fs::read_to_string(&children)?.trim(),
        "",
        "orphan not adopted"
    );
    let deadline = Instant::now() + WAIT;
    while !fs::read_to_string(&children)?.trim().is_empty() {
        assert!(Instant::now() < deadline, "orphan not reaped");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Idle, and deaf to SIGTERM.
    let before = cpu_and_wakeups(pid)?;
    // SAFETY: kill on the pid this test owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    std::thread::sleep(Duration::from_millis(500));
    let after = cpu_and_wakeups(pid)?;
    assert_eq!(before, after);

    drop(holder);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    Ok(())
}
