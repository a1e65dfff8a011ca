//! The spec hashes that tell whether a running container or sandbox still
//! matches its spec.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use petrel_cri::api;
use prost::Message;
use sha2::{Digest, Sha256};

/// A stable hex hash of the container's spec: the SHA-256 of its JSON form
/// (field order is fixed by the type, maps are ordered), truncated to 16
/// hex digits. It changes iff the spec changes.
pub fn container_hash(container: &Container) -> String {
    // Serializing a k8s-openapi type cannot fail (no non-string map keys);
    // an empty input would still hash deterministically.
    let json = serde_json::to_vec(container).unwrap_or_default();
    let digest = Sha256::digest(&json);
    hex::encode(&digest[..8])
}

/// A stable hex hash of a sandbox config (16 hex digits): what the pod's
/// sandbox is made from, so that a change of a pod-level field (labels,
/// hostname, DNS, host ports, namespaces, security context, QoS class) is
/// seen on the running sandbox. Not hashed: the attempt (it counts
/// recreations), the sandbox's seccomp profile (it confines nothing in a
/// pause-less pod) and the DNS servers read from the host's resolv.conf (a
/// host change must not recreate every pod): the pod's own DNS fields
/// stand for them. Maps are hashed sorted, since protobuf encodes them in
/// any order.
pub fn sandbox_hash(config: &api::PodSandboxConfig, spec: &PodSpec) -> String {
    let mut c = config.clone();
    if let Some(m) = c.metadata.as_mut() {
        m.attempt = 0;
    }
    c.dns_config = None;
    // The sandbox's seccomp profile confines no process of Petrel's
    // (pause-less pods): a change of it, or of --seccomp-default, must not
    // recreate pods; containers carry their own profile.
    if let Some(sc) = c.linux.as_mut().and_then(|l| l.security_context.as_mut()) {
        sc.seccomp = None;
    }
    let labels: BTreeMap<_, _> = std::mem::take(&mut c.labels).into_iter().collect();
    let annotations: BTreeMap<_, _> = std::mem::take(&mut c.annotations).into_iter().collect();
    let sysctls: BTreeMap<_, _> = c
        .linux
        .as_mut()
        .map(|l| std::mem::take(&mut l.sysctls).into_iter().collect())
        .unwrap_or_default();
    let mut h = Sha256::new();
    h.update(c.encode_to_vec());
    for map in [&labels, &annotations, &sysctls] {
        // Lengths first: no two different maps feed the same bytes.
        h.update((map.len() as u64).to_be_bytes());
        for (k, v) in map {
            h.update((k.len() as u64).to_be_bytes());
            h.update(k.as_bytes());
            h.update((v.len() as u64).to_be_bytes());
            h.update(v.as_bytes());
        }
    }
    let dns = serde_json::to_vec(&(&spec.dns_policy, &spec.dns_config)).unwrap_or_default();
    h.update(dns);
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::EnvVar;

    fn base() -> Container {
        serde_yaml::from_str(
            "name: app\nimage: busybox\ncommand: [sleep, '100']\nenv: [{name: A, value: '1'}]\n",
        )
        .unwrap()
    }

    #[test]
    fn container_hash_should_be_stable() {
        let h = container_hash(&base());
        assert_eq!(h, container_hash(&base()));
        assert_eq!(h.len(), 16);
        assert!(h.chars().all(|c| c.is_ascii_hexdigit()));
        // A round trip through JSON (as a re-read manifest) keeps it.
        let again: Container =
            serde_json::from_str(&serde_json::to_string(&base()).unwrap()).unwrap();
        assert_eq!(h, container_hash(&again));
    }

    #[test]
    fn container_hash_should_change_with_the_spec() {
        let h = container_hash(&base());
        let mut c = base();
        c.image = Some("busybox:1.36".into());
        assert_ne!(h, container_hash(&c));
        let mut c = base();
        c.command = Some(vec!["sleep".into(), "101".into()]);
        assert_ne!(h, container_hash(&c));
        let mut c = base();
        c.env.as_mut().unwrap()[0] = EnvVar {
            name: "A".into(),
            value: Some("2".into()),
            value_from: None,
        };
        assert_ne!(h, container_hash(&c));
        let mut c = base();
        c.name = "other".into();
        assert_ne!(h, container_hash(&c));
    }
}
