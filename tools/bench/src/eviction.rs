//! P21-P22: the agent's eviction manager (issue 8).
//!
//! One runtime and one `petrel agent` beside it whose node is a memory
//! cgroup of the bench's (`--node-cgroup`) with a small limit, so the
//! pressure is real and stays inside it. A few Guaranteed pods run all
//! along.
//!
//! - P21: a Burstable pod allocates memory in one step (busybox `dd` with
//!   one block the size of the step, held while `dd` waits on a pipe
//!   nobody reads) past the hard threshold `memory.available`. The
//!   crossing is stamped by the kernel's own threshold notification on
//!   the node cgroup (cgroup v1 `cgroup.event_control`, armed by the
//!   bench before each round at the usage where the signal meets the
//!   threshold); the stop call by the agent's log line written just
//!   before it calls StopContainer. Rounds with notifications (the
//!   default) and then polling only (`--eviction-notifications=false`,
//!   kubelet's 10 s period) in the same run.
//! - P22: the agent's CPU over idle windows with the default settings,
//!   against the same agent with its passes parked (a 1 h period), and
//!   the cost of one pass from a window with a pass every 100 ms.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustix::event::{EventfdFlags, PollFd, PollFlags};
use serde_json::Value;

use crate::agent::{delete_pods, wait_pods_running, SETTLE};
use crate::agent_proc::{AgentProc, Mode, NAMESPACE};
use crate::node::{Clients, Node, BUSYBOX};
use crate::procfs;
use crate::stats::Samples;
use crate::sweep::Work;
use crate::Args;

const MI: i64 = 1 << 20;
/// The node's memory: the node cgroup's limit.
pub const NODE_MEMORY: i64 = 256 * MI;
/// The hard threshold: `memory.available<64Mi`.
pub const THRESHOLD: i64 = 64 * MI;
/// The hog's one step: past the threshold (a working set of 192 MiB)
/// with the other pods' few MiB, short of the limit, so only an eviction
/// ends it, not the OOM killer.
pub const HOG: i64 = 216 * MI;
const _: () = assert!(HOG > NODE_MEMORY - THRESHOLD && HOG < NODE_MEMORY);
/// Guaranteed pods running throughout.
pub const STEADY_PODS: usize = 5;
/// kubelet's housekeeping period: the pass period without notifications.
pub const POLL_PERIOD: Duration = Duration::from_secs(10);
/// The pass period of the per-pass CPU figure.
pub const FAST_PERIOD: Duration = Duration::from_millis(100);
/// Quiet time before a round with notifications.
const GAP: Duration = Duration::from_millis(200);

/// CPU over one idle window.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuWindow {
    /// The window.
    pub wall: Duration,
    /// The agent's CPU (its live threads' schedstat).
    pub agent: Duration,
    /// The runtime's CPU (it answers the manager's ImageFsInfo).
    pub runtime: Duration,
}

impl CpuWindow {
    /// The agent's CPU scaled to `secs` seconds of wall time.
    pub fn agent_per(&self, secs: f64) -> Duration {
        if self.wall.is_zero() {
            return Duration::ZERO;
        }
        self.agent.mul_f64(secs / self.wall.as_secs_f64())
    }
}

/// What the section measured.
#[derive(Debug, Default)]
pub struct EvictionResults {
    /// Why the section stopped early.
    pub error: Option<String>,
    /// P21 with notifications: crossing → the stop call.
    pub notified: Samples,
    /// P21 with notifications: crossing → the eviction decision.
    pub notified_decision: Samples,
    /// P21 polling only: crossing → the stop call.
    pub polled: Samples,
    /// P21 polling only: crossing → the eviction decision.
    pub polled_decision: Samples,
    /// P21: the node cgroup's highest usage in any round, bytes (the
    /// hog's step and the other pods: it stayed short of the limit).
    pub hog_peak: Option<i64>,
    /// P21: rounds whose crossing was stamped by a watcher at SCHED_FIFO.
    pub realtime_stamps: usize,
    /// P21: rounds whose stop call was logged before the bench's stamp of
    /// the crossing (counted as 0).
    pub early_stops: usize,
    /// P22: default settings (a pass every 10 s, notifications).
    pub idle: Option<CpuWindow>,
    /// P22 reference: passes parked (a 1 h period).
    pub parked: Option<CpuWindow>,
    /// P22: a pass every 100 ms.
    pub fast: Option<CpuWindow>,
}

