//! The runtime's error type and its one conversion to gRPC status codes.

use tonic::{Code, Status};

/// Errors of CRI operations. [`RuntimeError::code`] maps each to its gRPC
/// code: that mapping is here and nowhere else.
///
/// The first variants are answers about the request (what a client did
/// wrong or must wait for). The others carry what failed below the
/// runtime, with the operation and path concerned and the source error.
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
    /// Something the image store or a registry lacks; the message names
    /// it (`image …`, `tag … of image …`, a manifest).
    #[error("{0} not found")]
    ImageNotFound(String),
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
    /// The call is not supported by this runtime (yet); says why.
    #[error("{0}")]
    Unsupported(String),
    /// A checkpoint archive could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::archive::ArchiveError),
    /// The metadata store failed.
    #[error(transparent)]
    Store(#[from] petrel_store::StoreError),
    /// The OCI runtime (runc) failed.
    #[error(transparent)]
    Oci(#[from] petrel_oci::runc::RuncError),
    /// The image store or a registry failed (see `From<ImageError>`).
    #[error(transparent)]
    Image(petrel_image::ImageError),
    /// A CNI plugin failed: its own message.
    #[error(transparent)]
    Cni(#[from] petrel_cni::CniError),
    /// The container's OCI spec could not be built (see `From<SpecError>`).
    #[error(transparent)]
    Spec(petrel_oci::spec::SpecError),
    /// An NRI plugin refused the call or did not answer it.
    #[error(transparent)]
    Nri(#[from] crate::nri::HookError),
    /// The streaming server refused a URL.
    #[error(transparent)]
    Stream(#[from] petrel_stream::StreamError),
    /// A directory of the runtime's own could not be made.
    #[error("{op}: {source}")]
    Dir {
        /// What the directory is for.
        op: &'static str,
        /// The error (it names the directory).
        source: petrel_fs::DirError,
    },
    /// No id could be generated (no randomness).
    #[error("generate an id: {0}")]
    Id(std::io::Error),
    /// A cgroup operation failed.
    #[error("{op}: {source}")]
    Cgroup {
        /// What was being done.
        op: &'static str,
        /// The error (it names the cgroup).
        source: petrel_oci::cgroups::CgroupError,
    },
    /// A pod's namespaces could not be made or released.
    #[error("{op}: {source}")]
    Namespace {
        /// What was being done.
        op: &'static str,
        /// The error (it names the namespace file).
        source: crate::sandbox::namespaces::NamespaceError,
    },
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A process the runtime runs or watches (a shim, a PID-namespace
    /// holder) failed, or talking to it did.
    #[error("{op}: {source}")]
    Process {
        /// What was being done, and with which process.
        op: String,
        /// The error.
        source: std::io::Error,
    },
    /// A shim did not create its container: the shim's (or runc's) own
    /// account.
    #[error("create container {id}: {message}")]
    ShimCreate {
        /// The container id.
        id: String,
        /// What the shim said.
        message: String,
    },
    /// A shim refused a command: its answer.
    #[error("shim {command}: {message}")]
    ShimCommand {
        /// The command.
        command: &'static str,
        /// The shim's answer.
        message: String,
    },
    /// A value could not be encoded.
    #[error("encode {what}: {source}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The error.
        source: serde_json::Error,
    },
    /// A task of the runtime's own ended without its result (it panicked
    /// or was aborted).
    #[error("{op} failed unexpectedly: {source}")]
    Task {
        /// What the task was doing.
        op: &'static str,
        /// How it ended.
        source: tokio::task::JoinError,
    },
    /// The host lacks something the runtime needs (the shim, the OCI
    /// runtime): says what, and what to do.
    #[error("{0}")]
    Setup(String),
    /// Something the runtime keeps true was not (a bug, or state changed
    /// behind its back): says what.
    #[error("{0}")]
    Invariant(String),
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

    /// A failed file system operation on `path`.
    pub fn io(
        op: &'static str,
        path: impl Into<std::path::PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// A failure of a process the runtime runs, or of talking to it.
    pub fn process(op: impl Into<String>, source: std::io::Error) -> Self {
        Self::Process {
            op: op.into(),
            source,
        }
    }

    /// A directory of the runtime's own that could not be made.
    pub fn dir(op: &'static str, source: petrel_fs::DirError) -> Self {
        Self::Dir { op, source }
    }

    /// A failed cgroup operation.
    pub fn cgroup(op: &'static str, source: petrel_oci::cgroups::CgroupError) -> Self {
        Self::Cgroup { op, source }
    }

    /// A task of the runtime's own that ended without its result.
    pub fn task(op: &'static str, source: tokio::task::JoinError) -> Self {
        Self::Task { op, source }
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
        use petrel_image::ImageError as I;
        use petrel_oci::runc::RuncError as R;
        use petrel_stream::StreamError as S;
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::NotFound { .. } | Self::ImageNotFound(_) => Code::NotFound,
            Self::AlreadyExists { .. } => Code::AlreadyExists,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::Cancelled(_) => Code::Cancelled,
            Self::Unavailable(_) => Code::Unavailable,
            Self::Unsupported(_) => Code::Unimplemented,
            Self::Oci(R::StartTimeout { .. } | R::Timeout { .. }) => Code::DeadlineExceeded,
            Self::Image(e) => match e {
                I::NotFound(_) => Code::NotFound,
                I::InvalidReference { .. } => Code::InvalidArgument,
                // A registry that cannot be reached: try again later.
                I::RegistryUnavailable { .. } => Code::Unavailable,
                I::Unauthorized { .. } => Code::PermissionDenied,
                I::DigestMismatch { .. } | I::SizeMismatch { .. } => Code::DataLoss,
                I::InvalidManifest { .. }
                | I::Unsupported(_)
                | I::RegistryConfig { .. }
                | I::InvalidArchive { .. }
                | I::UnsafeEntry { .. } => Code::FailedPrecondition,
                I::TooLarge { .. } => Code::ResourceExhausted,
                I::Io { source, .. } if is_disk_full(source) => Code::ResourceExhausted,
                I::Io { .. } | I::Store(_) => Code::Internal,
            },
            Self::Spec(petrel_oci::spec::SpecError::Invalid { .. }) => Code::InvalidArgument,
            Self::Nri(crate::nri::HookError::Timeout { .. }) => Code::DeadlineExceeded,
            // A plugin's refusal: the call cannot succeed as the pod is.
            Self::Nri(_) => Code::FailedPrecondition,
            Self::Stream(S::InvalidArgument(_)) => Code::InvalidArgument,
            Self::Stream(S::Token(_)) => Code::ResourceExhausted,
            Self::Stream(_) => Code::Unavailable,
            Self::Io { source, .. } if is_disk_full(source) => Code::ResourceExhausted,
            Self::Checkpoint(e) => {
                use crate::checkpoint::archive::ArchiveError as A;
                match e {
                    A::NotCheckpoint { .. } => Code::InvalidArgument,
                    A::Deadline { .. } => Code::DeadlineExceeded,
                    A::Io { source, .. } if is_disk_full(source) => Code::ResourceExhausted,
                    A::Diff {
                        source: petrel_image::ImageError::TooLarge { .. },
                        ..
                    } => Code::ResourceExhausted,
                    A::Io { .. } | A::Diff { .. } => Code::Internal,
                }
            }
            Self::Store(_)
            | Self::Oci(_)
            | Self::Cni(_)
            | Self::Spec(_)
            | Self::Dir { .. }
            | Self::Id(_)
            | Self::Cgroup { .. }
            | Self::Namespace { .. }
            | Self::Io { .. }
            | Self::Process { .. }
            | Self::ShimCreate { .. }
            | Self::ShimCommand { .. }
            | Self::Encode { .. }
            | Self::Task { .. }
            | Self::Setup(_)
            | Self::Invariant(_)
            | Self::ExitUnread { .. } => Code::Internal,
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

impl From<petrel_oci::spec::SpecError> for RuntimeError {
    fn from(e: petrel_oci::spec::SpecError) -> Self {
        match e {
            // A field of the request: named as every invalid argument is.
            petrel_oci::spec::SpecError::Invalid { field, reason } => {
                Self::InvalidArgument { field, reason }
            }
            other => Self::Spec(other),
        }
    }
}

impl From<petrel_image::ImageError> for RuntimeError {
    fn from(e: petrel_image::ImageError) -> Self {
        use petrel_image::ImageError as E;
        match e {
            // Answers about the request, worded as the others are.
            // The store's message names what is missing ("image …").
            E::NotFound(what) => Self::ImageNotFound(what),
            E::InvalidReference { .. } => Self::invalid("image.image", e.to_string()),
            other => Self::Image(other),
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
        let short = Status::from(RuntimeError::Invariant("short".into()));
        assert_eq!(short.message(), "short");
    }

    #[test]
    fn code_should_come_from_the_source_and_from_the_operation_under_a_cleanup() {
        use petrel_oci::runc::RuncError;
        let timeout = RuntimeError::from(RuncError::StartTimeout {
            id: "c".into(),
            within: std::time::Duration::from_secs(30),
        });
        assert_eq!(timeout.code(), Code::DeadlineExceeded);
        let failed = RuntimeError::from(RuncError::NotFound("c".into()));
        assert_eq!(failed.code(), Code::Internal);
        let cleanup = vec![RuntimeError::io(
            "remove",
            "/x",
            std::io::Error::from_raw_os_error(libc::EBUSY),
        )];
        let undone = RuntimeError::invalid("config.image", "bad").with_cleanup(cleanup);
        assert_eq!(undone.code(), Code::InvalidArgument);
        assert_eq!(
            undone.to_string(),
            "invalid config.image: bad; undoing it failed too: remove /x: Device or resource busy (os error 16)"
        );
        let several = RuntimeError::all(vec![
            RuntimeError::FailedPrecondition("first".into()),
            RuntimeError::Invariant("second".into()),
        ]);
        let several = several.expect_err("two errors");
        assert_eq!(several.code(), Code::FailedPrecondition);
        assert_eq!(several.to_string(), "first; second");
        assert!(RuntimeError::all(Vec::new()).is_ok());
        let full = RuntimeError::io(
            "write",
            "/x",
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert_eq!(full.code(), Code::ResourceExhausted);
    }

    #[test]
    fn sources_should_stay_reachable() {
        use std::error::Error;
        let e = RuntimeError::io("read", "/x", std::io::Error::from_raw_os_error(libc::EIO));
        let source = e.source().expect("a source");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
    }
}
