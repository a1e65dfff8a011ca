//! `petrel`: the one command of the Petrel node stack.
//!
//! - `petrel runtime`: the CRI v1 runtime;
//! - `petrel ctl`: a crictl-like client for any CRI runtime.

mod commands;
mod config;
mod observability;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Petrel: a lightweight, event-driven Kubernetes node stack.
#[derive(Debug, Parser)]
#[command(name = "petrel", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the CRI v1 container runtime.
    Runtime(commands::runtime::RuntimeArgs),
    /// Talk to a CRI runtime, like crictl.
    Ctl(commands::ctl::CtlArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Runtime(args) => commands::runtime::main(args),
        Command::Ctl(args) => commands::ctl::main(args),
    }
}
