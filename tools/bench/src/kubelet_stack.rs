//! The node stacks of the kubelet figures (P23-P27) and of the cluster
//! figures (P33-P35): started through the test kit (`petrel node`, or
//! kubelet on `petrel runtime`, containerd 2.x or 1.7, each on its own
//! network and cgroups; standalone, or joined to a cluster with a node's
//! credentials), their processes (kubelet, the runtime, its shims), and
//! what kubelet says at start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use petrel_testkit::cluster::NodeCredentials;
use petrel_testkit::containerd::Containerd;
use petrel_testkit::kubelet::{Kubelet, KubeletOptions};
use petrel_testkit::network::PodNetwork;
use petrel_testkit::petrel::{NodeAgent, PetrelOptions, PetrelRuntime};

use crate::http;
use crate::kubelet::{setup_name, Pleg, Setup, Shared};
use crate::procfs;
use crate::sweep::Work;
use crate::Args;

/// The agent's hard eviction threshold in node mode: the bench measures
/// pods, not this machine's nearly full disk (kubelet's kit config does
/// the same).
const NODE_EVICTION_HARD: &str = "memory.available<100Mi";

/// The runtime under a kubelet.
pub enum Runtime {
    /// `petrel runtime` or `petrel node`.
    Petrel(PetrelRuntime),
    /// containerd 2.x or 1.7.
    Containerd(Containerd),
}

/// A node stack, torn down in field order: kubelet (which removes its pods
/// through CRI), then the runtime, then the network.
pub struct Stack {
    /// kubelet, or None for `petrel node`.
    pub kubelet: Option<Kubelet>,
    /// The runtime process (`petrel node` is one).
    pub runtime: Runtime,
    /// The agent's mode.
    pub pleg: Pleg,
    _net: PodNetwork,
}

/// The processes of a stack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Procs {
    /// kubelet.
    pub kubelet: Option<u32>,
    /// The runtime process.
    pub runtime: u32,
    /// Its shims.
    pub shims: Vec<u32>,
}

impl Procs {
    /// Every pid: kubelet, the runtime, the shims.
    pub fn all(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.kubelet.into_iter().collect();
        v.push(self.runtime);
        v.extend_from_slice(&self.shims);
        v
    }
}

impl Stack {
    /// Where static pod manifests go.
    pub fn manifest_dir(&self) -> PathBuf {
        match (&self.kubelet, &self.runtime) {
            (Some(k), _) => k.manifest_dir(),
            (None, Runtime::Petrel(n)) => n.manifest_dir(),
            (None, Runtime::Containerd(_)) => PathBuf::new(),
        }
    }

    /// Where the node keeps its pods' directories (their volumes):
    /// kubelet's `<root-dir>/pods`, the agent's `<runtime root>/agent/pods`.
    pub fn pods_dir(&self) -> PathBuf {
        match (&self.kubelet, &self.runtime) {
            (Some(k), _) => k.root_dir().join("pods"),
            (None, Runtime::Petrel(n)) => n.root.join("agent").join("pods"),
            (None, Runtime::Containerd(_)) => PathBuf::new(),
        }
    }

    /// The name a pod of manifest `name` has at `/pods`: kubelet suffixes
    /// static pods with the node's name.
    pub fn pod_name(&self, name: &str) -> String {
        match &self.kubelet {
            Some(k) => format!("{name}-{}", k.node_name()),
            None => name.to_string(),
        }
    }

    /// Where `/pods` is served: kubelet's read-only port, or the agent's
    /// unix socket.
    pub fn pods_endpoint(&self) -> Result<http::Endpoint> {
        match (&self.kubelet, &self.runtime) {
            (Some(k), _) => {
                let port = k
                    .ports()
                    .read_only
                    .ok_or_else(|| anyhow!("kubelet has no read-only port"))?;
                Ok(http::Endpoint::Tcp(SocketAddr::from((k.address(), port))))
            }
            (None, Runtime::Petrel(n)) => Ok(http::Endpoint::Unix(n.agent_socket())),
            (None, Runtime::Containerd(_)) => bail!("containerd without kubelet"),
        }
    }

    /// The runtime's CRI endpoint.
    pub fn cri_endpoint(&self) -> String {
        match &self.runtime {
            Runtime::Petrel(p) => p.endpoint(),
            Runtime::Containerd(c) => c.endpoint(),
        }
    }

    /// The stack's processes now.
    pub fn procs(&self) -> Result<Procs> {
        let kubelet = match &self.kubelet {
            Some(k) => Some(k.pid().ok_or_else(|| anyhow!("kubelet is not running"))?),
            None => None,
        };
        let (runtime, shims) = match &self.runtime {
            Runtime::Petrel(p) => (
                p.pid()
                    .ok_or_else(|| anyhow!("the Petrel process is not running"))?,
                procfs::shims_of(&p.state_dir())?,
            ),
            Runtime::Containerd(c) => (
                c.pid()
                    .ok_or_else(|| anyhow!("containerd is not running"))?,
                containerd_shims(&c.socket),
            ),
        };
        Ok(Procs {
            kubelet,
            runtime,
            shims,
        })
    }

