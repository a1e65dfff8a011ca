//! A real OCI registry for pull tests: Debian's `docker-registry` (the CNCF
//! distribution registry) on 127.0.0.1 with its storage in a temp dir,
//! optionally behind htpasswd auth, filled with `skopeo copy`. Stopped by
//! PID and its storage removed on drop, also when the test fails.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A running registry.
pub struct Registry {
    pub dir: tempfile::TempDir,
    pub port: u16,
    /// `user:password` when started with auth.
    pub creds: Option<String>,
    child: Option<Child>,
}

fn require(bin: &str, package: &str) {
    assert!(
        Path::new(bin).is_file(),
        "{bin} not found: registry pull tests need the Debian package {package} \
         (`make deps` installs it)"
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("pick a free port")
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
    require("/usr/bin/openssl", "openssl");
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
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
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

impl Registry {
    /// Starts a registry without auth.
    pub fn start() -> Registry {
        Self::start_with(None)
    }

    /// Starts a registry; with `Some((user, password))` it requires Basic
    /// auth from an htpasswd file (bcrypt, made by `htpasswd -B`).
    pub fn start_with(auth: Option<(&str, &str)>) -> Registry {
        Self::start_inner(auth, false)
    }

    /// Starts a registry serving HTTPS with a certificate for 127.0.0.1
    /// signed by a CA of its own ([`Registry::ca_pem`]).
    pub fn start_tls() -> Registry {
        Self::start_inner(None, true)
    }

    /// The CA certificate of a registry started by [`Registry::start_tls`].
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    fn start_inner(auth: Option<(&str, &str)>, tls: bool) -> Registry {
        require(REGISTRY_BIN, "docker-registry");
        require("/usr/bin/skopeo", "skopeo");
        let mut dir = tempfile::Builder::new()
            .prefix("petrel-registry.")
            .tempdir()
            .expect("tempdir");
        let mut auth_yaml = String::new();
        if let Some((user, pass)) = auth {
            require("/usr/bin/htpasswd", "apache2-utils");
            let entry = run(Command::new("htpasswd").args(["-Bbn", user, pass]));
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, entry.trim()).expect("write htpasswd");
            auth_yaml = format!(
                "auth:\n  htpasswd:\n    realm: petrel-test\n    path: {}\n",
                file.display()
            );
        }
        let mut tls_yaml = String::new();
        if tls {
            make_certs(dir.path());
            tls_yaml = format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("server.pem").display(),
                dir.path().join("server.key").display()
            );
        }
        // A port picked by the kernel can be taken again before the
        // registry binds it; try a few.
        for _ in 0..5 {
            let port = free_port();
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
                     storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
                     http:\n  addr: 127.0.0.1:{port}\n{tls_yaml}{auth_yaml}",
                    dir.path().join("data").display()
                ),
            )
            .expect("write registry config");
            let log = std::fs::File::create(dir.path().join("registry.log")).expect("log");
            let log2 = log.try_clone().expect("log");
            let child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log2)
                .spawn()
                .expect("start docker-registry");
            let mut reg = Registry {
                dir,
                port,
                creds: auth.map(|(u, p)| format!("{u}:{p}")),
                child: Some(child),
            };
            if reg.wait_ready() {
                return reg;
            }
            reg.stop();
            dir = reg.take_dir();
        }
        panic!("docker-registry did not start");
    }

    fn take_dir(mut self) -> tempfile::TempDir {
        self.stop();
        let placeholder = tempfile::Builder::new()
            .prefix("petrel-registry-x.")
            .tempdir()
            .expect("tempdir");
        std::mem::replace(&mut self.dir, placeholder)
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

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
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
        let mut cmd = Command::new("skopeo");
        cmd.args(["inspect", "--raw", "--tls-verify=false"]);
        if let Some(c) = &self.creds {
            cmd.args(["--creds", c]);
        }
        cmd.arg(format!("docker://{}/{name_tag}", self.host()));
        let raw = run(&mut cmd).into_bytes();
        let mut sha = Command::new("sha256sum");
        sha.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = sha.spawn().expect("sha256sum");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), &raw).expect("write");
        let out = child.wait_with_output().expect("sha256sum");
        let hex = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        (raw, format!("sha256:{hex}"))
    }

    /// PUTs a manifest or index document under `<name>:<tag>`.
    pub fn put_manifest(&self, name: &str, tag: &str, media_type: &str, body: &[u8]) {
        let file = self.dir.path().join(format!("put-{tag}.json"));
        std::fs::write(&file, body).expect("write manifest");
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

    /// The file holding blob `digest` in the registry's storage.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The registry's log (access log lines included).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// How many `GET <path>` requests the access log shows.
    pub fn gets(&self, path: &str) -> usize {
        let needle = format!("\"GET {path} HTTP/1.1\" 200");
        self.log().lines().filter(|l| l.contains(&needle)).count()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop();
    }
}
