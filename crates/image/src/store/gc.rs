//! Removal with untag semantics, last-use tracking and garbage collection
//! (prune, and kubelet-style disk-usage thresholds).
//!
//! Layers are reference-counted by scanning the index: a layer goes in the
//! same transaction as the last image using it. The store keeps no blobs
//! (manifests, configs and compressed layers are dropped once unpacked), so
//! layers are all there is to collect.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use petrel_store::{Op, Table};

use super::{ImageStore, Index};
use crate::{Image, ImageError};

/// The least time since an image was last used (a container created from
/// it) or stored before threshold GC may delete it, as kubelet's
/// `--minimum-image-ttl-duration` (default 2 min). It also closes the race
/// between a container create that has resolved its image and a GC that
/// listed the containers just before.
pub const GC_MIN_AGE: Duration = Duration::from_secs(120);

/// Prune leaves alone an image a container was created from this recently:
/// CreateContainer marks the image used, then records the container (well
/// under a millisecond later) before it resolves and mounts the layers, so
/// a caller that listed containers just before may not see it. (A freshly
/// pulled image is not protected: prune means "unused now".)
pub const PRUNE_USE_GUARD: Duration = Duration::from_secs(5);

/// What removing one reference does (see [`ImageStore::plan_removal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// The reference is one of several tags of the image: only that tag
    /// (and the repo digests of its repository, if no other tag of that
    /// repository remains) goes; the image stays.
    Untag {
        /// The image the tag names.
        image_id: String,
        /// The normalised tag.
        tag: String,
    },
    /// The image goes with all its names and the layers only it uses.
    Delete {
        /// The image's id.
        image_id: String,
    },
}

impl Removal {
    /// The image concerned.
    pub fn image_id(&self) -> &str {
        match self {
            Removal::Untag { image_id, .. } | Removal::Delete { image_id } => image_id,
        }
    }
}

/// Capacity and free space of the filesystem holding the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStats {
    /// Total bytes.
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users (kubelet's "available").
    pub available_bytes: u64,
}

impl DiskStats {
    /// Used percent as kubelet computes it: `100 - available * 100 / capacity`.
    pub fn usage_percent(&self) -> u64 {
        if self.capacity_bytes == 0 {
            return 0;
        }
        let avail = u128::from(self.available_bytes.min(self.capacity_bytes));
        100 - (avail * 100 / u128::from(self.capacity_bytes)) as u64
    }
}

/// What a prune or a threshold GC did.
#[derive(Debug, Clone, Default)]
pub struct GcReport {
    /// The images deleted, least recently used first.
    pub removed: Vec<Image>,
    /// Bytes of the layers deleted (as measured when unpacked).
    pub freed_bytes: u64,
    /// Filesystem usage in percent before the GC (threshold GC only).
    pub usage_before_percent: Option<u64>,
    /// Bytes the threshold GC wanted to free (0 when usage was at or below
    /// the high threshold).
    pub wanted_bytes: u64,
}

/// When each image was stored and last used, in nanoseconds since the
/// epoch. Kept in memory only, as kubelet keeps its image records: after a
/// restart every image counts as stored at the restart and never used.
#[derive(Debug, Default)]
pub(super) struct Usage {
    inner: Mutex<UsageMaps>,
}

#[derive(Debug, Default)]
struct UsageMaps {
    stored: HashMap<String, u64>,
    used: HashMap<String, u64>,
}

pub(super) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Usage {
    fn lock(&self) -> std::sync::MutexGuard<'_, UsageMaps> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that these images were stored (imported or pulled) now.
    pub(super) fn stored(&self, ids: &[String]) {
        let now = now_ns();
        let mut m = self.lock();
        for id in ids {
            m.stored.insert(id.clone(), now);
        }
    }

    fn forget(&self, id: &str) {
        let mut m = self.lock();
        m.stored.remove(id);
        m.used.remove(id);
    }

    /// `(last use or store time, last use by a container)`.
    fn times(&self, id: &str, loaded_at: u64) -> (u64, u64) {
        let m = self.lock();
        let used = m.used.get(id).copied().unwrap_or(0);
        let stored = m.stored.get(id).copied().unwrap_or(loaded_at);
        (used.max(stored), used)
    }
}

