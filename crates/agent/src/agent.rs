//! Wiring: the agent's parts started in order. Each hands pod UIDs
//! straight to the work queue (no relay tasks): the source's watch, the
//! PLEG (which publishes the pod's status first) and the probes call it
//! from their own tasks.
//!
//! ```text
//! manifests --inotify--> source --change (urgent)--+
//! runtime --events/relist--> PLEG --event (urgent)-+--> work queue --> one worker per pod --> CRI
//!                               \--> status now  |        ^
//! probes --result (urgent/normal)------------------+        |
//! resync timer (background, spread) ------------------------+
//! ```

use std::collections::HashSet;
use std::future::Future;
use std::net::{IpAddr, UdpSocket};
use std::sync::{Arc, Weak};
use std::time::Duration;

use petrel_controller::{
    run_per_key, ItemExponential, MaxOf, Priority, QueueConfig, TokenBucket, WorkQueue,
};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use crate::cache::PodCache;
use crate::config::AgentConfig;
use crate::cri::{CriRuntime, RuntimeActuator, RuntimeObserver};
use crate::health::Health;
use crate::metrics::AgentMetrics;
use crate::pleg::{EventSink, Pleg, PlegConfig, PodLifecycleEvent};
use crate::probe::{ChangeSink, ProbeChange, ProbeManager};
use crate::source::{PodSource, SourceError};
use crate::status::StatusStore;
use crate::worker::{PodWorkers, WorkerConfig};

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The manifest directory could not be read or watched.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The runtime endpoint is malformed.
    #[error(transparent)]
    Endpoint(#[from] petrel_cri::ClientError),
    /// The HTTP server could not listen.
    #[error("listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The server may not or cannot serve as configured (a non-loopback
    /// address without client certificates, unreadable TLS files).
    #[error(transparent)]
    Exposure(#[from] crate::server::tls::ExposureError),
    /// The eviction settings or the node cgroup are invalid.
    #[error(transparent)]
    Config(#[from] crate::eviction::EvictionConfigError),
    /// The agent's root directory could not be created or made private.
    #[error("agent root: {0}")]
    Root(#[from] petrel_fs::DirError),
    /// The unix socket could not be set up.
    #[error(transparent)]
    Socket(#[from] crate::server::socket::SocketError),
    /// `socket_group` names no group.
    #[error("--agent-socket-group: {0}")]
    SocketGroup(String),
    /// Cluster mode could not start (an unusable kubeconfig).
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// The cgroup root cannot be used with the cgroup driver.
    #[error(transparent)]
    CgroupLayout(#[from] crate::qos_cgroups::LayoutError),
}

/// Runs the agent until `shutdown` completes. Pods keep running after it
/// returns and a new agent adopts them; with
/// [`AgentConfig::drain_on_exit`] they are stopped and removed first.
pub async fn run(
    config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AgentError> {
    let node_name = config.effective_node_name();
    config.validate()?;
    // The configured driver's layout must hold; the runtime may name
    // another driver, whose layout is checked once it has.
    config.cgroup_layout(config.cgroup_driver)?;
    if config.workers.is_some() {
        tracing::warn!(
            "agent setting `workers` is obsolete and ignored: every pod has its own worker"
        );
    }
    let cluster_mode = config.kubeconfig.is_some();
    let listen = config.effective_listen();
    // Before anything else: a server that may not run is a start-up error
    // (in cluster mode its certificate may have to be made first: below).
    let standalone_tls = if cluster_mode {
        None
    } else {
        crate::server::tls::server_tls(listen, &config.tls_files())?
    };
    let socket_group = match &config.socket_group {
        Some(g) => Some(
            crate::server::peer::resolve_group(
                g,
                &std::fs::read_to_string("/etc/group").unwrap_or_default(),
            )
            .map_err(AgentError::SocketGroup)?,
        ),
        None => None,
    };
    // The agent's own directory (pod volumes, evictions): 0700, narrowed
    // if it exists wider. Under `petrel node` it is <runtime root>/agent,
    // and whichever of the two creates <runtime root> makes it 0700.
    petrel_fs::ensure_private_root(&config.root, petrel_fs::PRIVATE, None)?;
    // subPath binds live only while a container is made: any found now
    // were left by a killed agent.
    crate::subpath::sweep(&config.root);
    let cert_dir = config
        .cert_dir
        .clone()
        .unwrap_or_else(|| config.root.join("pki"));
    // Cluster mode: a kubeconfig that cannot be used is a start-up error.
    let credentials = match &config.kubeconfig {
        Some(path) => Some(
            crate::cluster::credentials::load(
                &crate::cluster::credentials::CredentialFiles {
                    kubeconfig: path.clone(),
                    bootstrap: config.bootstrap_kubeconfig.clone(),
                    cert_dir: cert_dir.clone(),
                    rotate: config.rotate_certificates,
                },
                &node_name,
            )
            .await?,
        ),
        None => None,
    };
    let kube_client = credentials.as_ref().map(|c| c.client.clone());
    let node_ip = config.node_ip.unwrap_or_else(host_ip);
    // In cluster mode the kubelet API always serves TLS: with the
    // certificate given, else a self-signed one (as kubelet).
    let (tls, tls_files) = if cluster_mode {
        let mut files = config.tls_files();
        if files.cert.is_none() && files.key.is_none() {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            let (cert, key) =
                crate::cluster::serving::ensure_self_signed(&cert_dir, &node_name, &host, node_ip)
                    .map_err(crate::cluster::ClusterError::Serving)?;
            files.cert = Some(cert);
            files.key = Some(key);
        }
        (Some(crate::server::tls::cluster_server_tls(&files)?), files)
    } else {
        (standalone_tls, config.tls_files())
    };
    let node_flags =
        crate::cluster::NodeFlags::parse(&config.node_labels, &config.register_with_taints)?;
    let metrics = AgentMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let runtime: Arc<dyn RuntimeActuator> = Arc::new(CriRuntime::new(
        &config.runtime_endpoint,
        metrics.clone(),
        config.runtime_request_timeout,
    )?);
    // The PLEG and the server only observe; the workers act.
    let observer: Arc<dyn RuntimeObserver> = runtime.clone();
    let cache = Arc::new(PodCache::new());
    let health = Arc::new(Health::new(config.relist_threshold));
    let store = Arc::new(StatusStore::new());
    let node_state = Arc::new(crate::eviction::NodeState::new());
    let source = if config.kubeconfig.is_some() {
        // A node of a cluster may well have no static pods: a missing
        // manifest directory is made (private) rather than refused.
        if !config.manifests.exists() {
            petrel_fs::create_private_dir_all(&config.manifests, petrel_fs::PRIVATE)?;
            tracing::info!(dir = %config.manifests.display(), "no manifest directory: made an empty one");
        }
        PodSource::load_in_cluster(&config.manifests, &node_name)?
    } else {
        PodSource::load(&config.manifests, &node_name)?
    };
    let queue: WorkQueue<String> = WorkQueue::new(
        QueueConfig::default()
            .name("pods")
            .resync_window(config.sync_period / 2)
            // A failed sync (runtime down, say) retries from 50 ms up to
            // 5 s, not client-go's 1000 s: a pod must start soon after the
            // runtime returns, as kubelet's pod workers do.
            .rate_limiter(MaxOf::new(vec![
                Box::new(ItemExponential::<String>::new(
                    Duration::from_millis(50),
                    Duration::from_secs(5),
                )),
                Box::new(TokenBucket::new(50.0, 200)),
            ])),
    );
    queue.register(&mut registry);

    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: listen,
            source,
        })?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server_stop = {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let socket = crate::server::socket::bind(&config.socket, socket_group)?;
    let names = server_names(&node_name, tls.is_some().then_some(tls_files));
    let server = tokio::spawn(crate::server::serve(
        crate::server::Listeners {
            tcp: listener,
            tls,
            names,
            unix: Some(socket),
            webhook: kube_client.as_ref().map(|c| {
                Arc::new(crate::server::webhook::Webhook::new(
                    Arc::new(crate::cluster::delegated::KubeReviewer { client: c.clone() }),
                    &node_name,
                ))
            }),
        },
        crate::server::ServerState {
            store: Arc::clone(&store),
            health: Arc::clone(&health),
            registry: Arc::new(registry),
            runtime: Arc::clone(&observer),
            cache: Arc::clone(&cache),
            node: Arc::clone(&node_state),
            node_name: node_name.clone(),
        },
        server_stop,
    ));
    tracing::info!(listen = %listen, socket = %config.socket.display(), manifests = %config.manifests.display(), node = %node_name, "agent serving");
    if cluster_mode && config.cluster_dns.is_empty() {
        // kubelet warns per pod; once is enough to find the cause.
        tracing::warn!("no --cluster-dns: pods with dnsPolicy ClusterFirst get the host's resolver config (Default), as kubelet does");
    }

    let mut tasks = JoinSet::new();

    // The pod workers once started (the drain at exit needs them).
    let started: std::sync::OnceLock<Arc<PodWorkers>> = std::sync::OnceLock::new();
    let pod_side: std::sync::OnceLock<crate::cluster::PodSide> = std::sync::OnceLock::new();
    let main = async {
        let runtime_name = wait_for_runtime(observer.as_ref(), &health).await;
        let recursive_read_only = supports_recursive_read_only(observer.as_ref()).await;
        let driver = cgroup_driver(observer.as_ref(), config.cgroup_driver).await;
        let layout = config.cgroup_layout(driver)?;
        let cgroup_host = cgroup_host(driver);
        let core = Core {
            runtime: Arc::clone(&runtime),
            cache: Arc::clone(&cache),
            health: Arc::clone(&health),
            metrics: metrics.clone(),
            source: source.clone(),
            store: Arc::clone(&store),
            queue: queue.clone(),
        };
        let workers = build_workers(
            &core,
            PlegConfig {
                mode: config.pleg,
                relist_period: config.relist_period,
                event_relist_period: config.event_relist_period,
                inspect_concurrency: config.inspect_concurrency,
                node_name: node_name.clone(),
            },
            WorkerConfig {
                node_name: node_name.clone(),
                host_ip: node_ip.to_string(),
                runtime_name: runtime_name.clone(),
                cgroups: layout.clone(),
                root: config.root.clone(),
                backoff_initial: config.backoff_initial,
                backoff_max: config.backoff_max,
                seccomp_root: config.seccomp_root(),
                seccomp_default: config.seccomp_default,
                recursive_read_only,
                dns: config.dns_settings(),
            },
        );
        let pleg = workers.pleg().clone();
        tasks.spawn(pleg.clone().run());
        // Adoption waits for the PLEG's first relist, so pods already
        // running are recognised instead of created again.
        let mode = pleg.wait_ready().await;
        tracing::info!(runtime = %runtime_name, pleg = ?mode, "runtime connected; adopting pods");

        let _ = started.set(Arc::clone(&workers));
        // Admission needs the node as the Node shows it: the machine read
        // once (blocking reads) and shared with the Node's registration.
        let root = config.root.clone();
        let machine = tokio::task::spawn_blocking(move || {
            crate::cluster::node_object::MachineFacts::read(&root)
        })
        .await
        .unwrap_or_default();
        let reservations =
            crate::cluster::node_object::Reservations::from_settings(&config.eviction);
        let facts = node_facts(&node_name, &machine, &reservations, &node_flags);
        workers.set_node_facts(facts.clone());
        if let Some((_, host)) = &cgroup_host {
            start_qos_cgroups(
                &config,
                &layout,
                Arc::clone(host),
                &machine,
                &workers,
                &mut tasks,
            );
        }
        start_eviction(
            &config,
            &layout,
            cgroup_host.clone(),
            &runtime,
            &node_name,
            &queue,
            &source,
            &cache,
            &workers,
            &metrics,
            &node_state,
            &mut tasks,
        );
        if let (Some(client), Some(current)) = (
            kube_client.clone(),
            credentials.as_ref().and_then(|c| c.rotating.clone()),
        ) {
            tasks.spawn(crate::cluster::credentials::rotate(
                Arc::new(crate::cluster::credentials::KubeCsrApi(client)),
                current,
                node_name.clone(),
                cert_dir.clone(),
            ));
        }
        if let Some(client) = kube_client.clone() {
            let node_uid = crate::cluster::start_node(
                crate::cluster::NodeSideParts {
                    client: client.clone(),
                    node: node_name.clone(),
                    node_ip,
                    port: listen.port(),
                    flags: node_flags.clone(),
                    reservations,
                    facts: machine.clone(),
                    runtime: Arc::clone(&observer),
                    pressure: Arc::clone(&node_state),
                },
                &mut tasks,
            )
            .await;
            let side = crate::cluster::start_pods(
                crate::cluster::PodSideParts {
                    client,
                    node: node_name.clone(),
                    source: source.clone(),
                    queue: queue.clone(),
                    store: Arc::clone(&store),
                    workers: Arc::clone(&workers),
                    node_uid,
                    node_facts: facts,
                },
                &mut tasks,
            )
            .await;
            let _ = pod_side.set(side);
        }
        start_pipeline(
            Pipeline {
                queue: &queue,
                source: &source,
                cache: &cache,
                workers: &workers,
                sync_period: config.sync_period,
            },
            &mut tasks,
        )?;
        std::future::pending::<Result<(), AgentError>>().await
    };

    let result = tokio::select! {
        r = main => r,
        () = shutdown => Ok(()),
    };
    match started.get() {
        Some(workers) if config.drain_on_exit && result.is_ok() => {
            let limit = crate::drain::bound(&source);
            tracing::info!(pods = workers.known_uids().len(), limit = ?limit, "agent stopping; draining: every pod is stopped and removed");
            let parts = crate::drain::DrainParts {
                source: &source,
                queue: &queue,
                workers,
                cache: &cache,
            };
            match crate::drain::drain(parts, limit).await {
                Ok(()) => tracing::info!("drained: no pod of this node is left"),
                Err(left) => {
                    tracing::warn!(left = ?left, "drain incomplete: these pods keep running")
                }
            }
        }
        _ => tracing::info!("agent stopping; pods keep running"),
    }
    queue.shut_down();
    if let Some(side) = pod_side.get() {
        side.stop();
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let _ = stop_tx.send(true);
    let _ = server.await;
    result
}

/// What the PLEG and the pod workers are built from: made by [`run`], and
/// by the worker tests over a fake runtime, so that both wire the same.
pub(crate) struct Core {
    pub runtime: Arc<dyn RuntimeActuator>,
    pub cache: Arc<PodCache>,
    pub health: Arc<Health>,
    pub metrics: AgentMetrics,
    pub source: PodSource,
    pub store: Arc<StatusStore>,
    pub queue: WorkQueue<String>,
}

/// The pod workers with their PLEG and probes. The workers own the PLEG;
/// the PLEG's sink reaches the workers through a weak link (built in one
/// step with [`Arc::new_cyclic`], so nothing is set later).
pub(crate) fn build_workers(
    core: &Core,
    pleg: PlegConfig,
    config: WorkerConfig,
) -> Arc<PodWorkers> {
    let probes = Arc::new(ProbeManager::new(
        Arc::clone(&core.runtime),
        probe_sink(core.queue.clone()),
    ));
    let observer: Arc<dyn RuntimeObserver> = core.runtime.clone();
    Arc::new_cyclic(|me| {
        let pleg = Pleg::new(
            observer,
            Arc::clone(&core.cache),
            Arc::clone(&core.health),
            core.metrics.clone(),
            pleg,
            pleg_sink(core.queue.clone(), me.clone()),
        );
        PodWorkers::new(
            Arc::clone(&core.runtime),
            Arc::clone(&core.cache),
            pleg,
            core.source.clone(),
            Arc::clone(&core.store),
            probes,
            core.metrics.clone(),
            config,
        )
    })
}

/// Where the PLEG's events go: the pod's status is published at once, not
/// only after the sync the change calls for (which may restart the
/// container, or wait behind a grace period), then the sync is queued
/// unless the news needs none (a removal). Runs on the PLEG's tasks.
fn pleg_sink(queue: WorkQueue<String>, workers: Weak<PodWorkers>) -> EventSink {
    Arc::new(move |ev: PodLifecycleEvent| {
        if let Some(w) = workers.upgrade() {
            w.publish_observed(&ev.uid);
        }
        if ev.kind.wants_sync() {
            queue.add(ev.uid, Priority::Urgent);
        }
    })
}

/// Where probe results go: the pod's sync, urgently when a container must
/// be restarted.
fn probe_sink(queue: WorkQueue<String>) -> ChangeSink {
    Arc::new(move |uid: &str, change: ProbeChange| {
        let p = match change {
            ProbeChange::Kill => Priority::Urgent,
            ProbeChange::Status => Priority::Normal,
        };
        queue.add(uid.to_string(), p);
    })
}

/// The parts the queue connects: built by [`run`], and by the worker
/// tests over a fake runtime, so that both run the same dispatch.
pub(crate) struct Pipeline<'a> {
    pub queue: &'a WorkQueue<String>,
    pub source: &'a PodSource,
    pub cache: &'a PodCache,
    pub workers: &'a Arc<PodWorkers>,
    /// Period of the resync of pods that are not settled.
    pub sync_period: Duration,
}

/// Queues every pod for its first sync and starts, on `tasks`, the
/// manifest watch (which queues changed pods), the resync timer and the
/// pod workers, one per pod. Pods the runtime already runs are background
/// work (adoption); new pods and orphans are normal.
pub(crate) fn start_pipeline(p: Pipeline<'_>, tasks: &mut JoinSet<()>) -> Result<(), AgentError> {
    let (queue, source) = (p.queue, p.source);
    let wanted: HashSet<String> = source.all().into_iter().map(|d| d.uid).collect();
    for uid in &wanted {
        let known = p
            .cache
            .get(uid)
            .status
            .is_some_and(|s| !s.sandboxes.is_empty());
        let tier = if known {
            Priority::Background
        } else {
            Priority::Normal
        };
        queue.add(uid.clone(), tier);
    }
    for uid in p.cache.uids() {
        if !wanted.contains(&uid) {
            queue.add(uid, Priority::Normal);
        }
    }

    let q = queue.clone();
    tasks.spawn(source.watch(move |change| {
        tracing::info!(uid = %change.uid, kind = ?change.kind, pod = %format!("{}/{}", change.pod.namespace, change.pod.name), "manifest changed");
        q.add(change.uid, Priority::Urgent);
    })?);
    let (q, w, s, period) = (
        queue.clone(),
        Arc::clone(p.workers),
        source.clone(),
        p.sync_period,
    );
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let mut uids: HashSet<String> = s.all().into_iter().map(|d| d.uid).collect();
            uids.extend(w.known_uids());
            for uid in uids {
                if w.is_settled(&uid) {
                    continue;
                }
                q.add_resync(uid);
            }
        }
    });
    // One worker per pod: a pod that takes long (stopping with its grace
    // period, pulling an image) never delays another.
    let (w, k) = (Arc::clone(p.workers), Arc::clone(p.workers));
    tasks.spawn(run_per_key(
        queue.clone(),
        move |uid: String| {
            let w = Arc::clone(&w);
            async move { w.sync(uid).await }
        },
        move |uid: &String| k.is_known(uid),
    ));
    Ok(())
}

/// How often the QoS tiers are written again and busy pod cgroups tried
/// again (kubelet's periodic QoS cgroup update).
const QOS_CGROUP_RESYNC: Duration = Duration::from_secs(60);

/// The cgroup driver: the runtime's when it names one (CRI RuntimeConfig),
/// as kubelet takes it; else `configured`.
async fn cgroup_driver(
    runtime: &dyn RuntimeObserver,
    configured: crate::qos_cgroups::CgroupDriver,
) -> crate::qos_cgroups::CgroupDriver {
    choose_cgroup_driver(runtime.runtime_config().await, configured)
}

/// The driver from the runtime's RuntimeConfig answer: the one it names;
/// `configured` when it names none or an unknown one, or has no such call
/// (each said in the log).
fn choose_cgroup_driver(
    answer: crate::cri::CriResult<petrel_cri::api::RuntimeConfigResponse>,
    configured: crate::qos_cgroups::CgroupDriver,
) -> crate::qos_cgroups::CgroupDriver {
    use crate::qos_cgroups::CgroupDriver;
    use petrel_cri::api::CgroupDriver as Cri;
    let linux = match answer {
        Ok(r) => r.linux,
        Err(e) if e.is_unimplemented() => {
            tracing::info!(driver = %configured, "the runtime does not say its cgroup driver (no RuntimeConfig): the setting is used");
            return configured;
        }
        Err(e) => {
            tracing::warn!(error = %e, driver = %configured, "RuntimeConfig failed: the cgroup driver setting is used");
            return configured;
        }
    };
    let Some(linux) = linux else {
        return configured;
    };
    let from_runtime = match Cri::try_from(linux.cgroup_driver) {
        Ok(Cri::Systemd) => CgroupDriver::Systemd,
        Ok(Cri::Cgroupfs) => CgroupDriver::Cgroupfs,
        Err(_) => {
            tracing::warn!(value = linux.cgroup_driver, driver = %configured, "the runtime named an unknown cgroup driver: the setting is used");
            return configured;
        }
    };
    if from_runtime != configured {
        tracing::info!(runtime = %from_runtime, configured = %configured, "cgroup driver taken from the runtime (CRI RuntimeConfig), not the setting");
    }
    from_runtime
}

/// The host's cgroups and, for `driver`, how QoS and pod cgroups are made
/// on them: None (logged) without cgroups, or with the systemd driver
/// when systemd's bus cannot be reached; the runtime then makes pod
/// cgroups alone.
fn cgroup_host(
    driver: crate::qos_cgroups::CgroupDriver,
) -> Option<(
    petrel_oci::cgroups::Cgroups,
    Arc<dyn crate::qos_cgroups::CgroupHost>,
)> {
    use crate::qos_cgroups::{CgroupDriver, HostCgroups, SystemdCgroups, ZbusSystemd};
    let cgroups = match petrel_oci::cgroups::Cgroups::detect() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no cgroups: QoS and pod cgroups are left to the runtime");
            return None;
        }
    };
    let host: Arc<dyn crate::qos_cgroups::CgroupHost> = match driver {
        CgroupDriver::Cgroupfs => Arc::new(HostCgroups::new(cgroups.clone())),
        CgroupDriver::Systemd => match ZbusSystemd::connect(None) {
            Ok(bus) => {
                tracing::info!(
                    bus = bus.address(),
                    "systemd cgroup driver: QoS and pod cgroups are slices"
                );
                Arc::new(SystemdCgroups::new(Arc::new(bus), cgroups.clone()))
            }
            Err(e) => {
                tracing::error!(error = %e, "systemd cgroup driver without systemd: QoS and pod slices are not made, node allocatable is not enforced");
                return None;
            }
        },
    };
    Some((cgroups, host))
}

