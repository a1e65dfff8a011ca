//! Logging set-up for the daemons (libraries only emit events).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs a tracing subscriber writing to stderr. `level` is a default
/// filter (e.g. `info`); `RUST_LOG` overrides it. `json` selects JSON lines.
pub fn init(level: &str, json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colours only on a terminal: log files stay plain text.
        .with_ansi(std::io::stderr().is_terminal());
    // A second initialisation (tests) is harmless: keep the first.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
