//! A measurement, not a check: the two List calls of an agent's relist
//! (ListPodSandbox and ListContainers with the node's label selector) at
//! 1000 pods of 5 containers, over the runtime's real gRPC server on a unix
//! socket, without making a single container. Records like the agent's
//! (its labels and annotations) are put straight into the runtime's state.
//!
//! ```text
//! cargo test --release -p petrel-runtime list_perf -- --ignored --nocapture
//! ```
//!
//! Environment: `LIST_PERF_PODS` (1000), `LIST_PERF_ROUNDS` (30),
//! `LIST_PERF_ONLY` (a substring of the client variants to run),
//! `LIST_PERF_SHAPE=bench` (the records and calls of `make bench`'s P3:
//! 10 containers per pod without labels or annotations, unfiltered calls),
//! `LIST_PERF_CLIENT=current` (the client on one thread, as `petrel ctl`). Client and
//! server in separate processes, as agent and runtime are: one test binary
//! with `LIST_PERF_SERVE=<seconds>` (it prints its socket), another with
//! `LIST_PERF_SOCKET=<path>`; the server stops at SIGINT/SIGTERM or when
//! its time is up, removing its temporary root. Wall times on a shared 2-vCPU machine move by
//! tens of percent; the client's instruction count does not:
//! `valgrind --tool=cachegrind --cache-sim=no` on the client with two round
//! counts, the difference divided by the rounds' difference.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
use tokio::signal::unix::{signal, SignalKind};
use tonic::codegen::http;

use crate::config::RuntimeConfig;
use crate::records::{ContainerRecord, ContainerState, SandboxRecord, SandboxState};
use crate::service::Runtime;
use crate::state::{Container, Sandbox};

const NODE: &str = "bench-0123456789ab";
const LABEL_NODE: &str = "petrel.io/node";

fn hex_id(kind: u8, i: usize) -> String {
    format!("{kind:02x}{i:062x}")
}

fn pod_labels(pod: usize) -> HashMap<String, String> {
    HashMap::from([
        ("io.kubernetes.pod.name".into(), format!("idle-{pod:04}")),
        ("io.kubernetes.pod.namespace".into(), "bench".into()),
        (
            "io.kubernetes.pod.uid".into(),
            format!("5f0c2a4e-{pod:04}-4b1e-9a3c-0d7e6f1a2b3c"),
        ),
        (LABEL_NODE.into(), NODE.into()),
    ])
}

/// A sandbox like the agent's for pod `pod` (no pod labels or annotations).
pub(crate) fn sandbox_record(pod: usize) -> SandboxRecord {
    let labels = pod_labels(pod);
    SandboxRecord {
        id: hex_id(1, pod),
        name: format!("idle-{pod:04}_bench_uid_0"),
        config: api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: labels["io.kubernetes.pod.name"].clone(),
                uid: labels["io.kubernetes.pod.uid"].clone(),
                namespace: "bench".into(),
                attempt: 0,
            }),
            hostname: format!("idle-{pod:04}"),
            log_directory: format!("/var/log/pods/bench_idle-{pod:04}"),
            labels,
            ..Default::default()
        },
        runtime_handler: String::new(),
        state: SandboxState::Ready,
        created_at: 1_700_000_000_000_000_000 + pod as i64 * 1000,
        dir: format!("/run/petrel/sandboxes/{}", hex_id(1, pod)).into(),
        netns: None,
        ipcns: None,
        utsns: None,
        userns: None,
        pid_holder: None,
        shm_mounted: true,
        cgroup_parent: "/petrel-bench/agent/pod".into(),
        created_cgroups: Vec::new(),
        created_cgroup_dirs: Vec::new(),
        network: None,
        released_ips: Vec::new(),
    }
}

