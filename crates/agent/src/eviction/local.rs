//! Local storage: what each pod writes under the agent's root (its
//! emptyDirs in `pods/<uid>`, its containers' logs in
//! `logs/<namespace>_<name>_<uid>`), and kubelet's local-storage eviction:
//! a pod whose emptyDir outgrows its `sizeLimit`, or whose usage outgrows
//! its containers' `ephemeral-storage` limits, is evicted at once.
//!
//! A container's ephemeral storage is, as kubelet counts it, its writable
//! layer (from the runtime's ListContainerStats) plus its logs; a pod's is
//! its containers' plus its local volumes.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::PodSpec;

use crate::quantity;

/// Bytes (allocated, as du counts) and inodes under a directory, not
/// following symlinks nor crossing into other filesystems.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Allocated bytes.
    pub bytes: i64,
    /// Files and directories.
    pub inodes: i64,
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, o: Usage) -> Usage {
        Usage {
            bytes: self.bytes + o.bytes,
            inodes: self.inodes + o.inodes,
        }
    }
}

/// The usage of `dir`, as `du` counts it (zero when it does not exist).
pub fn dir_usage(dir: &Path) -> Usage {
    let u = petrel_oci::dir_usage::dir_usage(dir);
    Usage {
        bytes: i64::try_from(u.bytes).unwrap_or(i64::MAX),
        inodes: i64::try_from(u.inodes).unwrap_or(i64::MAX),
    }
}

/// Where a pod's files are under the agent's root.
#[derive(Debug, Clone)]
pub struct PodPaths {
    /// `pods/<uid>` (emptyDirs live under it).
    pub pod_dir: PathBuf,
    /// `logs/<namespace>_<name>_<uid>`, one subdirectory per container.
    pub log_dir: PathBuf,
}

impl PodPaths {
    /// The paths of pod `uid` under `root`.
    pub fn new(root: &Path, namespace: &str, name: &str, uid: &str) -> Self {
        Self {
            pod_dir: root.join("pods").join(uid),
            log_dir: root.join("logs").join(format!("{namespace}_{name}_{uid}")),
        }
    }

    /// The host directory of the pod's emptyDir `volume`.
    pub fn empty_dir(&self, volume: &str) -> PathBuf {
        self.pod_dir
            .join("volumes/kubernetes.io~empty-dir")
            .join(volume)
    }

    /// Everything the pod wrote.
    pub fn total(&self) -> Usage {
        dir_usage(&self.pod_dir) + dir_usage(&self.log_dir)
    }
}

/// Removes the dead container `id` and then its log file, as kubelet's
/// container garbage collection does (CRI leaves a removed container's
/// log to the kubelet). Only a log file under `logs_root` (the agent's
/// `logs` directory) is deleted. Returns the log bytes freed.
pub async fn remove_container_with_log(
    rt: &dyn crate::cri::RuntimeActuator,
    id: &str,
    logs_root: &Path,
) -> crate::cri::CriResult<i64> {
    // The log's path is only known while the container is.
    let log = match rt.container_status(id).await {
        Ok(st) => Some(PathBuf::from(st.log_path)),
        Err(e) if e.is_not_found() => return Ok(0),
        Err(e) => {
            tracing::debug!(container = id, error = %e, "status before removal failed; its log stays");
            None
        }
    };
    rt.remove_container(id).await?;
    let Some(log) = log.filter(|p| owned_log(p, logs_root)) else {
        return Ok(0);
    };
    let bytes = std::fs::symlink_metadata(&log)
        .map(|m| (m.blocks() as i64).saturating_mul(512))
        .unwrap_or(0);
    match std::fs::remove_file(&log) {
        Ok(()) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => {
            tracing::warn!(container = id, log = %log.display(), error = %e, "removing a dead container's log failed");
            Ok(0)
        }
    }
}

/// Whether `log` is a file path inside `logs_root` with no `..` that
/// could lead out of it.
fn owned_log(log: &Path, logs_root: &Path) -> bool {
    log.is_absolute()
        && log.starts_with(logs_root)
        && log
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir))
        && log != logs_root
}

/// A local-storage limit a pod broke, with kubelet's signal name (for the
/// metric) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `emptydirfs.limit`, `ephemeralpodfs.limit` or
    /// `ephemeralcontainerfs.limit`.
    pub signal: &'static str,
    /// Why, in kubelet's words.
    pub message: String,
}

