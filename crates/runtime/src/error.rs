//! The runtime's error type and its one conversion to gRPC status codes.

use tonic::{Code, Status};

/// Errors of CRI operations. Each variant maps to one gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A request field is missing or impossible; names the field.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The offending field, e.g. `config.metadata.name`.
        field: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The object does not exist.
    #[error("{kind} {id} not found")]
    NotFound {
        /// `pod sandbox`, `container` or `image`.
        kind: &'static str,
        /// The id or reference asked for.
        id: String,
    },
    /// A name is reserved by another object.
    #[error("name {name} is reserved by {owner}")]
    AlreadyExists {
        /// The name.
        name: String,
        /// The id holding it.
        owner: String,
    },
    /// The object is in the wrong state for the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The call did not finish in time.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The call was given up: its client went away.
    #[error("{0}")]
    Cancelled(String),
    /// The runtime is starting or stopping.
    #[error("runtime is not ready: {0}")]
    Unavailable(String),
    /// Something the runtime depends on (a registry) cannot be reached.
    #[error("{0}")]
    Upstream(String),
    /// Content is corrupt (a digest or size mismatch).
    #[error("{0}")]
    DataLoss(String),
    /// Credentials were refused or missing.
    #[error("{0}")]
    PermissionDenied(String),
    /// The call is not supported by this runtime (yet); says why.
    #[error("{0}")]
    Unsupported(String),
    /// The disk (or a quota) is full.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Something failed inside the runtime or below it (runc, the kernel).
    #[error("{0}")]
    Internal(String),
    /// A container's exit record is there but cannot be read.
    #[error("exit of container {id} not recorded: {source}")]
    ExitUnread {
        /// The container id.
        id: String,
        /// Why the record cannot be read.
        source: crate::parts::ExitReadError,
    },
    /// Several steps failed (each ran to its end): their errors, in order.
    #[error("{}", join(.0))]
    Several(Vec<RuntimeError>),
    /// An operation failed, and undoing what it had made failed too: the
    /// operation's own error, with the cleanup's.
    #[error("{error}; undoing it failed too: {}", join(cleanup))]
    Undone {
        /// The operation's error (the one its code comes from).
        error: Box<RuntimeError>,
        /// What went wrong while undoing it.
        cleanup: Vec<RuntimeError>,
    },
}

fn join(errors: &[RuntimeError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl RuntimeError {
    /// An invalid-argument error naming `field`.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// An internal error with context.
    pub fn internal(context: impl std::fmt::Display, err: impl std::fmt::Display) -> Self {
        Self::Internal(format!("{context}: {err}"))
    }

    /// `Ok` when `errors` is empty, else its one error, or all of them.
    pub fn all(mut errors: Vec<RuntimeError>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Self::Several(errors)),
        }
    }

    /// The errors this one is made of (itself alone unless it is
    /// [`RuntimeError::Several`]).
    pub fn into_list(self) -> Vec<RuntimeError> {
        match self {
            Self::Several(errors) => errors,
            e => vec![e],
        }
    }

    /// `self`, with the errors of undoing what its operation had made
    /// (none: `self` as it is).
    pub fn with_cleanup(self, cleanup: Vec<RuntimeError>) -> Self {
        if cleanup.is_empty() {
            self
        } else {
            Self::Undone {
                error: Box::new(self),
                cleanup,
            }
        }
    }

    /// The gRPC code of this error.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::NotFound { .. } => Code::NotFound,
            Self::AlreadyExists { .. } => Code::AlreadyExists,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::Cancelled(_) => Code::Cancelled,
            Self::Unavailable(_) => Code::Unavailable,
            Self::Upstream(_) => Code::Unavailable,
            Self::DataLoss(_) => Code::DataLoss,
            Self::PermissionDenied(_) => Code::PermissionDenied,
            Self::Unsupported(_) => Code::Unimplemented,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::Internal(_) | Self::ExitUnread { .. } => Code::Internal,
            Self::Undone { error, .. } => error.code(),
            Self::Several(errors) => errors.first().map_or(Code::Internal, Self::code),
        }
    }
}

impl From<RuntimeError> for Status {
    fn from(e: RuntimeError) -> Self {
        Status::new(e.code(), bounded_message(e.to_string()))
    }
}

