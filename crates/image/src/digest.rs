//! SHA-256 helpers: a reader that hashes what passes through it.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

/// Wraps a reader and hashes and counts every byte read through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    /// Starts hashing `inner` from its current position.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Reads the rest of the stream (so trailing bytes are hashed too) and
    /// returns `("sha256:<hex>", bytes read)`.
    pub fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((sha256_string(self.hasher), self.count))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// `"sha256:<hex>"` of a finished hasher.
fn sha256_string(hasher: Sha256) -> String {
    format!("sha256:{}", hex::encode(hasher.finalize()))
}
