//! SPDY/3.1 framing: control frames (SYN_STREAM, SYN_REPLY, RST_STREAM,
//! SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE) and DATA frames, read
//! from and written to byte buffers. Header blocks go through the
//! connection's zlib streams ([`super::zlib`]).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::zlib::{Deflater, Inflater, ZlibError};

/// The protocol version in every control frame.
const VERSION: u16 = 3;
/// A frame's fixed header: 8 bytes.
pub(crate) const HEADER_LEN: usize = 8;
/// Largest payload a frame's 24-bit length can express.
pub(crate) const MAX_PAYLOAD: usize = (1 << 24) - 1;

/// Control frame flag: last frame of the sender on this stream.
pub(crate) const FLAG_FIN: u8 = 0x01;

mod kind {
    pub(super) const SYN_STREAM: u16 = 1;
    pub(super) const SYN_REPLY: u16 = 2;
    pub(super) const RST_STREAM: u16 = 3;
    pub(super) const SETTINGS: u16 = 4;
    pub(super) const PING: u16 = 6;
    pub(super) const GOAWAY: u16 = 7;
    pub(super) const HEADERS: u16 = 8;
    pub(super) const WINDOW_UPDATE: u16 = 9;
}

/// RST_STREAM status codes used here.
pub(crate) mod rst {
    pub(crate) const PROTOCOL_ERROR: u32 = 1;
    pub(crate) const REFUSED_STREAM: u32 = 3;
    pub(crate) const CANCEL: u32 = 5;
}

/// Header names and values of a stream (names lower case on the wire).
pub(crate) type Headers = Vec<(String, String)>;

/// Looks up a header, ignoring case.
pub(crate) fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// One SPDY frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    /// Entries: (flags, id, value).
    Settings {
        flags: u8,
        entries: Vec<(u8, u32, u32)>,
    },
    Ping(u32),
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        fin: bool,
        payload: Bytes,
    },
    /// A control frame type this implementation does not know; SPDY says
    /// to ignore it.
    Unknown(u16),
}

/// The peer sent something that is not SPDY/3.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error(transparent)]
    Zlib(#[from] ZlibError),
}

/// Takes one complete frame off the front of `buf`, or `None` if `buf`
/// does not hold one yet. A DATA frame's payload is split off `buf`
/// without copying.
pub(crate) fn decode(
    buf: &mut BytesMut,
    inflater: &mut Inflater,
) -> Result<Option<Frame>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let word0 = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let flags = buf[4];
    let len = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
    if buf.len() < HEADER_LEN + len {
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    let mut body = buf.split_to(len);
    if word0 & 0x8000_0000 == 0 {
        return Ok(Some(Frame::Data {
            stream_id: word0 & 0x7fff_ffff,
            fin: flags & FLAG_FIN != 0,
            payload: body.freeze(),
        }));
    }
    let version = ((word0 >> 16) & 0x7fff) as u16;
    if version != VERSION {
        return Err(FrameError::Version(version));
    }
    let kind = (word0 & 0xffff) as u16;
    let need = |n: usize, what: &'static str, b: &BytesMut| {
        if b.len() < n {
            Err(FrameError::Malformed(what))
        } else {
            Ok(())
        }
    };
    let frame = match kind {
        kind::SYN_STREAM => {
            need(10, "SYN_STREAM", &body)?;
            let stream_id = body.get_u32() & 0x7fff_ffff;
            let associated_to = body.get_u32() & 0x7fff_ffff;
            let priority = body.get_u8() >> 5;
            let _slot = body.get_u8();
            let headers = read_headers(&inflater.decompress(&body)?)?;
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            }
        }
        kind::SYN_REPLY | kind::HEADERS => {
            need(4, "SYN_REPLY", &body)?;
            let stream_id = body.get_u32() & 0x7fff_ffff;
            let headers = read_headers(&inflater.decompress(&body)?)?;
            if kind == kind::SYN_REPLY {
                Frame::SynReply {
                    stream_id,
                    flags,
                    headers,
                }
            } else {
                Frame::Headers {
                    stream_id,
                    flags,
                    headers,
                }
            }
        }
        kind::RST_STREAM => {
            need(8, "RST_STREAM", &body)?;
            Frame::RstStream {
                stream_id: body.get_u32() & 0x7fff_ffff,
                status: body.get_u32(),
            }
        }
        kind::SETTINGS => {
            need(4, "SETTINGS", &body)?;
            let n = body.get_u32() as usize;
            need(n.saturating_mul(8), "SETTINGS", &body)?;
            let entries = (0..n)
                .map(|_| {
                    let w = body.get_u32();
                    ((w >> 24) as u8, w & 0x00ff_ffff, body.get_u32())
                })
                .collect();
            Frame::Settings { flags, entries }
        }
        kind::PING => {
            need(4, "PING", &body)?;
            Frame::Ping(body.get_u32())
        }
        kind::GOAWAY => {
            need(4, "GOAWAY", &body)?;
            let last_good = body.get_u32() & 0x7fff_ffff;
            let status = if body.len() >= 4 { body.get_u32() } else { 0 };
            Frame::GoAway { last_good, status }
        }
        kind::WINDOW_UPDATE => {
            need(8, "WINDOW_UPDATE", &body)?;
            Frame::WindowUpdate {
                stream_id: body.get_u32() & 0x7fff_ffff,
                delta: body.get_u32() & 0x7fff_ffff,
            }
        }
        other => Frame::Unknown(other),
    };
    Ok(Some(frame))
}

