//! The defaults the API server would fill in, so the agent, `/pods` and a
//! spec hash see the same pod whether or not the manifest spells them out.

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Pod, Probe};

/// Fills in the API server's defaults (and the node name) where unset.
pub fn apply(pod: &mut Pod, node: &str) {
    let meta = &mut pod.metadata;
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".into());
    }
    let spec = pod.spec.get_or_insert_with(Default::default);
    if spec.node_name.as_deref().is_none_or(str::is_empty) {
        spec.node_name = Some(node.to_string());
    }
    set_if_empty(&mut spec.restart_policy, "Always");
    set_if_empty(&mut spec.dns_policy, "ClusterFirst");
    set_if_empty(&mut spec.scheduler_name, "default-scheduler");
    spec.termination_grace_period_seconds.get_or_insert(30);
    for c in spec.containers.iter_mut() {
        container(c);
    }
    for c in spec.init_containers.iter_mut().flatten() {
        container(c);
    }
    // An image volume's pullPolicy defaults as a container image's does.
    for img in spec
        .volumes
        .iter_mut()
        .flatten()
        .filter_map(|v| v.image.as_mut())
    {
        if img.pull_policy.as_deref().is_none_or(str::is_empty) {
            if let Some(r) = img.reference.as_deref().filter(|r| !r.is_empty()) {
                img.pull_policy = Some(pull_policy_for(r).to_string());
            }
        }
    }
}

fn set_if_empty(field: &mut Option<String>, value: &str) {
    if field.as_deref().is_none_or(str::is_empty) {
        *field = Some(value.to_string());
    }
}

fn container(c: &mut Container) {
    if c.image_pull_policy.as_deref().is_none_or(str::is_empty) {
        if let Some(image) = c.image.as_deref().filter(|i| !i.is_empty()) {
            c.image_pull_policy = Some(pull_policy_for(image).to_string());
        }
    }
    set_if_empty(&mut c.termination_message_path, "/dev/termination-log");
    set_if_empty(&mut c.termination_message_policy, "File");
    for p in c.ports.iter_mut().flatten() {
        set_if_empty(&mut p.protocol, "TCP");
    }
    for p in [
        &mut c.liveness_probe,
        &mut c.readiness_probe,
        &mut c.startup_probe,
    ]
    .into_iter()
    .flatten()
    {
        probe(p);
    }
    if let Some(l) = c.lifecycle.as_mut() {
        for h in [&mut l.post_start, &mut l.pre_stop].into_iter().flatten() {
            if let Some(g) = h.http_get.as_mut() {
                http_get(g);
            }
        }
    }
    for e in c.env.iter_mut().flatten() {
        if let Some(f) = e.value_from.as_mut().and_then(|v| v.field_ref.as_mut()) {
            set_if_empty(&mut f.api_version, "v1");
        }
    }
}

fn probe(p: &mut Probe) {
    p.period_seconds.get_or_insert(10);
    p.timeout_seconds.get_or_insert(1);
    p.success_threshold.get_or_insert(1);
    p.failure_threshold.get_or_insert(3);
    if let Some(g) = p.http_get.as_mut() {
        http_get(g);
    }
}

fn http_get(g: &mut HTTPGetAction) {
    set_if_empty(&mut g.path, "/");
    set_if_empty(&mut g.scheme, "HTTP");
}

/// `Always` for `:latest` or an untagged image without digest, else
/// `IfNotPresent`, as the API server decides.
pub fn pull_policy_for(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    // A ':' after the last '/' starts the tag; one before it is a registry port.
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn apply_should_default_image_volume_pull_policies() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [], "volumes": [
                {"name": "a", "image": {"reference": "reg/x"}},
                {"name": "b", "image": {"reference": "reg/x:1"}},
                {"name": "c", "image": {"reference": "reg/x", "pullPolicy": "Never"}},
            ]}
        }))
        .unwrap();
        apply(&mut pod, "n");
        let policies: Vec<_> = pod
            .spec
            .unwrap()
            .volumes
            .unwrap()
            .into_iter()
            .map(|v| v.image.unwrap().pull_policy.unwrap())
            .collect();
        assert_eq!(policies, ["Always", "IfNotPresent", "Never"]);
    }

    #[test]
    fn pull_policy_should_follow_the_tag() {
        assert_eq!(pull_policy_for("busybox"), "Always");
        assert_eq!(pull_policy_for("busybox:latest"), "Always");
        assert_eq!(pull_policy_for("busybox:1.36"), "IfNotPresent");
        assert_eq!(pull_policy_for("reg:5000/busybox"), "Always");
        assert_eq!(pull_policy_for("reg:5000/busybox:1"), "IfNotPresent");
        assert_eq!(
            pull_policy_for("busybox@sha256:0123456789abcdef"),
            "IfNotPresent"
        );
    }
}