/// Makes the QoS cgroups (`kubepods`, its burstable and besteffort tiers)
/// with their values and hands the workers the manager that makes each
/// pod's cgroup; a task writes the tiers again each minute.
fn start_qos_cgroups(
    config: &AgentConfig,
    layout: &crate::qos_cgroups::CgroupLayout,
    host: Arc<dyn crate::qos_cgroups::CgroupHost>,
    machine: &crate::cluster::node_object::MachineFacts,
    workers: &Arc<PodWorkers>,
    tasks: &mut JoinSet<()>,
) {
    let qos = Arc::new(crate::qos_cgroups::QosCgroups::new(
        host,
        layout.clone(),
        config.pod_max_pids,
        Some(config.root.join("pod-cgroups")),
    ));
    // Node allocatable cpu, as the Node shows it: capacity minus the kube
    // and system reservations.
    let reserved = config
        .eviction
        .kube_reserved
        .plus(config.eviction.system_reserved)
        .cpu_millis;
    let cpus = i64::try_from(machine.cpus).unwrap_or(i64::MAX);
    let allocatable_cpu = cpus.saturating_mul(1000).saturating_sub(reserved).max(0);
    workers.set_qos_cgroups(Arc::clone(&qos));
    // On a blocking thread: with systemd each call waits for a job.
    tasks.spawn(async move {
        let q = Arc::clone(&qos);
        let started = tokio::task::spawn_blocking(move || q.start(allocatable_cpu)).await;
        // (Errors were logged by the manager; pods run on without the values.)
        if matches!(started, Ok(Ok(()))) {
            tracing::info!(cgroup = %qos.pods_cgroup(), driver = %qos.layout().driver(), allocatable_cpu_millis = allocatable_cpu, "QoS cgroups ready");
        }
        let mut tick = tokio::time::interval(QOS_CGROUP_RESYNC);
        tick.tick().await;
        loop {
            tick.tick().await;
            let q = Arc::clone(&qos);
            let _ = tokio::task::spawn_blocking(move || q.resync()).await;
        }
    });
}

