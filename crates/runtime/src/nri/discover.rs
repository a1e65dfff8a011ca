//! Pre-registered plugins: the `NN-name` executables of `plugin_path` and their
//! configuration files in `plugin_config_path`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// One pre-registered plugin found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginFile {
    /// Two-digit index (the order it runs in).
    pub index: String,
    /// Its name.
    pub name: String,
    /// The executable.
    pub path: PathBuf,
    /// Its configuration text (`NN-name.conf`, else `name.conf`), if any.
    pub config: Option<String>,
}

impl PluginFile {
    /// `index-name`.
    pub fn qualified_name(&self) -> String {
        format!("{}-{}", self.index, self.name)
    }
}

/// The pre-registered plugins, in index order (then name). A missing plugin
/// directory means none. Entries that are not `NN-name` executables are
/// skipped with a warning, as containerd does; an unreadable configuration
/// file is skipped with a warning too (the plugin gets none).
pub fn discover(plugin_path: &Path, config_path: &Path) -> std::io::Result<Vec<PluginFile>> {
    let entries = match std::fs::read_dir(plugin_path) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let Some(base) = entry.file_name().to_str().map(str::to_string) else {
            tracing::warn!(path = %path.display(), "nri: plugin file name is not UTF-8; skipped");
            continue;
        };
        let (index, name) = match petrel_nri::api::parse_plugin_name(&base) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "nri: not a plugin name (NN-name); skipped");
                continue;
            }
        };
        // Follows symlinks: a link to a plugin binary is a plugin.
        let executable = std::fs::metadata(&path)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false);
        if !executable {
            tracing::warn!(path = %path.display(), "nri: plugin is not an executable file; skipped");
            continue;
        }
        let config = read_config(config_path, &index, &name);
        found.push(PluginFile {
            index,
            name,
            path,
            config,
        });
    }
    found.sort_by(|a, b| (&a.index, &a.name).cmp(&(&b.index, &b.name)));
    Ok(found)
}

/// `NN-name.conf`, else `name.conf`, in `dir`.
fn read_config(dir: &Path, index: &str, name: &str) -> Option<String> {
    for file in [format!("{index}-{name}.conf"), format!("{name}.conf")] {
        let path = dir.join(file);
        match std::fs::read_to_string(&path) {
            Ok(text) => return Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "nri: plugin configuration unreadable; ignored");
                return None;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn discover_should_list_indexed_executables_in_order_with_their_config() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let plugins = dir.path().join("plugins");
        let conf = dir.path().join("conf.d");
        std::fs::create_dir_all(&plugins).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(&conf).unwrap_or_else(|e| panic!("{e}"));
        write(&plugins.join("20-policy"), "#!/bin/sh\n", 0o755);
        write(&plugins.join("10-logger"), "#!/bin/sh\n", 0o755);
        write(&plugins.join("05-notexec"), "", 0o644);
        write(&plugins.join("logger"), "#!/bin/sh\n", 0o755);
        write(&plugins.join("1-short"), "#!/bin/sh\n", 0o755);
        write(&conf.join("10-logger.conf"), "indexed", 0o644);
        write(&conf.join("logger.conf"), "plain", 0o644);
        write(&conf.join("policy.conf"), "by name", 0o644);

        let found = discover(&plugins, &conf).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<_> = found.iter().map(PluginFile::qualified_name).collect();
        assert_eq!(names, ["10-logger", "20-policy"]);
        assert_eq!(found[0].config.as_deref(), Some("indexed"));
        assert_eq!(found[1].config.as_deref(), Some("by name"));
        assert_eq!(found[1].path, plugins.join("20-policy"));

        let none = discover(&dir.path().join("missing"), &conf).unwrap_or_else(|e| panic!("{e}"));
        assert!(none.is_empty());
    }
}
