//! `exec -i/-t`, `attach` and `port-forward`: the runtime answers CRI
//! Exec, Attach and PortForward with a URL of its streaming server, and
//! `petrel_stream::client` speaks to it (WebSocket by default, SPDY with
//! `--transport spdy`), as crictl does.

use std::io::Read;
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use petrel_cri::api::{AttachRequest, ExecRequest, PortForwardRequest};
use petrel_stream::client::{self, ClientError, CommandOptions, Outcome, PortForwarder, Transport};
use petrel_stream::{Reader, TermSize};
use tokio::io::AsyncWriteExt;

use super::error::CtlError;
use super::Ctl;

/// `--transport` values.
#[derive(Debug, Clone, Copy, Default, clap::ValueEnum)]
pub enum TransportArg {
    /// WebSocket channels (v5.channel.k8s.io, else v4).
    #[default]
    Websocket,
    /// SPDY/3.1 streams, as older crictl and kubectl speak.
    Spdy,
}

impl TransportArg {
    fn transport(self) -> Transport {
        match self {
            Self::Websocket => Transport::WebSocket,
            Self::Spdy => Transport::Spdy,
        }
    }
}

/// Flags of `attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Send this terminal's input to the container's stdin.
    #[arg(short = 'i', long)]
    interactive: bool,
    /// The container runs on a terminal (it must have been created with tty).
    #[arg(short = 't', long)]
    tty: bool,
    /// The streaming protocol.
    #[arg(long, value_enum, default_value_t = TransportArg::Websocket)]
    transport: TransportArg,
    /// Container id.
    id: String,
}

/// Flags of `port-forward`.
#[derive(Debug, Args)]
pub struct PortForwardArgs {
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    address: IpAddr,
    /// Pod sandbox id.
    pod: String,
    /// `[LOCAL:]REMOTE` port pairs (LOCAL 0 or absent with `:`: any free port).
    #[arg(required = true)]
    ports: Vec<String>,
}

fn stream_err(what: &str, e: ClientError) -> CtlError {
    CtlError::Other(format!("{what}: {e}"))
}

/// `exec -i` / `exec -t`: a streaming exec.
pub(super) async fn exec(
    ctl: &Ctl,
    id: &str,
    cmd: Vec<String>,
    stdin: bool,
    tty: bool,
    transport: TransportArg,
) -> Result<ExitCode, CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = ExecRequest {
        container_id: id.to_string(),
        cmd,
        tty,
        stdin,
        stdout: true,
        stderr: !tty,
    };
    let url = ctl
        .call(format!("exec in container {id}"), rt.exec(req))
        .await?
        .url;
    run_command(&url, stdin, tty, transport.transport()).await
}

/// `attach`: the container's main process's stdio.
pub async fn attach(ctl: &Ctl, args: AttachArgs) -> Result<ExitCode, CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = AttachRequest {
        container_id: args.id.clone(),
        stdin: args.interactive,
        tty: args.tty,
        stdout: true,
        stderr: !args.tty,
    };
    let url = ctl
        .call(format!("attach to container {}", args.id), rt.attach(req))
        .await?
        .url;
    run_command(&url, args.interactive, args.tty, args.transport.transport()).await
}

async fn run_command(
    url: &str,
    stdin: bool,
    tty: bool,
    transport: Transport,
) -> Result<ExitCode, CtlError> {
    let opts = CommandOptions {
        stdin,
        stdout: true,
        stderr: !tty,
        tty,
        transport,
    };
    let mut rc = client::remote_command(url, opts)
        .await
        .map_err(|e| stream_err("connect to the streaming server", e))?;
    // Raw mode while a terminal is attached; restored on every path (drop).
    let raw = if tty && stdin {
        terminal::RawMode::enter()
    } else {
        None
    };
    if let Some(tx) = rc.resize.take() {
        tokio::spawn(terminal::forward_resizes(tx));
    }
    if let Some(mut w) = rc.stdin.take() {
        let mut rx = stdin_chunks();
        tokio::spawn(async move {
            while let Some(chunk) = rx.recv().await {
                if w.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            // End of our input: close the command's stdin.
            let _ = w.shutdown().await;
        });
    }
    let out = rc.stdout.take().map(|r| tokio::spawn(copy_out(r, false)));
    let err = rc.stderr.take().map(|r| tokio::spawn(copy_out(r, true)));
    for task in [out, err].into_iter().flatten() {
        let _ = task.await;
    }
    let outcome = rc.wait().await;
    drop(raw);
    match outcome.map_err(|e| stream_err("streaming session", e))? {
        Outcome::Success => Ok(ExitCode::SUCCESS),
        Outcome::Exited { code, .. } => Ok(ExitCode::from(u8::try_from(code).unwrap_or(255))),
        Outcome::Failed(msg) => Err(CtlError::Other(msg)),
    }
}

/// Standard input read on a thread of its own (a blocking read cannot be
/// cancelled; the thread ends with the process), in chunks as they come.
fn stdin_chunks() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let spawned = std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let mut buf = vec![0u8; 32 * 1024];
            let mut input = std::io::stdin().lock();
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
    if let Err(e) = spawned {
        eprintln!("petrel ctl: cannot read standard input: {e}");
    }
    rx
}

/// Copies one output stream to ours as it arrives.
async fn copy_out(mut r: Reader, stderr: bool) {
    let result = if stderr {
        tokio::io::copy(&mut r, &mut tokio::io::stderr()).await
    } else {
        tokio::io::copy(&mut r, &mut tokio::io::stdout()).await
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "output stream ended");
    }
}

