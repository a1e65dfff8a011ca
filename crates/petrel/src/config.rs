//! Petrel's configuration file (`/etc/petrel/config.toml`).
//!
//! One file with a section per part; each section is the part's own typed
//! configuration with defaults, so precedence is: defaults < file < flags.

use std::path::Path;

use anyhow::Context;
use petrel_runtime::RuntimeConfig;
use serde::Deserialize;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    /// `[cri]`: the runtime.
    pub cri: RuntimeConfig,
    /// `[agent]`: the node agent.
    pub agent: petrel_agent::AgentConfig,
    /// `[nri]`: NRI in the runtime, with containerd's keys.
    pub nri: petrel_runtime::nri::NriConfig,
}

impl FileConfig {
    /// Reads `path`; a missing file named explicitly is an error.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parse config file {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_should_fill_defaults_and_reject_unknown_keys() -> anyhow::Result<()> {
        let c: FileConfig = toml::from_str("[cri]\nroot = \"/tmp/x\"\n")?;
        assert_eq!(c.cri.root, std::path::PathBuf::from("/tmp/x"));
        assert_eq!(c.cri.state, RuntimeConfig::default().state);
        assert!(toml::from_str::<FileConfig>("[cri]\nbogus = 1\n").is_err());
        assert!(toml::from_str::<FileConfig>("[nope]\n").is_err());
        let c: FileConfig = toml::from_str(
            "[agent]\nmanifests = \"/m\"\npleg = \"events\"\nrelist_period = \"2s\"\n",
        )?;
        assert_eq!(c.agent.manifests, std::path::PathBuf::from("/m"));
        assert_eq!(c.agent.pleg, petrel_agent::PlegMode::Events);
        assert_eq!(c.agent.relist_period, std::time::Duration::from_secs(2));
        assert!(toml::from_str::<FileConfig>("[agent]\npleg = \"sometimes\"\n").is_err());
        Ok(())
    }

    #[test]
    fn fast_paths_should_default_on_and_be_switched_off_in_the_cri_section() -> anyhow::Result<()> {
        let c: FileConfig = toml::from_str("")?;
        assert!(c.cri.fast_paths);
        let c: FileConfig = toml::from_str("[cri]\nfast_paths = false\n")?;
        assert!(!c.cri.fast_paths);
        Ok(())
    }

    #[test]
    fn nri_section_should_use_containerds_keys_and_defaults() -> anyhow::Result<()> {
        let c: FileConfig = toml::from_str("")?;
        assert!(!c.nri.disable, "NRI is on by default");
        assert_eq!(c.nri.socket_path, Path::new("/var/run/nri/nri.sock"));
        let c: FileConfig = toml::from_str(concat!(
            "[nri]\nsocket_path = \"/tmp/n.sock\"\nplugin_request_timeout = \"500ms\"\n",
            "[nri.plugins.\"10-slow\"]\ntimeout_fatal = true\n",
            "[nri.default_validator]\nenable = true\nrequired_plugins = [\"policy\"]\n",
        ))?;
        assert_eq!(c.nri.socket_path, Path::new("/tmp/n.sock"));
        assert_eq!(
            c.nri.plugin_request_timeout,
            std::time::Duration::from_millis(500)
        );
        assert!(c.nri.plugin("10", "slow").is_some_and(|o| o.timeout_fatal));
        assert_eq!(c.nri.default_validator.required_plugins, ["policy"]);
        let e = toml::from_str::<FileConfig>("[nri]\nplugin_request_timeout = \"2 s\"\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("plugin_request_timeout"), "{e}");
        assert!(toml::from_str::<FileConfig>("[nri]\nsocket = \"/x\"\n").is_err());
        Ok(())
    }
}
