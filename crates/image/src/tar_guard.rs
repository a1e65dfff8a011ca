//! A reader between a tar stream and the `tar` crate that follows the
//! archive's framing and refuses an extension record (GNU long name or
//! link name, PAX header) larger than [`MAX_TAR_EXTENSION_BYTES`] before
//! any of it is read: the `tar` crate reads each such record whole into
//! memory, so a hostile archive could otherwise make the runtime allocate
//! what its size field claims.
//!
//! The guard reads headers with the `tar` crate's own parsers (`Header`,
//! `PaxExtensions`) and mirrors its framing (a PAX `size` record applies
//! to the next member that is not an extension record; GNU sparse
//! extension blocks sit between a header and its data), so both see the
//! same members. Its cost is constant per read call: data passes through
//! untouched, only the 512-byte header blocks are looked at.

use std::cell::Cell;
use std::io::{self, Read};

use crate::limits::MAX_TAR_EXTENSION_BYTES;

const BLOCK: usize = 512;
/// Offset of the "another sparse block follows" flag in a GNU sparse
/// extension block.
const EXT_IS_EXTENDED: usize = 504;

/// Why the guard stopped the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The record's kind, as people read it.
    pub kind: &'static str,
    /// The size its header claims.
    pub size: u64,
    /// Offset of its header in the tar stream.
    pub offset: u64,
}

impl Refusal {
    /// The refusal in words, for an error message.
    pub fn describe(&self) -> String {
        format!(
            "tar {} at byte {} claims {} bytes",
            self.kind, self.offset, self.size
        )
    }
}

fn refusal_error(r: Refusal) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "{}, over the limit of {MAX_TAR_EXTENSION_BYTES} bytes",
            r.describe()
        ),
    )
}

enum State {
    /// Collecting the next header block.
    Header,
    /// Collecting a GNU sparse extension block; then `data` bytes follow.
    SparseExt { data: u64 },
    /// Passing a member's data and padding through; a PAX header's data is
    /// kept (`collect`) to learn its `size` record.
    Data { left: u64, collect: u64 },
    /// The framing could not be followed (the `tar` crate refuses such a
    /// header too): pass everything through.
    Opaque,
}

/// The guard. A refusal is also left in the cell given to [`TarGuard::new`],
/// so the caller can tell it from the `tar` crate's own errors.
pub(crate) struct TarGuard<'a, R> {
    inner: R,
    state: State,
    block: [u8; BLOCK],
    filled: usize,
    /// Bytes of the stream passed so far.
    offset: u64,
    /// The data of a PAX header being collected.
    pax: Vec<u8>,
    /// The `size` record of the last PAX header, for the next member.
    pax_size: Option<u64>,
    refused: &'a Cell<Option<Refusal>>,
}

impl<'a, R: Read> TarGuard<'a, R> {
    /// Guards `inner`; a refusal is recorded in `refused`.
    pub fn new(inner: R, refused: &'a Cell<Option<Refusal>>) -> Self {
        Self {
            inner,
            state: State::Header,
            block: [0; BLOCK],
            filled: 0,
            offset: 0,
            pax: Vec::new(),
            pax_size: None,
            refused,
        }
    }

