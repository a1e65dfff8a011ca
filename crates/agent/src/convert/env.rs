//! Container environment: envFrom (ConfigMaps and Secrets, cluster mode),
//! literal values, fieldRefs, resourceFieldRefs, configMapKeyRef and
//! secretKeyRef, and `$(VAR)` expansion in values, command and args.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{
    Container, EnvFromSource, EnvVar, ObjectFieldSelector, ResourceFieldSelector,
};

use super::api_volumes::{config_map_data, found, secret_data, Lookup, ObjectView};

use super::qos::{effective_request, limit};
use super::resources::node_memory_bytes;
use super::{ConvertContext, ConvertError};
use crate::quantity;
use crate::types::DesiredPod;

/// Expands `$(NAME)` references from `lookup`, as Kubernetes does: `$$`
/// is an escaped `$`, and a reference to an unknown name (or one without a
/// closing parenthesis) stays as written.
pub(crate) fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('(') {
            match tail.find(')') {
                Some(end) => {
                    let name = &tail[..end];
                    match lookup(name) {
                        Some(value) => out.push_str(&value),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &tail[end + 1..];
                }
                None => {
                    out.push_str(&rest[pos..]);
                    rest = "";
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The field path of a container in the pod spec, for error messages.
pub(crate) fn container_field(container: &Container, init: bool) -> String {
    let list = if init { "initContainers" } else { "containers" };
    format!("spec.{list}[{}]", container.name)
}

/// The container's environment in declaration order (a repeated name keeps
/// its first position and its last value), then the pod's service
/// variables (`ctx.service_env`) it does not set itself, as kubelet adds
/// them. Each value may refer to the variables declared before it and to
/// the service variables.
pub(crate) fn environment(
    pod: &DesiredPod,
    container: &Container,
    init: bool,
    ctx: &ConvertContext,
) -> Result<Vec<(String, String)>, ConvertError> {
    let cfield = container_field(container, init);
    let mut order: Vec<String> = Vec::new();
    let mut values: HashMap<String, String> = HashMap::new();
    // envFrom first, in order; env after it wins, as in kubelet.
    for (i, from) in container.env_from.iter().flatten().enumerate() {
        let field = format!("{cfield}.envFrom[{i}]");
        for (k, v) in env_from(pod, from, &field, ctx)? {
            if values.insert(k.clone(), v).is_none() {
                order.push(k);
            }
        }
    }
    for var in container.env.iter().flatten() {
        let field = format!("{cfield}.env[{}]", var.name);
        // An optional reference that is missing leaves the variable out.
        let Some(value) = env_value(pod, container, var, &field, ctx, &values)? else {
            continue;
        };
        if values.insert(var.name.clone(), value).is_none() {
            order.push(var.name.clone());
        }
    }
    let services: Vec<_> = ctx
        .service_env
        .iter()
        .filter(|(k, _)| !values.contains_key(k))
        .cloned()
        .collect();
    Ok(order
        .into_iter()
        .map(|k| {
            let v = values.remove(&k).unwrap_or_default();
            (k, v)
        })
        .chain(services)
        .collect())
}

/// One variable's value.
fn env_value(
    pod: &DesiredPod,
    container: &Container,
    var: &EnvVar,
    field: &str,
    ctx: &ConvertContext,
    earlier: &HashMap<String, String>,
) -> Result<Option<String>, ConvertError> {
    let Some(from) = &var.value_from else {
        let raw = var.value.as_deref().unwrap_or("");
        // kubelet's mapping: declared variables first, then services'.
        return Ok(Some(expand(raw, &|n| {
            earlier.get(n).cloned().or_else(|| {
                ctx.service_env
                    .iter()
                    .find(|(k, _)| k == n)
                    .map(|(_, v)| v.clone())
            })
        })));
    };
    if let Some(f) = &from.field_ref {
        return field_ref(pod, f, &format!("{field}.valueFrom.fieldRef"), ctx).map(Some);
    }
    if let Some(r) = &from.resource_field_ref {
        return resource_field_ref(
            pod,
            container,
            r,
            &format!("{field}.valueFrom.resourceFieldRef"),
        )
        .map(Some);
    }
    if let Some(r) = &from.config_map_key_ref {
        let view = objects(ctx, &format!("{field}.valueFrom.configMapKeyRef"))?;
        return key_value(
            view.config_map(&pod.namespace, &r.name),
            config_map_data,
            ("configmap", "ConfigMap"),
            &pod.namespace,
            &r.name,
            &r.key,
            r.optional.unwrap_or(false),
        );
    }
    if let Some(r) = &from.secret_key_ref {
        let view = objects(ctx, &format!("{field}.valueFrom.secretKeyRef"))?;
        return key_value(
            view.secret(&pod.namespace, &r.name),
            secret_data,
            ("secret", "Secret"),
            &pod.namespace,
            &r.name,
            &r.key,
            r.optional.unwrap_or(false),
        );
    }
    if from.file_key_ref.is_some() {
        return Err(ConvertError::unsupported(
            format!("{field}.valueFrom.fileKeyRef"),
            "fileKeyRef (an alpha feature)",
        ));
    }
    Err(ConvertError::invalid(
        format!("{field}.valueFrom"),
        "no source set",
    ))
}

/// The API objects, or the error of a node without an API server.
fn objects<'a>(ctx: &'a ConvertContext, field: &str) -> Result<&'a dyn ObjectView, ConvertError> {
    ctx.objects.as_ref().map(|o| o.0.as_ref()).ok_or_else(|| {
        ConvertError::unsupported(field, "configMap and secret sources need an API server")
    })
}

/// The value of key `key` of object `name` (a `kind` as kubelet names it
/// in its errors): a missing object or key fails the container's
/// configuration unless `optional`, when the variable is left out
/// (`Ok(None)`).
fn key_value<T>(
    lookup: Lookup<T>,
    data: impl Fn(&T) -> BTreeMap<String, Vec<u8>>,
    kind: (&str, &str),
    namespace: &str,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, ConvertError> {
    let Some(obj) = found(lookup, kind.0, name, optional)? else {
        return Ok(None);
    };
    match data(&obj).remove(key) {
        Some(v) => Ok(Some(String::from_utf8_lossy(&v).into_owned())),
        None if optional => Ok(None),
        None => Err(ConvertError::Missing(format!(
            "couldn't find key {key} in {} {namespace}/{name}",
            kind.1
        ))),
    }
}

/// The variables of one envFrom source: every key of the ConfigMap or
/// Secret with the prefix; keys that cannot be variable names are left
/// out, as kubelet leaves them (with an event there, a log line here).
fn env_from(
    pod: &DesiredPod,
    from: &EnvFromSource,
    field: &str,
    ctx: &ConvertContext,
) -> Result<Vec<(String, String)>, ConvertError> {
    let prefix = from.prefix.as_deref().unwrap_or("");
    let data = if let Some(r) = &from.config_map_ref {
        let view = objects(ctx, &format!("{field}.configMapRef"))?;
        let optional = r.optional.unwrap_or(false);
        let cm = found(
            view.config_map(&pod.namespace, &r.name),
            "configmap",
            &r.name,
            optional,
        )?;
        cm.map(|c| config_map_data(&c))
    } else if let Some(r) = &from.secret_ref {
        let view = objects(ctx, &format!("{field}.secretRef"))?;
        let optional = r.optional.unwrap_or(false);
        let s = found(
            view.secret(&pod.namespace, &r.name),
            "secret",
            &r.name,
            optional,
        )?;
        s.map(|s| secret_data(&s))
    } else {
        None
    };
    let Some(data) = data else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (k, v) in data {
        let name = format!("{prefix}{k}");
        if !is_env_name(&name) {
            tracing::warn!(pod = %pod.name, field, key = %k, "key is not a valid environment variable name; left out");
            continue;
        }
        out.push((name, String::from_utf8_lossy(&v).into_owned()));
    }
    Ok(out)
}

/// An environment variable name as the API server accepts it now (any
/// printable ASCII but `=`, not empty).
fn is_env_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'=')
}

/// The value of a downward-API field path.
fn field_ref(
    pod: &DesiredPod,
    selector: &ObjectFieldSelector,
    field: &str,
    ctx: &ConvertContext,
) -> Result<String, ConvertError> {
    let meta = &pod.pod.metadata;
    let spec = pod.pod.spec.as_ref();
    let path = selector.field_path.as_str();
    let keyed = |prefix: &str| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(key.to_string())
    };
    let value = match path {
        "metadata.name" => pod.name.clone(),
        "metadata.namespace" => pod.namespace.clone(),
        "metadata.uid" => pod.uid.clone(),
        "spec.nodeName" => ctx.node_name.clone(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => ctx.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => ctx.pod_ips.join(","),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.clone(),
        _ => {
            if let Some(key) = keyed("metadata.labels['") {
                meta.labels
                    .as_ref()
                    .and_then(|m| m.get(&key).cloned())
                    .unwrap_or_default()
            } else if let Some(key) = keyed("metadata.annotations['") {
                meta.annotations
                    .as_ref()
                    .and_then(|m| m.get(&key).cloned())
                    .unwrap_or_default()
            } else {
                return Err(ConvertError::unsupported(
                    field,
                    format!("field path {path:?}"),
                ));
            }
        }
    };
    Ok(value)
}

/// The value of a resourceFieldRef: the container's (or a named sibling's)
/// request or limit, divided by the divisor and rounded up. An unset limit
/// is the node's capacity, as the container is bounded by nothing else.
pub(super) fn resource_field_ref(
    pod: &DesiredPod,
    container: &Container,
    selector: &ResourceFieldSelector,
    field: &str,
) -> Result<String, ConvertError> {
    let target = match selector.container_name.as_deref() {
        None | Some("") => container,
        Some(name) => pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|c| c.name == name)
            })
            .ok_or_else(|| {
                ConvertError::invalid(
                    format!("{field}.containerName"),
                    format!("no container {name:?}"),
                )
            })?,
    };
    let (kind, resource) = selector.resource.split_once('.').ok_or_else(|| {
        ConvertError::invalid(
            format!("{field}.resource"),
            format!("{:?}", selector.resource),
        )
    })?;
    let cpu = match resource {
        "cpu" => true,
        "memory" => false,
        _ => {
            return Err(ConvertError::unsupported(
                format!("{field}.resource"),
                format!("{:?} (only cpu and memory)", selector.resource),
            ))
        }
    };
    let value = match kind {
        "limits" => limit(target, resource).unwrap_or_else(|| node_capacity(cpu)),
        "requests" => effective_request(target, resource).unwrap_or(0),
        _ => {
            return Err(ConvertError::invalid(
                format!("{field}.resource"),
                format!("{:?}", selector.resource),
            ))
        }
    };
    let divisor_text = selector
        .divisor
        .as_ref()
        .map(|q| q.0.as_str())
        .unwrap_or("1");
    let divisor_err =
        || ConvertError::invalid(format!("{field}.divisor"), format!("{divisor_text:?}"));
    // Integer units on both sides (millicores, bytes) so 250m / 1m is
    // exactly 250.
    let divisor = if cpu {
        quantity::cpu_millis(divisor_text)
    } else {
        quantity::bytes(divisor_text)
    }
    .map_err(|_| divisor_err())?;
    if divisor <= 0 {
        return Err(divisor_err());
    }
    Ok(ceil_div(value, divisor).to_string())
}

