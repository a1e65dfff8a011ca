//! `run FILE`: runs one pod and its containers described in a small YAML
//! file, then prints the pod id and each container id, one per line.
//!
//! The schema keeps Kubernetes' names where it can (see `run-example.yaml`
//! beside this file); unknown keys are rejected:
//!
//! ```yaml
//! pod:
//!   name: demo                 # required
//!   namespace: default         # default: default
//!   uid: <string>              # default: a random UUID
//!   hostname: <string>         # default: the pod name (unset with host_network)
//!   log_directory: <abs path>  # default: /var/log/pods/<namespace>_<name>_<uid>
//!   labels: {key: value}
//!   annotations: {key: value}
//!   cgroup_parent: <string>    # default: the runtime's
//!   host_network: false        # network namespace NODE instead of POD
//!   share_pid: false           # PID namespace POD instead of CONTAINER
//! containers:                  # created and started in order
//!   - name: hello              # required, unique in the pod
//!     image: docker.io/petrel/busybox:latest   # required, already present
//!     command: [/bin/sh, -c]   # default: the image's entrypoint
//!     args: ["echo hi"]        # default: the image's cmd
//!     env: {KEY: value}
//!     working_dir: <abs path>  # default: the image's
//!     log_path: <rel path>     # default: <name>/0.log (in log_directory)
//!     labels: {key: value}
//!     annotations: {key: value}
//!     mounts:
//!       - {host_path: /abs, container_path: /abs, readonly: false}
//!     resources: {cpu_shares: 512, cpu_quota: 50000, cpu_period: 100000,
//!                 memory_limit_bytes: 67108864, cpuset_cpus: "0-1"}
//!     tty: false
//! ```
//!
//! Values of `env`, `labels` and `annotations` may be YAML strings, numbers
//! or booleans. The IPC namespace is always the pod's. Like the kubelet, the
//! pod's and containers' labels gain `io.kubernetes.pod.{name,namespace,uid}`
//! (and `io.kubernetes.container.name`) unless the file sets them, so other
//! CRI tools can show pod names.
//!
//! If a step fails, the pod sandbox (with whatever containers it holds) is
//! stopped and removed before the error is reported.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use petrel_cri::api::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, KeyValue,
    LinuxContainerConfig, LinuxContainerResources, LinuxContainerSecurityContext,
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RunPodSandboxRequest, StartContainerRequest,
};
use serde::Deserialize;

use super::error::CtlError;
use super::output::emit;
use super::{pods, Ctl};

/// Flags of `run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The YAML file describing the pod and its containers.
    file: PathBuf,
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// The pod sandbox.
    pub pod: PodSpec,
    /// Its containers, created and started in order.
    #[serde(default)]
    pub containers: Vec<ContainerSpec>,
}

/// The `pod` section.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// Namespace; `default` if absent.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Pod UID; a random UUID if absent.
    #[serde(default)]
    pub uid: Option<String>,
    /// Hostname; the pod name if absent (the node's with `host_network`).
    #[serde(default)]
    pub hostname: Option<String>,
    /// Where container logs go; `/var/log/pods/<ns>_<name>_<uid>` if absent.
    #[serde(default)]
    pub log_directory: Option<String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, Scalar>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, Scalar>,
    /// Parent cgroup; the runtime's default if absent.
    #[serde(default)]
    pub cgroup_parent: Option<String>,
    /// Use the node's network namespace.
    #[serde(default)]
    pub host_network: bool,
    /// Share one PID namespace between the pod's containers.
    #[serde(default)]
    pub share_pid: bool,
}

fn default_namespace() -> String {
    "default".into()
}

