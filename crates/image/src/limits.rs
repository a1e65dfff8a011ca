//! Bounds on what hostile input may make the store hold in memory or write
//! to disk. Each is checked before the bytes it bounds are read (from a
//! size field, a descriptor or `Content-Length`), or while they stream, so
//! input over a bound costs at most the bound.

/// Largest manifest or image index accepted, from a registry or an
/// archive (`index.json`, `manifest.json` and the blobs they name):
/// containerd's resolver refuses manifests over 4 MiB too.
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// Largest image config accepted. Configs carry the image's history and
/// labels, so they may be larger than manifests.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Largest tar extension record (a GNU long name or link name, a PAX
/// header): the tar reader holds each in memory whole. Real ones are a few
/// hundred bytes (a path is at most 4096 bytes on Linux; xattrs at most
/// 64 KiB each).
pub const MAX_TAR_EXTENSION_BYTES: u64 = 1 << 20;

/// Default bound on the size a layer unpacks to: the sum of its entries'
/// sizes (a sparse file's full size). Real layers stay far below it; a
/// layer claiming more is refused before the entry that crosses it is
/// written.
pub const DEFAULT_MAX_LAYER_BYTES: u64 = 64 << 30;

/// How much of a registry's error answer is read (to quote its start).
pub(crate) const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// Largest token server answer read.
pub(crate) const MAX_TOKEN_ANSWER_BYTES: usize = 1 << 20;

/// The bounds an [`ImageStore`](crate::ImageStore) applies to the layers
/// it unpacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest total size of a layer's entries; 0 means no bound.
    pub max_layer_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_layer_bytes: DEFAULT_MAX_LAYER_BYTES,
        }
    }
}
