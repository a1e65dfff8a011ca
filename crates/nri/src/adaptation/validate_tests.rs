//! Unit tests of validation requests and the default validator.

use std::collections::HashMap;

use super::*;
use crate::adaptation::merge::CreateMerger;
use crate::api;

fn plugin(index: &str, name: &str) -> api::PluginInstance {
    api::PluginInstance {
        name: name.to_string(),
        index: index.to_string(),
    }
}

fn request(
    pod_annotations: &[(&str, &str)],
    profile: Option<ProfileType>,
) -> api::CreateContainerRequest {
    api::CreateContainerRequest {
        pod: Some(api::PodSandbox {
            id: "pod1".into(),
            annotations: pod_annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }),
        container: Some(api::Container {
            id: "c1".into(),
            name: "ctr".into(),
            linux: Some(api::LinuxContainer {
                seccomp_profile: profile.map(|p| api::SecurityProfile {
                    profile_type: p as i32,
                    localhost_ref: String::new(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn adjusting(f: impl FnOnce(&mut api::ContainerAdjustment)) -> api::CreateContainerResponse {
    let mut adjust = api::ContainerAdjustment::default();
    f(&mut adjust);
    api::CreateContainerResponse {
        adjust: Some(adjust),
        ..Default::default()
    }
}

/// Runs plugin `10-a` with `response` and returns the validation request.
fn validation(
    req: api::CreateContainerRequest,
    response: api::CreateContainerResponse,
) -> api::ValidateContainerAdjustmentRequest {
    let mut m = CreateMerger::new(req);
    m.apply(&plugin("10", "a"), response).expect("merge");
    m.finish().validation_request()
}

fn enabled(f: impl FnOnce(&mut DefaultValidatorConfig)) -> DefaultValidator {
    let mut cfg = DefaultValidatorConfig {
        enable: true,
        ..Default::default()
    };
    f(&mut cfg);
    DefaultValidator::from_config(cfg).expect("enabled")
}

fn hook_response() -> api::CreateContainerResponse {
    adjusting(|adj| {
        adj.hooks = Some(api::Hooks {
            prestart: vec![api::Hook {
                path: "/bin/true".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
    })
}

#[test]
fn validation_request_carries_original_container_owners_and_plugins() {
    let mut m = CreateMerger::new(request(&[], None));
    m.note_plugin(&plugin("05", "observer"));
    m.apply(
        &plugin("10", "a"),
        adjusting(|adj| {
            adj.annotations.insert("x".into(), "1".into());
        }),
    )
    .expect("merge");
    let req = m.finish().validation_request();
    let c = req.container.as_ref().expect("container");
    assert!(
        c.annotations.is_empty(),
        "validators see the unadjusted container"
    );
    assert_eq!(
        req.adjust.as_ref().and_then(|a| a.annotations.get("x")),
        Some(&"1".to_string())
    );
    assert_eq!(
        req.owners
            .as_ref()
            .and_then(|o| o.container("c1"))
            .and_then(|o| o.compound_owner(api::Field::Annotations, "x")),
        Some("10-a")
    );
    assert_eq!(
        req.plugins,
        vec![plugin("05", "observer"), plugin("10", "a")]
    );
    assert_eq!(req.pod.as_ref().map(|p| p.id.as_str()), Some("pod1"));
}

#[test]
fn disabled_validator_is_not_built() {
    assert!(DefaultValidator::from_config(DefaultValidatorConfig::default()).is_none());
}

#[test]
fn oci_hooks_refused_only_when_configured() {
    let req = validation(request(&[], None), hook_response());
    enabled(|_| {}).validate(&req).expect("allowed by default");
    let err = enabled(|c| c.reject_oci_hook_adjustment = true)
        .validate(&req)
        .expect_err("refused");
    assert_eq!(
        err,
        ValidationError::OciHooks {
            plugins: "10-a".into()
        }
    );
    assert!(err.to_string().contains("10-a"));
}

fn seccomp_response() -> api::CreateContainerResponse {
    adjusting(|adj| {
        adj.linux = Some(api::LinuxContainerAdjustment {
            seccomp_policy: Some(api::LinuxSeccomp {
                default_action: "SCMP_ACT_ALLOW".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
    })
}

#[test]
fn seccomp_refusal_follows_the_container_profile() {
    type Opt = fn(&mut DefaultValidatorConfig);
    let cases: [(Option<ProfileType>, Opt, &str); 4] = [
        (
            None,
            |c| c.reject_unconfined_seccomp_adjustment = true,
            "unconfined",
        ),
        (
            Some(ProfileType::Unconfined),
            |c| c.reject_unconfined_seccomp_adjustment = true,
            "unconfined",
        ),
        (
            Some(ProfileType::RuntimeDefault),
            |c| c.reject_runtime_default_seccomp_adjustment = true,
            "runtime default",
        ),
        (
            Some(ProfileType::Localhost),
            |c| c.reject_custom_seccomp_adjustment = true,
            "custom (localhost)",
        ),
    ];
    // Every option except those for the profile of case `skip`.
    let all_but = |skip: usize| {
        move |c: &mut DefaultValidatorConfig| {
            for (_, opt, name) in cases.iter() {
                if *name != cases[skip].2 {
                    opt(c);
                }
            }
        }
    };
    for (i, (profile, opt, name)) in cases.iter().enumerate() {
        let req = validation(request(&[], *profile), seccomp_response());
        let err = enabled(*opt).validate(&req).expect_err("refused");
        assert_eq!(
            err,
            ValidationError::Seccomp {
                plugin: "10-a".into(),
                profile: name,
            }
        );
        // The options for the other profiles do not refuse this one.
        enabled(all_but(i)).validate(&req).expect("other options");
    }
}

#[test]
fn namespace_and_sysctl_refusals() {
    let req = validation(
        request(&[], None),
        adjusting(|adj| {
            adj.linux = Some(api::LinuxContainerAdjustment {
                namespaces: vec![api::LinuxNamespace {
                    r#type: "network".into(),
                    path: "/proc/1/ns/net".into(),
                }],
                sysctl: HashMap::from([("net.core.somaxconn".to_string(), "1024".to_string())]),
                ..Default::default()
            })
        }),
    );
    enabled(|_| {}).validate(&req).expect("allowed by default");
    let err = enabled(|c| c.reject_namespace_adjustment = true)
        .validate(&req)
        .expect_err("namespaces refused");
    assert_eq!(
        err,
        ValidationError::Namespace {
            adjusted: vec![("10-a".into(), "network".into())]
        }
    );
    assert!(err
        .to_string()
        .contains(r#"plugin "10-a" (namespace "network")"#));
    let err = enabled(|c| c.reject_sysctl_adjustment = true)
        .validate(&req)
        .expect_err("sysctls refused");
    assert_eq!(
        err,
        ValidationError::Sysctl {
            adjusted: vec![("10-a".into(), "net.core.somaxconn".into())]
        }
    );
    // Nothing adjusted: nothing refused.
    let plain = validation(request(&[], None), hook_response());
    enabled(|c| {
        c.reject_namespace_adjustment = true;
        c.reject_sysctl_adjustment = true;
    })
    .validate(&plain)
    .expect("no namespaces or sysctls");
}

fn required(names: &[&str]) -> DefaultValidator {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    enabled(move |c| {
        c.required_plugins = names;
        c.tolerate_missing_plugins_annotation = "tolerate-missing.example.com".into();
    })
}

#[test]
fn required_plugins_from_configuration() {
    let req = validation(request(&[], None), api::CreateContainerResponse::default());
    required(&["a"]).validate(&req).expect("present by name");
    required(&["10-a"])
        .validate(&req)
        .expect("present by NN-name");
    let err = required(&["a", "b", "20-c"])
        .validate(&req)
        .expect_err("missing");
    assert_eq!(
        err,
        ValidationError::MissingPlugins {
            missing: vec!["b".into(), "20-c".into()]
        }
    );
    assert!(err.to_string().contains(r#""b", "20-c""#));
    // Index must match when one is given.
    required(&["11-a"]).validate(&req).expect_err("wrong index");
}

#[test]
fn a_plugin_that_did_not_answer_is_missing() {
    // The runtime records only plugins that answered; one that timed out is absent.
    let m = CreateMerger::new(request(&[], None));
    let req = m.finish().validation_request();
    assert!(matches!(
        required(&["a"]).validate(&req),
        Err(ValidationError::MissingPlugins { .. })
    ));
}

#[test]
fn required_plugins_from_annotations() {
    let with = |ann: &[(&str, &str)]| {
        validation(request(ann, None), api::CreateContainerResponse::default())
    };
    let v = required(&[]);
    v.validate(&with(&[])).expect("nothing required");
    let err = v
        .validate(&with(&[(REQUIRED_PLUGINS_ANNOTATION, "[a, b]")]))
        .expect_err("b missing");
    assert_eq!(
        err,
        ValidationError::MissingPlugins {
            missing: vec!["b".into()]
        }
    );
    v.validate(&with(&[(
        "required-plugins.noderesource.dev/pod",
        "- a\n- 10-a\n",
    )]))
    .expect("block list, pod scope");
    // The container-scoped form wins over the pod-wide one.
    v.validate(&with(&[
        (REQUIRED_PLUGINS_ANNOTATION, "[b]"),
        ("required-plugins.noderesource.dev/container.ctr", "[a]"),
    ]))
    .expect("container scope");
    // Scoped to another container: the pod-wide value applies.
    v.validate(&with(&[
        (REQUIRED_PLUGINS_ANNOTATION, "[b]"),
        ("required-plugins.noderesource.dev/container.other", "[a]"),
    ]))
    .expect_err("b required");
    let err = v
        .validate(&with(&[(REQUIRED_PLUGINS_ANNOTATION, "a")]))
        .expect_err("not a list");
    assert!(matches!(err, ValidationError::BadAnnotation { .. }));
    assert!(err.to_string().contains(REQUIRED_PLUGINS_ANNOTATION));
}

#[test]
fn missing_plugins_tolerated_by_annotation() {
    let with = |ann: &[(&str, &str)]| {
        validation(request(ann, None), api::CreateContainerResponse::default())
    };
    let v = required(&["gone"]);
    v.validate(&with(&[("tolerate-missing.example.com", "true")]))
        .expect("tolerated");
    v.validate(&with(&[(
        "tolerate-missing.example.com/container.ctr",
        "1",
    )]))
    .expect("tolerated for the container");
    v.validate(&with(&[("tolerate-missing.example.com", "false")]))
        .expect_err("not tolerated");
    let err = v
        .validate(&with(&[("tolerate-missing.example.com", "maybe")]))
        .expect_err("bad value");
    assert!(matches!(err, ValidationError::BadAnnotation { .. }));
    // Without a configured toleration key the annotation means nothing.
    let strict = enabled(|c| c.required_plugins = vec!["gone".into()]);
    strict
        .validate(&with(&[("tolerate-missing.example.com", "true")]))
        .expect_err("no toleration configured");
}

#[test]
fn validator_verdicts() {
    let ok = api::ValidateContainerAdjustmentResponse::default();
    check_verdict("30-v", &ok).expect("accepted");
    let no = api::ValidateContainerAdjustmentResponse {
        reject: true,
        reason: "too many CPUs".into(),
    };
    let err = check_verdict("30-v", &no).expect_err("rejected");
    assert_eq!(
        err.to_string(),
        r#"validator "30-v" rejected the container adjustment: too many CPUs"#
    );
}

#[test]
fn configuration_from_toml() {
    let cfg: DefaultValidatorConfig = toml::from_str(
        r#"
enable = true
reject_oci_hook_adjustment = true
reject_runtime_default_seccomp_adjustment = true
reject_unconfined_seccomp_adjustment = true
reject_custom_seccomp_adjustment = true
reject_namespace_adjustment = true
reject_sysctl_adjustment = true
required_plugins = ["10-resource-policy"]
tolerate_missing_plugins_annotation = "tolerate-missing-plugins.noderesource.dev"
"#,
    )
    .expect("parse");
    assert!(cfg.enable && cfg.reject_oci_hook_adjustment && cfg.reject_sysctl_adjustment);
    assert!(cfg.reject_custom_seccomp_adjustment && cfg.reject_namespace_adjustment);
    assert_eq!(cfg.required_plugins, vec!["10-resource-policy".to_string()]);
    let empty: DefaultValidatorConfig = toml::from_str("").expect("defaults");
    assert_eq!(empty, DefaultValidatorConfig::default());
    assert!(toml::from_str::<DefaultValidatorConfig>("reject_hooks = true").is_err());
}
