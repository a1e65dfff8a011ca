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
}
