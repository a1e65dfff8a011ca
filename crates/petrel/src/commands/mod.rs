//! The subcommands; clap types live only here.
pub mod agent;
pub mod ctl;
pub mod node;
pub mod runtime;
