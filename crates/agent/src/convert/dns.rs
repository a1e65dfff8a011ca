//! The pod's resolver config (its resolv.conf) as kubelet forms it: the
//! DNS policy picks the base (the cluster's DNS servers, the host's
//! resolver config, or nothing), `spec.dnsConfig` is merged in, and the
//! result is cut to the limits the API server validates against.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{PodDNSConfig, PodSpec};
use petrel_cri::api;

use super::ConvertError;

/// The resolver reads at most three nameservers; more would be ignored.
const MAX_DNS_SERVERS: usize = 3;
/// Search paths: the API server's expanded limits (ExpandedDNSConfig, GA
/// in Kubernetes 1.28): 32 paths, 2048 characters on the search line.
const MAX_DNS_SEARCHES: usize = 32;
const MAX_DNS_SEARCH_CHARS: usize = 2048;
/// A longer search path makes some resolvers (glibc 2.28) abort: dropped.
const MAX_DNS_SEARCH_PATH: usize = 253;
/// The options ClusterFirst pods get: names with fewer than five dots are
/// tried against the cluster's search paths first.
const CLUSTER_OPTIONS: &str = "ndots:5";

/// kubelet's DNS settings: `--cluster-dns`, `--cluster-domain` and
/// `--resolv-conf`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    /// The cluster's DNS servers (kubelet's `clusterDNS`). Empty:
    /// ClusterFirst pods fall back to Default, as in kubelet.
    pub cluster_dns: Vec<String>,
    /// The cluster's domain (kubelet's `clusterDomain`, e.g.
    /// `cluster.local`). Empty: ClusterFirst pods get no cluster search
    /// paths.
    pub cluster_domain: String,
    /// The host's resolver config, the base of Default pods and the source
    /// of ClusterFirst pods' extra search paths. Empty (kubelet's
    /// `--resolv-conf=""`): no host config; Default pods get the local
    /// resolver only.
    pub resolv_conf: PathBuf,
}

impl Default for DnsSettings {
    fn default() -> Self {
        Self {
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            // kubelet's default `--resolv-conf`.
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
        }
    }
}

/// The host's resolver config text: None when `resolv_conf` is empty (no
/// host config); an error naming the file when it cannot be read (kubelet
/// refuses the pod's sandbox then too).
pub(crate) fn read_host_resolv_conf(path: &Path) -> Result<Option<String>, ConvertError> {
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    std::fs::read_to_string(path)
        .map(Some)
        .map_err(|source| ConvertError::Io {
            op: "read resolver config",
            path: path.to_path_buf(),
            source,
        })
}

/// Servers, searches and options of a resolv.conf text, as kubelet reads
/// it: nameserver lines add up, the last search line wins (a trailing dot
/// dropped, so `a.` and `a` count once), the last options line wins.
pub(crate) fn parse_resolv_conf(text: &str) -> api::DnsConfig {
    let mut dns = api::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
            Some("search") => {
                dns.searches = words
                    .map(|s| s.strip_suffix('.').unwrap_or(s).to_string())
                    .collect();
            }
            Some("options") => dns.options = words.map(str::to_string).collect(),
            _ => {}
        }
    }
    dns
}

/// Where a pod's resolver config comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    /// The cluster's DNS servers and search paths.
    Cluster,
    /// The host's resolver config.
    Host,
    /// Nothing: only `spec.dnsConfig`.
    Empty,
}

/// The base of a pod's policy: ClusterFirst on the host's network is
/// Default, as in kubelet (the pod cannot reach a cluster DNS address
/// meant for pod networks); ClusterFirstWithHostNet is the way to ask.
fn base_of(policy: &str, host_network: bool) -> Result<Base, ConvertError> {
    Ok(match policy {
        "None" => Base::Empty,
        "ClusterFirstWithHostNet" => Base::Cluster,
        "ClusterFirst" if !host_network => Base::Cluster,
        "ClusterFirst" | "Default" => Base::Host,
        other => {
            return Err(ConvertError::invalid(
                "spec.dnsPolicy",
                format!("unknown policy {other:?}"),
            ))
        }
    })
}

