//! downwardAPI volumes: the pod's metadata and its containers' resources
//! as files, which kubelet serves without an API server (so static pods
//! have them too). Written with [`super::atomic`] into
//! `pods/<uid>/volumes/kubernetes.io~downward-api/<volume>` when the
//! pod's sandbox is made, and mounted read-only.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, DownwardAPIVolumeSource};

use super::atomic::{FileProjection, Payload};
use super::env::resource_field_ref;
use super::{ConvertContext, ConvertError};
use crate::types::DesiredPod;

/// Where downwardAPI volumes live inside the pod's directory (kubelet's
/// plugin directory name).
const DOWNWARD_API_PLUGIN: &str = "volumes/kubernetes.io~downward-api";

/// The API server's default mode of a downwardAPI volume's files.
pub const DEFAULT_MODE: i32 = 0o644;

/// The fieldRef paths a downwardAPI volume may show (the API server's
/// list; `metadata.labels['k']` and `metadata.annotations['k']` too).
pub const FIELD_PATHS: &[&str] = &[
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
];

/// The host directory of the downwardAPI volume `name`.
pub(crate) fn downward_api_path(ctx: &ConvertContext, name: &str) -> PathBuf {
    ctx.pod_dir.join(DOWNWARD_API_PLUGIN).join(name)
}

/// A string as Go's `%q` writes it (`strconv.Quote`): in double quotes,
/// with `\a \b \f \n \r \t \v \\ \"` escaped, other ASCII controls as
/// `\xNN`, and characters that are not printable as `\uNNNN` or
/// `\UNNNNNNNN`. Go decides printability with Unicode tables; this uses
/// Rust's control and whitespace classes plus the format and private-use
/// ranges, which covers what annotation values hold.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if printable(c) => out.push(c),
            c if (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Go's `strconv.IsPrint`, closely: graphic characters and the ASCII space.
fn printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let u = c as u32;
    let format_or_private = matches!(u,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f
        | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff | 0xfff9..=0xfffb
        | 0xe000..=0xf8ff | 0xf0000..=0xffffd | 0x100000..=0x10fffd);
    let noncharacter = (0xfdd0..=0xfdef).contains(&u) || u & 0xfffe == 0xfffe;
    !format_or_private && !noncharacter
}

/// A map as kubelet writes labels and annotations into a downwardAPI
/// volume: `key="value"` lines in key order, values quoted as Go's `%q`,
/// no newline after the last.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks an item's path as the API server does: relative, no `..`
/// component, not starting with `..` (the writer's own names).
pub(crate) fn check_item_path(path: &str, field: &str) -> Result<PathBuf, ConvertError> {
    let p = Path::new(path);
    if path.is_empty() {
        return Err(ConvertError::invalid(field, "path is required"));
    }
    if p.is_absolute() {
        return Err(ConvertError::invalid(
            field,
            format!("{path:?} must be a relative path"),
        ));
    }
    if path.starts_with("..") {
        return Err(ConvertError::invalid(
            field,
            format!("{path:?} must not start with '..'"),
        ));
    }
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => {
                return Err(ConvertError::invalid(
                    field,
                    format!("{path:?} must not contain '..'"),
                ))
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err(ConvertError::invalid(
            field,
            format!("{path:?} names no file"),
        ));
    }
    Ok(out)
}

/// A file mode from the spec: permission bits only.
pub(crate) fn mode(m: i32, field: &str) -> Result<u32, ConvertError> {
    u32::try_from(m)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| {
            ConvertError::invalid(field, format!("{m:#o} is not a mode between 0 and 0777"))
        })
}

/// The value of a fieldRef in a downwardAPI volume.
fn field_value(pod: &DesiredPod, path: &str, field: &str) -> Result<String, ConvertError> {
    let meta = &pod.pod.metadata;
    let keyed = |prefix: &str| path.strip_prefix(prefix)?.strip_suffix("']");
    let labels = meta.labels.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();
    Ok(match path {
        "metadata.name" => pod.name.clone(),
        "metadata.namespace" => pod.namespace.clone(),
        "metadata.uid" => pod.uid.clone(),
        "metadata.labels" => format_map(&labels),
        "metadata.annotations" => format_map(&annotations),
        _ => {
            if let Some(k) = keyed("metadata.labels['") {
                labels.get(k).cloned().unwrap_or_default()
            } else if let Some(k) = keyed("metadata.annotations['") {
                annotations.get(k).cloned().unwrap_or_default()
            } else {
                return Err(ConvertError::unsupported(
                    field,
                    format!(
                        "field path {path:?} (a downwardAPI volume shows {})",
                        FIELD_PATHS.join(", ")
                    ),
                ));
            }
        }
    })
}

