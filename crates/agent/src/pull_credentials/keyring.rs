//! kubelet's keyring: registry credentials indexed by the registry key
//! they were given for, and matched against the repository of an image.
//!
//! A key is a registry host, optionally with a port and a path
//! (`reg.example.com:5000/team`), written with or without a scheme, and
//! docker's `/v1/` or `/v2/` path (`https://index.docker.io/v1/`) counts as
//! the host alone. A key matches a repository when their ports are the
//! same, their hosts have as many dot-separated labels and each label
//! matches as a glob (`*.example.com` matches `a.example.com` but not
//! `a.b.example.com`), and the key's path is a prefix of the
//! repository's path. Keys are tried from the greatest down (reverse
//! string order), so `quay.io/team` comes before `quay.io`, and a name
//! before a wildcard; every match's credentials are returned, in that
//! order. Credentials for `index.docker.io` serve any Docker Hub image
//! when no other key matches.

use std::collections::HashMap;

use petrel_cri::api::AuthConfig;

/// Docker Hub's registry key after normalization (kubelet's default
/// registry).
const DOCKER_HUB_KEY: &str = "index.docker.io";
/// The domain Docker Hub images are named with.
const DOCKER_HUB_DOMAIN: &str = "docker.io";

/// Registry credentials by registry key.
#[derive(Default, Clone)]
pub struct Keyring {
    /// The keys, unique, greatest first: the order of matching.
    index: Vec<String>,
    /// Each key's credentials, in the order they were added.
    creds: HashMap<String, Vec<AuthConfig>>,
}

impl std::fmt::Debug for Keyring {
    // Credentials never reach logs: only the keys are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Keyring {
    /// Adds credentials, each with the registry key it is for. A key that
    /// is not a registry location is left out with a warning, as kubelet
    /// ignores it.
    pub fn add(&mut self, entries: impl IntoIterator<Item = (String, AuthConfig)>) {
        for (location, auth) in entries {
            let Some(key) = registry_key(&location) else {
                tracing::warn!(%location, "pull secret entry is not a registry location; ignored");
                continue;
            };
            let list = self.creds.entry(key.clone()).or_default();
            if list.is_empty() {
                self.index.push(key);
            }
            list.push(auth);
        }
        self.index.sort_unstable_by(|a, b| b.cmp(a));
    }

    /// Whether it holds no credentials.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The credentials for pulling `image` (a reference, with or without
    /// tag or digest), the most specific key's first; empty when none
    /// match.
    pub fn lookup(&self, image: &str) -> Vec<AuthConfig> {
        let repo = repository(image);
        let found: Vec<AuthConfig> = self
            .index
            .iter()
            .filter(|key| key_matches(key, &repo))
            .flat_map(|key| self.creds.get(key).into_iter().flatten().cloned())
            .collect();
        if !found.is_empty() {
            return found;
        }
        match self.creds.get(DOCKER_HUB_KEY) {
            Some(hub) if is_docker_hub(&repo) => hub.clone(),
            _ => Vec::new(),
        }
    }
}

/// The repository an image reference names, normalized as docker names
/// it (what kubelet matches keys against): the tag and digest dropped,
/// Docker Hub's domain and `library/` added to short names.
/// `busybox:1.36` → `docker.io/library/busybox`;
/// `127.0.0.1:5000/team/app:1` → `127.0.0.1:5000/team/app`.
pub fn repository(image: &str) -> String {
    let name = image.split_once('@').map_or(image, |(n, _)| n);
    // A tag is a colon after the last slash (one before it is a port).
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    // The first component is a registry when it looks like a host: a dot,
    // a port, localhost, or capitals (repositories are lowercase).
    let (domain, rest) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first, rest)
        }
        _ => (DOCKER_HUB_DOMAIN, name),
    };
    let domain = if domain == DOCKER_HUB_KEY {
        DOCKER_HUB_DOMAIN
    } else {
        domain
    };
    if domain == DOCKER_HUB_DOMAIN && !rest.contains('/') {
        format!("{domain}/library/{rest}")
    } else {
        format!("{domain}/{rest}")
    }
}

