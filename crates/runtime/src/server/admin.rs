//! Petrel's admin API: image import and metrics.

use std::path::PathBuf;
use std::sync::Arc;

use petrel_cri::admin as adm;

use crate::error::{Result, RuntimeError};
use crate::records::{ContainerState, SandboxState};
use crate::service::Runtime;

impl Runtime {
    /// ImportImage: an OCI image-layout or docker archive on this host.
    pub(crate) async fn import_image(
        self: &Arc<Self>,
        req: adm::ImportImageRequest,
    ) -> Result<adm::ImportImageResponse> {
        let path = PathBuf::from(&req.path);
        if !path.is_absolute() {
            return Err(RuntimeError::invalid(
                "path",
                format!("{:?} must be an absolute path", req.path),
            ));
        }
        if !path.is_file() {
            return Err(RuntimeError::invalid(
                "path",
                format!("{} is not a readable file", path.display()),
            ));
        }
        for (i, t) in req.tags.iter().enumerate() {
            petrel_image::normalize_reference(t)
                .map_err(|e| RuntimeError::invalid(format!("tags[{i}]"), e.to_string()))?;
        }
        let rt = self.clone();
        let imported = tokio::task::spawn_blocking(move || rt.images.import(&path, &req.tags))
            .await
            .map_err(|e| RuntimeError::task("import image", e))?
            .map_err(|e| match e {
                petrel_image::ImageError::Io { .. }
                | petrel_image::ImageError::Store(_)
                | petrel_image::ImageError::TooLarge { .. } => RuntimeError::from(e),
                other => RuntimeError::invalid("path", other.to_string()),
            })?;
        Ok(adm::ImportImageResponse {
            images: imported
                .iter()
                .map(|i| adm::ImportedImage {
                    id: i.id.clone(),
                    repo_tags: i.repo_tags.clone(),
                    repo_digests: i.repo_digests.clone(),
                    size: i.size,
                })
                .collect(),
        })
    }

    /// Metrics in the Prometheus text format.
    pub(crate) async fn metrics_text(
        self: &Arc<Self>,
        _req: adm::MetricsRequest,
    ) -> Result<adm::MetricsResponse> {
        let m = &self.metrics;
        m.subscribers.set(self.events.subscriber_count() as i64);
        m.containers.clear();
        for c in self.state.containers() {
            let state = match c.state() {
                ContainerState::Creating => "creating",
                ContainerState::Created => "created",
                ContainerState::Running => "running",
                ContainerState::Exited => "exited",
            };
            m.containers
                .get_or_create(&crate::metrics::StateLabels {
                    state: state.into(),
                })
                .inc();
        }
        m.sandboxes.clear();
        for sb in self.state.sandboxes() {
            let state = match sb.with(|r| r.state) {
                SandboxState::Creating => "creating",
                SandboxState::Ready => "ready",
                SandboxState::NotReady => "notready",
            };
            m.sandboxes
                .get_or_create(&crate::metrics::StateLabels {
                    state: state.into(),
                })
                .inc();
        }
        Ok(adm::MetricsResponse { text: m.encode() })
    }

    /// NRI and its plugins, for `petrel ctl nri`.
    pub(crate) async fn nri_plugins(
        self: &Arc<Self>,
        _req: adm::NriPluginsRequest,
    ) -> Result<adm::NriPluginsResponse> {
        let Some(n) = self.nri() else {
            return Ok(adm::NriPluginsResponse::default());
        };
        let plugins = n
            .plugins()
            .into_iter()
            .map(|p| adm::NriPlugin {
                index: p.index,
                name: p.name,
                events: p.events,
                pre_registered: p.pre_registered,
                pid: p.pid,
                health: p.health,
                relaunches: p.relaunches,
                calls: p.calls,
                errors: p.errors,
                timeouts: p.timeouts,
                mean_call_micros: p.busy_micros.checked_div(p.calls).unwrap_or(0),
                request_timeout_ms: u64::try_from(p.request_timeout.as_millis())
                    .unwrap_or(u64::MAX),
                timeout_fatal: p.timeout_fatal,
            })
            .collect();
        Ok(adm::NriPluginsResponse {
            enabled: true,
            socket: n
                .socket()
                .map(|s| s.display().to_string())
                .unwrap_or_default(),
            plugins,
        })
    }
}
