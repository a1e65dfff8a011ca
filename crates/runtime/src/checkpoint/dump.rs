//! A running container checkpointed into an archive, left running.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use petrel_oci::runc::CheckpointOptions;

use super::archive::{self, ArchiveParts, ConfigDump};
use crate::error::{Result, RuntimeError};
use crate::records::ContainerState;
use crate::service::Runtime;
use crate::state::Container;
use crate::util;

/// RFC 3339 with nanoseconds, UTC, as Go's JSON writes times.
fn rfc3339(ns: i64) -> String {
    let mut buf = [0u8; petrel_shim::time::TIMESTAMP_LEN];
    petrel_shim::time::format_rfc3339_nano(ns, &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Removes the checkpoint's working directory, whatever happened.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.0.display(), error = %e, "checkpoint work directory not removed");
            }
        }
    }
}

/// The answer of a checkpoint that did not finish in time.
fn too_late(id: &str, timeout: Duration) -> RuntimeError {
    RuntimeError::DeadlineExceeded(format!(
        "checkpoint of container {id} did not finish within {timeout:?}"
    ))
}

impl Runtime {
    /// Checkpoints the running container `c` into the archive `location`
    /// (CheckpointContainer), leaving it running. The call is bounded by
    /// `timeout`: past it, it fails with DEADLINE_EXCEEDED and no archive is
    /// put in place. A dump under way is not cut short, though: runc and
    /// CRIU killed while CRIU has the container seized (its parasite code
    /// inside, the freezer cgroup frozen) may leave it broken or frozen
    /// (seen here), so the dump finishes on its own task, its result
    /// discarded and its files removed. Returns the archive's size.
    pub(crate) async fn container_checkpoint(
        self: &Arc<Self>,
        c: &Arc<Container>,
        location: &Path,
        timeout: Duration,
    ) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        let (rt, task_c, task_location) = (self.clone(), c.clone(), location.to_path_buf());
        let task = tokio::spawn(async move {
            rt.checkpoint_until(&task_c, &task_location, deadline, timeout)
                .await
        });
        match tokio::time::timeout_at(deadline.into(), task).await {
            Ok(joined) => joined.map_err(|e| RuntimeError::task("checkpoint", e))?,
            Err(_) => Err(too_late(&c.id, timeout)),
        }
    }

    /// [`Runtime::container_checkpoint`]'s work, to its end.
    async fn checkpoint_until(
        self: &Arc<Self>,
        c: &Arc<Container>,
        location: &Path,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<u64> {
        // Ordered with stops, removals and exits of the container.
        let _op = c.op.lock().await;
        let rec = c.record();
        if rec.state != ContainerState::Running {
            return Err(RuntimeError::FailedPrecondition(format!(
                "container {} is {:?}: only a running container can be checkpointed",
                rec.id, rec.state
            )));
        }
        if rec.config.tty {
            return Err(RuntimeError::FailedPrecondition(format!(
                "container {} has a terminal, which CRIU cannot checkpoint",
                rec.id
            )));
        }
        let criu = self.criu_binary()?;
        let work = WorkDir(self.layout.root.join("checkpoints").join(format!(
            "{}-{}",
            rec.id,
            &util::new_id().map_err(RuntimeError::Id)?[..8]
        )));
        let images = work.0.join(archive::CHECKPOINT_DIR);
        let criu_work = work.0.join("work");
        for dir in [&images, &criu_work] {
            petrel_fs::create_private_dir_all(dir, petrel_fs::PRIVATE)
                .map_err(|e| RuntimeError::dir("create checkpoint directory", e))?;
        }
        let opts = CheckpointOptions {
            criu: &criu,
            image_dir: &images,
            work_dir: &criu_work,
        };
        let t0 = Instant::now();
        self.oci.checkpoint(&rec.id, &opts).await?;
        let t_dump = t0.elapsed();
        if Instant::now() > deadline {
            return Err(too_late(&rec.id, timeout));
        }

        let image = self.images.get(&rec.image_id);
        let user_image = rec
            .config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let config = ConfigDump {
            id: rec.id.clone(),
            name: rec
                .config
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            rootfs_image: user_image.clone(),
            rootfs_image_ref: rec.image_id.clone(),
            rootfs_image_name: image
                .and_then(|i| i.repo_tags.first().cloned())
                .unwrap_or(user_image),
            runtime: self
                .oci
                .binary()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            created_time: rfc3339(rec.created_at),
            checkpointed_at: rfc3339(util::now_ns()),
            restored_at: archive::ZERO_TIME.to_string(),
            restored: rec.restored_from.is_some(),
        };
        let status = serde_json::to_vec(&self.container_status(c)).map_err(|source| {
            RuntimeError::Encode {
                what: "status.dump",
                source,
            }
        })?;
        let (location, id) = (location.to_path_buf(), rec.id.clone());
        let (bundle, layer_dir, log) = (rec.bundle.clone(), rec.layer_dir.clone(), rec.log_path);
        let written = tokio::task::spawn_blocking(move || -> Result<u64> {
            let spec_path = bundle.join("config.json");
            let spec =
                std::fs::read(&spec_path).map_err(|e| RuntimeError::io("read", &spec_path, e))?;
            let diff = work.0.join(archive::ROOTFS_DIFF);
            let upper = crate::container::rootfs::WritableLayer::new(&layer_dir).upper;
            petrel_image::archive_diff(&upper, &diff).map_err(|source| {
                archive::ArchiveError::Diff {
                    path: upper.clone(),
                    source,
                }
            })?;
            // runc has CRIU write its log and statistics to the work path.
            let stats = criu_work.join(archive::STATS_DUMP);
            let dump_log = criu_work.join(archive::DUMP_LOG);
            let size = archive::write_archive(
                &location,
                &ArchiveParts {
                    images: &images,
                    config: &config,
                    spec: &spec,
                    status: &status,
                    rootfs_diff: Some(&diff),
                    dump_log: Some(&dump_log),
                    stats_dump: Some(&stats),
                    container_log: log.as_deref(),
                    deadline: Some(deadline),
                },
            )?;
            drop(work);
            Ok(size)
        })
        .await
        .map_err(|e| RuntimeError::task("write checkpoint archive", e))?;
        let size = written.map_err(|e| match e {
            RuntimeError::Checkpoint(archive::ArchiveError::Deadline { .. }) => {
                too_late(&id, timeout)
            }
            other => other,
        })?;
        tracing::info!(
            container.id = %id,
            bytes = size,
            dump_ms = t_dump.as_millis() as u64,
            total_ms = t0.elapsed().as_millis() as u64,
            "container checkpointed"
        );
        Ok(size)
    }
}
