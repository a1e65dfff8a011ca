//! Seccomp with real runc containers: `RuntimeDefault` confines (and blocks
//! user namespaces for an unprivileged container), `Localhost` profiles deny
//! what they name, `Unconfined` and no profile leave the container alone, and
//! a bad profile is INVALID_ARGUMENT leaving nothing behind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use petrel_cri::api;
use petrel_testkit::prelude::*;

use api::security_profile::ProfileType;

fn profile(ty: ProfileType, localhost_ref: &str) -> api::SecurityProfile {
    api::SecurityProfile {
        profile_type: ty as i32,
        localhost_ref: localhost_ref.to_string(),
    }
}

/// `cfg` with `seccomp` in its security context.
fn with_seccomp(
    mut cfg: api::ContainerConfig,
    seccomp: Option<api::SecurityProfile>,
) -> api::ContainerConfig {
    cfg.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .seccomp = seccomp;
    cfg
}

/// `cfg` with the deprecated `seccomp_profile_path`.
#[allow(deprecated)]
fn with_profile_path(mut cfg: api::ContainerConfig, path: &str) -> api::ContainerConfig {
    cfg.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
        .seccomp_profile_path = path.to_string();
    cfg
}

/// The `Seccomp:` mode of a process in container `id` (0 off, 2 filter).
async fn seccomp_mode(c: &mut Clients, id: &str, pid: &str) -> String {
    let r = c
        .exec_sh(id, &format!("grep '^Seccomp:' /proc/{pid}/status"), 10)
        .await;
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    String::from_utf8_lossy(&r.stdout)
        .trim_start_matches("Seccomp:")
        .trim()
        .to_string()
}

/// Runs `script` in container `id`: exit code and stdout+stderr.
async fn sh(c: &mut Clients, id: &str, script: &str) -> (i32, String) {
    let r = c.exec_sh(id, script, 10).await;
    let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
    out.push_str(&String::from_utf8_lossy(&r.stderr));
    (r.exit_code, out)
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

#[tokio::test]
async fn runtime_default_should_confine_and_block_user_namespaces() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("rd");
    let pod = c.run_pod(pc.clone()).await;

    let confined = c
        .run(
            &pod,
            &pc,
            with_seccomp(
                sh_container("confined", "sleep 100"),
                Some(profile(ProfileType::RuntimeDefault, "")),
            ),
        )
        .await;
    // The container's init and exec'd processes are both filtered.
    assert_eq!(seccomp_mode(&mut c, &confined, "1").await, "2");
    assert_eq!(seccomp_mode(&mut c, &confined, "self").await, "2");
    let (rc, out) = sh(&mut c, &confined, "unshare -U true").await;
    assert_ne!(rc, 0, "unshare -U succeeded under RuntimeDefault: {out}");
    assert!(out.contains("Operation not permitted"), "{out}");
    // Ordinary work goes on.
    let (rc, out) = sh(
        &mut c,
        &confined,
        "mkdir /tmp/d && touch /tmp/d/f && ls /tmp/d",
    )
    .await;
    assert_eq!((rc, out.trim()), (0, "f"));

    // The same without a profile (and with Unconfined, and the deprecated
    // `runtime/default` for contrast): only the filter made the difference.
    let open = c.run(&pod, &pc, sh_container("open", "sleep 100")).await;
    assert_eq!(seccomp_mode(&mut c, &open, "1").await, "0");
    let (rc, out) = sh(&mut c, &open, "unshare -U true").await;
    assert_eq!(rc, 0, "unshare -U failed unconfined: {out}");
    let unconfined = c
        .run(
            &pod,
            &pc,
            with_seccomp(
                sh_container("unconfined", "sleep 100"),
                Some(profile(ProfileType::Unconfined, "")),
            ),
        )
        .await;
    assert_eq!(seccomp_mode(&mut c, &unconfined, "1").await, "0");
    let old_form = c
        .run(
            &pod,
            &pc,
            with_profile_path(sh_container("old-form", "sleep 100"), "runtime/default"),
        )
        .await;
    assert_eq!(seccomp_mode(&mut c, &old_form, "1").await, "2");
}

