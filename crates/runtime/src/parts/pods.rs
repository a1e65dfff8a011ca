//! The kernel seam of pod sandboxes: pinning and releasing their
//! namespaces, their `/dev/shm` tmpfs, and killing their PID-namespace
//! holder; and, for recovery, whether a pin and a holder are still there. The holder is started through [`super::ShimLauncher`]; the pod
//! cgroup goes through [`super::CgroupOps`].

use std::path::Path;

use crate::error::Result;
use crate::records::ProcessRef;
use crate::sandbox::namespaces::{self, NamespaceError, NamespaceRequest, Pinned};
use crate::sandbox::{files, pid_holder};

/// What a pod sandbox asks of the kernel.
pub trait PodKernel: Send + Sync + std::fmt::Debug {
    /// Creates the namespaces `req` asks for and pins them as files `net`,
    /// `ipc` and `uts` in `dir`; nothing is left behind on failure.
    /// Blocking.
    fn pin_namespaces(&self, dir: &Path, req: &NamespaceRequest) -> Result<Pinned, NamespaceError>;

    /// Releases one pinned namespace; one that is gone already is fine.
    fn unpin_namespace(&self, path: &Path) -> Result<(), NamespaceError>;

    /// Mounts the pod's `/dev/shm` tmpfs of `size` bytes at `path`
    /// (created if missing).
    fn mount_shm(&self, path: &Path, size: u64) -> Result<()>;

    /// Unmounts the shm tmpfs at `path` (not mounted or missing is fine).
    fn unmount_shm(&self, path: &Path) -> Result<()>;

    /// Kills the PID-namespace holder, if it is still the process started,
    /// and reaps it.
    fn kill_pid_holder(&self, holder: &ProcessRef);

    /// Whether the namespace pinned at `path` is still there (a reboot
    /// loses every pin).
    fn namespace_pinned(&self, path: &Path) -> bool;

    /// Whether the PID-namespace holder is still the process started.
    fn pid_holder_alive(&self, holder: &ProcessRef) -> bool;
}

/// The host's kernel.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostPods;

impl PodKernel for HostPods {
    fn pin_namespaces(&self, dir: &Path, req: &NamespaceRequest) -> Result<Pinned, NamespaceError> {
        namespaces::pin(dir, req)
    }

    fn unpin_namespace(&self, path: &Path) -> Result<(), NamespaceError> {
        namespaces::unpin(path)
    }

    fn mount_shm(&self, path: &Path, size: u64) -> Result<()> {
        files::mount_shm(path, size)
    }

    fn unmount_shm(&self, path: &Path) -> Result<()> {
        files::unmount(path)
    }

    fn kill_pid_holder(&self, holder: &ProcessRef) {
        pid_holder::kill(holder);
    }

    fn namespace_pinned(&self, path: &Path) -> bool {
        path.exists()
    }

    fn pid_holder_alive(&self, holder: &ProcessRef) -> bool {
        crate::util::process_alive(holder.pid, holder.start_time)
    }
}
