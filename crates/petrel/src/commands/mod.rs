//! The subcommands; clap types live only here.
pub mod ctl;
pub mod runtime;
