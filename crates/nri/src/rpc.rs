//! ttRPC client and server over one logical connection of a [`Mux`].
//!
//! NRI uses each logical connection in one direction only (the runtime calls on
//! connection 1, the plugin on connection 2), so an endpoint is either a client or a
//! server. Both decode their connection's bytes as the trunk's reader task hands them
//! over ([`Sink`]): an answer goes straight to its waiting caller, a request's handler
//! is polled once right there and gets a task of its own only if it has to wait, so a
//! slow handler never stops responses (or the other connection) from being read, and
//! a quick one costs no task switch.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex as StdMutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use thiserror::Error;
use tokio::sync::oneshot;

use crate::mux::{ConnId, Mux, MuxError, Sink, SinkWait};
use crate::ttrpc::{
    self, Code, Decoded, MessageDecoder, MessageHeader, Request, Response, Status, TYPE_REQUEST,
    TYPE_RESPONSE,
};

/// Why a call failed.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum RpcError {
    /// The peer answered with a non-OK status.
    #[error("{method}: peer returned {code:?}: {message}")]
    Status {
        /// Method called.
        method: String,
        /// Status code (see [`Code`]); kept raw so unknown codes survive.
        code: i32,
        /// Peer's message.
        message: String,
    },
    /// No answer within the call's timeout.
    #[error("{method}: no answer within {timeout:?}")]
    Timeout {
        /// Method called.
        method: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The connection is gone.
    #[error("{method}: connection lost: {cause}")]
    Disconnected {
        /// Method called.
        method: String,
        /// Why the trunk stopped.
        cause: MuxError,
    },
    /// The request would exceed the ttRPC message limit.
    #[error("{method}: request of {len} bytes exceeds the ttRPC limit of {max} bytes")]
    TooLarge {
        /// Method called.
        method: String,
        /// Encoded request size.
        len: usize,
        /// [`ttrpc::MAX_MESSAGE_LEN`].
        max: usize,
    },
    /// The answer could not be decoded.
    #[error("{method}: undecodable answer: {reason}")]
    Decode {
        /// Method called.
        method: String,
        /// Decoder's message.
        reason: String,
    },
}

