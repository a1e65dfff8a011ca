//! The List calls without building messages: the RuntimeService's routes
//! with ListPodSandbox and ListContainers served from cached encodings.
//!
//! An agent's PLEG relists every second (kubelet's), so these two are the
//! hottest calls of a node. The generated service would build a message per
//! sandbox or container and encode them all on every call; here the
//! response is the concatenation of each selected object's encoding, cached
//! until its record changes (`Sandbox::listing`, `Container::listing`).
//! Every other method goes to the generated service unchanged.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic::Status;

use crate::error::RuntimeError;
use crate::server::container_list::list_containers_encoded;
use crate::server::sandbox_list::list_pod_sandbox_encoded;
use crate::service::Runtime;
use crate::state::State;

const LIST_CONTAINERS: &str = "/runtime.v1.RuntimeService/ListContainers";
const LIST_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/ListPodSandbox";

/// The RuntimeService with ListPodSandbox and ListContainers answered from
/// cached encodings.
#[derive(Debug, Clone)]
pub struct RuntimeRoutes<S> {
    inner: S,
    rt: Arc<Runtime>,
}

impl<S> RuntimeRoutes<S> {
    /// Wraps the generated service.
    pub fn new(inner: S, rt: Arc<Runtime>) -> Self {
        Self { inner, rt }
    }
}

impl<S> NamedService for RuntimeRoutes<S> {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}

impl<S, B> Service<http::Request<B>> for RuntimeRoutes<S>
where
    S: Service<
        http::Request<B>,
        Response = http::Response<tonic::body::BoxBody>,
        Error = Infallible,
        Future = BoxFuture<http::Response<tonic::body::BoxBody>, Infallible>,
    >,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let rt = self.rt.clone();
        match req.uri().path() {
            LIST_CONTAINERS => Box::pin(async move {
                Ok(answer(rt, "ListContainers", list_containers_encoded, req).await)
            }),
            LIST_POD_SANDBOX => Box::pin(async move {
                Ok(answer(rt, "ListPodSandbox", list_pod_sandbox_encoded, req).await)
            }),
            _ => self.inner.call(req),
        }
    }
}

/// Answers one List call with `list`'s encoded response.
async fn answer<Req, B>(
    rt: Arc<Runtime>,
    op: &'static str,
    list: fn(&State, &Req) -> Bytes,
    req: http::Request<B>,
) -> http::Response<tonic::body::BoxBody>
where
    Req: prost::Message + Default + Send + 'static,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    let mut grpc = tonic::server::Grpc::new(EncodedCodec::<Req>::default());
    grpc.unary(Encoded { rt, op, list }, req).await
}

/// A List call: the request decoded, the response already encoded.
struct Encoded<Req> {
    rt: Arc<Runtime>,
    op: &'static str,
    list: fn(&State, &Req) -> Bytes,
}

impl<Req: Send + 'static> UnaryService<Req> for Encoded<Req> {
    type Response = Bytes;
    type Future = BoxFuture<tonic::Response<Bytes>, Status>;

    fn call(&mut self, req: tonic::Request<Req>) -> Self::Future {
        let (rt, op, list) = (self.rt.clone(), self.op, self.list);
        Box::pin(async move {
            let Some(_call) = rt.enter_call() else {
                return Err(RuntimeError::Unavailable(
                    "the runtime is starting or shutting down".into(),
                )
                .into());
            };
            let start = Instant::now();
            let body = list(&rt.state, req.get_ref());
            rt.metrics.observe(op, start.elapsed(), false);
            tracing::trace!(op, "call done");
            Ok(tonic::Response::new(body))
        })
    }
}

/// Decodes requests (`Req`) with prost; sends already encoded responses as
/// they are.
#[derive(Debug)]
struct EncodedCodec<Req>(PhantomData<fn() -> Req>);

impl<Req> Default for EncodedCodec<Req> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<Req> Codec for EncodedCodec<Req>
where
    Req: prost::Message + Default + Send + 'static,
{
    type Encode = Bytes;
    type Decode = Req;
    type Encoder = EncodedCodec<Req>;
    type Decoder = EncodedCodec<Req>;

    fn encoder(&mut self) -> Self::Encoder {
        Self::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        Self::default()
    }
}

impl<Req: Send + 'static> Encoder for EncodedCodec<Req> {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl<Req> Decoder for EncodedCodec<Req>
where
    Req: prost::Message + Default + Send + 'static,
{
    type Item = Req;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Req>, Status> {
        Req::decode(src)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("decode request: {e}")))
    }
}
