//! P36-P37: what pods read from the API (issue 32), on a stack of the
//! cluster figures after P35: `OBJECT_PODS` pods, each mounting a
//! ConfigMap and a Secret of its own as volumes.
//!
//! - P36: every ConfigMap changed at once, then every Secret: each timed
//!   from its patch request sent to the moment the new value is in the
//!   pod's file, read on the host through the node's own volume directory
//!   (`<pods dir>/<uid>/volumes/kubernetes.io~configmap|secret/...`, what
//!   the container's bind mount shows) every 5 ms;
//! - P37: the node idle with those pods beside P35's: API requests of
//!   `system:node:<name>` per minute, per pod of the node.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::controller_bench::count_requests;
use crate::kubelet::{CONTAINER, IMAGE, NAMESPACE};
use crate::kubelet_stack::Stack;
use crate::stats::Samples;

/// Pods, each with a ConfigMap and a Secret of its own.
pub const OBJECT_PODS: usize = 10;
/// The longest wait for the pods to run.
const START_WITHIN: Duration = Duration::from_secs(180);
/// The longest wait for one round of changes to reach every pod (kubelet
/// writes them at its next pod sync: up to a minute and more).
const ROUND_WITHIN: Duration = Duration::from_secs(180);
/// How often the files are read.
const READ_GAP: Duration = Duration::from_millis(5);

/// P36-P37 on one stack.
#[derive(Debug, Clone, Default)]
pub struct ObjectsRun {
    /// Pods with objects.
    pub pods: usize,
    /// P36: ConfigMap patch sent → new value in the pod's file.
    pub config_map: Samples,
    /// P36: Secret patch sent → new value in the pod's file.
    pub secret: Samples,
    /// Changes not seen within the round's wait.
    pub missed: usize,
    /// P37: requests of the node in the idle window.
    pub requests: usize,
    /// P37: the window.
    pub wall: Duration,
}

impl ObjectsRun {
    /// Requests per minute in the window.
    pub fn requests_per_min(&self) -> f64 {
        let s = self.wall.as_secs_f64();
        if s <= 0.0 {
            return 0.0;
        }
        self.requests as f64 * 60.0 / s
    }

    /// P37: requests per minute per pod of the node, `others` (P35's)
    /// beside these.
    pub fn per_pod(&self, others: usize) -> f64 {
        let pods = self.pods + others;
        if pods == 0 {
            return 0.0;
        }
        self.requests_per_min() / pods as f64
    }
}

/// The object pod `name` on `node`, reading ConfigMap and Secret `name`.
fn pod(name: &str, node: &str) -> Result<Pod> {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "volumes": [
                {"name": "cfg", "configMap": {"name": name}},
                {"name": "sec", "secret": {"secretName": name}},
            ],
            "containers": [{
                "name": CONTAINER,
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "86400"],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/cfg"},
                    {"name": "sec", "mountPath": "/sec"},
                ],
            }],
        },
    }))
    .with_context(|| format!("pod object {name}"))
}

/// The file of key `v` of volume `volume` (`configmap` or `secret`) of pod
/// `uid` on the node.
fn file(pods_dir: &Path, uid: &str, plugin: &str, volume: &str) -> PathBuf {
    pods_dir
        .join(uid)
        .join("volumes")
        .join(format!("kubernetes.io~{plugin}"))
        .join(volume)
        .join("v")
}

/// Measures P36-P37 on `stack` (node `node`, prefix `tag` for the
/// objects' names); `idle_seconds` is P37's window.
pub async fn measure(
    client: &kube::Client,
    stack: &Stack,
    node: &str,
    tag: &str,
    audit: &Path,
    idle_seconds: u64,
) -> Result<ObjectsRun> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let names: Vec<String> = (0..OBJECT_PODS).map(|i| format!("o-{tag}-{i}")).collect();
    let pp = PostParams::default();
    for n in &names {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": n}, "data": {"v": "0"}}))?;
        cms.create(&pp, &cm)
            .await
            .with_context(|| format!("create configmap {n}"))?;
        let s: Secret =
            serde_json::from_value(json!({"metadata": {"name": n}, "stringData": {"v": "0"}}))?;
        secrets
            .create(&pp, &s)
            .await
            .with_context(|| format!("create secret {n}"))?;
        pods.create(&pp, &pod(n, node)?)
            .await
            .with_context(|| format!("create pod {n}"))?;
    }
    let t0 = Instant::now();
    let mut uids = Vec::new();
    for n in &names {
        loop {
            let p = pods.get(n).await.with_context(|| format!("get pod {n}"))?;
            if crate::cluster_bench::running_ready(&p) {
                uids.push(p.metadata.uid.unwrap_or_default());
                break;
            }
            if t0.elapsed() > START_WITHIN {
                bail!(
                    "pod {n} not running within {} s:\n{}",
                    START_WITHIN.as_secs(),
                    stack.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let dir = stack.pods_dir();
    let mut run = ObjectsRun {
        pods: names.len(),
        ..ObjectsRun::default()
    };
    for (plugin, value) in [("configmap", "1"), ("secret", "1")] {
        let volume = if plugin == "configmap" { "cfg" } else { "sec" };
        let files: Vec<PathBuf> = uids.iter().map(|u| file(&dir, u, plugin, volume)).collect();
        for f in &files {
            let now =
                std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
            if now != "0" {
                bail!("{} holds {now:?} before the change", f.display());
            }
        }
        let mut sent = Vec::new();
        for n in &names {
            let body = match plugin {
                "configmap" => json!({"data": {"v": value}}),
                _ => json!({"stringData": {"v": value}}),
            };
            let t = Instant::now();
            match plugin {
                "configmap" => cms
                    .patch(n, &PatchParams::default(), &Patch::Merge(body))
                    .await
                    .map(drop),
                _ => secrets
                    .patch(n, &PatchParams::default(), &Patch::Merge(body))
                    .await
                    .map(drop),
            }
            .with_context(|| format!("patch {plugin} {n}"))?;
            sent.push(t);
        }
        let mut seen: Vec<Option<Instant>> = vec![None; files.len()];
        let start = Instant::now();
        while seen.iter().any(Option::is_none) && start.elapsed() < ROUND_WITHIN {
            for (i, f) in files.iter().enumerate() {
                if seen[i].is_none() && std::fs::read_to_string(f).is_ok_and(|s| s == value) {
                    seen[i] = Some(Instant::now());
                }
            }
            tokio::time::sleep(READ_GAP).await;
        }
        for (i, s) in seen.iter().enumerate() {
            match s {
                Some(at) => {
                    let d = at.saturating_duration_since(sent[i]);
                    if plugin == "configmap" {
                        run.config_map.push(d);
                    } else {
                        run.secret.push(d);
                    }
                }
                None => run.missed += 1,
            }
        }
    }
    tokio::time::sleep(crate::kubelet::SETTLE).await;
    let from = std::fs::metadata(audit)
        .with_context(|| format!("stat {}", audit.display()))?
        .len();
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(idle_seconds)).await;
    run.wall = t.elapsed();
    run.requests = count_requests(audit, from, &format!("system:node:{node}"))?;
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_pod_should_share_the_rate_among_every_pod_of_the_node() {
        let r = ObjectsRun {
            pods: 10,
            requests: 30,
            wall: Duration::from_secs(60),
            ..ObjectsRun::default()
        };
        assert!((r.requests_per_min() - 30.0).abs() < 1e-9);
        assert!((r.per_pod(90) - 0.3).abs() < 1e-9);
        assert_eq!(ObjectsRun::default().per_pod(0), 0.0);
    }
}
