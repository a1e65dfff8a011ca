//! The bench's work directory and cgroup parent, swept on drop: mounts
//! under the directory, the cgroup tree in every hierarchy (deepest
//! first; both with the test kit's sweep), orphans reparented to the
//! bench, then the directory itself.

use std::path::{Path, PathBuf};

use petrel_testkit::process::{remove_cgroup_tree, unmount_under};

use anyhow::{Context, Result};
use rustix::process::WaitOptions;

/// Owns the work directory and the cgroup parent of one bench run.
pub struct Work {
    /// The work directory.
    pub dir: PathBuf,
    /// `/petrel-bench-<id>`.
    pub cgroup_parent: String,
}

impl Work {
    /// Uses `dir` (created if missing) for this run.
    pub fn create(dir: PathBuf, cgroup_parent: String) -> Result<Work> {
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let dir =
            std::fs::canonicalize(&dir).with_context(|| format!("resolve {}", dir.display()))?;
        Ok(Work { dir, cgroup_parent })
    }

    /// The run's id (the suffix of the cgroup parent).
    pub fn id(&self) -> &str {
        self.cgroup_parent
            .rsplit_once("petrel-bench-")
            .map(|(_, id)| id)
            .unwrap_or(&self.cgroup_parent)
    }

    fn sweep(&self) {
        unmount_under(&self.dir);
        for left in remove_cgroup_tree(&self.cgroup_parent) {
            eprintln!(
                "petrel-bench: cgroup {} could not be removed",
                left.display()
            );
        }
        reap_orphans();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("petrel-bench: remove {}: {e}", self.dir.display());
            }
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.sweep();
    }
}

/// Makes `dir` a tmpfs (created if missing; left as it is when already a
/// mount point), for a runtime's volatile state: on a standard host `/run`
/// is a tmpfs, where runc, containerd and Petrel keep theirs, while this
/// VM's `/run` sits on its ext4 disk. The work directory's sweep unmounts it.
pub fn volatile_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let dir = std::fs::canonicalize(dir).with_context(|| format!("resolve {}", dir.display()))?;
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(&*dir.to_string_lossy()));
    if mounted {
        return Ok(());
    }
    rustix::mount::mount(
        "petrel-bench",
        &dir,
        "tmpfs",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        c"mode=0700,size=1g",
    )
    .with_context(|| format!("mount a tmpfs at {}", dir.display()))
}

/// Reaps every exited child: the bench is a child subreaper, so inits and
/// shims orphaned by a failure end up here; PID 1 of this machine would
/// not reap them.
pub fn reap_orphans() {
    while let Ok(Some(_)) = rustix::process::waitpid(None, WaitOptions::NOHANG) {}
}
