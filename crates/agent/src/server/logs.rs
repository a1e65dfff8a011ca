//! `GET /containerLogs/{namespace}/{pod}/{container}`: a container's log
//! file (CRI format, see [`crate::crilog`]) as plain text, with kubelet's
//! parameters `follow`, `tailLines`, `timestamps`, `previous`,
//! `sinceSeconds`, `sinceTime` and `limitBytes`.
//!
//! Following reads new lines as inotify reports the log directory changed
//! (polling when inotify is unavailable), survives rotation (the path
//! renamed and recreated, or the file truncated), and ends when the
//! container has exited and its file is drained, when the client goes
//! away, or when the server stops.

use std::io::SeekFrom;
use std::os::unix::fs::MetadataExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use inotify::{EventStream, Inotify, WatchMask};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::{mpsc, watch};

use super::params::QueryParams;
use super::resolve::{find_pod, is_running, ApiError};
use super::AppState;
use crate::cri::RuntimeObserver;
use crate::crilog::{
    drain_records, parse_rfc3339, ByteLimit, LineJoiner, LogLine, LogSelection, TailBuffer,
};

/// How often a follower asks the runtime whether the container still runs.
const STATE_CHECK: Duration = Duration::from_secs(1);
/// Longest sleep between reads with inotify (a safety net) and without.
const WAIT_INOTIFY: Duration = Duration::from_secs(1);
const WAIT_POLL: Duration = Duration::from_millis(250);
/// Lets the runtime's log writer flush the last output of a container
/// that just exited before the file is drained for good.
const EXIT_GRACE: Duration = Duration::from_millis(200);

/// What a `containerLogs` request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogRequest {
    /// Keep streaming new lines.
    pub follow: bool,
    /// The previous instance of the container.
    pub previous: bool,
    /// Which lines, and how they are written.
    pub selection: LogSelection,
}

impl LogRequest {
    /// Reads kubelet's parameters; `now` (ns since the epoch) anchors
    /// `sinceSeconds`.
    pub fn parse(q: &QueryParams, now: i64) -> Result<Self, ApiError> {
        let since_seconds: Option<i64> = q.number("sinceSeconds")?;
        let since_time = q.get("sinceTime");
        if since_seconds.is_some() && since_time.is_some() {
            return Err(ApiError::BadRequest(
                "at most one of sinceTime or sinceSeconds may be specified".into(),
            ));
        }
        let since = match (since_seconds, since_time) {
            (Some(s), _) if s < 1 => {
                return Err(ApiError::BadRequest(format!(
                    "invalid value {s} for parameter sinceSeconds: must be greater than 0"
                )))
            }
            (Some(s), _) => Some(now.saturating_sub(s.saturating_mul(1_000_000_000))),
            (None, Some(t)) => Some(parse_rfc3339(t).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "invalid value {t:?} for parameter sinceTime: expected an RFC 3339 time"
                ))
            })?),
            (None, None) => None,
        };
        let tail_lines: Option<i64> = q.number("tailLines")?;
        if let Some(n) = tail_lines.filter(|n| *n < 0) {
            return Err(ApiError::BadRequest(format!(
                "invalid value {n} for parameter tailLines: must be greater than or equal to 0"
            )));
        }
        let limit_bytes: Option<i64> = q.number("limitBytes")?;
        if let Some(n) = limit_bytes.filter(|n| *n < 1) {
            return Err(ApiError::BadRequest(format!(
                "invalid value {n} for parameter limitBytes: must be greater than 0"
            )));
        }
        Ok(Self {
            follow: q.flag("follow")?,
            previous: q.flag("previous")?,
            selection: LogSelection {
                since,
                tail_lines: tail_lines.map(|n| n.unsigned_abs()),
                limit_bytes: limit_bytes.map(|n| n.unsigned_abs()),
                timestamps: q.flag("timestamps")?,
            },
        })
    }
}