/// One entry of `containers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerSpec {
    /// Container name, unique in the pod.
    pub name: String,
    /// Image reference (the image must already be present).
    pub image: String,
    /// Entrypoint override.
    #[serde(default)]
    pub command: Vec<String>,
    /// Arguments override.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, Scalar>,
    /// Working directory.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// Log file relative to the pod's log directory; `<name>/0.log` if absent.
    #[serde(default)]
    pub log_path: Option<String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, Scalar>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, Scalar>,
    /// Bind mounts.
    #[serde(default)]
    pub mounts: Vec<MountSpec>,
    /// Resource limits.
    #[serde(default)]
    pub resources: Option<ResourcesSpec>,
    /// Allocate a terminal.
    #[serde(default)]
    pub tty: bool,
}

/// One bind mount.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// Absolute path on the host.
    pub host_path: String,
    /// Absolute path in the container.
    pub container_path: String,
    /// Mount read-only.
    #[serde(default)]
    pub readonly: bool,
}

/// Linux resources; absent fields are left to the runtime.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourcesSpec {
    /// CPU shares (relative weight).
    #[serde(default)]
    pub cpu_shares: Option<i64>,
    /// CFS quota in microseconds per period.
    #[serde(default)]
    pub cpu_quota: Option<i64>,
    /// CFS period in microseconds.
    #[serde(default)]
    pub cpu_period: Option<i64>,
    /// Memory limit in bytes.
    #[serde(default)]
    pub memory_limit_bytes: Option<i64>,
    /// CPUs the container may run on, e.g. `0-1`.
    #[serde(default)]
    pub cpuset_cpus: Option<String>,
}

/// A map value: YAML strings, numbers and booleans are all accepted, so
/// `PORT: 8080` needs no quotes.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// A string.
    String(String),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::String(s) => f.write_str(s),
            Self::Int(i) => write!(f, "{i}"),
            Self::Float(x) => write!(f, "{x}"),
            Self::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// Parses and checks a run file's text.
pub fn parse(text: &str) -> Result<RunSpec, String> {
    let spec: RunSpec = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
    validate(&spec)?;
    Ok(spec)
}

fn validate(spec: &RunSpec) -> Result<(), String> {
    let pod = &spec.pod;
    require(!pod.name.is_empty(), "pod.name must not be empty")?;
    require(!pod.namespace.is_empty(), "pod.namespace must not be empty")?;
    if let Some(dir) = &pod.log_directory {
        require(
            dir.starts_with('/'),
            "pod.log_directory must be an absolute path",
        )?;
    }
    let mut names = HashSet::new();
    for (i, c) in spec.containers.iter().enumerate() {
        let at = format!("containers[{i}]");
        require(!c.name.is_empty(), &format!("{at}.name must not be empty"))?;
        require(
            names.insert(c.name.as_str()),
            &format!("{at}.name {:?} is used twice", c.name),
        )?;
        require(
            !c.image.is_empty(),
            &format!("{at}.image must not be empty"),
        )?;
        if let Some(p) = &c.log_path {
            require(
                !p.is_empty() && !p.starts_with('/'),
                &format!("{at}.log_path must be relative to pod.log_directory"),
            )?;
        }
        for (j, m) in c.mounts.iter().enumerate() {
            require(
                m.host_path.starts_with('/') && m.container_path.starts_with('/'),
                &format!("{at}.mounts[{j}]: host_path and container_path must be absolute"),
            )?;
        }
    }
    Ok(())
}

fn require(ok: bool, message: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(message.to_string())
    }
}

fn strings(map: &BTreeMap<String, Scalar>) -> HashMap<String, String> {
    map.iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
}

/// Adds `key: value` unless the map already has `key`.
fn add_default(map: &mut HashMap<String, String>, key: &str, value: &str) {
    map.entry(key.to_string())
        .or_insert_with(|| value.to_string());
}

