//! Any gRPC client is answered (issue 26 item 8, issue 27 item 5): raw
//! HTTP/2 requests whatever their `:authority`, and Python's grpcio (grpc
//! C-core) with its default channel options, which sends the socket's path.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use bytes::BytesMut;
use petrel_cri::api;
use petrel_cri::hpack;
use petrel_testkit::h2raw::{self, RawH2};
use petrel_testkit::prelude::*;
use prost::Message;

const VERSION: &str = "/runtime.v1.RuntimeService/Version";

/// The call answered with gRPC status OK and a VersionResponse of Petrel.
fn assert_version(a: &h2raw::Answer, what: &str) {
    assert_eq!(a.reset, None, "{what}: stream reset: {a:?}");
    assert_eq!(a.goaway, None, "{what}: connection closed: {a:?}");
    assert_eq!(a.http_status.as_deref(), Some("200"), "{what}: {a:?}");
    assert_eq!(a.grpc_status.as_deref(), Some("0"), "{what}: {a:?}");
    let v = api::VersionResponse::decode(&a.message[..]).expect("VersionResponse");
    assert_eq!(v.runtime_name, "petrel", "{what}");
}

#[tokio::test]
async fn raw_http2_requests_should_get_a_grpc_answer_whatever_the_authority() {
    let node = Node::start();
    let sock = node.socket.clone();
    let socket_path = sock.display().to_string();
    let encoded_path = socket_path.replace('/', "%2F");
    let authorities: Vec<Option<Vec<u8>>> = vec![
        Some(b"localhost".to_vec()),
        Some(Vec::new()),
        Some(socket_path.clone().into_bytes()),
        Some(encoded_path.into_bytes()),
        Some(b"unix:///x".to_vec()),
        Some(b"unix:/run/x.sock".to_vec()),
        None,
        Some(b"localhost".to_vec()),
    ];
    tokio::task::spawn_blocking(move || {
        // Each on a connection of its own...
        for a in &authorities {
            let mut c = RawH2::connect(&sock);
            let answer = c.call(
                &h2raw::request_block(VERSION, a.as_deref()),
                &h2raw::grpc_body(&[]),
            );
            assert_version(
                &answer,
                &format!("{:?}", a.as_deref().map(String::from_utf8_lossy)),
            );
            // The adapter relies on the server's HPACK table being the
            // protocol's default: the server must not announce another.
            assert!(
                c.server_settings
                    .iter()
                    .all(|&(id, v)| id != 0x1 || v == hpack::DEFAULT_TABLE_SIZE as u32),
                "server announced a header table size: {:?}",
                c.server_settings
            );
        }
        // ...and all on one connection, good ones after bad ones.
        let mut c = RawH2::connect(&sock);
        for a in &authorities {
            let answer = c.call(
                &h2raw::request_block(VERSION, a.as_deref()),
                &h2raw::grpc_body(&[]),
            );
            assert_version(&answer, "one connection");
        }
    })
    .await
    .unwrap();
    // A well-behaved client still works.
    let mut c = node.clients().await;
    c.rt.version(api::VersionRequest::default()).await.unwrap();
}

