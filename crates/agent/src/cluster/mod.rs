//! Cluster mode (`--kubeconfig`): the agent as a node of a Kubernetes
//! cluster, beside its static pods.
//!
//! ```text
//! API server --pods spec.nodeName=<node>--> informer --> PodSource --> work queue --> pod workers
//!      ^                                        \--> status queue --+
//!      |                                                            |
//!      +--- status patch / delete (grace 0, UID precondition) <-- status sync <-- StatusStore feed,
//!      |                                                                          workers forgetting a pod
//!      +--- Node (registration, status on change or every 5 min) <-- node loop
//!      +--- Lease kube-node-lease/<node> every 10 s <-- lease loop
//! ```
//!
//! - [`node_object`]: the Node as kubelet builds it (pure);
//! - [`node`]: its registration and status;
//! - [`pods`]: the node's pod informer and what it feeds;
//! - [`mirror`]: the static pods' mirror pods;
//! - [`pod_status`]: pod status patches and final deletion;
//! - [`pull_secrets`]: pods' `imagePullSecrets`, read for their pulls;
//! - [`lease`]: the node's heartbeat;
//! - [`own_node`]: the Node as the API shows it, for admission;
//! - [`services`]: every Service, for the pods' service variables.

pub mod credentials;
pub mod delegated;
mod fresh_conns;
pub mod lease;
pub mod mirror;
pub mod node;
pub mod node_object;
pub mod objects;
pub mod own_node;
pub mod pod_status;
pub mod pods;
pub mod pull_secrets;
pub mod services;
pub mod serving;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use petrel_controller::informer::SharedInformer;
use petrel_controller::{
    run_workers, ItemExponential, MaxOf, Priority, QueueConfig, TokenBucket, WorkQueue,
};
use tokio::task::JoinSet;

use crate::source::PodSource;
use crate::status::StatusStore;
use crate::worker::PodWorkers;

/// The Kubernetes version the agent reports as its kubelet version: the
/// API it is built against (k8s-openapi's `v1_34`).
pub const KUBERNETES_VERSION: &str = "v1.34.0";

/// Why cluster mode could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A node flag is malformed.
    #[error("--{flag}: {reason}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The self-signed serving certificate could not be made.
    #[error("serving certificate: {0}")]
    Serving(String),
    /// The kubeconfig could not be read or used.
    #[error("--kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// The node's registration flags, parsed.
#[derive(Debug, Clone, Default)]
pub struct NodeFlags {
    /// `--node-labels`.
    pub labels: std::collections::BTreeMap<String, String>,
    /// `--register-with-taints`.
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
}

impl NodeFlags {
    /// Parses `--node-labels` and `--register-with-taints`.
    pub fn parse(labels: &str, taints: &str) -> Result<Self, ClusterError> {
        let labels =
            node_object::parse_node_labels(labels).map_err(|reason| ClusterError::Flag {
                flag: "node-labels",
                reason,
            })?;
        let taints = node_object::parse_taints(taints).map_err(|reason| ClusterError::Flag {
            flag: "register-with-taints",
            reason,
        })?;
        Ok(Self { labels, taints })
    }
}

/// What the node side (registration, status, Lease) is built from.
pub struct NodeSideParts {
    /// The node's client.
    pub client: kube::Client,
    /// The node's name.
    pub node: String,
    /// Its InternalIP.
    pub node_ip: std::net::IpAddr,
    /// The port of the agent's server.
    pub port: u16,
    /// `--node-labels`, `--register-with-taints`.
    pub flags: NodeFlags,
    /// What is set aside from capacity.
    pub reservations: node_object::Reservations,
    /// The machine's facts, read once at start.
    pub facts: node_object::MachineFacts,
    /// The runtime.
    pub runtime: Arc<dyn crate::cri::RuntimeObserver>,
    /// The eviction manager's pressure.
    pub pressure: Arc<crate::eviction::NodeState>,
}

