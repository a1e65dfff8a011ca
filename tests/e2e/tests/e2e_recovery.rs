//! Nothing is lost across crashes: after `kill -9` of the runtime,
//! containers keep running, exits that happen meanwhile are seen, and every
//! pod and container is listed in the right state.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::prelude::*;

#[tokio::test]
async fn restart_after_kill9_should_lose_nothing_and_see_exits_while_down() {
    let mut node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("crash");
    let pod = c.run_pod(pc.clone()).await;
    let runner = c
        .run(&pod, &pc, sh_container("runner", "echo before; sleep 1000"))
        .await;
    let dies = c
        .run(&pod, &pc, sh_container("dies", "sleep 2; echo bye; exit 7"))
        .await;
    let created = c
        .create(&pod, &pc, sh_container("created", "echo never"))
        .await
        .unwrap();
    let done = c.run(&pod, &pc, sh_container("done", "exit 0")).await;
    c.wait_state(
        &done,
        api::ContainerState::ContainerExited,
        Duration::from_secs(5),
    )
    .await;
    let runner_pid = c.init_pid(&runner).await as i32;

    node.kill9();
    // While the runtime is down, `dies` exits and `runner` keeps running.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // SAFETY: signal 0 only checks existence.
    assert_eq!(
        unsafe { libc::kill(runner_pid, 0) },
        0,
        "container died with the runtime"
    );
    node.restart();

    let mut c = node.clients().await;
    let pods =
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0].state, api::PodSandboxState::SandboxReady as i32);
    let st = c.status(&runner).await;
    assert_eq!(st.state, api::ContainerState::ContainerRunning as i32);
    let st = c.status(&dies).await;
    assert_eq!(
        st.state,
        api::ContainerState::ContainerExited as i32,
        "exit while down not seen: {st:?}"
    );
    assert_eq!(st.exit_code, 7);
    assert!(st.finished_at > st.started_at);
    assert_eq!(
        c.status(&created).await.state,
        api::ContainerState::ContainerCreated as i32
    );
    assert_eq!(c.status(&done).await.exit_code, 0);
    assert!(read_log(&node, "crash", "dies").contains("F bye"));

    // The re-adopted container is watched again: its exit is noticed live.
    c.stop(&runner, 0).await.unwrap();
    assert_eq!(c.status(&runner).await.exit_code, 137);
    // The created one can still be started after the restart.
    c.start(&created).await.unwrap();
    c.wait_state(
        &created,
        api::ContainerState::ContainerExited,
        Duration::from_secs(5),
    )
    .await;
    c.remove_pod(&pod).await.unwrap();
    assert!(c
        .rt
        .list_containers(api::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers
        .is_empty());
}

#[tokio::test]
async fn sigterm_should_stop_the_runtime_and_leave_containers_running() {
    let mut node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("graceful");
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("stay", "sleep 1000")).await;
    // An open event stream must not hold up the shutdown.
    let _events =
        c.rt.get_container_events(api::GetEventsRequest {})
            .await
            .unwrap()
            .into_inner();
    assert_eq!(node.terminate(), Some(0));
    assert!(!node.socket.exists(), "socket removed at shutdown");
    node.restart();
    let mut c = node.clients().await;
    assert_eq!(
        c.status(&id).await.state,
        api::ContainerState::ContainerRunning as i32
    );
}

#[tokio::test]
async fn a_killed_shim_should_end_its_container_and_leave_no_zombie() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("shimkill");
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("victim", "sleep 1000")).await;
    let init = c.init_pid(&id).await as i32;
    let shim = c.verbose_info(&id).await["shimPid"]
        .as_i64()
        .expect("shimPid in the verbose info") as i32;

    // SAFETY: signalling the shim the runtime started for this test.
    assert_eq!(unsafe { libc::kill(shim, libc::SIGKILL) }, 0);
    let st = c
        .wait_state(
            &id,
            api::ContainerState::ContainerExited,
            Duration::from_secs(20),
        )
        .await;
    assert_eq!(st.reason, "Unknown", "{st:?}");
    // The container's init, orphaned to the runtime (a child subreaper)
    // when its shim died, was killed and is reaped as an orphan: no zombie.
    let within = petrel_runtime::orphans::GRACE * 2 + Duration::from_secs(10);
    node.assert_no_zombie_children(within);
    assert!(
        eventually(Duration::from_secs(1), || {
            // SAFETY: signal 0 only checks existence (a zombie exists).
            let exists = unsafe { libc::kill(init, 0) } == 0;
            !exists
        })
        .await,
        "the container's init {init} is still there"
    );
    c.remove(&id).await.unwrap();
    c.remove_pod(&pod).await.unwrap();
}
