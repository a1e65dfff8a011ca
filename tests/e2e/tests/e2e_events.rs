//! The container event stream: every transition once, in order, to every
//! subscriber; a stalled subscriber hurts nobody and is told it fell behind.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_cri::api;
use petrel_cri::api::ContainerEventType as E;
use petrel_testkit::prelude::*;
use tokio_stream::StreamExt;

type Stream = tonic::Streaming<api::ContainerEventResponse>;

async fn subscribe(c: &mut Clients) -> Stream {
    c.rt.get_container_events(api::GetEventsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Reads events until `n` have arrived (or the deadline passes).
async fn take(s: &mut Stream, n: usize) -> Vec<api::ContainerEventResponse> {
    let mut out = vec![];
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.next()).await {
            Ok(Some(Ok(ev))) => out.push(ev),
            _ => break,
        }
    }
    out
}

fn kinds(evs: &[api::ContainerEventResponse]) -> Vec<(String, i32)> {
    evs.iter()
        .map(|e| (e.container_id.clone(), e.container_event_type))
        .collect()
}

#[tokio::test]
async fn two_subscribers_should_receive_the_same_events_in_order() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let mut s1 = subscribe(&mut c).await;
    let mut c2 = node.clients().await;
    let mut s2 = subscribe(&mut c2).await;
    // Give both subscriptions time to register before acting.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let pc = node.pod_config("events");
    let pod = c.run_pod(pc.clone()).await;
    let id = c.run(&pod, &pc, sh_container("quick", "exit 5")).await;
    c.wait_state(
        &id,
        api::ContainerState::ContainerExited,
        Duration::from_secs(5),
    )
    .await;
    c.remove(&id).await.unwrap();
    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    c.remove_pod(&pod).await.unwrap();

    let expected = vec![
        (pod.clone(), E::ContainerCreatedEvent as i32),
        (pod.clone(), E::ContainerStartedEvent as i32),
        (id.clone(), E::ContainerCreatedEvent as i32),
        (id.clone(), E::ContainerStartedEvent as i32),
        (id.clone(), E::ContainerStoppedEvent as i32),
        (id.clone(), E::ContainerDeletedEvent as i32),
        (pod.clone(), E::ContainerStoppedEvent as i32),
        (pod.clone(), E::ContainerDeletedEvent as i32),
    ];
    let e1 = take(&mut s1, expected.len()).await;
    let e2 = take(&mut s2, expected.len()).await;
    assert_eq!(kinds(&e1), expected);
    assert_eq!(kinds(&e2), expected);
    // Timestamps are nanoseconds and never go backwards.
    for w in e1.windows(2) {
        assert!(w[1].created_at >= w[0].created_at);
    }
    assert!(e1[0].created_at > 1_600_000_000_000_000_000);
    // Each event carries the pod's status and its containers' statuses.
    let stopped = &e1[4];
    assert_eq!(stopped.pod_sandbox_status.as_ref().unwrap().id, pod);
    let cs = stopped
        .containers_statuses
        .iter()
        .find(|s| s.id == id)
        .unwrap();
    assert_eq!(cs.state, api::ContainerState::ContainerExited as i32);
    assert_eq!(cs.exit_code, 5);
    // Exactly once: nothing more arrives.
    assert!(tokio::time::timeout(Duration::from_millis(300), s1.next())
        .await
        .is_err());
}

