//! A local Kubernetes control plane for tests: etcd and kube-apiserver on
//! loopback, each cluster with its own temporary directory (data, PKI,
//! logs, kubeconfigs) and free ports, so several run side by side.
//!
//! Made at start: a CA; the API server's serving certificate (127.0.0.1,
//! localhost, the in-cluster names); an admin client certificate
//! (O=system:masters) and its kubeconfig; the API server's client
//! certificate towards kubelets (also O=system:masters, so kubelet's
//! webhook authorization of it succeeds); a service-account signing key
//! pair. Authorization is `Node,RBAC` and admission includes
//! `NodeRestriction`, as in a real cluster; [`Cluster::node_credentials`]
//! gives each kubelet its own identity (CN=system:node:NAME,
//! O=system:nodes) and a serving certificate the API server verifies.
//!
//! Not run unless asked: kube-controller-manager
//! ([`Cluster::start_controller_manager`], with the controllers a test
//! names, e.g. the garbage collector) and kube-scheduler
//! ([`Cluster::start_scheduler`]); without the scheduler, tests bind pods
//! with `spec.nodeName`. Tests create the `default` ServiceAccount
//! themselves; a pod with the default token volume needs the
//! controller-manager's `root-ca-cert-publisher` (its `kube-root-ca.crt`),
//! others set `automountServiceAccountToken: false`.
//!
//! Dropping a [`Cluster`] stops kube-controller-manager (if started), then
//! kube-apiserver, then etcd, by pid
//! (SIGTERM, then SIGKILL) and removes the directory, also when the test
//! failed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::certs::{CertRequest, Issued, Pki, San};
use crate::kubeconfig::Kubeconfig;
use crate::kubectl::Kubectl;
use crate::process::{describe, free_port, spawn_logged, stop_child, tail};
use crate::KitError;

/// The service network (the API server needs one; nothing routes it).
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The first address of [`SERVICE_CIDR`]: the `kubernetes` service.
const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// How long etcd and kube-apiserver get to become ready (a loaded 2-core
/// machine has taken 25 s for the API server).
const READY_WITHIN: Duration = Duration::from_secs(180);
/// How many times a start is retried when a port picked as free was taken
/// by someone else in the meantime.
const PORT_ATTEMPTS: usize = 3;

/// etcd's ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdPorts {
    /// Client URL port.
    pub client: u16,
    /// Peer URL port (a one-member cluster still listens on one).
    pub peer: u16,
}

