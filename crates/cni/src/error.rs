//! Errors of the CNI client.

use std::path::PathBuf;

/// Why a network configuration could not be used or a plugin failed.
#[derive(Debug, thiserror::Error)]
pub enum CniError {
    /// The configuration directory could not be read.
    #[error("read CNI config directory {dir}: {source}")]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A configuration file is not valid.
    #[error("CNI config {file}: {reason}")]
    InvalidConfig {
        /// The file (or `<stored>` for a list kept by the runtime).
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No plugin binary of this type exists in the binary directories.
    #[error("CNI plugin {plugin:?} not found in {dirs}")]
    PluginNotFound {
        /// The plugin type.
        plugin: String,
        /// The directories searched, colon-separated.
        dirs: String,
    },
    /// The plugin could not be run.
    #[error("run CNI plugin {plugin}: {source}")]
    Exec {
        /// The plugin type.
        plugin: String,
        /// The error.
        source: std::io::Error,
    },
    /// The plugin reported an error (its `msg` and `details`).
    #[error("CNI plugin {plugin} failed ({command}): {message}")]
    Plugin {
        /// The plugin type.
        plugin: String,
        /// ADD, DEL or CHECK.
        command: &'static str,
        /// The plugin's message, with its details.
        message: String,
    },
    /// The plugin did not finish in time and was killed.
    #[error("CNI plugin {plugin} ({command}) did not finish within {seconds} s")]
    Timeout {
        /// The plugin type.
        plugin: String,
        /// ADD, DEL or CHECK.
        command: &'static str,
        /// The limit.
        seconds: u64,
    },
    /// The plugin's result could not be read.
    #[error("CNI plugin {plugin} returned an unreadable result: {reason}")]
    BadResult {
        /// The plugin type.
        plugin: String,
        /// What is wrong.
        reason: String,
    },
}
