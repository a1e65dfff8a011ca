//! Network configuration lists: finding and reading them.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::CniError;

/// File name extensions the configuration directory is searched for, as
/// libcni and containerd have them.
const EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// A network configuration list: the network's name, the CNI version its
/// plugins speak, and the plugins run in order for ADD (reverse for DEL).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkList {
    /// The network's name.
    pub name: String,
    /// The CNI version of the list (`cniVersion`).
    pub cni_version: String,
    /// Skip CHECK for this network (`disableCheck`).
    pub disable_check: bool,
    /// Each plugin's configuration object (with a `type`).
    pub plugins: Vec<Map<String, Value>>,
    /// Where it was read from.
    pub source: PathBuf,
}

/// Reads the network list the runtime uses: the first file of `dir`
/// (by name) ending in `.conf`, `.conflist` or `.json`. `Ok(None)` when
/// the directory is missing or holds no such file; an error when the
/// first file is not a valid configuration (it is not skipped: a broken
/// network configuration must be seen, not silently replaced by the next).
pub fn load_dir(dir: &Path) -> Result<Option<NetworkList>, CniError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CniError::ReadDir {
                dir: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| CniError::ReadDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        let wanted = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e));
        if wanted && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    let Some(first) = files.into_iter().next() else {
        return Ok(None);
    };
    let text = std::fs::read(&first).map_err(|e| invalid(&first, format!("read: {e}")))?;
    NetworkList::parse(&first, &text).map(Some)
}

fn invalid(file: &Path, reason: impl Into<String>) -> CniError {
    CniError::InvalidConfig {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

impl NetworkList {
    /// Parses a `.conflist` (an object with `plugins`) or a single
    /// plugin's `.conf` (an object with `type`), which becomes a list of one.
    pub fn parse(source: &Path, text: &[u8]) -> Result<Self, CniError> {
        let value: Value = serde_json::from_slice(text)
            .map_err(|e| invalid(source, format!("not valid JSON: {e}")))?;
        let Value::Object(mut obj) = value else {
            return Err(invalid(source, "not a JSON object"));
        };
        let name = string_field(source, &obj, "name")?;
        let cni_version = string_field(source, &obj, "cniVersion")?;
        if parse_version(&cni_version).is_none() {
            return Err(invalid(
                source,
                format!("cniVersion {cni_version:?} is not a version"),
            ));
        }
        let disable_check = obj
            .get("disableCheck")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let plugins = match obj.remove("plugins") {
            Some(Value::Array(list)) => {
                let mut plugins = Vec::with_capacity(list.len());
                for (i, p) in list.into_iter().enumerate() {
                    let Value::Object(p) = p else {
                        return Err(invalid(source, format!("plugins[{i}] is not an object")));
                    };
                    plugins.push(p);
                }
                plugins
            }
            Some(_) => return Err(invalid(source, "plugins is not a list")),
            // A single plugin's configuration.
            None => vec![obj],
        };
        if plugins.is_empty() {
            return Err(invalid(source, "the list has no plugins"));
        }
        for (i, p) in plugins.iter().enumerate() {
            let ty = p.get("type").and_then(Value::as_str).unwrap_or_default();
            if ty.is_empty() || ty.contains('/') || ty == "." || ty == ".." {
                return Err(invalid(
                    source,
                    format!("plugins[{i}].type {ty:?} must be a plugin's file name"),
                ));
            }
        }
        Ok(Self {
            name,
            cni_version,
            disable_check,
            plugins,
            source: source.to_path_buf(),
        })
    }

    /// The list as a `.conflist` document, to be stored with a pod so that
    /// its network is torn down with the configuration it was set up with.
    pub fn to_json(&self) -> String {
        let mut obj = Map::new();
        obj.insert("cniVersion".into(), Value::String(self.cni_version.clone()));
        obj.insert("name".into(), Value::String(self.name.clone()));
        if self.disable_check {
            obj.insert("disableCheck".into(), Value::Bool(true));
        }
        obj.insert(
            "plugins".into(),
            Value::Array(self.plugins.iter().cloned().map(Value::Object).collect()),
        );
        Value::Object(obj).to_string()
    }

    /// Whether the list's version knows `prevResult` on DEL and the CHECK
    /// command (CNI 0.4.0 and later).
    pub(crate) fn has_check(&self) -> bool {
        parse_version(&self.cni_version).is_some_and(|v| v >= (0, 4, 0))
    }

    /// The plugin types, in order.
    pub fn plugin_types(&self) -> impl Iterator<Item = &str> {
        self.plugins
            .iter()
            .map(|p| p.get("type").and_then(Value::as_str).unwrap_or_default())
    }
}

fn string_field(source: &Path, obj: &Map<String, Value>, key: &str) -> Result<String, CniError> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err(invalid(source, format!("{key} must be a non-empty string"))),
        None => Err(invalid(source, format!("{key} is missing"))),
    }
}

