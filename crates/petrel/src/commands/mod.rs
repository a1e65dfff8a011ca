//! The subcommands; clap types live only here.
pub mod agent;
pub mod ctl;
pub mod get;
pub mod node;
pub mod runtime;

/// Runs a daemon's future on a multi-threaded tokio runtime: exit code 1
/// (with the error on stderr, prefixed by `name`) if the runtime cannot
/// start or the future fails.
pub fn run_daemon<E: std::fmt::Display>(
    name: &str,
    fut: impl std::future::Future<Output = Result<(), E>>,
) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("petrel {name}: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "{name} failed");
            eprintln!("petrel {name}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
