//! Calling the plugins on a pod or container event: in index order, each
//! plugin subscribed to the event, each call timed and counted. What a
//! failure means depends on the event: RunPodSandbox and StartContainer can
//! be refused by a plugin; the notifications (stop, remove, post-*) cannot.
//! A timeout skips the plugin for that call unless its configuration makes
//! timeouts fatal; either way the plugin costs at most its timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use petrel_nri::adaptation::ConnError;
use petrel_nri::api::{self, Event};

use super::registry::Plugin;
use super::{Nri, NriHost};

/// Why NRI failed a CRI call.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// A plugin refused the event.
    #[error("NRI plugin {plugin} failed {event}: {message}")]
    Plugin {
        /// `NN-name`.
        plugin: String,
        /// The event.
        event: &'static str,
        /// Its message.
        message: String,
    },
    /// A plugin whose timeouts are fatal did not answer in time.
    #[error("NRI plugin {plugin} did not answer {event} within {timeout:?}")]
    Timeout {
        /// `NN-name`.
        plugin: String,
        /// The event.
        event: &'static str,
        /// Its timeout.
        timeout: std::time::Duration,
    },
    /// Two plugins changed the same thing, or a plugin's answer was malformed.
    #[error("NRI: {0}")]
    Merge(#[from] petrel_nri::adaptation::MergeError),
    /// A validator refused the merged adjustment, or a required plugin is missing.
    #[error("NRI: {0}")]
    Validation(#[from] petrel_nri::adaptation::ValidationError),
    /// The merged adjustment cannot be applied to the container.
    #[error("NRI: {0}")]
    Apply(#[from] super::spec::ApplyError),
}

/// Whether a plugin's error fails the CRI call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Veto {
    /// The plugin can refuse the event.
    Allowed,
    /// A notification: errors are logged.
    Never,
}

impl<H: NriHost> Nri<H> {
    /// Calls `call` on every plugin subscribed to `event`, in index order.
    /// Returns what each answered, or the first error that fails the call.
    pub(crate) async fn each<T, F, Fut>(
        &self,
        event: Event,
        veto: Veto,
        call: F,
    ) -> Result<Vec<(Arc<Plugin>, T)>, HookError>
    where
        F: Fn(Arc<Plugin>) -> Fut,
        Fut: Future<Output = Result<T, ConnError>>,
    {
        let plugins = self.registry.subscribed(event);
        let mut out = Vec::with_capacity(plugins.len());
        for p in plugins {
            let t0 = Instant::now();
            let r = call(p.clone()).await;
            if let Some(v) = self.settle(&p, event, veto, t0, r).await? {
                out.push((p, v));
            }
        }
        Ok(out)
    }

    /// Counts one call to `p` and decides what its outcome means: its answer,
    /// nothing (skipped: timed out, gone, or a failed notification), or the
    /// error that fails the CRI call.
    pub(crate) async fn settle<T>(
        &self,
        p: &Plugin,
        event: Event,
        veto: Veto,
        t0: Instant,
        r: Result<T, ConnError>,
    ) -> Result<Option<T>, HookError> {
        let timeout = matches!(&r, Err(e) if e.is_timeout());
        self.observe(p, event, t0.elapsed(), r.is_err(), timeout);
        let name = event.as_str_name();
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if timeout => {
                if p.timeout_fatal {
                    tracing::warn!(plugin = %p.qualified_name(), event = name, "nri: plugin timed out; its timeouts are fatal");
                    // A plugin that hangs is cut off, as containerd does.
                    p.conn.close().await;
                    return Err(HookError::Timeout {
                        plugin: p.qualified_name(),
                        event: name,
                        timeout: p.conn.request_timeout(),
                    });
                }
                tracing::warn!(plugin = %p.qualified_name(), event = name, error = %e, "nri: plugin timed out; skipped for this call");
                Ok(None)
            }
            Err(e) if e.is_disconnected() => {
                tracing::warn!(plugin = %p.qualified_name(), event = name, error = %e, "nri: plugin gone; skipped");
                Ok(None)
            }
            Err(e) => {
                if veto == Veto::Allowed {
                    return Err(HookError::Plugin {
                        plugin: p.qualified_name(),
                        event: name,
                        message: e.to_string(),
                    });
                }
                tracing::warn!(plugin = %p.qualified_name(), event = name, error = %e, "nri: plugin failed a notification");
                Ok(None)
            }
        }
    }

    /// RunPodSandbox: a plugin may refuse the pod.
    pub async fn run_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<(), HookError> {
        if !self.registry.any(Event::RunPodSandbox) {
            return Ok(());
        }
        let req = api::RunPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.each(Event::RunPodSandbox, Veto::Allowed, |p| {
            let req = req.clone();
            async move { p.conn.run_pod_sandbox(&req).await }
        })
        .await
        .map(drop)
    }

    /// StopPodSandbox (a notification).
    pub async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) {
        if !self.registry.any(Event::StopPodSandbox) {
            return;
        }
        let req = api::StopPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.each(Event::StopPodSandbox, Veto::Never, |p| {
            let req = req.clone();
            async move { p.conn.stop_pod_sandbox(&req).await }
        })
        .await
        .map_or_else(|e| notification_failed(Event::StopPodSandbox, &e), drop);
    }

    /// RemovePodSandbox (a notification).
    pub async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) {
        if !self.registry.any(Event::RemovePodSandbox) {
            return;
        }
        let req = api::RemovePodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.each(Event::RemovePodSandbox, Veto::Never, |p| {
            let req = req.clone();
            async move { p.conn.remove_pod_sandbox(&req).await }
        })
        .await
        .map_or_else(|e| notification_failed(Event::RemovePodSandbox, &e), drop);
    }

    /// PostCreateContainer (a notification).
    pub async fn post_create_container(&self, pod: &api::PodSandbox, ctr: &api::Container) {
        if !self.registry.any(Event::PostCreateContainer) {
            return;
        }
        let req = api::PostCreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
        };
        self.each(Event::PostCreateContainer, Veto::Never, |p| {
            let req = req.clone();
            async move { p.conn.post_create_container(&req).await }
        })
        .await
        .map_or_else(
            |e| notification_failed(Event::PostCreateContainer, &e),
            drop,
        );
    }

    /// StartContainer: a plugin may refuse the start.
    pub async fn start_container(
        &self,
        pod: &api::PodSandbox,
        ctr: &api::Container,
    ) -> Result<(), HookError> {
        if !self.registry.any(Event::StartContainer) {
            return Ok(());
        }
        let req = api::StartContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
        };
        self.each(Event::StartContainer, Veto::Allowed, |p| {
            let req = req.clone();
            async move { p.conn.start_container(&req).await }
        })
        .await
        .map(drop)
    }

    /// PostStartContainer (a notification).
    pub async fn post_start_container(&self, pod: &api::PodSandbox, ctr: &api::Container) {
        if !self.registry.any(Event::PostStartContainer) {
            return;
        }
        let req = api::PostStartContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
        };
        self.each(Event::PostStartContainer, Veto::Never, |p| {
            let req = req.clone();
            async move { p.conn.post_start_container(&req).await }
        })
        .await
        .map_or_else(|e| notification_failed(Event::PostStartContainer, &e), drop);
    }

    /// PostUpdateContainer (a notification).
    pub async fn post_update_container(&self, pod: &api::PodSandbox, ctr: &api::Container) {
        if !self.registry.any(Event::PostUpdateContainer) {
            return;
        }
        let req = api::PostUpdateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
        };
        self.each(Event::PostUpdateContainer, Veto::Never, |p| {
            let req = req.clone();
            async move { p.conn.post_update_container(&req).await }
        })
        .await
        .map_or_else(
            |e| notification_failed(Event::PostUpdateContainer, &e),
            drop,
        );
    }

    /// RemoveContainer (a notification).
    pub async fn remove_container(&self, pod: &api::PodSandbox, ctr: &api::Container) {
        if !self.registry.any(Event::RemoveContainer) {
            return;
        }
        let req = api::RemoveContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
        };
        self.each(Event::RemoveContainer, Veto::Never, |p| {
            let req = req.clone();
            async move { p.conn.remove_container(&req).await }
        })
        .await
        .map_or_else(|e| notification_failed(Event::RemoveContainer, &e), drop);
    }
}

/// A notification's failure: the plugin's, already logged by `settle`; the
/// CRI call it follows goes on.
fn notification_failed(event: Event, e: &HookError) {
    tracing::debug!(event = event.as_str_name(), error = %e, "nri: notification failed");
}
