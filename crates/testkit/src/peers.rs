//! Where the peer binaries are: the one lookup every test and tool uses.
//!
//! For a binary `NAME` (e.g. `critest`, `containerd`), in order:
//! 1. `PETREL_PEER_<NAME>` (upper case, `-` as `_`): an explicit path;
//! 2. `$PETREL_PEERS_BIN/NAME`;
//! 3. `/var/cache/petrel/peers/bin/NAME`, where `make peers` puts them.
//!
//! `make test` may leave components out explicitly: `PETREL_PEERS_SKIP`
//! lists them (comma- or space-separated, e.g. `critest,containerd`).

use std::path::{Path, PathBuf};

use crate::KitError;

/// The default directory of peer binaries (`make peers`).
pub const DEFAULT_PEERS_BIN: &str = "/var/cache/petrel/peers/bin";

/// The environment variable naming an explicit path for peer `name`.
pub fn override_var(name: &str) -> String {
    format!("PETREL_PEER_{}", name.to_uppercase().replace('-', "_"))
}

/// Where peer binary `name` is expected, by the rules above, from the
/// given environment lookup (the process environment in [`peer_binary`]).
pub fn locate(name: &str, env: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(p) = env(&override_var(name)).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let dir = env("PETREL_PEERS_BIN")
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| DEFAULT_PEERS_BIN.to_string());
    Path::new(&dir).join(name)
}

/// The path of peer binary `name`, which must be an executable file.
pub fn peer_binary(name: &str) -> Result<PathBuf, KitError> {
    let path = locate(name, |k| std::env::var(k).ok());
    if is_executable(&path) {
        return Ok(path);
    }
    Err(KitError::Missing {
        component: name.to_string(),
        path,
        hint: format!(
            "run `make peers`, set {} or PETREL_PEERS_BIN, or leave it out with PETREL_PEERS_SKIP={name}",
            override_var(name)
        ),
    })
}

/// Whether `component` was left out explicitly (`PETREL_PEERS_SKIP`).
pub fn left_out(component: &str) -> bool {
    skip_list_names(
        &std::env::var("PETREL_PEERS_SKIP").unwrap_or_default(),
        component,
    )
}

/// Whether the skip list `list` names `component`.
pub fn skip_list_names(list: &str, component: &str) -> bool {
    list.split(|c: char| c == ',' || c.is_whitespace())
        .any(|n| n == component)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn locate_should_prefer_the_explicit_path_then_the_bin_dir_then_the_cache() {
        let both = env(&[
            ("PETREL_PEER_CRITEST", "/x/critest"),
            ("PETREL_PEERS_BIN", "/y"),
        ]);
        assert_eq!(locate("critest", both), Path::new("/x/critest"));
        assert_eq!(
            locate("critest", env(&[("PETREL_PEERS_BIN", "/y")])),
            Path::new("/y/critest")
        );
        assert_eq!(
            locate("critest", env(&[])),
            Path::new("/var/cache/petrel/peers/bin/critest")
        );
        assert_eq!(
            locate(
                "containerd-shim-runc-v2",
                env(&[("PETREL_PEER_CONTAINERD_SHIM_RUNC_V2", "/z")])
            ),
            Path::new("/z")
        );
    }

    #[test]
    fn skip_list_should_name_whole_components_only() {
        assert!(skip_list_names("critest", "critest"));
        assert!(skip_list_names("kubelet, critest", "critest"));
        assert!(skip_list_names("etcd critest", "critest"));
        assert!(!skip_list_names("critest-x", "critest"));
        assert!(!skip_list_names("", "critest"));
    }

    #[test]
    fn peer_binary_should_fail_naming_the_path_and_the_remedy() {
        let e = peer_binary("no-such-peer-binary").expect_err("missing");
        let msg = e.to_string();
        assert!(msg.contains("no-such-peer-binary"), "{msg}");
        assert!(msg.contains("make peers"), "{msg}");
    }
}
