//! ttRPC client and server over one logical connection of a [`Mux`].
//!
//! NRI uses each logical connection in one direction only (the runtime calls on
//! connection 1, the plugin on connection 2), so an endpoint is either a client or a
//! server. Both read their connection continuously in a task of their own, so a slow
//! handler never stops responses (or the other connection) from being read.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use thiserror::Error;
use tokio::sync::oneshot;

use crate::mux::{ConnId, ConnReader, Mux, MuxError};
use crate::ttrpc::{
    self, Code, Decoded, MessageDecoder, Request, Response, Status, TYPE_REQUEST, TYPE_RESPONSE,
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
    /// Starts reading responses from `reader`.
    pub(crate) fn start(mux: Mux, reader: ConnReader, service: &'static str) -> RpcClient {
        let conn = reader.conn();
        let pending: Pending = Arc::default();
        tokio::spawn(read_responses(reader, pending.clone()));
        RpcClient {
            mux,
            conn,
            service,
            next_stream: Arc::new(tokio::sync::Mutex::new(1)),
            pending,
        }
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

async fn read_responses(mut reader: ConnReader, pending: Pending) {
    let mut decoder = MessageDecoder::default();
    while let Some(chunk) = reader.recv().await {
        decoder.push(&chunk);
        while let Some(decoded) = decoder.next_message() {
            match decoded {
                Decoded::Message(h, payload) if h.kind == TYPE_RESPONSE => {
                    let resp = match Response::decode(payload) {
                        Ok(resp) => resp,
                        Err(e) => Response {
                            status: Some(Status::new(
                                Code::Internal,
                                format!("undecodable response envelope: {e}"),
                            )),
                            payload: Vec::new(),
                        },
                    };
                    let waiter = pending.lock().ok().and_then(|mut p| p.remove(&h.stream_id));
                    match waiter {
                        Some(tx) => {
                            let _ = tx.send(resp);
                        }
                        None => tracing::debug!(
                            stream = h.stream_id,
                            "nri: answer to a forgotten (timed out) call dropped"
                        ),
                    }
                }
                Decoded::Message(h, _) => tracing::warn!(
                    kind = h.kind,
                    stream = h.stream_id,
                    "nri: unexpected ttrpc message type on a client connection ignored"
                ),
                Decoded::Oversized(h) => {
                    let waiter = pending.lock().ok().and_then(|mut p| p.remove(&h.stream_id));
                    if let Some(tx) = waiter {
                        let _ = tx.send(Response {
                            status: Some(Status::new(
                                Code::ResourceExhausted,
                                format!("answer of {} bytes exceeds the ttRPC limit", h.length),
                            )),
                            payload: Vec::new(),
                        });
                    }
                }
            }
        }
    }
    // The trunk is gone: waking every caller with "disconnected" happens by dropping
    // their senders.
    if let Ok(mut pending) = pending.lock() {
        pending.clear();
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

/// Serves `service` on `reader`'s connection until the trunk closes. Each request runs
/// in its own task (at most [`MAX_IN_FLIGHT`] at once); a request's `timeout_nano`
/// bounds its handler.
pub(crate) async fn serve(
    mux: Mux,
    mut reader: ConnReader,
    service: &'static str,
    handler: Handler,
) {
    let conn = reader.conn();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut decoder = MessageDecoder::default();
    let mut last_stream = 0u32;
    while let Some(chunk) = reader.recv().await {
        decoder.push(&chunk);
        while let Some(decoded) = decoder.next_message() {
            match decoded {
                // Clients number streams odd and increasing, as ttRPC servers enforce.
                Decoded::Message(h, _)
                    if h.kind == TYPE_REQUEST
                        && (h.stream_id % 2 != 1 || h.stream_id <= last_stream) =>
                {
                    tracing::warn!(
                        stream = h.stream_id,
                        "nri: ttrpc request with an invalid stream id refused"
                    );
                    let resp = Err(Status::new(
                        Code::InvalidArgument,
                        "stream id must be odd and increasing",
                    ));
                    send_response(&mux, conn, h.stream_id, resp).await;
                }
                Decoded::Message(h, payload) if h.kind == TYPE_REQUEST => {
                    last_stream = h.stream_id;
                    let Ok(permit) = in_flight.clone().acquire_owned().await else {
                        return;
                    };
                    let mux = mux.clone();
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        let resp = answer(service, &handler, payload).await;
                        send_response(&mux, conn, h.stream_id, resp).await;
                        drop(permit);
                    });
                }
                Decoded::Message(h, _) => tracing::warn!(
                    kind = h.kind,
                    stream = h.stream_id,
                    "nri: unexpected ttrpc message type on a server connection ignored"
                ),
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
                        send_response(&mux, conn, h.stream_id, resp).await;
                    }
                }
            }
        }
    }
}

async fn answer(service: &str, handler: &Handler, payload: Bytes) -> Result<Vec<u8>, Status> {
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
    let call = handler(req.method, Bytes::from(req.payload));
    if req.timeout_nano > 0 {
        let timeout = Duration::from_nanos(req.timeout_nano as u64);
        tokio::time::timeout(timeout, call).await.map_err(|_| {
            Status::new(
                Code::DeadlineExceeded,
                "handler exceeded the caller's deadline",
            )
        })?
    } else {
        call.await
    }
}

async fn send_response(mux: &Mux, conn: ConnId, stream_id: u32, result: Result<Vec<u8>, Status>) {
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
