//! CreateContainer: the request checked and turned into a container
//! record, then created by `container::create` (all or nothing).

use std::path::Path;
use std::sync::Arc;

use petrel_cri::api;
use petrel_oci::spec;

use crate::checkpoint;
use crate::error::{non_empty, required, Result, RuntimeError};
use crate::records::{ContainerRecord, ContainerState, ImageVolume, SandboxState};
use crate::service::Runtime;
use crate::util;

impl Runtime {
    /// CreateContainer.
    pub(crate) async fn create_container(
        self: &Arc<Self>,
        req: api::CreateContainerRequest,
    ) -> Result<api::CreateContainerResponse> {
        let _sync = self.nri_block_sync().await;
        let sb = self.sandbox(&req.pod_sandbox_id)?;
        let _pod = sb.op.read().await;
        let sbrec = sb.record();
        if sbrec.state != SandboxState::Ready {
            return Err(RuntimeError::FailedPrecondition(format!(
                "pod sandbox {} is not ready",
                sbrec.id
            )));
        }
        let config = required(req.config, "config")?;
        // Before anything is made, and before anything is named from them.
        crate::validate::container(&config, &sbrec.config, &self.host)?;
        required(config.metadata.as_ref(), "config.metadata")?;
        let image_ref = non_empty(
            config
                .image
                .as_ref()
                .map(|i| i.image.as_str())
                .unwrap_or_default(),
            "config.image.image",
        )?;
        // An image that is the path of a checkpoint archive asks for a
        // restore (as containerd and CRI-O take it).
        let (config, image, restored_from) = if checkpoint::restore::names_archive(image_ref) {
            let archive = Path::new(image_ref).to_path_buf();
            let plan = self.plan_restore(&archive, config).await?;
            (plan.config, plan.image, Some(plan.from))
        } else {
            let image = self.images.get(image_ref).ok_or_else(|| {
                RuntimeError::invalid(
                    "config.image.image",
                    format!("image {image_ref:?} not found"),
                )
            })?;
            (config, image, None)
        };
        let image_volumes = self.resolve_image_volumes(&config.mounts)?;
        let md = required(config.metadata.as_ref(), "config.metadata")?;
        // Before the layers are mounted: GC spares recently used images.
        self.images.mark_used(&image.id);
        for v in &image_volumes {
            self.images.mark_used(&v.image_id);
        }
        let log_path = if config.log_path.is_empty() || sbrec.config.log_directory.is_empty() {
            None
        } else {
            Some(Path::new(&sbrec.config.log_directory).join(&config.log_path))
        };
        let pod_md = sbrec.config.metadata.clone().unwrap_or_default();
        let name = format!(
            "{}_{}_{}_{}_{}",
            md.name, pod_md.name, pod_md.namespace, pod_md.uid, md.attempt
        );
        let id = util::new_id().map_err(RuntimeError::Id)?;

        let mut rec = ContainerRecord {
            id: id.clone(),
            sandbox_id: sbrec.id.clone(),
            name: name.clone(),
            config,
            image_id: image.id.clone(),
            state: ContainerState::Creating,
            created_at: util::now_ns(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            pid: 0,
            init_start_time: 0,
            own_pid_ns: false,
            shim: None,
            bundle: self.layout.bundle(&id),
            layer_dir: self.layout.container_layer(&id),
            log_path,
            cgroup_path: spec::driver_cgroup_path(
                self.config.cgroup_driver,
                &sbrec.cgroup_parent,
                &id,
            ),
            resources: None,
            user: None,
            restored_from,
            image_volumes,
        };
        rec.resources = rec.config.linux.as_ref().and_then(|l| l.resources.clone());
        let c = self.container_create(&sb, &sbrec, rec, &image).await?;
        Ok(api::CreateContainerResponse {
            container_id: c.id.clone(),
        })
    }
}

impl Runtime {
    /// The image volumes among `mounts`, each image resolved to its id. An
    /// image not in the store is refused naming the mount (kubelet pulls
    /// image volumes, per their pull policy, before CreateContainer).
    fn resolve_image_volumes(&self, mounts: &[api::Mount]) -> Result<Vec<ImageVolume>> {
        let mut out = Vec::new();
        for (i, m) in mounts.iter().enumerate() {
            let Some(spec) = &m.image else { continue };
            let field = format!("config.mounts[{i}].image.image");
            let reference = non_empty(&spec.image, &field)?;
            let image = self.images.get(reference).ok_or_else(|| {
                RuntimeError::invalid(
                    &field,
                    format!("image {reference:?} not found: pull it first"),
                )
            })?;
            let sub_path = petrel_oci::spec::check_image_sub_path(
                &format!("config.mounts[{i}].image_sub_path"),
                &m.image_sub_path,
            )?;
            out.push(ImageVolume {
                mount: i,
                image_id: image.id,
                sub_path,
            });
        }
        Ok(out)
    }
}
