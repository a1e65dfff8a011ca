//! The console socket on which runc hands over a `--tty` container's
//! pseudo-terminal master.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;

use petrel_shim::fdpass::receive_fd;
use petrel_shim::CONSOLE_SOCKET;

/// A listening socket at [`CONSOLE_SOCKET`], relative to the working
/// directory (the bundle; a relative path keeps clear of the 108-byte limit
/// on socket paths). The socket file is removed on drop.
#[derive(Debug)]
pub struct ConsoleSocket {
    listener: UnixListener,
}

impl ConsoleSocket {
    /// Binds the socket, replacing a stale one.
    pub fn bind() -> io::Result<Self> {
        match std::fs::remove_file(CONSOLE_SOCKET) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(CONSOLE_SOCKET)?;
        listener.set_nonblocking(true)?;
        Ok(Self { listener })
    }

    /// Takes the master runc sent. Called after `runc create` has exited, so
    /// its connection and message already wait in the socket.
    pub fn receive_master(&self) -> io::Result<OwnedFd> {
        let (conn, _) = self.listener.accept().map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                io::Error::other("runc did not connect to the console socket")
            } else {
                e
            }
        })?;
        receive_fd(&conn)
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(CONSOLE_SOCKET);
    }
}
