//! The pod's volumes: emptyDir directories and downwardAPI files under the
//! pod's directory, hostPath type checks, image volumes (mounted by the
//! runtime from an OCI image), and the CRI mounts of a container.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Volume, VolumeMount};
use petrel_cri::api;

use super::api_volumes::{api_volume_path, is_api_volume, write_api_volume, MEMORY_PLUGINS};
use super::downward::{downward_api_path, write_volume};
use super::env::{container_field, expand};
use super::{ConvertContext, ConvertError};
use crate::types::DesiredPod;

/// Where emptyDir volumes live inside the pod's directory (kubelet's
/// plugin directory name, so tools that know kubelet find them).
const EMPTY_DIR_PLUGIN: &str = "volumes/kubernetes.io~empty-dir";

/// The host directory of an emptyDir volume.
pub(crate) fn empty_dir_path(ctx: &ConvertContext, name: &str) -> PathBuf {
    ctx.pod_dir.join(EMPTY_DIR_PLUGIN).join(name)
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ConvertError {
    let path = path.to_path_buf();
    move |source| ConvertError::Io { op, path, source }
}

/// A volume name becomes a path component: refuse anything that is not
/// exactly one normal component.
fn check_volume_name(name: &str, field: &str) -> Result<(), ConvertError> {
    let mut comps = Path::new(name).components();
    match (comps.next(), comps.next()) {
        (Some(Component::Normal(_)), None) if !name.contains('/') => Ok(()),
        _ => Err(ConvertError::invalid(
            field,
            format!("volume name {name:?} is not a single path component"),
        )),
    }
}

/// Creates the pod's emptyDir directories (mode 0777, so containers
/// running as any user can write, like kubelet's), writes its downwardAPI
/// volumes (`downward.rs`) and checks or creates its hostPaths
/// by their declared type, and checks that image volumes name their image.
/// Other volume types are refused.
/// subPaths are made when their container is created (see
/// [`crate::subpath`]), not here: a path checked now could be a symlink
/// by then.
pub fn prepare_volumes(pod: &DesiredPod, ctx: &ConvertContext) -> Result<(), ConvertError> {
    let Some(spec) = pod.pod.spec.as_ref() else {
        return Ok(());
    };
    for v in spec.volumes.iter().flatten() {
        let field = format!("spec.volumes[{}]", v.name);
        check_volume_name(&v.name, &field)?;
        if let Some(ed) = &v.empty_dir {
            if ed.medium.as_deref() == Some("Memory") {
                // No tmpfs yet: a disk directory keeps such pods running.
                tracing::warn!(pod = %pod.name, volume = %v.name, "emptyDir medium Memory served from disk");
            }
            let dir = empty_dir_path(ctx, &v.name);
            // The volume is 0777; the path to it is the agent's, private.
            if let Some(parent) = dir.parent() {
                petrel_fs::create_private_dir_all(parent, petrel_fs::PRIVATE)
                    .map_err(|e| io_err("create", parent)(std::io::Error::other(e)))?;
            }
            fs::create_dir_all(&dir).map_err(io_err("create emptyDir", &dir))?;
            // The pod's fsGroup owns it, setgid so what is made in it
            // keeps the group, as kubelet's volume ownership does.
            let mode = match super::fs_group(pod) {
                Some(gid) => {
                    std::os::unix::fs::chown(&dir, None, Some(gid))
                        .map_err(io_err("chown emptyDir", &dir))?;
                    0o2777
                }
                None => 0o777,
            };
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                .map_err(io_err("chmod emptyDir", &dir))?;
        } else if let Some(hp) = &v.host_path {
            check_host_path(&hp.path, hp.type_.as_deref().unwrap_or(""), &field)?;
        } else if let Some(da) = &v.downward_api {
            write_volume(pod, &v.name, da, ctx)?;
        } else if is_api_volume(v) {
            write_api_volume(pod, v, ctx)?;
        } else if v.image.is_some() {
            // The runtime mounts it; the worker pulls it (see
            // `image_volume_reference`).
            image_volume_reference(v)?;
        } else {
            return Err(unsupported_volume(v, &field));
        }
    }
    Ok(())
}

fn unsupported_volume(v: &Volume, field: &str) -> ConvertError {
    // Name the volume's type by its JSON key, e.g. "configMap".
    let kind = serde_json::to_value(v)
        .ok()
        .and_then(|j| {
            j.as_object()
                .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        })
        .unwrap_or_else(|| "no source".to_string());
    ConvertError::unsupported(
        field,
        format!("volume type {kind} (only emptyDir, hostPath, downwardAPI, image, and configMap, secret and projected in cluster mode)"),
    )
}

/// The image an image volume (`spec.volumes[].image`) mounts, or `None`
/// for other volumes; an image volume without a reference is refused.
pub fn image_volume_reference(v: &Volume) -> Result<Option<&str>, ConvertError> {
    let Some(img) = &v.image else {
        return Ok(None);
    };
    match img.reference.as_deref().map(str::trim) {
        Some(r) if !r.is_empty() => Ok(Some(r)),
        _ => Err(ConvertError::invalid(
            format!("spec.volumes[{}].image.reference", v.name),
            "an image volume must name its image",
        )),
    }
}

/// Checks a hostPath against its declared type, creating it for the
/// `...OrCreate` types.
fn check_host_path(path: &str, kind: &str, field: &str) -> Result<(), ConvertError> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(ConvertError::invalid(
            format!("{field}.hostPath.path"),
            format!("{path:?} is not absolute"),
        ));
    }
    // The API server's rule: a hostPath never climbs with "..".
    if path.split('/').any(|c| c == "..") {
        return Err(ConvertError::invalid(
            format!("{field}.hostPath.path"),
            format!("{path:?} must not contain '..'"),
        ));
    }
    let md = fs::metadata(p);
    let wrong = |what: &str| {
        ConvertError::invalid(
            format!("{field}.hostPath"),
            format!("{path} is not {what} (type {kind})"),
        )
    };
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" => match md {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(wrong("a directory")),
            Err(_) => {
                fs::create_dir_all(p).map_err(io_err("create hostPath", p))?;
                fs::set_permissions(p, fs::Permissions::from_mode(0o755))
                    .map_err(io_err("chmod hostPath", p))
            }
        },
        "FileOrCreate" => match md {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(wrong("a file")),
            Err(_) => {
                if let Some(parent) = p.parent() {
                    fs::create_dir_all(parent).map_err(io_err("create hostPath parent", parent))?;
                }
                fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(p)
                    .map_err(io_err("create hostPath", p))?;
                fs::set_permissions(p, fs::Permissions::from_mode(0o644))
                    .map_err(io_err("chmod hostPath", p))
            }
        },
        "Directory" | "File" | "Socket" | "CharDevice" | "BlockDevice" => {
            let m = md.map_err(|_| wrong("present"))?;
            let ft = m.file_type();
            let ok = match kind {
                "Directory" => ft.is_dir(),
                "File" => ft.is_file(),
                "Socket" => ft.is_socket(),
                "CharDevice" => ft.is_char_device(),
                _ => ft.is_block_device(),
            };
            if ok {
                Ok(())
            } else {
                Err(wrong(match kind {
                    "Directory" => "a directory",
                    "File" => "a file",
                    "Socket" => "a socket",
                    "CharDevice" => "a character device",
                    _ => "a block device",
                }))
            }
        }
        other => Err(ConvertError::invalid(
            format!("{field}.hostPath.type"),
            format!("unknown type {other:?}"),
        )),
    }
}

