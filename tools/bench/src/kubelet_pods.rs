//! The pods of the kubelet figures (P23-P27): their manifests, what
//! `/pods` shows of them (kubelet's read-only port or the agent's socket,
//! polled), and the timed exits and starts.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rand::rngs::StdRng;
use rand::Rng;
use rustix::process::{Pid, Signal};
use serde_json::Value;

use crate::agent_proc::{all_running, container_id};
use crate::http;
use crate::kubelet::{Series, CONTAINER, GAP, IMAGE, JITTER, NAMESPACE, POLL_GAP};
use crate::kubelet_stack::Stack;
use crate::node::Clients;

/// The longest wait for one exit or start to show at `/pods`.
const SEEN_WITHIN: Duration = Duration::from_secs(60);

/// The manifest of a bench pod: one busybox container sleeping a day,
/// restarted when it exits, stopped without grace.
pub fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\n\
         spec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 0\n  containers:\n\
         \x20 - name: {CONTAINER}\n    image: {IMAGE}\n    imagePullPolicy: IfNotPresent\n\
         \x20   command: [\"sleep\", \"86400\"]\n"
    )
}

/// Writes manifest `name` to a dot-file (which kubelet and the agent
/// skip), then renames it into place; returns the moment just before the
/// rename.
pub fn write_manifest(dir: &Path, name: &str) -> Result<Instant> {
    let tmp = dir.join(format!(".{name}.yaml.tmp"));
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&tmp, manifest(name)).with_context(|| format!("write {}", tmp.display()))?;
    let t = Instant::now();
    std::fs::rename(&tmp, &path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(t)
}

/// [`GAP`] plus a random part of [`JITTER`].
pub fn quiet(rng: &mut StdRng) -> Duration {
    GAP + Duration::from_micros(rng.gen_range(0..JITTER.as_micros() as u64))
}

/// Every pod at `/pods`, with when the answer was in hand and how long
/// the GET took.
pub async fn get_pods(ep: &http::Endpoint) -> Result<(Instant, Duration, Vec<Value>)> {
    let t = Instant::now();
    let r = http::get(ep.clone(), "/pods", Duration::from_secs(30)).await?;
    let at = Instant::now();
    if r.status != 200 {
        bail!(
            "GET {ep}/pods: status {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body).trim()
        );
    }
    let v: Value =
        serde_json::from_slice(&r.body).with_context(|| format!("{ep}/pods is not JSON"))?;
    let items = v
        .get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    Ok((at, at - t, items))
}

/// The pods of `items` by name.
pub fn by_name(items: &[Value]) -> HashMap<&str, &Value> {
    items
        .iter()
        .filter_map(|p| Some((p.pointer("/metadata/name")?.as_str()?, p)))
        .collect()
}

/// Waits until every pod of `names` runs its container at `/pods`, or
/// `timeout`; returns how many do. `/pods` may refuse connections a
/// moment after a (re)start (kubelet answers `/healthz` before its
/// read-only port listens): that is retried until the timeout.
pub async fn wait_all_running(
    stack: &Stack,
    ep: &http::Endpoint,
    names: &[String],
    timeout: Duration,
) -> Result<usize> {
    let t0 = Instant::now();
    loop {
        let items = match get_pods(ep).await {
            Ok((_, _, items)) => items,
            Err(e) if t0.elapsed() > timeout => return Err(e),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let pods = by_name(&items);
        let running = names
            .iter()
            .filter(|n| {
                pods.get(stack.pod_name(n).as_str())
                    .is_some_and(|p| all_running(p, 1))
            })
            .count();
        if running == names.len() || t0.elapsed() > timeout {
            return Ok(running);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Container id of each running pod of `names`, by name.
pub async fn running_ids(
    stack: &Stack,
    ep: &http::Endpoint,
    names: &[String],
) -> Result<HashMap<String, String>> {
    let (_, _, items) = get_pods(ep).await?;
    let pods = by_name(&items);
    Ok(names
        .iter()
        .filter_map(|n| {
            let p = pods.get(stack.pod_name(n).as_str())?;
            all_running(p, 1)
                .then(|| container_id(p, CONTAINER))
                .flatten()
                .map(|id| (n.clone(), id))
        })
        .collect())
}

/// Whether the pod shows container `old` exited: terminated, or as the
/// last state of a newer container, or already replaced.
pub fn exited(pod: &Value, old: &str) -> bool {
    let Some(c) = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("name").and_then(Value::as_str) == Some(CONTAINER))
        })
    else {
        return false;
    };
    let id = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .map(|s| s.split_once("://").map_or(s, |(_, i)| i).to_string())
    };
    let current = id(c.get("containerID"));
    if c.pointer("/state/terminated").is_some() && current.as_deref() == Some(old) {
        return true;
    }
    if id(c.pointer("/lastState/terminated/containerID")).as_deref() == Some(old) {
        return true;
    }
    current.is_some_and(|cur| !cur.is_empty() && cur != old)
}

