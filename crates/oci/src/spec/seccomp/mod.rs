//! The seccomp filter of a container, as containerd's CRI plugin chooses it.
//!
//! The profile asked for is the `seccomp` field of the security context, or,
//! when that is unset, the deprecated `seccomp_profile_path`:
//! `runtime/default` and `docker/default` mean `RuntimeDefault`,
//! `unconfined` and the empty string mean unconfined, `localhost/<path>` a
//! profile file; anything else is refused. A privileged container runs
//! unconfined whatever it asks for (as with containerd and CRI-O: privileged
//! already grants everything a filter would deny); an unknown profile type
//! or a `localhost_ref` beside another type is refused, never ignored.
//!
//! [`runtime_default`] is Petrel's own default profile; [`load_profile`]
//! reads and checks a `Localhost` one.

mod default_profile;
mod localhost;

use std::collections::HashSet;
use std::path::PathBuf;

use oci_spec::runtime::{Capability, LinuxSeccomp};
use petrel_cri::api;

use super::{invalid, shown, SpecError};

pub use default_profile::runtime_default;
pub use localhost::{load_profile, parse_profile};

/// The CRI field of the new form (in a container's or a sandbox's config).
pub const FIELD: &str = "linux.security_context.seccomp";
/// The CRI field of the deprecated form.
pub const PATH_FIELD: &str = "linux.security_context.seccomp_profile_path";

/// A profile as a CRI request asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeccompRequest {
    /// No filter.
    Unconfined,
    /// Petrel's default profile ([`runtime_default`]).
    RuntimeDefault,
    /// The profile in this JSON file (absolute path).
    Localhost(PathBuf),
}

impl SeccompRequest {
    /// The CRI field this request came from, for error messages.
    fn field(from_path: bool) -> String {
        if from_path {
            PATH_FIELD.to_string()
        } else {
            format!("{FIELD}.localhost_ref")
        }
    }
}

/// The profile asked for by a security context's `seccomp` field, or by its
/// deprecated `seccomp_profile_path` when the field is unset. Returns the
/// request and the field it came from.
pub fn requested(
    profile: Option<&api::SecurityProfile>,
    deprecated_path: &str,
) -> Result<(SeccompRequest, String), SpecError> {
    use api::security_profile::ProfileType;
    let Some(p) = profile else {
        return from_path(deprecated_path).map(|r| (r, SeccompRequest::field(true)));
    };
    let ty = ProfileType::try_from(p.profile_type).map_err(|_| {
        invalid(
            format!("{FIELD}.profile_type"),
            format!("unknown profile type {}", p.profile_type),
        )
    })?;
    if ty != ProfileType::Localhost && !p.localhost_ref.is_empty() {
        return Err(invalid(
            format!("{FIELD}.localhost_ref"),
            format!(
                "may only be set with profile type Localhost, not {}",
                ty.as_str_name()
            ),
        ));
    }
    let req = match ty {
        ProfileType::RuntimeDefault => SeccompRequest::RuntimeDefault,
        ProfileType::Unconfined => SeccompRequest::Unconfined,
        ProfileType::Localhost => {
            // containerd trims a stray `localhost/` prefix too.
            let path = p
                .localhost_ref
                .strip_prefix("localhost/")
                .unwrap_or(&p.localhost_ref);
            localhost_path(path, &SeccompRequest::field(false))?
        }
    };
    Ok((req, SeccompRequest::field(false)))
}

fn from_path(path: &str) -> Result<SeccompRequest, SpecError> {
    match path {
        "" | "unconfined" => Ok(SeccompRequest::Unconfined),
        "runtime/default" | "docker/default" => Ok(SeccompRequest::RuntimeDefault),
        p => match p.strip_prefix("localhost/") {
            Some(file) => localhost_path(file, PATH_FIELD),
            None => Err(invalid(
                PATH_FIELD,
                format!(
                    "unknown profile {}: expected runtime/default, docker/default, \
                     unconfined or localhost/<absolute path>",
                    shown(p)
                ),
            )),
        },
    }
}