impl EvictionResults {
    fn count(&mut self, r: &Round) {
        self.hog_peak = self.hog_peak.max(Some(r.peak));
        self.realtime_stamps += usize::from(r.realtime);
        self.early_stops += usize::from(r.early);
    }

    /// P22: the CPU of one pass, from the 100 ms window against the parked
    /// one (both scaled to their walls); None when not measured.
    pub fn per_pass(&self) -> Option<Duration> {
        let (fast, parked) = (self.fast?, self.parked?);
        let secs = fast.wall.as_secs_f64();
        let extra = fast.agent.saturating_sub(parked.agent_per(secs));
        let passes = passes_in(fast.wall, FAST_PERIOD);
        (passes > 0.0).then(|| extra.div_f64(passes))
    }
}

/// About how many passes a period runs in `wall` (each pass's own time
/// is ignored: an upper bound).
pub fn passes_in(wall: Duration, period: Duration) -> f64 {
    if period.is_zero() {
        return 0.0;
    }
    wall.as_secs_f64() / period.as_secs_f64()
}

/// Measures P21-P22; failures end up in `error`.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> EvictionResults {
    let mut res = EvictionResults::default();
    if let Err(e) = measure_into(args, work, &mut res, progress).await {
        progress(&format!("eviction section failed: {e:#}"));
        res.error = Some(format!("{e:#}"));
    }
    res
}

/// The v1 memory cgroup directory of `path`.
fn memory_dir(path: &str) -> PathBuf {
    PathBuf::from("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'))
}

/// The node's memory cgroup and the names of its files, which differ
/// between cgroup v1 and v2 (the test VM's guests: P39).
#[derive(Debug, Clone)]
pub struct NodeMemcg {
    /// Its directory.
    pub dir: PathBuf,
    /// Whether it is in a cgroup v2 hierarchy.
    pub v2: bool,
}

impl NodeMemcg {
    fn usage(&self) -> PathBuf {
        self.dir.join(if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        })
    }

    fn limit(&self) -> PathBuf {
        self.dir.join(if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        })
    }

    fn peak(&self) -> PathBuf {
        self.dir.join(if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        })
    }
}

