//! Test doubles of the parts: one in-memory host ([`FakeHost`]) that is
//! the OCI runtime, the cgroups, the shims, the mounts, the pods' kernel
//! parts and their networks at once, so that
//! what one part does shows in the others (a shim's create makes a runc
//! container and its cgroup; a SIGKILL through the OCI runtime makes the
//! shim record the exit and exit). Every call is recorded as a [`Call`];
//! failures are scripted with [`FakeHost::fail`]. Shims and inits get pids
//! above the kernel's largest (`pid_max` is at most 2^22), so nothing the
//! runtime does by pid ever reaches a real process.
//!
//! [`TestRuntime`] builds a runtime on a temporary directory over a fake
//! host, with a layerless image and helpers for pods and containers.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use oci_spec::runtime::{LinuxResources, Process};
use petrel_cni::NetworkList;
use petrel_cri::api;
use petrel_oci::cgroups::{CgroupError, CgroupStats, CgroupVersion};
use petrel_oci::runc::{CheckpointOptions, ExecOutput, RuncError, RuncState};
use petrel_shim::{Command, ExitRecord, EXIT_FILE};
use tokio::sync::Notify;

use super::{
    CgroupOps, ExitReadError, FoundShim, InitSeen, OciRuntime, Parts, PodNetworking, Readiness,
    RootfsMounter, ShimLauncher, ShimSeen, ShimWatch, StartedShim, WaitFailed,
};
use crate::container::rootfs::WritableLayer;
use crate::container::shim::ShimOptions;
use crate::error::{Result, RuntimeError};
use crate::records::{NetworkRecord, ProcessRef, SandboxRecord};
use crate::service::Runtime;

/// Where fake pids start: above any pid the kernel hands out.
const FIRST_PID: u32 = 5_000_000;
/// The prefix of the fake cgroup hierarchy's directories.
const CGROUP_ROOT: &str = "/fake-cgroup";

/// A call made to the fake host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    ShimStart(String),
    OciStart(String),
    OciKill {
        id: String,
        signal: i32,
        all: bool,
    },
    OciDelete {
        id: String,
        force: bool,
    },
    OciState(String),
    OciList,
    OciUpdate(String),
    OciCheckpoint(String),
    OciExec(String),
    ClearStart(String),
    Mount(PathBuf),
    /// The rootfs just mounted has layers idmapped with this user namespace.
    IdmappedMount(PathBuf),
    Unmount(PathBuf),
    CgroupEnsure(String),
    CgroupRemove(String),
    ReleaseMemory(String),
    ShimCommand(PathBuf),
    KillTree(u32),
    PinNamespaces(PathBuf),
    UnpinNamespace(PathBuf),
    MountShm(PathBuf),
    UnmountShm(PathBuf),
    SpawnPidHolder,
    /// A PID-namespace holder started in this user namespace (after
    /// `SpawnPidHolder`).
    PidHolderUserns(PathBuf),
    KillPidHolder(u32),
    /// CNI ADD of the pod with this id.
    NetworkAdd(String),
    /// CNI DEL of the pod with this id.
    NetworkDel(String),
    /// CNI CHECK of the pod with this id.
    NetworkCheck(String),
}

/// A call that can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Fault {
    ShimStart,
    OciStart,
    OciKill,
    OciDelete,
    OciState,
    OciCheckpoint,
    Mount,
    Unmount,
    CgroupRemove,
    /// `ShimLauncher::wait_exit` fails (the shim stays watched).
    WaitExit,
    CgroupEnsure,
    PinNamespaces,
    UnpinNamespace,
    MountShm,
    UnmountShm,
    SpawnPidHolder,
    NetworkAdd,
    NetworkDel,
    NetworkCheck,
}

/// The OCI runtime's status of a fake container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Created,
    Running,
    Stopped,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Stopped => "stopped",
        }
    }
}

/// A container the fake OCI runtime knows.
#[derive(Debug, Clone)]
pub(crate) struct FakeContainer {
    pub status: Status,
    pub init_pid: u32,
    pub bundle: PathBuf,
    /// runc's exec FIFO is still there.
    pub start_pending: bool,
    /// The cgroup its create made (from config.json).
    pub cgroup: Option<String>,
}

/// A fake shim.
#[derive(Debug, Clone)]
pub(crate) struct FakeShim {
    pub id: String,
    pub bundle: PathBuf,
    pub alive: bool,
    /// Where it is while alive.
    pub seen: ShimSeen,
    /// Looks at it (`FoundShim::seen`) before an `InCreate` shim turns
    /// `Serving`.
    pub create_looks: u32,
}

/// What a fake shim leaves in the bundle when it exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitFile {
    /// An exit record with this code, from a shim that could not tell
    /// whether the OOM killer killed (cgroup v1, an older shim).
    Code(i32),
    /// An exit record with this code and the shim's finding on OOM kills.
    CodeOom(i32, bool),
    /// A record that cannot be read (a directory in its place).
    Unreadable,
    /// A record that is not one.
    Corrupt,
}

