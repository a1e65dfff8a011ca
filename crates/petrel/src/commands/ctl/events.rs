//! `events`: streams GetContainerEvents until Ctrl-C or the stream ends.

use std::collections::HashMap;
use std::process::ExitCode;

use petrel_cri::api::{ContainerEventResponse, ContainerEventType, GetEventsRequest};
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};

use super::containers::container_state_name;
use super::error::CtlError;
use super::output::{self, emit, Format};
use super::Ctl;

/// `events`: prints each event as it arrives.
pub async fn watch(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    let format = ctl.format_or(Format::Table);
    let mut rt = ctl.runtime().await?;
    // Subscribing is a call like any other: bounded by --timeout.
    let mut stream = ctl
        .call(
            "subscribe to container events",
            rt.get_container_events(GetEventsRequest {}),
        )
        .await?;
    // Registered once, so a Ctrl-C that comes while an event is printed is
    // not lost.
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| CtlError::Other(format!("cannot watch for Ctrl-C: {e}")))?;
    let mut first = true;
    let mut names = ContainerNames::default();
    loop {
        let next = tokio::select! {
            next = stream.message() => next,
            _ = interrupt.recv() => return Ok(ExitCode::SUCCESS),
        };
        match next {
            Ok(Some(event)) => {
                names.learn(&event);
                emit(&event_text(format, &event, &names, first)?)?;
                names.forget(&event);
                first = false;
            }
            Ok(None) => return Ok(ExitCode::SUCCESS),
            Err(status) => return Err(CtlError::rpc("container event stream ended", status)),
        }
    }
}

/// Container names seen in earlier events, for events that no longer carry
/// their container's status (a deleted container's, typically).
#[derive(Debug, Default)]
struct ContainerNames(HashMap<String, String>);

impl ContainerNames {
    /// Remembers the names of the containers the event describes.
    fn learn(&mut self, event: &ContainerEventResponse) {
        for c in &event.containers_statuses {
            if let Some(m) = &c.metadata {
                self.0.insert(c.id.clone(), m.name.clone());
            }
        }
    }

    /// Drops a deleted container's name.
    fn forget(&mut self, event: &ContainerEventResponse) {
        if event.container_event_type == ContainerEventType::ContainerDeletedEvent as i32 {
            self.0.remove(&event.container_id);
        }
    }

    fn get(&self, id: &str) -> Option<&str> {
        self.0.get(id).map(String::as_str)
    }
}

/// One event in the chosen format; YAML documents after the first one are
/// preceded by `---`.
fn event_text(
    format: Format,
    event: &ContainerEventResponse,
    names: &ContainerNames,
    first: bool,
) -> Result<String, CtlError> {
    match format {
        Format::Table => Ok(event_line(event, names)),
        Format::Json => output::render(format, &event_value(event)?),
        Format::Yaml => {
            let doc = output::render(format, &event_value(event)?)?;
            Ok(if first { doc } else { format!("---\n{doc}") })
        }
    }
}

/// `TIME  TYPE  ID  POD  [CONTAINER]` on one line.
fn event_line(event: &ContainerEventResponse, names: &ContainerNames) -> String {
    let pod = event
        .pod_sandbox_status
        .as_ref()
        .and_then(|p| p.metadata.as_ref())
        .map_or("", |m| m.name.as_str());
    // Sandbox events carry the pod's id, which names no container.
    let container = names.get(&event.container_id);
    let mut line = format!(
        "{}  {:<7}  {:<13}  {}",
        output::rfc3339(event.created_at, 3),
        event_type_label(event.container_event_type),
        output::short_id(&event.container_id),
        if pod.is_empty() { "-" } else { pod },
    );
    if let Some(name) = container {
        line.push_str("  ");
        line.push_str(name);
    }
    line.push('\n');
    line
}

fn event_type_label(t: i32) -> &'static str {
    match ContainerEventType::try_from(t) {
        Ok(ContainerEventType::ContainerCreatedEvent) => "CREATED",
        Ok(ContainerEventType::ContainerStartedEvent) => "STARTED",
        Ok(ContainerEventType::ContainerStoppedEvent) => "STOPPED",
        Ok(ContainerEventType::ContainerDeletedEvent) => "DELETED",
        Err(_) => "UNKNOWN",
    }
}

