//! The rewriter against a simulated server: its output is parsed as the
//! server would (frames, then header blocks with a decoder of its own).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use super::*;
use crate::hpack::tests::{field_strategy, Repr, TestEncoder};
use bytes::Bytes;
use proptest::prelude::*;

/// A frame as the server reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    frame_header(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out.to_vec()
}

/// Feeds `input` in chunks of `chunk` bytes; returns the output, or the error.
fn run(input: &[u8], chunk: usize) -> io::Result<Vec<u8>> {
    let mut r = Rewriter::new();
    let mut out = BytesMut::new();
    for c in input.chunks(chunk.max(1)) {
        r.input().extend_from_slice(c);
        r.process(&mut out)?;
    }
    r.finish(&mut out);
    Ok(out.to_vec())
}

/// Splits the server's view into frames (after the preface).
fn frames(bytes: &[u8]) -> Vec<Frame> {
    assert_eq!(&bytes[..24], PREFACE);
    let mut rest = &bytes[24..];
    let mut out = Vec::new();
    while !rest.is_empty() {
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        out.push(Frame {
            kind: rest[3],
            flags: rest[4],
            stream: u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]),
            payload: rest[9..9 + len].to_vec(),
        });
        rest = &rest[9 + len..];
    }
    out
}

/// A header block as the server decodes it: stream, HEADERS flags, fields.
type Decoded = (u32, u8, Vec<Field>);

/// The header blocks the server decodes, per stream, with the flags of
/// their HEADERS frame; other frames as they are.
fn server_view(bytes: &[u8]) -> (Vec<Decoded>, Vec<Frame>) {
    let mut dec = Decoder::new(hpack::DEFAULT_TABLE_SIZE);
    let mut blocks = Vec::new();
    let mut others = Vec::new();
    let mut current: Option<(u32, u8, Vec<u8>)> = None;
    for f in frames(bytes) {
        match f.kind {
            HEADERS => {
                assert!(current.is_none());
                let (_, fragment) = headers_payload(f.flags, &f.payload).expect("padding");
                assert!(f.payload.len() <= SAFE_FRAME);
                current = Some((f.stream, f.flags, fragment.to_vec()));
            }
            CONTINUATION => {
                assert!(f.payload.len() <= SAFE_FRAME);
                current
                    .as_mut()
                    .expect("block")
                    .2
                    .extend_from_slice(&f.payload);
            }
            _ => {
                assert!(current.is_none(), "frame inside a header block");
                others.push(f.clone());
            }
        }
        if matches!(f.kind, HEADERS | CONTINUATION) && f.flags & END_HEADERS != 0 {
            let (stream, flags, block) = current.take().expect("block");
            let mut fields = Vec::new();
            dec.decode(&block, 1 << 20, &mut fields)
                .expect("server decodes");
            blocks.push((stream, flags & (END_STREAM | PRIORITY), fields));
        }
    }
    (blocks, others)
}

fn request(authority: &[u8]) -> Vec<(Vec<u8>, Vec<u8>, Repr, bool)> {
    vec![
        (b":method".to_vec(), b"POST".to_vec(), Repr::Indexed, false),
        (b":scheme".to_vec(), b"http".to_vec(), Repr::Indexed, false),
        (
            b":path".to_vec(),
            b"/runtime.v1.RuntimeService/Version".to_vec(),
            Repr::Incremental,
            true,
        ),
        (
            b":authority".to_vec(),
            authority.to_vec(),
            Repr::Incremental,
            true,
        ),
        (
            b"te".to_vec(),
            b"trailers".to_vec(),
            Repr::Incremental,
            false,
        ),
        (
            b"content-type".to_vec(),
            b"application/grpc".to_vec(),
            Repr::Indexed,
            false,
        ),
    ]
}