#[derive(Debug, Default)]
struct World {
    next_pid: u32,
    containers: BTreeMap<String, FakeContainer>,
    shims: BTreeMap<u32, FakeShim>,
    mounts: BTreeSet<PathBuf>,
    cgroups: BTreeSet<String>,
    /// Pinned pod namespaces (their files exist, as the real pins').
    namespaces: BTreeSet<PathBuf>,
    shm_mounts: BTreeSet<PathBuf>,
    pid_holders: BTreeSet<u32>,
    /// The network new pods join (`None`: loopback only).
    network: Option<NetworkList>,
    /// The pods attached to the network, by sandbox id.
    attached: BTreeMap<String, NetworkRecord>,
    oom_kills: HashMap<String, u64>,
    calls: Vec<Call>,
    faults: HashMap<Fault, u32>,
    /// How long a checkpoint (CRIU's dump) takes.
    checkpoint_takes: Duration,
}

impl World {
    fn pid(&mut self) -> u32 {
        if self.next_pid < FIRST_PID {
            self.next_pid = FIRST_PID;
        }
        self.next_pid += 1;
        self.next_pid
    }

    /// Whether a scripted failure of `fault` is due (and counts it).
    fn fails(&mut self, fault: Fault) -> bool {
        match self.faults.get_mut(&fault) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// The container `id` stops; its shim, if alive, leaves `exit` and
    /// exits.
    fn stop(&mut self, id: &str, exit: ExitFile) {
        if let Some(c) = self.containers.get_mut(id) {
            c.status = Status::Stopped;
            c.start_pending = false;
        }
        let live: Vec<u32> = self
            .shims
            .iter()
            .filter(|(_, s)| s.id == id && s.alive)
            .map(|(pid, _)| *pid)
            .collect();
        for pid in live {
            if let Some(s) = self.shims.get_mut(&pid) {
                write_exit_file(&s.bundle, exit);
                s.alive = false;
            }
        }
    }
}

fn write_exit_file(bundle: &Path, exit: ExitFile) {
    let path = bundle.join(EXIT_FILE);
    let written = match exit {
        ExitFile::Code(code) => std::fs::write(
            &path,
            ExitRecord {
                exit_code: code,
                exited_at_ns: 1_000,
                oom_killed: None,
            }
            .to_string(),
        ),
        ExitFile::CodeOom(code, oom) => std::fs::write(
            &path,
            ExitRecord {
                exit_code: code,
                exited_at_ns: 1_000,
                oom_killed: Some(oom),
            }
            .to_string(),
        ),
        ExitFile::Unreadable => std::fs::create_dir_all(&path),
        ExitFile::Corrupt => std::fs::write(&path, "not an exit record"),
    };
    match written {
        // Its bundle removed meanwhile (a removal racing a failed start's
        // shim): the real shim cannot write it either.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("fake shim cannot write {}: {e}", path.display()),
        Ok(()) => {}
    }
}

fn injected(command: &'static str, id: &str) -> RuncError {
    RuncError::Failed {
        command,
        id: id.to_string(),
        message: "injected failure".to_string(),
    }
}

/// The in-memory host.
#[derive(Debug, Default)]
pub(crate) struct FakeHost {
    world: Arc<Mutex<World>>,
    changed: Arc<Notify>,
}

fn lock(world: &Mutex<World>) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeHost {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The parts of a runtime on this host.
    pub fn parts(self: &Arc<Self>) -> Parts {
        Parts {
            oci: self.clone(),
            cgroups: self.clone(),
            shims: self.clone(),
            rootfs: self.clone(),
            pods: self.clone(),
            networks: self.clone(),
            host: petrel_oci::spec::HostLimits {
                bounding_caps: Vec::new(),
                min_oom_score_adj: -1000,
                open_files: None,
                online_cpus: None,
                online_mems: None,
                hugetlb: false,
                recursive_read_only: true,
                user_namespaces: true,
                cgroup_namespaces: false,
            },
        }
    }

    fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    /// Makes the next `times` calls of `fault`'s kind fail.
    pub fn fail(&self, fault: Fault, times: u32) {
        *self.world().faults.entry(fault).or_default() += times;
    }

    /// Lets every later call of `fault`'s kind succeed again.
    pub fn allow(&self, fault: Fault) {
        self.world().faults.remove(&fault);
    }

    /// Makes every later checkpoint take `d`.
    pub fn checkpoint_takes(&self, d: Duration) {
        self.world().checkpoint_takes = d;
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.world().calls.clone()
    }

    /// Forgets the calls so far.
    pub fn clear_calls(&self) {
        self.world().calls.clear();
    }

    /// The containers the OCI runtime knows.
    pub fn containers(&self) -> BTreeMap<String, FakeContainer> {
        self.world().containers.clone()
    }

    /// The live shims, by pid.
    pub fn live_shims(&self) -> Vec<(u32, FakeShim)> {
        self.world()
            .shims
            .iter()
            .filter(|(_, s)| s.alive)
            .map(|(p, s)| (*p, s.clone()))
            .collect()
    }

    /// Mounted rootfs targets.
    pub fn mounts(&self) -> BTreeSet<PathBuf> {
        self.world().mounts.clone()
    }

    /// Existing cgroups.
    pub fn cgroups(&self) -> BTreeSet<String> {
        self.world().cgroups.clone()
    }

    /// Pinned pod namespaces.
    pub fn namespaces(&self) -> BTreeSet<PathBuf> {
        self.world().namespaces.clone()
    }

    /// Mounted pod shm tmpfs.
    pub fn shm_mounts(&self) -> BTreeSet<PathBuf> {
        self.world().shm_mounts.clone()
    }

    /// Live PID-namespace holders.
    pub fn pid_holders(&self) -> BTreeSet<u32> {
        self.world().pid_holders.clone()
    }

    /// Pods attached to the network (by sandbox id).
    pub fn attached(&self) -> BTreeMap<String, NetworkRecord> {
        self.world().attached.clone()
    }

    /// Pods that are not on the host's network join a network from now on
    /// (until then they get loopback only, whatever `pod_network` says:
    /// the fake stands in for the whole of pod networking).
    pub fn use_network(&self) {
        let list = NetworkList::parse(
            Path::new("/fake/net.d/10-fake.conflist"),
            br#"{"cniVersion":"1.0.0","name":"fake","plugins":[{"type":"fake"}]}"#,
        );
        match list {
            Ok(list) => self.world().network = Some(list),
            Err(e) => panic!("fake network config: {e}"),
        }
    }

    /// What a reboot takes: every pinned namespace, shm mount and
    /// PID-namespace holder (address leases, the network's, survive).
    pub fn reboot(&self) {
        let mut w = self.world();
        for p in std::mem::take(&mut w.namespaces) {
            std::fs::remove_file(&p).unwrap_or_default();
        }
        w.shm_mounts.clear();
        w.pid_holders.clear();
    }

    /// The PID-namespace holder `pid` dies.
    pub fn kill_holder(&self, pid: u32) {
        self.world().pid_holders.remove(&pid);
    }

    /// Sets the OOM kill count of a cgroup.
    pub fn set_oom_kills(&self, cgroup: &str, n: u64) {
        self.world().oom_kills.insert(cgroup.to_string(), n);
    }

    /// The container `id`'s init exits: its shim leaves `exit` in the
    /// bundle and exits.
    pub fn exit(&self, id: &str, exit: ExitFile) {
        self.world().stop(id, exit);
        self.changed.notify_waiters();
    }

    /// The container `id`'s shim dies on its own (killed), leaving no exit
    /// record; the container keeps running.
    pub fn kill_shim(&self, id: &str) {
        for s in self.world().shims.values_mut().filter(|s| s.id == id) {
            s.alive = false;
        }
        self.changed.notify_waiters();
    }

    /// Replaces what a container's bundle says of its exit.
    pub fn rewrite_exit(&self, bundle: &Path, exit: ExitFile) {
        let path = bundle.join(EXIT_FILE);
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap_or_default();
        } else {
            std::fs::remove_file(&path).unwrap_or_default();
        }
        write_exit_file(bundle, exit);
    }