    /// A complete header block: what follows it.
    fn on_header(&mut self) -> io::Result<State> {
        let start = self.offset - BLOCK as u64;
        if self.block.iter().all(|b| *b == 0) {
            // An end-of-archive block (the tar crate stops here).
            return Ok(State::Header);
        }
        let h = tar::Header::from_byte_slice(&self.block);
        let sum: u32 = self.block[..148]
            .iter()
            .chain(&self.block[156..])
            .map(|b| u32::from(*b))
            .sum::<u32>()
            + 8 * 32;
        let Ok(size) = h.entry_size() else {
            return Ok(State::Opaque);
        };
        if h.cksum().ok() != Some(sum) {
            return Ok(State::Opaque);
        }
        let t = h.entry_type();
        let kind = if t.is_gnu_longname() {
            Some("long name record")
        } else if t.is_gnu_longlink() {
            Some("long link name record")
        } else if t.is_pax_local_extensions() {
            Some("PAX header")
        } else {
            None
        };
        let is_extension = kind.is_some() || t.is_pax_global_extensions();
        if let Some(kind) = kind {
            if size > MAX_TAR_EXTENSION_BYTES {
                let r = Refusal {
                    kind,
                    size,
                    offset: start,
                };
                self.refused.set(Some(r));
                return Err(refusal_error(r));
            }
        }
        // As the tar crate does: a long name, long link or PAX header in a
        // header it recognises (GNU or ustar magic) is read and kept for
        // the next member; any other header is a member, which a pending
        // PAX header's size applies to unless it is an extension record by
        // type, and which uses that PAX header up either way.
        let recognised = h.as_gnu().is_some() || h.as_ustar().is_some();
        let pending = if recognised && kind.is_some() {
            None
        } else {
            self.pax_size.take()
        };
        let size = match pending {
            Some(s) if !is_extension => s,
            _ => size,
        };
        let collect = if t.is_pax_local_extensions() && recognised {
            self.pax.clear();
            size
        } else {
            0
        };
        if t.is_gnu_sparse() && h.as_gnu().is_some_and(|g| g.is_extended()) {
            return Ok(State::SparseExt { data: size });
        }
        Ok(Self::data(size, collect))
    }

    fn data(size: u64, collect: u64) -> State {
        let padded = size.div_ceil(BLOCK as u64).saturating_mul(BLOCK as u64);
        State::Data {
            left: padded,
            collect,
        }
    }

    /// A complete PAX header's data: remember its `size` record as the
    /// tar crate reads it (the first `size` record, unless a record before
    /// it is malformed).
    fn on_pax(&mut self) {
        let mut size = None;
        for ext in tar::PaxExtensions::new(&self.pax) {
            let Ok(ext) = ext else { break };
            if ext.key() != Ok("size") {
                continue;
            }
            size = ext.value().ok().and_then(|v| v.parse::<u64>().ok());
            break;
        }
        self.pax_size = size;
        self.pax = Vec::new();
    }
}

