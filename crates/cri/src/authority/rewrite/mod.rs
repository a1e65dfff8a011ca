//! The byte-level part of the adapter: HTTP/2 frames from a client, with
//! header blocks re-encoded where `:authority` needs it.

use std::io;

use bytes::{BufMut, BytesMut};

use crate::hpack::{self, Decoder, Field};

/// The client's connection preface (RFC 7540 3.5).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE's initial value: a frame payload every peer accepts.
const SAFE_FRAME: usize = 16_384;
/// The most raw bytes one header block may gather, and the most it may
/// decode to. Both far above what a server accepts (hyper's header list
/// limit is 16 KiB), so that the server, not the adapter, refuses large ones.
pub(super) const MAX_BLOCK: usize = 1 << 20;
/// The authority that replaces one the server would refuse.
pub const REPLACEMENT: &[u8] = b"localhost";

/// Where the rewriter is in the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reading the preface; `.0` bytes of it seen.
    Preface(usize),
    /// Header blocks pass unchanged: the server's HPACK table mirrors the
    /// client's.
    Verbatim,
    /// A block was re-encoded: every later block is too (as literals that
    /// leave the server's table alone), since the tables no longer agree.
    Rewrite,
    /// Not HTTP/2 as expected, or malformed while the server's view was
    /// still the client's own: everything passes so the server judges it.
    Aside,
}

/// A header block being gathered (a HEADERS frame and its CONTINUATIONs).
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
    /// The frames as received, for passing them unchanged.
    raw: BytesMut,
}

/// Rewrites the client-to-server bytes of one HTTP/2 connection.
#[derive(Debug)]
pub struct Rewriter {
    mode: Mode,
    decoder: Decoder,
    /// Received, not yet processed.
    input: BytesMut,
    /// Bytes of the current frame's payload still to pass through.
    forward: usize,
    block: Option<Block>,
    fields: Vec<Field>,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    /// A rewriter at the start of a connection.
    pub fn new() -> Self {
        Self {
            mode: Mode::Preface(0),
            decoder: Decoder::new(hpack::DEFAULT_TABLE_SIZE),
            input: BytesMut::new(),
            forward: 0,
            block: None,
            fields: Vec::new(),
        }
    }

    /// The buffer received bytes go to (read straight into by the adapter).
    pub fn input(&mut self) -> &mut BytesMut {
        &mut self.input
    }

