//! Validation of a defaulted Pod, with messages that name the field the way
//! the API server does (`spec.containers[0].image: Required value`).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeSource, LifecycleHandler, Pod, Probe, SeccompProfile, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lowercase \
alphanumeric characters, '-' or '.', start and end with an alphanumeric character, \
and be at most 253 characters";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lowercase \
alphanumeric characters or '-', start and end with an alphanumeric character, \
and be at most 63 characters";

/// Volume sources the agent can provide to any pod.
const SUPPORTED_VOLUMES: &[&str] = &["emptyDir", "hostPath", "downwardAPI", "image"];
/// Volume sources the agent provides to API pods too: they read API
/// objects (a static pod has no API objects of its own: the API server
/// refuses its mirror pod if it references any).
const API_VOLUMES: &[&str] = &[
    "emptyDir",
    "hostPath",
    "downwardAPI",
    "image",
    "configMap",
    "secret",
    "projected",
];

/// Every problem found, in field order; empty when the pod is valid.
pub fn validate(pod: &Pod) -> Vec<String> {
    validate_with(pod, SUPPORTED_VOLUMES)
}

/// [`validate`] for a pod of the API server, whose configMap, secret and
/// projected volumes the agent provides.
pub fn validate_api(pod: &Pod) -> Vec<String> {
    validate_with(pod, API_VOLUMES)
}

fn validate_with(pod: &Pod, supported: &[&str]) -> Vec<String> {
    let mut errs = Vec::new();
    let meta = &pod.metadata;
    match meta.name.as_deref() {
        None | Some("") => errs.push("metadata.name: Required value".to_string()),
        Some(n) if !is_subdomain(n) => errs.push(invalid("metadata.name", n, SUBDOMAIN_MSG)),
        Some(_) => {}
    }
    if let Some(ns) = meta.namespace.as_deref() {
        if !is_label(ns) {
            errs.push(invalid("metadata.namespace", ns, LABEL_MSG));
        }
    }
    let Some(spec) = pod.spec.as_ref() else {
        errs.push("spec: Required value".to_string());
        return errs;
    };
    if let Some(p) = spec.restart_policy.as_deref() {
        check_enum(
            &mut errs,
            "spec.restartPolicy",
            p,
            &["Always", "OnFailure", "Never"],
        );
    }
    if let Some(g) = spec.termination_grace_period_seconds {
        if g < 0 {
            errs.push(invalid(
                "spec.terminationGracePeriodSeconds",
                &g.to_string(),
                "must be greater than or equal to 0",
            ));
        }
    }

    if let Some(p) = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref())
    {
        seccomp_profile(&mut errs, "spec.securityContext.seccompProfile", p);
    }
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let mut volume_names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        volume(&mut errs, i, v, &mut volume_names, supported);
    }

    if spec.containers.is_empty() {
        errs.push("spec.containers: Required value".to_string());
    }
    // Container names are unique across init and app containers: they key
    // statuses and runtime labels alike.
    let mut names = HashSet::new();
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (i, c) in init.iter().enumerate() {
        let path = format!("spec.initContainers[{i}]");
        container(&mut errs, &path, c, &mut names, &volume_names);
        init_container(&mut errs, &path, c);
    }
    for (i, c) in spec.containers.iter().enumerate() {
        let path = format!("spec.containers[{i}]");
        container(&mut errs, &path, c, &mut names, &volume_names);
        if c.restart_policy.is_some() {
            errs.push(format!(
                "{path}.restartPolicy: Forbidden: may not be set for non-init containers"
            ));
        }
    }
    errs
}