/// Starts the eviction manager on `tasks`. Without cgroups (an unusual
/// host) the agent runs without eviction and says so.
#[allow(clippy::too_many_arguments)]
fn start_eviction(
    config: &AgentConfig,
    layout: &crate::qos_cgroups::CgroupLayout,
    cgroup_host: Option<(
        petrel_oci::cgroups::Cgroups,
        Arc<dyn crate::qos_cgroups::CgroupHost>,
    )>,
    runtime: &Arc<dyn RuntimeActuator>,
    node_name: &str,
    queue: &WorkQueue<String>,
    source: &PodSource,
    cache: &Arc<PodCache>,
    workers: &Arc<PodWorkers>,
    metrics: &AgentMetrics,
    node: &Arc<crate::eviction::NodeState>,
    tasks: &mut JoinSet<()>,
) {
    let (cgroups, host) = match cgroup_host {
        Some(c) => c,
        None => match petrel_oci::cgroups::Cgroups::detect() {
            // (systemd unreachable: eviction still reads the cgroups.)
            Ok(c) => (
                c.clone(),
                Arc::new(crate::qos_cgroups::HostCgroups::new(c))
                    as Arc<dyn crate::qos_cgroups::CgroupHost>,
            ),
            Err(e) => {
                tracing::warn!(error = %e, "no cgroups: node-pressure eviction disabled");
                return;
            }
        },
    };
    let reserved = config
        .eviction
        .kube_reserved
        .plus(config.eviction.system_reserved);
    let observer = crate::eviction::observe::NodeObserver::new(
        cgroups,
        config.node_cgroup.clone(),
        &layout.pods_cgroup(),
        config.root.clone(),
        reserved,
    )
    .with_host(host);
    workers.set_node_state(Arc::clone(node));
    let parts = crate::eviction::ManagerParts {
        runtime: Arc::clone(runtime),
        node_name: node_name.to_string(),
        source: source.clone(),
        evictor: Arc::clone(workers) as Arc<dyn crate::eviction::Evictor>,
        queue: queue.clone(),
        cache: Arc::clone(cache),
        metrics: metrics.clone(),
        node: Arc::clone(node),
        cgroups: layout.clone(),
        root: config.root.clone(),
    };
    match crate::eviction::EvictionManager::new(config.eviction.clone(), observer, parts) {
        Ok(m) => {
            tasks.spawn(m.run());
        }
        // Validated at start-up already; kept for the record.
        Err(e) => tracing::error!(error = %e, "eviction manager not started"),
    }
}