/// The `etcd` arguments of a one-member cluster named `name` in `data`.
pub fn etcd_args(name: &str, data: &Path, ports: EtcdPorts) -> Vec<String> {
    let client = format!("http://127.0.0.1:{}", ports.client);
    let peer = format!("http://127.0.0.1:{}", ports.peer);
    vec![
        format!("--name={name}"),
        format!("--data-dir={}", data.display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster={name}={peer}"),
        // Throwaway data: no fsync, so a loaded disk does not stall the
        // API server's writes.
        "--unsafe-no-fsync".into(),
        "--log-level=warn".into(),
    ]
}

/// Files kube-apiserver is started with.
#[derive(Debug, Clone)]
pub struct ApiserverFiles {
    /// Its serving certificate.
    pub serving: Issued,
    /// The CA that client certificates must chain to (and kubelets' serving
    /// certificates).
    pub ca: PathBuf,
    /// Its client certificate towards kubelets.
    pub kubelet_client: Issued,
    /// Service-account token signing key and its public half.
    pub sa_key: PathBuf,
    /// The public half.
    pub sa_pub: PathBuf,
    /// A directory of its own (`--cert-dir`, never used with the files
    /// above, but the default is `/var/run/kubernetes`).
    pub cert_dir: PathBuf,
    /// An audit log of every request (its policy beside it), or none.
    pub audit_log: Option<PathBuf>,
}

/// The audit policy of an audited cluster: one event per request, with
/// who sent it and when, no bodies.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
";

/// The `kube-controller-manager` arguments: the admin kubeconfig for its
/// API calls and its delegated authentication and authorization, its
/// serving port on loopback (a self-signed certificate in `cert_dir`), no
/// leader election, and only `controllers` run (e.g. `garbagecollector`).
pub fn controller_manager_args(
    kubeconfig: &Path,
    port: u16,
    cert_dir: &Path,
    controllers: &[&str],
    signing_ca: &Issued,
) -> Vec<String> {
    let k = kubeconfig.display();
    vec![
        // The CSR signer (`csrsigning`) signs with the cluster's CA.
        format!("--cluster-signing-cert-file={}", signing_ca.cert.display()),
        format!("--cluster-signing-key-file={}", signing_ca.key.display()),
        // What `root-ca-cert-publisher` puts in each namespace's
        // kube-root-ca.crt (the default token volume's ca.crt).
        format!("--root-ca-file={}", signing_ca.cert.display()),
        format!("--kubeconfig={k}"),
        format!("--authentication-kubeconfig={k}"),
        format!("--authorization-kubeconfig={k}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", cert_dir.display()),
        "--leader-elect=false".into(),
        format!("--controllers={}", controllers.join(",")),
        "--use-service-account-credentials=false".into(),
        "--profiling=false".into(),
    ]
}

/// The `kube-scheduler` arguments: the admin kubeconfig for its API calls
/// and its delegated authentication and authorization, its serving port on
/// loopback (a self-signed certificate in `cert_dir`), no leader election.
pub fn scheduler_args(kubeconfig: &Path, port: u16, cert_dir: &Path) -> Vec<String> {
    let k = kubeconfig.display();
    vec![
        format!("--kubeconfig={k}"),
        format!("--authentication-kubeconfig={k}"),
        format!("--authorization-kubeconfig={k}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", cert_dir.display()),
        "--leader-elect=false".into(),
        "--profiling=false".into(),
    ]
}

/// The `kube-apiserver` arguments: loopback, port `port`, etcd at
/// `etcd_client_port`, real-cluster authorization and admission.
pub fn apiserver_args(port: u16, etcd_client_port: u16, f: &ApiserverFiles) -> Vec<String> {
    let p = |p: &Path| p.display().to_string();
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{etcd_client_port}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        // The endpoint reconciler refuses a loopback advertise address, and
        // there is no in-cluster network to publish the service on anyway.
        "--endpoint-reconciler-type=none".into(),
        format!("--cert-dir={}", p(&f.cert_dir)),
        format!("--tls-cert-file={}", p(&f.serving.cert)),
        format!("--tls-private-key-file={}", p(&f.serving.key)),
        format!("--client-ca-file={}", p(&f.ca)),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--anonymous-auth=false".into(),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", p(&f.sa_pub)),
        format!("--service-account-signing-key-file={}", p(&f.sa_key)),
        format!("--service-cluster-ip-range={SERVICE_CIDR}"),
        // logs, exec, port-forward: the API server calls kubelet as this
        // client, checks kubelet's serving certificate against the CA, and
        // dials the node's InternalIP (kubelets' host names resolve
        // nowhere).
        format!("--kubelet-client-certificate={}", p(&f.kubelet_client.cert)),
        format!("--kubelet-client-key={}", p(&f.kubelet_client.key)),
        format!("--kubelet-certificate-authority={}", p(&f.ca)),
        "--kubelet-preferred-address-types=InternalIP".into(),
        // Nodes may join with a bootstrap token (TLS bootstrap).
        "--enable-bootstrap-token-auth".into(),
        "--profiling=false".into(),
    ];
    if let Some(log) = &f.audit_log {
        args.push(format!("--audit-log-path={}", p(log)));
        args.push(format!(
            "--audit-policy-file={}",
            p(&log.with_extension("policy.yaml"))
        ));
        args.push("--audit-log-format=json".into());
    }
    args
}

/// A node name no other test picks: `<prefix>-<8 hex digits>` (RFC 1123
/// when `prefix` is).
pub fn node_name(prefix: &str) -> String {
    let suffix = crate::process::random_suffix();
    format!("{prefix}-{}", &suffix[..8.min(suffix.len())])
}

