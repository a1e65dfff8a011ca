//! Pod identity: the stable UID of a static pod and DNS-safe fallback names.

use sha2::{Digest, Sha256};

/// The UID of a pod whose manifest sets none: 32 lowercase hex characters
/// of a SHA-256 over node, namespace and name. It depends on nothing else,
/// so editing a manifest keeps the pod (only changed containers restart).
pub fn derive(node: &str, namespace: &str, name: &str) -> String {
    derive_parts(&[node, namespace, name])
}

/// A UID for a pod that would collide with another's (a duplicate): the
/// source path is mixed in so each manifest document keeps its own key.
pub fn derive_for_duplicate(node: &str, namespace: &str, name: &str, source: &str) -> String {
    derive_parts(&[node, namespace, name, source])
}

fn derive_parts(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(b"petrel-static-pod");
    for p in parts {
        // NUL separators keep ("ab","c") and ("a","bc") apart.
        h.update([0u8]);
        h.update(p.as_bytes());
    }
    let digest = h.finalize();
    hex::encode(&digest[..16])
}

/// A DNS label (RFC 1123) made from a file stem, for documents whose own
/// name cannot be read: lowercase, runs of other characters become one '-',
/// no leading or trailing '-', at most 63 characters.
pub fn sanitize_label(stem: &str) -> String {
    let mut out = String::with_capacity(stem.len());
    for c in stem.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut s: String = out.trim_matches('-').chars().take(63).collect();
    while s.ends_with('-') {
        s.pop();
    }
    if s.is_empty() {
        "manifest".to_string()
    } else {
        s
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn derive_should_hash_node_namespace_and_name() {
        let mut h = Sha256::new();
        h.update(b"petrel-static-pod\0node-a\0default\0web");
        let expected = hex::encode(&h.finalize()[..16]);
        assert_eq!(derive("node-a", "default", "web"), expected);
        assert_eq!(expected.len(), 32);
        assert_ne!(
            derive("node-a", "default", "web"),
            derive("node-b", "default", "web")
        );
        assert_ne!(derive("n", "ab", "c"), derive("n", "a", "bc"));
        assert_ne!(
            derive("n", "default", "web"),
            derive_for_duplicate("n", "default", "web", "/m/b.yaml")
        );
    }

    #[test]
    fn sanitize_label_should_make_dns_labels() {
        assert_eq!(sanitize_label("My_Pod.v2"), "my-pod-v2");
        assert_eq!(sanitize_label("--x--"), "x");
        assert_eq!(sanitize_label("___"), "manifest");
        let long = "a".repeat(62) + "-b";
        assert_eq!(sanitize_label(&long), "a".repeat(62));
    }
}
