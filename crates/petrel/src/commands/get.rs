//! `petrel get pods`: the agent's pods like `kubectl get pods`, from its
//! unix socket (`/pods`, `/pods/{namespace}/{name}`, `/pods?watch=true`);
//! `petrel get node`: the node's pressure conditions (`/node`).
//!
//! Errors print `Error: <message>` and exit with 1; usage errors exit with 2.
//! A reader that closes the pipe (`| head`) ends it quietly with 0.

mod http;
mod table;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

use http::{HttpError, Lines, Server};
use table::Columns;

/// Flags of `petrel get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// What to show: pods, or the node.
    #[arg(value_enum)]
    resource: Resource,
    /// One pod's name.
    name: Option<String>,
    /// The namespace [default: default].
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Pods of every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum)]
    output: Option<Output>,
    /// After the list, print a line per change.
    #[arg(short = 'w', long)]
    watch: bool,
    /// The agent: its unix socket (`unix:///PATH`), or `http://HOST:PORT`
    /// for a server that serves pods over plain HTTP (the agent's TCP port
    /// does not: it serves /healthz and /metrics only).
    #[arg(
        long,
        env = "PETREL_AGENT",
        default_value = "unix:///run/petrel-agent/agent.sock"
    )]
    server: String,
}

/// The resource types `get` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Resource {
    /// Pods.
    #[value(alias = "pod", alias = "po")]
    Pods,
    /// The node (its pressure conditions).
    #[value(alias = "node", alias = "no")]
    Nodes,
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// The table with IP and NODE.
    Wide,
    /// The Pod (or a List) as JSON.
    Json,
    /// The Pod (or a List) as YAML.
    Yaml,
}

