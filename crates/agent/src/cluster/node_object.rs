//! The Node object the agent registers and keeps up to date, built the way
//! kubelet builds it: capacity and allocatable from the machine and the
//! reservations, the pressure and Ready conditions with kubelet's reasons
//! and messages, the system info, the image list, and the labels and
//! taints given on the command line.
//!
//! Everything here is pure except [`MachineFacts::read`], which reads the
//! machine once at start; the registration loop that sends the object
//! lives elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::eviction::config::Reserved;
use crate::eviction::{EvictionSettings, Signal, ThresholdValue};

/// kubelet's default `--max-pods`.
pub const DEFAULT_MAX_PODS: u64 = 110;

/// kubelet's default `--node-status-max-images`: the most images listed
/// in the node's status.
pub const MAX_IMAGES: usize = 50;

/// The most names listed per image in the node's status (kubelet's limit).
pub const MAX_NAMES_PER_IMAGE: usize = 5;

// ---------------------------------------------------------------------------
// The machine.

/// Facts of the machine, read once at start. Reading never fails: a fact
/// that cannot be read is logged and left at zero or empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineFacts {
    /// Logical CPUs online.
    pub cpus: u64,
    /// `MemTotal` of /proc/meminfo, bytes.
    pub memory_bytes: u64,
    /// Huge pages: page size in bytes → bytes of pages allocated.
    pub hugepages: BTreeMap<u64, u64>,
    /// Size of the filesystem of the agent's root directory, bytes.
    pub ephemeral_storage_bytes: u64,
    /// The most pods the node runs ([`DEFAULT_MAX_PODS`]).
    pub max_pods: u64,
    /// /proc/sys/kernel/osrelease.
    pub kernel_version: String,
    /// `PRETTY_NAME` of os-release.
    pub os_image: String,
    /// /etc/machine-id.
    pub machine_id: String,
    /// The DMI product UUID (empty where it cannot be read).
    pub system_uuid: String,
    /// /proc/sys/kernel/random/boot_id.
    pub boot_id: String,
    /// The architecture as Go names it (`amd64`, `arm64`, ...).
    pub architecture: String,
    /// The operating system as Go names it: `linux`.
    pub operating_system: String,
}

impl MachineFacts {
    /// Reads this machine's facts; the ephemeral storage is that of the
    /// filesystem holding `agent_root`. It reads files (blocking), once at
    /// start.
    pub fn read(agent_root: &Path) -> MachineFacts {
        Self::read_under(Path::new("/"), agent_root)
    }

    /// Reads the facts from a tree laid out as the host's (`/proc`,
    /// `/sys`, `/etc` below `host`), so tests can give a fake one.
    pub fn read_under(host: &Path, agent_root: &Path) -> MachineFacts {
        let at = |p: &str| host.join(p);
        let memory_bytes = read_fact(&at("proc/meminfo"), "memory")
            .and_then(|s| {
                let m = parse_meminfo_total(&s);
                if m.is_none() {
                    tracing::warn!("no MemTotal in /proc/meminfo: memory capacity left at 0");
                }
                m
            })
            .unwrap_or(0);
        MachineFacts {
            cpus: read_cpus(&at("sys/devices/system/cpu/online")),
            memory_bytes,
            hugepages: read_hugepages(&at("sys/kernel/mm/hugepages")),
            ephemeral_storage_bytes: read_fs_size(agent_root),
            max_pods: DEFAULT_MAX_PODS,
            kernel_version: read_trimmed(&at("proc/sys/kernel/osrelease"), "kernel version"),
            os_image: read_os_image(&[at("etc/os-release"), at("usr/lib/os-release")]),
            machine_id: read_trimmed(&at("etc/machine-id"), "machine id"),
            system_uuid: read_trimmed(&at("sys/class/dmi/id/product_uuid"), "system UUID"),
            boot_id: read_trimmed(&at("proc/sys/kernel/random/boot_id"), "boot id"),
            architecture: go_arch(std::env::consts::ARCH).to_string(),
            operating_system: "linux".to_string(),
        }
    }
}

/// The file's text, or None with a warning naming `what` was not learnt.
fn read_fact(path: &Path, what: &str) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the node's {what}; left empty or zero");
            None
        }
    }
}

fn read_trimmed(path: &Path, what: &str) -> String {
    read_fact(path, what)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// CPUs online; where the list cannot be read, what the process may use
/// (which a cgroup quota or affinity mask may lower).
fn read_cpus(online: &Path) -> u64 {
    if let Some(list) = read_fact(online, "CPUs online") {
        match parse_cpu_list(&list) {
            Some(n) => return n,
            None => {
                tracing::warn!(path = %online.display(), list = list.trim(), "cannot parse the CPUs online")
            }
        }
    }
    match std::thread::available_parallelism() {
        Ok(n) => n.get() as u64,
        Err(e) => {
            tracing::warn!(error = %e, "cannot count the node's CPUs; cpu capacity left at 0");
            0
        }
    }
}

/// Bytes of huge pages per page size, from `hugepages-<N>kB/nr_hugepages`
/// below `dir`. A kernel without huge pages has no such directory: none.
fn read_hugepages(dir: &Path) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // No hugetlb support in the kernel: no huge pages, nothing amiss.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            tracing::warn!(path = %dir.display(), error = %e, "cannot list huge page sizes; none reported");
            return out;
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(page) = name.to_str().and_then(parse_hugepage_dir) else {
            continue;
        };
        let pages = read_fact(&entry.path().join("nr_hugepages"), "huge pages")
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        out.insert(page, pages.saturating_mul(page));
    }
    out
}

/// Size of the filesystem holding `path` (blocks × fragment size).
fn read_fs_size(path: &Path) -> u64 {
    match rustix::fs::statvfs(path) {
        Ok(st) => st.f_blocks.saturating_mul(st.f_frsize),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot statfs the agent root; ephemeral-storage capacity left at 0");
            0
        }
    }
}

/// `PRETTY_NAME` of the first os-release that can be read. As cadvisor
/// does, a file without one names the system "Linux".
fn read_os_image(candidates: &[std::path::PathBuf]) -> String {
    for path in candidates {
        if let Ok(s) = std::fs::read_to_string(path) {
            return parse_os_release_pretty_name(&s).unwrap_or_else(|| "Linux".to_string());
        }
    }
    tracing::warn!("cannot read /etc/os-release or /usr/lib/os-release; osImage left empty");
    String::new()
}

/// `MemTotal` of /proc/meminfo in bytes (the file gives kB, meaning KiB).
pub fn parse_meminfo_total(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("MemTotal:")?;
        let mut words = rest.split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// The number of CPUs in a kernel CPU list such as `0-3,6,8-9`.
pub fn parse_cpu_list(list: &str) -> Option<u64> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    let mut n = 0u64;
    for part in list.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u64>().ok()?, hi.parse::<u64>().ok()?),
            None => {
                let one = part.parse::<u64>().ok()?;
                (one, one)
            }
        };
        if hi < lo {
            return None;
        }
        n = n.checked_add(hi - lo + 1)?;
    }
    Some(n)
}

