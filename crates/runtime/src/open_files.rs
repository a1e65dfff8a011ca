//! The runtime's own open-file limit.
//!
//! A runtime holds a pidfd per shim and a mount namespace per running
//! container, so a thousand containers need more descriptors than the soft
//! limit of 1024 a service usually starts with. The runtime raises its soft
//! limit to the hard one, as Go runtimes such as containerd do, while its
//! containers keep the limit it was started with (passed to runc in their
//! spec), so that programs in them that loop over every possible descriptor
//! stay fast.

use std::sync::OnceLock;

use petrel_oci::spec::OpenFileLimit;

/// The limit this process started with, recorded by the first raise.
static STARTED_WITH: OnceLock<OpenFileLimit> = OnceLock::new();

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (capped at
/// the kernel's `fs.nr_open`, above which setrlimit fails) once per process,
/// and returns the limit the process had before: the one containers get.
/// Several runtimes in one process (tests) share the first answer.
pub fn raise_once() -> OpenFileLimit {
    *STARTED_WITH.get_or_init(|| {
        let before = OpenFileLimit::current();
        let target = before.hard.min(nr_open());
        if target > before.soft {
            let limit = rustix::process::Rlimit {
                current: Some(target),
                maximum: (before.hard != u64::MAX).then_some(before.hard),
            };
            match rustix::process::setrlimit(rustix::process::Resource::Nofile, limit) {
                Ok(()) => tracing::info!(
                    from = before.soft,
                    to = target,
                    "raised the open-file limit; containers keep the one the runtime started with"
                ),
                Err(e) => tracing::warn!(
                    soft = before.soft,
                    error = %e,
                    "open-file limit not raised; about a quarter of it is left for held mount namespaces"
                ),
            }
        }
        before
    })
}

/// The kernel's ceiling for any process's descriptor limit.
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raise_once_should_lift_the_soft_limit_and_report_the_first_one() {
        let first = raise_once();
        let now = OpenFileLimit::current();
        assert_eq!(now.hard, first.hard);
        assert_eq!(now.soft, first.hard.min(nr_open()).max(first.soft));
        // A second runtime in this process is told the same starting limit.
        assert_eq!(raise_once(), first);
    }
}