/// The handler.
pub(super) async fn container_logs(
    State(st): State<AppState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    match start(&st, &namespace, &pod, &container, query.as_deref()).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

async fn start(
    st: &AppState,
    namespace: &str,
    pod: &str,
    container: &str,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    let req = LogRequest::parse(&QueryParams::parse(query), now_ns())?;
    let found = find_pod(st, namespace, pod)?;
    let c = found.container(container, req.previous)?;
    // A previous instance has exited: there is nothing to follow.
    let follow = req.follow && !req.previous && is_running(&c);
    if c.log_path.is_empty() {
        return Ok(text_stream(Body::empty()));
    }
    let log = match LogFile::open(PathBuf::from(&c.log_path)).await {
        Ok(f) => f,
        // No output yet, or the file was removed with the container.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(text_stream(Body::empty()));
        }
        Err(e) => {
            return Err(ApiError::Internal(format!(
                "open log of container {container:?}: {}: {e}",
                c.log_path
            )))
        }
    };
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(16);
    let streamer = Streamer {
        runtime: Arc::clone(&st.shared.runtime),
        container_id: c.id.clone(),
        selection: req.selection,
        follow,
        stopping: st.stopping.clone(),
        limit: ByteLimit::new(None),
        tx,
    };
    tokio::spawn(streamer.run(log));
    Ok(text_stream(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )))
}

fn text_stream(body: Body) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// An open log file and the records read from it so far.
struct LogFile {
    path: PathBuf,
    file: tokio::fs::File,
    /// (device, inode) of the open file, to notice the path replaced.
    identity: (u64, u64),
    pos: u64,
    /// An incomplete last record.
    rest: Vec<u8>,
    joiner: LineJoiner,
}

/// What became of the path since the file was opened.
enum FileChange {
    Same,
    /// The path names a new file (rotation) or none (mid-rotation).
    Replaced,
    /// The file is shorter than what was read (copy-and-truncate).
    Truncated,
}

impl LogFile {
    async fn open(path: PathBuf) -> std::io::Result<Self> {
        let file = tokio::fs::File::open(&path).await?;
        let m = file.metadata().await?;
        Ok(Self {
            path,
            file,
            identity: (m.dev(), m.ino()),
            pos: 0,
            rest: Vec::new(),
            joiner: LineJoiner::new(),
        })
    }

    /// Reads to the end of the file; each whole line goes to `out`.
    async fn read_lines(&mut self, out: &mut (dyn FnMut(LogLine) + Send)) -> std::io::Result<()> {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = self.file.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            self.pos += n as u64;
            self.rest.extend_from_slice(&chunk[..n]);
            for rec in drain_records(&mut self.rest) {
                self.push(&rec, out);
            }
        }
    }

    fn push(&mut self, rec: &[u8], out: &mut (dyn FnMut(LogLine) + Send)) {
        match self.joiner.push(rec) {
            Ok(Some(line)) => out(line),
            Ok(None) => {}
            // kubelet skips what it cannot parse, and so do we.
            Err(e) => {
                tracing::debug!(path = %self.path.display(), error = %e, "skipping log record")
            }
        }
    }

    /// The end of a file no one writes any more: an unterminated record
    /// and partial lines count as lines.
    fn finish(&mut self, out: &mut (dyn FnMut(LogLine) + Send)) {
        let rest = std::mem::take(&mut self.rest);
        if !rest.is_empty() {
            self.push(&rest, out);
        }
        for line in self.joiner.flush() {
            out(line);
        }
    }

    async fn change(&self) -> FileChange {
        match tokio::fs::metadata(&self.path).await {
            Ok(m) if (m.dev(), m.ino()) != self.identity => FileChange::Replaced,
            Ok(m) if m.len() < self.pos => FileChange::Truncated,
            Ok(_) => FileChange::Same,
            Err(_) => FileChange::Replaced,
        }
    }

    async fn rewind(&mut self) -> std::io::Result<()> {
        self.file.seek(SeekFrom::Start(0)).await?;
        self.pos = 0;
        self.rest.clear();
        Ok(())
    }
}

/// Wakes a follower when the log directory changes, or after a while.
struct Wake {
    events: Option<EventStream<Vec<u8>>>,
}

impl Wake {
    fn new(path: &FsPath) -> Self {
        let events = path.parent().and_then(|dir| {
            let setup = || -> std::io::Result<EventStream<Vec<u8>>> {
                let ino = Inotify::init()?;
                ino.watches().add(
                    dir,
                    WatchMask::MODIFY
                        | WatchMask::CREATE
                        | WatchMask::MOVED_TO
                        | WatchMask::MOVED_FROM
                        | WatchMask::DELETE,
                )?;
                ino.into_event_stream(vec![0u8; 4096])
            };
            setup()
                .map_err(|e| tracing::debug!(dir = %dir.display(), error = %e, "no inotify on the log directory; polling"))
                .ok()
        });
        Self { events }
    }

