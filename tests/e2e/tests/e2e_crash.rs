//! kill -9 at any moment loses nothing and leaves nothing: the runtime is
//! killed in the middle of bursts of concurrent CreateContainer and
//! StartContainer calls, restarted on the same root and state, and after
//! every restart its records, runc's containers, the shims, the rootfs
//! mounts and the containers' cgroups must agree; every acknowledged call
//! must have stuck, every name whose create was not acknowledged must be
//! free or held by a usable container, and every container must start and
//! be removed.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_testkit::prelude::*;

/// When the kill comes, one round each, as a fraction of the time an
/// undisturbed burst takes here (measured first; a debug build on a busy
/// machine is much slower than the release runtime's 2-200 ms): early in
/// the creates' first steps, inside `runc create`, at the handshakes and
/// commits, and among the starts.
const KILL_AT: [f64; 8] = [0.02, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 1.0];
/// Concurrent creates per burst.
const CREATES: usize = 20;
/// Longest a StartContainer may take: the runtime's own bound is 30 s.
const CALL_BOUND: Duration = Duration::from_secs(40);

/// Everything that names a container, by id.
#[derive(Debug, Default)]
struct Seen {
    /// CRI records: id → (state, name).
    records: BTreeMap<String, (api::ContainerState, String)>,
    /// runc: id → status.
    runc: HashMap<String, String>,
    /// Live shims: id → pid.
    shims: HashMap<String, u32>,
    /// Rootfs mounts: ids.
    mounts: BTreeSet<String>,
    /// Container cgroups (memory, pids, freezer hierarchies): ids.
    cgroups: BTreeSet<String>,
    /// Bundles and writable layers: ids.
    dirs: BTreeSet<String>,
}

fn ids_in(dir: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.len() == 64)
        .collect()
}

async fn look(node: &Node, c: &mut Clients, pod_cgroup: &str) -> Seen {
    let records =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .expect("ListContainers")
            .into_inner()
            .containers
            .into_iter()
            .map(|k| {
                let name = k.metadata.map(|m| m.name).unwrap_or_default();
                (
                    k.id,
                    (api::ContainerState::try_from(k.state).unwrap(), name),
                )
            })
            .collect();
    let containers = node.state.join("containers");
    let mounts = mounts_under(&containers)
        .into_iter()
        .filter_map(|m| {
            let rel = std::path::Path::new(&m).strip_prefix(&containers).ok()?;
            Some(rel.components().next()?.as_os_str().to_str()?.to_string())
        })
        .collect();
    let mut cgroups = BTreeSet::new();
    for ctrl in ["memory", "pids", "freezer"] {
        cgroups.extend(ids_in(&Node::cgroup_dir(ctrl, pod_cgroup)));
    }
    let mut dirs = ids_in(&containers);
    dirs.extend(ids_in(&node.root.join("containers")));
    Seen {
        records,
        runc: node.runc_list(),
        shims: node.live_shims(),
        mounts,
        cgroups,
        dirs,
    }
}

/// What does not agree: anything without a record, any record without
/// what its state needs.
fn disagreements(s: &Seen) -> Vec<String> {
    let mut bad = Vec::new();
    let recorded = |id: &String| s.records.contains_key(id);
    for id in s.runc.keys().filter(|id| !recorded(id)) {
        bad.push(format!(
            "runc container {id} ({}) has no record",
            s.runc[id]
        ));
    }
    for id in s.shims.keys().filter(|id| !recorded(id)) {
        bad.push(format!("shim {} of {id} has no record", s.shims[id]));
    }
    for id in s.mounts.iter().filter(|id| !recorded(id)) {
        bad.push(format!("rootfs mount of {id} has no record"));
    }
    for id in s.cgroups.iter().filter(|id| !recorded(id)) {
        bad.push(format!("cgroup of {id} has no record"));
    }
    for id in s.dirs.iter().filter(|id| !recorded(id)) {
        bad.push(format!("bundle or layer of {id} has no record"));
    }
    for (id, (state, name)) in &s.records {
        let runc = s.runc.get(id).map(String::as_str);
        let live = s.shims.contains_key(id);
        let ok = match state {
            // Not started: no process (its shim and runc create come with
            // StartContainer), its rootfs mounted.
            api::ContainerState::ContainerCreated => {
                runc.is_none() && !live && s.mounts.contains(id) && !s.cgroups.contains(id)
            }
            api::ContainerState::ContainerRunning => {
                runc == Some("running") && live && s.mounts.contains(id) && s.cgroups.contains(id)
            }
            api::ContainerState::ContainerExited => !live && runc != Some("running"),
            _ => false,
        };
        if !ok {
            bad.push(format!(
                "{name} ({id}) is {state:?} but runc says {runc:?}, shim {}, mount {}, cgroup {}",
                if live { "alive" } else { "gone" },
                s.mounts.contains(id),
                s.cgroups.contains(id),
            ));
        }
    }
    bad
}