#[tokio::test]
async fn raw_http2_should_answer_huffman_indexed_padded_and_continued_authorities() {
    let node = Node::start();
    let sock = node.socket.clone();
    let path = sock.display().to_string();
    tokio::task::spawn_blocking(move || {
        let mut c = RawH2::connect(&sock);
        // 1. :authority a Huffman-coded literal entered into the table.
        let mut block = BytesMut::new();
        hpack::encode_literal(b":method", b"POST", false, &mut block);
        hpack::encode_literal(b":scheme", b"http", false, &mut block);
        hpack::encode_literal(b":path", VERSION.as_bytes(), false, &mut block);
        block.extend_from_slice(&[0x41]); // literal with indexing, name :authority
        let mut huff = Vec::new();
        hpack::huffman::encode(path.as_bytes(), &mut huff);
        hpack::encode_integer(huff.len(), 7, 0x80, &mut block);
        block.extend_from_slice(&huff);
        hpack::encode_literal(b"content-type", b"application/grpc", false, &mut block);
        hpack::encode_literal(b"te", b"trailers", false, &mut block);
        assert_version(&c.call(&block, &h2raw::grpc_body(&[])), "huffman");
        // 2. The same :authority by its dynamic table index (62).
        let mut block = BytesMut::new();
        hpack::encode_literal(b":method", b"POST", false, &mut block);
        hpack::encode_literal(b":scheme", b"http", false, &mut block);
        hpack::encode_literal(b":path", VERSION.as_bytes(), false, &mut block);
        block.extend_from_slice(&[0x80 | 62]);
        hpack::encode_literal(b"content-type", b"application/grpc", false, &mut block);
        hpack::encode_literal(b"te", b"trailers", false, &mut block);
        assert_version(&c.call(&block, &h2raw::grpc_body(&[])), "indexed");
        // 3. A padded HEADERS with priority, continued over two frames.
        let block = h2raw::request_block(VERSION, Some(b"/some/socket"));
        let (a, b) = block.split_at(block.len() / 2);
        let stream = c.next_stream();
        let mut payload = vec![4u8, 0, 0, 0, 0, 16];
        payload.extend_from_slice(a);
        payload.extend_from_slice(&[0; 4]);
        let mut frames = h2raw::frame(
            h2raw::HEADERS,
            h2raw::PADDED | h2raw::PRIORITY,
            stream,
            &payload,
        );
        frames.extend(h2raw::frame(
            h2raw::CONTINUATION,
            h2raw::END_HEADERS,
            stream,
            b,
        ));
        frames.extend(h2raw::frame(
            h2raw::DATA,
            h2raw::END_STREAM,
            stream,
            &h2raw::grpc_body(&[]),
        ));
        assert_version(&c.call_raw(&frames), "padded and continued");
        // 4. And a plain good one after all that.
        assert_version(
            &c.call(
                &h2raw::request_block(VERSION, Some(b"localhost")),
                &h2raw::grpc_body(&[]),
            ),
            "after",
        );
    })
    .await
    .unwrap();
}

/// The Python of the venv `make pyenv` makes (`PETREL_PYTHON` overrides).
fn grpcio_python() -> PathBuf {
    let p = std::env::var_os("PETREL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build/pyenv/bin/python")
        });
    assert!(
        p.is_file(),
        "{} not found: run `make pyenv` (a venv with grpcio from PyPI) or set PETREL_PYTHON",
        p.display()
    );
    p
}

/// Calls `method` with an empty request through grpcio with default channel
/// options on `target`; returns the response bytes.
fn grpcio_call(target: &str, method: &str) -> Vec<u8> {
    const SCRIPT: &str = r#"
import sys, grpc
target, method = sys.argv[1], sys.argv[2]
with grpc.insecure_channel(target) as ch:
    call = ch.unary_unary(method)
    resp = call(b"", timeout=20)
sys.stdout.write(grpc.__version__ + " " + resp.hex())
"#;
    let out = Command::new(grpcio_python())
        .args(["-c", SCRIPT, target, method])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "grpcio call {method} on {target} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let (version, hex) = text.split_once(' ').unwrap();
    assert!(!version.is_empty());
    hex::decode(hex.trim()).unwrap()
}

#[tokio::test]
async fn python_grpcio_should_be_answered_with_default_channel_options() {
    let node = Node::start();
    let sock = node.socket.display().to_string();
    // Both of grpcio's unix target forms: `unix:PATH` and `unix://ABSPATH`.
    for target in [format!("unix:{sock}"), format!("unix://{sock}")] {
        let t = target.clone();
        let v = tokio::task::spawn_blocking(move || grpcio_call(&t, VERSION))
            .await
            .unwrap();
        let v = api::VersionResponse::decode(&v[..]).expect("VersionResponse");
        assert_eq!(v.runtime_name, "petrel", "{target}");
        // ListContainers is served by its own fast path.
        let t = target.clone();
        let l = tokio::task::spawn_blocking(move || {
            grpcio_call(&t, "/runtime.v1.RuntimeService/ListContainers")
        })
        .await
        .unwrap();
        let l = api::ListContainersResponse::decode(&l[..]).expect("ListContainersResponse");
        assert!(l.containers.is_empty());
    }
}
