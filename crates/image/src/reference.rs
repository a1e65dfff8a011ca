//! Image reference parsing and normalisation, following the rules containerd
//! and docker apply (`busybox` is `docker.io/library/busybox:latest`).

use crate::ImageError;

const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DOMAIN: &str = "index.docker.io";
const OFFICIAL_PREFIX: &str = "library/";
const DEFAULT_TAG: &str = "latest";
const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    /// `domain/path`, e.g. `docker.io/library/busybox`.
    pub name: String,
    /// The tag, if any (none only when a digest is given).
    pub tag: Option<String>,
    /// `sha256:<hex>`, if the reference pins a digest.
    pub digest: Option<String>,
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Normalises an image reference the way containerd does: a missing domain
/// becomes `docker.io`, a single-component name on docker.io gets
/// `library/`, and a reference without tag or digest gets `:latest`.
///
/// `busybox` → `docker.io/library/busybox:latest`,
/// `foo/bar` → `docker.io/foo/bar:latest`,
/// `localhost:5000/x` → `localhost:5000/x:latest`.
pub fn normalize_reference(s: &str) -> Result<String, ImageError> {
    parse(s).map(|r| r.to_string())
}

fn invalid(reference: &str, reason: impl Into<String>) -> ImageError {
    ImageError::InvalidReference {
        reference: reference.to_string(),
        reason: reason.into(),
    }
}

/// Parses and normalises a reference (see [`normalize_reference`]).
pub(crate) fn parse(s: &str) -> Result<Reference, ImageError> {
    if s.is_empty() {
        return Err(invalid(s, "empty reference"));
    }
    if is_hex64(s) {
        return Err(invalid(
            s,
            "a 64-character hexadecimal string is an id, not a repository name",
        ));
    }
    let (rest, digest) = match s.split_once('@') {
        Some((rest, digest)) => {
            validate_digest(digest).map_err(|reason| invalid(s, reason))?;
            (rest, Some(digest.to_string()))
        }
        None => (s, None),
    };
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => {
            let colon = last_slash + i;
            (&rest[..colon], Some(&rest[colon + 1..]))
        }
        None => (rest, None),
    };
    if let Some(tag) = tag {
        if !is_valid_tag(tag) {
            return Err(invalid(s, format!("invalid tag {tag:?}")));
        }
    }
    let (domain, path) = split_domain(name);
    if !is_valid_domain(&domain) {
        return Err(invalid(s, format!("invalid domain {domain:?}")));
    }
    if path.is_empty() || !path.split('/').all(is_valid_path_component) {
        return Err(invalid(
            s,
            "repository name must be lowercase letters, digits and separators",
        ));
    }
    let full = format!("{domain}/{path}");
    if full.len() > MAX_NAME_LEN {
        return Err(invalid(
            s,
            format!("repository name longer than {MAX_NAME_LEN} characters"),
        ));
    }
    let tag = match (tag, &digest) {
        (Some(t), _) => Some(t.to_string()),
        (None, Some(_)) => None,
        (None, None) => Some(DEFAULT_TAG.to_string()),
    };
    Ok(Reference {
        name: full,
        tag,
        digest,
    })
}

/// Splits `name` into domain and path, adding docker.io and `library/`.
fn split_domain(name: &str) -> (String, String) {
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.')
                || first.contains(':')
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    let domain = if domain == LEGACY_DOMAIN {
        DEFAULT_DOMAIN.to_string()
    } else {
        domain
    };
    let path = if domain == DEFAULT_DOMAIN && !path.contains('/') {
        format!("{OFFICIAL_PREFIX}{path}")
    } else {
        path
    };
    (domain, path)
}

/// `host[:port]`, host being dot-separated alphanumeric labels with inner
/// dashes, or a bracketed IPv6 address.
fn is_valid_domain(domain: &str) -> bool {
    let (host, port) = if let Some(rest) = domain.strip_prefix('[') {
        match rest.split_once(']') {
            Some((addr, after)) => {
                if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
                    return false;
                }
                match after {
                    "" => return true,
                    p => match p.strip_prefix(':') {
                        Some(port) => return is_port(port),
                        None => return false,
                    },
                }
            }
            None => return false,
        }
    } else {
        match domain.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (domain, None),
        }
    };
    if let Some(port) = port {
        if !is_port(port) {
            return false;
        }
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.len() <= 5 && p.bytes().all(|c| c.is_ascii_digit())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn is_valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`
pub(crate) fn is_valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_TAG_LEN
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// Accepts `sha256:<64 lowercase hex>` only: the one algorithm this store
/// verifies.
pub(crate) fn validate_digest(d: &str) -> Result<(), String> {
    match d.split_once(':') {
        Some(("sha256", hex)) if is_hex64(hex) => Ok(()),
        Some(("sha256", _)) => Err(format!("invalid sha256 digest {d:?}")),
        Some((alg, _)) => Err(format!("unsupported digest algorithm {alg:?}")),
        None => Err(format!("invalid digest {d:?}")),
    }
}

/// True for exactly 64 lowercase hexadecimal characters.
pub(crate) fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        match normalize_reference(s) {
            Ok(n) => n,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn normalize_should_add_docker_io_library_and_latest() {
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(norm("foo/bar"), "docker.io/foo/bar:latest");
        assert_eq!(
            norm("docker.io/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(
            norm("index.docker.io/library/busybox:x"),
            "docker.io/library/busybox:x"
        );
        assert_eq!(norm("a/b/c:v1"), "docker.io/a/b/c:v1");
    }

    #[test]
    fn normalize_should_keep_registry_hosts_and_ports() {
        assert_eq!(norm("localhost:5000/x"), "localhost:5000/x:latest");
        assert_eq!(norm("localhost/x:y"), "localhost/x:y");
        assert_eq!(norm("quay.io/a/b"), "quay.io/a/b:latest");
        assert_eq!(norm("127.0.0.1:5000/a:b"), "127.0.0.1:5000/a:b");
        assert_eq!(norm("[::1]:5000/a"), "[::1]:5000/a:latest");
    }

    #[test]
    fn normalize_should_keep_digests_without_adding_latest() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            norm(&format!("busybox@{d}")),
            format!("docker.io/library/busybox@{d}")
        );
        assert_eq!(
            norm(&format!("busybox:1@{d}")),
            format!("docker.io/library/busybox:1@{d}")
        );
    }

    #[test]
    fn normalize_should_reject_malformed_references() {
        for bad in [
            "",
            "Busybox",
            "foo/Bar",
            "busybox:",
            "busybox:-x",
            "busybox@sha256:abc",
            "busybox@md5:0123",
            "a//b",
            "-a/b",
            "foo..bar/x",
            &"a".repeat(64),
            &format!("x:{}", "t".repeat(129)),
            "bad domain.io/x",
        ] {
            assert!(normalize_reference(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn parse_should_split_name_tag_and_digest() -> Result<(), ImageError> {
        let r = parse("localhost:5000/a/b:v2")?;
        assert_eq!(r.name, "localhost:5000/a/b");
        assert_eq!(r.tag.as_deref(), Some("v2"));
        assert_eq!(r.digest, None);
        Ok(())
    }
}
