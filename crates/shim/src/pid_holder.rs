//! `petrel-shim --pid-holder`: the init of a pod's shared PID namespace.
//!
//! The process unshares a PID namespace and forks the namespace's init,
//! prints the init's pid (as seen from the caller's namespace) on standard
//! output and exits. The init leaves the caller's session, lets go of the
//! caller's stdio, and then only reaps the orphans that the namespace hands
//! it, asleep in `sigwaitinfo` otherwise. As a namespace init it ignores
//! every signal it has no handler for, except SIGKILL from outside, which is
//! how the runtime ends it (and the namespace with it).
//!
//! Given a user namespace file (a pod's own user namespace, pinned by the
//! runtime), the holder joins it first, so that the PID namespace belongs
//! to it: the pod's containers, root in that user namespace, can then
//! mount their `/proc`.

use std::path::Path;

use crate::sys;

/// Runs the holder's parent side, in the user namespace at `userns` when
/// given; returns the exit code.
pub fn run(userns: Option<&Path>) -> i32 {
    if let Some(path) = userns {
        if let Err(e) = join_user_namespace(path) {
            eprintln!("petrel-shim: join user namespace {}: {e}", path.display());
            return 1;
        }
    }
    // SAFETY: unshare with one flag; it changes the namespace of the
    // children forked from now on, not ours.
    if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
        eprintln!(
            "petrel-shim: unshare pid namespace: {}",
            std::io::Error::last_os_error()
        );
        return 1;
    }
    // SAFETY: the process is single-threaded, so the child is a complete
    // copy; it runs only `hold`, which never returns.
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!(
                "petrel-shim: fork pid namespace init: {}",
                std::io::Error::last_os_error()
            );
            1
        }
        0 => hold(),
        pid => match sys::write_all_fd(libc::STDOUT_FILENO, format!("{pid}\n").as_bytes()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("petrel-shim: write pid: {e}");
                1
            }
        },
    }
}

/// setns(2) into the user namespace pinned at `path` (the process is
/// single-threaded, as joining a user namespace requires).
fn join_user_namespace(path: &Path) -> std::io::Result<()> {
    let f = sys::open_raw(path, libc::O_RDONLY)?;
    // SAFETY: setns on a descriptor we own; it changes only this process.
    if unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWUSER) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The namespace init: reaps forever.
fn hold() -> ! {
    let _ = sys::setsid();
    let _ = std::env::set_current_dir("/");
    // Release the caller's pipes, so that it sees EOF when the parent exits.
    if let Ok(null) = sys::open_raw(Path::new("/dev/null"), libc::O_RDWR) {
        for fd in [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO] {
            let _ = sys::replace_fd(&null, fd);
        }
    }
    let chld = match sys::block_into_signalfd(&[libc::SIGCHLD]) {
        Ok(fd) => fd,
        // Without it there is nothing to wait on; idle without reaping.
        Err(_) => loop {
            // SAFETY: pause takes no arguments.
            unsafe { libc::pause() };
        },
    };
    loop {
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&chld),
            events: libc::POLLIN,
            revents: 0,
        };
        let _ = sys::poll(std::slice::from_mut(&mut pfd), -1);
        while let Ok(Some(_)) = sys::read_signal(&chld) {}
        while sys::reap_any().is_some() {}
    }
}
