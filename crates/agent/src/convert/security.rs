//! Security settings shared by the sandbox and its containers: namespace
//! modes, supplemental groups, seccomp and AppArmor profiles.

use k8s_openapi::api::core::v1::{Container, PodSpec};
use petrel_cri::api;

use super::{ConvertContext, ConvertError};

/// The pod's namespace modes, [`base_namespace_options`] with its user
/// namespace: the pod's own (mode POD, its range for uids and gids) with
/// `hostUsers: false`, as kubelet sends it to the sandbox and every
/// container. Refused for a pod that also shares the host's network, PID
/// or IPC namespace (the API server's rule), or whose range could not be
/// had.
pub(crate) fn namespace_options(
    spec: &PodSpec,
    ctx: &ConvertContext,
) -> Result<api::NamespaceOption, ConvertError> {
    let mut opts = base_namespace_options(spec);
    if spec.host_users != Some(false) {
        return Ok(opts);
    }
    let shared = [
        (spec.host_network, "hostNetwork"),
        (spec.host_pid, "hostPID"),
        (spec.host_ipc, "hostIPC"),
    ];
    if let Some((_, name)) = shared.iter().find(|(on, _)| *on == Some(true)) {
        return Err(ConvertError::invalid(
            "spec.hostUsers",
            format!("false is not allowed with {name}: true"),
        ));
    }
    let host_id = match &ctx.userns {
        Some(Ok(id)) => *id,
        Some(Err(why)) => return Err(ConvertError::invalid("spec.hostUsers", why.clone())),
        None => {
            return Err(ConvertError::invalid(
                "spec.hostUsers",
                "no user namespace range was allocated for the pod",
            ))
        }
    };
    let range = vec![api::IdMapping {
        container_id: 0,
        host_id,
        length: crate::userns::IDS_PER_POD,
    }];
    opts.userns_options = Some(api::UserNamespace {
        mode: api::NamespaceMode::Pod as i32,
        uids: range.clone(),
        gids: range,
    });
    Ok(opts)
}

/// The pod's namespace modes: the host's where the pod asks for them;
/// otherwise the pod's network and IPC, and a pid namespace per container
/// unless the pod shares one.
pub(crate) fn base_namespace_options(spec: &PodSpec) -> api::NamespaceOption {
    let node = api::NamespaceMode::Node as i32;
    let pod = api::NamespaceMode::Pod as i32;
    let pid = if spec.host_pid == Some(true) {
        node
    } else if spec.share_process_namespace == Some(true) {
        pod
    } else {
        api::NamespaceMode::Container as i32
    };
    api::NamespaceOption {
        network: if spec.host_network == Some(true) {
            node
        } else {
            pod
        },
        pid,
        ipc: if spec.host_ipc == Some(true) {
            node
        } else {
            pod
        },
        ..Default::default()
    }
}

/// The pod's supplemental groups, with its fsGroup (which volumes are
/// meant to be writable by) appended when not already there.
pub(crate) fn supplemental_groups(spec: &PodSpec) -> Vec<i64> {
    let Some(sc) = spec.security_context.as_ref() else {
        return Vec::new();
    };
    let mut groups = sc.supplemental_groups.clone().unwrap_or_default();
    if let Some(fs) = sc.fs_group {
        if !groups.contains(&fs) {
            groups.push(fs);
        }
    }
    groups
}

/// A seccomp or AppArmor profile in CRI form.
pub(crate) fn profile(
    kind: &str,
    localhost: Option<&str>,
    field: &str,
) -> Result<api::SecurityProfile, ConvertError> {
    let profile_type = match kind {
        "RuntimeDefault" => api::security_profile::ProfileType::RuntimeDefault,
        "Unconfined" => api::security_profile::ProfileType::Unconfined,
        "Localhost" => api::security_profile::ProfileType::Localhost,
        other => {
            return Err(ConvertError::invalid(
                format!("{field}.type"),
                format!("unknown profile type {other:?}"),
            ))
        }
    };
    let localhost_ref = localhost.unwrap_or_default().to_string();
    if profile_type == api::security_profile::ProfileType::Localhost && localhost_ref.is_empty() {
        return Err(ConvertError::invalid(
            format!("{field}.localhostProfile"),
            "required with type Localhost",
        ));
    }
    Ok(api::SecurityProfile {
        profile_type: profile_type as i32,
        localhost_ref,
    })
}

