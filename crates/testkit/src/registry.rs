//! A local registry: Debian's `docker-registry` (the CNCF distribution
//! registry) on a free port of 127.0.0.1, stopped by pid on drop. Either
//! serving a built image set's storage read-only (the conformance kit, with
//! the hosts.toml mirror directory that sends the upstream registries
//! critest names to it), or writable with its storage in its own temporary
//! directory, optionally behind htpasswd auth or TLS, filled with `skopeo
//! copy` (the pull tests).

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

/// A running registry; stopped by pid on drop.
pub struct LocalRegistry {
    dir: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// `user:password` of a writable registry started with auth.
    pub creds: Option<String>,
    child: Option<Child>,
}

impl LocalRegistry {
    /// Serves the registry storage `storage` (a docker-registry filesystem
    /// root) read-only on a free port of 127.0.0.1. Several may serve the
    /// same storage at once.
    pub fn serve_read_only(storage: &Path) -> Result<LocalRegistry, KitError> {
        let dir = kit_tempdir("petrel-kit-registry.")?;
        Self::serve(dir, None, |port| read_only_config(storage, port))
    }

    /// Starts docker-registry in `dir` with the configuration `config`
    /// makes for a port. A port picked by the kernel may be taken before
    /// the registry binds it: tries a few.
    fn serve(
        mut dir: tempfile::TempDir,
        creds: Option<String>,
        config: impl Fn(u16) -> String,
    ) -> Result<LocalRegistry, KitError> {
        require(REGISTRY_BIN, "docker-registry")?;
        let log = dir.path().join("registry.log");
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port()?;
            let file = dir.path().join("config.yml");
            std::fs::write(&file, config(port)).map_err(|e| KitError::io("write", &file, e))?;
            let mut cmd = Command::new(REGISTRY_BIN);
            cmd.arg("serve").arg(&file);
            last = describe(&cmd);
            let child = spawn_logged("docker-registry", &mut cmd, &log)?;
            write_pid_file(dir.path(), "registry", child.id());
            let mut reg = LocalRegistry {
                dir,
                port,
                creds: creds.clone(),
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

    /// The registry's own directory (config, log, a writable one's
    /// storage); a test may keep files of its own there.
    pub fn dir(&self) -> &Path {
        self.dir.path()
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

/// An error unless the binary `bin` (Debian package `package`) is there.
fn require(bin: &str, package: &str) -> Result<(), KitError> {
    if Path::new(bin).is_file() {
        return Ok(());
    }
    Err(KitError::Missing {
        component: bin.to_string(),
        path: bin.into(),
        hint: format!("apt-get install {package} (`make deps`)"),
    })
}

/// Runs a command, panicking with its output when it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A CA (`ca.pem`) and a server certificate for IP 127.0.0.1 signed by it
/// (`server.pem`, `server.key`) in `dir`, made with the openssl command.
fn make_certs(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(Command::new("openssl")
        .current_dir(dir)
        .args(["req", "-x509", "-days", "2", "-subj", "/CN=petrel-test-ca"])
        .args(ec)
        .args(["-keyout", "ca.key", "-out", "ca.pem"])
        .args(["-addext", "basicConstraints=critical,CA:TRUE"])
        .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]));
    run(Command::new("openssl")
        .current_dir(dir)
        .args(["req", "-subj", "/CN=127.0.0.1"])
        .args(ec)
        .args(["-keyout", "server.key", "-out", "server.csr"]));
    let ext = dir.join("server.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", ext.display()));
    run(Command::new("openssl").current_dir(dir).args([
        "x509",
        "-req",
        "-days",
        "2",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-extfile",
        "server.ext",
        "-out",
        "server.pem",
    ]));
}

/// A writable registry for the pull tests. Its constructors panic (a
/// test's failure) when a tool is missing or the registry does not start.
impl LocalRegistry {
    /// Starts a writable registry without auth.
    pub fn start() -> LocalRegistry {
        Self::start_writable(None, false)
    }

    /// Starts a writable registry; with `Some((user, password))` it requires
    /// Basic auth from an htpasswd file (bcrypt, made by `htpasswd -B`).
    pub fn start_with(auth: Option<(&str, &str)>) -> LocalRegistry {
        Self::start_writable(auth, false)
    }

