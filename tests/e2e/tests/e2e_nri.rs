//! NRI end to end: plugins on Petrel's SDK against a real `petrel runtime`.
//! In-process plugins (this test dialling the runtime's NRI socket) do what a
//! test needs; the sample plugins of `plugins/` run pre-registered, launched
//! by the runtime from its plugin directory. Each test has its own runtime,
//! NRI socket and plugin directory.
//!
//! Multi-threaded: the in-process plugins must keep answering while a
//! failing test's `Node` is dropped (its clean-up blocks the test's thread
//! and removes pods through the runtime, which calls the plugins).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use petrel_cri::admin::{NriPlugin, NriPluginsRequest};
use petrel_cri::api;
use petrel_nri::api as nri;
use petrel_nri::stub::{Backoff, PluginError, Stub, StubBuilder, StubHandle};
use petrel_testkit::prelude::{eventually, mounts_under, sh_container, Clients, Node};

/// A sample plugin binary, built beside `petrel`.
fn sample_plugin(name: &str) -> PathBuf {
    let p = petrel_testkit::prelude::petrel_bin()
        .parent()
        .map(|d| d.join(format!("petrel-nri-{name}")))
        .unwrap_or_default();
    assert!(
        p.is_file(),
        "{} missing: run `cargo build --workspace --bins`",
        p.display()
    );
    p
}

/// Installs a sample plugin as `NN-name` in the node's plugin directory
/// (before the runtime starts), with an optional configuration.
fn install(node: &Node, qualified: &str, sample: &str, conf: Option<&str>) {
    let dir = node.nri_dir();
    std::fs::create_dir_all(dir.join("plugins")).unwrap();
    std::os::unix::fs::symlink(sample_plugin(sample), dir.join("plugins").join(qualified)).unwrap();
    if let Some(conf) = conf {
        std::fs::create_dir_all(dir.join("conf.d")).unwrap();
        std::fs::write(dir.join("conf.d").join(format!("{qualified}.conf")), conf).unwrap();
    }
}

/// A runtime with extra `[nri]` settings and the sample plugins `install`
/// puts in place first.
fn start_node(extra_nri: &str, setup: impl FnOnce(&Node)) -> Node {
    let mut node = Node::prepare_with("", extra_nri);
    setup(&node);
    node.spawn();
    node
}

/// A stub builder for an in-process plugin dialling the node's socket.
fn plugin<S: Send + Sync + 'static>(
    node: &Node,
    index: &str,
    name: &str,
    state: S,
) -> StubBuilder<S> {
    Stub::builder(state)
        .name(name)
        .index(index)
        .socket_path(node.nri_dir().join("nri.sock"))
        .reconnect(Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(200),
        })
}

/// Runs a built stub in the background; returns its handle once the runtime
/// lists it as connected.
async fn run(c: &mut Clients, stub: Stub<impl Send + Sync + 'static>) -> StubHandle {
    let qualified = format!("{}-{}", stub.index(), stub.name());
    let handle = stub.handle();
    tokio::spawn(stub.run());
    wait_connected(c, &qualified).await;
    handle
}

/// The runtime's view of its plugins (`petrel ctl nri`).
async fn plugins(c: &mut Clients) -> Vec<NriPlugin> {
    c.admin
        .nri_plugins(NriPluginsRequest {})
        .await
        .unwrap()
        .into_inner()
        .plugins
}

async fn connected(c: &mut Clients, qualified: &str) -> Option<NriPlugin> {
    plugins(c)
        .await
        .into_iter()
        .find(|p| format!("{}-{}", p.index, p.name) == qualified && p.health == "connected")
}

