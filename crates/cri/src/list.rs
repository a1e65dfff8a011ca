//! ListPodSandbox and ListContainers with their responses decoded from one
//! contiguous byte slice.
//!
//! A relist of 1000 pods receives a 4 MB ListContainers response. The
//! generated client decodes it through tonic's `DecodeBuf`, a `Buf` whose
//! every read and advance goes through the receive buffer's `BytesMut`;
//! prost is at its fastest on a plain `&[u8]`, and the whole message is one
//! slice there (tonic reserves a message's length before reading it). These
//! calls decode from that slice: the same messages for less CPU.

use std::marker::PhantomData;

use tonic::codec::{Codec, DecodeBuf, Decoder, ProstCodec};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::api;
use crate::summary::{decode_container_summaries, ContainerSummary};

/// The two List calls of a `RuntimeService`, decoded from one slice; a
/// stand-in for the generated client's methods of the same names.
#[derive(Debug, Clone)]
pub struct ListClient {
    grpc: tonic::client::Grpc<Channel>,
}

impl ListClient {
    /// A client on `channel`.
    pub fn new(channel: Channel) -> Self {
        Self {
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    /// Limits the size of a decoded response (tonic's default: 4 MiB).
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.grpc = self.grpc.max_decoding_message_size(limit);
        self
    }

    /// ListPodSandbox.
    pub async fn list_pod_sandbox(
        &mut self,
        req: impl tonic::IntoRequest<api::ListPodSandboxRequest>,
    ) -> Result<Response<api::ListPodSandboxResponse>, Status> {
        let path = "/runtime.v1.RuntimeService/ListPodSandbox";
        self.unary(req.into_request(), path).await
    }

    /// ListContainers.
    pub async fn list_containers(
        &mut self,
        req: impl tonic::IntoRequest<api::ListContainersRequest>,
    ) -> Result<Response<api::ListContainersResponse>, Status> {
        let path = "/runtime.v1.RuntimeService/ListContainers";
        self.unary(req.into_request(), path).await
    }

    /// ListContainers decoded lean: each container's id, sandbox id, state,
    /// creation time and the labels named in `keep` (see
    /// [`crate::summary`]), for callers that need no more.
    pub async fn list_container_summaries(
        &mut self,
        req: impl tonic::IntoRequest<api::ListContainersRequest>,
        keep: &'static [&'static str],
    ) -> Result<Response<Vec<ContainerSummary>>, Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unknown(format!("service was not ready: {e}")))?;
        let path = PathAndQuery::from_static("/runtime.v1.RuntimeService/ListContainers");
        self.grpc
            .unary(req.into_request(), path, SummaryCodec { keep })
            .await
    }

    async fn unary<Req, Resp>(
        &mut self,
        req: Request<Req>,
        path: &'static str,
    ) -> Result<Response<Resp>, Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc
            .ready()
            .await
            .map_err(|e| Status::unknown(format!("service was not ready: {e}")))?;
        let path = PathAndQuery::from_static(path);
        self.grpc
            .unary(req, path, SliceCodec::<Req, Resp>::default())
            .await
    }
}

/// Encodes requests as tonic's prost codec does; decodes responses from the
/// received message as one byte slice.
#[derive(Debug)]
struct SliceCodec<Req, Resp>(PhantomData<fn(Req) -> Resp>);

impl<Req, Resp> Default for SliceCodec<Req, Resp> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<Req, Resp> Codec for SliceCodec<Req, Resp>
where
    Req: prost::Message + Send + 'static,
    Resp: prost::Message + Default + Send + 'static,
{
    type Encode = Req;
    type Decode = Resp;
    type Encoder = <ProstCodec<Req, Resp> as Codec>::Encoder;
    type Decoder = SliceDecoder<Resp>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<Req, Resp>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder(PhantomData)
    }
}

/// Decodes a `Resp` from the message's bytes as one slice.
#[derive(Debug)]
struct SliceDecoder<Resp>(PhantomData<fn() -> Resp>);

impl<Resp> Decoder for SliceDecoder<Resp>
where
    Resp: prost::Message + Default + Send + 'static,
{
    type Item = Resp;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Resp>, Status> {
        use prost::bytes::Buf;
        let len = src.remaining();
        let decoded = if src.chunk().len() == len {
            let m = Resp::decode(src.chunk());
            src.advance(len);
            m
        } else {
            // Not one slice (never seen): as the prost codec does.
            Resp::decode(&mut *src)
        };
        decoded
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

/// Decodes a ListContainersResponse into container summaries.
#[derive(Debug, Clone, Copy)]
struct SummaryCodec {
    keep: &'static [&'static str],
}

impl Codec for SummaryCodec {
    type Encode = api::ListContainersRequest;
    type Decode = Vec<ContainerSummary>;
    type Encoder = <ProstCodec<api::ListContainersRequest, ()> as Codec>::Encoder;
    type Decoder = SummaryCodec;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<api::ListContainersRequest, ()>::default().encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        *self
    }
}

impl Decoder for SummaryCodec {
    type Item = Vec<ContainerSummary>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        use prost::bytes::Buf;
        let len = src.remaining();
        let decoded = if src.chunk().len() == len {
            decode_container_summaries(src.chunk(), self.keep)
        } else {
            // Not one slice (never seen): gathered first.
            let mut all = Vec::with_capacity(len);
            while src.has_remaining() {
                let n = src.chunk().len();
                all.extend_from_slice(src.chunk());
                src.advance(n);
            }
            decode_container_summaries(&all, self.keep)
        };
        src.advance(src.remaining());
        decoded
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::convert::Infallible;
    use std::task::{Context, Poll};

