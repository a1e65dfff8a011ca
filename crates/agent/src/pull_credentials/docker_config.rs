//! Registry credentials out of a pull secret: the two Secret types kubelet
//! reads, `kubernetes.io/dockerconfigjson` (key `.dockerconfigjson`, the
//! docker CLI's `config.json`: `{"auths": {<registry>: <entry>}}`) and
//! the legacy `kubernetes.io/dockercfg` (key `.dockercfg`: the
//! `{<registry>: <entry>}` map itself).
//!
//! An entry has `username` and `password`, or `auth` (base64 of
//! `user:password`, which then wins, as in kubelet), and may carry docker's
//! `identitytoken` and `registrytoken`. Field names match whatever their
//! case, as Go's JSON decoding does; unknown fields are ignored.
//!
//! Errors never quote the secret's content: serde's messages can echo a
//! value, so only the position of a JSON error is given.

use k8s_openapi::api::core::v1::Secret;
use petrel_cri::api::AuthConfig;
use serde_json::{Map, Value};

/// The type of a secret holding a docker `config.json`.
pub const TYPE_DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// Its data key.
pub const KEY_DOCKER_CONFIG_JSON: &str = ".dockerconfigjson";
/// The type of a secret holding a legacy `.dockercfg`.
pub const TYPE_DOCKERCFG: &str = "kubernetes.io/dockercfg";
/// Its data key.
pub const KEY_DOCKERCFG: &str = ".dockercfg";

/// A pull secret that cannot be read as registry credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pull secret {namespace}/{name}: key {key}: {reason}")]
pub struct DockerConfigError {
    /// The secret's namespace.
    pub namespace: String,
    /// The secret's name.
    pub name: String,
    /// The data key read.
    pub key: &'static str,
    /// What is wrong, without any of the secret's content.
    pub reason: String,
}

/// The registry credentials of `secret`, each with the registry key it
/// is for (the order does not matter: the keyring sorts). `Ok(None)` for a secret
/// kubelet does not read as credentials: another type, or the type's key
/// missing or empty.
pub fn parse_secret(
    secret: &Secret,
) -> Result<Option<Vec<(String, AuthConfig)>>, DockerConfigError> {
    let (key, nested) = match secret.type_.as_deref() {
        Some(TYPE_DOCKER_CONFIG_JSON) => (KEY_DOCKER_CONFIG_JSON, true),
        Some(TYPE_DOCKERCFG) => (KEY_DOCKERCFG, false),
        _ => return Ok(None),
    };
    let Some(bytes) = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .filter(|b| !b.0.is_empty())
    else {
        return Ok(None);
    };
    let fail = |reason: String| DockerConfigError {
        namespace: secret.metadata.namespace.clone().unwrap_or_default(),
        name: secret.metadata.name.clone().unwrap_or_default(),
        key,
        reason,
    };
    parse_config(&bytes.0, nested).map(Some).map_err(fail)
}

/// Parses a `config.json` (`nested`: credentials under `auths`) or a
/// `.dockercfg`.
pub fn parse_config(bytes: &[u8], nested: bool) -> Result<Vec<(String, AuthConfig)>, String> {
    let doc: Value = serde_json::from_slice(bytes).map_err(describe_json_error)?;
    let auths = if nested {
        match field(object(&doc, "the document")?, "auths") {
            None | Some(Value::Null) => return Ok(Vec::new()),
            Some(v) => object(v, "auths")?,
        }
    } else {
        object(&doc, "the document")?
    };
    auths
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(registry, entry)| Ok((registry.clone(), parse_entry(registry, entry)?)))
        .collect()
}

