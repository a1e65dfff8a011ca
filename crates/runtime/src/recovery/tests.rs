//! The whole recovery pass on a fake host: every combination of what a
//! crash can leave of a container (its record, its pod, its shim, its init
//! and runc's view) is set up at once, recovered in one pass, and checked
//! against what the module's doc promises for it.

use std::path::PathBuf;
use std::time::Duration;

use petrel_store::Table;

use crate::parts::fake::{Call, ExitFile, FakeContainer, FakeShim, Fault, Status, TestRuntime};
use crate::parts::{InitSeen, RootfsMounter, ShimSeen};
use crate::records::{ContainerRecord, ContainerState, ProcessRef, SandboxRecord, SandboxState};
use crate::util;

use ContainerState::*;

/// What a crash left of one container.
#[derive(Debug, Clone, Copy)]
struct Case {
    record: Option<ContainerState>,
    pod_known: bool,
    shim: ShimSeen,
    init: InitSeen,
    /// runc's exec FIFO is there.
    fifo: bool,
    /// runc knows the container.
    in_runc: bool,
}

/// What recovery must have done with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Everything of it is gone, its name free.
    Removed,
    /// Its exited record stays as it was.
    Kept,
    /// The exit its shim recorded while the runtime was down is committed.
    ExitRecorded,
    /// An interrupted start is recorded: `Running`; the FIFO cleared when
    /// it was there.
    MarkedRunning { fifo_cleared: bool },
    /// Left in its state and watched: a later exit is recorded.
    Watched(ContainerState),
}

/// The promise of `recovery`'s doc, case by case.
fn expected(c: &Case) -> Outcome {
    let acknowledged = matches!(c.record, Some(Created | Running | Exited));
    if !acknowledged || !c.pod_known {
        return Outcome::Removed;
    }
    match (c.record, c.shim, c.init) {
        (Some(Exited), ..) => Outcome::Kept,
        (_, ShimSeen::Gone, _) => Outcome::ExitRecorded,
        (Some(Created), _, InitSeen::Started) => Outcome::MarkedRunning {
            fifo_cleared: c.fifo,
        },
        (Some(Running), _, InitSeen::Started) if c.fifo => {
            Outcome::MarkedRunning { fifo_cleared: true }
        }
        (Some(state), ..) => Outcome::Watched(state),
        (None, ..) => Outcome::Removed,
    }
}