fn ceil_div(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// The node's cpu (millicores) or memory (bytes) capacity.
fn node_capacity(cpu: bool) -> i64 {
    if cpu {
        std::thread::available_parallelism()
            .map(|n| n.get() as i64 * 1000)
            .unwrap_or(1000)
    } else {
        node_memory_bytes()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::{ctx, desired};
    use std::sync::Arc;

    fn map(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |n| m.get(n).cloned()
    }

    #[test]
    fn expand_should_follow_kubernetes_rules() {
        let f = map(&[("A", "x"), ("B", "y")]);
        assert_eq!(expand("$(A)", &f), "x");
        assert_eq!(expand("pre-$(A)-$(B)-post", &f), "pre-x-y-post");
        assert_eq!(expand("$$(A)", &f), "$(A)");
        assert_eq!(expand("$$$(A)", &f), "$x");
        assert_eq!(expand("$(C)", &f), "$(C)");
        assert_eq!(expand("$(A", &f), "$(A");
        assert_eq!(expand("a$b", &f), "a$b");
        assert_eq!(expand("end$", &f), "end$");
        assert_eq!(expand("$()", &f), "$()");
        assert_eq!(expand("no refs", &f), "no refs");
        assert_eq!(expand("ünïcode $(A) ✓", &f), "ünïcode x ✓");
    }

    const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: prod
  labels: {app: web}
  annotations: {team: core}
spec:
  serviceAccountName: builder
  containers:
  - name: app
    image: busybox
    resources:
      requests: {cpu: 250m, memory: 64Mi}
      limits: {memory: 128Mi}
    env:
    - {name: A, value: one}
    - {name: B, value: "$(A)-two"}
    - {name: C, value: "$(D)"}
    - {name: D, value: four}
    - {name: ESC, value: "$$(A)"}
    - {name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
    - {name: LABEL, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
    - {name: ANN, valueFrom: {fieldRef: {fieldPath: "metadata.annotations['team']"}}}
    - {name: MISSING, valueFrom: {fieldRef: {fieldPath: "metadata.labels['nope']"}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: SA, valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}}
    - {name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: IPS, valueFrom: {fieldRef: {fieldPath: status.podIPs}}}
    - {name: HOST, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
    - {name: CPU_REQ, valueFrom: {resourceFieldRef: {resource: requests.cpu, divisor: 1m}}}
    - {name: CPU_REQ_CORES, valueFrom: {resourceFieldRef: {resource: requests.cpu}}}
    - {name: MEM_LIM, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: MEM_REQ, valueFrom: {resourceFieldRef: {resource: requests.memory}}}
    - {name: CPU_LIM, valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: 1m}}}
    - {name: A, value: again}
"#;

    #[test]
    fn environment_should_read_config_maps_and_secrets_as_kubelet_does() {
        let pod = desired(
            r#"
metadata: {name: web, namespace: prod}
spec:
  containers:
  - name: app
    image: x
    envFrom:
    - {configMapRef: {name: cfg}, prefix: CFG_}
    - {secretRef: {name: gone, optional: true}}
    env:
    - {name: CFG_mode, value: overridden}
    - {name: USER, valueFrom: {secretKeyRef: {name: creds, key: user}}}
    - {name: OPT, valueFrom: {configMapKeyRef: {name: cfg, key: nokey, optional: true}}}
    - {name: OPT2, valueFrom: {secretKeyRef: {name: gone, key: k, optional: true}}}
    - {name: BOTH, value: "$(USER)-$(CFG_mode)"}
"#,
        );
        let objs = Arc::new(crate::convert::api_volumes::tests::objects());
        let c = ConvertContext {
            objects: Some(crate::convert::Objects(objs)),
            ..ctx()
        };
        let app = &pod.pod.spec.as_ref().unwrap().containers[0];
        let env = environment(&pod, app, false, &c).unwrap();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            ["CFG_app.conf", "CFG_blob", "CFG_mode", "USER", "BOTH"]
        );
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CFG_mode"), Some("overridden"));
        assert_eq!(get("USER"), Some("admin"));
        assert_eq!(get("BOTH"), Some("admin-overridden"));

        // What is missing and not optional fails with kubelet's words.
        for (line, want) in [
            (
                "{name: X, valueFrom: {configMapKeyRef: {name: cfg, key: nokey}}}",
                "couldn't find key nokey in ConfigMap prod/cfg",
            ),
            (
                "{name: X, valueFrom: {secretKeyRef: {name: gone, key: k}}}",
                "secret \"gone\" not found",
            ),
        ] {
            let p = desired(&format!(
                "metadata: {{name: web, namespace: prod}}\nspec:\n  containers:\n  - name: app\n    image: x\n    env: [{line}]\n"
            ));
            let a = &p.pod.spec.as_ref().unwrap().containers[0];
            let err = environment(&p, a, false, &c).unwrap_err();
            assert!(
                matches!(&err, ConvertError::Missing(m) if m == want),
                "{err}"
            );
        }
    }

    #[test]
    fn environment_should_resolve_values_and_references_in_order() {
        let pod = desired(POD);
        let c = &pod.pod.spec.as_ref().unwrap().containers[0];
        let env = environment(&pod, c, false, &ctx()).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            env[0],
            ("A".to_string(), "again".to_string()),
            "first position, last value"
        );
        assert_eq!(env.iter().filter(|(n, _)| n == "A").count(), 1);
        assert_eq!(get("B"), Some("one-two"));
        assert_eq!(get("C"), Some("$(D)"), "later variables are not visible");
        assert_eq!(get("ESC"), Some("$(A)"));
        assert_eq!(get("NAME"), Some("web"));
        assert_eq!(get("NS"), Some("prod"));
        assert_eq!(get("UID"), Some(pod.uid.as_str()));
        assert_eq!(get("LABEL"), Some("web"));
        assert_eq!(get("ANN"), Some("core"));
        assert_eq!(get("MISSING"), Some(""));
        assert_eq!(get("NODE"), Some("node-1"));
        assert_eq!(get("SA"), Some("builder"));
        assert_eq!(get("IP"), Some("10.0.0.5"));
        assert_eq!(get("IPS"), Some("10.0.0.5,fd00::5"));
        assert_eq!(get("HOST"), Some("192.168.1.10"));
        assert_eq!(get("CPU_REQ"), Some("250"));
        assert_eq!(get("CPU_REQ_CORES"), Some("1"), "rounded up");
        assert_eq!(get("MEM_LIM"), Some("128"));
        assert_eq!(get("MEM_REQ"), Some("67108864"));
        let cores: i64 = get("CPU_LIM").unwrap().parse().unwrap();
        assert!(cores >= 1000, "an unset limit is the node's capacity");
    }

    #[test]
    fn environment_should_refuse_unsupported_sources_naming_the_field() {
        for (src, name) in [
            ("configMapKeyRef: {name: cm, key: k}", "configMapKeyRef"),
            ("secretKeyRef: {name: s, key: k}", "secretKeyRef"),
        ] {
            let yaml = format!(
                "metadata: {{name: p}}\nspec:\n  containers:\n  - name: app\n    image: x\n    env:\n    - name: V\n      valueFrom: {{{src}}}\n"
            );
            let pod = desired(&yaml);
            let c = &pod.pod.spec.as_ref().unwrap().containers[0];
            let err = environment(&pod, c, false, &ctx()).unwrap_err().to_string();
            assert!(
                err.contains(&format!("spec.containers[app].env[V].valueFrom.{name}")),
                "{err}"
            );
        }
        let pod = desired(
            "metadata: {name: p}\nspec:\n  initContainers:\n  - name: i\n    image: x\n    env:\n    - {name: V, valueFrom: {fieldRef: {fieldPath: spec.bogus}}}\n  containers: []\n",
        );
        let c = &pod
            .pod
            .spec
            .as_ref()
            .unwrap()
            .init_containers
            .as_ref()
            .unwrap()[0];
        let err = environment(&pod, c, true, &ctx()).unwrap_err().to_string();
        assert!(
            err.contains("spec.initContainers[i].env[V].valueFrom.fieldRef"),
            "{err}"
        );
        assert!(err.contains("spec.bogus"), "{err}");
    }

    #[test]
    fn environment_should_refuse_env_from_and_zero_divisors() {
        let pod = desired(
            "metadata: {name: p}\nspec:\n  containers:\n  - name: app\n    image: x\n    envFrom: [{configMapRef: {name: cm}}]\n",
        );
        let c = &pod.pod.spec.as_ref().unwrap().containers[0];
        let err = environment(&pod, c, false, &ctx()).unwrap_err().to_string();
        assert!(err.contains("spec.containers[app].envFrom"), "{err}");
        let pod = desired(
            "metadata: {name: p}\nspec:\n  containers:\n  - name: app\n    image: x\n    env:\n    - {name: V, valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: \"0\"}}}\n",
        );
        let c = &pod.pod.spec.as_ref().unwrap().containers[0];
        let err = environment(&pod, c, false, &ctx()).unwrap_err().to_string();
        assert!(err.contains("resourceFieldRef.divisor"), "{err}");
    }
}
