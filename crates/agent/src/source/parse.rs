//! Reading manifest files: which names count, and turning a file's text
//! into documents (one per Pod, each either a Pod or the reason it is not).

use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

/// One document of a manifest file.
#[derive(Debug, Clone, PartialEq)]
pub struct Doc {
    /// The pod, when it could be decoded (possibly still invalid).
    pub pod: Option<Pod>,
    /// metadata.name as written, if readable.
    pub name: Option<String>,
    /// metadata.namespace as written, if readable.
    pub namespace: Option<String>,
    /// Why the document is not a usable Pod (decode errors, wrong kind).
    pub error: Option<String>,
}

/// Whether a directory entry is a manifest: `*.yaml`, `*.yml` or `*.json`,
/// not hidden (editors' swap files, `..data` links) and not a backup (`~`).
pub fn is_manifest_name(name: &str) -> bool {
    if name.starts_with('.') || name.ends_with('~') {
        return false;
    }
    let ext = Path::new(name).extension().and_then(|e| e.to_str());
    matches!(ext, Some("yaml" | "yml" | "json")) && Path::new(name).file_stem().is_some()
}

/// Splits and decodes a manifest's text. JSON files hold one object; YAML
/// files one or more documents. A `List` or `PodList` contributes its items.
pub fn parse(path: &Path, text: &str) -> Vec<Doc> {
    let is_json = path.extension().is_some_and(|e| e == "json");
    let mut values = Vec::new();
    if is_json {
        match serde_json::from_str::<Value>(text) {
            Ok(v) => values.push(v),
            Err(e) => return vec![Doc::broken(format!("invalid JSON: {e}"))],
        }
    } else {
        for doc in serde_yaml::Deserializer::from_str(text) {
            match Value::deserialize(doc) {
                // `---` at the end or between documents leaves empty ones.
                Ok(Value::Null) => {}
                Ok(mut v) => {
                    octal_modes(&mut v);
                    values.push(v);
                }
                Err(e) => {
                    // The YAML parser cannot resynchronise after a syntax
                    // error, so the rest of the file is this one broken doc.
                    let mut docs: Vec<Doc> = values.into_iter().flat_map(expand).collect();
                    docs.push(Doc::broken(format!("invalid YAML: {e}")));
                    return docs;
                }
            }
        }
    }
    values.into_iter().flat_map(expand).collect()
}

/// File modes written the YAML 1.1 way (`defaultMode: 0644`), as kubectl's
/// YAML reader takes them: octal numbers. serde_yaml follows YAML 1.2, to
/// which `0644` is a string (and `0o644` the octal number). Only the keys
/// that hold file modes in a Pod (`mode`, `defaultMode` of volume
/// sources and their items) are read so.
fn octal_modes(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                let octal = match x {
                    Value::String(s) if k == "mode" || k == "defaultMode" => s
                        .strip_prefix('0')
                        .filter(|d| !d.is_empty() && d.bytes().all(|b| (b'0'..=b'7').contains(&b)))
                        .and_then(|d| i64::from_str_radix(d, 8).ok()),
                    _ => None,
                };
                match octal {
                    Some(n) => *x = Value::from(n),
                    None => octal_modes(x),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(octal_modes),
        _ => {}
    }
}

/// A document that is a Pod or a list of Pods, as documents.
fn expand(v: Value) -> Vec<Doc> {
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    if kind == "List" || kind == "PodList" {
        let Some(items) = v.get("items").and_then(Value::as_array) else {
            return vec![Doc::broken(format!("{kind} without items"))];
        };
        return items
            .iter()
            .map(|item| {
                let mut item = item.clone();
                // PodList items usually leave out kind and apiVersion.
                if kind == "PodList" {
                    if let Value::Object(m) = &mut item {
                        m.entry("kind").or_insert_with(|| "Pod".into());
                        m.entry("apiVersion").or_insert_with(|| "v1".into());
                    }
                }
                decode(item)
            })
            .collect();
    }
    vec![decode(v)]
}

fn decode(v: Value) -> Doc {
    let meta = v.get("metadata");
    let text = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let mut doc = Doc {
        pod: None,
        name: text("name"),
        namespace: text("namespace"),
        error: None,
    };
    if !v.is_object() {
        doc.error = Some("not an object: expected a v1 Pod".into());
        return doc;
    }
    match v.get("kind").map(|k| k.as_str()) {
        None => doc.error = Some("kind: Required value".into()),
        Some(Some("Pod")) => {}
        Some(k) => {
            doc.error = Some(format!(
                "kind: Unsupported value: {:?}: supported: Pod",
                k.unwrap_or_default()
            ))
        }
    }
    if doc.error.is_none() {
        match v.get("apiVersion").map(|k| k.as_str()) {
            None => doc.error = Some("apiVersion: Required value".into()),
            Some(Some("v1")) => {}
            Some(k) => {
                doc.error = Some(format!(
                    "apiVersion: Unsupported value: {:?}: supported: v1",
                    k.unwrap_or_default()
                ))
            }
        }
    }
    if doc.error.is_some() {
        return doc;
    }
    match serde_json::from_value::<Pod>(v) {
        Ok(p) => doc.pod = Some(p),
        Err(e) => doc.error = Some(format!("cannot decode as a v1 Pod: {e}")),
    }
    doc
}