fn volume(
    errs: &mut Vec<String>,
    i: usize,
    v: &Volume,
    names: &mut HashSet<String>,
    supported: &[&str],
) {
    let path = format!("spec.volumes[{i}]");
    if v.name.is_empty() {
        errs.push(format!("{path}.name: Required value"));
    } else if !is_label(&v.name) {
        errs.push(invalid(&format!("{path}.name"), &v.name, LABEL_MSG));
    } else if !names.insert(v.name.clone()) {
        errs.push(format!("{path}.name: Duplicate value: {:?}", v.name));
    }
    // The source is whichever other field is set; going through JSON finds
    // it among the dozens of volume types without naming each.
    let kinds: Vec<String> = match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m
            .into_iter()
            .filter(|(k, v)| k != "name" && !v.is_null())
            .map(|(k, _)| k)
            .collect(),
        _ => Vec::new(),
    };
    match kinds.as_slice() {
        [] => errs.push(format!(
            "{path}: Required value: must specify a volume type"
        )),
        [kind] if !supported.contains(&kind.as_str()) => errs.push(format!(
            "{path}: Unsupported value: {kind:?}: supported: {}",
            supported.join(", ")
        )),
        [_] => {}
        _ => errs.push(format!(
            "{path}: Forbidden: may not specify more than 1 volume type"
        )),
    }
    if let Some(da) = v.downward_api.as_ref() {
        downward_api(errs, &format!("{path}.downwardAPI"), da);
    }
    if let Some(img) = v.image.as_ref() {
        // The API server's rules for an image volume (KEP-4639).
        if img.reference.as_deref().is_none_or(|r| r.trim().is_empty()) {
            errs.push(format!("{path}.image.reference: Required value"));
        }
        if let Some(p) = img.pull_policy.as_deref() {
            check_enum(
                errs,
                &format!("{path}.image.pullPolicy"),
                p,
                &["Always", "IfNotPresent", "Never"],
            );
        }
    }
    if let Some(hp) = v.host_path.as_ref() {
        if hp.path.is_empty() {
            errs.push(format!("{path}.hostPath.path: Required value"));
        } else if !hp.path.starts_with('/') {
            errs.push(invalid(
                &format!("{path}.hostPath.path"),
                &hp.path,
                "must be an absolute path",
            ));
        } else if has_backstep(&hp.path) {
            errs.push(invalid(
                &format!("{path}.hostPath.path"),
                &hp.path,
                "must not contain '..'",
            ));
        }
    }
}

/// A downwardAPI volume as the API server checks it: each item a relative
/// path (no `..`), one source, a metadata field path, a resource with its
/// container named; modes within 0777.
fn downward_api(errs: &mut Vec<String>, path: &str, da: &DownwardAPIVolumeSource) {
    let check_mode = |errs: &mut Vec<String>, field: &str, m: Option<i32>| {
        if let Some(m) = m.filter(|m| !(0..=0o777).contains(m)) {
            errs.push(invalid(
                field,
                &m.to_string(),
                "must be a number between 0 and 0777 (octal), both inclusive",
            ));
        }
    };
    check_mode(errs, &format!("{path}.defaultMode"), da.default_mode);
    for (i, item) in da.items.iter().flatten().enumerate() {
        let ip = format!("{path}.items[{i}]");
        if item.path.is_empty() {
            errs.push(format!("{ip}.path: Required value"));
        } else if item.path.starts_with('/') {
            errs.push(invalid(
                &format!("{ip}.path"),
                &item.path,
                "must be a relative path",
            ));
        } else if has_backstep(&item.path) {
            errs.push(invalid(
                &format!("{ip}.path"),
                &item.path,
                "must not contain '..'",
            ));
        } else if item.path.starts_with("..") {
            errs.push(invalid(
                &format!("{ip}.path"),
                &item.path,
                "must not start with '..'",
            ));
        }
        check_mode(errs, &format!("{ip}.mode"), item.mode);
        match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), None) => {
                let p = f.field_path.as_str();
                let keyed = ["metadata.labels['", "metadata.annotations['"]
                    .iter()
                    .any(|k| p.starts_with(k) && p.ends_with("']"));
                if !keyed && !crate::convert::DOWNWARD_API_FIELD_PATHS.contains(&p) {
                    errs.push(format!(
                        "{ip}.fieldRef.fieldPath: Unsupported value: {p:?}: supported: {}",
                        crate::convert::DOWNWARD_API_FIELD_PATHS.join(", ")
                    ));
                }
            }
            (None, Some(r)) => {
                if r.container_name.as_deref().unwrap_or("").is_empty() {
                    errs.push(format!(
                        "{ip}.resourceFieldRef.containerName: Required value"
                    ));
                }
            }
            (None, None) => errs.push(format!(
                "{ip}: Required value: one of fieldRef and resourceFieldRef is required"
            )),
            (Some(_), Some(_)) => errs.push(format!(
                "{ip}: Invalid value: fieldRef and resourceFieldRef can not be specified simultaneously"
            )),
        }
    }
}