    /// Puts a container into the OCI runtime as a crash may have left it.
    pub fn put_container(&self, id: &str, c: FakeContainer) {
        self.world().containers.insert(id.to_string(), c);
    }

    /// Puts a shim on the host as a crash may have left it; returns its
    /// pid.
    pub fn put_shim(&self, shim: FakeShim) -> u32 {
        let mut w = self.world();
        let pid = w.pid();
        w.shims.insert(pid, shim);
        pid
    }

    /// A fresh fake pid (for an init).
    pub fn new_pid(&self) -> u32 {
        self.world().pid()
    }

    /// Waits until `pred` holds of the host (up to `within`).
    pub async fn wait_for(&self, within: Duration, pred: impl Fn(&FakeHost) -> bool) -> bool {
        tokio::time::timeout(within, async {
            loop {
                let notified = self.changed.notified();
                if pred(self) {
                    return;
                }
                // Changes through the runtime's own calls notify nobody:
                // look again soon in any case.
                let _ = tokio::time::timeout(Duration::from_millis(5), notified).await;
            }
        })
        .await
        .is_ok()
    }

    fn shim_alive(&self, pid: u32) -> bool {
        self.world().shims.get(&pid).is_some_and(|s| s.alive)
    }
}

#[async_trait::async_trait]
impl OciRuntime for FakeHost {
    fn binary(&self) -> &Path {
        Path::new("/fake/runc")
    }

    fn root(&self) -> &Path {
        Path::new("/fake/runc-root")
    }

    async fn start(&self, id: &str, _init: Option<(OwnedFd, u32)>) -> Result<(), RuncError> {
        let mut w = self.world();
        w.calls.push(Call::OciStart(id.to_string()));
        if w.fails(Fault::OciStart) {
            return Err(injected("start", id));
        }
        match w.containers.get_mut(id) {
            Some(c) if c.status == Status::Created => {
                c.status = Status::Running;
                c.start_pending = false;
                Ok(())
            }
            Some(_) => Err(RuncError::Failed {
                command: "start",
                id: id.to_string(),
                message: "cannot start a container that is not created".to_string(),
            }),
            None => Err(RuncError::NotFound(id.to_string())),
        }
    }

