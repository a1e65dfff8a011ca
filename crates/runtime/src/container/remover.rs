//! A removed container's remains, taken off RemoveContainer's path.
//!
//! RemoveContainer of an exited container only detaches its rootfs and
//! image volumes (nothing can use them any more), renames its bundle and
//! writable layer into the trash (one rename each, [`Trash::take`]),
//! commits the record's deletion and returns. The one background
//! [`Remover`] then, container after container: deletes the container from
//! the OCI runtime (its state directory and cgroups), lets go of its mount
//! namespace (the kernel tears it down then) and removes both trees (after
//! unmounting whatever a crash left mounted in a trashed bundle).
//!
//! Nothing left is visible as the container: its record, name and listing
//! entry are gone when the call returns, and a new container never shares
//! an id. What must be gone before something else can happen waits for it:
//! RemovePodSandbox finishes the OCI runtime's part of its containers'
//! removals itself ([`Remover::finish_pod`]) before it removes the pod's
//! cgroup. A crash leaves the trash to the start-up sweep (recovery), which
//! also completes a removal whose rename happened but whose deletion was
//! not committed.
//!
//! The trash is `<root>/trash` (writable layers, on the file system of
//! `<root>/containers`) and `<state>/trash` (bundles); what is in it still
//! counts in ImageFsInfo's container file system until it is removed.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Notify};

use crate::container::mount_ns::HeldNamespace;
use crate::error::{Result, RuntimeError};
use crate::parts::{CgroupOps, OciRuntime, RootfsMounter};
use crate::service::Layout;
use crate::state::Container;
use crate::util::is_id;

/// The two trash directories: one per file system a container's files
/// live on, so that moving them there is a rename.
#[derive(Debug, Clone)]
pub(crate) struct Trash {
    bundles: PathBuf,
    layers: PathBuf,
}

/// Why [`Trash::take`] could not move a container's files.
#[derive(Debug)]
pub(crate) enum TakeError {
    /// The trash is on another file system (a rename cannot move it):
    /// nothing was moved, the files are to be removed in place.
    OtherFileSystem,
    /// Another failure, naming the path.
    Failed(RuntimeError),
}

impl Trash {
    /// The trash of a runtime's directories.
    pub fn of(layout: &Layout) -> Self {
        Self {
            bundles: layout.state.join("trash"),
            layers: layout.root.join("trash"),
        }
    }

    /// Both trash directories (created with the runtime's others).
    pub fn dirs(&self) -> [&Path; 2] {
        [&self.bundles, &self.layers]
    }

    /// The trash of writable layers.
    pub fn layers_dir(&self) -> &Path {
        &self.layers
    }

    /// Where container `id`'s bundle goes.
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.bundles.join(id)
    }

    /// Where container `id`'s writable layer goes.
    pub fn layer(&self, id: &str) -> PathBuf {
        self.layers.join(id)
    }

    /// Moves container `id`'s bundle and writable layer into the trash,
    /// one rename each; a missing one (moved by an earlier try) is fine.
    /// The renames are not synced: whichever of them a crash loses, the
    /// files are found again, in the trash or where they were, and removed
    /// by recovery either way.
    pub fn take(
        &self,
        id: &str,
        bundle: &Path,
        layer: &Path,
    ) -> std::result::Result<(), TakeError> {
        let moved = [(bundle, self.bundle(id)), (layer, self.layer(id))];
        for (i, (from, to)) in moved.iter().enumerate() {
            match std::fs::rename(from, to) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                    // All or nothing: what moved already goes back (the
                    // same rename, the other way).
                    for (from, to) in &moved[..i] {
                        if let Err(e) = std::fs::rename(to, from) {
                            if e.kind() != io::ErrorKind::NotFound {
                                return Err(TakeError::Failed(RuntimeError::io(
                                    "move back from trash",
                                    to,
                                    e,
                                )));
                            }
                        }
                    }
                    return Err(TakeError::OtherFileSystem);
                }
                Err(e) => {
                    return Err(TakeError::Failed(RuntimeError::io(
                        "move to trash",
                        from,
                        e,
                    )))
                }
            }
        }
        Ok(())
    }

    /// The ids of containers with something in the trash.
    pub fn ids(&self) -> BTreeSet<String> {
        self.dirs()
            .into_iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flat_map(|it| it.flatten())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| is_id(n))
            .collect()
    }
}

/// The OCI runtime's part of a queued removal: the container (whose
/// `runc_deleted` lock orders it with the exit's own cleanup) and its
/// cgroup.
#[derive(Debug, Clone)]
struct RuncPart {
    container: Arc<Container>,
    sandbox_id: String,
    cgroup: String,
}

/// One removal: a container's, or the start-up sweep's of trash alone.
#[derive(Debug)]
struct Job {
    id: String,
    runc: bool,
    mount_ns: Option<HeldNamespace>,
}

/// The parts the remover drives, shared with its task.
#[derive(Debug)]
struct Shared {
    oci: Arc<dyn OciRuntime>,
    cgroups: Arc<dyn CgroupOps>,
    rootfs: Arc<dyn RootfsMounter>,
    trash: Trash,
    /// Removals whose OCI runtime part is still to do, by container id.
    pending: Mutex<HashMap<String, RuncPart>>,
    /// Jobs queued or under way.
    queued: AtomicUsize,
    /// Told when `queued` drops to zero.
    idle: Notify,
}