/// The pod's DNS config, as kubelet's `GetPodDNS`: `host_resolv` is the
/// host's resolver config text (None: `--resolv-conf` is empty), `host_ip`
/// the node's IP. A cluster base without `--cluster-dns` falls back to the
/// host's, as in kubelet.
pub(crate) fn dns_config(
    spec: &PodSpec,
    namespace: &str,
    settings: &DnsSettings,
    host_resolv: Option<&str>,
    host_ip: &str,
) -> Result<api::DnsConfig, ConvertError> {
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let mut base = base_of(policy, spec.host_network == Some(true))?;
    if base == Base::Cluster && settings.cluster_dns.is_empty() {
        base = Base::Host;
    }
    let host = || match host_resolv {
        Some(text) => parse_resolv_conf(text),
        None => local_resolver(host_ip),
    };
    let mut dns = match base {
        Base::Empty => api::DnsConfig::default(),
        Base::Host => host(),
        Base::Cluster => {
            // The host's search paths follow the cluster's; its servers
            // and options do not apply (the cluster's DNS forwards).
            let host_searches = host_resolv
                .map(parse_resolv_conf)
                .unwrap_or_default()
                .searches;
            api::DnsConfig {
                servers: settings.cluster_dns.clone(),
                searches: cluster_searches(namespace, &settings.cluster_domain, host_searches),
                options: vec![CLUSTER_OPTIONS.to_string()],
            }
        }
    };
    match &spec.dns_config {
        Some(extra) => merge_dns(&mut dns, extra),
        None if base == Base::Empty => {
            return Err(ConvertError::invalid(
                "spec.dnsConfig",
                "required with dnsPolicy None",
            ))
        }
        None => {}
    }
    fit_limits(&mut dns);
    Ok(dns)
}

/// kubelet's config when `--resolv-conf` is empty: the local machine's
/// resolver (what a resolver does without nameservers), no search.
fn local_resolver(host_ip: &str) -> api::DnsConfig {
    let loopback = if host_ip.contains(':') {
        "::1"
    } else {
        "127.0.0.1"
    };
    api::DnsConfig {
        servers: vec![loopback.to_string()],
        searches: vec![".".to_string()],
        options: Vec::new(),
    }
}