#[tokio::test]
async fn removing_a_pod_should_stop_and_delete_each_of_its_containers_once_and_leave_nothing() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let mut s = subscribe(&mut c).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let pc = node.pod_config("many");
    let pod = c.run_pod(pc.clone()).await;
    let mut running = vec![];
    for i in 0..6 {
        let cfg = sh_container(&format!("run{i}"), "sleep 1000");
        running.push(c.run(&pod, &pc, cfg).await);
    }
    let exited = c.run(&pod, &pc, sh_container("done", "exit 3")).await;
    c.wait_state(
        &exited,
        api::ContainerState::ContainerExited,
        Duration::from_secs(5),
    )
    .await;
    let created = c
        .create(&pod, &pc, sh_container("idle", "true"))
        .await
        .unwrap();
    for id in &running {
        c.wait_state(
            id,
            api::ContainerState::ContainerRunning,
            Duration::from_secs(5),
        )
        .await;
    }
    // Up to here: the pod's CREATED and STARTED, CREATED and STARTED of the
    // seven started containers, STOPPED of the one that exited, CREATED of
    // the one never started.
    let before = take(&mut s, 2 + 2 * 7 + 1 + 1).await;
    assert_eq!(before.len(), 18);

    // No StopPodSandbox or RemoveContainer first: RemovePodSandbox does it all.
    c.remove_pod(&pod).await.unwrap();
    let mut all = running.clone();
    all.extend([exited.clone(), created.clone()]);
    let list =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(list.containers.is_empty(), "{:?}", list.containers);
    for id in &all {
        c.assert_container_gone(id).await;
    }

    // Each running container STOPPED once and then DELETED once, the pod
    // STOPPED after its running containers and DELETED last. (The container
    // never started is killed in its created state: STOPPED at most once.)
    let mut after = vec![];
    let pod_deleted = (pod.clone(), E::ContainerDeletedEvent as i32);
    while after.last() != Some(&pod_deleted) {
        let ev = take(&mut s, 1).await;
        assert_eq!(ev.len(), 1, "pod's DELETED not seen: {after:?}");
        after.extend(kinds(&ev));
    }
    let count = |id: &str, k: E| {
        after
            .iter()
            .filter(|e| **e == (id.to_string(), k as i32))
            .count()
    };
    let position = |id: &str, k: E| {
        after
            .iter()
            .position(|e| *e == (id.to_string(), k as i32))
            .unwrap_or_else(|| panic!("{id}: no {k:?} in {after:?}"))
    };
    let pod_stopped = position(&pod, E::ContainerStoppedEvent);
    for id in &running {
        assert_eq!(count(id, E::ContainerStoppedEvent), 1, "{id}: {after:?}");
        assert!(position(id, E::ContainerStoppedEvent) < pod_stopped);
        assert!(pod_stopped < position(id, E::ContainerDeletedEvent));
    }
    for id in &all {
        assert_eq!(count(id, E::ContainerDeletedEvent), 1, "{id}: {after:?}");
    }
    assert_eq!(count(&exited, E::ContainerStoppedEvent), 0, "{after:?}");
    assert!(count(&created, E::ContainerStoppedEvent) <= 1, "{after:?}");
    assert_eq!(count(&pod, E::ContainerStoppedEvent), 1, "{after:?}");
    assert!(tokio::time::timeout(Duration::from_millis(300), s.next())
        .await
        .is_err());
    node.assert_no_debris("many");
}

#[tokio::test]
async fn a_stalled_subscriber_should_not_slow_lifecycle_operations() {
    // A small queue makes the stalled subscriber overflow quickly.
    let node = Node::start_with("event_queue_capacity = 8");
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("stall");
    let pod = c.run_pod(pc.clone()).await;

    // Baseline without subscribers.
    let mut base = vec![];
    for i in 0..5 {
        let id = c
            .create(&pod, &pc, sh_container(&format!("b{i}"), "sleep 1000"))
            .await
            .unwrap();
        let t = Instant::now();
        c.start(&id).await.unwrap();
        base.push(t.elapsed());
    }
    // A subscriber that never reads (on a connection with small HTTP/2
    // windows, so transport buffers fill fast), and a live one.
    let mut cs = node.clients_small_window().await;
    let mut stalled = subscribe(&mut cs).await;
    let mut cl = node.clients().await;
    let mut live = subscribe(&mut cl).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reader = tokio::spawn(async move {
        let mut n = 0usize;
        while let Some(Ok(_)) = live.next().await {
            n += 1;
            if n == 60 {
                break;
            }
        }
        n
    });
    let mut with = vec![];
    for i in 0..30 {
        let id = c
            .create(&pod, &pc, sh_container(&format!("s{i}"), "sleep 1000"))
            .await
            .unwrap();
        let t = Instant::now();
        c.start(&id).await.unwrap();
        with.push(t.elapsed());
    }
    base.sort();
    with.sort();
    let (b, w) = (base[base.len() / 2], with[with.len() / 2]);
    assert!(
        w < b * 3 + Duration::from_millis(50),
        "median StartContainer {w:?} with a stalled subscriber vs {b:?}"
    );
    // The live subscriber got every event (30 created + 30 started).
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .unwrap()
            .unwrap(),
        60
    );
    // The stalled one is told it fell behind once it reads.
    let mut ended = None;
    while let Ok(Some(item)) = tokio::time::timeout(Duration::from_secs(5), stalled.next()).await {
        if let Err(status) = item {
            ended = Some(status);
            break;
        }
    }
    let status = ended.expect("stalled stream must end with an error");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    // It is told how many events it lost, and the counter counts each.
    let lost: u64 = status
        .message()
        .split("lost ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {status:?}"));
    assert!(lost >= 1, "{status:?}");
    let m = c.metrics().await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("petrel_runtime_event_subscriber_overflows_total 1")),
        "{m}"
    );
    assert!(
        m.lines()
            .any(|l| l == format!("petrel_runtime_events_dropped_total {lost}")),
        "{lost} lost: {m}"
    );
}
