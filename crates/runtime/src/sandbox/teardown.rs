//! What a pod sandbox has on the host, undone: its PID-namespace holder,
//! its CNI network, pinned namespaces, shm mount, the cgroup directories it
//! made and its directory.

use crate::error::{Result, RuntimeError};
use crate::records::SandboxRecord;
use crate::service::Runtime;
use crate::util::remove_dir;

impl Runtime {
    /// Undoes everything a sandbox may have made, in reverse order, from
    /// what its record says and what its directory holds. Every step runs;
    /// the errors of those that failed are returned.
    pub(crate) async fn sandbox_teardown(&self, rec: &SandboxRecord) -> Result<()> {
        let mut errors: Vec<RuntimeError> = Vec::new();
        if let Some(h) = &rec.pid_holder {
            self.pods.kill_pid_holder(h);
        }
        // CNI DEL while the namespace still exists (plugins may look in it).
        if let Some(net) = &rec.network {
            if let Err(e) = self.networks.del(rec, net).await {
                errors.push(e);
            }
        }
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                errors.push(e);
            }
        };
        let dir = &rec.dir;
        // The user namespace last: the others belong to it.
        for kind in ["net", "ipc", "uts", "user"] {
            let p = dir.join(kind);
            note(
                self.pods
                    .unpin_namespace(&p)
                    .map_err(|source| RuntimeError::Namespace {
                        op: "release namespace",
                        source,
                    }),
            );
        }
        note(self.pods.unmount_shm(&dir.join("shm")));
        // Only what this pod made, and not what other pods still live in
        // (the runtime's default parent among them): see `cgroup_owner`.
        note(self.release_pod_cgroups(rec));
        note(remove_dir(dir));
        RuntimeError::all(errors)
    }
}
