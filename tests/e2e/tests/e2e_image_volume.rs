//! Image volumes (KEP-4639) with real runc: a CRI mount naming an image
//! gets the image's files read-only, ContainerStatus reports the image's
//! id and digest in the mount, `image_sub_path` mounts a directory of the
//! image (one it lacks is refused), the image cannot be removed while a container mounts
//! it, and nothing stays mounted after the container is removed or after a
//! refused create.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use petrel_cri::api;
use petrel_testkit::oci_layout::archive_with_files;
use petrel_testkit::prelude::*;

/// The image the test mounts as a volume: busybox with a file of its own.
const VOLUME_IMAGE: &str = "test.local/image-volume:1";

/// Imports [`VOLUME_IMAGE`]; returns its id.
async fn import_volume_image(c: &mut Clients) -> String {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("volume.tar");
    archive_with_files(
        &images_dir().join("busybox-oci.tar"),
        &archive,
        VOLUME_IMAGE,
        &[("data/hello", "from the image\n")],
    );
    let r = c
        .admin
        .import_image(petrel_cri::admin::ImportImageRequest {
            path: archive.display().to_string(),
            tags: vec![],
        })
        .await
        .expect("import the volume image")
        .into_inner();
    r.images.first().map(|i| i.id.clone()).unwrap()
}

fn image_volume(image: &str, readonly: bool) -> api::Mount {
    api::Mount {
        container_path: "/vol".into(),
        readonly,
        image: Some(api::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The image volumes mounted under this node's bundles.
fn volume_mounts(node: &Node) -> Vec<String> {
    mounts_under(&node.state.join("containers"))
        .into_iter()
        .filter(|m| m.contains("/image-volumes/"))
        .collect()
}

async fn remove_image(c: &mut Clients, id: &str) -> Result<(), tonic::Status> {
    c.img
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: id.to_string(),
                ..Default::default()
            }),
        })
        .await
        .map(|_| ())
}

#[tokio::test]
async fn image_volume_should_show_the_image_read_only_and_hold_it_until_removed() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let volume_id = import_volume_image(&mut c).await;
    let pc = node.pod_config("imgvol");
    let pod = c.run_pod(pc.clone()).await;

    let mut cfg = sh_container("reader", "sleep 600");
    cfg.mounts = vec![image_volume(VOLUME_IMAGE, true)];
    let id = c.run(&pod, &pc, cfg).await;

    let r = c.exec_sh(&id, "cat /vol/data/hello", 10).await;
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(String::from_utf8_lossy(&r.stdout), "from the image\n");
    let r = c.exec_sh(&id, "touch /vol/data/new 2>&1", 10).await;
    assert_ne!(r.exit_code, 0, "the image volume is writable");
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(out.contains("Read-only file system"), "{out}");
    // Not noexec: the image's own binaries run from it.
    let r = c.exec_sh(&id, "/vol/bin/ls /vol/data", 10).await;
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert!(String::from_utf8_lossy(&r.stdout).contains("hello"));

    let status = c.status(&id).await;
    let mount = status
        .mounts
        .iter()
        .find(|m| m.container_path == "/vol")
        .expect("the image volume in ContainerStatus");
    let spec = mount.image.clone().expect("its image");
    assert_eq!(spec.image, volume_id);
    assert_eq!(spec.user_specified_image, VOLUME_IMAGE);
    // The digest (KEP-4639's image_ref): what PullImage answers for it.
    assert_eq!(spec.image_ref, volume_id);

    let err = remove_image(&mut c, &volume_id)
        .await
        .expect_err("an image in use as a volume is kept");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
    assert!(err.message().contains(&id), "{err}");
    let volumes = volume_mounts(&node);
    assert_eq!(volumes.len(), 1, "the volume mounted under the bundle");

    c.stop(&id, 5).await.unwrap();
    c.remove(&id).await.unwrap();
    c.assert_container_gone(&id).await;
    let left = volume_mounts(&node);
    assert!(left.is_empty(), "image volumes still mounted: {left:?}");
    remove_image(&mut c, &volume_id)
        .await
        .expect("removable once no container mounts it");

    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris(&pod);
}

#[tokio::test]
async fn image_volume_should_be_refused_when_writable_or_absent_leaving_nothing() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let pc = node.pod_config("imgvol-refused");
    let pod = c.run_pod(pc.clone()).await;
    for (mount, field) in [
        (image_volume(BUSYBOX, false), "mounts[0].readonly"),
        (
            image_volume("test.local/not-pulled:1", true),
            "config.mounts[0].image.image",
        ),
    ] {
        let mut cfg = sh_container("refused", "sleep 600");
        cfg.mounts = vec![mount];
        let err = c.create(&pod, &pc, cfg).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(err.message().contains(field), "{field}: {err}");
    }
    let left = mounts_under(&node.state.join("containers"));
    assert!(left.is_empty(), "{left:?}");
    // The name is free again: nothing of the refused creates stayed.
    let mut ok = sh_container("refused", "sleep 600");
    ok.mounts = vec![image_volume(BUSYBOX, true)];
    let id = c.run(&pod, &pc, ok).await;
    c.stop(&id, 5).await.unwrap();
    c.remove(&id).await.unwrap();
    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris(&pod);
}

#[tokio::test]
async fn image_volume_should_mount_only_its_sub_path_and_refuse_one_the_image_lacks() {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    let volume_id = import_volume_image(&mut c).await;
    let pc = node.pod_config("imgvol-subpath");
    let pod = c.run_pod(pc.clone()).await;

    let mut cfg = sh_container("sub", "sleep 600");
    cfg.mounts = vec![api::Mount {
        image_sub_path: "./data/".into(),
        ..image_volume(VOLUME_IMAGE, true)
    }];
    let id = c.run(&pod, &pc, cfg).await;
    let r = c.exec_sh(&id, "cat /vol/hello && ls /vol", 10).await;
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        "from the image\nhello\n"
    );
    let r = c.exec_sh(&id, "touch /vol/new 2>&1", 10).await;
    assert_ne!(r.exit_code, 0, "the sub path is writable");
    let status = c.status(&id).await;
    let mount = &status.mounts[0];
    assert_eq!(mount.image_sub_path, "./data/", "reported as asked");
    assert_eq!(
        mount.image.as_ref().map(|i| i.image_ref.as_str()),
        Some(volume_id.as_str())
    );
    c.stop(&id, 5).await.unwrap();
    c.remove(&id).await.unwrap();

    for (sub_path, why) in [
        ("no/such/dir", "does not exist"),
        ("../etc", "escapes the image"),
    ] {
        let mut cfg = sh_container("sub-refused", "sleep 600");
        cfg.mounts = vec![api::Mount {
            image_sub_path: sub_path.into(),
            ..image_volume(VOLUME_IMAGE, true)
        }];
        let err = c.create(&pod, &pc, cfg).await.expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(
            err.message().contains("mounts[0].image_sub_path") && err.message().contains(why),
            "{sub_path}: {err}"
        );
    }
    let left = mounts_under(&node.state.join("containers"));
    assert!(left.is_empty(), "mounts left by refused creates: {left:?}");
    c.remove_pod(&pod).await.unwrap();
    node.assert_no_debris(&pod);
}