/// The page size in bytes of a `hugepages-<N>kB` directory name.
pub fn parse_hugepage_dir(name: &str) -> Option<u64> {
    name.strip_prefix("hugepages-")?
        .strip_suffix("kB")?
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)
}

/// `PRETTY_NAME` of an os-release file, its quotes and escapes removed.
pub fn parse_os_release_pretty_name(os_release: &str) -> Option<String> {
    let raw = os_release
        .lines()
        .find_map(|l| l.trim().strip_prefix("PRETTY_NAME="))?
        .trim();
    let unquoted = match raw.as_bytes().first() {
        Some(q @ (b'"' | b'\'')) => {
            let inner = &raw[1..];
            inner.strip_suffix(*q as char).unwrap_or(inner)
        }
        _ => raw,
    };
    // Shell-style escapes: a backslash keeps the next character literally.
    let mut out = String::with_capacity(unquoted.len());
    let mut chars = unquoted.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// Rust's name of an architecture (`std::env::consts::ARCH`) as Go's
/// `GOARCH` spells it, which is what Kubernetes publishes.
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "powerpc64" => "ppc64",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        other => other,
    }
}

// ---------------------------------------------------------------------------
// Quantities in Kubernetes' canonical form.

const DECIMAL_SUFFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];
const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// A whole amount in decimal SI form: the largest power of 1000 that
/// divides it exactly (`110`, `2k`, `0`).
fn decimal_si(v: u64) -> String {
    let (mut n, mut e) = (v, 0);
    while n != 0 && n.is_multiple_of(1000) && e + 1 < DECIMAL_SUFFIXES.len() {
        n /= 1000;
        e += 1;
    }
    format!("{n}{}", DECIMAL_SUFFIXES[e])
}

/// A whole amount of bytes in binary SI form, as Kubernetes prints a
/// quantity made in that format: below 1024 in decimal form; else the
/// largest power of 1024 that divides it exactly (`16384256Ki`, `2Gi`),
/// and a plain number when 1024 does not divide it.
fn binary_si(v: u64) -> String {
    if v < 1024 {
        return decimal_si(v);
    }
    let (mut n, mut e) = (v, 0);
    while n.is_multiple_of(1024) && e + 1 < BINARY_SUFFIXES.len() {
        n /= 1024;
        e += 1;
    }
    format!("{n}{}", BINARY_SUFFIXES[e])
}

/// Millicores: whole cores as a plain number (`4`), else millicores
/// (`3500m`).
fn cpu_quantity(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        decimal_si(millis / 1000)
    } else {
        format!("{millis}m")
    }
}

// ---------------------------------------------------------------------------
// Capacity and allocatable.

/// What is set aside from the node's capacity: kubelet's allocatable is
/// capacity − kube-reserved − system-reserved − the hard eviction
/// thresholds of `memory.available` and `nodefs.available`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reservations {
    /// `--kube-reserved`.
    pub kube: Reserved,
    /// `--system-reserved`.
    pub system: Reserved,
    /// The hard `memory.available` threshold, if any.
    pub hard_memory_available: Option<ThresholdValue>,
    /// The hard `nodefs.available` threshold, if any.
    pub hard_nodefs_available: Option<ThresholdValue>,
}

impl Reservations {
    /// The reservations of the agent's eviction settings.
    pub fn from_settings(settings: &EvictionSettings) -> Reservations {
        // A hard threshold given as 0% or 100% is switched off (None).
        let hard = |s: Signal| settings.hard.get(s).and_then(|spec| spec.0);
        Reservations {
            kube: settings.kube_reserved,
            system: settings.system_reserved,
            hard_memory_available: hard(Signal::MemoryAvailable),
            hard_nodefs_available: hard(Signal::NodeFsAvailable),
        }
    }
}

/// A threshold's amount as kubelet reserves it: a percentage is taken of
/// the capacity and truncated (kubelet converts the product to an integer;
/// the eviction manager's own [`ThresholdValue::amount`] rounds).
fn threshold_amount(value: Option<ThresholdValue>, capacity: u64) -> u64 {
    match value {
        None => 0,
        Some(ThresholdValue::Quantity(q)) => q.max(0) as u64,
        Some(ThresholdValue::Percentage(p)) => (capacity as f64 * p).max(0.0) as u64,
    }
}

/// `capacity − reserved`, never below zero.
fn minus(capacity: u64, reserved: u64) -> u64 {
    capacity.saturating_sub(reserved)
}

/// A reservation's amount (negative ones cannot be given; they count as 0).
fn amount(v: i64) -> u64 {
    v.max(0) as u64
}

/// The resource name of huge pages of `page_size` bytes, as kubelet names
/// it (`hugepages-2Mi`, `hugepages-1Gi`).
pub fn hugepages_resource(page_size: u64) -> String {
    format!("hugepages-{}", binary_si(page_size))
}

/// The node's capacity: cpu, memory, pods, ephemeral-storage and one
/// `hugepages-<size>` per page size, in kubelet's canonical forms.
pub fn capacity(facts: &MachineFacts) -> BTreeMap<String, Quantity> {
    let mut out = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        out.insert(k.to_string(), Quantity(v));
    };
    put("cpu", cpu_quantity(facts.cpus.saturating_mul(1000)));
    put("memory", binary_si(facts.memory_bytes));
    put("pods", decimal_si(facts.max_pods));
    put(
        "ephemeral-storage",
        binary_si(facts.ephemeral_storage_bytes),
    );
    for (page, total) in &facts.hugepages {
        out.insert(hugepages_resource(*page), Quantity(binary_si(*total)));
    }
    out
}

/// The node's allocatable: capacity less the reservations, never below
/// zero; memory is further reduced by the huge pages (which MemTotal
/// counts but pods cannot use as ordinary memory), as kubelet does.
pub fn allocatable(facts: &MachineFacts, r: &Reservations) -> BTreeMap<String, Quantity> {
    let reserved = r.kube.plus(r.system);
    let cpu = minus(facts.cpus.saturating_mul(1000), amount(reserved.cpu_millis));
    let memory_reserved = amount(reserved.memory).saturating_add(threshold_amount(
        r.hard_memory_available,
        facts.memory_bytes,
    ));
    let hugepages: u64 = facts
        .hugepages
        .values()
        .fold(0, |sum, v| sum.saturating_add(*v));
    let memory = minus(minus(facts.memory_bytes, memory_reserved), hugepages);
    let storage_reserved = amount(reserved.ephemeral_storage).saturating_add(threshold_amount(
        r.hard_nodefs_available,
        facts.ephemeral_storage_bytes,
    ));
    let storage = minus(facts.ephemeral_storage_bytes, storage_reserved);

    let mut out = capacity(facts);
    let mut put = |k: &str, v: String| {
        out.insert(k.to_string(), Quantity(v));
    };
    put("cpu", cpu_quantity(cpu));
    put("memory", binary_si(memory));
    put("ephemeral-storage", binary_si(storage));
    out
}

// ---------------------------------------------------------------------------
// Conditions.

