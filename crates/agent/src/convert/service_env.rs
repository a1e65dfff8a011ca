//! Service environment variables (kubelet's "service links",
//! `pkg/kubelet/envvars`): where each service of the pod's namespace is,
//! in the variables Docker links used, plus the API server's own
//! `kubernetes` service for every pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

/// The namespace and name of the API server's service, whose variables
/// every pod gets (in-cluster clients find the API server by them).
const MASTER_NAMESPACE: &str = "default";
const MASTER_SERVICE: &str = "kubernetes";

/// The service variables of a pod in `namespace`, sorted by name: those
/// of the `kubernetes` service of `default` always, and with
/// `enable_links` (`spec.enableServiceLinks`, true by default) those of
/// every service of the pod's namespace (a same-named one there wins over
/// `default`'s `kubernetes`). Services without a cluster IP (headless,
/// ExternalName) have none.
pub fn service_env<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    namespace: &str,
    enable_links: bool,
) -> Vec<(String, String)> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for s in services {
        if cluster_ip(s).is_none() {
            continue;
        }
        let Some(name) = s.metadata.name.as_deref() else {
            continue;
        };
        let ns = s.metadata.namespace.as_deref().unwrap_or("");
        if ns == namespace && enable_links {
            chosen.insert(name, s);
        } else if ns == MASTER_NAMESPACE && name == MASTER_SERVICE {
            chosen.entry(name).or_insert(s);
        }
    }
    let mut vars = BTreeMap::new();
    for (name, s) in chosen {
        add_service(&mut vars, name, s);
    }
    vars.into_iter().collect()
}