async fn measure_into(
    args: &Args,
    work: &Work,
    res: &mut EvictionResults,
    progress: &dyn Fn(&str),
) -> Result<()> {
    ensure!(
        Path::new("/sys/fs/cgroup/memory/cgroup.event_control").exists(),
        "the crossing is stamped by a cgroup v1 memory threshold notification; this machine has no v1 memory controller"
    );
    let dir = work.dir.join("eviction");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let cgroup = format!("{}/eviction", work.cgroup_parent);
    let node_cgroup = format!("{cgroup}/node");
    let node_dir = memory_dir(&node_cgroup);
    std::fs::create_dir_all(&node_dir).with_context(|| format!("create {}", node_dir.display()))?;
    let memcg = NodeMemcg {
        dir: node_dir.clone(),
        v2: false,
    };
    std::fs::write(
        node_dir.join("memory.limit_in_bytes"),
        NODE_MEMORY.to_string(),
    )
    .with_context(|| format!("limit {}", node_dir.display()))?;

    progress("eviction: starting a runtime and an agent on a 256 MiB node cgroup");
    let mut node = Node::start(
        &args.petrel,
        args.shim.as_deref(),
        &format!("{cgroup}/direct"),
    )?;
    let mut c = node.connect().await?;
    c.import(&args.image).await?;
    let node_name = format!("bench-evict-{}", work.id());
    let mut agent = AgentProc::new(
        &args.petrel,
        &node.endpoint(),
        &dir,
        &node_name,
        &format!("{cgroup}/agent"),
    )?;
    agent.eviction_hard = format!("memory.available<{}Mi", THRESHOLD / MI);
    let base = vec!["--node-cgroup".to_string(), node_cgroup.clone()];
    let out = async {
        agent.extra_args = base.clone();
        agent.start(Mode::Events).await?;
        let steady: Vec<String> = (0..STEADY_PODS).map(|i| format!("steady-{i}")).collect();
        for n in &steady {
            agent.write_manifest(n, &steady_manifest(n))?;
        }
        wait_pods_running(&agent, &steady, 1, Duration::from_secs(120)).await?;
        let mut rng = StdRng::from_entropy();

        progress(&format!(
            "P21 with notifications: {} rounds",
            args.eviction_rounds
        ));
        for i in 0..args.eviction_rounds {
            let r = round(&mut c, &agent, &memcg, &format!("hog-n{i:02}"), GAP).await?;
            res.notified.push(r.stop);
            res.notified_decision.push(r.decision);
            res.count(&r);
        }

        agent.extra_args = [base.clone(), vec!["--eviction-notifications=false".into()]].concat();
        agent.restart(Mode::Events).await?;
        wait_pods_running(&agent, &steady, 1, Duration::from_secs(60)).await?;
        progress(&format!(
            "P21 polling only: {} rounds",
            args.eviction_polling_rounds
        ));
        for i in 0..args.eviction_polling_rounds {
            // The crossing falls at a random phase of the pass period.
            let gap = Duration::from_micros(rng.gen_range(0..POLL_PERIOD.as_micros() as u64));
            let r = round(&mut c, &agent, &memcg, &format!("hog-p{i:02}"), gap).await?;
            res.polled.push(r.stop);
            res.polled_decision.push(r.decision);
            res.count(&r);
        }

        let windows = [
            (vec![], args.eviction_idle_seconds, "default settings"),
            (
                vec!["--eviction-monitoring-interval=1h".to_string()],
                args.eviction_idle_seconds,
                "passes parked (1 h period)",
            ),
            (
                vec![format!(
                    "--eviction-monitoring-interval={}ms",
                    FAST_PERIOD.as_millis()
                )],
                args.eviction_pass_seconds,
                "a pass every 100 ms",
            ),
        ];
        for (i, (flags, secs, what)) in windows.into_iter().enumerate() {
            agent.extra_args = [base.clone(), flags].concat();
            agent.restart(Mode::Events).await?;
            wait_pods_running(&agent, &steady, 1, Duration::from_secs(60)).await?;
            tokio::time::sleep(SETTLE).await;
            progress(&format!("P22 agent CPU over {secs} s, {what}"));
            let w = cpu_window(&node, &agent, secs).await?;
            match i {
                0 => res.idle = Some(w),
                1 => res.parked = Some(w),
                _ => res.fast = Some(w),
            }
        }
        // Only the hogs were evicted.
        let pods = agent.pods().await?;
        for n in &steady {
            let p = pods
                .iter()
                .find(|p| p.pointer("/metadata/name").and_then(Value::as_str) == Some(n))
                .with_context(|| format!("pod {n} is gone"))?;
            ensure!(
                crate::agent_proc::all_running(p, 1),
                "pod {n} is not running: {}",
                p.get("status").cloned().unwrap_or(Value::Null)
            );
        }
        Ok(())
    }
    .await;
    agent.stop();
    drop(c);
    node.shutdown();
    out
}

/// P39: [`round`]s with notifications in one test VM guest, on the
/// cgroup version it runs (what P21 does on the host, without the
/// polling rounds and P22).
#[derive(Debug, Default)]
pub struct GuestReaction {
    /// Crossing → the stop call.
    pub stop: Samples,
    /// Crossing → the eviction decision.
    pub decision: Samples,
    /// v2: each round's stamp uncertainty ([`Round::window`]).
    pub windows: Samples,
    /// Rounds whose stop call was logged before the bench's stamp.
    pub early_stops: usize,
    /// Rounds whose crossing was stamped by a watcher at SCHED_FIFO.
    pub realtime_stamps: usize,
    /// The node cgroup's highest usage, bytes.
    pub hog_peak: Option<i64>,
}