fn localhost_path(path: &str, field: &str) -> Result<SeccompRequest, SpecError> {
    if path.is_empty() {
        return Err(invalid(
            field,
            "a Localhost profile needs the path of its file",
        ));
    }
    if !path.starts_with('/') || path.contains('\0') {
        return Err(invalid(
            field,
            format!("seccomp profile path {} must be absolute", shown(path)),
        ));
    }
    Ok(SeccompRequest::Localhost(PathBuf::from(path)))
}

/// The OCI `linux.seccomp` of a container: `None` when it runs unconfined
/// (asked for, or privileged). `bounding` is the container's bounding
/// capability set, which decides the capability-gated rules of
/// `RuntimeDefault`. Reads a `Localhost` profile.
pub fn container_seccomp(
    sc: Option<&api::LinuxContainerSecurityContext>,
    bounding: &HashSet<Capability>,
) -> Result<Option<LinuxSeccomp>, SpecError> {
    let Some(sc) = sc else {
        // No security context: nothing asked, as with an empty path.
        return Ok(None);
    };
    #[allow(deprecated)]
    let (req, field) = requested(sc.seccomp.as_ref(), &sc.seccomp_profile_path)?;
    if sc.privileged {
        return Ok(None);
    }
    Ok(match req {
        SeccompRequest::Unconfined => None,
        SeccompRequest::RuntimeDefault => Some(runtime_default(bounding)),
        SeccompRequest::Localhost(path) => Some(load_profile(&path, &field)?),
    })
}

/// Checks a container's seccomp request before anything is made: its form,
/// and a `Localhost` profile's file (read and validated). The default
/// profile is not built here: [`container_seccomp`] builds it once, with
/// the container's capabilities.
pub fn check_container_seccomp(
    sc: Option<&api::LinuxContainerSecurityContext>,
) -> Result<(), SpecError> {
    let Some(sc) = sc else { return Ok(()) };
    #[allow(deprecated)]
    let (req, field) = requested(sc.seccomp.as_ref(), &sc.seccomp_profile_path)?;
    check_localhost(&req, &field, sc.privileged)
}

/// Reads and validates a `Localhost` profile unless the process is
/// privileged (then it runs unconfined and the file is never read).
fn check_localhost(req: &SeccompRequest, field: &str, privileged: bool) -> Result<(), SpecError> {
    if let SeccompRequest::Localhost(path) = req {
        if !privileged {
            load_profile(path, field)?;
        }
    }
    Ok(())
}

/// The profile a container runs under, as NRI plugins are shown it:
/// unconfined when privileged or when its request is unusable (such a
/// container is refused before NRI is asked).
pub fn applied(sc: Option<&api::LinuxContainerSecurityContext>) -> SeccompRequest {
    let Some(sc) = sc.filter(|s| !s.privileged) else {
        return SeccompRequest::Unconfined;
    };
    #[allow(deprecated)]
    requested(sc.seccomp.as_ref(), &sc.seccomp_profile_path)
        .map_or(SeccompRequest::Unconfined, |(r, _)| r)
}

