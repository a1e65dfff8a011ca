//! The machine's floor for a call to another process: a 32-byte round trip
//! over a unix socket between the bench and a child process (the bench binary
//! itself, run with `--echo-socket PATH`), both blocking in `read`, after the
//! same idle time a plugin sees between two CreateContainer calls. No NRI
//! plugin call can be quicker than this on the machine.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::stats::Samples;

/// The argument that makes the bench binary the echo child.
pub const ECHO_ARG: &str = "--echo-socket";

/// Bytes sent each way.
const PING: usize = 32;

/// The echo child: connects to `path` and sends back whatever it reads until
/// the other end closes.
pub fn serve_echo(path: &Path) -> Result<()> {
    let mut s =
        UnixStream::connect(path).with_context(|| format!("connect to {}", path.display()))?;
    let mut buf = [0u8; PING];
    loop {
        match s.read(&mut buf)? {
            0 => return Ok(()),
            n => s.write_all(&buf[..n])?,
        }
    }
}

/// Kills the child on every way out.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `n` round trips, each after `gap` idle. Blocking: run it off the async
/// runtime (`spawn_blocking`).
pub fn round_trips(dir: &Path, gap: Duration, n: usize) -> Result<Samples> {
    let path = dir.join("echo.sock");
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).with_context(|| format!("bind {}", path.display()))?;
    let exe = std::env::current_exe().context("the bench's own executable")?;
    let child = Command::new(exe)
        .arg(ECHO_ARG)
        .arg(&path)
        .spawn()
        .context("start the echo child")?;
    let _reap = Reap(child);
    let (mut s, _) = listener.accept().context("accept the echo child")?;
    let _ = std::fs::remove_file(&path);
    let ping = [7u8; PING];
    let mut pong = [0u8; PING];
    let mut samples = Samples::default();
    // One unmeasured round trip: the child's start-up falls on nobody.
    for i in 0..=n {
        std::thread::sleep(gap);
        let t = Instant::now();
        s.write_all(&ping).context("write to the echo child")?;
        s.read_exact(&mut pong)
            .context("read from the echo child")?;
        if i > 0 {
            samples.push(t.elapsed());
        }
    }
    Ok(samples)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn echo_serves_until_the_peer_closes() {
        let dir = std::env::temp_dir().join(format!("petrel-bench-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("e.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let p = path.clone();
        let child = std::thread::spawn(move || serve_echo(&p));
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"abc").unwrap();
        let mut got = [0u8; 3];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"abc");
        drop(s);
        child.join().unwrap().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
