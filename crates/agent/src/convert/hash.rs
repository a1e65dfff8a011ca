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
