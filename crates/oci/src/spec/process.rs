//! The container process: arguments, environment, working directory and user.

use std::path::{Path, PathBuf};

use oci_spec::image::Config as ImageConfig;
use petrel_cri::api;

use super::{invalid, SpecError};
use crate::user::{resolve_user, GroupsPolicy, ResolvedUser, UserDb, UserError};

/// `PATH` when neither the image nor the CRI sets one.
pub const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The process arguments, with Docker's and containerd's rules:
/// a CRI `command` replaces the image entrypoint and drops the image `Cmd`; without a
/// `command`, the entrypoint stays and CRI `args` (if any) replace the image `Cmd`.
/// An image entrypoint of exactly `[""]` means "no entrypoint".
pub(super) fn args(
    config: &api::ContainerConfig,
    image: Option<&ImageConfig>,
) -> Result<Vec<String>, SpecError> {
    let mut out: Vec<String>;
    let args: &[String];
    if config.command.is_empty() {
        let entrypoint = image.and_then(|i| i.entrypoint().as_deref()).unwrap_or(&[]);
        out = if entrypoint == [""] {
            Vec::new()
        } else {
            entrypoint.to_vec()
        };
        args = if config.args.is_empty() {
            image.and_then(|i| i.cmd().as_deref()).unwrap_or(&[])
        } else {
            &config.args
        };
    } else {
        out = config.command.clone();
        args = &config.args;
    }
    out.extend(args.iter().cloned());
    if out.is_empty() {
        return Err(invalid(
            "command",
            "no command specified by the container or its image",
        ));
    }
    Ok(out)
}

/// The environment: a default `PATH` and `HOSTNAME`, then the image's `Env`, then the
/// CRI `envs`; later entries replace earlier ones with the same name. An image entry
/// without `=` removes the variable.
pub(super) fn env(
    config: &api::ContainerConfig,
    image: Option<&ImageConfig>,
    hostname: &str,
) -> Result<Vec<String>, SpecError> {
    let mut out = vec![DEFAULT_PATH.to_string(), format!("HOSTNAME={hostname}")];
    for e in image.and_then(|i| i.env().as_deref()).unwrap_or(&[]) {
        set_env(&mut out, e);
    }
    for (i, kv) in config.envs.iter().enumerate() {
        if kv.key.is_empty() || kv.key.contains('=') || kv.key.contains('\0') {
            return Err(invalid(
                format!("envs[{i}].key"),
                format!("invalid variable name {:?}", kv.key),
            ));
        }
        // The CRI carries the value as bytes; OCI's config.json is JSON text.
        let value = std::str::from_utf8(&kv.value).map_err(|_| {
            invalid(
                format!("envs[{i}].value"),
                format!("the value of {:?} is not UTF-8", kv.key),
            )
        })?;
        set_env(&mut out, &format!("{}={value}", kv.key));
    }
    Ok(out)
}

fn set_env(list: &mut Vec<String>, entry: &str) {
    let (key, value) = match entry.split_once('=') {
        Some((k, _)) => (k, true),
        None => (entry, false),
    };
    let pos = list
        .iter()
        .position(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key);
    match (pos, value) {
        (Some(p), true) => list[p] = entry.to_string(),
        (None, true) => list.push(entry.to_string()),
        (Some(p), false) => {
            list.remove(p);
        }
        (None, false) => {}
    }
}

/// The working directory: CRI `working_dir` (must be absolute), else the image's
/// (made absolute), else `/`.
pub(super) fn cwd(
    config: &api::ContainerConfig,
    image: Option<&ImageConfig>,
) -> Result<PathBuf, SpecError> {
    if !config.working_dir.is_empty() {
        if !config.working_dir.starts_with('/') {
            return Err(invalid(
                "working_dir",
                format!("{:?} is not an absolute path", config.working_dir),
            ));
        }
        return Ok(PathBuf::from(&config.working_dir));
    }
    match image.and_then(|i| i.working_dir().as_deref()) {
        Some(w) if !w.is_empty() => Ok(Path::new("/").join(w)),
        _ => Ok(PathBuf::from("/")),
    }
}