/// The images to delete, least recently used first, until `to_free` bytes
/// of layers would be freed (all candidates for `u64::MAX`), and the bytes
/// that frees. `candidates` are `(id, last use)`; a layer counts as freed
/// when every image using it is deleted.
fn plan(index: &Index, mut candidates: Vec<(String, u64)>, to_free: u64) -> (Vec<String>, u64) {
    candidates.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    let mut users: HashMap<&str, usize> = HashMap::new();
    for image in index.images.values() {
        for d in image.diff_ids.iter().collect::<HashSet<_>>() {
            *users.entry(d.as_str()).or_default() += 1;
        }
    }
    let mut chosen = Vec::new();
    let mut freed = 0u64;
    for (id, _) in candidates {
        if freed >= to_free {
            break;
        }
        let Some(image) = index.images.get(&id) else {
            continue;
        };
        for d in image.diff_ids.iter().collect::<HashSet<_>>() {
            if let Some(n) = users.get_mut(d.as_str()) {
                *n -= 1;
                if *n == 0 {
                    freed += index.layers.get(d).map_or(0, |l| l.size);
                }
            }
        }
        chosen.push(id);
    }
    (chosen, freed)
}

impl ImageStore {
    /// Records that a container is being created from image `id` (for LRU
    /// ordering and the GC's minimum age). Call before mounting its layers.
    pub fn mark_used(&self, id: &str) {
        self.usage.lock().used.insert(id.to_string(), now_ns());
    }

    /// What removing `reference` would do, or `None` if it names no image.
    /// A tag of an image with several tags untags; an id, id prefix, repo
    /// digest or an image's only tag deletes the image (as `docker rmi`).
    pub fn plan_removal(&self, reference: &str) -> Option<Removal> {
        let index = self.read_index();
        let image = index.resolve(reference)?;
        let tag = crate::reference::parse(reference.trim())
            .ok()
            .filter(|r| r.digest.is_none())
            .map(|r| r.to_string())
            .filter(|t| index.tags.get(t) == Some(&image.id));
        Some(match tag {
            Some(tag) if image.repo_tags.len() > 1 => Removal::Untag {
                image_id: image.id.clone(),
                tag,
            },
            _ => Removal::Delete {
                image_id: image.id.clone(),
            },
        })
    }

    /// Carries out a [`Removal`] planned by [`plan_removal`](Self::plan_removal).
    /// Whether a container uses the image is the caller's business (an
    /// untag never matters to containers: they hold the id). Returns the
    /// bytes of layers freed.
    pub fn apply_removal(&self, removal: &Removal) -> Result<u64, ImageError> {
        let _writer = self.lock_writer();
        match removal {
            Removal::Delete { image_id } => {
                let (removed, freed) = self.delete_locked(std::slice::from_ref(image_id))?;
                if removed.is_empty() {
                    return Err(ImageError::NotFound(format!("image {image_id}")));
                }
                Ok(freed)
            }
            Removal::Untag { image_id, tag } => {
                let mut image = self
                    .read_index()
                    .images
                    .get(image_id)
                    .cloned()
                    .ok_or_else(|| ImageError::NotFound(format!("image {image_id}")))?;
                if !image.repo_tags.contains(tag) {
                    return Err(ImageError::NotFound(format!(
                        "tag {tag} of image {image_id}"
                    )));
                }
                if image.repo_tags.len() == 1 {
                    // Its other tags went meanwhile: this is the last name.
                    return self
                        .delete_locked(std::slice::from_ref(image_id))
                        .map(|r| r.1);
                }
                image.repo_tags.retain(|t| t != tag);
                let repo = crate::reference::parse(tag).map(|r| r.name).ok();
                if let Some(repo) = repo {
                    let kept = image
                        .repo_tags
                        .iter()
                        .any(|t| crate::reference::parse(t).is_ok_and(|r| r.name == repo));
                    if !kept {
                        let prefix = format!("{repo}@");
                        image.repo_digests.retain(|d| !d.starts_with(&prefix));
                    }
                }
                self.db.apply(vec![Op::Put(
                    Table::Images,
                    image.id.clone(),
                    petrel_store::encode(
                        Table::Images,
                        &image.id,
                        &super::ImageRecord::from(&image),
                    )?,
                )])?;
                self.write_index().insert(image);
                tracing::info!(image.id = %image_id, tag = %tag, "image untagged");
                Ok(0)
            }
        }
    }