/// A connection: preface, SETTINGS, then per request a HEADERS (+ DATA).
fn connection(enc: &mut TestEncoder, authorities: &[&[u8]]) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    for (i, a) in authorities.iter().enumerate() {
        let stream = 1 + 2 * i as u32;
        let mut block = BytesMut::new();
        enc.encode(&request(a), None, &mut block);
        out.extend(frame(HEADERS, END_HEADERS, stream, &block));
        out.extend(frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 0]));
    }
    out
}

fn authority_of(fields: &[Field]) -> Bytes {
    fields
        .iter()
        .find(|f| &f.name[..] == b":authority")
        .map(|f| f.value.clone())
        .expect(":authority")
}

#[test]
fn rewriter_should_pass_acceptable_connections_unchanged() {
    let input = connection(&mut TestEncoder::new(), &[b"localhost", b"localhost:1"]);
    for chunk in [1, 7, 9, 100, 1 << 20] {
        assert_eq!(run(&input, chunk).expect("run"), input, "chunk {chunk}");
    }
}

#[test]
fn rewriter_should_replace_every_authority_the_server_refuses() {
    for bad in [
        &b""[..],
        b"/run/petrel/petrel.sock",
        b"%2Frun%2Fpetrel.sock",
        b"unix:///x",
        b"unix:/run/x.sock",
        b"a b",
        b"\xff\xfe",
    ] {
        assert!(!acceptable_authority(bad), "{bad:?}");
        // Good, bad, then good again: the third refers to table entries the
        // client made while the server's table was frozen.
        let input = connection(&mut TestEncoder::new(), &[b"localhost", bad, bad, b"ok:1"]);
        for chunk in [1, 13, 1 << 20] {
            let out = run(&input, chunk).expect("run");
            let (blocks, others) = server_view(&out);
            let got: Vec<Bytes> = blocks.iter().map(|(_, _, f)| authority_of(f)).collect();
            assert_eq!(
                got,
                vec!["localhost", "localhost", "localhost", "ok:1"],
                "{bad:?}"
            );
            for (_, _, fields) in &blocks {
                assert_eq!(fields.len(), 6);
                assert_eq!(&fields[2].value[..], b"/runtime.v1.RuntimeService/Version");
            }
            assert_eq!(others.len(), 5, "SETTINGS and four DATA frames");
            assert!(others[1..].iter().all(|f| f.payload == [0, 0, 0, 0, 0]));
        }
    }
}

#[test]
fn rewriter_should_handle_padding_priority_and_continuation() {
    let mut enc = TestEncoder::new();
    let mut block = BytesMut::new();
    let mut fields = request(b"/a/socket");
    fields.push((b"x-big".to_vec(), vec![b'v'; 40_000], Repr::Without, false));
    fields.push((b"x-secret".to_vec(), b"s".to_vec(), Repr::Never, false));
    enc.encode(&fields, None, &mut block);
    let (a, b) = block.split_at(10);
    let (b, c) = b.split_at(20_000);
    let mut payload = vec![3u8]; // pad length
    payload.extend_from_slice(&[0x80, 0, 0, 7, 200]); // exclusive dependency on 7, weight
    payload.extend_from_slice(a);
    payload.extend_from_slice(&[0, 0, 0]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_STREAM | PADDED | 0x20, 1, &payload));
    input.extend(frame(CONTINUATION, 0, 1, b));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, c));
    let out = run(&input, 4096).expect("run");
    let f = frames(&out);
    assert_eq!(f[0].payload[..5], [0x80, 0, 0, 7, 200], "priority kept");
    assert_eq!(f[0].flags & PADDED, 0, "padding dropped");
    let (blocks, _) = server_view(&out);
    assert_eq!(blocks.len(), 1);
    let (stream, flags, got) = &blocks[0];
    assert_eq!((*stream, *flags), (1, END_STREAM | PRIORITY));
    assert_eq!(authority_of(got), "localhost");
    assert_eq!(got[6].value.len(), 40_000);
    assert!(got[7].sensitive && !got[6].sensitive);
}

