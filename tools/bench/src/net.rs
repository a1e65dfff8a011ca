//! P16-P18: pod networking and exec against containerd 1.7 in the same
//! run. Both runtimes use one CNI configuration (bridge + host-local +
//! loopback + portmap, Debian's plugins in /usr/lib/cni) on the bench's
//! own bridge and subnet, with their own lease directory each so that
//! neither sees the other's addresses; they alternate sample by sample.
//!
//! - P16: RunPodSandbox of a pod with its own network namespace (Petrel:
//!   namespaces pinned + CNI ADD; containerd: its pause container + CNI
//!   ADD), and the matching StopPodSandbox + RemovePodSandbox (CNI DEL).
//! - P17: ExecSync of `true` in a running busybox container.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use petrel_cri::api;

use crate::containerd::{self, Containerd};
use crate::node::{pod_config, sleep_container, Clients, Node};
use crate::stats::Samples;
use crate::stream;
use crate::sweep::Work;
use crate::Args;
use petrel_testkit::petrel::CniDirs;

/// The plugins both runtimes run.
pub const CNI_BIN: &str = "/usr/lib/cni";

/// What the section measured.
#[derive(Debug, Default)]
pub struct NetResults {
    /// Why the section stopped early.
    pub error: Option<String>,
    /// Why containerd was not measured (the section then has no reference).
    pub containerd_missing: Option<String>,
    /// `containerd --version`.
    pub containerd_version: String,
    /// The configuration both used.
    pub conflist: String,
    /// P16: RunPodSandbox, Petrel.
    pub run_petrel: Samples,
    /// P16: RunPodSandbox, containerd.
    pub run_containerd: Samples,
    /// P16: StopPodSandbox + RemovePodSandbox, Petrel.
    pub down_petrel: Samples,
    /// P16: StopPodSandbox + RemovePodSandbox, containerd.
    pub down_containerd: Samples,
    /// P17: ExecSync, Petrel.
    pub exec_petrel: Samples,
    /// P17: ExecSync, containerd.
    pub exec_containerd: Samples,
    /// P17: Exec through the streaming server (SPDY), Petrel.
    pub stream_petrel: Samples,
    /// P17: Exec through the streaming server (SPDY), containerd.
    pub stream_containerd: Samples,
    /// P18: bytes per port-forward (and direct) run.
    pub forward_bytes: u64,
    /// P18: port-forward runs through Petrel.
    pub forward_petrel: Samples,
    /// P18: port-forward runs through containerd.
    pub forward_containerd: Samples,
    /// P18: the same pushes straight to the Petrel pod's IP.
    pub forward_direct: Samples,
}

/// Measures P16-P18; failures end up in `error`.
pub async fn measure(args: &Args, work: &Work, progress: &dyn Fn(&str)) -> NetResults {
    let mut res = NetResults::default();
    if let Err(e) = measure_into(args, work, &mut res, progress).await {
        progress(&format!("net section failed: {e:#}"));
        res.error = Some(format!("{e:#}"));
    }
    res
}

/// The bench's network: its bridge (removed on drop) and one
/// configuration directory per runtime (same list, own lease directory).
struct BenchNet {
    bridge: String,
}

impl BenchNet {
    fn create(dir: &Path, id: &str) -> Result<(BenchNet, PathBuf, PathBuf, String)> {
        // At most 15 bytes; 10.198.0.0/24 is used by nothing else of Petrel's
        // (the demo has 10.199, the tests 10.200-249).
        let bridge = format!("pbn{}", &id[..id.len().min(8)]);
        let conf = |leases: &Path| {
            format!(
                r#"{{"cniVersion":"1.0.0","name":"petrel-bench","plugins":[
  {{"type":"bridge","bridge":"{bridge}","isGateway":true,"ipMasq":false,"hairpinMode":true,
    "ipam":{{"type":"host-local","dataDir":"{}","ranges":[[{{"subnet":"10.198.0.0/24"}}]],"routes":[{{"dst":"0.0.0.0/0"}}]}}}},
  {{"type":"loopback"}},
  {{"type":"portmap","capabilities":{{"portMappings":true}},"snat":true}}]}}"#,
                leases.display()
            )
        };
        let mut dirs = Vec::new();
        let mut text = String::new();
        for who in ["petrel", "containerd"] {
            let d = dir.join(format!("cni-{who}"));
            std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
            text = conf(&dir.join(format!("leases-{who}")));
            std::fs::write(d.join("10-bench.conflist"), &text)
                .with_context(|| format!("write {}", d.display()))?;
            dirs.push(d);
        }
        let containerd_dir = dirs.pop().unwrap_or_default();
        let petrel_dir = dirs.pop().unwrap_or_default();
        Ok((BenchNet { bridge }, petrel_dir, containerd_dir, text))
    }
}

