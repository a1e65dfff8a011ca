//! The List calls without building messages: the RuntimeService's routes
//! with ListPodSandbox and ListContainers served from cached encodings.
//!
//! An agent's PLEG relists every second (kubelet's), so these two are the
//! hottest calls of a node. The generated service would build a message per
//! sandbox or container and encode them all on every call; here the
//! response is the concatenation of each selected object's encoding, cached
//! until its record changes (`Sandbox::listing`, `Container::listing`), and
//! the unfiltered answer is cached whole. That answer is handed to hyper as
//! it is, behind its 5-byte gRPC prefix, so a relist copies nothing in the
//! runtime: the request is still decoded by tonic's framing code, with its
//! limits. Every other method goes to the generated service unchanged.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use tonic::codec::{DecodeBuf, Decoder, Streaming};
use tonic::codegen::{http, Body, BoxFuture, Service, StdError};
use tonic::server::NamedService;
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
    let listed = async {
        let req = request_message::<Req, B>(req).await?;
        let Some(_call) = rt.enter_call() else {
            return Err(Status::from(RuntimeError::Unavailable(
                "the runtime is starting or shutting down".into(),
            )));
        };
        let start = Instant::now();
        let body = list(&rt.state, &req);
        rt.metrics.observe(op, start.elapsed(), false);
        tracing::trace!(op, "call done");
        Ok(body)
    };
    match listed.await {
        Ok(message) => response(message),
        Err(status) => status.into_http(),
    }
}

/// The one message of a unary request, decoded with tonic's framing rules
/// and limits. The server enables no compression, so a compressed request
/// is refused as tonic's generated services refuse it.
async fn request_message<Req, B>(req: http::Request<B>) -> Result<Req, Status>
where
    Req: prost::Message + Default + Send + 'static,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    if let Some(encoding) = req.headers().get(GRPC_ENCODING) {
        if encoding.as_bytes() != b"identity" {
            return Err(Status::unimplemented(format!(
                "request compressed with {encoding:?}, which this server does not support"
            )));
        }
    }
    let mut stream = Streaming::new_request(
        RequestDecoder::<Req>(PhantomData),
        req.into_body(),
        None,
        Some(MAX_REQUEST_BYTES),
    );
    stream
        .message()
        .await?
        .ok_or_else(|| Status::internal("missing request message"))
}

/// The largest request accepted: tonic's default for its services.
const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

const GRPC_ENCODING: &str = "grpc-encoding";

/// A successful unary response carrying `message`, already encoded.
///
/// The message goes to hyper as the very `Bytes` the cache holds: going
/// through tonic's encoder would copy it into a new buffer on every call,
/// a third of a megabyte per relist at a thousand containers.
fn response(message: Bytes) -> http::Response<tonic::body::BoxBody> {
    let Ok(len) = u32::try_from(message.len()) else {
        return Status::resource_exhausted(format!(
            "the response takes {} bytes, over gRPC's 4 GiB limit",
            message.len()
        ))
        .into_http();
    };
    let mut prefix = BytesMut::with_capacity(5);
    prefix.put_u8(0); // not compressed
    prefix.put_u32(len);
    let body = EncodedMessage {
        prefix: Some(prefix.freeze()),
        message: (!message.is_empty()).then_some(message),
        trailers: true,
    };
    let mut res = http::Response::new(tonic::body::boxed(body));
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    res
}

/// The body of a successful unary response: the gRPC frame of one message
/// (prefix, then the message itself), then `grpc-status: 0`.
struct EncodedMessage {
    prefix: Option<Bytes>,
    message: Option<Bytes>,
    trailers: bool,
}

impl Body for EncodedMessage {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(data) = this.prefix.take().or_else(|| this.message.take()) {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut this.trailers) {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.message.is_none() && !self.trailers
    }
}

/// Decodes requests (`Req`) with prost.
struct RequestDecoder<Req>(PhantomData<fn() -> Req>);