    async fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), RuncError> {
        {
            let mut w = self.world();
            w.calls.push(Call::OciKill {
                id: id.to_string(),
                signal,
                all,
            });
            if w.fails(Fault::OciKill) {
                return Err(injected("kill", id));
            }
            match w.containers.get(id).map(|c| c.status) {
                None => return Err(RuncError::NotFound(id.to_string())),
                Some(Status::Stopped) => {
                    return Err(RuncError::Failed {
                        command: "kill",
                        id: id.to_string(),
                        message: "container not running".to_string(),
                    })
                }
                // Every signal the tests send ends the init.
                Some(_) => w.stop(id, ExitFile::Code(128 + signal)),
            }
        }
        self.changed.notify_waiters();
        Ok(())
    }

    async fn delete(&self, id: &str, force: bool) -> Result<(), RuncError> {
        {
            let mut w = self.world();
            w.calls.push(Call::OciDelete {
                id: id.to_string(),
                force,
            });
            if w.fails(Fault::OciDelete) {
                return Err(injected("delete", id));
            }
            let Some(c) = w.containers.get(id).cloned() else {
                return Ok(());
            };
            if c.status != Status::Stopped && !force {
                return Err(RuncError::Failed {
                    command: "delete",
                    id: id.to_string(),
                    message: "container is not stopped".to_string(),
                });
            }
            // A live init is killed; a shim still there (recording the
            // init's exit) then exits.
            w.stop(id, ExitFile::Code(128 + libc::SIGKILL));
            w.containers.remove(id);
            if let Some(cg) = c.cgroup {
                w.cgroups.remove(&cg);
            }
        }
        self.changed.notify_waiters();
        Ok(())
    }

    async fn state(&self, id: &str) -> Result<Option<RuncState>, RuncError> {
        let mut w = self.world();
        w.calls.push(Call::OciState(id.to_string()));
        if w.fails(Fault::OciState) {
            return Err(injected("state", id));
        }
        Ok(w.containers.get(id).map(|c| RuncState {
            id: id.to_string(),
            pid: i64::from(c.init_pid),
            status: c.status.as_str().to_string(),
            bundle: c.bundle.display().to_string(),
        }))
    }

    async fn list(&self) -> Result<Vec<RuncState>, RuncError> {
        let mut w = self.world();
        w.calls.push(Call::OciList);
        Ok(w.containers
            .iter()
            .map(|(id, c)| RuncState {
                id: id.clone(),
                pid: i64::from(c.init_pid),
                status: c.status.as_str().to_string(),
                bundle: c.bundle.display().to_string(),
            })
            .collect())
    }

    async fn update(&self, id: &str, _resources: &LinuxResources) -> Result<(), RuncError> {
        self.world().calls.push(Call::OciUpdate(id.to_string()));
        Ok(())
    }

    /// Writes what CRIU's dump would (an inventory image, one page image,
    /// its log) for a running container.
    async fn checkpoint(&self, id: &str, opts: &CheckpointOptions<'_>) -> Result<(), RuncError> {
        let takes = self.world().checkpoint_takes;
        tokio::time::sleep(takes).await;
        let mut w = self.world();
        w.calls.push(Call::OciCheckpoint(id.to_string()));
        if w.fails(Fault::OciCheckpoint) {
            return Err(injected("checkpoint", id));
        }
        match w.containers.get(id).map(|c| c.status) {
            Some(Status::Running) => {}
            Some(_) => {
                return Err(RuncError::Failed {
                    command: "checkpoint",
                    id: id.to_string(),
                    message: "container is not running".to_string(),
                })
            }
            None => return Err(RuncError::NotFound(id.to_string())),
        }
        let io = |path: PathBuf| {
            move |source| RuncError::Io {
                op: "fake checkpoint: write",
                path,
                source,
            }
        };
        let inventory = opts.image_dir.join("inventory.img");
        std::fs::write(&inventory, id).map_err(io(inventory.clone()))?;
        let pages = opts.image_dir.join("pages-1.img");
        std::fs::write(&pages, [0u8; 64]).map_err(io(pages.clone()))?;
        let log = opts.work_dir.join("dump.log");
        std::fs::write(&log, "Dumping finished successfully\n").map_err(io(log.clone()))?;
        Ok(())
    }

    async fn exec(
        &self,
        id: &str,
        _process: &Process,
        _work_dir: &Path,
        _timeout: Option<Duration>,
    ) -> Result<ExecOutput, RuncError> {
        self.world().calls.push(Call::OciExec(id.to_string()));
        Ok(ExecOutput::default())
    }

    fn init_seen(&self, id: &str, init: ProcessRef, _created: bool) -> InitSeen {
        match self.world().containers.get(id) {
            Some(c) if c.init_pid == init.pid && c.status != Status::Stopped => {
                if c.status == Status::Created && c.start_pending {
                    InitSeen::AwaitingStart
                } else {
                    InitSeen::Started
                }
            }
            _ => InitSeen::Gone,
        }
    }

    fn start_pending(&self, id: &str) -> bool {
        self.world()
            .containers
            .get(id)
            .is_some_and(|c| c.start_pending)
    }

    fn started_at(&self, _id: &str) -> Option<SystemTime> {
        None
    }

    fn clear_start(&self, id: &str) -> io::Result<()> {
        let mut w = self.world();
        w.calls.push(Call::ClearStart(id.to_string()));
        if let Some(c) = w.containers.get_mut(id) {
            c.start_pending = false;
        }
        Ok(())
    }
}

impl CgroupOps for FakeHost {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn ensure_dirs(&self, path: &str) -> Result<Vec<PathBuf>, CgroupError> {
        let mut w = self.world();
        w.calls.push(Call::CgroupEnsure(path.to_string()));
        if w.fails(Fault::CgroupEnsure) {
            return Err(CgroupError::NotMounted("injected failure".to_string()));
        }
        if !w.cgroups.insert(path.to_string()) {
            return Ok(Vec::new());
        }
        Ok(vec![PathBuf::from(format!("{CGROUP_ROOT}{path}"))])
    }