#[test]
fn rewriter_should_step_aside_for_what_is_not_http2_or_malformed_before_a_rewrite() {
    let http1 = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    assert_eq!(run(&http1, 3).expect("run"), http1);
    // A HEADERS frame that is not valid HPACK, then more: all passes.
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS, 1, &[0xbe]));
    input.extend(frame(HEADERS, END_HEADERS, 3, &[0x82]));
    assert_eq!(run(&input, 5).expect("run"), input);
    // A header block interrupted by another frame.
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, 0, 1, &[0x82]));
    input.extend(frame(0x0, 0, 1, &[1, 2]));
    assert_eq!(run(&input, 5).expect("run"), input);
    // A truncated connection keeps its bytes.
    let input = connection(&mut TestEncoder::new(), &[b"/x"]);
    let cut = &input[..input.len() - 20];
    let out = run(cut, 64).expect("run");
    assert!(out.len() >= cut.len() - 40);
}

#[test]
fn rewriter_should_end_a_connection_malformed_after_a_rewrite() {
    let mut input = connection(&mut TestEncoder::new(), &[b"/x"]);
    input.extend(frame(HEADERS, END_HEADERS, 3, &[0xff, 0x7f]));
    let e = run(&input, 1 << 20).expect_err("malformed");
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
}

proptest! {
    #[test]
    fn rewriter_should_keep_the_server_view_equal_to_the_client_intent(
        blocks in proptest::collection::vec(
            (proptest::collection::vec(field_strategy(), 0..6),
             proptest::option::weighted(0.1, 0usize..=4096),
             proptest::collection::vec(1usize..200, 0..3),
             0u8..3),
            1..10,
        ),
        chunk in 1usize..300,
    ) {
        let mut enc = TestEncoder::new();
        let mut input = PREFACE.to_vec();
        let mut want = Vec::new();
        for (i, (fields, resize, splits, pad)) in blocks.iter().enumerate() {
            let stream = 1 + 2 * i as u32;
            let mut block = BytesMut::new();
            enc.encode(fields, *resize, &mut block);
            // Cut the block into HEADERS + CONTINUATIONs at random points.
            let mut cuts: Vec<usize> = splits.iter().map(|s| s % (block.len() + 1)).collect();
            cuts.sort_unstable();
            let mut parts = Vec::new();
            let mut last = 0;
            for c in cuts {
                parts.push(&block[last..c]);
                last = c;
            }
            parts.push(&block[last..]);
            for (j, part) in parts.iter().enumerate() {
                let end = if j + 1 == parts.len() { END_HEADERS } else { 0 };
                if j == 0 {
                    let mut payload = Vec::new();
                    let mut flags = end;
                    if *pad > 0 {
                        flags |= PADDED;
                        payload.push(*pad);
                    }
                    payload.extend_from_slice(part);
                    payload.extend(std::iter::repeat_n(0, usize::from(*pad)));
                    input.extend(frame(HEADERS, flags, stream, &payload));
                } else {
                    input.extend(frame(CONTINUATION, end, stream, part));
                }
            }
            input.extend(frame(0x0, END_STREAM, stream, &[i as u8; 3]));
            want.push(fields.iter().map(|(n, v, _, _)| {
                let v = if n == b":authority" && !acceptable_authority(v) {
                    REPLACEMENT.to_vec()
                } else {
                    v.clone()
                };
                (n.clone(), v)
            }).collect::<Vec<_>>());
        }
        let out = run(&input, chunk).expect("run");
        let (got, others) = server_view(&out);
        prop_assert_eq!(got.len(), want.len());
        for ((_, _, g), w) in got.iter().zip(&want) {
            let g: Vec<(Vec<u8>, Vec<u8>)> =
                g.iter().map(|f| (f.name.to_vec(), f.value.to_vec())).collect();
            prop_assert_eq!(&g, w);
        }
        prop_assert_eq!(others.len(), blocks.len());
        for (i, f) in others.iter().enumerate() {
            prop_assert_eq!(&f.payload, &vec![i as u8; 3]);
        }
    }
}
