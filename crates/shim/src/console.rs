//! The console socket on which runc hands over a `--tty` container's
//! pseudo-terminal master.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;

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

/// Receives one descriptor sent with SCM_RIGHTS (runc puts the terminal's
/// name in the message body, which is not needed).
fn receive_fd(conn: &impl AsRawFd) -> io::Result<OwnedFd> {
    let mut name = [0u8; 256];
    let mut iov = libc::iovec {
        iov_base: name.as_mut_ptr().cast(),
        iov_len: name.len(),
    };
    // Room for a few descriptors, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; every field used is set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);

    // SAFETY: recvmsg writes into the buffers described by `msg`, which all
    // live on this stack frame.
    let n = unsafe {
        libc::recvmsg(
            conn.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }

    let mut received: Option<OwnedFd> = None;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled,
    // within `msg_controllen`; descriptors in SCM_RIGHTS are new and ours.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                let payload = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let count = payload / std::mem::size_of::<libc::c_int>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    // Keep the first; extra ones are closed when dropped.
                    if received.is_none() {
                        received = Some(fd);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    received.ok_or_else(|| io::Error::other("runc sent no terminal on the console socket"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    fn send_fd(sock: &UnixStream, fd: &impl AsRawFd) -> io::Result<()> {
        let mut body = *b"/dev/pts/7";
        let mut iov = libc::iovec {
            iov_base: body.as_mut_ptr().cast(),
            iov_len: body.len(),
        };
        let mut control = [0u64; 4];
        // SAFETY: test helper building an SCM_RIGHTS message in local buffers.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(4) as usize;
            libc::CMSG_DATA(cmsg)
                .cast::<libc::c_int>()
                .write_unaligned(fd.as_raw_fd());
            if libc::sendmsg(sock.as_raw_fd(), &msg, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    #[test]
    fn receive_fd_should_return_the_sent_descriptor() -> io::Result<()> {
        let (a, b) = UnixStream::pair()?;
        let (r, w) = crate::sys::pipe()?;
        send_fd(&a, &w)?;
        drop(w);
        let got = receive_fd(&b)?;
        let mut got = std::fs::File::from(got);
        got.write_all(b"via fd")?;
        drop(got);
        let mut out = String::new();
        std::fs::File::from(r).read_to_string(&mut out)?;
        assert_eq!(out, "via fd");
        Ok(())
    }

    #[test]
    fn receive_fd_should_fail_without_a_descriptor() -> io::Result<()> {
        let (mut a, b) = UnixStream::pair()?;
        a.write_all(b"no fd")?;
        assert!(receive_fd(&b).is_err());
        Ok(())
    }
}
