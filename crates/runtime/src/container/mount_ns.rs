//! A container init's mount namespace, held open by the runtime so that the
//! kernel tears it down when the runtime lets go of it instead of on the
//! exit's path, within a budget of file descriptors.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::util;

/// Namespaces held by every runtime in this process: the descriptor limit
/// is the process's.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Share of the soft RLIMIT_NOFILE that held namespaces may use (the
/// runtime also keeps a pidfd per shim, sockets and files).
const BUDGET_DIVISOR: u64 = 4;

/// One held mount namespace; dropping it closes it, and the kernel tears
/// the namespace down then if the init is gone.
#[derive(Debug)]
pub struct HeldNamespace {
    _fd: OwnedFd,
}

impl Drop for HeldNamespace {
    fn drop(&mut self) {
        HELD.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Opens and holds the mount namespace of the process `pid` started at
/// `start_time`, unless the held namespaces already use their share of
/// the descriptor limit.
pub fn hold(pid: u32, start_time: u64) -> io::Result<HeldNamespace> {
    let budget = budget();
    if !try_reserve(&HELD, budget) {
        return Err(io::Error::other(format!(
            "{budget} mount namespaces are held already (1/{BUDGET_DIVISOR} of RLIMIT_NOFILE)"
        )));
    }
    match open(pid, start_time) {
        Ok(fd) => Ok(HeldNamespace { _fd: fd }),
        Err(e) => {
            HELD.fetch_sub(1, Ordering::AcqRel);
            Err(e)
        }
    }
}

/// Opens the mount namespace of the process `pid` if it is still the one
/// that started at `start_time`. The identity is checked after the open:
/// a pid is never reused while its process lives, so a match proves the
/// namespace is that process's.
fn open(pid: u32, start_time: u64) -> io::Result<OwnedFd> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))?;
    if start_time == 0 || util::process_start_time(pid) != Some(start_time) {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(ns.into())
}

fn budget() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the one struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    usize::try_from(lim.rlim_cur / BUDGET_DIVISOR).unwrap_or(usize::MAX)
}

/// Takes one of `budget` slots counted by `counter`.
fn try_reserve(counter: &AtomicUsize, budget: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < budget).then_some(n + 1)
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_reserve_should_stop_at_the_budget() {
        let counter = AtomicUsize::new(0);
        assert!(try_reserve(&counter, 2));
        assert!(try_reserve(&counter, 2));
        assert!(!try_reserve(&counter, 2));
        assert_eq!(counter.load(Ordering::Acquire), 2);
        counter.fetch_sub(1, Ordering::AcqRel);
        assert!(try_reserve(&counter, 2));
    }

    #[test]
    fn budget_should_be_a_quarter_of_the_soft_descriptor_limit() {
        let b = budget();
        assert!(b > 0, "budget {b}");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the one struct we pass.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(b as u64, lim.rlim_cur / BUDGET_DIVISOR);
    }
}