/// A subPath as a relative path that stays inside its volume: no absolute
/// paths, no `..`.
pub(crate) fn safe_sub_path(sub: &str, field: &str) -> Result<PathBuf, ConvertError> {
    let p = Path::new(sub);
    let mut out = PathBuf::new();
    for comp in p.components() {
        match comp {
            Component::Normal(c) => out.push(c),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(ConvertError::invalid(
                    field,
                    format!("{sub:?} contains '..'"),
                ))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(ConvertError::invalid(field, format!("{sub:?} is absolute")))
            }
        }
    }
    Ok(out)
}

fn propagation(m: &VolumeMount, privileged: bool, field: &str) -> Result<i32, ConvertError> {
    Ok(match m.mount_propagation.as_deref() {
        None | Some("") | Some("None") => api::MountPropagation::PropagationPrivate,
        Some("HostToContainer") => api::MountPropagation::PropagationHostToContainer,
        Some("Bidirectional") if privileged => api::MountPropagation::PropagationBidirectional,
        Some("Bidirectional") => {
            return Err(ConvertError::invalid(
                format!("{field}.mountPropagation"),
                "Bidirectional needs a privileged container",
            ))
        }
        Some(other) => {
            return Err(ConvertError::invalid(
                format!("{field}.mountPropagation"),
                format!("unknown mode {other:?}"),
            ))
        }
    } as i32)
}