async fn wait_connected(c: &mut Clients, qualified: &str) -> NriPlugin {
    let t0 = Instant::now();
    loop {
        if let Some(p) = connected(c, qualified).await {
            return p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "plugin {qualified} never connected: {:?}",
            plugins(c).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn exec(c: &mut Clients, id: &str, script: &str) -> String {
    let r = c.exec_sh(id, script, 10).await;
    assert_eq!(
        r.exit_code,
        0,
        "{script}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    String::from_utf8_lossy(&r.stdout).trim().to_string()
}

/// The OCI spec the container was created with (from verbose status).
async fn runtime_spec(c: &mut Clients, id: &str) -> serde_json::Value {
    c.verbose_info(id).await["runtimeSpec"].clone()
}

fn cgroup_file(node: &Node, pod: &str, id: &str, controller: &str, file: &str) -> String {
    let cg = format!("{}/{pod}/{id}", node.cgroup_parent);
    std::fs::read_to_string(Node::cgroup_dir(controller, &cg).join(file))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A pod whose every container gets an rlimit from the ulimit adjuster.
fn pod_with_annotations(
    node: &Node,
    name: &str,
    annotations: &[(&str, &str)],
) -> api::PodSandboxConfig {
    let mut pc = node.pod_config(name);
    pc.annotations = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    pc
}

fn no_container_left(node: &Node, pod_cgroup: &str) -> bool {
    let bundles = std::fs::read_dir(node.state.join("containers"))
        .map(|d| d.count())
        .unwrap_or(0);
    let layers = std::fs::read_dir(node.root.join("containers"))
        .map(|d| d.count())
        .unwrap_or(0);
    let cgroups = std::fs::read_dir(Node::cgroup_dir("memory", pod_cgroup))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .count()
        })
        .unwrap_or(0);
    bundles == 0 && layers == 0 && cgroups == 0
}

/// An answer to CreateContainer that sets `WHO=<value>`.
fn sets_who(value: &str) -> nri::CreateContainerResponse {
    let mut adjust = nri::ContainerAdjustment::default();
    adjust.env.push(nri::KeyValue {
        key: "WHO".into(),
        value: value.into(),
    });
    nri::CreateContainerResponse {
        adjust: Some(adjust),
        ..Default::default()
    }
}

/// Adds env, an annotation, a mount, a memory limit and a cpuset.
async fn adjuster(
    mount_src: Arc<PathBuf>,
    req: nri::CreateContainerRequest,
) -> Result<nri::CreateContainerResponse, PluginError> {
    let name = req.container.map(|c| c.name).unwrap_or_default();
    let mut adjust = nri::ContainerAdjustment::default();
    adjust.env.push(nri::KeyValue {
        key: "NRI_ADJUSTED".into(),
        value: format!("yes-{name}"),
    });
    adjust
        .annotations
        .insert("e2e.petrel.dev/adjusted".into(), name);
    adjust.mounts.push(nri::Mount {
        destination: "/nri-data".into(),
        r#type: "bind".into(),
        source: mount_src.display().to_string(),
        options: vec!["rbind".into(), "ro".into()],
    });
    adjust.linux = Some(nri::LinuxContainerAdjustment {
        resources: Some(nri::LinuxResources {
            memory: Some(nri::LinuxMemory {
                limit: Some(nri::OptionalInt64 { value: 48 << 20 }),
                ..Default::default()
            }),
            cpu: Some(nri::LinuxCpu {
                cpus: "0".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    Ok(nri::CreateContainerResponse {
        adjust: Some(adjust),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adjustments_should_be_visible_in_the_running_container() {
    let node = start_node("", |n| {
        install(n, "10-ulimit-adjuster", "ulimit-adjuster", None)
    });
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("hello"), "from the plugin\n").unwrap();
    let stub = plugin(&node, "50", "adjuster", data.path().to_path_buf())
        .on_create_container(|s: Arc<PathBuf>, r| adjuster(s, r))
        .build()
        .unwrap();
    run(&mut c, stub).await;
    let ulimit = wait_connected(&mut c, "10-ulimit-adjuster").await;
    assert!(ulimit.pre_registered && ulimit.pid > 0, "{ulimit:?}");
    assert!(
        ulimit.events.iter().any(|e| e == "CREATE_CONTAINER"),
        "{ulimit:?}"
    );

    let pc = pod_with_annotations(
        &node,
        "adjusted",
        &[(
            "ulimits.noderesource.dev/container.app",
            "- {type: nofile, soft: 1234, hard: 2345}\n",
        )],
    );
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("app", "sleep 1000")).await;

    assert_eq!(exec(&mut c, &id, "echo $NRI_ADJUSTED").await, "yes-app");
    assert_eq!(
        exec(&mut c, &id, "cat /nri-data/hello").await,
        "from the plugin"
    );
    // The container's own process (runc's exec may leave soft = hard for
    // open files: a race in Debian's runc 1.1).
    assert_eq!(
        exec(
            &mut c,
            &id,
            "grep 'Max open files' /proc/1/limits | tr -s ' ' | cut -d' ' -f4,5"
        )
        .await,
        "1234 2345"
    );
    assert_eq!(
        cgroup_file(&node, "adjusted", &id, "memory", "memory.limit_in_bytes"),
        (48u64 << 20).to_string()
    );
    assert_eq!(
        cgroup_file(&node, "adjusted", &id, "cpuset", "cpuset.cpus"),
        "0"
    );
    let spec = runtime_spec(&mut c, &id).await;
    assert_eq!(spec["annotations"]["e2e.petrel.dev/adjusted"], "app");
    // The record shows the adjusted resources too.
    let st = c.status(&id).await;
    let res = st.resources.unwrap().linux.unwrap();
    assert_eq!(res.memory_limit_in_bytes, 48 << 20);
    assert_eq!(res.cpuset_cpus, "0");

    // Both plugins were called and timed.
    let ps = plugins(&mut c).await;
    assert_eq!(
        ps.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        ["ulimit-adjuster", "adjuster"],
        "index order"
    );
    assert!(ps.iter().all(|p| p.calls >= 1 && p.errors == 0), "{ps:?}");
    let metrics = c.metrics().await;
    assert!(
        metrics.contains("petrel_runtime_nri_plugin_call_duration_seconds_count{plugin=\"50-adjuster\",event=\"CREATE_CONTAINER\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("petrel_runtime_nri_plugins 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_adjustments_should_fail_the_create_and_leave_nothing() {
    let node = start_node("", |_| {});
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let env = |value: &'static str| {
        move |_: Arc<()>, _req: nri::CreateContainerRequest| async move { Ok(sets_who(value)) }
    };
    let first = plugin(&node, "10", "first", ())
        .on_create_container(env("first"))
        .build()
        .unwrap();
    run(&mut c, first).await;
    let second = plugin(&node, "20", "second", ())
        .on_create_container(env("second"))
        .no_reconnect()
        .build()
        .unwrap();
    let second = run(&mut c, second).await;

    let pc = node.pod_config("conflict");
    let pod = c.run_pod(pc.clone()).await;
    let e = c
        .create(&pod, &pc, sh_container("app", "sleep 1000"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("\"10-first\"")
            && e.message().contains("\"20-second\"")
            && e.message().contains("WHO"),
        "{}",
        e.message()
    );
    let listed =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .containers;
    assert!(listed.is_empty(), "{listed:?}");
    let pod_cg = format!("{}/conflict", node.cgroup_parent);
    assert!(no_container_left(&node, &pod_cg), "debris left");
    // Again, now that the image is known: its rootfs is mounted while the
    // plugins are asked, and the failure must still leave nothing, no
    // mount either.
    let e = c
        .create(&pod, &pc, sh_container("app", "sleep 1000"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(no_container_left(&node, &pod_cg), "debris left");
    assert_eq!(mounts_under(&node.state.join("containers")).len(), 0);

    // Without the second plugin the same name is free and the create works.
    second.stop();
    let t0 = Instant::now();
    while connected(&mut c, "20-second").await.is_some() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let id = c.run(&pod, &pc, sh_container("app", "sleep 1000")).await;
    assert_eq!(exec(&mut c, &id, "echo $WHO").await, "first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_should_reject_and_required_plugins_should_fail_closed() {
    let node = start_node(
        "[nri.default_validator]\nenable = true\nreject_oci_hook_adjustment = true\nrequired_plugins = [\"guard\"]\n",
        |_| {},
    );
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("validated");
    let pod = c.run_pod(pc.clone()).await;

    // No plugin at all: the required one is missing.
    let e = c
        .create(&pod, &pc, sh_container("a", "sleep 1000"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("required plugin(s) \"guard\""),
        "{}",
        e.message()
    );

    // The required plugin, validating: it refuses containers named "bad".
    let guard = plugin(&node, "30", "guard", ())
        .on_validate_container_adjustment(
            |_, req: nri::ValidateContainerAdjustmentRequest| async move {
                let name = req.container.map(|c| c.name).unwrap_or_default();
                if name == "bad" {
                    return Err(PluginError::new("containers named bad are not welcome"));
                }
                Ok(())
            },
        )
        .build()
        .unwrap();
    run(&mut c, guard).await;
    let id = c.run(&pod, &pc, sh_container("a", "sleep 1000")).await;
    assert!(!id.is_empty());
    let e = c
        .create(&pod, &pc, sh_container("bad", "sleep 1000"))
        .await
        .unwrap_err();
    assert!(
        e.message().contains("\"30-guard\"") && e.message().contains("not welcome"),
        "{}",
        e.message()
    );

    // The default validator refuses OCI hook injection.
    let hooker = plugin(&node, "40", "hooker", ())
        .on_create_container(|_, _req| async move {
            let adjust = nri::ContainerAdjustment {
                hooks: Some(nri::Hooks {
                    prestart: vec![nri::Hook {
                        path: "/bin/true".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            Ok(nri::CreateContainerResponse {
                adjust: Some(adjust),
                ..Default::default()
            })
        })
        .build()
        .unwrap();
    run(&mut c, hooker).await;
    let e = c
        .create(&pod, &pc, sh_container("hooked", "sleep 1000"))
        .await
        .unwrap_err();
    assert!(
        e.message().contains("OCI hook injection") && e.message().contains("40-hooker"),
        "{}",
        e.message()
    );
    let listed =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .containers;
    assert_eq!(
        listed.len(),
        1,
        "only the first container exists: {listed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_plugin_should_be_relaunched_and_serve_again() {
    let node = start_node("", |n| {
        install(n, "10-ulimit-adjuster", "ulimit-adjuster", None)
    });
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let before = wait_connected(&mut c, "10-ulimit-adjuster").await;
    // SAFETY: kill(2) on the plugin process this runtime launched.
    assert_eq!(unsafe { libc::kill(before.pid, libc::SIGKILL) }, 0);
    let t0 = Instant::now();
    let after = loop {
        let p = wait_connected(&mut c, "10-ulimit-adjuster").await;
        if p.pid != before.pid {
            break p;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "not relaunched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(after.relaunches, 1, "{after:?}");
    assert_open_files_adjusted(&node, &mut c, "relaunched", 777).await;
    // A bad annotation fails the create with the plugin's message, nothing left.
    let bad = pod_with_annotations(
        &node,
        "badlimits",
        &[(
            "ulimits.noderesource.dev/pod",
            "- {type: nofiles, soft: 1, hard: 1}\n",
        )],
    );
    let bad_pod = c.run_pod(bad.clone()).await;
    let e = c
        .create(&bad_pod, &bad, sh_container("app", "true"))
        .await
        .unwrap_err();
    assert!(
        e.message().contains("10-ulimit-adjuster") && e.message().contains("nofiles"),
        "{}",
        e.message()
    );
    assert!(pod_cgroup_empty(&format!(
        "{}/badlimits",
        node.cgroup_parent
    )));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_whose_launcher_exits_should_be_reaped_at_once_and_keep_serving() {
    use std::os::unix::fs::PermissionsExt;
    // The launched file is a shell that starts the plugin in the background
    // and exits; the plugin keeps the inherited connection.
    let node = start_node("", |n| {
        let dir = n.nri_dir().join("plugins");
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("10-ulimit-adjuster");
        let real = sample_plugin("ulimit-adjuster");
        std::fs::write(
            &script,
            format!("#!/bin/sh\n'{}' \"$@\" &\nexit 0\n", real.display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    });
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    wait_connected(&mut c, "10-ulimit-adjuster").await;
    // The shell is waited for when it exits, not left a zombie until the
    // orphan reaper's two looks (its pid could be reused by then).
    node.assert_no_zombie_children(Duration::from_secs(3));
    let log = node.log();
    assert!(
        log.contains("nri: plugin process exited") && !log.contains("reaped an orphaned process"),
        "{}",
        &log[log.len().saturating_sub(3000)..]
    );
    assert_open_files_adjusted(&node, &mut c, "wrapped", 555).await;
}

/// Runs pod `name` asking the ulimit adjuster for an open-files limit of
/// `n`, and checks that its container got it.
async fn assert_open_files_adjusted(node: &Node, c: &mut Clients, name: &str, n: u32) {
    let pc = pod_with_annotations(
        node,
        name,
        &[(
            "ulimits.noderesource.dev/pod",
            &format!("- {{type: nofile, soft: {n}, hard: {n}}}\n"),
        )],
    );
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("app", "sleep 1000")).await;
    let limits = exec(
        c,
        &id,
        "grep 'Max open files' /proc/1/limits | tr -s ' ' | cut -d' ' -f4,5",
    )
    .await;
    assert_eq!(limits, format!("{n} {n}"));
}

/// True if the pod's cgroup has no container cgroup in it.
fn pod_cgroup_empty(pod_cgroup: &str) -> bool {
    std::fs::read_dir(Node::cgroup_dir("memory", pod_cgroup))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .count()
                == 0
        })
        .unwrap_or(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_plugin_should_cost_at_most_its_timeout() {
    let node = start_node(
        "plugin_request_timeout = \"300ms\"\n[nri.plugins.\"20-fatal\"]\ntimeout_fatal = true\nrequest_timeout = \"200ms\"\n",
        |_| {},
    );
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let hang = |_: Arc<()>, _req: nri::CreateContainerRequest| async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(nri::CreateContainerResponse::default())
    };
    let slow = plugin(&node, "10", "slow", ())
        .on_create_container(hang)
        .build()
        .unwrap();
    run(&mut c, slow).await;
    let pc = node.pod_config("hang");
    let pod = c.run_pod(pc.clone()).await;
    let t0 = Instant::now();
    let id = c.run(&pod, &pc, sh_container("a", "sleep 1000")).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert!(!id.is_empty());
    let slow = connected(&mut c, "10-slow").await.unwrap();
    assert_eq!(slow.timeouts, 1, "{slow:?}");

    // A plugin whose timeouts are fatal fails the call and is cut off.
    let fatal = plugin(&node, "20", "fatal", ())
        .on_create_container(hang)
        .no_reconnect()
        .build()
        .unwrap();
    run(&mut c, fatal).await;
    let e = c
        .create(&pod, &pc, sh_container("b", "sleep 1000"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    assert!(e.message().contains("20-fatal"), "{}", e.message());
    let t0 = Instant::now();
    while connected(&mut c, "20-fatal").await.is_some() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "fatal plugin still connected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Records every event it gets, in order.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<String>>,
    synced: Mutex<Vec<(usize, usize)>>,
}

impl Recorder {
    fn push(&self, what: &str, name: &str) {
        self.events.lock().unwrap().push(format!("{what} {name}"));
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

fn recording(node: &Node, r: Arc<Recorder>) -> Stub<Arc<Recorder>> {
    fn ctr(c: &Option<nri::Container>) -> String {
        c.as_ref().map(|c| c.name.clone()).unwrap_or_default()
    }
    fn pod(p: &Option<nri::PodSandbox>) -> String {
        p.as_ref().map(|p| p.name.clone()).unwrap_or_default()
    }
    plugin(node, "90", "recorder", r)
        .on_synchronize(|s: Arc<Arc<Recorder>>, pods, containers| async move {
            s.synced
                .lock()
                .unwrap()
                .push((pods.len(), containers.len()));
            Ok(Vec::new())
        })
        .on_run_pod_sandbox(|s, r| async move {
            s.push("RunPodSandbox", &pod(&r.pod));
            Ok(())
        })
        .on_stop_pod_sandbox(|s, r| async move {
            s.push("StopPodSandbox", &pod(&r.pod));
            Ok(())
        })
        .on_remove_pod_sandbox(|s, r| async move {
            s.push("RemovePodSandbox", &pod(&r.pod));
            Ok(())
        })
        .on_create_container(|s, r| async move {
            s.push("CreateContainer", &ctr(&r.container));
            Ok(nri::CreateContainerResponse::default())
        })
        .on_post_create_container(|s, r| async move {
            s.push("PostCreateContainer", &ctr(&r.container));
            Ok(())
        })
        .on_start_container(|s, r| async move {
            s.push("StartContainer", &ctr(&r.container));
            Ok(())
        })
        .on_post_start_container(|s, r| async move {
            s.push("PostStartContainer", &ctr(&r.container));
            Ok(())
        })
        .on_update_container(|s, r| async move {
            s.push("UpdateContainer", &ctr(&r.container));
            // Raise the CPU shares asked for by one: visible in the cgroup.
            let shares = r
                .linux_resources
                .and_then(|l| l.cpu)
                .and_then(|c| c.shares)
                .map_or(0, |s| s.value);
            let id = r.container.map(|c| c.id).unwrap_or_default();
            Ok(nri::UpdateContainerResponse {
                update: vec![nri::ContainerUpdate {
                    container_id: id,
                    linux: Some(nri::LinuxContainerUpdate {
                        resources: Some(nri::LinuxResources {
                            cpu: Some(nri::LinuxCpu {
                                shares: Some(nri::OptionalUInt64 { value: shares + 1 }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                    }),
                    ignore_failure: false,
                }],
                evict: Vec::new(),
            })
        })
        .on_post_update_container(|s, r| async move {
            s.push("PostUpdateContainer", &ctr(&r.container));
            Ok(())
        })
        .on_stop_container(|s, r| async move {
            s.push("StopContainer", &ctr(&r.container));
            Ok(nri::StopContainerResponse::default())
        })
        .on_remove_container(|s, r| async move {
            s.push("RemoveContainer", &ctr(&r.container));
            Ok(())
        })
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_should_reach_a_subscribed_plugin_in_order_and_restarts_reconnect_it() {
    let mut node = start_node("", |_| {});
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let rec = Arc::new(Recorder::default());
    run(&mut c, recording(&node, rec.clone())).await;
    assert_eq!(*rec.synced.lock().unwrap(), [(0, 0)]);

    let pc = node.pod_config("events");
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("app", "sleep 1000")).await;
    c.rt.update_container_resources(api::UpdateContainerResourcesRequest {
        container_id: id.clone(),
        linux: Some(api::LinuxContainerResources {
            cpu_shares: 300,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        cgroup_file(&node, "events", &id, "cpu", "cpu.shares"),
        "301"
    );
    assert_eq!(
        c.status(&id)
            .await
            .resources
            .unwrap()
            .linux
            .unwrap()
            .cpu_shares,
        301
    );
    c.stop(&id, 0).await.unwrap();
    // StopContainer is sent when the exit is recorded, off the call's path.
    let stopped = eventually(Duration::from_secs(5), || {
        rec.events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e == "StopContainer app")
    })
    .await;
    assert!(stopped);
    c.remove(&id).await.unwrap();
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    c.remove_pod(&pod).await.unwrap();
    assert_eq!(
        rec.take(),
        [
            "RunPodSandbox events",
            "CreateContainer app",
            "PostCreateContainer app",
            "StartContainer app",
            "PostStartContainer app",
            "UpdateContainer app",
            "PostUpdateContainer app",
            "StopContainer app",
            "RemoveContainer app",
            "StopPodSandbox events",
            "RemovePodSandbox events",
        ]
    );

    // A pod and a container that exist when the runtime restarts are in the
    // reconnecting plugin's Synchronize.
    let pod = c.run_pod(pc.clone()).await;
    c.run(&pod, &pc, sh_container("kept", "sleep 1000")).await;
    node.terminate();
    node.restart();
    let mut c = node.clients().await;
    wait_connected(&mut c, "90-recorder").await;
    assert_eq!(rec.synced.lock().unwrap().last(), Some(&(1, 1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_evictions_should_stop_the_container_with_the_reason() {
    let node = start_node("", |_| {});
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    // A plugin needs a handler to register; this one only watches removals.
    let stub = plugin(&node, "50", "evictor", ())
        .on_remove_container(|_, _| async { Ok(()) })
        .build()
        .unwrap();
    let h = run(&mut c, stub).await;
    let pc = node.pod_config("evicted");
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("app", "sleep 1000")).await;
    let failed = h
        .update_containers(
            Vec::new(),
            vec![nri::ContainerEviction {
                container_id: id.clone(),
                reason: "node too hot".into(),
            }],
        )
        .await
        .unwrap();
    assert!(failed.is_empty());
    let st = c
        .wait_state(
            &id,
            api::ContainerState::ContainerExited,
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(st.reason, "Evicted", "{st:?}");
    assert_eq!(
        st.message, "evicted by NRI plugin 50-evictor: node too hot",
        "{st:?}"
    );
    // An update of a container that does not exist comes back as failed.
    let failed = h
        .update_containers(
            vec![nri::ContainerUpdate {
                container_id: "nope".into(),
                linux: Some(nri::LinuxContainerUpdate {
                    resources: Some(nri::LinuxResources {
                        cpu: Some(nri::LinuxCpu {
                            shares: Some(nri::OptionalUInt64 { value: 100 }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                }),
                ignore_failure: false,
            }],
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_policy_should_pin_guaranteed_containers_and_update_the_shared_pool() {
    let node = start_node("", |n| {
        install(n, "20-cpu-policy", "cpu-policy", Some("cpus: \"0-1\"\n"))
    });
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    wait_connected(&mut c, "20-cpu-policy").await;
    let mut shared_pc = node.pod_config("shared");
    shared_pc.linux.as_mut().unwrap().cgroup_parent =
        format!("{}/burstable-shared", node.cgroup_parent);
    let shared_pod = c.run_pod(shared_pc.clone()).await;
    let shared = c
        .run(&shared_pod, &shared_pc, sh_container("s", "sleep 1000"))
        .await;
    let cpus = |pod: &str, id: &str| {
        let cg = format!("{}/{pod}/{id}", node.cgroup_parent);
        std::fs::read_to_string(Node::cgroup_dir("cpuset", &cg).join("cpuset.cpus"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    assert_eq!(cpus("burstable-shared", &shared), "0-1");

    let pc = node.pod_config("guaranteed");
    let pod = c.run_pod(pc.clone()).await;
    let mut cfg = sh_container("g", "sleep 1000");
    cfg.linux = Some(api::LinuxContainerConfig {
        resources: Some(api::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 100_000,
            cpu_shares: 1024,
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        }),
        security_context: None,
    });
    let g = c.run(&pod, &pc, cfg).await;
    let exclusive = cpus("guaranteed", &g);
    assert!(exclusive == "0" || exclusive == "1", "{exclusive}");
    let rest = if exclusive == "0" { "1" } else { "0" };
    let moved = eventually(Duration::from_secs(5), || {
        cpus("burstable-shared", &shared) == rest
    })
    .await;
    assert!(
        moved,
        "shared container on {}",
        cpus("burstable-shared", &shared)
    );
    // When the exclusive container stops, the pool grows back.
    c.stop(&g, 0).await.unwrap();
    let back = eventually(Duration::from_secs(5), || {
        cpus("burstable-shared", &shared) == "0-1"
    })
    .await;
    assert!(
        back,
        "shared container on {}",
        cpus("burstable-shared", &shared)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronize_should_deliver_a_thousand_containers_in_chunks() {
    let node = start_node("", |_| {});
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    const PODS: usize = 10;
    const PER_POD: usize = 100;
    // 5 KiB of annotations each: 1000 of them (5 MiB) do not fit one ttRPC
    // message (4 MiB), so the Synchronize must be split.
    let big = "x".repeat(5 * 1024);
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..PODS {
        let mut c = node.clients().await;
        let pc = node.pod_config(&format!("sync{p}"));
        let big = big.clone();
        tasks.spawn(async move {
            let pod = c.run_pod(pc.clone()).await;
            for i in 0..PER_POD {
                let mut cfg = sh_container(&format!("c{i}"), "true");
                cfg.annotations =
                    HashMap::from([("e2e.petrel.dev/filler".to_string(), big.clone())]);
                c.create(&pod, &pc, cfg).await.unwrap();
            }
        });
    }
    let t0 = Instant::now();
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    eprintln!(
        "{} containers created in {:?}",
        PODS * PER_POD,
        t0.elapsed()
    );
    let rec = Arc::new(Recorder::default());
    let stub = recording(&node, rec.clone());
    let t0 = Instant::now();
    run(&mut c, stub).await;
    let took = t0.elapsed();
    assert_eq!(*rec.synced.lock().unwrap(), [(PODS, PODS * PER_POD)]);
    eprintln!("synchronize of {} containers took {took:?}", PODS * PER_POD);
    let log = node.log();
    assert!(
        log.contains("nri: plugin synchronized") && log.contains("containers=1000"),
        "{}",
        &log[log.len().saturating_sub(2000)..]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_plugins_should_be_refused_and_the_runtime_should_keep_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let node = start_node("", |_| {});
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;

    // Garbage on the socket: the connection is dropped, nothing else happens.
    let mut raw = tokio::net::UnixStream::connect(node.nri_dir().join("nri.sock"))
        .await
        .unwrap();
    raw.write_all(&[0xff; 64]).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), raw.read(&mut buf))
        .await
        .expect("the runtime closes a connection sending garbage")
        .unwrap_or(0);
    assert_eq!(n, 0, "nothing is answered to garbage");
    // The socket closes before the refusal is logged: wait for the line.
    assert!(
        eventually(Duration::from_secs(5), || node
            .log()
            .contains("nri: external plugin refused"))
        .await,
        "{}",
        node.log()
    );

    // An adjustment the runtime cannot apply fails the create by name, and
    // leaves nothing.
    let bad = plugin(&node, "10", "bad", ())
        .on_create_container(|_, _req| async move {
            let mut adjust = nri::ContainerAdjustment::default();
            adjust.mounts.push(nri::Mount {
                destination: "relative/path".into(),
                r#type: "bind".into(),
                source: "/tmp".into(),
                options: vec!["rbind".into()],
            });
            Ok(nri::CreateContainerResponse {
                adjust: Some(adjust),
                ..Default::default()
            })
        })
        .build()
        .unwrap();
    run(&mut c, bad).await;
    let pc = node.pod_config("badadjust");
    let pod = c.run_pod(pc.clone()).await;
    let e = c
        .create(&pod, &pc, sh_container("app", "sleep 1000"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("mount destination") && e.message().contains("relative/path"),
        "{}",
        e.message()
    );
    assert!(no_container_left(
        &node,
        &format!("{}/badadjust", node.cgroup_parent)
    ));
    // CRI goes on.
    c.rt.version(api::VersionRequest::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_images_rootfs_should_be_mounted_while_plugins_are_asked() {
    let node = start_node("", |_| {});
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let who = plugin(&node, "10", "who", ())
        .on_create_container(|_: Arc<()>, _req| async move { Ok(sets_who("plugin")) })
        .build()
        .unwrap();
    run(&mut c, who).await;
    let pc = node.pod_config("known");
    let pod = c.run_pod(pc.clone()).await;
    let as_user = |name: &str, user: &str| {
        let mut cfg = sh_container(name, "sleep 1000");
        cfg.linux = Some(api::LinuxContainerConfig {
            security_context: Some(api::LinuxContainerSecurityContext {
                run_as_username: user.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        });
        cfg
    };
    // The image's first container: mounted first, its users read from it.
    // The second: the users are known, the mount runs while the plugin is
    // asked. Both run as the image's `nobody`, with the plugin's change.
    for name in ["first", "second"] {
        let id = c.run(&pod, &pc, as_user(name, "nobody")).await;
        assert_eq!(exec(&mut c, &id, "id -u").await, "65534", "{name}");
        assert_eq!(exec(&mut c, &id, "echo $WHO").await, "plugin", "{name}");
    }
    // A user the image does not have: refused, naming the field, and the
    // rootfs mounted meanwhile is gone again.
    let e = c
        .create(&pod, &pc, as_user("ghost", "nosuchuser"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("run_as_username"), "{}", e.message());
    let bundles = std::fs::read_dir(node.state.join("containers"))
        .unwrap()
        .count();
    assert_eq!(bundles, 2);
    assert_eq!(mounts_under(&node.state.join("containers")).len(), 2);
    // The runtime tells what NRI added to each create apart from what it took.
    let text = c.metrics().await;
    for metric in [
        "petrel_runtime_nri_create_container_wait_seconds_count{plugins=\"1\"} 2",
        "petrel_runtime_nri_create_container_duration_seconds_count{plugins=\"1\"} 2",
    ] {
        assert!(text.contains(metric), "{metric} not in:\n{text}");
    }
}

/// Until a plugin's RunPodSandbox hook returns, the pod is not listed, has
/// no status and takes no container; after it, the pod is Ready and runs
/// containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_should_stay_unseen_until_its_run_pod_sandbox_hook_returns() {
    let node = start_node("", |_| {});
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let (reached_tx, reached_rx) = std::sync::mpsc::channel::<String>();
    let reached_tx = Mutex::new(reached_tx);
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let stub = plugin(&node, "10", "blocker", ())
        .on_run_pod_sandbox(move |_s, req: nri::RunPodSandboxRequest| {
            let id = req.pod.map(|p| p.id).unwrap_or_default();
            let _ = reached_tx.lock().unwrap().send(id);
            let r = r.clone();
            async move {
                r.notified().await;
                Ok(())
            }
        })
        .build()
        .unwrap();
    let handle = run(&mut c, stub).await;

    let pc = node.pod_config("hooked");
    let mut rt = c.rt.clone();
    let req = api::RunPodSandboxRequest {
        config: Some(pc.clone()),
        runtime_handler: String::new(),
    };
    let running = tokio::spawn(async move { rt.run_pod_sandbox(req).await });
    let id = tokio::task::spawn_blocking(move || reached_rx.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the RunPodSandbox hook was not called");

    let listed =
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
            .await
            .unwrap()
            .into_inner()
            .items;
    assert!(listed.iter().all(|p| p.id != id), "{listed:?}");
    let status =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    let created =
        c.rt.create_container(api::CreateContainerRequest {
            pod_sandbox_id: id.clone(),
            config: Some(sh_container("early", "sleep 1000")),
            sandbox_config: Some(pc.clone()),
        })
        .await;
    assert!(created.is_err(), "{created:?}");

    release.notify_one();
    let ran = running.await.unwrap().unwrap().into_inner();
    assert_eq!(ran.pod_sandbox_id, id);
    let status =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.status.unwrap().state,
        api::PodSandboxState::SandboxReady as i32
    );
    let ctr = c.run(&id, &pc, sh_container("late", "sleep 1000")).await;
    c.stop(&ctr, 0).await.unwrap();
    c.remove_pod(&id).await.unwrap();
    handle.stop();
}

/// StopPodSandbox reaches plugins once however often a pod is stopped, and
/// StopPodSandbox and RemovePodSandbox name the pod's addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_stop_should_reach_plugins_once_with_its_addresses() {
    let net =
        petrel_testkit::network::PodNetwork::with_chain(petrel_testkit::network::LOOPBACK_PORTMAP);
    let mut node = Node::prepare_with(&net.cri_config(), "");
    node.spawn();
    let mut c = node.clients().await;
    let told: Arc<Mutex<Vec<String>>> = Arc::default();
    let (t1, t2) = (told.clone(), told.clone());
    let note = |t: &Mutex<Vec<String>>, what: &str, pod: Option<nri::PodSandbox>| {
        let pod = pod.unwrap_or_default();
        t.lock()
            .unwrap()
            .push(format!("{what} {} {}", pod.id, pod.ips.join(",")));
    };
    let stub = plugin(&node, "10", "stops", ())
        .on_stop_pod_sandbox(move |_s, req: nri::StopPodSandboxRequest| {
            note(&t1, "stop", req.pod);
            async { Ok(()) }
        })
        .on_remove_pod_sandbox(move |_s, req: nri::RemovePodSandboxRequest| {
            note(&t2, "remove", req.pod);
            async { Ok(()) }
        })
        .build()
        .unwrap();
    let handle = run(&mut c, stub).await;

    let pod = c.run_pod(node.pod_config("twice")).await;
    let ip =
        c.rt.pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    assert!(ip.starts_with(&net.prefix), "{ip}");
    for _ in 0..3 {
        c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    }
    c.remove_pod(&pod).await.unwrap();
    c.remove_pod(&pod).await.unwrap();
    assert_eq!(
        *told.lock().unwrap(),
        [format!("stop {pod} {ip}"), format!("remove {pod} {ip}")]
    );
    assert!(net.leased().is_empty(), "{:?}", net.leased());
    handle.stop();
}

/// A plugin that connects late and takes longer than the request timeout
/// to synchronize is kept, and learns of a container created meanwhile
/// (the create waits for the Synchronize to end, then reaches it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_created_while_a_late_plugin_synchronizes_should_reach_it() {
    let node = start_node("", |_| {});
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("sync");
    let pod = c.run_pod(pc.clone()).await;
    let before = c.run(&pod, &pc, sh_container("before", "sleep 1000")).await;

    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let (s1, s2) = (seen.clone(), seen.clone());
    let (reached_tx, reached_rx) = std::sync::mpsc::channel::<()>();
    let reached_tx = Mutex::new(reached_tx);
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let stub = plugin(&node, "20", "late", ())
        .on_synchronize(move |_s, _pods, containers: Vec<nri::Container>| {
            s1.lock()
                .unwrap()
                .extend(containers.into_iter().map(|c| c.id));
            let _ = reached_tx.lock().unwrap().send(());
            let r = r.clone();
            async move {
                r.notified().await;
                Ok(Vec::new())
            }
        })
        .on_create_container(move |_s, req: nri::CreateContainerRequest| {
            s2.lock()
                .unwrap()
                .push(req.container.map(|c| c.id).unwrap_or_default());
            async { Ok(nri::CreateContainerResponse::default()) }
        })
        .build()
        .unwrap();
    let handle = stub.handle();
    tokio::spawn(stub.run());
    tokio::task::spawn_blocking(move || reached_rx.recv_timeout(Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("Synchronize was not called");

    let mut rt = c.rt.clone();
    let req = api::CreateContainerRequest {
        pod_sandbox_id: pod.clone(),
        config: Some(sh_container("during", "sleep 1000")),
        sandbox_config: Some(pc.clone()),
    };
    let creating = tokio::spawn(async move { rt.create_container(req).await });
    // Past the default request timeout (2 s) of the Synchronize call.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    release.notify_one();
    let during = creating.await.unwrap().unwrap().into_inner().container_id;
    wait_connected(&mut c, "20-late").await;
    let after = c.run(&pod, &pc, sh_container("after", "sleep 1000")).await;
    let seen = seen.lock().unwrap().clone();
    for id in [&before, &during, &after] {
        assert_eq!(
            seen.iter().filter(|s| *s == id).count(),
            1,
            "container {id} reached the late plugin other than once: {seen:?}"
        );
    }
    c.remove_pod(&pod).await.unwrap();
    handle.stop();
}
