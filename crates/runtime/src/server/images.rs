//! ImageService: PullImage, ListImages, ImageStatus, RemoveImage,
//! ImageFsInfo. Images arrive from registries (PullImage) or by
//! `petrel ctl image import`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use petrel_cri::api;
use petrel_image::registry::{decode_auth_field, Credentials, ProgressReporter};
use petrel_image::{Image, Removal};

use crate::error::{non_empty, Result, RuntimeError};
use crate::service::Runtime;
use crate::util;
use petrel_oci::dir_usage::{dir_usage, DirUsage};

/// The CRI view of an image.
pub(crate) fn cri_image(img: &Image) -> api::Image {
    let user = img
        .config
        .config()
        .as_ref()
        .and_then(|c| c.user().clone())
        .unwrap_or_default();
    // "uid[:gid]" gives a uid; a name is reported as username.
    let user_part = user.split(':').next().unwrap_or_default().to_string();
    let (uid, username) = match user_part.parse::<i64>() {
        Ok(uid) => (Some(api::Int64Value { value: uid }), String::new()),
        Err(_) => (None, user_part),
    };
    api::Image {
        id: img.id.clone(),
        repo_tags: img.repo_tags.clone(),
        repo_digests: img.repo_digests.clone(),
        size: img.size,
        uid,
        username,
        spec: Some(api::ImageSpec {
            image: img.id.clone(),
            ..Default::default()
        }),
        pinned: false,
    }
}

impl Runtime {
    /// ListImages.
    pub(crate) async fn list_images(
        self: &Arc<Self>,
        req: api::ListImagesRequest,
    ) -> Result<api::ListImagesResponse> {
        let want = req
            .filter
            .and_then(|f| f.image)
            .map(|s| s.image)
            .filter(|s| !s.is_empty());
        let images = match want {
            Some(r) => self.images.get(&r).iter().map(cri_image).collect(),
            // The store lists by id already.
            None => self.images.list_map(cri_image),
        };
        Ok(api::ListImagesResponse { images })
    }

    /// ImageStatus: an unknown image is an empty answer, not an error.
    pub(crate) async fn image_status(
        self: &Arc<Self>,
        req: api::ImageStatusRequest,
    ) -> Result<api::ImageStatusResponse> {
        let r = req.image.map(|s| s.image).unwrap_or_default();
        non_empty(&r, "image.image")?;
        let Some(img) = self.images.get(&r) else {
            return Ok(api::ImageStatusResponse::default());
        };
        let mut info = HashMap::new();
        if req.verbose {
            info.insert(
                "info".to_string(),
                serde_json::json!({ "imageSpec": img.config, "diffIds": img.diff_ids }).to_string(),
            );
        }
        Ok(api::ImageStatusResponse {
            image: Some(cri_image(&img)),
            info,
        })
    }

    /// PullImage: resolves the reference on its registry (through the
    /// configured mirrors), downloads and verifies what the store lacks,
    /// and commits the image like an import. Returns the image id.
    pub(crate) async fn pull_image(
        self: &Arc<Self>,
        req: api::PullImageRequest,
    ) -> Result<api::PullImageResponse> {
        let r = req.image.map(|s| s.image).unwrap_or_default();
        non_empty(&r, "image.image")?;
        let image = self
            .pull_and_store(&r, req.auth, &ProgressReporter::disabled())
            .await?;
        Ok(api::PullImageResponse {
            image_ref: image.id,
        })
    }

    /// The pull of CRI PullImage and of the admin API's streaming
    /// PullImage: credentials from the request or the config file, the
    /// download, then the commit on a blocking thread. Each layer's course
    /// goes to `progress`.
    pub(crate) async fn pull_and_store(
        self: &Arc<Self>,
        reference: &str,
        auth: Option<api::AuthConfig>,
        progress: &ProgressReporter,
    ) -> Result<Image> {
        let creds = self.pull_credentials(reference, auth);
        let pulled = self
            .puller
            .pull(&self.images, reference, &creds, progress)
            .await?;
        let rt = self.clone();
        let progress = progress.clone();
        // The commit runs on if the call is dropped: it keeps the runtime's
        // shutdown waiting like a call under way.
        let image = tokio::task::spawn_blocking(move || {
            let _call = rt.enter_call();
            rt.images.import_pulled(&pulled, &progress)
        })
        .await
        .map_err(|e| RuntimeError::task("store pulled image", e))??;
        Ok(image)
    }

    /// The request's credentials (docker's base64 `auth` field counts as
    /// user and password), else those the config file has for the
    /// reference's registry.
    fn pull_credentials(&self, reference: &str, auth: Option<api::AuthConfig>) -> Credentials {
        let mut creds = auth
            .map(|a| {
                let (username, password) = if a.username.is_empty() && !a.auth.is_empty() {
                    decode_auth_field(&a.auth).unwrap_or_default()
                } else {
                    (a.username, a.password)
                };
                Credentials {
                    username,
                    password,
                    identity_token: a.identity_token,
                    registry_token: a.registry_token,
                }
            })
            .unwrap_or_default();
        if creds.is_empty() {
            let registry = petrel_image::normalize_reference(reference)
                .ok()
                .and_then(|n| n.split('/').next().map(str::to_string));
            if let Some(a) = registry.and_then(|r| self.config.registry.auths.get(&r)) {
                creds.username = a.username.clone();
                creds.password = a.password.clone();
                creds.identity_token = a.identity_token.clone();
            }
        }
        creds
    }