    /// Starts a writable registry serving HTTPS with a certificate for
    /// 127.0.0.1 signed by a CA of its own ([`LocalRegistry::ca_pem`]).
    pub fn start_tls() -> LocalRegistry {
        Self::start_writable(None, true)
    }

    /// The CA certificate of a registry started by
    /// [`LocalRegistry::start_tls`].
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn start_writable(auth: Option<(&str, &str)>, tls: bool) -> LocalRegistry {
        let fail = |e: KitError| -> ! { panic!("registry pull tests: {e}") };
        require("/usr/bin/skopeo", "skopeo").unwrap_or_else(|e| fail(e));
        let dir = kit_tempdir("petrel-registry.").unwrap_or_else(|e| fail(e));
        let mut auth_yaml = String::new();
        if let Some((user, pass)) = auth {
            require("/usr/bin/htpasswd", "apache2-utils").unwrap_or_else(|e| fail(e));
            let entry = run(Command::new("htpasswd").args(["-Bbn", user, pass]));
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, entry.trim())
                .unwrap_or_else(|e| fail(KitError::io("write", &file, e)));
            auth_yaml = format!(
                "auth:\n  htpasswd:\n    realm: petrel-test\n    path: {}\n",
                file.display()
            );
        }
        let mut tls_yaml = String::new();
        if tls {
            require("/usr/bin/openssl", "openssl").unwrap_or_else(|e| fail(e));
            make_certs(dir.path());
            tls_yaml = format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("server.pem").display(),
                dir.path().join("server.key").display()
            );
        }
        let data = dir.path().join("data");
        Self::serve(dir, auth.map(|(u, p)| format!("{u}:{p}")), |port| {
            format!(
                "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                 http:\n  addr: 127.0.0.1:{port}\n{tls_yaml}{auth_yaml}",
                data.display()
            )
        })
        .unwrap_or_else(|e| fail(e))
    }

    /// Pushes an OCI archive as `<host>/<name_tag>`.
    pub fn push(&self, archive: &Path, name_tag: &str) {
        self.push_from(&format!("oci-archive:{}", archive.display()), name_tag);
    }

    /// Pushes the image skopeo finds at `source` (e.g. `oci:DIR:TAG`) as
    /// `<host>/<name_tag>`.
    pub fn push_from(&self, source: &str, name_tag: &str) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some(c) = &self.creds {
            cmd.args(["--dest-creds", c]);
        }
        cmd.arg(source)
            .arg(format!("docker://{}/{name_tag}", self.host()));
        run(&mut cmd);
    }

    /// The raw manifest `<host>/<name_tag>` (as pushed) and its digest.
    pub fn manifest(&self, name_tag: &str) -> (Vec<u8>, String) {
        use sha2::{Digest as _, Sha256};
        let mut cmd = Command::new("skopeo");
        cmd.args(["inspect", "--raw", "--tls-verify=false"]);
        if let Some(c) = &self.creds {
            cmd.args(["--creds", c]);
        }
        cmd.arg(format!("docker://{}/{name_tag}", self.host()));
        let raw = run(&mut cmd).into_bytes();
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&raw)));
        (raw, digest)
    }

    /// PUTs a manifest or index document under `<name>:<tag>`.
    pub fn put_manifest(&self, name: &str, tag: &str, media_type: &str, body: &[u8]) {
        let file = self.dir.path().join(format!("put-{tag}.json"));
        std::fs::write(&file, body).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
        run(Command::new("curl").args([
            "-fsS",
            "-X",
            "PUT",
            "-H",
            &format!("Content-Type: {media_type}"),
            "--data-binary",
            &format!("@{}", file.display()),
            &format!("http://{}/v2/{name}/manifests/{tag}", self.host()),
        ]));
    }

    /// The file holding blob `digest` in a writable registry's storage.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(hex.get(..2).unwrap_or(hex))
            .join(hex)
            .join("data")
    }

    /// The registry's log (access log lines included).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// How many `GET <path>` requests the access log shows answered 200.
    pub fn gets(&self, path: &str) -> usize {
        let needle = format!("\"GET {path} HTTP/1.1\" 200");
        self.log().lines().filter(|l| l.contains(&needle)).count()
    }
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