/// Whether the mount is recursively read-only, as kubelet resolves
/// `recursiveReadOnly`: `Enabled` and `IfPossible` need `readOnly: true`
/// and no mount propagation (the API server's rules, checked again for
/// static pods); `Enabled` fails when the runtime cannot (`supported`:
/// its default handler's `recursive_read_only_mounts`), `IfPossible`
/// falls back to a plain read-only mount.
fn recursive_read_only(
    m: &VolumeMount,
    supported: bool,
    field: &str,
) -> Result<bool, ConvertError> {
    let mode = match m.recursive_read_only.as_deref() {
        None | Some("Disabled") => return Ok(false),
        Some(mode @ ("Enabled" | "IfPossible")) => mode,
        Some(other) => {
            return Err(ConvertError::invalid(
                format!("{field}.recursiveReadOnly"),
                format!("unknown mode {other:?} (Disabled, IfPossible, Enabled)"),
            ))
        }
    };
    if !m.read_only.unwrap_or(false) {
        return Err(ConvertError::invalid(
            format!("{field}.recursiveReadOnly"),
            "may only be specified when readOnly is true",
        ));
    }
    if m.mount_propagation.as_deref().is_some_and(|p| p != "None") {
        return Err(ConvertError::invalid(
            format!("{field}.recursiveReadOnly"),
            "may only be specified when mountPropagation is None or not specified",
        ));
    }
    if mode == "Enabled" && !supported {
        return Err(ConvertError::unsupported(
            format!("{field}.recursiveReadOnly"),
            "Enabled, but the runtime does not support recursive read-only mounts",
        ));
    }
    Ok(supported)
}

/// A volumeMount with a subPath: what must be bound before the container
/// is created, and where. The CRI mount's `host_path` is `mount_point`,
/// which holds nothing until [`crate::subpath`] binds the subPath opened
/// beneath `volume_dir` there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubPathMount {
    /// The volumeMount's (and volume's) name.
    pub volume: String,
    /// The container's name.
    pub container: String,
    /// The subPath as the spec gives it (subPathExpr expanded).
    pub sub_path: String,
    /// The volume's host directory.
    pub volume_dir: PathBuf,
    /// The subPath as normal components, relative to `volume_dir`.
    pub relative: PathBuf,
    /// The agent's mount point: `<sub_path_dir>/<volume>/<container>/<index
    /// of the volumeMount>`.
    pub mount_point: PathBuf,
}

/// The container's CRI mounts from its volumeMounts, and the subPaths to
/// bind for them. `env` expands subPathExpr.
pub(crate) fn container_mounts(
    pod: &DesiredPod,
    container: &Container,
    init: bool,
    env: &[(String, String)],
    ctx: &ConvertContext,
) -> Result<(Vec<api::Mount>, Vec<SubPathMount>), ConvertError> {
    let volumes: &[Volume] = pod
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or(&[]);
    let privileged = container
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    let cfield = container_field(container, init);
    let mut mounts = Vec::new();
    let mut sub_paths = Vec::new();
    for (index, m) in container.volume_mounts.iter().flatten().enumerate() {
        let field = format!("{cfield}.volumeMounts[{}]", m.name);
        let v = volumes.iter().find(|v| v.name == m.name).ok_or_else(|| {
            ConvertError::invalid(&field, format!("no volume named {:?}", m.name))
        })?;
        check_volume_name(&v.name, &field)?;
        if !Path::new(&m.mount_path).is_absolute() {
            return Err(ConvertError::invalid(
                format!("{field}.mountPath"),
                format!("{:?} is not absolute", m.mount_path),
            ));
        }
        let sub = match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
            (Some(s), _) if !s.is_empty() => Some((s.to_string(), "subPath")),
            (_, Some(e)) if !e.is_empty() => {
                let expanded = expand(e, &|n| {
                    env.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
                });
                Some((expanded, "subPathExpr"))
            }
            _ => None,
        };
        if let Some(reference) = image_volume_reference(v)? {
            mounts.push(image_mount(m, reference, sub, privileged, &field)?);
            continue;
        }
        // downwardAPI, configMap, secret and projected volumes are
        // read-only, as kubelet mounts them.
        let forced_readonly = v.downward_api.is_some() || is_api_volume(v);
        let volume_dir = if v.empty_dir.is_some() {
            empty_dir_path(ctx, &v.name)
        } else if let Some(hp) = &v.host_path {
            PathBuf::from(&hp.path)
        } else if v.downward_api.is_some() {
            downward_api_path(ctx, &v.name)
        } else if let Some(dir) = api_volume_path(ctx, v).filter(|_| ctx.objects.is_some()) {
            dir
        } else {
            return Err(unsupported_volume(v, &format!("spec.volumes[{}]", v.name)));
        };
        let host = match sub {
            Some((s, name)) => {
                let relative = safe_sub_path(&s, &format!("{field}.{name}"))?;
                // Container names are DNS labels and volume names single
                // components (checked above): safe as path components.
                let mount_point = ctx
                    .sub_path_dir
                    .join(&v.name)
                    .join(&container.name)
                    .join(index.to_string());
                sub_paths.push(SubPathMount {
                    volume: v.name.clone(),
                    container: container.name.clone(),
                    sub_path: s,
                    volume_dir,
                    relative,
                    mount_point: mount_point.clone(),
                });
                mount_point
            }
            None => volume_dir,
        };
        let readonly = m.read_only.unwrap_or(false) || forced_readonly;
        mounts.push(api::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.to_string_lossy().into_owned(),
            readonly,
            recursive_read_only: recursive_read_only(m, ctx.recursive_read_only, &field)?,
            propagation: propagation(m, privileged, &field)?,
            ..Default::default()
        });
    }
    Ok((mounts, sub_paths))
}

