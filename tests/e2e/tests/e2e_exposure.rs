//! End-to-end: what another local user, or a web page, can reach of a
//! node (issue 26, items 2–4), with a throwaway unprivileged user made
//! for the test and removed after it:
//! - the agent's pods, logs, exec, attach and port-forward are refused to
//!   that user on TCP (403) and on the unix socket (no access to its
//!   directory; with the directory opened by hand, the peer check still
//!   answers 403), while root uses them (`petrel get pods`) and the TCP
//!   port serves health and metrics without pod data;
//! - a socket group admits its members and no one else;
//! - cross-origin and DNS-rebinding WebSocket upgrades are refused by the
//!   agent and by the runtime's streaming server, which still serves a
//!   kubectl-like client with the same URL;
//! - every directory Petrel makes under its root and state is private
//!   (emptyDir volumes 0777 under private parents), whichever of runtime
//!   and agent starts first, and the user cannot read what a container
//!   wrote to its emptyDir.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_testkit::agent::{running, Agent};
use petrel_testkit::prelude::{petrel_bin, Node, BUSYBOX};

const T: Duration = Duration::from_secs(60);

fn random_hex() -> String {
    let mut b = [0u8; 4];
    getrandom::getrandom(&mut b).unwrap();
    hex::encode(b)
}

/// Runs a user-management command, retrying while another test holds the
/// lock on /etc/passwd.
fn admin(cmd: &str, args: &[&str]) {
    let mut last = String::new();
    for _ in 0..50 {
        let out = Command::new(cmd).args(args).output().expect(cmd);
        if out.status.success() {
            return;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{cmd} {args:?}: {last}");
}

/// A group made for the test, deleted when dropped.
struct TempGroup {
    name: String,
}

impl TempGroup {
    fn new() -> TempGroup {
        let name = format!("ptlg{}", random_hex());
        admin("groupadd", &[&name]);
        TempGroup { name }
    }

    fn gid(&self) -> u32 {
        let text = std::fs::read_to_string("/etc/group").unwrap();
        text.lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.first() == Some(&self.name.as_str())).then(|| f[2].parse().unwrap())
            })
            .unwrap()
    }
}

impl Drop for TempGroup {
    fn drop(&mut self) {
        let _ = Command::new("groupdel").arg(&self.name).output();
    }
}

/// An unprivileged user made for the test (its own group, optionally in
/// more groups), deleted with its group when dropped, even on failure.
struct TempUser {
    name: String,
}

impl TempUser {
    fn new(groups: &[&str]) -> TempUser {
        let name = format!("ptlu{}", random_hex());
        let mut args = vec![
            "--no-create-home",
            "--user-group",
            "--shell",
            "/usr/sbin/nologin",
        ];
        let list = groups.join(",");
        if !groups.is_empty() {
            args.extend(["--groups", list.as_str()]);
        }
        args.push(&name);
        admin("useradd", &args);
        TempUser { name }
    }

    /// Runs `cmd` as this user, with the groups a login would give it.
    fn run(&self, cmd: &str, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args([
                &format!("--reuid={}", self.name),
                &format!("--regid={}", self.name),
                "--init-groups",
                "--",
                cmd,
            ])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("setpriv")
    }

