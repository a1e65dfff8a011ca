//! Interop of Petrel's NRI SDK with a real containerd 1.7 (issue 7): the
//! sample plugins of `plugins/`, built on `petrel-nri`, run against
//! containerd's NRI, and what they do is seen through containerd's CRI.
//!
//! - The logger dials containerd's NRI socket as an external plugin and
//!   prints every event it gets (1.7 sends some through StateChange, some
//!   through their own RPCs); its CreateContainer adjustment (an annotation)
//!   is in the container's OCI spec; after a containerd restart it
//!   reconnects and is synchronized with the running pod and container.
//! - The ulimit adjuster is pre-registered (`20-ulimit-adjuster` in
//!   containerd's `plugin_path`, launched by containerd with its socket on
//!   fd 3); the rlimits from the pod's annotations are those of the running
//!   containers, and a bad annotation fails CreateContainer with the
//!   plugin's message.
//!
//! The plugins are the workspace's binaries beside the `petrel` binary
//! (`cargo build --workspace --bins`, as `make test` does). Skipped when
//! containerd is absent (`make containerd`) unless PETREL_REQUIRE_CONTAINERD
//! is set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime};

use petrel_cri::api;
use petrel_testkit::local_containerd::{Containerd, Version};
use petrel_testkit::prelude::*;

/// The workspace's root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Newest modification time of the files under `path`.
fn newest(path: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter_map(|e| newest(&e.path()))
        .max()
}

/// The binary `name` of plugin crate `plugins/<dir>`, built beside the
/// `petrel` binary. A missing binary, or one older than its sources or the
/// SDK's, is a failure that says how to build it: testing a stale plugin
/// would test old code.
fn plugin_bin(dir: &str, name: &str) -> PathBuf {
    let bin = petrel_bin().with_file_name(name);
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; build the plugins first: cargo build --workspace --bins",
                bin.display()
            )
        });
    let ws = workspace();
    for src in [
        ws.join("plugins").join(dir),
        ws.join("crates/nri/src"),
        ws.join("crates/nri/proto"),
        ws.join("crates/nri/build.rs"),
    ] {
        if let Some(t) = newest(&src) {
            assert!(
                t <= built,
                "{} is older than {}: cargo build --workspace --bins",
                bin.display(),
                src.display()
            );
        }
    }
    bin
}

