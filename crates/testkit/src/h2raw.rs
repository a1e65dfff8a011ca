//! A hand-made HTTP/2 client over the runtime's unix socket, for requests a
//! well-behaved client cannot send: any `:authority` (or none), padded or
//! continued header blocks, HPACK's dynamic table and Huffman strings.
//! Responses are decoded with Petrel's own HPACK decoder.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use petrel_cri::hpack::{self, Decoder};

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;
const ACK: u8 = 0x1;

/// How one call ended.
#[derive(Debug, Default)]
pub struct Answer {
    /// `:status` of the response headers.
    pub http_status: Option<String>,
    /// `grpc-status` (in the headers or the trailers).
    pub grpc_status: Option<String>,
    /// `grpc-message`, if any.
    pub grpc_message: Option<String>,
    /// The response message (the DATA without its 5-byte gRPC prefix).
    pub message: Vec<u8>,
    /// The RST_STREAM error code, if the stream was reset.
    pub reset: Option<u32>,
    /// The GOAWAY error code, if the connection was closed.
    pub goaway: Option<u32>,
}

/// One HTTP/2 connection.
pub struct RawH2 {
    sock: UnixStream,
    decoder: Decoder,
    next_stream: u32,
    /// Settings the server announced: (identifier, value).
    pub server_settings: Vec<(u16, u32)>,
}

/// A frame's bytes.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A request header block of literals: `:method POST`, `:scheme http`,
/// `:path`, `:authority` when given, `content-type` and `te`.
pub fn request_block(path: &str, authority: Option<&[u8]>) -> BytesMut {
    let mut b = BytesMut::new();
    hpack::encode_literal(b":method", b"POST", false, &mut b);
    hpack::encode_literal(b":scheme", b"http", false, &mut b);
    hpack::encode_literal(b":path", path.as_bytes(), false, &mut b);
    if let Some(a) = authority {
        hpack::encode_literal(b":authority", a, false, &mut b);
    }
    hpack::encode_literal(b"content-type", b"application/grpc", false, &mut b);
    hpack::encode_literal(b"te", b"trailers", false, &mut b);
    b
}

/// A gRPC message frame body: the 5-byte prefix and the message.
pub fn grpc_body(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

impl RawH2 {
    /// Connects and sends the preface and an empty SETTINGS frame.
    pub fn connect(socket: &Path) -> Self {
        let sock = UnixStream::connect(socket).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut c = Self {
            sock,
            decoder: Decoder::new(hpack::DEFAULT_TABLE_SIZE),
            next_stream: 1,
            server_settings: Vec::new(),
        };
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        c.sock.write_all(&hello).expect("preface");
        c
    }

    /// The stream id the next call will use.
    pub fn next_stream(&self) -> u32 {
        self.next_stream
    }

    /// Sends raw bytes (frames made by the caller).
    pub fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("send");
    }

    /// A unary call whose request headers are `block`, sent as one HEADERS
    /// frame, then `body` as one DATA frame ending the stream.
    pub fn call(&mut self, block: &[u8], body: &[u8]) -> Answer {
        let stream = self.next_stream;
        let mut bytes = frame(HEADERS, END_HEADERS, stream, block);
        bytes.extend(frame(DATA, END_STREAM, stream, body));
        self.call_raw(&bytes)
    }

    /// A call whose frames the caller made (for stream `next_stream()`).
    pub fn call_raw(&mut self, frames: &[u8]) -> Answer {
        let stream = self.next_stream;
        self.next_stream += 2;
        self.send(frames);
        self.answer(stream)
    }

    fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut h = [0u8; 9];
        self.sock.read_exact(&mut h).ok()?;
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let mut payload = vec![0u8; len];
        self.sock.read_exact(&mut payload).ok()?;
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        Some((h[3], h[4], stream, payload))
    }

    /// Reads until `stream` ends (trailers, reset) or the connection does.
    fn answer(&mut self, stream: u32) -> Answer {
        let mut a = Answer::default();
        let mut block: Option<(Vec<u8>, bool)> = None;
        while let Some((kind, flags, id, payload)) = self.read_frame() {
            match kind {
                SETTINGS if flags & ACK == 0 => {
                    for s in payload.chunks(6) {
                        let id = u16::from_be_bytes([s[0], s[1]]);
                        let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
                        self.server_settings.push((id, v));
                    }
                    self.send(&frame(SETTINGS, ACK, 0, &[]));
                }
                PING if flags & ACK == 0 => self.send(&frame(PING, ACK, 0, &payload)),
                GOAWAY => {
                    a.goaway = Some(u32::from_be_bytes([
                        payload[4], payload[5], payload[6], payload[7],
                    ]));
                    return a;
                }
                RST_STREAM if id == stream => {
                    a.reset = Some(u32::from_be_bytes([
                        payload[0], payload[1], payload[2], payload[3],
                    ]));
                    return a;
                }
                HEADERS | CONTINUATION => {
                    let fragment = if kind == HEADERS {
                        let mut pos = 0;
                        let mut pad = 0;
                        if flags & PADDED != 0 {
                            pad = usize::from(payload[0]);
                            pos = 1;
                        }
                        if flags & PRIORITY != 0 {
                            pos += 5;
                        }
                        block = Some((Vec::new(), flags & END_STREAM != 0));
                        payload[pos..payload.len() - pad].to_vec()
                    } else {
                        payload
                    };
                    let (b, end_stream) = block.as_mut().expect("header block");
                    b.extend_from_slice(&fragment);
                    if flags & END_HEADERS != 0 {
                        let end_stream = *end_stream;
                        let (b, _) = block.take().expect("header block");
                        let mut fields = Vec::new();
                        self.decoder
                            .decode(&b, 1 << 20, &mut fields)
                            .expect("decode the server's headers");
                        if id != stream {
                            continue;
                        }
                        for f in fields {
                            let v = String::from_utf8_lossy(&f.value).into_owned();
                            match &f.name[..] {
                                b":status" => a.http_status = Some(v),
                                b"grpc-status" => a.grpc_status = Some(v),
                                b"grpc-message" => a.grpc_message = Some(v),
                                _ => {}
                            }
                        }
                        if end_stream {
                            return a;
                        }
                    }
                }
                DATA if id == stream => {
                    a.message
                        .extend_from_slice(payload.get(5..).unwrap_or_default());
                    if flags & END_STREAM != 0 {
                        return a;
                    }
                }
                _ => {}
            }
        }
        a
    }
}