/// Whether repository `repo` is pulled from Docker Hub (kubelet's test
/// for its default registry).
fn is_docker_hub(repo: &str) -> bool {
    match repo.split_once('/') {
        None => !repo.is_empty(),
        Some(("", _)) => false,
        Some((first, _)) => {
            first == DOCKER_HUB_DOMAIN || first == DOCKER_HUB_KEY || !first.contains(['.', ':'])
        }
    }
}

/// The key a secret's registry location is indexed by: host[:port] and
/// path, without scheme; `/v1/` and `/v2/` count as no path. `None` when
/// the location names no host.
fn registry_key(location: &str) -> Option<String> {
    let rest = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    // (Another scheme than HTTP(S) names no registry.)
    if host.is_empty()
        || rest.contains("://")
        || host.chars().any(|c| c.is_whitespace() || c.is_control())
        || !port_is_valid(host)
    {
        return None;
    }
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
        &path[3..]
    } else {
        path
    };
    if path.is_empty() || path == "/" {
        Some(host.to_string())
    } else {
        Some(format!("{host}{path}"))
    }
}

/// A port, if given, is digits (a URL parser refuses others).
fn port_is_valid(host: &str) -> bool {
    let port = if let Some(after) = host.strip_prefix('[') {
        match after.split_once(']') {
            Some((_, tail)) => tail.strip_prefix(':'),
            None => return false,
        }
    } else {
        match host.split_once(':') {
            Some((_, p)) if !p.contains(':') => Some(p),
            Some(_) => return false,
            None => None,
        }
    };
    port.is_none_or(|p| p.bytes().all(|b| b.is_ascii_digit()))
}

/// Splits `host[:port]/path` into host labels, port and path.
fn split_location(location: &str) -> (Vec<&str>, &str, &str) {
    let (authority, path) = match location.find('/') {
        Some(i) => location.split_at(i),
        None => (location, ""),
    };
    let (host, port) = split_host_port(authority);
    (host.split('.').collect(), port, path)
}

/// host and port, as Go's `net.SplitHostPort` splits them; an authority
/// it refuses (no port, several colons) is all host.
fn split_host_port(authority: &str) -> (&str, &str) {
    if let Some(after) = authority.strip_prefix('[') {
        if let Some((host, tail)) = after.split_once(']') {
            if let Some(port) = tail.strip_prefix(':') {
                return (host, port);
            }
        }
        return (authority, "");
    }
    match authority.split_once(':') {
        Some((host, port)) if !port.contains(':') => (host, port),
        _ => (authority, ""),
    }
}

/// Whether registry key `key` covers repository `repo`.
fn key_matches(key: &str, repo: &str) -> bool {
    let (key_labels, key_port, key_path) = split_location(key);
    let (labels, port, path) = split_location(repo);
    key_port == port
        && key_labels.len() == labels.len()
        && path.starts_with(key_path)
        && key_labels
            .iter()
            .zip(&labels)
            .all(|(pattern, label)| glob_matches(pattern, label))
}

/// One element of a glob pattern.
#[derive(Debug, PartialEq)]
enum Token {
    /// `*`: any run of characters.
    Star,
    /// `?`: one character.
    Any,
    /// A character as is (`\c` escapes it).
    Char(char),
    /// `[...]` / `[^...]`: one character in (or not in) the ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Whether `text` matches the shell glob `pattern` (`*`, `?`, `[a-z]`,
/// `[^...]`, `\` escapes; Go's `filepath.Match` syntax). A malformed
/// pattern matches nothing, as kubelet treats it.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let Some(tokens) = tokenize(pattern) else {
        return false;
    };
    let text: Vec<char> = text.chars().collect();
    // Greedy with one backtrack point: linear, whatever the stars.
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match tokens.get(p) {
            Some(Token::Star) => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(tok) if one_matches(tok, text[t]) => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((star, from)) => {
                    p = star + 1;
                    t = from + 1;
                    backtrack = Some((star, from + 1));
                }
                None => return false,
            },
        }
    }
    tokens[p..].iter().all(|tok| *tok == Token::Star)
}

fn one_matches(tok: &Token, c: char) -> bool {
    match tok {
        Token::Star => false,
        Token::Any => true,
        Token::Char(x) => *x == c,
        Token::Class { negated, ranges } => {
            ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
        }
    }
}