/// Starts, on `tasks`, the Node's registration and status, and its Lease
/// (which takes the Node as owner once registered). Returns where the
/// Node's UID is told once registered.
pub async fn start_node(
    p: NodeSideParts,
    tasks: &mut JoinSet<()>,
) -> tokio::sync::watch::Receiver<Option<String>> {
    let runtime_version = match p.runtime.version().await {
        Ok(v) => format!("{}://{}", v.runtime_name, v.runtime_version),
        Err(_) => "unknown://unknown".to_string(),
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| p.node.clone());
    let identity = node_object::NodeIdentity {
        name: p.node.clone(),
        labels: p.flags.labels,
        taints: p.flags.taints,
        addresses: node_object::node_addresses(p.node_ip, &host),
        kubelet_port: p.port,
        container_runtime_version: runtime_version,
        kubelet_version: KUBERNETES_VERSION.to_string(),
    };
    let facts = p.facts;
    let (uid_tx, uid_rx) = tokio::sync::watch::channel(None);
    tasks.spawn(node::run(node::NodeParts {
        client: p.client.clone(),
        identity,
        facts,
        reservations: p.reservations,
        runtime: p.runtime,
        pressure: p.pressure,
        uid: uid_tx,
    }));
    tasks.spawn(lease::run(p.client, p.node, uid_rx.clone()));
    uid_rx
}

/// The running pod side of cluster mode: stopped with [`PodSide::stop`].
pub struct PodSide {
    informer: SharedInformer<Pod>,
    volumes: WorkQueue<String>,
    node: SharedInformer<k8s_openapi::api::core::v1::Node>,
    services: SharedInformer<k8s_openapi::api::core::v1::Service>,
    status: WorkQueue<String>,
}

impl PodSide {
    /// Stops the informer and the status sync.
    pub fn stop(&self) {
        self.informer.stop();
        self.node.stop();
        self.services.stop();
        self.status.shut_down();
        self.volumes.shut_down();
    }
}

/// What the pod side is built from.
pub struct PodSideParts {
    /// The node's client.
    pub client: kube::Client,
    /// The node's name.
    pub node: String,
    /// The pods wanted (the API's join the static ones).
    pub source: PodSource,
    /// The pod workers' queue.
    pub queue: WorkQueue<String>,
    /// The statuses the workers publish.
    pub store: Arc<StatusStore>,
    /// The pod workers.
    pub workers: Arc<PodWorkers>,
    /// The Node's UID once registered (mirror pods' owner).
    pub node_uid: tokio::sync::watch::Receiver<Option<String>>,
    /// What admission knows of the node now (from the flags).
    pub node_facts: crate::admission::NodeFacts,
}

impl pod_status::PodsOnNode for PodWorkers {
    fn is_known(&self, uid: &str) -> bool {
        PodWorkers::is_known(self, uid)
    }
}