fn container(
    errs: &mut Vec<String>,
    path: &str,
    c: &Container,
    names: &mut HashSet<String>,
    volumes: &HashSet<String>,
) {
    if c.name.is_empty() {
        errs.push(format!("{path}.name: Required value"));
    } else if !is_label(&c.name) {
        errs.push(invalid(&format!("{path}.name"), &c.name, LABEL_MSG));
    } else if !names.insert(c.name.clone()) {
        errs.push(format!("{path}.name: Duplicate value: {:?}", c.name));
    }
    if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
        errs.push(format!("{path}.image: Required value"));
    }
    if let Some(p) = c.image_pull_policy.as_deref() {
        check_enum(
            errs,
            &format!("{path}.imagePullPolicy"),
            p,
            &["Always", "IfNotPresent", "Never"],
        );
    }
    if let Some(p) = c
        .security_context
        .as_ref()
        .and_then(|sc| sc.seccomp_profile.as_ref())
    {
        seccomp_profile(errs, &format!("{path}.securityContext.seccompProfile"), p);
    }
    if let Some(r) = c.resources.as_ref() {
        resources(
            errs,
            &format!("{path}.resources"),
            r.requests.as_ref(),
            r.limits.as_ref(),
        );
    }
    for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
        let mp = format!("{path}.volumeMounts[{j}]");
        if m.name.is_empty() {
            errs.push(format!("{mp}.name: Required value"));
        } else if !volumes.contains(&m.name) {
            errs.push(format!("{mp}.name: Not found: {:?}", m.name));
        }
        if m.mount_path.is_empty() {
            errs.push(format!("{mp}.mountPath: Required value"));
        }
        let sub = m.sub_path.as_deref().filter(|s| !s.is_empty());
        let expr = m.sub_path_expr.as_deref().filter(|s| !s.is_empty());
        if let (Some(_), Some(e)) = (sub, expr) {
            errs.push(invalid(
                &format!("{mp}.subPathExpr"),
                e,
                "subPathExpr and subPath are mutually exclusive",
            ));
        }
        for (field, value) in [("subPath", sub), ("subPathExpr", expr)] {
            let Some(v) = value else { continue };
            if v.starts_with('/') {
                errs.push(invalid(
                    &format!("{mp}.{field}"),
                    v,
                    "must be a relative path",
                ));
            } else if has_backstep(v) {
                errs.push(invalid(
                    &format!("{mp}.{field}"),
                    v,
                    "must not contain '..'",
                ));
            }
        }
    }
    for (j, p) in c.ports.iter().flatten().enumerate() {
        let pp = format!("{path}.ports[{j}]");
        if !(1..=65535).contains(&p.container_port) {
            errs.push(invalid(
                &format!("{pp}.containerPort"),
                &p.container_port.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        if let Some(proto) = p.protocol.as_deref() {
            check_enum(
                errs,
                &format!("{pp}.protocol"),
                proto,
                &["TCP", "UDP", "SCTP"],
            );
        }
    }
    for (field, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
        ("startupProbe", &c.startup_probe),
    ] {
        if let Some(p) = probe {
            check_probe(errs, &format!("{path}.{field}"), p);
        }
    }
    if let Some(l) = c.lifecycle.as_ref() {
        for (field, h) in [("postStart", &l.post_start), ("preStop", &l.pre_stop)] {
            if let Some(h) = h {
                check_handler(errs, &format!("{path}.lifecycle.{field}"), h);
            }
        }
    }
}

/// What only init containers may or may not set: `restartPolicy: Always`
/// makes a sidecar, which alone may have probes and lifecycle hooks (it
/// runs beside the app containers; the others run to completion).
fn init_container(errs: &mut Vec<String>, path: &str, c: &Container) {
    match c.restart_policy.as_deref() {
        Some(p) => check_enum(errs, &format!("{path}.restartPolicy"), p, &["Always"]),
        None => {
            for (field, set) in [
                ("lifecycle", c.lifecycle.is_some()),
                ("livenessProbe", c.liveness_probe.is_some()),
                ("readinessProbe", c.readiness_probe.is_some()),
                ("startupProbe", c.startup_probe.is_some()),
            ] {
                if set {
                    errs.push(format!(
                        "{path}.{field}: Forbidden: may not be set for init containers without restartPolicy=Always"
                    ));
                }
            }
        }
    }
}

fn check_probe(errs: &mut Vec<String>, path: &str, p: &Probe) {
    let n = [
        p.exec.is_some(),
        p.http_get.is_some(),
        p.tcp_socket.is_some(),
        p.grpc.is_some(),
    ]
    .into_iter()
    .filter(|b| *b)
    .count();
    handler_count(errs, path, n);
    for (field, v) in [
        ("periodSeconds", p.period_seconds),
        ("timeoutSeconds", p.timeout_seconds),
        ("successThreshold", p.success_threshold),
        ("failureThreshold", p.failure_threshold),
    ] {
        if let Some(v) = v.filter(|v| *v < 1) {
            errs.push(invalid(
                &format!("{path}.{field}"),
                &v.to_string(),
                "must be greater than or equal to 1",
            ));
        }
    }
}

fn check_handler(errs: &mut Vec<String>, path: &str, h: &LifecycleHandler) {
    let n = [
        h.exec.is_some(),
        h.http_get.is_some(),
        h.tcp_socket.is_some(),
        h.sleep.is_some(),
    ]
    .into_iter()
    .filter(|b| *b)
    .count();
    handler_count(errs, path, n);
}

fn handler_count(errs: &mut Vec<String>, path: &str, n: usize) {
    match n {
        0 => errs.push(format!(
            "{path}: Required value: must specify a handler type"
        )),
        1 => {}
        _ => errs.push(format!(
            "{path}: Forbidden: may not specify more than 1 handler type"
        )),
    }
}

type Resources = BTreeMap<String, Quantity>;

fn resources(
    errs: &mut Vec<String>,
    path: &str,
    requests: Option<&Resources>,
    limits: Option<&Resources>,
) {
    let parse = |errs: &mut Vec<String>, which: &str, m: Option<&Resources>| {
        let mut out = BTreeMap::new();
        for (k, q) in m.into_iter().flatten() {
            match quantity::parse(&q.0) {
                Ok(v) => {
                    out.insert(k.clone(), v);
                }
                Err(e) => errs.push(invalid(
                    &format!("{path}.{which}[{k}]"),
                    &q.0,
                    &e.to_string(),
                )),
            }
        }
        out
    };
    let req = parse(errs, "requests", requests);
    let lim = parse(errs, "limits", limits);
    for (k, r) in &req {
        if let Some(l) = lim.get(k) {
            if r > l {
                let shown = |m: Option<&Resources>| {
                    m.and_then(|m| m.get(k))
                        .map(|q| q.0.clone())
                        .unwrap_or_default()
                };
                errs.push(invalid(
                    &format!("{path}.requests[{k}]"),
                    &shown(requests),
                    &format!(
                        "must be less than or equal to {k} limit of {}",
                        shown(limits)
                    ),
                ));
            }
        }
    }
}

/// A path with a `..` component (the API server splits on '/').
/// A seccomp profile as the API server checks it: a known type, and a
/// `localhostProfile` exactly with `Localhost`, relative to kubelet's
/// seccomp directory and never leaving it.
fn seccomp_profile(errs: &mut Vec<String>, path: &str, p: &SeccompProfile) {
    const TYPES: [&str; 3] = ["Localhost", "RuntimeDefault", "Unconfined"];
    if p.type_.is_empty() {
        errs.push(format!("{path}.type: Required value"));
        return;
    }
    if !TYPES.contains(&p.type_.as_str()) {
        check_enum(errs, &format!("{path}.type"), &p.type_, &TYPES);
        return;
    }
    let field = format!("{path}.localhostProfile");
    match (p.type_.as_str(), p.localhost_profile.as_deref()) {
        ("Localhost", None | Some("")) => errs.push(format!(
            "{field}: Required value: must be set when seccomp type is Localhost"
        )),
        ("Localhost", Some(f)) if f.starts_with('/') => {
            errs.push(invalid(&field, f, "must be a relative path"))
        }
        ("Localhost", Some(f)) if has_backstep(f) => {
            errs.push(invalid(&field, f, "must not contain '..'"))
        }
        ("Localhost", Some(_)) => {}
        (_, Some(f)) => errs.push(invalid(
            &field,
            f,
            "can only be set when seccomp type is Localhost",
        )),
        (_, None) => {}
    }
}

fn has_backstep(path: &str) -> bool {
    path.split('/').any(|c| c == "..")
}

fn check_enum(errs: &mut Vec<String>, path: &str, value: &str, allowed: &[&str]) {
    if !allowed.contains(&value) {
        errs.push(format!(
            "{path}: Unsupported value: {value:?}: supported: {}",
            allowed.join(", ")
        ));
    }
}

fn invalid(path: &str, value: &str, why: &str) -> String {
    format!("{path}: Invalid value: {value:?}: {why}")
}

/// RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_label(s: &str) -> bool {
    s.len() <= 63 && label_chars(s)
}

/// RFC 1123 subdomain: labels joined by '.', at most 253 characters.
pub fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(label_chars)
}

