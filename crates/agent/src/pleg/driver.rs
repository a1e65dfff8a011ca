//! The PLEG's main loop: keeps the event stream connected (reconnecting
//! forever with capped backoff), runs relists at the right period (every
//! `relist_period` while no stream is connected, every
//! `event_relist_period` as a safety net while one is, and at once after
//! every connect), and hands events to the per-pod inspections.
//!
//! While the stream is connected and nothing happens, the loop sleeps on
//! the stream and the safety-net deadline only: no other wake-ups.
//!
//! Its state is a [`Driver`]: the stream's [`StreamState`] (a state
//! machine, below), the reconnect backoff and the next relist's time.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Pleg;
use crate::config::PlegMode;
use crate::cri::{CriError, CriResult, EventStream};

/// First reconnect delay.
pub(crate) const BACKOFF_INITIAL: Duration = Duration::from_millis(20);
/// Longest reconnect delay: a restarted runtime is picked up within it.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A connection that lasted this long was healthy: the backoff restarts.
pub(crate) const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);

/// How long subscribing may take (the runtime answers at once when well).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Capped exponential backoff.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Self {
            next: BACKOFF_INITIAL,
        }
    }

    /// The delay before the next attempt (doubling up to the cap).
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        d
    }

    pub(crate) fn reset(&mut self) {
        self.next = BACKOFF_INITIAL;
    }
}

/// The connected stream and what it achieved so far.
struct Connection {
    stream: EventStream,
    since: Instant,
    delivered: bool,
}

/// The runtime's event stream, as the driver sees it.
///
/// ```text
///                 connect fails (retry at now + backoff)
///                 +---------+
///                 v         |
///   start --> Disconnected -+--connect ok--> Connected
///    |            ^   |                        |
///    |            |   | UNIMPLEMENTED (auto)    | stream ends or fails
///    |            |   v                        |  (backoff reset if it was healthy)
///    |            |  Off <---------------------+ UNIMPLEMENTED before any event (auto)
///    |            +----------------------------+ otherwise
///    +--(relist mode)--> Off
/// ```
enum StreamState {
    /// No stream, for good: relist mode, or a runtime without events in
    /// auto mode. Relists every `relist_period`.
    Off,
    /// Not connected; the next attempt at `retry_at`. Relists every
    /// `relist_period` meanwhile.
    Disconnected { retry_at: Instant },
    /// Connected: its events are hints (each inspects its pod); a relist
    /// every `event_relist_period` is the safety net.
    Connected(Connection),
}

/// The driver's state between two turns of its loop.
struct Driver {
    stream: StreamState,
    /// Reconnect delays; kept across connections.
    backoff: Backoff,
    /// When the next relist is due (one at a time).
    next_relist: Instant,
    /// An events-mode runtime without events was warned about once.
    warned_unimplemented: bool,
}

/// What one turn of the loop woke up for.
enum Wake {
    /// Boxed: an event is large, and this value lives for one turn only.
    Event(Box<Option<CriResult<petrel_cri::api::ContainerEventResponse>>>),
    RelistDone(bool),
    Other,
}

