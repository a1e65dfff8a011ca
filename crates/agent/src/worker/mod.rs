//! Pod workers: the reconcile function the controller kit's work queue
//! calls for each pod UID.
//!
//! One sync looks at what the manifest wants ([`PodSource`]) and what the
//! runtime has (the [`PodCache`], never older than this worker's own last
//! action: see `PodWorkers::fresh_status`) and moves the runtime one step
//! closer: sandbox, then init containers in order, then app containers with
//! the restart policy and crash-loop backoff; or, for a pod whose manifest
//! is gone, graceful termination. Then it publishes the pod's status.
//!
//! Each pod has its own worker task ([`petrel_controller::run_per_key`],
//! started by `agent.rs`), as kubelet's pod workers: the work queue feeds
//! it, it syncs its pod at most once at a time (updates that arrive
//! meanwhile are merged into one next sync), and it ends once the pod is
//! forgotten. A sync that waits (a grace period, an image pull) holds
//! nothing another pod needs.
//!
//! Never creating a container twice rests on three facts: the work queue
//! never hands one UID out twice at once; every sync acts on a status inspected
//! after the previous sync's last action; and a container is only created
//! when that status shows no live instance of it.

mod backoff;
mod hooks;
mod init;
mod phase;
mod sync;
mod terminate;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use petrel_controller::Action;

use crate::admission::{NodeFacts, Refusal};
use crate::cache::{now_ns, PodCache};
use crate::convert::{ConvertContext, ConvertError};
use crate::cri::{CriError, RuntimeActuator};
use crate::metrics::AgentMetrics;
use crate::pleg::Pleg;
use crate::probe::ProbeManager;
use crate::pull_credentials::SecretReader;
use crate::source::PodSource;
use crate::status::compute::{
    carry_transition_times, compute_pod_status, published_pod, StatusContext,
};
use crate::status::StatusStore;
use crate::types::{DesiredPod, PodHints, PodOrigin, PodRuntimeStatus, PodUid};

pub use backoff::CrashBackoff;
use phase::{EvictionOrder, PodPhase};

/// Why a sync failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A CRI call failed.
    #[error(transparent)]
    Runtime(#[from] CriError),
    /// The pod's spec could not be turned into CRI configuration.
    #[error(transparent)]
    Convert(#[from] ConvertError),
    /// The runtime did not produce a status newer than our last action.
    #[error("no fresh status for pod {0} from the runtime")]
    StaleStatus(PodUid),
    /// Creating the pod's directories failed.
    #[error("{0}")]
    Io(String),
}

/// Settings of the pod workers.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The node's name.
    pub node_name: String,
    /// The node's IP.
    pub host_ip: String,
    /// The runtime's name, for containerID (`containerd://...`).
    pub runtime_name: String,
    /// Where the pods' cgroups are (`<root>/kubepods/...`, or slices).
    pub cgroups: crate::qos_cgroups::CgroupLayout,
    /// The agent's root: `pods/<uid>` and `logs/` under it.
    pub root: PathBuf,
    /// Crash-loop backoff start and cap.
    pub backoff_initial: Duration,
    /// Crash-loop backoff cap.
    pub backoff_max: Duration,
    /// Where `Localhost` seccomp profiles are (`<root>/seccomp`).
    pub seccomp_root: PathBuf,
    /// kubelet's `seccompDefault`.
    pub seccomp_default: bool,
    /// Whether the runtime's default handler supports recursive read-only
    /// mounts (learnt from its Status when the agent connects).
    pub recursive_read_only: bool,
    /// kubelet's DNS settings, for the pods' resolver config.
    pub dns: crate::convert::DnsSettings,
}

/// What a worker remembers about a pod between syncs.
#[derive(Debug, Default)]
struct PodState {
    /// When this agent last changed the pod in the runtime (ns).
    last_action: i64,
    /// Waiting reasons and messages for the status.
    hints: PodHints,
    /// When the agent first saw the pod (pod start latency).
    first_seen: Option<Instant>,
    /// Pod start latency already recorded.
    start_recorded: bool,
    /// Active, evicted or terminating.
    phase: PodPhase,
    /// The last desired pod seen (to show a terminating pod).
    last_desired: Option<DesiredPod>,
    /// When the inspection the current sync acts on began (ns).
    observed_at: i64,
    /// When the inspection last published began (ns): a publish never
    /// goes back to an older one.
    published_at: i64,
}

/// What an eviction record on disk holds: the message and grace period,
/// and a hash of the pod evicted, so a restarted agent keeps the pod
/// evicted (kubelet keeps that in the API server) unless its manifest
/// changed meanwhile.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct EvictionRecord {
    message: String,
    grace_secs: i64,
    pod_hash: String,
}

/// A hash of the desired pod's JSON.
fn pod_hash(d: &DesiredPod) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(&*d.pod).unwrap_or_default();
    hex::encode(sha2::Sha256::digest(&json))
}

/// Everything a sync of a running pod decides on: the runtime status (by
/// content: a relist that re-inspects an unchanged pod gives a newer entry
/// with the same content), the desired pod (by identity: the source makes
/// a new `Arc` for every change) and the probe results.
#[derive(Debug, Clone)]
struct Fingerprint {
    status: Arc<PodRuntimeStatus>,
    pod: usize,
    probes: Vec<(Option<bool>, Option<bool>, bool)>,
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Self) -> bool {
        self.pod == other.pod
            && self.probes == other.probes
            && (Arc::ptr_eq(&self.status, &other.status) || *self.status == *other.status)
    }
}

