//! ttRPC message framing and envelopes, as containerd's ttRPC speaks them.
//!
//! A ttRPC message is a 10-byte header followed by a protobuf payload:
//!
//! ```text
//! +----------------+----------------+---------+----------+------------------+
//! | length u32 BE  | stream id u32  | type u8 | flags u8 | payload (length) |
//! +----------------+----------------+---------+----------+------------------+
//! ```
//!
//! The payload of a request is a [`Request`] envelope naming the service and method and
//! carrying the method's encoded argument; a response carries a [`Response`] with a
//! [`Status`] and the encoded result. Clients number their streams with odd ids counting
//! up by two. Payloads are limited to [`MAX_MESSAGE_LEN`] (4 MiB); a receiver skips an
//! oversized message and, if it was a request, answers `RESOURCE_EXHAUSTED`.

use bytes::{Buf, Bytes, BytesMut};

/// Length of a ttRPC message header.
pub const MESSAGE_HEADER_LEN: usize = 10;
/// Largest ttRPC payload.
pub const MAX_MESSAGE_LEN: usize = 4 << 20;

/// Message type of a request.
pub const TYPE_REQUEST: u8 = 1;
/// Message type of a response.
pub const TYPE_RESPONSE: u8 = 2;
/// Message type of stream data (unused by NRI).
pub const TYPE_DATA: u8 = 3;

/// A ttRPC message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageHeader {
    /// Payload length.
    pub length: u32,
    /// Stream (call) id.
    pub stream_id: u32,
    /// [`TYPE_REQUEST`], [`TYPE_RESPONSE`] or [`TYPE_DATA`].
    pub kind: u8,
    /// Stream flags (unused by NRI, always 0 when sending).
    pub flags: u8,
}

impl MessageHeader {
    /// The header's 10 wire bytes.
    pub fn to_bytes(&self) -> [u8; MESSAGE_HEADER_LEN] {
        let mut b = [0u8; MESSAGE_HEADER_LEN];
        b[0..4].copy_from_slice(&self.length.to_be_bytes());
        b[4..8].copy_from_slice(&self.stream_id.to_be_bytes());
        b[8] = self.kind;
        b[9] = self.flags;
        b
    }

    /// Parses the first 10 bytes of `b`.
    pub fn parse(b: &[u8]) -> Option<MessageHeader> {
        if b.len() < MESSAGE_HEADER_LEN {
            return None;
        }
        Some(MessageHeader {
            length: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            stream_id: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            kind: b[8],
            flags: b[9],
        })
    }
}

/// Header and payload as one buffer, ready to be written.
pub fn encode_message(stream_id: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let header = MessageHeader {
        // Callers keep payloads under MAX_MESSAGE_LEN.
        length: payload.len() as u32,
        stream_id,
        kind,
        flags: 0,
    };
    let mut out = Vec::with_capacity(MESSAGE_HEADER_LEN + payload.len());
    out.extend_from_slice(&header.to_bytes());
    out.extend_from_slice(payload);
    out
}

/// What [`MessageDecoder::next_message`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A complete message.
    Message(MessageHeader, Bytes),
    /// A message over [`MAX_MESSAGE_LEN`]; its payload was (or is being) skipped.
    Oversized(MessageHeader),
}

/// Cuts ttRPC messages out of a byte stream (one logical mux connection).
#[derive(Debug, Default)]
pub struct MessageDecoder {
    buf: BytesMut,
    /// Bytes of an oversized payload still to be thrown away.
    skip: usize,
}