/// One item's file.
fn item_file(
    pod: &DesiredPod,
    item: &DownwardAPIVolumeFile,
    default_mode: u32,
    field: &str,
) -> Result<FileProjection, ConvertError> {
    let data = match (&item.field_ref, &item.resource_field_ref) {
        (Some(f), None) => field_value(pod, &f.field_path, &format!("{field}.fieldRef"))?,
        (None, Some(r)) => {
            let rfield = format!("{field}.resourceFieldRef");
            let name = r.container_name.as_deref().unwrap_or("");
            let spec = pod.pod.spec.as_ref();
            let container = spec
                .and_then(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                        .find(|c| c.name == name)
                })
                .ok_or_else(|| {
                    ConvertError::invalid(
                        format!("{rfield}.containerName"),
                        format!("no container {name:?}"),
                    )
                })?;
            resource_field_ref(pod, container, r, &rfield)?
        }
        _ => {
            return Err(ConvertError::invalid(
                field,
                "exactly one of fieldRef and resourceFieldRef must be set",
            ))
        }
    };
    let mode = match item.mode {
        Some(m) => mode(m, &format!("{field}.mode"))?,
        None => default_mode,
    };
    Ok(FileProjection {
        data: data.into_bytes(),
        mode,
    })
}

/// The files of the downwardAPI volume `source` of `pod`; `field` names
/// the volume (`spec.volumes[podinfo]`).
pub fn payload(
    pod: &DesiredPod,
    source: &DownwardAPIVolumeSource,
    field: &str,
) -> Result<Payload, ConvertError> {
    let default_mode = mode(
        source.default_mode.unwrap_or(DEFAULT_MODE),
        &format!("{field}.downwardAPI.defaultMode"),
    )?;
    items_payload(
        pod,
        source.items.as_deref().unwrap_or(&[]),
        default_mode,
        &format!("{field}.downwardAPI"),
    )
}

/// The files of downwardAPI `items` (of a volume, or of a projected
/// volume's source, `field`), each with its mode or `default_mode`.
pub(crate) fn items_payload(
    pod: &DesiredPod,
    items: &[DownwardAPIVolumeFile],
    default_mode: u32,
    field: &str,
) -> Result<Payload, ConvertError> {
    let mut out = Payload::new();
    for (i, item) in items.iter().enumerate() {
        let ifield = format!("{field}.items[{i}]");
        let path = check_item_path(&item.path, &format!("{ifield}.path"))?;
        out.insert(path, item_file(pod, item, default_mode, &ifield)?);
    }
    Ok(out)
}