impl Doc {
    /// A document that is no Pod, for this reason.
    pub fn broken(error: String) -> Doc {
        Doc {
            pod: None,
            name: None,
            namespace: None,
            error: Some(error),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn names(docs: &[Doc]) -> Vec<Option<String>> {
        docs.iter().map(|d| d.name.clone()).collect()
    }

    #[test]
    fn manifest_names_should_skip_hidden_backup_and_other_files() {
        for ok in ["a.yaml", "a.yml", "a.json", "a.b.yaml"] {
            assert!(is_manifest_name(ok), "{ok}");
        }
        for no in [
            ".a.yaml",
            ".a.yaml.swp",
            "a.yaml~",
            "a.txt",
            "yaml",
            "a.yaml.bak",
            "4913",
        ] {
            assert!(!is_manifest_name(no), "{no}");
        }
    }

    #[test]
    fn parse_should_split_yaml_documents() {
        let text = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, image: i}]}\n---\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: b, namespace: x}\n...\n";
        let docs = parse(Path::new("p.yaml"), text);
        assert_eq!(names(&docs), vec![Some("a".into()), Some("b".into())]);
        assert!(docs.iter().all(|d| d.error.is_none() && d.pod.is_some()));
        assert_eq!(docs[1].namespace.as_deref(), Some("x"));
        let c = &docs[0]
            .pod
            .as_ref()
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        assert_eq!(c.image.as_deref(), Some("i"));
    }

    #[test]
    fn parse_should_read_yaml_1_1_octal_file_modes() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: [{name: c, image: i, env: [{name: X, value: '0644'}]}]\n  volumes:\n  - name: v\n    downwardAPI:\n      defaultMode: 0640\n      items: [{path: n, mode: 0400, fieldRef: {fieldPath: metadata.name}}, {path: m, mode: 0o600, fieldRef: {fieldPath: metadata.name}}, {path: d, mode: 420, fieldRef: {fieldPath: metadata.name}}]\n";
        let docs = parse(Path::new("p.yaml"), text);
        assert_eq!(docs[0].error, None);
        let spec = docs[0].pod.as_ref().unwrap().spec.as_ref().unwrap();
        let da = spec.volumes.as_ref().unwrap()[0]
            .downward_api
            .as_ref()
            .unwrap();
        assert_eq!(da.default_mode, Some(0o640));
        let modes: Vec<_> = da.items.iter().flatten().map(|i| i.mode).collect();
        assert_eq!(modes, [Some(0o400), Some(0o600), Some(420)]);
        // Other strings stay strings.
        let env = spec.containers[0].env.as_ref().unwrap();
        assert_eq!(env[0].value.as_deref(), Some("0644"));
    }

    #[test]
    fn parse_should_read_json_and_lists() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
        let docs = parse(Path::new("p.json"), json);
        assert_eq!(names(&docs), vec![Some("j".into())]);
        assert!(docs[0].pod.is_some());

        let list = r#"{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}"#;
        let docs = parse(Path::new("l.json"), list);
        assert_eq!(names(&docs), vec![Some("a".into()), Some("b".into())]);
        assert!(docs.iter().all(|d| d.pod.is_some()), "{docs:?}");

        let list = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a}}\n- {apiVersion: apps/v1, kind: Deployment, metadata: {name: d}}\n";
        let docs = parse(Path::new("l.yaml"), list);
        assert_eq!(names(&docs), vec![Some("a".into()), Some("d".into())]);
        assert!(docs[0].error.is_none());
        assert_eq!(
            docs[1].error.as_deref(),
            Some(r#"kind: Unsupported value: "Deployment": supported: Pod"#)
        );
    }

    #[test]
    fn parse_should_keep_broken_documents_with_their_reason() {
        let docs = parse(
            Path::new("p.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\n---\nmetadata: [unclosed\n",
        );
        assert_eq!(docs.len(), 2);
        assert!(docs[0].error.is_none());
        assert!(
            docs[1]
                .error
                .as_deref()
                .unwrap()
                .starts_with("invalid YAML"),
            "{docs:?}"
        );

        let docs = parse(Path::new("p.json"), "{");
        assert!(docs[0]
            .error
            .as_deref()
            .unwrap()
            .starts_with("invalid JSON"));

        let docs = parse(Path::new("p.yaml"), "kind: Pod\nmetadata: {name: n}\n");
        assert_eq!(docs[0].error.as_deref(), Some("apiVersion: Required value"));
        assert_eq!(docs[0].name.as_deref(), Some("n"));

        let docs = parse(Path::new("p.yaml"), "apiVersion: v2\nkind: Pod\n");
        assert_eq!(
            docs[0].error.as_deref(),
            Some(r#"apiVersion: Unsupported value: "v2": supported: v1"#)
        );

        // Readable metadata survives a spec that does not decode.
        let docs = parse(
            Path::new("p.yaml"),
            "apiVersion: v1\nkind: Pod\nmetadata: {name: n, namespace: s}\nspec: {containers: 3}\n",
        );
        assert!(docs[0]
            .error
            .as_deref()
            .unwrap()
            .starts_with("cannot decode as a v1 Pod"));
        assert_eq!(docs[0].name.as_deref(), Some("n"));
        assert_eq!(docs[0].namespace.as_deref(), Some("s"));

        let docs = parse(Path::new("p.yaml"), "just text\n");
        assert_eq!(
            docs[0].error.as_deref(),
            Some("not an object: expected a v1 Pod")
        );
    }
}
