//! SPDY/3 header block compression: one zlib stream per direction for the
//! whole connection, primed with the dictionary the SPDY/3 specification
//! defines (section 2.6.10.1), each header block ending in a sync flush.

use std::sync::OnceLock;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// Header names and values the dictionary lists, each preceded on the wire
/// by its length as a 32-bit big-endian integer.
const WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's tail: common values, concatenated without lengths.
const TAIL: &[&str] = &[
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service Unavailable",
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,",
    "text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch",
    "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
];

/// The SPDY/3 header compression dictionary (1423 bytes).
pub(crate) fn dictionary() -> &'static [u8] {
    static DICT: OnceLock<Vec<u8>> = OnceLock::new();
    DICT.get_or_init(|| {
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        for t in TAIL {
            d.extend_from_slice(t.as_bytes());
        }
        d
    })
}

/// A header block could not be compressed or decompressed.
#[derive(Debug, thiserror::Error)]
#[error("SPDY header compression: {0}")]
pub(crate) struct ZlibError(String);

/// Compresses header blocks for one direction of a connection.
pub(crate) struct Deflater {
    z: Compress,
}

impl Deflater {
    pub(crate) fn new() -> Result<Self, ZlibError> {
        let mut z = Compress::new(Compression::default(), true);
        z.set_dictionary(dictionary())
            .map_err(|e| ZlibError(e.to_string()))?;
        Ok(Deflater { z })
    }

    /// Appends the compressed form of `block` to `out`, ending with a sync
    /// flush so the peer can decode it without waiting for more.
    pub(crate) fn compress(&mut self, block: &[u8], out: &mut Vec<u8>) -> Result<(), ZlibError> {
        let start_in = self.z.total_in();
        loop {
            out.reserve(block.len() / 2 + 64);
            let done = (self.z.total_in() - start_in) as usize;
            let before_out = self.z.total_out();
            self.z
                .compress_vec(&block[done..], out, FlushCompress::Sync)
                .map_err(|e| ZlibError(e.to_string()))?;
            let consumed_all = (self.z.total_in() - start_in) as usize == block.len();
            // A sync flush is complete once zlib stops filling the space it
            // was given.
            if consumed_all && out.len() < out.capacity() {
                return Ok(());
            }
            if self.z.total_out() == before_out && !consumed_all {
                return Err(ZlibError("deflate made no progress".into()));
            }
        }
    }
}

/// Decompresses header blocks for one direction of a connection.
pub(crate) struct Inflater {
    z: Decompress,
}

/// Largest decompressed header block accepted (a defence against bombs).
const MAX_BLOCK: usize = 1 << 20;

impl Inflater {
    pub(crate) fn new() -> Self {
        Inflater {
            z: Decompress::new(true),
        }
    }

    /// Decompresses one header block (all of `input` belongs to it).
    pub(crate) fn decompress(&mut self, input: &[u8]) -> Result<Vec<u8>, ZlibError> {
        let start_in = self.z.total_in();
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        loop {
            let done = (self.z.total_in() - start_in) as usize;
            if out.len() == out.capacity() {
                if out.len() >= MAX_BLOCK {
                    return Err(ZlibError("header block too large".into()));
                }
                out.reserve(out.len());
            }
            let before = (self.z.total_in(), self.z.total_out());
            match self
                .z
                .decompress_vec(&input[done..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::StreamEnd) => return Ok(out),
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.z
                        .set_dictionary(dictionary())
                        .map_err(|e| ZlibError(e.to_string()))?;
                    continue;
                }
                Err(e) => return Err(ZlibError(e.to_string())),
            }
            let consumed_all = (self.z.total_in() - start_in) as usize == input.len();
            if consumed_all && out.len() < out.capacity() {
                return Ok(out);
            }
            if !consumed_all
                && (self.z.total_in(), self.z.total_out()) == before
                && out.len() < out.capacity()
            {
                return Err(ZlibError("inflate made no progress".into()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adler-32, to check the dictionary against the id the spec gives it.
    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for &x in data {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn dictionary_is_the_specs() {
        assert_eq!(dictionary().len(), 1423);
        assert_eq!(adler32(dictionary()), 0xe3c6_a7c2);
    }

    #[test]
    fn blocks_round_trip_across_a_stream() {
        let mut d = Deflater::new().unwrap_or_else(|e| panic!("{e}"));
        let mut i = Inflater::new();
        for n in 0..20 {
            let block = format!(
                "block {n}: streamtype stdout port 8080 {}",
                "x".repeat(n * 100)
            );
            let mut wire = Vec::new();
            d.compress(block.as_bytes(), &mut wire)
                .unwrap_or_else(|e| panic!("{e}"));
            let back = i.decompress(&wire).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(back, block.as_bytes());
        }
    }
}