/// The CRI mount of an image volume, as kubelet makes it: the runtime
/// mounts the image itself (no host path), always read-only whatever the
/// volumeMount's `readOnly` says, and a subPath is the runtime's
/// `image_sub_path` (no agent bind: the agent never sees the image's
/// files).
fn image_mount(
    m: &VolumeMount,
    reference: &str,
    sub: Option<(String, &str)>,
    privileged: bool,
    field: &str,
) -> Result<api::Mount, ConvertError> {
    let image_sub_path = match sub {
        Some((s, name)) => safe_sub_path(&s, &format!("{field}.{name}"))?
            .to_string_lossy()
            .into_owned(),
        None => String::new(),
    };
    Ok(api::Mount {
        container_path: m.mount_path.clone(),
        readonly: true,
        propagation: propagation(m, privileged, field)?,
        image: Some(api::ImageSpec {
            image: reference.to_string(),
            ..Default::default()
        }),
        image_sub_path,
        ..Default::default()
    })
}

/// Removes the pod's subPath mount points (unmounted first) and its
/// directory with everything in it (its emptyDirs). The removal never
/// follows symlinks, so a link a container left in an emptyDir cannot make
/// it delete anything outside the pod's directory.
pub fn remove_pod_dir(ctx: &ConvertContext) -> std::io::Result<()> {
    let mounts = crate::subpath::remove_pod(&ctx.sub_path_dir);
    let memory = unmount_memory_volumes(ctx);
    let dir = remove_dir_only(ctx);
    mounts.and(memory).and(dir)
}

/// Unmounts the tmpfs of each secret and projected volume of the pod, so
/// the removal that follows only ever sees the agent's directories.
fn unmount_memory_volumes(ctx: &ConvertContext) -> std::io::Result<()> {
    let mut first = Ok(());
    for plugin in MEMORY_PLUGINS {
        let Ok(entries) = fs::read_dir(ctx.pod_dir.join(plugin)) else {
            continue;
        };
        for e in entries.flatten() {
            if let Err(err) = crate::subpath::unmount_all(&e.path()) {
                if first.is_ok() {
                    first = Err(err);
                }
            }
        }
    }
    first
}

/// Writes the pod's downwardAPI, configMap, secret and projected volumes
/// again (each atomically, nothing when unchanged) when their objects or
/// the pod changed, as kubelet's volume manager does; only volumes made
/// already (the pod's sandbox exists) are touched. A volume that cannot
/// be written keeps its files; the first error is returned after the
/// others were tried. Returns how many volumes were looked at.
pub fn refresh_volumes(pod: &DesiredPod, ctx: &ConvertContext) -> Result<usize, ConvertError> {
    let Some(spec) = pod.pod.spec.as_ref() else {
        return Ok(0);
    };
    let mut first = Ok(());
    let mut n = 0;
    for v in spec.volumes.iter().flatten() {
        let written = if let Some(da) = &v.downward_api {
            if !downward_api_path(ctx, &v.name).exists() {
                continue;
            }
            write_volume(pod, &v.name, da, ctx).map(drop)
        } else if is_api_volume(v) {
            if !api_volume_path(ctx, v).is_some_and(|d| d.exists()) {
                continue;
            }
            write_api_volume(pod, v, ctx).map(drop)
        } else {
            continue;
        };
        n += 1;
        if let Err(e) = written {
            if first.is_ok() {
                first = Err(e);
            }
        }
    }
    first.map(|()| n)
}

