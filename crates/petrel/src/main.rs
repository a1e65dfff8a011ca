//! `petrel`: the one command of the Petrel node stack.
//!
//! - `petrel runtime`: the CRI v1 runtime;
//! - `petrel ctl`: a crictl-like client for any CRI runtime;
//! - `petrel agent`: the node agent;
//! - `petrel node`: runtime and agent in one process;
//! - `petrel get pods`: the agent's pods, like kubectl.

// Doc comments on clap arguments are the `--help` text, written for a
// terminal: `[cri]` and `<state>` there are not rustdoc links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

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
    Runtime(Box<commands::runtime::RuntimeArgs>),
    /// Talk to a CRI runtime, like crictl.
    Ctl(commands::ctl::CtlArgs),
    /// Show the agent's pods, like kubectl get.
    Get(commands::get::GetArgs),
    /// Run the node agent against a CRI runtime.
    Agent(Box<commands::agent::AgentArgs>),
    /// Run runtime and agent in one process: a node.
    Node(Box<commands::node::NodeArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Runtime(args) => commands::runtime::main(*args),
        Command::Ctl(args) => commands::ctl::main(args),
        Command::Get(args) => commands::get::main(args),
        Command::Agent(args) => commands::agent::main(*args),
        Command::Node(args) => commands::node::main(*args),
    }
}
