//! The pod sandbox config: identity, hostname, logs, DNS, host ports,
//! cgroup parent and the pod-wide security settings.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::PodSpec;
use petrel_cri::api;

use super::dns::{dns_config, read_host_resolv_conf};
use super::hash::sandbox_hash;
use super::qos::qos_class;
use super::security::{is_privileged, namespace_options, seccomp, supplemental_groups};
use super::{ConvertContext, ConvertError};
use crate::types::{
    DesiredPod, ANNOTATION_SANDBOX_HASH, LABEL_MANAGED_BY, LABEL_POD_NAME, LABEL_POD_NAMESPACE,
    LABEL_POD_UID,
};

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
    let host_resolv = read_host_resolv_conf(&ctx.dns.resolv_conf)?;
    let dns = dns_config(
        spec,
        &pod.namespace,
        &ctx.dns,
        host_resolv.as_deref(),
        &ctx.host_ip,
    )?;
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
    let mut config = api::PodSandboxConfig {
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
            cgroup_parent: ctx.cgroups.pod_parent(&pod.uid, qos_class(spec)),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec, ctx)?),
                run_as_user: run_as(|sc| sc.run_as_user),
                run_as_group: run_as(|sc| sc.run_as_group),
                supplemental_groups: supplemental_groups(spec),
                privileged,
                seccomp: Some(seccomp(spec, None, ctx)?),
                ..Default::default()
            }),
            sysctls,
            ..Default::default()
        }),
        ..Default::default()
    };
    // An API pod's labels and annotations change while the pod stays the
    // same (`kubectl label pod`): kubelet does not recreate a sandbox for
    // them, so they do not count. A static pod's edited manifest is a new
    // pod to kubelet: everything counts.
    let hash = match pod.source {
        crate::types::PodOrigin::Api => {
            let mut identity = config.clone();
            identity.labels = pod_labels(pod, ctx);
            identity.annotations.clear();
            sandbox_hash(&identity, spec)
        }
        crate::types::PodOrigin::File(_) => sandbox_hash(&config, spec),
    };
    // Ours last, over any pod annotation of the same name.
    config
        .annotations
        .insert(ANNOTATION_SANDBOX_HASH.to_string(), hash);
    Ok(config)
}