/// What admission knows of the node: its name; the standard labels with
/// `--node-labels` over them and the `--register-with-taints` taints, as
/// the Node is registered; its allocatable.
fn node_facts(
    node_name: &str,
    machine: &crate::cluster::node_object::MachineFacts,
    reservations: &crate::cluster::node_object::Reservations,
    flags: &crate::cluster::NodeFlags,
) -> crate::admission::NodeFacts {
    use crate::cluster::node_object;
    let mut labels =
        node_object::standard_labels(node_name, &machine.operating_system, &machine.architecture);
    labels.extend(flags.labels.clone());
    crate::admission::NodeFacts::new(
        node_name.to_string(),
        labels,
        flags.taints.clone(),
        &node_object::allocatable(machine, reservations),
    )
}

/// Whether the runtime's default handler (named "") reports recursive
/// read-only mounts, as kubelet reads it; a runtime whose Status fails or
/// names no such handler does not.
async fn supports_recursive_read_only(runtime: &dyn RuntimeObserver) -> bool {
    match runtime.runtime_handlers().await {
        Ok(handlers) => handlers
            .iter()
            .find(|h| h.name.is_empty())
            .and_then(|h| h.features.as_ref())
            .is_some_and(|f| f.recursive_read_only_mounts),
        Err(e) => {
            tracing::warn!(error = %e, "runtime handlers unknown: recursive read-only mounts taken as unsupported");
            false
        }
    }
}

