//! Layer compression: gzip, zstd or none, told by the blob's magic bytes,
//! checked against the media type where one is known.
//!
//! Magic bytes win over the media type, as in containerd: docker archives
//! and some registries label layers loosely (`tar` for gzip data). The one
//! mismatch refused is a media type declaring compression for data that
//! has none, which would otherwise fail later as a confusing tar error.

use std::io::{self, Read};

use crate::ImageError;

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Layer compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    /// A plain tar stream.
    None,
    /// gzip (one or more members).
    Gzip,
    /// zstd (one or more frames).
    Zstd,
}

impl Compression {
    /// Recognises gzip and zstd magic numbers; anything else is taken as tar.
    pub fn sniff(head: &[u8]) -> Self {
        if head.starts_with(GZIP_MAGIC) {
            Self::Gzip
        } else if head.starts_with(ZSTD_MAGIC) {
            Self::Zstd
        } else {
            Self::None
        }
    }

    /// The compression an OCI or docker layer media type declares, `None`
    /// for media types that do not say.
    pub fn declared_by(media_type: &str) -> Option<Self> {
        let t = media_type.trim();
        if t.ends_with("+gzip") || t.ends_with(".tar.gzip") {
            Some(Self::Gzip)
        } else if t.ends_with("+zstd") || t.ends_with(".tar.zstd") {
            Some(Self::Zstd)
        } else if t.ends_with(".tar") {
            Some(Self::None)
        } else {
            None
        }
    }

    /// The compression of a blob starting with `head`, checked against its
    /// media type when known (see the module docs).
    pub fn detect(head: &[u8], media_type: Option<&str>) -> Result<Self, ImageError> {
        let sniffed = Self::sniff(head);
        match media_type.and_then(Self::declared_by) {
            Some(declared @ (Self::Gzip | Self::Zstd)) if sniffed == Self::None => {
                Err(ImageError::Unsupported(format!(
                    "layer declared {} ({}) is not {declared:?}-compressed",
                    media_type.unwrap_or_default(),
                    if head.is_empty() {
                        "empty"
                    } else {
                        "no magic number"
                    },
                )))
            }
            _ => Ok(sniffed),
        }
    }
}

/// Wraps a layer blob's reader into its uncompressed tar stream, told by
/// magic bytes (and checked against `media_type` when given). Reading
/// errors of the head are I/O errors of `what`.
pub(crate) fn decompress<'a>(
    mut blob: impl Read + 'a,
    media_type: Option<&str>,
    what: &std::path::Path,
) -> Result<Box<dyn Read + 'a>, ImageError> {
    // Read the magic bytes without BufRead: a network stream may hand them
    // out in pieces.
    let mut head = [0u8; 4];
    let mut n = 0;
    while n < head.len() {
        match blob.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ImageError::io("read layer blob", what, e)),
        }
    }
    let compression = Compression::detect(&head[..n], media_type)?;
    let stream = io::Cursor::new(head).take(n as u64).chain(blob);
    Ok(match compression {
        Compression::None => Box::new(stream),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(stream)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(stream)
                .map_err(|e| ImageError::io("start zstd decoder", what, e))?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::path::Path;

    /// A reader handing out one byte per call, like a slow network stream.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match (self.0.split_first(), buf.first_mut()) {
                (Some((b, rest)), Some(out)) => {
                    *out = *b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(data).expect("gzip in memory");
        gz.finish().expect("gzip in memory")
    }

    fn read_all(r: &mut dyn Read) -> Vec<u8> {
        let mut out = Vec::new();
        r.read_to_end(&mut out).expect("read");
        out
    }

    #[test]
    fn compression_should_be_sniffed_from_magic_bytes() {
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(
            Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]),
            Compression::Zstd
        );
        assert_eq!(Compression::sniff(b"usr/"), Compression::None);
        assert_eq!(Compression::sniff(b""), Compression::None);
    }

    #[test]
    fn media_types_should_declare_their_compression() {
        let d = Compression::declared_by;
        assert_eq!(
            d("application/vnd.oci.image.layer.v1.tar+gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            d("application/vnd.oci.image.layer.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(
            d("application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"),
            Some(Compression::Zstd)
        );
        assert_eq!(
            d("application/vnd.docker.image.rootfs.diff.tar.gzip"),
            Some(Compression::Gzip)
        );
        assert_eq!(
            d("application/vnd.oci.image.layer.v1.tar"),
            Some(Compression::None)
        );
        assert_eq!(d("application/octet-stream"), None);
    }

    #[test]
    fn detect_should_trust_magic_but_refuse_declared_compression_without_it() {
        let gz = "application/vnd.oci.image.layer.v1.tar+gzip";
        let zst = "application/vnd.oci.image.layer.v1.tar+zstd";
        let tar = "application/vnd.oci.image.layer.v1.tar";
        assert_eq!(
            Compression::detect(GZIP_MAGIC, Some(tar)).ok(),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::detect(GZIP_MAGIC, Some(zst)).ok(),
            Some(Compression::Gzip)
        );
        assert_eq!(
            Compression::detect(b"etc/", None).ok(),
            Some(Compression::None)
        );
        for t in [gz, zst] {
            assert!(matches!(
                Compression::detect(b"etc/", Some(t)),
                Err(ImageError::Unsupported(_))
            ));
        }
    }

    #[test]
    fn decompress_should_give_back_the_tar_stream_for_each_compression() {
        let data = b"some tar bytes, any bytes really".repeat(100);
        let zst = zstd::stream::encode_all(&data[..], 3).expect("zstd in memory");
        let what = Path::new("blob");
        for (blob, mt) in [
            (data.clone(), None),
            (
                gzip(&data),
                Some("application/vnd.oci.image.layer.v1.tar+gzip"),
            ),
            (
                zst.clone(),
                Some("application/vnd.oci.image.layer.v1.tar+zstd"),
            ),
            (zst, None),
        ] {
            let mut r = decompress(Trickle(&blob), mt, what).expect("decompress");
            assert_eq!(read_all(&mut r), data, "{mt:?}");
        }
        // Shorter than a magic number.
        let mut r = decompress(&b"ab"[..], None, what).expect("short");
        assert_eq!(read_all(&mut r), b"ab");
    }
}