/// `major.minor.patch` of a CNI version string.
pub(crate) fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next().unwrap_or(Some(0))?;
    let patch = parts.next().unwrap_or(Some(0))?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("write {name}: {e}"));
    }

    #[test]
    fn load_dir_should_pick_the_first_file_by_name() -> Result<(), CniError> {
        let dir = tempfile::tempdir().map_err(|e| invalid(Path::new("tmp"), e.to_string()))?;
        assert_eq!(load_dir(&dir.path().join("missing"))?, None);
        assert_eq!(load_dir(dir.path())?, None);
        write(dir.path(), "README", "not a config");
        write(
            dir.path(),
            "20-b.conflist",
            r#"{"cniVersion":"1.0.0","name":"b","plugins":[{"type":"bridge"},{"type":"portmap","capabilities":{"portMappings":true}}]}"#,
        );
        write(
            dir.path(),
            "10-a.conf",
            r#"{"cniVersion":"0.3.1","name":"a","type":"bridge","bridge":"x"}"#,
        );
        let list = load_dir(dir.path())?.ok_or_else(|| invalid(dir.path(), "none found"))?;
        assert_eq!(list.name, "a");
        assert_eq!(list.plugins.len(), 1);
        assert_eq!(list.plugin_types().collect::<Vec<_>>(), ["bridge"]);
        assert!(!list.has_check());
        std::fs::remove_file(dir.path().join("10-a.conf"))
            .map_err(|e| invalid(dir.path(), e.to_string()))?;
        let list = load_dir(dir.path())?.ok_or_else(|| invalid(dir.path(), "none found"))?;
        assert_eq!(
            list.plugin_types().collect::<Vec<_>>(),
            ["bridge", "portmap"]
        );
        assert!(list.has_check());
        // Stored and read back, the list is the same.
        let again = NetworkList::parse(&list.source, list.to_json().as_bytes())?;
        assert_eq!(again, list);
        Ok(())
    }

    #[test]
    fn parse_should_name_what_is_wrong() {
        let cases = [
            ("{", "not valid JSON"),
            ("[]", "not a JSON object"),
            (
                r#"{"cniVersion":"1.0.0","plugins":[{"type":"x"}]}"#,
                "name is missing",
            ),
            (
                r#"{"name":"n","plugins":[{"type":"x"}]}"#,
                "cniVersion is missing",
            ),
            (
                r#"{"name":"n","cniVersion":"one","type":"x"}"#,
                "is not a version",
            ),
            (
                r#"{"name":"n","cniVersion":"1.0.0","plugins":[]}"#,
                "no plugins",
            ),
            (
                r#"{"name":"n","cniVersion":"1.0.0","plugins":[3]}"#,
                "plugins[0] is not an object",
            ),
            (
                r#"{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"../sh"}]}"#,
                "plugins[0].type",
            ),
            (
                r#"{"name":"n","cniVersion":"1.0.0","plugins":[{}]}"#,
                "plugins[0].type",
            ),
        ];
        for (text, want) in cases {
            match NetworkList::parse(Path::new("/etc/cni/net.d/x.conflist"), text.as_bytes()) {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(want), "{text}: {msg}");
                    assert!(msg.contains("/etc/cni/net.d/x.conflist"), "{msg}");
                }
                Ok(l) => panic!("{text} accepted as {l:?}"),
            }
        }
    }

    #[test]
    fn parse_version_should_read_cni_versions() {
        assert_eq!(parse_version("1.0.0"), Some((1, 0, 0)));
        assert_eq!(parse_version("0.3.1"), Some((0, 3, 1)));
        assert_eq!(parse_version("0.4"), Some((0, 4, 0)));
        assert_eq!(parse_version("1.0.0.0"), None);
        assert_eq!(parse_version("x"), None);
    }
}