/// Checks a pod sandbox's seccomp request: its form, and a `Localhost`
/// profile's file. Petrel's sandboxes have no pause process for it to
/// confine (namespaces are pinned by bind mounts; the PID-namespace holder is
/// Petrel's own reaper), so nothing is applied, but a request that could not
/// be honoured is still refused, as containerd refuses it for its pause
/// container.
pub fn check_sandbox_seccomp(
    sc: Option<&api::LinuxSandboxSecurityContext>,
) -> Result<(), SpecError> {
    let Some(sc) = sc else { return Ok(()) };
    #[allow(deprecated)]
    let (req, field) = requested(sc.seccomp.as_ref(), &sc.seccomp_profile_path)?;
    check_localhost(&req, &field, sc.privileged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::security_profile::ProfileType;

    fn profile(ty: ProfileType, r: &str) -> api::SecurityProfile {
        api::SecurityProfile {
            profile_type: ty as i32,
            localhost_ref: r.to_string(),
        }
    }

    #[test]
    fn requested_should_map_the_deprecated_paths_as_containerd_does() {
        for (path, want) in [
            ("", SeccompRequest::Unconfined),
            ("unconfined", SeccompRequest::Unconfined),
            ("runtime/default", SeccompRequest::RuntimeDefault),
            ("docker/default", SeccompRequest::RuntimeDefault),
            (
                "localhost//etc/p.json",
                SeccompRequest::Localhost("/etc/p.json".into()),
            ),
        ] {
            let (got, field) = requested(None, path).expect(path);
            assert_eq!(got, want, "{path}");
            assert_eq!(field, PATH_FIELD);
        }
        for bad in ["default", "localhost/relative.json", "localhost/"] {
            match requested(None, bad) {
                Err(SpecError::Invalid { field, .. }) => assert_eq!(field, PATH_FIELD, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn requested_should_prefer_the_new_field() {
        let (got, _) = requested(
            Some(&profile(ProfileType::Unconfined, "")),
            "runtime/default",
        )
        .expect("ok");
        assert_eq!(got, SeccompRequest::Unconfined);
        let (got, field) =
            requested(Some(&profile(ProfileType::Localhost, "/p.json")), "").expect("ok");
        assert_eq!(got, SeccompRequest::Localhost("/p.json".into()));
        assert_eq!(field, "linux.security_context.seccomp.localhost_ref");
        // The zero value of the enum is RuntimeDefault (critest's "default").
        let (got, _) = requested(Some(&api::SecurityProfile::default()), "").expect("ok");
        assert_eq!(got, SeccompRequest::RuntimeDefault);
    }

    #[test]
    fn requested_should_refuse_inconsistent_profiles_naming_the_field() {
        let cases = [
            (
                profile(ProfileType::RuntimeDefault, "/p.json"),
                "seccomp.localhost_ref",
            ),
            (profile(ProfileType::Localhost, ""), "seccomp.localhost_ref"),
            (
                profile(ProfileType::Localhost, "p.json"),
                "seccomp.localhost_ref",
            ),
            (
                api::SecurityProfile {
                    profile_type: 9,
                    localhost_ref: String::new(),
                },
                "seccomp.profile_type",
            ),
        ];
        for (p, want) in cases {
            match requested(Some(&p), "") {
                Err(SpecError::Invalid { field, .. }) => assert!(field.ends_with(want), "{field}"),
                other => panic!("{p:?}: {other:?}"),
            }
        }
    }

    fn sc(p: Option<api::SecurityProfile>, privileged: bool) -> api::LinuxContainerSecurityContext {
        api::LinuxContainerSecurityContext {
            seccomp: p,
            privileged,
            ..Default::default()
        }
    }

    #[test]
    fn container_seccomp_should_confine_only_what_asks_for_it() {
        let caps = HashSet::new();
        assert_eq!(container_seccomp(None, &caps).expect("none"), None);
        assert_eq!(
            container_seccomp(Some(&sc(None, false)), &caps).expect("nil"),
            None
        );
        let rd = Some(profile(ProfileType::RuntimeDefault, ""));
        assert!(container_seccomp(Some(&sc(rd.clone(), false)), &caps)
            .expect("default")
            .is_some());
        // Privileged: unconfined, and a Localhost file is not even read.
        assert_eq!(
            container_seccomp(Some(&sc(rd, true)), &caps).expect("priv"),
            None
        );
        let missing = Some(profile(ProfileType::Localhost, "/nonexistent/p.json"));
        assert_eq!(
            container_seccomp(Some(&sc(missing.clone(), true)), &caps).expect("priv"),
            None
        );
        assert!(matches!(
            container_seccomp(Some(&sc(missing, false)), &caps),
            Err(SpecError::Invalid { .. })
        ));
    }

    #[test]
    fn check_sandbox_seccomp_should_read_a_localhost_profile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("p.json");
        std::fs::write(&good, r#"{"defaultAction":"SCMP_ACT_ALLOW"}"#).expect("write");
        let sandbox = |r: &str| api::LinuxSandboxSecurityContext {
            seccomp: Some(profile(ProfileType::Localhost, r)),
            ..Default::default()
        };
        assert!(check_sandbox_seccomp(Some(&sandbox(&good.to_string_lossy()))).is_ok());
        let missing = dir.path().join("missing.json");
        match check_sandbox_seccomp(Some(&sandbox(&missing.to_string_lossy()))) {
            Err(SpecError::Invalid { field, reason }) => {
                assert_eq!(field, "linux.security_context.seccomp.localhost_ref");
                assert!(reason.contains("missing.json"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
