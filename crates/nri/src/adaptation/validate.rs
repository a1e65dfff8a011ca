//! Validation of merged CreateContainer results: the request sent to validator plugins,
//! their verdicts, and the built-in default validator with its required-plugins check.
//!
//! The default validator fails closed: a plugin counts as present only if it took part
//! in this container's creation (its answer was merged, or the runtime recorded it as
//! consulted); one that is not running or timed out is missing.

use serde::{Deserialize, Serialize};

use super::merge::CreateResult;
use super::owners::removal_target;
use crate::api::{self, security_profile::ProfileType, Field};

/// Domain of NRI's own annotations.
pub const ANNOTATION_DOMAIN: &str = "noderesource.dev";
/// Pod annotation listing plugins that must process a container (a YAML list of plugin
/// names or `NN-name`s). Scoped forms: `<key>/container.<name>` for one container
/// (takes precedence), `<key>/pod` or the bare key for every container of the pod.
pub const REQUIRED_PLUGINS_ANNOTATION: &str = "required-plugins.noderesource.dev";

/// The value of a pod annotation as it applies to one container: the
/// `key/container.<name>` form first, then `key/pod`, then `key`.
pub fn effective_annotation<'a>(
    pod: Option<&'a api::PodSandbox>,
    key: &str,
    container: &str,
) -> Option<&'a str> {
    let annotations = &pod?.annotations;
    [
        format!("{key}/container.{container}"),
        format!("{key}/pod"),
        key.to_string(),
    ]
    .iter()
    .find_map(|k| annotations.get(k))
    .map(String::as_str)
}

impl CreateResult {
    /// The ValidateContainerAdjustment request for validator plugins: the pod, the
    /// container before adjustment, the merged adjustment and updates, the owners and
    /// the plugins that took part.
    pub fn validation_request(&self) -> api::ValidateContainerAdjustmentRequest {
        api::ValidateContainerAdjustmentRequest {
            pod: self.pod.clone(),
            container: Some(self.original.clone()),
            adjust: Some(self.adjust.clone()),
            update: self.updates.clone(),
            owners: Some(self.owners.clone()),
            plugins: self.plugins.clone(),
        }
    }
}