/// The event as JSON, with its type, states and times named.
fn event_value(event: &ContainerEventResponse) -> Result<Value, CtlError> {
    let mut v = output::to_value(event)?;
    let kind = ContainerEventType::try_from(event.container_event_type)
        .ok()
        .map(|t| t.as_str_name());
    output::name_enum(&mut v, "container_event_type", kind);
    output::name_time(&mut v, "created_at");
    if let (Some(pod_json), Some(pod)) =
        (v.get_mut("pod_sandbox_status"), &event.pod_sandbox_status)
    {
        let state = petrel_cri::api::PodSandboxState::try_from(pod.state)
            .ok()
            .map(|s| s.as_str_name());
        output::name_enum(pod_json, "state", state);
        output::name_time(pod_json, "created_at");
    }
    if let Some(list) = v
        .get_mut("containers_statuses")
        .and_then(Value::as_array_mut)
    {
        for (c_json, c) in list.iter_mut().zip(&event.containers_statuses) {
            output::name_enum(c_json, "state", container_state_name(c.state));
            for key in ["created_at", "started_at", "finished_at"] {
                output::name_time(c_json, key);
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
// A failed expectation is a failed test.
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use petrel_cri::api::{
        ContainerMetadata, ContainerState, ContainerStatus, PodSandboxMetadata, PodSandboxStatus,
    };

    fn event(id: &str, kind: ContainerEventType) -> ContainerEventResponse {
        ContainerEventResponse {
            container_id: id.into(),
            container_event_type: kind as i32,
            created_at: 1_709_214_330_123_456_789,
            pod_sandbox_status: Some(PodSandboxStatus {
                id: "pod0123456789abcdef".into(),
                metadata: Some(PodSandboxMetadata {
                    name: "demo".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers_statuses: vec![ContainerStatus {
                id: "ctr0123456789abcdef".into(),
                metadata: Some(ContainerMetadata {
                    name: "hello".into(),
                    attempt: 0,
                }),
                state: ContainerState::ContainerRunning as i32,
                ..Default::default()
            }],
        }
    }

    #[test]
    fn event_line_should_name_the_container_when_the_id_is_one() {
        let e = event(
            "ctr0123456789abcdef",
            ContainerEventType::ContainerStartedEvent,
        );
        let mut names = ContainerNames::default();
        names.learn(&e);
        assert_eq!(
            event_line(&e, &names),
            "2024-02-29T13:45:30.123Z  STARTED  ctr0123456789  demo  hello\n"
        );
    }

    #[test]
    fn event_line_should_show_only_the_pod_for_sandbox_events() {
        let e = event(
            "pod0123456789abcdef",
            ContainerEventType::ContainerCreatedEvent,
        );
        let mut names = ContainerNames::default();
        names.learn(&e);
        assert_eq!(
            event_line(&e, &names),
            "2024-02-29T13:45:30.123Z  CREATED  pod0123456789  demo\n"
        );
    }

    #[test]
    fn event_line_should_remember_names_of_deleted_containers() {
        let mut names = ContainerNames::default();
        names.learn(&event(
            "ctr0123456789abcdef",
            ContainerEventType::ContainerStoppedEvent,
        ));
        let mut deleted = event(
            "ctr0123456789abcdef",
            ContainerEventType::ContainerDeletedEvent,
        );
        deleted.containers_statuses.clear();
        names.learn(&deleted);
        assert!(event_line(&deleted, &names).ends_with("  demo  hello\n"));
        names.forget(&deleted);
        assert_eq!(names.get("ctr0123456789abcdef"), None);
    }

    #[test]
    fn event_value_should_name_type_and_states() {
        let e = event(
            "ctr0123456789abcdef",
            ContainerEventType::ContainerStoppedEvent,
        );
        let v = event_value(&e).expect("json");
        assert_eq!(v["container_event_type"], "CONTAINER_STOPPED_EVENT");
        assert_eq!(v["created_at"], "2024-02-29T13:45:30.123456789Z");
        assert_eq!(v["pod_sandbox_status"]["state"], "SANDBOX_READY");
        assert_eq!(v["containers_statuses"][0]["state"], "CONTAINER_RUNNING");
    }

    #[test]
    fn event_text_should_separate_yaml_documents() {
        let e = event(
            "ctr0123456789abcdef",
            ContainerEventType::ContainerDeletedEvent,
        );
        let names = ContainerNames::default();
        let first = event_text(Format::Yaml, &e, &names, true).expect("yaml");
        let second = event_text(Format::Yaml, &e, &names, false).expect("yaml");
        assert!(!first.starts_with("---"));
        assert!(second.starts_with("---\n"));
    }
}
