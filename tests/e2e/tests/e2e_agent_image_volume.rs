//! End-to-end: image volumes (KEP-4639) through `petrel agent` on a real
//! `petrel runtime` with real runc containers. A static pod mounts an
//! imported image read-only (even when its volumeMount says
//! `readOnly: false`, as kubelet does), a subPath of it, and an image that
//! is absent under pull policy Never leaves its container waiting with
//! ErrImageNeverPull.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use petrel_testkit::agent::{container_state, running, Agent};
use petrel_testkit::oci_layout::archive_with_files;
use petrel_testkit::prelude::{eventually, images_dir, Clients, Node, BUSYBOX};

const T: Duration = Duration::from_secs(60);

/// The image the pod mounts: busybox with a file of its own.
const VOLUME_IMAGE: &str = "test.local/agent-image-volume:1";

async fn import_volume_image(c: &mut Clients) {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("volume.tar");
    archive_with_files(
        &images_dir().join("busybox-oci.tar"),
        &archive,
        VOLUME_IMAGE,
        &[("data/hello", "from the image volume\n")],
    );
    c.admin
        .import_image(petrel_cri::admin::ImportImageRequest {
            path: archive.display().to_string(),
            tags: vec![],
        })
        .await
        .expect("import the volume image");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_should_mount_image_volumes_read_only_and_wait_for_absent_ones() {
    let node = Node::start_with_busybox().await;
    let mut c = node.clients().await;
    import_volume_image(&mut c).await;
    let agent = Agent::for_node(&node, &[]);
    let out = node.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();

    let script = "cat /iv/data/hello > /out/seen && cat /sub/hello > /out/sub && \
                  if touch /iv/data/new 2>/out/err; then echo writable; else echo readonly; fi > /out/ro && \
                  exec sleep 3600";
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: iv, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: iv, image: {{reference: {VOLUME_IMAGE}}}}}\n  - {{name: out, hostPath: {{path: {}}}}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sh\", \"-c\", {script:?}]\n    volumeMounts:\n    - {{name: iv, mountPath: /iv, readOnly: false}}\n    - {{name: iv, mountPath: /sub, subPath: data}}\n    - {{name: out, mountPath: /out}}\n",
        out.display()
    );
    agent.write_manifest("iv.yaml", &pod);
    agent.wait_pod("default", "iv", T, "running", |p| running(p, "app"));
    // The shell creates the file before echo fills it: wait for content.
    let done = eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(out.join("ro")).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    assert!(done, "the container did not write its marker");
    let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap();
    assert_eq!(read("seen"), "from the image volume\n");
    assert_eq!(read("sub"), "from the image volume\n");
    assert_eq!(read("ro"), "readonly\n", "write into /iv: {}", read("err"));
    assert!(
        read("err").contains("Read-only file system"),
        "{}",
        read("err")
    );

    // An image that is not present under pull policy Never: the container
    // waits with kubelet's reason, naming the image.
    let absent = "test.local/agent-image-volume-absent:1";
    let never = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: never, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  volumes:\n  - {{name: iv, image: {{reference: {absent}, pullPolicy: Never}}}}\n  containers:\n  - name: app\n    image: {BUSYBOX}\n    imagePullPolicy: IfNotPresent\n    command: [\"sleep\", \"3600\"]\n    volumeMounts:\n    - {{name: iv, mountPath: /iv}}\n"
    );
    agent.write_manifest("never.yaml", &never);
    let p = agent.wait_pod("default", "never", T, "waiting", |p| {
        matches!(container_state(p, "app"), Some(("waiting", w)) if w["reason"] == "ErrImageNeverPull")
    });
    let (_, w) = container_state(&p, "app").unwrap();
    assert!(w["message"].as_str().unwrap_or("").contains(absent), "{w}");

    agent.remove_manifest("iv.yaml");
    agent.remove_manifest("never.yaml");
    agent.wait_gone("default", "iv", T);
    agent.wait_gone("default", "never", T);
}
