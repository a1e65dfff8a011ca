//! Plain types shared by the agent's parts: what the sources want, what the
//! runtime has, and the labels that tie the two together.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use petrel_cri::api;

/// A pod's UID, the key of everything per pod (work queue, cache, workers).
pub type PodUid = String;

/// Sandbox and container label: the pod's UID.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// Sandbox and container label: the pod's name.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
/// Sandbox and container label: the pod's namespace.
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Container label: the container's name in the pod spec.
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Sandbox and container label naming the agent (node) that made it. The
/// agent only ever lists, inspects, stops or removes what carries its own
/// value, so it never touches pods someone else made on the same runtime.
pub const LABEL_MANAGED_BY: &str = "petrel.io/node";
/// Container annotation: hash of the container's spec (a changed spec
/// means the container is restarted).
pub const ANNOTATION_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Container annotation: the restart count this container was created with.
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Container annotation: [`KIND_INIT`], [`KIND_SIDECAR`] or [`KIND_APP`].
pub const ANNOTATION_CONTAINER_KIND: &str = "petrel.io/container-kind";
/// [`ANNOTATION_CONTAINER_KIND`] of an init container that runs to
/// completion.
pub const KIND_INIT: &str = "init";
/// [`ANNOTATION_CONTAINER_KIND`] of a native sidecar: an init container
/// with `restartPolicy: Always`, kept running beside the app containers.
pub const KIND_SIDECAR: &str = "sidecar";
/// [`ANNOTATION_CONTAINER_KIND`] of an app container.
pub const KIND_APP: &str = "app";
/// Container annotation: the pod's termination grace period in seconds,
/// kept so a pod whose manifest is gone still stops gracefully.
pub const ANNOTATION_TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Container annotation: the container's preStop exec command (JSON array),
/// kept for the same reason.
pub const ANNOTATION_PRE_STOP: &str = "petrel.io/pre-stop-exec";

/// Sandbox annotation: hash of what the sandbox was made from (a changed
/// pod-level spec means the pod gets a new sandbox).
pub const ANNOTATION_SANDBOX_HASH: &str = "petrel.io/sandbox-hash";

/// Where a desired pod comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOrigin {
    /// A static pod: a document of this manifest file.
    File(PathBuf),
    /// A pod the API server bound to this node (cluster mode).
    Api,
}

impl std::fmt::Display for PodOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(p) => write!(f, "{}", p.display()),
            Self::Api => f.write_str("the API server"),
        }
    }
}

/// A pod that a source (the manifest directory, or the API server in
/// cluster mode) wants on this node.
#[derive(Debug, Clone)]
pub struct DesiredPod {
    /// Stable UID (from the manifest's metadata.uid, else derived from
    /// node, namespace and name).
    pub uid: PodUid,
    /// Namespace (default "default").
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The pod with defaults applied (metadata.uid set, restartPolicy,
    /// terminationGracePeriodSeconds, imagePullPolicy, ... filled in).
    pub pod: Arc<Pod>,
    /// Where it came from.
    pub source: PodOrigin,
    /// Why this pod cannot run (a parse or validation error), in which case
    /// it is shown with this reason and never started.
    pub invalid: Option<String>,
}

/// What the runtime has for one pod: one inspection, as cached by the PLEG.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodRuntimeStatus {
    /// The pod's UID (from labels).
    pub uid: PodUid,
    /// Name (from labels).
    pub name: String,
    /// Namespace (from labels).
    pub namespace: String,
    /// Every sandbox of the pod, newest (largest created_at) first.
    pub sandboxes: Vec<api::PodSandboxStatus>,
    /// Every container of the pod (all sandboxes, every state), newest
    /// first.
    pub containers: Vec<api::ContainerStatus>,
    /// Kind and restart count per container id, from the annotations the
    /// agent wrote at create time.
    pub container_meta: HashMap<String, ContainerMeta>,
}

/// What the agent recorded on a container when it created it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerMeta {
    /// Init container (a sidecar too)?
    pub init: bool,
    /// A native sidecar (an init container with `restartPolicy: Always`)?
    pub sidecar: bool,
    /// Spec hash at create time.
    pub hash: String,
    /// Restart count at create time.
    pub restart_count: i32,
    /// The sandbox it runs in (from ListContainers; CRI's ContainerStatus
    /// does not carry it).
    pub sandbox_id: String,
}

impl PodRuntimeStatus {
    /// The newest sandbox, if any.
    pub fn latest_sandbox(&self) -> Option<&api::PodSandboxStatus> {
        self.sandboxes.first()
    }

    /// The newest container with this name, if any.
    pub fn latest_container(&self, name: &str) -> Option<&api::ContainerStatus> {
        self.containers
            .iter()
            .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
    }

    /// The pod's IPs from its newest sandbox.
    pub fn ips(&self) -> Vec<String> {
        let Some(net) = self.latest_sandbox().and_then(|s| s.network.as_ref()) else {
            return Vec::new();
        };
        let mut ips = Vec::new();
        if !net.ip.is_empty() {
            ips.push(net.ip.clone());
        }
        ips.extend(net.additional_ips.iter().map(|i| i.ip.clone()));
        ips
    }
}

/// What the pod worker knows beyond the runtime's view, for the status:
/// why a container waits, and probe results.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodHints {
    /// Per container name.
    pub containers: HashMap<String, ContainerHints>,
    /// The pod is being terminated (manifest deleted).
    pub terminating: bool,
    /// A pod-level message (e.g. why the sandbox cannot be created).
    pub message: Option<String>,
    /// When the agent first acknowledged the pod (status.startTime).
    pub start_time: Option<std::time::SystemTime>,
    /// The pod was evicted for node pressure: the message (signal and
    /// usage). It shows as Failed, reason Evicted.
    pub evicted: Option<String>,
    /// The pod was refused admission: kubelet's reason (`OutOfcpu`,
    /// `NodeAffinity`, ...) and message. It shows as Failed with them.
    pub rejected: Option<(String, String)>,
}

/// Per-container hints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerHints {
    /// Waiting reason and message (CrashLoopBackOff, ErrImageNeverPull,
    /// CreateContainerError, ...), shown while the container is not running.
    pub waiting: Option<(String, String)>,
    /// Readiness probe result (None: no probe, ready when running).
    pub ready: Option<bool>,
    /// Startup probe passed (None: no probe, started when running).
    pub started: Option<bool>,
}
