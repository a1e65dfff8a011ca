//! Registry credentials and the `WWW-Authenticate` challenge flow (Basic,
//! and Bearer tokens from the realm the registry names).

use std::collections::HashMap;

/// Credentials for one pull, as CRI's `AuthConfig` carries them.
#[derive(Clone, Default)]
pub struct Credentials {
    /// User name for Basic auth or the token server.
    pub username: String,
    /// Password for Basic auth or the token server.
    pub password: String,
    /// An identity (refresh) token, exchanged at the token server.
    pub identity_token: String,
    /// A bearer token sent to the registry as is.
    pub registry_token: String,
}

impl std::fmt::Debug for Credentials {
    // Secrets never reach logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// Whether any credential is set.
    pub fn is_empty(&self) -> bool {
        self.username.is_empty()
            && self.password.is_empty()
            && self.identity_token.is_empty()
            && self.registry_token.is_empty()
    }

    /// `Basic <base64(user:password)>`, when a user name is set.
    pub fn basic(&self) -> Option<String> {
        (!self.username.is_empty()).then(|| {
            format!(
                "Basic {}",
                base64(format!("{}:{}", self.username, self.password).as_bytes())
            )
        })
    }
}

/// Decodes docker's `auth` field (base64 of `user:password`).
pub fn decode_auth_field(s: &str) -> Option<(String, String)> {
    let mut bits = 0u32;
    let mut nbits = 0;
    let mut out = Vec::new();
    for c in s.trim().trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    let text = String::from_utf8(out).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// A parsed `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// `Basic realm=...`.
    Basic,
    /// `Bearer realm=...,service=...,scope=...`.
    Bearer {
        /// The token endpoint.
        realm: String,
        /// The `service` parameter, if given.
        service: Option<String>,
        /// The `scope` parameter, if given.
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` value; unknown schemes give `None`.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let params = parse_params(rest);
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        }),
        _ => None,
    }
}

/// `key="value", key=value` pairs; quoted values may contain commas.
fn parse_params(s: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        if let Some(n) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek() {
                if *c == ',' {
                    break;
                }
                value.push(*c);
                chars.next();
            }
        }
        out.insert(key.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    out
}

/// Standard base64 with padding (only for the Basic header; a crate for
/// twelve lines is not worth it).
pub fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenge_should_parse_quoted_params_with_commas() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#,
        );
        assert_eq!(
            c,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".to_string(),
                service: Some("registry.docker.io".to_string()),
                scope: Some("repository:library/busybox:pull,push".to_string()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(parse_challenge("Bearer service=x"), None);
    }

    #[test]
    fn base64_should_match_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn auth_field_should_decode_to_user_and_password() {
        assert_eq!(
            decode_auth_field(&base64(b"user:pa:ss")),
            Some(("user".to_string(), "pa:ss".to_string()))
        );
        assert_eq!(decode_auth_field("dTpw"), Some(("u".into(), "p".into())));
        assert_eq!(decode_auth_field("not base64!"), None);
        assert_eq!(decode_auth_field(&base64(b"nocolon")), None);
    }

    #[test]
    fn debug_should_hide_secrets() {
        let c = Credentials {
            username: "u".into(),
            password: "hunter2".into(),
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(c.basic().as_deref(), Some("Basic dTpodW50ZXIy"));
    }
}
