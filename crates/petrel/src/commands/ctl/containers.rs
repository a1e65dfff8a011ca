//! Container commands: `ps`, `inspect`, `exec`, `stop` and `rm`.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use petrel_cri::api::{
    Container, ContainerFilter, ContainerState, ContainerStateValue, ContainerStatusRequest,
    ContainerStatusResponse, ExecSyncRequest, ListContainersRequest, MountPropagation,
    RemoveContainerRequest, StopContainerRequest,
};
use serde_json::{json, Value};

use super::error::CtlError;
use super::output::{self, emit, Format, StatusDoc, Table};
use super::{pods, Ctl, Outcome};

/// A container state as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ContainerStateArg {
    /// CONTAINER_CREATED.
    Created,
    /// CONTAINER_RUNNING.
    Running,
    /// CONTAINER_EXITED.
    Exited,
    /// CONTAINER_UNKNOWN.
    Unknown,
}

impl ContainerStateArg {
    fn cri(self) -> ContainerState {
        match self {
            Self::Created => ContainerState::ContainerCreated,
            Self::Running => ContainerState::ContainerRunning,
            Self::Exited => ContainerState::ContainerExited,
            Self::Unknown => ContainerState::ContainerUnknown,
        }
    }
}

/// Flags of `ps`.
#[derive(Debug, Args)]
pub struct PsArgs {
    /// Show all containers, not only running ones.
    #[arg(short = 'a', long)]
    all: bool,
    /// Filter by container id (the runtime matches prefixes).
    #[arg(long)]
    id: Option<String>,
    /// Filter by pod id.
    #[arg(short = 'p', long)]
    pod: Option<String>,
    /// Filter by container name (substring).
    #[arg(long)]
    name: Option<String>,
    /// Filter by state (instead of the running-only default).
    #[arg(short = 's', long, value_enum)]
    state: Option<ContainerStateArg>,
    /// Filter by label, key=value (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Print only container ids.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Show full ids.
    #[arg(long)]
    no_trunc: bool,
}

