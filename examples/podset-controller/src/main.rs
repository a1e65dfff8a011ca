//! `petrel-podset-controller`: the PodSet sample controller on Petrel's
//! controller kit (issue 30), the counterpart of the controller-runtime
//! reference `podset-controller` (tools/peers/controller-runtime): the same
//! flags, the same reconcile and the same stdout protocol ([`report`]), so
//! the benchmark compares the kits and not the work.
//!
//! How it uses the kit: an [`InformerFactory`] makes one informer for
//! PodSets and one for Pods; they start at once on every replica (warm
//! standby) and `/readyz` answers 200 once both have synced. With
//! `--leader-elect` a [`LeaseElector`] campaigns on a Lease and the kit's
//! `run_warm` runs the leader's part for each term, dropping it when the
//! term ends (fencing; the Lease is released on SIGTERM). While this
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
//! [`LeaseElector`]: petrel_controller::leader::LeaseElector

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
use petrel_controller::leader::{
    run_warm, serve_readiness, Backoff, ConfigError, KubeLease, LeaderMetrics, LeaseConfig,
    LeaseElector, Readiness, Term,
};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

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
    #[error("leader election: {0}")]
    LeaderElection(#[from] ConfigError),
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

/// Cancels `token` on SIGTERM or SIGINT.
fn cancel_on_signal(token: CancellationToken) -> Result<(), std::io::Error> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        token.cancel();
    });
    Ok(())
}

/// This candidate's Lease identity: host name and a random suffix
/// (client-go's `hostname_uuid`), unique per process.
fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "podset-controller".to_string());
    format!("{host}_{:016x}", rand::random::<u64>())
}

/// Prints `stopped-leading` when dropped: a term's work ends by being
/// dropped (fenced, released, shut down).
struct StoppedOnDrop(Arc<Reporter>);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.0.stopped_leading();
    }
}

async fn run(args: Args) -> Result<(), RunError> {
    let client = client(args.kubeconfig.as_ref()).await?;
    let report = Arc::new(Reporter::stdout());
    let leader_metrics = LeaderMetrics::new();
    let metrics = if args.leader_elect {
        Metrics::with_leader(leader_metrics.clone(), &args.leader_election_id)
    } else {
        Metrics::default()
    };
    let settings = Settings {
        workers: args.workers.max(1),
        fifo: args.fifo,
        background_share: args.background_share,
        sync_period: args.sync_period,
    };
    let ctl = Arc::new(Controller::new(
        client.clone(),
        &args.namespace,
        settings,
        report.clone(),
        metrics.clone(),
    ));
    let shutdown = CancellationToken::new();
    cancel_on_signal(shutdown.clone())?;
    let readiness = Readiness::new();
    // Listen before anything else, so a bad address fails at once.
    if let Bind::At(addr) = args.metrics_bind_address {
        let l = http::bind(addr, "metrics").await?;
        tokio::spawn(log_exit("metrics", http::serve_metrics(l, metrics)));
    }
    if let Bind::At(addr) = args.health_probe_bind_address {
        let l = http::bind(addr, "health probe").await?;
        // Served until the process exits (a never-cancelled token).
        let serve = serve_readiness(l, readiness.clone(), CancellationToken::new());
        tokio::spawn(log_exit("health probe", serve));
    }
    // Every replica lists and watches at once: a standby's cache is warm.
    ctl.start_informers();
    if !args.leader_elect {
        // Without leader election this replica leads from the start, as
        // the reference's manager does.
        report.leading();
        let _stopped = StoppedOnDrop(report.clone());
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = async {
                ctl.wait_for_sync().await;
                readiness.set_synced(true);
                ctl.lead(None).await;
            } => {}
        }
        return Ok(());
    }
    let lock = KubeLease::new(
        client,
        &args.leader_election_namespace,
        &args.leader_election_id,
    );
    let config = LeaseConfig::new(identity())
        .timing(args.lease_duration, args.renew_deadline, args.retry_period)
        // A standby retries every retry period (jittered), as client-go;
        // it also wakes at once when the Lease changes (a release).
        .backoff(Backoff::fixed(args.retry_period, 0.2))
        .release_on_shutdown(args.release_on_cancel);
    let (elector, leadership) = LeaseElector::new(lock, config, leader_metrics)?;
    let elector = tokio::spawn(elector.run(shutdown.clone()));
    let synced = {
        let ctl = ctl.clone();
        async move { ctl.wait_for_sync().await }
    };
    run_warm(leadership, readiness, synced, |term: Term| {
        let (ctl, report) = (ctl.clone(), report.clone());
        async move {
            report.leading();
            let _stopped = StoppedOnDrop(report);
            ctl.lead(Some(term)).await;
        }
    })
    .await;
    // run_warm returns once the elector has stopped (the Lease released).
    let _ = elector.await;
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