/// The CRI seccomp profile of a container (or, with `container` `None`,
/// of the pod's sandbox), by kubelet's rules: the container's own profile
/// over the pod's; with neither, `RuntimeDefault` when the agent runs with
/// `--seccomp-default` and `Unconfined` otherwise. A `Localhost` profile's
/// `localhostProfile` is relative to the agent's seccomp directory
/// (kubelet's `<root-dir>/seccomp`), which it may not leave. Privileged
/// containers get the same profile: the runtime runs them unconfined.
pub(crate) fn seccomp(
    spec: &PodSpec,
    container: Option<(&Container, &str)>,
    ctx: &ConvertContext,
) -> Result<api::SecurityProfile, ConvertError> {
    let own = container.and_then(|(c, cfield)| {
        c.security_context
            .as_ref()
            .and_then(|sc| sc.seccomp_profile.as_ref())
            .map(|p| (p, format!("{cfield}.securityContext.seccompProfile")))
    });
    let pod = || {
        spec.security_context
            .as_ref()
            .and_then(|sc| sc.seccomp_profile.as_ref())
            .map(|p| (p, "spec.securityContext.seccompProfile".to_string()))
    };
    let Some((p, field)) = own.or_else(pod) else {
        let ty = if ctx.seccomp_default {
            api::security_profile::ProfileType::RuntimeDefault
        } else {
            api::security_profile::ProfileType::Unconfined
        };
        return Ok(api::SecurityProfile {
            profile_type: ty as i32,
            localhost_ref: String::new(),
        });
    };
    let mut out = profile(&p.type_, p.localhost_profile.as_deref(), &field)?;
    if out.profile_type == api::security_profile::ProfileType::Localhost as i32 {
        let rel = std::path::Path::new(&out.localhost_ref);
        let escapes = rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
        if escapes {
            return Err(ConvertError::invalid(
                format!("{field}.localhostProfile"),
                format!(
                    "{:?} must be a relative path inside the seccomp directory",
                    out.localhost_ref
                ),
            ));
        }
        out.localhost_ref = ctx.seccomp_root.join(rel).to_string_lossy().into_owned();
    } else if p
        .localhost_profile
        .as_deref()
        .is_some_and(|f| !f.is_empty())
    {
        return Err(ConvertError::invalid(
            format!("{field}.localhostProfile"),
            "can only be set when seccomp type is Localhost",
        ));
    }
    Ok(out)
}

