//! Resources updated before a container's start: written into its
//! bundle's `config.json`, which its start's `runc create` reads (as
//! containerd updates the spec of a container that has no task yet).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use oci_spec::runtime::LinuxResources;
use serde_json::Value;

use crate::error::{Result, RuntimeError};

/// Merges `resources` into `linux.resources` of the bundle's config.json,
/// as `runc update` changes a live container: only what `resources` sets
/// changes (object fields merged one by one), the rest (devices...) stays.
/// The file is replaced whole (written beside it, then renamed).
pub(crate) fn set_resources(bundle: &Path, resources: &LinuxResources) -> Result<()> {
    let path = bundle.join("config.json");
    let text = std::fs::read(&path).map_err(|e| RuntimeError::io("read", &path, e))?;
    let mut config: Value =
        serde_json::from_slice(&text).map_err(|source| RuntimeError::Encode {
            what: "config.json (read back)",
            source,
        })?;
    let update = serde_json::to_value(resources).map_err(|source| RuntimeError::Encode {
        what: "resources",
        source,
    })?;
    let Some(root) = config.as_object_mut() else {
        return Err(RuntimeError::Invariant(format!(
            "{} is not a JSON object",
            path.display()
        )));
    };
    let linux = root
        .entry("linux")
        .or_insert_with(|| Value::Object(Default::default()));
    let Some(linux) = linux.as_object_mut() else {
        return Err(RuntimeError::Invariant(format!(
            "{}: linux is not an object",
            path.display()
        )));
    };
    merge(
        linux
            .entry("resources")
            .or_insert_with(|| Value::Object(Default::default())),
        update,
    );
    let json = serde_json::to_vec(&config).map_err(|source| RuntimeError::Encode {
        what: "config.json",
        source,
    })?;
    let tmp = bundle.join("config.json.new");
    // Private, as the create wrote it: the spec may hold secrets.
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&json))
        .map_err(|e| RuntimeError::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| RuntimeError::io("rename into", &path, e))
}

/// Merges `update` into `into`: objects field by field, anything else
/// replaced; nulls (unset) change nothing.
fn merge(into: &mut Value, update: Value) {
    match (into, update) {
        (_, Value::Null) => {}
        (Value::Object(into), Value::Object(update)) => {
            for (k, v) in update {
                merge(into.entry(k).or_insert(Value::Null), v);
            }
        }
        (into, update) => *into = update,
    }
}

#[cfg(test)]
mod tests {
    use oci_spec::runtime::{LinuxCpuBuilder, LinuxResourcesBuilder};
    use serde_json::json;

    use super::*;

    #[test]
    fn set_resources_should_change_only_what_the_update_sets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = json!({
            "ociVersion": "1.0.2",
            "linux": {
                "cgroupsPath": "/p/c",
                "resources": {
                    "devices": [{"allow": false, "access": "rwm"}],
                    "cpu": {"shares": 2, "quota": 10000},
                    "memory": {"limit": 1000000}
                }
            }
        });
        std::fs::write(dir.path().join("config.json"), config.to_string()).expect("write");
        let update = LinuxResourcesBuilder::default()
            .cpu(
                LinuxCpuBuilder::default()
                    .shares(512u64)
                    .build()
                    .expect("cpu"),
            )
            .build()
            .expect("resources");
        set_resources(dir.path(), &update).expect("set");
        let text = std::fs::read(dir.path().join("config.json")).expect("read");
        let got: Value = serde_json::from_slice(&text).expect("json");
        let r = &got["linux"]["resources"];
        assert_eq!(r["cpu"], json!({"shares": 512, "quota": 10000}));
        assert_eq!(r["memory"], json!({"limit": 1000000}));
        assert_eq!(r["devices"], config["linux"]["resources"]["devices"]);
        assert_eq!(got["linux"]["cgroupsPath"], "/p/c");
        assert!(!dir.path().join("config.json.new").exists());
    }

    #[test]
    fn set_resources_should_name_a_missing_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = set_resources(dir.path(), &LinuxResources::default()).expect_err("missing");
        assert!(err.to_string().contains("config.json"), "{err}");
    }
}
