//! A pure cgroup v2 guest for the tests of Petrel's cgroup v2 code paths:
//! this machine is cgroup v1 hybrid, and a v2 hierarchy with controllers
//! needs a kernel of its own (../shared/ENVIRONMENT.md). [`Vm::boot`]
//! starts QEMU (software emulation, `-accel tcg,thread=single`: KVM is not
//! usable here, and multi-threaded TCG hangs now and then) on the kernel
//! and initramfs `make vm` puts in `build/vm` (`scripts/vm.sh`).
//!
//! The guest sees the host's `/` read-only over virtio-9p with a tmpfs
//! overlay on top, so host-built binaries and `/work/...` paths mean the
//! same in both; its `/tmp`, `/run`, `/dev/shm` are its own tmpfs. The run's
//! work directory ([`Vm::work_dir`]) is shared read-write at the same path
//! on both sides: the only place under `/tmp` both see. cgroup2 is mounted
//! at `/sys/fs/cgroup` with cpu, cpuset, io, memory, pids and hugetlb
//! enabled for its children (the default, [`CgroupMode::V2`]); with
//! [`CgroupMode::V1`] the same kernel boots into this host's v1 hybrid
//! layout instead, so that a bench compares both in one run on one
//! kernel. The guest kernel's modules are at
//! `/lib/modules/<release>` (overlay, veth, bridge, br_netfilter,
//! nf_tables load on demand); only loopback is up.
//!
//! [`Vm::run`] runs one command in the guest through the agent
//! (`petrel-vm-agent`, a binary of this crate that the guest's init starts,
//! speaking [`protocol`] over a virtio-serial port) and returns its exit
//! status and output. Expect the guest to be 8–10× slower than the host.
//! Dropping the [`Vm`] kills QEMU by its pid and removes the run's
//! directory (console log, sockets, work directory); a test process killed
//! hard leaves it to the kit's sweep of stale runs ([`crate::stale`]),
//! which stops a process whose command line names the directory.

pub mod protocol;

use std::collections::BTreeMap;
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::process::{kill_child, kit_tempdir, spawn_logged, tail, write_pid_file};
use crate::test_images::workspace_dir;
use crate::KitError;
use protocol::{LineReader, Read, Request, Response};

/// The variable naming a directory with the kernel and initramfs to boot
/// instead of the workspace's `build/vm`.
pub const VM_DIR_ENV: &str = "PETREL_VM_DIR";

/// The agent binary's name, in the cargo target directory.
pub const AGENT_BIN: &str = "petrel-vm-agent";

/// The component named in errors.
const COMPONENT: &str = "test VM";

/// How the guest is booted.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Where `vmlinux`, `initrd.img` and `modules/` are (`make vm`):
    /// `PETREL_VM_DIR`, else the workspace's `build/vm`.
    pub vm_dir: PathBuf,
    /// The QEMU binary (`qemu-system-x86_64`, looked up in PATH).
    pub qemu: PathBuf,
    /// The agent; `None`: `petrel-vm-agent` in the running executable's
    /// cargo target directory ([`crate::bins::find`]).
    pub agent: Option<PathBuf>,
    /// Guest memory in MiB: its tmpfs root and `/tmp` live in it.
    pub memory_mib: u32,
    /// Guest CPUs (emulated on one host thread).
    pub cpus: u32,
    /// How long the guest may take to answer the first ping: ~4 s on a
    /// quiet host, up to ~17 s at a load of 12.
    pub boot_timeout: Duration,
    /// How long past a command's own timeout (which the agent enforces)
    /// the host waits before it calls the guest hung.
    pub hang_margin: Duration,
    /// The guest's cgroup layout: pure v2 (the default) or this host's
    /// v1 hybrid, for figures that compare the two in one run.
    pub cgroup: CgroupMode,
    /// What runs as the guest's PID 1: the agent under a shell (the
    /// default) or systemd (v2 only).
    pub init: GuestInit,
}

/// The guest's PID 1 (`petrel.init=` on the kernel command line).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GuestInit {
    /// A busybox shell runs the agent and reaps orphans; no service
    /// manager, no system bus.
    #[default]
    Agent,
    /// The host's systemd, booted into a target of the init's own
    /// (`petrel-vm.target`) that starts only the system bus (`dbus.socket`,
    /// `dbus.service`) and the agent as `petrel-vm-agent.service` (root,
    /// `Delegate=yes`): what the agent runs is in a delegated service
    /// cgroup, as a node's kubelet and runtime are, and systemd manages
    /// the cgroup2 tree (slices, scopes). The guest powers off when the
    /// agent ends. Needs [`CgroupMode::V2`].
    Systemd,
}