    /// Deletes every image not in `in_use` (ids), except those a container
    /// was created from in the last [`PRUNE_USE_GUARD`] (it may not be
    /// listed yet).
    pub fn prune(&self, in_use: &HashSet<String>) -> Result<GcReport, ImageError> {
        let _writer = self.lock_writer();
        let now = now_ns();
        let guard = PRUNE_USE_GUARD.as_nanos() as u64;
        let candidates = self.candidates(in_use, |_, used| now.saturating_sub(used) >= guard);
        let (ids, _) = plan(&self.read_index(), candidates, u64::MAX);
        let (removed, freed_bytes) = self.delete_locked(&ids)?;
        Ok(GcReport {
            removed,
            freed_bytes,
            ..GcReport::default()
        })
    }

    /// Kubelet's image GC: when the store's filesystem is more than `high`
    /// percent used, deletes unused images (not in `in_use`, older than
    /// [`GC_MIN_AGE`]), least recently used first, until the layers freed
    /// bring usage down to `low` percent (or no candidate is left).
    pub fn gc_to_threshold(
        &self,
        high: u8,
        low: u8,
        in_use: &HashSet<String>,
    ) -> Result<GcReport, ImageError> {
        let stats = rustix::fs::statvfs(&self.root)
            .map_err(|e| ImageError::io("statvfs", &self.root, e))?;
        let disk = DiskStats {
            capacity_bytes: stats.f_blocks.saturating_mul(stats.f_frsize),
            available_bytes: stats.f_bavail.saturating_mul(stats.f_frsize),
        };
        self.gc_with(disk, high, low, in_use, GC_MIN_AGE)
    }

    /// [`gc_to_threshold`](Self::gc_to_threshold) against given disk stats
    /// and minimum age (for callers that measure the disk themselves, and
    /// tests).
    pub fn gc_with(
        &self,
        disk: DiskStats,
        high: u8,
        low: u8,
        in_use: &HashSet<String>,
        min_age: Duration,
    ) -> Result<GcReport, ImageError> {
        if low > high || high > 100 {
            return Err(ImageError::Unsupported(format!(
                "image GC thresholds low {low}% and high {high}%: need low <= high <= 100"
            )));
        }
        let usage = disk.usage_percent();
        let mut report = GcReport {
            usage_before_percent: Some(usage),
            ..GcReport::default()
        };
        if usage <= u64::from(high) {
            return Ok(report);
        }
        // kubelet: amountToFree = capacity * (100 - low) / 100 - available.
        let target_available =
            (u128::from(disk.capacity_bytes) * u128::from(100 - low) / 100) as u64;
        report.wanted_bytes = target_available.saturating_sub(disk.available_bytes);
        let _writer = self.lock_writer();
        let now = now_ns();
        let min_age = min_age.as_nanos() as u64;
        let candidates = self.candidates(in_use, |last, _| now.saturating_sub(last) >= min_age);
        let (ids, _) = plan(&self.read_index(), candidates, report.wanted_bytes);
        let (removed, freed) = self.delete_locked(&ids)?;
        report.removed = removed;
        report.freed_bytes = freed;
        if freed < report.wanted_bytes {
            tracing::warn!(
                wanted = report.wanted_bytes,
                freed,
                "image GC could not free enough: the rest is in use or too recent"
            );
        }
        Ok(report)
    }

    /// Unused images `keep(last use or store, last container use)` allows,
    /// with their LRU key.
    fn candidates(
        &self,
        in_use: &HashSet<String>,
        keep: impl Fn(u64, u64) -> bool,
    ) -> Vec<(String, u64)> {
        let index = self.read_index();
        index
            .images
            .keys()
            .filter(|id| !in_use.contains(*id))
            .filter_map(|id| {
                let (last, used) = self.usage.times(id, self.loaded_at);
                keep(last, used).then(|| (id.clone(), last))
            })
            .collect()
    }

