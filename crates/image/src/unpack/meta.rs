//! An entry's metadata from its header, with PAX records applied.

use std::io::{self, Read};

use rustix::fs::{Gid, Timespec, Uid};

use super::path::unsafe_entry;
use super::Unpacker;
use crate::ImageError;

const PAX_XATTR_PREFIX: &str = "SCHILY.xattr.";

/// Metadata of one entry, with PAX records applied.
pub(super) struct Meta {
    pub uid: Uid,
    pub gid: Gid,
    /// Permission bits with setuid, setgid and sticky.
    pub mode: u32,
    pub mtime: Timespec,
    /// Extended attributes (`SCHILY.xattr.*`), overlay ones removed.
    pub xattrs: Vec<(String, Vec<u8>)>,
}

/// A numeric header field: its parsed value, or 0 when the field is blank
/// (all NUL or spaces, as some writers leave unused fields).
fn numeric(raw: &[u8], parsed: io::Result<u64>) -> Option<u64> {
    match parsed {
        Ok(v) => Some(v),
        Err(_) if raw.iter().all(|b| *b == 0 || *b == b' ') => Some(0),
        Err(_) => None,
    }
}

/// Parses a PAX `mtime` ("1700000000" or "1700000000.25").
pub(super) fn parse_pax_time(v: &str) -> Option<Timespec> {
    let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
    let tv_sec: i64 = secs.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    while digits.len() < 9 {
        digits.push('0');
    }
    let tv_nsec: i64 = digits.parse().ok()?;
    Some(Timespec { tv_sec, tv_nsec })
}

/// Whether an xattr would forge overlayfs metadata (opaque, redirect,
/// metacopy...): only the unpacker's own whiteout handling may set those.
fn is_overlay_xattr(name: &str) -> bool {
    name.starts_with("trusted.overlay.") || name.starts_with("user.overlay.")
}

impl Unpacker {
    pub(super) fn meta<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        name: &str,
    ) -> Result<Meta, ImageError> {
        let h = entry.header();
        let bad = |what: &str| unsafe_entry(name, format!("invalid {what} in header"));
        let old = h.as_old();
        let mut uid = numeric(&old.uid, h.uid()).ok_or_else(|| bad("uid"))?;
        let mut gid = numeric(&old.gid, h.gid()).ok_or_else(|| bad("gid"))?;
        let mode = numeric(&old.mode, h.mode().map(u64::from)).ok_or_else(|| bad("mode"))?;
        let mode = u32::try_from(mode & 0o7777).map_err(|_| bad("mode"))?;
        let secs = numeric(&old.mtime, h.mtime()).ok_or_else(|| bad("mtime"))?;
        let mut mtime = Timespec {
            tv_sec: i64::try_from(secs).map_err(|_| bad("mtime"))?,
            tv_nsec: 0,
        };
        let mut xattrs = Vec::new();
        let pax = entry
            .pax_extensions()
            .map_err(|e| ImageError::io("read pax header", self.target.clone(), e))?;
        if let Some(pax) = pax {
            for ext in pax {
                let ext =
                    ext.map_err(|e| ImageError::io("read pax header", self.target.clone(), e))?;
                let Ok(key) = ext.key() else { continue };
                let value = ext.value_bytes();
                match key {
                    "uid" => {
                        uid = ext
                            .value()
                            .ok()
                            .and_then(|v| v.parse().ok())
                            .ok_or_else(|| bad("pax uid"))?
                    }
                    "gid" => {
                        gid = ext
                            .value()
                            .ok()
                            .and_then(|v| v.parse().ok())
                            .ok_or_else(|| bad("pax gid"))?
                    }
                    "mtime" => {
                        mtime = ext
                            .value()
                            .ok()
                            .and_then(parse_pax_time)
                            .ok_or_else(|| bad("pax mtime"))?
                    }
                    k => {
                        if let Some(attr) = k.strip_prefix(PAX_XATTR_PREFIX) {
                            if is_overlay_xattr(attr) {
                                self.dropped_xattrs += 1;
                            } else {
                                xattrs.push((attr.to_string(), value.to_vec()));
                            }
                        }
                    }
                }
            }
        }
        // u32::MAX is "no change" to chown: refuse it rather than leave the
        // unpacker's own ids on the file.
        let uid = u32::try_from(uid)
            .ok()
            .filter(|u| *u != u32::MAX)
            .ok_or_else(|| bad("uid"))?;
        let gid = u32::try_from(gid)
            .ok()
            .filter(|g| *g != u32::MAX)
            .ok_or_else(|| bad("gid"))?;
        Ok(Meta {
            uid: Uid::from_raw(uid),
            gid: Gid::from_raw(gid),
            mode,
            mtime,
            xattrs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_pax_time_should_read_seconds_and_fractions() {
        let t = |s| parse_pax_time(s).map(|t| (t.tv_sec, t.tv_nsec));
        assert_eq!(t("1700000000"), Some((1_700_000_000, 0)));
        assert_eq!(t("1700000000.25"), Some((1_700_000_000, 250_000_000)));
        assert_eq!(t("1.1234567891"), Some((1, 123_456_789)));
        assert_eq!(t("-5"), Some((-5, 0)));
        assert_eq!(t("x"), None);
        assert_eq!(t("1.x"), None);
    }

    #[test]
    fn numeric_should_take_blank_fields_as_zero_only() {
        let err = || Err(io::Error::other("bad"));
        assert_eq!(numeric(b"\0\0\0", err()), Some(0));
        assert_eq!(numeric(b"   ", err()), Some(0));
        assert_eq!(numeric(b"12x", err()), None);
        assert_eq!(numeric(b"", Ok(7)), Some(7));
    }
}