/// `ps`: lists containers, newest first.
pub async fn list(ctl: &Ctl, args: PsArgs) -> Result<ExitCode, CtlError> {
    let state = match (args.state, args.all) {
        (Some(s), _) => Some(s.cri()),
        (None, false) => Some(ContainerState::ContainerRunning),
        (None, true) => None,
    };
    let filter = ContainerFilter {
        id: args.id.clone().unwrap_or_default(),
        pod_sandbox_id: args.pod.clone().unwrap_or_default(),
        state: state.map(|s| ContainerStateValue { state: s as i32 }),
        label_selector: output::parse_labels(&args.labels)?,
    };
    let mut containers = list_containers(ctl, filter).await?;
    if let Some(name) = &args.name {
        containers.retain(|c| c.metadata.as_ref().is_some_and(|m| m.name.contains(name)));
    }
    containers.sort_by_key(|x| std::cmp::Reverse(x.created_at));

    if args.quiet {
        emit(
            &containers
                .iter()
                .map(|c| format!("{}\n", c.id))
                .collect::<String>(),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    match ctl.format_or(Format::Table) {
        Format::Table => {
            let names = pod_names(ctl).await?;
            ps_table(&containers, &names, output::now_ns(), args.no_trunc).print()?;
        }
        f => {
            let items = containers
                .iter()
                .map(container_value)
                .collect::<Result<Vec<_>, _>>()?;
            output::print_structured(f, &json!({ "containers": items }))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Every container that passes `filter`.
pub async fn list_containers(
    ctl: &Ctl,
    filter: ContainerFilter,
) -> Result<Vec<Container>, CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = ListContainersRequest {
        filter: Some(filter),
    };
    Ok(ctl
        .call("list containers", rt.list_containers(req))
        .await?
        .containers)
}

/// Pod names by pod id, for the POD column.
pub async fn pod_names(ctl: &Ctl) -> Result<HashMap<String, String>, CtlError> {
    let pods = pods::list_pods(ctl, None).await?;
    Ok(pods
        .into_iter()
        .map(|p| (p.id, p.metadata.map(|m| m.name).unwrap_or_default()))
        .collect())
}

fn ps_table(
    containers: &[Container],
    pod_names: &HashMap<String, String>,
    now: i64,
    no_trunc: bool,
) -> Table {
    let mut t = Table::new(&[
        "CONTAINER",
        "IMAGE",
        "CREATED",
        "STATE",
        "NAME",
        "ATTEMPT",
        "POD ID",
        "POD",
    ]);
    let cut = |id: &str| -> String {
        if no_trunc {
            id.to_string()
        } else {
            output::short_id(id).to_string()
        }
    };
    for c in containers {
        let meta = c.metadata.clone().unwrap_or_default();
        let image = c.image.as_ref().map_or("", |i| i.image.as_str());
        // Kubelet passes image ids (sha256:...); cut those like ids.
        let image = if image.starts_with("sha256:") && !no_trunc {
            output::short_id(image).to_string()
        } else {
            image.to_string()
        };
        t.push(vec![
            cut(&c.id),
            image,
            output::ago(c.created_at, now),
            container_state_label(c.state).to_string(),
            meta.name,
            meta.attempt.to_string(),
            cut(&c.pod_sandbox_id),
            pod_names
                .get(&c.pod_sandbox_id)
                .cloned()
                .unwrap_or_else(|| "unknown".into()),
        ]);
    }
    t
}

/// crictl's word for a container state.
pub fn container_state_label(state: i32) -> &'static str {
    match ContainerState::try_from(state) {
        Ok(ContainerState::ContainerCreated) => "Created",
        Ok(ContainerState::ContainerRunning) => "Running",
        Ok(ContainerState::ContainerExited) => "Exited",
        Ok(ContainerState::ContainerUnknown) | Err(_) => "Unknown",
    }
}

/// The CRI name of a container state, e.g. `CONTAINER_RUNNING`.
pub fn container_state_name(state: i32) -> Option<&'static str> {
    ContainerState::try_from(state)
        .ok()
        .map(|s| s.as_str_name())
}

fn container_value(c: &Container) -> Result<Value, CtlError> {
    let mut v = output::to_value(c)?;
    output::name_enum(&mut v, "state", container_state_name(c.state));
    Ok(v)
}

/// Flags of `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Container ids or unique id prefixes.
    #[arg(required = true)]
    ids: Vec<String>,
}

/// `inspect`: verbose ContainerStatus of each id (JSON by default).
pub async fn inspect(ctl: &Ctl, args: InspectArgs) -> Result<ExitCode, CtlError> {
    let mut fetched = Vec::with_capacity(args.ids.len());
    for id in &args.ids {
        fetched.push(container_status(ctl, id, true).await);
    }
    super::print_statuses(
        ctl.format_or(Format::Json),
        fetched,
        status_text,
        status_value,
    )
}

/// The ContainerStatus of one container.
pub async fn container_status(
    ctl: &Ctl,
    id: &str,
    verbose: bool,
) -> Result<ContainerStatusResponse, CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = ContainerStatusRequest {
        container_id: id.to_string(),
        verbose,
    };
    ctl.call(
        format!("get status of container {id}"),
        rt.container_status(req),
    )
    .await
}

/// The status as JSON: enum names, RFC 3339 times, parsed info.
fn status_value(resp: &ContainerStatusResponse) -> Result<StatusDoc, CtlError> {
    let mut status = output::to_value(&resp.status)?;
    if let Some(s) = &resp.status {
        output::name_enum(&mut status, "state", container_state_name(s.state));
        for key in ["created_at", "started_at", "finished_at"] {
            output::name_time(&mut status, key);
        }
        if let Some(mounts) = status.get_mut("mounts").and_then(Value::as_array_mut) {
            for (m, cri) in mounts.iter_mut().zip(&s.mounts) {
                let name = MountPropagation::try_from(cri.propagation)
                    .ok()
                    .map(|p| p.as_str_name());
                output::name_enum(m, "propagation", name);
            }
        }
    }
    Ok(StatusDoc {
        status,
        info: output::info_value(&resp.info),
    })
}

fn status_text(resp: &ContainerStatusResponse, now: i64) -> String {
    let Some(s) = &resp.status else {
        return String::new();
    };
    let meta = s.metadata.clone().unwrap_or_default();
    let mut out = format!(
        "ID: {}\nName: {}\nAttempt: {}\n",
        s.id, meta.name, meta.attempt
    );
    out.push_str(&format!(
        "State: {}\n",
        container_state_name(s.state).unwrap_or("?")
    ));
    if let Some(image) = &s.image {
        out.push_str(&format!("Image: {}\n", image.image));
    }
    out.push_str(&format!("Created: {}\n", output::ago(s.created_at, now)));
    if s.started_at > 0 {
        out.push_str(&format!("Started: {}\n", output::ago(s.started_at, now)));
    }
    if s.state == ContainerState::ContainerExited as i32 {
        out.push_str(&format!("Finished: {}\n", output::ago(s.finished_at, now)));
        out.push_str(&format!("Exit Code: {}\n", s.exit_code));
        if !s.reason.is_empty() {
            out.push_str(&format!("Reason: {}\n", s.reason));
        }
    }
    out.push_str(&output::map_lines("Labels", &s.labels));
    out.push_str(&output::map_lines("Annotations", &s.annotations));
    out
}