    /// Deletes these images (absent ids are skipped) and the layers no
    /// remaining image uses, in one transaction. The writer lock must be
    /// held. Returns the images deleted and the layer bytes freed.
    fn delete_locked(&self, ids: &[String]) -> Result<(Vec<Image>, u64), ImageError> {
        let (removed, unused, freed) = {
            let index = self.read_index();
            let doomed: HashSet<&String> = ids.iter().collect();
            let removed: Vec<Image> = ids
                .iter()
                .filter_map(|id| index.images.get(id).cloned())
                .collect();
            let still_used: HashSet<&String> = index
                .images
                .values()
                .filter(|i| !doomed.contains(&i.id))
                .flat_map(|i| &i.diff_ids)
                .collect();
            let unused: HashSet<String> = removed
                .iter()
                .flat_map(|i| &i.diff_ids)
                .filter(|d| !still_used.contains(d) && index.layers.contains_key(*d))
                .cloned()
                .collect();
            let freed = unused
                .iter()
                .filter_map(|d| index.layers.get(d))
                .map(|l| l.size)
                .sum::<u64>();
            (removed, unused, freed)
        };
        if removed.is_empty() {
            return Ok((removed, 0));
        }
        let mut ops: Vec<Op> = removed
            .iter()
            .map(|i| Op::Delete(Table::Images, i.id.clone()))
            .collect();
        ops.extend(unused.iter().map(|d| Op::Delete(Table::Layers, d.clone())));
        self.db.apply(ops)?;
        {
            let mut index = self.write_index();
            for i in &removed {
                index.remove(&i.id);
            }
            for d in &unused {
                index.layers.remove(d);
            }
        }
        for i in &removed {
            self.usage.forget(&i.id);
        }
        // Metadata first: a crash now leaves unreferenced directories (in
        // tmp/ or layers/), never an image whose layer is gone.
        for d in &unused {
            self.discard_layer_dir(d);
        }
        for i in &removed {
            tracing::info!(image.id = %i.id, "image removed");
        }
        tracing::info!(
            images = removed.len(),
            layers = unused.len(),
            freed_bytes = freed,
            "images deleted"
        );
        Ok((removed, freed))
    }
}

#[cfg(test)]
mod tests {
    use super::super::LayerRecord;
    use super::*;

    fn image(id: &str, layers: &[&str]) -> Image {
        Image {
            id: id.to_string(),
            repo_tags: Vec::new(),
            repo_digests: Vec::new(),
            size: 0,
            config: oci_spec::image::ImageConfiguration::default(),
            diff_ids: layers.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn index(images: &[Image], layers: &[(&str, u64)]) -> Index {
        let mut ix = Index::default();
        for i in images {
            ix.insert(i.clone());
        }
        for (d, size) in layers {
            ix.layers.insert(
                d.to_string(),
                LayerRecord {
                    diff_id: d.to_string(),
                    size: *size,
                    inodes: 1,
                },
            );
        }
        ix
    }

    #[test]
    fn plan_should_take_least_recently_used_first_and_stop_once_enough_is_freed() {
        let ix = index(
            &[
                image("a", &["l1"]),
                image("b", &["l2"]),
                image("c", &["l3"]),
            ],
            &[("l1", 10), ("l2", 20), ("l3", 40)],
        );
        let cands = vec![("a".into(), 30), ("b".into(), 10), ("c".into(), 20)];
        let (ids, freed) = plan(&ix, cands.clone(), 50);
        assert_eq!(ids, vec!["b".to_string(), "c".to_string()]);
        assert_eq!(freed, 60);
        let (ids, freed) = plan(&ix, cands, u64::MAX);
        assert_eq!(ids.len(), 3);
        assert_eq!(freed, 70);
    }

    #[test]
    fn plan_should_count_a_shared_layer_only_when_its_last_user_goes() {
        // l1 is shared with "kept", which is no candidate (in use).
        let ix = index(
            &[
                image("a", &["l1", "l2", "l2"]),
                image("b", &["l1", "l3"]),
                image("kept", &["l1"]),
            ],
            &[("l1", 100), ("l2", 5), ("l3", 7)],
        );
        let (ids, freed) = plan(&ix, vec![("a".into(), 1), ("b".into(), 2)], u64::MAX);
        assert_eq!(ids.len(), 2);
        assert_eq!(freed, 12, "l1 stays for the image in use");
    }

    #[test]
    fn usage_percent_should_follow_kubelet() {
        let d = DiskStats {
            capacity_bytes: 1000,
            available_bytes: 150,
        };
        assert_eq!(d.usage_percent(), 85);
        let empty = DiskStats {
            capacity_bytes: 0,
            available_bytes: 0,
        };
        assert_eq!(empty.usage_percent(), 0);
    }
}