/// spec.hostname, else the pod's name, cut to what the kernel accepts.
pub(crate) fn hostname(spec: &PodSpec, name: &str) -> String {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::{ctx, desired};

    const POD: &str = r#"
metadata:
  name: web
  namespace: prod
  labels: {app: web, "io.kubernetes.pod.name": spoofed, "petrel.io/node": other}
  annotations: {note: hi}
spec:
  hostname: www
  securityContext:
    runAsUser: 1000
    runAsGroup: 3000
    supplementalGroups: [4000]
    fsGroup: 2000
    sysctls: [{name: net.ipv4.ip_unprivileged_port_start, value: "0"}]
    seccompProfile: {type: RuntimeDefault}
  initContainers:
  - name: setup
    image: busybox
    securityContext: {privileged: true}
  containers:
  - name: app
    image: nginx
    resources: {requests: {cpu: 100m}}
    ports:
    - {containerPort: 80, hostPort: 8080}
    - {containerPort: 53, hostPort: 5353, protocol: UDP, hostIP: 127.0.0.1}
    - {containerPort: 9000}
"#;

    #[test]
    fn sandbox_config_should_carry_identity_labels_and_logs() {
        let pod = desired(POD);
        let cfg = sandbox_config(&pod, 2, &ctx()).unwrap();
        let md = cfg.metadata.unwrap();
        assert_eq!(
            (
                md.name.as_str(),
                md.namespace.as_str(),
                md.uid.as_str(),
                md.attempt
            ),
            ("web", "prod", "uid-web", 2)
        );
        assert_eq!(cfg.hostname, "www");
        assert_eq!(cfg.log_directory, "/var/lib/petrel/logs/ns_name_uid");
        assert_eq!(cfg.labels["app"], "web");
        assert_eq!(cfg.labels[LABEL_POD_NAME], "web", "ours override the pod's");
        assert_eq!(cfg.labels[LABEL_POD_NAMESPACE], "prod");
        assert_eq!(cfg.labels[LABEL_POD_UID], "uid-web");
        assert_eq!(cfg.labels[LABEL_MANAGED_BY], "node-1");
        assert_eq!(cfg.annotations["note"], "hi");
        assert!(cfg.dns_config.is_some());
    }

    fn hash_of(yaml: &str, attempt: u32) -> String {
        let cfg = sandbox_config(&desired(yaml), attempt, &ctx()).unwrap();
        cfg.annotations[ANNOTATION_SANDBOX_HASH].clone()
    }

    #[test]
    fn sandbox_hash_should_ignore_the_attempt_and_map_order() {
        let h = hash_of(POD, 0);
        assert_eq!(h.len(), 16);
        assert_eq!(h, hash_of(POD, 3), "a recreated sandbox has the same spec");
        // Maps come out of a HashMap in any order; many labels make a
        // different order between two builds all but certain.
        let many: String = (0..40).map(|i| format!("l{i}: v{i}, ")).collect();
        let labelled = POD.replace("labels: {", &format!("labels: {{{many}"));
        assert_eq!(hash_of(&labelled, 0), hash_of(&labelled, 0));
        let pod = desired(POD);
        let mut cfg = sandbox_config(&pod, 0, &ctx()).unwrap();
        cfg.annotations.remove(ANNOTATION_SANDBOX_HASH);
        let spec = pod.pod.spec.as_ref().unwrap();
        let mut other = cfg.clone();
        other.dns_config = Some(api::DnsConfig {
            servers: vec!["192.0.2.53".into()],
            ..Default::default()
        });
        assert_eq!(
            sandbox_hash(&cfg, spec),
            sandbox_hash(&other, spec),
            "the host's resolv.conf does not count"
        );
    }

    #[test]
    fn an_api_pod_s_labels_and_annotations_should_not_change_its_sandbox_hash() {
        let hash = |yaml: &str| {
            let mut pod = desired(yaml);
            pod.source = crate::types::PodOrigin::Api;
            sandbox_config(&pod, 0, &ctx()).unwrap().annotations[ANNOTATION_SANDBOX_HASH].clone()
        };
        let relabelled = POD
            .replace("labels: {", "labels: {tier: gold, ")
            .replace("annotations: {", "annotations: {seen: yes, ");
        assert_ne!(POD, relabelled);
        assert_eq!(hash(POD), hash(&relabelled));
        // A static pod's edited labels still count.
        assert_ne!(hash_of(POD, 0), hash_of(&relabelled, 0));
    }

    #[test]
    fn sandbox_hash_should_change_with_pod_level_fields() {
        let h = hash_of(POD, 0);
        for (what, yaml) in [
            ("label", POD.replace("app: web,", "app: web2,")),
            ("annotation", POD.replace("note: hi", "note: ho")),
            ("hostname", POD.replace("hostname: www", "hostname: w3")),
            ("host port", POD.replace("hostPort: 8080", "hostPort: 8081")),
            (
                "security",
                POD.replace("runAsUser: 1000", "runAsUser: 1001"),
            ),
            ("QoS", POD.replace("{requests: {cpu: 100m}}", "{}")),
            (
                "DNS policy",
                POD.replace(
                    "  hostname: www\n",
                    "  hostname: www\n  dnsPolicy: Default\n",
                ),
            ),
            (
                "host network",
                POD.replace(
                    "  hostname: www\n",
                    "  hostname: www\n  hostNetwork: true\n",
                ),
            ),
        ] {
            assert_ne!(yaml, POD, "{what}: the edit must apply");
            assert_ne!(hash_of(&yaml, 0), h, "{what}");
        }
        // A container's command is not the sandbox's business.
        let cmd = POD.replace("    image: nginx\n", "    image: nginx\n    command: [x]\n");
        assert_ne!(cmd, POD);
        assert_eq!(hash_of(&cmd, 0), h);
    }

    #[test]
    fn sandbox_config_should_map_host_ports() {
        let cfg = sandbox_config(&desired(POD), 0, &ctx()).unwrap();
        assert_eq!(
            cfg.port_mappings,
            vec![
                api::PortMapping {
                    protocol: api::Protocol::Tcp as i32,
                    container_port: 80,
                    host_port: 8080,
                    host_ip: String::new()
                },
                api::PortMapping {
                    protocol: api::Protocol::Udp as i32,
                    container_port: 53,
                    host_port: 5353,
                    host_ip: "127.0.0.1".into()
                },
            ]
        );
    }

    #[test]
    fn sandbox_config_should_set_linux_security_and_cgroup() {
        let cfg = sandbox_config(&desired(POD), 0, &ctx()).unwrap();
        let linux = cfg.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/petrel/kubepods/burstable/poduid-web");
        // With the systemd driver: the pod's slice unit, as kubelet.
        let mut sd = ctx();
        sd.cgroups =
            crate::qos_cgroups::CgroupLayout::new(crate::qos_cgroups::CgroupDriver::Systemd, "/")
                .unwrap();
        let parent = sandbox_config(&desired(POD), 0, &sd)
            .unwrap()
            .linux
            .unwrap()
            .cgroup_parent;
        assert_eq!(parent, "kubepods-burstable-poduid_web.slice");
        assert_eq!(linux.sysctls["net.ipv4.ip_unprivileged_port_start"], "0");
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user, Some(api::Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(api::Int64Value { value: 3000 }));
        assert_eq!(sc.supplemental_groups, vec![4000, 2000]);
        assert!(sc.privileged, "an init container is privileged");
        assert_eq!(
            sc.seccomp.unwrap().profile_type,
            api::security_profile::ProfileType::RuntimeDefault as i32
        );
        let ns = sc.namespace_options.unwrap();
        assert_eq!(ns.network, api::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, api::NamespaceMode::Container as i32);
        assert_eq!(ns.ipc, api::NamespaceMode::Pod as i32);
    }

    #[test]
    fn sandbox_config_should_use_host_namespaces_when_asked() {
        let pod = desired(
            "metadata: {name: h}\nspec:\n  hostNetwork: true\n  hostPID: true\n  hostIPC: true\n  containers: [{name: a, image: x}]\n",
        );
        let cfg = sandbox_config(&pod, 0, &ctx()).unwrap();
        assert_eq!(cfg.hostname, "", "the host's own hostname");
        let linux = cfg.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "/petrel/kubepods/besteffort/poduid-h");
        let sc = linux.security_context.unwrap();
        assert!(!sc.privileged);
        let ns = sc.namespace_options.unwrap();
        let node = api::NamespaceMode::Node as i32;
        assert_eq!((ns.network, ns.pid, ns.ipc), (node, node, node));

        let pod = desired("metadata: {name: s}\nspec:\n  shareProcessNamespace: true\n  containers: [{name: a, image: x}]\n");
        let ns = namespace_options(pod.pod.spec.as_ref().unwrap(), &ctx()).unwrap();
        assert_eq!(ns.pid, api::NamespaceMode::Pod as i32);
    }

    #[test]
    fn hostname_should_default_to_the_pod_name_and_fit() {
        let spec = PodSpec::default();
        assert_eq!(hostname(&spec, "web"), "web");
        let long = format!("{}-x", "a".repeat(62));
        assert_eq!(
            hostname(&spec, &long),
            "a".repeat(62),
            "cut to 63, no trailing dash"
        );
    }
}