/// Container `c` of pod `pod`, with the agent's labels and annotations.
pub(crate) fn container_record(pod: usize, c: usize) -> ContainerRecord {
    let mut labels = pod_labels(pod);
    labels.insert("io.kubernetes.container.name".into(), format!("c{c}"));
    let annotations = HashMap::from([
        (
            "io.kubernetes.container.hash".into(),
            "0123456789abcdef".into(),
        ),
        ("io.kubernetes.container.restartCount".into(), "0".into()),
        ("petrel.io/container-kind".into(), "app".into()),
        (
            "io.kubernetes.pod.terminationGracePeriod".into(),
            "0".into(),
        ),
        (
            "io.kubernetes.container.terminationMessagePath".into(),
            "/dev/termination-log".into(),
        ),
    ]);
    let image = "docker.io/petrel/busybox:latest".to_string();
    ContainerRecord {
        id: hex_id(2, pod * 8 + c),
        sandbox_id: hex_id(1, pod),
        name: format!("c{c}_idle-{pod:04}_bench_uid_0"),
        config: api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: format!("c{c}"),
                attempt: 0,
            }),
            image: Some(api::ImageSpec {
                image: image.clone(),
                user_specified_image: image,
                ..Default::default()
            }),
            command: vec!["sleep".into(), "86400".into()],
            labels,
            annotations,
            log_path: format!("c{c}/0.log"),
            ..Default::default()
        },
        image_id: format!("sha256:{}", hex_id(3, 0)),
        state: ContainerState::Running,
        created_at: 1_700_000_000_000_000_000 + (pod * 8 + c) as i64 * 1000,
        started_at: 1,
        finished_at: 0,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        pid: 1,
        init_start_time: 1,
        own_pid_ns: true,
        shim: None,
        bundle: "/b".into(),
        layer_dir: "/l".into(),
        log_path: None,
        cgroup_path: "/c".into(),
        resources: None,
        user: None,
        restored_from: None,
        image_volumes: Vec::new(),
    }
}

/// Whether the records and calls are those of `make bench`'s P3 (read
/// once: the requests are built inside the timed calls).
fn bench_shape() -> bool {
    static SHAPE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHAPE.get_or_init(|| std::env::var("LIST_PERF_SHAPE").is_ok_and(|s| s == "bench"))
}

/// Container `c` of pod `pod` as the bench makes it: no labels or
/// annotations, the image as named in the config.
fn bench_container_record(pod: usize, c: usize) -> ContainerRecord {
    let mut rec = container_record(pod, c);
    rec.config.labels.clear();
    rec.config.annotations.clear();
    rec.config.metadata = Some(api::ContainerMetadata {
        name: format!("extra-{c}"),
        attempt: 0,
    });
    if let Some(image) = rec.config.image.as_mut() {
        image.user_specified_image.clear();
    }
    rec
}

fn fill(rt: &Runtime, pods: usize, per_pod: usize) {
    for p in 0..pods {
        let sb = Arc::new(Sandbox::new(sandbox_record(p)));
        for c in 0..per_pod {
            let rec = if bench_shape() {
                bench_container_record(p, c)
            } else {
                container_record(p, c)
            };
            sb.add_container(&rec.id);
            rt.state.insert_container(Arc::new(Container::new(rec)));
        }
        rt.state.insert_sandbox(sb);
    }
}

fn selector() -> HashMap<String, String> {
    HashMap::from([(LABEL_NODE.to_string(), NODE.to_string())])
}

fn sandbox_request() -> api::ListPodSandboxRequest {
    if bench_shape() {
        return api::ListPodSandboxRequest::default();
    }
    api::ListPodSandboxRequest {
        filter: Some(api::PodSandboxFilter {
            label_selector: selector(),
            ..Default::default()
        }),
    }
}

fn container_request() -> api::ListContainersRequest {
    if bench_shape() {
        return api::ListContainersRequest::default();
    }
    api::ListContainersRequest {
        filter: Some(api::ContainerFilter {
            label_selector: selector(),
            ..Default::default()
        }),
    }
}

/// Wall-clock samples and the process's CPU time per round.
struct Samples {
    wall: Vec<Duration>,
    cpu: Duration,
}

fn process_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Mean, p50, p99 and min of the wall times, and CPU time per round.
fn summary(s: Samples) -> String {
    let mut w = s.wall;
    w.sort();
    let n = w.len().max(1);
    let mean = w.iter().sum::<Duration>() / n as u32;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "mean {:>7.3} ms  p50 {:>7.3} ms  p99 {:>7.3} ms  min {:>7.3} ms  cpu {:>7.3} ms",
        ms(mean),
        ms(w.get(n / 2).copied().unwrap_or_default()),
        ms(w.get((n * 99).div_ceil(100).saturating_sub(1))
            .copied()
            .unwrap_or_default()),
        ms(w.first().copied().unwrap_or_default()),
        ms(s.cpu / n as u32),
    )
}