/// `n` exits, round-robin over `victims`: each container's init killed
/// (SIGKILL), timed until `/pods` shows it exited; then the bench waits
/// for the pod to run again.
pub async fn exits(
    stack: &Stack,
    ep: &http::Endpoint,
    cri: &mut Clients,
    victims: &[String],
    n: usize,
    rng: &mut StdRng,
    series: &mut Series,
) -> Result<()> {
    if victims.is_empty() {
        return Ok(());
    }
    for i in 0..n {
        let name = &victims[i % victims.len()];
        let pod = stack.pod_name(name);
        let ids = running_ids(stack, ep, std::slice::from_ref(name)).await?;
        let Some(id) = ids.get(name).cloned() else {
            bail!("pod {pod} is not running before its exit");
        };
        tokio::time::sleep(quiet(rng)).await;
        let (pid, _) = cri.init_pid(&id).await?;
        let target = Pid::from_raw(i32::try_from(pid).context("init pid")?)
            .ok_or_else(|| anyhow!("init pid 0"))?;
        let t0 = Instant::now();
        rustix::process::kill_process(target, Signal::KILL)
            .with_context(|| format!("kill init {pid} of container {id}"))?;
        let at = poll_until(ep, &pod, series, |p| exited(p, &id)).await?;
        series.samples.push(at.saturating_duration_since(t0));
        // Back to running (a restart, not measured) before the next exit.
        let t = Instant::now();
        loop {
            let again = running_ids(stack, ep, std::slice::from_ref(name)).await?;
            if again.get(name).is_some_and(|x| *x != id) || t.elapsed() > SEEN_WITHIN {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// GETs `/pods` every [`POLL_GAP`] until pod `pod` satisfies `pred`;
/// returns when that answer was in hand.
pub async fn poll_until(
    ep: &http::Endpoint,
    pod: &str,
    series: &mut Series,
    pred: impl Fn(&Value) -> bool,
) -> Result<Instant> {
    let t0 = Instant::now();
    loop {
        let (at, took, items) = get_pods(ep).await?;
        series.polls.push(took);
        if by_name(&items).get(pod).is_some_and(|p| pred(p)) {
            return Ok(at);
        }
        if t0.elapsed() > SEEN_WITHIN {
            let last = by_name(&items)
                .get(pod)
                .map(|p| p.get("status").cloned().unwrap_or(Value::Null).to_string())
                .unwrap_or_else(|| "absent".to_string());
            bail!(
                "pod {pod}: not seen within {} s at {ep}/pods; last: {}",
                SEEN_WITHIN.as_secs(),
                last.chars().take(400).collect::<String>()
            );
        }
        tokio::time::sleep(POLL_GAP).await;
    }
}

/// One manifest written, timed until `/pods` shows its container running.
pub async fn start_one(
    stack: &Stack,
    ep: &http::Endpoint,
    name: &str,
    series: &mut Series,
) -> Result<()> {
    let pod = stack.pod_name(name);
    let t0 = write_manifest(&stack.manifest_dir(), name)?;
    let at = poll_until(ep, &pod, series, |p| all_running(p, 1)).await?;
    series.samples.push(at.saturating_duration_since(t0));
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    fn pod(state: Value, id: &str, last: Option<&str>) -> Value {
        let mut c = serde_json::json!({"name": CONTAINER, "state": state, "containerID": format!("containerd://{id}")});
        if let Some(l) = last {
            c["lastState"] = serde_json::json!({"terminated": {"exitCode": 137, "containerID": format!("containerd://{l}")}});
        }
        serde_json::json!({"metadata": {"name": "p"}, "status": {"containerStatuses": [c]}})
    }

    #[test]
    fn exited_should_see_the_exit_whichever_way_the_status_shows_it() {
        let running = serde_json::json!({"running": {}});
        let terminated = serde_json::json!({"terminated": {"exitCode": 137}});
        assert!(!exited(&pod(running.clone(), "a", None), "a"));
        assert!(exited(&pod(terminated, "a", None), "a"));
        assert!(exited(&pod(running.clone(), "b", Some("a")), "a"));
        // Replaced without the exit ever shown: seen all the same.
        assert!(exited(&pod(running, "b", None), "a"));
        assert!(!exited(&serde_json::json!({"status": {}}), "a"));
    }

    #[test]
    fn manifest_should_be_one_busybox_container_that_restarts() {
        let m = manifest("p007");
        assert!(m.contains("name: p007\n  namespace: bench\n"), "{m}");
        assert!(m.contains("restartPolicy: Always"), "{m}");
        assert!(
            m.contains(&format!("  - name: {CONTAINER}\n    image: {IMAGE}\n")),
            "{m}"
        );
        assert!(m.contains("    command: [\"sleep\", \"86400\"]\n"), "{m}");
    }
}
