//! `petrel-podset-controller`: the PodSet sample controller on Petrel's
//! controller kit (issue 30), the counterpart of the controller-runtime
//! reference `podset-controller` (tools/peers/controller-runtime): the same
//! flags, the same reconcile and the same stdout protocol ([`report`]), so
//! the benchmark compares the kits and not the work.
//!
//! How it uses the kit: an [`InformerFactory`] makes one informer for
//! PodSets and one for Pods; they start at once on every replica (warm
//! standby) and `/readyz` answers 200 once both have synced. While this
//! replica leads, a [`QueueHandler`] puts PodSet events and an
//! [`handler::OwnerHandler`] Pod events (under their owner's key) into a
//! [`WorkQueue`] at the tier their class deserves (initial list and no-op
//! resyncs in the background, resyncs spread; user changes urgent), and
//! [`run_workers`] reconciles. `/metrics` has client-go's `workqueue_*`.
//!
//! [`InformerFactory`]: petrel_controller::informer::InformerFactory
//! [`QueueHandler`]: petrel_controller::informer::QueueHandler
//! [`WorkQueue`]: petrel_controller::WorkQueue
//! [`run_workers`]: petrel_controller::run_workers

mod cli;
mod controller;
mod handler;
mod http;
mod kube_api;
mod podset;
mod reconcile;
mod report;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::{Args, Bind};
use crate::controller::{Controller, Settings};
use crate::http::Metrics;
use crate::report::Reporter;

/// Why the controller could not run.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("read kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("kube client config: {0}")]
    Config(String),
    #[error("kube client: {0}")]
    Client(#[source] kube::Error),
    #[error("--leader-elect: leader election is not available in this build yet")]
    NoLeaderElection,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("petrel-podset-controller: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client, RunError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| RunError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| RunError::Config(format!("{}: {e}", path.display())))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| RunError::Config(e.to_string()))?,
    };
    Client::try_from(config).map_err(RunError::Client)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() -> Result<(), std::io::Error> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

async fn run(args: Args) -> Result<(), RunError> {
    if args.leader_elect {
        return Err(RunError::NoLeaderElection);
    }
    let client = client(args.kubeconfig.as_ref()).await?;
    let report = Arc::new(Reporter::stdout());
    let metrics = Metrics::default();
    let settings = Settings {
        workers: args.workers.max(1),
        fifo: args.fifo,
        sync_period: args.sync_period,
    };
    let ctl = Arc::new(Controller::new(
        client,
        &args.namespace,
        settings,
        report.clone(),
        metrics.clone(),
    ));
    // Listen before anything else, so a bad address fails at once.
    if let Bind::At(addr) = args.metrics_bind_address {
        let l = http::bind(addr, "metrics").await?;
        tokio::spawn(log_exit("metrics", http::serve_metrics(l, metrics)));
    }
    if let Bind::At(addr) = args.health_probe_bind_address {
        let l = http::bind(addr, "health probe").await?;
        let c = ctl.clone();
        tokio::spawn(log_exit(
            "health probe",
            http::serve_probes(l, Arc::new(move || c.has_synced())),
        ));
    }
    ctl.start_informers();
    let signalled = shutdown_signal();
    // Without leader election this replica leads from the start, as the
    // reference's manager does.
    report.leading();
    tokio::select! {
        r = signalled => r?,
        _ = async { ctl.wait_for_sync().await; ctl.lead().await } => {}
    }
    report.stopped_leading();
    Ok(())
}

async fn log_exit(
    what: &'static str,
    serve: impl std::future::Future<Output = std::io::Result<()>>,
) {
    if let Err(e) = serve.await {
        tracing::error!(server = what, error = %e, "server stopped");
    }
}