impl RpcError {
    /// The status code if the peer answered with one.
    pub fn code(&self) -> Option<i32> {
        match self {
            RpcError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the peer does not know the method (an older plugin or runtime).
    pub fn is_unimplemented(&self) -> bool {
        self.code() == Some(Code::Unimplemented as i32)
    }
}

type Pending = Arc<StdMutex<HashMap<u32, oneshot::Sender<Response>>>>;

/// Client end of a logical connection.
#[derive(Clone)]
pub(crate) struct RpcClient {
    mux: Mux,
    conn: ConnId,
    service: &'static str,
    next_stream: Arc<tokio::sync::Mutex<u32>>,
    pending: Pending,
}

impl RpcClient {
    /// A client calling `service` on connection `conn` of `mux`, and the sink the
    /// connection's bytes must go to (see [`crate::mux::Reading::start`]).
    pub(crate) fn new(mux: Mux, conn: ConnId, service: &'static str) -> (RpcClient, ClientSink) {
        let pending: Pending = Arc::default();
        let sink = ClientSink {
            decoder: MessageDecoder::default(),
            pending: pending.clone(),
        };
        let client = RpcClient {
            mux,
            conn,
            service,
            next_stream: Arc::new(tokio::sync::Mutex::new(1)),
            pending,
        };
        (client, sink)
    }

    /// Calls `method` with `req`; waits at most `timeout` (if given) for the answer. On
    /// timeout the call is forgotten: a late answer is dropped.
    pub(crate) async fn call<Req: Message, Resp: Message + Default>(
        &self,
        method: &str,
        req: &Req,
        timeout: Option<Duration>,
    ) -> Result<Resp, RpcError> {
        let envelope = Request {
            service: self.service.to_string(),
            method: method.to_string(),
            payload: req.encode_to_vec(),
            timeout_nano: timeout
                .map(|t| i64::try_from(t.as_nanos()).unwrap_or(i64::MAX))
                .unwrap_or(0),
            metadata: Vec::new(),
        };
        let payload = envelope.encode_to_vec();
        if payload.len() > ttrpc::MAX_MESSAGE_LEN {
            return Err(RpcError::TooLarge {
                method: method.to_string(),
                len: payload.len(),
                max: ttrpc::MAX_MESSAGE_LEN,
            });
        }
        let disconnected = |cause: MuxError| RpcError::Disconnected {
            method: method.to_string(),
            cause,
        };
        let exchange = async {
            // Stream ids are taken and written in one critical section: ttRPC servers
            // refuse an id lower than one they have already seen, so concurrent calls
            // must reach the wire in id order (Go's client does the same).
            let (rx, _forget) = {
                let mut next = self.next_stream.lock().await;
                let stream_id = *next;
                *next = next.wrapping_add(2);
                let (tx, rx) = oneshot::channel();
                if let Ok(mut pending) = self.pending.lock() {
                    pending.insert(stream_id, tx);
                }
                let forget = ForgetOnDrop {
                    pending: &self.pending,
                    stream_id,
                };
                let message = ttrpc::encode_message(stream_id, TYPE_REQUEST, &payload);
                self.mux
                    .write_parts(self.conn, &crate::mux::ttrpc_message_parts(&message))
                    .await
                    .map_err(disconnected)?;
                (rx, forget)
            };
            match rx.await {
                Ok(resp) => Ok(resp),
                Err(_) => Err(disconnected(self.mux.error().unwrap_or(MuxError::Closed))),
            }
        };
        let resp = match timeout {
            Some(t) => {
                tokio::time::timeout(t, exchange)
                    .await
                    .map_err(|_| RpcError::Timeout {
                        method: method.to_string(),
                        timeout: t,
                    })??
            }
            None => exchange.await?,
        };
        if let Some(status) = resp.status.filter(|s| s.code != Code::Ok as i32) {
            return Err(RpcError::Status {
                method: method.to_string(),
                code: status.code,
                message: status.message,
            });
        }
        Resp::decode(&resp.payload[..]).map_err(|e| RpcError::Decode {
            method: method.to_string(),
            reason: e.to_string(),
        })
    }
}

/// Removes a call from the pending table however the call ends (answer, timeout, or
/// the caller's future being dropped), so the table cannot grow with abandoned calls.
struct ForgetOnDrop<'a> {
    pending: &'a Pending,
    stream_id: u32,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(&self.stream_id);
        }
    }
}

/// Hands each answer on a client connection to its waiting caller.
pub(crate) struct ClientSink {
    decoder: MessageDecoder,
    pending: Pending,
}

impl ClientSink {
    fn answer(&self, stream_id: u32, resp: Response) {
        let waiter = self
            .pending
            .lock()
            .ok()
            .and_then(|mut p| p.remove(&stream_id));
        match waiter {
            Some(tx) => {
                let _ = tx.send(resp);
            }
            None => tracing::debug!(
                stream = stream_id,
                "nri: answer to a forgotten (timed out) call dropped"
            ),
        }
    }
}

impl Sink for ClientSink {
    fn push<'a>(&'a mut self, _mux: &'a Mux, data: Bytes) -> Option<SinkWait<'a>> {
        self.decoder.push(&data);
        while let Some(decoded) = self.decoder.next_message() {
            match decoded {
                Decoded::Message(h, payload) if h.kind == TYPE_RESPONSE => {
                    let resp = Response::decode(payload).unwrap_or_else(|e| Response {
                        status: Some(Status::new(
                            Code::Internal,
                            format!("undecodable response envelope: {e}"),
                        )),
                        payload: Vec::new(),
                    });
                    self.answer(h.stream_id, resp);
                }
                Decoded::Message(h, _) => tracing::warn!(
                    kind = h.kind,
                    stream = h.stream_id,
                    "nri: unexpected ttrpc message type on a client connection ignored"
                ),
                Decoded::Oversized(h) => self.answer(
                    h.stream_id,
                    Response {
                        status: Some(Status::new(
                            Code::ResourceExhausted,
                            format!("answer of {} bytes exceeds the ttRPC limit", h.length),
                        )),
                        payload: Vec::new(),
                    },
                ),
            }
        }
        None
    }
}

impl Drop for ClientSink {
    /// The trunk is gone: every waiting caller learns it as its sender is dropped.
    fn drop(&mut self) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.clear();
        }
    }
}

/// Future a server handler returns: the encoded result or an error status.
pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, Status>> + Send>>;

