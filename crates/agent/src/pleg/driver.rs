//! The PLEG's main loop: keeps the event stream connected (reconnecting
//! forever with capped backoff), runs relists at the right period (every
//! `relist_period` while no stream is connected, every
//! `event_relist_period` as a safety net while one is, and at once after
//! every connect), and hands events to the per-pod inspections.
//!
//! While the stream is connected and nothing happens, the loop sleeps on
//! the stream and the safety-net deadline only: no other wake-ups.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Pleg, MODE_EVENTS, MODE_RELIST};
use crate::config::PlegMode;
use crate::cri::EventStream;

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

impl Pleg {
    pub(crate) async fn run_loop(self) {
        let inner = &self.inner;
        let cfg = &inner.config;
        // Relist mode never subscribes; the others try the stream first so
        // the relist that follows covers everything before it.
        let mut stream_enabled = cfg.mode != PlegMode::Relist;
        let mut conn: Option<Connection> = None;
        let mut backoff = Backoff::new();
        let mut next_connect = Instant::now();
        let mut next_relist = Instant::now();
        let mut warned_unimplemented = false;
        let mut relists: JoinSet<bool> = JoinSet::new();
        let mut tasks: JoinSet<()> = JoinSet::new();

        loop {
            let now = Instant::now();
            if stream_enabled && conn.is_none() && now >= next_connect {
                // Bounded: a wedged runtime must not stop the relists.
                let connect =
                    tokio::time::timeout(CONNECT_TIMEOUT, inner.runtime.container_events());
                let connected = connect.await.unwrap_or_else(|_| {
                    Err(crate::cri::CriError {
                        operation: "get_container_events",
                        code: tonic::Code::DeadlineExceeded,
                        message: format!("no answer within {CONNECT_TIMEOUT:?}"),
                    })
                });
                match connected {
                    Ok(stream) => {
                        inner.metrics.evented_pleg_connection_successes.inc();
                        tracing::info!("pleg: runtime event stream connected");
                        conn = Some(Connection {
                            stream,
                            since: Instant::now(),
                            delivered: false,
                        });
                        inner.health.set_event_stream(Some(cfg.event_relist_period));
                        // Whatever happened while disconnected is found by a
                        // relist started after the subscription.
                        next_relist = Instant::now();
                        if inner.first_relist_done() {
                            inner.set_mode(MODE_EVENTS);
                        }
                    }
                    Err(e) if e.is_unimplemented() && cfg.mode == PlegMode::Auto => {
                        tracing::info!("pleg: the runtime has no event stream (GetContainerEvents unimplemented); relisting every {:?}", cfg.relist_period);
                        stream_enabled = false;
                        inner.set_mode(MODE_RELIST);
                    }
                    Err(e) => {
                        inner.metrics.evented_pleg_connection_errors.inc();
                        if e.is_unimplemented() && !warned_unimplemented {
                            warned_unimplemented = true;
                            tracing::warn!("pleg: events mode asked but the runtime does not implement GetContainerEvents; relisting while retrying");
                        } else {
                            tracing::debug!(error = %e, "pleg: event stream connect failed");
                        }
                        inner.note_runtime_error(&e);
                        next_connect = Instant::now() + backoff.next_delay();
                    }
                }
            }

            if relists.is_empty() && Instant::now() >= next_relist {
                let period = if conn.is_some() {
                    cfg.event_relist_period
                } else {
                    cfg.relist_period
                };
                next_relist = Instant::now() + period;
                let pleg = self.clone();
                relists.spawn(async move { pleg.relist().await });
            }

            let connected = conn.is_some();
            let waiting_connect = stream_enabled && !connected;
            tokio::select! {
                item = next_event(&mut conn), if connected => {
                    match item {
                        Some(Ok(ev)) => {
                            if let Some(c) = conn.as_mut() {
                                c.delivered = true;
                            }
                            if let Some(task) = self.on_event(ev) {
                                tasks.spawn(task);
                            }
                        }
                        end => {
                            let Some(c) = conn.take() else { continue };
                            let healthy = c.delivered || c.since.elapsed() >= BACKOFF_RESET_AFTER;
                            if healthy {
                                backoff.reset();
                            }
                            inner.health.set_event_stream(None);
                            inner.metrics.evented_pleg_connection_errors.inc();
                            match end {
                                Some(Err(e)) if e.is_unimplemented() && !c.delivered && cfg.mode == PlegMode::Auto => {
                                    // Some runtimes accept the call and fail the stream.
                                    tracing::info!("pleg: the runtime has no event stream; relisting every {:?}", cfg.relist_period);
                                    stream_enabled = false;
                                    inner.set_mode(MODE_RELIST);
                                }
                                Some(Err(e)) => {
                                    tracing::warn!(error = %e, "pleg: event stream broken; reconnecting");
                                    inner.note_runtime_error(&e);
                                }
                                _ => tracing::warn!("pleg: event stream ended; reconnecting"),
                            }
                            next_connect = Instant::now() + backoff.next_delay();
                            // Relist at the disconnected pace until it is back.
                            next_relist = next_relist.min(Instant::now() + cfg.relist_period);
                        }
                    }
                }
                Some(done) = relists.join_next(), if !relists.is_empty() => {
                    let ok = matches!(done, Ok(true));
                    if ok && !inner.first_relist_done() {
                        let mode = if stream_enabled && (conn.is_some() || cfg.mode == PlegMode::Events) {
                            MODE_EVENTS
                        } else {
                            MODE_RELIST
                        };
                        inner.set_mode(mode);
                        inner.set_first_relist_done();
                    }
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                () = inner.relist_wanted.notified() => {
                    next_relist = Instant::now();
                }
                () = tokio::time::sleep_until(next_connect), if waiting_connect => {}
                () = tokio::time::sleep_until(next_relist), if relists.is_empty() => {}
            }
        }
    }
}

async fn next_event(
    conn: &mut Option<Connection>,
) -> Option<crate::cri::CriResult<petrel_cri::api::ContainerEventResponse>> {
    match conn {
        Some(c) => c.stream.next().await,
        // Not polled without a connection (the branch is disabled).
        None => std::future::pending().await,
    }
}
