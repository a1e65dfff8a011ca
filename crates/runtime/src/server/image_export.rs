//! Admin ExportImage: an image as an OCI image-layout archive on this host.

use std::path::PathBuf;
use std::sync::Arc;

use petrel_cri::admin as adm;

use crate::error::{non_empty, Result, RuntimeError};
use crate::service::Runtime;

impl Runtime {
    /// ExportImage.
    pub(crate) async fn export_image(
        self: &Arc<Self>,
        req: adm::ExportImageRequest,
    ) -> Result<adm::ExportImageResponse> {
        non_empty(&req.image, "image")?;
        let path = PathBuf::from(&req.path);
        if !path.is_absolute() {
            return Err(RuntimeError::invalid(
                "path",
                format!("{:?} must be an absolute path", req.path),
            ));
        }
        if !path.parent().is_some_and(|p| p.is_dir()) || path.is_dir() {
            return Err(RuntimeError::invalid(
                "path",
                format!("{} is not a file in an existing directory", path.display()),
            ));
        }
        let rt = self.clone();
        let image = req.image.clone();
        let e = tokio::task::spawn_blocking(move || rt.images.export(&image, &path))
            .await
            .map_err(|e| RuntimeError::task("export image", e))??;
        Ok(adm::ExportImageResponse {
            id: e.id,
            source_id: e.source_id,
            manifest_digest: e.manifest_digest,
            size: e.size,
        })
    }
}