/// The pod workers' shared state; `sync` is the reconcile function.
pub struct PodWorkers {
    runtime: Arc<dyn RuntimeActuator>,
    cache: Arc<PodCache>,
    pleg: Pleg,
    source: PodSource,
    store: Arc<StatusStore>,
    probes: Arc<ProbeManager>,
    metrics: AgentMetrics,
    backoff: CrashBackoff,
    /// Image pull backoff, per pod and container name + image.
    pull_backoff: CrashBackoff,
    config: WorkerConfig,
    pods: Mutex<HashMap<PodUid, PodState>>,
    /// User-namespace ranges of `hostUsers: false` pods.
    userns: crate::userns::UsernsAllocator,
    /// The node's pressure, for admission (set when eviction runs).
    node: std::sync::OnceLock<Arc<crate::eviction::NodeState>>,
    /// The node's name, labels, taints and allocatable, for admission
    /// (none: every pod is admitted). A lock, not a OnceLock: cluster mode
    /// may learn new labels.
    node_facts: std::sync::RwLock<Option<Arc<NodeFacts>>>,
    /// The admission verdict of each pod that has not started yet, by the
    /// pod admitted (its identity: a changed pod is admitted anew). One
    /// lock, so pods are admitted one at a time, each beside the ones
    /// admitted before it.
    admissions: Mutex<HashMap<PodUid, Admission>>,
    /// Told each pod the workers forget (terminated and removed): cluster
    /// mode deletes a pod being deleted from the API then.
    on_forget: std::sync::OnceLock<ForgetHook>,
    /// The API objects pods read (cluster mode only).
    objects: std::sync::OnceLock<Arc<dyn PodObjects>>,
    /// Where pods' pull secrets are read (cluster mode; none: images are
    /// pulled without a pod's credentials).
    pull_secrets: std::sync::OnceLock<Arc<dyn SecretReader>>,
    /// The pods' service variables (cluster mode); none set: no service
    /// variables, as kubelet without an API server.
    service_env: std::sync::OnceLock<ServiceEnvFn>,
    /// The QoS and pod cgroups (none: the runtime makes pod cgroups
    /// alone, with no values of their own).
    qos_cgroups: std::sync::OnceLock<Arc<crate::qos_cgroups::QosCgroups>>,
}

/// The API objects pods read, made available before a pod's volumes and
/// containers are made (cluster mode; the cluster side implements it).
#[async_trait::async_trait]
pub trait PodObjects: crate::convert::ObjectView {
    /// Watches what `pod` references from now on (and stops what it no
    /// longer does), has its service-account tokens issued, and waits a
    /// little for all of it; the error says, in kubelet's words, what is
    /// still missing.
    async fn prepare(&self, pod: &DesiredPod) -> Result<(), String>;
    /// Forgets pod `uid`: the watches only it needed end, its tokens go.
    fn release(&self, uid: &str);
}

/// A pod's admission verdict.
#[derive(Debug, Clone)]
struct Admission {
    /// The desired pod decided on (by identity).
    pod: usize,
    /// Why it was refused; None: admitted.
    refusal: Option<Refusal>,
}

/// What [`PodWorkers::set_service_env`] is given: the service variables of
/// a pod, or why they cannot be had yet.
pub type ServiceEnvFn =
    Arc<dyn Fn(&DesiredPod) -> Result<Vec<(String, String)>, String> + Send + Sync>;

/// What [`PodWorkers::set_forget_hook`] calls with a forgotten pod's UID.
pub type ForgetHook = Arc<dyn Fn(&str) + Send + Sync>;

