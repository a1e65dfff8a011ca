//! `/metrics/resource`: kubelet's resource metrics (what metrics-server,
//! and so `kubectl top`, reads), in the Prometheus text format, from the
//! same statistics as `/stats/summary`: cumulative CPU seconds and working
//! set of the node, each pod and each container, each sample stamped with
//! the time it was observed (milliseconds).

use std::fmt::Write;

use crate::eviction::summary::{CpuStats, MemoryStats, Summary};

/// One metric family: name, help, type.
const FAMILIES: &[(&str, &str, &str)] = &[
    (
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        "counter",
    ),
    (
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
        "gauge",
    ),
    (
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        "counter",
    ),
    (
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
        "gauge",
    ),
    (
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
    ),
    (
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
        "gauge",
    ),
    (
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
        "gauge",
    ),
];

/// A label value as the text format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn millis(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> String {
    t.as_ref()
        .map(|t| format!(" {}", t.0.as_millisecond()))
        .unwrap_or_default()
}

/// The samples of one family, as (labels, value, time suffix).
type Samples = Vec<(String, String, String)>;

fn cpu(labels: String, c: &CpuStats, out: &mut Samples) {
    let secs = c.usage_core_nano_seconds as f64 / 1e9;
    out.push((labels, format!("{secs}"), millis(&c.time)));
}

fn memory(labels: String, m: &MemoryStats, out: &mut Samples) {
    out.push((labels, m.working_set_bytes.to_string(), millis(&m.time)));
}

/// The text of `/metrics/resource` for `summary` (None: no statistics yet,
/// reported as a scrape error, as kubelet does).
pub fn render(summary: Option<&Summary>) -> String {
    let mut by_family: Vec<Samples> = vec![Vec::new(); FAMILIES.len()];
    let mut error = "1";
    if let Some(s) = summary {
        error = "0";
        for p in &s.pods {
            let pod = format!(
                "namespace=\"{}\",pod=\"{}\"",
                escape(&p.pod_ref.namespace),
                escape(&p.pod_ref.name)
            );
            for c in &p.containers {
                let labels = format!("{{container=\"{}\",{pod}}}", escape(&c.name));
                cpu(labels.clone(), &c.cpu, &mut by_family[0]);
                memory(labels, &c.memory, &mut by_family[1]);
            }
            cpu(format!("{{{pod}}}"), &p.cpu, &mut by_family[4]);
            memory(format!("{{{pod}}}"), &p.memory, &mut by_family[5]);
        }
        if let Some(c) = &s.node.cpu {
            cpu(String::new(), c, &mut by_family[2]);
        }
        memory(String::new(), &s.node.memory, &mut by_family[3]);
    }
    by_family[6].push((String::new(), error.to_string(), String::new()));
    let mut text = String::new();
    for ((name, help, kind), samples) in FAMILIES.iter().zip(by_family) {
        let _ = writeln!(text, "# HELP {name} {help}");
        let _ = writeln!(text, "# TYPE {name} {kind}");
        for (labels, value, at) in samples {
            let _ = writeln!(text, "{name}{labels} {value}{at}");
        }
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::eviction::summary::{
        ContainerSummary, NodeSummary, PodRef, PodSummary, Rlimit, RuntimeSummary,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at() -> Option<Time> {
        Some(Time("2026-01-01T00:00:01Z".parse().unwrap()))
    }

    fn cpu(ns: u64) -> CpuStats {
        CpuStats {
            time: at(),
            usage_nano_cores: None,
            usage_core_nano_seconds: ns,
            psi: None,
        }
    }

    fn mem(ws: i64) -> MemoryStats {
        MemoryStats {
            time: at(),
            available_bytes: None,
            usage_bytes: ws,
            working_set_bytes: ws,
            rss_bytes: None,
            page_faults: None,
            major_page_faults: None,
            psi: None,
        }
    }

    #[test]
    fn the_text_should_carry_node_pod_and_container_figures_with_their_times() {
        let s = Summary {
            node: NodeSummary {
                node_name: "n".into(),
                system_containers: vec![],
                cpu: Some(cpu(2_500_000_000)),
                memory: mem(1000),
                io: None,
                fs: None,
                runtime: RuntimeSummary {
                    image_fs: None,
                    container_fs: None,
                },
                rlimit: Rlimit {
                    time: None,
                    maxpid: 0,
                    curproc: 0,
                },
            },
            pods: vec![PodSummary {
                pod_ref: PodRef {
                    name: "p\"1".into(),
                    namespace: "ns".into(),
                    uid: "u".into(),
                },
                containers: vec![ContainerSummary {
                    name: "c".into(),
                    cpu: cpu(500_000_000),
                    memory: mem(42),
                    io: None,
                    rootfs: None,
                    logs: None,
                }],
                cpu: cpu(600_000_000),
                memory: mem(50),
                io: None,
                volume: vec![],
                ephemeral_storage: None,
                process_stats: None,
            }],
        };
        let t = render(Some(&s));
        for line in [
            "container_cpu_usage_seconds_total{container=\"c\",namespace=\"ns\",pod=\"p\\\"1\"} 0.5 1767225601000",
            "container_memory_working_set_bytes{container=\"c\",namespace=\"ns\",pod=\"p\\\"1\"} 42 1767225601000",
            "pod_cpu_usage_seconds_total{namespace=\"ns\",pod=\"p\\\"1\"} 0.6 1767225601000",
            "node_cpu_usage_seconds_total 2.5 1767225601000",
            "node_memory_working_set_bytes 1000 1767225601000",
            "resource_scrape_error 0",
            "# TYPE node_cpu_usage_seconds_total counter",
        ] {
            assert!(t.lines().any(|l| l == line), "{line} missing from\n{t}");
        }
    }

    #[test]
    fn no_statistics_yet_should_be_a_scrape_error() {
        let t = render(None);
        assert!(t.lines().any(|l| l == "resource_scrape_error 1"), "{t}");
        assert!(!t
            .lines()
            .any(|l| l.starts_with("node_cpu_usage_seconds_total")));
    }
}
