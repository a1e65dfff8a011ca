//! P38-P39: Petrel's cgroup v2 paths against its v1 paths, in the test VM
//! (issue 33; `petrel_testkit::vm`, `make vm`).
//!
//! This machine is cgroup v1 hybrid, so v2 needs a kernel of its own: the
//! host side boots two guests of the same kernel one after the other, a
//! pure v2 one and a v1 hybrid one laid out as this host, and runs this
//! same release binary in each (`--only vm-guest`: the guest sees the
//! host's root, so the shipped `petrel`, `petrel-shim`, runc and the
//! image are the host's files). The guest part writes its figures as
//! JSON into the VM's shared work directory, where the host reads them.
//! QEMU emulates the guests (TCG, 8-10× slower than the host), so only
//! ratios taken inside one guest mean anything:
//!
//! - P38: pod up (RunPodSandbox + CreateContainer + StartContainer) and
//!   down against raw runc in the same guest, P1's method with fewer pods;
//!   the ratio on v2 against the ratio on v1.
//! - P39: P21's eviction reaction in each guest (notifications on; the
//!   crossing stamped by the kernel's threshold eventfd on v1, by a
//!   1 ms read of `memory.current` on v2, which has no threshold).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use petrel_testkit::vm::{CgroupMode, Vm, VmConfig};
use serde_json::{json, Value};

use crate::eviction::{guest_reaction, GuestReaction};
use crate::node::Node;
use crate::raw::RawRunc;
use crate::report::Lifecycle;
use crate::stats::Samples;
use crate::sweep::Work;
use crate::{machine, petrel_down, petrel_up, raw_down, raw_up, Args};

/// How long one guest's part may take (TCG: minutes where the host takes
/// seconds).
const GUEST_TIMEOUT: Duration = Duration::from_secs(2400);

/// One direction of P38 in one guest.
#[derive(Debug, Default, Clone)]
pub struct Direction {
    /// Petrel, the whole direction.
    pub petrel: Samples,
    /// Raw runc, the whole direction.
    pub raw: Samples,
    /// Petrel per CRI call, in call order.
    pub steps: Vec<(String, Samples)>,
}

/// What one guest measured.
#[derive(Debug, Default)]
pub struct GuestRun {
    /// `v2` or `v1`.
    pub cgroup: String,
    /// QEMU start → the guest agent's first answer.
    pub boot: Option<Duration>,
    /// The guest's `uname -r`.
    pub kernel: String,
    /// The host's load average before and after the guest's part.
    pub host_load: (String, String),
    /// The guest's load average before and after its part.
    pub guest_load: (String, String),
    /// P38 up.
    pub up: Direction,
    /// P38 down.
    pub down: Direction,
    /// P39.
    pub reaction: GuestReaction,
    /// Why the guest's part stopped early (what it measured is kept).
    pub error: Option<String>,
}

/// What the section measured.
#[derive(Debug, Default)]
pub struct VmResults {
    /// Pods per guest (P38).
    pub pods: usize,
    /// Eviction rounds per guest (P39).
    pub rounds: usize,
    /// The v2 guest's run, then the v1 guest's.
    pub runs: Vec<GuestRun>,
    /// Why the section did not run at all.
    pub error: Option<String>,
}

impl VmResults {
    /// The run of guest `cgroup` (`v2`, `v1`).
    pub fn run(&self, cgroup: &str) -> Option<&GuestRun> {
        self.runs.iter().find(|r| r.cgroup == cgroup)
    }
}

/// Measures P38-P39 (host side): each guest booted, measured and
/// stopped in turn; failures end up in the results.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> VmResults {
    let mut res = VmResults {
        pods: args.vm_pods,
        rounds: args.vm_eviction_rounds,
        ..Default::default()
    };
    let bench = match std::env::current_exe() {
        Ok(b) => b,
        Err(e) => {
            res.error = Some(format!("the bench's own path: {e}"));
            return res;
        }
    };
    for mode in [CgroupMode::V2, CgroupMode::V1] {
        progress(&format!("vm: booting the cgroup {} guest", mode.name()));
        // The guest blocks this thread for minutes: off the runtime's
        // workers, as any blocking call.
        let run = tokio::task::block_in_place(|| guest_run(args, work, &bench, mode, progress));
        if let Some(e) = &run.error {
            progress(&format!("vm: the {} guest: {e}", mode.name()));
        }
        res.runs.push(run);
    }
    res
}