/// Starts the pod informer and, once the source holds every pod bound to
/// this node, the status sync (on `tasks`). Returns when the source is
/// fed, so the workers' first pass adopts the API's pods.
pub async fn start_pods(p: PodSideParts, tasks: &mut JoinSet<()>) -> PodSide {
    // Before the first API pod reaches a worker: its pulls need its
    // pull secrets.
    p.workers
        .set_pull_secrets(Arc::new(pull_secrets::KubeSecrets {
            client: p.client.clone(),
        }));
    let status: WorkQueue<String> = WorkQueue::new(
        QueueConfig::default()
            .name("pod_status")
            .rate_limiter(MaxOf::new(vec![
                Box::new(ItemExponential::<String>::new(
                    Duration::from_millis(200),
                    Duration::from_secs(30),
                )),
                Box::new(TokenBucket::new(50.0, 100)),
            ])),
    );
    // Volumes written again when their objects, tokens or pod change.
    let volumes: WorkQueue<String> = WorkQueue::new(QueueConfig::default().name("pod_volumes"));
    let objects = {
        let (v, q) = (volumes.clone(), p.queue.clone());
        objects::ObjectManager::new(
            p.client.clone(),
            Arc::new(move |uid: &str| {
                v.add(uid.to_string(), Priority::Urgent);
                // A pod waiting for the object starts at once.
                q.add(uid.to_string(), Priority::Urgent);
            }),
        )
    };
    p.workers.set_objects(objects.clone());
    tasks.spawn(objects.renew_tokens());
    let w = Arc::clone(&p.workers);
    tasks.spawn(run_workers(volumes.clone(), 2, move |uid: String| {
        let w = Arc::clone(&w);
        async move {
            w.refresh_volumes(&uid);
            Ok::<_, std::convert::Infallible>(petrel_controller::Action::Done)
        }
    }));
    // Services first: their first list is usually in before the pods',
    // so the first containers need not wait for it.
    let service_informer = services::informer(p.client.clone());
    p.workers
        .set_service_env(services::env_source(&service_informer));
    service_informer.start();
    let informer = pods::informer(p.client.clone(), &p.node);
    let mirrors = Arc::new(tokio::sync::Notify::new());
    let registration = pods::feed(
        &informer,
        p.source.clone(),
        p.queue.clone(),
        status.clone(),
        volumes.clone(),
        Arc::clone(&mirrors),
    );
    informer.start();
    tracing::info!(node = %p.node, "cluster mode: waiting for the pods bound to this node");
    pods::wait_fed(&registration).await;
    tracing::info!(node = %p.node, pods = informer.store().len(), "cluster mode: pods of this node listed");

    // Every published status of an API pod, and every pod the workers let
    // go, is a reason to look at its API copy.
    let q = status.clone();
    p.workers.set_forget_hook(Arc::new(move |uid: &str| {
        q.add(uid.to_string(), Priority::Normal)
    }));
    let (q, source, store) = (status.clone(), p.source.clone(), Arc::clone(&p.store));
    let (wake, cache) = (Arc::clone(&mirrors), informer.store());
    tasks.spawn(async move {
        let mut feed = store.subscribe();
        loop {
            match feed.recv().await {
                Ok(ev) => {
                    let Some(uid) = ev.object.metadata.uid.as_deref() else {
                        continue;
                    };
                    if source.is_api(uid) {
                        q.add(uid.to_string(), Priority::Normal);
                        continue;
                    }
                    // A static pod: its mirror may be due, or its status.
                    wake.notify_one();
                    let key = petrel_controller::informer::object_key(ev.object.as_ref());
                    if let Some(m) = cache.get(&key).filter(|m| crate::source::api::is_mirror(m)) {
                        if let Some(muid) = m.metadata.uid.clone() {
                            q.add(muid, Priority::Normal);
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    for uid in source.api_uids() {
                        q.add(uid, Priority::Normal);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    let sync = Arc::new(pod_status::PodStatusSync::new(
        Arc::new(pod_status::KubePodStatusApi {
            client: p.client.clone(),
        }),
        Arc::new(informer.store()),
        Arc::clone(&p.store),
        p.workers.clone() as Arc<dyn pod_status::PodsOnNode>,
    ));
    tasks.spawn(mirror::run(mirror::MirrorParts {
        client: p.client.clone(),
        node: p.node.clone(),
        node_uid: p.node_uid,
        source: p.source.clone(),
        pods: informer.store(),
        wake: mirrors,
    }));
    tasks.spawn(run_workers(status.clone(), 4, move |uid: String| {
        let sync = Arc::clone(&sync);
        async move { sync.reconcile(&uid).await }
    }));
    // The Node's labels and taints as edited in the API reach admission.
    let node = own_node::informer(p.client.clone(), &p.node);
    let workers = Arc::clone(&p.workers);
    let _ = own_node::feed(&node, p.node_facts, move |f| workers.set_node_facts(f));
    node.start();
    PodSide {
        informer,
        volumes,
        node,
        services: service_informer,
        status,
    }
}
