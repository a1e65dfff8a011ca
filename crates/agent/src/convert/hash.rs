//! The spec hash that tells whether a running container still matches its
//! spec.

use k8s_openapi::api::core::v1::Container;
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
