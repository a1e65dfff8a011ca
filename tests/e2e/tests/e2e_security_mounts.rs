//! Mount and identity security with real runc: recursive read-only mounts
//! (KEP-3857) against plain read-only ones on a host directory with a
//! submount, their refusals, and SupplementalGroupsPolicy (KEP-3619) Merge
//! and Strict as the container's processes and ContainerStatus.user see it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use petrel_cri::api;
use petrel_testkit::oci_layout::archive_with_files;
use petrel_testkit::prelude::*;

/// A tmpfs the test mounted, unmounted (lazily) however the test ends.
struct TmpfsGuard(PathBuf);

impl TmpfsGuard {
    fn mount(at: &Path) -> Self {
        std::fs::create_dir_all(at).unwrap();
        rustix::mount::mount(
            "tmpfs",
            at,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            c"size=1m",
        )
        .unwrap_or_else(|e| panic!("mount tmpfs on {}: {e}", at.display()));
        Self(at.to_path_buf())
    }
}

impl Drop for TmpfsGuard {
    fn drop(&mut self) {
        if let Err(e) = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH) {
            eprintln!("unmount {}: {e}", self.0.display());
        }
    }
}

/// Whether this host can make recursive read-only mounts with `runc`,
/// found here independently of the runtime: Linux 5.12 or later
/// (mount_setattr) and a runc whose `features` lists `rro`.
fn host_has_rro(runc: &Path) -> Result<(), String> {
    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    if version < (5, 12) {
        return Err(format!("kernel {release} has no mount_setattr"));
    }
    let out = std::process::Command::new(runc)
        .arg("features")
        .output()
        .map_err(|e| format!("runc features: {e}"))?;
    if !String::from_utf8_lossy(&out.stdout).contains("\"rro\"") {
        return Err("runc does not know the rro mount option".into());
    }
    Ok(())
}

fn bind(host: &Path, at: &str, readonly: bool, recursive: bool) -> api::Mount {
    api::Mount {
        container_path: at.to_string(),
        host_path: host.display().to_string(),
        readonly,
        recursive_read_only: recursive,
        ..Default::default()
    }
}

/// With Debian's runc (1.1.5+ds1, whose `features` lists `rro` here), the
/// default OCI runtime.
#[tokio::test]
async fn recursive_read_only_mounts_should_protect_submounts_where_plain_read_only_does_not() {
    let runc = Path::new(petrel_testkit::conformance::DEFAULT_RUNC);
    rro_on(Node::start(), runc).await;
}

/// The same with the peers' runc (1.5), which user-namespaced pods need.
#[tokio::test]
async fn recursive_read_only_mounts_should_work_with_the_newer_runc_too() {
    if petrel_testkit::peers::left_out("runc") {
        eprintln!("skipped: PETREL_PEERS_SKIP names runc");
        return;
    }
    let runc = petrel_testkit::peers::peer_binary("runc").unwrap_or_else(|e| panic!("{e}"));
    rro_on(Node::start_with_runc(&runc), &runc).await;
}