/// Errors of `petrel get`.
#[derive(Debug, thiserror::Error)]
enum GetError {
    #[error(transparent)]
    Http(#[from] HttpError),
    /// What the agent said, from its Status answer.
    #[error("{0}")]
    Server(String),
    #[error("a resource cannot be retrieved by name across all namespaces")]
    NameAcrossNamespaces,
    #[error("decoding the agent's answer: {0}")]
    Decode(String),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// Runs `petrel get`.
pub fn main(args: GetArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`| head`): it has what it
        // wanted, which is no failure (a script with pipefail goes on).
        Err(GetError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What to show, from the flags.
#[derive(Debug, Clone)]
struct Query {
    name: Option<String>,
    /// None: every namespace.
    namespace: Option<String>,
    output: Option<Output>,
    columns: Columns,
}

impl Query {
    fn from_args(args: &GetArgs) -> Result<Self, GetError> {
        if args.all_namespaces && args.name.is_some() {
            return Err(GetError::NameAcrossNamespaces);
        }
        let namespace = (!args.all_namespaces)
            .then(|| args.namespace.clone().unwrap_or_else(|| "default".into()));
        Ok(Self {
            name: args.name.clone(),
            namespace,
            output: args.output,
            columns: Columns {
                namespace: args.all_namespaces,
                wide: args.output == Some(Output::Wide),
            },
        })
    }

    fn wants(&self, pod: &Pod) -> bool {
        let m = &pod.metadata;
        self.namespace
            .as_ref()
            .is_none_or(|ns| m.namespace.as_ref() == Some(ns))
            && self
                .name
                .as_ref()
                .is_none_or(|n| m.name.as_ref() == Some(n))
    }
}

async fn run(args: GetArgs) -> Result<(), GetError> {
    let server = Server::parse(&args.server)?;
    if args.resource == Resource::Nodes {
        if args.watch {
            return Err(GetError::Server(
                "--watch is only supported for pods".into(),
            ));
        }
        let node = fetch_node(&server, args.name.as_deref()).await?;
        let mut out = std::io::stdout();
        return print_node(&mut out, args.output, &node);
    }
    let query = Query::from_args(&args)?;
    let pods = fetch(&server, &query).await?;
    let mut out = std::io::stdout();
    let mut widths = Vec::new();
    print_initial(&mut out, &query, &pods, &mut widths)?;
    if args.watch {
        watch(&server, &query, pods, widths, &mut out).await?;
    }
    Ok(())
}

/// The pods the query names (one by name, or a namespace's, or all).
async fn fetch(server: &Server, q: &Query) -> Result<Vec<Pod>, GetError> {
    if let (Some(name), Some(ns)) = (&q.name, &q.namespace) {
        let mut resp = server
            .get(&format!("/pods/{}/{}", escape(ns), escape(name)))
            .await?;
        let body = resp.body().await?;
        if resp.status != 200 {
            return Err(server_error(resp.status, &body));
        }
        let pod: Pod =
            serde_json::from_slice(&body).map_err(|e| GetError::Decode(e.to_string()))?;
        return Ok(vec![pod]);
    }
    Ok(list(server)
        .await?
        .into_iter()
        .filter(|p| q.wants(p))
        .collect())
}

/// The agent's node (`name`, when given, must be its name).
async fn fetch_node(
    server: &Server,
    name: Option<&str>,
) -> Result<k8s_openapi::api::core::v1::Node, GetError> {
    let mut resp = server.get("/node").await?;
    let body = resp.body().await?;
    if resp.status != 200 {
        return Err(server_error(resp.status, &body));
    }
    let node: k8s_openapi::api::core::v1::Node =
        serde_json::from_slice(&body).map_err(|e| GetError::Decode(e.to_string()))?;
    if let Some(n) = name {
        if node.metadata.name.as_deref() != Some(n) {
            return Err(GetError::Server(format!("nodes {n:?} not found")));
        }
    }
    Ok(node)
}

/// The node as a table (NAME and one column per pressure condition) or
/// as JSON/YAML.
fn print_node(
    out: &mut impl Write,
    format: Option<Output>,
    node: &k8s_openapi::api::core::v1::Node,
) -> Result<(), GetError> {
    if matches!(format, Some(Output::Json) | Some(Output::Yaml)) {
        let value = serde_json::to_value(node).map_err(|e| GetError::Decode(e.to_string()))?;
        write_object(out, format, &value)?;
        out.flush()?;
        return Ok(());
    }
    const KINDS: [&str; 3] = ["MemoryPressure", "DiskPressure", "PIDPressure"];
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    let mut header = vec!["NAME".to_string()];
    header.extend(KINDS.iter().map(|k| k.to_uppercase()));
    let mut row = vec![node.metadata.name.clone().unwrap_or_default()];
    for k in KINDS {
        let status = conditions
            .and_then(|cs| cs.iter().find(|c| c.type_ == k))
            .map_or("Unknown", |c| c.status.as_str());
        row.push(status.to_string());
    }
    out.write_all(table::render(&[header, row], &mut Vec::new()).as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Every pod the agent has.
async fn list(server: &Server) -> Result<Vec<Pod>, GetError> {
    #[derive(Deserialize)]
    struct PodList {
        #[serde(default)]
        items: Vec<Pod>,
    }
    let mut resp = server.get("/pods").await?;
    let body = resp.body().await?;
    if resp.status != 200 {
        return Err(server_error(resp.status, &body));
    }
    let list: PodList =
        serde_json::from_slice(&body).map_err(|e| GetError::Decode(e.to_string()))?;
    Ok(list.items)
}

/// The message of a Kubernetes Status answer, else the status code.
fn server_error(status: u16, body: &[u8]) -> GetError {
    #[derive(Deserialize)]
    struct Status {
        message: Option<String>,
    }
    match serde_json::from_slice::<Status>(body)
        .ok()
        .and_then(|s| s.message)
    {
        Some(m) => GetError::Server(m),
        None => GetError::Server(format!(
            "the agent answered {status}: {}",
            String::from_utf8_lossy(body).trim()
        )),
    }
}

/// Percent-encodes a path segment (names are DNS names; this is for the
/// odd character in a bad one).
fn escape(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn print_initial(
    out: &mut impl Write,
    q: &Query,
    pods: &[Pod],
    widths: &mut Vec<usize>,
) -> Result<(), GetError> {
    match q.output {
        Some(Output::Json) | Some(Output::Yaml) => {
            let value = if q.name.is_some() && pods.len() == 1 {
                serde_json::to_value(&pods[0])
            } else {
                serde_json::to_value(serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "List",
                    "metadata": {"resourceVersion": ""},
                    "items": pods,
                }))
            }
            .map_err(|e| GetError::Decode(e.to_string()))?;
            write_object(out, q.output, &value)?;
        }
        _ => {
            if pods.is_empty() {
                match &q.namespace {
                    Some(ns) => eprintln!("No resources found in {ns} namespace."),
                    None => eprintln!("No resources found"),
                }
                return Ok(());
            }
            let now = now();
            let mut rows = vec![q.columns.header()];
            rows.extend(pods.iter().map(|p| q.columns.row(p, now)));
            out.write_all(table::render(&rows, widths).as_bytes())?;
        }
    }
    out.flush()?;
    Ok(())
}

fn write_object(
    out: &mut impl Write,
    format: Option<Output>,
    value: &serde_json::Value,
) -> Result<(), GetError> {
    let text = if format == Some(Output::Yaml) {
        serde_yaml::to_string(value).map_err(|e| GetError::Decode(e.to_string()))?
    } else {
        let mut s =
            serde_json::to_string_pretty(value).map_err(|e| GetError::Decode(e.to_string()))?;
        s.push('\n');
        s
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}

/// The wall clock as a Kubernetes timestamp (k8s-openapi's jiff is built
/// without its clock).
fn now() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::new(d.as_secs() as i64, d.subsec_nanos() as i32).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// One watch event.
#[derive(Debug, Deserialize)]
struct WatchEvent {
    #[serde(rename = "type")]
    kind: String,
    object: Pod,
}

/// Prints a line per change until interrupted, each change once: an event
/// that changes nothing the output shows (a condition's time, say) prints
/// nothing. The agent's stream starts with every pod (ADDED); those
/// already shown unchanged are skipped. When
/// the stream ends (the agent restarted, or this watcher fell behind), it
/// reconnects; pods gone meanwhile are printed once more as last seen.
async fn watch(
    server: &Server,
    q: &Query,
    shown: Vec<Pod>,
    mut widths: Vec<usize>,
    out: &mut impl Write,
) -> Result<(), GetError> {
    let key = |p: &Pod| {
        (
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        )
    };
    // What each pod's line said last (tables: the cells but AGE; JSON and
    // YAML: the object): an event that would print the same again is a
    // change the output does not show, and is skipped.
    let seen = |p: &Pod| Seen::of(q, p);
    let mut last: BTreeMap<(String, String), Seen> =
        shown.iter().map(|p| (key(p), seen(p))).collect();
    let mut shown: BTreeMap<(String, String), Pod> =
        shown.into_iter().map(|p| (key(&p), p)).collect();
    let mut retry = Duration::from_millis(200);
    let mut reconnect = false;
    loop {
        if reconnect {
            // Catch up with what happened while disconnected.
            match list(server).await {
                Ok(pods) => {
                    let now: BTreeMap<_, _> = pods
                        .into_iter()
                        .filter(|p| q.wants(p))
                        .map(|p| (key(&p), p))
                        .collect();
                    let gone: Vec<_> = shown
                        .keys()
                        .filter(|k| !now.contains_key(*k))
                        .cloned()
                        .collect();
                    for k in gone {
                        last.remove(&k);
                        if let Some(p) = shown.remove(&k) {
                            print_change(out, q, &p, &mut widths)?;
                        }
                    }
                }
                Err(e) => {
                    eprintln!("Error: {e}; retrying");
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        reconnect = true;
        let mut resp = match server.get("/pods?watch=true").await {
            Ok(r) if r.status == 200 => r,
            Ok(mut r) => {
                let body = r.body().await.unwrap_or_default();
                return Err(server_error(r.status, &body));
            }
            Err(e) => {
                eprintln!("Error: {e}; retrying");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        retry = Duration::from_millis(200);
        let mut lines = Lines::default();
        loop {
            let piece = match resp.chunk().await {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "watch stream broke");
                    break;
                }
            };
            for line in lines.push(&piece) {
                let ev: WatchEvent = match serde_json::from_slice(&line) {
                    Ok(ev) => ev,
                    Err(e) => return Err(GetError::Decode(e.to_string())),
                };
                if !q.wants(&ev.object) {
                    continue;
                }
                let k = key(&ev.object);
                if ev.kind == "DELETED" {
                    last.remove(&k);
                    shown.remove(&k);
                } else {
                    let now = seen(&ev.object);
                    shown.insert(k.clone(), ev.object.clone());
                    if last.get(&k) == Some(&now) {
                        continue;
                    }
                    last.insert(k, now);
                }
                print_change(out, q, &ev.object, &mut widths)?;
            }
        }
    }
}

/// What a pod's line in the watch shows, to print each change once.
#[derive(Debug, PartialEq)]
enum Seen {
    /// A table row's cells without AGE (which changes by itself).
    Row(Vec<String>),
    /// The whole pod (JSON and YAML show all of it).
    Object(Box<Pod>),
}

impl Seen {
    fn of(q: &Query, pod: &Pod) -> Self {
        match q.output {
            Some(Output::Json) | Some(Output::Yaml) => Self::Object(Box::new(pod.clone())),
            _ => {
                let mut row = q.columns.row(pod, Timestamp::UNIX_EPOCH);
                if let Some(age) = q.columns.age_index() {
                    row.remove(age);
                }
                Self::Row(row)
            }
        }
    }
}

fn print_change(
    out: &mut impl Write,
    q: &Query,
    pod: &Pod,
    widths: &mut Vec<usize>,
) -> Result<(), GetError> {
    match q.output {
        Some(Output::Json) | Some(Output::Yaml) => {
            let v = serde_json::to_value(pod).map_err(|e| GetError::Decode(e.to_string()))?;
            if q.output == Some(Output::Yaml) {
                out.write_all(b"---\n")?;
            }
            write_object(out, q.output, &v)?;
        }
        _ => {
            let mut rows = Vec::new();
            // Nothing was listed at the start: the first row brings the header.
            if widths.is_empty() {
                rows.push(q.columns.header());
            }
            rows.push(q.columns.row(pod, now()));
            out.write_all(table::render(&rows, widths).as_bytes())?;
        }
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
