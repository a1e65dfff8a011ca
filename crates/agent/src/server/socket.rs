//! The agent's unix socket: the full API for root (and a configured
//! group) on this machine. The socket is 0660, owned by root and that
//! group (root's by default), in a directory of its own that is 0700
//! (0750 with the group's ownership): other users can neither reach the
//! socket's directory nor open the socket, and a container running as
//! root with the host's network, which passes any uid check on loopback
//! TCP, has no path to it at all. The peer's credentials are checked
//! again on every connection ([`super::peer`]).

use std::path::{Path, PathBuf};

use super::peer::PeerPolicy;

/// Default path of the socket: a directory of its own under /run, so a
/// group can be let in without opening the runtime's state directory.
pub const DEFAULT_SOCKET: &str = "/run/petrel-agent/agent.sock";

/// The listening socket and who may use it.
#[derive(Debug)]
pub struct AgentSocket {
    /// The listener.
    pub listener: tokio::net::UnixListener,
    /// Its path.
    pub path: PathBuf,
    /// Who is admitted besides root.
    pub policy: PeerPolicy,
}

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// The path names no file in a directory.
    #[error("agent socket {0}: not a file path")]
    BadPath(PathBuf),
    /// The socket's directory could not be made private.
    #[error("agent socket directory: {0}")]
    Dir(#[from] petrel_fs::DirError),
    /// Binding failed (in use, path too long, ...).
    #[error("agent socket: {0}")]
    Bind(#[from] petrel_cri::server::ServerError),
    /// The socket's or its directory's owner or mode could not be set.
    #[error("agent socket: {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Whether `dir` holds nothing but (a stale) `name`: the agent's own.
fn holds_only(dir: &Path, name: &std::ffi::OsStr) -> std::io::Result<bool> {
    for e in std::fs::read_dir(dir)? {
        if e?.file_name() != name {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Binds the socket at `path`, admitting root and members of `group`.
///
/// Its directory, when missing or holding nothing but the socket, is the
/// agent's own and made 0700 root:root, or 0750 root:`group`. A directory
/// that holds other files (`/run`, say) is not the agent's to change: it
/// is left as it is, with a warning if others may enter it (the socket's
/// own mode and the peer check still keep them out).
pub fn bind(path: &Path, group: Option<u32>) -> Result<AgentSocket, SocketError> {
    let bad = || SocketError::BadPath(path.to_path_buf());
    let name = path.file_name().ok_or_else(bad)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(bad)?;
    let io = |op: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |e: rustix::io::Errno| SocketError::Io {
            op,
            path: p,
            source: e.into(),
        }
    };
    let mode = if group.is_some() { 0o750 } else { 0o700 };
    let own = !dir.exists() || holds_only(dir, name).unwrap_or(false);
    if own {
        let gid = group.unwrap_or(0);
        petrel_fs::ensure_private_root(dir, mode, Some(gid))?;
        // Exactly `mode`: a directory left 0700 by a start without a group
        // opens to the group now.
        rustix::fs::chmod(dir, rustix::fs::Mode::from_raw_mode(mode)).map_err(io("chmod", dir))?;
    } else if let Ok(md) = std::fs::metadata(dir) {
        use std::os::unix::fs::PermissionsExt;
        let m = md.permissions().mode();
        if m & 0o007 != 0 {
            tracing::warn!(
                dir = %dir.display(),
                mode = format_args!("{:04o}", m & 0o7777),
                "the agent socket's directory holds other files and is left as it is; \
                 others may enter it (the socket itself admits only root and its group)"
            );
        }
    }
    let listener = petrel_cri::server::bind_unix_listener(path, 0o660)?;
    if let Some(gid) = group {
        rustix::fs::chown(path, None, Some(rustix::fs::Gid::from_raw(gid)))
            .map_err(io("chgrp", path))?;
    }
    Ok(AgentSocket {
        listener,
        path: path.to_path_buf(),
        policy: PeerPolicy { group },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn the_socket_should_be_0660_in_a_private_directory_of_its_own() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("agent/agent.sock");
        let s = bind(&path, None).unwrap();
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        assert_eq!(mode(&path), 0o660);
        drop(s);
        // With a group the directory opens to it, exactly 0750.
        let gid = rustix::process::getegid().as_raw();
        let s = bind(&path, Some(gid)).unwrap();
        let dir = std::fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(dir.mode() & 0o7777, 0o750);
        assert_eq!(dir.gid(), gid);
        assert_eq!(std::fs::metadata(&path).unwrap().gid(), gid);
        assert_eq!(s.policy.group, Some(gid));
    }

    #[tokio::test]
    async fn a_shared_directory_should_be_left_as_it_is() {
        let d = tempfile::tempdir().unwrap();
        let shared = d.path().join("run");
        std::fs::create_dir(&shared).unwrap();
        std::fs::write(shared.join("other.pid"), "1").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = shared.join("agent.sock");
        let _s = bind(&path, None).unwrap();
        assert_eq!(mode(&shared), 0o755);
        assert_eq!(mode(&path), 0o660);
    }
}