    fn cgroup_of_dir(&self, dir: &Path) -> Option<String> {
        dir.to_str()?.strip_prefix(CGROUP_ROOT).map(str::to_string)
    }

    fn remove_created(&self, dirs: &[PathBuf]) -> Result<(), (Vec<PathBuf>, CgroupError)> {
        let mut w = self.world();
        for d in dirs {
            if let Some(cg) = d.to_str().and_then(|d| d.strip_prefix(CGROUP_ROOT)) {
                w.calls.push(Call::CgroupRemove(cg.to_string()));
                w.cgroups.remove(cg);
            }
        }
        Ok(())
    }

    fn remove(&self, path: &str) -> Result<(), CgroupError> {
        let mut w = self.world();
        w.calls.push(Call::CgroupRemove(path.to_string()));
        if w.fails(Fault::CgroupRemove) {
            return Err(CgroupError::Busy {
                path: path.to_string(),
                dir: PathBuf::from(format!("{CGROUP_ROOT}{path}")),
            });
        }
        w.cgroups.remove(path);
        Ok(())
    }

    fn release_memory(&self, path: &str) -> Result<(), CgroupError> {
        self.world()
            .calls
            .push(Call::ReleaseMemory(path.to_string()));
        Ok(())
    }

    fn oom_kill_count(&self, path: &str) -> Option<u64> {
        self.world().oom_kills.get(path).copied()
    }

    fn stats(&self, _path: &str) -> Result<CgroupStats, CgroupError> {
        Ok(CgroupStats::default())
    }

    fn metrics(&self, _path: &str) -> Result<petrel_oci::cgroups::CgroupMetrics, CgroupError> {
        Ok(Default::default())
    }

    fn procs(&self, _path: &str) -> Result<Vec<u32>, CgroupError> {
        Ok(Vec::new())
    }
}

impl RootfsMounter for FakeHost {
    fn mount(
        &self,
        _lower: &[PathBuf],
        _layer: &WritableLayer,
        _empty_lower: &Path,
        target: &Path,
        idmap: Option<&crate::container::idmap::LayerIdmap>,
    ) -> Result<()> {
        let mut w = self.world();
        w.calls.push(Call::Mount(target.to_path_buf()));
        if let Some(m) = idmap {
            w.calls.push(Call::IdmappedMount(m.userns.clone()));
        }
        if w.fails(Fault::Mount) {
            return Err(RuntimeError::io(
                "mount overlay at",
                target,
                io::Error::other("injected failure"),
            ));
        }
        // As the real mount, it makes its mount point.
        std::fs::create_dir_all(target).map_err(|e| RuntimeError::io("create", target, e))?;
        w.mounts.insert(target.to_path_buf());
        Ok(())
    }

    fn mount_read_only(&self, _lower: &[PathBuf], empty: &Path, target: &Path) -> Result<()> {
        self.mount(&[], &WritableLayer::new(empty), empty, target, None)
    }

    fn unmount(&self, target: &Path) -> Result<()> {
        let mut w = self.world();
        w.calls.push(Call::Unmount(target.to_path_buf()));
        if w.fails(Fault::Unmount) {
            return Err(RuntimeError::io(
                "unmount",
                target,
                io::Error::other("injected failure"),
            ));
        }
        w.mounts.remove(target);
        Ok(())
    }

    fn is_mounted(&self, target: &Path) -> bool {
        self.world().mounts.contains(target)
    }
}

fn injected_io(op: &'static str, path: &Path) -> io::Error {
    io::Error::other(format!("injected failure: {op} {}", path.display()))
}

impl super::PodKernel for FakeHost {
    fn pin_namespaces(
        &self,
        dir: &Path,
        req: &crate::sandbox::namespaces::NamespaceRequest,
    ) -> Result<crate::sandbox::namespaces::Pinned, crate::sandbox::namespaces::NamespaceError>
    {
        use crate::sandbox::namespaces::{NamespaceError, Pinned};
        let mut w = self.world();
        w.calls.push(Call::PinNamespaces(dir.to_path_buf()));
        if w.fails(Fault::PinNamespaces) {
            return Err(NamespaceError::Sys {
                op: "unshare",
                path: dir.to_path_buf(),
                source: injected_io("unshare", dir),
            });
        }
        let mut pinned = Pinned::default();
        for (kind, wanted, slot) in [
            ("net", req.net, &mut pinned.net),
            ("ipc", req.ipc, &mut pinned.ipc),
            ("uts", req.uts.is_some(), &mut pinned.uts),
            ("user", req.user.is_some(), &mut pinned.user),
        ] {
            if wanted {
                // As the real pins: a file in the pod's directory.
                let p = dir.join(kind);
                std::fs::write(&p, "").map_err(|source| NamespaceError::Sys {
                    op: "create",
                    path: p.clone(),
                    source,
                })?;
                w.namespaces.insert(p.clone());
                *slot = Some(p);
            }
        }
        Ok(pinned)
    }

