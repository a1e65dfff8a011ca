//! Pod and container names, namespaces and uids.
//!
//! They become the name the runtime reserves (`name_namespace_uid_attempt`)
//! and annotations, so what matters to Petrel is that they are text of a
//! sane length, without NUL, control characters or `/`, and not `.` or
//! `..`. The limits are Kubernetes' own: a pod name is at most 253 bytes (a
//! DNS-1123 subdomain), a namespace at most 63 (a DNS-1123 label). The DNS
//! character rules themselves are not enforced, as containerd does not
//! enforce them: critest names pods and containers like
//! `PodSandbox-for-create-test-<uuid>` (upper case) and some of its
//! container names are 75 bytes long, so container names get the 253-byte
//! limit of Kubernetes object names rather than a label's 63. A uid is a
//! UUID in Kubernetes (kubelet's static pods use a 32-digit hash); the same
//! 253 bytes bound it.

use petrel_cri::api;
use petrel_oci::spec::shown;

use crate::error::{Result, RuntimeError};

/// The longest pod name, container name and uid (a DNS-1123 subdomain).
pub(crate) const MAX_NAME: usize = 253;
/// The longest namespace (a DNS-1123 label).
pub(crate) const MAX_NAMESPACE: usize = 63;

/// A pod's metadata: name (required), namespace and uid.
pub(crate) fn pod_metadata(md: &api::PodSandboxMetadata) -> Result<()> {
    name("config.metadata.name", &md.name, MAX_NAME, true)?;
    name(
        "config.metadata.namespace",
        &md.namespace,
        MAX_NAMESPACE,
        false,
    )?;
    name("config.metadata.uid", &md.uid, MAX_NAME, false)
}

/// A container's metadata: its name (required).
pub(crate) fn container_metadata(md: &api::ContainerMetadata) -> Result<()> {
    name("config.metadata.name", &md.name, MAX_NAME, true)
}

/// One name: at most `max` bytes, no control character (NUL included) or
/// `/`, not `.` or `..`; empty only when not `required`.
pub(crate) fn name(field: &str, value: &str, max: usize, required: bool) -> Result<()> {
    let bad = |why: String| Err(RuntimeError::invalid(field, why));
    if value.is_empty() {
        return if required {
            bad("must not be empty".into())
        } else {
            Ok(())
        };
    }
    if value.len() > max {
        return bad(format!(
            "{} is {} bytes long, more than {max}",
            shown(value),
            value.len()
        ));
    }
    if value == "." || value == ".." {
        return bad(format!("{value:?} is not a name"));
    }
    if let Some(c) = value.chars().find(|c| c.is_control() || *c == '/') {
        return bad(format!("{} contains {c:?}", shown(value)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, namespace: &str, uid: &str) -> api::PodSandboxMetadata {
        api::PodSandboxMetadata {
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
            attempt: 0,
        }
    }

    fn field_of(r: Result<()>) -> String {
        match r {
            Err(RuntimeError::InvalidArgument { field, reason }) => {
                assert!(reason.len() < 200, "{reason}");
                field
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn names_should_accept_what_kubelet_and_critest_send() {
        let uuid = "3f6c1d2e-9a4b-4c1d-8e2f-0a1b2c3d4e5f";
        for (n, ns, uid) in [
            ("nginx-7d9f8", "default", uuid),
            (
                "kube-apiserver-node1",
                "kube-system",
                "0123456789abcdef0123456789abcdef",
            ),
            (
                &format!("PodSandbox-for-create-test-{uuid}") as &str,
                &format!("cri-test-namespace{uuid}") as &str,
                &format!("cri-test-uid{uuid}") as &str,
            ),
            (&"a".repeat(253), &"b".repeat(63), ""),
            ("pod.with.dots", "", ""),
        ] {
            pod_metadata(&pod(n, ns, uid)).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
        let long_critest = format!("container-with-SupplementalGroups-test-{uuid}");
        container_metadata(&api::ContainerMetadata {
            name: long_critest,
            attempt: 3,
        })
        .expect("critest container name");
    }

    #[test]
    fn names_should_refuse_nul_slash_dots_and_megabytes_naming_the_field() {
        let big = "x".repeat(3 << 20);
        let cases: Vec<(api::PodSandboxMetadata, &str)> = vec![
            (pod("", "ns", "u"), "config.metadata.name"),
            (pod("a\0b", "ns", "u"), "config.metadata.name"),
            (pod("a/b", "ns", "u"), "config.metadata.name"),
            (pod("..", "ns", "u"), "config.metadata.name"),
            (pod(".", "ns", "u"), "config.metadata.name"),
            (pod("a\nb", "ns", "u"), "config.metadata.name"),
            (pod(&big, "ns", "u"), "config.metadata.name"),
            (pod(&"a".repeat(254), "ns", "u"), "config.metadata.name"),
            (pod("p", "kube/system", "u"), "config.metadata.namespace"),
            (pod("p", &"n".repeat(64), "u"), "config.metadata.namespace"),
            (pod("p", "..", "u"), "config.metadata.namespace"),
            (pod("p", "ns", "u\0"), "config.metadata.uid"),
            (pod("p", "ns", &big), "config.metadata.uid"),
        ];
        for (md, want) in cases {
            assert_eq!(
                field_of(pod_metadata(&md)),
                want,
                "{:?}",
                &md.name.get(..20)
            );
        }
        for bad in ["", "c\0", "c/d", "..", &big] {
            let md = api::ContainerMetadata {
                name: bad.into(),
                attempt: 0,
            };
            assert_eq!(field_of(container_metadata(&md)), "config.metadata.name");
        }
    }
}