/// Writes the downwardAPI volume `name` of `pod` (atomically; nothing when
/// unchanged) and returns its directory.
pub(crate) fn write_volume(
    pod: &DesiredPod,
    name: &str,
    source: &DownwardAPIVolumeSource,
    ctx: &ConvertContext,
) -> Result<PathBuf, ConvertError> {
    let field = format!("spec.volumes[{name}]");
    let mut files = payload(pod, source, &field)?;
    // The pod's fsGroup owns the files, as kubelet's volume ownership.
    let gid = super::fs_group(pod);
    if gid.is_some() {
        for f in files.values_mut() {
            f.mode |= 0o440;
        }
    }
    let dir = downward_api_path(ctx, name);
    if let Some(parent) = dir.parent() {
        petrel_fs::create_private_dir_all(parent, petrel_fs::PRIVATE).map_err(|e| {
            ConvertError::Io {
                op: "create",
                path: parent.to_path_buf(),
                source: std::io::Error::other(e),
            }
        })?;
    }
    super::atomic::write(&dir, &files, gid).map_err(|source| ConvertError::Io {
        op: "write downwardAPI volume",
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::convert::test_support::{ctx, desired};

    const POD: &str = r#"
metadata:
  name: web
  namespace: prod
  labels: {tier: front, app: web}
  annotations: {note: "two\nlines \"quoted\" \\ tab\t", build: "7"}
spec:
  containers:
  - name: app
    image: busybox
    resources:
      requests: {cpu: 250m, memory: 64Mi}
      limits: {cpu: "1", memory: 128Mi}
  volumes:
  - name: podinfo
    downwardAPI:
      defaultMode: 0o640
      items:
      - {path: name, fieldRef: {fieldPath: metadata.name}}
      - {path: ns, fieldRef: {fieldPath: metadata.namespace}}
      - {path: uid, fieldRef: {fieldPath: metadata.uid}, mode: 0o400}
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: meta/annotations, fieldRef: {fieldPath: metadata.annotations}}
      - {path: tier, fieldRef: {fieldPath: "metadata.labels['tier']"}}
      - {path: build, fieldRef: {fieldPath: "metadata.annotations['build']"}}
      - {path: cpu_limit, resourceFieldRef: {containerName: app, resource: limits.cpu, divisor: 1m}}
      - {path: mem_request, resourceFieldRef: {containerName: app, resource: requests.memory, divisor: 1Mi}}
"#;

    fn source(pod: &DesiredPod) -> DownwardAPIVolumeSource {
        pod.pod.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0]
            .downward_api
            .clone()
            .unwrap()
    }

    #[test]
    fn go_quote_should_escape_as_go_does() {
        assert_eq!(go_quote("plain"), r#""plain""#);
        assert_eq!(
            go_quote("a\"b\\c\nd\te\r\u{7}\u{8}\u{c}\u{b}"),
            r#""a\"b\\c\nd\te\r\a\b\f\v""#
        );
        assert_eq!(go_quote("\u{0}\u{1b}\u{7f}"), r#""\x00\x1b\x7f""#);
        assert_eq!(go_quote("ünïcödé ✓ 日本"), "\"ünïcödé ✓ 日本\"");
        assert_eq!(
            go_quote("\u{a0}\u{200b}\u{feff}"),
            r#""\u00a0\u200b\ufeff""#
        );
        assert_eq!(go_quote("\u{85}"), r#""\u0085""#);
        assert_eq!(go_quote("\u{10ffff}"), r#""\U0010ffff""#);
        assert_eq!(go_quote("😀"), "\"😀\"");
    }

    #[test]
    fn format_map_should_sort_and_quote_without_a_final_newline() {
        let m: BTreeMap<String, String> = [("b", "2"), ("a", "x\"y"), ("c.io/k", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(format_map(&m), "a=\"x\\\"y\"\nb=\"2\"\nc.io/k=\"\"");
        assert_eq!(format_map(&BTreeMap::new()), "");
    }

    #[test]
    fn payload_should_hold_metadata_and_resources_with_their_modes() {
        let pod = desired(POD);
        let p = payload(&pod, &source(&pod), "spec.volumes[podinfo]").unwrap();
        let get = |path: &str| {
            let f = &p[Path::new(path)];
            (String::from_utf8(f.data.clone()).unwrap(), f.mode)
        };
        assert_eq!(get("name"), ("web".into(), 0o640));
        assert_eq!(get("ns"), ("prod".into(), 0o640));
        assert_eq!(get("uid"), ("uid-web".into(), 0o400));
        assert_eq!(get("labels").0, "app=\"web\"\ntier=\"front\"");
        assert_eq!(
            get("meta/annotations").0,
            "build=\"7\"\nnote=\"two\\nlines \\\"quoted\\\" \\\\ tab\\t\""
        );
        assert_eq!(get("tier").0, "front");
        assert_eq!(get("build").0, "7");
        assert_eq!(get("cpu_limit").0, "1000");
        assert_eq!(get("mem_request").0, "64");
        assert_eq!(p.len(), 9);
    }

    #[test]
    fn payload_should_name_the_bad_field() {
        let pod = desired(POD);
        let bad = |yaml: &str| {
            let s: DownwardAPIVolumeSource = serde_yaml::from_str(yaml).unwrap();
            payload(&pod, &s, "spec.volumes[v]")
                .unwrap_err()
                .to_string()
        };
        let e = bad("items: [{path: x, fieldRef: {fieldPath: spec.nodeName}}]");
        assert!(
            e.contains("spec.volumes[v].downwardAPI.items[0].fieldRef"),
            "{e}"
        );
        let e = bad("items: [{path: ../x, fieldRef: {fieldPath: metadata.name}}]");
        assert!(e.contains("items[0].path") && e.contains("'..'"), "{e}");
        let e = bad("items: [{path: /x, fieldRef: {fieldPath: metadata.name}}]");
        assert!(e.contains("relative"), "{e}");
        let e = bad("items: [{path: a/../../x, fieldRef: {fieldPath: metadata.name}}]");
        assert!(e.contains("'..'"), "{e}");
        let e = bad(
            "items: [{path: x, resourceFieldRef: {containerName: nope, resource: limits.cpu}}]",
        );
        assert!(e.contains("containerName") && e.contains("nope"), "{e}");
        let e = bad("items: [{path: x}]");
        assert!(e.contains("exactly one"), "{e}");
        let e = bad("defaultMode: 4096\nitems: []");
        assert!(e.contains("defaultMode"), "{e}");
        let e = bad("items: [{path: x, mode: -1, fieldRef: {fieldPath: metadata.name}}]");
        assert!(e.contains("items[0].mode"), "{e}");
    }

    #[test]
    fn write_volume_should_write_into_the_pods_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let c = ConvertContext {
            pod_dir: tmp.path().join("pods/uid"),
            ..ctx()
        };
        let pod = desired(POD);
        let dir = write_volume(&pod, "podinfo", &source(&pod), &c).unwrap();
        assert!(dir.ends_with("pods/uid/volumes/kubernetes.io~downward-api/podinfo"));
        assert_eq!(std::fs::read_to_string(dir.join("name")).unwrap(), "web");
        assert_eq!(
            std::fs::read_to_string(dir.join("meta/annotations"))
                .unwrap()
                .lines()
                .count(),
            2
        );
        let mode = std::fs::metadata(dir.join("uid"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o400);
    }
}
