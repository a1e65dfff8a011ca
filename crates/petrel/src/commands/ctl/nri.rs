//! `nri`: the runtime's NRI plugins, their index, subscriptions and health.

use std::process::ExitCode;

use petrel_cri::admin::{NriPluginsRequest, NriPluginsResponse};

use super::error::CtlError;
use super::output::{self, emit, Format, Table};
use super::Ctl;

/// `nri`: a table by default, the whole answer in JSON or YAML.
pub async fn plugins(ctl: &Ctl) -> Result<ExitCode, CtlError> {
    let mut admin = ctl.admin().await?;
    let r = ctl
        .call("list NRI plugins", admin.nri_plugins(NriPluginsRequest {}))
        .await?;
    match ctl.format_or(Format::Table) {
        Format::Table => emit(&table(&r))?,
        f => output::print_structured(f, &r)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Event names as NRI spells them, shortened for the table.
fn short_event(e: &str) -> String {
    e.to_ascii_lowercase()
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

fn table(r: &NriPluginsResponse) -> String {
    if !r.enabled {
        return "NRI is disabled\n".to_string();
    }
    let mut t = Table::new(&[
        "INDEX", "NAME", "HEALTH", "PID", "LAUNCHED", "CALLS", "ERRORS", "TIMEOUTS", "MEAN",
        "EVENTS",
    ]);
    for p in &r.plugins {
        t.push(vec![
            p.index.clone(),
            p.name.clone(),
            p.health.clone(),
            if p.pid == 0 {
                "-".to_string()
            } else {
                p.pid.to_string()
            },
            if p.pre_registered {
                format!("yes ({} relaunches)", p.relaunches)
            } else {
                "no".to_string()
            },
            p.calls.to_string(),
            p.errors.to_string(),
            p.timeouts.to_string(),
            format!("{}µs", p.mean_call_micros),
            p.events
                .iter()
                .map(|e| short_event(e))
                .collect::<Vec<_>>()
                .join(","),
        ]);
    }
    let socket = if r.socket.is_empty() {
        "(connections disabled)"
    } else {
        r.socket.as_str()
    };
    format!("{}\nSocket: {socket}\n", t.render())
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_cri::admin::NriPlugin;

    #[test]
    fn table_should_list_plugins_with_short_event_names() {
        let r = NriPluginsResponse {
            enabled: true,
            socket: "/run/nri.sock".into(),
            plugins: vec![NriPlugin {
                index: "10".into(),
                name: "logger".into(),
                events: vec!["CREATE_CONTAINER".into(), "POST_START_CONTAINER".into()],
                pre_registered: true,
                pid: 42,
                health: "connected".into(),
                calls: 3,
                mean_call_micros: 120,
                ..Default::default()
            }],
        };
        let t = table(&r);
        assert!(t.contains("CreateContainer,PostStartContainer"), "{t}");
        assert!(t.contains("yes (0 relaunches)"), "{t}");
        assert!(t.contains("Socket: /run/nri.sock"), "{t}");
        assert_eq!(table(&NriPluginsResponse::default()), "NRI is disabled\n");
    }
}
