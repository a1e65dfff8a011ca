//! The pod sandbox config: identity, hostname, logs, DNS, host ports,
//! cgroup parent and the pod-wide security settings.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{PodDNSConfig, PodSpec};
use petrel_cri::api;

use super::qos::{pod_cgroup_parent, qos_class};
use super::security::{is_privileged, namespace_options, pod_seccomp, supplemental_groups};
use super::{ConvertContext, ConvertError};
use crate::types::{
    DesiredPod, LABEL_MANAGED_BY, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

/// resolv.conf limits glibc honours; more would be silently ignored.
const MAX_DNS_SERVERS: usize = 3;
const MAX_DNS_SEARCHES: usize = 32;
/// The longest hostname the kernel accepts.
const MAX_HOSTNAME: usize = 63;

/// The labels that tie a sandbox or container to its pod and this node.
pub(crate) fn pod_labels(pod: &DesiredPod, ctx: &ConvertContext) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_POD_NAME.to_string(), pod.name.clone()),
        (LABEL_POD_NAMESPACE.to_string(), pod.namespace.clone()),
        (LABEL_POD_UID.to_string(), pod.uid.clone()),
        (LABEL_MANAGED_BY.to_string(), ctx.node_name.clone()),
    ])
}

/// The pod's spec, or an error naming it when the pod has none.
pub(crate) fn spec_of(pod: &DesiredPod) -> Result<&PodSpec, ConvertError> {
    pod.pod
        .spec
        .as_ref()
        .ok_or_else(|| ConvertError::invalid("spec", "missing"))
}

/// The CRI sandbox config of a pod.
pub fn sandbox_config(
    pod: &DesiredPod,
    attempt: u32,
    ctx: &ConvertContext,
) -> Result<api::PodSandboxConfig, ConvertError> {
    let spec = spec_of(pod)?;
    let host_network = spec.host_network == Some(true);
    let mut labels: HashMap<String, String> = pod
        .pod
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Ours last: a pod label cannot impersonate another pod or node.
    labels.extend(pod_labels(pod, ctx));
    let annotations = pod
        .pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let dns = dns_config(spec, &host_resolv)?;
    let run_as = |f: fn(&k8s_openapi::api::core::v1::PodSecurityContext) -> Option<i64>| {
        spec.security_context
            .as_ref()
            .and_then(f)
            .map(|value| api::Int64Value { value })
    };
    let sysctls = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_ref())
        .iter()
        .flat_map(|s| s.iter())
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    let privileged = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .any(is_privileged);
    Ok(api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            attempt,
        }),
        hostname: if host_network {
            String::new()
        } else {
            hostname(spec, &pod.name)
        },
        log_directory: ctx.log_dir.to_string_lossy().into_owned(),
        dns_config: Some(dns),
        port_mappings: port_mappings(spec)?,
        labels,
        annotations,
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: pod_cgroup_parent(&pod.uid, qos_class(spec), &ctx.cgroup_root),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec)),
                run_as_user: run_as(|sc| sc.run_as_user),
                run_as_group: run_as(|sc| sc.run_as_group),
                supplemental_groups: supplemental_groups(spec),
                privileged,
                seccomp: pod_seccomp(spec)?,
                ..Default::default()
            }),
            sysctls,
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// spec.hostname, else the pod's name, cut to what the kernel accepts.
fn hostname(spec: &PodSpec, name: &str) -> String {
    let h = spec
        .hostname
        .as_deref()
        .filter(|h| !h.is_empty())
        .unwrap_or(name);
    let mut end = h.len().min(MAX_HOSTNAME);
    while !h.is_char_boundary(end) {
        end -= 1;
    }
    h[..end].trim_end_matches(['-', '.']).to_string()
}

/// Host ports of the app containers' ports.
fn port_mappings(spec: &PodSpec) -> Result<Vec<api::PortMapping>, ConvertError> {
    let mut out = Vec::new();
    for c in &spec.containers {
        for p in c.ports.iter().flatten() {
            let Some(host_port) = p.host_port.filter(|hp| *hp > 0) else {
                continue;
            };
            let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => api::Protocol::Tcp,
                "UDP" => api::Protocol::Udp,
                "SCTP" => api::Protocol::Sctp,
                other => {
                    return Err(ConvertError::invalid(
                        format!(
                            "spec.containers[{}].ports[{}].protocol",
                            c.name, p.container_port
                        ),
                        format!("unknown protocol {other:?}"),
                    ))
                }
            };
            out.push(api::PortMapping {
                protocol: protocol as i32,
                container_port: p.container_port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// Servers, searches and options of a resolv.conf text.
fn parse_resolv_conf(text: &str) -> api::DnsConfig {
    let mut dns = api::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
            // The last search or domain line wins, as in the resolver.
            Some("search") | Some("domain") => {
                dns.searches = words.map(str::to_string).collect();
            }
            Some("options") => dns.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    dns
}

/// The pod's DNS config. Without cluster DNS, ClusterFirst (and
/// ClusterFirstWithHostNet) fall back to Default: the host's resolv.conf.
/// None starts empty. spec.dnsConfig is then merged in: servers and
/// searches appended without duplicates, options overriding by name.
pub(crate) fn dns_config(
    spec: &PodSpec,
    host_resolv: &str,
) -> Result<api::DnsConfig, ConvertError> {
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let mut dns = match policy {
        "Default" | "ClusterFirst" | "ClusterFirstWithHostNet" => parse_resolv_conf(host_resolv),
        "None" => api::DnsConfig::default(),
        other => {
            return Err(ConvertError::invalid(
                "spec.dnsPolicy",
                format!("unknown policy {other:?}"),
            ))
        }
    };
    if let Some(extra) = &spec.dns_config {
        merge_dns(&mut dns, extra);
    } else if policy == "None" {
        return Err(ConvertError::invalid(
            "spec.dnsConfig",
            "required with dnsPolicy None",
        ));
    }
    dns.servers.truncate(MAX_DNS_SERVERS);
    dns.searches.truncate(MAX_DNS_SEARCHES);
    Ok(dns)
}

fn merge_dns(dns: &mut api::DnsConfig, extra: &PodDNSConfig) {
    for s in extra.nameservers.iter().flatten() {
        if !dns.servers.contains(s) {
            dns.servers.push(s.clone());
        }
    }
    for s in extra.searches.iter().flatten() {
        if !dns.searches.contains(s) {
            dns.searches.push(s.clone());
        }
    }
    for o in extra.options.iter().flatten() {
        let Some(name) = o.name.as_deref().filter(|n| !n.is_empty()) else {
            continue;
        };
        let rendered = match o.value.as_deref() {
            Some(v) if !v.is_empty() => format!("{name}:{v}"),
            _ => name.to_string(),
        };
        let same = |existing: &String| existing.split(':').next() == Some(name);
        match dns.options.iter_mut().find(|e| same(e)) {
            Some(e) => *e = rendered,
            None => dns.options.push(rendered),
        }
    }
}
