//! From the names in a URL (`namespace/pod/container`) to the runtime's
//! objects: the pod through the status store (the pods this agent runs),
//! its containers and sandboxes through the PLEG's cache. Also the error
//! type of the streaming and log endpoints, with kubelet's HTTP statuses.

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Pod;
use petrel_cri::api;

use super::AppState;
use crate::cri::CriError;
use crate::types::PodRuntimeStatus;

/// Why a log or streaming request failed; each maps to kubelet's status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// No such pod or container: 404.
    #[error("{0}")]
    NotFound(String),
    /// A bad parameter, or a container in the wrong state: 400.
    #[error("{0}")]
    BadRequest(String),
    /// The runtime is busy: 429.
    #[error("{0}")]
    TooManyRequests(String),
    /// The runtime or the agent failed: 500.
    #[error("{0}")]
    Internal(String),
    /// The runtime's streaming server could not be reached or answered
    /// nonsense: 502.
    #[error("{0}")]
    BadGateway(String),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::BadGateway(_) => StatusCode::BAD_GATEWAY,
        }
    }
}

impl From<CriError> for ApiError {
    /// A runtime error as kubelet reports it: not found and invalid
    /// requests are the client's problem, anything else a server error.
    fn from(e: CriError) -> Self {
        let msg = e.to_string();
        match e.code {
            tonic::Code::NotFound => Self::NotFound(msg),
            tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition
            | tonic::Code::OutOfRange => Self::BadRequest(msg),
            tonic::Code::ResourceExhausted => Self::TooManyRequests(msg),
            _ => Self::Internal(msg),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut body = self.to_string();
        body.push('\n');
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            body,
        )
            .into_response()
    }
}

/// A pod this agent runs, with the runtime's view of it.
pub(crate) struct FoundPod {
    /// The published pod (spec and status).
    pub pod: Arc<Pod>,
    /// The runtime's containers and sandboxes of it (empty when the PLEG
    /// has not inspected it yet).
    pub runtime: Arc<PodRuntimeStatus>,
}

impl FoundPod {
    /// `namespace/name`, for messages.
    fn full_name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or_default(),
            self.pod.metadata.name.as_deref().unwrap_or_default()
        )
    }

    /// Whether the pod's spec has a container (regular, init or
    /// ephemeral) of this name.
    fn declares(&self, container: &str) -> bool {
        let Some(spec) = &self.pod.spec else {
            return false;
        };
        spec.containers.iter().any(|c| c.name == container)
            || spec
                .init_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
            || spec
                .ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == container)
    }

    /// The runtime's instances of `container`, newest first.
    fn instances<'a>(
        &'a self,
        container: &'a str,
    ) -> impl Iterator<Item = &'a api::ContainerStatus> {
        self.runtime
            .containers
            .iter()
            .filter(move |c| c.metadata.as_ref().is_some_and(|m| m.name == container))
    }

    /// The container's current instance, or its previous one (the
    /// instance before the newest: restart count one less, when the agent
    /// recorded it).
    pub fn container(&self, name: &str, previous: bool) -> Result<api::ContainerStatus, ApiError> {
        if !self.declares(name) {
            return Err(ApiError::NotFound(format!(
                "container {name:?} not found in pod {:?}",
                self.full_name()
            )));
        }
        let mut all = self.instances(name);
        let Some(latest) = all.next() else {
            return Err(ApiError::BadRequest(format!(
                "container {name:?} in pod {:?} is waiting to start",
                self.full_name()
            )));
        };
        if !previous {
            return Ok(latest.clone());
        }
        let restarts = |c: &api::ContainerStatus| {
            self.runtime
                .container_meta
                .get(&c.id)
                .map(|m| m.restart_count)
        };
        let older: Vec<&api::ContainerStatus> = all.collect();
        let wanted = restarts(latest).map(|n| n - 1);
        let prev = older
            .iter()
            .find(|c| wanted.is_some() && restarts(c) == wanted)
            .or_else(|| older.first());
        prev.map(|c| (*c).clone()).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "previous terminated container {name:?} in pod {:?} not found",
                self.full_name()
            ))
        })
    }

    /// The pod's newest sandbox id.
    pub fn sandbox_id(&self) -> Result<String, ApiError> {
        self.runtime
            .latest_sandbox()
            .map(|s| s.id.clone())
            .ok_or_else(|| {
                ApiError::BadRequest(format!("pod {:?} has no sandbox yet", self.full_name()))
            })
    }
}

/// Finds pod `namespace/name` among the pods this agent runs.
pub(crate) fn find_pod(st: &AppState, namespace: &str, name: &str) -> Result<FoundPod, ApiError> {
    let pod = st
        .shared
        .store
        .get(namespace, name)
        .ok_or_else(|| ApiError::NotFound(format!("pod {namespace}/{name} not found")))?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let runtime = st.shared.cache.get(&uid).status.unwrap_or_default();
    Ok(FoundPod { pod, runtime })
}

/// Whether a container status says running.
pub(crate) fn is_running(c: &api::ContainerStatus) -> bool {
    c.state == api::ContainerState::ContainerRunning as i32
}
