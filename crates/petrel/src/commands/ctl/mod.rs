//! `petrel ctl`: a crictl-like client for any CRI v1 runtime (and Petrel's
//! admin API).
//!
//! Commands keep crictl's names, flags and table columns: `version`, `info`,
//! `pods`, `ps`, `inspect`, `inspectp`, `inspecti`, `images`, `pull`, `rmi`
//! (with `-a` and `--prune`), `imagefsinfo`, `events`, `logs`, `exec`
//! (`-i`/`-t` stream through the runtime's streaming server), `attach`,
//! `port-forward`, `stats`, `metricdescs`, `metricsp`, `run`, `stop`, `rm`,
//! `stopp`, `rmp` and `metrics`; Petrel's own
//! `image import`, `image export`, `image prune` and `image gc --high --low`
//! go through its admin API.
//!
//! Differences from crictl worth knowing:
//! - `--name` and `--namespace` filters match substrings, not regular
//!   expressions;
//! - `run FILE` takes one small YAML file describing a pod and its
//!   containers (see [`run`] and `run-example.yaml` beside this file);
//! - `image import` loads a local OCI or docker archive through Petrel's
//!   admin API; `pull` shows per-layer progress through Petrel's admin
//!   API (bars on a terminal, lines otherwise) and falls back to CRI
//!   PullImage, without progress, on other runtimes;
//! - JSON and YAML use the CRI field names in snake_case, with enum values
//!   and status timestamps rendered as names and RFC 3339 text.
//!
//! Errors print `petrel ctl: <what failed>: <message> (<gRPC code>)` and exit
//! with 1; usage errors exit with 2.

mod containers;
mod error;
mod events;
mod images;
mod info;
mod logs;
mod nri;
mod output;
mod pod_metrics;
mod pods;
mod pull;
mod run;
mod stats;
mod stream;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use petrel_cri::admin::admin_client::AdminClient;
use petrel_cri::api::image_service_client::ImageServiceClient;
use petrel_cri::api::runtime_service_client::RuntimeServiceClient;
use petrel_cri::ClientError;
use tokio::sync::OnceCell;
use tonic::transport::Channel;

pub use error::CtlError;
use output::Format;

/// The largest message accepted from the runtime; long container lists and
/// verbose status answers exceed tonic's 4 MiB default.
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// `--timeout` when not given, in seconds.
const DEFAULT_TIMEOUT_SECS: u64 = 10;

/// Flags of `petrel ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// CRI endpoint: unix:///path/to/socket or /path/to/socket.
    #[arg(
        long,
        env = "PETREL_ENDPOINT",
        default_value = "unix:///run/petrel/petrel.sock"
    )]
    endpoint: String,
    /// Seconds to wait for each call's answer (0: no limit) [default: 10;
    /// for pull 600, and a pull given --timeout stops after it].
    #[arg(long)]
    timeout: Option<u64>,
    /// Output format, where the command has several [default: table, or
    /// json for inspect, inspectp, inspecti and info].
    #[arg(short = 'o', long, value_enum, global = true)]
    output: Option<Format>,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Subcommand)]
enum CtlCommand {
    /// Show the runtime's name and versions.
    Version,
    /// Show the runtime's conditions and verbose information.
    Info,
    /// List pod sandboxes.
    Pods(pods::PodsArgs),
    /// List containers (running ones unless -a).
    Ps(containers::PsArgs),
    /// Show the status of one or more containers.
    Inspect(containers::InspectArgs),
    /// Show the status of one or more pod sandboxes.
    Inspectp(pods::InspectpArgs),
    /// Show the status of an image.
    Inspecti(images::InspectiArgs),
    /// List images.
    Images(images::ImagesArgs),
    /// Pull an image from its registry (or a configured mirror).
    Pull(pull::PullArgs),
    /// Manage images.
    #[command(subcommand)]
    Image(images::ImageCommand),
    /// Remove one or more images.
    Rmi(images::RmiArgs),
    /// Show the image and container filesystems' usage.
    Imagefsinfo,
    /// Stream container events until Ctrl-C.
    Events,
    /// Print a container's logs.
    Logs(logs::LogsArgs),
    /// Run a command in a running container (-i/-t: interactive, streaming).
    Exec(containers::ExecArgs),
    /// Attach to a running container's main process.
    Attach(stream::AttachArgs),
    /// Forward local ports to ports in a pod.
    PortForward(stream::PortForwardArgs),
    /// Show containers' resource usage.
    Stats(stats::StatsArgs),
    /// Run a pod and its containers from a YAML file.
    Run(run::RunArgs),
    /// Stop one or more running containers.
    Stop(containers::StopArgs),
    /// Remove one or more containers.
    Rm(containers::RmArgs),
    /// Checkpoint a running container into an archive (it keeps running).
    Checkpoint(containers::CheckpointArgs),
    /// Stop one or more pod sandboxes.
    Stopp(pods::StoppArgs),
    /// Remove one or more pod sandboxes.
    Rmp(pods::RmpArgs),
    /// Show the runtime's metrics (Prometheus text).
    Metrics,
    /// List the CRI metric descriptors (what `metricsp` reports).
    Metricdescs,
    /// List every ready pod's CRI metrics and its containers'.
    Metricsp,
    /// List the runtime's NRI plugins: index, subscriptions, health, calls.
    Nri,
}