    fn unpin_namespace(
        &self,
        path: &Path,
    ) -> Result<(), crate::sandbox::namespaces::NamespaceError> {
        let mut w = self.world();
        w.calls.push(Call::UnpinNamespace(path.to_path_buf()));
        if w.fails(Fault::UnpinNamespace) {
            return Err(crate::sandbox::namespaces::NamespaceError::Sys {
                op: "unmount",
                path: path.to_path_buf(),
                source: injected_io("unmount", path),
            });
        }
        w.namespaces.remove(path);
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(crate::sandbox::namespaces::NamespaceError::Sys {
                    op: "remove",
                    path: path.to_path_buf(),
                    source: e,
                })
            }
            _ => Ok(()),
        }
    }

    fn mount_shm(&self, path: &Path, _size: u64) -> Result<()> {
        let mut w = self.world();
        w.calls.push(Call::MountShm(path.to_path_buf()));
        if w.fails(Fault::MountShm) {
            return Err(RuntimeError::io(
                "mount shm at",
                path,
                injected_io("mount", path),
            ));
        }
        std::fs::create_dir_all(path).map_err(|e| RuntimeError::io("create", path, e))?;
        w.shm_mounts.insert(path.to_path_buf());
        Ok(())
    }

    fn unmount_shm(&self, path: &Path) -> Result<()> {
        let mut w = self.world();
        w.calls.push(Call::UnmountShm(path.to_path_buf()));
        if w.fails(Fault::UnmountShm) {
            return Err(RuntimeError::io(
                "unmount",
                path,
                injected_io("unmount", path),
            ));
        }
        w.shm_mounts.remove(path);
        Ok(())
    }

    fn kill_pid_holder(&self, holder: &ProcessRef) {
        let mut w = self.world();
        w.calls.push(Call::KillPidHolder(holder.pid));
        w.pid_holders.remove(&holder.pid);
    }

    fn namespace_pinned(&self, path: &Path) -> bool {
        self.world().namespaces.contains(path)
    }

    fn pid_holder_alive(&self, holder: &ProcessRef) -> bool {
        self.world().pid_holders.contains(&holder.pid)
    }
}

fn injected_cni(command: &'static str) -> RuntimeError {
    RuntimeError::Cni(petrel_cni::CniError::Plugin {
        plugin: "fake".to_string(),
        command,
        message: "injected failure".to_string(),
    })
}

#[async_trait::async_trait]
impl PodNetworking for FakeHost {
    fn current(&self) -> Result<Option<NetworkList>> {
        Ok(self.world().network.clone())
    }

    fn readiness(&self) -> Readiness {
        Readiness {
            ready: true,
            reason: String::new(),
            message: "fake network".to_string(),
        }
    }

    async fn add(&self, list: &NetworkList, rec: &SandboxRecord) -> Result<NetworkRecord> {
        let mut w = self.world();
        w.calls.push(Call::NetworkAdd(rec.id.clone()));
        if w.fails(Fault::NetworkAdd) {
            return Err(injected_cni("ADD"));
        }
        if rec.netns.as_ref().is_none_or(|p| !w.namespaces.contains(p)) {
            return Err(RuntimeError::Invariant(format!(
                "fake CNI ADD of pod {} without its network namespace",
                rec.id
            )));
        }
        let n = w.attached.len() + 2;
        let net = NetworkRecord {
            conflist: list.to_json(),
            ifname: crate::sandbox::network::POD_IFNAME.to_string(),
            ips: vec![format!("10.88.0.{n}")],
            result: Some(serde_json::json!({ "cniVersion": list.cni_version })),
        };
        w.attached.insert(rec.id.clone(), net.clone());
        Ok(net)
    }

    async fn del(&self, rec: &SandboxRecord, _net: &NetworkRecord) -> Result<()> {
        let mut w = self.world();
        w.calls.push(Call::NetworkDel(rec.id.clone()));
        if w.fails(Fault::NetworkDel) {
            return Err(injected_cni("DEL"));
        }
        // As CNI's DEL: releasing what is not there is fine.
        w.attached.remove(&rec.id);
        Ok(())
    }

    async fn check(&self, rec: &SandboxRecord, _net: &NetworkRecord) -> Result<Option<()>> {
        let mut w = self.world();
        w.calls.push(Call::NetworkCheck(rec.id.clone()));
        if w.fails(Fault::NetworkCheck) {
            return Err(injected_cni("CHECK"));
        }
        Ok(Some(()))
    }
}

/// A fake shim found at start-up.
#[derive(Debug)]
struct FakeFound {
    world: Arc<Mutex<World>>,
    changed: Arc<Notify>,
    pid: u32,
}

#[async_trait::async_trait]
impl FoundShim for FakeFound {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn seen(&self) -> ShimSeen {
        let mut w = lock(&self.world);
        let Some(s) = w.shims.get_mut(&self.pid).filter(|s| s.alive) else {
            return ShimSeen::Gone;
        };
        if s.seen == ShimSeen::InCreate {
            if s.create_looks == 0 {
                s.seen = ShimSeen::Serving;
            } else {
                s.create_looks -= 1;
            }
        }
        s.seen
    }

    fn kill_tree(&self) {
        let id = {
            let mut w = lock(&self.world);
            w.calls.push(Call::KillTree(self.pid));
            let Some(s) = w.shims.get_mut(&self.pid) else {
                return;
            };
            s.alive = false;
            s.id.clone()
        };
        if let Some(c) = lock(&self.world).containers.get_mut(&id) {
            c.status = Status::Stopped;
        }
        self.changed.notify_waiters();
    }