impl GuestInit {
    /// The value of `petrel.init=` the guest's init reads.
    pub fn name(self) -> &'static str {
        match self {
            GuestInit::Agent => "agent",
            GuestInit::Systemd => "systemd",
        }
    }
}

/// The cgroup layout the guest's init mounts (`petrel.cgroup=` on the
/// kernel command line).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CgroupMode {
    /// Pure cgroup v2: v1 refused by the kernel (`cgroup_no_v1=all`),
    /// cgroup2 at `/sys/fs/cgroup` with its controllers enabled.
    #[default]
    V2,
    /// v1 hybrid, as this host and systemd's "hybrid" distributions: a
    /// tmpfs at `/sys/fs/cgroup` with one v1 hierarchy per controller
    /// (cpu and cpuacct together, net_cls and net_prio together) and a
    /// controller-less cgroup2 at `/sys/fs/cgroup/unified` (where PSI is
    /// accounted per cgroup).
    V1,
}

impl CgroupMode {
    /// The value of `petrel.cgroup=` the guest's init reads.
    pub fn name(self) -> &'static str {
        match self {
            CgroupMode::V2 => "v2",
            CgroupMode::V1 => "v1",
        }
    }
}

impl Default for VmConfig {
    fn default() -> VmConfig {
        VmConfig {
            vm_dir: std::env::var_os(VM_DIR_ENV)
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| workspace_dir().join("build/vm")),
            qemu: PathBuf::from("qemu-system-x86_64"),
            agent: None,
            memory_mib: 2560,
            cpus: 2,
            boot_timeout: Duration::from_secs(90),
            hang_margin: Duration::from_secs(30),
            cgroup: CgroupMode::V2,
            init: GuestInit::Agent,
        }
    }
}

/// How a command in the guest ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// Its exit code, when it exited.
    pub status: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Its stdout (lossy UTF-8).
    pub stdout: String,
    /// Its stderr (lossy UTF-8).
    pub stderr: String,
    /// Whether the agent killed it at its timeout.
    pub timed_out: bool,
    /// Its run time in the guest.
    pub elapsed: Duration,
    /// The round trip as the host saw it (`elapsed` plus the agent's and
    /// the port's overhead).
    pub round_trip: Duration,
}

impl Output {
    /// Whether it exited with 0 in time.
    pub fn success(&self) -> bool {
        self.status == Some(0) && !self.timed_out
    }

    /// How it ended, and its output, for a failure message.
    pub fn describe(&self) -> String {
        let how = match (self.timed_out, self.status, self.signal) {
            (true, _, _) => format!("timed out after {:.1?}", self.elapsed),
            (_, Some(c), _) => format!("exit status {c}"),
            (_, _, Some(s)) => format!("killed by signal {s}"),
            _ => "ended in an unknown way".into(),
        };
        format!(
            "{how}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        )
    }
}

/// A running guest; see the module's documentation.
pub struct Vm {
    qemu: Child,
    work: PathBuf,
    console: PathBuf,
    command: String,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    lines: LineReader,
    next_id: u64,
    broken: Option<String>,
    boot_time: Duration,
    hang_margin: Duration,
    // Last: removed after QEMU is gone (Drop kills it first anyway).
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("pid", &self.qemu.id())
            .field("work", &self.work)
            .field("console", &self.console)
            .finish_non_exhaustive()
    }
}

/// What the guest must find on the host: the kernel, initramfs and
/// modules of `make vm`, QEMU and the agent.
struct Parts {
    vmlinux: PathBuf,
    initrd: PathBuf,
    modules: PathBuf,
    qemu: PathBuf,
    agent: PathBuf,
}

impl Parts {
    fn find(cfg: &VmConfig) -> Result<Parts, KitError> {
        let missing = |component: &str, path: PathBuf, hint: &str| KitError::Missing {
            component: component.into(),
            path,
            hint: hint.into(),
        };
        // Canonical: the guest reaches them by their real path on the
        // host's root, not through build/vm's links.
        let built = |name: &str| {
            let p = cfg.vm_dir.join(name);
            std::fs::canonicalize(&p).map_err(|_| missing("test VM kernel", p, "run `make vm`"))
        };
        let vmlinux = built("vmlinux")?;
        let initrd = built("initrd.img")?;
        let modules = built("modules")?;
        let qemu = find_in_path(&cfg.qemu).ok_or_else(|| {
            missing(
                "qemu-system-x86_64",
                cfg.qemu.clone(),
                "run `make deps` (Debian's qemu-system-x86)",
            )
        })?;
        let agent = match &cfg.agent {
            Some(a) if a.is_file() => a.clone(),
            Some(a) => return Err(missing(AGENT_BIN, a.clone(), "build it")),
            None => crate::bins::find(AGENT_BIN).map_err(|e| match e {
                KitError::Missing { path, .. } => missing(
                    AGENT_BIN,
                    path,
                    "run `cargo build -p petrel-testkit --bin petrel-vm-agent` (make build does)",
                ),
                e => e,
            })?,
        };
        Ok(Parts {
            vmlinux,
            initrd,
            modules,
            qemu,
            agent,
        })
    }
}