/// A plugin process the test started, killed (by pid) and reaped on drop.
struct PluginProcess {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl PluginProcess {
    /// Runs `bin args...` with its output in files under `dir`.
    fn spawn(bin: &Path, args: &[&Path], dir: &Path, name: &str) -> PluginProcess {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        let child = Command::new(bin)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("plugin stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("plugin stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        PluginProcess {
            child,
            stdout,
            stderr,
        }
    }

    /// What the plugin printed so far.
    fn output(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Its stdout and stderr, for failure messages.
    fn describe(&self) -> String {
        format!(
            "plugin stdout:\n{}\nplugin stderr:\n{}",
            self.output(),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Waits until the plugin's output holds `line` (a whole line) `n` times.
    async fn wait_line(&mut self, line: &str, n: usize, cd: &Containerd) {
        let ok = eventually(Duration::from_secs(20), || {
            self.output().lines().filter(|l| *l == line).count() >= n
        })
        .await;
        if !ok {
            let exited = self.child.try_wait().ok().flatten();
            panic!(
                "the plugin did not print {line:?} {n} time(s) (exited: {exited:?})\n{}\ncontainerd log:\n{}",
                self.describe(),
                cd.log()
            );
        }
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `lines` contains `want` in this order (other lines between them allowed).
fn in_order(lines: &[&str], want: &[&str]) -> bool {
    let mut it = lines.iter();
    want.iter().all(|w| it.any(|l| l == w))
}

/// ContainerStatus' verbose `info` as JSON: containerd puts the container's
/// OCI spec (`runtimeSpec`) and its init process's pid there.
async fn verbose_info(c: &mut Clients, id: &str) -> serde_json::Value {
    let r =
        c.rt.container_status(api::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: true,
        })
        .await
        .expect("ContainerStatus verbose")
        .into_inner();
    let info = r.info.get("info").expect("verbose info");
    serde_json::from_str(info).expect("info is JSON")
}

/// The container's OCI spec, as containerd created it.
async fn runtime_spec(c: &mut Clients, id: &str) -> serde_json::Value {
    let v = verbose_info(c, id).await;
    v.get("runtimeSpec").cloned().expect("runtimeSpec in info")
}

/// ExecSync `sh -c script` in container `id`, returning stdout.
async fn exec(c: &mut Clients, id: &str, script: &str) -> String {
    let r = c.exec_sh(id, script, 10).await;
    assert_eq!(
        r.exit_code,
        0,
        "{script}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    String::from_utf8_lossy(&r.stdout).into_owned()
}

/// Stops and removes container `id` and pod `pod` through CRI.
async fn tear_down(c: &mut Clients, pod: &str, id: &str) {
    c.stop(id, 0).await.expect("StopContainer");
    c.remove(id).await.expect("RemoveContainer");
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.to_string(),
    })
    .await
    .expect("StopPodSandbox");
    c.remove_pod(pod).await.expect("RemovePodSandbox");
}

#[tokio::test]
async fn logger_plugin_should_see_pod_life_through_containerd_17_and_reconnect() {
    let Some(mut cd) = Containerd::start_with_nri(Version::V17, |_| {}) else {
        return;
    };
    let nri = cd.nri.clone().expect("NRI enabled");
    let bin = plugin_bin("logger", "petrel-nri-logger");
    // Declared after `cd`: dropped (killed) before containerd is torn down.
    let mut logger = PluginProcess::spawn(&bin, &[&nri.socket], cd.dir.path(), "logger");

    // Registered, configured by containerd, synchronized with nothing.
    logger
        .wait_line("Synchronize pods=0 containers=0", 1, &cd)
        .await;
    assert!(
        logger
            .output()
            .lines()
            .any(|l| l.starts_with("Configure runtime=containerd version=")),
        "{}",
        logger.describe()
    );

    // A pod's whole life.
    let mut c = cd.clients().await;
    let pc = cd.pod_config("nri-log");
    let pod = c.run_pod(pc.clone()).await;
    let id = c
        .run(&pod, &pc, sh_container("app", "exec sleep 3600"))
        .await;
    // The logger's CreateContainer adjustment reached the OCI spec.
    let spec = runtime_spec(&mut c, &id).await;
    assert_eq!(
        spec["annotations"]["petrel.dev/nri-logger"],
        "seen",
        "annotations: {}\n{}",
        spec["annotations"],
        logger.describe()
    );
    tear_down(&mut c, &pod, &id).await;
    logger
        .wait_line("StopPodSandbox pod=nri-log container=-", 1, &cd)
        .await;
    let out = logger.output();
    let lines: Vec<&str> = out.lines().collect();
    let life = [
        "Synchronize pods=0 containers=0",
        "RunPodSandbox pod=nri-log container=-",
        "CreateContainer pod=nri-log container=app",
        "StartContainer pod=nri-log container=app",
        "PostStartContainer pod=nri-log container=app",
        "StopContainer pod=nri-log container=app",
        "RemoveContainer pod=nri-log container=app",
        "StopPodSandbox pod=nri-log container=-",
    ];
    assert!(
        in_order(&lines, &life),
        "expected in order: {life:#?}\n{}",
        logger.describe()
    );
    // Each event once: none delivered through both its RPC and StateChange.
    for l in &life[1..] {
        let n = lines.iter().filter(|x| *x == l).count();
        assert_eq!(n, 1, "{l}\n{}", logger.describe());
    }

    // containerd restarts under a running pod: the logger dials again, is
    // configured again and synchronized with the pod and its container, and
    // sees that container's end. (Not the pod's: containerd 1.7 keeps pod
    // states for NRI in memory and its sync restores only containers', so
    // it relays no StopPodSandbox for a pod from before its restart.)
    let pc = cd.pod_config("nri-sync");
    let pod = c.run_pod(pc.clone()).await;
    let id = c
        .run(&pod, &pc, sh_container("kept", "exec sleep 3600"))
        .await;
    drop(c);
    cd.terminate();
    cd.restart();
    logger
        .wait_line("Synchronize pods=1 containers=1", 1, &cd)
        .await;
    let configured = logger
        .output()
        .lines()
        .filter(|l| l.starts_with("Configure runtime=containerd"))
        .count();
    assert_eq!(configured, 2, "{}", logger.describe());
    let mut c = cd.clients().await;
    tear_down(&mut c, &pod, &id).await;
    logger
        .wait_line("RemoveContainer pod=nri-sync container=kept", 1, &cd)
        .await;
    let out = logger.output();
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        in_order(
            &lines,
            &[
                "PostStartContainer pod=nri-sync container=kept",
                "Synchronize pods=1 containers=1",
                "StopContainer pod=nri-sync container=kept",
                "RemoveContainer pod=nri-sync container=kept",
            ]
        ),
        "{}",
        logger.describe()
    );
}

/// Pod annotations for the ulimit adjuster.
fn ulimit_pod(
    cd: &Containerd,
    name: &str,
    pod: &str,
    container: &[(&str, &str)],
) -> api::PodSandboxConfig {
    let mut pc = cd.pod_config(name);
    let mut a = HashMap::from([("ulimits.noderesource.dev/pod".to_string(), pod.to_string())]);
    for (ctr, text) in container {
        a.insert(
            format!("ulimits.noderesource.dev/container.{ctr}"),
            text.to_string(),
        );
    }
    pc.annotations = a;
    pc
}

/// RLIMIT_NOFILE (soft, hard) of process `pid`, from `/proc/<pid>/limits`.
fn nofile(pid: u64) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("read limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open files limit in {limits}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    // "Max open files <soft> <hard> files"
    (f[3].to_string(), f[4].to_string())
}

/// RLIMIT_NOFILE of the container's init process, read on the host (in the
/// container, PID 1 is the pod's pause process: the PID namespace is the
/// pod's).
async fn init_nofile(c: &mut Clients, id: &str) -> (String, String) {
    let pid = verbose_info(c, id).await["pid"]
        .as_u64()
        .expect("pid in verbose info");
    nofile(pid)
}

/// The processes containerd (`parent`) launched from `dir`.
fn launched_from(parent: u32, dir: &Path) -> Vec<u32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let ppid = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|s| {
                let (_, tail) = s.rsplit_once(')')?;
                tail.split_whitespace().nth(1)?.parse::<u32>().ok()
            });
        let exe = std::fs::read_link(e.path().join("exe")).ok();
        if ppid == Some(parent) && exe.is_some_and(|x| x.starts_with(dir)) {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` has exited (gone, or a zombie waiting for its reaper).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, tail)| tail.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

#[tokio::test]
async fn preregistered_ulimit_adjuster_should_set_rlimits_of_containerd_17_containers() {
    let Some(mut cd) = Containerd::start_with_nri(Version::V17, |nri| {
        let bin = plugin_bin("ulimit-adjuster", "petrel-nri-ulimit-adjuster");
        // containerd launches `NN-name` executables of its plugin_path. A
        // hard link where possible (same file system), else a copy: the
        // launched process's executable is then inside the instance's
        // directory, where the harness's teardown looks for leftovers.
        let dest = nri.plugin_path.join("20-ulimit-adjuster");
        if std::fs::hard_link(&bin, &dest).is_err() {
            std::fs::copy(&bin, &dest).expect("copy the ulimit adjuster");
        }
    }) else {
        return;
    };
    let mut c = cd.clients().await;

    let pc = ulimit_pod(
        &cd,
        "nri-ulimit",
        "- {type: RLIMIT_NOFILE, soft: 1000, hard: 2000}\n",
        &[("tuned", "- {type: nofile, soft: 1500, hard: 1800}\n")],
    );
    let pod = c.run_pod(pc.clone()).await;
    let plain = c
        .run(&pod, &pc, sh_container("plain", "exec sleep 3600"))
        .await;
    let tuned = c
        .run(&pod, &pc, sh_container("tuned", "exec sleep 3600"))
        .await;

    // The pod-wide limit, and the container's own where it has one: in its
    // init process, and the hard limit in what an exec inherits from the
    // spec. (Not an exec's soft limit: Debian's runc 1.1.5, built with Go
    // 1.19, sets an exec'd process's rlimits from outside while its Go
    // runtime may be starting and raising the soft NOFILE limit to the hard
    // one, so that soft limit is sometimes the hard one; later runc versions
    // set RLIMIT_NOFILE from inside.)
    let why = || format!("containerd log:\n{}", cd.log());
    assert_eq!(
        init_nofile(&mut c, &plain).await,
        ("1000".into(), "2000".into()),
        "{}",
        why()
    );
    assert_eq!(exec(&mut c, &plain, "ulimit -Hn").await, "2000\n");
    assert_eq!(
        init_nofile(&mut c, &tuned).await,
        ("1500".into(), "1800".into()),
        "{}",
        why()
    );
    assert_eq!(exec(&mut c, &tuned, "ulimit -Hn").await, "1800\n");
    let spec = runtime_spec(&mut c, &tuned).await;
    let rlimits = spec["process"]["rlimits"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        rlimits
            .iter()
            .any(|r| r["type"] == "RLIMIT_NOFILE" && r["soft"] == 1500 && r["hard"] == 1800),
        "rlimits: {rlimits:?}"
    );

    // A pod without the annotations keeps containerd's defaults.
    let pc2 = cd.pod_config("nri-none");
    let pod2 = c.run_pod(pc2.clone()).await;
    let none = c
        .run(&pod2, &pc2, sh_container("none", "exec sleep 3600"))
        .await;
    let spec = runtime_spec(&mut c, &none).await;
    assert!(
        spec["process"]["rlimits"]
            .as_array()
            .is_none_or(|r| r.is_empty()),
        "{}",
        spec["process"]
    );
    assert_eq!(init_nofile(&mut c, &none).await, nofile(cd.pid().into()));

    // A bad annotation: the plugin refuses the container, containerd fails
    // CreateContainer with the plugin's reason and keeps no container.
    let bad = ulimit_pod(&cd, "nri-bad", "- {type: bogus, soft: 1, hard: 1}\n", &[]);
    let bad_pod = c.run_pod(bad.clone()).await;
    let err = c
        .create(&bad_pod, &bad, sh_container("x", "exec sleep 3600"))
        .await
        .expect_err("CreateContainer with a bad ulimit annotation");
    assert!(
        err.message().contains("unknown rlimit type \"bogus\""),
        "{err:?}"
    );
    let left =
        c.rt.list_containers(api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                pod_sandbox_id: bad_pod.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    assert!(left.is_empty(), "{left:?}");

    // The launched plugin's life is its connection's: when containerd stops,
    // it exits by itself (the harness's teardown would kill it otherwise).
    let nri = cd.nri.clone().expect("NRI enabled");
    let plugins = launched_from(cd.pid(), &nri.plugin_path);
    assert_eq!(plugins.len(), 1, "{plugins:?}");
    drop(c);
    cd.terminate();
    assert!(
        eventually(Duration::from_secs(10), || exited(plugins[0])).await,
        "the ulimit adjuster (pid {}) outlived containerd",
        plugins[0]
    );
}