/// Flags of `exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Seconds the command may run (0: no limit).
    #[arg(long, default_value_t = 0)]
    timeout: u64,
    /// Send this terminal's input to the command (streaming exec).
    #[arg(short = 'i', long)]
    interactive: bool,
    /// Run the command on a terminal (streaming exec).
    #[arg(short = 't', long)]
    tty: bool,
    /// The streaming protocol of -i/-t.
    #[arg(long, value_enum, default_value_t = super::stream::TransportArg::Websocket)]
    transport: super::stream::TransportArg,
    /// Container id or unique id prefix.
    id: String,
    /// The command and its arguments (put `--` before them if they start
    /// with a dash).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(super) cmd: Vec<String>,
}

/// `exec`: runs a command with ExecSync, prints its output and exits with
/// its exit code; with `-i` or `-t`, through the streaming server instead
/// (input, a terminal, output as it comes).
pub async fn exec(ctl: &Ctl, args: ExecArgs) -> Result<ExitCode, CtlError> {
    if args.interactive || args.tty {
        return super::stream::exec(
            ctl,
            &args.id,
            args.cmd,
            args.interactive,
            args.tty,
            args.transport,
        )
        .await;
    }
    let mut rt = ctl.runtime().await?;
    let req = ExecSyncRequest {
        container_id: args.id.clone(),
        cmd: args.cmd.clone(),
        timeout: i64::try_from(args.timeout).unwrap_or(i64::MAX),
    };
    // The runtime enforces the command's timeout; give the call that much
    // on top of --timeout, and no limit when the command has none.
    let limit = match (args.timeout, ctl.timeout) {
        (0, _) | (_, None) => None,
        (t, Some(grace)) => Some(Duration::from_secs(t) + grace),
    };
    let what = format!("exec in container {}", args.id);
    let resp = ctl.call_within(limit, what, rt.exec_sync(req)).await?;
    output::emit_bytes(false, &resp.stdout)?;
    output::emit_bytes(true, &resp.stderr)?;
    Ok(ExitCode::from(exit_status_byte(resp.exit_code)))
}

/// A command's exit code as a process exit status (out-of-range codes, which
/// would wrap to 0, become 255).
fn exit_status_byte(code: i32) -> u8 {
    u8::try_from(code).unwrap_or(255)
}

/// Flags of `stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// Seconds to wait after SIGTERM before SIGKILL.
    #[arg(short = 't', long, default_value_t = 0)]
    timeout: i64,
    /// Container ids or unique id prefixes.
    #[arg(required = true)]
    ids: Vec<String>,
}

/// `stop`: stops each container.
pub async fn stop(ctl: &Ctl, args: StopArgs) -> Result<ExitCode, CtlError> {
    let mut outcome = Outcome::default();
    for id in &args.ids {
        if outcome
            .note(stop_container(ctl, id, args.timeout).await)
            .is_some()
        {
            emit(&format!("{id}\n"))?;
        }
    }
    Ok(outcome.exit_code())
}

/// Stops one container; the call may take the grace period plus --timeout.
pub async fn stop_container(ctl: &Ctl, id: &str, grace: i64) -> Result<(), CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = StopContainerRequest {
        container_id: id.to_string(),
        timeout: grace,
    };
    let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
    let limit = ctl.timeout.map(|t| t + grace);
    ctl.call_within(
        limit,
        format!("stop container {id}"),
        rt.stop_container(req),
    )
    .await
    .map(drop)
}

/// Flags of `rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Stop running containers before removing them.
    #[arg(short = 'f', long)]
    force: bool,
    /// Container ids or unique id prefixes.
    #[arg(required = true)]
    ids: Vec<String>,
}

/// `rm`: removes each container; running ones only with `-f`.
pub async fn remove(ctl: &Ctl, args: RmArgs) -> Result<ExitCode, CtlError> {
    let mut outcome = Outcome::default();
    for id in &args.ids {
        if outcome
            .note(remove_one(ctl, id, args.force).await)
            .is_some()
        {
            emit(&format!("{id}\n"))?;
        }
    }
    Ok(outcome.exit_code())
}

