//! End-to-end: the agent's pod workers never block each other (issue 28,
//! item 7). Every pod has its own worker, so pods stopping with a long
//! grace period delay neither a new pod's start nor a pod with a shorter
//! grace period. Real `petrel runtime`, real runc containers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use petrel_testkit::agent::{running, Agent};
use petrel_testkit::prelude::{Node, BUSYBOX};

/// The longer grace period: far above every bound asserted below.
const LONG_GRACE: u64 = 30;
/// A pod's usual start is well below this on a loaded test machine.
const START_BOUND: Duration = Duration::from_secs(5);

/// A pod of one container that ignores SIGTERM (so it takes its whole
/// grace period to stop) and sleeps.
fn stubborn(name: &str, grace: u64) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  terminationGracePeriodSeconds: {grace}\n  containers:\n  - name: c\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", \"trap '' TERM; while :; do sleep 1; done\"]\n"
    )
}

/// Writes the pods `{prefix}-0..n` and waits until all run.
fn start_pods(agent: &Agent, prefix: &str, n: usize, grace: u64) {
    for i in 0..n {
        agent.write_manifest(
            &format!("{prefix}-{i}.yaml"),
            &stubborn(&format!("{prefix}-{i}"), grace),
        );
    }
    for i in 0..n {
        agent.wait_pod(
            "default",
            &format!("{prefix}-{i}"),
            Duration::from_secs(120),
            "running",
            |p| running(p, "c"),
        );
    }
}

/// Deletes the pods `{prefix}-0..n` and waits until /pods shows each as
/// terminating (its worker has begun to stop it).
fn delete_pods(agent: &Agent, prefix: &str, n: usize) {
    for i in 0..n {
        agent.remove_manifest(&format!("{prefix}-{i}.yaml"));
    }
    for i in 0..n {
        agent.wait_pod(
            "default",
            &format!("{prefix}-{i}"),
            Duration::from_secs(20),
            "terminating",
            |p| p["metadata"]["deletionTimestamp"].is_string(),
        );
    }
}

/// How many of the pods `{prefix}-0..n` /pods still shows.
fn still_shown(agent: &Agent, prefix: &str, n: usize) -> usize {
    (0..n)
        .filter(|i| agent.pod("default", &format!("{prefix}-{i}")).is_some())
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_workers_should_start_a_new_pod_while_twenty_pods_terminate() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    const N: usize = 20;
    start_pods(&agent, "slow", N, LONG_GRACE);
    // The usual start of a pod on this machine now, for the report.
    let t = Instant::now();
    agent.write_manifest("before.yaml", &stubborn("before", 0));
    agent.wait_pod("default", "before", START_BOUND, "running", |p| {
        running(p, "c")
    });
    let usual = t.elapsed();

    delete_pods(&agent, "slow", N);
    let t = Instant::now();
    agent.write_manifest("fresh.yaml", &stubborn("fresh", 0));
    agent.wait_pod("default", "fresh", START_BOUND, "running", |p| {
        running(p, "c")
    });
    let with_terminating = t.elapsed();
    eprintln!("pod start: {usual:?} alone, {with_terminating:?} beside {N} terminating pods");
    // The twenty are still in their grace period: the new pod did not
    // wait for any of them.
    assert_eq!(still_shown(&agent, "slow", N), N);
    assert_eq!(
        agent.live_containers(&node).await.len(),
        N + 2,
        "the terminating pods' containers still run"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_workers_should_stop_a_short_grace_pod_behind_long_grace_ones() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &[]);
    // More long-grace pods than the four workers of old.
    const N: usize = 6;
    start_pods(&agent, "long", N, LONG_GRACE);
    start_pods(&agent, "short", 1, 3);

    delete_pods(&agent, "long", N);
    let t = Instant::now();
    agent.remove_manifest("short-0.yaml");
    agent.wait_gone("default", "short-0", Duration::from_secs(10));
    let took = t.elapsed();
    eprintln!("3 s grace pod gone after {took:?}");
    assert!(
        took >= Duration::from_millis(2500),
        "its grace period was cut short: {took:?}"
    );
    assert!(
        took < Duration::from_secs(8),
        "it waited behind the others: {took:?}"
    );
    assert_eq!(
        still_shown(&agent, "long", N),
        N,
        "the long ones still stop"
    );
}