    /// The last lines of the agent's log (kubelet's or the node's).
    pub fn log_tail(&self) -> String {
        let path = match (&self.kubelet, &self.runtime) {
            (Some(k), _) => k.log_path(),
            (None, Runtime::Petrel(n)) => n.log_path(),
            (None, Runtime::Containerd(c)) => c.log_path(),
        };
        petrel_testkit::process::tail(&path, 20)
    }
}

/// containerd's shims: processes whose command line has `-address <socket>`.
pub fn containerd_shims(socket: &Path) -> Vec<u32> {
    let want = socket.display().to_string();
    let mut pids: Vec<u32> = all_pids()
        .into_iter()
        .filter(|p| {
            procfs::cmdline(*p)
                .windows(2)
                .any(|w| w[0] == "-address" && w[1] == want)
        })
        .collect();
    pids.sort_unstable();
    pids
}

pub fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|it| {
            it.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Children of `parents` whose command name is `comm`.
pub fn children_named(parents: &[u32], comm: &str) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|p| {
            procfs::ppid(*p).is_some_and(|pp| parents.contains(&pp))
                && std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}

/// Where and as what a stack runs.
pub struct StackSpec<'a> {
    /// Its cgroup (the runtime's pods and kubelet's `kubepods` below it).
    pub cgroup: String,
    /// The node's name (the credentials' when joined).
    pub node_name: String,
    /// Credentials of a cluster to join as a node; None: standalone
    /// (static pods only).
    pub join: Option<&'a NodeCredentials>,
    /// The most pods kubelet admits (at least its default 110).
    pub max_pods: usize,
}

/// The node name of `setup`'s stack in this run.
pub fn node_name(work: &Work, setup: Setup) -> String {
    format!("bench-{}-{}", setup.tag(), work.id())
}

/// Starts the setup's stack for the kubelet figures: standalone.
pub fn start_stack(
    args: &Args,
    work: &Work,
    shared: &Shared,
    index: usize,
    setup: Setup,
) -> Result<(Stack, String)> {
    // Room for the largest size and the started pods.
    let most = args.kubelet_sizes.iter().max().copied().unwrap_or(0) + 2 * args.kubelet_starts;
    let spec = StackSpec {
        cgroup: format!("{}/{}-{index}", work.cgroup_parent, setup.tag()),
        node_name: node_name(work, setup),
        join: None,
        max_pods: most,
    };
    start_stack_with(args, shared, setup, &spec)
}

/// Starts the setup's stack as `spec` says: its own CNI network, runtime,
/// directories and cgroup; joined to a cluster when `spec.join` is set
/// (kubelet's `--kubeconfig`; `petrel node --kubeconfig --node-ip`).
pub fn start_stack_with(
    args: &Args,
    shared: &Shared,
    setup: Setup,
    spec: &StackSpec<'_>,
) -> Result<(Stack, String)> {
    let net = PodNetwork::new()?;
    let cgroup = &spec.cgroup;
    let node_name = spec.node_name.clone();
    let mirrors = shared.mirrors.path();
    let petrel_opts = |node: Option<NodeAgent>| PetrelOptions {
        shim: args.shim.clone(),
        cgroup_parent: Some(format!("{cgroup}/runtime")),
        node,
        ..PetrelOptions::default()
    };
    let (runtime, version) = match setup {
        Setup::PetrelNode => {
            let agent = NodeAgent {
                node_name: node_name.clone(),
                pleg: "events".to_string(),
                eviction_hard: Some(NODE_EVICTION_HARD.to_string()),
                extra: match spec.join {
                    Some(c) => vec![
                        "--kubeconfig".to_string(),
                        c.kubeconfig.display().to_string(),
                        "--node-ip".to_string(),
                        c.node_ip.to_string(),
                    ],
                    None => vec![],
                },
            };
            let n = PetrelRuntime::start_with(
                &args.petrel,
                &shared.runc,
                &net,
                mirrors,
                &petrel_opts(Some(agent)),
            )?;
            return Ok((
                Stack {
                    kubelet: None,
                    runtime: Runtime::Petrel(n),
                    pleg: Pleg::Evented,
                    _net: net,
                },
                petrel_version(&args.petrel),
            ));
        }
        Setup::KubeletPetrel => (
            Runtime::Petrel(PetrelRuntime::start_with(
                &args.petrel,
                &shared.runc,
                &net,
                mirrors,
                &petrel_opts(None),
            )?),
            petrel_version(&args.petrel),
        ),
        Setup::KubeletContainerd => {
            let bin = petrel_testkit::containerd::binaries()?;
            let c = Containerd::start(&bin, &shared.runc, &net, mirrors)?;
            let v = c.version().to_string();
            (Runtime::Containerd(c), v)
        }
        Setup::KubeletContainerd17 => {
            let bin = crate::containerd::bin_dir(&args.build_dir).join("containerd");
            if !bin.is_file() || !bin.with_file_name("containerd-shim-runc-v2").is_file() {
                bail!(
                    "not measured: containerd 1.7 is not at {} (run `make containerd`)",
                    bin.display()
                );
            }
            let c = Containerd::start(&bin, &shared.runc, &net, mirrors)?;
            let v = c.version().to_string();
            (Runtime::Containerd(c), v)
        }
    };
    let endpoint = match &runtime {
        Runtime::Petrel(p) => p.endpoint(),
        Runtime::Containerd(c) => c.endpoint(),
    };
    let mut opts = match spec.join {
        Some(c) => KubeletOptions::joined(c.clone(), &endpoint),
        None => KubeletOptions::standalone(&node_name, &endpoint),
    }
    .evented_pleg(false);
    opts.cgroup_root = Some(format!("{cgroup}/kubelet"));
    // kubelet's default verbosity, as a node runs it: its log costs CPU.
    opts.verbosity = 0;
    // kubelet admits 110 pods by default.
    opts.max_pods = Some(u32::try_from(spec.max_pods.max(110)).unwrap_or(u32::MAX));
    let kubelet = match Kubelet::start(opts) {
        Ok(k) => k,
        Err(e) => {
            let text = e.to_string();
            bail!(
                "kubelet did not start on {}: {}",
                setup_name(setup, &version),
                kubelet_refusal(&text).unwrap_or(text)
            );
        }
    };
    Ok((
        Stack {
            kubelet: Some(kubelet),
            runtime,
            pleg: Pleg::Generic,
            _net: net,
        },
        version,
    ))
}

