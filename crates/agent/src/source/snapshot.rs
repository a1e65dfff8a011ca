//! From parsed files to the desired pods: identity, defaults, validation,
//! duplicates across files, and the difference between two snapshots.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::parse::Doc;
use super::{defaults, uid, validate, ChangeKind, Naming, SourceChange};
use crate::types::{DesiredPod, PodOrigin, PodUid};

/// The documents of every manifest file, by path (sorted: the order that
/// decides which of two duplicates is the invalid one).
pub type Files = BTreeMap<PathBuf, Vec<Doc>>;

/// The desired pods, by UID.
pub type Snapshot = BTreeMap<PodUid, DesiredPod>;

struct Candidate<'a> {
    path: &'a Path,
    namespace: String,
    name: String,
    /// The name came from the file stem, not the document.
    fallback_name: bool,
    pod: Pod,
    invalid: Vec<String>,
    explicit_uid: Option<String>,
}

/// Which pod owns each namespace/name (the first defined; later
/// duplicates are shown as invalid under their own UIDs).
pub type Owners = HashMap<(String, String), PodUid>;

/// Builds the desired pods of `files` for node `node`.
pub fn build(files: &Files, node: &str, naming: Naming) -> (Snapshot, Owners) {
    let mut cands = Vec::new();
    for (path, docs) in files {
        let many = docs.len() > 1;
        for (i, doc) in docs.iter().enumerate() {
            let mut c = candidate(path, i, many, doc, node);
            if naming == Naming::NodeSuffix {
                c.name = format!("{}-{node}", c.name);
                c.pod.metadata.name = Some(c.name.clone());
                // The longer name must still be valid (253 characters).
                let named_ok = !c.invalid.iter().any(|e| e.starts_with("metadata.name"));
                if named_ok && !c.fallback_name {
                    let name_errors = validate::validate(&c.pod)
                        .into_iter()
                        .filter(|e| e.starts_with("metadata.name"));
                    c.invalid.extend(name_errors);
                }
            }
            cands.push(c);
        }
    }
    // Pods named by their own manifest claim names first, in path order; a
    // broken document named after its file yields to them, so a typo in one
    // file never takes a working pod's identity.
    let order = cands
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.fallback_name)
        .chain(cands.iter().enumerate().filter(|(_, c)| c.fallback_name))
        .map(|(i, _)| i)
        .collect::<Vec<_>>();
    let mut by_name: HashMap<(String, String), PathBuf> = HashMap::new();
    let mut owners = Owners::new();
    let mut out = Snapshot::new();
    let mut cands: Vec<Option<Candidate>> = cands.into_iter().map(Some).collect();
    for i in order {
        let Some(mut c) = cands[i].take() else {
            continue;
        };
        let key = (c.namespace.clone(), c.name.clone());
        let mut uid = c
            .explicit_uid
            .clone()
            .unwrap_or_else(|| uid::derive(node, &c.namespace, &c.name));
        let owner = !by_name.contains_key(&key);
        if let Some(first) = by_name.get(&key) {
            c.invalid.push(format!(
                "duplicate pod {}/{}, also defined in {}",
                c.namespace,
                c.name,
                first.display()
            ));
        } else {
            by_name.insert(key, c.path.to_path_buf());
        }
        if let Some(other) = out.get(&uid) {
            if c.explicit_uid.is_some() && c.invalid.is_empty() {
                c.invalid.push(format!(
                    "metadata.uid: Duplicate value: {uid:?}: also used by {}/{} in {}",
                    other.namespace, other.name, other.source
                ));
            }
            // Every document keeps its own key, so it can be shown.
            uid = uid::derive_for_duplicate(node, &c.namespace, &c.name, &c.path.to_string_lossy());
        }
        c.pod.metadata.uid = Some(uid.clone());
        if owner {
            owners.insert((c.namespace.clone(), c.name.clone()), uid.clone());
        }
        let invalid = (!c.invalid.is_empty()).then(|| c.invalid.join("; "));
        out.insert(
            uid.clone(),
            DesiredPod {
                uid,
                namespace: c.namespace,
                name: c.name,
                pod: Arc::new(c.pod),
                source: PodOrigin::File(c.path.to_path_buf()),
                invalid,
            },
        );
    }
    (out, owners)
}

fn candidate<'a>(path: &'a Path, index: usize, many: bool, doc: &Doc, node: &str) -> Candidate<'a> {
    let mut invalid: Vec<String> = doc.error.iter().cloned().collect();
    let mut pod = doc.pod.clone().unwrap_or_else(|| Pod {
        metadata: ObjectMeta {
            name: doc.name.clone(),
            namespace: doc.namespace.clone(),
            ..Default::default()
        },
        spec: Some(PodSpec::default()),
        ..Default::default()
    });
    defaults::apply(&mut pod, node);
    if doc.pod.is_some() {
        invalid.extend(validate::validate(&pod));
    }
    let (name, fallback_name) = match readable(&pod.metadata.name, 253) {
        Some(n) => (n, false),
        None => {
            let stem = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut n = uid::sanitize_label(&stem);
            if many {
                n = format!("{}-{index}", n.chars().take(50).collect::<String>());
            }
            (n, true)
        }
    };
    let namespace = pod
        .metadata
        .namespace
        .as_ref()
        .and(readable(&pod.metadata.namespace, 63))
        .unwrap_or_else(|| "default".to_string());
    // The shown pod carries the identity it is shown under.
    pod.metadata.name = Some(name.clone());
    pod.metadata.namespace = Some(namespace.clone());
    let explicit_uid = pod.metadata.uid.clone().filter(|u| !u.is_empty());
    Candidate {
        path,
        namespace,
        name,
        fallback_name,
        pod,
        invalid,
        explicit_uid,
    }
}

/// A name as written, if it can be shown and used in a URL path: even an
/// invalid one ("Foo_") is better shown as the user wrote it.
fn readable(s: &Option<String>, max: usize) -> Option<String> {
    s.clone().filter(|n| {
        !n.is_empty()
            && n.len() <= max
            && !n
                .chars()
                .any(|c| c == '/' || c.is_whitespace() || c.is_control())
    })
}

/// Gives every pod of `new` that equals its pod in `old` (same pod object
/// and validity) the old pod's `Arc`: the workers recognise an unchanged
/// pod by identity, so a re-read of unchanged files (the watcher's scans,
/// an edit of another file) must not make every pod look new.
pub fn keep_unchanged(old: &Snapshot, new: &mut Snapshot) {
    for (uid, p) in new.iter_mut() {
        if let Some(o) = old.get(uid) {
            if !Arc::ptr_eq(&o.pod, &p.pod) && o.pod == p.pod && o.invalid == p.invalid {
                p.pod = Arc::clone(&o.pod);
            }
        }
    }
}

/// The changes that turn `old` into `new`: one per pod whose pod object or
/// validity differs (where it came from does not count).
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<SourceChange> {
    let mut out = Vec::new();
    for (uid, p) in new {
        let kind = match old.get(uid) {
            None => ChangeKind::Added,
            Some(o) if o.pod != p.pod || o.invalid != p.invalid => ChangeKind::Updated,
            Some(_) => continue,
        };
        out.push(SourceChange {
            uid: uid.clone(),
            kind,
            pod: p.clone(),
        });
    }
    for (uid, p) in old {
        if !new.contains_key(uid) {
            out.push(SourceChange {
                uid: uid.clone(),
                kind: ChangeKind::Removed,
                pod: p.clone(),
            });
        }
    }
    out
}
