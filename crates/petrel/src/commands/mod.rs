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

/// SIGTERM and SIGINT, counted: the first asks a daemon to stop (an agent
/// with `--drain-on-exit` drains its pods first), the second to stop at
/// once. Install it inside the tokio runtime.
pub struct StopSignals {
    count: tokio::sync::watch::Receiver<u32>,
}

impl StopSignals {
    /// Starts counting the signals (a task of the current runtime).
    pub fn install() -> Self {
        let (tx, count) = tokio::sync::watch::channel(0u32);
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                // Without handlers the signals' default action ends the
                // process: nothing to count.
                return;
            };
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                tx.send_modify(|n| *n += 1);
            }
        });
        Self { count }
    }

    /// Completes once `n` signals have arrived (never, if no handler could
    /// be installed).
    pub fn nth(&self, n: u32) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.count.clone();
        async move {
            if rx.wait_for(|c| *c >= n).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
