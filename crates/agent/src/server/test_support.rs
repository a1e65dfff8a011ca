//! Shared by the log and streaming tests: the real server over a fake
//! runtime, a pod in the store and cache, and raw HTTP/1.1 requests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use petrel_cri::api;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};

use super::{serve, Listeners, ServerState};

/// A connection to the server under test, whichever transport.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection read line by line.
pub(crate) type Conn = BufReader<Box<dyn Io>>;

/// Where a test connects: the unix socket (the whole API) or the TCP
/// port (health and metrics only, in plain HTTP).
#[derive(Debug, Clone)]
pub(crate) enum At {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

pub(crate) async fn connect(at: &At) -> Box<dyn Io> {
    match at {
        At::Tcp(a) => Box::new(TcpStream::connect(a).await.unwrap()),
        At::Unix(p) => Box::new(UnixStream::connect(p).await.unwrap()),
    }
}

/// The server as the agent runs it: plain TCP on loopback and the unix
/// socket in a directory of the test (kept alive by the returned guard).
pub(crate) async fn serve_both(
    state: ServerState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (
    At,
    At,
    tempfile::TempDir,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp = listener.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent/agent.sock");
    let socket = super::socket::bind(&path, None).unwrap();
    let listeners = Listeners {
        tcp: listener,
        tls: None,
        names: Default::default(),
        unix: Some(socket),
        webhook: None,
    };
    let task = tokio::spawn(serve(listeners, state, shutdown));
    (At::Unix(path), At::Tcp(tcp), dir, task)
}
use crate::cache::PodCache;
use crate::health::Health;
use crate::pleg::fake::FakeRuntime;
use crate::status::StatusStore;
use crate::types::{ContainerMeta, PodRuntimeStatus, LABEL_POD_UID};

pub(crate) struct TestServer {
    /// The unix socket.
    pub addr: At,
    /// The TCP port.
    pub tcp: At,
    _dir: tempfile::TempDir,
    pub store: Arc<StatusStore>,
    pub cache: Arc<PodCache>,
    pub rt: Arc<FakeRuntime>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

pub(crate) async fn start() -> TestServer {
    let store = Arc::new(StatusStore::new());
    let cache = Arc::new(PodCache::new());
    let rt = Arc::new(FakeRuntime::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let state = ServerState {
        store: store.clone(),
        health: Arc::new(Health::new(Duration::from_secs(60))),
        registry: Arc::new(Default::default()),
        runtime: rt.clone(),
        cache: cache.clone(),
        node: Arc::new(crate::eviction::NodeState::new()),
        node_name: "test-node".to_string(),
    };
    let (addr, tcp, dir, _task) = serve_both(state, async move {
        let _ = stopped.await;
    })
    .await;
    TestServer {
        addr,
        tcp,
        _dir: dir,
        store,
        cache,
        rt,
        _stop: stop,
    }
}

/// One container instance to put in the cache.
pub(crate) struct Instance {
    pub id: String,
    pub name: String,
    pub restart_count: i32,
    pub running: bool,
    pub log_path: String,
}

impl TestServer {
    /// A running sandbox and a started container `name` in the fake
    /// runtime; returns (sandbox id, container id).
    pub async fn run_container(&self, uid: &str, name: &str) -> (String, String) {
        use crate::cri::RuntimeActuator;
        let sb_config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: "p".into(),
                uid: uid.into(),
                namespace: "ns".into(),
                attempt: 0,
            }),
            labels: [(LABEL_POD_UID.to_string(), uid.to_string())].into(),
            ..Default::default()
        };
        let sb = self.rt.run_pod_sandbox(sb_config.clone()).await.unwrap();
        let c = self
            .rt
            .create_container(
                &sb,
                api::ContainerConfig {
                    metadata: Some(api::ContainerMetadata {
                        name: name.into(),
                        attempt: 0,
                    }),
                    ..Default::default()
                },
                sb_config,
            )
            .await
            .unwrap();
        self.rt.start_container(&c).await.unwrap();
        (sb, c)
    }

    /// Publishes pod `ns/name` (containers `names`) with these runtime
    /// instances (newest first) in sandbox `sandbox`.
    pub fn put_pod(
        &self,
        uid: &str,
        names: &[&str],
        sandbox: Option<&str>,
        instances: &[Instance],
    ) {
        self.store.upsert(Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: names
                    .iter()
                    .map(|n| Container {
                        name: n.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mut status = PodRuntimeStatus {
            uid: uid.into(),
            name: "p".into(),
            namespace: "ns".into(),
            ..Default::default()
        };
        if let Some(sb) = sandbox {
            status.sandboxes.push(api::PodSandboxStatus {
                id: sb.into(),
                ..Default::default()
            });
        }
        for i in instances {
            status.containers.push(api::ContainerStatus {
                id: i.id.clone(),
                metadata: Some(api::ContainerMetadata {
                    name: i.name.clone(),
                    attempt: u32::try_from(i.restart_count).unwrap(),
                }),
                state: if i.running {
                    api::ContainerState::ContainerRunning as i32
                } else {
                    api::ContainerState::ContainerExited as i32
                },
                log_path: i.log_path.clone(),
                ..Default::default()
            });
            status.container_meta.insert(
                i.id.clone(),
                ContainerMeta {
                    restart_count: i.restart_count,
                    sandbox_id: sandbox.unwrap_or_default().into(),
                    ..Default::default()
                },
            );
        }
        self.cache.set(uid, Ok(Arc::new(status)), 1);
    }
}

/// Sends a raw request; returns the open connection.
pub(crate) async fn send(addr: &At, request: &str) -> Conn {
    let mut s = connect(addr).await;
    s.write_all(request.as_bytes()).await.unwrap();
    BufReader::new(s)
}

/// Status and lower-cased headers of a response.
pub(crate) async fn head(r: &mut Conn) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).await.unwrap();
    let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).await.unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    (status, headers)
}

/// The next chunk of a chunked body (None at its end).
pub(crate) async fn chunk(r: &mut Conn) -> Option<Vec<u8>> {
    let mut size = String::new();
    r.read_line(&mut size).await.unwrap();
    let n = usize::from_str_radix(size.trim(), 16).ok()?;
    let mut data = vec![0u8; n + 2];
    r.read_exact(&mut data).await.unwrap();
    data.truncate(n);
    (n > 0).then_some(data)
}

/// A whole GET: status and body.
pub(crate) async fn get(addr: &At, path: &str) -> (u16, String) {
    let mut r = send(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"),
    )
    .await;
    let (status, headers) = head(&mut r).await;
    let mut body = Vec::new();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v == "chunked")
    {
        while let Some(c) = chunk(&mut r).await {
            body.extend(c);
        }
    } else {
        r.read_to_end(&mut body).await.unwrap();
    }
    (status, String::from_utf8(body).unwrap())
}