/// Boots one guest, runs the guest part in it and reads its figures.
fn guest_run(
    args: &Args,
    work: &Work,
    bench: &Path,
    mode: CgroupMode,
    progress: &dyn Fn(&str),
) -> GuestRun {
    let mut run = GuestRun {
        cgroup: mode.name().to_string(),
        ..Default::default()
    };
    if let Err(e) = guest_run_into(args, work, bench, mode, &mut run, progress) {
        let e = format!("{e:#}");
        run.error = Some(match run.error.take() {
            Some(guest) => format!("{guest}; {e}"),
            None => e,
        });
    }
    run
}

fn guest_run_into(
    args: &Args,
    work: &Work,
    bench: &Path,
    mode: CgroupMode,
    run: &mut GuestRun,
    progress: &dyn Fn(&str),
) -> Result<()> {
    let cfg = VmConfig {
        vm_dir: args.build_dir.join("vm"),
        cgroup: mode,
        ..VmConfig::default()
    };
    let mut vm = Vm::boot(&cfg).with_context(|| format!("boot the {} guest", mode.name()))?;
    run.boot = Some(vm.boot_time());
    progress(&format!(
        "vm: {} guest up in {:.1?}; its part: {} pods, {} eviction rounds",
        mode.name(),
        vm.boot_time(),
        args.vm_pods,
        args.vm_eviction_rounds
    ));
    let out = vm.work_dir().join(format!("guest-{}.json", mode.name()));
    let argv = guest_argv(args, bench, &out, work.id())?;
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    run.host_load.0 = machine::load_average();
    let t = Instant::now();
    let done = vm
        .run(&argv, &[("RUST_BACKTRACE", "1")], GUEST_TIMEOUT)
        .with_context(|| format!("run the guest part in the {} guest", mode.name()))?;
    run.host_load.1 = machine::load_average();
    progress(&format!(
        "vm: {} guest part done in {:.1?}",
        mode.name(),
        t.elapsed()
    ));
    // Its progress, kept beside the host's report for a failed run.
    let log = work.dir.join(format!("vm-guest-{}.log", mode.name()));
    if let Err(e) = std::fs::write(&log, &done.stderr) {
        progress(&format!("vm: write {}: {e}", log.display()));
    }
    let text = std::fs::read_to_string(&out);
    match text {
        Ok(text) => parse_guest(&text, run)?,
        Err(e) => bail!(
            "no figures from the {} guest ({}: {e}): {}",
            mode.name(),
            out.display(),
            tail_lines(&done.describe(), 30)
        ),
    }
    ensure!(
        done.success() || run.error.is_some(),
        "the guest part failed: {}",
        tail_lines(&done.describe(), 30)
    );
    Ok(())
}

/// The last `n` lines of `s`.
fn tail_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The guest part's command line: this binary with the host's binaries
/// and image, which the guest sees at the same paths.
fn guest_argv(args: &Args, bench: &Path, out: &Path, id: &str) -> Result<Vec<String>> {
    let abs = |p: &Path, what: &str| -> Result<String> {
        let p = std::fs::canonicalize(p).with_context(|| format!("{what} {}", p.display()))?;
        // The guest's /tmp is its own: a host path there is not shared.
        ensure!(
            !p.starts_with("/tmp"),
            "{what} {} is under /tmp, which the guest does not see",
            p.display()
        );
        Ok(p.display().to_string())
    };
    let mut argv = vec![
        abs(bench, "the bench")?,
        "--only".into(),
        "vm-guest".into(),
        "--petrel".into(),
        abs(&args.petrel, "petrel")?,
        "--image".into(),
        abs(&args.image, "the image")?,
        "--vm-pods".into(),
        args.vm_pods.to_string(),
        "--vm-eviction-rounds".into(),
        args.vm_eviction_rounds.to_string(),
        "--vm-guest-out".into(),
        out.display().to_string(),
        "--id".into(),
        id.to_string(),
    ];
    if let Some(shim) = &args.shim {
        argv.extend(["--shim".into(), abs(shim, "the shim")?]);
    }
    // A bare name is looked up in the guest's PATH, the host's programs.
    if args.runc.components().count() > 1 {
        argv.extend(["--runc".into(), abs(&args.runc, "runc")?]);
    }
    Ok(argv)
}

fn ns_list(s: &Samples) -> Value {
    s.values()
        .iter()
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .collect()
}

