//! `/exec/{namespace}/{pod}/{container}`, `/attach/{namespace}/{pod}/{container}`
//! and `/portForward/{namespace}/{pod}` (GET and POST, as kubelet serves
//! them): the names resolved to a container or sandbox id, the runtime
//! asked for a streaming URL (CRI Exec, Attach, PortForward), and the
//! client's upgrade proxied there ([`super::proxy`]).

use axum::extract::{Path, RawQuery, Request, State};
use axum::response::{IntoResponse, Response};
use petrel_cri::api;

use super::params::QueryParams;
use super::proxy::proxy_upgrade;
use super::resolve::{find_pod, is_running, ApiError};
use super::AppState;

/// Which streams a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Streams {
    /// `input`
    pub stdin: bool,
    /// `output`
    pub stdout: bool,
    /// `error`
    pub stderr: bool,
    /// `tty`
    pub tty: bool,
}

impl Streams {
    /// kubelet's rules: a terminal merges stderr into stdout (stderr is
    /// dropped), and at least one stream must be asked for.
    pub fn parse(q: &QueryParams) -> Result<Self, ApiError> {
        let tty = q.flag("tty")?;
        let s = Self {
            stdin: q.flag("input")?,
            stdout: q.flag("output")?,
            stderr: q.flag("error")? && !tty,
            tty,
        };
        if !(s.stdin || s.stdout || s.stderr) {
            return Err(ApiError::BadRequest(
                "you must specify at least 1 of stdin, stdout, stderr (parameters input, output, error)".into(),
            ));
        }
        Ok(s)
    }
}

/// The id of running container `namespace/pod/container`.
fn running_container(
    st: &AppState,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<String, ApiError> {
    let c = find_pod(st, namespace, pod)?.container(container, false)?;
    if !is_running(&c) {
        return Err(ApiError::BadRequest(format!(
            "container {container:?} in pod {namespace}/{pod} is not running"
        )));
    }
    Ok(c.id)
}

/// `/exec/...`.
pub(super) async fn exec(
    State(st): State<AppState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let run = async {
        let q = QueryParams::parse(query.as_deref());
        let cmd = q.all("command");
        if cmd.is_empty() {
            return Err(ApiError::BadRequest(
                "missing parameter command: the command to run".into(),
            ));
        }
        let s = Streams::parse(&q)?;
        let id = running_container(&st, &namespace, &pod, &container)?;
        let url = st
            .shared
            .runtime
            .exec(api::ExecRequest {
                container_id: id,
                cmd,
                tty: s.tty,
                stdin: s.stdin,
                stdout: s.stdout,
                stderr: s.stderr,
            })
            .await?;
        proxy_upgrade(req, &url).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `/attach/...`.
pub(super) async fn attach(
    State(st): State<AppState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let run = async {
        let s = Streams::parse(&QueryParams::parse(query.as_deref()))?;
        let id = running_container(&st, &namespace, &pod, &container)?;
        let url = st
            .shared
            .runtime
            .attach(api::AttachRequest {
                container_id: id,
                stdin: s.stdin,
                tty: s.tty,
                stdout: s.stdout,
                stderr: s.stderr,
            })
            .await?;
        proxy_upgrade(req, &url).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `/portForward/...`: ports may be named in the query (`port=8080`,
/// repeated), as WebSocket clients do; SPDY clients name them per stream.
pub(super) async fn port_forward(
    State(st): State<AppState>,
    Path((namespace, pod)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let run = async {
        let q = QueryParams::parse(query.as_deref());
        let port = q
            .all("port")
            .iter()
            .map(|p| match p.parse::<u16>() {
                Ok(n) if n > 0 => Ok(i32::from(n)),
                _ => Err(ApiError::BadRequest(format!(
                    "invalid value {p:?} for parameter port: expected 1-65535"
                ))),
            })
            .collect::<Result<Vec<i32>, ApiError>>()?;
        let sandbox = find_pod(&st, &namespace, &pod)?.sandbox_id()?;
        let url = st
            .shared
            .runtime
            .port_forward(api::PortForwardRequest {
                pod_sandbox_id: sandbox,
                port,
            })
            .await?;
        proxy_upgrade(req, &url).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