/// Whether a container asks to be privileged.
pub(crate) fn is_privileged(c: &Container) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::convert::test_support::{ctx, desired};
    use api::security_profile::ProfileType;

    fn spec_of(yaml: &str) -> PodSpec {
        desired(yaml).pod.spec.clone().unwrap()
    }

    #[test]
    fn namespace_options_should_give_host_users_false_pods_their_range() {
        let spec = spec_of(
            "metadata: {name: u}\nspec:\n  hostUsers: false\n  containers: [{name: a, image: x}]\n",
        );
        let with = ConvertContext {
            userns: Some(Ok(3 * 65536)),
            ..ctx()
        };
        let ns = namespace_options(&spec, &with).unwrap();
        let u = ns.userns_options.unwrap();
        assert_eq!(u.mode, api::NamespaceMode::Pod as i32);
        let want = vec![api::IdMapping {
            container_id: 0,
            host_id: 3 * 65536,
            length: 65536,
        }];
        assert_eq!((u.uids, u.gids), (want.clone(), want));
        // hostUsers unset or true: the host's user namespace.
        let host = spec_of("metadata: {name: h}\nspec:\n  containers: [{name: a, image: x}]\n");
        assert!(namespace_options(&host, &with)
            .unwrap()
            .userns_options
            .is_none());
    }

    #[test]
    fn namespace_options_should_refuse_host_users_false_without_a_range_or_with_host_namespaces() {
        let spec = spec_of(
            "metadata: {name: u}\nspec:\n  hostUsers: false\n  containers: [{name: a, image: x}]\n",
        );
        let failed = ConvertContext {
            userns: Some(Err("no user namespace range left".into())),
            ..ctx()
        };
        let err = namespace_options(&spec, &failed).unwrap_err().to_string();
        assert!(
            err.contains("spec.hostUsers") && err.contains("range left"),
            "{err}"
        );
        assert!(
            namespace_options(&spec, &ctx()).is_err(),
            "never the host's silently"
        );
        let host_net = spec_of(
            "metadata: {name: u}\nspec:\n  hostUsers: false\n  hostNetwork: true\n  containers: [{name: a, image: x}]\n",
        );
        let with = ConvertContext {
            userns: Some(Ok(65536)),
            ..ctx()
        };
        let err = namespace_options(&host_net, &with).unwrap_err().to_string();
        assert!(err.contains("hostNetwork"), "{err}");
    }

    fn container_profile(
        yaml: &str,
        c: &ConvertContext,
    ) -> Result<api::SecurityProfile, ConvertError> {
        let spec = spec_of(yaml);
        seccomp(&spec, Some((&spec.containers[0], "spec.containers[a]")), c)
    }

    #[test]
    fn seccomp_should_follow_seccomp_default_when_nothing_is_set() {
        let yaml = "metadata: {name: p}\nspec: {containers: [{name: a, image: x}]}\n";
        let mut c = ctx();
        let got = container_profile(yaml, &c).unwrap();
        assert_eq!(got.profile_type, ProfileType::Unconfined as i32);
        c.seccomp_default = true;
        let got = container_profile(yaml, &c).unwrap();
        assert_eq!(got.profile_type, ProfileType::RuntimeDefault as i32);
        let sandbox = seccomp(&spec_of(yaml), None, &c).unwrap();
        assert_eq!(sandbox.profile_type, ProfileType::RuntimeDefault as i32);
    }

    #[test]
    fn seccomp_should_prefer_the_container_and_join_localhost_to_the_root() {
        let yaml = "metadata: {name: p}\nspec:\n  securityContext: {seccompProfile: {type: Localhost, localhostProfile: pod.json}}\n  containers: [{name: a, image: x, securityContext: {seccompProfile: {type: Localhost, localhostProfile: profiles/own.json}}}, {name: b, image: x}]\n";
        let c = ctx();
        let got = container_profile(yaml, &c).unwrap();
        assert_eq!(got.profile_type, ProfileType::Localhost as i32);
        assert_eq!(
            got.localhost_ref,
            "/var/lib/petrel/seccomp/profiles/own.json"
        );
        let spec = spec_of(yaml);
        let b = seccomp(&spec, Some((&spec.containers[1], "spec.containers[b]")), &c).unwrap();
        assert_eq!(b.localhost_ref, "/var/lib/petrel/seccomp/pod.json");
        // The pod's profile wins over --seccomp-default.
        let with_default = ConvertContext {
            seccomp_default: true,
            ..ctx()
        };
        let b = seccomp(
            &spec,
            Some((&spec.containers[1], "spec.containers[b]")),
            &with_default,
        )
        .unwrap();
        assert_eq!(b.profile_type, ProfileType::Localhost as i32);
    }

    #[test]
    fn seccomp_should_refuse_profiles_outside_the_seccomp_directory() {
        let c = ctx();
        for (profile, want) in [
            (
                "{type: Localhost}",
                "spec.containers[a].securityContext.seccompProfile.localhostProfile",
            ),
            (
                "{type: Localhost, localhostProfile: /etc/p.json}",
                "relative path",
            ),
            (
                "{type: Localhost, localhostProfile: ../p.json}",
                "relative path",
            ),
            (
                "{type: RuntimeDefault, localhostProfile: p.json}",
                "only be set",
            ),
            ("{type: Sometimes}", "unknown profile type"),
        ] {
            let yaml = format!(
                "metadata: {{name: p}}\nspec: {{containers: [{{name: a, image: x, securityContext: {{seccompProfile: {profile}}}}}]}}\n"
            );
            let err = container_profile(&yaml, &c).unwrap_err().to_string();
            assert!(err.contains(want), "{profile}: {err}");
        }
    }
}