/// Recursive and plain read-only mounts on `node`, which runs `runc`.
async fn rro_on(node: Node, runc: &Path) {
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let status =
        c.rt.status(api::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    let reported = status.runtime_handlers[0]
        .features
        .as_ref()
        .unwrap()
        .recursive_read_only_mounts;
    let host = host_has_rro(runc);
    assert_eq!(reported, host.is_ok(), "Status against the host: {host:?}");

    // <data>/top is the bound directory, <data>/top/sub a tmpfs under it.
    let data = tempfile::tempdir().unwrap();
    let top = data.path().join("top");
    let _sub = TmpfsGuard::mount(&top.join("sub"));
    let pc = node.pod_config("rro");
    let pod = c.run_pod(pc.clone()).await;

    let mut rro = sh_container("rro", "sleep 600");
    rro.mounts = vec![bind(&top, "/mnt", true, true)];
    let mut plain = sh_container("plain", "sleep 600");
    plain.mounts = vec![bind(&top, "/mnt", true, false)];

    if let Err(why) = host {
        let err = c.create(&pod, &pc, rro).await.expect_err("rro refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(
            err.message().contains("recursive_read_only"),
            "{err}: {why}"
        );
    } else {
        let rro = c.run(&pod, &pc, rro).await;
        for path in ["/mnt/f", "/mnt/sub/f"] {
            let r = c.exec_sh(&rro, &format!("touch {path} 2>&1"), 10).await;
            assert_ne!(r.exit_code, 0, "{path} writable under rro");
            let out = String::from_utf8_lossy(&r.stdout);
            assert!(out.contains("Read-only file system"), "{path}: {out}");
        }
        assert!(!top.join("sub/f").exists() && !top.join("f").exists());
    }

    // Plain read-only: the bound directory is, its submount is not.
    let plain = c.run(&pod, &pc, plain).await;
    let r = c.exec_sh(&plain, "touch /mnt/f", 10).await;
    assert_ne!(r.exit_code, 0, "/mnt writable under ro");
    let r = c.exec_sh(&plain, "touch /mnt/sub/plain", 10).await;
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert!(top.join("sub/plain").exists());

    // Refused, naming the field: rro without readonly, or not private.
    let mut writable = sh_container("w", "true");
    writable.mounts = vec![bind(&top, "/mnt", false, true)];
    let mut slave = sh_container("s", "true");
    slave.mounts = vec![api::Mount {
        propagation: api::MountPropagation::PropagationHostToContainer as i32,
        ..bind(&top, "/mnt", true, true)
    }];
    for cfg in [writable, slave] {
        let err = c.create(&pod, &pc, cfg).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(
            err.message().contains("mounts[0].recursive_read_only"),
            "{err}"
        );
    }

    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris(&pc.metadata.as_ref().unwrap().name);
}

/// The image of the groups test: busybox with user `app` (1000:1000),
/// member of `imagegroup` (50000) in its /etc/group.
const GROUPS_IMAGE: &str = "docker.io/petrel/groups-e2e:latest";

async fn import_groups_image(c: &mut Clients, dir: &Path) {
    let archive = dir.join("groups-oci.tar");
    archive_with_files(
        &images_dir().join("busybox-oci.tar"),
        &archive,
        GROUPS_IMAGE,
        &[
            (
                "etc/passwd",
                "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
            ),
            (
                "etc/group",
                "root:x:0:\napp:x:1000:\nimagegroup:x:50000:app\n",
            ),
        ],
    );
    c.admin
        .import_image(petrel_cri::admin::ImportImageRequest {
            path: archive.display().to_string(),
            tags: vec![],
        })
        .await
        .expect("import the groups image");
}

fn groups_container(name: &str, policy: api::SupplementalGroupsPolicy) -> api::ContainerConfig {
    let mut cfg = sh_container(name, "id -G; sleep 600");
    cfg.image = Some(api::ImageSpec {
        image: GROUPS_IMAGE.to_string(),
        ..Default::default()
    });
    cfg.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            run_as_user: Some(api::Int64Value { value: 1000 }),
            supplemental_groups: vec![1234],
            supplemental_groups_policy: policy as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
    cfg
}

#[tokio::test]
async fn supplemental_groups_policy_should_merge_image_groups_unless_strict() {
    let node = Node::start();
    let mut c = node.clients().await;
    let work = tempfile::tempdir().unwrap();
    import_groups_image(&mut c, work.path()).await;
    let status =
        c.rt.status(api::StatusRequest { verbose: false })
            .await
            .unwrap()
            .into_inner();
    assert!(status.features.unwrap().supplemental_groups_policy);

    let pc = node.pod_config("groups");
    let pod = c.run_pod(pc.clone()).await;
    for (name, policy, groups) in [
        (
            "merge",
            api::SupplementalGroupsPolicy::Merge,
            vec![1000, 1234, 50000],
        ),
        (
            "strict",
            api::SupplementalGroupsPolicy::Strict,
            vec![1000, 1234],
        ),
    ] {
        let id = c.run(&pod, &pc, groups_container(name, policy)).await;
        let shown = groups
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        // The container's first process and an exec'd one.
        let logged = eventually(Duration::from_secs(10), || {
            read_log(&node, "groups", name).contains(&format!(" {shown}\n"))
        })
        .await;
        assert!(logged, "{name}: {}", read_log(&node, "groups", name));
        let r = c.exec_sh(&id, "id -G", 10).await;
        assert_eq!(
            String::from_utf8_lossy(&r.stdout),
            format!("{shown}\n"),
            "{name}"
        );
        let mut user = c
            .status(&id)
            .await
            .user
            .and_then(|u| u.linux)
            .expect("user");
        user.supplemental_groups.sort_unstable();
        assert_eq!(
            user,
            api::LinuxContainerUser {
                uid: 1000,
                gid: 1000,
                supplemental_groups: groups,
            },
            "{name}"
        );
    }

    c.rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await
    .unwrap();
    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris("groups");
}