    /// Moves every processed byte of the input to `out`. An error means the
    /// connection cannot go on (a malformed header block after a rewrite).
    pub fn process(&mut self, out: &mut BytesMut) -> io::Result<()> {
        loop {
            match self.mode {
                Mode::Aside => {
                    out.extend_from_slice(&self.input.split());
                    return Ok(());
                }
                Mode::Preface(seen) => {
                    let n = self.input.len().min(PREFACE.len() - seen);
                    if self.input[..n] != PREFACE[seen..seen + n] {
                        self.mode = Mode::Aside;
                        continue;
                    }
                    out.extend_from_slice(&self.input.split_to(n));
                    if seen + n < PREFACE.len() {
                        self.mode = Mode::Preface(seen + n);
                        return Ok(());
                    }
                    self.mode = Mode::Verbatim;
                }
                Mode::Verbatim | Mode::Rewrite => {
                    if !self.frame(out)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// The connection ended: whatever is left passes as it is.
    pub fn finish(&mut self, out: &mut BytesMut) {
        if let Some(block) = self.block.take() {
            out.extend_from_slice(&block.raw);
        }
        out.extend_from_slice(&self.input.split());
    }

    /// Handles the next frame, or part of it; `false` when more input is
    /// needed.
    fn frame(&mut self, out: &mut BytesMut) -> io::Result<bool> {
        if self.forward > 0 {
            let n = self.forward.min(self.input.len());
            if n == 0 {
                return Ok(false);
            }
            out.extend_from_slice(&self.input.split_to(n));
            self.forward -= n;
            return Ok(true);
        }
        if self.input.len() < FRAME_HEADER {
            return Ok(false);
        }
        let h = &self.input[..FRAME_HEADER];
        let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let in_block = self.block.as_ref().map(|b| b.stream);
        let is_header_frame = kind == HEADERS || (kind == CONTINUATION && in_block.is_some());
        if let Some(s) = in_block {
            if kind != CONTINUATION || stream != s {
                return self.malformed(out, "header block interrupted by another frame");
            }
        }
        if !is_header_frame {
            out.extend_from_slice(&self.input.split_to(FRAME_HEADER));
            self.forward = len;
            return Ok(true);
        }
        let gathered = self.block.as_ref().map_or(0, |b| b.raw.len());
        if gathered + FRAME_HEADER + len > MAX_BLOCK {
            return self.malformed(out, "header block too large");
        }
        if self.input.len() < FRAME_HEADER + len {
            self.input.reserve(FRAME_HEADER + len - self.input.len());
            return Ok(false);
        }
        let frame = self.input.split_to(FRAME_HEADER + len);
        let payload = &frame[FRAME_HEADER..];
        if kind == HEADERS {
            let Some((priority, fragment)) = headers_payload(flags, payload) else {
                out.extend_from_slice(&frame);
                return self.malformed(out, "bad padding in a HEADERS frame");
            };
            self.block = Some(Block {
                stream,
                end_stream: flags & END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
                raw: BytesMut::new(),
            });
        } else if let Some(b) = self.block.as_mut() {
            b.fragment.extend_from_slice(payload);
        }
        if let Some(b) = self.block.as_mut() {
            b.raw.extend_from_slice(&frame);
        }
        if flags & END_HEADERS != 0 {
            if let Some(block) = self.block.take() {
                self.finish_block(block, out)?;
            }
        }
        Ok(true)
    }

    /// A complete header block: passed, or re-encoded.
    fn finish_block(&mut self, block: Block, out: &mut BytesMut) -> io::Result<()> {
        self.fields.clear();
        if let Err(e) = self
            .decoder
            .decode(&block.fragment, MAX_BLOCK, &mut self.fields)
        {
            out.extend_from_slice(&block.raw);
            return self.malformed(out, &e.to_string()).map(|_| ());
        }
        let refused = self
            .fields
            .iter()
            .any(|f| &f.name[..] == b":authority" && !acceptable_authority(&f.value));
        if self.mode == Mode::Verbatim && !refused {
            out.extend_from_slice(&block.raw);
            return Ok(());
        }
        self.mode = Mode::Rewrite;
        let mut encoded = BytesMut::with_capacity(block.fragment.len() + 64);
        for f in &self.fields {
            let value: &[u8] = if &f.name[..] == b":authority" && !acceptable_authority(&f.value) {
                REPLACEMENT
            } else {
                &f.value
            };
            hpack::encode_literal(&f.name, value, f.sensitive, &mut encoded);
        }
        write_block(&block, &encoded, out);
        Ok(())
    }

    /// A framing or HPACK error: while the server still shares the client's
    /// view, everything passes from here on and the server answers it as it
    /// would have; after a rewrite the connection cannot go on.
    fn malformed(&mut self, out: &mut BytesMut, what: &str) -> io::Result<bool> {
        if self.mode == Mode::Verbatim {
            if let Some(block) = self.block.take() {
                out.extend_from_slice(&block.raw);
            }
            self.mode = Mode::Aside;
            return Ok(true);
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("http/2 from the client: {what}"),
        ))
    }
}

/// Whether the server accepts `value` as `:authority`: the `http` crate's
/// parser, the one the server's HTTP/2 layer (h2) applies.
pub fn acceptable_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// The priority fields and the header block fragment of a HEADERS payload;
/// `None` when the padding does not fit.
fn headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut pos = 0;
    let mut pad = 0;
    if flags & PADDED != 0 {
        pad = usize::from(*payload.first()?);
        pos = 1;
    }
    let priority = if flags & PRIORITY != 0 {
        let p: [u8; 5] = payload.get(pos..pos + 5)?.try_into().ok()?;
        pos += 5;
        Some(p)
    } else {
        None
    };
    let end = payload.len().checked_sub(pad)?;
    Some((priority, payload.get(pos..end)?))
}

/// Writes a re-encoded block as HEADERS and CONTINUATION frames no larger
/// than every peer accepts, without padding.
fn write_block(block: &Block, encoded: &[u8], out: &mut BytesMut) {
    let prio_len = if block.priority.is_some() { 5 } else { 0 };
    let first_len = encoded.len().min(SAFE_FRAME - prio_len);
    let (first, mut rest) = encoded.split_at(first_len);
    let mut flags = 0;
    if block.end_stream {
        flags |= END_STREAM;
    }
    if block.priority.is_some() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    frame_header(out, first.len() + prio_len, HEADERS, flags, block.stream);
    if let Some(p) = block.priority {
        out.extend_from_slice(&p);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let n = rest.len().min(SAFE_FRAME);
        let (chunk, tail) = rest.split_at(n);
        let flags = if tail.is_empty() { END_HEADERS } else { 0 };
        frame_header(out, chunk.len(), CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
        rest = tail;
    }
}

fn frame_header(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    out.put_uint(len as u64, 3);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
}

#[cfg(test)]
mod tests;
