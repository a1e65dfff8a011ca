//! Admin GarbageCollectImages: prune, or kubelet-style threshold GC of the
//! image store. Images some container (in any state) was created from are
//! never deleted.

use std::sync::Arc;

use petrel_cri::admin as adm;

use crate::error::{Result, RuntimeError};
use crate::service::Runtime;

impl Runtime {
    /// GarbageCollectImages.
    pub(crate) async fn garbage_collect_images(
        self: &Arc<Self>,
        req: adm::GarbageCollectImagesRequest,
    ) -> Result<adm::GarbageCollectImagesResponse> {
        let (high, low) = if req.prune {
            (0, 0)
        } else {
            let high = percent(req.high_threshold_percent, "high_threshold_percent")?;
            let low = percent(req.low_threshold_percent, "low_threshold_percent")?;
            if low > high {
                return Err(RuntimeError::invalid(
                    "low_threshold_percent",
                    format!("{low} is above high_threshold_percent {high}"),
                ));
            }
            (high, low)
        };
        let in_use = self.images_in_use();
        let rt = self.clone();
        let prune = req.prune;
        let report = tokio::task::spawn_blocking(move || {
            if prune {
                rt.images.prune(&in_use)
            } else {
                rt.images.gc_to_threshold(high, low, &in_use)
            }
        })
        .await
        .map_err(|e| RuntimeError::task("garbage collect images", e))??;
        tracing::info!(
            prune,
            removed = report.removed.len(),
            freed_bytes = report.freed_bytes,
            usage_before = ?report.usage_before_percent,
            "image garbage collection"
        );
        Ok(adm::GarbageCollectImagesResponse {
            removed: report
                .removed
                .iter()
                .map(|i| adm::ImportedImage {
                    id: i.id.clone(),
                    repo_tags: i.repo_tags.clone(),
                    repo_digests: i.repo_digests.clone(),
                    size: i.size,
                })
                .collect(),
            freed_bytes: report.freed_bytes,
            usage_before_percent: report.usage_before_percent.map_or(0, |p| p as u32),
        })
    }
}

/// A threshold in 0..=100, or INVALID_ARGUMENT naming the field.
fn percent(value: u32, field: &str) -> Result<u8> {
    u8::try_from(value)
        .ok()
        .filter(|v| *v <= 100)
        .ok_or_else(|| RuntimeError::invalid(field, format!("{value} is not a percentage")))
}