impl Drop for BenchNet {
    fn drop(&mut self) {
        // The bridge plugin leaves its bridge; it is the bench's to remove.
        let _ = std::process::Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

async fn measure_into(
    args: &Args,
    work: &Work,
    res: &mut NetResults,
    progress: &dyn Fn(&str),
) -> Result<()> {
    anyhow::ensure!(
        args.net_pods > 0 && args.net_execs > 0,
        "--net-pods and --net-execs must be at least 1"
    );
    let dir = work.dir.join("net");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let id = work
        .cgroup_parent
        .rsplit('-')
        .next()
        .unwrap_or("0")
        .to_string();
    let (net, petrel_conf, containerd_conf, conflist) = BenchNet::create(&dir, &id)?;
    res.conflist = conflist;
    let cgroup = format!("{}/net", work.cgroup_parent);

    progress("net: starting petrel runtime and containerd 1.7 on the bench's CNI network");
    let mut node = Node::start_on(
        &args.petrel,
        args.shim.as_deref(),
        &cgroup,
        Some(CniDirs {
            conf_dir: petrel_conf.clone(),
            bin_dir: PathBuf::from(CNI_BIN),
        }),
    )?;
    let mut pc = node.connect().await?;
    pc.import(&args.image).await?;

    let images = args
        .image
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let bin_dir = containerd::bin_dir(&args.build_dir);
    let mut cd = match containerd::unavailable(&bin_dir, &images) {
        Some(why) => {
            res.containerd_missing = Some(why);
            None
        }
        None => {
            let c = Containerd::start_with_cni(
                &bin_dir,
                &dir.join("containerd"),
                &images,
                &containerd_conf,
                Path::new(CNI_BIN),
            )
            .await?;
            res.containerd_version = if c.version.is_empty() {
                "containerd 1.7".to_string()
            } else {
                format!("containerd {}", c.version)
            };
            Some(c)
        }
    };
    let mut cc = match &cd {
        Some(c) => Some(Clients::connect(&c.endpoint()).await?),
        None => None,
    };

    let pods = |who: &str, i: usize| pod_config(&format!("net-{who}-{i}"), &cgroup, &dir);
    progress(&format!(
        "net: P16 {} pods up and down on each runtime (one unmeasured warm-up)",
        args.net_pods
    ));
    for i in 0..=args.net_pods {
        let warm = i == 0;
        let petrel_first = i % 2 == 0;
        for turn in 0..2 {
            let petrel = (turn == 0) == petrel_first;
            let (c, up, down) = if petrel {
                (&mut pc, &mut res.run_petrel, &mut res.down_petrel)
            } else {
                match cc.as_mut() {
                    Some(c) => (c, &mut res.run_containerd, &mut res.down_containerd),
                    None => continue,
                }
            };
            let config = pods(if petrel { "p" } else { "c" }, i);
            let t = Instant::now();
            let pod = c.run_pod(&config).await?;
            let d_up = t.elapsed();
            let t = Instant::now();
            c.stop_pod(&pod).await?;
            c.remove_pod(&pod).await?;
            let d_down = t.elapsed();
            if !warm {
                up.push(d_up);
                down.push(d_down);
            }
        }
    }

    progress(&format!(
        "net: P17 {} ExecSync calls on each runtime",
        args.net_execs
    ));
    let mut targets = Vec::new();
    for (who, c) in [("p", Some(&mut pc)), ("c", cc.as_mut())] {
        let Some(c) = c else { continue };
        let config = pods(&format!("{who}x"), 0);
        let pod = c.run_pod(&config).await?;
        let ctr = c.create(&pod, &config, sleep_container("exec")).await?;
        c.start(&ctr).await?;
        targets.push((pod, ctr));
    }
    for i in 0..=args.net_execs {
        let petrel_first = i % 2 == 0;
        for turn in 0..2 {
            let petrel = (turn == 0) == petrel_first;
            let (c, samples, target) = if petrel {
                (&mut pc, &mut res.exec_petrel, &targets[0])
            } else {
                match (cc.as_mut(), targets.get(1)) {
                    (Some(c), Some(t)) => (c, &mut res.exec_containerd, t),
                    _ => continue,
                }
            };
            let t = Instant::now();
            let r =
                c.rt.exec_sync(api::ExecSyncRequest {
                    container_id: target.1.clone(),
                    cmd: vec!["true".into()],
                    timeout: 10,
                })
                .await
                .context("ExecSync")?
                .into_inner();
            let d = t.elapsed();
            anyhow::ensure!(r.exit_code == 0, "ExecSync true exited {}", r.exit_code);
            if i > 0 {
                samples.push(d);
            }
        }
    }
    progress(&format!(
        "net: P17 {} exec round trips through each runtime's streaming server",
        args.net_execs
    ));
    for i in 0..=args.net_execs {
        let petrel_first = i % 2 == 0;
        for turn in 0..2 {
            let petrel = (turn == 0) == petrel_first;
            let (c, samples, target) = if petrel {
                (&mut pc, &mut res.stream_petrel, &targets[0])
            } else {
                match (cc.as_mut(), targets.get(1)) {
                    (Some(c), Some(t)) => (c, &mut res.stream_containerd, t),
                    _ => continue,
                }
            };
            let d = stream::exec_round_trip(c, &target.1).await?;
            if i > 0 {
                samples.push(d);
            }
        }
    }

    progress(&format!(
        "net: P18 {} port-forward runs of {} MiB through each runtime and direct",
        args.net_forward_runs, args.net_forward_mib
    ));
    res.forward_bytes = args.net_forward_mib << 20;
    let pid = stream::container_pid(&mut pc, &targets[0].1).await?;
    stream::start_sink(pid)?;
    let ip = stream::pod_ip(&mut pc, &targets[0].0).await?;
    if let (Some(c), Some(t)) = (cc.as_mut(), targets.get(1)) {
        let pid = stream::container_pid(c, &t.1).await?;
        stream::start_sink(pid)?;
    }
    for i in 0..=args.net_forward_runs {
        let direct = stream::direct_push(&ip, res.forward_bytes)
            .await
            .context("direct to the pod IP")?;
        let d = stream::port_forward_push(&mut pc, &targets[0].0, res.forward_bytes)
            .await
            .context("Petrel port-forward")?;
        let other = match (cc.as_mut(), targets.get(1)) {
            (Some(c), Some(t)) => {
                let d = stream::port_forward_push(c, &t.0, res.forward_bytes).await;
                Some(d.context("containerd port-forward")?)
            }
            _ => None,
        };
        if i > 0 {
            res.forward_petrel.push(d);
            res.forward_direct.push(direct);
            if let Some(o) = other {
                res.forward_containerd.push(o);
            }
        }
    }

    for (k, (pod, _)) in targets.iter().enumerate() {
        let c = if k == 0 { Some(&mut pc) } else { cc.as_mut() };
        if let Some(c) = c {
            c.stop_pod(pod).await?;
            c.remove_pod(pod).await?;
        }
    }
    drop(cc);
    if let Some(c) = cd.as_mut() {
        c.shutdown();
    }
    node.shutdown();
    // Give the kernel a moment to let the veths of the last pods go before
    // the bridge is removed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(net);
    Ok(())
}
