//! `petrel-shim`: one small process per container. It creates the container
//! through `runc create`, holds its stdio, writes the CRI log, serves
//! commands on a FIFO and records the container's exit. See the library
//! (`petrel_shim`) for the contract with the runtime.
//!
//! One thread, one `poll(2)` loop without a timeout while the container runs:
//! an idle shim costs no CPU, and its memory is a few pages of buffers.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use petrel_shim::time;
use petrel_shim::{
    attach, Command, ExitRecord, Handshake, ACK_FIFO, ATTACH_SOCKET, CTL_FIFO, EXIT_FILE,
    EXIT_TMP_FILE, INIT_PID_FILE, PID_HOLDER_FLAG, SHIM_LOG, STDIN_FD,
};

/// Writes a diagnostic line to standard error (the bundle's `shim.log`).
macro_rules! diag {
    ($($arg:tt)*) => {
        $crate::diag_write(format_args!($($arg)*))
    };
}

mod args;
mod clients;
mod console;
mod log;
mod oom;
mod pid_holder;
mod runc;
mod sys;

use args::Args;
use clients::{AttachServer, Request, MAX_CLIENTS};
use console::ConsoleSocket;
use log::{LineSplitter, LogFile, Stream};
use runc::{CreateStdio, Runc};

/// CRIU's work directory of a restore, in the bundle (`restore.log`).
const RESTORE_WORK_DIR: &str = "criu-restore";
/// Size of the one buffer container output is read into.
const READ_BUF: usize = 16 * 1024;
/// How long output is still drained after the container's init exited
/// (processes that escaped into a shared PID namespace may hold the pipes).
const DRAIN_AFTER_EXIT_NS: i64 = 1_000_000_000;
/// Longest command line accepted on the control FIFO.
const MAX_COMMAND: usize = 64;
/// Poll slots before the attach clients': signalfd, control FIFO, two
/// outputs, the attach listener, the container's input, the OOM watch.
const FIXED_FDS: usize = 7;

fn diag_write(args: fmt::Arguments<'_>) {
    let mut ts = [0u8; time::TIMESTAMP_LEN];
    time::format_rfc3339_nano(time::realtime_ns(), &mut ts);
    let ts = std::str::from_utf8(&ts).unwrap_or_default();
    // Nothing sensible is left to do if standard error is gone.
    let _ = writeln!(io::stderr().lock(), "{ts} petrel-shim: {args}");
}

fn main() {
    let argv: Vec<_> = std::env::args_os().skip(1).collect();
    // `--pid-holder [<user namespace file>]`.
    if argv.len() <= 2 && argv.first().is_some_and(|a| a == PID_HOLDER_FLAG) {
        let userns = argv.get(1).map(std::path::Path::new);
        std::process::exit(pid_holder::run(userns));
    }
    let args = match args::parse(std::env::args_os().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("petrel-shim: {e}\n{}", args::USAGE);
            let _ = handshake(&Handshake::Error(format!("invalid arguments: {e}")));
            std::process::exit(2);
        }
    };
    let code = match start(args) {
        Ok(shim) => {
            let answered = handshake(&Handshake::Ok {
                init_pid: shim.init_pid.unsigned_abs(),
            });
            if answered.is_err() {
                // The runtime that asked is gone (killed before it read
                // the answer): no record will ever name this container, so
                // it is undone rather than kept for nobody. A restarted
                // runtime waits for this before it sweeps the bundle.
                shim.abandon();
                std::process::exit(1);
            }
            // The runtime reads the handshake to its end.
            match sys::open_raw(Path::new("/dev/null"), libc::O_WRONLY) {
                Ok(null) => {
                    if let Err(e) = sys::replace_fd(&null, libc::STDOUT_FILENO) {
                        diag!("redirect standard output: {e}");
                    }
                }
                Err(e) => diag!("open /dev/null: {e}"),
            }
            sys::drop_startup_code_pages();
            shim.serve()
        }
        Err(msg) => {
            diag!("{msg}");
            let _ = handshake(&Handshake::Error(msg));
            1
        }
    };
    std::process::exit(code);
}