/// `petrel --version`'s answer, or empty.
pub fn petrel_version(petrel: &Path) -> String {
    std::process::Command::new(petrel)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// kubelet's own reason for not starting, from the tail of its log in a
/// start error: its last error (`E…`) or fatal (`F…`) klog line, without
/// the header, or its last `run.go` line.
pub fn kubelet_refusal(text: &str) -> Option<String> {
    let klog = |l: &&str| {
        let b = l.as_bytes();
        b.len() > 5 && (b[0] == b'E' || b[0] == b'F') && b[1..5].iter().all(u8::is_ascii_digit)
    };
    let line = text.lines().rev().find(klog)?;
    let msg = line.split_once("] ").map(|(_, m)| m).unwrap_or(line);
    Some(msg.trim().to_string())
}

/// kubelet's distinct warnings and errors (klog `W`/`E` lines, without
/// their headers) that say the runtime or a setting is deprecated or
/// unsupported; at most three.
pub fn kubelet_warnings(log: &str) -> Vec<String> {
    const WORDS: [&str; 5] = [
        "deprecat",
        "unsupported",
        "not supported",
        "too old",
        "minimum",
    ];
    let mut out: Vec<String> = vec![];
    for l in log.lines() {
        let b = l.as_bytes();
        let klog =
            b.len() > 5 && (b[0] == b'W' || b[0] == b'E') && b[1..5].iter().all(u8::is_ascii_digit);
        if !klog {
            continue;
        }
        let msg = l.split_once("] ").map_or(l, |(_, m)| m).trim();
        let lower = msg.to_lowercase();
        if WORDS.iter().any(|w| lower.contains(w)) {
            let msg: String = msg.chars().take(240).collect();
            if !out.contains(&msg) {
                out.push(msg);
            }
            if out.len() == 3 {
                break;
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    #[test]
    fn kubelet_refusal_should_be_its_last_error_line_without_the_header() {
        let text = "kubelet failed to start: exited at start; last lines:\n\
                    I1127 15:46:42.1 20537 server.go:1] starting\n\
                    E1127 15:46:42.988304   20537 run.go:72] \"command failed\" err=\"runtime too old\"\n\
                    some trailer";
        assert_eq!(
            kubelet_refusal(text).as_deref(),
            Some("\"command failed\" err=\"runtime too old\"")
        );
        assert_eq!(kubelet_refusal("no klog here"), None);
    }

    #[test]
    fn kubelet_warnings_should_keep_distinct_deprecations_only() {
        let log = "I1127 1 1 a.go:1] Deprecated but info\n\
                   W1127 1 1 b.go:2] \"containerd 1.x is deprecated\" version=\"1.7.24\"\n\
                   W1127 1 1 b.go:2] \"containerd 1.x is deprecated\" version=\"1.7.24\"\n\
                   E1127 1 1 c.go:3] \"failed to get stats\"\n";
        assert_eq!(
            kubelet_warnings(log),
            vec!["\"containerd 1.x is deprecated\" version=\"1.7.24\"".to_string()]
        );
    }
}