/// Measures P39 in this guest into `res` (kept when a round fails).
pub async fn guest_reaction(
    args: &Args,
    work: &Work,
    rounds: usize,
    res: &mut GuestReaction,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let dir = work.dir.join("eviction");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let cgroup = format!("{}/eviction", work.cgroup_parent);
    let node_cgroup = format!("{cgroup}/node");
    // On v2 a child has the memory files only when every parent enables
    // the controller for its children: the kit's helper does that.
    use petrel_testkit::node::Node as KitNode;
    let node_dir = KitNode::make_cgroup("memory", &node_cgroup)
        .with_context(|| format!("create the node cgroup {node_cgroup}"))?;
    let memcg = NodeMemcg { dir: node_dir, v2 };
    std::fs::write(memcg.limit(), NODE_MEMORY.to_string())
        .with_context(|| format!("limit {}", memcg.dir.display()))?;

    progress("P39: a runtime and an agent on a 256 MiB node cgroup");
    let mut node = Node::start(
        &args.petrel,
        args.shim.as_deref(),
        &format!("{cgroup}/direct"),
    )?;
    let mut c = node.connect().await?;
    c.import(&args.image).await?;
    let mut agent = AgentProc::new(
        &args.petrel,
        &node.endpoint(),
        &dir,
        &format!("bench-vm-{}", work.id()),
        &format!("{cgroup}/agent"),
    )?;
    agent.eviction_hard = format!("memory.available<{}Mi", THRESHOLD / MI);
    agent.extra_args = vec!["--node-cgroup".to_string(), node_cgroup.clone()];
    let out = async {
        agent.start(Mode::Events).await?;
        let steady: Vec<String> = (0..STEADY_PODS).map(|i| format!("steady-{i}")).collect();
        for n in &steady {
            agent.write_manifest(n, &steady_manifest(n))?;
        }
        wait_pods_running(&agent, &steady, 1, Duration::from_secs(600)).await?;
        for i in 0..rounds {
            progress(&format!("P39 round {}/{rounds}", i + 1));
            let r = round(&mut c, &agent, &memcg, &format!("hog-v{i:02}"), GAP).await?;
            res.stop.push(r.stop);
            res.decision.push(r.decision);
            if let Some(w) = r.window {
                res.windows.push(w);
            }
            res.early_stops += usize::from(r.early);
            res.realtime_stamps += usize::from(r.realtime);
            res.hog_peak = res.hog_peak.max(Some(r.peak));
        }
        Ok(())
    }
    .await;
    agent.stop();
    drop(c);
    node.shutdown();
    out
}

/// One round's figures.
pub(crate) struct Round {
    /// Crossing → the stop call.
    pub stop: Duration,
    /// Crossing → the eviction decision.
    pub decision: Duration,
    /// The stop call was logged before the bench's stamp.
    pub early: bool,
    /// The crossing was stamped at SCHED_FIFO.
    pub realtime: bool,
    /// The node cgroup's peak usage in the round (v2: since the cgroup
    /// was made; 6.1's `memory.peak` cannot be reset).
    pub peak: i64,
    /// v2: the stamp's uncertainty, from the last read of
    /// `memory.current` below the crossing to the first above it.
    pub window: Option<Duration>,
}

/// One hog: the crossing armed, the hog's manifest written after `gap`,
/// its eviction awaited and read from the agent's log, the hog deleted.
pub(crate) async fn round(
    c: &mut Clients,
    agent: &AgentProc,
    node: &NodeMemcg,
    name: &str,
    gap: Duration,
) -> Result<Round> {
    let at = wait_quiet(node).await?;
    reset_peak(node);
    let mut crossing = if node.v2 {
        Crossing::poll(&node.usage(), at)?
    } else {
        Crossing::arm(&node.dir, at)?
    };
    tokio::time::sleep(gap).await;
    agent.write_manifest(name, &hog_manifest(name))?;
    let crossed = crossing
        .wait(Duration::from_secs(60))
        .await
        .with_context(|| {
            format!(
                "no crossing of {} MiB by pod {name}:\n{}",
                at / MI,
                agent.log_tail()
            )
        })?;
    let realtime = crossing.realtime;
    let window = crossing.window();
    drop(crossing);
    let pod = wait_evicted(agent, name, Duration::from_secs(60)).await?;
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .with_context(|| format!("pod {name}: no uid"))?
        .to_string();
    let (decided, stopped) = eviction_stamps(agent, &uid).await?;
    let peak = read_i64(&node.peak()).unwrap_or(0);
    delete_pods(c, agent, &[name.to_string()], Duration::from_secs(60)).await?;
    let since = |t: i64| ns_duration(t - crossed);
    Ok(Round {
        stop: since(stopped),
        decision: since(decided),
        early: stopped < crossed,
        realtime,
        peak,
        window,
    })
}