/// Runs one `petrel ctl` command and returns its exit code.
pub fn main(args: CtlArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("petrel ctl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ctl = Ctl::new(&args);
    match rt.block_on(dispatch(&ctl, args.command)) {
        Ok(code) => code,
        Err(e) => {
            report(&e);
            ExitCode::from(e.exit_code())
        }
    }
}

async fn dispatch(ctl: &Ctl, command: CtlCommand) -> Result<ExitCode, CtlError> {
    match command {
        CtlCommand::Version => info::version(ctl).await,
        CtlCommand::Info => info::info(ctl).await,
        CtlCommand::Metrics => info::metrics(ctl).await,
        CtlCommand::Metricdescs => pod_metrics::descriptors(ctl).await,
        CtlCommand::Metricsp => pod_metrics::pod_metrics(ctl).await,
        CtlCommand::Nri => nri::plugins(ctl).await,
        CtlCommand::Pods(a) => pods::list(ctl, a).await,
        CtlCommand::Inspectp(a) => pods::inspect(ctl, a).await,
        CtlCommand::Stopp(a) => pods::stop(ctl, a).await,
        CtlCommand::Rmp(a) => pods::remove(ctl, a).await,
        CtlCommand::Ps(a) => containers::list(ctl, a).await,
        CtlCommand::Inspect(a) => containers::inspect(ctl, a).await,
        CtlCommand::Exec(a) => containers::exec(ctl, a).await,
        CtlCommand::Attach(a) => stream::attach(ctl, a).await,
        CtlCommand::PortForward(a) => stream::port_forward(ctl, a).await,
        CtlCommand::Stop(a) => containers::stop(ctl, a).await,
        CtlCommand::Rm(a) => containers::remove(ctl, a).await,
        CtlCommand::Checkpoint(a) => containers::checkpoint(ctl, a).await,
        CtlCommand::Images(a) => images::list(ctl, a).await,
        CtlCommand::Inspecti(a) => images::inspect(ctl, a).await,
        CtlCommand::Image(c) => images::image(ctl, c).await,
        CtlCommand::Pull(a) => pull::pull(ctl, a).await,
        CtlCommand::Rmi(a) => images::remove(ctl, a).await,
        CtlCommand::Imagefsinfo => images::fs_info(ctl).await,
        CtlCommand::Events => events::watch(ctl).await,
        CtlCommand::Logs(a) => logs::logs(ctl, a).await,
        CtlCommand::Stats(a) => stats::stats(ctl, a).await,
        CtlCommand::Run(a) => run::run(ctl, a).await,
    }
}

/// Prints an error the way every command does.
fn report(e: &CtlError) {
    if !e.is_silent() {
        eprintln!("petrel ctl: {e}");
    }
}

/// Prints the statuses fetched for `inspect`-like commands: text in table
/// format, else one JSON/YAML document per status; failures are reported
/// and make the exit code 1, the other ids are still shown.
fn print_statuses<R>(
    format: output::Format,
    fetched: Vec<Result<R, CtlError>>,
    text: fn(&R, i64) -> String,
    value: fn(&R) -> Result<output::StatusDoc, CtlError>,
) -> Result<ExitCode, CtlError> {
    let mut outcome = Outcome::default();
    let mut docs = Vec::new();
    for result in fetched {
        let Some(resp) = outcome.note(result) else {
            continue;
        };
        if format == output::Format::Table {
            output::emit(&text(&resp, output::now_ns()))?;
        } else if let Some(doc) = outcome.note(value(&resp)) {
            docs.push(doc);
        }
    }
    if format != output::Format::Table && !docs.is_empty() {
        output::print_documents(format, &docs)?;
    }
    Ok(outcome.exit_code())
}

/// Collects the outcome of commands that act on several ids: each failure
/// is reported at once and the others still run.
#[derive(Debug, Default)]
struct Outcome {
    failed: bool,
}

impl Outcome {
    /// Reports `result`'s error, if any, and keeps its value.
    fn note<T>(&mut self, result: Result<T, CtlError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                report(&e);
                self.failed = true;
                None
            }
        }
    }

    /// 0 if everything succeeded, else 1.
    fn exit_code(&self) -> ExitCode {
        if self.failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// The connection and settings shared by every command. The socket is
/// dialled on first use, so commands that fail on their input never touch it.
struct Ctl {
    endpoint: String,
    timeout: Option<Duration>,
    /// Whether `--timeout` was given (a pull then keeps to it exactly).
    timeout_given: bool,
    output: Option<Format>,
    channel: OnceCell<Channel>,
}

impl Ctl {
    fn new(args: &CtlArgs) -> Self {
        Self {
            endpoint: args.endpoint.clone(),
            timeout: match args.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS) {
                0 => None,
                t => Some(Duration::from_secs(t)),
            },
            timeout_given: args.timeout.is_some(),
            output: args.output,
            channel: OnceCell::new(),
        }
    }

    /// The output format chosen, or the command's own default.
    fn format_or(&self, default: Format) -> Format {
        self.output.unwrap_or(default)
    }

    async fn channel(&self) -> Result<Channel, CtlError> {
        self.channel
            .get_or_try_init(|| async {
                petrel_cri::connect(&self.endpoint)
                    .await
                    .map_err(connect_error)
            })
            .await
            .cloned()
    }

    /// A CRI RuntimeService client.
    async fn runtime(&self) -> Result<RuntimeServiceClient<Channel>, CtlError> {
        Ok(RuntimeServiceClient::new(self.channel().await?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// A CRI ImageService client.
    async fn images(&self) -> Result<ImageServiceClient<Channel>, CtlError> {
        Ok(ImageServiceClient::new(self.channel().await?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// A Petrel admin client.
    async fn admin(&self) -> Result<AdminClient<Channel>, CtlError> {
        Ok(AdminClient::new(self.channel().await?).max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Awaits a unary call within `--timeout`; `what` names it in errors.
    async fn call<T>(
        &self,
        what: impl Into<String>,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CtlError> {
        self.call_within(self.timeout, what, call).await
    }

    /// Awaits a unary call within `limit` (None: no limit).
    async fn call_within<T>(
        &self,
        limit: Option<Duration>,
        what: impl Into<String>,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CtlError> {
        let result = match limit {
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(r) => r,
                Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                    "no answer within {}s (see --timeout)",
                    limit.as_secs()
                ))),
            },
            None => call.await,
        };
        result
            .map(tonic::Response::into_inner)
            .map_err(|status| CtlError::rpc(what, status))
    }
}

fn connect_error(e: ClientError) -> CtlError {
    match &e {
        ClientError::InvalidEndpoint(_) => CtlError::Endpoint(e.to_string()),
        ClientError::Connect { path, source } => CtlError::Unreachable {
            path: path.display().to_string(),
            cause: error::root_cause(source),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        ctl: CtlArgs,
    }

    fn parse(args: &[&str]) -> Result<CtlArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("ctl").chain(args.iter().copied())).map(|c| c.ctl)
    }

    #[test]
    fn ctl_args_should_accept_output_after_the_subcommand() {
        let a = parse(&["pods", "-o", "json"]).ok();
        assert_eq!(a.and_then(|a| a.output), Some(Format::Json));
    }

    #[test]
    fn ctl_args_should_default_endpoint_and_timeout() {
        let a = parse(&["version"]).ok();
        assert_eq!(a.as_ref().map(|a| a.timeout), Some(None));
        let ctl = a.as_ref().map(Ctl::new);
        assert_eq!(
            ctl.as_ref().map(|c| (c.timeout, c.timeout_given)),
            Some((Some(Duration::from_secs(DEFAULT_TIMEOUT_SECS)), false))
        );
        let ctl = parse(&["--timeout", "0", "version"])
            .ok()
            .map(|a| Ctl::new(&a));
        assert_eq!(
            ctl.map(|c| (c.timeout, c.timeout_given)),
            Some((None, true))
        );
        assert!(a.is_some_and(|a| a.endpoint.starts_with("unix:///")));
    }

    #[test]
    fn ctl_args_should_take_exec_command_with_or_without_double_dash() {
        for args in [
            &["exec", "abc", "--", "ls", "-l"][..],
            &["exec", "abc", "ls", "-l"][..],
            &["exec", "--timeout", "5", "abc", "--", "ls", "-l"][..],
        ] {
            match parse(args).ok().map(|a| a.command) {
                Some(CtlCommand::Exec(e)) => assert_eq!(e.cmd, ["ls", "-l"], "{args:?}"),
                other => panic!("unexpected {other:?} for {args:?}"),
            }
        }
    }

    #[test]
    fn ctl_args_should_reject_unknown_output_format() {
        assert!(parse(&["pods", "-o", "xml"]).is_err());
    }

    #[test]
    fn outcome_should_fail_after_any_error() {
        let mut o = Outcome::default();
        assert_eq!(o.note::<()>(Ok(())), Some(()));
        assert!(!o.failed);
        assert_eq!(o.note::<()>(Err(CtlError::Other("x".into()))), None);
        assert!(o.failed);
    }

    #[tokio::test]
    async fn ctl_should_name_the_socket_it_cannot_reach() {
        let args = parse(&["--endpoint", "/nonexistent/petrel-test.sock", "version"]);
        let ctl = args.as_ref().map(Ctl::new).ok();
        let err = match ctl {
            Some(ctl) => ctl.runtime().await.err(),
            None => None,
        };
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("/nonexistent/petrel-test.sock"), "{text}");
        assert!(text.contains("--endpoint"), "{text}");
    }
}