fn remove_dir_only(ctx: &ConvertContext) -> std::io::Result<()> {
    match fs::symlink_metadata(&ctx.pod_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        // A symlink in place of the pod directory: remove the link only.
        Ok(md) if !md.is_dir() => fs::remove_file(&ctx.pod_dir),
        // remove_dir_all does not follow symlinks inside the tree.
        Ok(_) => fs::remove_dir_all(&ctx.pod_dir),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::{ctx, desired};

    fn ctx_in(dir: &Path) -> ConvertContext {
        ConvertContext {
            pod_dir: dir.join("pods/uid"),
            sub_path_dir: dir.join("volume-subpaths/uid"),
            ..ctx()
        }
    }

    fn mount(read_only: bool, rro: Option<&str>, propagation: Option<&str>) -> VolumeMount {
        VolumeMount {
            name: "v".into(),
            mount_path: "/v".into(),
            read_only: Some(read_only),
            recursive_read_only: rro.map(str::to_string),
            mount_propagation: propagation.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn recursive_read_only_should_resolve_as_kubelet_does() {
        let f = "spec.containers[a].volumeMounts[v]";
        for supported in [false, true] {
            for rro in [None, Some("Disabled")] {
                assert!(!recursive_read_only(&mount(true, rro, None), supported, f).unwrap());
            }
            // IfPossible: whatever the runtime can do.
            let m = mount(true, Some("IfPossible"), Some("None"));
            assert_eq!(recursive_read_only(&m, supported, f).unwrap(), supported);
        }
        let enabled = mount(true, Some("Enabled"), None);
        assert!(recursive_read_only(&enabled, true, f).unwrap());
        let e = recursive_read_only(&enabled, false, f)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("recursiveReadOnly") && e.contains("does not support"),
            "{e}"
        );
    }

    #[test]
    fn recursive_read_only_should_refuse_writable_propagating_or_unknown_mounts() {
        let f = "spec.containers[a].volumeMounts[v]";
        for (m, want) in [
            (mount(false, Some("Enabled"), None), "readOnly is true"),
            (mount(false, Some("IfPossible"), None), "readOnly is true"),
            (
                mount(true, Some("Enabled"), Some("HostToContainer")),
                "mountPropagation is None",
            ),
            (mount(true, Some("Always"), None), "unknown mode"),
        ] {
            let e = recursive_read_only(&m, true, f).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains(f), "{e}");
        }
    }

    #[test]
    fn prepare_volumes_should_give_the_fs_group_empty_dirs_and_downward_files() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let pod = desired("metadata: {name: p, labels: {a: b}}\nspec:\n  securityContext: {fsGroup: 3456}\n  volumes: [{name: scratch, emptyDir: {}}, {name: info, downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}}]\n  containers: [{name: a, image: x}]\n");
        let c = ctx_in(tmp.path());
        prepare_volumes(&pod, &c).unwrap();
        let scratch = fs::metadata(empty_dir_path(&c, "scratch")).unwrap();
        assert_eq!(scratch.gid(), 3456);
        assert_eq!(scratch.permissions().mode() & 0o7777, 0o2777);
        let labels = fs::metadata(downward_api_path(&c, "info").join("labels")).unwrap();
        assert_eq!(labels.gid(), 3456);
        assert_eq!(labels.permissions().mode() & 0o777, 0o644 | 0o440);
    }

    #[test]
    fn prepare_volumes_should_create_empty_dirs_but_not_sub_paths() {
        let tmp = tempfile::tempdir().unwrap();
        let c = ctx_in(tmp.path());
        let pod = desired(
            "metadata: {name: p}\nspec:\n  volumes: [{name: d, emptyDir: {}}, {name: m, emptyDir: {medium: Memory}}]\n  containers: [{name: a, image: x, volumeMounts: [{name: d, mountPath: /m, subPath: x/y}]}]\n",
        );
        prepare_volumes(&pod, &c).unwrap();
        let d = empty_dir_path(&c, "d");
        assert!(d.ends_with("pods/uid/volumes/kubernetes.io~empty-dir/d"));
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o777
        );
        assert!(empty_dir_path(&c, "m").is_dir());
        // subPaths are made safely when their container is created.
        assert!(!d.join("x").exists());
        // Idempotent.
        prepare_volumes(&pod, &c).unwrap();
    }

    #[test]
    fn prepare_volumes_should_check_host_path_types() {
        let tmp = tempfile::tempdir().unwrap();
        let c = ctx_in(tmp.path());
        let base = tmp.path().display().to_string();
        fs::write(tmp.path().join("file"), b"x").unwrap();
        let ok = [
            format!("{{path: {base}, type: Directory}}"),
            format!("{{path: {base}/file, type: File}}"),
            format!("{{path: {base}/new/dir, type: DirectoryOrCreate}}"),
            format!("{{path: {base}/newer/file, type: FileOrCreate}}"),
            format!("{{path: {base}/missing}}"),
            "{path: /dev/null, type: CharDevice}".to_string(),
        ];
        for hp in ok {
            let pod = desired(&format!("metadata: {{name: p}}\nspec:\n  volumes: [{{name: h, hostPath: {hp}}}]\n  containers: []\n"));
            prepare_volumes(&pod, &c).unwrap_or_else(|e| panic!("{hp}: {e}"));
        }
        assert!(tmp.path().join("new/dir").is_dir());
        assert!(tmp.path().join("newer/file").is_file());
        // A '..' is refused before anything is made.
        assert!(!tmp.path().join("etc").exists());
        let bad = [
            (
                format!("{{path: {base}/file, type: Directory}}"),
                "spec.volumes[h].hostPath",
            ),
            (format!("{{path: {base}, type: File}}"), "not a file"),
            (
                format!("{{path: {base}/missing, type: Directory}}"),
                "not present",
            ),
            (format!("{{path: {base}, type: Socket}}"), "not a socket"),
            (
                format!("{{path: {base}/file, type: DirectoryOrCreate}}"),
                "not a directory",
            ),
            (format!("{{path: {base}, type: Weird}}"), "hostPath.type"),
            ("{path: relative}".to_string(), "not absolute"),
            (
                format!("{{path: {base}/new/../../etc, type: DirectoryOrCreate}}"),
                "spec.volumes[h].hostPath.path: \"",
            ),
            ("{path: /var/..}".to_string(), "must not contain '..'"),
        ];
        for (hp, needle) in bad {
            let pod = desired(&format!("metadata: {{name: p}}\nspec:\n  volumes: [{{name: h, hostPath: {hp}}}]\n  containers: []\n"));
            let err = prepare_volumes(&pod, &c).unwrap_err().to_string();
            assert!(err.contains(needle), "{hp}: {err}");
        }
    }

    #[test]
    fn prepare_volumes_should_refuse_unsupported_types_and_bad_names() {
        let tmp = tempfile::tempdir().unwrap();
        let c = ctx_in(tmp.path());
        let pod = desired("metadata: {name: p}\nspec:\n  volumes: [{name: s, secret: {secretName: x}}]\n  containers: []\n");
        let err = prepare_volumes(&pod, &c).unwrap_err().to_string();
        assert!(
            err.contains("spec.volumes[s]") && err.contains("secret"),
            "{err}"
        );
        let pod = desired("metadata: {name: p}\nspec:\n  volumes: [{name: '..', emptyDir: {}}]\n  containers: []\n");
        assert!(prepare_volumes(&pod, &c).is_err());
        assert!(!tmp
            .path()
            .join("pods/uid/volumes")
            .join("..")
            .join("..")
            .join("x")
            .exists());
    }

    fn image_pod(volume: &str, mount: &str) -> DesiredPod {
        desired(&format!(
            "metadata: {{name: p}}\nspec:\n  volumes: [{{name: iv, {volume}}}]\n  containers: [{{name: a, image: x, env: [{{name: SUB, value: etc}}], volumeMounts: [{{name: iv, mountPath: /iv{mount}}}]}}]\n"
        ))
    }

    fn mounts_of(pod: &DesiredPod, c: &ConvertContext) -> Result<Vec<api::Mount>, ConvertError> {
        let spec = pod.pod.spec.as_ref().unwrap();
        let env = vec![("SUB".to_string(), "etc".to_string())];
        let (mounts, sub_paths) = container_mounts(pod, &spec.containers[0], false, &env, c)?;
        // The runtime mounts image volumes: the agent binds nothing.
        assert!(sub_paths.is_empty(), "{sub_paths:?}");
        Ok(mounts)
    }

    #[test]
    fn container_mounts_should_mount_image_volumes_read_only_from_the_image() {
        let tmp = tempfile::tempdir().unwrap();
        let c = ctx_in(tmp.path());
        // readOnly: false is ignored, as kubelet ignores it.
        let pod = image_pod(
            "image: {reference: 'reg/tools:1', pullPolicy: Never}",
            ", readOnly: false",
        );
        prepare_volumes(&pod, &c).unwrap();
        let m = mounts_of(&pod, &c).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].container_path, "/iv");
        assert!(m[0].readonly);
        assert_eq!(m[0].host_path, "");
        assert_eq!(m[0].image_sub_path, "");
        assert_eq!(m[0].image.as_ref().unwrap().image, "reg/tools:1");
    }

    #[test]
    fn container_mounts_should_pass_an_image_volume_sub_path_to_the_runtime() {
        let c = ctx();
        for (mount, want) in [
            (", subPath: ./bin/tools", "bin/tools"),
            (", subPathExpr: '$(SUB)/x'", "etc/x"),
        ] {
            let pod = image_pod("image: {reference: 'reg/tools:1'}", mount);
            let m = mounts_of(&pod, &c).unwrap();
            assert_eq!(m[0].image_sub_path, want, "{mount}");
            assert!(m[0].host_path.is_empty());
        }
        for mount in [", subPath: ../etc", ", subPath: /etc"] {
            let pod = image_pod("image: {reference: 'reg/tools:1'}", mount);
            let e = mounts_of(&pod, &c).unwrap_err().to_string();
            assert!(e.contains("volumeMounts[iv].subPath"), "{mount}: {e}");
        }
    }

    #[test]
    fn image_volumes_should_be_refused_without_a_reference() {
        let tmp = tempfile::tempdir().unwrap();
        let c = ctx_in(tmp.path());
        for volume in ["image: {}", "image: {reference: ' ', pullPolicy: Always}"] {
            let pod = image_pod(volume, "");
            for e in [
                prepare_volumes(&pod, &c).unwrap_err().to_string(),
                mounts_of(&pod, &c).unwrap_err().to_string(),
            ] {
                assert!(e.contains("spec.volumes[iv].image.reference"), "{e}");
            }
        }
    }

    #[test]
    fn safe_sub_path_should_refuse_escapes() {
        assert_eq!(safe_sub_path("a/./b", "f").unwrap(), PathBuf::from("a/b"));
        assert!(safe_sub_path("..", "f").is_err());
        assert!(safe_sub_path("a/../b", "f").is_err());
        assert!(safe_sub_path("/abs", "f").is_err());
    }

    #[test]
    fn remove_pod_dir_should_remove_only_the_pod_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let c = ctx_in(tmp.path());
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), b"x").unwrap();
        let pod = desired(
            "metadata: {name: p}\nspec:\n  volumes: [{name: d, emptyDir: {}}]\n  containers: []\n",
        );
        prepare_volumes(&pod, &c).unwrap();
        let d = empty_dir_path(&c, "d");
        fs::write(d.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, d.join("link")).unwrap();
        // A subPath bind a killed agent left behind: unmounted, and what
        // it showed (the outside directory) untouched.
        let mut binds = crate::subpath::Binds::new();
        let fd = crate::subpath::open_beneath(&outside, Path::new(""), ".").unwrap();
        binds
            .bind(std::os::fd::AsFd::as_fd(&fd), &c.sub_path_dir.join("d/a/0"))
            .unwrap();
        std::mem::forget(binds);
        remove_pod_dir(&c).unwrap();
        assert!(!c.pod_dir.exists());
        assert!(!c.sub_path_dir.exists());
        assert!(outside.join("keep").exists(), "symlink target untouched");
        remove_pod_dir(&c).unwrap(); // already gone: fine
                                     // A symlink in place of the pod dir: only the link goes.
        std::os::unix::fs::symlink(&outside, &c.pod_dir).unwrap();
        remove_pod_dir(&c).unwrap();
        assert!(outside.join("keep").exists());
        assert!(fs::symlink_metadata(&c.pod_dir).is_err());
    }
}