/// Every combination a crash can leave (a live init or shim is one runc
/// knows; an init waits for its start only through the FIFO; a shim is
/// inside its create only for a create no client was answered for).
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for record in [
        None,
        Some(Creating),
        Some(Created),
        Some(Running),
        Some(Exited),
    ] {
        for pod_known in [true, false] {
            for shim in [ShimSeen::Gone, ShimSeen::InCreate, ShimSeen::Serving] {
                for init in [InitSeen::Gone, InitSeen::AwaitingStart, InitSeen::Started] {
                    for fifo in [false, true] {
                        for in_runc in [false, true] {
                            let c = Case {
                                record,
                                pod_known,
                                shim,
                                init,
                                fifo,
                                in_runc,
                            };
                            let acknowledged = matches!(record, Some(Created | Running | Exited));
                            let live = init != InitSeen::Gone || shim != ShimSeen::Gone;
                            let valid = (!live || in_runc)
                                && (init != InitSeen::AwaitingStart || fifo)
                                && (!fifo || in_runc)
                                && (shim != ShimSeen::InCreate || !acknowledged || !pod_known)
                                && (record.is_some() || pod_known);
                            if valid {
                                out.push(c);
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// One container as the crash left it.
struct Left {
    case: Case,
    id: String,
    bundle: PathBuf,
    layer: PathBuf,
    cgroup: String,
}

fn set_up(t: &TestRuntime, pod: &SandboxRecord, n: usize, case: Case) -> Left {
    let rt = &t.rt;
    let id = util::new_id().expect("id");
    let sandbox_id = if case.pod_known {
        pod.id.clone()
    } else {
        util::new_id().expect("id")
    };
    let bundle = rt.layout.bundle(&id);
    let layer = rt.layout.container_layer(&id);
    let cgroup = format!("{}/{id}", pod.cgroup_parent);
    std::fs::create_dir_all(&bundle).expect("bundle");
    std::fs::create_dir_all(layer.join("upper")).expect("layer");
    std::fs::write(
        bundle.join("config.json"),
        serde_json::json!({ "linux": { "cgroupsPath": cgroup } }).to_string(),
    )
    .expect("config.json");
    t.host
        .mount(
            &[],
            &crate::container::rootfs::WritableLayer::new(&layer),
            &layer,
            &bundle.join("rootfs"),
            None,
        )
        .expect("mount");
    crate::parts::CgroupOps::ensure_dirs(t.host.as_ref(), &cgroup).expect("cgroup");
    let init_pid = t.host.new_pid();
    if case.in_runc {
        let (status, start_pending) = match case.init {
            InitSeen::Gone => (Status::Stopped, case.fifo),
            InitSeen::AwaitingStart => (Status::Created, true),
            InitSeen::Started => (Status::Running, case.fifo),
        };
        t.host.put_container(
            &id,
            FakeContainer {
                status,
                init_pid,
                bundle: bundle.clone(),
                start_pending,
                cgroup: Some(cgroup.clone()),
            },
        );
    }
    let shim_pid = t.host.put_shim(FakeShim {
        id: id.clone(),
        bundle: bundle.clone(),
        alive: case.shim != ShimSeen::Gone,
        seen: case.shim,
        create_looks: 2,
    });
    if case.shim == ShimSeen::Gone {
        // The exit the shim recorded before it went.
        std::fs::write(bundle.join(petrel_shim::EXIT_FILE), "5 2000\n").expect("exit");
    }
    if let Some(state) = case.record {
        let rec = ContainerRecord {
            id: id.clone(),
            sandbox_id,
            name: format!("c{n}_p_unit_uid_0"),
            config: crate::parts::fake::container_config(&format!("c{n}")),
            image_id: String::new(),
            state,
            created_at: 1,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            pid: init_pid,
            init_start_time: 1,
            own_pid_ns: false,
            shim: Some(ProcessRef {
                pid: shim_pid,
                start_time: 1,
            }),
            bundle: bundle.clone(),
            layer_dir: layer.clone(),
            log_path: None,
            cgroup_path: cgroup.clone(),
            resources: None,
            user: None,
            restored_from: None,
            image_volumes: Vec::new(),
        };
        // Unsynced: hundreds of fsyncs would make the test slow.
        rt.store
            .put_unsynced(Table::Containers, &id, &rec)
            .expect("store record");
    }
    Left {
        case,
        id,
        bundle,
        layer,
        cgroup,
    }
}

fn pod_record(t: &TestRuntime) -> SandboxRecord {
    let id = util::new_id().expect("id");
    let rec = SandboxRecord {
        id: id.clone(),
        name: "p_unit_uid_0".to_string(),
        config: crate::parts::fake::pod_config("p"),
        runtime_handler: String::new(),
        state: SandboxState::Ready,
        created_at: 1,
        dir: t.rt.layout.sandbox_dir(&id),
        netns: None,
        ipcns: None,
        utsns: None,
        userns: None,
        pid_holder: None,
        shm_mounted: false,
        cgroup_parent: format!("/petrel-unit/{id}"),
        created_cgroups: Vec::new(),
        created_cgroup_dirs: Vec::new(),
        network: None,
        released_ips: Vec::new(),
    };
    t.rt.store
        .put(Table::Sandboxes, &id, &rec)
        .expect("store pod");
    rec
}

#[tokio::test]
async fn recovery_should_reconcile_every_combination_of_record_shim_and_runc_state() {
    let t = TestRuntime::new();
    let pod = pod_record(&t);
    let left: Vec<Left> = cases()
        .into_iter()
        .enumerate()
        .map(|(n, case)| set_up(&t, &pod, n, case))
        .collect();
    assert!(left.len() > 50, "only {} cases", left.len());
    t.host.clear_calls();
    t.rt.recover().await.expect("recover");
    let calls = t.host.calls();
    let mut watched = Vec::new();
    for l in &left {
        let want = expected(&l.case);
        let what = format!("{:?} expected {want:?}", l.case);
        let state = t.state(&l.id);
        let stored = t.stored(&l.id);
        let cleared = calls.contains(&Call::ClearStart(l.id.clone()));
        match want {
            Outcome::Removed => {
                assert_eq!(state, None, "{what}");
                assert!(stored.is_none(), "{what}: record left");
                assert!(
                    !t.host.containers().contains_key(&l.id),
                    "{what}: runc container left"
                );
                assert!(
                    !t.host.live_shims().iter().any(|(_, s)| s.id == l.id),
                    "{what}: shim left"
                );
                assert!(
                    !t.host.mounts().contains(&l.bundle.join("rootfs")),
                    "{what}: mount left"
                );
                assert!(!l.bundle.exists(), "{what}: bundle left");
                assert!(!l.layer.exists(), "{what}: layer left");
                assert!(!t.host.cgroups().contains(&l.cgroup), "{what}: cgroup left");
            }
            Outcome::Kept => {
                assert_eq!(state, Some(Exited), "{what}");
                let rec = stored.expect("record");
                assert_eq!((rec.state, rec.exit_code), (Exited, 0), "{what}");
            }
            Outcome::ExitRecorded => {
                assert_eq!(state, Some(Exited), "{what}");
                let rec = stored.expect("record");
                assert_eq!((rec.exit_code, rec.finished_at), (5, 2000), "{what}");
            }
            Outcome::MarkedRunning { fifo_cleared } => {
                assert_eq!(state, Some(Running), "{what}");
                assert_eq!(stored.expect("record").state, Running, "{what}");
                assert_eq!(cleared, fifo_cleared, "{what}");
                watched.push(l);
            }
            Outcome::Watched(s) => {
                assert_eq!(state, Some(s), "{what}");
                assert!(!cleared, "{what}: FIFO cleared");
                watched.push(l);
            }
        }
        if want != Outcome::Removed {
            // Its name is held again.
            let name = stored_name(&t, &l.id);
            assert!(
                t.rt.state.reserve_name(&name, "someone-else").is_err(),
                "{what}"
            );
        }
    }
    // Watched containers' exits are recorded as they come.
    assert!(!watched.is_empty());
    for l in &watched {
        t.host.exit(&l.id, ExitFile::Code(9));
    }
    for l in &watched {
        assert!(
            t.wait_state(&l.id, Exited).await,
            "{:?}: exit not recorded",
            l.case
        );
        assert_eq!(
            t.stored(&l.id).expect("record").exit_code,
            9,
            "{:?}",
            l.case
        );
    }
}

fn stored_name(t: &TestRuntime, id: &str) -> String {
    t.stored(id).map(|r| r.name).unwrap_or_default()
}

#[tokio::test]
async fn recovery_should_kill_a_container_whose_shim_died_without_an_exit_record() {
    let t = TestRuntime::new();
    let pod = pod_record(&t);
    let case = Case {
        record: Some(Running),
        pod_known: true,
        shim: ShimSeen::Gone,
        init: InitSeen::Started,
        fifo: false,
        in_runc: true,
    };
    let l = set_up(&t, &pod, 0, case);
    std::fs::remove_file(l.bundle.join(petrel_shim::EXIT_FILE)).expect("rm exit");
    t.rt.recover().await.expect("recover");
    let rec = t.stored(&l.id).expect("record");
    assert_eq!(
        (rec.state, rec.exit_code, rec.reason.as_str()),
        (Exited, 255, "Unknown")
    );
    assert!(t.host.calls().contains(&Call::OciKill {
        id: l.id.clone(),
        signal: libc::SIGKILL,
        all: true
    }));
}

#[tokio::test]
async fn recovery_should_undo_a_pod_whose_create_was_interrupted() {
    let t = TestRuntime::new();
    let mut pod = pod_record(&t);
    pod.state = SandboxState::Creating;
    std::fs::create_dir_all(&pod.dir).expect("pod dir");
    std::fs::write(pod.dir.join("hostname"), "p\n").expect("hostname");
    let dirs =
        crate::parts::CgroupOps::ensure_dirs(t.host.as_ref(), &pod.cgroup_parent).expect("cgroup");
    pod.created_cgroup_dirs = dirs;
    t.rt.store
        .put(Table::Sandboxes, &pod.id, &pod)
        .expect("store pod");
    t.rt.recover().await.expect("recover");
    assert!(t.rt.state.sandbox(&pod.id).is_none());
    let stored: Option<SandboxRecord> = t.rt.store.get(Table::Sandboxes, &pod.id).expect("get");
    assert!(stored.is_none(), "record left");
    assert!(!pod.dir.exists(), "directory left");
    assert!(
        !t.host.cgroups().contains(&pod.cgroup_parent),
        "cgroup left"
    );
}

#[tokio::test]
async fn recovery_should_wait_for_a_shim_inside_its_create_before_removing_it() {
    let t = TestRuntime::new();
    let pod = pod_record(&t);
    let case = Case {
        record: None,
        pod_known: true,
        shim: ShimSeen::InCreate,
        init: InitSeen::AwaitingStart,
        fifo: true,
        in_runc: true,
    };
    let l = set_up(&t, &pod, 0, case);
    t.host.clear_calls();
    let recovered = tokio::time::timeout(Duration::from_secs(20), t.rt.recover()).await;
    recovered.expect("in time").expect("recover");
    // Nothing was deleted while the shim was still inside its create.
    let calls = t.host.calls();
    let deleted = calls
        .iter()
        .position(|c| matches!(c, Call::OciDelete { id, .. } if *id == l.id));
    assert!(deleted.is_some(), "{calls:?}");
    assert!(t.host.containers().is_empty());
    assert!(!l.bundle.exists());
}

/// A pod of its own namespaces, PID-namespace holder and (fake) network,
/// made through RunPodSandbox, then forgotten by the runtime's memory as
/// by a restart (its record and what it has on the host stay).
async fn pod_before_restart(t: &TestRuntime) -> SandboxRecord {
    t.host.use_network();
    let id = t.isolated_pod("p").await.expect("run pod");
    let rec: SandboxRecord =
        t.rt.store
            .get(Table::Sandboxes, &id)
            .expect("get")
            .expect("pod record");
    assert!(rec.netns.is_some() && rec.pid_holder.is_some() && rec.network.is_some());
    t.rt.state.remove_sandbox(&id);
    t.rt.state.release_name(&rec.name, &id);
    t.host.clear_calls();
    rec
}

fn stored_pod(t: &TestRuntime, id: &str) -> SandboxRecord {
    t.rt.store
        .get(Table::Sandboxes, id)
        .expect("get")
        .expect("pod record")
}

fn network_calls(t: &TestRuntime) -> Vec<Call> {
    t.host
        .calls()
        .into_iter()
        .filter(|c| {
            matches!(
                c,
                Call::NetworkAdd(_) | Call::NetworkDel(_) | Call::NetworkCheck(_)
            )
        })
        .collect()
}

/// The pod is known again, `NotReady`, in memory and in the store, its
/// name held.
fn assert_recovered_not_ready(t: &TestRuntime, pod: &SandboxRecord) -> SandboxRecord {
    let sb = t.rt.state.sandbox(&pod.id).expect("pod in memory");
    assert_eq!(sb.with(|r| r.state), SandboxState::NotReady);
    let rec = stored_pod(t, &pod.id);
    assert_eq!(rec.state, SandboxState::NotReady);
    assert!(t.rt.state.reserve_name(&pod.name, "someone-else").is_err());
    rec
}

#[tokio::test]
async fn recovery_should_mark_a_pod_whose_namespaces_and_holder_are_gone_not_ready() {
    let t = TestRuntime::new();
    let pod = pod_before_restart(&t).await;
    t.host.reboot();
    t.rt.recover().await.expect("recover");
    let rec = assert_recovered_not_ready(&t, &pod);
    // Address leases outlive a reboot: the network is released at once.
    assert!(rec.network.is_none());
    assert!(t.host.attached().is_empty());
    assert_eq!(network_calls(&t), [Call::NetworkDel(pod.id.clone())]);
    // Its remains go with it.
    t.rt.remove_pod_sandbox(petrel_cri::api::RemovePodSandboxRequest {
        pod_sandbox_id: pod.id.clone(),
    })
    .await
    .expect("remove pod");
    assert!(!pod.dir.exists());
    assert!(t.host.cgroups().is_empty(), "{:?}", t.host.cgroups());
}

#[tokio::test]
async fn recovery_should_mark_a_pod_whose_pid_holder_died_not_ready() {
    let t = TestRuntime::new();
    let pod = pod_before_restart(&t).await;
    let holder = pod.pid_holder.expect("holder");
    t.host.kill_holder(holder.pid);
    t.rt.recover().await.expect("recover");
    let rec = assert_recovered_not_ready(&t, &pod);
    assert!(rec.network.is_none());
    assert_eq!(network_calls(&t), [Call::NetworkDel(pod.id.clone())]);
}

#[tokio::test]
async fn recovery_should_keep_the_network_of_a_vanished_pod_whose_release_fails() {
    let t = TestRuntime::new();
    let pod = pod_before_restart(&t).await;
    t.host.reboot();
    t.host.fail(Fault::NetworkDel, 1);
    t.rt.recover().await.expect("recover");
    let rec = assert_recovered_not_ready(&t, &pod);
    assert!(rec.network.is_some(), "network record dropped");
    assert!(t.host.attached().contains_key(&pod.id));
    // StopPodSandbox releases it.
    t.rt.stop_pod_sandbox(petrel_cri::api::StopPodSandboxRequest {
        pod_sandbox_id: pod.id.clone(),
    })
    .await
    .expect("stop pod");
    assert!(stored_pod(&t, &pod.id).network.is_none());
    assert!(t.host.attached().is_empty());
}

#[tokio::test]
async fn recovery_should_keep_an_intact_pod_ready_and_check_its_network() {
    let t = TestRuntime::new();
    let pod = pod_before_restart(&t).await;
    t.rt.recover().await.expect("recover");
    let sb = t.rt.state.sandbox(&pod.id).expect("pod in memory");
    assert_eq!(sb.with(|r| r.state), SandboxState::Ready);
    let rec = stored_pod(&t, &pod.id);
    assert_eq!(rec.state, SandboxState::Ready);
    assert_eq!(rec.network, pod.network);
    assert!(t.host.attached().contains_key(&pod.id));
    assert!(t.rt.state.reserve_name(&pod.name, "someone-else").is_err());
    // CNI CHECK runs off the start-up path; nothing is released.
    let checked = t
        .host
        .wait_for(Duration::from_secs(5), |h| {
            h.calls().contains(&Call::NetworkCheck(pod.id.clone()))
        })
        .await;
    assert!(checked, "no CNI CHECK: {:?}", t.host.calls());
    assert_eq!(network_calls(&t), [Call::NetworkCheck(pod.id.clone())]);
    assert!(!t
        .host
        .calls()
        .iter()
        .any(|c| matches!(c, Call::UnpinNamespace(_) | Call::KillPidHolder(_))));
}

#[tokio::test]
async fn recovery_should_keep_a_user_namespaced_pod_only_while_its_user_namespace_is_pinned() {
    let t = TestRuntime::new();
    let id =
        t.rt.run_pod_sandbox(petrel_cri::api::RunPodSandboxRequest {
            config: Some(crate::parts::fake::userns_pod_config("u")),
            runtime_handler: String::new(),
        })
        .await
        .expect("run pod")
        .pod_sandbox_id;
    let restart = |t: &TestRuntime| {
        let rec = stored_pod(t, &id);
        t.rt.state.remove_sandbox(&id);
        t.rt.state.release_name(&rec.name, &id);
        rec
    };
    // A restart with every pin there: Ready, and its containers still join it.
    let before = restart(&t);
    let user = before.userns.clone().expect("user namespace recorded");
    t.rt.recover().await.expect("recover");
    let sb = t.rt.state.sandbox(&id).expect("pod in memory");
    assert_eq!(sb.with(|r| r.state), SandboxState::Ready);
    let joined = crate::sandbox::user_namespace(&sb.record()).expect("user namespace");
    assert_eq!(joined.map(|u| u.path), Some(user.clone()));
    // The user namespace's pin alone gone: NotReady, never a pod whose next
    // containers would run in the host's user namespace.
    crate::parts::PodKernel::unpin_namespace(t.host.as_ref(), &user).expect("unpin");
    let pod = restart(&t);
    t.rt.recover().await.expect("recover");
    assert_recovered_not_ready(&t, &pod);
}

/// A `Created` record as CreateContainer leaves it: no shim, no pid.
fn forget_process(t: &TestRuntime, id: &str) {
    let mut rec = t.stored(id).expect("record");
    rec.shim = None;
    rec.pid = 0;
    rec.init_start_time = 0;
    t.rt.store
        .put(Table::Containers, id, &rec)
        .expect("store record");
}

async fn start(t: &TestRuntime, id: &str) {
    t.rt.start_container(petrel_cri::api::StartContainerRequest {
        container_id: id.to_string(),
    })
    .await
    .expect("start");
    assert_eq!(t.state(id), Some(Running));
}

#[tokio::test]
async fn recovery_should_keep_a_created_container_without_a_shim_created() {
    let t = TestRuntime::new();
    let pod = pod_record(&t);
    let case = Case {
        record: Some(Created),
        pod_known: true,
        shim: ShimSeen::Gone,
        init: InitSeen::Gone,
        fifo: false,
        in_runc: false,
    };
    let l = set_up(&t, &pod, 0, case);
    forget_process(&t, &l.id);
    t.host.clear_calls();
    t.rt.recover().await.expect("recover");
    assert_eq!(t.state(&l.id), Some(Created));
    let rec = t.stored(&l.id).expect("record");
    assert_eq!(
        (rec.state, rec.exit_code, rec.reason.as_str()),
        (Created, 0, "")
    );
    let calls = t.host.calls();
    assert!(
        !calls.iter().any(
            |c| matches!(c, Call::OciDelete { id, .. } | Call::OciKill { id, .. } if *id == l.id)
        ),
        "{calls:?}"
    );
    assert!(l.bundle.exists() && t.host.mounts().contains(&l.bundle.join("rootfs")));
    // A stale exit record (set_up wrote one) is not this start's.
    start(&t, &l.id).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(t.state(&l.id), Some(Running));
}

#[tokio::test]
async fn recovery_should_undo_a_start_interrupted_before_running_was_committed() {
    let t = TestRuntime::new();
    let pod = pod_record(&t);
    let case = Case {
        record: Some(Created),
        pod_known: true,
        shim: ShimSeen::Serving,
        init: InitSeen::AwaitingStart,
        fifo: true,
        in_runc: true,
    };
    let l = set_up(&t, &pod, 0, case);
    forget_process(&t, &l.id);
    t.host.clear_calls();
    t.rt.recover().await.expect("recover");
    assert_eq!(t.state(&l.id), Some(Created));
    assert_eq!(t.stored(&l.id).expect("record").state, Created);
    assert!(t.host.calls().contains(&Call::OciDelete {
        id: l.id.clone(),
        force: true
    }));
    assert!(
        !t.host.containers().contains_key(&l.id),
        "runc container left"
    );
    assert!(
        !t.host.live_shims().iter().any(|(_, s)| s.id == l.id),
        "shim left"
    );
    assert!(!l.bundle.join(petrel_shim::EXIT_FILE).exists());
    // The files stay: the client's retry of the start works.
    assert!(l.bundle.join("config.json").is_file());
    assert!(t.host.mounts().contains(&l.bundle.join("rootfs")));
    start(&t, &l.id).await;
}
