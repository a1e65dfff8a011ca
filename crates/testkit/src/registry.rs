//! A local registry for the conformance kit: Debian's `docker-registry`
//! (the CNCF distribution registry) on 127.0.0.1, serving a built image
//! set's storage read-only, and the hosts.toml mirror directory that sends
//! the upstream registries critest names to it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::process::{describe, free_port, kit_tempdir, spawn_logged, stop_child, write_pid_file};
use crate::KitError;

/// The registry binary (Debian package docker-registry).
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// The upstream registries critest's images come from, each with the
/// server a client would use without a mirror.
pub const MIRRORED: [(&str, &str); 5] = [
    ("registry.k8s.io", "https://registry.k8s.io"),
    ("k8s.gcr.io", "https://k8s.gcr.io"),
    ("gcr.io", "https://gcr.io"),
    ("public.ecr.aws", "https://public.ecr.aws"),
    ("docker.io", "https://registry-1.docker.io"),
];

/// A running read-only registry; stopped by pid on drop.
pub struct LocalRegistry {
    dir: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
}

impl LocalRegistry {
    /// Serves the registry storage `storage` (a docker-registry filesystem
    /// root) read-only on a free port of 127.0.0.1. Several may serve the
    /// same storage at once.
    pub fn serve_read_only(storage: &Path) -> Result<LocalRegistry, KitError> {
        if !Path::new(REGISTRY_BIN).is_file() {
            return Err(KitError::Missing {
                component: "docker-registry".into(),
                path: REGISTRY_BIN.into(),
                hint: "apt-get install docker-registry (`make deps`)".into(),
            });
        }
        let mut dir = kit_tempdir("petrel-kit-registry.")?;
        let log = dir.path().join("registry.log");
        let mut last = String::new();
        // A port picked by the kernel may be taken before the registry binds
        // it: try a few.
        for _ in 0..5 {
            let port = free_port()?;
            let config = dir.path().join("config.yml");
            std::fs::write(&config, read_only_config(storage, port))
                .map_err(|e| KitError::io("write", &config, e))?;
            let mut cmd = Command::new(REGISTRY_BIN);
            cmd.arg("serve").arg(&config);
            last = describe(&cmd);
            let child = spawn_logged("docker-registry", &mut cmd, &log)?;
            write_pid_file(dir.path(), "registry", child.id());
            let mut reg = LocalRegistry {
                dir,
                port,
                child: Some(child),
            };
            if reg.wait_ready() {
                return Ok(reg);
            }
            reg.stop();
            dir = reg.take_dir()?;
        }
        Err(KitError::Start {
            component: "docker-registry".into(),
            command: last,
            log,
            detail: "did not listen within 10 s (5 tries)".into(),
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The registry's log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    fn wait_ready(&mut self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    return false;
                }
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    fn take_dir(mut self) -> Result<tempfile::TempDir, KitError> {
        self.stop();
        let placeholder = kit_tempdir("petrel-kit-registry-x.")?;
        Ok(std::mem::replace(&mut self.dir, placeholder))
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(2));
        }
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// docker-registry's configuration for serving `storage` read-only on
/// 127.0.0.1:`port` (no upload purging: the storage may be shared).
pub fn read_only_config(storage: &Path, port: u16) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  maintenance:\n    uploadpurging:\n      enabled: false\n    readonly:\n      enabled: true\n\
         http:\n  addr: 127.0.0.1:{port}\n",
        storage.display()
    )
}

/// Writes `<dir>/<registry>/hosts.toml` for each of [`MIRRORED`]: pulls and
/// resolves go to `http://<mirror_host>` first (containerd's hosts.toml
/// format, read by Petrel's `[cri.registry] config_path` and containerd's).
pub fn write_mirror_config(dir: &Path, mirror_host: &str) -> Result<(), KitError> {
    for (registry, server) in MIRRORED {
        let d = dir.join(registry);
        std::fs::create_dir_all(&d).map_err(|e| KitError::io("create directory", &d, e))?;
        let f = d.join("hosts.toml");
        std::fs::write(&f, hosts_toml(server, mirror_host))
            .map_err(|e| KitError::io("write", &f, e))?;
    }
    Ok(())
}

/// One registry's hosts.toml with `mirror_host` as its mirror over HTTP.
pub fn hosts_toml(server: &str, mirror_host: &str) -> String {
    format!(
        "server = \"{server}\"\n\n[host.\"http://{mirror_host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn mirror_config_should_send_every_upstream_registry_to_the_mirror() {
        let d = tempfile::tempdir().expect("tempdir");
        write_mirror_config(d.path(), "127.0.0.1:5123").expect("write");
        for (reg, server) in MIRRORED {
            let text =
                std::fs::read_to_string(d.path().join(reg).join("hosts.toml")).expect("read");
            assert!(text.contains(&format!("server = \"{server}\"")), "{text}");
            assert!(
                text.contains("[host.\"http://127.0.0.1:5123\"]"),
                "{reg}: {text}"
            );
            assert!(text.contains("\"pull\", \"resolve\""), "{text}");
        }
    }

    #[test]
    fn read_only_config_should_name_the_storage_and_forbid_writes() {
        let c = read_only_config(Path::new("/s/registry"), 5000);
        assert!(c.contains("rootdirectory: /s/registry"), "{c}");
        assert!(c.contains("readonly:\n      enabled: true"), "{c}");
        assert!(c.contains("addr: 127.0.0.1:5000"), "{c}");
    }
}