#[tokio::test]
async fn localhost_profile_should_deny_the_syscalls_it_names() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let profile_path = node.dir.path().join("no-mkdir.json");
    write(
        &profile_path,
        r#"{
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
            "syscalls": [
                {"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"},
                {"names": ["sethostname"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13}
            ]
        }"#,
    );
    let path = profile_path.display().to_string();
    let mut pc = node.pod_config("lh");
    // The pod may name the profile too: it is checked, not applied.
    pc.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .seccomp = Some(profile(ProfileType::Localhost, &path));
    let pod = c.run_pod(pc.clone()).await;

    let mut cfg = with_seccomp(
        sh_container("lh", "sleep 100"),
        Some(profile(ProfileType::Localhost, &path)),
    );
    // With SYS_ADMIN, only the profile can refuse sethostname.
    cfg.linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .capabilities = Some(api::Capability {
        add_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    let id = c.run(&pod, &pc, cfg).await;
    assert_eq!(seccomp_mode(&mut c, &id, "1").await, "2");
    let (rc, out) = sh(&mut c, &id, "mkdir /tmp/d").await;
    assert_ne!(rc, 0, "mkdir succeeded: {out}");
    assert!(out.contains("Operation not permitted"), "{out}");
    let (rc, out) = sh(&mut c, &id, "hostname other").await;
    assert_ne!(rc, 0, "sethostname succeeded: {out}");
    assert!(
        out.contains("Permission denied"),
        "errnoRet 13 is EACCES: {out}"
    );
    let (rc, out) = sh(&mut c, &id, "touch /tmp/f && ls /tmp").await;
    assert_eq!((rc, out.trim()), (0, "f"), "other syscalls work");

    // The deprecated `localhost/<path>` form names the same profile.
    let old = c
        .run(
            &pod,
            &pc,
            with_profile_path(
                sh_container("old", "sleep 100"),
                &format!("localhost/{path}"),
            ),
        )
        .await;
    let (rc, out) = sh(&mut c, &old, "mkdir /tmp/d").await;
    assert!(
        rc != 0 && out.contains("Operation not permitted"),
        "{rc} {out}"
    );
}

#[tokio::test]
async fn bad_profiles_should_be_invalid_and_leave_nothing() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let dir = node.dir.path();
    let malformed = dir.join("malformed.json");
    write(
        &malformed,
        r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir"]"#,
    );
    let bad_action = dir.join("bad-action.json");
    write(&bad_action, r#"{"defaultAction": "SCMP_ACT_SOMETIMES"}"#);
    let docker_form = dir.join("docker.json");
    write(
        &docker_form,
        r#"{"defaultAction": "SCMP_ACT_ERRNO", "archMap": [{"architecture": "SCMP_ARCH_X86_64"}]}"#,
    );
    let missing = dir.join("missing.json");
    let show = |p: &Path| p.display().to_string();
    let localhost = |p: &str| Some(profile(ProfileType::Localhost, p));

    let pc = node.pod_config("bad");
    let pod = c.run_pod(pc.clone()).await;
    let field = "config.linux.security_context.seccomp";
    let cases = [
        (
            "missing",
            localhost(&show(&missing)),
            None,
            format!("{field}.localhost_ref"),
            show(&missing),
        ),
        (
            "malformed",
            localhost(&show(&malformed)),
            None,
            format!("{field}.localhost_ref"),
            "not valid JSON".into(),
        ),
        (
            "bad action",
            localhost(&show(&bad_action)),
            None,
            format!("{field}.localhost_ref"),
            "SCMP_ACT_SOMETIMES".into(),
        ),
        (
            "docker form",
            localhost(&show(&docker_form)),
            None,
            format!("{field}.localhost_ref"),
            "archMap".into(),
        ),
        (
            "relative",
            localhost("profile.json"),
            None,
            format!("{field}.localhost_ref"),
            "absolute".into(),
        ),
        (
            "ref with RuntimeDefault",
            Some(profile(ProfileType::RuntimeDefault, "/x.json")),
            None,
            format!("{field}.localhost_ref"),
            "Localhost".into(),
        ),
        (
            "unknown type",
            Some(api::SecurityProfile {
                profile_type: 7,
                localhost_ref: String::new(),
            }),
            None,
            format!("{field}.profile_type"),
            "7".into(),
        ),
        (
            "unknown path form",
            None,
            Some("default"),
            format!("{field}_profile_path"),
            "default".into(),
        ),
        (
            "missing path form",
            None,
            Some(&*format!("localhost/{}", show(&missing))),
            format!("{field}_profile_path"),
            show(&missing),
        ),
    ];
    for (what, seccomp, path, field, detail) in cases {
        let mut cfg = with_seccomp(sh_container("x", "true"), seccomp);
        if let Some(p) = path {
            cfg = with_profile_path(cfg, p);
        }
        let e = c.create(&pod, &pc, cfg).await.expect_err(what);
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(
            e.message().contains(&field),
            "{what}: {field} not in {:?}",
            e.message()
        );
        assert!(
            e.message().contains(&detail),
            "{what}: {detail} not in {:?}",
            e.message()
        );
    }
    let list =
        c.rt.list_containers(api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner();
    assert!(
        list.containers.is_empty(),
        "a refused create left {:?}",
        list.containers
    );
    for d in ["state/containers", "root/containers"] {
        let n = std::fs::read_dir(dir.join(d))
            .map(|it| it.count())
            .unwrap_or(0);
        assert_eq!(n, 0, "{d} not empty after refused creates");
    }
    let pod_cg = Node::cgroup_dir("memory", &format!("{}/bad", node.cgroup_parent));
    let children = std::fs::read_dir(&pod_cg)
        .map(|it| it.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0);
    assert_eq!(children, 0, "container cgroup left");
    // The name is free: the same container with a good profile runs.
    let id = c
        .run(
            &pod,
            &pc,
            with_seccomp(
                sh_container("x", "sleep 100"),
                Some(profile(ProfileType::RuntimeDefault, "")),
            ),
        )
        .await;
    assert_eq!(seccomp_mode(&mut c, &id, "1").await, "2");

    // A pod naming a missing profile is refused before it exists.
    let mut bad_pod = node.pod_config("badpod");
    bad_pod
        .linux
        .as_mut()
        .unwrap()
        .security_context
        .as_mut()
        .unwrap()
        .seccomp = localhost(&show(&missing));
    let e =
        c.rt.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(bad_pod),
            runtime_handler: String::new(),
        })
        .await
        .expect_err("RunPodSandbox with a missing profile");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains(&format!("{field}.localhost_ref")),
        "{}",
        e.message()
    );
    let pods =
        c.rt.list_pod_sandbox(api::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items;
    assert_eq!(pods.len(), 1, "only the good pod: {pods:?}");
    let pod_cg = Node::cgroup_dir("memory", &format!("{}/badpod", node.cgroup_parent));
    assert!(
        !pod_cg.exists(),
        "refused pod's cgroup {} left",
        pod_cg.display()
    );
}
