//! ListContainers without building messages: the RuntimeService's routes
//! with ListContainers served from per-container cached encodings.
//!
//! kubelet's PLEG relists every second, so ListContainers is the hottest
//! call of a node. The generated service would build a `Container` message
//! per container and encode them all on every call; here the response is
//! the concatenation of each container's encoding, cached until its record
//! changes (`Container::listing`). Every other method goes to the generated
//! service unchanged.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{BufMut, Bytes};
use petrel_cri::api;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic::Status;

use crate::error::RuntimeError;
use crate::service::Runtime;

const LIST_CONTAINERS: &str = "/runtime.v1.RuntimeService/ListContainers";

/// The RuntimeService with ListContainers answered from cached encodings.
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
        if req.uri().path() != LIST_CONTAINERS {
            return self.inner.call(req);
        }
        let rt = self.rt.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(EncodedCodec);
            Ok(grpc.unary(ListContainers(rt), req).await)
        })
    }
}

struct ListContainers(Arc<Runtime>);

impl UnaryService<api::ListContainersRequest> for ListContainers {
    type Response = Bytes;
    type Future = BoxFuture<tonic::Response<Bytes>, Status>;

    fn call(&mut self, req: tonic::Request<api::ListContainersRequest>) -> Self::Future {
        let rt = self.0.clone();
        Box::pin(async move {
            let Some(_call) = rt.enter_call() else {
                return Err(RuntimeError::Unavailable(
                    "the runtime is starting or shutting down".into(),
                )
                .into());
            };
            let start = Instant::now();
            let body = rt.list_containers_encoded(req.get_ref());
            rt.metrics.observe("ListContainers", start.elapsed(), false);
            tracing::trace!(op = "ListContainers", "call done");
            Ok(tonic::Response::new(body))
        })
    }
}

/// Decodes requests with prost; sends already encoded responses as they are.
#[derive(Debug, Clone, Copy, Default)]
struct EncodedCodec;

impl Codec for EncodedCodec {
    type Encode = Bytes;
    type Decode = api::ListContainersRequest;
    type Encoder = EncodedCodec;
    type Decoder = EncodedCodec;

    fn encoder(&mut self) -> Self::Encoder {
        EncodedCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        EncodedCodec
    }
}

impl Encoder for EncodedCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for EncodedCodec {
    type Item = api::ListContainersRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        prost::Message::decode(src)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("decode ListContainersRequest: {e}")))
    }
}