/// One registry's entry.
fn parse_entry(registry: &str, entry: &Value) -> Result<AuthConfig, String> {
    let entry = object(entry, &format!("the entry of {registry}"))?;
    let text = |name: &str| -> Result<String, String> {
        match field(entry, name) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(format!("{name} of {registry} is not a string")),
        }
    };
    let mut auth = AuthConfig {
        username: text("username")?,
        password: text("password")?,
        identity_token: text("identitytoken")?,
        registry_token: text("registrytoken")?,
        ..Default::default()
    };
    let field_auth = text("auth")?;
    if !field_auth.is_empty() {
        let (user, password) =
            decode_auth(&field_auth).map_err(|why| format!("auth of {registry} {why}"))?;
        auth.username = user;
        auth.password = password;
    }
    Ok(auth)
}

/// `base64(user:password)` → (user, password).
fn decode_auth(field: &str) -> Result<(String, String), &'static str> {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(field)
        .map_err(|_| "is not base64")?;
    let text = String::from_utf8(raw).map_err(|_| "is not UTF-8 text")?;
    let (user, password) = text.split_once(':').ok_or("is not user:password")?;
    Ok((user.to_string(), password.to_string()))
}

/// The member `name` of `obj`, its name matched whatever its case (an
/// exact match first).
fn field<'a>(obj: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn object<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, String> {
    v.as_object()
        .ok_or_else(|| format!("{what} is not a JSON object"))
}