    use tonic::body::BoxBody;
    use tonic::codegen::{http, BoxFuture, Service};
    use tonic::server::{NamedService, UnaryService};

    use super::*;
    use crate::api::runtime_service_client::RuntimeServiceClient;

    /// A RuntimeService answering the two List calls with fixed responses.
    #[derive(Clone)]
    struct Fixed {
        sandboxes: api::ListPodSandboxResponse,
        containers: api::ListContainersResponse,
    }

    impl NamedService for Fixed {
        const NAME: &'static str = "runtime.v1.RuntimeService";
    }

    struct Answer<Resp>(Resp);

    impl<Req: Send + 'static, Resp: Clone + Send + 'static> UnaryService<Req> for Answer<Resp> {
        type Response = Resp;
        type Future = BoxFuture<tonic::Response<Resp>, Status>;

        fn call(&mut self, _: tonic::Request<Req>) -> Self::Future {
            let r = self.0.clone();
            Box::pin(async move { Ok(tonic::Response::new(r)) })
        }
    }

    impl Service<http::Request<BoxBody>> for Fixed {
        type Response = http::Response<BoxBody>;
        type Error = Infallible;
        type Future = BoxFuture<Self::Response, Infallible>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<BoxBody>) -> Self::Future {
            let me = self.clone();
            Box::pin(async move {
                Ok(match req.uri().path() {
                    "/runtime.v1.RuntimeService/ListPodSandbox" => {
                        let codec = ProstCodec::<_, api::ListPodSandboxRequest>::default();
                        let mut grpc = tonic::server::Grpc::new(codec);
                        grpc.unary(Answer(me.sandboxes), req).await
                    }
                    "/runtime.v1.RuntimeService/ListContainers" => {
                        let codec = ProstCodec::<_, api::ListContainersRequest>::default();
                        let mut grpc = tonic::server::Grpc::new(codec);
                        grpc.unary(Answer(me.containers), req).await
                    }
                    _ => Status::unimplemented("").into_http(),
                })
            })
        }
    }

    fn fixed(n: usize) -> Fixed {
        let labels = |i: usize| {
            HashMap::from([
                ("petrel.io/node".to_string(), "n1".to_string()),
                ("io.kubernetes.pod.uid".to_string(), format!("uid-{i}")),
            ])
        };
        Fixed {
            sandboxes: api::ListPodSandboxResponse {
                items: (0..n)
                    .map(|i| api::PodSandbox {
                        id: format!("sb-{i:060}"),
                        state: (i % 2) as i32,
                        created_at: i as i64,
                        labels: labels(i),
                        ..Default::default()
                    })
                    .collect(),
            },
            containers: api::ListContainersResponse {
                containers: (0..n * 5)
                    .map(|i| api::Container {
                        id: format!("c-{i:062}"),
                        pod_sandbox_id: format!("sb-{:060}", i / 5),
                        metadata: Some(api::ContainerMetadata {
                            name: format!("c{}", i % 5),
                            attempt: 1,
                        }),
                        image: Some(api::ImageSpec {
                            image: "busybox".into(),
                            ..Default::default()
                        }),
                        state: 1,
                        created_at: i as i64,
                        labels: labels(i / 5),
                        annotations: HashMap::from([("a".to_string(), "b".repeat(i % 300))]),
                        ..Default::default()
                    })
                    .collect(),
            },
        }
    }

    #[tokio::test]
    #[allow(clippy::unwrap_used)]
    async fn list_client_should_decode_what_the_generated_client_does() {
        let dir = std::env::temp_dir().join(format!("petrel-cri-list-{}", std::process::id()));
        let socket = dir.join("s.sock");
        let served = fixed(200);
        let incoming = crate::bind_unix(&socket, 0o600).unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(served.clone())
                .serve_with_incoming(incoming),
        );
        let ch = crate::connect(&socket.to_string_lossy()).await.unwrap();
        let mut generated =
            RuntimeServiceClient::new(ch.clone()).max_decoding_message_size(64 << 20);
        let mut ours = ListClient::new(ch).max_decoding_message_size(64 << 20);

        let req = api::ListPodSandboxRequest::default();
        let a = generated.list_pod_sandbox(req.clone()).await.unwrap();
        let b = ours.list_pod_sandbox(req).await.unwrap();
        assert_eq!(a.into_inner(), served.sandboxes);
        assert_eq!(b.into_inner(), served.sandboxes);

        let req = api::ListContainersRequest::default();
        let a = generated.list_containers(req.clone()).await.unwrap();
        let b = ours.list_containers(req).await.unwrap();
        assert_eq!(a.into_inner(), served.containers);
        assert_eq!(b.into_inner(), served.containers);

        // The lean decode: the same containers, only the labels asked for.
        let keep: &[&str] = &["io.kubernetes.pod.uid"];
        let lean = ours
            .list_container_summaries(api::ListContainersRequest::default(), keep)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(lean.len(), served.containers.containers.len());
        for (s, c) in lean.iter().zip(&served.containers.containers) {
            assert_eq!(
                (&s.id, &s.pod_sandbox_id, s.state),
                (&c.id, &c.pod_sandbox_id, c.state)
            );
            assert_eq!(s.created_at, c.created_at);
            assert_eq!(s.labels.len(), 1);
            assert_eq!(s.label(keep[0]), c.labels.get(keep[0]).map(String::as_str));
        }

        // The size limit still holds.
        let mut small = ours.clone().max_decoding_message_size(1024);
        let err = small
            .list_containers(api::ListContainersRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::OutOfRange);
        server.abort();
        let _ = std::fs::remove_dir_all(dir);
    }
}
