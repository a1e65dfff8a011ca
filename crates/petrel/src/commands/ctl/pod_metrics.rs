//! `metricdescs` and `metricsp`: the runtime's CRI metrics (crictl's
//! commands of the same names), JSON by default.

use std::process::ExitCode;

use petrel_cri::api::{ListMetricDescriptorsRequest, ListPodSandboxMetricsRequest};

use super::error::CtlError;
use super::output::{self, Format};
use super::Ctl;

/// `metricdescs`: the metrics `metricsp` can report.
pub async fn descriptors(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    let mut rt = ctl.runtime().await?;
    let r = ctl
        .call(
            "list metric descriptors",
            rt.list_metric_descriptors(ListMetricDescriptorsRequest {}),
        )
        .await?;
    output::print_structured(structured(ctl), &r)?;
    Ok(ExitCode::SUCCESS)
}

/// `metricsp`: every ready pod's metrics and its containers'.
pub async fn pod_metrics(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    let mut rt = ctl.runtime().await?;
    let r = ctl
        .call(
            "list pod sandbox metrics",
            rt.list_pod_sandbox_metrics(ListPodSandboxMetricsRequest {}),
        )
        .await?;
    output::print_structured(structured(ctl), &r)?;
    Ok(ExitCode::SUCCESS)
}

/// JSON unless YAML was asked for (a table has no room for label sets).
fn structured(ctl: &Ctl) -> Format {
    match ctl.format_or(Format::Json) {
        Format::Table => Format::Json,
        f => f,
    }
}
