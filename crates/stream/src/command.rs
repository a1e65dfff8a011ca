//! Runs an accepted exec or attach on the backend, whatever the transport,
//! and turns its result into the status the client is told.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::pipe::ChunkReader;
use crate::protocol::resize;
use crate::protocol::status::Outcome;
use crate::{AttachSpec, BackendError, ExecSpec, StreamBackend, StreamIo, TermSize};

/// An exec or attach waiting for (or served to) its client.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    Exec(ExecSpec),
    Attach(AttachSpec),
}

impl Command {
    pub(crate) fn tty(&self) -> bool {
        match self {
            Command::Exec(s) => s.tty,
            Command::Attach(s) => s.tty,
        }
    }
    pub(crate) fn stdin(&self) -> bool {
        match self {
            Command::Exec(s) => s.stdin,
            Command::Attach(s) => s.stdin,
        }
    }
    pub(crate) fn stdout(&self) -> bool {
        match self {
            Command::Exec(s) => s.stdout,
            Command::Attach(s) => s.stdout,
        }
    }
    /// Never with a terminal (which merges stderr into stdout).
    pub(crate) fn stderr(&self) -> bool {
        let (tty, stderr) = match self {
            Command::Exec(s) => (s.tty, s.stderr),
            Command::Attach(s) => (s.tty, s.stderr),
        };
        stderr && !tty
    }
}

/// Runs `command` with `io` until it ends or `stop` fires (the client went
/// away or the server shuts down: the backend's future is dropped, which
/// kills an exec). `None` when stopped: nobody is left to tell.
pub(crate) async fn run(
    backend: Arc<dyn StreamBackend>,
    command: Command,
    io: StreamIo,
    stop: CancellationToken,
) -> Option<Outcome> {
    let work = async {
        match command {
            Command::Exec(spec) => match backend.exec(spec, io).await {
                Ok(code) => Outcome::from_exit_code(code),
                Err(BackendError::CommandFailed { message, exit_code }) => Outcome::Exited {
                    code: exit_code,
                    message,
                },
                Err(e) => Outcome::Failed(format!("error executing command in container: {e}")),
            },
            Command::Attach(spec) => match backend.attach(spec, io).await {
                Ok(()) => Outcome::Success,
                Err(e) => Outcome::Failed(format!("error attaching to container: {e}")),
            },
        }
    };
    tokio::select! {
        outcome = work => Some(outcome),
        _ = stop.cancelled() => None,
    }
}

/// Turns a resize stream's bytes into terminal sizes for the backend. Ends
/// when the stream ends, the backend drops its receiver, or the stream
/// holds garbage (logged).
pub(crate) fn spawn_resize_decoder(mut input: ChunkReader, sizes: mpsc::Sender<TermSize>) {
    tokio::spawn(async move {
        let mut decoder = resize::Decoder::default();
        while let Some(chunk) = input.next_chunk().await {
            match decoder.push(&chunk) {
                Ok(list) => {
                    for size in list {
                        if sizes.send(size).await.is_err() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ignoring the rest of a resize stream");
                    return;
                }
            }
        }
    });
}
