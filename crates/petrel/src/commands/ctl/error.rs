//! What can go wrong in `petrel ctl`, and the exit code each failure gives.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// A failed `petrel ctl` step; its `Display` is the message after `petrel ctl: `.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The endpoint string is not a unix socket address.
    #[error("{0}; pass --endpoint unix:///path/to/socket")]
    Endpoint(String),
    /// The runtime socket could not be reached.
    #[error(
        "cannot reach the runtime at {path}: {cause}; is it running? \
         choose another socket with --endpoint or PETREL_ENDPOINT"
    )]
    Unreachable {
        /// The socket path.
        path: String,
        /// The innermost cause, e.g. "No such file or directory (os error 2)".
        cause: String,
    },
    /// A call to the runtime failed.
    #[error("{}", RpcMessage { what, status })]
    Rpc {
        /// What was being done, e.g. `stop container 0123abc`.
        what: String,
        /// The gRPC status the runtime answered with (boxed: it is large).
        status: Box<tonic::Status>,
    },
    /// A local file operation failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// The operation, e.g. `read log file`.
        what: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Standard output was closed under us (e.g. `| head`): stop quietly.
    #[error("standard output closed")]
    OutputClosed,
    /// Bad input that clap could not catch (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Anything else worth a sentence, e.g. an invalid `run` file.
    #[error("{0}")]
    Other(String),
}

impl CtlError {
    /// A failed call: `what` says what was being done.
    pub fn rpc(what: impl Into<String>, status: tonic::Status) -> Self {
        Self::Rpc {
            what: what.into(),
            status: Box::new(status),
        }
    }

    /// The gRPC code if this is a failed call.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Rpc { status, .. } => Some(status.code()),
            _ => None,
        }
    }

    /// The process exit code for this failure: 2 for usage errors, 0 when
    /// the reader of standard output went away (`| head` has what it
    /// wanted: not a failure, and a script with `pipefail` goes on), else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::OutputClosed => 0,
            Self::Endpoint(_) | Self::Usage(_) => 2,
            _ => 1,
        }
    }

    /// Whether the failure deserves no message (the reader went away).
    pub fn is_silent(&self) -> bool {
        matches!(self, Self::OutputClosed)
    }
}

/// Formats `<what>: <grpc message> (<code>)`.
struct RpcMessage<'a> {
    what: &'a str,
    status: &'a tonic::Status,
}

impl fmt::Display for RpcMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = self.status.message();
        if message.is_empty() {
            write!(f, "{} ({:?})", self.what, self.status.code())
        } else {
            write!(f, "{}: {} ({:?})", self.what, message, self.status.code())
        }
    }
}

/// The innermost cause of an error chain: transport errors wrap the
/// `io::Error` that says what really happened.
pub fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = err;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_error_should_show_what_message_and_code() {
        let e = CtlError::rpc(
            "stop container abc",
            tonic::Status::not_found("container abc not found"),
        );
        assert_eq!(
            e.to_string(),
            "stop container abc: container abc not found (NotFound)"
        );
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn rpc_error_should_omit_empty_message() {
        let e = CtlError::rpc(
            "list pods",
            tonic::Status::new(tonic::Code::Unavailable, ""),
        );
        assert_eq!(e.to_string(), "list pods (Unavailable)");
    }

    #[test]
    fn usage_error_should_exit_with_two() {
        assert_eq!(CtlError::Usage("bad".into()).exit_code(), 2);
        assert_eq!(CtlError::Endpoint("bad".into()).exit_code(), 2);
    }

    #[test]
    fn closed_output_should_exit_quietly_with_zero() {
        assert_eq!(CtlError::OutputClosed.exit_code(), 0);
        assert!(CtlError::OutputClosed.is_silent());
    }

    #[test]
    fn root_cause_should_find_innermost_error() {
        let inner = io::Error::new(io::ErrorKind::NotFound, "no such socket");
        assert_eq!(root_cause(&Wrapped(inner)), "no such socket");
    }

    #[derive(Debug)]
    struct Wrapped(io::Error);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("transport error")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
