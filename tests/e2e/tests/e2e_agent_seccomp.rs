//! End-to-end: the agent applies kubelet's seccomp rules. With
//! `--seccomp-default` a pod that names no profile runs under the runtime's
//! default profile; a pod's or container's `seccompProfile` wins over it
//! (the container's over the pod's); a `Localhost` profile is read from
//! `<agent root>/seccomp`; a manifest whose profile is incomplete or leaves
//! that directory is shown invalid with the field named. Real `petrel
//! runtime`, real runc.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use petrel_testkit::agent::{container_id, pod_yaml, running, Agent};
use petrel_testkit::prelude::{Clients, Node, BUSYBOX};

const T: Duration = Duration::from_secs(30);

/// A busybox container item that sleeps, with `security` (YAML flow
/// mapping, may be empty) as its securityContext.
fn sleeper(name: &str, security: &str) -> String {
    let mut s = format!(
        "  - name: {name}\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n"
    );
    if !security.is_empty() {
        s.push_str(&format!("    securityContext: {security}\n"));
    }
    s
}

/// Runs `script` in the container `name` of running pod `pod`: exit code
/// and output.
async fn exec(
    c: &mut Clients,
    agent: &Agent,
    pod: &str,
    name: &str,
    script: &str,
) -> (i32, String) {
    let p = agent.wait_pod("default", pod, T, "running", |p| running(p, name));
    let id = container_id(&p, name);
    let id = id.split("://").nth(1).unwrap_or(&id).to_string();
    let r = c.exec_sh(&id, script, 10).await;
    let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
    out.push_str(&String::from_utf8_lossy(&r.stderr));
    (r.exit_code, out.trim().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_apply_kubelet_seccomp_rules() {
    let node = Node::start_with_busybox().await;
    let agent = Agent::for_node(&node, &["--seccomp-default"]);
    let profiles = agent.root.join("seccomp/profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("no-mkdir.json"),
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let mut c = node.clients().await;
    let mode = "grep '^Seccomp:' /proc/1/status";

    // Nothing named: --seccomp-default gives RuntimeDefault, which refuses
    // a user namespace to an unprivileged container.
    agent.write_manifest("dflt.yaml", &pod_yaml("dflt", "", &sleeper("c", "")));
    // The pod's Unconfined wins over the default; a container's own
    // Localhost profile wins over the pod's.
    agent.write_manifest(
        "mixed.yaml",
        &pod_yaml(
            "mixed",
            "  securityContext: {seccompProfile: {type: Unconfined}}\n",
            &format!(
                "{}{}",
                sleeper("open", ""),
                sleeper(
                    "lh",
                    "{seccompProfile: {type: Localhost, localhostProfile: profiles/no-mkdir.json}}"
                )
            ),
        ),
    );
    // Bad manifests, refused as the API server would.
    agent.write_manifest(
        "noprofile.yaml",
        &pod_yaml(
            "noprofile",
            "",
            &sleeper("c", "{seccompProfile: {type: Localhost}}"),
        ),
    );
    agent.write_manifest(
        "escape.yaml",
        &pod_yaml(
            "escape",
            "  securityContext: {seccompProfile: {type: Localhost, localhostProfile: ../../etc/p.json}}\n",
            &sleeper("c", ""),
        ),
    );

    let (rc, out) = exec(&mut c, &agent, "dflt", "c", mode).await;
    assert_eq!((rc, out.as_str()), (0, "Seccomp:\t2"));
    let (rc, out) = exec(&mut c, &agent, "dflt", "c", "unshare -U true").await;
    assert!(
        rc != 0 && out.contains("Operation not permitted"),
        "{rc} {out}"
    );

    let (rc, out) = exec(&mut c, &agent, "mixed", "open", mode).await;
    assert_eq!((rc, out.as_str()), (0, "Seccomp:\t0"));
    let (rc, out) = exec(&mut c, &agent, "mixed", "lh", mode).await;
    assert_eq!((rc, out.as_str()), (0, "Seccomp:\t2"));
    let (rc, out) = exec(&mut c, &agent, "mixed", "lh", "mkdir /tmp/d").await;
    assert!(
        rc != 0 && out.contains("Operation not permitted"),
        "{rc} {out}"
    );
    let (rc, out) = exec(&mut c, &agent, "mixed", "lh", "touch /tmp/f && echo ok").await;
    assert_eq!((rc, out.as_str()), (0, "ok"));

    for (pod, want) in [
        (
            "noprofile",
            "spec.containers[0].securityContext.seccompProfile.localhostProfile: Required value",
        ),
        (
            "escape",
            "spec.securityContext.seccompProfile.localhostProfile: Invalid value: \"../../etc/p.json\": must not contain '..'",
        ),
    ] {
        let p = agent.wait_pod("default", pod, T, "InvalidManifest", |p| {
            p["status"]["reason"] == "InvalidManifest"
        });
        let msg = p["status"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(want), "{pod}: {msg}");
    }
    // Nothing of the refused pods reached the runtime.
    let sandboxes = agent.runtime_sandboxes(&node).await;
    assert_eq!(sandboxes.len(), 2, "only dflt and mixed: {sandboxes:?}");
}