/// `<ns>.svc.<domain> svc.<domain> <domain>`, then the host's, once each.
fn cluster_searches(namespace: &str, domain: &str, host: Vec<String>) -> Vec<String> {
    if domain.is_empty() {
        return host;
    }
    let mut out = vec![
        format!("{namespace}.svc.{domain}"),
        format!("svc.{domain}"),
        domain.to_string(),
    ];
    for s in host {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// spec.dnsConfig over the base: servers and searches appended without
/// duplicates, options overriding by name.
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

/// Cuts the config to the limits, as kubelet does: the first three
/// servers; the first 32 search paths, without any longer than 253
/// characters, then the last ones dropped until the line fits 2048
/// characters.
fn fit_limits(dns: &mut api::DnsConfig) {
    let before = (dns.servers.len(), dns.searches.clone());
    dns.servers.truncate(MAX_DNS_SERVERS);
    dns.searches.truncate(MAX_DNS_SEARCHES);
    dns.searches.retain(|s| s.len() <= MAX_DNS_SEARCH_PATH);
    let line = |s: &[String]| s.iter().map(String::len).sum::<usize>() + s.len().saturating_sub(1);
    while line(&dns.searches) > MAX_DNS_SEARCH_CHARS {
        dns.searches.pop();
    }
    if before.0 != dns.servers.len() || before.1 != dns.searches {
        tracing::warn!(servers = ?dns.servers, searches = ?dns.searches, "DNS config limits exceeded; some nameservers or search paths were omitted");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const RESOLV: &str = "# generated\nnameserver 10.0.0.2\nnameserver 10.0.0.3 ; second\nsearch corp.example example.\noptions ndots:2 edns0\n";

    fn spec(yaml: &str) -> PodSpec {
        serde_yaml::from_str(&format!("{yaml}containers: []\n")).unwrap()
    }

    fn cluster() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            ..Default::default()
        }
    }

    fn dns(yaml: &str, settings: &DnsSettings) -> api::DnsConfig {
        dns_config(&spec(yaml), "prod", settings, Some(RESOLV), "192.168.1.10").unwrap()
    }

    #[test]
    fn cluster_first_should_use_the_cluster_dns_and_search_paths() {
        for policy in ["", "dnsPolicy: ClusterFirst\n"] {
            let d = dns(policy, &cluster());
            assert_eq!(d.servers, vec!["10.96.0.10"], "{policy}");
            assert_eq!(
                d.searches,
                vec![
                    "prod.svc.cluster.local",
                    "svc.cluster.local",
                    "cluster.local",
                    "corp.example",
                    "example"
                ]
            );
            assert_eq!(
                d.options,
                vec!["ndots:5"],
                "the host's options do not apply"
            );
        }
    }

    #[test]
    fn cluster_first_without_a_domain_should_keep_the_hosts_search_paths() {
        let s = DnsSettings {
            cluster_domain: String::new(),
            ..cluster()
        };
        let d = dns("", &s);
        assert_eq!(d.servers, vec!["10.96.0.10"]);
        assert_eq!(d.searches, vec!["corp.example", "example"]);
    }

    #[test]
    fn cluster_first_should_not_repeat_a_search_path_the_host_has() {
        let d = dns_config(
            &spec(""),
            "prod",
            &cluster(),
            Some("search cluster.local corp\n"),
            "192.168.1.10",
        )
        .unwrap();
        assert_eq!(
            d.searches,
            vec![
                "prod.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp"
            ]
        );
    }

    #[test]
    fn cluster_first_on_the_host_network_should_be_default() {
        let d = dns("hostNetwork: true\ndnsPolicy: ClusterFirst\n", &cluster());
        assert_eq!(d.servers, vec!["10.0.0.2", "10.0.0.3"]);
        assert_eq!(d.searches, vec!["corp.example", "example"]);
        assert_eq!(d.options, vec!["ndots:2", "edns0"]);
    }

    #[test]
    fn cluster_first_with_host_net_should_use_the_cluster_dns() {
        let d = dns(
            "hostNetwork: true\ndnsPolicy: ClusterFirstWithHostNet\n",
            &cluster(),
        );
        assert_eq!(d.servers, vec!["10.96.0.10"]);
        assert_eq!(d.searches[0], "prod.svc.cluster.local");
        assert_eq!(d.options, vec!["ndots:5"]);
    }

    #[test]
    fn cluster_first_without_cluster_dns_should_fall_back_to_default() {
        for policy in ["", "dnsPolicy: ClusterFirstWithHostNet\n"] {
            let d = dns(policy, &DnsSettings::default());
            assert_eq!(d.servers, vec!["10.0.0.2", "10.0.0.3"], "{policy}");
            assert_eq!(d.searches, vec!["corp.example", "example"]);
            assert_eq!(d.options, vec!["ndots:2", "edns0"]);
        }
    }

    #[test]
    fn default_should_use_the_hosts_resolver_config() {
        let d = dns("dnsPolicy: Default\n", &cluster());
        assert_eq!(d.servers, vec!["10.0.0.2", "10.0.0.3"]);
        assert_eq!(d.searches, vec!["corp.example", "example"]);
        assert_eq!(d.options, vec!["ndots:2", "edns0"]);
    }

    #[test]
    fn default_without_a_resolver_config_should_use_the_local_resolver() {
        let s = spec("dnsPolicy: Default\n");
        let d = dns_config(&s, "prod", &cluster(), None, "192.168.1.10").unwrap();
        assert_eq!(d.servers, vec!["127.0.0.1"]);
        assert_eq!(d.searches, vec!["."]);
        let d = dns_config(&s, "prod", &cluster(), None, "fd00::1").unwrap();
        assert_eq!(d.servers, vec!["::1"]);
    }

    #[test]
    fn dns_config_should_merge_the_pods_dns_config() {
        let d = dns(
            "dnsPolicy: Default\ndnsConfig:\n  nameservers: [10.0.0.2, 1.1.1.1]\n  searches: [svc.local]\n  options: [{name: ndots, value: '5'}, {name: rotate}]\n",
            &cluster(),
        );
        assert_eq!(d.servers, vec!["10.0.0.2", "10.0.0.3", "1.1.1.1"]);
        assert_eq!(d.searches, vec!["corp.example", "example", "svc.local"]);
        assert_eq!(d.options, vec!["ndots:5", "edns0", "rotate"]);
        // Over ClusterFirst too: the pod's ndots overrides the cluster's.
        let d = dns(
            "dnsConfig:\n  nameservers: [1.1.1.1]\n  options: [{name: ndots, value: '2'}]\n",
            &cluster(),
        );
        assert_eq!(d.servers, vec!["10.96.0.10", "1.1.1.1"]);
        assert_eq!(d.options, vec!["ndots:2"]);
    }

    #[test]
    fn none_should_take_only_the_pods_dns_config() {
        let d = dns(
            "dnsPolicy: None\ndnsConfig:\n  nameservers: [9.9.9.9, 8.8.8.8, 1.1.1.1, 4.4.4.4]\n  searches: [a.example]\n",
            &cluster(),
        );
        assert_eq!(
            d.servers,
            vec!["9.9.9.9", "8.8.8.8", "1.1.1.1"],
            "at most 3"
        );
        assert_eq!(d.searches, vec!["a.example"]);
        assert!(d.options.is_empty());
        let err = dns_config(
            &spec("dnsPolicy: None\n"),
            "p",
            &cluster(),
            Some(RESOLV),
            "",
        )
        .unwrap_err();
        assert!(err.to_string().contains("spec.dnsConfig"), "{err}");
        let err = dns_config(
            &spec("dnsPolicy: Bogus\n"),
            "p",
            &cluster(),
            Some(RESOLV),
            "",
        )
        .unwrap_err();
        assert!(err.to_string().contains("spec.dnsPolicy"), "{err}");
    }

    #[test]
    fn search_paths_should_fit_kubelets_limits() {
        let many: Vec<String> = (0..40).map(|i| format!("s{i}.example")).collect();
        let yaml = format!(
            "dnsPolicy: None\ndnsConfig:\n  searches: [{}, {}]\n",
            "x".repeat(254),
            many.join(", ")
        );
        let d = dns(&yaml, &cluster());
        assert_eq!(d.searches.len(), 31, "the first 32, less the long one");
        assert_eq!(d.searches[0], "s0.example");
        // 2048 characters on the line: the last paths go.
        let long: Vec<String> = (0..20)
            .map(|i| format!("{i:02}{}", "y".repeat(198)))
            .collect();
        let yaml = format!(
            "dnsPolicy: None\ndnsConfig:\n  searches: [{}]\n",
            long.join(", ")
        );
        let d = dns(&yaml, &cluster());
        assert_eq!(d.searches.len(), 10, "10 × 200 + 9 spaces fit, 11 do not");
        assert_eq!(d.searches[9], long[9]);
    }

    #[test]
    fn parse_resolv_conf_should_read_as_kubelet() {
        let d = parse_resolv_conf("search a b.\nsearch c\noptions x\noptions y z\ndomain d\n");
        assert_eq!(d.searches, vec!["c"], "the last search line wins");
        assert_eq!(d.options, vec!["y", "z"], "the last options line wins");
        let d = parse_resolv_conf(RESOLV);
        assert_eq!(d.servers, vec!["10.0.0.2", "10.0.0.3"]);
        assert_eq!(d.searches, vec!["corp.example", "example"]);
    }

    #[test]
    fn read_host_resolv_conf_should_name_an_unreadable_file() {
        assert_eq!(read_host_resolv_conf(Path::new("")).unwrap(), None);
        let err = read_host_resolv_conf(Path::new("/nonexistent/petrel-resolv")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/petrel-resolv"),
            "{err}"
        );
    }
}
