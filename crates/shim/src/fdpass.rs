//! Receiving a descriptor over a unix socket (SCM_RIGHTS), as runc hands
//! over a terminal's master on its `--console-socket`. Used by the shim for a
//! container's terminal and by the runtime for a streaming exec's.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Receives one descriptor sent with SCM_RIGHTS on a connected socket,
/// without blocking (runc puts the terminal's name in the message body,
/// which is not needed). Extra descriptors are closed.
pub fn receive_fd(conn: &impl AsRawFd) -> io::Result<OwnedFd> {
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

    fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
        let mut fds = [-1; 2];
        // SAFETY: pipe2 writes two new descriptors into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are new and owned by nobody else.
        Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
    }

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
        let (r, w) = pipe()?;
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