/// Prints a progress line of `port-forward`: a closed standard output (the
/// reader of `| head` went away) is no reason to stop forwarding.
fn say(line: &str) {
    use std::io::Write;
    if let Err(e) = writeln!(std::io::stdout(), "{line}") {
        tracing::debug!(error = %e, "standard output closed");
    }
}

/// `port-forward`: listens on local ports and forwards each connection to
/// its port in the pod over one SPDY connection (as kubectl does).
pub async fn port_forward(ctl: &Ctl, args: PortForwardArgs) -> Result<ExitCode, CtlError> {
    let mut pairs = Vec::new();
    for p in &args.ports {
        pairs.push(parse_pair(p)?);
    }
    let mut rt = ctl.runtime().await?;
    let req = PortForwardRequest {
        pod_sandbox_id: args.pod.clone(),
        port: pairs.iter().map(|(_, remote)| i32::from(*remote)).collect(),
    };
    let url = ctl
        .call(
            format!("port-forward to pod {}", args.pod),
            rt.port_forward(req),
        )
        .await?
        .url;
    let forwarder = Arc::new(
        PortForwarder::connect(&url)
            .await
            .map_err(|e| stream_err("connect to the streaming server", e))?,
    );
    let mut tasks = tokio::task::JoinSet::new();
    for (local, remote) in pairs {
        let listener = tokio::net::TcpListener::bind((args.address, local))
            .await
            .map_err(|e| CtlError::Other(format!("listen on {}:{local}: {e}", args.address)))?;
        let bound = listener
            .local_addr()
            .map_err(|e| CtlError::Other(format!("listen on {}:{local}: {e}", args.address)))?;
        say(&format!("Forwarding from {bound} -> {remote}"));
        let fwd = forwarder.clone();
        tasks.spawn(async move {
            loop {
                let Ok((conn, peer)) = listener.accept().await else {
                    return;
                };
                let fwd = fwd.clone();
                tokio::spawn(async move {
                    say(&format!("Handling connection for {remote}"));
                    if let Err(e) = forward_one(&fwd, conn, remote).await {
                        eprintln!("petrel ctl: connection from {peer} to port {remote}: {e}");
                    }
                });
            }
        });
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = tasks.join_next() => {}
    }
    forwarder.close().await;
    Ok(ExitCode::SUCCESS)
}

async fn forward_one(
    fwd: &PortForwarder,
    conn: tokio::net::TcpStream,
    remote: u16,
) -> Result<(), String> {
    let stream = fwd.open(remote).await.map_err(|e| e.to_string())?;
    let (mut from_pod, mut to_pod, error) = (stream.reader, stream.writer, stream.error);
    let (mut rd, mut wr) = conn.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut rd, &mut to_pod).await;
        let _ = to_pod.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut from_pod, &mut wr).await;
        let _ = wr.shutdown().await;
    };
    tokio::join!(up, down);
    match error.wait().await {
        Some(msg) => Err(msg),
        None => Ok(()),
    }
}

/// `[LOCAL:]REMOTE` → (local, remote); LOCAL defaults to REMOTE.
fn parse_pair(s: &str) -> Result<(u16, u16), CtlError> {
    let bad = || {
        CtlError::Usage(format!(
            "{s:?} is not [LOCAL:]REMOTE with ports 0-65535 (REMOTE not 0)"
        ))
    };
    let (local, remote) = match s.split_once(':') {
        Some((l, r)) => (
            if l.is_empty() {
                0
            } else {
                l.parse::<u16>().map_err(|_| bad())?
            },
            r.parse::<u16>().map_err(|_| bad())?,
        ),
        None => {
            let p = s.parse::<u16>().map_err(|_| bad())?;
            (p, p)
        }
    };
    if remote == 0 {
        return Err(bad());
    }
    Ok((local, remote))
}

/// The controlling terminal: raw mode and its size.
mod terminal {
    use rustix::termios::{self, OptionalActions, Termios};

    use super::TermSize;

    /// Raw mode on stdin, undone on drop.
    pub struct RawMode(Termios);

    impl RawMode {
        /// `None` when stdin is not a terminal.
        pub fn enter() -> Option<RawMode> {
            let fd = std::io::stdin();
            if !termios::isatty(&fd) {
                return None;
            }
            let saved = termios::tcgetattr(&fd).ok()?;
            let mut raw = saved.clone();
            raw.make_raw();
            termios::tcsetattr(&fd, OptionalActions::Now, &raw).ok()?;
            Some(RawMode(saved))
        }
    }

    impl Drop for RawMode {
        fn drop(&mut self) {
            let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.0);
        }
    }

    fn size() -> Option<TermSize> {
        let ws = termios::tcgetwinsize(std::io::stdout()).ok()?;
        (ws.ws_col > 0 && ws.ws_row > 0).then_some(TermSize {
            width: ws.ws_col,
            height: ws.ws_row,
        })
    }

    /// Sends the terminal's size now and after each SIGWINCH.
    pub async fn forward_resizes(tx: tokio::sync::mpsc::Sender<TermSize>) {
        use tokio::signal::unix::{signal, SignalKind};
        if let Some(s) = size() {
            if tx.send(s).await.is_err() {
                return;
            }
        }
        let Ok(mut winch) = signal(SignalKind::window_change()) else {
            return;
        };
        while winch.recv().await.is_some() {
            if let Some(s) = size() {
                if tx.send(s).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_pair_should_read_local_and_remote_ports() {
        assert_eq!(parse_pair("8080").ok(), Some((8080, 8080)));
        assert_eq!(parse_pair("9000:80").ok(), Some((9000, 80)));
        assert_eq!(parse_pair(":80").ok(), Some((0, 80)));
        for bad in ["", "x", "1:0", "0", "70000", "1:2:3", "a:80"] {
            assert!(parse_pair(bad).is_err(), "{bad}");
        }
    }
}
