//! Creating the listening unix socket of a gRPC server.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::authority::UnixIncoming;

/// Errors while creating a listening socket.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A filesystem operation on the socket or its directory failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The socket's directory could not be created.
    #[error(transparent)]
    Dir(#[from] petrel_fs::DirError),
    /// Another process is serving on the socket already.
    #[error("socket {0} is in use by another process")]
    InUse(PathBuf),
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ServerError + 'a {
    move |source| ServerError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Binds a unix socket at `path` with permission `mode` (e.g. `0o660`) for a
/// gRPC server: [`bind_unix_listener`], with each accepted connection behind
/// [`crate::authority::AuthorityFix`], so clients that send a `:authority`
/// the HTTP/2 layer refuses (grpc C-core's socket path) are answered too.
pub fn bind_unix(path: &Path, mode: u32) -> Result<UnixIncoming, ServerError> {
    bind_unix_listener(path, mode).map(UnixIncoming::new)
}

/// Binds a unix socket at `path` with permission `mode`, as it is.
///
/// A missing parent directory is created with mode 0700. A stale socket file
/// left by a crashed server is replaced, but a socket that still accepts
/// connections is reported as [`ServerError::InUse`] rather than stolen.
pub fn bind_unix_listener(path: &Path, mode: u32) -> Result<UnixListener, ServerError> {
    if let Some(parent) = path.parent() {
        petrel_fs::create_private_dir_all(parent, petrel_fs::PRIVATE)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServerError::InUse(path.to_path_buf()));
        }
        std::fs::remove_file(path).map_err(io("remove stale socket", path))?;
    }
    // Bind under a restrictive umask-equivalent: chmod right after bind, before
    // anyone can use it (the directory is 0700 when we created it).
    let listener = UnixListener::bind(path).map_err(io("bind", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io("chmod", path))?;
    Ok(listener)
}
