//! Image removal and garbage collection through `petrel ctl`: untag
//! semantics, refusal while a container uses the image, prune, and the
//! threshold GC, with the layers' disk freed; `image export` read back
//! by `image import` and skopeo.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use petrel_cri::api;
use petrel_testkit::prelude::*;

fn layer_count(node: &Node) -> usize {
    std::fs::read_dir(node.root.join("images/layers"))
        .expect("read layers")
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn rmi_should_untag_refuse_in_use_images_and_prune_should_free_layers() {
    let node = Node::start_with_busybox().await;
    let busybox = images_dir().join("busybox-oci.tar");
    let out = ok(
        &node,
        &[
            "image",
            "import",
            busybox.to_str().unwrap(),
            "--tag",
            "docker.io/petrel/extra:1",
        ],
    );
    assert!(out.contains("docker.io/petrel/extra:1"), "{out}");
    let pause = images_dir().join("pause-oci.tar");
    let have_pause = pause.is_file();
    if have_pause {
        ok(&node, &["image", "import", pause.to_str().unwrap()]);
    }
    let layers_before = layer_count(&node);
    assert!(layers_before >= 1);

    // A container from busybox keeps it in use.
    let mut c = node.clients().await;
    let pc = node.pod_config("gc");
    let pod = c.run_pod(pc.clone()).await;
    let ctr = c
        .create(&pod, &pc, sh_container("main", "sleep 100"))
        .await
        .expect("create");

    // One of two tags: untagged, image kept.
    let out = ok(&node, &["rmi", "petrel/extra:1"]);
    assert_eq!(out, "Untagged: docker.io/petrel/extra:1\n");
    assert!(ok(&node, &["images"]).contains("docker.io/petrel/busybox"));

    // Its last tag would remove it: refused while the container exists.
    let o = ctl(&node, &["rmi", "docker.io/petrel/busybox:latest"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("in use"), "{err}");

    // Prune removes only what no container uses.
    let out = ok(&node, &["image", "prune"]);
    assert!(!out.contains("petrel/busybox"), "{out}");
    assert!(out.contains("Total reclaimed space"), "{out}");
    assert!(ok(&node, &["images"]).contains("docker.io/petrel/busybox"));
    if have_pause {
        // The pause image shares its layer with busybox: no layer goes.
        assert!(
            out.contains("Deleted: docker.io/petrel/pause:latest"),
            "{out}"
        );
        assert!(!ok(&node, &["images"]).contains("petrel/pause"));
        assert_eq!(layer_count(&node), layers_before);
    }

    // Threshold GC above 100 % used never runs.
    let out = ok(&node, &["image", "gc", "--high", "100", "--low", "100"]);
    assert_eq!(out, "Total reclaimed space: 0B\n");

    // Once the container is gone, rmi --prune deletes busybox and its layers.
    c.remove(&ctr).await.expect("remove container");
    // Prune spares an image a container was created from in the last 5 s
    // (petrel_image::PRUNE_USE_GUARD): a create may not be listed yet.
    let out = ok(&node, &["rmi", "--prune"]);
    assert_eq!(out, "Total reclaimed space: 0B\n");
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let out = ok(&node, &["rmi", "--prune"]);
    assert!(
        out.contains("Deleted: docker.io/petrel/busybox:latest"),
        "{out}"
    );
    assert!(ok(&node, &["images", "-q"]).trim().is_empty());
    assert_eq!(layer_count(&node), 0);
    c.remove_pod(&pod).await.expect("remove pod");
}

#[tokio::test(flavor = "multi_thread")]
async fn image_export_should_write_an_archive_import_and_skopeo_read() {
    let node = Node::start_with_busybox().await;
    let file = node.dir.path().join("export/busybox.tar");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let out = ok(
        &node,
        &[
            "image",
            "export",
            "petrel/busybox",
            file.to_str().unwrap(),
            "-o",
            "json",
        ],
    );
    let resp: serde_json::Value = serde_json::from_str(&out).expect("json");
    let id = resp["id"].as_str().expect("id").to_string();
    assert!(file.is_file());

    let copy = node.dir.path().join("export/skopeo");
    let o = Command::new("skopeo")
        .arg("copy")
        .arg(format!("oci-archive:{}", file.display()))
        .arg(format!("dir:{}", copy.display()))
        .output()
        .expect("run skopeo (Debian package skopeo)");
    assert!(
        o.status.success(),
        "skopeo: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Replace the image by its export: same name, the export's id.
    ok(&node, &["rmi", "petrel/busybox"]);
    let out = ok(&node, &["image", "import", file.to_str().unwrap()]);
    assert!(out.contains("docker.io/petrel/busybox:latest"), "{out}");
    let ids = ok(&node, &["images", "-q"]);
    assert_eq!(ids.trim(), id);

    // And it runs.
    let mut c = node.clients().await;
    let pc = node.pod_config("export");
    let pod = c.run_pod(pc.clone()).await;
    let ctr = c.run(&pod, &pc, sh_container("main", "echo hi")).await;
    let st = c
        .wait_state(
            &ctr,
            api::ContainerState::ContainerExited,
            std::time::Duration::from_secs(10),
        )
        .await;
    assert_eq!(st.exit_code, 0);
    c.remove(&ctr).await.expect("remove container");
    c.remove_pod(&pod).await.expect("remove pod");
}
