//! configMap, secret and projected volumes: files made from API objects
//! (cluster mode), as kubelet's plugins of the same names make them, and
//! written with [`super::atomic`] so a reader never sees half an update.
//!
//! ```text
//! pods/<uid>/volumes/kubernetes.io~configmap/<volume>   on the pod directory's disk
//! pods/<uid>/volumes/kubernetes.io~secret/<volume>      on a tmpfs of its own
//! pods/<uid>/volumes/kubernetes.io~projected/<volume>   on a tmpfs of its own
//! ```
//!
//! The objects come through [`ObjectView`] (the cluster side watches
//! them and requests service-account tokens); what is not known yet or
//! missing is a [`ConvertError::Missing`] with kubelet's words, which the
//! workers retry.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, KeyToPath, ProjectedVolumeSource, Secret, SecretVolumeSource,
    Volume,
};

use super::atomic::{FileProjection, Payload};
use super::downward::{check_item_path, items_payload, mode};
use super::{ConvertContext, ConvertError};
use crate::types::DesiredPod;

/// kubelet's plugin directories of these volumes in the pod's directory.
const CONFIG_MAP_PLUGIN: &str = "volumes/kubernetes.io~configmap";
const SECRET_PLUGIN: &str = "volumes/kubernetes.io~secret";
const PROJECTED_PLUGIN: &str = "volumes/kubernetes.io~projected";
/// The plugin directories whose volumes are tmpfs mounts.
pub(crate) const MEMORY_PLUGINS: &[&str] = &[SECRET_PLUGIN, PROJECTED_PLUGIN];

/// The API server's default mode of these volumes' files.
pub const DEFAULT_MODE: i32 = 0o644;
/// A projected service-account token's lifetime when none is asked for
/// (the API server's default).
pub const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// What an object lookup found.
#[derive(Debug, Clone)]
pub enum Lookup<T> {
    /// The object.
    Found(Arc<T>),
    /// The API server says there is none.
    NotFound,
    /// Not known yet (its watch has not listed it), with why.
    Unknown(String),
}

/// A service-account token a pod asked for (a projected volume's
/// `serviceAccountToken` source).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokenKey {
    /// The pod's service account.
    pub service_account: String,
    /// The audience ("" for the API server's own).
    pub audience: String,
    /// The lifetime asked for, in seconds.
    pub expiration_seconds: i64,
}

/// The API objects of the pods bound to this node, as the volume and
/// environment code reads them: from caches the cluster side keeps.
pub trait ObjectView: Send + Sync {
    /// ConfigMap `namespace/name`.
    fn config_map(&self, namespace: &str, name: &str) -> Lookup<ConfigMap>;
    /// Secret `namespace/name`.
    fn secret(&self, namespace: &str, name: &str) -> Lookup<Secret>;
    /// The current token `key` of pod `uid`, if one was issued.
    fn token(&self, uid: &str, key: &TokenKey) -> Option<String>;
    /// Every ClusterTrustBundle of the cluster.
    fn trust_bundles(&self) -> Lookup<Vec<super::TrustBundle>>;
}

/// The objects' view in a [`ConvertContext`].
#[derive(Clone)]
pub struct Objects(pub Arc<dyn ObjectView>);

impl fmt::Debug for Objects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Objects")
    }
}

/// Is `v` a volume made from API objects?
pub fn is_api_volume(v: &Volume) -> bool {
    v.config_map.is_some() || v.secret.is_some() || v.projected.is_some()
}

/// The host directory of API volume `v`, if it is one.
pub(crate) fn api_volume_path(ctx: &ConvertContext, v: &Volume) -> Option<PathBuf> {
    let plugin = if v.config_map.is_some() {
        CONFIG_MAP_PLUGIN
    } else if v.secret.is_some() {
        SECRET_PLUGIN
    } else if v.projected.is_some() {
        PROJECTED_PLUGIN
    } else {
        return None;
    };
    Some(ctx.pod_dir.join(plugin).join(&v.name))
}

/// The files of API volume `v` of `pod` now.
pub fn api_volume_payload(
    pod: &DesiredPod,
    v: &Volume,
    view: &dyn ObjectView,
) -> Result<Payload, ConvertError> {
    let field = format!("spec.volumes[{}]", v.name);
    if let Some(src) = &v.config_map {
        return config_map_volume(pod, src, view, &field);
    }
    if let Some(src) = &v.secret {
        return secret_volume(pod, src, view, &field);
    }
    if let Some(src) = &v.projected {
        return projected_volume(pod, src, view, &field);
    }
    Err(ConvertError::invalid(
        field,
        "not a configMap, secret or projected volume",
    ))
}

/// Which object a volume or projection source reads, and how.
struct Keyed<'a> {
    /// A ConfigMap (else a Secret).
    config_map: bool,
    name: &'a str,
    items: Option<&'a [KeyToPath]>,
    optional: bool,
}