/// Credentials of one node's kubelet in a [`Cluster`].
#[derive(Debug, Clone)]
pub struct NodeCredentials {
    /// The node's name.
    pub node: String,
    /// The node's IP (`--node-ip`): where the API server dials kubelet.
    pub node_ip: IpAddr,
    /// kubeconfig as `system:node:<node>` in group `system:nodes`.
    pub kubeconfig: PathBuf,
    /// The client certificate the kubeconfig uses.
    pub client: Issued,
    /// The cluster CA: kubelet authenticates the API server's client
    /// certificate with it (`authentication.x509.clientCAFile`).
    pub client_ca: PathBuf,
    /// kubelet's serving certificate (the node's IP and name), signed by the
    /// CA the API server checks kubelets against.
    pub serving: Issued,
}

/// A running etcd + kube-apiserver.
pub struct Cluster {
    dir: tempfile::TempDir,
    pki: Pki,
    /// The admin's client certificate (O=system:masters).
    admin_cert: Issued,
    server: String,
    admin: PathBuf,
    apiserver: Option<Child>,
    etcd: Option<Child>,
    controller_manager: Option<Child>,
    scheduler: Option<Child>,
    /// How the running kube-apiserver was started (for a restart).
    started: Option<ApiserverStart>,
}

/// What a kube-apiserver restart needs to come back the same.
struct ApiserverStart {
    bin: PathBuf,
    etcd_port: u16,
    port: u16,
    files: ApiserverFiles,
}

/// Why cluster tests are left out, if `PETREL_PEERS_SKIP` says so: it
/// names `etcd`, `kubernetes` (the component) or `kube-apiserver` or
/// `kubectl`. Otherwise a missing peer fails the test.
pub fn left_out() -> Option<String> {
    ["etcd", "kubernetes", "kube-apiserver", "kubectl"]
        .into_iter()
        .find(|c| crate::peers::left_out(c))
        .map(|c| format!("{c} left out (PETREL_PEERS_SKIP)"))
}

impl Cluster {
    /// Makes the certificates, starts etcd and kube-apiserver on free
    /// loopback ports and waits until `/readyz` answers `ok` (up to 3 min).
    pub fn start() -> Result<Cluster, KitError> {
        Self::start_with(false)
    }

    /// [`Cluster::start`] with an audit log of every request
    /// ([`Cluster::audit_log`]): who asked what, and when.
    pub fn start_audited() -> Result<Cluster, KitError> {
        Self::start_with(true)
    }

    fn start_with(audited: bool) -> Result<Cluster, KitError> {
        let etcd_bin = crate::peers::peer_binary("etcd")?;
        let apiserver_bin = crate::peers::peer_binary("kube-apiserver")?;
        crate::peers::peer_binary("kubectl")?;
        let dir = crate::process::kit_tempdir("petrel-cluster.")?;
        let pki = Pki::create(&dir.path().join("pki"), "petrel-test-ca")?;
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut sans = vec![San::Dns("localhost".into()), San::Ip(loopback)];
        for n in [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ] {
            sans.push(San::Dns(n.into()));
        }
        sans.push(San::Ip(IpAddr::V4(SERVICE_IP)));
        let serving = pki.issue(&CertRequest::server("apiserver", "kube-apiserver", sans))?;
        let admin = pki.issue(&CertRequest::client(
            "admin",
            "petrel-admin",
            &["system:masters"],
        ))?;
        let kubelet_client = pki.issue(&CertRequest::client(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            &["system:masters"],
        ))?;
        let (sa_key, sa_pub) = pki.service_account_keys()?;
        let files = ApiserverFiles {
            serving,
            ca: pki.ca_cert().to_path_buf(),
            kubelet_client,
            sa_key,
            sa_pub,
            cert_dir: dir.path().join("apiserver-certs"),
            audit_log: audited.then(|| dir.path().join("audit.log")),
        };
        if let Some(log) = &files.audit_log {
            let policy = log.with_extension("policy.yaml");
            std::fs::write(&policy, AUDIT_POLICY).map_err(|e| KitError::io("write", &policy, e))?;
        }
        let mut cluster = Cluster {
            server: String::new(),
            admin: dir.path().join("admin.kubeconfig"),
            admin_cert: admin.clone(),
            pki,
            dir,
            apiserver: None,
            etcd: None,
            controller_manager: None,
            scheduler: None,
            started: None,
        };
        let etcd_port = cluster.start_etcd(&etcd_bin)?;
        cluster.start_apiserver(&apiserver_bin, etcd_port, &files)?;
        Kubeconfig {
            server: cluster.server.clone(),
            ca: cluster.pki.ca_cert().to_path_buf(),
            cert: admin.cert,
            key: admin.key,
            user: "petrel-admin".into(),
        }
        .write(&cluster.admin)?;
        cluster.wait_ready()?;
        Ok(cluster)
    }