/// A service implementation: method name and encoded argument in, encoded result out.
pub(crate) type Handler = Arc<dyn Fn(String, Bytes) -> HandlerFuture + Send + Sync>;

/// Requests one connection may have in progress at once. Past that the server stops
/// reading the connection until one finishes, so a flooding peer fills its own queue
/// instead of the process's memory with tasks.
pub(crate) const MAX_IN_FLIGHT: usize = 64;

/// Serves `service` on one connection: the sink its bytes must go to. Each request's
/// handler is polled once as it arrives; one that has to wait continues in a task of
/// its own (at most [`MAX_IN_FLIGHT`] at once). A request's `timeout_nano` bounds its
/// handler.
pub(crate) fn server(conn: ConnId, service: &'static str, handler: Handler) -> ServerSink {
    ServerSink {
        conn,
        service,
        handler,
        decoder: MessageDecoder::default(),
        last_stream: 0,
        in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
    }
}

/// The server side of a connection, see [`server`].
pub(crate) struct ServerSink {
    conn: ConnId,
    service: &'static str,
    handler: Handler,
    decoder: MessageDecoder,
    last_stream: u32,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl Sink for ServerSink {
    fn push<'a>(&'a mut self, mux: &'a Mux, data: Bytes) -> Option<SinkWait<'a>> {
        self.decoder.push(&data);
        while let Some(decoded) = self.decoder.next_message() {
            let Some((h, payload)) = self.check(mux, decoded) else {
                continue;
            };
            match self.in_flight.clone().try_acquire_owned() {
                Ok(permit) => self.run(mux, h, payload, permit),
                // Every slot is busy: the trunk waits until one frees.
                Err(_) => return Some(Box::pin(self.wait_and_run(mux, h, payload))),
            }
        }
        None
    }
}

impl ServerSink {
    /// A request to run, or None when the message was answered or ignored here.
    fn check(&mut self, mux: &Mux, decoded: Decoded) -> Option<(MessageHeader, Bytes)> {
        match decoded {
            // Clients number streams odd and increasing, as ttRPC servers enforce.
            Decoded::Message(h, _)
                if h.kind == TYPE_REQUEST
                    && (h.stream_id % 2 != 1 || h.stream_id <= self.last_stream) =>
            {
                tracing::warn!(
                    stream = h.stream_id,
                    "nri: ttrpc request with an invalid stream id refused"
                );
                let resp = Err(Status::new(
                    Code::InvalidArgument,
                    "stream id must be odd and increasing",
                ));
                respond_later(mux, self.conn, h.stream_id, resp);
                None
            }
            Decoded::Message(h, payload) if h.kind == TYPE_REQUEST => {
                self.last_stream = h.stream_id;
                Some((h, payload))
            }
            Decoded::Message(h, _) => {
                tracing::warn!(
                    kind = h.kind,
                    stream = h.stream_id,
                    "nri: unexpected ttrpc message type on a server connection ignored"
                );
                None
            }
            Decoded::Oversized(h) => {
                tracing::warn!(
                    len = h.length,
                    "nri: oversized ttrpc request refused with RESOURCE_EXHAUSTED"
                );
                if h.kind == TYPE_REQUEST {
                    let resp = Err(Status::new(
                        Code::ResourceExhausted,
                        format!(
                            "message length {} exceeds maximum message size of {}",
                            h.length,
                            ttrpc::MAX_MESSAGE_LEN
                        ),
                    ));
                    respond_later(mux, self.conn, h.stream_id, resp);
                }
                None
            }
        }
    }

    /// Waits for a free slot, runs the request, then whatever else is decoded.
    async fn wait_and_run(&mut self, mux: &Mux, h: MessageHeader, payload: Bytes) {
        let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
            return;
        };
        self.run(mux, h, payload, permit);
        while let Some(decoded) = self.decoder.next_message() {
            let Some((h, payload)) = self.check(mux, decoded) else {
                continue;
            };
            let Ok(permit) = self.in_flight.clone().acquire_owned().await else {
                return;
            };
            self.run(mux, h, payload, permit);
        }
    }

