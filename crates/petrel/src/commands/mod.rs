//! The subcommands; clap types live only here.
pub mod agent;
pub mod ctl;
pub mod get;
pub mod node;
pub mod runtime;
