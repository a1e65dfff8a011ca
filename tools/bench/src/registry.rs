//! A local OCI registry for the pull figures (P14, P15): Debian's
//! `docker-registry` (the CNCF distribution registry) on 127.0.0.1, on a
//! port picked by the kernel, with its configuration, log and storage in
//! one directory of the bench's work directory. Stopped by its handle and
//! its directory removed on drop, on every path.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The registry binary of the Debian package `docker-registry`.
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A running registry.
pub struct Registry {
    /// Its configuration, log, pid file and storage.
    pub dir: PathBuf,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    child: Option<Child>,
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(l.local_addr().context("local address")?.port())
}

/// Waits up to 10 s for the registry to accept connections; false if it
/// exited or did not.
fn wait_ready(child: &mut Child, port: u16) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

impl Registry {
    /// Starts a registry with its files in `dir` (created) and waits until
    /// it accepts connections.
    pub fn start(dir: &Path) -> Result<Registry> {
        if !Path::new(REGISTRY_BIN).is_file() {
            bail!("{REGISTRY_BIN} not found (Debian package docker-registry; `make deps`)");
        }
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        // A port the kernel picked may be taken again before the registry
        // binds it: a few tries.
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port()?;
            let config = dir.join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n\
                     http:\n  addr: 127.0.0.1:{port}\n",
                    dir.join("data").display()
                ),
            )
            .with_context(|| format!("write {}", config.display()))?;
            let log_path = dir.join("registry.log");
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("create {}", log_path.display()))?;
            let log2 = log.try_clone().context("clone the log file")?;
            let mut child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log2)
                .spawn()
                .context("start docker-registry")?;
            // For scripts/bench.sh's trap, should the bench die too hard to
            // stop it (the command line names the work directory).
            let pid_file = dir.join("registry.pid");
            if let Err(e) = std::fs::write(&pid_file, child.id().to_string()) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).with_context(|| format!("write {}", pid_file.display()));
            }
            if wait_ready(&mut child, port) {
                return Ok(Registry {
                    dir: dir.to_path_buf(),
                    port,
                    child: Some(child),
                });
            }
            // Our own child, by its handle; the directory stays for the
            // next try.
            let _ = child.kill();
            let _ = child.wait();
            last = std::fs::read_to_string(&log_path).unwrap_or_default();
        }
        bail!(
            "docker-registry did not start on 127.0.0.1; its log:\n{}",
            last.lines().rev().take(10).collect::<Vec<_>>().join("\n")
        )
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Pushes image `layout:tag` (an OCI layout directory) as
    /// `<host>/<name_tag>` with skopeo.
    pub fn push_layout(&self, layout: &Path, tag: &str, name_tag: &str) -> Result<()> {
        let out = Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{name_tag}", self.host()))
            .stdin(Stdio::null())
            .output()
            .context("run skopeo copy (Debian package skopeo)")?;
        if !out.status.success() {
            bail!(
                "skopeo copy to {}/{name_tag}: {}: {}",
                self.host(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Our own child, by its handle.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("petrel-bench: remove {}: {e}", self.dir.display());
            }
        }
    }
}