/// `prog` if it is a path, else the first executable of that name in PATH.
fn find_in_path(prog: &Path) -> Option<PathBuf> {
    if prog.components().count() > 1 {
        return prog.is_file().then(|| prog.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// `p` as text for QEMU's and the kernel's command lines, which split on
/// commas and spaces: such paths are refused rather than escaped.
fn plain(p: &Path) -> Result<String, KitError> {
    let s = p.to_str().unwrap_or_default();
    if s.is_empty() || s.contains([',', ' ', '\t', '\n']) {
        return Err(KitError::Missing {
            component: "a path without commas or spaces".into(),
            path: p.to_path_buf(),
            hint: "QEMU's options and the kernel's command line cannot carry it; move it".into(),
        });
    }
    Ok(s.to_string())
}

impl Vm {
    /// Boots a guest and waits (up to `cfg.boot_timeout`) for its agent to
    /// answer. Fails naming what is missing (no kernel: run `make vm`), or
    /// with the console's last lines when the guest does not come up.
    pub fn boot(cfg: &VmConfig) -> Result<Vm, KitError> {
        if cfg.init == GuestInit::Systemd && cfg.cgroup != CgroupMode::V2 {
            return Err(KitError::Missing {
                component: "a cgroup v2 guest for systemd".into(),
                path: cfg.vm_dir.clone(),
                hint: "GuestInit::Systemd boots only with CgroupMode::V2".into(),
            });
        }
        let parts = Parts::find(cfg)?;
        let dir = kit_tempdir("petrel-vm.")?;
        let work = dir.path().join("work");
        std::fs::create_dir(&work).map_err(|e| KitError::io("create directory", &work, e))?;
        // The agent runs from the work directory: a target directory under
        // /tmp would be hidden by the guest's own /tmp.
        let agent = work.join(AGENT_BIN);
        std::fs::copy(&parts.agent, &agent).map_err(|e| KitError::io("copy", &parts.agent, e))?;
        let console = dir.path().join("console.log");
        let socket = dir.path().join("agent.sock");
        // v1 needs its controllers left to v1: without `cgroup_no_v1=all`
        // a controller is bound to whichever hierarchy mounts it first, and
        // the init mounts the v1 ones (petrel.cgroup=v1).
        let no_v1 = match cfg.cgroup {
            CgroupMode::V2 => "cgroup_no_v1=all ",
            CgroupMode::V1 => "",
        };
        // systemd reads its own settings from the same command line: the
        // init's target instead of the host's default, and v2 even where
        // the build defaults to hybrid.
        let systemd = match cfg.init {
            GuestInit::Agent => "",
            GuestInit::Systemd => {
                " systemd.unit=petrel-vm.target systemd.unified_cgroup_hierarchy=1 \
                 systemd.show_status=error"
            }
        };
        let append = format!(
            // tsc=reliable: the emulated CPUs' TSCs fail the kernel's sync
            // check, which would leave it on the HPET, slow to read under
            // emulation; QEMU's TSC is one clock for all vCPUs.
            "console=ttyS0 loglevel=4 {no_v1}softlockup_panic=1 panic=-1 \
             tsc=reliable petrel.cgroup={} petrel.init={} petrel.work={} petrel.agent={} \
             petrel.modules={}{systemd}",
            cfg.cgroup.name(),
            cfg.init.name(),
            plain(&work)?,
            plain(&agent)?,
            plain(&parts.modules)?,
        );
        let mut cmd = Command::new(&parts.qemu);
        cmd.args(["-accel", "tcg,thread=single", "-cpu", "max"])
            .args(["-smp", &cfg.cpus.to_string()])
            .args(["-m", &format!("{}M", cfg.memory_mib)])
            .args([
                "-nographic",
                "-nodefaults",
                "-no-reboot",
                "-monitor",
                "none",
            ])
            .arg("-serial")
            .arg(format!("file:{}", plain(&console)?))
            .arg("-kernel")
            .arg(plain(&parts.vmlinux)?)
            .arg("-initrd")
            .arg(plain(&parts.initrd)?)
            .args(["-append", &append])
            .args([
                "-fsdev",
                "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
                "-device",
                "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
                "-fsdev",
            ])
            .arg(format!(
                "local,id=work,path={},security_model=passthrough,multidevs=remap",
                plain(&work)?
            ))
            .args(["-device", "virtio-9p-pci,fsdev=work,mount_tag=work"])
            .args(["-device", "virtio-serial-pci", "-chardev"])
            .arg(format!(
                "socket,id=agent,path={},server=on,wait=off",
                plain(&socket)?
            ))
            .args(["-device", "virtserialport,chardev=agent,name=petrel.agent"]);
        let command = crate::process::describe(&cmd);
        let start = Instant::now();
        let mut qemu = spawn_logged(COMPONENT, &mut cmd, &dir.path().join("qemu.log"))?;
        write_pid_file(dir.path(), "qemu", qemu.id());

        let fail = |qemu: &mut Child, detail: String| {
            kill_child(qemu);
            let report = boot_report(dir.path(), &console);
            eprintln!("testkit: the test VM did not come up: {detail}\n{report}");
            KitError::Start {
                component: COMPONENT.into(),
                command: command.clone(),
                log: console.clone(),
                detail: format!("{detail}\n{report}"),
            }
        };
        let stream = loop {
            match UnixStream::connect(&socket) {
                Ok(s) => break s,
                Err(e) => {
                    if let Ok(Some(st)) = qemu.try_wait() {
                        return Err(fail(&mut qemu, format!("qemu exited at start ({st})")));
                    }
                    if start.elapsed() > cfg.boot_timeout {
                        let detail = format!("no socket {}: {e}", socket.display());
                        return Err(fail(&mut qemu, detail));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        let prepared = stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .and_then(|()| stream.try_clone());
        let writer = match prepared {
            Ok(w) => w,
            Err(e) => return Err(fail(&mut qemu, format!("agent socket: {e}"))),
        };
        let mut vm = Vm {
            qemu,
            work,
            console: console.clone(),
            command: command.clone(),
            reader: BufReader::new(stream),
            writer,
            lines: LineReader::new(),
            next_id: 1,
            broken: None,
            boot_time: Duration::ZERO,
            hang_margin: cfg.hang_margin,
            _dir: dir,
        };
        // The ping waits in the socket until the agent opens its port.
        let deadline = start + cfg.boot_timeout;
        match vm.call(Vec::new(), BTreeMap::new(), None, Duration::ZERO, deadline) {
            Ok(_) => {
                vm.boot_time = start.elapsed();
                Ok(vm)
            }
            Err(e) => {
                let detail = format!(
                    "no answer from the agent (boot timeout {:?}): {e}",
                    cfg.boot_timeout
                );
                kill_child(&mut vm.qemu);
                let report = boot_report(vm._dir.path(), &vm.console);
                eprintln!("testkit: the test VM did not come up: {detail}\n{report}");
                Err(KitError::Start {
                    component: COMPONENT.into(),
                    command: vm.command.clone(),
                    log: vm.console.clone(),
                    detail: format!("{detail}\n{report}"),
                })
            }
        }
    }

    /// Runs `argv` in the guest (working directory `/`) with `env` added to
    /// the agent's environment (PATH of the usual directories, HOME=/root):
    /// killed with what it started after `timeout`, and the guest called
    /// hung if no answer comes [`VmConfig::hang_margin`] later (every later
    /// call then fails at once).
    pub fn run(
        &mut self,
        argv: &[&str],
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Output, KitError> {
        self.run_in(None, argv, env, timeout)
    }

    /// [`Vm::run`] in the working directory `cwd` (a guest path).
    pub fn run_in(
        &mut self,
        cwd: Option<&Path>,
        argv: &[&str],
        env: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Output, KitError> {
        if argv.is_empty() {
            return Err(self.error("no command to run".into()));
        }
        if let Some(why) = &self.broken {
            return Err(self.error(format!("the guest is unusable: {why}")));
        }
        let start = Instant::now();
        let deadline = start + timeout + self.hang_margin;
        let resp = self.call(
            argv.iter().map(|a| a.to_string()).collect(),
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            cwd.map(|c| c.display().to_string()),
            timeout,
            deadline,
        );
        let resp = match resp {
            Ok(r) => r,
            Err(why) => {
                let msg = format!("{}: {why} (waited {:.1?})", argv.join(" "), start.elapsed());
                self.broken = Some(msg.clone());
                return Err(self.error(format!(
                    "{msg}\n--- console (last lines) ---\n{}",
                    tail(&self.console, 40)
                )));
            }
        };
        if let Some(e) = resp.error {
            return Err(self.error(e));
        }
        Ok(Output {
            status: resp.status,
            signal: resp.signal,
            stdout: resp.stdout,
            stderr: resp.stderr,
            timed_out: resp.timed_out,
            elapsed: Duration::try_from_secs_f64(resp.elapsed_s).unwrap_or_default(),
            round_trip: start.elapsed(),
        })
    }

    /// Sends one request and waits until `deadline` for its answer,
    /// skipping answers to abandoned requests. The error says why there is
    /// none (the guest gone, a hang).
    fn call(
        &mut self,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Response, String> {
        let id = self.next_id;
        self.next_id += 1;
        let req = Request {
            id,
            argv,
            env,
            cwd,
            timeout_s: timeout.as_secs_f64(),
        };
        protocol::send(&mut self.writer, &req).map_err(|e| format!("send to the agent: {e}"))?;
        loop {
            match self.lines.next_line(&mut self.reader) {
                Ok(Read::Line(line)) => match protocol::decode::<Response>(&line) {
                    Ok(r) if r.id == id => return Ok(r),
                    Ok(_) => continue,
                    Err(e) => return Err(format!("a bad answer from the agent: {e}")),
                },
                Ok(Read::Timeout) => {
                    if let Ok(Some(st)) = self.qemu.try_wait() {
                        return Err(format!("qemu exited ({st})"));
                    }
                    if Instant::now() > deadline {
                        return Err("no answer by the deadline: the guest hangs".into());
                    }
                }
                Ok(Read::Eof) => return Err(self.gone("qemu closed the agent's socket".into())),
                Err(e) => return Err(self.gone(format!("read from the agent: {e}"))),
            }
        }
    }

    /// Why the agent's socket ended: QEMU's exit, when it is exiting (the
    /// guest powered off), else `what`.
    fn gone(&mut self, what: String) -> String {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(st)) = self.qemu.try_wait() {
                return format!("qemu exited ({st})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        what
    }

    fn error(&self, detail: String) -> KitError {
        KitError::Run {
            component: COMPONENT.into(),
            detail,
            log: self.console.clone(),
        }
    }

    /// The directory shared read-write, at the same path in the guest.
    pub fn work_dir(&self) -> &Path {
        &self.work
    }

    /// The guest's console (kernel messages, the init's and the agent's
    /// complaints); removed with the VM.
    pub fn console_log(&self) -> &Path {
        &self.console
    }

    /// From starting QEMU to the agent's first answer.
    pub fn boot_time(&self) -> Duration {
        self.boot_time
    }

    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.qemu.id()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Nothing in the guest is worth a clean shutdown: its disks are the
        // host's (read-only) and the work directory, written through.
        kill_child(&mut self.qemu);
    }
}

/// The console's and QEMU's own last lines, for a boot failure.
fn boot_report(dir: &Path, console: &Path) -> String {
    format!(
        "--- console (last lines) ---\n{}\n--- qemu ---\n{}",
        tail(console, 60),
        tail(&dir.join("qemu.log"), 20)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn boot_should_say_run_make_vm_when_the_kernel_is_missing() {
        let empty = tempfile::tempdir().unwrap();
        let cfg = VmConfig {
            vm_dir: empty.path().to_path_buf(),
            ..VmConfig::default()
        };
        let err = Vm::boot(&cfg).unwrap_err().to_string();
        assert!(err.contains("make vm"), "{err}");
        assert!(err.contains(&empty.path().display().to_string()), "{err}");
    }

    #[test]
    fn plain_should_refuse_what_a_command_line_would_split() {
        assert_eq!(
            plain(Path::new("/tmp/petrel-vm.x/work")).unwrap(),
            "/tmp/petrel-vm.x/work"
        );
        assert!(plain(Path::new("/tmp/a,b")).is_err());
        assert!(plain(Path::new("/tmp/a b")).is_err());
    }

    #[test]
    fn output_should_describe_how_a_command_ended() {
        let out = Output {
            status: None,
            signal: Some(9),
            stdout: "o".into(),
            stderr: "e".into(),
            timed_out: false,
            elapsed: Duration::from_millis(5),
            round_trip: Duration::from_millis(9),
        };
        assert!(!out.success());
        let d = out.describe();
        assert!(d.starts_with("killed by signal 9"), "{d}");
        assert!(d.contains("--- stdout ---\no") && d.contains("--- stderr ---\ne"));
    }
}