/// The whole length (header included) of the frame starting `buf`, once
/// its header is there.
pub(crate) fn frame_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= HEADER_LEN).then(|| {
        HEADER_LEN
            + ((usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]))
    })
}

/// The 8-byte header of a DATA frame; the payload follows it unchanged.
pub(crate) fn data_header(stream_id: u32, fin: bool, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
    let fl = (u32::from(if fin { FLAG_FIN } else { 0 }) << 24) | (len as u32 & 0x00ff_ffff);
    h[4..].copy_from_slice(&fl.to_be_bytes());
    h
}

/// Appends a control frame to `out` (`Data` frames are written with
/// [`data_header`] instead, to keep their payload uncopied).
pub(crate) fn encode_control(
    frame: &Frame,
    deflater: &mut Deflater,
    out: &mut BytesMut,
) -> Result<(), FrameError> {
    let mut body = Vec::new();
    let (kind, flags) = match frame {
        Frame::SynStream {
            stream_id,
            associated_to,
            priority,
            flags,
            headers,
        } => {
            body.put_u32(*stream_id);
            body.put_u32(*associated_to);
            body.put_u8((priority & 0x7) << 5);
            body.put_u8(0);
            deflater.compress(&write_headers(headers), &mut body)?;
            (kind::SYN_STREAM, *flags)
        }
        Frame::SynReply {
            stream_id,
            flags,
            headers,
        } => {
            body.put_u32(*stream_id);
            deflater.compress(&write_headers(headers), &mut body)?;
            (kind::SYN_REPLY, *flags)
        }
        Frame::Headers {
            stream_id,
            flags,
            headers,
        } => {
            body.put_u32(*stream_id);
            deflater.compress(&write_headers(headers), &mut body)?;
            (kind::HEADERS, *flags)
        }
        Frame::RstStream { stream_id, status } => {
            body.put_u32(*stream_id);
            body.put_u32(*status);
            (kind::RST_STREAM, 0)
        }
        Frame::Settings { flags, entries } => {
            body.put_u32(entries.len() as u32);
            for (f, id, value) in entries {
                body.put_u32((u32::from(*f) << 24) | (id & 0x00ff_ffff));
                body.put_u32(*value);
            }
            (kind::SETTINGS, *flags)
        }
        Frame::Ping(id) => {
            body.put_u32(*id);
            (kind::PING, 0)
        }
        Frame::GoAway { last_good, status } => {
            body.put_u32(*last_good);
            body.put_u32(*status);
            (kind::GOAWAY, 0)
        }
        Frame::WindowUpdate { stream_id, delta } => {
            body.put_u32(*stream_id);
            body.put_u32(*delta);
            (kind::WINDOW_UPDATE, 0)
        }
        Frame::Data { .. } | Frame::Unknown(_) => return Err(FrameError::Malformed("control")),
    };
    if body.len() > MAX_PAYLOAD {
        return Err(FrameError::Malformed("oversized control"));
    }
    out.put_u32(0x8000_0000 | (u32::from(VERSION) << 16) | u32::from(kind));
    out.put_u32((u32::from(flags) << 24) | body.len() as u32);
    out.put_slice(&body);
    Ok(())
}