fn limit_of(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<i64> {
    quantity::bytes(&q?.0).ok().filter(|v| *v > 0)
}

/// The first local-storage limit the pod breaks, if any: an emptyDir
/// over its sizeLimit, the pod's usage over the sum of its containers'
/// ephemeral-storage limits (when every container has one), a container's
/// writable layer and logs over its own limit. `rootfs` holds the
/// writable layers' bytes by container name.
pub fn violation(
    spec: &PodSpec,
    paths: &PodPaths,
    rootfs: &HashMap<String, i64>,
) -> Option<Violation> {
    let mut empty_dirs = Usage::default();
    for v in spec.volumes.iter().flatten() {
        let Some(ed) = &v.empty_dir else { continue };
        if ed.medium.as_deref() == Some("Memory") {
            continue;
        }
        let used = dir_usage(&paths.empty_dir(&v.name));
        empty_dirs = empty_dirs + used;
        if let Some(limit) = limit_of(ed.size_limit.as_ref()) {
            if used.bytes > limit {
                return Some(Violation {
                    signal: "emptydirfs.limit",
                    message: format!(
                        "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                        v.name,
                        ed.size_limit
                            .as_ref()
                            .map(|q| q.0.as_str())
                            .unwrap_or_default()
                    ),
                });
            }
        }
    }
    let limits: Vec<Option<i64>> = spec
        .containers
        .iter()
        .map(|c| {
            limit_of(
                c.resources
                    .as_ref()
                    .and_then(|r| r.limits.as_ref())
                    .and_then(|l| l.get("ephemeral-storage")),
            )
        })
        .collect();
    let mut containers_total = 0;
    for (c, limit) in spec.containers.iter().zip(&limits) {
        let used = dir_usage(&paths.log_dir.join(&c.name)).bytes
            + rootfs.get(&c.name).copied().unwrap_or(0);
        containers_total += used;
        if let Some(limit) = limit {
            if used > *limit {
                return Some(Violation {
                    signal: "ephemeralcontainerfs.limit",
                    message: format!(
                        "Container {} exceeded its local ephemeral storage limit {:?}. ",
                        c.name,
                        limit.to_string()
                    ),
                });
            }
        }
    }
    if !limits.is_empty() && limits.iter().all(Option::is_some) {
        let total: i64 = limits.iter().flatten().sum();
        if empty_dirs.bytes + containers_total > total {
            return Some(Violation {
                signal: "ephemeralpodfs.limit",
                message: format!(
                    "Pod ephemeral local storage usage exceeds the total limit of containers {total}. "
                ),
            });
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> PodSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn usage_should_count_allocated_bytes_and_inodes() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/f"), vec![1u8; 100_000]).unwrap();
        let u = dir_usage(d.path());
        // The directory itself, a and a/f.
        assert_eq!(u.inodes, 3);
        assert!(u.bytes >= 100_000, "{u:?}");
        assert_eq!(dir_usage(&d.path().join("missing")), Usage::default());
    }

    #[test]
    fn an_empty_dir_over_its_size_limit_should_be_a_violation() {
        let root = tempfile::tempdir().unwrap();
        let paths = PodPaths::new(root.path(), "default", "p", "u1");
        let s = spec(
            "volumes: [{name: scratch, emptyDir: {sizeLimit: 64Ki}}]\ncontainers: [{name: c}]\n",
        );
        let dir = paths.empty_dir("scratch");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), vec![1u8; 32 << 10]).unwrap();
        assert_eq!(violation(&s, &paths, &HashMap::new()), None);
        std::fs::write(dir.join("g"), vec![1u8; 64 << 10]).unwrap();
        let v = violation(&s, &paths, &HashMap::new()).unwrap();
        assert_eq!(v.signal, "emptydirfs.limit");
        assert!(
            v.message.contains("\"scratch\"") && v.message.contains("64Ki"),
            "{}",
            v.message
        );
    }

    #[test]
    fn container_logs_over_the_limit_should_be_a_violation() {
        let root = tempfile::tempdir().unwrap();
        let paths = PodPaths::new(root.path(), "default", "p", "u1");
        let s = spec(
            "containers: [{name: c, resources: {limits: {ephemeral-storage: 100Ki}}}, {name: d}]\n",
        );
        std::fs::create_dir_all(paths.log_dir.join("c")).unwrap();
        std::fs::write(paths.log_dir.join("c/0.log"), vec![1u8; 200 << 10]).unwrap();
        let v = violation(&s, &paths, &HashMap::new()).unwrap();
        assert_eq!(v.signal, "ephemeralcontainerfs.limit");
        // Every container limited: the pod's total counts too.
        let s = spec(
            "volumes: [{name: e, emptyDir: {}}]\ncontainers: [{name: c, resources: {limits: {ephemeral-storage: 1Mi}}}]\n",
        );
        std::fs::create_dir_all(paths.empty_dir("e")).unwrap();
        std::fs::write(paths.empty_dir("e").join("f"), vec![1u8; 900 << 10]).unwrap();
        assert_eq!(
            violation(&s, &paths, &HashMap::new()).unwrap().signal,
            "ephemeralpodfs.limit"
        );
    }

    #[test]
    fn the_writable_layer_should_count_toward_a_containers_limit() {
        let root = tempfile::tempdir().unwrap();
        let paths = PodPaths::new(root.path(), "default", "p", "u1");
        let s = spec(
            "containers: [{name: c, resources: {limits: {ephemeral-storage: 1Mi}}}, {name: d}]\n",
        );
        std::fs::create_dir_all(paths.log_dir.join("c")).unwrap();
        std::fs::write(paths.log_dir.join("c/0.log"), vec![1u8; 600 << 10]).unwrap();
        assert_eq!(violation(&s, &paths, &HashMap::new()), None);
        // Logs and writable layer together pass the limit.
        let rootfs = HashMap::from([("c".to_string(), 600i64 << 10), ("d".into(), 1 << 30)]);
        let v = violation(&s, &paths, &rootfs).unwrap();
        assert_eq!(v.signal, "ephemeralcontainerfs.limit");
        assert!(v.message.contains("Container c "), "{}", v.message);
    }

    #[test]
    fn only_logs_under_the_agents_log_directory_should_be_owned() {
        let root = Path::new("/var/lib/petrel/logs");
        assert!(owned_log(
            Path::new("/var/lib/petrel/logs/ns_p_u/c/0.log"),
            root
        ));
        assert!(!owned_log(Path::new("/var/lib/petrel/logs"), root));
        assert!(!owned_log(Path::new("/var/lib/petrel/logs/../x"), root));
        assert!(!owned_log(Path::new("/var/log/pods/x/0.log"), root));
        assert!(!owned_log(Path::new(""), root));
        assert!(!owned_log(Path::new("logs/x.log"), root));
    }
}
