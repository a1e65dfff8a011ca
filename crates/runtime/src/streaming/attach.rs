//! Attach: a connection to the container's shim on its attach socket
//! (protocol: `petrel_shim::attach`), copied to and from the client.
//!
//! The shim holds the container's stdio for the container's whole life, so
//! an attach works the same before and after a runtime restart.

use std::io;
use std::path::Path;

use petrel_shim::attach::{self, HEADER_LEN};
use petrel_shim::ATTACH_SOCKET;
use petrel_stream::{AttachSpec, BackendError, Reader, StreamIo, TermSize, Writer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use super::fd;

/// Most input bytes sent in one frame.
const INPUT_CHUNK: usize = 16 * 1024;

/// Serves `io` until the container's shim closes the connection (the
/// container exited and its output is written) or the caller drops the
/// future (the client left: the shim then forgets this client, and with
/// `stdin_once` closes the container's stdin if this attach carried it).
pub(super) async fn run(
    id: &str,
    bundle: &Path,
    spec: AttachSpec,
    io: StreamIo,
) -> Result<(), BackendError> {
    let conn = fd::connect_in(bundle, ATTACH_SOCKET)
        .await
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => BackendError::FailedPrecondition(format!(
                "container {id} cannot be attached to: its shim serves no attach socket \
                 (started by an older petrel-shim, or exited)"
            )),
            io::ErrorKind::ConnectionRefused => {
                BackendError::FailedPrecondition(format!("container {id} is not running"))
            }
            _ => BackendError::Internal(format!("connect to the shim of {id}: {e}")),
        })?;
    let (from_shim, to_shim) = conn.into_split();
    let StreamIo {
        stdin,
        stdout,
        stderr,
        resize,
    } = io;
    let stdin = stdin.filter(|_| spec.stdin);
    let resize = resize.filter(|_| spec.tty);
    let stdout = stdout.filter(|_| spec.stdout);
    let stderr = stderr.filter(|_| spec.stderr && !spec.tty);

    let input = send_input(to_shim, spec.stdin, stdin, resize);
    tokio::pin!(input);
    tokio::select! {
        r = receive_output(from_shim, stdout, stderr) => r.map_err(|e| {
            BackendError::Internal(format!("read output of {id} from its shim: {e}"))
        }),
        // Never completes: it holds the connection's write half, whose drop
        // would make the shim drop this client.
        () = &mut input => Ok(()),
    }
}

/// Copies frames from the shim to the client's streams until the shim
/// closes the connection.
async fn receive_output(
    mut from: OwnedReadHalf,
    mut stdout: Option<Writer>,
    mut stderr: Option<Writer>,
) -> io::Result<()> {
    let mut payload = vec![0u8; attach::MAX_PAYLOAD];
    loop {
        let mut header = [0u8; HEADER_LEN];
        match from.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let (kind, len) = attach::parse_header(header);
        let data = &mut payload[..len];
        match from.read_exact(data).await {
            Ok(_) => {}
            // The shim exited in the middle of a frame: what came is lost.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let to = match kind {
            attach::STDOUT => &mut stdout,
            attach::STDERR => &mut stderr,
            _ => continue,
        };
        if let Some(w) = to.as_mut() {
            // A client stream that fails is dropped; the other may live on.
            if w.write_all(data).await.is_err() || w.flush().await.is_err() {
                *to = None;
            }
        }
    }
}

/// Sends the client's input and terminal sizes to the shim, then waits
/// forever, keeping the connection open.
async fn send_input(
    mut to: OwnedWriteHalf,
    carries_stdin: bool,
    mut stdin: Option<Reader>,
    mut resize: Option<mpsc::Receiver<TermSize>>,
) {
    if carries_stdin
        && to
            .write_all(&attach::header(attach::STDIN_OPEN, 0))
            .await
            .is_err()
    {
        return std::future::pending().await;
    }
    if carries_stdin && stdin.is_none() {
        // Asked for input without giving any: it ends at once.
        if let Err(e) = to.write_all(&attach::header(attach::STDIN_CLOSE, 0)).await {
            tracing::debug!(error = %e, "attach: stdin close not sent to the shim");
        }
    }
    let mut buf = vec![0u8; INPUT_CHUNK];
    while stdin.is_some() || resize.is_some() {
        tokio::select! {
            r = read_some(&mut stdin, &mut buf) => {
                let sent = match r {
                    Ok(n) if n > 0 => {
                        let frame = attach::header(attach::STDIN, n);
                        match to.write_all(&frame).await {
                            Ok(()) => to.write_all(&buf[..n]).await,
                            Err(e) => Err(e),
                        }
                    }
                    _ => {
                        stdin = None;
                        to.write_all(&attach::header(attach::STDIN_CLOSE, 0)).await
                    }
                };
                if sent.is_err() {
                    break;
                }
            }
            size = next_size(&mut resize) => match size {
                Some(s) => {
                    if to.write_all(&attach::resize_frame(s.width, s.height)).await.is_err() {
                        break;
                    }
                }
                None => resize = None,
            },
        }
    }
    std::future::pending().await
}

/// Reads from the client's stdin; never completes without one.
async fn read_some(stdin: &mut Option<Reader>, buf: &mut [u8]) -> io::Result<usize> {
    match stdin {
        Some(r) => r.read(buf).await,
        None => std::future::pending().await,
    }
}

/// The next terminal size; never completes without a resize channel.
async fn next_size(rx: &mut Option<mpsc::Receiver<TermSize>>) -> Option<TermSize> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