    async fn wait(&mut self) {
        match self.events.as_mut() {
            Some(ev) => match tokio::time::timeout(WAIT_INOTIFY, ev.next()).await {
                Ok(Some(Ok(_))) | Err(_) => {}
                // A broken inotify descriptor: poll from now on.
                Ok(_) => self.events = None,
            },
            None => tokio::time::sleep(WAIT_POLL).await,
        }
    }
}

/// Writes one request's log output into the response body.
struct Streamer {
    runtime: Arc<dyn RuntimeObserver>,
    container_id: String,
    selection: LogSelection,
    follow: bool,
    stopping: watch::Receiver<bool>,
    limit: ByteLimit,
    tx: mpsc::Sender<std::io::Result<Bytes>>,
}

/// The client went away, the output limit was reached, or reading failed
/// (already reported to the client): stop streaming.
struct Stop;

impl Streamer {
    async fn run(mut self, mut log: LogFile) {
        self.limit = ByteLimit::new(self.selection.limit_bytes);
        let _ = self.stream(&mut log).await;
    }

    async fn stream(&mut self, log: &mut LogFile) -> Result<(), Stop> {
        let mut tail = TailBuffer::new(&self.selection);
        let sel = self.selection.clone();
        let mut keep = |l: LogLine| {
            if sel.admits(&l) {
                tail.push(l);
            }
        };
        let read = log.read_lines(&mut keep).await;
        self.check(read).await?;
        if !self.follow {
            log.finish(&mut keep);
        }
        for line in tail.into_lines() {
            self.emit(&line).await?;
        }
        if !self.follow {
            return Ok(());
        }
        self.follow(log).await
    }

    async fn follow(&mut self, log: &mut LogFile) -> Result<(), Stop> {
        let mut wake = Wake::new(&log.path);
        let mut last_check = Instant::now();
        loop {
            self.drain(log).await?;
            match log.change().await {
                FileChange::Same => {}
                FileChange::Truncated => {
                    let r = log.rewind().await;
                    self.check(r).await?;
                    continue;
                }
                FileChange::Replaced => {
                    // The old file is read to its end (writes may have
                    // landed after the last read), then the new one from
                    // its start; a path not yet recreated is retried.
                    if let Ok(mut new) = LogFile::open(log.path.clone()).await {
                        self.drain(log).await?;
                        new.joiner = std::mem::take(&mut log.joiner);
                        *log = new;
                        continue;
                    }
                }
            }
            if last_check.elapsed() >= STATE_CHECK {
                last_check = Instant::now();
                if !self.container_running().await {
                    tokio::time::sleep(EXIT_GRACE).await;
                    self.drain(log).await?;
                    let mut lines = Vec::new();
                    let sel = &self.selection;
                    log.finish(&mut |l| {
                        if sel.admits(&l) {
                            lines.push(l);
                        }
                    });
                    for l in &lines {
                        self.emit(l).await?;
                    }
                    return Ok(());
                }
            }
            let mut stopping = self.stopping.clone();
            tokio::select! {
                () = wake.wait() => {}
                () = self.tx.closed() => return Err(Stop),
                _ = stopping.wait_for(|s| *s) => return Err(Stop),
            }
        }
    }

    /// Reads what is new and writes it.
    async fn drain(&mut self, log: &mut LogFile) -> Result<(), Stop> {
        let mut lines = Vec::new();
        let sel = &self.selection;
        let r = log
            .read_lines(&mut |l| {
                if sel.admits(&l) {
                    lines.push(l);
                }
            })
            .await;
        self.check(r).await?;
        for l in &lines {
            self.emit(l).await?;
        }
        Ok(())
    }

    async fn emit(&mut self, line: &LogLine) -> Result<(), Stop> {
        let out = self.limit.take(line.render(self.selection.timestamps));
        if !out.is_empty() && self.tx.send(Ok(Bytes::from(out))).await.is_err() {
            return Err(Stop);
        }
        if self.limit.exhausted() {
            return Err(Stop);
        }
        Ok(())
    }

    /// Passes a read error to the client (the body ends with an error).
    async fn check(&self, r: std::io::Result<()>) -> Result<(), Stop> {
        match r {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(container = %self.container_id, error = %e, "reading container log failed");
                let _ = self.tx.send(Err(e)).await;
                Err(Stop)
            }
        }
    }

    /// Whether the container still runs; a runtime that cannot answer is
    /// asked again later.
    async fn container_running(&self) -> bool {
        match self.runtime.container_status(&self.container_id).await {
            Ok(s) => is_running(&s),
            Err(e) if e.is_not_found() => false,
            Err(_) => true,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
