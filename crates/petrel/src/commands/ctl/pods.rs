//! Pod sandbox commands: `pods`, `inspectp`, `stopp` and `rmp`.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use petrel_cri::api::{
    ListPodSandboxRequest, NamespaceMode, PodSandbox, PodSandboxFilter, PodSandboxState,
    PodSandboxStateValue, PodSandboxStatusRequest, PodSandboxStatusResponse,
    RemovePodSandboxRequest, StopPodSandboxRequest,
};
use serde_json::{json, Value};

use super::error::CtlError;
use super::output::{self, emit, Format, StatusDoc, Table};
use super::{Ctl, Outcome};

/// A pod state as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PodStateArg {
    /// SANDBOX_READY.
    Ready,
    /// SANDBOX_NOTREADY.
    Notready,
}

/// Flags of `pods`.
#[derive(Debug, Args)]
pub struct PodsArgs {
    /// Filter by pod id (the runtime matches prefixes).
    #[arg(long)]
    id: Option<String>,
    /// Filter by pod name (substring).
    #[arg(long)]
    name: Option<String>,
    /// Filter by pod namespace (substring).
    #[arg(long)]
    namespace: Option<String>,
    /// Filter by state.
    #[arg(short = 's', long, value_enum)]
    state: Option<PodStateArg>,
    /// Filter by label, key=value (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Print only pod ids.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Show full ids.
    #[arg(long)]
    no_trunc: bool,
}

/// `pods`: lists pod sandboxes, newest first.
pub async fn list(ctl: &Ctl, args: PodsArgs) -> Result<ExitCode, CtlError> {
    let filter = PodSandboxFilter {
        id: args.id.clone().unwrap_or_default(),
        state: args.state.map(|s| PodSandboxStateValue {
            state: match s {
                PodStateArg::Ready => PodSandboxState::SandboxReady,
                PodStateArg::Notready => PodSandboxState::SandboxNotready,
            } as i32,
        }),
        label_selector: output::parse_labels(&args.labels)?,
    };
    let mut pods = list_pods(ctl, Some(filter)).await?;
    pods.retain(|p| matches_names(p, args.name.as_deref(), args.namespace.as_deref()));
    pods.sort_by_key(|x| std::cmp::Reverse(x.created_at));

    if args.quiet {
        let ids: String = pods.iter().map(|p| format!("{}\n", p.id)).collect();
        emit(&ids)?;
        return Ok(ExitCode::SUCCESS);
    }
    match ctl.format_or(Format::Table) {
        Format::Table => pods_table(&pods, output::now_ns(), args.no_trunc).print()?,
        f => {
            let items = pods.iter().map(pod_value).collect::<Result<Vec<_>, _>>()?;
            output::print_structured(f, &json!({ "items": items }))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Every pod sandbox that passes `filter`.
pub async fn list_pods(
    ctl: &Ctl,
    filter: Option<PodSandboxFilter>,
) -> Result<Vec<PodSandbox>, CtlError> {
    let mut rt = ctl.runtime().await?;
    let resp = ctl
        .call(
            "list pod sandboxes",
            rt.list_pod_sandbox(ListPodSandboxRequest { filter }),
        )
        .await?;
    Ok(resp.items)
}

fn matches_names(p: &PodSandbox, name: Option<&str>, namespace: Option<&str>) -> bool {
    let meta = p.metadata.clone().unwrap_or_default();
    name.is_none_or(|n| meta.name.contains(n))
        && namespace.is_none_or(|ns| meta.namespace.contains(ns))
}

fn pods_table(pods: &[PodSandbox], now: i64, no_trunc: bool) -> Table {
    let mut t = Table::new(&[
        "POD ID",
        "CREATED",
        "STATE",
        "NAME",
        "NAMESPACE",
        "ATTEMPT",
        "RUNTIME",
    ]);
    for p in pods {
        let meta = p.metadata.clone().unwrap_or_default();
        let id = if no_trunc {
            p.id.as_str()
        } else {
            output::short_id(&p.id)
        };
        t.push(vec![
            id.to_string(),
            output::ago(p.created_at, now),
            pod_state_label(p.state).to_string(),
            meta.name,
            meta.namespace,
            meta.attempt.to_string(),
            output::or_default(&p.runtime_handler, "(default)"),
        ]);
    }
    t
}

/// crictl's word for a pod state.
pub fn pod_state_label(state: i32) -> &'static str {
    match PodSandboxState::try_from(state) {
        Ok(PodSandboxState::SandboxReady) => "Ready",
        Ok(PodSandboxState::SandboxNotready) => "NotReady",
        Err(_) => "Unknown",
    }
}

fn pod_state_name(state: i32) -> Option<&'static str> {
    PodSandboxState::try_from(state)
        .ok()
        .map(|s| s.as_str_name())
}

fn pod_value(p: &PodSandbox) -> Result<Value, CtlError> {
    let mut v = output::to_value(p)?;
    output::name_enum(&mut v, "state", pod_state_name(p.state));
    Ok(v)
}

/// Flags of `inspectp`.
#[derive(Debug, Args)]
pub struct InspectpArgs {
    /// Pod ids or unique id prefixes.
    #[arg(required = true)]
    ids: Vec<String>,
}

/// `inspectp`: verbose PodSandboxStatus of each id (JSON by default).
pub async fn inspect(ctl: &Ctl, args: InspectpArgs) -> Result<ExitCode, CtlError> {
    let mut fetched = Vec::with_capacity(args.ids.len());
    for id in &args.ids {
        fetched.push(pod_status(ctl, id, true).await);
    }
    super::print_statuses(
        ctl.format_or(Format::Json),
        fetched,
        status_text,
        status_value,
    )
}

/// The PodSandboxStatus of one pod.
pub async fn pod_status(
    ctl: &Ctl,
    id: &str,
    verbose: bool,
) -> Result<PodSandboxStatusResponse, CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = PodSandboxStatusRequest {
        pod_sandbox_id: id.to_string(),
        verbose,
    };
    ctl.call(
        format!("get status of pod sandbox {id}"),
        rt.pod_sandbox_status(req),
    )
    .await
}