/// The one background remover of a runtime (see the module's doc).
#[derive(Debug)]
pub(crate) struct Remover {
    tx: mpsc::UnboundedSender<Job>,
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Remover {
    /// Starts the remover's task (within a tokio runtime); it ends when
    /// the remover is dropped.
    pub fn start(
        oci: Arc<dyn OciRuntime>,
        cgroups: Arc<dyn CgroupOps>,
        rootfs: Arc<dyn RootfsMounter>,
        trash: Trash,
    ) -> Self {
        let shared = Arc::new(Shared {
            oci,
            cgroups,
            rootfs,
            trash,
            pending: Mutex::new(HashMap::new()),
            queued: AtomicUsize::new(0),
            idle: Notify::new(),
        });
        let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
        let task = shared.clone();
        tokio::spawn(async move {
            while let Some(job) = rx.recv().await {
                task.run(job).await;
                if task.queued.fetch_sub(1, Ordering::AcqRel) == 1 {
                    task.idle.notify_waiters();
                }
            }
        });
        Self { tx, shared }
    }

    /// The trash the remover empties.
    pub fn trash(&self) -> &Trash {
        &self.shared.trash
    }

    /// Queues what is left of container `c` once its files are in the
    /// trash and its record deleted: the OCI runtime's part (in the pod
    /// `sandbox_id`, cgroup `cgroup`), then the files.
    pub fn remove(
        &self,
        c: Arc<Container>,
        sandbox_id: String,
        cgroup: String,
        mount_ns: Option<HeldNamespace>,
    ) {
        let id = c.id.clone();
        lock(&self.shared.pending).insert(
            id.clone(),
            RuncPart {
                container: c,
                sandbox_id,
                cgroup,
            },
        );
        self.queue(Job {
            id,
            runc: true,
            mount_ns,
        });
    }

    /// Queues the removal of what the trash holds of container `id` (the
    /// start-up sweep).
    pub fn sweep(&self, id: String) {
        self.queue(Job {
            id,
            runc: false,
            mount_ns: None,
        });
    }

    fn queue(&self, job: Job) {
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(job)) = self.tx.send(job) {
            // The task is gone (the tokio runtime shuts down): the trash
            // waits for the next start.
            tracing::debug!(container.id = %job.id, "remover stopped; removal left to the next start");
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Does now the OCI runtime's part of the queued removals of pod
    /// `sandbox_id`'s containers (their cgroups are inside the pod's),
    /// all at once; the first failure is returned (and the part stays
    /// queued, for the next try).
    pub async fn finish_pod(&self, sandbox_id: &str) -> Result<()> {
        let parts: Vec<RuncPart> = lock(&self.shared.pending)
            .values()
            .filter(|p| p.sandbox_id == sandbox_id)
            .cloned()
            .collect();
        let done =
            futures_util::future::join_all(parts.iter().map(|p| self.shared.delete(p))).await;
        done.into_iter().collect::<Result<Vec<()>>>().map(drop)
    }

    /// Completes once nothing is queued or under way.
    pub async fn idle(&self) {
        loop {
            let notified = self.shared.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.queued.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Shared {
    async fn run(&self, job: Job) {
        if job.runc {
            let part = lock(&self.pending).get(&job.id).cloned();
            if let Some(part) = part {
                if let Err(e) = self.delete(&part).await {
                    // Kept pending: RemovePodSandbox tries again, and
                    // start-up recovery deletes what runc still knows.
                    tracing::warn!(container.id = %job.id, error = %e, "removed container not deleted from the OCI runtime");
                }
            }
        }
        let (rootfs, trash, id) = (self.rootfs.clone(), self.trash.clone(), job.id.clone());
        let mount_ns = job.mount_ns;
        let files = tokio::task::spawn_blocking(move || {
            // The namespace's teardown (its copy of the rootfs mount among
            // the rest) comes before the rootfs is removed.
            drop(mount_ns);
            crate::container::teardown::remove_container_files(
                rootfs.as_ref(),
                &trash.bundle(&id),
                &trash.layer(&id),
            )
        })
        .await
        .unwrap_or_else(|e| vec![RuntimeError::task("remove container files", e)]);
        for e in files {
            tracing::warn!(container.id = %job.id, error = %e, "removed container's files not removed; the next start tries again");
        }
        tracing::debug!(container.id = %job.id, "removed container's remains gone");
    }

    /// The OCI runtime's part of a removal: the container deleted from it
    /// (unless the exit's cleanup did), then its cgroup (runc removes it;
    /// one that never reached runc may have left it empty).
    async fn delete(&self, part: &RuncPart) -> Result<()> {
        let c = &part.container;
        let mut deleted = c.runc_deleted.lock().await;
        // A container never given to runc (not started, or its failed start
        // undone) has nothing there to delete.
        if !*deleted && c.record().in_oci_runtime() {
            self.oci
                .delete(&c.id, true)
                .await
                .map_err(RuntimeError::from)?;
            *deleted = true;
        }
        drop(deleted);
        if let Err(e) = self.cgroups.remove(&part.cgroup) {
            tracing::debug!(container.id = %c.id, cgroup = %part.cgroup, error = %e, "container cgroup not removed");
        }
        lock(&self.pending).remove(&c.id);
        Ok(())
    }
}