fn config_map_volume(
    pod: &DesiredPod,
    src: &ConfigMapVolumeSource,
    view: &dyn ObjectView,
    field: &str,
) -> Result<Payload, ConvertError> {
    let default_mode = mode(
        src.default_mode.unwrap_or(DEFAULT_MODE),
        &format!("{field}.configMap.defaultMode"),
    )?;
    let keyed = Keyed {
        config_map: true,
        name: &src.name,
        items: src.items.as_deref(),
        optional: src.optional.unwrap_or(false),
    };
    keyed_files(
        pod,
        &keyed,
        default_mode,
        view,
        &format!("{field}.configMap"),
    )
}

fn secret_volume(
    pod: &DesiredPod,
    src: &SecretVolumeSource,
    view: &dyn ObjectView,
    field: &str,
) -> Result<Payload, ConvertError> {
    let default_mode = mode(
        src.default_mode.unwrap_or(DEFAULT_MODE),
        &format!("{field}.secret.defaultMode"),
    )?;
    let keyed = Keyed {
        config_map: false,
        name: src.secret_name.as_deref().unwrap_or(""),
        items: src.items.as_deref(),
        optional: src.optional.unwrap_or(false),
    };
    keyed_files(pod, &keyed, default_mode, view, &format!("{field}.secret"))
}

/// What a lookup found, with kubelet's words for what it did not:
/// `Ok(None)` for a missing object that is `optional`.
pub(crate) fn found<T>(
    lookup: Lookup<T>,
    kind: &str,
    name: &str,
    optional: bool,
) -> Result<Option<Arc<T>>, ConvertError> {
    match lookup {
        Lookup::Found(o) => Ok(Some(o)),
        Lookup::NotFound if optional => Ok(None),
        Lookup::NotFound => Err(ConvertError::Missing(format!("{kind} {name:?} not found"))),
        Lookup::Unknown(why) => Err(ConvertError::Missing(why)),
    }
}

/// A ConfigMap's data and binaryData as bytes by key.
pub(crate) fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

/// A Secret's data as bytes by key.
pub(crate) fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// The files of the object `keyed` names.
fn keyed_files(
    pod: &DesiredPod,
    keyed: &Keyed<'_>,
    default_mode: u32,
    view: &dyn ObjectView,
    field: &str,
) -> Result<Payload, ConvertError> {
    let (data, missing) = if keyed.config_map {
        let cm = found(
            view.config_map(&pod.namespace, keyed.name),
            "configmap",
            keyed.name,
            keyed.optional,
        )?;
        (
            cm.map(|c| config_map_data(&c)),
            "configmap references non-existent config key",
        )
    } else {
        let s = found(
            view.secret(&pod.namespace, keyed.name),
            "secret",
            keyed.name,
            keyed.optional,
        )?;
        (
            s.map(|s| secret_data(&s)),
            "secret references non-existent secret key",
        )
    };
    match data {
        Some(data) => key_files(
            &data,
            keyed.items,
            keyed.optional,
            default_mode,
            missing,
            field,
        ),
        None => Ok(Payload::new()),
    }
}