    /// RemoveImage with untag semantics: one of several tags removes only
    /// that tag; an id, digest or the last tag removes the image (refused
    /// while a container uses it). Removing an absent image succeeds, also
    /// when a concurrent RemoveImage removed it first (CRI: idempotent).
    pub(crate) async fn remove_image(
        self: &Arc<Self>,
        req: api::RemoveImageRequest,
    ) -> Result<api::RemoveImageResponse> {
        let r = req.image.map(|s| s.image).unwrap_or_default();
        non_empty(&r, "image.image")?;
        let Some(removal) = self.images.plan_removal(&r) else {
            return Ok(api::RemoveImageResponse {});
        };
        if let Removal::Delete { image_id } = &removal {
            let users = self.containers_using(image_id);
            if !users.is_empty() {
                return Err(RuntimeError::FailedPrecondition(format!(
                    "image {image_id} is in use by container(s) {}",
                    users.join(", ")
                )));
            }
            self.image_users.remove(image_id);
        }
        let rt = self.clone();
        let removed = tokio::task::spawn_blocking(move || rt.images.apply_removal(&removal))
            .await
            .map_err(|e| RuntimeError::task("remove image", e))?;
        match removed {
            // A concurrent RemoveImage of the same image got there first:
            // the image is gone, which is what this call asked for.
            Ok(_) | Err(petrel_image::ImageError::NotFound(_)) => Ok(api::RemoveImageResponse {}),
            Err(e) => Err(e.into()),
        }
    }

    /// Ids of the containers (in any state) created from image `image_id`
    /// or mounting it as an image volume.
    pub(crate) fn containers_using(&self, image_id: &str) -> Vec<String> {
        self.state
            .containers()
            .iter()
            .filter(|c| {
                c.with(|rec| {
                    rec.image_id == image_id
                        || rec.image_volumes.iter().any(|v| v.image_id == image_id)
                })
            })
            .map(|c| c.id.clone())
            .collect()
    }

    /// Ids of the images some container (in any state) was created from or
    /// mounts as an image volume: GC never deletes those.
    pub(crate) fn images_in_use(&self) -> HashSet<String> {
        let mut used = HashSet::new();
        for c in self.state.containers() {
            c.with(|rec| {
                used.insert(rec.image_id.clone());
                used.extend(rec.image_volumes.iter().map(|v| v.image_id.clone()));
            });
        }
        used
    }

    /// ImageFsInfo: the image store's usage, and the writable layers'.
    pub(crate) async fn image_fs_info(
        self: &Arc<Self>,
        _req: api::ImageFsInfoRequest,
    ) -> Result<api::ImageFsInfoResponse> {
        let u = self.images.fs_usage();
        let ts = util::now_ns();
        let containers_dir = self.layout.root.join("containers");
        let DirUsage { bytes, inodes } = dir_usage(&containers_dir);
        // Removed containers' layers still in the trash use the same file
        // system until the remover is done with them: counted, once (a
        // layer is moved there, not copied).
        let (bytes, inodes) = std::fs::read_dir(self.remover.trash().layers_dir())
            .into_iter()
            .flat_map(|it| it.flatten())
            .map(|e| dir_usage(&e.path()))
            .fold((bytes, inodes), |(b, i), u| (b + u.bytes, i + u.inodes));
        Ok(api::ImageFsInfoResponse {
            image_filesystems: vec![api::FilesystemUsage {
                timestamp: ts,
                fs_id: Some(api::FilesystemIdentifier {
                    mountpoint: u.mountpoint.display().to_string(),
                }),
                used_bytes: Some(api::UInt64Value {
                    value: u.used_bytes,
                }),
                inodes_used: Some(api::UInt64Value {
                    value: u.inodes_used,
                }),
            }],
            container_filesystems: vec![api::FilesystemUsage {
                timestamp: ts,
                fs_id: Some(api::FilesystemIdentifier {
                    mountpoint: containers_dir.display().to_string(),
                }),
                used_bytes: Some(api::UInt64Value { value: bytes }),
                inodes_used: Some(api::UInt64Value { value: inodes }),
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use futures_util::future::join_all;
    use petrel_cri::api;

    use crate::error::RuntimeError;
    use crate::parts::fake::{TestRuntime, IMAGE};

    fn remove(image: &str) -> api::RemoveImageRequest {
        api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
        }
    }

    #[tokio::test]
    async fn concurrent_removals_of_one_image_should_all_succeed() {
        let t = TestRuntime::new();
        let removals = (0..5).map(|_| t.rt.remove_image(remove(IMAGE)));
        for r in join_all(removals).await {
            r.expect("every removal succeeds");
        }
        assert!(t.rt.images.list().is_empty());
        t.rt.remove_image(remove(IMAGE))
            .await
            .expect("removed again");
        t.rt.remove_image(remove("nothing.local/x:1"))
            .await
            .expect("never there");
    }

    #[test]
    fn image_not_found_should_name_the_image_once() {
        let e = RuntimeError::from(petrel_image::ImageError::NotFound(
            "image sha256:abc".into(),
        ));
        assert_eq!(e.to_string(), "image sha256:abc not found");
        assert_eq!(e.code(), tonic::Code::NotFound);
    }
}