/// A duration from nanoseconds, zero when negative.
fn ns_duration(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

fn read_i64(p: &Path) -> Option<i64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// The inactive file pages of a memory cgroup and its descendants from
/// its `memory.stat`: v1's `total_inactive_file`, v2's `inactive_file`
/// (hierarchical there).
fn inactive_file(stat: &str, v2: bool) -> Option<i64> {
    let key = if v2 {
        "inactive_file "
    } else {
        "total_inactive_file "
    };
    stat.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

/// The usage at which the node's memory.available falls below the
/// threshold, as the agent computes it: capacity − threshold + inactive
/// file pages (the working set is usage − inactive file).
pub fn crossing_usage(capacity: i64, threshold: i64, inactive: i64) -> i64 {
    capacity - threshold + inactive.max(0)
}

/// Waits until the node's usage is well below the crossing (the last
/// hog's memory freed); returns the crossing's usage.
async fn wait_quiet(node: &NodeMemcg) -> Result<i64> {
    let t0 = Instant::now();
    loop {
        let usage = read_i64(&node.usage());
        let limit = read_i64(&node.limit());
        let stat = std::fs::read_to_string(node.dir.join("memory.stat")).unwrap_or_default();
        if let (Some(usage), Some(limit), Some(inactive)) =
            (usage, limit, inactive_file(&stat, node.v2))
        {
            let at = crossing_usage(limit, THRESHOLD, inactive);
            if usage < at - HOG / 2 {
                return Ok(at);
            }
            if t0.elapsed() > Duration::from_secs(30) {
                bail!(
                    "the node's memory usage stays at {} MiB (crossing at {} MiB)",
                    usage / MI,
                    at / MI
                );
            }
        } else if t0.elapsed() > Duration::from_secs(30) {
            bail!(
                "cannot read the node's memory cgroup {}",
                node.dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn reset_peak(node: &NodeMemcg) {
    // Writing 0 resets the v1 peak; a failure leaves the previous peak.
    // (6.1's v2 `memory.peak` has no reset: it stays the run's peak.)
    if !node.v2 {
        let _ = std::fs::write(node.peak(), "0");
    }
}

/// Waits until pod `name` is Failed with reason Evicted at `/pods`.
async fn wait_evicted(agent: &AgentProc, name: &str, timeout: Duration) -> Result<Value> {
    let path = format!("/pods/{NAMESPACE}/{name}");
    let t0 = Instant::now();
    let mut last = Value::Null;
    while t0.elapsed() < timeout {
        if let Ok(r) = crate::http::get(agent.api(), &path, Duration::from_secs(10)).await {
            if r.status == 200 {
                if let Ok(p) = serde_json::from_slice::<Value>(&r.body) {
                    let phase = p.pointer("/status/phase").and_then(Value::as_str);
                    let reason = p.pointer("/status/reason").and_then(Value::as_str);
                    if phase == Some("Failed") && reason == Some("Evicted") {
                        return Ok(p);
                    }
                    last = p;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!(
        "pod {name} not evicted within {timeout:?}; last seen {}:\n{}",
        last.get("status").cloned().unwrap_or(Value::Null),
        agent.log_tail()
    )
}

/// When the agent decided to evict pod `uid` and when it called
/// StopContainer for it, from its log (nanoseconds since the epoch).
async fn eviction_stamps(agent: &AgentProc, uid: &str) -> Result<(i64, i64)> {
    let t0 = Instant::now();
    loop {
        let log = agent.log_text();
        if let (Some(d), Some(s)) = (decision_stamp(&log, uid), stop_stamp(&log, uid)) {
            return Ok((d, s));
        }
        if t0.elapsed() > Duration::from_secs(10) {
            bail!(
                "no \"evicting pod\" and \"stopping container\" lines for pod {uid} in the agent's log:\n{}",
                agent.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether a log line has field `name` with `value` (plain or quoted).
fn has_field(line: &str, name: &str, value: &str) -> bool {
    line.contains(&format!(" {name}={value}")) || line.contains(&format!(" {name}=\"{value}\""))
}

/// The first line's stamp among those with `message` and `uid`.
fn stamp_of(log: &str, message: &str, uid: &str, also: &str) -> Option<i64> {
    log.lines()
        .find(|l| l.contains(message) && has_field(l, "uid", uid) && l.contains(also))
        .and_then(|l| rfc3339_ns(l.split_whitespace().next()?))
}

/// The agent's "evicting pod" line of pod `uid`.
pub fn decision_stamp(log: &str, uid: &str) -> Option<i64> {
    stamp_of(log, "evicting pod", uid, "")
}

/// The agent's "stopping container" line of pod `uid`, written just
/// before its StopContainer call for the eviction.
pub fn stop_stamp(log: &str, uid: &str) -> Option<i64> {
    stamp_of(log, "stopping container", uid, "pod evicted")
}

/// Nanoseconds since the epoch of an RFC 3339 UTC time as the agent's
/// log writes it: `2026-11-22T22:04:22.123456Z` (any fraction digits).
pub fn rfc3339_ns(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let (h, mi, sec): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let nanos: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().ok()?
    };
    // Days from 1970-01-01 of a proleptic Gregorian date (eras of 400
    // years, March-based years so the leap day ends a year).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi) * 60 * 1_000_000_000 + sec * 1_000_000_000 + nanos)
}

/// Nanoseconds since the epoch, now.
fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The kernel's notice of a memory cgroup's usage crossing a value: a v1
/// threshold on `memory.usage_in_bytes` through `cgroup.event_control`,
/// and a thread blocked in poll(2) on its eventfd that stamps the first
/// crossing with the wall clock (which the agent's log also uses).
///
/// On cgroup v2 there is no usage threshold to register ([`Crossing::poll`]).
struct Crossing {
    rx: Option<tokio::sync::oneshot::Receiver<(i64, Option<Duration>)>>,
    stop: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Whether the watcher runs at SCHED_FIFO.
    realtime: bool,
    /// [`Crossing::poll`]: the stamp's uncertainty (see [`Round::window`]).
    window: Option<Duration>,
    // Open as long as the registration.
    _usage: File,
}

impl Crossing {
    fn arm(dir: &Path, bytes: i64) -> Result<Crossing> {
        let usage_path = dir.join("memory.usage_in_bytes");
        let usage =
            File::open(&usage_path).with_context(|| format!("open {}", usage_path.display()))?;
        let efd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC).context("eventfd")?;
        let control = dir.join("cgroup.event_control");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&control)
            .and_then(|mut f| {
                f.write_all(format!("{} {} {bytes}", efd.as_raw_fd(), usage.as_raw_fd()).as_bytes())
            })
            .with_context(|| format!("write {}", control.display()))?;
        let stop = rustix::event::eventfd(0, EventfdFlags::CLOEXEC).context("eventfd")?;
        let stop_wait = stop.try_clone().context("dup eventfd")?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("bench-crossing".into())
            .spawn(move || {
                let _ = tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get());
                loop {
                    let mut fds = [
                        PollFd::new(&efd, PollFlags::IN),
                        PollFd::new(&stop_wait, PollFlags::IN),
                    ];
                    match rustix::event::poll(&mut fds, None) {
                        Ok(_) => {}
                        Err(rustix::io::Errno::INTR) => continue,
                        Err(_) => return,
                    }
                    let at = now_ns();
                    if !fds[0].revents().is_empty() {
                        let _ = tx.send((at, None));
                    }
                    return;
                }
            })
            .context("spawn the crossing watcher")?;
        // The kernel wakes every waiter of the threshold together; at
        // SCHED_FIFO the watcher runs at once (before the hog and the
        // agent, on a busy 2-core machine), so its stamp is the crossing's
        // to within its wake-up.
        let realtime = make_realtime(&tid_rx);
        Ok(Crossing {
            rx: Some(rx),
            stop,
            thread: Some(thread),
            realtime,
            window: None,
            _usage: usage,
        })
    }

    /// cgroup v2, which has no usage threshold: a thread at SCHED_FIFO
    /// reads `usage` (`memory.current`) every [`POLL_USAGE`] until it
    /// reaches `bytes`. The stamp is the start of the last read that was
    /// still below: the crossing came after it, so the reaction measured
    /// from it is an upper bound, too long by at most the window to the
    /// first read above ([`Crossing::window`]).
    fn poll(usage: &Path, bytes: i64) -> Result<Crossing> {
        let file = File::open(usage).with_context(|| format!("open {}", usage.display()))?;
        let fd = file.try_clone().context("dup memory.current")?;
        let stop = rustix::event::eventfd(0, EventfdFlags::CLOEXEC).context("eventfd")?;
        let stop_wait = stop.try_clone().context("dup eventfd")?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let path = usage.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("bench-usage-poll".into())
            .spawn(move || {
                let _ = tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get());
                let period = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: POLL_USAGE.as_nanos() as _,
                };
                let mut below: Option<i64> = None;
                let mut buf = [0u8; 32];
                loop {
                    let started = now_ns();
                    let value = rustix::io::pread(&fd, &mut buf, 0).ok().and_then(|n| {
                        std::str::from_utf8(&buf[..n])
                            .ok()?
                            .trim()
                            .parse::<i64>()
                            .ok()
                    });
                    match value {
                        Some(v) if v >= bytes => {
                            // Above at the first read: no stamp to give.
                            if let Some(b) = below {
                                let _ = tx.send((b, Some(ns_duration(started - b))));
                            }
                            return;
                        }
                        Some(_) => below = Some(started),
                        None => {
                            eprintln!("petrel-bench: cannot read {}", path.display());
                            return;
                        }
                    }
                    let mut fds = [PollFd::new(&stop_wait, PollFlags::IN)];
                    match rustix::event::poll(&mut fds, Some(&period)) {
                        Ok(0) | Err(rustix::io::Errno::INTR) => {}
                        _ => return,
                    }
                }
            })
            .context("spawn the usage poller")?;
        // At SCHED_FIFO its reads keep their period while the hog and the
        // agent keep the (emulated) CPUs busy.
        let realtime = make_realtime(&tid_rx);
        Ok(Crossing {
            rx: Some(rx),
            stop,
            thread: Some(thread),
            realtime,
            window: None,
            _usage: file,
        })
    }

    /// [`Crossing::poll`]'s uncertainty of the last crossing waited for.
    fn window(&self) -> Option<Duration> {
        self.window
    }

    /// The wall-clock nanoseconds of the first crossing.
    async fn wait(&mut self, timeout: Duration) -> Result<i64> {
        let rx = self.rx.take().context("waited twice")?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok((at, window))) => {
                self.window = window;
                Ok(at)
            }
            Ok(Err(_)) => bail!("the crossing watcher ended"),
            Err(_) => bail!("no crossing within {timeout:?}"),
        }
    }
}

/// How often [`Crossing::poll`] reads `memory.current`.
pub const POLL_USAGE: Duration = Duration::from_millis(1);

/// Raises the thread whose id comes on `tid` to SCHED_FIFO 50; whether it
/// worked. rustix has no sched_setscheduler and the workspace has no
/// unsafe code: chrt(1) sets it by thread id.
fn make_realtime(tid: &std::sync::mpsc::Receiver<i32>) -> bool {
    let Ok(tid) = tid.recv_timeout(Duration::from_secs(5)) else {
        return false;
    };
    std::process::Command::new("chrt")
        .args(["--fifo", "--pid", "50", &tid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for Crossing {
    fn drop(&mut self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A Guaranteed pod running `sleep`.
pub fn steady_manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"86400\"]\n    resources:\n      requests: {{cpu: 10m, memory: 16Mi}}\n      limits: {{cpu: 10m, memory: 16Mi}}\n"
    )
}

/// A Burstable pod (admitted under memory pressure, as a BestEffort one
/// would not be) that allocates [`HOG`] bytes in one step: `dd` reads one
/// block of that size from /dev/zero, touching every page, and holds it
/// while it blocks writing to a pipe `sleep` never reads. It waits 1 s
/// first, so that the agent knows the pod as running when the node
/// crosses the threshold (as it would a pod that grows); a pod not yet
/// in the agent's cache cannot be a candidate, and the crossing would
/// be acted on only at the next periodic pass. Its shell ends at
/// SIGTERM, so the eviction's grace period is not waited out.
pub fn hog_manifest(name: &str) -> String {
    let script = format!(
        "trap 'exit 0' TERM; sleep 1; dd if=/dev/zero bs={HOG} count=1 2>/dev/null | sleep 86400 & wait"
    );
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 0\n  containers:\n  - name: hog\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n    resources:\n      requests: {{memory: 1Mi}}\n"
    )
}

/// The agent's and the runtime's CPU over `secs` of idleness.
async fn cpu_window(node: &Node, agent: &AgentProc, secs: u64) -> Result<CpuWindow> {
    let (rt, ag) = (node.pid(), agent.pid());
    let (r0, a0) = (procfs::cpu(rt)?, procfs::cpu(ag)?);
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let wall = t.elapsed();
    let (r1, a1) = (procfs::cpu(rt)?, procfs::cpu(ag)?);
    Ok(CpuWindow {
        wall,
        agent: Duration::from_nanos(a1.since(a0).sched_ns),
        runtime: Duration::from_nanos(r1.since(r0).sched_ns),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_ns_should_count_from_the_epoch() {
        assert_eq!(rfc3339_ns("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_ns("1970-01-02T00:00:01.5Z"),
            Some(86_401_500_000_000)
        );
        // date -u -d 2026-11-22T22:04:22Z +%s → 1795385062.
        assert_eq!(
            rfc3339_ns("2026-11-22T22:04:22.123456Z"),
            Some(1_795_385_062_123_456_000)
        );
        // A leap day: 2024-02-29 is 19782 days after the epoch.
        assert_eq!(
            rfc3339_ns("2024-02-29T00:00:00.000000001Z"),
            Some(19_782 * 86_400 * 1_000_000_000 + 1)
        );
        assert_eq!(rfc3339_ns("2026-11-22T22:04:22"), None);
        assert_eq!(rfc3339_ns("2026-13-22T22:04:22Z"), None);
        assert_eq!(rfc3339_ns("INFO"), None);
    }

    #[test]
    fn stamps_should_come_from_the_lines_of_the_pod() {
        let log = concat!(
            "2026-11-22T22:00:00.000001Z  WARN evicting pod uid=other pod=bench/x signal=memory.available\n",
            "2026-11-22T22:00:00.000100Z  WARN evicting pod uid=u1 pod=bench/hog signal=memory.available grace=1\n",
            "2026-11-22T22:00:00.000200Z  INFO stopping container uid=\"u1\" container=hog id=c1 grace=1 reason=\"pod terminating\"\n",
            "2026-11-22T22:00:00.000300Z  INFO stopping container uid=\"u1\" container=hog id=c1 grace=1 reason=\"pod evicted\"\n",
        );
        let base = rfc3339_ns("2026-11-22T22:00:00Z").unwrap_or_default();
        assert_eq!(decision_stamp(log, "u1"), Some(base + 100_000));
        assert_eq!(stop_stamp(log, "u1"), Some(base + 300_000));
        assert_eq!(stop_stamp(log, "u2"), None);
        // "uid=u1" must not match a uid that merely ends in it.
        assert_eq!(decision_stamp(log, "1"), None);
    }

    #[test]
    fn crossing_should_be_where_the_working_set_meets_the_threshold() {
        // 256 MiB, 64 MiB threshold, 3 MiB of inactive file pages.
        assert_eq!(
            crossing_usage(NODE_MEMORY, THRESHOLD, 3 * MI),
            NODE_MEMORY - THRESHOLD + 3 * MI
        );
        let stat = "cache 10\ninactive_file 5\ntotal_inactive_file 4096\n";
        assert_eq!(inactive_file(stat, false), Some(4096));
        assert_eq!(inactive_file(stat, true), Some(5));
    }

    #[test]
    fn per_pass_should_subtract_the_parked_rate() {
        let w = |secs: u64, ms: u64| CpuWindow {
            wall: Duration::from_secs(secs),
            agent: Duration::from_millis(ms),
            runtime: Duration::ZERO,
        };
        let r = EvictionResults {
            parked: Some(w(60, 30)),
            // 200 passes in 20 s; the parked rate is 10 ms per 20 s.
            fast: Some(w(20, 110)),
            ..Default::default()
        };
        assert_eq!(r.per_pass(), Some(Duration::from_micros(500)));
        assert_eq!(EvictionResults::default().per_pass(), None);
    }

    #[test]
    fn manifests_should_be_guaranteed_and_burstable() {
        let s = steady_manifest("steady-0");
        assert!(s.contains("limits: {cpu: 10m, memory: 16Mi}"));
        let h = hog_manifest("hog-n00");
        assert!(h.contains(&format!("bs={HOG} count=1")));
        assert!(h.contains("requests: {memory: 1Mi}") && !h.contains("limits"));
    }
}