    /// Polls the handler once here; a handler that must wait, and an answer the
    /// socket cannot take at once, continue in a task holding the slot.
    fn run(
        &self,
        mux: &Mux,
        h: MessageHeader,
        payload: Bytes,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let conn = self.conn;
        let arrived = tokio::time::Instant::now();
        let (mut call, timeout) = match start_call(self.service, &self.handler, payload) {
            Ok(started) => started,
            Err(status) => {
                respond_later(mux, conn, h.stream_id, Err(status));
                return;
            }
        };
        let mut cx = Context::from_waker(Waker::noop());
        if let Poll::Ready(resp) = call.as_mut().poll(&mut cx) {
            let mut send = Box::pin(send_response(mux.clone(), conn, h.stream_id, resp));
            if send.as_mut().poll(&mut cx).is_ready() {
                return;
            }
            tokio::spawn(async move {
                send.await;
                drop(permit);
            });
            return;
        }
        // Polled once with a no-op waker: the task polls it again at once, with its own.
        // Only a handler that waits needs the caller's deadline as a timer.
        let mux = mux.clone();
        tokio::spawn(async move {
            let resp = match timeout {
                Some(t) => tokio::time::timeout_at(arrived + t, call)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Status::new(
                            Code::DeadlineExceeded,
                            "handler exceeded the caller's deadline",
                        ))
                    }),
                None => call.await,
            };
            send_response(mux, conn, h.stream_id, resp).await;
            drop(permit);
        });
    }
}

/// Refusals decided by the reader are sent from a task of their own.
fn respond_later(mux: &Mux, conn: ConnId, stream_id: u32, resp: Result<Vec<u8>, Status>) {
    tokio::spawn(send_response(mux.clone(), conn, stream_id, resp));
}

/// Decodes a request's envelope and starts its handler: the handler's future and
/// the caller's deadline, if it gave one.
fn start_call(
    service: &str,
    handler: &Handler,
    payload: Bytes,
) -> Result<(HandlerFuture, Option<Duration>), Status> {
    let req = Request::decode(payload).map_err(|e| {
        Status::new(
            Code::InvalidArgument,
            format!("undecodable request envelope: {e}"),
        )
    })?;
    if req.service != service {
        return Err(Status::new(
            Code::Unimplemented,
            format!("service {}: not implemented", req.service),
        ));
    }
    let timeout = u64::try_from(req.timeout_nano)
        .ok()
        .filter(|&n| n > 0)
        .map(Duration::from_nanos);
    Ok((handler(req.method, Bytes::from(req.payload)), timeout))
}

async fn send_response(mux: Mux, conn: ConnId, stream_id: u32, result: Result<Vec<u8>, Status>) {
    let mut resp = match result {
        Ok(payload) => Response {
            status: Some(Status::new(Code::Ok, "")),
            payload,
        },
        Err(status) => Response {
            status: Some(status),
            payload: Vec::new(),
        },
    };
    let mut encoded = resp.encode_to_vec();
    if encoded.len() > ttrpc::MAX_MESSAGE_LEN {
        resp = Response {
            status: Some(Status::new(
                Code::ResourceExhausted,
                format!("answer of {} bytes exceeds the ttRPC limit", encoded.len()),
            )),
            payload: Vec::new(),
        };
        encoded = resp.encode_to_vec();
    }
    let message = ttrpc::encode_message(stream_id, TYPE_RESPONSE, &encoded);
    let parts = crate::mux::ttrpc_message_parts(&message);
    if let Err(e) = mux.write_parts(conn, &parts).await {
        tracing::debug!(error = %e, "nri: answer not sent, connection gone");
    }
}

/// Decodes a request argument for a handler.
pub(crate) fn decode_arg<T: Message + Default>(method: &str, payload: Bytes) -> Result<T, Status> {
    T::decode(payload).map_err(|e| {
        Status::new(
            Code::InvalidArgument,
            format!("{method}: undecodable argument: {e}"),
        )
    })
}