/// What the node's conditions are made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionInputs {
    /// Whether the runtime answers; the error says why not.
    pub runtime: Result<(), String>,
    /// Whether the runtime's network is ready; the error says why not.
    pub network: Result<(), String>,
    /// Under memory pressure (the eviction manager's condition).
    pub memory_pressure: bool,
    /// Under disk pressure.
    pub disk_pressure: bool,
    /// Under PID pressure.
    pub pid_pressure: bool,
}

impl ConditionInputs {
    /// Inputs with the pressure taken from the eviction manager's set of
    /// conditions that hold ([`crate::eviction::NodeState::conditions`]).
    pub fn new(
        runtime: Result<(), String>,
        network: Result<(), String>,
        pressure: &BTreeSet<crate::eviction::NodeCondition>,
    ) -> ConditionInputs {
        use crate::eviction::NodeCondition as Pressure;
        ConditionInputs {
            runtime,
            network,
            memory_pressure: pressure.contains(&Pressure::MemoryPressure),
            disk_pressure: pressure.contains(&Pressure::DiskPressure),
            pid_pressure: pressure.contains(&Pressure::PidPressure),
        }
    }
}

/// One condition before its times are set.
struct Draft {
    type_: &'static str,
    on: bool,
    reason: &'static str,
    message: String,
}

/// A pressure condition with kubelet's reason and message for each state.
fn pressure(
    type_: &'static str,
    on: bool,
    off: (&'static str, &str),
    on_: (&'static str, &str),
) -> Draft {
    let (reason, message) = if on { on_ } else { off };
    Draft {
        type_,
        on,
        reason,
        message: message.to_string(),
    }
}

/// Ready: true unless the runtime or its network is not; the errors are
/// joined as kubelet's aggregate error prints them (one error alone, or
/// `[a, b]`).
fn ready(inputs: &ConditionInputs) -> Draft {
    let mut errors = Vec::new();
    if let Err(e) = &inputs.runtime {
        errors.push(format!("container runtime is down: {e}"));
    }
    if let Err(e) = &inputs.network {
        errors.push(format!("container runtime network not ready: {e}"));
    }
    if errors.is_empty() {
        return Draft {
            type_: "Ready",
            on: true,
            reason: "KubeletReady",
            message: "kubelet is posting ready status".to_string(),
        };
    }
    let message = if errors.len() == 1 {
        errors.remove(0)
    } else {
        format!("[{}]", errors.join(", "))
    };
    Draft {
        type_: "Ready",
        on: false,
        reason: "KubeletNotReady",
        message,
    }
}

/// The node's conditions in kubelet's order (the pressures, then Ready,
/// which kubelet keeps last). Each is heartbeated at `now`; its transition
/// time is `now` when its status differs from the one in `prev` (or `prev`
/// has none), else carried over from `prev`.
pub fn conditions(
    inputs: &ConditionInputs,
    prev: Option<&[NodeCondition]>,
    now: &Time,
) -> Vec<NodeCondition> {
    let drafts = [
        pressure(
            "MemoryPressure",
            inputs.memory_pressure,
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
        ),
        pressure(
            "DiskPressure",
            inputs.disk_pressure,
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        ),
        pressure(
            "PIDPressure",
            inputs.pid_pressure,
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
        ),
        ready(inputs),
    ];
    drafts
        .into_iter()
        .map(|d| {
            let status = if d.on { "True" } else { "False" };
            let before = prev.unwrap_or_default().iter().find(|c| c.type_ == d.type_);
            let transition = match before {
                Some(b) if b.status == status => b
                    .last_transition_time
                    .clone()
                    .unwrap_or_else(|| now.clone()),
                _ => now.clone(),
            };
            NodeCondition {
                type_: d.type_.to_string(),
                status: status.to_string(),
                reason: Some(d.reason.to_string()),
                message: Some(d.message),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(transition),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Status and registration.

/// Who the node is and how it registers (from the flags and the runtime).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeIdentity {
    /// The node's name.
    pub name: String,
    /// `--node-labels` (see [`parse_node_labels`]); they are applied over
    /// the standard labels.
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints` (see [`parse_taints`]).
    pub taints: Vec<Taint>,
    /// The node's addresses (see [`node_addresses`]).
    pub addresses: Vec<NodeAddress>,
    /// The port the agent's server listens on
    /// (`daemonEndpoints.kubeletEndpoint.Port`).
    pub kubelet_port: u16,
    /// `<runtime name>://<runtime version>` from the CRI Version call.
    pub container_runtime_version: String,
    /// The Kubernetes version the agent is compatible with (`v1.34.0`).
    pub kubelet_version: String,
}

/// The addresses kubelet reports without a cloud provider: the node's IP
/// as `InternalIP`, then its host name as `Hostname`.
pub fn node_addresses(internal_ip: IpAddr, hostname: &str) -> Vec<NodeAddress> {
    vec![
        NodeAddress {
            type_: "InternalIP".to_string(),
            address: internal_ip.to_string(),
        },
        NodeAddress {
            type_: "Hostname".to_string(),
            address: hostname.to_string(),
        },
    ]
}

/// The images for the node's status from `(names, size in bytes)` pairs
/// (names: repo digests then repo tags, as kubelet lists them): the
/// [`MAX_IMAGES`] largest, largest first, each with at most
/// [`MAX_NAMES_PER_IMAGE`] names. Ties keep a fixed order (by names), so
/// that an unchanged list never looks like a change of status.
pub fn node_images(images: impl IntoIterator<Item = (Vec<String>, u64)>) -> Vec<ContainerImage> {
    let mut all: Vec<(Vec<String>, u64)> = images.into_iter().collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all.into_iter()
        .take(MAX_IMAGES)
        .map(|(mut names, size)| {
            names.truncate(MAX_NAMES_PER_IMAGE);
            ContainerImage {
                names: Some(names),
                size_bytes: Some(i64::try_from(size).unwrap_or(i64::MAX)),
            }
        })
        .collect()
}

/// The node's status: addresses, capacity, allocatable, `conditions` (see
/// [`conditions`]), system info, daemon endpoints and `images` (see
/// [`node_images`]).
pub fn node_status(
    identity: &NodeIdentity,
    facts: &MachineFacts,
    reservations: &Reservations,
    conditions: Vec<NodeCondition>,
    images: Vec<ContainerImage>,
) -> NodeStatus {
    NodeStatus {
        addresses: Some(identity.addresses.clone()),
        capacity: Some(capacity(facts)),
        allocatable: Some(allocatable(facts, reservations)),
        conditions: Some(conditions),
        node_info: Some(NodeSystemInfo {
            machine_id: facts.machine_id.clone(),
            system_uuid: facts.system_uuid.clone(),
            boot_id: facts.boot_id.clone(),
            kernel_version: facts.kernel_version.clone(),
            os_image: facts.os_image.clone(),
            container_runtime_version: identity.container_runtime_version.clone(),
            kubelet_version: identity.kubelet_version.clone(),
            // Deprecated: kubelet no longer fills it in.
            kube_proxy_version: String::new(),
            operating_system: facts.operating_system.clone(),
            architecture: facts.architecture.clone(),
            swap: None,
        }),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(identity.kubelet_port),
            }),
        }),
        images: (!images.is_empty()).then_some(images),
        ..Default::default()
    }
}

/// The annotation by which a node leaves attaching and detaching its
/// volumes to the controller manager; kubelet sets it by default.
pub const CONTROLLER_MANAGED_ATTACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The labels every node gets, which `--node-labels` may override.
pub fn standard_labels(name: &str, os: &str, arch: &str) -> BTreeMap<String, String> {
    [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", os),
        ("kubernetes.io/arch", arch),
        ("beta.kubernetes.io/os", os),
        ("beta.kubernetes.io/arch", arch),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The Node to register: its name; the standard labels with the
/// `--node-labels` over them (as kubelet applies them); the
/// controller-managed attach/detach annotation; the taints; and `status`.
pub fn registration(identity: &NodeIdentity, status: NodeStatus) -> Node {
    let (os, arch) = status
        .node_info
        .as_ref()
        .map(|i| (i.operating_system.clone(), i.architecture.clone()))
        .unwrap_or_else(|| {
            (
                "linux".to_string(),
                go_arch(std::env::consts::ARCH).to_string(),
            )
        });
    let mut labels = standard_labels(&identity.name, &os, &arch);
    labels.extend(identity.labels.clone());
    Node {
        metadata: ObjectMeta {
            name: Some(identity.name.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                CONTROLLER_MANAGED_ATTACH.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!identity.taints.is_empty()).then(|| identity.taints.clone()),
            ..Default::default()
        }),
        status: Some(status),
    }
}

/// Whether two statuses differ in anything but the conditions' heartbeat
/// times: the status is sent when it changed, else only at the report
/// frequency. Conditions are compared whatever their order, times to the
/// second (what the API keeps), and quantities by value (`1Gi` = `1024Mi`).
pub fn status_changed(old: &NodeStatus, new: &NodeStatus) -> bool {
    normalized(old) != normalized(new)
}

fn normalized(s: &NodeStatus) -> NodeStatus {
    let mut s = s.clone();
    if let Some(conds) = s.conditions.as_mut() {
        for c in conds.iter_mut() {
            c.last_heartbeat_time = None;
            c.last_transition_time = c.last_transition_time.take().map(to_second);
        }
        conds.sort_by(|a, b| a.type_.cmp(&b.type_));
    }
    for list in [s.capacity.as_mut(), s.allocatable.as_mut()]
        .into_iter()
        .flatten()
    {
        for q in list.values_mut() {
            if let Ok(v) = crate::quantity::parse(&q.0) {
                // Equal values print alike; f64 is exact for node-sized
                // figures.
                q.0 = format!("{v}");
            }
        }
    }
    if s.images.as_ref().is_some_and(Vec::is_empty) {
        s.images = None;
    }
    s
}

fn to_second(t: Time) -> Time {
    match k8s_openapi::jiff::Timestamp::from_second(t.0.as_second()) {
        Ok(ts) => Time(ts),
        Err(_) => t,
    }
}

// ---------------------------------------------------------------------------
// --node-labels and --register-with-taints.

/// Label keys in the Kubernetes namespaces that a kubelet may set on its
/// own Node (kubelet's list; the NodeRestriction admission plugin refuses
/// the others).
const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
];

/// Label namespaces (and their subdomains) a kubelet may set freely.
const KUBELET_LABEL_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The prefix of a label key (`example.com` of `example.com/x`), if any.
fn label_namespace(key: &str) -> Option<&str> {
    key.split_once('/').map(|(ns, _)| ns)
}

fn in_domain(ns: &str, domain: &str) -> bool {
    ns == domain || ns.strip_suffix(domain).is_some_and(|r| r.ends_with('.'))
}

/// Whether `key` is in the `kubernetes.io` or `k8s.io` namespaces (or a
/// subdomain of them), which only Kubernetes itself may define.
fn is_kubernetes_label(key: &str) -> bool {
    label_namespace(key).is_some_and(|ns| in_domain(ns, "kubernetes.io") || in_domain(ns, "k8s.io"))
}

/// Whether a kubelet may set `key` on its own Node.
pub fn is_kubelet_label(key: &str) -> bool {
    KUBELET_LABELS.contains(&key)
        || label_namespace(key)
            .is_some_and(|ns| KUBELET_LABEL_NAMESPACES.iter().any(|d| in_domain(ns, d)))
}

/// One DNS label of a subdomain: lower-case alphanumerics and `-`,
/// starting and ending alphanumeric.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// A name part or label value: at most 63 of `[A-Za-z0-9._-]`, starting
/// and ending alphanumeric (emptiness is checked by the callers).
fn name_part_error(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.len() > 63 {
        return Some(format!("{s:?} is longer than 63 characters"));
    }
    if !b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
    {
        return Some(format!(
            "{s:?} may only hold letters, digits, '-', '_' and '.'"
        ));
    }
    if !b.first().is_some_and(u8::is_ascii_alphanumeric)
        || !b.last().is_some_and(u8::is_ascii_alphanumeric)
    {
        return Some(format!("{s:?} must start and end with a letter or digit"));
    }
    None
}

/// Checks a label (or taint) key: a qualified name, `[prefix/]name`, the
/// prefix a DNS subdomain of at most 253 characters.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Err(format!("key {key:?}: the prefix before '/' is empty"));
        }
        if p.len() > 253 || !p.split('.').all(is_dns_label) {
            return Err(format!(
                "key {key:?}: the prefix {p:?} must be a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"
            ));
        }
    }
    if name.is_empty() {
        return Err(format!("key {key:?}: the name is empty"));
    }
    if name.contains('/') {
        return Err(format!("key {key:?}: at most one '/' is allowed"));
    }
    match name_part_error(name) {
        Some(e) => Err(format!("key {key:?}: the name {e}")),
        None => Ok(()),
    }
}