    /// curl as this user: (HTTP status, body); status 0 when curl could not
    /// connect at all (its exit code is in the body then).
    fn curl(&self, args: &[&str]) -> (u16, String) {
        let mut all = vec!["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"];
        all.extend(args);
        let out = self.run("curl", &all);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        let code = code.trim().parse().unwrap_or(0);
        let err = String::from_utf8_lossy(&out.stderr);
        (code, format!("{body}{err}(exit {:?})", out.status.code()))
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// The test's own directory opened to everyone, so only Petrel's modes
/// stand between the user and what Petrel made (a tempdir is 0700).
fn open_to_all(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn pod_with_secret(name: &str) -> String {
    let script = "echo s3cr3t > /data/secret; chmod 644 /data/secret; exec sleep 3600";
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  volumes:\n  - name: data\n    emptyDir: {{}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - name: data\n      mountPath: /data\n"
    )
}

/// Finds the file `name` under `dir` (not following links).
fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        let ft = e.file_type().ok()?;
        if ft.is_dir() {
            if let Some(f) = find_file(&p, name) {
                return Some(f);
            }
        } else if e.file_name() == name {
            return Some(p);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_serve_pods_logs_and_exec_to_root_only() {
    let node = Node::start_with_busybox().await;
    open_to_all(node.dir.path());
    let agent = Agent::for_node(&node, &[]);
    agent.write_manifest("hush.yaml", &pod_with_secret("hushhush"));
    agent.wait_pod("default", "hushhush", T, "running", |p| running(p, "app"));
    let user = TempUser::new(&[]);
    let tcp = format!("http://127.0.0.1:{}", agent.port);
    let sock = agent.socket.to_str().unwrap();

    // Root: the whole API on the socket, `petrel get` included.
    let out = Command::new(petrel_bin())
        .args(["get", "pods", "-A", "--server", &agent.server_url()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("hushhush"), "{text}");
    let (code, logs) = agent.get("/containerLogs/default/hushhush/app").unwrap();
    assert_eq!(code, 200, "{logs}");

    // The user, on TCP: health and metrics, nothing about pods.
    for path in ["/healthz", "/metrics"] {
        let (code, body) = user.curl(&[&format!("{tcp}{path}")]);
        assert_eq!(code, 200, "{path}: {body}");
        assert!(
            !body.contains("hushhush") && !body.contains(BUSYBOX),
            "{path}: {body}"
        );
    }
    let sensitive = [
        "/pods",
        "/pods/default/hushhush",
        "/containerLogs/default/hushhush/app",
        "/exec/default/hushhush/app?command=id&output=1",
        "/attach/default/hushhush/app?output=1",
        "/portForward/default/hushhush?port=80",
        "/stats/summary",
    ];
    for path in sensitive {
        let (code, body) = user.curl(&[&format!("{tcp}{path}")]);
        assert_eq!(code, 403, "{path}: {body}");
        // The refusal names the path asked for, nothing of the pod.
        assert!(
            !body.contains("s3cr3t") && !body.contains("\"spec\""),
            "{body}"
        );
    }
    // An exec upgrade as kubectl sends it: refused, nothing runs.
    let (code, body) = user.curl(&[
        "-X",
        "POST",
        "-H",
        "Connection: Upgrade",
        "-H",
        "Upgrade: SPDY/3.1",
        "-H",
        "X-Stream-Protocol-Version: v4.channel.k8s.io",
        &format!("{tcp}/exec/default/hushhush/app?command=id&output=1"),
    ]);
    assert_eq!(code, 403, "{body}");

    // The user, on the socket: its directory is closed to them.
    for path in ["/pods", "/containerLogs/default/hushhush/app"] {
        let (code, body) = user.curl(&["--unix-socket", sock, &format!("http://localhost{path}")]);
        assert_eq!(code, 0, "{path}: {body}");
    }
    let out = user.run(
        petrel_bin().to_str().unwrap(),
        &["get", "pods", "-A", "--server", &agent.server_url()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("Permission denied"), "{err}");

    // With the directory and the socket opened by hand, the peer check
    // still refuses every request.
    let dir = agent.socket.parent().unwrap();
    let (dir_mode, sock_mode) = (mode(dir), mode(&agent.socket));
    assert_eq!((dir_mode, sock_mode), (0o700, 0o660));
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&agent.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    for path in sensitive {
        let (code, body) = user.curl(&["--unix-socket", sock, &format!("http://localhost{path}")]);
        assert_eq!(code, 403, "{path}: {body}");
        assert!(body.contains("not root"), "{path}: {body}");
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(dir_mode)).unwrap();
    std::fs::set_permissions(&agent.socket, std::fs::Permissions::from_mode(sock_mode)).unwrap();

    agent.remove_manifest("hush.yaml");
    agent.wait_gone("default", "hushhush", T);
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_socket_group_should_admit_its_members_only() {
    let node = Node::start();
    open_to_all(node.dir.path());
    let group = TempGroup::new();
    let member = TempUser::new(&[&group.name]);
    let stranger = TempUser::new(&[]);
    let agent = Agent::for_node(&node, &["--agent-socket-group", &group.name]);
    let sock = agent.socket.to_str().unwrap();
    let dir = agent.socket.parent().unwrap();
    assert_eq!(mode(dir), 0o750);
    assert_eq!(std::fs::metadata(dir).unwrap().gid(), group.gid());
    assert_eq!(std::fs::metadata(&agent.socket).unwrap().gid(), group.gid());
    // A supplementary group, as `usermod -aG` makes it: SO_PEERGROUPS.
    let (code, body) = member.curl(&["--unix-socket", sock, "http://localhost/pods"]);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("PodList"), "{body}");
    let (code, body) = stranger.curl(&["--unix-socket", sock, "http://localhost/pods"]);
    assert_eq!(code, 0, "{body}");
}

/// Sends `request` on `s` and returns the status code of the answer.
fn status_of(mut s: impl Read + Write, request: &str) -> u16 {
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = [0u8; 512];
    let mut got = Vec::new();
    while !got.windows(2).any(|w| w == b"\r\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn ws_upgrade(path: &str, host: &str, origin: Option<&str>) -> String {
    let origin = origin
        .map(|o| format!("Origin: {o}\r\n"))
        .unwrap_or_default();
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{origin}Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn web_pages_should_not_reach_exec_on_the_agent_or_the_streaming_server() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    agent.write_manifest("web.yaml", &pod_with_secret("web"));
    let pod = agent.wait_pod("default", "web", T, "running", |p| running(p, "app"));
    let id = petrel_testkit::agent::container_id(&pod, "app");
    let id = id.rsplit("://").next().unwrap().to_string();
    let exec = "/exec/default/web/app?command=id&output=1";

    // The agent: a cross-origin page on the socket's behalf (as if a
    // local proxy carried it), and a rebinding page on TCP.
    let unix = || std::os::unix::net::UnixStream::connect(&agent.socket).unwrap();
    assert_eq!(
        status_of(
            unix(),
            &ws_upgrade(exec, "localhost", Some("http://evil.example"))
        ),
        403
    );
    let tcp = || std::net::TcpStream::connect(("127.0.0.1", agent.port)).unwrap();
    let port = agent.port;
    for (host, origin) in [
        (
            format!("evil.example:{port}"),
            format!("http://evil.example:{port}"),
        ),
        (
            format!("127.0.0.1:{port}"),
            "http://evil.example".to_string(),
        ),
    ] {
        assert_eq!(
            status_of(tcp(), &ws_upgrade(exec, &host, Some(&origin))),
            403
        );
        assert_eq!(
            status_of(tcp(), &ws_upgrade("/healthz", &host, Some(&origin))),
            403,
            "{host} {origin}"
        );
    }
    // kubectl's way (no Origin) on the socket: upgraded.
    assert_eq!(status_of(unix(), &ws_upgrade(exec, "localhost", None)), 101);

    // The runtime's streaming server, with a URL from CRI Exec.
    let mut c = node.clients().await;
    let url =
        c.rt.exec(api::ExecRequest {
            container_id: id.clone(),
            cmd: vec!["cat".into(), "/data/secret".into()],
            stdout: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .url;
    let rest = url.strip_prefix("http://").unwrap();
    let (authority, path) = rest.split_at(rest.find('/').unwrap());
    let path = path.to_string();
    let stream = || std::net::TcpStream::connect(authority).unwrap();
    let sport = authority.rsplit(':').next().unwrap();
    for (host, origin) in [
        // DNS rebinding: Origin and Host agree on a name not the server's.
        (
            format!("evil.example:{sport}"),
            format!("http://evil.example:{sport}"),
        ),
        // Cross-origin: a page elsewhere opening ws://127.0.0.1:port.
        (authority.to_string(), "http://evil.example".to_string()),
    ] {
        assert_eq!(
            status_of(stream(), &ws_upgrade(&path, &host, Some(&origin))),
            403
        );
    }
    // The refusals spent nothing: the URL still serves a normal client.
    let opts = petrel_stream::client::CommandOptions {
        stdin: false,
        stdout: true,
        stderr: false,
        tty: false,
        transport: petrel_stream::client::Transport::WebSocket,
    };
    let mut rc = petrel_stream::client::remote_command(&url, opts)
        .await
        .unwrap();
    let mut out = String::new();
    if let Some(mut r) = rc.stdout.take() {
        tokio::io::AsyncReadExt::read_to_string(&mut r, &mut out)
            .await
            .unwrap();
    }
    assert_eq!(out, "s3cr3t\n");
    let _ = rc.wait().await;

    agent.remove_manifest("web.yaml");
    agent.wait_gone("default", "web", T);
}

/// Directories under `root` (not crossing mounts, not following links)
/// that group or others may access, except where `allowed` says the mode
/// is by design; `allowed` returning true also skips what is below.
fn loose_dirs(root: &Path, allowed: &dyn Fn(&Path, u32) -> bool) -> Vec<String> {
    let dev = std::fs::metadata(root).unwrap().dev();
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(md) = std::fs::symlink_metadata(&d) else {
            continue;
        };
        if !md.is_dir() || md.dev() != dev {
            continue;
        }
        let m = md.mode() & 0o7777;
        if allowed(&d, m) {
            continue;
        }
        if m & 0o077 != 0 {
            out.push(format!("{:04o} {}", m, d.display()));
        }
        if let Ok(rd) = std::fs::read_dir(&d) {
            todo.extend(rd.flatten().map(|e| e.path()));
        }
    }
    out
}

/// What the runtime and agent leave open by design, and what is not
/// theirs: image content (`layers/<id>/`, modes from the image), a
/// container's writable layer (`upper`: the container's `/`, 0755; and
/// what the container wrote), runc's own state (`runc/<id>`, 0711), and
/// emptyDir volumes (0777, written by containers of any uid).
fn by_design(p: &Path, mode: u32) -> bool {
    let parent = p.parent().and_then(|x| x.file_name()).unwrap_or_default();
    let name = p.file_name().unwrap_or_default();
    parent == "layers"
        || (name == "upper" && mode == 0o755)
        || parent == "runc"
        || (parent == "kubernetes.io~empty-dir" && mode == 0o777)
}

#[tokio::test(flavor = "multi_thread")]
async fn runtime_and_agent_directories_should_be_private() {
    // The node's layout: the agent's root under the runtime's.
    let node = Node::start_with_busybox().await;
    open_to_all(node.dir.path());
    let agent = Agent::for_node_at(&node, &node.root.join("agent"), &[]);
    agent.write_manifest("sec.yaml", &pod_with_secret("sec"));
    agent.wait_pod("default", "sec", T, "running", |p| running(p, "app"));
    let secret = {
        let start = Instant::now();
        loop {
            if let Some(f) = find_file(&agent.root, "secret") {
                break f;
            }
            assert!(
                start.elapsed() < T,
                "no secret under {}",
                agent.root.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert_eq!(mode(secret.parent().unwrap()), 0o777);
    for d in [&node.root, &node.state, &agent.root] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
        let loose = loose_dirs(d, &by_design);
        assert!(loose.is_empty(), "open directories:\n{}", loose.join("\n"));
    }
    assert_eq!(mode(agent.socket.parent().unwrap()), 0o700);
    // Every directory on the way to the secret but the volume is private.
    let mut p = secret.parent().unwrap().parent();
    while let Some(d) = p {
        if d == node.dir.path() {
            break;
        }
        assert_eq!(mode(d), 0o700, "{}", d.display());
        p = d.parent();
    }
    // Another local user cannot read what the container wrote, though
    // the file itself is 0644 and the volume 0777.
    let user = TempUser::new(&[]);
    let out = user.run("cat", &[secret.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the user read the secret");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cr3t"));
    // Root can (the check above is about permissions, not a wrong path).
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "s3cr3t\n");

    agent.remove_manifest("sec.yaml");
    agent.wait_gone("default", "sec", T);
}

/// A `petrel node`, `petrel runtime` or `petrel agent` process with its
/// files under `dir` and no pods: started, then stopped by its pid.
struct Proc(std::process::Child);

impl Proc {
    fn start(dir: &Path, cmd: &str, cgroup: &str) -> Proc {
        let root = dir.join("root");
        let mut c = Command::new(petrel_bin());
        c.arg(cmd);
        if cmd != "agent" {
            c.arg("--root")
                .arg(&root)
                .arg("--state")
                .arg(dir.join("state"))
                .args(["--default-cgroup-parent", cgroup])
                .args(["--pod-network", "loopback"])
                .arg("--nri-socket")
                .arg(dir.join("nri/nri.sock"))
                .arg("--nri-plugin-path")
                .arg(dir.join("nri/plugins"));
        } else {
            c.args(["--runtime-endpoint"])
                .arg(format!(
                    "unix://{}",
                    dir.join("state/petrel.sock").display()
                ))
                .arg("--root")
                .arg(root.join("agent"))
                .args(["--cgroup-root", cgroup]);
        }
        if cmd != "runtime" {
            let manifests = dir.join("manifests");
            std::fs::create_dir_all(&manifests).unwrap();
            c.arg("--manifests")
                .arg(&manifests)
                .args(["--listen", "127.0.0.1:0"])
                .arg("--agent-socket")
                .arg(dir.join("agent-sock/agent.sock"))
                .args(["--eviction-hard", "memory.available<100Mi"]);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{cmd}.log")))
            .unwrap();
        let child = c
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let ready = if cmd == "runtime" {
            dir.join("state/petrel.sock")
        } else {
            dir.join("agent-sock/agent.sock")
        };
        let start = Instant::now();
        while !ready.exists() {
            assert!(
                start.elapsed() < T,
                "{cmd} did not start:\n{}",
                std::fs::read_to_string(dir.join(format!("{cmd}.log"))).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Proc(child)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The runtime's root after `steps` (each a command run and stopped in
/// turn), with nothing made open.
fn root_after(steps: &[&str], pre_existing: Option<u32>) {
    let dir = tempfile::Builder::new()
        .prefix("petrel-modes.")
        .tempdir()
        .unwrap();
    open_to_all(dir.path());
    let cgroup = format!("/petrel-test-{}", random_hex());
    let root = dir.path().join("root");
    if let Some(m) = pre_existing {
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(m)).unwrap();
    }
    for step in steps {
        let p = Proc::start(dir.path(), step, &cgroup);
        drop(p);
    }
    for d in [root.clone(), root.join("agent"), dir.path().join("state")] {
        if d.exists() {
            assert_eq!(mode(&d), 0o700, "{steps:?}: {}", d.display());
            let loose = loose_dirs(&d, &by_design);
            assert!(loose.is_empty(), "{steps:?}: open:\n{}", loose.join("\n"));
        }
    }
    petrel_testkit::prelude::remove_cgroup_tree(&cgroup);
}

#[test]
fn petrel_node_root_should_be_private_whichever_part_starts_first() {
    // `petrel node` itself: runtime and agent race for <root>.
    root_after(&["node"], None);
    // The agent made <root> (as <root>/agent's parent) before the runtime.
    root_after(&["agent", "runtime"], None);
    root_after(&["agent", "node"], None);
    // The runtime first, then the agent.
    root_after(&["runtime", "agent"], None);
    // A root left 0755 by an earlier version is narrowed.
    root_after(&["node"], Some(0o755));
}