impl<R: Read> Read for TarGuard<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(r) = self.refused.get() {
            return Err(refusal_error(r));
        }
        match self.state {
            State::Opaque => self.inner.read(buf),
            State::Header | State::SparseExt { .. } => {
                let want = (BLOCK - self.filled).min(buf.len());
                let n = self.inner.read(&mut buf[..want])?;
                self.block[self.filled..self.filled + n].copy_from_slice(&buf[..n]);
                self.filled += n;
                self.offset += n as u64;
                if self.filled == BLOCK {
                    self.filled = 0;
                    self.state = match self.state {
                        State::SparseExt { data } if self.block[EXT_IS_EXTENDED] == 1 => {
                            State::SparseExt { data }
                        }
                        State::SparseExt { data } => Self::data(data, 0),
                        _ => self.on_header()?,
                    };
                }
                Ok(n)
            }
            State::Data { left, collect } => {
                if left == 0 {
                    self.state = State::Header;
                    return self.read(buf);
                }
                let want = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
                let n = self.inner.read(&mut buf[..want])?;
                self.offset += n as u64;
                let keep = usize::try_from(collect).map_or(n, |c| c.min(n));
                if keep > 0 {
                    self.pax.extend_from_slice(&buf[..keep]);
                }
                let collect = collect - keep as u64;
                let left = left - n as u64;
                if collect == 0 && keep > 0 {
                    self.on_pax();
                }
                self.state = if left == 0 {
                    State::Header
                } else {
                    State::Data { left, collect }
                };
                Ok(n)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tar::{EntryType, Header};

    fn header(kind: EntryType, name: &str, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_path(name).expect("path");
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h
    }

    /// Reads `data` through a guard into the tar crate: the names of the
    /// members and the guard's refusal.
    fn names(data: &[u8]) -> (Result<Vec<String>, String>, Option<Refusal>) {
        let refused = Cell::new(None);
        let mut a = tar::Archive::new(TarGuard::new(data, &refused));
        let res = (|| {
            let mut out = Vec::new();
            for e in a.entries().map_err(|e| e.to_string())? {
                let mut e = e.map_err(|e| e.to_string())?;
                out.push(String::from_utf8_lossy(&e.path_bytes()).into_owned());
                io::copy(&mut e, &mut io::sink()).map_err(|e| e.to_string())?;
            }
            Ok(out)
        })();
        (res, refused.get())
    }

    /// One PAX record: `<length> <key>=<value>\n`, the length counting
    /// itself.
    fn pax_record(key: &str, value: &str) -> String {
        let body = format!(" {key}={value}\n");
        let mut len = body.len() + 1;
        while format!("{len}").len() + body.len() != len {
            len += 1;
        }
        format!("{len}{body}")
    }

    #[test]
    fn guard_should_pass_archives_with_every_kind_of_record() {
        let mut b = tar::Builder::new(Vec::new());
        let long = format!("{}/file", "d".repeat(300));
        b.append_data(&mut header(EntryType::Regular, "x", 3), &long, &b"abc"[..])
            .expect("long name");
        // A PAX header whose size record overrides the next header's.
        let records = pax_record("SCHILY.xattr.user.k", "v") + &pax_record("size", "5");
        let h = header(EntryType::XHeader, "pax", records.len() as u64);
        b.append(&h, records.as_bytes()).expect("pax");
        let mut h = header(EntryType::Regular, "paxed", 0);
        h.set_size(0);
        h.set_cksum();
        let mut data = b.into_inner().expect("tar");
        data.truncate(data.len() - 1024);
        data.extend_from_slice(h.as_bytes());
        data.extend_from_slice(b"12345");
        data.resize(data.len() + 512 - 5, 0);
        data.extend_from_slice(header(EntryType::Directory, "dir/", 0).as_bytes());
        data.resize(data.len() + 1024, 0);
        let (res, refused) = names(&data);
        assert_eq!(res, Ok(vec![long, "paxed".to_string(), "dir/".to_string()]));
        assert_eq!(refused, None);
    }

    #[test]
    fn guard_should_refuse_huge_extension_records_before_reading_them() {
        for (kind, what) in [
            (EntryType::GNULongName, "long name record"),
            (EntryType::GNULongLink, "long link name record"),
            (EntryType::XHeader, "PAX header"),
        ] {
            // The header claims 512 MiB; only the header is there.
            let h = header(kind, "././@LongLink", 512 << 20);
            let data = h.as_bytes().to_vec();
            let (res, refused) = names(&data);
            assert!(res.is_err(), "{what}: {res:?}");
            assert_eq!(
                refused,
                Some(Refusal {
                    kind: what,
                    size: 512 << 20,
                    offset: 0
                })
            );
        }
        // At the bound it is read (and the tar crate reports what is missing).
        let h = header(EntryType::XHeader, "pax", MAX_TAR_EXTENSION_BYTES);
        let (_, refused) = names(h.as_bytes());
        assert_eq!(refused, None);
    }

    #[test]
    fn guard_should_follow_pax_sizes() {
        // A member whose header says 0 bytes and whose PAX size says 600,
        // then a long name record over the bound: found where the tar
        // crate would read it, after two data blocks.
        let records = pax_record("size", "600");
        let mut data = header(EntryType::XHeader, "pax", records.len() as u64)
            .as_bytes()
            .to_vec();
        data.extend_from_slice(records.as_bytes());
        data.resize(1024, 0);
        data.extend_from_slice(header(EntryType::Regular, "f", 0).as_bytes());
        data.extend_from_slice(&[b'x'; 1024]);
        data.extend_from_slice(header(EntryType::GNULongName, "x", 1 << 30).as_bytes());
        let (_, refused) = names(&data);
        assert_eq!(refused.map(|r| r.offset), Some(5 * 512));
        assert_eq!(tar_next_header_after(&data, "f"), Some(5 * 512));
    }

    /// Where the tar crate itself expects the header after member `name`
    /// (reading `data` without a guard).
    fn tar_next_header_after(data: &[u8], name: &str) -> Option<u64> {
        let mut a = tar::Archive::new(data);
        let entries = a.entries().ok()?;
        for e in entries {
            let Ok(e) = e else { break };
            if e.path_bytes().as_ref() == name.as_bytes() {
                let size = e.size().div_ceil(BLOCK as u64) * BLOCK as u64;
                return Some(e.raw_header_position() + BLOCK as u64 + size);
            }
        }
        None
    }

    #[test]
    fn guard_should_use_a_pax_size_up_as_the_tar_crate_does() {
        // A PAX size record, then a global header (returned as a member:
        // it uses the PAX header up without taking its size), then a
        // member of 0 bytes, then a record over the bound right after it.
        let records = pax_record("size", "600");
        let mut data = header(EntryType::XHeader, "pax", records.len() as u64)
            .as_bytes()
            .to_vec();
        data.extend_from_slice(records.as_bytes());
        data.resize(1024, 0);
        data.extend_from_slice(header(EntryType::XGlobalHeader, "g", 0).as_bytes());
        data.extend_from_slice(header(EntryType::Regular, "f", 0).as_bytes());
        data.extend_from_slice(header(EntryType::GNULongName, "x", 1 << 30).as_bytes());
        let (_, refused) = names(&data);
        assert_eq!(refused.map(|r| r.offset), Some(4 * 512));
        assert_eq!(tar_next_header_after(&data, "f"), Some(4 * 512));

        // A long name between the PAX header and its member keeps it
        // pending: the member's data is 600 bytes (two blocks).
        let mut data = header(EntryType::XHeader, "pax", records.len() as u64)
            .as_bytes()
            .to_vec();
        data.extend_from_slice(records.as_bytes());
        data.resize(1024, 0);
        data.extend_from_slice(header(EntryType::GNULongName, "././@LongLink", 4).as_bytes());
        data.extend_from_slice(b"abc\0");
        data.resize(2048, 0);
        data.extend_from_slice(header(EntryType::Regular, "f", 0).as_bytes());
        data.extend_from_slice(&[b'x'; 1024]);
        data.extend_from_slice(header(EntryType::GNULongName, "x", 1 << 30).as_bytes());
        let (_, refused) = names(&data);
        assert_eq!(refused.map(|r| r.offset), Some(7 * 512));
        assert_eq!(tar_next_header_after(&data, "abc"), Some(7 * 512));
    }

    #[test]
    fn guard_should_follow_sparse_extension_blocks() {
        // A GNU sparse member whose map continues in one extension block,
        // then a long name record over the bound: the guard must find it
        // where the tar crate does.
        let mut h = header(EntryType::GNUSparse, "sparse", 512);
        let g = h.as_gnu_mut().expect("gnu");
        g.sparse[0].offset = [0; 12];
        g.set_real_size(4096);
        g.isextended[0] = 1;
        h.set_cksum();
        let mut ext = tar::GnuExtSparseHeader::new();
        ext.sparse[0].set_offset(0);
        ext.sparse[0].set_length(512);
        ext.sparse[1].set_offset(4096);
        ext.sparse[1].set_length(0);
        let mut data = h.as_bytes().to_vec();
        data.extend_from_slice(ext.as_bytes());
        data.extend_from_slice(&[7u8; 512]);
        data.extend_from_slice(header(EntryType::GNULongName, "x", 1 << 30).as_bytes());
        let (_, refused) = names(&data);
        assert_eq!(refused.map(|r| r.offset), Some(3 * 512));
    }
}