    async fn exited_within(&self, within: Duration) -> bool {
        let alive = || {
            lock(&self.world)
                .shims
                .get(&self.pid)
                .is_some_and(|s| s.alive)
        };
        tokio::time::timeout(within, async {
            loop {
                let notified = self.changed.notified();
                if !alive() {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }
}

#[async_trait::async_trait]
impl ShimLauncher for FakeHost {
    fn binary(&self) -> &Path {
        Path::new("/fake/petrel-shim")
    }

    async fn start(&self, opts: &ShimOptions) -> Result<StartedShim> {
        let mut w = self.world();
        w.calls.push(Call::ShimStart(opts.id.clone()));
        if w.fails(Fault::ShimStart) {
            return Err(RuntimeError::ShimCreate {
                id: opts.id.clone(),
                message: "injected failure".to_string(),
            });
        }
        // The shim runs `runc create` on what the runtime wrote.
        let config = std::fs::read(opts.bundle.join("config.json"))
            .map_err(|e| RuntimeError::io("shim: read", opts.bundle.join("config.json"), e))?;
        let cgroup = serde_json::from_slice::<serde_json::Value>(&config)
            .ok()
            .and_then(|v| v["linux"]["cgroupsPath"].as_str().map(str::to_string));
        // A restore (`runc restore`) needs CRIU's images, and its
        // container runs at once.
        if let Some(restore) = &opts.restore {
            if !restore.images.join("inventory.img").is_file() {
                return Err(RuntimeError::ShimCreate {
                    id: opts.id.clone(),
                    message: format!("no CRIU images in {}", restore.images.display()),
                });
            }
        }
        let restored = opts.restore.is_some();
        let (shim_pid, init_pid) = (w.pid(), w.pid());
        if let Some(cg) = &cgroup {
            w.cgroups.insert(cg.clone());
        }
        w.containers.insert(
            opts.id.clone(),
            FakeContainer {
                status: if restored {
                    Status::Running
                } else {
                    Status::Created
                },
                init_pid,
                bundle: opts.bundle.clone(),
                start_pending: !restored,
                cgroup,
            },
        );
        w.shims.insert(
            shim_pid,
            FakeShim {
                id: opts.id.clone(),
                bundle: opts.bundle.clone(),
                alive: true,
                seen: ShimSeen::Serving,
                create_looks: 0,
            },
        );
        Ok(StartedShim {
            shim: ProcessRef {
                pid: shim_pid,
                start_time: 1,
            },
            init: ProcessRef {
                pid: init_pid,
                start_time: 0,
            },
            watch: ShimWatch::without_fd(shim_pid),
        })
    }

    fn adopt(&self, shim: &ProcessRef) -> io::Result<Option<ShimWatch>> {
        Ok(self
            .shim_alive(shim.pid)
            .then(|| ShimWatch::without_fd(shim.pid)))
    }

    async fn wait_exit(&self, watch: ShimWatch) -> Result<(), WaitFailed> {
        if self.world().fails(Fault::WaitExit) {
            return Err(WaitFailed {
                watch,
                error: io::Error::other("injected failure"),
            });
        }
        loop {
            let notified = self.changed.notified();
            if !self.shim_alive(watch.pid()) {
                return Ok(());
            }
            notified.await;
        }
    }

    fn exited(&self, watch: &ShimWatch) -> io::Result<bool> {
        Ok(!self.shim_alive(watch.pid()))
    }

    fn read_exit(&self, bundle: &Path) -> Result<Option<ExitRecord>, ExitReadError> {
        crate::container::shim::read_exit(bundle)
    }

    async fn send_command(&self, bundle: &Path, _command: Command) -> Result<()> {
        self.world()
            .calls
            .push(Call::ShimCommand(bundle.to_path_buf()));
        Ok(())
    }

    fn find(&self, containers: &Path) -> HashMap<String, u32> {
        self.world()
            .shims
            .iter()
            .filter(|(_, s)| s.alive && s.bundle.parent() == Some(containers))
            .map(|(pid, s)| (s.id.clone(), *pid))
            .collect()
    }

    fn pin(&self, id: &str, pid: u32, _containers: &Path) -> Option<Box<dyn FoundShim>> {
        let ok = self
            .world()
            .shims
            .get(&pid)
            .is_some_and(|s| s.alive && s.id == id);
        ok.then(|| {
            Box::new(FakeFound {
                world: self.world.clone(),
                changed: self.changed.clone(),
                pid,
            }) as Box<dyn FoundShim>
        })
    }

    async fn spawn_pid_holder(&self, userns: Option<&Path>) -> Result<ProcessRef> {
        let mut w = self.world();
        w.calls.push(Call::SpawnPidHolder);
        if let Some(u) = userns {
            w.calls.push(Call::PidHolderUserns(u.to_path_buf()));
        }
        if w.fails(Fault::SpawnPidHolder) {
            return Err(RuntimeError::io(
                "spawn pid holder",
                Path::new("/fake/petrel-shim"),
                io::Error::other("injected failure"),
            ));
        }
        let pid = w.pid();
        w.pid_holders.insert(pid);
        Ok(ProcessRef { pid, start_time: 0 })
    }
}

/// A runtime on a temporary directory over a [`FakeHost`].
pub(crate) struct TestRuntime {
    pub rt: Arc<Runtime>,
    pub host: Arc<FakeHost>,
    pub dir: tempfile::TempDir,
}

/// The reference of the test image.
pub(crate) const IMAGE: &str = "test.local/empty:1";

impl TestRuntime {
    /// A runtime, initialized, with the test image imported.
    pub fn new() -> Self {
        Self::with_config(|_| {})
    }

    /// [`TestRuntime::new`] with its configuration adjusted.
    pub fn with_config(adjust: impl FnOnce(&mut crate::RuntimeConfig)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = FakeHost::new();
        let rt = Self::open(dir.path(), &host, adjust);
        let archive = dir.path().join("image.tar");
        write_layerless_image(&archive, IMAGE);
        rt.images.import(&archive, &[]).expect("import test image");
        rt.set_initialized();
        Self { rt, host, dir }
    }

    fn open(
        dir: &Path,
        host: &Arc<FakeHost>,
        adjust: impl FnOnce(&mut crate::RuntimeConfig),
    ) -> Arc<Runtime> {
        let mut config = crate::RuntimeConfig {
            root: dir.join("root"),
            state: dir.join("state"),
            default_cgroup_parent: "/petrel-unit".to_string(),
            ..Default::default()
        };
        adjust(&mut config);
        Runtime::with_parts(config, host.parts()).expect("open runtime")
    }

    /// A pod on the host's namespaces (nothing to pin, no network).
    pub async fn pod(&self, name: &str) -> String {
        let config = pod_config(name);
        self.rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .expect("run pod")
            .pod_sandbox_id
    }

    /// A pod of [its own namespaces](isolated_pod_config).
    pub async fn isolated_pod(&self, name: &str) -> Result<String> {
        self.rt
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(isolated_pod_config(name)),
                runtime_handler: String::new(),
            })
            .await
            .map(|r| r.pod_sandbox_id)
    }

    /// Creates a container `name` in `pod`.
    pub async fn create(&self, pod: &str, name: &str) -> Result<String> {
        let sandbox_config = self.rt.sandbox(pod)?.with(|r| r.config.clone());
        self.rt
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: pod.to_string(),
                config: Some(container_config(name)),
                sandbox_config: Some(sandbox_config),
            })
            .await
            .map(|r| r.container_id)
    }