/// The service's cluster IP, unless it has none (`None`, empty).
fn cluster_ip(s: &Service) -> Option<&str> {
    s.spec
        .as_ref()
        .and_then(|sp| sp.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
}

/// A service or port name as a variable name: upper case, `-` as `_`.
fn var_name(name: &str) -> String {
    name.to_uppercase().replace('-', "_")
}

/// `ip:port`, with an IPv6 address in brackets.
fn host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

fn add_service(vars: &mut BTreeMap<String, String>, name: &str, s: &Service) {
    let Some(ip) = cluster_ip(s) else { return };
    let prefix = var_name(name);
    let ports = s
        .spec
        .as_ref()
        .and_then(|sp| sp.ports.as_deref())
        .unwrap_or(&[]);
    vars.insert(format!("{prefix}_SERVICE_HOST"), ip.to_string());
    let Some(first) = ports.first() else {
        // The API server refuses a cluster IP without ports; nothing more
        // to say of one anyway.
        return;
    };
    vars.insert(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
    for p in ports {
        if let Some(pn) = p.name.as_deref().filter(|n| !n.is_empty()) {
            vars.insert(
                format!("{prefix}_SERVICE_PORT_{}", var_name(pn)),
                p.port.to_string(),
            );
        }
    }
    // The Docker link variables; the first port also as `<NAME>_PORT`.
    for (i, p) in ports.iter().enumerate() {
        let proto = p
            .protocol
            .as_deref()
            .filter(|p| !p.is_empty())
            .unwrap_or("TCP");
        let url = format!("{}://{}", proto.to_lowercase(), host_port(ip, p.port));
        if i == 0 {
            vars.insert(format!("{prefix}_PORT"), url.clone());
        }
        let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
        vars.insert(format!("{pp}_PROTO"), proto.to_lowercase());
        vars.insert(format!("{pp}_PORT"), p.port.to_string());
        vars.insert(format!("{pp}_ADDR"), ip.to_string());
        vars.insert(pp, url);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn svc(yaml: &str) -> Service {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn services() -> Vec<Service> {
        vec![
            svc("metadata: {name: kubernetes, namespace: default}\nspec: {clusterIP: 10.96.0.1, ports: [{name: https, port: 443}]}\n"),
            svc("metadata: {name: web-front, namespace: prod}\nspec:\n  clusterIP: 10.96.0.20\n  ports: [{name: http, port: 80}, {name: dns-udp, port: 53, protocol: UDP}]\n"),
            svc("metadata: {name: headless, namespace: prod}\nspec: {clusterIP: None, ports: [{port: 80}]}\n"),
            svc("metadata: {name: ext, namespace: prod}\nspec: {type: ExternalName, externalName: example.com}\n"),
            svc("metadata: {name: other, namespace: dev}\nspec: {clusterIP: 10.96.0.30, ports: [{port: 8080}]}\n"),
        ]
    }

    fn as_map(v: Vec<(String, String)>) -> BTreeMap<String, String> {
        v.into_iter().collect()
    }

    #[test]
    fn service_env_should_describe_the_namespaces_services_and_the_api_server() {
        let all = services();
        let v = service_env(&all, "prod", true);
        let names: Vec<_> = v.iter().map(|(k, _)| k.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "sorted by name");
        let m = as_map(v);
        let expect = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("WEB_FRONT_SERVICE_HOST", "10.96.0.20"),
            ("WEB_FRONT_SERVICE_PORT", "80"),
            ("WEB_FRONT_SERVICE_PORT_HTTP", "80"),
            ("WEB_FRONT_SERVICE_PORT_DNS_UDP", "53"),
            ("WEB_FRONT_PORT", "tcp://10.96.0.20:80"),
            ("WEB_FRONT_PORT_80_TCP", "tcp://10.96.0.20:80"),
            ("WEB_FRONT_PORT_53_UDP", "udp://10.96.0.20:53"),
            ("WEB_FRONT_PORT_53_UDP_PROTO", "udp"),
            ("WEB_FRONT_PORT_53_UDP_PORT", "53"),
            ("WEB_FRONT_PORT_53_UDP_ADDR", "10.96.0.20"),
        ];
        for (k, v) in expect {
            assert_eq!(m.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert_eq!(m.len(), 8 + 13, "{m:#?}");
        assert!(!m
            .keys()
            .any(|k| k.starts_with("HEADLESS") || k.starts_with("EXT")));
        assert!(
            !m.keys().any(|k| k.starts_with("OTHER")),
            "another namespace's"
        );
    }

    #[test]
    fn service_env_without_links_should_keep_only_the_api_servers() {
        let all = services();
        let m = as_map(service_env(&all, "prod", false));
        assert_eq!(m.len(), 8);
        assert!(m.keys().all(|k| k.starts_with("KUBERNETES_")), "{m:?}");
        // In `default` itself, links off still give the API server's.
        let m = as_map(service_env(&all, "default", false));
        assert_eq!(m["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
    }

    #[test]
    fn service_env_should_let_the_pods_namespace_win_a_name() {
        let mut all = services();
        all.push(svc("metadata: {name: kubernetes, namespace: prod}\nspec: {clusterIP: 10.96.0.99, ports: [{port: 6443}]}\n"));
        for order in [all.clone(), all.into_iter().rev().collect()] {
            let m = as_map(service_env(&order, "prod", true));
            assert_eq!(m["KUBERNETES_SERVICE_HOST"], "10.96.0.99");
        }
    }

    #[test]
    fn container_env_should_put_its_own_first_and_expand_service_variables() {
        use crate::convert::container_plan;
        use crate::convert::test_support::{ctx, desired};
        let pod = desired(
            "metadata: {name: web, namespace: prod}\nspec:\n  containers:\n  - name: a\n    image: x\n\
             \x20   command: [echo, '$(WEB_FRONT_SERVICE_HOST)']\n\
             \x20   env: [{name: KUBERNETES_SERVICE_HOST, value: mine}, {name: URL, value: 'http://$(WEB_FRONT_SERVICE_HOST):$(WEB_FRONT_SERVICE_PORT)'}]\n",
        );
        let mut c = ctx();
        c.service_env = service_env(&services(), "prod", true);
        let spec = pod.pod.spec.clone().unwrap();
        let plan = container_plan(&pod, &spec.containers[0], false, 0, &c).unwrap();
        let env: Vec<(String, String)> = plan
            .config
            .envs
            .iter()
            .map(|kv| {
                (
                    kv.key.clone(),
                    String::from_utf8_lossy(&kv.value).into_owned(),
                )
            })
            .collect();
        assert_eq!(
            env[0],
            ("KUBERNETES_SERVICE_HOST".into(), "mine".into()),
            "explicit wins"
        );
        assert_eq!(env[1], ("URL".into(), "http://10.96.0.20:80".into()));
        assert_eq!(
            env.iter()
                .filter(|(k, _)| k == "KUBERNETES_SERVICE_HOST")
                .count(),
            1
        );
        assert_eq!(
            env.len(),
            2 + 21 - 1,
            "the services' after, less the one set"
        );
        assert_eq!(env[2].0, "KUBERNETES_PORT", "then the services', sorted");
        assert_eq!(plan.config.command, vec!["echo", "10.96.0.20"]);
        // Outside cluster mode (no services) nothing is added.
        let plan = container_plan(&pod, &spec.containers[0], false, 0, &ctx()).unwrap();
        assert_eq!(plan.config.envs.len(), 2);
    }

    #[test]
    fn service_env_should_bracket_ipv6_addresses() {
        let all = [svc("metadata: {name: v6, namespace: p}\nspec: {clusterIP: 'fd00::10', ports: [{port: 80}]}\n")];
        let m = as_map(service_env(&all, "p", true));
        assert_eq!(m["V6_PORT"], "tcp://[fd00::10]:80");
        assert_eq!(m["V6_PORT_80_TCP_ADDR"], "fd00::10");
    }
}