    fn start_etcd(&mut self, bin: &Path) -> Result<u16, KitError> {
        let log = self.etcd_log();
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let ports = EtcdPorts {
                client: free_port()?,
                peer: free_port()?,
            };
            let data = self.dir.path().join("etcd");
            let _ = std::fs::remove_dir_all(&data);
            let mut cmd = Command::new(bin);
            cmd.args(etcd_args("petrel", &data, ports));
            let command = describe(&cmd);
            let mut child = spawn_logged("etcd", &mut cmd, &log)?;
            let addr = SocketAddr::from(([127, 0, 0, 1], ports.client));
            let start = Instant::now();
            let outcome = loop {
                if let Ok(r) = crate::http::get(addr, "/health", Duration::from_secs(2)) {
                    if r.body.contains("\"health\":\"true\"") {
                        break Ok(());
                    }
                }
                if let Ok(Some(st)) = child.try_wait() {
                    break Err(format!("exited at start ({st})"));
                }
                if start.elapsed() > READY_WITHIN {
                    break Err(format!("no healthy /health within {READY_WITHIN:?}"));
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            match outcome {
                Ok(()) => {
                    self.etcd = Some(child);
                    return Ok(ports.client);
                }
                Err(detail) => {
                    stop_child(&mut child, Duration::from_secs(5));
                    let err = KitError::Start {
                        component: "etcd".into(),
                        command,
                        log: log.clone(),
                        detail: format!("{detail}; last lines: {}", tail(&log, 5)),
                    };
                    if !tail(&log, 20).contains("address already in use") {
                        return Err(err);
                    }
                    last = Some(err);
                }
            }
        }
        Err(last.unwrap_or_else(|| KitError::Start {
            component: "etcd".into(),
            command: bin.display().to_string(),
            log,
            detail: "no attempt made".into(),
        }))
    }

    fn start_apiserver(
        &mut self,
        bin: &Path,
        etcd_port: u16,
        files: &ApiserverFiles,
    ) -> Result<(), KitError> {
        std::fs::create_dir_all(&files.cert_dir)
            .map_err(|e| KitError::io("create directory", &files.cert_dir, e))?;
        let (child, port) =
            start_on_free_port("kube-apiserver", bin, &self.apiserver_log(), |port| {
                apiserver_args(port, etcd_port, files)
            })?;
        self.apiserver = Some(child);
        self.server = format!("https://127.0.0.1:{port}");
        self.started = Some(ApiserverStart {
            bin: bin.to_path_buf(),
            etcd_port,
            port,
            files: files.clone(),
        });
        Ok(())
    }

    /// Waits for `/readyz` to say `ok`, asked through kubectl as admin.
    fn wait_ready(&mut self) -> Result<(), KitError> {
        let kubectl = self.kubectl()?;
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < READY_WITHIN {
            if let Some(c) = self.apiserver.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(self.not_ready(format!("exited ({st})")));
                }
            }
            match kubectl.run_with(&["get", "--raw=/readyz"], None, Duration::from_secs(20)) {
                Ok(out) if out.status.success() && out.stdout.starts_with(b"ok") => return Ok(()),
                Ok(out) => {
                    last = format!(
                        "{}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    )
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Err(self.not_ready(format!(
            "/readyz not ok within {READY_WITHIN:?}: {}",
            last.trim()
        )))
    }

    fn not_ready(&self, detail: String) -> KitError {
        KitError::Start {
            component: "kube-apiserver".into(),
            command: format!("kube-apiserver (server {})", self.server),
            log: self.apiserver_log(),
            detail,
        }
    }

    /// Compacts etcd's history up to its current revision, so a watch from
    /// any older resourceVersion is answered 410 Gone (as after the API
    /// server's periodic compaction, which comes only every 5 min).
    /// Blocking; returns the revision compacted to.
    pub fn compact_etcd(&self) -> Result<i64, KitError> {
        let Some(start) = self.started.as_ref() else {
            return Err(self.not_ready("not started, no etcd to compact".into()));
        };
        let etcdctl = crate::peers::peer_binary("etcdctl")?;
        let endpoint = format!("--endpoints=http://127.0.0.1:{}", start.etcd_port);
        let run = |args: &[&str]| -> Result<String, KitError> {
            let mut cmd = Command::new(&etcdctl);
            cmd.arg(&endpoint).args(args);
            let out = cmd.output().map_err(|e| KitError::io("run", &etcdctl, e))?;
            if !out.status.success() {
                return Err(KitError::Start {
                    component: "etcdctl".into(),
                    command: describe(&cmd),
                    log: self.etcd_log(),
                    detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let status = run(&["get", "petrel-compaction-probe", "-w", "json"])?;
        let revision = serde_json::from_str::<serde_json::Value>(&status)
            .ok()
            .and_then(|v| v["header"]["revision"].as_i64())
            .ok_or_else(|| KitError::Start {
                component: "etcdctl".into(),
                command: "etcdctl get -w json".into(),
                log: self.etcd_log(),
                detail: format!("no header.revision in {status:?}"),
            })?;
        run(&["compact", &revision.to_string()])?;
        Ok(revision)
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL) and starts it again on
    /// the same port with the same files and etcd, so clients see an API
    /// server restart (their connections break; the data stays); returns
    /// once `/readyz` is `ok` again. Blocking.
    pub fn restart_apiserver(&mut self) -> Result<(), KitError> {
        self.restart_apiserver_after(Duration::ZERO)
    }

    /// [`Cluster::restart_apiserver`], with the API server down for `down`
    /// between (an outage: clients' requests are refused meanwhile).
    pub fn restart_apiserver_after(&mut self, down: Duration) -> Result<(), KitError> {
        let Some(start) = self.started.take() else {
            return Err(self.not_ready("never started, so not restartable".into()));
        };
        if let Some(mut c) = self.apiserver.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        std::thread::sleep(down);
        let log = self.apiserver_log();
        let mut cmd = Command::new(&start.bin);
        cmd.args(apiserver_args(start.port, start.etcd_port, &start.files));
        self.apiserver = Some(spawn_logged("kube-apiserver", &mut cmd, &log)?);
        self.started = Some(start);
        self.wait_ready()
    }

    /// Starts kube-controller-manager with only `controllers` (e.g.
    /// `["garbagecollector"]`) against this cluster, as admin; returns once
    /// it serves its port (its controllers then sync their caches on their
    /// own: wait for their effect, not for this call). Stopped on drop.
    pub fn start_controller_manager(&mut self, controllers: &[&str]) -> Result<(), KitError> {
        self.start_controller_manager_with(controllers, &[])
    }

    /// [`Cluster::start_controller_manager`] with `extra` flags last (e.g.
    /// `--cluster-signing-duration=1m` for short-lived node certificates).
    pub fn start_controller_manager_with(
        &mut self,
        controllers: &[&str],
        extra: &[&str],
    ) -> Result<(), KitError> {
        let bin = crate::peers::peer_binary("kube-controller-manager")?;
        if let Some(mut c) = self.controller_manager.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        let cert_dir = self.dir.path().join("controller-manager-certs");
        std::fs::create_dir_all(&cert_dir)
            .map_err(|e| KitError::io("create directory", &cert_dir, e))?;
        let log = self.controller_manager_log();
        let (child, _) = start_on_free_port("kube-controller-manager", &bin, &log, |port| {
            let mut args =
                controller_manager_args(&self.admin, port, &cert_dir, controllers, self.pki.ca());
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        })?;
        self.controller_manager = Some(child);
        Ok(())
    }

    /// Starts kube-scheduler against this cluster, as admin; returns once it
    /// serves its port (it schedules once its caches have synced). Stopped
    /// on drop.
    pub fn start_scheduler(&mut self) -> Result<(), KitError> {
        let bin = crate::peers::peer_binary("kube-scheduler")?;
        if let Some(mut c) = self.scheduler.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        let cert_dir = self.dir.path().join("scheduler-certs");
        std::fs::create_dir_all(&cert_dir)
            .map_err(|e| KitError::io("create directory", &cert_dir, e))?;
        let log = self.scheduler_log();
        let (child, _) = start_on_free_port("kube-scheduler", &bin, &log, |port| {
            scheduler_args(&self.admin, port, &cert_dir)
        })?;
        self.scheduler = Some(child);
        Ok(())
    }

    /// kube-scheduler's log file.
    pub fn scheduler_log(&self) -> PathBuf {
        self.dir.path().join("kube-scheduler.log")
    }

    /// kube-controller-manager's log file.
    pub fn controller_manager_log(&self) -> PathBuf {
        self.dir.path().join("kube-controller-manager.log")
    }

    /// The audit log (JSON lines, one per request stage), if audited.
    pub fn audit_log(&self) -> Option<&Path> {
        self.started
            .as_ref()
            .and_then(|s| s.files.audit_log.as_deref())
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The cluster CA's certificate.
    pub fn ca_cert(&self) -> &Path {
        self.pki.ca_cert()
    }

    /// A bootstrap kubeconfig for TLS bootstrap, as kubeadm sets one up: a
    /// bootstrap token (group `system:bootstrappers`) in `kube-system`, the
    /// bindings that let that group ask for node client certificates and
    /// have them approved, and nodes renew theirs. The controller manager
    /// must run `csrapproving` and `csrsigning` for requests to be served.
    pub fn bootstrap_kubeconfig(&self) -> Result<PathBuf, KitError> {
        let hex = crate::process::random_suffix();
        let id: String = hex
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(6)
            .collect();
        let secret: String = format!("{hex}{hex}")
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(16)
            .collect();
        let kc = self.kubectl()?;
        kc.apply(&format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: bootstrap-token-{id}, namespace: kube-system}}\n\
             type: bootstrap.kubernetes.io/token\nstringData:\n  token-id: \"{id}\"\n  token-secret: \"{secret}\"\n\
             \x20 usage-bootstrap-authentication: \"true\"\n"
        ))?;
        for (name, role, group) in [
            (
                "petrel:node-bootstrapper",
                "system:node-bootstrapper",
                "system:bootstrappers",
            ),
            (
                "petrel:node-autoapprove-bootstrap",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                "system:bootstrappers",
            ),
            (
                "petrel:node-autoapprove-renewal",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                "system:nodes",
            ),
        ] {
            kc.apply(&format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: \"{name}\"}}\n\
                 roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: \"{role}\"}}\n\
                 subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: Group, name: \"{group}\"}}]\n"
            ))?;
        }
        let path = self.dir.path().join(format!("bootstrap-{id}.kubeconfig"));
        let q = |s: &str| serde_json::Value::from(s).to_string();
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: petrel\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n- name: bootstrap\n  user:\n    token: {token}\n\
             contexts:\n- name: petrel\n  context:\n    cluster: petrel\n    user: bootstrap\n\
             current-context: petrel\n",
            server = q(&self.server),
            ca = q(&self.pki.ca_cert().display().to_string()),
            token = q(&format!("{id}.{secret}")),
        );
        std::fs::write(&path, text).map_err(|e| KitError::io("write", &path, e))?;
        Ok(path)
    }

    /// The admin's client certificate and key (O=system:masters).
    pub fn admin_client(&self) -> &Issued {
        &self.admin_cert
    }

    /// The admin kubeconfig (O=system:masters).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin
    }

    /// The cluster's directory (logs, PKI, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// kube-apiserver's log file.
    pub fn apiserver_log(&self) -> PathBuf {
        self.dir.path().join("kube-apiserver.log")
    }

    /// etcd's log file.
    pub fn etcd_log(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// kubectl as the admin, its HOME in the cluster's directory.
    pub fn kubectl(&self) -> Result<Kubectl, KitError> {
        Kubectl::new(&self.admin, self.dir.path(), &self.apiserver_log())
    }

    /// Makes node `node`'s kubelet credentials: a client certificate and
    /// kubeconfig for `system:node:<node>`, and a serving certificate for
    /// `node_ip` (a non-loopback address of this host: kubelet refuses
    /// loopback; see [`crate::kubelet::node_ip`]).
    pub fn node_credentials(
        &self,
        node: &str,
        node_ip: IpAddr,
    ) -> Result<NodeCredentials, KitError> {
        let client = self.pki.issue(&CertRequest::client(
            &format!("node-{node}"),
            &format!("system:node:{node}"),
            &["system:nodes"],
        ))?;
        let serving = self.pki.issue(&CertRequest::server(
            &format!("kubelet-{node}"),
            node,
            vec![San::Dns(node.to_string()), San::Ip(node_ip)],
        ))?;
        let kubeconfig = self.dir.path().join(format!("node-{node}.kubeconfig"));
        Kubeconfig {
            server: self.server.clone(),
            ca: self.pki.ca_cert().to_path_buf(),
            cert: client.cert.clone(),
            key: client.key.clone(),
            user: format!("system:node:{node}"),
        }
        .write(&kubeconfig)?;
        Ok(NodeCredentials {
            node: node.to_string(),
            node_ip,
            kubeconfig,
            client,
            client_ca: self.pki.ca_cert().to_path_buf(),
            serving,
        })
    }
}

/// Starts `component` (`bin` with `args(port)`, output to `log`) on a free
/// loopback port and waits until it listens there; a port taken by someone
/// else meanwhile ("address already in use") is retried with another.
fn start_on_free_port(
    component: &str,
    bin: &Path,
    log: &Path,
    args: impl Fn(u16) -> Vec<String>,
) -> Result<(Child, u16), KitError> {
    let mut last = None;
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port()?;
        let mut cmd = Command::new(bin);
        cmd.args(args(port));
        let command = describe(&cmd);
        let mut child = spawn_logged(component, &mut cmd, log)?;
        match wait_listening(&mut child, port) {
            Ok(()) => return Ok((child, port)),
            Err(detail) => {
                stop_child(&mut child, Duration::from_secs(5));
                let err = KitError::Start {
                    component: component.into(),
                    command,
                    log: log.to_path_buf(),
                    detail: format!("{detail}; last lines: {}", tail(log, 5)),
                };
                if !tail(log, 20).contains("address already in use") {
                    return Err(err);
                }
                last = Some(err);
            }
        }
    }
    Err(last.unwrap_or_else(|| KitError::Start {
        component: component.into(),
        command: bin.display().to_string(),
        log: log.to_path_buf(),
        detail: "no attempt made".into(),
    }))
}

/// Waits until `child` listens on loopback port `port`: bound within
/// seconds, or gone (an address in use ends it at once); a port that
/// accepts is ours.
fn wait_listening(child: &mut Child, port: u16) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("exited at start ({st})"));
        }
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
            return Ok(());
        }
        if start.elapsed() > READY_WITHIN {
            return Err(format!("not listening on {addr} within {READY_WITHIN:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.scheduler.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        if let Some(mut c) = self.controller_manager.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        if let Some(mut c) = self.apiserver.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        if let Some(mut c) = self.etcd.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
        // A failing test's messages name these logs, which go with the
        // directory: show their ends first.
        if std::thread::panicking() {
            for log in [
                self.scheduler_log(),
                self.controller_manager_log(),
                self.apiserver_log(),
                self.etcd_log(),
            ] {
                if !log.exists() {
                    continue;
                }
                eprintln!("--- last lines of {}:\n{}", log.display(), tail(&log, 30));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> ApiserverFiles {
        let i = |n: &str| Issued {
            cert: PathBuf::from(format!("/p/{n}.crt")),
            key: PathBuf::from(format!("/p/{n}.key")),
        };
        ApiserverFiles {
            serving: i("apiserver"),
            ca: "/p/ca.crt".into(),
            kubelet_client: i("kc"),
            sa_key: "/p/sa.key".into(),
            sa_pub: "/p/sa.pub".into(),
            cert_dir: "/p/certs".into(),
            audit_log: None,
        }
    }

    #[test]
    fn apiserver_args_should_audit_only_when_asked() {
        let plain = apiserver_args(6443, 2379, &files());
        assert!(!plain.iter().any(|a| a.starts_with("--audit")), "{plain:?}");
        let audited = ApiserverFiles {
            audit_log: Some("/d/audit.log".into()),
            ..files()
        };
        let args = apiserver_args(6443, 2379, &audited);
        for want in [
            "--audit-log-path=/d/audit.log",
            "--audit-policy-file=/d/audit.policy.yaml",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing: {args:?}");
        }
    }

    #[test]
    fn apiserver_args_should_enable_node_authorization_and_node_restriction() {
        let args = apiserver_args(6443, 2379, &files());
        for want in [
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--etcd-servers=http://127.0.0.1:2379",
            "--secure-port=6443",
            "--bind-address=127.0.0.1",
            "--client-ca-file=/p/ca.crt",
            "--kubelet-client-certificate=/p/kc.crt",
            "--kubelet-certificate-authority=/p/ca.crt",
            "--kubelet-preferred-address-types=InternalIP",
            "--cert-dir=/p/certs",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing: {args:?}");
        }
    }

    #[test]
    fn controller_manager_args_should_run_only_the_named_controllers_on_loopback() {
        let args = controller_manager_args(
            Path::new("/d/admin.kubeconfig"),
            10257,
            Path::new("/d/kcm-certs"),
            &["garbagecollector", "namespace"],
            &Issued {
                cert: PathBuf::from("/p/ca.crt"),
                key: PathBuf::from("/p/ca.key"),
            },
        );
        for want in [
            "--cluster-signing-cert-file=/p/ca.crt",
            "--cluster-signing-key-file=/p/ca.key",
            "--kubeconfig=/d/admin.kubeconfig",
            "--authentication-kubeconfig=/d/admin.kubeconfig",
            "--authorization-kubeconfig=/d/admin.kubeconfig",
            "--bind-address=127.0.0.1",
            "--secure-port=10257",
            "--cert-dir=/d/kcm-certs",
            "--leader-elect=false",
            "--controllers=garbagecollector,namespace",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing: {args:?}");
        }
    }

    #[test]
    fn scheduler_args_should_serve_on_loopback_without_leader_election() {
        let a = scheduler_args(
            Path::new("/d/admin.kubeconfig"),
            4321,
            Path::new("/d/certs"),
        );
        for want in [
            "--kubeconfig=/d/admin.kubeconfig",
            "--bind-address=127.0.0.1",
            "--secure-port=4321",
            "--cert-dir=/d/certs",
            "--leader-elect=false",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} missing from {a:?}");
        }
    }

    #[test]
    fn etcd_args_should_keep_every_url_on_loopback_and_data_in_its_directory() {
        let args = etcd_args("n", Path::new("/d/etcd"), EtcdPorts { client: 1, peer: 2 });
        assert!(args.contains(&"--data-dir=/d/etcd".to_string()));
        assert!(args.contains(&"--initial-cluster=n=http://127.0.0.1:2".to_string()));
        for a in args.iter().filter(|a| a.contains("http://")) {
            assert!(a.contains("http://127.0.0.1:"), "{a}");
        }
    }
}