    /// Creates and starts a container.
    pub async fn run(&self, pod: &str, name: &str) -> String {
        let id = self.create(pod, name).await.expect("create");
        self.rt
            .start_container(api::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .expect("start");
        id
    }

    /// The container's state in memory, `None` when it is not there.
    pub fn state(&self, id: &str) -> Option<crate::records::ContainerState> {
        self.rt.state.container(id).map(|c| c.state())
    }

    /// The container's stored record.
    pub fn stored(&self, id: &str) -> Option<crate::records::ContainerRecord> {
        self.rt
            .store
            .get(petrel_store::Table::Containers, id)
            .expect("read store")
    }

    /// Waits until the container's state is `state`, in memory and in the
    /// store.
    pub async fn wait_state(&self, id: &str, state: crate::records::ContainerState) -> bool {
        self.host
            .wait_for(Duration::from_secs(5), |_| {
                self.state(id) == Some(state) && self.stored(id).is_some_and(|r| r.state == state)
            })
            .await
    }
}

/// A pod config on the host's network, IPC and PID namespaces.
pub(crate) fn pod_config(name: &str) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.to_string(),
            uid: format!("uid-{name}"),
            namespace: "unit".to_string(),
            attempt: 0,
        }),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    pid: api::NamespaceMode::Container as i32,
                    ipc: api::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A pod config with network, IPC, UTS and PID namespaces of its own:
/// every kernel step of RunPodSandbox runs (and CNI ADD, once the host
/// [uses a network](FakeHost::use_network)).
pub(crate) fn isolated_pod_config(name: &str) -> api::PodSandboxConfig {
    let mut config = pod_config(name);
    config.hostname = name.to_string();
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.network = api::NamespaceMode::Pod as i32;
        ns.pid = api::NamespaceMode::Pod as i32;
        ns.ipc = api::NamespaceMode::Pod as i32;
    }
    config
}

/// [`isolated_pod_config`] asking for a user namespace of its own (mode
/// POD, container root as host id 100000).
pub(crate) fn userns_pod_config(name: &str) -> api::PodSandboxConfig {
    let mut config = isolated_pod_config(name);
    let map = vec![api::IdMapping {
        container_id: 0,
        host_id: 100_000,
        length: 65536,
    }];
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.userns_options = Some(api::UserNamespace {
            mode: api::NamespaceMode::Pod as i32,
            uids: map.clone(),
            gids: map,
        });
    }
    config
}

/// A container config running the test image.
pub(crate) fn container_config(name: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: IMAGE.to_string(),
            ..Default::default()
        }),
        command: vec!["/bin/true".to_string()],
        ..Default::default()
    }
}

fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}

/// Writes an OCI image-layout archive of one image without layers.
fn write_layerless_image(path: &Path, reference: &str) {
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": { "Cmd": ["/bin/true"] },
        "rootfs": { "type": "layers", "diff_ids": [] },
    })
    .to_string()
    .into_bytes();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": sha256(&config), "size": config.len() },
        "layers": [],
    })
    .to_string()
    .into_bytes();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(&manifest), "size": manifest.len(),
            "annotations": { "org.opencontainers.image.ref.name": reference },
        }],
    })
    .to_string()
    .into_bytes();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).expect("tar entry");
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json", &index);
    for blob in [&config, &manifest] {
        add(&format!("blobs/sha256/{}", &sha256(blob)[7..]), blob);
    }
    let bytes = b.into_inner().expect("finish tar");
    std::fs::write(path, bytes).expect("write image archive");
}