async fn remove_one(ctl: &Ctl, id: &str, force: bool) -> Result<(), CtlError> {
    let status = container_status(ctl, id, false)
        .await?
        .status
        .unwrap_or_default();
    if status.state == ContainerState::ContainerRunning as i32 {
        if !force {
            return Err(CtlError::Other(format!(
                "container {id} is running: stop it first or use -f"
            )));
        }
        stop_container(ctl, id, 0).await?;
    }
    let mut rt = ctl.runtime().await?;
    let req = RemoveContainerRequest {
        container_id: id.to_string(),
    };
    ctl.call(format!("remove container {id}"), rt.remove_container(req))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_cri::api::{ContainerMetadata, ContainerStatus, ImageSpec, Mount};

    fn container(id: &str, pod: &str, image: &str) -> Container {
        Container {
            id: id.into(),
            pod_sandbox_id: pod.into(),
            metadata: Some(ContainerMetadata {
                name: "web".into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            state: ContainerState::ContainerRunning as i32,
            created_at: 1,
            ..Default::default()
        }
    }

    #[test]
    fn ps_table_should_show_pod_name_and_cut_ids() {
        let names = HashMap::from([("feedbeefcafe0000".to_string(), "demo".to_string())]);
        let cs = [container(
            "0123456789abcdef",
            "feedbeefcafe0000",
            "sha256:aaaaaaaaaaaaaaaaaaaa",
        )];
        let text = ps_table(&cs, &names, 2_000_000_000, false).render();
        let row: Vec<&str> = text.lines().nth(1).unwrap_or("").split("  ").collect();
        let row: Vec<&str> = row
            .iter()
            .map(|c| c.trim())
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            row,
            [
                "0123456789abc",
                "aaaaaaaaaaaaa",
                "1 second ago",
                "Running",
                "web",
                "0",
                "feedbeefcafe0",
                "demo"
            ]
        );
    }

    #[test]
    fn ps_table_should_keep_image_references_whole() {
        let cs = [container("c", "p", "docker.io/petrel/busybox:latest")];
        let text = ps_table(&cs, &HashMap::new(), 2, false).render();
        assert!(text.contains("docker.io/petrel/busybox:latest"), "{text}");
        assert!(text.contains("unknown"), "{text}");
    }

    #[test]
    fn status_value_should_name_state_propagation_and_times() {
        let resp = ContainerStatusResponse {
            status: Some(ContainerStatus {
                id: "c".into(),
                state: ContainerState::ContainerExited as i32,
                created_at: 1_000_000_000,
                started_at: 0,
                mounts: vec![Mount {
                    propagation: MountPropagation::PropagationBidirectional as i32,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            info: HashMap::new(),
        };
        let v = status_value(&resp)
            .ok()
            .and_then(|d| serde_json::to_value(d).ok());
        let v = v.unwrap_or_default();
        assert_eq!(v["status"]["state"], "CONTAINER_EXITED");
        assert_eq!(v["status"]["created_at"], "1970-01-01T00:00:01.000000000Z");
        assert!(v["status"]["started_at"].is_null());
        assert_eq!(
            v["status"]["mounts"][0]["propagation"],
            "PROPAGATION_BIDIRECTIONAL"
        );
    }

    #[test]
    fn exit_status_byte_should_pass_small_codes_and_saturate_others() {
        assert_eq!(exit_status_byte(0), 0);
        assert_eq!(exit_status_byte(42), 42);
        assert_eq!(exit_status_byte(256), 255);
        assert_eq!(exit_status_byte(-1), 255);
    }
}

/// Flags of `checkpoint`.
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// The checkpoint archive to write (a .tar; relative to the current
    /// directory). Restore it with a container whose image is its path.
    #[arg(long)]
    export: std::path::PathBuf,
    /// The container id.
    id: String,
}

/// `checkpoint`: checkpoints a running container into an archive, leaving
/// it running (as `crictl checkpoint`).
pub async fn checkpoint(ctl: &Ctl, args: CheckpointArgs) -> Result<ExitCode, CtlError> {
    let location = std::path::absolute(&args.export).map_err(|source| CtlError::Io {
        what: "resolve",
        path: args.export.clone(),
        source,
    })?;
    let mut rt = ctl.runtime().await?;
    let req = petrel_cri::api::CheckpointContainerRequest {
        container_id: args.id.clone(),
        location: location.display().to_string(),
        timeout: ctl
            .timeout
            .map_or(0, |t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX)),
    };
    ctl.call(
        format!("checkpoint container {}", args.id),
        rt.checkpoint_container(req),
    )
    .await?;
    emit(&format!("{}\n", args.id))?;
    Ok(ExitCode::SUCCESS)
}