/// A JSON error by kind and position only (serde's message may quote the
/// value it choked on).
fn describe_json_error(e: serde_json::Error) -> String {
    use serde_json::error::Category;
    let kind = match e.classify() {
        Category::Io => "unreadable",
        Category::Syntax => "malformed JSON",
        Category::Data => "unexpected JSON",
        Category::Eof => "truncated JSON",
    };
    format!("{kind} at line {} column {}", e.line(), e.column())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    pub(crate) fn secret(name: &str, type_: &str, key: &str, body: &str) -> Secret {
        Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team".into()),
                ..Default::default()
            },
            type_: Some(type_.into()),
            data: Some(BTreeMap::from([(
                key.to_string(),
                ByteString(body.as_bytes().to_vec()),
            )])),
            ..Default::default()
        }
    }

    fn json_secret(body: &str) -> Secret {
        secret(
            "regcred",
            TYPE_DOCKER_CONFIG_JSON,
            KEY_DOCKER_CONFIG_JSON,
            body,
        )
    }

    #[test]
    fn dockerconfigjson_should_give_each_registrys_credentials() {
        let s = json_secret(
            r#"{"auths":{"reg.example.com":{"username":"u","password":"p"},
                "other.example.com:5000":{"auth":"YWxpY2U6czNjcjN0Og=="}}}"#,
        );
        let got: BTreeMap<String, AuthConfig> =
            parse_secret(&s).unwrap().unwrap().into_iter().collect();
        assert_eq!(got.len(), 2);
        // A password may hold colons.
        let other = &got["other.example.com:5000"];
        assert_eq!(
            (other.username.as_str(), other.password.as_str()),
            ("alice", "s3cr3t:")
        );
        let reg = &got["reg.example.com"];
        assert_eq!((reg.username.as_str(), reg.password.as_str()), ("u", "p"));
        // The server address stays empty, as kubelet sends it: containerd
        // drops credentials whose address is not a URL of the host pulled.
        assert!(got.iter().all(|(_, a)| a.server_address.is_empty()));
    }

    #[test]
    fn auth_field_should_override_username_and_password() {
        let s = json_secret(r#"{"auths":{"r.io":{"username":"x","password":"y","auth":"dTpw"}}}"#);
        let got = parse_secret(&s).unwrap().unwrap();
        assert_eq!(
            (got[0].1.username.as_str(), got[0].1.password.as_str()),
            ("u", "p")
        );
    }

    #[test]
    fn tokens_and_field_case_should_be_read_as_docker_and_go_do() {
        let s = json_secret(
            r#"{"Auths":{"r.io":{"Username":"u","identitytoken":"id-tok","RegistryToken":"bearer","email":"e@x"}}}"#,
        );
        let got = parse_secret(&s).unwrap().unwrap();
        assert_eq!(got[0].1.username, "u");
        assert_eq!(got[0].1.identity_token, "id-tok");
        assert_eq!(got[0].1.registry_token, "bearer");
    }

    #[test]
    fn legacy_dockercfg_should_be_the_map_itself() {
        let s = secret(
            "old",
            TYPE_DOCKERCFG,
            KEY_DOCKERCFG,
            r#"{"https://index.docker.io/v1/":{"auth":"dTpw","email":"e@x"}}"#,
        );
        let got = parse_secret(&s).unwrap().unwrap();
        assert_eq!(got[0].0, "https://index.docker.io/v1/");
        assert_eq!(got[0].1.username, "u");
    }

    #[test]
    fn other_types_and_missing_or_empty_keys_should_be_no_credentials() {
        let opaque = secret("o", "Opaque", KEY_DOCKER_CONFIG_JSON, r#"{"auths":{}}"#);
        assert_eq!(parse_secret(&opaque).unwrap(), None);
        // The type's key, not the other type's.
        let wrong_key = secret("w", TYPE_DOCKER_CONFIG_JSON, KEY_DOCKERCFG, r#"{}"#);
        assert_eq!(parse_secret(&wrong_key).unwrap(), None);
        let empty = secret("e", TYPE_DOCKER_CONFIG_JSON, KEY_DOCKER_CONFIG_JSON, "");
        assert_eq!(parse_secret(&empty).unwrap(), None);
        let no_data = Secret {
            type_: Some(TYPE_DOCKERCFG.into()),
            ..Default::default()
        };
        assert_eq!(parse_secret(&no_data).unwrap(), None);
        // A document without auths holds no credentials, but is fine.
        assert_eq!(
            parse_secret(&json_secret(r#"{"HttpHeaders":{}}"#)).unwrap(),
            Some(vec![])
        );
        assert_eq!(
            parse_secret(&json_secret(r#"{"auths":null}"#)).unwrap(),
            Some(vec![])
        );
    }

    #[test]
    fn malformed_secrets_should_fail_naming_secret_and_key_but_no_content() {
        let cases = [
            (
                r#"{"auths":{"r.io":{"password":"hunter2""#,
                "truncated JSON",
            ),
            (r#"{"auths": hunter2}"#, "malformed JSON"),
            (r#"["hunter2"]"#, "the document is not a JSON object"),
            (r#"{"auths":["hunter2"]}"#, "auths is not a JSON object"),
            (
                r#"{"auths":{"r.io":"hunter2"}}"#,
                "the entry of r.io is not a JSON object",
            ),
            (
                r#"{"auths":{"r.io":{"password":12345}}}"#,
                "password of r.io is not a string",
            ),
            (
                r#"{"auths":{"r.io":{"auth":"hunter2!"}}}"#,
                "auth of r.io is not base64",
            ),
            (
                r#"{"auths":{"r.io":{"auth":"aHVudGVyMg=="}}}"#,
                "auth of r.io is not user:password",
            ),
            (
                r#"{"auths":{"r.io":{"auth":"/w=="}}}"#,
                "auth of r.io is not UTF-8 text",
            ),
        ];
        for (body, want) in cases {
            let e = parse_secret(&json_secret(body)).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.starts_with("pull secret team/regcred: key .dockerconfigjson: "),
                "{msg}"
            );
            assert!(msg.contains(want), "{body}: {msg}");
            assert!(!msg.contains("hunter2") && !msg.contains("12345"), "{msg}");
        }
    }

    #[test]
    fn arbitrary_bytes_should_never_panic() {
        for body in [
            &b"\xff\xfe"[..],
            b"{",
            b"null",
            b"\"x\"",
            b"{\"auths\":{\"\":{}}}",
        ] {
            let s = secret("x", TYPE_DOCKER_CONFIG_JSON, KEY_DOCKER_CONFIG_JSON, "");
            let mut s = s;
            s.data = Some(BTreeMap::from([(
                KEY_DOCKER_CONFIG_JSON.to_string(),
                ByteString(body.to_vec()),
            )]));
            let _ = parse_secret(&s);
        }
    }
}