/// Resolves the user of the process inside `rootfs`: CRI `run_as_username` or
/// `run_as_user` (with `run_as_group`), else the image `User`, else root. Its
/// supplementary groups: the primary group, then with the `Merge` policy (the
/// default) the groups the image's `/etc/group` gives the user, then the
/// requested `supplemental_groups`; with `Strict` the image's are left out.
pub(super) fn user(
    sc: Option<&api::LinuxContainerSecurityContext>,
    image: Option<&ImageConfig>,
    rootfs: &Path,
    users: Option<&UserDb>,
) -> Result<ResolvedUser, SpecError> {
    const SC: &str = "linux.security_context";
    let id = |v: i64, field: &str| {
        u32::try_from(v)
            .map_err(|_| invalid(format!("{SC}.{field}"), format!("{v} is out of range")))
    };
    let mut user = String::new();
    let mut field = "image user".to_string();
    let mut supplemental = Vec::new();
    let mut policy = GroupsPolicy::Merge;
    if let Some(sc) = sc {
        if !sc.run_as_username.is_empty() {
            user.clone_from(&sc.run_as_username);
            field = format!("{SC}.run_as_username");
        } else if let Some(u) = &sc.run_as_user {
            user = id(u.value, "run_as_user")?.to_string();
            field = format!("{SC}.run_as_user");
        }
        if let Some(g) = &sc.run_as_group {
            if user.is_empty() {
                return Err(invalid(
                    format!("{SC}.run_as_group"),
                    "run_as_group requires run_as_user or run_as_username",
                ));
            }
            let gid = id(g.value, "run_as_group")?;
            user = format!("{user}:{gid}");
        }
        for (i, g) in sc.supplemental_groups.iter().enumerate() {
            supplemental.push(id(*g, &format!("supplemental_groups[{i}]"))?);
        }
        policy = match api::SupplementalGroupsPolicy::try_from(sc.supplemental_groups_policy) {
            Ok(api::SupplementalGroupsPolicy::Merge) => GroupsPolicy::Merge,
            Ok(api::SupplementalGroupsPolicy::Strict) => GroupsPolicy::Strict,
            Err(_) => {
                return Err(invalid(
                    format!("{SC}.supplemental_groups_policy"),
                    format!("unknown policy {}", sc.supplemental_groups_policy),
                ))
            }
        };
    }
    if user.is_empty() {
        user = image
            .and_then(|i| i.user().as_deref())
            .unwrap_or_default()
            .to_string();
    }
    match users {
        Some(db) => db.resolve(&user, &supplemental, policy),
        None => resolve_user(rootfs, &user, &supplemental, policy),
    }
    .map_err(|e| match e {
        UserError::Io { .. } => SpecError::User(e),
        other => invalid(field, other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::image::ConfigBuilder;

    fn cfg(command: &[&str], args: &[&str]) -> api::ContainerConfig {
        api::ContainerConfig {
            command: command.iter().map(|s| s.to_string()).collect(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn image(entrypoint: &[&str], cmd: &[&str]) -> ImageConfig {
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut b = ConfigBuilder::default();
        if !entrypoint.is_empty() {
            b = b.entrypoint(v(entrypoint));
        }
        if !cmd.is_empty() {
            b = b.cmd(v(cmd));
        }
        b.build().expect("image config")
    }

    #[test]
    fn args_should_use_image_entrypoint_and_cmd_without_cri_command_or_args() {
        let img = image(&["/entry", "-x"], &["serve", "--port=80"]);
        let a = args(&cfg(&[], &[]), Some(&img)).expect("args");
        assert_eq!(a, ["/entry", "-x", "serve", "--port=80"]);
    }

    #[test]
    fn args_should_replace_image_cmd_with_cri_args() {
        let img = image(&["/entry"], &["serve"]);
        let a = args(&cfg(&[], &["debug", "-v"]), Some(&img)).expect("args");
        assert_eq!(a, ["/entry", "debug", "-v"]);
    }

    #[test]
    fn args_should_ignore_image_entrypoint_and_cmd_with_cri_command() {
        let img = image(&["/entry"], &["serve"]);
        let a = args(&cfg(&["/bin/sh"], &[]), Some(&img)).expect("args");
        assert_eq!(a, ["/bin/sh"]);
        let a = args(&cfg(&["/bin/sh"], &["-c", "true"]), Some(&img)).expect("args");
        assert_eq!(a, ["/bin/sh", "-c", "true"]);
    }

    #[test]
    fn args_should_use_image_cmd_alone_without_entrypoint() {
        let img = image(&[], &["/bin/app"]);
        assert_eq!(
            args(&cfg(&[], &[]), Some(&img)).expect("args"),
            ["/bin/app"]
        );
        // An entrypoint of [""] means "none".
        let img = image(&[""], &["/bin/app"]);
        assert_eq!(
            args(&cfg(&[], &[]), Some(&img)).expect("args"),
            ["/bin/app"]
        );
    }

    #[test]
    fn args_should_reject_an_empty_command() {
        let err = args(&cfg(&[], &[]), Some(&image(&[], &[]))).expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, .. } if field == "command"),
            "{err}"
        );
        assert!(args(&cfg(&[], &[]), None).is_err());
        // CRI args without any command at all are a command.
        assert_eq!(
            args(&cfg(&[], &["/bin/true"]), None).expect("args"),
            ["/bin/true"]
        );
    }

    #[test]
    fn env_should_let_cri_envs_override_the_image() {
        let img = ConfigBuilder::default()
            .env(vec![
                "PATH=/image/bin".to_string(),
                "A=image".to_string(),
                "B=image".to_string(),
                "HOSTNAME".to_string(),
            ])
            .build()
            .expect("image config");
        let mut c = cfg(&[], &[]);
        c.envs = vec![
            api::KeyValue {
                key: "B".into(),
                value: "cri".into(),
            },
            api::KeyValue {
                key: "C".into(),
                value: "x=y".into(),
            },
        ];
        let e = env(&c, Some(&img), "pod-1").expect("env");
        assert_eq!(e, ["PATH=/image/bin", "A=image", "B=cri", "C=x=y"]);
    }

    #[test]
    fn env_should_default_path_and_hostname() {
        let e = env(&cfg(&[], &[]), None, "pod-1").expect("env");
        assert_eq!(e, [DEFAULT_PATH, "HOSTNAME=pod-1"]);
    }

    #[test]
    fn env_should_reject_an_invalid_key() {
        let mut c = cfg(&[], &[]);
        c.envs = vec![
            api::KeyValue {
                key: "OK".into(),
                value: "1".into(),
            },
            api::KeyValue {
                key: "A=B".into(),
                value: "1".into(),
            },
        ];
        let err = env(&c, None, "h").expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, .. } if field == "envs[1].key"),
            "{err}"
        );
    }

    #[test]
    fn env_should_refuse_a_value_that_is_not_utf8_naming_the_field() {
        let mut c = cfg(&[], &[]);
        c.envs = vec![api::KeyValue {
            key: "RAW".into(),
            value: vec![b'a', 0xff],
        }];
        let err = env(&c, None, "h").expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, .. } if field == "envs[0].value"),
            "{err}"
        );
    }

    #[test]
    fn cwd_should_prefer_cri_then_image_then_root() {
        let img = ConfigBuilder::default()
            .working_dir("srv".to_string())
            .build()
            .expect("image config");
        let mut c = cfg(&[], &[]);
        assert_eq!(cwd(&c, Some(&img)).expect("cwd"), PathBuf::from("/srv"));
        assert_eq!(cwd(&c, None).expect("cwd"), PathBuf::from("/"));
        c.working_dir = "/work".into();
        assert_eq!(cwd(&c, Some(&img)).expect("cwd"), PathBuf::from("/work"));
        c.working_dir = "rel".into();
        assert!(matches!(cwd(&c, None), Err(SpecError::Invalid { .. })));
    }

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("etc")).expect("mkdir");
        std::fs::write(
            dir.path().join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("etc/group"),
            "root:x:0:\napp:x:1000:\nstaff:x:50:app\nvideo:x:44:\n",
        )
        .expect("write");
        dir
    }

    fn sc() -> api::LinuxContainerSecurityContext {
        api::LinuxContainerSecurityContext::default()
    }

    #[test]
    fn user_should_default_to_root() {
        let r = rootfs();
        let u = user(None, None, r.path(), None).expect("user");
        assert_eq!((u.uid, u.gid, u.additional_gids), (0, 0, vec![0]));
    }

    #[test]
    fn user_should_use_the_image_user() {
        let r = rootfs();
        let img = ConfigBuilder::default()
            .user("app".to_string())
            .build()
            .expect("image config");
        let u = user(None, Some(&img), r.path(), None).expect("user");
        assert_eq!(
            (u.uid, u.gid, u.additional_gids),
            (1000, 1000, vec![1000, 50])
        );
    }

    #[test]
    fn user_should_prefer_cri_run_as_user_and_group() {
        let r = rootfs();
        let img = ConfigBuilder::default()
            .user("app".to_string())
            .build()
            .expect("image config");
        let mut s = sc();
        s.run_as_user = Some(api::Int64Value { value: 1000 });
        s.run_as_group = Some(api::Int64Value { value: 3000 });
        s.supplemental_groups = vec![44, 2000];
        let u = user(Some(&s), Some(&img), r.path(), None).expect("user");
        assert_eq!((u.uid, u.gid), (1000, 3000));
        assert_eq!(u.additional_gids, [3000, 50, 44, 2000]);
    }

    #[test]
    fn user_should_resolve_run_as_username() {
        let r = rootfs();
        let mut s = sc();
        s.run_as_username = "app".into();
        s.run_as_user = Some(api::Int64Value { value: 5 });
        let u = user(Some(&s), None, r.path(), None).expect("user");
        assert_eq!((u.uid, u.gid), (1000, 1000));
    }

    #[test]
    fn user_should_reject_an_unknown_username_naming_the_field() {
        let r = rootfs();
        let mut s = sc();
        s.run_as_username = "ghost".into();
        let err = user(Some(&s), None, r.path(), None).expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, reason }
                if field == "linux.security_context.run_as_username" && reason.contains("ghost")),
            "{err}"
        );
    }

    #[test]
    fn user_should_reject_run_as_group_without_user() {
        let r = rootfs();
        let mut s = sc();
        s.run_as_group = Some(api::Int64Value { value: 5 });
        let err = user(Some(&s), None, r.path(), None).expect_err("should fail");
        assert!(
            matches!(&err, SpecError::Invalid { field, .. } if field == "linux.security_context.run_as_group"),
            "{err}"
        );
    }

    #[test]
    fn user_should_reject_negative_ids() {
        let r = rootfs();
        let mut s = sc();
        s.run_as_user = Some(api::Int64Value { value: -1 });
        assert!(matches!(
            user(Some(&s), None, r.path(), None),
            Err(SpecError::Invalid { .. })
        ));
        let mut s = sc();
        s.run_as_user = Some(api::Int64Value { value: 1 });
        s.supplemental_groups = vec![1, -2];
        let err = user(Some(&s), None, r.path(), None).expect_err("should fail");
        assert!(err.to_string().contains("supplemental_groups[1]"), "{err}");
    }

    #[test]
    fn user_should_merge_the_image_groups_by_default_and_skip_them_when_strict() {
        let r = rootfs();
        let mut s = sc();
        s.run_as_user = Some(api::Int64Value { value: 1000 });
        s.supplemental_groups = vec![1234, 50];
        let merged = user(Some(&s), None, r.path(), None).expect("user");
        assert_eq!((merged.uid, merged.gid), (1000, 1000));
        assert_eq!(merged.additional_gids, [1000, 50, 1234]);
        s.supplemental_groups_policy = api::SupplementalGroupsPolicy::Merge as i32;
        assert_eq!(user(Some(&s), None, r.path(), None).expect("user"), merged);
        s.supplemental_groups_policy = api::SupplementalGroupsPolicy::Strict as i32;
        let strict = user(Some(&s), None, r.path(), None).expect("user");
        assert_eq!(strict.additional_gids, [1000, 1234, 50]);
        s.supplemental_groups_policy = 7;
        let err = user(Some(&s), None, r.path(), None).expect_err("unknown policy");
        assert!(
            err.to_string()
                .contains("linux.security_context.supplemental_groups_policy"),
            "{err}"
        );
    }

    #[test]
    fn user_should_skip_etc_group_with_the_strict_policy() {
        let r = rootfs();
        let mut s = sc();
        s.run_as_user = Some(api::Int64Value { value: 1000 });
        s.supplemental_groups_policy = api::SupplementalGroupsPolicy::Strict as i32;
        let u = user(Some(&s), None, r.path(), None).expect("user");
        assert_eq!(u.additional_gids, [1000]);
    }
}
