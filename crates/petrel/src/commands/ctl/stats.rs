//! `stats`: containers' CPU, memory and writable-layer usage.

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use petrel_cri::api::{
    ContainerFilter, ContainerState, ContainerStateValue, ContainerStats, ContainerStatsFilter,
    ListContainerStatsRequest, ListContainerStatsResponse,
};

use super::containers::list_containers;
use super::error::CtlError;
use super::output::{self, Format, Table};
use super::Ctl;

/// The interval between the two samples a CPU rate is computed from when
/// the runtime reports no `usage_nano_cores`.
const SAMPLE: Duration = Duration::from_secs(1);

/// Flags of `stats`.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Show all containers, not only running ones.
    #[arg(short = 'a', long)]
    all: bool,
    /// Filter by container id.
    #[arg(long)]
    id: Option<String>,
    /// Filter by pod id.
    #[arg(short = 'p', long)]
    pod: Option<String>,
    /// Filter by label, key=value (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Container id (like --id).
    #[arg(conflicts_with = "id")]
    container: Option<String>,
}

/// `stats`: one table of usage, newest sample.
pub async fn stats(ctl: &Ctl, args: StatsArgs) -> Result<ExitCode, CtlError> {
    let filter = ContainerStatsFilter {
        id: args.id.or(args.container).unwrap_or_default(),
        pod_sandbox_id: args.pod.unwrap_or_default(),
        label_selector: output::parse_labels(&args.labels)?,
    };
    let running = if args.all {
        None
    } else {
        Some(running_ids(ctl, &filter).await?)
    };
    let first = sample(ctl, &filter, running.as_ref()).await?;
    let (now, before) = if first.iter().all(has_rate) {
        (first, Vec::new())
    } else {
        tokio::time::sleep(SAMPLE).await;
        (sample(ctl, &filter, running.as_ref()).await?, first)
    };
    match ctl.format_or(Format::Table) {
        Format::Table => stats_table(&now, &before).print()?,
        f => output::print_structured(f, &ListContainerStatsResponse { stats: now })?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Ids of the running containers the filter selects.
async fn running_ids(
    ctl: &Ctl,
    filter: &ContainerStatsFilter,
) -> Result<HashSet<String>, CtlError> {
    let filter = ContainerFilter {
        id: filter.id.clone(),
        pod_sandbox_id: filter.pod_sandbox_id.clone(),
        state: Some(ContainerStateValue {
            state: ContainerState::ContainerRunning as i32,
        }),
        label_selector: filter.label_selector.clone(),
    };
    Ok(list_containers(ctl, filter)
        .await?
        .into_iter()
        .map(|c| c.id)
        .collect())
}

/// One ListContainerStats answer, limited to `only` if given, sorted by id.
async fn sample(
    ctl: &Ctl,
    filter: &ContainerStatsFilter,
    only: Option<&HashSet<String>>,
) -> Result<Vec<ContainerStats>, CtlError> {
    let mut rt = ctl.runtime().await?;
    let req = ListContainerStatsRequest {
        filter: Some(filter.clone()),
    };
    let mut stats = ctl
        .call("list container stats", rt.list_container_stats(req))
        .await?
        .stats;
    if let Some(only) = only {
        stats.retain(|s| only.contains(stats_id(s)));
    }
    stats.sort_by(|a, b| stats_id(a).cmp(stats_id(b)));
    Ok(stats)
}

fn stats_id(s: &ContainerStats) -> &str {
    s.attributes.as_ref().map_or("", |a| a.id.as_str())
}

/// Whether a sample carries a CPU rate of its own.
fn has_rate(s: &ContainerStats) -> bool {
    s.cpu.as_ref().is_some_and(|c| c.usage_nano_cores.is_some())
}

/// CPU use in percent of one core: the runtime's rate if it gave one, else
/// computed from the cumulative usage of two samples.
fn cpu_percent(now: &ContainerStats, before: Option<&ContainerStats>) -> Option<f64> {
    let cpu = now.cpu.as_ref()?;
    if let Some(rate) = &cpu.usage_nano_cores {
        return Some(rate.value as f64 / 1e7);
    }
    let prev = before?.cpu.as_ref()?;
    let used = cpu
        .usage_core_nano_seconds
        .as_ref()?
        .value
        .checked_sub(prev.usage_core_nano_seconds.as_ref()?.value)?;
    let elapsed = cpu.timestamp.checked_sub(prev.timestamp)?;
    (elapsed > 0).then(|| used as f64 / elapsed as f64 * 100.0)
}

fn stats_table(now: &[ContainerStats], before: &[ContainerStats]) -> Table {
    let before: HashMap<&str, &ContainerStats> = before.iter().map(|s| (stats_id(s), s)).collect();
    let mut t = Table::new(&["CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES"]);
    for s in now {
        let id = stats_id(s);
        let name = s
            .attributes
            .as_ref()
            .and_then(|a| a.metadata.as_ref())
            .map_or("", |m| m.name.as_str());
        let mem = s.memory.as_ref().and_then(|m| m.working_set_bytes.as_ref());
        let disk = s.writable_layer.as_ref();
        t.push(vec![
            output::short_id(id).to_string(),
            name.to_string(),
            cpu_percent(s, before.get(id).copied()).map_or("-".into(), |p| format!("{p:.2}")),
            mem.map_or("-".into(), |m| output::human_size(m.value)),
            disk.and_then(|d| d.used_bytes.as_ref())
                .map_or("-".into(), |b| output::human_size(b.value)),
            disk.and_then(|d| d.inodes_used.as_ref())
                .map_or("-".into(), |i| i.value.to_string()),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use petrel_cri::api::{
        ContainerAttributes, ContainerMetadata, CpuUsage, FilesystemUsage, MemoryUsage, UInt64Value,
    };

    fn stats(id: &str, ts: i64, total_ns: u64, rate: Option<u64>) -> ContainerStats {
        ContainerStats {
            attributes: Some(ContainerAttributes {
                id: id.into(),
                metadata: Some(ContainerMetadata {
                    name: "web".into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            cpu: Some(CpuUsage {
                timestamp: ts,
                usage_core_nano_seconds: Some(UInt64Value { value: total_ns }),
                usage_nano_cores: rate.map(|value| UInt64Value { value }),
                psi: None,
            }),
            memory: Some(MemoryUsage {
                working_set_bytes: Some(UInt64Value { value: 2_100_000 }),
                ..Default::default()
            }),
            writable_layer: Some(FilesystemUsage {
                used_bytes: Some(UInt64Value { value: 4096 }),
                inodes_used: Some(UInt64Value { value: 12 }),
                ..Default::default()
            }),
            swap: None,
            io: None,
        }
    }

    #[test]
    fn cpu_percent_should_prefer_the_runtime_rate() {
        let s = stats("a", 0, 0, Some(250_000_000));
        assert_eq!(cpu_percent(&s, None), Some(25.0));
    }

    #[test]
    fn cpu_percent_should_use_two_samples_without_a_rate() {
        let before = stats("a", 1_000_000_000, 100, None);
        let now = stats("a", 2_000_000_000, 500_000_100, None);
        assert_eq!(cpu_percent(&now, Some(&before)), Some(50.0));
        assert_eq!(cpu_percent(&now, None), None);
        assert_eq!(cpu_percent(&before, Some(&now)), None);
    }

    #[test]
    fn stats_table_should_show_usage_columns() {
        let before = [stats("0123456789abcdef", 0, 0, None)];
        let now = [stats("0123456789abcdef", 1_000_000_000, 10_000_000, None)];
        let text = stats_table(&now, &before).render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "CONTAINER      NAME  CPU %  MEM    DISK     INODES"
        );
        assert_eq!(lines[1], "0123456789abc  web   1.00   2.1MB  4.096kB  12");
    }
}