impl MessageDecoder {
    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        if self.skip > 0 {
            let n = self.skip.min(data.len());
            self.skip -= n;
            self.buf.extend_from_slice(&data[n..]);
        } else {
            self.buf.extend_from_slice(data);
        }
    }

    /// Next message, if a complete one (or an oversized header) is buffered.
    pub fn next_message(&mut self) -> Option<Decoded> {
        if self.skip > 0 {
            return None;
        }
        let header = MessageHeader::parse(&self.buf)?;
        let len = header.length as usize;
        if len > MAX_MESSAGE_LEN {
            self.buf.advance(MESSAGE_HEADER_LEN);
            let now = len.min(self.buf.len());
            self.buf.advance(now);
            self.skip = len - now;
            return Some(Decoded::Oversized(header));
        }
        if self.buf.len() < MESSAGE_HEADER_LEN + len {
            return None;
        }
        self.buf.advance(MESSAGE_HEADER_LEN);
        Some(Decoded::Message(header, self.buf.split_to(len).freeze()))
    }

    /// Bytes buffered but not yet forming a message.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// ttRPC request envelope.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    /// Fully qualified service name, e.g. `nri.pkg.api.v1alpha1.Plugin`.
    #[prost(string, tag = "1")]
    pub service: String,
    /// Method name, e.g. `Configure`.
    #[prost(string, tag = "2")]
    pub method: String,
    /// Encoded argument.
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
    /// Caller's deadline in nanoseconds (0: none).
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
    /// Request metadata.
    #[prost(message, repeated, tag = "5")]
    pub metadata: Vec<KeyValue>,
}

/// One metadata entry of a [`Request`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    /// Key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// ttRPC response envelope.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    /// Outcome; absent or code 0 means success.
    #[prost(message, optional, tag = "1")]
    pub status: Option<Status>,
    /// Encoded result.
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// gRPC-style status (google.rpc.Status without details, which are skipped on decode).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Status {
    /// A [`Code`] value.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Human-readable message.
    #[prost(string, tag = "2")]
    pub message: String,
}

impl Status {
    /// A status with the given code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code: code as i32,
            message: message.into(),
        }
    }
}

/// The gRPC status codes ttRPC uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
#[allow(missing_docs)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn header_bytes_are_big_endian() {
        let h = MessageHeader {
            length: 0x0102,
            stream_id: 3,
            kind: TYPE_REQUEST,
            flags: 0,
        };
        assert_eq!(h.to_bytes(), [0, 0, 1, 2, 0, 0, 0, 3, 1, 0]);
        assert_eq!(MessageHeader::parse(&h.to_bytes()), Some(h));
    }

    #[test]
    fn request_envelope_encodes_as_protobuf() {
        let req = Request {
            service: "s".into(),
            method: "m".into(),
            payload: vec![0xAB],
            timeout_nano: 1,
            metadata: vec![],
        };
        // field 1 "s", field 2 "m", field 3 [0xAB], field 4 varint 1
        assert_eq!(
            req.encode_to_vec(),
            vec![0x0A, 1, b's', 0x12, 1, b'm', 0x1A, 1, 0xAB, 0x20, 1]
        );
    }

    #[test]
    fn decoder_handles_split_input_and_skips_oversized() {
        let mut d = MessageDecoder::default();
        let msg = encode_message(5, TYPE_RESPONSE, b"xyz");
        d.push(&msg[..4]);
        assert_eq!(d.next_message(), None);
        d.push(&msg[4..]);
        match d.next_message() {
            Some(Decoded::Message(h, p)) => {
                assert_eq!(
                    (h.stream_id, h.kind, &p[..]),
                    (5, TYPE_RESPONSE, &b"xyz"[..])
                )
            }
            other => panic!("unexpected {other:?}"),
        }
        // Oversized: header announces MAX+1; the payload is skipped across pushes and
        // the following message still decodes.
        let big = MessageHeader {
            length: (MAX_MESSAGE_LEN + 1) as u32,
            stream_id: 7,
            kind: TYPE_REQUEST,
            flags: 0,
        };
        d.push(&big.to_bytes());
        assert!(matches!(d.next_message(), Some(Decoded::Oversized(h)) if h.stream_id == 7));
        d.push(&vec![0u8; MAX_MESSAGE_LEN]);
        let mut tail = vec![0u8; 1];
        tail.extend_from_slice(&encode_message(9, TYPE_REQUEST, b"ok"));
        d.push(&tail);
        assert!(
            matches!(d.next_message(), Some(Decoded::Message(h, p)) if h.stream_id == 9 && &p[..] == b"ok")
        );
        assert_eq!(d.pending(), 0);
    }
}