/// Writes the handshake line to standard output.
fn handshake(h: &Handshake) -> io::Result<()> {
    let written = sys::write_all_fd(libc::STDOUT_FILENO, h.to_string().as_bytes());
    if let Err(e) = &written {
        diag!("write handshake: {e}");
    }
    written
}

/// One output stream of the container being copied into the log.
struct Output {
    file: File,
    splitter: LineSplitter,
}

impl Output {
    fn new(fd: OwnedFd, stream: Stream) -> io::Result<Self> {
        sys::set_nonblocking(&fd)?;
        Ok(Self {
            file: File::from(fd),
            splitter: LineSplitter::new(stream),
        })
    }
}

/// The container's input: the write end of its stdin pipe (`--stdin`), or
/// its terminal. Written without blocking; input that the container does not
/// take yet waits here, and while it waits no client's input is read.
struct Input {
    /// Where input goes; `None` without stdin, or once closed.
    target: Option<File>,
    /// The terminal (a duplicate of the master), for resizes.
    terminal: Option<File>,
    /// Close the input when a client carrying it ends it (`--stdin-once`).
    stdin_once: bool,
    pending: Vec<u8>,
    close_when_flushed: bool,
}

impl Input {
    /// Whether more input can be taken now.
    fn wants_more(&self) -> bool {
        self.pending.is_empty()
    }

    fn push(&mut self, data: &[u8]) {
        // Without a target (no stdin, or closed) input is discarded.
        if self.target.is_some() && !self.close_when_flushed {
            self.pending.extend_from_slice(data);
            self.flush();
        }
    }

    /// Writes what is pending as far as the container takes it.
    fn flush(&mut self) {
        if let Some(target) = &self.target {
            while !self.pending.is_empty() {
                match (&*target).write(&self.pending) {
                    Ok(n) => {
                        self.pending.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) => {
                        // EPIPE: nothing reads the container's stdin any more.
                        if e.raw_os_error() != Some(libc::EPIPE) {
                            diag!("write container input: {e}");
                        }
                        self.pending.clear();
                    }
                }
            }
        }
        self.pending = Vec::new();
        if self.close_when_flushed {
            self.target = None;
        }
    }

    /// A client carrying input ended it.
    fn ended(&mut self) {
        if self.stdin_once {
            self.close_when_flushed = true;
            self.flush();
        }
    }

    /// Closes the input at once ([`Command::CloseStdin`]).
    fn close(&mut self) {
        self.pending = Vec::new();
        self.target = None;
    }

    fn resize(&self, width: u16, height: u16) {
        let Some(terminal) = &self.terminal else {
            return;
        };
        let size = libc::winsize {
            ws_row: height,
            ws_col: width,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads the winsize we pass, on a terminal we hold.
        if unsafe { libc::ioctl(terminal.as_raw_fd(), libc::TIOCSWINSZ, &size) } != 0 {
            diag!("resize terminal: {}", io::Error::last_os_error());
        }
    }

    fn request(&mut self, request: Request<'_>) {
        match request {
            Request::Input(data) => self.push(data),
            Request::InputEnded => self.ended(),
            Request::Resize(width, height) => self.resize(width, height),
        }
    }
}

/// What undoing the create needs: runc and the container's id.
struct CreatedBy {
    runc_bin: PathBuf,
    runc_root: PathBuf,
    systemd_cgroup: bool,
    log: PathBuf,
    id: std::ffi::OsString,
}

/// The shim once the container is created.
struct Shim {
    init_pid: libc::pid_t,
    created_by: CreatedBy,
    log: Option<LogFile>,
    sigfd: File,
    ctl: File,
    /// stdout and stderr, or the terminal master alone; `None` after EOF.
    outputs: [Option<Output>; 2],
    /// Where attach clients' input goes.
    input: Input,
    /// Attach clients; `None` when the socket could not be bound (the
    /// container runs, it cannot be attached to).
    attach: Option<AttachServer>,
    /// The OOM kills in the container's cgroup (cgroup v2); `None` where
    /// they cannot be watched.
    oom: Option<oom::HostOomWatch>,
    command: [u8; MAX_COMMAND],
    command_len: usize,
    command_overlong: bool,
}

/// The container's init has exited.
#[derive(Clone, Copy)]
struct Exited {
    record: ExitRecord,
    /// Monotonic time after which output is no longer waited for.
    drain_deadline: i64,
}

/// Makes `path` absolute against the shim's starting directory, since the
/// shim moves into the bundle.
fn absolute(cwd: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    }
}