/// Checks a label (or taint) value: empty, or a name part.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    match name_part_error(value) {
        Some(e) if !value.is_empty() => Err(format!("value {e}")),
        _ => Ok(()),
    }
}

/// Parses `--node-labels`: `key=value,key2=value2`. Each key and value is
/// checked, a key given twice is refused, and so are keys in the
/// `kubernetes.io`/`k8s.io` namespaces that a kubelet may not set (see
/// [`is_kubelet_label`]). Errors name the entry at fault.
pub fn parse_node_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (k, v) = entry
            .split_once('=')
            .ok_or_else(|| format!("--node-labels {entry:?}: expected key=value"))?;
        let (k, v) = (k.trim(), v.trim());
        validate_label_key(k).map_err(|e| format!("--node-labels {entry:?}: {e}"))?;
        validate_label_value(v).map_err(|e| format!("--node-labels {entry:?}: {e}"))?;
        if is_kubernetes_label(k) && !is_kubelet_label(k) {
            return Err(format!(
                "--node-labels {entry:?}: a node may not set label {k:?} of the 'kubernetes.io' or 'k8s.io' namespaces; allowed are the namespaces {} (and their subdomains) and the labels {}",
                KUBELET_LABEL_NAMESPACES.join(", "),
                KUBELET_LABELS.join(", ")
            ));
        }
        if out.insert(k.to_string(), v.to_string()).is_some() {
            return Err(format!(
                "--node-labels {entry:?}: label {k:?} is given twice"
            ));
        }
    }
    Ok(out)
}