/// An object's keys as files: every key under its own name, or the items'
/// keys at their paths (a missing key refused with `missing`, kubelet's
/// words, unless `optional`).
fn key_files(
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    optional: bool,
    default_mode: u32,
    missing: &str,
    field: &str,
) -> Result<Payload, ConvertError> {
    let mut out = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (key, bytes) in data {
                let path = check_item_path(key, &format!("{field}: key {key:?}"))?;
                let file = FileProjection {
                    data: bytes.clone(),
                    mode: default_mode,
                };
                out.insert(path, file);
            }
        }
        Some(items) => {
            for (i, item) in items.iter().enumerate() {
                let ifield = format!("{field}.items[{i}]");
                let Some(bytes) = data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(ConvertError::Missing(format!("{missing}: {}", item.key)));
                };
                let path = check_item_path(&item.path, &format!("{ifield}.path"))?;
                let file_mode = match item.mode {
                    Some(m) => mode(m, &format!("{ifield}.mode"))?,
                    None => default_mode,
                };
                out.insert(
                    path,
                    FileProjection {
                        data: bytes.clone(),
                        mode: file_mode,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// The service account a pod runs as.
pub fn service_account(pod: &DesiredPod) -> String {
    pod.pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// The tokens `pod`'s projected volumes ask for.
pub fn token_keys(pod: &DesiredPod) -> Vec<TokenKey> {
    let sa = service_account(pod);
    let mut keys: Vec<TokenKey> = pod
        .pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.projected.as_ref())
        .flat_map(|p| p.sources.iter().flatten())
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| TokenKey {
            service_account: sa.clone(),
            audience: t.audience.clone().unwrap_or_default(),
            expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

fn projected_volume(
    pod: &DesiredPod,
    src: &ProjectedVolumeSource,
    view: &dyn ObjectView,
    field: &str,
) -> Result<Payload, ConvertError> {
    let default_mode = mode(
        src.default_mode.unwrap_or(DEFAULT_MODE),
        &format!("{field}.projected.defaultMode"),
    )?;
    let mut out = Payload::new();
    for (i, s) in src.sources.iter().flatten().enumerate() {
        let sfield = format!("{field}.projected.sources[{i}]");
        let files = if let Some(cm) = &s.config_map {
            let keyed = Keyed {
                config_map: true,
                name: &cm.name,
                items: cm.items.as_deref(),
                optional: cm.optional.unwrap_or(false),
            };
            keyed_files(
                pod,
                &keyed,
                default_mode,
                view,
                &format!("{sfield}.configMap"),
            )?
        } else if let Some(sec) = &s.secret {
            let keyed = Keyed {
                config_map: false,
                name: &sec.name,
                items: sec.items.as_deref(),
                optional: sec.optional.unwrap_or(false),
            };
            keyed_files(pod, &keyed, default_mode, view, &format!("{sfield}.secret"))?
        } else if let Some(d) = &s.downward_api {
            items_payload(
                pod,
                d.items.as_deref().unwrap_or(&[]),
                default_mode,
                &format!("{sfield}.downwardAPI"),
            )?
        } else if let Some(t) = &s.service_account_token {
            let key = TokenKey {
                service_account: service_account(pod),
                audience: t.audience.clone().unwrap_or_default(),
                expiration_seconds: t.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
            };
            let path = check_item_path(&t.path, &format!("{sfield}.serviceAccountToken.path"))?;
            let token = view.token(&pod.uid, &key).ok_or_else(|| {
                ConvertError::Missing(format!(
                    "no token for service account {:?} yet",
                    key.service_account
                ))
            })?;
            Payload::from([(
                path,
                FileProjection {
                    data: token.into_bytes(),
                    mode: default_mode,
                },
            )])
        } else if let Some(ctb) = &s.cluster_trust_bundle {
            let cfield = format!("{sfield}.clusterTrustBundle");
            let path = check_item_path(&ctb.path, &format!("{cfield}.path"))?;
            let data = super::trust_bundles::projection_file(ctb, view.trust_bundles(), &cfield)?;
            Payload::from([(
                path,
                FileProjection {
                    data,
                    mode: default_mode,
                },
            )])
        } else {
            continue;
        };
        out.extend(files);
    }
    Ok(out)
}

/// Writes API volume `v` of `pod` (atomically; nothing when unchanged),
/// its directory a tmpfs of its own for secrets and projections when
/// `ctx.memory_volumes`; returns the directory.
pub(crate) fn write_api_volume(
    pod: &DesiredPod,
    v: &Volume,
    ctx: &ConvertContext,
) -> Result<PathBuf, ConvertError> {
    let field = format!("spec.volumes[{}]", v.name);
    let view = ctx.objects.as_ref().ok_or_else(|| {
        ConvertError::unsupported(
            &field,
            "configMap, secret and projected volumes need an API server",
        )
    })?;
    let dir = api_volume_path(ctx, v)
        .ok_or_else(|| ConvertError::invalid(&field, "not an API volume"))?;
    // Read first: nothing is made for a volume whose objects are missing.
    let mut files = api_volume_payload(pod, v, view.0.as_ref()).map_err(|e| match e {
        ConvertError::Missing(m) => ConvertError::Missing(format!(
            "MountVolume.SetUp failed for volume {:?} : {m}",
            v.name
        )),
        e => e,
    })?;
    let io = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source: std::io::Error| ConvertError::Io { op, path, source }
    };
    if let Some(parent) = dir.parent() {
        petrel_fs::create_private_dir_all(parent, petrel_fs::PRIVATE)
            .map_err(|e| io("create", parent)(std::io::Error::other(e)))?;
    }
    if ctx.memory_volumes && v.config_map.is_none() {
        mount_tmpfs(&dir).map_err(io("mount tmpfs on", &dir))?;
    }
    // A pod's fsGroup owns the files, readable by the group, as kubelet's
    // volume ownership makes them.
    let gid = super::fs_group(pod);
    if gid.is_some() {
        for f in files.values_mut() {
            f.mode |= 0o440;
        }
    }
    super::atomic::write(&dir, &files, gid).map_err(io("write volume", &dir))?;
    Ok(dir)
}

/// Makes `dir` a tmpfs (once: a directory already on another filesystem
/// than its parent is taken as mounted), so secrets never reach a disk.
fn mount_tmpfs(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let parent = dir.parent().unwrap_or(dir);
    if std::fs::symlink_metadata(dir)?.dev() != std::fs::symlink_metadata(parent)?.dev() {
        return Ok(());
    }
    use rustix::mount::{mount, MountFlags};
    mount(
        "tmpfs",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=0755",
    )
    .map_err(std::io::Error::from)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests;