impl<Req> Decoder for RequestDecoder<Req>
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

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use petrel_cri::api;
    use prost::Message;

    fn request(
        body: Vec<u8>,
        encoding: Option<&str>,
    ) -> http::Request<http_body_util::Full<Bytes>> {
        let mut req = http::Request::new(http_body_util::Full::new(Bytes::from(body)));
        if let Some(e) = encoding {
            req.headers_mut().insert(
                GRPC_ENCODING,
                http::HeaderValue::from_str(e)
                    .unwrap_or_else(|_| http::HeaderValue::from_static("x")),
            );
        }
        req
    }

    fn framed(message: &[u8], compressed: bool) -> Vec<u8> {
        let mut out = vec![u8::from(compressed)];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    #[tokio::test]
    async fn a_request_message_should_be_decoded_from_its_grpc_frame() {
        let sent = api::ListContainersRequest {
            filter: Some(api::ContainerFilter {
                id: "abc".into(),
                ..Default::default()
            }),
        };
        let got: api::ListContainersRequest = request_message(request(
            framed(&sent.encode_to_vec(), false),
            Some("identity"),
        ))
        .await
        .expect("decoded");
        assert_eq!(got, sent);
        // An empty message (all defaults) is a message too.
        let got: api::ListContainersRequest = request_message(request(framed(&[], false), None))
            .await
            .expect("decoded");
        assert_eq!(got, Default::default());
    }

    #[tokio::test]
    async fn bad_requests_should_get_the_status_that_names_the_problem() {
        let code =
            |r: Result<api::ListContainersRequest, Status>| r.map(|_| ()).err().map(|s| s.code());
        assert_eq!(
            code(request_message(request(framed(&[], true), Some("gzip"))).await),
            Some(tonic::Code::Unimplemented)
        );
        assert_eq!(
            code(request_message(request(vec![], None)).await),
            Some(tonic::Code::Internal),
            "no message"
        );
        assert_eq!(
            code(request_message(request(framed(&[0x0a, 0x05, 0x01], false), None)).await),
            Some(tonic::Code::InvalidArgument),
            "truncated field"
        );
        let mut huge = vec![0u8];
        huge.extend_from_slice(&(MAX_REQUEST_BYTES as u32 + 1).to_be_bytes());
        assert_eq!(
            code(request_message(request(huge, None)).await),
            Some(tonic::Code::OutOfRange),
            "over the size limit"
        );
    }

    #[tokio::test]
    async fn a_response_should_be_one_grpc_frame_then_an_ok_status() {
        let message = api::ListContainersResponse {
            containers: vec![api::Container {
                id: "c1".into(),
                ..Default::default()
            }],
        }
        .encode_to_vec();
        let res = response(Bytes::from(message.clone()));
        assert_eq!(
            res.headers()[http::header::CONTENT_TYPE],
            "application/grpc"
        );
        let collected = res.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(collected.to_bytes().to_vec(), framed(&message, false));
        // An empty list is an empty message: the prefix alone.
        let collected = response(Bytes::new())
            .into_body()
            .collect()
            .await
            .expect("body");
        assert_eq!(collected.to_bytes().to_vec(), framed(&[], false));
    }

    // The fast path against the typed path: for any set of sandboxes and
    // containers and any filter, the hand-framed answer decodes to exactly
    // the typed handler's answer, both taken over HTTP from the services.

    use crate::parts::fake::TestRuntime;
    use crate::records::{ContainerState, SandboxState};
    use crate::server::container_list::tests::record as container_record;
    use crate::server::sandbox_list::tests::record as sandbox_record;
    use crate::server::CriServer;
    use crate::state::{Container, Sandbox};
    use petrel_cri::api::runtime_service_server::RuntimeServiceServer;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// One pod of a generated node: its state, `app` label, creation time
    /// and its containers (state, `app` label, `tier` label, creation time).
    type PodCase = (u8, u8, i64, Vec<(u8, u8, Option<u8>, i64)>);

    const APPS: [&str; 3] = ["web", "db", "cache"];

    fn sandbox_state(n: u8) -> SandboxState {
        [
            SandboxState::Ready,
            SandboxState::NotReady,
            SandboxState::Creating,
        ][usize::from(n % 3)]
    }

    fn container_state(n: u8) -> ContainerState {
        [
            ContainerState::Creating,
            ContainerState::Created,
            ContainerState::Running,
            ContainerState::Exited,
        ][usize::from(n % 4)]
    }

    /// Puts the generated pods in `rt`'s state; returns the sandbox and
    /// container ids.
    fn fill(rt: &Runtime, pods: &[PodCase]) -> (Vec<String>, Vec<String>) {
        let (mut sandboxes, mut containers) = (Vec::new(), Vec::new());
        for (p, (state, app, created, ctrs)) in pods.iter().enumerate() {
            let id = format!("{p:02x}5a{p:02x}");
            let mut sb = sandbox_record(
                &id,
                sandbox_state(*state),
                *created,
                APPS[usize::from(*app % 3)],
            );
            sb.id.clone_from(&id);
            rt.state.insert_sandbox(Arc::new(Sandbox::new(sb)));
            for (c, (state, app, tier, created)) in ctrs.iter().enumerate() {
                let cid = format!("{p:02x}c{c:02x}");
                let mut r = container_record(&cid, *created);
                r.sandbox_id.clone_from(&id);
                r.state = container_state(*state);
                r.config.labels =
                    HashMap::from([("app".into(), APPS[usize::from(*app % 3)].into())]);
                if let Some(t) = tier {
                    r.config.labels.insert("tier".into(), format!("t{}", t % 2));
                }
                rt.state.insert_container(Arc::new(Container::new(r)));
                containers.push(cid);
            }
            sandboxes.push(id);
        }
        (sandboxes, containers)
    }

    /// An id filter from a pick: none, a known id, a prefix of one (unique
    /// or not), or an unknown id.
    fn pick_id(ids: &[String], pick: u8) -> String {
        let Some(id) = ids.get(usize::from(pick / 4) % ids.len().max(1)) else {
            return if pick % 4 == 3 {
                "ffff".into()
            } else {
                String::new()
            };
        };
        match pick % 4 {
            0 => String::new(),
            1 => id.clone(),
            2 => id[..2].to_string(),
            _ => "ffff".into(),
        }
    }

    fn selector(pick: u8) -> HashMap<String, String> {
        // 0: no app label, 1..=3: one of APPS; 0: no tier, 1..=2: t0, t1.
        let (app, tier) = (usize::from(pick % 4), pick / 4 % 3);
        let mut labels = HashMap::new();
        if let Some(app) = app.checked_sub(1) {
            labels.insert("app".into(), APPS[app].into());
        }
        if let Some(tier) = tier.checked_sub(1) {
            labels.insert("tier".into(), format!("t{tier}"));
        }
        labels
    }

    /// The one message of a unary gRPC answer from `svc`.
    async fn call<S>(svc: &mut S, path: &str, message: Vec<u8>) -> Bytes
    where
        S: Service<
            http::Request<http_body_util::Full<Bytes>>,
            Response = http::Response<tonic::body::BoxBody>,
            Error = Infallible,
        >,
    {
        let mut req = request(framed(&message, false), None);
        *req.uri_mut() = http::Uri::try_from(path).expect("uri");
        *req.method_mut() = http::Method::POST;
        req.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        let res = match svc.call(req).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        let collected = res.into_body().collect().await.expect("body");
        let status = collected
            .trailers()
            .and_then(|t| t.get("grpc-status").cloned());
        assert_eq!(status, Some(http::HeaderValue::from_static("0")));
        let body = collected.to_bytes();
        assert_eq!(body[0], 0, "not compressed");
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        assert_eq!(body.len(), 5 + len, "one message");
        body.slice(5..)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn fast_list_answers_should_decode_to_the_typed_answers(
            pods in prop::collection::vec(
                (any::<u8>(), any::<u8>(), 0i64..20,
                 prop::collection::vec((any::<u8>(), any::<u8>(), any::<Option<u8>>(), 0i64..50), 0..8)),
                0..12),
            filters in prop::collection::vec((any::<u8>(), any::<u8>(), any::<Option<u8>>(), any::<u8>()), 1..6),
        ) {
            let threads = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
            threads.block_on(async {
                let t = TestRuntime::new();
                let (sandboxes, containers) = fill(&t.rt, &pods);
                let server = CriServer { rt: t.rt.clone() };
                let mut typed = RuntimeServiceServer::new(server.clone());
                let mut fast = RuntimeRoutes::new(RuntimeServiceServer::new(server), t.rt.clone());
                for (id, pod, state, labels) in filters {
                    let req = api::ListContainersRequest {
                        filter: (id != 255).then(|| api::ContainerFilter {
                            id: pick_id(&containers, id),
                            pod_sandbox_id: pick_id(&sandboxes, pod),
                            state: state.map(|s| api::ContainerStateValue { state: i32::from(s % 4) }),
                            label_selector: selector(labels),
                        }),
                    }
                    .encode_to_vec();
                    let want = call(&mut typed, LIST_CONTAINERS, req.clone()).await;
                    let got = call(&mut fast, LIST_CONTAINERS, req).await;
                    let want = api::ListContainersResponse::decode(want).expect("typed answer");
                    let got = api::ListContainersResponse::decode(got).expect("fast answer");
                    assert_eq!(got, want);

                    let req = api::ListPodSandboxRequest {
                        filter: (id != 255).then(|| api::PodSandboxFilter {
                            id: pick_id(&sandboxes, pod),
                            state: state.map(|s| api::PodSandboxStateValue { state: i32::from(s % 2) }),
                            label_selector: selector(labels),
                        }),
                    }
                    .encode_to_vec();
                    let want = call(&mut typed, LIST_POD_SANDBOX, req.clone()).await;
                    let got = call(&mut fast, LIST_POD_SANDBOX, req).await;
                    let want = api::ListPodSandboxResponse::decode(want).expect("typed answer");
                    let got = api::ListPodSandboxResponse::decode(got).expect("fast answer");
                    assert_eq!(got, want);
                }
            });
        }
    }
}