/// Waits until the runtime answers Version; returns its name. Meanwhile
/// the agent reports the runtime unhealthy.
async fn wait_for_runtime(runtime: &dyn RuntimeObserver, health: &Health) -> String {
    let mut delay = Duration::from_millis(20);
    loop {
        match runtime.version().await {
            Ok(v) => {
                health.set_runtime_error(None);
                return if v.runtime_name.is_empty() {
                    "cri".to_string()
                } else {
                    v.runtime_name
                };
            }
            Err(e) => {
                tracing::warn!(error = %e, "runtime not answering; retrying");
                health.set_runtime_error(Some(e.to_string()));
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// The node's IP: the source address of the default route, else loopback.
fn host_ip() -> IpAddr {
    // Connecting a UDP socket sends nothing; it only picks a route.
    UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("192.0.2.1:9")?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// The names a TCP request's `Host` may carry besides IP literals and
/// `localhost`: the host name, the node name and, with TLS, every name
/// the server certificate is valid for.
fn server_names(
    node_name: &str,
    tls: Option<crate::server::tls::TlsFiles>,
) -> petrel_stream::origin::ServerNames {
    let names = petrel_stream::origin::ServerNames::new([node_name]).with_host_name();
    match tls.and_then(|f| crate::server::tls::certificate_names(&f)) {
        Some(matcher) => names.with_matcher(matcher),
        None => names,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pleg::PodLifecycleEventType;

    fn event(kind: PodLifecycleEventType) -> PodLifecycleEvent {
        PodLifecycleEvent {
            uid: "pod-a".to_string(),
            kind,
            container_id: "c1".to_string(),
        }
    }

    #[tokio::test]
    async fn pleg_sink_should_queue_a_sync_for_news_but_not_for_a_removal() {
        let queue: WorkQueue<String> = WorkQueue::new(QueueConfig::default().name("t"));
        // No workers (gone, or not built yet): nothing to publish to.
        let sink = pleg_sink(queue.clone(), Weak::new());
        sink(event(PodLifecycleEventType::ContainerRemoved));
        assert!(queue.is_empty());
        sink(event(PodLifecycleEventType::ContainerDied));
        sink(event(PodLifecycleEventType::ContainerStarted));
        assert_eq!(queue.len(), 1, "one entry per pod");
        let item = queue.get().await;
        assert_eq!(
            item.map(|i| (i.key, i.priority)),
            Some(("pod-a".to_string(), Priority::Urgent))
        );
    }

    #[test]
    fn the_runtimes_cgroup_driver_should_win_when_it_names_one() {
        use crate::qos_cgroups::CgroupDriver::{Cgroupfs, Systemd};
        use petrel_cri::api;
        let says = |d: i32| {
            Ok(api::RuntimeConfigResponse {
                linux: Some(api::LinuxRuntimeConfiguration { cgroup_driver: d }),
            })
        };
        let systemd = api::CgroupDriver::Systemd as i32;
        let cgroupfs = api::CgroupDriver::Cgroupfs as i32;
        assert_eq!(choose_cgroup_driver(says(systemd), Cgroupfs), Systemd);
        assert_eq!(choose_cgroup_driver(says(cgroupfs), Systemd), Cgroupfs);
        assert_eq!(choose_cgroup_driver(says(7), Systemd), Systemd);
        let silent = Ok(api::RuntimeConfigResponse { linux: None });
        assert_eq!(choose_cgroup_driver(silent, Systemd), Systemd);
        let unimplemented = Err(crate::cri::CriError {
            operation: "runtime_config",
            code: tonic::Code::Unimplemented,
            message: String::new(),
        });
        assert_eq!(choose_cgroup_driver(unimplemented, Systemd), Systemd);
        let down = Err(crate::cri::CriError {
            operation: "runtime_config",
            code: tonic::Code::Unavailable,
            message: "down".into(),
        });
        assert_eq!(choose_cgroup_driver(down, Cgroupfs), Cgroupfs);
    }

    #[tokio::test]
    async fn probe_sink_should_queue_the_pod() {
        let queue: WorkQueue<String> = WorkQueue::new(QueueConfig::default().name("t"));
        let sink = probe_sink(queue.clone());
        sink("pod-b", ProbeChange::Status);
        assert_eq!(queue.len(), 1);
        let item = queue.get().await;
        assert_eq!(
            item.map(|i| (i.key, i.priority)),
            Some(("pod-b".to_string(), Priority::Normal))
        );
    }
}