impl Pleg {
    pub(crate) async fn run_loop(self) {
        let inner = &self.inner;
        let cfg = &inner.config;
        // Relist mode never subscribes; the others try the stream first so
        // the relist that follows covers everything before it.
        let mut d = Driver {
            stream: if cfg.mode == PlegMode::Relist {
                StreamState::Off
            } else {
                StreamState::Disconnected {
                    retry_at: Instant::now(),
                }
            },
            backoff: Backoff::new(),
            next_relist: Instant::now(),
            warned_unimplemented: false,
        };
        let mut relists: JoinSet<bool> = JoinSet::new();
        let mut tasks: JoinSet<()> = JoinSet::new();

        loop {
            if let StreamState::Disconnected { retry_at } = d.stream {
                if Instant::now() >= retry_at {
                    self.connect(&mut d).await;
                }
            }

            if relists.is_empty() && Instant::now() >= d.next_relist {
                let period = match d.stream {
                    StreamState::Connected(_) => cfg.event_relist_period,
                    _ => cfg.relist_period,
                };
                d.next_relist = Instant::now() + period;
                let pleg = self.clone();
                relists.spawn(async move { pleg.relist().await });
            }

            let retry_at = match d.stream {
                StreamState::Disconnected { retry_at } => Some(retry_at),
                _ => None,
            };
            let wake = tokio::select! {
                item = next_event(&mut d.stream) => Wake::Event(Box::new(item)),
                Some(done) = relists.join_next(), if !relists.is_empty() => {
                    Wake::RelistDone(matches!(done, Ok(true)))
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => Wake::Other,
                () = inner.relist_wanted.notified() => {
                    d.next_relist = Instant::now();
                    Wake::Other
                }
                () = sleep_until_some(retry_at) => Wake::Other,
                () = tokio::time::sleep_until(d.next_relist), if relists.is_empty() => Wake::Other,
            };
            match wake {
                Wake::Event(item) => match *item {
                    Some(Ok(ev)) => {
                        if let StreamState::Connected(c) = &mut d.stream {
                            c.delivered = true;
                        }
                        if let Some(task) = self.on_event(ev) {
                            tasks.spawn(task);
                        }
                    }
                    end => self.disconnected(&mut d, end),
                },
                Wake::RelistDone(ok) => {
                    if ok && !self.is_ready() {
                        let mode = match d.stream {
                            StreamState::Connected(_) => PlegMode::Events,
                            StreamState::Disconnected { .. } if cfg.mode == PlegMode::Events => {
                                PlegMode::Events
                            }
                            _ => PlegMode::Relist,
                        };
                        self.set_ready(mode);
                    }
                }
                Wake::Other => {}
            }
        }
    }

    /// Disconnected → Connected, Off or Disconnected (later).
    async fn connect(&self, d: &mut Driver) {
        let inner = &self.inner;
        let cfg = &inner.config;
        // Bounded: a wedged runtime must not stop the relists.
        let connect = tokio::time::timeout(CONNECT_TIMEOUT, inner.runtime.container_events());
        let connected = connect.await.unwrap_or_else(|_| {
            Err(CriError {
                operation: "get_container_events",
                code: tonic::Code::DeadlineExceeded,
                message: format!("no answer within {CONNECT_TIMEOUT:?}"),
            })
        });
        match connected {
            Ok(stream) => {
                inner.metrics.evented_pleg_connection_successes.inc();
                tracing::info!("pleg: runtime event stream connected");
                d.stream = StreamState::Connected(Connection {
                    stream,
                    since: Instant::now(),
                    delivered: false,
                });
                inner.health.set_event_stream(Some(cfg.event_relist_period));
                // Whatever happened while disconnected is found by a relist
                // started after the subscription.
                d.next_relist = Instant::now();
                if self.is_ready() {
                    self.set_ready(PlegMode::Events);
                }
            }
            Err(e) if e.is_unimplemented() && cfg.mode == PlegMode::Auto => {
                tracing::info!("pleg: the runtime has no event stream (GetContainerEvents unimplemented); relisting every {:?}", cfg.relist_period);
                self.stream_off(d);
            }
            Err(e) => {
                inner.metrics.evented_pleg_connection_errors.inc();
                if e.is_unimplemented() && !d.warned_unimplemented {
                    d.warned_unimplemented = true;
                    tracing::warn!("pleg: events mode asked but the runtime does not implement GetContainerEvents; relisting while retrying");
                } else {
                    tracing::debug!(error = %e, "pleg: event stream connect failed");
                }
                inner.note_runtime_error(&e);
                d.stream = StreamState::Disconnected {
                    retry_at: Instant::now() + d.backoff.next_delay(),
                };
            }
        }
    }

    /// Connected → Disconnected (or Off): the stream ended with `end`.
    fn disconnected(
        &self,
        d: &mut Driver,
        end: Option<CriResult<petrel_cri::api::ContainerEventResponse>>,
    ) {
        let inner = &self.inner;
        let cfg = &inner.config;
        let StreamState::Connected(c) = std::mem::replace(
            &mut d.stream,
            StreamState::Disconnected {
                retry_at: Instant::now(),
            },
        ) else {
            return;
        };
        let healthy = c.delivered || c.since.elapsed() >= BACKOFF_RESET_AFTER;
        if healthy {
            d.backoff.reset();
        }
        inner.health.set_event_stream(None);
        inner.metrics.evented_pleg_connection_errors.inc();
        match end {
            Some(Err(e)) if e.is_unimplemented() && !c.delivered && cfg.mode == PlegMode::Auto => {
                // Some runtimes accept the call and fail the stream.
                tracing::info!(
                    "pleg: the runtime has no event stream; relisting every {:?}",
                    cfg.relist_period
                );
                self.stream_off(d);
                d.next_relist = d.next_relist.min(Instant::now() + cfg.relist_period);
                return;
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "pleg: event stream broken; reconnecting");
                inner.note_runtime_error(&e);
            }
            _ => tracing::warn!("pleg: event stream ended; reconnecting"),
        }
        d.stream = StreamState::Disconnected {
            retry_at: Instant::now() + d.backoff.next_delay(),
        };
        // Relist at the disconnected pace until it is back.
        d.next_relist = d.next_relist.min(Instant::now() + cfg.relist_period);
    }

    /// → Off: relisting for good.
    fn stream_off(&self, d: &mut Driver) {
        d.stream = StreamState::Off;
        if self.is_ready() {
            self.set_ready(PlegMode::Relist);
        }
    }
}

/// The next item of the connected stream; pending in any other state.
async fn next_event(
    stream: &mut StreamState,
) -> Option<CriResult<petrel_cri::api::ContainerEventResponse>> {
    match stream {
        StreamState::Connected(c) => c.stream.next().await,
        _ => std::future::pending().await,
    }
}

/// Sleeps until `at`; pending forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
