//! The crate's error type.

use std::path::PathBuf;

/// Errors of the image store.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// No image, layer or archive member matches.
    #[error("not found: {0}")]
    NotFound(String),
    /// A reference (name, tag or digest) does not parse.
    #[error("invalid reference {reference:?}: {reason}")]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The archive is not a well-formed OCI image layout or docker archive.
    #[error("invalid archive {path}: {reason}")]
    InvalidArchive {
        /// The archive file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Content does not hash to the digest that names it.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// The blob, layer or file concerned.
        what: String,
        /// The digest it should have.
        expected: String,
        /// The digest it has.
        actual: String,
    },
    /// Content does not have the size its descriptor states.
    #[error("size mismatch for {what}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// The blob concerned.
        what: String,
        /// The size it should have.
        expected: u64,
        /// The size it has.
        actual: u64,
    },
    /// A layer entry was refused because it could write outside the layer
    /// directory or is otherwise unsafe to create.
    #[error("unsafe layer entry {path:?}: {reason}")]
    UnsafeEntry {
        /// The entry's path as written in the layer.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// Input claims more than a bound the store keeps on what hostile
    /// input may cost (see `limits`): refused before it is read or
    /// written.
    #[error("{what}, over the limit of {limit} bytes")]
    TooLarge {
        /// What claims too much, with how much.
        what: String,
        /// The bound.
        limit: u64,
    },
    /// The archive uses a feature this store does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A registry could not be reached or answered with a server error.
    #[error("registry {host} unavailable: {reason}")]
    RegistryUnavailable {
        /// The registry host (`host[:port]`).
        host: String,
        /// What went wrong.
        reason: String,
    },
    /// A registry refused the credentials (or asked for some and none were given).
    #[error("registry {host} denied access to {reference}: {reason}")]
    Unauthorized {
        /// The registry host.
        host: String,
        /// The image reference.
        reference: String,
        /// The registry's answer.
        reason: String,
    },
    /// A manifest or index is malformed, too large or not usable.
    #[error("invalid manifest for {reference}: {reason}")]
    InvalidManifest {
        /// The image reference.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The registry configuration (`hosts.toml`, insecure list) is invalid.
    #[error("registry configuration {path}: {reason}")]
    RegistryConfig {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation, e.g. "create directory".
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The metadata store failed.
    #[error(transparent)]
    Store(#[from] petrel_store::StoreError),
}

impl ImageError {
    /// The same error for another caller of a shared operation (a download
    /// several pulls wait for). I/O errors keep their errno (or kind) and
    /// message; a store error becomes an I/O error with its message.
    pub(crate) fn duplicate(&self) -> Self {
        use ImageError as E;
        match self {
            E::NotFound(s) => E::NotFound(s.clone()),
            E::InvalidReference { reference, reason } => E::InvalidReference {
                reference: reference.clone(),
                reason: reason.clone(),
            },
            E::InvalidArchive { path, reason } => E::InvalidArchive {
                path: path.clone(),
                reason: reason.clone(),
            },
            E::DigestMismatch {
                what,
                expected,
                actual,
            } => E::DigestMismatch {
                what: what.clone(),
                expected: expected.clone(),
                actual: actual.clone(),
            },
            E::SizeMismatch {
                what,
                expected,
                actual,
            } => E::SizeMismatch {
                what: what.clone(),
                expected: *expected,
                actual: *actual,
            },
            E::UnsafeEntry { path, reason } => E::UnsafeEntry {
                path: path.clone(),
                reason: reason.clone(),
            },
            E::TooLarge { what, limit } => E::TooLarge {
                what: what.clone(),
                limit: *limit,
            },
            E::Unsupported(s) => E::Unsupported(s.clone()),
            E::RegistryUnavailable { host, reason } => E::RegistryUnavailable {
                host: host.clone(),
                reason: reason.clone(),
            },
            E::Unauthorized {
                host,
                reference,
                reason,
            } => E::Unauthorized {
                host: host.clone(),
                reference: reference.clone(),
                reason: reason.clone(),
            },
            E::InvalidManifest { reference, reason } => E::InvalidManifest {
                reference: reference.clone(),
                reason: reason.clone(),
            },
            E::RegistryConfig { path, reason } => E::RegistryConfig {
                path: path.clone(),
                reason: reason.clone(),
            },
            E::Io { op, path, source } => E::Io {
                op,
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(n) => std::io::Error::from_raw_os_error(n),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                },
            },
            E::Store(e) => E::Io {
                op: "use the image metadata store",
                path: PathBuf::from("meta.redb"),
                source: std::io::Error::other(e.to_string()),
            },
        }
    }

    /// Builds an [`ImageError::Io`] from anything convertible to an I/O error
    /// (std and rustix errors).
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
        source: impl Into<std::io::Error>,
    ) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source: source.into(),
        }
    }
}