/// The longest error message sent to a client, in bytes. gRPC carries the
/// message in the `grpc-message` trailer, percent-encoded (up to three bytes
/// per byte), and both HTTP/2 ends bound a header list to 16 KiB by
/// default: a longer message (one that quotes a 3 MB name, say) would end
/// the call with a protocol or RESOURCE_EXHAUSTED error instead of the
/// status it describes.
pub const MAX_MESSAGE: usize = 2048;

/// `msg`, or its first [`MAX_MESSAGE`] bytes (at a character boundary) and
/// how long it was.
pub fn bounded_message(msg: String) -> String {
    if msg.len() <= MAX_MESSAGE {
        return msg;
    }
    let mut end = MAX_MESSAGE;
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}... (message cut: {} bytes in all)",
        &msg[..end],
        msg.len()
    )
}

impl From<petrel_store::StoreError> for RuntimeError {
    fn from(e: petrel_store::StoreError) -> Self {
        Self::Internal(e.to_string())
    }
}

impl From<petrel_oci::spec::SpecError> for RuntimeError {
    fn from(e: petrel_oci::spec::SpecError) -> Self {
        match e {
            petrel_oci::spec::SpecError::Invalid { field, reason } => {
                Self::InvalidArgument { field, reason }
            }
            other => Self::Internal(other.to_string()),
        }
    }
}

impl From<petrel_oci::runc::RuncError> for RuntimeError {
    fn from(e: petrel_oci::runc::RuncError) -> Self {
        match e {
            petrel_oci::runc::RuncError::StartTimeout { .. } => {
                Self::DeadlineExceeded(e.to_string())
            }
            e => Self::Internal(e.to_string()),
        }
    }
}

impl From<petrel_image::ImageError> for RuntimeError {
    fn from(e: petrel_image::ImageError) -> Self {
        use petrel_image::ImageError as E;
        let msg = e.to_string();
        match e {
            E::NotFound(what) => Self::NotFound {
                kind: "image",
                id: what,
            },
            E::InvalidReference { .. } => Self::invalid("image.image", msg),
            E::RegistryUnavailable { .. } => Self::Upstream(msg),
            E::Unauthorized { .. } => Self::PermissionDenied(msg),
            E::DigestMismatch { .. } | E::SizeMismatch { .. } => Self::DataLoss(msg),
            E::InvalidManifest { .. }
            | E::Unsupported(_)
            | E::RegistryConfig { .. }
            | E::InvalidArchive { .. }
            | E::UnsafeEntry { .. } => Self::FailedPrecondition(msg),
            E::TooLarge { .. } => Self::ResourceExhausted(msg),
            E::Io { ref source, .. } if is_disk_full(source) => Self::ResourceExhausted(msg),
            E::Io { .. } | E::Store(_) => Self::Internal(msg),
        }
    }
}

/// ENOSPC or EDQUOT: the caller can free space and retry, so the error says
/// RESOURCE_EXHAUSTED rather than INTERNAL.
fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || e.kind() == std::io::ErrorKind::StorageFull
}

/// A required request field, or INVALID_ARGUMENT naming it.
pub(crate) fn required<T>(value: Option<T>, field: &str) -> Result<T> {
    value.ok_or_else(|| RuntimeError::invalid(field, "missing"))
}

/// A string field that must not be empty, or INVALID_ARGUMENT naming it.
pub(crate) fn non_empty<'a>(value: &'a str, field: &str) -> Result<&'a str> {
    if value.is_empty() {
        Err(RuntimeError::invalid(field, "must not be empty"))
    } else {
        Ok(value)
    }
}

/// The result type of runtime operations.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_should_cut_a_long_message_and_say_how_long_it_was() {
        let name = "é".repeat(3 << 20);
        let s = Status::from(RuntimeError::invalid("config.metadata.name", name));
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(
            s.message().len() < MAX_MESSAGE + 64,
            "{}",
            s.message().len()
        );
        assert!(s.message().starts_with("invalid config.metadata.name: é"));
        let full = "invalid config.metadata.name: ".len() + (6 << 20);
        let tail = format!("(message cut: {full} bytes in all)");
        assert!(s.message().ends_with(&tail), "{}", s.message().len());
        let short = Status::from(RuntimeError::Internal("short".into()));
        assert_eq!(short.message(), "short");
    }
}