/// The status as JSON: enum names, RFC 3339 times, parsed info.
fn status_value(resp: &PodSandboxStatusResponse) -> Result<StatusDoc, CtlError> {
    let mut status = output::to_value(&resp.status)?;
    if let Some(s) = &resp.status {
        output::name_enum(&mut status, "state", pod_state_name(s.state));
        output::name_time(&mut status, "created_at");
        if let Some(opts) = status
            .pointer_mut("/linux/namespaces/options")
            .filter(|o| o.is_object())
        {
            name_namespace_modes(opts);
        }
    }
    Ok(StatusDoc {
        status,
        info: output::info_value(&resp.info),
    })
}

/// Names the network, pid and ipc modes of a NamespaceOption value.
pub fn name_namespace_modes(opts: &mut Value) {
    for key in ["network", "pid", "ipc"] {
        let name = opts
            .get(key)
            .and_then(Value::as_i64)
            .and_then(|m| i32::try_from(m).ok())
            .and_then(|m| NamespaceMode::try_from(m).ok())
            .map(|m| m.as_str_name());
        output::name_enum(opts, key, name);
    }
}

fn status_text(resp: &PodSandboxStatusResponse, now: i64) -> String {
    let Some(s) = &resp.status else {
        return String::new();
    };
    let meta = s.metadata.clone().unwrap_or_default();
    let mut out = format!("ID: {}\nName: {}\n", s.id, meta.name);
    out.push_str(&format!(
        "UID: {}\nNamespace: {}\nAttempt: {}\n",
        meta.uid, meta.namespace, meta.attempt
    ));
    out.push_str(&format!(
        "Status: {}\n",
        pod_state_name(s.state).unwrap_or("?")
    ));
    out.push_str(&format!("Created: {}\n", output::ago(s.created_at, now)));
    if let Some(net) = s.network.as_ref().filter(|n| !n.ip.is_empty()) {
        out.push_str(&format!("IP Address: {}\n", net.ip));
    }
    out.push_str(&output::map_lines("Labels", &s.labels));
    out.push_str(&output::map_lines("Annotations", &s.annotations));
    out
}

/// Flags of `stopp`.
#[derive(Debug, Args)]
pub struct StoppArgs {
    /// Pod ids or unique id prefixes.
    #[arg(required = true)]
    ids: Vec<String>,
}

/// `stopp`: stops each pod sandbox.
pub async fn stop(ctl: &Ctl, args: StoppArgs) -> Result<ExitCode, CtlError> {
    let mut outcome = Outcome::default();
    for id in &args.ids {
        if outcome.note(stop_pod(ctl, id).await).is_some() {
            emit(&format!("Stopped sandbox {id}\n"))?;
        }
    }
    Ok(outcome.exit_code())
}

/// Stops one pod sandbox.
pub async fn stop_pod(ctl: &Ctl, id: &str) -> Result<(), CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = StopPodSandboxRequest {
        pod_sandbox_id: id.to_string(),
    };
    ctl.call(format!("stop pod sandbox {id}"), rt.stop_pod_sandbox(req))
        .await
        .map(drop)
}

