//! `version`, `info` and `metrics`: what the runtime says about itself.

use std::process::ExitCode;

use petrel_cri::admin::MetricsRequest;
use petrel_cri::api::{StatusRequest, StatusResponse, VersionRequest, VersionResponse};
use serde::Serialize;
use serde_json::Value;

use super::error::CtlError;
use super::output::{self, emit, Format, Table};
use super::Ctl;

/// The CRI version this client speaks.
const CRI_VERSION: &str = "v1";

/// `version`: the runtime's name and versions.
pub async fn version(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = VersionRequest {
        version: CRI_VERSION.into(),
    };
    let v = ctl.call("get runtime version", rt.version(req)).await?;
    match ctl.format_or(Format::Table) {
        Format::Table => emit(&version_text(&v))?,
        f => output::print_structured(f, &v)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn version_text(v: &VersionResponse) -> String {
    format!(
        "Version:  {}\nRuntimeName:  {}\nRuntimeVersion:  {}\nRuntimeApiVersion:  {}\n",
        v.version, v.runtime_name, v.runtime_version, v.runtime_api_version
    )
}

/// `info`: conditions, handlers and the verbose info map (JSON by default).
pub async fn info(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    let mut rt = ctl.runtime().await?;
    let s = ctl
        .call(
            "get runtime status",
            rt.status(StatusRequest { verbose: true }),
        )
        .await?;
    match ctl.format_or(Format::Json) {
        Format::Table => emit(&status_table(&s))?,
        f => output::print_structured(f, &status_value(&s)?)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// What `info` prints, in this order.
#[derive(Debug, Serialize)]
struct InfoDoc {
    status: Value,
    runtime_handlers: Value,
    features: Value,
    info: Value,
}

fn status_value(s: &StatusResponse) -> Result<InfoDoc, CtlError> {
    Ok(InfoDoc {
        status: output::to_value(&s.status)?,
        runtime_handlers: output::to_value(&s.runtime_handlers)?,
        features: output::to_value(&s.features)?,
        info: output::info_value(&s.info),
    })
}

fn status_table(s: &StatusResponse) -> String {
    let mut t = Table::new(&["CONDITION", "STATUS", "REASON", "MESSAGE"]);
    for c in s.status.iter().flat_map(|st| &st.conditions) {
        t.push(vec![
            c.r#type.clone(),
            c.status.to_string(),
            c.reason.clone(),
            c.message.clone(),
        ]);
    }
    let mut text = t.render();
    let handlers: Vec<String> = s
        .runtime_handlers
        .iter()
        .map(|h| output::or_default(&h.name, "(default)"))
        .collect();
    if !handlers.is_empty() {
        text.push_str(&format!("\nRuntime handlers: {}\n", handlers.join(", ")));
    }
    text
}

/// `metrics`: the runtime's metrics in the Prometheus text format.
pub async fn metrics(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    let mut admin = ctl.admin().await?;
    let m = ctl
        .call("get runtime metrics", admin.metrics(MetricsRequest {}))
        .await?;
    emit(&m.text)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_cri::api::{RuntimeCondition, RuntimeStatus};
    use std::collections::HashMap;

    fn status() -> StatusResponse {
        StatusResponse {
            status: Some(RuntimeStatus {
                conditions: vec![RuntimeCondition {
                    r#type: "RuntimeReady".into(),
                    status: true,
                    reason: String::new(),
                    message: String::new(),
                }],
            }),
            info: HashMap::from([("config".into(), r#"{"root":"/var/lib/petrel"}"#.into())]),
            runtime_handlers: vec![],
            features: None,
        }
    }

    #[test]
    fn status_value_should_nest_parsed_info_beside_conditions() {
        let v = status_value(&status())
            .ok()
            .and_then(|d| serde_json::to_value(d).ok());
        let v = v.unwrap_or_default();
        assert_eq!(v["status"]["conditions"][0]["type"], "RuntimeReady");
        assert_eq!(v["info"]["config"]["root"], "/var/lib/petrel");
    }

    #[test]
    fn status_table_should_list_conditions() {
        let t = status_table(&status());
        assert!(
            t.starts_with("CONDITION     STATUS  REASON  MESSAGE\n"),
            "{t}"
        );
        assert!(t.contains("RuntimeReady  true"), "{t}");
    }

    #[test]
    fn version_text_should_print_one_field_per_line() {
        let v = VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "petrel".into(),
            runtime_version: "0.1.0".into(),
            runtime_api_version: "v1".into(),
        };
        assert!(version_text(&v).contains("RuntimeName:  petrel\n"));
    }
}