impl PodWorkers {
    /// The workers' state.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        runtime: Arc<dyn RuntimeActuator>,
        cache: Arc<PodCache>,
        pleg: Pleg,
        source: PodSource,
        store: Arc<StatusStore>,
        probes: Arc<ProbeManager>,
        metrics: AgentMetrics,
        config: WorkerConfig,
    ) -> Self {
        Self {
            runtime,
            cache,
            pleg,
            source,
            store,
            probes,
            metrics,
            backoff: CrashBackoff::new(config.backoff_initial, config.backoff_max),
            pull_backoff: CrashBackoff::new(sync::IMAGE_BACKOFF_INITIAL, sync::IMAGE_BACKOFF_MAX),
            userns: crate::userns::UsernsAllocator::new(config.root.join("pods")),
            config,
            pods: Mutex::new(HashMap::new()),
            node: std::sync::OnceLock::new(),
            node_facts: std::sync::RwLock::new(None),
            admissions: Mutex::new(HashMap::new()),
            on_forget: std::sync::OnceLock::new(),
            objects: std::sync::OnceLock::new(),
            pull_secrets: std::sync::OnceLock::new(),
            service_env: std::sync::OnceLock::new(),
            qos_cgroups: std::sync::OnceLock::new(),
        }
    }

    /// Has pods' cgroups made by `qos` before their sandboxes, and
    /// removed after (once set, it stays).
    pub fn set_qos_cgroups(&self, qos: Arc<crate::qos_cgroups::QosCgroups>) {
        let _ = self.qos_cgroups.set(qos);
    }

    /// Counts `pod` in its QoS tier and makes its cgroup with its values
    /// if missing, as kubelet does before a pod's sandbox. A failure is
    /// logged (once per pod) by the manager and does not hold the pod: the
    /// runtime still makes the cgroup. Done on a blocking thread: with the
    /// systemd driver it waits for systemd's jobs.
    async fn ensure_pod_cgroup(&self, pod: &DesiredPod) {
        if let Some(q) = self.qos_cgroups.get() {
            let (q, pod) = (Arc::clone(q), pod.clone());
            let _ = tokio::task::spawn_blocking(move || q.ensure_pod(&pod)).await;
        }
    }

    /// Gives the workers the API objects pods read (cluster mode; once).
    pub fn set_objects(&self, objects: Arc<dyn PodObjects>) {
        let _ = self.objects.set(objects);
    }

    /// Writes pod `uid`'s downwardAPI, configMap, secret and projected
    /// volumes again if their content changed (an object, a token or the
    /// pod did); volumes not made yet are left to the pod's worker.
    pub fn refresh_volumes(&self, uid: &str) {
        let Some(pod) = self.source.get(uid) else {
            return;
        };
        if pod.invalid.is_some() {
            return;
        }
        let ctx = self.convert_context(&pod, Vec::new());
        match crate::convert::refresh_volumes(&pod, &ctx) {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(uid, pod = %format!("{}/{}", pod.namespace, pod.name), error = %e, "volume not updated; its files stay as they were")
            }
        }
    }

    /// Reads pods' `imagePullSecrets` with `reader` from now on (once
    /// set, it stays): their credentials go with each pull.
    pub fn set_pull_secrets(&self, reader: Arc<dyn SecretReader>) {
        let _ = self.pull_secrets.set(reader);
    }

    /// The PLEG the workers inspect pods with.
    pub fn pleg(&self) -> &Pleg {
        &self.pleg
    }

    fn with_state<R>(&self, uid: &str, f: impl FnOnce(&mut PodState) -> R) -> R {
        let mut g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        f(g.entry(uid.to_string()).or_default())
    }

    /// Records that the agent just changed the pod in the runtime: the
    /// next sync waits for a status inspected after now.
    fn acted(&self, uid: &str) {
        let t = now_ns();
        self.with_state(uid, |s| s.last_action = s.last_action.max(t));
    }

    fn set_waiting(&self, uid: &str, container: &str, reason: &str, message: String) {
        self.with_state(uid, |s| {
            s.hints
                .containers
                .entry(container.to_string())
                .or_default()
                .waiting = Some((reason.to_string(), message));
        });
    }

    /// The message of the container's current waiting reason.
    fn waiting_message(&self, uid: &str, container: &str) -> Option<String> {
        self.with_state(uid, |s| {
            s.hints
                .containers
                .get(container)
                .and_then(|h| h.waiting.as_ref())
                .map(|(_, m)| m.clone())
        })
    }

    fn clear_waiting(&self, uid: &str, container: &str) {
        self.with_state(uid, |s| {
            if let Some(h) = s.hints.containers.get_mut(container) {
                h.waiting = None;
            }
        });
    }

    fn set_pod_message(&self, uid: &str, message: Option<String>) {
        self.with_state(uid, |s| s.hints.message = message);
    }

    /// The conversion context of a pod.
    fn convert_context(&self, pod: &DesiredPod, pod_ips: Vec<String>) -> ConvertContext {
        ConvertContext {
            node_name: self.config.node_name.clone(),
            cgroups: self.config.cgroups.clone(),
            pod_dir: self.config.root.join("pods").join(&pod.uid),
            sub_path_dir: crate::subpath::pod_dir(&self.config.root, &pod.uid),
            log_dir: self
                .config
                .root
                .join("logs")
                .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid)),
            pod_ips,
            host_ip: self.config.host_ip.clone(),
            seccomp_root: self.config.seccomp_root.clone(),
            seccomp_default: self.config.seccomp_default,
            recursive_read_only: self.config.recursive_read_only,
            dns: self.config.dns.clone(),
            service_env: Vec::new(),
            userns: (pod.pod.spec.as_ref().and_then(|s| s.host_users) == Some(false)).then(|| {
                self.userns
                    .host_id(&self.config.root.join("pods").join(&pod.uid))
                    .map_err(|e| e.to_string())
            }),
            objects: self.objects.get().map(|o| {
                let view: Arc<dyn crate::convert::ObjectView> = o.clone();
                crate::convert::Objects(view)
            }),
            // Cluster mode runs as root: secrets get a tmpfs of their own.
            memory_volumes: self.objects.get().is_some(),
        }
    }

    /// Reconciles the pod `uid` once.
    pub async fn sync(&self, uid: PodUid) -> Result<Action, WorkerError> {
        let desired = self.source.get(&uid);
        let (status, observed_at) = self.fresh_status(&uid).await?;
        self.with_state(&uid, |s| s.observed_at = observed_at);
        match desired {
            Some(d) if d.invalid.is_none() => {
                let fp = Fingerprint {
                    status: Arc::clone(&status),
                    pod: Arc::as_ptr(&d.pod) as usize,
                    probes: self.probe_fingerprint(&d, &status),
                };
                self.restore_eviction(&d);
                if let Some(action) = self.sync_evicted(&d, &status, &fp).await? {
                    return Ok(action);
                }
                // Admission: a pod that never started is refused under
                // node pressure, and shown as evicted (kubelet's reason).
                if status.sandboxes.is_empty() {
                    if let Some(message) = self.admission_refusal(&d) {
                        tracing::warn!(uid, pod = %format!("{}/{}", d.namespace, d.name), %message, "pod refused under node pressure");
                        self.with_state(&uid, |s| {
                            s.last_desired = Some(d.clone());
                            if s.first_seen.is_none() {
                                s.first_seen = Some(Instant::now());
                                s.hints.start_time = Some(SystemTime::now());
                            }
                        });
                        self.request_eviction(&uid, 0, message);
                        if let Some(action) = self.sync_evicted(&d, &status, &fp).await? {
                            return Ok(action);
                        }
                    }
                    // kubelet's admission: resources, node affinity, node
                    // name, host ports, taints. A refused pod never starts
                    // and stays refused until the pod changes.
                    if let Some(refusal) = self.admission_verdict(&d) {
                        tracing::warn!(uid, pod = %format!("{}/{}", d.namespace, d.name), reason = %refusal.reason, message = %refusal.message, "pod refused admission");
                        self.refuse(&d, &refusal);
                        if let Some(action) = self.sync_evicted(&d, &status, &fp).await? {
                            return Ok(action);
                        }
                    }
                }
                // (A sync that would see what the last quiet one saw has
                // nothing to do: a quiet node's resyncs cost a comparison.)
                let (settled, acted_before) =
                    self.with_state(&uid, |s| (s.phase.settled() == Some(&fp), s.last_action));
                if settled {
                    return Ok(Action::Done);
                }
                // An adopted pod started when its oldest sandbox was made.
                let adopted_at = status.sandboxes.last().map(|sb| {
                    SystemTime::UNIX_EPOCH
                        + Duration::from_nanos(u64::try_from(sb.created_at).unwrap_or(0))
                });
                self.with_state(&uid, |s| {
                    s.phase.activate();
                    s.last_desired = Some(d.clone());
                    if s.first_seen.is_none() {
                        s.first_seen = Some(Instant::now());
                        s.start_recorded = adopted_at.is_some();
                        s.hints.start_time = Some(adopted_at.unwrap_or_else(SystemTime::now));
                    }
                });
                let result = self.sync_pod(&d, &status).await;
                if result.is_err() {
                    // A failed step (a container that cannot be created or
                    // started, say) is retried; meanwhile the pod shows
                    // why, as kubelet shows it.
                    self.publish(&d, Some(&status));
                }
                let quiet = matches!(result, Ok(Action::Done));
                self.with_state(&uid, |s| {
                    s.phase
                        .set_settled((quiet && s.last_action == acted_before).then_some(fp));
                });
                result
            }
            Some(d) => {
                // A manifest that cannot run: whatever ran under its name
                // before is stopped, and the pod is shown with its reason.
                if !status.sandboxes.is_empty() || !status.containers.is_empty() {
                    self.kill_pod(&uid, &status, Some(&d), true).await?;
                }
                self.with_state(&uid, |s| s.last_desired = Some(d.clone()));
                // A duplicate of another file's pod is only logged: the
                // name belongs to the first file's pod.
                if self.source.owner(&d.namespace, &d.name).as_deref() == Some(uid.as_str()) {
                    self.publish(&d, None);
                } else {
                    tracing::warn!(uid, pod = %format!("{}/{}", d.namespace, d.name), reason = ?d.invalid, "ignoring a duplicate pod manifest");
                }
                Ok(Action::Done)
            }
            None => {
                // An API pod being deleted is stopped with the deletion's
                // grace period, and shown as it is meanwhile.
                if let Some(d) = self.source.deleting(&uid) {
                    self.with_state(&uid, |s| s.last_desired = Some(d));
                }
                self.terminate(&uid, &status).await
            }
        }
    }

    /// Gives containers created from now on their pod's service variables
    /// from `f` (once set, it stays).
    pub fn set_service_env(&self, f: ServiceEnvFn) {
        let _ = self.service_env.set(f);
    }

    /// The service variables of `pod`: none without a source.
    fn service_env_of(&self, pod: &DesiredPod) -> Result<Vec<(String, String)>, String> {
        self.service_env.get().map_or(Ok(Vec::new()), |f| f(pod))
    }

    /// Calls `hook` with the UID of every pod the workers forget from now
    /// on (once set, it stays).
    pub fn set_forget_hook(&self, hook: ForgetHook) {
        let _ = self.on_forget.set(hook);
    }

    /// Turns on admission by node pressure: a pod not started yet is
    /// refused under pressure (BestEffort under memory pressure, any
    /// non-critical pod under disk or PID pressure), as kubelet does.
    pub fn set_node_state(&self, node: Arc<crate::eviction::NodeState>) {
        let _ = self.node.set(node);
    }

    /// Gives admission the node's facts (again when they change): pods
    /// not started yet are admitted against them.
    pub fn set_node_facts(&self, facts: NodeFacts) {
        let mut g = self.node_facts.write().unwrap_or_else(|p| p.into_inner());
        *g = Some(Arc::new(facts));
    }

    /// The admission verdict of `d`, which has no sandbox: the one given
    /// before to this very pod, else decided now. Pods older than `d`
    /// (by creation time) that are not decided yet are decided first, so
    /// pods arriving together are admitted in creation order whichever
    /// worker comes first, as kubelet admits them. Pods the runtime already
    /// runs count as admitted: an agent restart never refuses them.
    fn admission_verdict(&self, d: &DesiredPod) -> Option<Refusal> {
        let facts = self
            .node_facts
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        let mut book = self.admissions.lock().unwrap_or_else(|p| p.into_inner());
        let me = Arc::as_ptr(&d.pod) as usize;
        if let Some(a) = book.get(&d.uid).filter(|a| a.pod == me) {
            return a.refusal.clone();
        }
        // What the workers know: pods refused or evicted (they hold
        // nothing), and pods being stopped (they hold theirs until gone).
        let (stopped, terminating): (Vec<(PodUid, usize)>, Vec<DesiredPod>) = {
            let g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            let stopped = g
                .iter()
                .filter_map(|(uid, s)| s.phase.eviction().map(|e| (uid.clone(), e.pod)))
                .collect();
            let terminating = g
                .values()
                .filter(|s| s.phase.terminating_since().is_some())
                .filter_map(|s| s.last_desired.clone())
                .collect();
            (stopped, terminating)
        };
        let has_sandbox = |uid: &str| {
            self.cache
                .get(uid)
                .status
                .is_some_and(|s| !s.sandboxes.is_empty())
        };
        let terminal = |q: &DesiredPod| {
            self.store.get(&q.namespace, &q.name).is_some_and(|p| {
                p.metadata.uid.as_deref() == Some(q.uid.as_str())
                    && p.status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
            })
        };
        let created = |q: &DesiredPod| q.pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let mut holding: Vec<DesiredPod> = terminating
            .into_iter()
            // (One wanted again is counted with the source's pods below.)
            .filter(|q| self.source.get(&q.uid).is_none())
            .filter(|q| q.uid != d.uid && has_sandbox(&q.uid) && !terminal(q))
            .collect();
        let mut undecided: Vec<DesiredPod> = Vec::new();
        for q in self.source.all() {
            if q.uid == d.uid || q.invalid.is_some() {
                continue;
            }
            let ptr = Arc::as_ptr(&q.pod) as usize;
            if stopped.iter().any(|(u, p)| *u == q.uid && *p == ptr) || terminal(&q) {
                continue;
            }
            let decided = book.get(&q.uid).filter(|a| a.pod == ptr);
            if has_sandbox(&q.uid) || decided.is_some_and(|a| a.refusal.is_none()) {
                holding.push(q);
            } else if decided.is_none() && created(&q) <= created(d) {
                undecided.push(q);
            }
        }
        let mut admitted: Vec<&k8s_openapi::api::core::v1::Pod> =
            holding.iter().map(|q| &*q.pod).collect();
        let mut pending: Vec<_> = undecided.iter().map(candidate).collect();
        pending.push(candidate(d));
        let mut mine = None;
        for (uid, verdict) in crate::admission::admit_in_order(pending, &mut admitted, &facts) {
            let pod = if uid == d.uid {
                mine = Some(verdict.clone().err());
                me
            } else {
                match undecided.iter().find(|q| q.uid == uid) {
                    Some(q) => Arc::as_ptr(&q.pod) as usize,
                    None => continue,
                }
            };
            book.insert(
                uid.to_string(),
                Admission {
                    pod,
                    refusal: verdict.err(),
                },
            );
        }
        mine.flatten()
    }

    /// Marks `d` refused: never started, shown Failed with the refusal's
    /// reason and message, until the pod changes. Not recorded on disk: a
    /// restarted agent admits a pod that never started anew.
    fn refuse(&self, d: &DesiredPod, refusal: &Refusal) {
        let pod = Arc::as_ptr(&d.pod) as usize;
        self.with_state(&d.uid, |s| {
            s.last_desired = Some(d.clone());
            if s.first_seen.is_none() {
                s.first_seen = Some(Instant::now());
                s.hints.start_time = Some(SystemTime::now());
            }
            s.phase.evict(EvictionOrder { grace_secs: 0, pod });
            s.hints.evicted = None;
            s.hints.rejected = Some((refusal.reason.clone(), refusal.status_message()));
        });
    }

    /// Why the node refuses to start `d` now, if it does.
    fn admission_refusal(&self, d: &DesiredPod) -> Option<String> {
        use crate::eviction::NodeCondition;
        let node = self.node.get()?;
        let conditions = node.conditions();
        if conditions.is_empty() {
            return None;
        }
        let spec = d.pod.spec.as_ref()?;
        let critical = spec.priority.unwrap_or(0)
            >= crate::eviction::rank::SYSTEM_CRITICAL_PRIORITY
            || matches!(
                spec.priority_class_name.as_deref(),
                Some("system-node-critical" | "system-cluster-critical")
            );
        if critical {
            return None;
        }
        let best_effort = crate::convert::qos_class(spec) == crate::convert::QosClass::BestEffort;
        let refusing: Vec<&str> = conditions
            .iter()
            .filter(|c| **c != NodeCondition::MemoryPressure || best_effort)
            .map(|c| c.as_str())
            .collect();
        if refusing.is_empty() {
            return None;
        }
        Some(format!(
            "The node had condition: [{}]. ",
            refusing.join(", ")
        ))
    }

    /// Asks for pod `uid` to be evicted: its containers are stopped with
    /// `grace_secs` by its next sync (which the caller queues), it is
    /// never started again unless its manifest changes, and it shows as
    /// Failed, reason Evicted, with `message`. False when the pod is not
    /// one the workers run, or is already evicted.
    pub fn request_eviction(&self, uid: &str, grace_secs: i64, message: String) -> bool {
        let Some(d) = self.source.get(uid) else {
            return false;
        };
        let pod = Arc::as_ptr(&d.pod) as usize;
        let mut g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = g.get_mut(uid) else {
            return false;
        };
        let order = EvictionOrder {
            grace_secs: grace_secs.max(0),
            pod,
        };
        if !s.phase.evict(order) {
            return false;
        }
        s.hints.evicted = Some(message.clone());
        drop(g);
        self.persist_eviction(&d, grace_secs.max(0), &message);
        true
    }

    /// Where the eviction of pod `uid` is recorded.
    fn eviction_file(&self, uid: &str) -> PathBuf {
        self.config.root.join("evictions").join(uid)
    }

    /// Records the eviction of `d` on disk (best effort: without it, an
    /// agent restart would start the pod again).
    fn persist_eviction(&self, d: &DesiredPod, grace_secs: i64, message: &str) {
        let rec = EvictionRecord {
            message: message.to_string(),
            grace_secs,
            pod_hash: pod_hash(d),
        };
        let file = self.eviction_file(&d.uid);
        let res = file
            .parent()
            .map_or(Ok(()), |dir| {
                petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE)
                    .map(drop)
                    .map_err(std::io::Error::other)
            })
            .and_then(|()| {
                let tmp = file.with_extension("tmp");
                std::fs::write(&tmp, serde_json::to_vec(&rec).unwrap_or_default())?;
                std::fs::rename(&tmp, &file)
            });
        if let Err(e) = res {
            tracing::warn!(uid = %d.uid, error = %e, "recording an eviction failed");
        }
    }

    fn forget_eviction(&self, uid: &str) {
        match std::fs::remove_file(self.eviction_file(uid)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(uid, error = %e, "removing an eviction record failed"),
        }
    }

    /// At a pod's first sync by this agent: an eviction recorded by a
    /// previous agent for this very pod is taken up again.
    fn restore_eviction(&self, d: &DesiredPod) {
        let fresh = self.with_state(&d.uid, |s| {
            s.first_seen.is_none() && s.phase.eviction().is_none()
        });
        if !fresh {
            return;
        }
        let Ok(bytes) = std::fs::read(self.eviction_file(&d.uid)) else {
            return;
        };
        match serde_json::from_slice::<EvictionRecord>(&bytes) {
            Ok(rec) if rec.pod_hash == pod_hash(d) => {
                let pod = Arc::as_ptr(&d.pod) as usize;
                self.with_state(&d.uid, |s| {
                    s.phase.evict(EvictionOrder {
                        grace_secs: rec.grace_secs,
                        pod,
                    });
                    s.hints.evicted = Some(rec.message);
                });
                tracing::info!(uid = %d.uid, "pod stays evicted across the agent's restart");
            }
            // Another pod now (changed manifest) or an unreadable record.
            _ => self.forget_eviction(&d.uid),
        }
    }

    /// Whether pod `uid` was evicted (and its manifest has not changed
    /// since).
    pub fn is_evicted(&self, uid: &str) -> bool {
        let pod = self.source.get(uid).map(|d| Arc::as_ptr(&d.pod) as usize);
        let g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        g.get(uid)
            .and_then(|s| s.phase.eviction())
            .is_some_and(|e| Some(e.pod) == pod)
    }

    /// The sync of an evicted pod: stop whatever still runs, publish it as
    /// evicted. None when the pod is not evicted (any more: a changed
    /// manifest makes a new pod of it).
    async fn sync_evicted(
        &self,
        d: &DesiredPod,
        status: &Arc<PodRuntimeStatus>,
        fp: &Fingerprint,
    ) -> Result<Option<Action>, WorkerError> {
        let pod = Arc::as_ptr(&d.pod) as usize;
        let (evicted, cleared) = self.with_state(&d.uid, |s| match s.phase.eviction() {
            Some(e) if e.pod == pod => (true, false),
            Some(_) => {
                s.phase.clear_eviction();
                s.hints.evicted = None;
                s.hints.rejected = None;
                (false, true)
            }
            None => (false, false),
        });
        if cleared {
            // A changed manifest is a new pod: it may run.
            self.forget_eviction(&d.uid);
        }
        if !evicted {
            return Ok(None);
        }
        if self.with_state(&d.uid, |s| s.phase.settled() == Some(fp)) {
            return Ok(Some(Action::Done));
        }
        let live = status.containers.iter().any(|c| {
            c.state == petrel_cri::api::ContainerState::ContainerRunning as i32
                || c.state == petrel_cri::api::ContainerState::ContainerUnknown as i32
        }) || status
            .sandboxes
            .iter()
            .any(|s| s.state == petrel_cri::api::PodSandboxState::SandboxReady as i32);
        if live {
            self.kill_pod(&d.uid, status, Some(d), false).await?;
            tracing::info!(uid = %d.uid, pod = %format!("{}/{}", d.namespace, d.name), "evicted pod stopped");
            // The next sync (on the PLEG's events) publishes the stopped
            // containers.
            self.publish(d, Some(status));
            return Ok(Some(Action::Done));
        }
        // Nothing runs any more: its emptyDirs go (kubelet tears down an
        // evicted pod's volumes), which is what relieves disk pressure.
        let ctx = self.convert_context(d, Vec::new());
        if let Err(e) = crate::convert::remove_pod_dir(&ctx) {
            tracing::warn!(uid = %d.uid, error = %e, "removing an evicted pod's volumes failed");
        }
        self.publish(d, Some(status));
        self.with_state(&d.uid, |s| s.phase.set_settled(Some(fp.clone())));
        Ok(Some(Action::Done))
    }

    /// The runtime's status of `uid`, inspected after this agent's last
    /// action on it: from the cache if that is fresh enough, else by a
    /// targeted inspection (and `get_newer_than` makes sure of it); with
    /// the time that inspection began.
    async fn fresh_status(&self, uid: &str) -> Result<(Arc<PodRuntimeStatus>, i64), WorkerError> {
        let last = self.with_state(uid, |s| s.last_action);
        let entry = self.cache.get(uid);
        // A failed inspection is not a status: look again.
        if entry.timestamp <= last || entry.timestamp == 0 || entry.error.is_some() {
            self.pleg.inspect(uid).await?;
        }
        let entry = tokio::time::timeout(
            Duration::from_secs(10),
            self.cache.get_newer_than(uid, last),
        )
        .await
        .map_err(|_| WorkerError::StaleStatus(uid.to_string()))?;
        if let Some(e) = entry.error {
            return Err(WorkerError::Io(format!("inspecting pod {uid}: {e}")));
        }
        let status = entry.status.unwrap_or_else(|| {
            Arc::new(PodRuntimeStatus {
                uid: uid.to_string(),
                ..Default::default()
            })
        });
        Ok((status, entry.timestamp))
    }

    /// Would a sync of `uid` now do nothing? True when its last sync was
    /// quiet and nothing it decided on has changed since: the cached status
    /// (fresh, no error), the desired pod and the probe results. The
    /// periodic resync skips such pods, so a quiet node wakes once per
    /// period, not once per pod.
    pub fn is_settled(&self, uid: &str) -> bool {
        let Some(d) = self.source.get(uid) else {
            return false;
        };
        if d.invalid.is_some() {
            return false;
        }
        let entry = self.cache.get(uid);
        let Some(status) = entry.status.as_ref() else {
            return false;
        };
        let (settled, last_action) =
            self.with_state(uid, |s| (s.phase.settled().cloned(), s.last_action));
        if entry.error.is_some() || entry.timestamp <= last_action {
            return false;
        }
        let fp = Fingerprint {
            status: Arc::clone(status),
            pod: Arc::as_ptr(&d.pod) as usize,
            probes: self.probe_fingerprint(&d, status),
        };
        settled == Some(fp)
    }

    /// The probe results of the pod's running containers.
    fn probe_fingerprint(
        &self,
        pod: &DesiredPod,
        runtime: &PodRuntimeStatus,
    ) -> Vec<(Option<bool>, Option<bool>, bool)> {
        pod_containers(pod)
            .filter_map(|c| runtime.latest_container(&c.name).map(|i| (c, i)))
            .filter(|(_, i)| i.state == petrel_cri::api::ContainerState::ContainerRunning as i32)
            .map(|(c, i)| {
                let r = self.probes.results(&pod.uid, &c.name, &i.id);
                (r.ready, r.started, r.kill_reason.is_some())
            })
            .collect()
    }

    /// Publishes the status of `pod` computed from `runtime` (the status
    /// the current sync acts on), or from the cache's newest inspection
    /// when that is newer: a status never goes back to what the sync began
    /// with after the PLEG published a later one (see
    /// [`PodWorkers::publish_observed`]).
    fn publish(&self, pod: &DesiredPod, runtime: Option<&Arc<PodRuntimeStatus>>) {
        let mut g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let s = g.entry(pod.uid.clone()).or_default();
        let runtime = runtime.map(|snapshot| {
            let newest = self.cache.get(&pod.uid);
            match newest.status {
                Some(st) if newest.error.is_none() && newest.timestamp >= s.observed_at => {
                    (st, newest.timestamp)
                }
                _ => (Arc::clone(snapshot), s.observed_at),
            }
        });
        self.publish_locked(pod, s, runtime);
    }

    /// Publishes the status of pod `uid` from the cache's newest
    /// inspection, at once: called when the PLEG saw the pod change, so a
    /// container that died shows as terminated before its worker restarts
    /// it, and while its worker is busy (stopping another container with
    /// its grace period, say). Only for a pod its worker has synced (the
    /// pod it acts on, its waiting reasons), and only an inspection at
    /// least as new as the last published.
    pub fn publish_observed(&self, uid: &str) {
        let entry = self.cache.get(uid);
        let Some(status) = entry.status.filter(|_| entry.error.is_none()) else {
            return;
        };
        let mut g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = g.get_mut(uid) else {
            return;
        };
        let Some(pod) = s.last_desired.clone().filter(|d| d.invalid.is_none()) else {
            return;
        };
        if entry.timestamp < s.published_at {
            return;
        }
        self.publish_locked(&pod, s, Some((status, entry.timestamp)));
    }

    /// Computes and publishes the status of `pod` from `runtime` (an
    /// inspection and its time) and the worker's state `s`, under the pods
    /// lock: publishes of one pod never interleave, so the last one
    /// published is the newest.
    fn publish_locked(
        &self,
        pod: &DesiredPod,
        s: &mut PodState,
        runtime: Option<(Arc<PodRuntimeStatus>, i64)>,
    ) {
        let mut hints = s.hints.clone();
        let terminating_since = s.phase.terminating_since();
        if let Some((_, at)) = &runtime {
            s.published_at = s.published_at.max(*at);
        }
        let runtime = runtime.map(|(st, _)| st);
        hints.terminating = terminating_since.is_some();
        // Probe results of the running instances.
        if let Some(rt) = runtime.as_deref() {
            for c in pod_containers(pod) {
                if let Some(inst) = rt.latest_container(&c.name) {
                    if inst.state == petrel_cri::api::ContainerState::ContainerRunning as i32 {
                        let r = self.probes.results(&pod.uid, &c.name, &inst.id);
                        let h = hints.containers.entry(c.name.clone()).or_default();
                        h.ready = r.ready;
                        h.started = r.started;
                    }
                }
            }
        }
        let ctx = StatusContext {
            host_ip: &self.config.host_ip,
            runtime_name: &self.config.runtime_name,
            now: SystemTime::now(),
        };
        let mut status = compute_pod_status(pod, runtime.as_deref(), &hints, &ctx);
        if let Some((reason, message)) = &hints.rejected {
            crate::status::compute::mark_rejected(&mut status, reason, message);
        } else if let Some(message) = &hints.evicted {
            crate::status::compute::mark_evicted(&mut status, message);
        }
        let prev = self.store.get(&pod.namespace, &pod.name);
        let prev_status = prev.as_ref().and_then(|p| p.status.as_ref());
        // A pod whose sandboxes all stopped (it completed, say: stopping
        // released its network) keeps showing the IPs it had, as kubelet
        // shows a dead pod's.
        let all_stopped = runtime.as_deref().is_some_and(|r| {
            r.sandboxes
                .iter()
                .all(|sb| sb.state != petrel_cri::api::PodSandboxState::SandboxReady as i32)
        });
        let same_pod = prev
            .as_ref()
            .is_some_and(|p| p.metadata.uid.as_deref() == Some(pod.uid.as_str()));
        if status.pod_ip.is_none() && all_stopped && same_pod {
            if let Some(p) = prev_status.filter(|p| p.pod_ip.is_some()) {
                status.pod_ip.clone_from(&p.pod_ip);
                status.pod_ips.clone_from(&p.pod_ips);
            }
        }
        carry_transition_times(prev_status, &mut status, ctx.now);
        self.store
            .upsert(published_pod(pod, status, terminating_since));
    }

    /// Forgets everything about `uid` (its pod is gone from the runtime and
    /// from the sources).
    fn forget(&self, uid: &str) {
        self.forget_eviction(uid);
        self.admissions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
        let state = {
            let mut g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            g.remove(uid)
        };
        if let Some(d) = state.and_then(|s| s.last_desired) {
            // Only our own entry: a duplicate shares the name.
            let ours = self
                .store
                .get(&d.namespace, &d.name)
                .is_some_and(|p| p.metadata.uid.as_deref() == Some(uid));
            if ours {
                self.store.remove(&d.namespace, &d.name);
            }
            let ctx = self.convert_context(&d, Vec::new());
            if let Err(e) = crate::convert::remove_pod_dir(&ctx) {
                tracing::warn!(uid, error = %e, "removing the pod's directory failed");
            }
            // The pod's container logs go with it, as kubelet removes
            // /var/log/pods/<pod> with the pod.
            match std::fs::remove_dir_all(&ctx.log_dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(uid, error = %e, "removing the pod's logs failed"),
            }
        }
        self.cache.delete(uid);
        self.probes.remove_pod(uid);
        self.backoff.forget_pod(uid);
        self.pull_backoff.forget_pod(uid);
        if let Some(objects) = self.objects.get() {
            objects.release(uid);
        }
        // Its sandboxes are gone: the pod cgroup the agent made goes too
        // (kubelet removes an orphaned pod's cgroup).
        if let Some(q) = self.qos_cgroups.get() {
            q.forget_pod(uid);
        }
        // Last: whoever hears it finds the pod forgotten everywhere.
        if let Some(hook) = self.on_forget.get() {
            hook(uid);
        }
    }

    /// Whether the workers know pod `uid` (it has not been forgotten): its
    /// worker task lives as long as this holds.
    pub fn is_known(&self, uid: &str) -> bool {
        let g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        g.contains_key(uid)
    }

    /// UIDs of every pod the workers know (for the periodic resync).
    pub fn known_uids(&self) -> Vec<PodUid> {
        let g = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        g.keys().cloned().collect()
    }
}

impl crate::eviction::Evictor for PodWorkers {
    fn request_eviction(&self, uid: &str, grace_secs: i64, message: String) -> bool {
        PodWorkers::request_eviction(self, uid, grace_secs, message)
    }

    fn is_evicted(&self, uid: &str) -> bool {
        PodWorkers::is_evicted(self, uid)
    }
}

/// A desired pod as admission sees it.
fn candidate(q: &DesiredPod) -> crate::admission::Candidate<'_> {
    crate::admission::Candidate {
        uid: q.uid.as_str(),
        pod: &q.pod,
        is_static: matches!(q.source, PodOrigin::File(_)),
    }
}

/// Init and app containers of a pod's spec.
fn pod_containers(
    pod: &DesiredPod,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::Container> {
    pod.pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}