fn samples_of(v: &Value) -> Samples {
    let mut s = Samples::default();
    for n in v.as_array().into_iter().flatten().filter_map(Value::as_u64) {
        s.push(Duration::from_nanos(n));
    }
    s
}

fn direction_json(l: &Lifecycle) -> Value {
    let steps: Vec<Value> = l
        .petrel_steps
        .iter()
        .map(|(name, s)| json!({ "name": name, "ns": ns_list(s) }))
        .collect();
    json!({ "petrel": ns_list(&l.petrel), "raw": ns_list(&l.raw), "steps": steps })
}

fn direction_of(v: &Value) -> Direction {
    Direction {
        petrel: samples_of(&v["petrel"]),
        raw: samples_of(&v["raw"]),
        steps: v["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                (
                    s["name"].as_str().unwrap_or("?").to_string(),
                    samples_of(&s["ns"]),
                )
            })
            .collect(),
    }
}

/// The guest's figures as it writes them.
fn guest_json(
    cgroup: &str,
    load: (&str, &str),
    up: &Lifecycle,
    down: &Lifecycle,
    r: &GuestReaction,
    error: Option<&str>,
) -> Value {
    json!({
        "cgroup": cgroup,
        "kernel": machine_kernel(),
        "load_before": load.0,
        "load_after": load.1,
        "up": direction_json(up),
        "down": direction_json(down),
        "reaction": {
            "stop": ns_list(&r.stop),
            "decision": ns_list(&r.decision),
            "windows": ns_list(&r.windows),
            "early_stops": r.early_stops,
            "realtime_stamps": r.realtime_stamps,
            "hog_peak": r.hog_peak,
        },
        "error": error,
    })
}

/// Reads the guest's figures into `run`.
fn parse_guest(text: &str, run: &mut GuestRun) -> Result<()> {
    let v: Value = serde_json::from_str(text).context("parse the guest's figures")?;
    let cgroup = v["cgroup"].as_str().unwrap_or_default();
    ensure!(
        cgroup == run.cgroup,
        "the {} guest reports cgroup {cgroup:?}",
        run.cgroup
    );
    let text_of = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    run.kernel = text_of("kernel");
    run.guest_load = (text_of("load_before"), text_of("load_after"));
    run.up = direction_of(&v["up"]);
    run.down = direction_of(&v["down"]);
    let r = &v["reaction"];
    let count = |k: &str| r[k].as_u64().unwrap_or(0) as usize;
    run.reaction = GuestReaction {
        stop: samples_of(&r["stop"]),
        decision: samples_of(&r["decision"]),
        windows: samples_of(&r["windows"]),
        early_stops: count("early_stops"),
        realtime_stamps: count("realtime_stamps"),
        hog_peak: r["hog_peak"].as_i64(),
    };
    run.error = v["error"].as_str().map(str::to_string);
    Ok(())
}

fn machine_kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `--only vm-guest`: the guest side, run by [`measure`] inside a test VM
/// guest. Writes its figures to `--vm-guest-out`, also when a step fails
/// (with the error), and fails only when it cannot write them.
pub fn run_guest(args: &Args) -> Result<()> {
    let out = args
        .vm_guest_out
        .clone()
        .context("--only vm-guest needs --vm-guest-out")?;
    ensure!(args.vm_pods > 0, "--vm-pods must be at least 1");
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let cgroup = if v2 { "v2" } else { "v1" };
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .context("become a child subreaper")?;
    let id = args.id.clone().unwrap_or_else(|| "vm".to_string());
    // The guest's own /tmp (a tmpfs), not the shared 9p directory: the
    // runtime's files on the guest's memory, as /run on a host.
    let work = Work::create(
        std::env::temp_dir().join(format!("petrel-bench.{id}")),
        format!("/petrel-bench-{id}"),
    )?;
    let load_before = machine::load_average();
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start tokio")?;
    let mut up = Lifecycle::default();
    let mut down = Lifecycle::default();
    let mut reaction = GuestReaction::default();
    let result = tokio.block_on(async {
        lifecycle(args, &work, &mut up, &mut down).await?;
        guest_reaction(
            args,
            &work,
            args.vm_eviction_rounds,
            &mut reaction,
            &crate::progress,
        )
        .await
    });
    drop(tokio);
    let error = result.err().map(|e| format!("{e:#}"));
    if let Some(e) = &error {
        eprintln!("petrel-bench: the {cgroup} guest's part failed: {e}");
    }
    let load_after = machine::load_average();
    let v = guest_json(
        cgroup,
        (&load_before, &load_after),
        &up,
        &down,
        &reaction,
        error.as_deref(),
    );
    let tmp = out.with_extension("json.tmp");
    std::fs::write(&tmp, v.to_string()).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &out).with_context(|| format!("rename to {}", out.display()))?;
    drop(work);
    Ok(())
}

