//! Image pull credentials from a pod's `imagePullSecrets`, used as kubelet
//! uses them.
//!
//! For each pull, the pod's pull secrets are read (in cluster mode, from
//! the API server with the node's credentials, through
//! [`SecretReader`]); those of type `kubernetes.io/dockerconfigjson` or
//! `kubernetes.io/dockercfg` fill a [`Keyring`], which gives the
//! credentials matching the image's registry, most specific first. Each
//! is tried in turn until a pull succeeds; when none match, the image is
//! pulled without credentials (and the runtime may use its own). As in
//! kubelet, there is no anonymous attempt after matching credentials all
//! failed, a secret that cannot be read is logged and left out, and a
//! secret that is malformed fails the pull.
//!
//! - [`docker_config`]: a secret's content as registry credentials (pure);
//! - [`keyring`]: matching registry keys to an image (pure).

pub mod docker_config;
pub mod keyring;

use std::future::Future;

use k8s_openapi::api::core::v1::{Pod, Secret};
use petrel_cri::api::AuthConfig;

pub use docker_config::DockerConfigError;
pub use keyring::Keyring;

use crate::cri::{CriError, CriResult};

/// Where a pod's pull secrets are read from.
#[async_trait::async_trait]
pub trait SecretReader: Send + Sync + 'static {
    /// The secret `namespace/name`, or why it cannot be had (not found,
    /// forbidden, unreachable). The reason is logged: it must not hold
    /// the secret's content.
    async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, String>;
}

/// Why a pull with the pod's credentials failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// A pull secret is malformed: nothing was pulled.
    #[error(transparent)]
    Secret(#[from] DockerConfigError),
    /// Every attempt failed: without credentials (one error), or with each
    /// credential that matched (one error each, in order).
    #[error("{}", aggregate(.0))]
    Runtime(Vec<CriError>),
}

/// The runtime's messages as kubelet aggregates errors: one message as
/// is, several distinct ones as `[first, second]`.
fn aggregate(errors: &[CriError]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errors {
        if !seen.contains(&e.message.as_str()) {
            seen.push(&e.message);
        }
    }
    match seen.as_slice() {
        [one] => (*one).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// The keyring of `pod`'s pull secrets read with `reader`. A secret that
/// cannot be read is logged and left out (the pull may still work, as
/// kubelet hopes); a malformed one is an error.
pub async fn pod_keyring(
    reader: &dyn SecretReader,
    pod: &Pod,
) -> Result<Keyring, DockerConfigError> {
    let mut ring = Keyring::default();
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let refs = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.as_ref())
        .into_iter()
        .flatten();
    for r in refs {
        // The API allows references without a name: nothing to read.
        if r.name.is_empty() {
            continue;
        }
        match reader.secret(namespace, &r.name).await {
            Ok(secret) => {
                if let Some(entries) = docker_config::parse_secret(&secret)? {
                    ring.add(entries);
                }
            }
            Err(error) => {
                tracing::warn!(
                    pod = %format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or_default()),
                    secret = %r.name,
                    %error,
                    "unable to retrieve pull secret, the image pull may not succeed"
                );
            }
        }
    }
    Ok(ring)
}

/// Pulls with each of `creds` in turn until one works; with none, once
/// without credentials. `pull` makes one attempt.
pub async fn pull_in_turn<F, Fut>(creds: Vec<AuthConfig>, mut pull: F) -> Result<String, PullError>
where
    F: FnMut(Option<AuthConfig>) -> Fut,
    Fut: Future<Output = CriResult<String>>,
{
    if creds.is_empty() {
        return pull(None).await.map_err(|e| PullError::Runtime(vec![e]));
    }
    let mut errors = Vec::new();
    for auth in creds {
        match pull(Some(auth)).await {
            Ok(image_ref) => return Ok(image_ref),
            Err(e) => errors.push(e),
        }
    }
    Err(PullError::Runtime(errors))
}