/// The taint effects.
const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Parses `--register-with-taints`: comma-separated `key=value:Effect` or
/// `key:Effect`, the effect one of `NoSchedule`, `PreferNoSchedule`,
/// `NoExecute`. Keys and values are checked as label ones, and a key may
/// appear once per effect. Errors name the entry at fault.
pub fn parse_taints(s: &str) -> Result<Vec<Taint>, String> {
    let mut out: Vec<Taint> = Vec::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: String| format!("--register-with-taints {entry:?}: {why}");
        let (kv, effect) = entry
            .rsplit_once(':')
            .ok_or_else(|| bad("expected key=value:Effect or key:Effect".to_string()))?;
        let effect = effect.trim();
        if !EFFECTS.contains(&effect) {
            return Err(bad(format!(
                "effect {effect:?} must be one of {}",
                EFFECTS.join(", ")
            )));
        }
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (kv.trim(), None),
        };
        validate_label_key(key).map_err(bad)?;
        if let Some(v) = value {
            validate_label_value(v).map_err(bad)?;
        }
        if out.iter().any(|t| t.key == key && t.effect == effect) {
            return Err(bad(format!("taint {key}:{effect} is given twice")));
        }
        out.push(Taint {
            key: key.to_string(),
            value: value.filter(|v| !v.is_empty()).map(str::to_string),
            effect: effect.to_string(),
            time_added: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    // --- machine facts -----------------------------------------------------

    const MEMINFO: &str = "MemTotal:       16384256 kB\n\
                           MemFree:         1234567 kB\n\
                           MemAvailable:    8765432 kB\n\
                           HugePages_Total:     512\n";

    #[test]
    fn meminfo_should_give_memtotal_in_bytes() {
        assert_eq!(parse_meminfo_total(MEMINFO), Some(16384256 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo_total("MemTotal: lots kB\n"), None);
        assert_eq!(parse_meminfo_total(""), None);
    }

    #[test]
    fn cpu_lists_should_count_ranges_and_singles() {
        assert_eq!(parse_cpu_list("0-3\n"), Some(4));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(7));
        for bad in ["", "\n", "3-1", "a", "0-", "0,,1"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hugepage_directories_should_give_the_page_size() {
        assert_eq!(parse_hugepage_dir("hugepages-2048kB"), Some(2 << 20));
        assert_eq!(parse_hugepage_dir("hugepages-1048576kB"), Some(1 << 30));
        assert_eq!(parse_hugepage_dir("hugepages-64kB"), Some(64 << 10));
        assert_eq!(parse_hugepage_dir("hugepages-2048"), None);
        assert_eq!(parse_hugepage_dir("other"), None);
    }

    #[test]
    fn os_release_should_give_the_pretty_name_unquoted() {
        let debian = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nID=debian\n";
        assert_eq!(
            parse_os_release_pretty_name(debian).as_deref(),
            Some("Debian GNU/Linux 12 (bookworm)")
        );
        assert_eq!(
            parse_os_release_pretty_name("NAME=x\nPRETTY_NAME='Alpine Linux v3.20'\n").as_deref(),
            Some("Alpine Linux v3.20")
        );
        assert_eq!(
            parse_os_release_pretty_name("PRETTY_NAME=Plain\n").as_deref(),
            Some("Plain")
        );
        assert_eq!(
            parse_os_release_pretty_name("PRETTY_NAME=\"Say \\\"hi\\\"\"\n").as_deref(),
            Some("Say \"hi\"")
        );
        assert_eq!(parse_os_release_pretty_name("NAME=x\n"), None);
    }

    #[test]
    fn architectures_should_be_named_as_go_names_them() {
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_arch("s390x"), "s390x");
        assert_eq!(go_arch("riscv64"), "riscv64");
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn facts_should_be_read_from_a_host_tree() {
        let host = tempfile::tempdir().unwrap();
        let h = host.path();
        write(h, "proc/meminfo", MEMINFO);
        write(h, "sys/devices/system/cpu/online", "0-3,6\n");
        write(
            h,
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "512\n",
        );
        write(
            h,
            "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            "0\n",
        );
        write(h, "proc/sys/kernel/osrelease", "6.1.0-18-amd64\n");
        write(h, "etc/os-release", "PRETTY_NAME=\"Debian GNU/Linux 12\"\n");
        write(h, "etc/machine-id", "0123456789abcdef0123456789abcdef\n");
        write(h, "proc/sys/kernel/random/boot_id", "b00t-1d\n");
        // No DMI: the system UUID stays empty.
        let f = MachineFacts::read_under(h, h);
        assert_eq!(f.cpus, 5);
        assert_eq!(f.memory_bytes, 16384256 * 1024);
        assert_eq!(
            f.hugepages,
            BTreeMap::from([(2 << 20, 1 << 30), (1 << 30, 0)])
        );
        assert!(f.ephemeral_storage_bytes > 0);
        assert_eq!(f.max_pods, 110);
        assert_eq!(f.kernel_version, "6.1.0-18-amd64");
        assert_eq!(f.os_image, "Debian GNU/Linux 12");
        assert_eq!(f.machine_id, "0123456789abcdef0123456789abcdef");
        assert_eq!(f.boot_id, "b00t-1d");
        assert_eq!(f.system_uuid, "");
        assert_eq!(f.operating_system, "linux");
        assert_eq!(f.architecture, go_arch(std::env::consts::ARCH));
    }

    #[test]
    fn facts_that_cannot_be_read_should_be_left_empty() {
        let host = tempfile::tempdir().unwrap();
        let h = host.path();
        let f = MachineFacts::read_under(h, &h.join("missing"));
        assert!(f.cpus > 0, "falls back to the CPUs the process may use");
        assert_eq!(f.memory_bytes, 0);
        assert!(f.hugepages.is_empty());
        assert_eq!(f.ephemeral_storage_bytes, 0);
        assert_eq!(f.os_image, "");
        assert_eq!(f.machine_id, "");
        // An os-release without PRETTY_NAME names the system "Linux".
        write(h, "usr/lib/os-release", "ID=x\n");
        assert_eq!(MachineFacts::read_under(h, h).os_image, "Linux");
    }

    // --- quantities, capacity, allocatable ---------------------------------

    #[test]
    fn quantities_should_take_kubernetes_canonical_forms() {
        assert_eq!(decimal_si(0), "0");
        assert_eq!(decimal_si(110), "110");
        assert_eq!(decimal_si(2000), "2k");
        assert_eq!(binary_si(0), "0");
        assert_eq!(binary_si(1000), "1k");
        assert_eq!(binary_si(1023), "1023");
        assert_eq!(binary_si(16384256 * 1024), "16384256Ki");
        assert_eq!(binary_si(2 << 20), "2Mi");
        assert_eq!(binary_si(1 << 30), "1Gi");
        // Not a multiple of 1024: a plain number.
        assert_eq!(binary_si(96636764161), "96636764161");
        assert_eq!(cpu_quantity(4000), "4");
        assert_eq!(cpu_quantity(3500), "3500m");
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(hugepages_resource(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepages_resource(1 << 30), "hugepages-1Gi");
        assert_eq!(hugepages_resource(64 << 10), "hugepages-64Ki");
    }

    fn facts() -> MachineFacts {
        MachineFacts {
            cpus: 4,
            memory_bytes: 16384256 * 1024,
            hugepages: BTreeMap::from([(2 << 20, 1 << 30), (1 << 30, 0)]),
            ephemeral_storage_bytes: 100 << 30,
            max_pods: DEFAULT_MAX_PODS,
            kernel_version: "6.1.0".into(),
            os_image: "Debian GNU/Linux 12".into(),
            machine_id: "mid".into(),
            system_uuid: "uuid".into(),
            boot_id: "boot".into(),
            architecture: "amd64".into(),
            operating_system: "linux".into(),
        }
    }

    #[test]
    fn capacity_should_list_every_resource_as_kubelet_does() {
        let c = capacity(&facts());
        let want: BTreeMap<String, Quantity> = [
            ("cpu", "4"),
            ("memory", "16384256Ki"),
            ("pods", "110"),
            ("ephemeral-storage", "100Gi"),
            ("hugepages-2Mi", "1Gi"),
            ("hugepages-1Gi", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), q(v)))
        .collect();
        assert_eq!(c, want);
    }

    #[test]
    fn allocatable_should_subtract_reservations_thresholds_and_hugepages() {
        let r = Reservations {
            kube: "cpu=300m,memory=512Mi,ephemeral-storage=1Gi"
                .parse()
                .unwrap(),
            system: "cpu=200m,memory=512Mi,ephemeral-storage=1Gi"
                .parse()
                .unwrap(),
            hard_memory_available: Some(ThresholdValue::Quantity(100 << 20)),
            hard_nodefs_available: Some(ThresholdValue::Percentage(0.10)),
        };
        let a = allocatable(&facts(), &r);
        assert_eq!(a["cpu"], q("3500m"));
        // 16384256Ki − 1Gi reserved − 100Mi threshold − 1Gi of huge pages.
        let memory = 16384256u64 * 1024 - (1 << 30) - (100 << 20) - (1 << 30);
        assert_eq!(a["memory"], q(&format!("{}Ki", memory / 1024)));
        assert_eq!(a["memory"], q("14184704Ki"));
        // 100Gi − 2Gi reserved − 10% of 100Gi.
        assert_eq!(a["ephemeral-storage"], q("88Gi"));
        assert_eq!(a["pods"], q("110"));
        assert_eq!(a["hugepages-2Mi"], q("1Gi"));
        assert_eq!(a["hugepages-1Gi"], q("0"));
    }

    #[test]
    fn percentage_thresholds_should_be_truncated_as_kubelet_does() {
        let f = MachineFacts {
            ephemeral_storage_bytes: 12345,
            ..facts()
        };
        let r = Reservations {
            hard_nodefs_available: Some(ThresholdValue::Percentage(0.10)),
            ..Default::default()
        };
        // 10% of 12345 is 1234.5; kubelet reserves 1234.
        assert_eq!(allocatable(&f, &r)["ephemeral-storage"], q("11111"));
    }

    #[test]
    fn allocatable_should_never_go_below_zero() {
        let r = Reservations {
            kube: "cpu=8,memory=64Gi,ephemeral-storage=1Ti".parse().unwrap(),
            ..Default::default()
        };
        let a = allocatable(&facts(), &r);
        assert_eq!(a["cpu"], q("0"));
        assert_eq!(a["memory"], q("0"));
        assert_eq!(a["ephemeral-storage"], q("0"));
        // Huge pages larger than what is left of memory: still zero.
        let f = MachineFacts {
            memory_bytes: 1 << 30,
            hugepages: BTreeMap::from([(2 << 20, 2 << 30)]),
            ..facts()
        };
        assert_eq!(allocatable(&f, &Reservations::default())["memory"], q("0"));
    }

    #[test]
    fn reservations_should_come_from_the_eviction_settings() {
        let r = Reservations::from_settings(&EvictionSettings::default());
        assert_eq!(r.kube, Reserved::default());
        assert_eq!(
            r.hard_memory_available,
            Some(ThresholdValue::Quantity(100 << 20))
        );
        assert_eq!(
            r.hard_nodefs_available,
            Some(ThresholdValue::Percentage(0.10))
        );
        let s = EvictionSettings {
            hard: "memory.available<0%,imagefs.available<20%".parse().unwrap(),
            kube_reserved: "cpu=100m".parse().unwrap(),
            system_reserved: "memory=1Gi".parse().unwrap(),
            ..Default::default()
        };
        let r = Reservations::from_settings(&s);
        // 0% switches the threshold off; imagefs does not count.
        assert_eq!(r.hard_memory_available, None);
        assert_eq!(r.hard_nodefs_available, None);
        assert_eq!(r.kube.cpu_millis, 100);
        assert_eq!(r.system.memory, 1 << 30);
    }

    // --- conditions --------------------------------------------------------

    fn healthy() -> ConditionInputs {
        ConditionInputs::new(Ok(()), Ok(()), &BTreeSet::new())
    }

    fn find<'a>(conds: &'a [NodeCondition], t: &str) -> &'a NodeCondition {
        conds.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_healthy_node_should_have_kubelets_conditions() {
        let now = at(1000);
        let c = conditions(&healthy(), None, &now);
        let got: Vec<(&str, &str, &str, &str)> = c
            .iter()
            .map(|c| {
                (
                    c.type_.as_str(),
                    c.status.as_str(),
                    c.reason.as_deref().unwrap(),
                    c.message.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available"
                ),
                (
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure"
                ),
                (
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available"
                ),
                (
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status"
                ),
            ]
        );
        for c in &c {
            assert_eq!(c.last_heartbeat_time, Some(now.clone()));
            assert_eq!(c.last_transition_time, Some(now.clone()));
        }
    }

    #[test]
    fn pressure_should_come_from_the_eviction_conditions() {
        use crate::eviction::NodeCondition as P;
        let inputs = ConditionInputs::new(
            Ok(()),
            Ok(()),
            &BTreeSet::from([P::MemoryPressure, P::DiskPressure, P::PidPressure]),
        );
        let c = conditions(&inputs, None, &at(1));
        let reason = |t| {
            let c = find(&c, t);
            (
                c.status.as_str(),
                c.reason.clone().unwrap(),
                c.message.clone().unwrap(),
            )
        };
        assert_eq!(
            reason("MemoryPressure"),
            (
                "True",
                "KubeletHasInsufficientMemory".into(),
                "kubelet has insufficient memory available".into()
            )
        );
        assert_eq!(
            reason("DiskPressure"),
            (
                "True",
                "KubeletHasDiskPressure".into(),
                "kubelet has disk pressure".into()
            )
        );
        assert_eq!(
            reason("PIDPressure"),
            (
                "True",
                "KubeletHasInsufficientPID".into(),
                "kubelet has insufficient PID available".into()
            )
        );
        // Pressure alone does not make the node not ready.
        assert_eq!(find(&c, "Ready").status, "True");
    }

    #[test]
    fn ready_should_say_what_is_wrong_with_the_runtime() {
        let ready = |runtime: Result<(), String>, network: Result<(), String>| {
            let inputs = ConditionInputs {
                runtime,
                network,
                ..healthy()
            };
            let c = conditions(&inputs, None, &at(1));
            let r = find(&c, "Ready").clone();
            assert_eq!(r.status, "False");
            assert_eq!(r.reason.as_deref(), Some("KubeletNotReady"));
            r.message.unwrap()
        };
        assert_eq!(
            ready(Err("connection refused".into()), Ok(())),
            "container runtime is down: connection refused"
        );
        assert_eq!(
            ready(Ok(()), Err("NetworkReady=false reason:NoCNI".into())),
            "container runtime network not ready: NetworkReady=false reason:NoCNI"
        );
        assert_eq!(
            ready(Err("timeout".into()), Err("no CNI".into())),
            "[container runtime is down: timeout, container runtime network not ready: no CNI]"
        );
    }

    #[test]
    fn transition_times_should_be_carried_while_the_status_holds() {
        let first = conditions(&healthy(), None, &at(100));
        // The same statuses later: heartbeats move, transitions stay.
        let second = conditions(&healthy(), Some(&first), &at(200));
        for c in &second {
            assert_eq!(c.last_heartbeat_time, Some(at(200)), "{}", c.type_);
            assert_eq!(c.last_transition_time, Some(at(100)), "{}", c.type_);
        }
        // Disk pressure and a runtime down: those two transition now.
        let bad = ConditionInputs {
            runtime: Err("down".into()),
            disk_pressure: true,
            ..healthy()
        };
        let third = conditions(&bad, Some(&second), &at(300));
        assert_eq!(
            find(&third, "DiskPressure").last_transition_time,
            Some(at(300))
        );
        assert_eq!(find(&third, "Ready").last_transition_time, Some(at(300)));
        assert_eq!(
            find(&third, "MemoryPressure").last_transition_time,
            Some(at(100))
        );
        // A new message with the same status is no transition.
        let worse = ConditionInputs {
            runtime: Err("still down".into()),
            ..bad
        };
        let fourth = conditions(&worse, Some(&third), &at(400));
        let ready = find(&fourth, "Ready");
        assert_eq!(ready.last_transition_time, Some(at(300)));
        assert_eq!(
            ready.message.as_deref(),
            Some("container runtime is down: still down")
        );
        // A previous condition without a transition time gets `now`.
        let mut bare = first.clone();
        for c in &mut bare {
            c.last_transition_time = None;
        }
        let fifth = conditions(&healthy(), Some(&bare), &at(500));
        assert!(fifth
            .iter()
            .all(|c| c.last_transition_time == Some(at(500))));
    }

    // --- status ------------------------------------------------------------

    fn identity() -> NodeIdentity {
        NodeIdentity {
            name: "worker-1".into(),
            labels: BTreeMap::from([("node.kubernetes.io/pool".into(), "a".into())]),
            taints: parse_taints("dedicated=gpu:NoSchedule").unwrap(),
            addresses: node_addresses("10.0.0.7".parse().unwrap(), "worker-1"),
            kubelet_port: 10250,
            container_runtime_version: "containerd://2.1.4".into(),
            kubelet_version: "v1.34.0".into(),
        }
    }

    fn status_at(second: i64, prev: Option<&NodeStatus>) -> NodeStatus {
        let prev = prev.and_then(|p| p.conditions.as_deref());
        node_status(
            &identity(),
            &facts(),
            &Reservations::from_settings(&EvictionSettings::default()),
            conditions(&healthy(), prev, &at(second)),
            node_images([(vec!["nginx:1".to_string()], 1000)]),
        )
    }

    #[test]
    fn the_status_should_carry_system_info_and_endpoints() {
        let s = status_at(1, None);
        let info = s.node_info.unwrap();
        assert_eq!(info.machine_id, "mid");
        assert_eq!(info.system_uuid, "uuid");
        assert_eq!(info.boot_id, "boot");
        assert_eq!(info.kernel_version, "6.1.0");
        assert_eq!(info.os_image, "Debian GNU/Linux 12");
        assert_eq!(info.container_runtime_version, "containerd://2.1.4");
        assert_eq!(info.kubelet_version, "v1.34.0");
        assert_eq!(info.kube_proxy_version, "");
        assert_eq!(info.operating_system, "linux");
        assert_eq!(info.architecture, "amd64");
        assert_eq!(
            s.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
            10250
        );
        let addrs = s.addresses.unwrap();
        assert_eq!(
            addrs
                .iter()
                .map(|a| (a.type_.as_str(), a.address.as_str()))
                .collect::<Vec<_>>(),
            [("InternalIP", "10.0.0.7"), ("Hostname", "worker-1")]
        );
        assert_eq!(s.capacity.unwrap()["cpu"], q("4"));
        assert_eq!(s.allocatable.unwrap()["cpu"], q("4"));
        assert_eq!(s.conditions.unwrap().len(), 4);
        assert_eq!(s.images.unwrap().len(), 1);
        let no_images = node_status(
            &identity(),
            &facts(),
            &Reservations::default(),
            Vec::new(),
            Vec::new(),
        );
        assert_eq!(no_images.images, None);
    }

    #[test]
    fn status_changes_should_ignore_heartbeats_only() {
        let old = status_at(100, None);
        let same = status_at(200, Some(&old));
        assert!(!status_changed(&old, &same));
        // Another order of the conditions, quantities spelt otherwise,
        // times below the second: no change either.
        let mut respelt = same.clone();
        respelt.conditions.as_mut().unwrap().reverse();
        respelt
            .capacity
            .as_mut()
            .unwrap()
            .insert("hugepages-2Mi".into(), q("1024Mi"));
        for c in respelt.conditions.as_mut().unwrap() {
            c.last_transition_time = Some(Time(Timestamp::new(100, 500_000_000).unwrap()));
        }
        assert!(!status_changed(&old, &respelt));
        // A condition that turned.
        let pressed = ConditionInputs {
            memory_pressure: true,
            ..healthy()
        };
        let mut turned = same.clone();
        turned.conditions = Some(conditions(&pressed, old.conditions.as_deref(), &at(200)));
        assert!(status_changed(&old, &turned));
        // Other allocatable, another boot, other images.
        let mut less = same.clone();
        less.allocatable
            .as_mut()
            .unwrap()
            .insert("cpu".into(), q("3500m"));
        assert!(status_changed(&old, &less));
        let mut rebooted = same.clone();
        rebooted.node_info.as_mut().unwrap().boot_id = "other".into();
        assert!(status_changed(&old, &rebooted));
        let mut pulled = same.clone();
        pulled.images = Some(node_images([(vec!["redis:7".to_string()], 5)]));
        assert!(status_changed(&old, &pulled));
    }

    // --- images ------------------------------------------------------------

    #[test]
    fn images_should_be_the_fifty_largest_first() {
        let list = (0..60u64).map(|i| (vec![format!("img-{i}")], i * 10));
        let images = node_images(list);
        assert_eq!(images.len(), MAX_IMAGES);
        assert_eq!(images[0].names, Some(vec!["img-59".to_string()]));
        assert_eq!(images[0].size_bytes, Some(590));
        assert_eq!(images[49].names, Some(vec!["img-10".to_string()]));
        assert!(images
            .windows(2)
            .all(|w| w[0].size_bytes >= w[1].size_bytes));
    }

    #[test]
    fn images_should_list_at_most_five_names_in_a_fixed_order() {
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let images = node_images([
            (names.clone(), 7),
            (vec!["b".into()], 7),
            (vec!["a".into()], 7),
        ]);
        // Equal sizes are ordered by names.
        assert_eq!(images[0].names, Some(vec!["a".to_string()]));
        assert_eq!(images[1].names, Some(vec!["b".to_string()]));
        assert_eq!(
            images[2].names.as_ref().unwrap(),
            &names[..MAX_NAMES_PER_IMAGE]
        );
        let again = node_images([(vec!["a".into()], 7), (vec!["b".into()], 7), (names, 7)]);
        assert_eq!(images, again);
        // A size beyond i64 is capped rather than wrapped.
        let huge = node_images([(vec!["x".into()], u64::MAX)]);
        assert_eq!(huge[0].size_bytes, Some(i64::MAX));
    }

    // --- registration ------------------------------------------------------

    #[test]
    fn registration_should_label_taint_and_name_the_node() {
        let mut id = identity();
        // A node label overrides a standard one, as in kubelet.
        id.labels
            .insert("kubernetes.io/hostname".into(), "worker-one".into());
        let node = registration(&id, status_at(1, None));
        assert_eq!(node.metadata.name.as_deref(), Some("worker-1"));
        let labels = node.metadata.labels.unwrap();
        let want: BTreeMap<String, String> = [
            ("kubernetes.io/hostname", "worker-one"),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", "amd64"),
            ("node.kubernetes.io/pool", "a"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels, want);
        assert_eq!(
            node.metadata.annotations.unwrap()[CONTROLLER_MANAGED_ATTACH],
            "true"
        );
        let taints = node.spec.unwrap().taints.unwrap();
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0].key, "dedicated");
        assert!(node.status.is_some());
        // Without taints the spec lists none.
        id.taints.clear();
        let node = registration(&id, status_at(1, None));
        assert_eq!(node.spec.unwrap().taints, None);
    }

    // --- --node-labels -----------------------------------------------------

    #[test]
    fn node_labels_should_parse_valid_pairs() {
        let l = parse_node_labels(
            " env=prod,example.com/team=a-b_c.d,node.kubernetes.io/pool=x,empty=,\
             sub.kubelet.kubernetes.io/k=v,\
             topology.kubernetes.io/zone=z1",
        )
        .unwrap();
        assert_eq!(l["env"], "prod");
        assert_eq!(l["example.com/team"], "a-b_c.d");
        assert_eq!(l["empty"], "");
        assert_eq!(l.len(), 6);
        assert!(parse_node_labels("").unwrap().is_empty());
    }

    #[test]
    fn node_labels_should_be_refused_naming_the_entry() {
        let long = "x".repeat(64);
        let cases = [
            ("env", "\"env\": expected key=value"),
            ("=v", "the name is empty"),
            ("/a=v", "prefix before '/' is empty"),
            ("a/b/c=v", "at most one '/'"),
            ("Example.com/a=v", "DNS subdomain"),
            ("ex_ample.com/a=v", "DNS subdomain"),
            ("-a=v", "start and end"),
            ("a b=v", "may only hold"),
            (&format!("{long}=v"), "longer than 63"),
            (&format!("k={long}"), "value \"xxx"),
            ("k=-v", "start and end"),
            ("k=a/b", "may only hold"),
            ("a=1,a=2", "given twice"),
            ("kubernetes.io/role=master", "may not set label"),
            // The well-known role label is the cluster's to set, not the node's.
            ("node-role.kubernetes.io/worker=", "may not set label"),
            ("node-restriction.kubernetes.io/x=y", "may not set label"),
            ("x.k8s.io/y=z", "may not set label"),
            ("kubernetes.io/instance-type=big", "may not set label"),
        ];
        for (input, needle) in cases {
            let e = parse_node_labels(input).unwrap_err();
            assert!(e.contains(needle), "{input}: {e}");
            assert!(e.starts_with("--node-labels \""), "{input}: {e}");
        }
    }

    #[test]
    fn kubelet_labels_should_be_kubelets_allowed_set() {
        for ok in [
            "kubernetes.io/hostname",
            "beta.kubernetes.io/instance-type",
            "node.kubernetes.io/instance-type",
            "failure-domain.beta.kubernetes.io/zone",
            "kubelet.kubernetes.io/anything",
            "a.b.node.kubernetes.io/anything",
        ] {
            assert!(is_kubelet_label(ok), "{ok}");
        }
        for no in [
            "kubernetes.io/role",
            "beta.kubernetes.io/fluentd-ds-ready",
            "xnode.kubernetes.io/a",
            "node.kubernetes.io",
        ] {
            assert!(!is_kubelet_label(no), "{no}");
        }
        // Outside the Kubernetes namespaces anything goes.
        assert!(!is_kubernetes_label("notkubernetes.io/a"));
        assert!(!is_kubernetes_label("kubernetes.io"));
        assert!(is_kubernetes_label("k8s.io/a"));
    }

    // --- --register-with-taints --------------------------------------------

    #[test]
    fn taints_should_parse_with_and_without_values() {
        let t = parse_taints(
            "dedicated=gpu:NoSchedule, example.com/spot:PreferNoSchedule,gone=:NoExecute",
        )
        .unwrap();
        let got: Vec<(&str, Option<&str>, &str)> = t
            .iter()
            .map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("dedicated", Some("gpu"), "NoSchedule"),
                ("example.com/spot", None, "PreferNoSchedule"),
                ("gone", None, "NoExecute"),
            ]
        );
        // One key may carry several effects.
        assert_eq!(parse_taints("k:NoSchedule,k:NoExecute").unwrap().len(), 2);
        assert!(parse_taints("").unwrap().is_empty());
    }

    #[test]
    fn taints_should_be_refused_naming_the_entry() {
        for (input, needle) in [
            ("dedicated=gpu", "expected key=value:Effect"),
            ("k=v:NoScheduleX", "must be one of NoSchedule"),
            ("k=v:", "must be one of"),
            (":NoSchedule", "the name is empty"),
            ("bad key=v:NoSchedule", "may only hold"),
            ("k=-v:NoSchedule", "start and end"),
            ("k=a:b:NoSchedule", "may only hold"),
            ("k=1:NoSchedule,k=2:NoSchedule", "given twice"),
        ] {
            let e = parse_taints(input).unwrap_err();
            assert!(e.contains(needle), "{input}: {e}");
            assert!(e.starts_with("--register-with-taints \""), "{input}: {e}");
        }
    }
}