/// The pattern's tokens; `None` if it is malformed (an unclosed or empty
/// class, a trailing `\`, a bad range).
fn tokenize(pattern: &str) -> Option<Vec<Token>> {
    let mut out = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(match c {
            '*' => Token::Star,
            '?' => Token::Any,
            '\\' => Token::Char(chars.next()?),
            '[' => {
                let negated = chars.next_if_eq(&'^').is_some();
                let mut ranges = Vec::new();
                loop {
                    let lo = match chars.next()? {
                        ']' if !ranges.is_empty() => break,
                        ']' | '-' => return None,
                        '\\' => chars.next()?,
                        c => c,
                    };
                    let hi = if chars.next_if_eq(&'-').is_some() {
                        match chars.next()? {
                            ']' | '-' => return None,
                            '\\' => chars.next()?,
                            c => c,
                        }
                    } else {
                        lo
                    };
                    if hi < lo {
                        return None;
                    }
                    ranges.push((lo, hi));
                }
                Token::Class { negated, ranges }
            }
            c => Token::Char(c),
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(user: &str) -> AuthConfig {
        AuthConfig {
            username: user.into(),
            password: "pw".into(),
            ..Default::default()
        }
    }

    fn ring(entries: &[(&str, &str)]) -> Keyring {
        let mut k = Keyring::default();
        k.add(entries.iter().map(|(loc, u)| (loc.to_string(), auth(u))));
        k
    }

    fn users(k: &Keyring, image: &str) -> Vec<String> {
        k.lookup(image).into_iter().map(|a| a.username).collect()
    }

    #[test]
    fn repository_should_normalize_as_docker_names_images() {
        for (image, want) in [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:1.36", "docker.io/library/busybox"),
            ("library/busybox@sha256:abc", "docker.io/library/busybox"),
            ("team/app:v1", "docker.io/team/app"),
            ("docker.io/busybox", "docker.io/library/busybox"),
            ("index.docker.io/team/app", "docker.io/team/app"),
            (
                "127.0.0.1:5000/private/busybox:1",
                "127.0.0.1:5000/private/busybox",
            ),
            ("127.0.0.1:5000/busybox", "127.0.0.1:5000/busybox"),
            ("localhost/app:1", "localhost/app"),
            ("quay.io/coreos/etcd:v3@sha256:abc", "quay.io/coreos/etcd"),
            ("[::1]:5000/app:2", "[::1]:5000/app"),
        ] {
            assert_eq!(repository(image), want, "{image}");
        }
    }

    #[test]
    fn registry_key_should_drop_scheme_and_docker_api_paths() {
        for (loc, want) in [
            ("reg.io", Some("reg.io")),
            ("https://reg.io", Some("reg.io")),
            ("http://reg.io:5000/", Some("reg.io:5000")),
            ("https://index.docker.io/v1/", Some("index.docker.io")),
            ("reg.io/v2/team", Some("reg.io/team")),
            ("reg.io/team/app", Some("reg.io/team/app")),
            ("[::1]:5000", Some("[::1]:5000")),
            ("", None),
            ("https://", None),
            ("/just/a/path", None),
            ("reg.io:http", None),
            ("ftp://reg.io", None),
            ("bad host", None),
        ] {
            assert_eq!(registry_key(loc).as_deref(), want, "{loc:?}");
        }
    }

    #[test]
    fn lookup_should_match_the_host_with_or_without_scheme() {
        let k = ring(&[("https://reg.example.com", "a")]);
        assert_eq!(users(&k, "reg.example.com/team/app:1"), ["a"]);
        assert!(users(&k, "other.example.com/app").is_empty());
        assert!(users(&k, "busybox").is_empty());
        // Labels are compared one by one: no suffix matching.
        assert!(users(&k, "x.reg.example.com/app").is_empty());
    }

    #[test]
    fn lookup_should_require_the_same_port() {
        let k = ring(&[("127.0.0.1:5000", "five"), ("127.0.0.1", "none")]);
        assert_eq!(users(&k, "127.0.0.1:5000/app"), ["five"]);
        assert_eq!(users(&k, "127.0.0.1/app"), ["none"]);
        assert!(users(&k, "127.0.0.1:6000/app").is_empty());
    }

    #[test]
    fn lookup_should_match_path_prefixes_most_specific_first() {
        let k = ring(&[
            ("quay.io", "host"),
            ("quay.io/coreos", "team"),
            ("quay.io/coreos/etcd", "repo"),
            ("quay.io/other", "other"),
        ]);
        assert_eq!(
            users(&k, "quay.io/coreos/etcd:v3"),
            ["repo", "team", "host"]
        );
        assert_eq!(users(&k, "quay.io/coreos/flannel"), ["team", "host"]);
        assert_eq!(users(&k, "quay.io/someone/app"), ["host"]);
    }

    #[test]
    fn lookup_should_match_wildcards_per_label_after_names() {
        let k = ring(&[
            ("*.example.com", "wild"),
            ("a.example.com", "named"),
            ("*.*.example.com", "deep"),
            ("reg.*", "tld"),
            ("app*.k8s.io", "partial"),
        ]);
        assert_eq!(users(&k, "a.example.com/x"), ["named", "wild"]);
        assert_eq!(users(&k, "b.example.com/x"), ["wild"]);
        assert_eq!(users(&k, "a.b.example.com/x"), ["deep"]);
        assert_eq!(users(&k, "reg.io/x"), ["tld"]);
        assert_eq!(users(&k, "app1.k8s.io/x"), ["partial"]);
        assert!(users(&k, "example.com/x").is_empty());
    }

    #[test]
    fn lookup_should_give_every_secrets_credentials_for_a_key_in_order() {
        let mut k = Keyring::default();
        k.add([("reg.io".to_string(), auth("first"))]);
        k.add([("https://reg.io/".to_string(), auth("second"))]);
        assert_eq!(users(&k, "reg.io/app"), ["first", "second"]);
    }

    #[test]
    fn docker_hub_credentials_should_serve_hub_images_only() {
        let k = ring(&[("https://index.docker.io/v1/", "hub")]);
        for image in [
            "busybox",
            "busybox:1.36",
            "team/app",
            "docker.io/team/app",
            "index.docker.io/library/busybox",
        ] {
            assert_eq!(users(&k, image), ["hub"], "{image}");
        }
        assert!(users(&k, "quay.io/team/app").is_empty());
        assert!(users(&k, "localhost:5000/app").is_empty());
        // The short key matches docker.io names directly.
        let k = ring(&[("docker.io", "short")]);
        assert_eq!(users(&k, "busybox"), ["short"]);
        assert!(users(&k, "quay.io/x").is_empty());
    }

    #[test]
    fn docker_hub_credentials_should_come_only_when_nothing_else_matches() {
        let k = ring(&[("index.docker.io", "hub"), ("docker.io/team", "team")]);
        assert_eq!(users(&k, "team/app"), ["team"]);
        assert_eq!(users(&k, "other/app"), ["hub"]);
    }

    #[test]
    fn bad_locations_should_be_ignored_not_fatal() {
        let k = ring(&[("bad host", "x"), ("reg.io:http", "y"), ("reg.io", "ok")]);
        assert_eq!(users(&k, "reg.io/app"), ["ok"]);
        assert!(!k.is_empty());
        assert!(ring(&[("", "x")]).is_empty());
    }

    #[test]
    fn glob_should_follow_filepath_match() {
        for (p, t, want) in [
            ("*", "anything", true),
            ("*", "", true),
            ("a*b", "ab", true),
            ("a*b", "axxb", true),
            ("a*b", "axxc", false),
            ("?", "x", true),
            ("?", "", false),
            ("[a-c]x", "bx", true),
            ("[a-c]x", "dx", false),
            ("[^a-c]x", "dx", true),
            ("[^a-c]x", "ax", false),
            ("\\*", "*", true),
            ("\\*", "a", false),
            ("*a*a*a*a*a*a*a*a*b", &"a".repeat(60), false),
            // Malformed: match nothing.
            ("[", "[", false),
            ("[]", "x", false),
            ("[z-a]", "m", false),
            ("a\\", "a", false),
        ] {
            assert_eq!(glob_matches(p, t), want, "{p:?} vs {t:?}");
        }
    }

    #[test]
    fn debug_should_not_show_credentials() {
        let k = ring(&[("reg.io", "alice")]);
        let shown = format!("{k:?}");
        assert!(shown.contains("reg.io") && !shown.contains("alice") && !shown.contains("pw"));
    }
}