/// Pulls `image` for `pod` as kubelet does: with the credentials its pull
/// secrets hold for the image's registry (read with `reader`; none
/// without one), tried in turn, else without credentials. `pull` makes
/// one attempt.
pub async fn pull_for_pod<F, Fut>(
    reader: Option<&dyn SecretReader>,
    pod: &Pod,
    image: &str,
    pull: F,
) -> Result<String, PullError>
where
    F: FnMut(Option<AuthConfig>) -> Fut,
    Fut: Future<Output = CriResult<String>>,
{
    let creds = match reader {
        Some(reader) => pod_keyring(reader, pod).await?.lookup(image),
        None => Vec::new(),
    };
    pull_in_turn(creds, pull).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Mutex;

    use k8s_openapi::api::core::v1::{LocalObjectReference, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::ByteString;

    use super::docker_config::{KEY_DOCKER_CONFIG_JSON, TYPE_DOCKER_CONFIG_JSON};
    use super::*;

    /// Secrets by `namespace/name`; every read recorded.
    #[derive(Default)]
    struct FakeSecrets {
        secrets: HashMap<String, Secret>,
        reads: Mutex<Vec<String>>,
    }

    impl FakeSecrets {
        fn with(mut self, ns: &str, name: &str, body: &str) -> Self {
            let s = Secret {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some(ns.into()),
                    ..Default::default()
                },
                type_: Some(TYPE_DOCKER_CONFIG_JSON.into()),
                data: Some(BTreeMap::from([(
                    KEY_DOCKER_CONFIG_JSON.to_string(),
                    ByteString(body.as_bytes().to_vec()),
                )])),
                ..Default::default()
            };
            self.secrets.insert(format!("{ns}/{name}"), s);
            self
        }
    }

    #[async_trait::async_trait]
    impl SecretReader for FakeSecrets {
        async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, String> {
            let key = format!("{namespace}/{name}");
            self.reads.lock().unwrap().push(key.clone());
            self.secrets
                .get(&key)
                .cloned()
                .ok_or_else(|| format!("secrets \"{name}\" not found"))
        }
    }

    fn pod(secrets: &[&str]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("team".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                image_pull_secrets: Some(
                    secrets
                        .iter()
                        .map(|n| LocalObjectReference {
                            name: n.to_string(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn creds(user: &str, password: &str) -> String {
        format!(r#"{{"auths":{{"reg.io:5000":{{"username":"{user}","password":"{password}"}}}}}}"#)
    }

    fn denied(message: &str) -> CriError {
        CriError {
            operation: "pull_image",
            code: tonic::Code::PermissionDenied,
            message: message.into(),
        }
    }

    /// A registry that accepts `good` only: records each attempt's user
    /// (`-` without credentials).
    fn registry<'a>(
        good: &'static str,
        attempts: &'a Mutex<Vec<String>>,
    ) -> impl FnMut(Option<AuthConfig>) -> std::future::Ready<CriResult<String>> + 'a {
        move |auth| {
            let user = auth
                .as_ref()
                .map_or("-".to_string(), |a| a.username.clone());
            attempts.lock().unwrap().push(user.clone());
            std::future::ready(if user == good {
                Ok("sha256:img".into())
            } else {
                Err(denied(&format!("401 Unauthorized for {user}")))
            })
        }
    }

    #[tokio::test]
    async fn pull_should_try_each_matching_credential_until_one_works() {
        let secrets = FakeSecrets::default()
            .with("team", "old", &creds("old", "expired"))
            .with("team", "new", &creds("new", "ok"));
        let attempts = Mutex::new(Vec::new());
        let got = pull_for_pod(
            Some(&secrets),
            &pod(&["old", "new"]),
            "reg.io:5000/app:1",
            registry("new", &attempts),
        )
        .await
        .unwrap();
        assert_eq!(got, "sha256:img");
        assert_eq!(*attempts.lock().unwrap(), ["old", "new"]);
        assert_eq!(*secrets.reads.lock().unwrap(), ["team/old", "team/new"]);
    }

    #[tokio::test]
    async fn pull_should_not_fall_back_to_anonymous_after_credentials_failed() {
        let secrets = FakeSecrets::default()
            .with("team", "a", &creds("a", "x"))
            .with("team", "b", &creds("b", "y"));
        let attempts = Mutex::new(Vec::new());
        let err = pull_for_pod(
            Some(&secrets),
            &pod(&["a", "b"]),
            "reg.io:5000/app",
            registry("-", &attempts),
        )
        .await
        .unwrap_err();
        assert_eq!(*attempts.lock().unwrap(), ["a", "b"]);
        assert_eq!(
            err.to_string(),
            "[401 Unauthorized for a, 401 Unauthorized for b]"
        );
    }

    #[tokio::test]
    async fn pull_should_go_without_credentials_when_none_match() {
        let secrets = FakeSecrets::default().with("team", "a", &creds("a", "x"));
        let attempts = Mutex::new(Vec::new());
        let err = pull_for_pod(
            Some(&secrets),
            &pod(&["a"]),
            "other.io/app",
            registry("a", &attempts),
        )
        .await
        .unwrap_err();
        assert_eq!(*attempts.lock().unwrap(), ["-"]);
        // One failure: the runtime's message as is.
        assert_eq!(err.to_string(), "401 Unauthorized for -");
        // Without a reader (no API server) or without secrets: the same.
        let attempts = Mutex::new(Vec::new());
        pull_for_pod(
            None,
            &pod(&["a"]),
            "reg.io:5000/app",
            registry("-", &attempts),
        )
        .await
        .unwrap();
        pull_for_pod(
            Some(&secrets),
            &pod(&[]),
            "reg.io:5000/app",
            registry("-", &attempts),
        )
        .await
        .unwrap();
        assert_eq!(*attempts.lock().unwrap(), ["-", "-"]);
    }

    #[tokio::test]
    async fn a_missing_secret_should_be_skipped_and_the_rest_used() {
        let secrets = FakeSecrets::default().with("team", "there", &creds("there", "ok"));
        let attempts = Mutex::new(Vec::new());
        pull_for_pod(
            Some(&secrets),
            &pod(&["gone", "", "there"]),
            "reg.io:5000/app",
            registry("there", &attempts),
        )
        .await
        .unwrap();
        assert_eq!(*attempts.lock().unwrap(), ["there"]);
        // The empty name is not read.
        assert_eq!(*secrets.reads.lock().unwrap(), ["team/gone", "team/there"]);
        // Only missing ones: pulled without credentials, the registry's
        // answer is the message.
        let attempts = Mutex::new(Vec::new());
        let err = pull_for_pod(
            Some(&secrets),
            &pod(&["gone"]),
            "reg.io:5000/app",
            registry("x", &attempts),
        )
        .await
        .unwrap_err();
        assert_eq!(*attempts.lock().unwrap(), ["-"]);
        assert_eq!(err.to_string(), "401 Unauthorized for -");
    }

    #[tokio::test]
    async fn a_malformed_secret_should_fail_the_pull_naming_it() {
        let secrets = FakeSecrets::default()
            .with("team", "good", &creds("good", "ok"))
            .with(
                "team",
                "broken",
                r#"{"auths":{"reg.io:5000":{"auth":"not base64!"}}}"#,
            );
        let attempts = Mutex::new(Vec::new());
        let err = pull_for_pod(
            Some(&secrets),
            &pod(&["good", "broken"]),
            "reg.io:5000/app",
            registry("good", &attempts),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, PullError::Secret(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "pull secret team/broken: key .dockerconfigjson: auth of reg.io:5000 is not base64"
        );
        assert!(attempts.lock().unwrap().is_empty());
    }

    #[test]
    fn aggregate_should_drop_repeated_messages() {
        let e = PullError::Runtime(vec![denied("same"), denied("same")]);
        assert_eq!(e.to_string(), "same");
    }
}