fn label_chars(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.iter().all(|c| alnum(c) || *c == b'-')
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Parses, defaults and validates one YAML pod.
    fn errors(yaml: &str) -> Vec<String> {
        let mut pod: Pod = serde_yaml::from_str(yaml).unwrap();
        crate::source::defaults::apply(&mut pod, "node");
        validate(&pod)
    }

    fn one(yaml: &str) -> String {
        let e = errors(yaml);
        assert_eq!(e.len(), 1, "{e:?}");
        e[0].clone()
    }

    const OK: &str = "
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers: [{name: app, image: busybox}]
";

    #[test]
    fn validate_should_accept_a_minimal_pod() {
        assert_eq!(errors(OK), Vec::<String>::new());
    }

    #[test]
    fn validate_should_name_the_bad_field_in_metadata() {
        let e = one("metadata: {name: Foo_}\nspec: {containers: [{name: a, image: i}]}");
        assert!(
            e.starts_with(
                r#"metadata.name: Invalid value: "Foo_": a lowercase RFC 1123 subdomain"#
            ),
            "{e}"
        );
        assert_eq!(
            one("metadata: {}\nspec: {containers: [{name: a, image: i}]}"),
            "metadata.name: Required value"
        );
        let e =
            one("metadata: {name: a, namespace: a.b}\nspec: {containers: [{name: a, image: i}]}");
        assert!(
            e.starts_with(
                r#"metadata.namespace: Invalid value: "a.b": a lowercase RFC 1123 label"#
            ),
            "{e}"
        );
        assert!(
            errors("metadata: {name: a.b-c}\nspec: {containers: [{name: a, image: i}]}").is_empty()
        );
    }

    #[test]
    fn validate_should_check_seccomp_profiles_as_the_api_server_does() {
        let cases = [
            ("securityContext: {seccompProfile: {type: Localhost}}", "spec.securityContext.seccompProfile.localhostProfile: Required value"),
            ("securityContext: {seccompProfile: {type: Localhost, localhostProfile: /etc/p.json}}", "must be a relative path"),
            ("securityContext: {seccompProfile: {type: Localhost, localhostProfile: a/../../p.json}}", "must not contain '..'"),
            ("securityContext: {seccompProfile: {type: RuntimeDefault, localhostProfile: p.json}}", "can only be set when seccomp type is Localhost"),
            ("securityContext: {seccompProfile: {type: Strict}}", "spec.securityContext.seccompProfile.type: Unsupported value"),
            ("containers: [{name: a, image: x, securityContext: {seccompProfile: {type: Localhost}}}]", "spec.containers[0].securityContext.seccompProfile.localhostProfile: Required value"),
        ];
        for (spec, want) in cases {
            let text = if spec.starts_with("containers") {
                format!("metadata: {{name: p}}\nspec: {{{spec}}}\n")
            } else {
                format!("metadata: {{name: p}}\nspec: {{{spec}, containers: [{{name: a, image: x}}]}}\n")
            };
            let pod: Pod = serde_yaml::from_str(&text).unwrap();
            let errs = validate(&pod);
            assert!(errs.iter().any(|e| e.contains(want)), "{spec}: {errs:?}");
        }
        let ok: Pod = serde_yaml::from_str(
            "metadata: {name: p}\nspec: {securityContext: {seccompProfile: {type: Localhost, localhostProfile: profiles/p.json}}, containers: [{name: a, image: x, securityContext: {seccompProfile: {type: Unconfined}}}]}\n",
        )
        .unwrap();
        assert_eq!(validate(&ok), Vec::<String>::new());
    }

    #[test]
    fn validate_should_check_containers() {
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: []}"),
            "spec.containers: Required value"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: a}]}"),
            "spec.containers[0].image: Required value"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: a, image: ' '}]}"),
            "spec.containers[0].image: Required value"
        );
        assert!(
            one("metadata: {name: a}\nspec: {containers: [{name: A, image: i}]}").starts_with(
                r#"spec.containers[0].name: Invalid value: "A": a lowercase RFC 1123 label"#
            )
        );
        // Unique across init and app containers.
        assert_eq!(
            one("metadata: {name: a}\nspec: {initContainers: [{name: x, image: i}], containers: [{name: y, image: i}, {name: x, image: i}]}"),
            r#"spec.containers[1].name: Duplicate value: "x""#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {initContainers: [{name: x, image: i, imagePullPolicy: Sometimes}], containers: [{name: y, image: i}]}"),
            r#"spec.initContainers[0].imagePullPolicy: Unsupported value: "Sometimes": supported: Always, IfNotPresent, Never"#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: y, image: i, ports: [{containerPort: 0}]}]}"),
            r#"spec.containers[0].ports[0].containerPort: Invalid value: "0": must be between 1 and 65535, inclusive"#
        );
    }

    #[test]
    fn validate_should_check_image_volumes() {
        let pod = |image: &str| {
            format!("metadata: {{name: a}}\nspec: {{volumes: [{{name: v, image: {image}}}], containers: [{{name: a, image: i, volumeMounts: [{{name: v, mountPath: /v}}]}}]}}")
        };
        assert!(errors(&pod("{reference: 'reg/x:1', pullPolicy: Never}")).is_empty());
        assert_eq!(
            one(&pod("{pullPolicy: Always}")),
            "spec.volumes[0].image.reference: Required value"
        );
        assert_eq!(
            one(&pod("{reference: x, pullPolicy: Sometimes}")),
            r#"spec.volumes[0].image.pullPolicy: Unsupported value: "Sometimes": supported: Always, IfNotPresent, Never"#
        );
    }

    #[test]
    fn validate_should_check_downward_api_volumes() {
        let pod = |items: &str| {
            format!("metadata: {{name: a}}\nspec: {{volumes: [{{name: v, downwardAPI: {{items: [{items}]}}}}], containers: [{{name: a, image: i}}]}}")
        };
        assert!(errors(&pod("{path: l, fieldRef: {fieldPath: metadata.labels}}, {path: k, fieldRef: {fieldPath: \"metadata.annotations['x']\"}}, {path: c, resourceFieldRef: {containerName: a, resource: limits.cpu}}")).is_empty());
        assert_eq!(
            one(&pod("{path: x, fieldRef: {fieldPath: spec.nodeName}}")),
            r#"spec.volumes[0].downwardAPI.items[0].fieldRef.fieldPath: Unsupported value: "spec.nodeName": supported: metadata.annotations, metadata.labels, metadata.name, metadata.namespace, metadata.uid"#
        );
        assert_eq!(
            one(&pod("{path: ../x, fieldRef: {fieldPath: metadata.name}}")),
            r#"spec.volumes[0].downwardAPI.items[0].path: Invalid value: "../x": must not contain '..'"#
        );
        assert_eq!(
            one(&pod("{path: ..x, fieldRef: {fieldPath: metadata.name}}")),
            r#"spec.volumes[0].downwardAPI.items[0].path: Invalid value: "..x": must not start with '..'"#
        );
        assert_eq!(
            one(&pod("{path: x, resourceFieldRef: {resource: limits.cpu}}")),
            "spec.volumes[0].downwardAPI.items[0].resourceFieldRef.containerName: Required value"
        );
        assert_eq!(
            one(&pod(
                "{path: x, mode: 512, fieldRef: {fieldPath: metadata.name}}"
            )),
            r#"spec.volumes[0].downwardAPI.items[0].mode: Invalid value: "512": must be a number between 0 and 0777 (octal), both inclusive"#
        );
    }

    #[test]
    fn validate_should_accept_sidecars_only_among_init_containers() {
        assert!(errors("metadata: {name: a}\nspec: {initContainers: [{name: s, image: i, restartPolicy: Always, readinessProbe: {exec: {command: [x]}}}], containers: [{name: a, image: i}]}").is_empty());
        assert_eq!(
            one("metadata: {name: a}\nspec: {initContainers: [{name: s, image: i, restartPolicy: Never}], containers: [{name: a, image: i}]}"),
            r#"spec.initContainers[0].restartPolicy: Unsupported value: "Never": supported: Always"#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {initContainers: [{name: s, image: i, livenessProbe: {exec: {command: [x]}}}], containers: [{name: a, image: i}]}"),
            "spec.initContainers[0].livenessProbe: Forbidden: may not be set for init containers without restartPolicy=Always"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: a, image: i, restartPolicy: Always}]}"),
            "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers"
        );
    }

    #[test]
    fn validate_should_check_restart_policy_and_grace() {
        assert_eq!(
            one("metadata: {name: a}\nspec: {restartPolicy: Sometimes, containers: [{name: a, image: i}]}"),
            r#"spec.restartPolicy: Unsupported value: "Sometimes": supported: Always, OnFailure, Never"#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {terminationGracePeriodSeconds: -1, containers: [{name: a, image: i}]}"),
            r#"spec.terminationGracePeriodSeconds: Invalid value: "-1": must be greater than or equal to 0"#
        );
    }

    #[test]
    fn validate_should_check_resources() {
        let e = one("metadata: {name: a}\nspec: {containers: [{name: a, image: i, resources: {limits: {cpu: 1x}}}]}");
        assert!(
            e.starts_with(
                r#"spec.containers[0].resources.limits[cpu]: Invalid value: "1x": invalid quantity"#
            ),
            "{e}"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: a, image: i, resources: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}}]}"),
            r#"spec.containers[0].resources.requests[memory]: Invalid value: "2Gi": must be less than or equal to memory limit of 1Gi"#
        );
        assert!(errors("metadata: {name: a}\nspec: {containers: [{name: a, image: i, resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {cpu: '1', memory: 1Gi}}}]}").is_empty());
    }

    #[test]
    fn validate_should_check_volumes_and_mounts() {
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, emptyDir: {}}, {name: c, configMap: {name: x}}], containers: [{name: a, image: i}]}"),
            r#"spec.volumes[1]: Unsupported value: "configMap": supported: emptyDir, hostPath, downwardAPI, image"#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, emptyDir: {}}, {name: d, emptyDir: {}}], containers: [{name: a, image: i}]}"),
            r#"spec.volumes[1].name: Duplicate value: "d""#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, hostPath: {path: data}}], containers: [{name: a, image: i}]}"),
            r#"spec.volumes[0].hostPath.path: Invalid value: "data": must be an absolute path"#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d}], containers: [{name: a, image: i}]}"),
            "spec.volumes[0]: Required value: must specify a volume type"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, emptyDir: {}, hostPath: {path: /x}}], containers: [{name: a, image: i}]}"),
            "spec.volumes[0]: Forbidden: may not specify more than 1 volume type"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, emptyDir: {}}], containers: [{name: a, image: i, volumeMounts: [{name: d, mountPath: /d}, {name: e, mountPath: /e}]}]}"),
            r#"spec.containers[0].volumeMounts[1].name: Not found: "e""#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, hostPath: {path: /var/lib/../../etc}}], containers: [{name: a, image: i}]}"),
            r#"spec.volumes[0].hostPath.path: Invalid value: "/var/lib/../../etc": must not contain '..'"#
        );
        // '..' as part of a name is fine.
        assert_eq!(
            errors("metadata: {name: a}\nspec: {volumes: [{name: d, hostPath: {path: /srv/..data/x..}}], containers: [{name: a, image: i}]}"),
            Vec::<String>::new()
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, emptyDir: {}}], containers: [{name: a, image: i, volumeMounts: [{name: d, mountPath: /d, subPath: a/../..}]}]}"),
            r#"spec.containers[0].volumeMounts[0].subPath: Invalid value: "a/../..": must not contain '..'"#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, emptyDir: {}}], containers: [{name: a, image: i, volumeMounts: [{name: d, mountPath: /d, subPathExpr: /etc}]}]}"),
            r#"spec.containers[0].volumeMounts[0].subPathExpr: Invalid value: "/etc": must be a relative path"#
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {volumes: [{name: d, emptyDir: {}}], containers: [{name: a, image: i, volumeMounts: [{name: d, mountPath: /d, subPath: x, subPathExpr: y}]}]}"),
            r#"spec.containers[0].volumeMounts[0].subPathExpr: Invalid value: "y": subPathExpr and subPath are mutually exclusive"#
        );
    }

    #[test]
    fn validate_should_require_exactly_one_handler() {
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: a, image: i, livenessProbe: {periodSeconds: 5}}]}"),
            "spec.containers[0].livenessProbe: Required value: must specify a handler type"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: a, image: i, readinessProbe: {exec: {command: [x]}, tcpSocket: {port: 80}}}]}"),
            "spec.containers[0].readinessProbe: Forbidden: may not specify more than 1 handler type"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: a, image: i, lifecycle: {preStop: {}}}]}"),
            "spec.containers[0].lifecycle.preStop: Required value: must specify a handler type"
        );
        assert_eq!(
            one("metadata: {name: a}\nspec: {containers: [{name: a, image: i, startupProbe: {exec: {command: [x]}, failureThreshold: 0}}]}"),
            r#"spec.containers[0].startupProbe.failureThreshold: Invalid value: "0": must be greater than or equal to 1"#
        );
        assert!(errors("metadata: {name: a}\nspec: {containers: [{name: a, image: i, lifecycle: {postStart: {exec: {command: [x]}}}, livenessProbe: {grpc: {port: 1}}}]}").is_empty());
    }

    #[test]
    fn dns_names_should_follow_rfc_1123() {
        assert!(is_label("a-1"));
        assert!(!is_label("-a"));
        assert!(!is_label("a-"));
        assert!(!is_label(""));
        assert!(!is_label(&"a".repeat(64)));
        assert!(is_subdomain("a.b.c"));
        assert!(!is_subdomain("a..b"));
        assert!(!is_subdomain(&"a".repeat(254)));
    }
}