/// Removes one pod sandbox.
pub async fn remove_pod(ctl: &Ctl, id: &str) -> Result<(), CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = RemovePodSandboxRequest {
        pod_sandbox_id: id.to_string(),
    };
    ctl.call(
        format!("remove pod sandbox {id}"),
        rt.remove_pod_sandbox(req),
    )
    .await
    .map(drop)
}

/// Flags of `rmp`.
#[derive(Debug, Args)]
pub struct RmpArgs {
    /// Pod ids or unique id prefixes.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    ids: Vec<String>,
    /// Stop ready pods before removing them.
    #[arg(short = 'f', long)]
    force: bool,
    /// Remove every pod sandbox.
    #[arg(short = 'a', long)]
    all: bool,
}

/// `rmp`: removes each pod sandbox; ready ones only with `-f`.
pub async fn remove(ctl: &Ctl, args: RmpArgs) -> Result<ExitCode, CtlError> {
    let ids = if args.all {
        list_pods(ctl, None)
            .await?
            .into_iter()
            .map(|p| p.id)
            .collect()
    } else {
        args.ids
    };
    let mut outcome = Outcome::default();
    for id in &ids {
        if outcome
            .note(remove_one(ctl, id, args.force).await)
            .is_some()
        {
            emit(&format!("Removed sandbox {id}\n"))?;
        }
    }
    Ok(outcome.exit_code())
}

async fn remove_one(ctl: &Ctl, id: &str, force: bool) -> Result<(), CtlError> {
    let status = pod_status(ctl, id, false).await?.status.unwrap_or_default();
    if status.state == PodSandboxState::SandboxReady as i32 {
        if !force {
            return Err(CtlError::Other(format!(
                "pod sandbox {id} is ready: stop it first (stopp) or use -f"
            )));
        }
        stop_pod(ctl, id).await?;
    }
    remove_pod(ctl, id).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_cri::api::{
        LinuxPodSandboxStatus, Namespace, NamespaceOption, PodSandboxMetadata, PodSandboxStatus,
    };
    use std::collections::HashMap;

    fn pod(id: &str, name: &str, ns: &str, created: i64) -> PodSandbox {
        PodSandbox {
            id: id.into(),
            metadata: Some(PodSandboxMetadata {
                name: name.into(),
                uid: "u".into(),
                namespace: ns.into(),
                attempt: 1,
            }),
            state: PodSandboxState::SandboxReady as i32,
            created_at: created,
            ..Default::default()
        }
    }

    #[test]
    fn pods_table_should_show_crictl_columns() {
        let now = 600_000_000_000;
        let pods = [pod(
            "0123456789abcdef",
            "demo",
            "default",
            now - 180_000_000_000,
        )];
        let text = pods_table(&pods, now, false).render();
        let mut lines = text.lines();
        assert_eq!(
            lines
                .next()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")),
            Some("POD ID CREATED STATE NAME NAMESPACE ATTEMPT RUNTIME".into())
        );
        assert_eq!(
            lines.next(),
            Some("0123456789abc  3 minutes ago  Ready  demo  default    1        (default)")
        );
    }

    #[test]
    fn matches_names_should_use_substrings() {
        let p = pod("a", "nginx-web", "prod", 1);
        assert!(matches_names(&p, Some("web"), None));
        assert!(matches_names(&p, None, Some("pro")));
        assert!(!matches_names(&p, Some("db"), None));
    }

    #[test]
    fn status_value_should_name_state_namespaces_and_time() {
        let resp = PodSandboxStatusResponse {
            status: Some(PodSandboxStatus {
                id: "abc".into(),
                state: PodSandboxState::SandboxNotready as i32,
                created_at: 1_000_000_000,
                linux: Some(LinuxPodSandboxStatus {
                    namespaces: Some(Namespace {
                        options: Some(NamespaceOption {
                            network: NamespaceMode::Node as i32,
                            pid: NamespaceMode::Container as i32,
                            ..Default::default()
                        }),
                    }),
                }),
                ..Default::default()
            }),
            info: HashMap::from([("info".into(), r#"{"pid":7}"#.into())]),
            ..Default::default()
        };
        let v = status_value(&resp)
            .ok()
            .and_then(|d| serde_json::to_value(d).ok());
        let v = v.unwrap_or_default();
        assert_eq!(v["status"]["state"], "SANDBOX_NOTREADY");
        assert_eq!(v["status"]["created_at"], "1970-01-01T00:00:01.000000000Z");
        assert_eq!(
            v["status"]["linux"]["namespaces"]["options"]["network"],
            "NODE"
        );
        assert_eq!(v["status"]["linux"]["namespaces"]["options"]["ipc"], "POD");
        assert_eq!(v["info"]["info"]["pid"], 7);
    }
}