/// Creates the container's stdin pipe with our write end at [`STDIN_FD`],
/// where the runtime finds it to attach.
fn stdin_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = sys::pipe()?;
    let read = if read.as_raw_fd() == STDIN_FD {
        let moved = sys::dup_above(&read, STDIN_FD + 1)?;
        drop(read);
        moved
    } else {
        read
    };
    let write = if write.as_raw_fd() == STDIN_FD {
        write
    } else {
        let fixed = sys::dup_to(&write, STDIN_FD)?;
        drop(write);
        fixed
    };
    Ok((read, write))
}

/// Sets the process up, creates the container and returns the shim ready to
/// serve; on failure the message for the handshake (nothing of the container
/// remains).
fn start(args: Args) -> Result<Shim, String> {
    // First, so that nothing else has taken STDIN_FD.
    let stdin_pipe = if args.stdin && !args.tty {
        Some(stdin_pipe().map_err(|e| format!("create stdin pipe: {e}"))?)
    } else {
        None
    };

    let cwd = std::env::current_dir().map_err(|e| format!("get working directory: {e}"))?;
    let bundle = absolute(&cwd, &args.bundle);
    let runc_root = absolute(&cwd, &args.runc_root);
    // A bare name is looked up in PATH.
    let runc_bin = if args.runc.as_os_str().as_bytes().contains(&b'/') {
        absolute(&cwd, &args.runc)
    } else {
        args.runc.clone()
    };
    let log_path = args.log_path.as_deref().map(|p| absolute(&cwd, p));

    // 1. Outlive the runtime: own session, reaper of the container's
    //    processes, signals read from a signalfd (SIGTERM/INT/HUP only noted).
    if let Err(e) = sys::setsid() {
        diag!("setsid: {e}");
    }
    sys::set_child_subreaper().map_err(|e| format!("become child subreaper: {e}"))?;
    std::env::set_current_dir(&bundle)
        .map_err(|e| format!("enter bundle {}: {e}", bundle.display()))?;
    sys::ignore_signal(libc::SIGPIPE);
    let sigfd =
        sys::block_into_signalfd(&[libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
            .map_err(|e| format!("create signalfd: {e}"))?;

    // The log must be writable before there is a container to log.
    let log = match &log_path {
        Some(path) => Some(
            LogFile::open(path.clone())
                .map_err(|e| format!("open log file {}: {e}", path.display()))?,
        ),
        None => None,
    };

    // 2. The control FIFO (read-write: never EOF without a writer) and the
    //    acknowledgement FIFO.
    sys::mkfifo_fresh(Path::new(CTL_FIFO)).map_err(|e| format!("create fifo {CTL_FIFO}: {e}"))?;
    let ctl = sys::open_raw(Path::new(CTL_FIFO), libc::O_RDWR | libc::O_NONBLOCK)
        .map_err(|e| format!("open fifo {CTL_FIFO}: {e}"))?;
    sys::mkfifo_fresh(Path::new(ACK_FIFO)).map_err(|e| format!("create fifo {ACK_FIFO}: {e}"))?;

    if args.restore_from.is_some() && args.tty {
        // runc restores a terminal only for shell jobs, which a container is not.
        return Err("a container with a terminal cannot be restored".into());
    }

    // 3. The container's stdio.
    let mut outputs: [Option<Output>; 2] = [None, None];
    let mut stdin = None;
    let mut console = None;
    let stdio = if args.tty {
        console = Some(ConsoleSocket::bind().map_err(|e| format!("bind console socket: {e}"))?);
        CreateStdio {
            stdin: Stdio::null(),
            stdout: Stdio::null(),
            stderr: Stdio::null(),
        }
    } else {
        let pipes = || -> io::Result<_> {
            let (out_r, out_w) = sys::pipe()?;
            let (err_r, err_w) = sys::pipe()?;
            Ok((
                Output::new(out_r, Stream::Stdout)?,
                out_w,
                Output::new(err_r, Stream::Stderr)?,
                err_w,
            ))
        };
        let (out, out_w, err, err_w) = pipes().map_err(|e| format!("create stdio pipes: {e}"))?;
        outputs = [Some(out), Some(err)];
        let container_stdin = match stdin_pipe {
            Some((read, write)) => {
                stdin = Some(write);
                Stdio::from(read)
            }
            None => Stdio::null(),
        };
        CreateStdio {
            stdin: container_stdin,
            stdout: out_w.into(),
            stderr: err_w.into(),
        }
    };

    // 4. runc create; the container-side ends are closed once it runs.
    let runc = Runc {
        bin: &runc_bin,
        root: &runc_root,
        log: bundle.join(SHIM_LOG),
        systemd_cgroup: args.systemd_cgroup,
    };
    let log_offset = std::fs::metadata(SHIM_LOG).map(|m| m.len()).unwrap_or(0);
    let restore_work = bundle.join(RESTORE_WORK_DIR);
    let restore = args.restore_from.as_ref().map(|images| runc::Restore {
        images,
        work: &restore_work,
        criu: args.criu.as_deref(),
    });
    let status = match &restore {
        None => runc.create(&bundle, &args.id, args.tty, stdio),
        Some(restore) => runc.restore(&bundle, &args.id, restore, stdio),
    }
    .map_err(|e| format!("run {}: {e}", runc_bin.display()))?;
    if !status.success() {
        let mut msg = runc::last_logged_error(&runc.log, log_offset);
        if restore.is_some() {
            // runc says only that CRIU failed; CRIU's log says why.
            let criu = runc::last_criu_error(&restore_work.join("restore.log"));
            msg = match (msg, criu) {
                (Some(m), Some(c)) => Some(format!("{m}: {c}")),
                (m, c) => m.or(c),
            };
        }
        if msg.is_none() {
            // runc also prints its error to its stderr, the container's.
            if let Some(err) = &mut outputs[1] {
                let mut text = [0u8; 4096];
                let n = err.file.read(&mut text).unwrap_or(0);
                msg = runc::last_line(&String::from_utf8_lossy(&text[..n]));
            }
        }
        let what = if restore.is_some() {
            "restore"
        } else {
            "create"
        };
        let msg = msg.unwrap_or_else(|| format!("runc {what} failed ({status})"));
        return Err(undo_create(&runc, &args.id, msg));
    }
    if let Some(console) = console {
        let master = console
            .receive_master()
            .and_then(|fd| Output::new(fd, Stream::Stdout));
        match master {
            Ok(master) => outputs[0] = Some(master),
            Err(e) => {
                return Err(undo_create(
                    &runc,
                    &args.id,
                    format!("receive terminal: {e}"),
                ))
            }
        }
    }

    // 5. The init pid.
    let init_pid = match read_init_pid() {
        Ok(pid) => pid,
        Err(e) => {
            return Err(undo_create(
                &runc,
                &args.id,
                format!("read {INIT_PID_FILE}: {e}"),
            ))
        }
    };

    // 6. The OOM watch on the container's cgroup, now that init is in it.
    let oom = oom::HostOomWatch::start(init_pid);

    // 7. Attach clients and their input.
    let terminal = match outputs[0].as_ref().filter(|_| args.tty) {
        Some(master) => match master.file.try_clone() {
            Ok(dup) => Some(dup),
            Err(e) => {
                diag!("duplicate terminal: {e}");
                None
            }
        },
        None => None,
    };
    let target = match stdin {
        Some(fd) => match sys::set_nonblocking(&fd) {
            Ok(()) => Some(File::from(fd)),
            Err(e) => {
                diag!("stdin pipe: {e}");
                None
            }
        },
        None if args.stdin => terminal.as_ref().and_then(|t| t.try_clone().ok()),
        None => None,
    };
    let attach = match AttachServer::bind() {
        Ok(server) => Some(server),
        Err(e) => {
            diag!("bind {ATTACH_SOCKET}: {e}; attach is not available");
            None
        }
    };

    Ok(Shim {
        init_pid,
        created_by: CreatedBy {
            runc_bin: runc_bin.clone(),
            runc_root: runc_root.clone(),
            systemd_cgroup: args.systemd_cgroup,
            log: runc.log.clone(),
            id: args.id.clone(),
        },
        log,
        sigfd,
        ctl,
        outputs,
        input: Input {
            target,
            terminal,
            stdin_once: args.stdin_once,
            pending: Vec::new(),
            close_when_flushed: false,
        },
        attach,
        oom,
        command: [0; MAX_COMMAND],
        command_len: 0,
        command_overlong: false,
    })
}

fn read_init_pid() -> io::Result<libc::pid_t> {
    let text = std::fs::read_to_string(INIT_PID_FILE)?;
    text.trim()
        .parse()
        .ok()
        .filter(|&pid: &libc::pid_t| pid > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad pid {text:?}")))
}

/// Removes what a failed create may have left; returns `msg`.
fn undo_create(runc: &Runc<'_>, id: &std::ffi::OsStr, msg: String) -> String {
    match runc.delete_force(id) {
        // A container that was never created is not an error here.
        Ok(_) => {}
        Err(e) => diag!("run runc delete: {e}"),
    }
    let _ = std::fs::remove_file(INIT_PID_FILE);
    // Reap what runc left to us (a killed init may take a moment to die),
    // so that no zombie is handed on when we exit.
    let deadline = time::monotonic_ns() + 2 * DRAIN_AFTER_EXIT_NS;
    while sys::has_children() && time::monotonic_ns() < deadline {
        while sys::reap_any().is_some() {}
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    msg
}

impl Shim {
    /// Undoes the create (`runc delete --force`, the init reaped) because
    /// nobody received the handshake; no exit is recorded.
    fn abandon(self) {
        let by = &self.created_by;
        let runc = Runc {
            bin: &by.runc_bin,
            root: &by.runc_root,
            log: by.log.clone(),
            systemd_cgroup: by.systemd_cgroup,
        };
        undo_create(&runc, &by.id, String::new());
    }

    /// Runs until the container's init has exited and its output is drained;
    /// records the exit and returns the shim's exit code.
    fn serve(mut self) -> i32 {
        let mut buf = [0u8; READ_BUF];
        let mut exited = None;
        // Children may have exited while runc create ran.
        self.reap(&mut exited);
        loop {
            let timeout = match exited {
                None => -1,
                Some(Exited { drain_deadline, .. }) => {
                    if self.outputs.iter().all(Option::is_none) {
                        break;
                    }
                    let left = drain_deadline - time::monotonic_ns();
                    if left <= 0 {
                        break;
                    }
                    // Whole milliseconds, rounded up: never wake early.
                    ((left + 999_999) / 1_000_000) as libc::c_int
                }
            };
            let fd = |raw: Option<i32>, events: libc::c_short| libc::pollfd {
                fd: raw.unwrap_or(-1),
                events,
                revents: 0,
            };
            let raw = |file: Option<&File>| file.map(AsRawFd::as_raw_fd);
            let want_input = self.input.wants_more();
            let mut fds = [fd(None, 0); FIXED_FDS + MAX_CLIENTS];
            fds[0] = fd(raw(Some(&self.sigfd)), libc::POLLIN);
            fds[1] = fd(raw(Some(&self.ctl)), libc::POLLIN);
            fds[2] = fd(raw(self.outputs[0].as_ref().map(|o| &o.file)), libc::POLLIN);
            fds[3] = fd(raw(self.outputs[1].as_ref().map(|o| &o.file)), libc::POLLIN);
            fds[4] = fd(
                self.attach.as_ref().map(AttachServer::listener_fd),
                libc::POLLIN,
            );
            if !want_input {
                fds[5] = fd(raw(self.input.target.as_ref()), libc::POLLOUT);
            }
            fds[6] = fd(
                self.oom.as_ref().map(|o| o.inotify.as_raw_fd()),
                libc::POLLIN,
            );
            if let Some(attach) = &self.attach {
                attach.fill_pollfds(&mut fds[FIXED_FDS..], want_input);
            }
            if let Err(e) = sys::poll(&mut fds, timeout) {
                // Only possible with no memory left; do not spin.
                diag!("poll: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
            if fds[6].revents != 0 {
                if let Some(oom) = &mut self.oom {
                    oom.notified();
                }
            }
            if fds[0].revents != 0 {
                self.signals(&mut exited);
            }
            for (i, pfd) in fds[2..4].iter().enumerate() {
                if pfd.revents != 0 {
                    self.read_output(i, &mut buf);
                }
            }
            if fds[5].revents != 0 {
                self.input.flush();
            }
            if let Some(attach) = &mut self.attach {
                let input = &mut self.input;
                for (i, pfd) in fds[FIXED_FDS..].iter().enumerate() {
                    if pfd.revents != 0 {
                        let want = input.wants_more();
                        attach.serve_client(i, pfd.revents, want, &mut |r| input.request(r));
                    }
                }
                if fds[4].revents != 0 {
                    attach.accept();
                }
            }
            if fds[1].revents != 0 {
                self.commands();
            }
        }
        if let Some(attach) = &mut self.attach {
            attach.finish();
        }

        // Unterminated lines end as partial records.
        for output in &mut self.outputs {
            if let (Some(out), Some(log)) = (output.take(), &mut self.log) {
                let mut out = out;
                out.splitter.finish(log);
                log.flush();
            }
        }
        self.reap(&mut exited);
        let Some(mut exited) = exited else {
            // The loop only ends after init exited.
            return 1;
        };
        if let Some(oom) = &self.oom {
            exited.record.oom_killed = oom.watch.verdict();
            if exited.record.oom_killed.is_none() {
                diag!("OOM kills unknown: the container's cgroup was gone before its last read");
            }
        }
        match write_exit_record(&exited.record) {
            Ok(()) => 0,
            Err(e) => {
                diag!("write exit record: {e}");
                1
            }
        }
    }

    fn signals(&mut self, exited: &mut Option<Exited>) {
        loop {
            match sys::read_signal(&self.sigfd) {
                Ok(Some(signo)) if signo == libc::SIGCHLD as u32 => {}
                Ok(Some(signo)) => diag!("ignoring signal {signo}"),
                Ok(None) => break,
                Err(e) => {
                    diag!("read signalfd: {e}");
                    break;
                }
            }
        }
        self.reap(exited);
    }

    /// Reaps every exited child; notes init's exit.
    fn reap(&mut self, exited: &mut Option<Exited>) {
        while let Some((pid, status)) = sys::reap_any() {
            if pid == self.init_pid && exited.is_none() {
                // First, before systemd may remove the container's scope
                // (and its cgroup) now that it is empty.
                if let Some(oom) = &mut self.oom {
                    oom.exited();
                }
                *exited = Some(Exited {
                    record: ExitRecord {
                        exit_code: sys::exit_code(status),
                        exited_at_ns: time::realtime_ns(),
                        oom_killed: None,
                    },
                    drain_deadline: time::monotonic_ns() + DRAIN_AFTER_EXIT_NS,
                });
            }
        }
    }

    fn read_output(&mut self, index: usize, buf: &mut [u8]) {
        let Some(out) = &mut self.outputs[index] else {
            return;
        };
        let eof = match out.file.read(buf) {
            Ok(0) => true,
            Ok(n) => {
                if let Some(log) = &mut self.log {
                    log.stamp();
                    out.splitter.feed(&buf[..n], log);
                    log.flush();
                }
                if let Some(attach) = &mut self.attach {
                    let kind = match out.splitter.stream() {
                        Stream::Stdout => attach::STDOUT,
                        Stream::Stderr => attach::STDERR,
                    };
                    let input = &mut self.input;
                    attach.broadcast(kind, &buf[..n], &mut |r| input.request(r));
                }
                false
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                false
            }
            // A terminal master reads EIO once the container closed its side.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => true,
            Err(e) => {
                diag!("read container output: {e}");
                true
            }
        };
        if eof {
            if let Some(log) = &mut self.log {
                out.splitter.finish(log);
                log.flush();
            }
            self.outputs[index] = None;
        }
    }

    fn commands(&mut self) {
        let mut chunk = [0u8; 256];
        loop {
            let n = match (&self.ctl).read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    diag!("read {CTL_FIFO}: {e}");
                    return;
                }
            };
            for &byte in &chunk[..n] {
                if byte == b'\n' {
                    self.command_line();
                } else if self.command_len < MAX_COMMAND {
                    self.command[self.command_len] = byte;
                    self.command_len += 1;
                } else {
                    self.command_overlong = true;
                }
            }
        }
    }

    fn command_line(&mut self) {
        let line = &self.command[..self.command_len];
        let command = if self.command_overlong {
            None
        } else {
            std::str::from_utf8(line).ok().and_then(Command::parse)
        };
        let overlong = self.command_overlong;
        self.command_len = 0;
        self.command_overlong = false;
        let reply = match command {
            Some(Command::ReopenLog) => match &mut self.log {
                Some(log) => match log.reopen() {
                    Ok(()) => Ok(()),
                    Err(e) => Err(format!("reopen log {}: {e}", log.path().display())),
                },
                None => Ok(()),
            },
            Some(Command::CloseStdin) => {
                // Closing twice, or without a stdin pipe, is not an error.
                self.input.close();
                Ok(())
            }
            None if overlong => Err("command too long".to_owned()),
            None => Err("unknown command".to_owned()),
        };
        if let Err(msg) = &reply {
            diag!("command failed: {msg}");
        }
        ack(&reply);
    }
}

/// Answers a command on the acknowledgement FIFO if someone listens.
fn ack(reply: &Result<(), String>) {
    let line = match reply {
        Ok(()) => "ok\n".to_owned(),
        Err(msg) => format!("error {}\n", msg.replace('\n', " ")),
    };
    let mut fifo = match sys::open_raw(Path::new(ACK_FIFO), libc::O_WRONLY | libc::O_NONBLOCK) {
        Ok(f) => f,
        // Nobody reads: the runtime did not ask for an answer.
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => return,
        Err(e) => {
            diag!("open {ACK_FIFO}: {e}");
            return;
        }
    };
    if let Err(e) = fifo.write_all(line.as_bytes()) {
        diag!("write {ACK_FIFO}: {e}");
    }
}

/// Writes the exit record atomically: a complete file appears under its name
/// or none does.
fn write_exit_record(record: &ExitRecord) -> io::Result<()> {
    let mut tmp = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(EXIT_TMP_FILE)?;
    tmp.write_all(record.to_string().as_bytes())?;
    drop(tmp);
    // No fsync: the record must survive the runtime (a process), which the
    // page cache guarantees; a machine crash takes the container with it, and
    // the state directory is volatile anyway. The rename makes the record
    // appear whole or not at all, and the fsyncs cost the exit notification
    // whole milliseconds on a busy disk.
    std::fs::rename(EXIT_TMP_FILE, EXIT_FILE)
}
