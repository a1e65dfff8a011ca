//! The test VM's guest agent (`petrel_testkit::vm`): built on the host,
//! run in the guest (which sees the host's root) by the guest's init. It
//! reads requests from the virtio-serial port named `petrel.agent`, runs
//! each command with a timeout and answers its exit status and output; one
//! command at a time. Its own messages go to stderr, the guest's console.

use std::io::BufReader;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use petrel_testkit::vm::protocol::{self, LineReader, Read, Request, Response};
use rustix::process::{Pid, Signal};

/// The port's name, as the host's `virtserialport,name=...` gives it.
const PORT_NAME: &str = "petrel.agent";

/// How long the output of a command that has exited may still take to
/// arrive: a process it left behind may hold the pipes open (it is killed
/// with the command's process group first, but may be in another group).
const DRAIN: Duration = Duration::from_secs(2);

fn main() {
    let port = match wait_for_port(Duration::from_secs(30)) {
        Some(p) => p,
        None => {
            eprintln!("petrel-vm-agent: no virtio-serial port named {PORT_NAME}");
            std::process::exit(1);
        }
    };
    if let Err(e) = serve(&port) {
        eprintln!("petrel-vm-agent: {}: {e}", port.display());
        std::process::exit(1);
    }
}

/// The device of the port named [`PORT_NAME`] (`/dev/vportNpM`; there is
/// no udev in the guest to make `/dev/virtio-ports/<name>`).
fn wait_for_port(within: Duration) -> Option<PathBuf> {
    let start = Instant::now();
    loop {
        for e in std::fs::read_dir("/sys/class/virtio-ports")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
            let dev = Path::new("/dev").join(e.file_name());
            if name.trim() == PORT_NAME && dev.exists() {
                return Some(dev);
            }
        }
        if start.elapsed() > within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Answers requests on the port until it fails.
fn serve(port: &Path) -> std::io::Result<()> {
    let file = std::fs::File::options().read(true).write(true).open(port)?;
    let mut out = file.try_clone()?;
    let mut input = BufReader::new(file);
    let mut lines = LineReader::new();
    loop {
        let line = match lines.next_line(&mut input) {
            Ok(Read::Line(l)) => l,
            // A read returns at once while no host is connected: wait for
            // one without spinning.
            Ok(Read::Eof) | Ok(Read::Timeout) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                eprintln!("petrel-vm-agent: {e}");
                continue;
            }
            Err(e) => return Err(e),
        };
        let resp = match protocol::decode::<Request>(&line) {
            Ok(req) => run(&req),
            Err(e) => Response {
                error: Some(format!("bad request: {e}")),
                ..Response::default()
            },
        };
        protocol::send(&mut out, &resp)?;
    }
}

/// Runs one request's command, killing its process group at the timeout.
fn run(req: &Request) -> Response {
    let mut resp = Response {
        id: req.id,
        ..Response::default()
    };
    let Some((program, args)) = req.argv.split_first() else {
        // A ping.
        resp.status = Some(0);
        return resp;
    };
    let start = Instant::now();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(&req.env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so that a timeout ends what it started too.
        .process_group(0);
    if let Some(cwd) = &req.cwd {
        cmd.current_dir(cwd);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            resp.error = Some(format!("run {program}: {e}"));
            return resp;
        }
    };
    let pgid = i32::try_from(child.id()).ok().and_then(Pid::from_raw);
    let stdout = collect(child.stdout.take());
    let stderr = collect(child.stderr.take());
    let timeout = Duration::try_from_secs_f64(req.timeout_s).unwrap_or(Duration::MAX);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if start.elapsed() >= timeout => {
                resp.timed_out = true;
                kill_group(pgid);
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                resp.error = Some(format!("wait for {program}: {e}"));
                kill_group(pgid);
                break child.wait().ok();
            }
        }
    };
    // What it left in its group would keep the pipes open.
    kill_group(pgid);
    if let Some(st) = status {
        resp.status = st.code();
        resp.signal = st.signal();
    }
    let deadline = Instant::now() + DRAIN;
    resp.stdout = protocol::output_text(&stdout.finish(deadline));
    resp.stderr = protocol::output_text(&stderr.finish(deadline));
    resp.elapsed_s = start.elapsed().as_secs_f64();
    resp
}

fn kill_group(pgid: Option<Pid>) {
    if let Some(p) = pgid {
        let _ = rustix::process::kill_process_group(p, Signal::KILL);
    }
}

/// A pipe read to its end on a thread of its own, into a buffer shared
/// with the caller: what arrived is kept even when the end never comes.
struct Collector {
    buf: Arc<Mutex<Vec<u8>>>,
    done: Option<mpsc::Receiver<()>>,
}

fn collect(pipe: Option<impl std::io::Read + Send + 'static>) -> Collector {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let Some(mut pipe) = pipe else {
        return Collector { buf, done: None };
    };
    let (tx, rx) = mpsc::channel();
    let shared = Arc::clone(&buf);
    std::thread::spawn(move || {
        let mut chunk = vec![0u8; 64 << 10];
        // A read error ends the output like its end does.
        while let Ok(n @ 1..) = pipe.read(&mut chunk) {
            lock(&shared).extend_from_slice(&chunk[..n]);
        }
        let _ = tx.send(());
    });
    Collector {
        buf,
        done: Some(rx),
    }
}

/// The buffer, also after a panic of the other side (a Vec stays valid).
fn lock(buf: &Mutex<Vec<u8>>) -> std::sync::MutexGuard<'_, Vec<u8>> {
    buf.lock().unwrap_or_else(|e| e.into_inner())
}

impl Collector {
    /// The output once it ended, or what arrived by `deadline` with a note
    /// (the thread is then left to finish alone).
    fn finish(self, deadline: Instant) -> Vec<u8> {
        let ended = self.done.as_ref().is_none_or(|rx| {
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .is_ok()
        });
        let mut out = std::mem::take(&mut *lock(&self.buf));
        if !ended {
            out.extend_from_slice(
                b"\n[petrel-vm-agent: the output did not end: a process outside the command's group holds it]\n",
            );
        }
        out
    }
}
