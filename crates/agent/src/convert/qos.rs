//! The pod's QoS class and its cgroup parent, by kubelet's rules.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity;

/// A pod's quality-of-service class, which decides its cgroup parent and
/// its containers' OOM score adjustment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    /// Every container sets cpu and memory limits equal to its requests.
    Guaranteed,
    /// Something is requested or limited, but not enough for Guaranteed.
    Burstable,
    /// Nothing is requested or limited.
    BestEffort,
}

impl QosClass {
    /// The name as `status.qosClass` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

impl std::fmt::Display for QosClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resources that decide the QoS class; others (hugepages, extended
/// resources) do not count.
const QOS_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// A positive amount of `name` in a resource list, in a common unit (millis
/// for cpu, bytes for memory). Zero and unparsable amounts count as unset,
/// as the API server would have refused the latter anyway.
fn amount(list: Option<&BTreeMap<String, Quantity>>, name: &str) -> Option<i64> {
    let q = list?.get(name)?;
    let v = if name == "cpu" {
        quantity::cpu_millis(&q.0).ok()?
    } else {
        quantity::bytes(&q.0).ok()?
    };
    (v > 0).then_some(v)
}

/// A container's effective request for `name`: the request, else the limit
/// (the API server defaults a missing request to the limit).
pub(crate) fn effective_request(c: &Container, name: &str) -> Option<i64> {
    let r = c.resources.as_ref()?;
    amount(r.requests.as_ref(), name).or_else(|| amount(r.limits.as_ref(), name))
}

/// A container's limit for `name`, if positive.
pub(crate) fn limit(c: &Container, name: &str) -> Option<i64> {
    amount(c.resources.as_ref()?.limits.as_ref(), name)
}

/// The pod's QoS class: BestEffort when no container (init or app) requests
/// or limits cpu or memory; Guaranteed when every container limits both and
/// the totals of requests equal the totals of limits; else Burstable.
pub fn qos_class(spec: &PodSpec) -> QosClass {
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let mut any = false;
    let mut every_limited = true;
    let mut requests = [0i64; 2];
    let mut limits = [0i64; 2];
    for c in containers {
        for (i, name) in QOS_RESOURCES.iter().enumerate() {
            if let Some(r) = effective_request(c, name) {
                any = true;
                requests[i] += r;
            }
            match limit(c, name) {
                Some(l) => {
                    any = true;
                    limits[i] += l;
                }
                None => every_limited = false,
            }
        }
    }
    if !any {
        QosClass::BestEffort
    } else if every_limited && requests == limits {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The pod's cgroup parent in kubelet's cgroupfs layout:
/// `<root>/kubepods/pod<uid>` for Guaranteed pods and
/// `<root>/kubepods/<burstable|besteffort>/pod<uid>` for the others.
pub fn pod_cgroup_parent(uid: &str, qos: QosClass, cgroup_root: &str) -> String {
    let root = cgroup_root.trim_end_matches('/');
    match qos {
        QosClass::Guaranteed => format!("{root}/kubepods/pod{uid}"),
        QosClass::Burstable => format!("{root}/kubepods/burstable/pod{uid}"),
        QosClass::BestEffort => format!("{root}/kubepods/besteffort/pod{uid}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::container_with;

    fn spec(init: Vec<Container>, apps: Vec<Container>) -> PodSpec {
        PodSpec {
            init_containers: (!init.is_empty()).then_some(init),
            containers: apps,
            ..Default::default()
        }
    }

    #[test]
    fn qos_class_should_be_best_effort_without_requests_or_limits() {
        let s = spec(
            vec![],
            vec![container_with(&[], &[]), container_with(&[], &[])],
        );
        assert_eq!(qos_class(&s), QosClass::BestEffort);
        let s = spec(vec![], vec![container_with(&[("cpu", "0")], &[])]);
        assert_eq!(qos_class(&s), QosClass::BestEffort, "zero counts as unset");
        let s = spec(
            vec![],
            vec![container_with(&[("ephemeral-storage", "1Gi")], &[])],
        );
        assert_eq!(
            qos_class(&s),
            QosClass::BestEffort,
            "only cpu and memory count"
        );
    }

    #[test]
    fn qos_class_should_be_guaranteed_when_limits_equal_requests_everywhere() {
        let g = || {
            container_with(
                &[("cpu", "500m"), ("memory", "1Gi")],
                &[("cpu", "0.5"), ("memory", "1024Mi")],
            )
        };
        assert_eq!(
            qos_class(&spec(vec![], vec![g(), g()])),
            QosClass::Guaranteed
        );
        assert_eq!(qos_class(&spec(vec![g()], vec![g()])), QosClass::Guaranteed);
        let only_limits = container_with(&[], &[("cpu", "1"), ("memory", "1Gi")]);
        assert_eq!(
            qos_class(&spec(vec![], vec![only_limits])),
            QosClass::Guaranteed
        );
    }

    #[test]
    fn qos_class_should_be_burstable_otherwise() {
        let g = || {
            container_with(
                &[("cpu", "1"), ("memory", "1Gi")],
                &[("cpu", "1"), ("memory", "1Gi")],
            )
        };
        let less = container_with(
            &[("cpu", "500m"), ("memory", "1Gi")],
            &[("cpu", "1"), ("memory", "1Gi")],
        );
        assert_eq!(qos_class(&spec(vec![], vec![less])), QosClass::Burstable);
        let cpu_only = container_with(&[("cpu", "1")], &[("cpu", "1")]);
        assert_eq!(
            qos_class(&spec(vec![], vec![cpu_only])),
            QosClass::Burstable
        );
        assert_eq!(
            qos_class(&spec(vec![], vec![g(), container_with(&[], &[])])),
            QosClass::Burstable,
            "one unlimited container"
        );
        assert_eq!(
            qos_class(&spec(
                vec![container_with(&[("memory", "1Mi")], &[])],
                vec![g()]
            )),
            QosClass::Burstable,
            "init containers count"
        );
    }

    #[test]
    fn pod_cgroup_parent_should_follow_kubelets_layout() {
        assert_eq!(
            pod_cgroup_parent("u1", QosClass::Guaranteed, "/petrel"),
            "/petrel/kubepods/podu1"
        );
        assert_eq!(
            pod_cgroup_parent("u1", QosClass::Burstable, "/petrel/"),
            "/petrel/kubepods/burstable/podu1"
        );
        assert_eq!(
            pod_cgroup_parent("u1", QosClass::BestEffort, "/petrel"),
            "/petrel/kubepods/besteffort/podu1"
        );
        assert_eq!(
            pod_cgroup_parent("u1", QosClass::BestEffort, ""),
            "/kubepods/besteffort/podu1"
        );
        assert_eq!(QosClass::Burstable.as_str(), "Burstable");
        assert_eq!(QosClass::BestEffort.to_string(), "BestEffort");
    }
}