/// Looks until everything agrees (exits seen after a restart are recorded
/// a moment later), at most 15 s.
async fn agreed(node: &Node, c: &mut Clients, pod_cgroup: &str, when: &str) -> Seen {
    let t0 = Instant::now();
    loop {
        let seen = look(node, c, pod_cgroup).await;
        let bad = disagreements(&seen);
        if bad.is_empty() {
            return seen;
        }
        if t0.elapsed() > Duration::from_secs(15) {
            panic!(
                "{when}: records, runc, shims, mounts and cgroups disagree:\n{}\n{}",
                bad.join("\n"),
                node.log()
                    .lines()
                    .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn sleeper(name: &str) -> api::ContainerConfig {
    sh_container(name, "sleep 1000")
}

fn jitter_ms(max: u64) -> u64 {
    let mut b = [0u8; 2];
    getrandom::getrandom(&mut b).expect("random");
    u64::from(u16::from_le_bytes(b)) % (max + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_creates_and_starts_should_leave_records_runc_shims_mounts_and_cgroups_agreeing(
) {
    let t0 = Instant::now();
    let mut node = Node::start_with_busybox().await;
    let mut c = node.clients().await;
    let pc = node.pod_config("crash");
    let pod_cgroup = pc.linux.as_ref().unwrap().cgroup_parent.clone();
    let pod = c.run_pod(pc.clone()).await;
    // How long a burst takes without a kill: creates, then starts.
    let t = Instant::now();
    let mut calibration = Vec::new();
    for i in 0..CREATES {
        let (mut c, pod, pc) = (c.clone(), pod.clone(), pc.clone());
        calibration.push(tokio::spawn(async move {
            c.create(&pod, &pc, sleeper(&format!("cal{i}"))).await
        }));
    }
    let mut to_start: Vec<String> = Vec::new();
    for t in calibration {
        to_start.push(t.await.unwrap().expect("CreateContainer"));
    }
    let burst = t.elapsed();
    eprintln!("{CREATES} concurrent creates took {burst:?}");

    for (round, at) in KILL_AT.iter().enumerate() {
        let names: Vec<String> = (0..CREATES).map(|i| format!("r{round}c{i}")).collect();
        let mut creates = Vec::new();
        for name in &names {
            let (mut c, pod, pc, name) = (c.clone(), pod.clone(), pc.clone(), name.clone());
            creates.push(tokio::spawn(async move {
                let r = c.create(&pod, &pc, sleeper(&name)).await;
                (name, r)
            }));
        }
        let mut starts = Vec::new();
        for id in to_start.drain(..) {
            let mut c = c.clone();
            starts.push(tokio::spawn(async move {
                let r = c.start(&id).await;
                (id, r)
            }));
        }
        let base = (burst.as_millis() as f64 * at) as u64;
        let delay = base + jitter_ms(base / 4);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        node.kill9();
        let log_before = node.log().len();
        let mut acked_creates = BTreeMap::new();
        for t in creates {
            let (name, r) = tokio::time::timeout(CALL_BOUND, t)
                .await
                .expect("a create outlived its runtime")
                .unwrap();
            if let Ok(id) = r {
                acked_creates.insert(name, id);
            }
        }
        let mut acked_starts = Vec::new();
        for t in starts {
            let (id, r) = tokio::time::timeout(CALL_BOUND, t)
                .await
                .expect("a start outlived its runtime")
                .unwrap();
            if r.is_ok() {
                acked_starts.push(id);
            }
        }
        node.restart();
        c = node.clients().await;
        let when = format!("round {round}, killed {delay} ms in");
        let seen = agreed(&node, &mut c, &pod_cgroup, &when).await;

        // Nothing acknowledged was lost.
        for (name, id) in &acked_creates {
            assert!(
                seen.records.contains_key(id),
                "{when}: acknowledged create of {name} ({id}) lost"
            );
        }
        for id in &acked_starts {
            let state = seen.records.get(id).map(|r| r.0);
            assert!(
                matches!(
                    state,
                    Some(
                        api::ContainerState::ContainerRunning
                            | api::ContainerState::ContainerExited
                    )
                ),
                "{when}: acknowledged start of {id} lost: {state:?}"
            );
        }
        // A name whose create is not recorded is free again (kubelet
        // retries with the same name).
        let recorded_names: BTreeSet<&str> =
            seen.records.values().map(|(_, n)| n.as_str()).collect();
        let retries: Vec<&String> = names
            .iter()
            .filter(|n| !recorded_names.contains(n.as_str()))
            .collect();
        let mut again = Vec::new();
        for name in &retries {
            let (mut c, pod, pc, name) = (c.clone(), pod.clone(), pc.clone(), name.to_string());
            again.push(tokio::spawn(async move {
                let r = c.create(&pod, &pc, sleeper(&name)).await;
                (name, r)
            }));
        }
        for t in again {
            let (name, r) = t.await.unwrap();
            if let Err(e) = r {
                panic!("{when}: {name} cannot be created again: {e}");
            }
        }

        // Every created container is started in the next burst; every
        // other one is removed now.
        let seen = agreed(
            &node,
            &mut c,
            &pod_cgroup,
            &format!("{when}, after retries"),
        )
        .await;
        let mut removals = Vec::new();
        for (id, (state, _)) in &seen.records {
            if *state == api::ContainerState::ContainerCreated {
                to_start.push(id.clone());
                continue;
            }
            let (mut c, id) = (c.clone(), id.clone());
            removals.push(tokio::spawn(async move {
                let r = c.remove(&id).await;
                (id, r)
            }));
        }
        for t in removals {
            let (id, r) = t.await.unwrap();
            if let Err(e) = r {
                panic!("{when}: {id} cannot be removed: {e}");
            }
        }
        let log = node.log();
        let recovery = &log[log_before.min(log.len())..];
        let count = |what: &str| recovery.matches(what).count();
        let waited = recovery
            .lines()
            .filter(|l| l.contains("waited for shims inside their create"))
            .filter_map(|l| l.split("shims=").nth(1)?.split_whitespace().next())
            .collect::<Vec<_>>()
            .join(",");
        eprintln!(
            "{when}: {} creates and {} starts acknowledged; recovery removed {} half-made \
             (waited for shims in their create: {waited:?}), recorded {} starts; {} names \
             created again, {} to start; {:?} so far",
            acked_creates.len(),
            acked_starts.len(),
            count("interrupted create removed"),
            count("had started the container: recorded running"),
            retries.len(),
            to_start.len(),
            t0.elapsed()
        );
    }

    // Whatever is still created starts (bounded), and everything goes.
    for id in &to_start {
        match tokio::time::timeout(CALL_BOUND, c.start(id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{id} cannot be started: {e}"),
            Err(_) => panic!("StartContainer of {id} hung"),
        }
    }
    let seen = agreed(&node, &mut c, &pod_cgroup, "at the end").await;
    assert!(seen
        .records
        .values()
        .all(|(s, _)| *s == api::ContainerState::ContainerRunning));
    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris("crash");
    assert!(node.runc_list().is_empty(), "{:?}", node.runc_list());
    assert!(node.live_shims().is_empty(), "{:?}", node.live_shims());
}