/// Why a container adjustment was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// A validator plugin rejected the adjustment.
    #[error("validator {validator:?} rejected the container adjustment: {reason}")]
    Rejected {
        /// Qualified name of the validator.
        validator: String,
        /// Its reason.
        reason: String,
    },
    /// OCI hooks were injected while that is refused.
    #[error("OCI hook injection by plugin(s) {plugins} is not allowed")]
    OciHooks {
        /// The injecting plugins, comma-separated.
        plugins: String,
    },
    /// A seccomp policy was adjusted while that is refused for the container's profile.
    #[error("plugin {plugin:?} may not adjust the seccomp policy of a container with a {profile} profile")]
    Seccomp {
        /// The plugin.
        plugin: String,
        /// "runtime default", "unconfined" or "custom (localhost)".
        profile: &'static str,
    },
    /// Namespaces were adjusted while that is refused.
    #[error("namespace adjustment is not allowed: {}", list_pairs(.adjusted, "namespace"))]
    Namespace {
        /// (plugin, namespace type) pairs.
        adjusted: Vec<(String, String)>,
    },
    /// Sysctls were adjusted while that is refused.
    #[error("sysctl adjustment is not allowed: {}", list_pairs(.adjusted, "sysctl"))]
    Sysctl {
        /// (plugin, sysctl key) pairs.
        adjusted: Vec<(String, String)>,
    },
    /// Required plugins did not take part.
    #[error("required plugin(s) {} did not process the container (not running or timed out)", quoted(.missing))]
    MissingPlugins {
        /// The missing plugins as they were required.
        missing: Vec<String>,
    },
    /// An NRI annotation could not be parsed.
    #[error("invalid {key} annotation {value:?}: {reason}")]
    BadAnnotation {
        /// The annotation key.
        key: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

fn list_pairs(pairs: &[(String, String)], what: &str) -> String {
    pairs
        .iter()
        .map(|(p, k)| format!("plugin {p:?} ({what} {k:?})"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A validator plugin's verdict as a result.
pub fn check_verdict(
    validator: &str,
    response: &api::ValidateContainerAdjustmentResponse,
) -> Result<(), ValidationError> {
    if !response.reject {
        return Ok(());
    }
    let reason = if response.reason.is_empty() {
        "no reason given".to_string()
    } else {
        response.reason.clone()
    };
    Err(ValidationError::Rejected {
        validator: validator.to_string(),
        reason,
    })
}

/// Configuration of the built-in default validator (the runtime's
/// `[nri.default_validator]` section; option names as containerd's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefaultValidatorConfig {
    /// Run the default validator at all.
    pub enable: bool,
    /// Refuse any OCI hook injection.
    pub reject_oci_hook_adjustment: bool,
    /// Refuse seccomp policy changes of containers with the runtime's default profile.
    pub reject_runtime_default_seccomp_adjustment: bool,
    /// Refuse seccomp policy changes of unconfined containers (or without a profile).
    pub reject_unconfined_seccomp_adjustment: bool,
    /// Refuse seccomp policy changes of containers with a custom (localhost) profile.
    pub reject_custom_seccomp_adjustment: bool,
    /// Refuse any namespace adjustment.
    pub reject_namespace_adjustment: bool,
    /// Refuse any sysctl adjustment.
    pub reject_sysctl_adjustment: bool,
    /// Plugins every container needs (names or `NN-name`s). Pods that must run without
    /// them (static pods) need the toleration annotation.
    pub required_plugins: Vec<String>,
    /// Pod annotation key which, set to true (pod- or container-scoped like the
    /// required-plugins annotation), lets a container run without required plugins.
    /// Empty: no toleration.
    pub tolerate_missing_plugins_annotation: String,
}

/// The built-in validator.
#[derive(Debug, Clone)]
pub struct DefaultValidator {
    cfg: DefaultValidatorConfig,
}

/// Go's `strconv.ParseBool`, which containerd uses for the toleration annotation.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

impl DefaultValidator {
    /// The validator, or None if the configuration does not enable it.
    pub fn from_config(cfg: DefaultValidatorConfig) -> Option<Self> {
        cfg.enable.then_some(DefaultValidator { cfg })
    }

    /// The configuration in use.
    pub fn config(&self) -> &DefaultValidatorConfig {
        &self.cfg
    }

    /// Checks one request; the first refusal found is returned.
    pub fn validate(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), ValidationError> {
        let id = req.container.as_ref().map_or("", |c| c.id.as_str());
        let owners = req.owners.as_ref().and_then(|o| o.container(id));
        if req.adjust.is_some() {
            if let Some(owners) = owners {
                self.check_hooks(owners)?;
                self.check_seccomp(req, owners)?;
                self.check_namespaces(owners)?;
                self.check_sysctls(owners)?;
            }
        }
        self.check_required_plugins(req)
    }

    fn check_hooks(&self, owners: &api::FieldOwners) -> Result<(), ValidationError> {
        match owners.simple_owner(Field::OciHooks) {
            Some(plugins) if self.cfg.reject_oci_hook_adjustment && !plugins.is_empty() => {
                Err(ValidationError::OciHooks {
                    plugins: plugins.to_string(),
                })
            }
            _ => Ok(()),
        }
    }

    fn check_seccomp(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
        owners: &api::FieldOwners,
    ) -> Result<(), ValidationError> {
        let Some(plugin) = owners.simple_owner(Field::SeccompPolicy) else {
            return Ok(());
        };
        let profile = req
            .container
            .as_ref()
            .and_then(|c| c.linux.as_ref())
            .and_then(|l| l.seccomp_profile.as_ref())
            .map(|p| ProfileType::try_from(p.profile_type).unwrap_or(ProfileType::Unconfined));
        let (refused, name) = match profile {
            None | Some(ProfileType::Unconfined) => {
                (self.cfg.reject_unconfined_seccomp_adjustment, "unconfined")
            }
            Some(ProfileType::RuntimeDefault) => (
                self.cfg.reject_runtime_default_seccomp_adjustment,
                "runtime default",
            ),
            Some(ProfileType::Localhost) => (
                self.cfg.reject_custom_seccomp_adjustment,
                "custom (localhost)",
            ),
        };
        if refused {
            return Err(ValidationError::Seccomp {
                plugin: plugin.to_string(),
                profile: name,
            });
        }
        Ok(())
    }

    fn owned_entries(owners: &api::FieldOwners, field: Field) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = owners
            .compound_owners(field)
            .map(|m| {
                m.iter()
                    .map(|(k, p)| (removal_target(p).unwrap_or(p).to_string(), k.clone()))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn check_namespaces(&self, owners: &api::FieldOwners) -> Result<(), ValidationError> {
        if !self.cfg.reject_namespace_adjustment {
            return Ok(());
        }
        let adjusted = Self::owned_entries(owners, Field::Namespace);
        if adjusted.is_empty() {
            return Ok(());
        }
        Err(ValidationError::Namespace { adjusted })
    }

    fn check_sysctls(&self, owners: &api::FieldOwners) -> Result<(), ValidationError> {
        if !self.cfg.reject_sysctl_adjustment {
            return Ok(());
        }
        let adjusted = Self::owned_entries(owners, Field::Sysctl);
        if adjusted.is_empty() {
            return Ok(());
        }
        Err(ValidationError::Sysctl { adjusted })
    }

    fn check_required_plugins(
        &self,
        req: &api::ValidateContainerAdjustmentRequest,
    ) -> Result<(), ValidationError> {
        let container = req.container.as_ref().map_or("", |c| c.name.as_str());
        let pod = req.pod.as_ref();
        let tolerate_key = &self.cfg.tolerate_missing_plugins_annotation;
        if !tolerate_key.is_empty() {
            if let Some(value) = effective_annotation(pod, tolerate_key, container) {
                match parse_bool(value) {
                    Some(true) => return Ok(()),
                    Some(false) => {}
                    None => {
                        return Err(ValidationError::BadAnnotation {
                            key: tolerate_key.clone(),
                            value: value.to_string(),
                            reason: "not a boolean".to_string(),
                        })
                    }
                }
            }
        }
        let mut required = self.cfg.required_plugins.clone();
        if let Some(value) = effective_annotation(pod, REQUIRED_PLUGINS_ANNOTATION, container) {
            let listed: Vec<String> =
                serde_yaml::from_str(value).map_err(|e| ValidationError::BadAnnotation {
                    key: REQUIRED_PLUGINS_ANNOTATION.to_string(),
                    value: value.to_string(),
                    reason: format!("not a YAML list of plugin names: {e}"),
                })?;
            required.extend(listed);
        }
        let present = |r: &str| {
            req.plugins
                .iter()
                .any(|p| p.name == r || format!("{}-{}", p.index, p.name) == r)
        };
        let mut missing: Vec<String> = required.into_iter().filter(|r| !present(r)).collect();
        missing.dedup();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(ValidationError::MissingPlugins { missing })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
#[path = "validate_tests.rs"]
mod tests;