/// Unknown-method answer, worded as ttRPC servers word it.
pub(crate) fn unimplemented(service: &str, method: &str) -> Status {
    Status::new(
        Code::Unimplemented,
        format!("{service}.{method}: method not implemented"),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::UnixStream;

    /// A client on one end of a socketpair calling a server on the other, both on
    /// connection 1.
    fn pair(handler: Handler) -> (RpcClient, Mux) {
        let (a, b) = UnixStream::pair().unwrap();
        let (ma, reading_a) = Mux::open(a, &[1]).unwrap();
        let (mb, reading_b) = Mux::open(b, &[1]).unwrap();
        let (client, answers) = RpcClient::new(ma, 1, "svc");
        reading_a.start(vec![(1, Box::new(answers))]).unwrap();
        reading_b
            .start(vec![(1, Box::new(server(1, "svc", handler)))])
            .unwrap();
        (client, mb)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn busy_server_stops_reading_at_the_in_flight_limit_and_catches_up() {
        let started = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let handler: Handler = {
            let (started, gate) = (started.clone(), gate.clone());
            Arc::new(move |_method, payload: Bytes| -> HandlerFuture {
                let (started, gate) = (started.clone(), gate.clone());
                Box::pin(async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    // Waits: the handler continues in a task of its own.
                    gate.acquire().await.unwrap().forget();
                    Ok(payload.to_vec())
                })
            })
        };
        let (client, _server) = pair(handler);
        let total = MAX_IN_FLIGHT + 6;
        let calls: Vec<_> = (0..total)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let req = ttrpc::Status::new(Code::Ok, format!("call {i}"));
                    client
                        .call::<_, ttrpc::Status>("Echo", &req, None)
                        .await
                        .map(|s| s.message)
                })
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while started.load(Ordering::SeqCst) < MAX_IN_FLIGHT && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(started.load(Ordering::SeqCst), MAX_IN_FLIGHT);
        gate.add_permits(total);
        for (i, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap().unwrap(), format!("call {i}"));
        }
        assert_eq!(started.load(Ordering::SeqCst), total);
    }

    #[tokio::test]
    async fn quick_and_failing_handlers_answer_and_a_closed_trunk_wakes_callers() {
        let handler: Handler = Arc::new(|method: String, payload: Bytes| -> HandlerFuture {
            Box::pin(async move {
                match method.as_str() {
                    "Echo" => Ok(payload.to_vec()),
                    other => Err(unimplemented("svc", other)),
                }
            })
        });
        let (client, server) = pair(handler);
        let req = ttrpc::Status::new(Code::Ok, "hello");
        let got: ttrpc::Status = client
            .call("Echo", &req, Some(Duration::from_secs(1)))
            .await
            .unwrap();
        assert_eq!(got.message, "hello");
        let e = client
            .call::<_, ttrpc::Status>("Nope", &req, None)
            .await
            .unwrap_err();
        assert!(e.is_unimplemented(), "{e}");
        server.close().await;
        let e = client
            .call::<_, ttrpc::Status>("Echo", &req, Some(Duration::from_secs(5)))
            .await
            .unwrap_err();
        assert!(matches!(e, RpcError::Disconnected { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_handler_past_the_callers_deadline_answers_deadline_exceeded() {
        let handler: Handler = Arc::new(|_method, _payload| -> HandlerFuture {
            Box::pin(async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Vec::new())
            })
        });
        let (a, b) = UnixStream::pair().unwrap();
        // The caller: raw frames, no deadline of its own, so only the server's counts.
        let (ma, mut readers) = Mux::start(a, &[1], crate::mux::MuxOptions::default()).unwrap();
        let (_mb, reading_b) = Mux::open(b, &[1]).unwrap();
        reading_b
            .start(vec![(1, Box::new(server(1, "svc", handler)))])
            .unwrap();
        let req = Request {
            service: "svc".into(),
            method: "Slow".into(),
            payload: Vec::new(),
            timeout_nano: 100_000_000,
            metadata: Vec::new(),
        };
        let t0 = std::time::Instant::now();
        let message = ttrpc::encode_message(1, TYPE_REQUEST, &req.encode_to_vec());
        ma.write(1, &message).await.unwrap();
        let mut decoder = MessageDecoder::default();
        let resp = loop {
            let chunk = tokio::time::timeout(Duration::from_secs(5), readers[0].recv())
                .await
                .unwrap()
                .unwrap();
            decoder.push(&chunk);
            if let Some(Decoded::Message(h, payload)) = decoder.next_message() {
                assert_eq!((h.stream_id, h.kind), (1, TYPE_RESPONSE));
                break Response::decode(payload).unwrap();
            }
        };
        let status = resp.status.unwrap();
        assert_eq!(status.code, Code::DeadlineExceeded as i32, "{status:?}");
        assert!((Duration::from_millis(100)..Duration::from_secs(5)).contains(&t0.elapsed()));
    }
}