/// `f` timed `rounds` times after 5 unmeasured ones.
async fn time<F, Fut>(rounds: usize, mut f: F) -> Samples
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..5 {
        f().await;
    }
    let mut wall = Vec::new();
    let cpu = process_cpu();
    for _ in 0..rounds {
        let t = Instant::now();
        f().await;
        wall.push(t.elapsed());
    }
    Samples {
        wall,
        cpu: process_cpu().saturating_sub(cpu),
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The runtime's state filled, its gRPC server running on runtime threads
/// of its own (like a separate process).
struct Served {
    rt: Arc<Runtime>,
    socket: std::path::PathBuf,
    threads: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

#[allow(clippy::unwrap_used)]
fn serve(pods: usize) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        root: dir.path().join("root"),
        state: dir.path().join("state"),
        // Never started: any existing file will do.
        shim_binary: Some(std::env::current_exe().unwrap()),
        runtime_binary: "/bin/sh".into(),
        nri: crate::nri::NriConfig {
            disable: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let socket = config.socket_path();
    let rt = Runtime::open(config).unwrap();
    fill(&rt, pods, if bench_shape() { 10 } else { 5 });
    rt.set_initialized();
    let threads = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let incoming = {
        let _g = threads.enter();
        petrel_cri::bind_unix(&socket, 0o600).unwrap()
    };
    threads.spawn(super::router(&rt).serve_with_incoming(incoming));
    Served {
        rt,
        socket,
        threads,
        _dir: dir,
    }
}

/// The server's work and the client's decode, in this process.
#[allow(clippy::unwrap_used)]
async fn in_process(rt: &Arc<Runtime>, rounds: usize) {
    let sb_bytes =
        prost::Message::encode_to_vec(&rt.list_pod_sandbox(sandbox_request()).await.unwrap());
    let c_bytes = super::container_list::list_containers_encoded(&rt.state, &container_request());
    println!(
        "ListPodSandbox response {} bytes, ListContainers response {} bytes",
        sb_bytes.len(),
        c_bytes.len()
    );
    let s = time(rounds, || async {
        let r = rt.list_pod_sandbox(sandbox_request()).await.unwrap();
        std::hint::black_box(prost::Message::encode_to_vec(&r));
    })
    .await;
    println!("server ListPodSandbox build+encode   {}", summary(s));
    let s = time(rounds, || async {
        std::hint::black_box(super::sandbox_list::list_pod_sandbox_encoded(
            &rt.state,
            &sandbox_request(),
        ));
    })
    .await;
    println!("server ListPodSandbox (cached)       {}", summary(s));
    let s = time(rounds, || async {
        std::hint::black_box(super::container_list::list_containers_encoded(
            &rt.state,
            &container_request(),
        ));
    })
    .await;
    println!("server ListContainers (cached)       {}", summary(s));
    let s = time(rounds, || async {
        let r: api::ListPodSandboxResponse = prost::Message::decode(&sb_bytes[..]).unwrap();
        std::hint::black_box(r);
    })
    .await;
    println!("client decode+drop ListPodSandbox    {}", summary(s));
    let s = time(rounds, || async {
        let r: api::ListContainersResponse = prost::Message::decode(&c_bytes[..]).unwrap();
        std::hint::black_box(r);
    })
    .await;
    println!("client decode+drop ListContainers    {}", summary(s));
}

/// Whether variant `name` is measured (`LIST_PERF_ONLY`: a substring of
/// the names wanted; all when unset).
fn wanted(name: &str) -> bool {
    std::env::var("LIST_PERF_ONLY").map_or(true, |only| name.contains(&only))
}

/// The two calls over gRPC: with the generated client (as the bench's
/// reference), undecoded, and with `petrel_cri::ListClient` (as the agent).
#[allow(clippy::unwrap_used)]
async fn over_grpc(socket: &std::path::Path, rounds: usize) {
    let ch = petrel_cri::connect_lazy(&socket.to_string_lossy()).unwrap();
    let generated = RuntimeServiceClient::new(ch.clone()).max_decoding_message_size(64 << 20);
    let list = petrel_cri::ListClient::new(ch.clone()).max_decoding_message_size(64 << 20);
    let raw = tonic::client::Grpc::new(ch).max_decoding_message_size(64 << 20);
    if wanted("generated Version") {
        let s = time(rounds, || {
            let mut c = generated.clone();
            async move {
                c.version(api::VersionRequest::default()).await.unwrap();
            }
        })
        .await;
        println!("generated Version                    {}", summary(s));
    }
    if wanted("generated ListPodSandbox") {
        let s = time(rounds, || {
            let mut c = generated.clone();
            async move {
                c.list_pod_sandbox(sandbox_request()).await.unwrap();
            }
        })
        .await;
        println!("generated ListPodSandbox             {}", summary(s));
    }
    if wanted("generated ListContainers") {
        let s = time(rounds, || {
            let mut c = generated.clone();
            async move {
                c.list_containers(container_request()).await.unwrap();
            }
        })
        .await;
        println!("generated ListContainers             {}", summary(s));
    }
    if wanted("undecoded ListContainers") {
        let s = time(rounds, || {
            let mut g = raw.clone();
            async move {
                g.ready().await.unwrap();
                let path = "/runtime.v1.RuntimeService/ListContainers";
                let path = http::uri::PathAndQuery::from_static(path);
                let req = tonic::Request::new(container_request());
                std::hint::black_box(g.unary(req, path, RawCodec).await.unwrap());
            }
        })
        .await;
        println!("undecoded ListContainers             {}", summary(s));
    }
    if wanted("generated both") {
        let s = time(rounds, || {
            let mut c = generated.clone();
            async move {
                c.list_pod_sandbox(sandbox_request()).await.unwrap();
                c.list_containers(container_request()).await.unwrap();
            }
        })
        .await;
        println!("generated both (a relist's calls)    {}", summary(s));
    }
    if wanted("ListClient both") {
        let s = time(rounds, || {
            let mut c = list.clone();
            async move {
                c.list_pod_sandbox(sandbox_request()).await.unwrap();
                c.list_containers(container_request()).await.unwrap();
            }
        })
        .await;
        println!("ListClient both (the agent's)        {}", summary(s));
    }
}

/// Everything in one process, or (`LIST_PERF_SERVE=<seconds>`) the server
/// alone, or (`LIST_PERF_SOCKET=<path>`) the client alone against it.
#[test]
#[ignore = "a measurement: cargo test --release -p petrel-runtime list_perf -- --ignored --nocapture"]
#[allow(clippy::unwrap_used)]
fn list_perf() {
    let pods = env_usize("LIST_PERF_PODS", 1000);
    let rounds = env_usize("LIST_PERF_ROUNDS", 30);
    // `LIST_PERF_CLIENT=current`: the client on one thread, as `petrel ctl`.
    let client = if std::env::var("LIST_PERF_CLIENT").is_ok_and(|c| c == "current") {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    if let Ok(socket) = std::env::var("LIST_PERF_SOCKET") {
        println!("client of {socket}");
        client.block_on(over_grpc(socket.as_ref(), rounds));
        return;
    }
    let served = serve(pods);
    println!("{pods} pods served on {}", served.socket.display());
    if let Ok(secs) = std::env::var("LIST_PERF_SERVE") {
        // Until the time is up or SIGINT/SIGTERM: either way the temporary
        // root is dropped below, not left behind.
        let secs = Duration::from_secs(secs.parse().unwrap_or(60));
        client.block_on(async {
            let mut term = signal(SignalKind::terminate()).unwrap();
            tokio::select! {
                _ = tokio::time::sleep(secs) => {}
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        });
    } else {
        client.block_on(async {
            in_process(&served.rt, rounds).await;
            over_grpc(&served.socket, rounds).await;
        });
    }
    served.threads.shutdown_background();
}

/// ListContainers with the response kept as bytes (transport alone).
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = api::ListContainersRequest;
    type Decode = bytes::Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = api::ListContainersRequest;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Self::Item,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        prost::Message::encode(&item, dst).map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = bytes::Bytes;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Self::Item>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