/// The pod's namespaces: network NODE or POD, PID POD or CONTAINER, IPC POD.
pub fn namespace_options(pod: &PodSpec) -> NamespaceOption {
    let mode = |shared: bool, yes: NamespaceMode, no: NamespaceMode| {
        if shared {
            yes as i32
        } else {
            no as i32
        }
    };
    NamespaceOption {
        network: mode(pod.host_network, NamespaceMode::Node, NamespaceMode::Pod),
        pid: mode(pod.share_pid, NamespaceMode::Pod, NamespaceMode::Container),
        ipc: NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// The pod labels the kubelet would add.
fn pod_identity_labels(labels: &mut HashMap<String, String>, pod: &PodSpec, uid: &str) {
    add_default(labels, "io.kubernetes.pod.name", &pod.name);
    add_default(labels, "io.kubernetes.pod.namespace", &pod.namespace);
    add_default(labels, "io.kubernetes.pod.uid", uid);
}

/// The PodSandboxConfig for `pod` with UID `uid`.
pub fn pod_config(pod: &PodSpec, uid: &str) -> PodSandboxConfig {
    let mut labels = strings(&pod.labels);
    pod_identity_labels(&mut labels, pod, uid);
    let hostname = match (&pod.hostname, pod.host_network) {
        (Some(h), _) => h.clone(),
        (None, false) => pod.name.clone(),
        (None, true) => String::new(),
    };
    let log_directory = pod
        .log_directory
        .clone()
        .unwrap_or_else(|| format!("/var/log/pods/{}_{}_{uid}", pod.namespace, pod.name));
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: pod.name.clone(),
            uid: uid.to_string(),
            namespace: pod.namespace.clone(),
            attempt: 0,
        }),
        hostname,
        log_directory,
        labels,
        annotations: strings(&pod.annotations),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: pod.cgroup_parent.clone().unwrap_or_default(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The ContainerConfig for `c` in `pod` with UID `uid`.
pub fn container_config(c: &ContainerSpec, pod: &PodSpec, uid: &str) -> ContainerConfig {
    let mut labels = strings(&c.labels);
    pod_identity_labels(&mut labels, pod, uid);
    add_default(&mut labels, "io.kubernetes.container.name", &c.name);
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: c.name.clone(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: c.image.clone(),
            user_specified_image: c.image.clone(),
            ..Default::default()
        }),
        command: c.command.clone(),
        args: c.args.clone(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: c
            .env
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.clone(),
                value: v.to_string().into_bytes(),
            })
            .collect(),
        mounts: c.mounts.iter().map(mount).collect(),
        labels,
        annotations: strings(&c.annotations),
        log_path: c
            .log_path
            .clone()
            .unwrap_or_else(|| format!("{}/0.log", c.name)),
        tty: c.tty,
        linux: Some(LinuxContainerConfig {
            resources: c.resources.as_ref().map(resources),
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

fn mount(m: &MountSpec) -> Mount {
    Mount {
        host_path: m.host_path.clone(),
        container_path: m.container_path.clone(),
        readonly: m.readonly,
        ..Default::default()
    }
}

fn resources(r: &ResourcesSpec) -> LinuxContainerResources {
    LinuxContainerResources {
        cpu_shares: r.cpu_shares.unwrap_or(0),
        cpu_quota: r.cpu_quota.unwrap_or(0),
        cpu_period: r.cpu_period.unwrap_or(0),
        memory_limit_in_bytes: r.memory_limit_bytes.unwrap_or(0),
        cpuset_cpus: r.cpuset_cpus.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// A random (version 4) UUID.
fn new_uid() -> Result<String, CtlError> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|source| CtlError::Io {
            what: "read random bytes from",
            path: "/dev/urandom".into(),
            source,
        })?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

fn load(path: &Path) -> Result<RunSpec, CtlError> {
    let text = std::fs::read_to_string(path).map_err(|source| CtlError::Io {
        what: "read run file",
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|e| CtlError::Other(format!("invalid run file {}: {e}", path.display())))
}

/// `run FILE`: RunPodSandbox, then CreateContainer and StartContainer for
/// each container; on failure the pod is removed again.
pub async fn run(ctl: &Ctl, args: RunArgs) -> Result<ExitCode, CtlError> {
    let spec = load(&args.file)?;
    let uid = match &spec.pod.uid {
        Some(uid) => uid.clone(),
        None => new_uid()?,
    };
    let pod_config = pod_config(&spec.pod, &uid);
    let mut rt = ctl.runtime().await?;
    let req = RunPodSandboxRequest {
        config: Some(pod_config.clone()),
        runtime_handler: String::new(),
    };
    let what = format!("run pod sandbox {}", spec.pod.name);
    let pod_id = ctl
        .call(what, rt.run_pod_sandbox(req))
        .await?
        .pod_sandbox_id;

    let mut ids = vec![pod_id.clone()];
    for c in &spec.containers {
        match start_container(ctl, &pod_id, &pod_config, c, &spec.pod, &uid).await {
            Ok(id) => ids.push(id),
            Err(e) => return Err(roll_back(ctl, &pod_id, e).await),
        }
    }
    emit(&ids.iter().map(|id| format!("{id}\n")).collect::<String>())?;
    Ok(ExitCode::SUCCESS)
}

async fn start_container(
    ctl: &Ctl,
    pod_id: &str,
    pod_config: &PodSandboxConfig,
    c: &ContainerSpec,
    pod: &PodSpec,
    uid: &str,
) -> Result<String, CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = CreateContainerRequest {
        pod_sandbox_id: pod_id.to_string(),
        config: Some(container_config(c, pod, uid)),
        sandbox_config: Some(pod_config.clone()),
    };
    let what = format!("create container {} in pod sandbox {pod_id}", c.name);
    let id = ctl.call(what, rt.create_container(req)).await?.container_id;
    let req = StartContainerRequest {
        container_id: id.clone(),
    };
    let what = format!("start container {} ({id})", c.name);
    ctl.call(what, rt.start_container(req)).await?;
    Ok(id)
}

/// Removes the pod after `cause`, and says so in the error.
async fn roll_back(ctl: &Ctl, pod_id: &str, cause: CtlError) -> CtlError {
    let cleanup = match pods::stop_pod(ctl, pod_id).await {
        Ok(()) => pods::remove_pod(ctl, pod_id).await,
        Err(e) => Err(e),
    };
    match cleanup {
        Ok(()) => CtlError::Other(format!("{cause}; removed pod sandbox {pod_id} again")),
        Err(e) => CtlError::Other(format!("{cause}; pod sandbox {pod_id} is left behind: {e}")),
    }
}

#[cfg(test)]
// A failed expectation is a failed test.
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("run-example.yaml");

    fn minimal() -> RunSpec {
        parse("pod: {name: demo}\ncontainers:\n  - {name: c, image: busybox}\n")
            .expect("minimal spec")
    }

    #[test]
    fn parse_should_accept_the_example_file() {
        let spec = parse(EXAMPLE).expect("example parses");
        assert_eq!(spec.pod.name, "demo");
        assert_eq!(spec.containers.len(), 1);
        assert_eq!(spec.containers[0].env["GREETER"].to_string(), "petrel");
    }

    #[test]
    fn parse_should_reject_unknown_keys_by_name() {
        let err = parse("pod: {name: demo, nmespace: x}\n")
            .err()
            .unwrap_or_default();
        assert!(err.contains("unknown field `nmespace`"), "{err}");
        let err = parse("pod: {name: d}\ncontainers: [{name: c, image: i, imagee: x}]\n")
            .err()
            .unwrap_or_default();
        assert!(err.contains("unknown field `imagee`"), "{err}");
        let err = parse("pod: {name: d}\nextra: 1\n")
            .err()
            .unwrap_or_default();
        assert!(err.contains("unknown field `extra`"), "{err}");
    }

    #[test]
    fn parse_should_reject_duplicate_names_and_relative_mounts() {
        let dup = "pod: {name: d}\ncontainers: [{name: c, image: i}, {name: c, image: i}]\n";
        assert!(parse(dup).err().unwrap_or_default().contains("used twice"));
        let rel = "pod: {name: d}\ncontainers:\n  - name: c\n    image: i\n    \
                   mounts: [{host_path: tmp, container_path: /x}]\n";
        assert!(parse(rel).err().unwrap_or_default().contains("mounts[0]"));
    }

    #[test]
    fn parse_should_accept_numbers_and_booleans_in_maps() {
        let spec = parse(
            "pod: {name: d, labels: {replicas: 3}}\n\
             containers: [{name: c, image: i, env: {PORT: 8080, DEBUG: true}}]\n",
        )
        .expect("spec");
        assert_eq!(spec.pod.labels["replicas"].to_string(), "3");
        assert_eq!(spec.containers[0].env["PORT"].to_string(), "8080");
        assert_eq!(spec.containers[0].env["DEBUG"].to_string(), "true");
    }

    #[test]
    fn pod_config_should_fill_defaults_like_the_kubelet() {
        let spec = minimal();
        let cfg = pod_config(&spec.pod, "u-1");
        let meta = cfg.metadata.clone().unwrap_or_default();
        assert_eq!(
            (
                meta.name.as_str(),
                meta.namespace.as_str(),
                meta.uid.as_str()
            ),
            ("demo", "default", "u-1")
        );
        assert_eq!(cfg.hostname, "demo");
        assert_eq!(cfg.log_directory, "/var/log/pods/default_demo_u-1");
        assert_eq!(cfg.labels["io.kubernetes.pod.name"], "demo");
        let ns = cfg
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .unwrap_or_default();
        assert_eq!(ns.network, NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, NamespaceMode::Container as i32);
        assert_eq!(ns.ipc, NamespaceMode::Pod as i32);
    }

    #[test]
    fn namespace_options_should_follow_host_network_and_share_pid() {
        let spec = parse("pod: {name: d, host_network: true, share_pid: true}\n").expect("spec");
        let ns = namespace_options(&spec.pod);
        assert_eq!(ns.network, NamespaceMode::Node as i32);
        assert_eq!(ns.pid, NamespaceMode::Pod as i32);
        assert_eq!(pod_config(&spec.pod, "u").hostname, "");
    }

    #[test]
    fn container_config_should_map_every_field() {
        let spec = parse(EXAMPLE).expect("example parses");
        let c = container_config(&spec.containers[0], &spec.pod, "u-2");
        assert_eq!(c.metadata.map(|m| m.name), Some("hello".into()));
        assert_eq!(
            c.image.map(|i| i.image),
            Some("docker.io/petrel/busybox:latest".into())
        );
        assert_eq!(c.command, ["/bin/sh", "-c"]);
        assert_eq!(c.envs[0].key, "GREETER");
        assert_eq!(c.log_path, "hello/0.log");
        assert_eq!(c.labels["tier"], "demo");
        assert_eq!(c.labels["io.kubernetes.container.name"], "hello");
        assert!(c.mounts[0].readonly);
        let r = c.linux.and_then(|l| l.resources).unwrap_or_default();
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_quota,
                r.cpu_period,
                r.memory_limit_in_bytes
            ),
            (512, 50_000, 100_000, 64 << 20)
        );
    }

    #[test]
    fn container_config_should_keep_labels_the_file_sets() {
        let spec = parse(
            "pod: {name: d}\ncontainers: \
             [{name: c, image: i, labels: {io.kubernetes.container.name: mine}}]\n",
        )
        .expect("spec");
        let c = container_config(&spec.containers[0], &spec.pod, "u");
        assert_eq!(c.labels["io.kubernetes.container.name"], "mine");
    }

    #[test]
    fn new_uid_should_look_like_a_version_4_uuid() {
        let a = new_uid().expect("uid");
        let b = new_uid().expect("uid");
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(a.as_bytes()[14], b'4');
    }
}