/// A header block before compression.
fn write_headers(headers: &Headers) -> Vec<u8> {
    let mut b = Vec::new();
    b.put_u32(headers.len() as u32);
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        b.put_u32(name.len() as u32);
        b.put_slice(name.as_bytes());
        b.put_u32(value.len() as u32);
        b.put_slice(value.as_bytes());
    }
    b
}

/// A header block after decompression. Several values of one name are
/// NUL-separated on the wire and become separate entries.
fn read_headers(mut b: &[u8]) -> Result<Headers, FrameError> {
    let bad = || FrameError::Malformed("header block");
    let take = |b: &mut &[u8]| -> Result<String, FrameError> {
        if b.len() < 4 {
            return Err(bad());
        }
        let n = b.get_u32() as usize;
        if b.len() < n {
            return Err(bad());
        }
        let s = String::from_utf8_lossy(&b[..n]).into_owned();
        b.advance(n);
        Ok(s)
    };
    if b.len() < 4 {
        return Err(bad());
    }
    let count = b.get_u32();
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = take(&mut b)?.to_ascii_lowercase();
        let value = take(&mut b)?;
        for v in value.split('\0') {
            headers.push((name.clone(), v.to_owned()));
        }
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frame: Frame) {
        let mut d = Deflater::new().unwrap_or_else(|e| panic!("{e}"));
        let mut i = Inflater::new();
        let mut buf = BytesMut::new();
        encode_control(&frame, &mut d, &mut buf).unwrap_or_else(|e| panic!("{e}"));
        // Feed it one byte at a time: a frame split across reads.
        let mut input = BytesMut::new();
        let bytes = buf.freeze();
        let mut got = None;
        for (n, b) in bytes.iter().enumerate() {
            input.put_u8(*b);
            got = decode(&mut input, &mut i).unwrap_or_else(|e| panic!("{e}"));
            if got.is_some() {
                assert_eq!(n + 1, bytes.len());
            }
        }
        assert_eq!(got, Some(frame));
    }

    #[test]
    fn control_frames_round_trip() {
        let headers = vec![
            ("streamtype".to_owned(), "data".to_owned()),
            ("port".to_owned(), "8080".to_owned()),
        ];
        round_trip(Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: headers.clone(),
        });
        round_trip(Frame::SynReply {
            stream_id: 3,
            flags: FLAG_FIN,
            headers: vec![],
        });
        round_trip(Frame::RstStream {
            stream_id: 5,
            status: rst::CANCEL,
        });
        round_trip(Frame::Settings {
            flags: 0,
            entries: vec![(0, 7, 65536)],
        });
        round_trip(Frame::Ping(1));
        round_trip(Frame::GoAway {
            last_good: 7,
            status: 0,
        });
        round_trip(Frame::WindowUpdate {
            stream_id: 1,
            delta: 1000,
        });
    }

    #[test]
    fn data_frames() {
        let mut i = Inflater::new();
        let mut buf = BytesMut::new();
        buf.put_slice(&data_header(9, true, 3));
        buf.put_slice(b"abc");
        buf.put_slice(&data_header(9, false, 0));
        assert_eq!(
            decode(&mut buf, &mut i).ok().flatten(),
            Some(Frame::Data {
                stream_id: 9,
                fin: true,
                payload: Bytes::from_static(b"abc")
            })
        );
        assert!(matches!(
            decode(&mut buf, &mut i),
            Ok(Some(Frame::Data { fin: false, .. }))
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn multiple_values_split() {
        let mut b = Vec::new();
        b.put_u32(1);
        b.put_u32(4);
        b.put_slice(b"Port");
        b.put_u32(5);
        b.put_slice(b"80\x0081");
        let h = read_headers(&b).unwrap_or_default();
        assert_eq!(header(&h, "port"), Some("80"));
        assert_eq!(h.len(), 2);
    }
}