/// P38 in the guest: P1's up and down with `--vm-pods` pods, Petrel and
/// raw runc alternating sample by sample, after one unmeasured round
/// trip of each.
async fn lifecycle(
    args: &Args,
    work: &Work,
    up: &mut Lifecycle,
    down: &mut Lifecycle,
) -> Result<()> {
    crate::progress("P38: starting the runtime");
    let pods_cgroup = format!("{}/petrel", work.cgroup_parent);
    let mut node = Node::start(&args.petrel, args.shim.as_deref(), &pods_cgroup)?;
    let out = async {
        let mut c = node.connect().await?;
        c.import(&args.image).await?;
        let layer = crate::single_layer(&node.root)?;
        let mut raw = RawRunc::prepare(
            &args.runc,
            &work.dir.join("raw"),
            &layer,
            &format!("{}/raw", work.cgroup_parent),
        )?;
        {
            let (mut u, mut d) = (Lifecycle::default(), Lifecycle::default());
            let pod = petrel_up(&mut c, "warmup", &pods_cgroup, &work.dir, &mut u).await?;
            petrel_down(&mut c, &pod, &mut d).await?;
            raw_up(&mut raw, "warmup", &mut u)?;
            raw_down(&mut raw, "warmup", &mut d)?;
        }
        crate::progress(&format!("P38 up: {} pods and raw runc", args.vm_pods));
        let mut pods = Vec::with_capacity(args.vm_pods);
        for i in 0..args.vm_pods {
            let raw_id = format!("r{i:04}");
            if i % 2 == 1 {
                raw_up(&mut raw, &raw_id, up)?;
            }
            let name = format!("p{i:04}");
            pods.push(petrel_up(&mut c, &name, &pods_cgroup, &work.dir, up).await?);
            if i % 2 == 0 {
                raw_up(&mut raw, &raw_id, up)?;
            }
        }
        crate::progress("P38 down");
        for (i, pod) in pods.iter().enumerate() {
            let raw_id = format!("r{i:04}");
            if i % 2 == 1 {
                raw_down(&mut raw, &raw_id, down)?;
            }
            petrel_down(&mut c, pod, down).await?;
            if i % 2 == 0 {
                raw_down(&mut raw, &raw_id, down)?;
            }
        }
        raw.sweep();
        anyhow::Ok(())
    }
    .await;
    node.shutdown();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_figures_should_survive_the_round_trip() {
        let mut up = Lifecycle::default();
        up.petrel.push(Duration::from_millis(300));
        up.petrel_steps
            .push("RunPodSandbox", Duration::from_millis(100));
        up.raw.push(Duration::from_millis(250));
        let down = Lifecycle::default();
        let mut r = GuestReaction::default();
        r.stop.push(Duration::from_nanos(123_456_789));
        r.windows.push(Duration::from_micros(1500));
        r.hog_peak = Some(42);
        let v = guest_json("v2", ("1", "2"), &up, &down, &r, Some("boom"));
        let mut run = GuestRun {
            cgroup: "v2".into(),
            ..Default::default()
        };
        parse_guest(&v.to_string(), &mut run).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(run.up.petrel.p50(), Duration::from_millis(300));
        assert_eq!(run.up.raw.p50(), Duration::from_millis(250));
        assert_eq!(run.up.steps[0].0, "RunPodSandbox");
        assert_eq!(run.reaction.stop.p50(), Duration::from_nanos(123_456_789));
        assert_eq!(run.reaction.windows.len(), 1);
        assert_eq!(run.reaction.hog_peak, Some(42));
        assert_eq!(run.error.as_deref(), Some("boom"));
        assert_eq!(run.guest_load, ("1".to_string(), "2".to_string()));
        let mut wrong = GuestRun {
            cgroup: "v1".into(),
            ..Default::default()
        };
        assert!(parse_guest(&v.to_string(), &mut wrong).is_err());
    }
}
