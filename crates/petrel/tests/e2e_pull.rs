//! PullImage against a real registry (Debian's docker-registry on
//! 127.0.0.1, filled with skopeo): by tag and digest, multi-arch index,
//! htpasswd auth, a hosts.toml mirror for registry.k8s.io, concurrent pulls
//! downloading each blob once, a tampered blob, unknown and unreachable.
//! Without docker-registry/skopeo/htpasswd these tests fail saying which
//! package to install.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::registry::Registry;
use common::*;
use petrel_cri::api;

/// The busybox test image's config digest (= image id) as an import sees it.
async fn busybox_id() -> String {
    let node = Node::start();
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await
}

fn pull_req(reference: &str, auth: Option<api::AuthConfig>) -> api::PullImageRequest {
    api::PullImageRequest {
        image: Some(api::ImageSpec {
            image: reference.to_string(),
            ..Default::default()
        }),
        auth,
        sandbox_config: None,
    }
}

async fn pull(c: &mut Clients, reference: &str) -> Result<String, tonic::Status> {
    c.img
        .pull_image(pull_req(reference, None))
        .await
        .map(|r| r.into_inner().image_ref)
}

async fn status(c: &mut Clients, reference: &str) -> Option<api::Image> {
    c.img
        .image_status(api::ImageStatusRequest {
            image: Some(api::ImageSpec {
                image: reference.to_string(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .expect("ImageStatus")
        .into_inner()
        .image
}

async fn image_count(c: &mut Clients) -> usize {
    c.img
        .list_images(api::ListImagesRequest { filter: None })
        .await
        .expect("ListImages")
        .into_inner()
        .images
        .len()
}

fn dir_entries(p: &Path) -> Vec<String> {
    std::fs::read_dir(p)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn busybox_archive() -> std::path::PathBuf {
    images_dir().join("busybox-oci.tar")
}

/// Runs `echo` from `image` in a pod and checks its output: the pulled
/// layers really make a rootfs.
async fn run_echo(node: &Node, c: &mut Clients, image: &str) {
    let pc = node.pod_config("pulled");
    let pod = c.run_pod(pc.clone()).await;
    let mut cfg = sh_container("echo", "echo pulled-ok");
    cfg.image = Some(api::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    });
    let id = c.run(&pod, &pc, cfg).await;
    c.wait_state(
        &id,
        api::ContainerState::ContainerExited,
        Duration::from_secs(10),
    )
    .await;
    assert!(read_log(node, "pulled", "echo").contains("pulled-ok"));
    c.remove_pod(&pod).await.expect("remove pod");
}

#[tokio::test]
async fn pull_by_tag_and_by_digest_should_store_the_image_like_an_import() {
    let want_id = busybox_id().await;
    let reg = Registry::start();
    reg.push(&busybox_archive(), "petrel/busybox:1");
    let (_, manifest_digest) = reg.manifest("petrel/busybox:1");
    let name = format!("{}/petrel/busybox", reg.host());

    let node = Node::start();
    let mut c = node.clients().await;
    let id = pull(&mut c, &format!("{name}:1"))
        .await
        .expect("pull by tag");
    assert_eq!(id, want_id);
    let img = status(&mut c, &format!("{name}:1")).await.expect("stored");
    assert_eq!(img.repo_tags, vec![format!("{name}:1")]);
    assert_eq!(img.repo_digests, vec![format!("{name}@{manifest_digest}")]);
    run_echo(&node, &mut c, &format!("{name}:1")).await;
    // Nothing left in the store's temp directory.
    assert_eq!(
        dir_entries(&node.root.join("images/tmp")),
        Vec::<String>::new()
    );

    let node2 = Node::start();
    let mut c2 = node2.clients().await;
    let by_digest = format!("{name}@{manifest_digest}");
    assert_eq!(
        pull(&mut c2, &by_digest).await.expect("pull by digest"),
        want_id
    );
    let img = status(&mut c2, &by_digest).await.expect("stored by digest");
    assert!(img.repo_tags.is_empty(), "{:?}", img.repo_tags);
    assert_eq!(img.repo_digests, vec![by_digest.clone()]);
    // A wrong digest is not found, not mistaken for another manifest.
    let wrong = format!("{name}@sha256:{}", "0".repeat(64));
    let err = pull(&mut c2, &wrong).await.expect_err("unknown digest");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
}

#[tokio::test]
async fn multi_arch_index_should_resolve_to_linux_amd64() {
    let want_id = busybox_id().await;
    let reg = Registry::start();
    reg.push(&busybox_archive(), "petrel/multi:amd64");
    reg.push(&images_dir().join("pause-oci.tar"), "petrel/multi:other");
    let (amd, amd_digest) = reg.manifest("petrel/multi:amd64");
    let (other, other_digest) = reg.manifest("petrel/multi:other");
    // The other platforms come first: only the platform decides.
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{other_digest}","size":{},"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{other_digest}","size":{},"platform":{{"architecture":"amd64","os":"linux","variant":"v3"}}}},
{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{amd_digest}","size":{},"platform":{{"architecture":"amd64","os":"linux"}}}}]}}"#,
        other.len(),
        other.len(),
        amd.len()
    );
    reg.put_manifest(
        "petrel/multi",
        "latest",
        "application/vnd.oci.image.index.v1+json",
        index.as_bytes(),
    );
    let node = Node::start();
    let mut c = node.clients().await;
    let r = format!("{}/petrel/multi:latest", reg.host());
    assert_eq!(pull(&mut c, &r).await.expect("pull index"), want_id);
    let img = status(&mut c, &r).await.expect("stored");
    // The repo digest is the index's, as containerd records it.
    let (_, index_digest) = reg.manifest("petrel/multi:latest");
    assert_eq!(
        img.repo_digests,
        vec![format!("{}/petrel/multi@{index_digest}", reg.host())]
    );

    // An index without linux/amd64: NOT_FOUND saying so, nothing stored.
    let arm_only = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[
{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{other_digest}","size":{},"platform":{{"architecture":"arm64","os":"linux"}}}}]}}"#,
        other.len()
    );
    reg.put_manifest(
        "petrel/multi",
        "arm",
        "application/vnd.oci.image.index.v1+json",
        arm_only.as_bytes(),
    );
    let node2 = Node::start();
    let mut c2 = node2.clients().await;
    let err = pull(&mut c2, &format!("{}/petrel/multi:arm", reg.host()))
        .await
        .expect_err("no amd64");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert!(err.message().contains("linux/amd64"), "{err:?}");
    assert_eq!(image_count(&mut c2).await, 0);
}

#[tokio::test]
async fn auth_should_use_the_requests_credentials() {
    let reg = Registry::start_with(Some(("petrel", "s3cret")));
    reg.push(&busybox_archive(), "private/busybox:1");
    let node = Node::start();
    let mut c = node.clients().await;
    let r = format!("{}/private/busybox:1", reg.host());

    let err = pull(&mut c, &r).await.expect_err("no credentials");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("credentials"), "{err:?}");

    let wrong = api::AuthConfig {
        username: "petrel".into(),
        password: "wrong".into(),
        ..Default::default()
    };
    let err = c
        .img
        .pull_image(pull_req(&r, Some(wrong)))
        .await
        .expect_err("wrong password");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains(&reg.host()), "{err:?}");
    assert_eq!(image_count(&mut c).await, 0);

    let right = api::AuthConfig {
        username: "petrel".into(),
        password: "s3cret".into(),
        ..Default::default()
    };
    c.img
        .pull_image(pull_req(&r, Some(right)))
        .await
        .expect("pull with credentials");
    assert!(status(&mut c, &r).await.is_some());

    // Docker's base64 `auth` field ("petrel:s3cret").
    let node = Node::start();
    let mut c = node.clients().await;
    let field = api::AuthConfig {
        auth: "cGV0cmVsOnMzY3JldA==".into(),
        ..Default::default()
    };
    c.img
        .pull_image(pull_req(&r, Some(field)))
        .await
        .expect("pull with the auth field");

    // Credentials from the config file, for the reference's registry.
    let node = Node::start_with(&format!(
        "[cri.registry.auths.{:?}]\nusername = \"petrel\"\npassword = \"s3cret\"\n",
        reg.host()
    ));
    let mut c = node.clients().await;
    pull(&mut c, &r)
        .await
        .expect("pull with configured credentials");
}

#[tokio::test]
async fn hosts_toml_mirror_should_serve_registry_k8s_io() {
    let want_id = busybox_id().await;
    let reg = Registry::start();
    // The mirror keeps the repository path: registry.k8s.io/pause → pause.
    reg.push(&busybox_archive(), "pause:3.9");
    let certs = tempfile::tempdir().expect("tempdir");
    let dir = certs.path().join("registry.k8s.io");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"https://registry.k8s.io\"\n\n[host.\"http://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  [host.\"http://{}\".header]\n    x-petrel-test = \"mirror\"\n",
            reg.host(),
            reg.host()
        ),
    )
    .expect("write hosts.toml");
    let node = Node::start_with(&format!(
        "[cri.registry]\nconfig_path = {:?}\n",
        certs.path()
    ));
    let mut c = node.clients().await;
    let id = pull(&mut c, "registry.k8s.io/pause:3.9")
        .await
        .expect("pull through the mirror");
    assert_eq!(id, want_id);
    let img = status(&mut c, "registry.k8s.io/pause:3.9")
        .await
        .expect("stored under the upstream name");
    assert_eq!(img.repo_tags, vec!["registry.k8s.io/pause:3.9".to_string()]);
    assert!(reg.gets("/v2/pause/manifests/3.9") >= 1, "{}", reg.log());

    // Not on the mirror: the upstream is tried next (unreachable here, as
    // this machine has no internet) and the answer says so.
    let err = pull(&mut c, "registry.k8s.io/other:1")
        .await
        .expect_err("not mirrored");
    assert!(
        matches!(err.code(), tonic::Code::NotFound | tonic::Code::Unavailable),
        "{err:?}"
    );
}

#[tokio::test]
async fn concurrent_pulls_should_download_each_blob_once() {
    let reg = Registry::start();
    reg.push(&busybox_archive(), "petrel/busybox:shared");
    let (raw, _) = reg.manifest("petrel/busybox:shared");
    let manifest: serde_json::Value = serde_json::from_slice(&raw).expect("manifest json");
    let mut blobs = vec![manifest["config"]["digest"]
        .as_str()
        .expect("config digest")
        .to_string()];
    for l in manifest["layers"].as_array().expect("layers") {
        blobs.push(l["digest"].as_str().expect("digest").to_string());
    }
    let node = Node::start();
    let c = node.clients().await;
    let r = format!("{}/petrel/busybox:shared", reg.host());
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut c = c.clone();
        let r = r.clone();
        tasks.push(tokio::spawn(async move { pull(&mut c, &r).await }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("join").expect("pull"));
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    for b in &blobs {
        assert_eq!(
            reg.gets(&format!("/v2/petrel/busybox/blobs/{b}")),
            1,
            "blob {b} fetched once:\n{}",
            reg.log()
        );
    }
    // A later pull of a present image fetches no blob again.
    pull(&mut c.clone(), &r).await.expect("pull again");
    for b in &blobs {
        assert_eq!(reg.gets(&format!("/v2/petrel/busybox/blobs/{b}")), 1);
    }
}

#[tokio::test]
async fn tampered_blob_should_be_rejected_and_nothing_stored() {
    let reg = Registry::start();
    reg.push(&busybox_archive(), "petrel/busybox:bad");
    let (raw, _) = reg.manifest("petrel/busybox:bad");
    let manifest: serde_json::Value = serde_json::from_slice(&raw).expect("manifest json");
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .expect("layer digest")
        .to_string();
    // Same size, one byte changed: only the digest can tell.
    let path = reg.blob_path(&layer);
    let mut data = std::fs::read(&path).expect("read blob");
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    std::fs::write(&path, &data).expect("tamper");

    let node = Node::start();
    let mut c = node.clients().await;
    let err = pull(&mut c, &format!("{}/petrel/busybox:bad", reg.host()))
        .await
        .expect_err("tampered");
    assert_eq!(err.code(), tonic::Code::DataLoss, "{err:?}");
    assert!(err.message().contains(&layer), "{err:?}");
    assert_eq!(image_count(&mut c).await, 0);
    assert_eq!(
        dir_entries(&node.root.join("images/layers")),
        Vec::<String>::new()
    );
    assert_eq!(
        dir_entries(&node.root.join("images/tmp")),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn unknown_and_unreachable_should_be_not_found_and_unavailable() {
    let reg = Registry::start();
    reg.push(&busybox_archive(), "petrel/busybox:1");
    let node = Node::start();
    let mut c = node.clients().await;

    let unknown_tag = format!("{}/petrel/busybox:nope", reg.host());
    let err = pull(&mut c, &unknown_tag).await.expect_err("unknown tag");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert!(err.message().contains(&unknown_tag), "{err:?}");

    let unknown_repo = format!("{}/petrel/nothing:1", reg.host());
    let err = pull(&mut c, &unknown_repo).await.expect_err("unknown repo");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");

    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let err = pull(&mut c, &format!("127.0.0.1:{port}/x/y:1"))
        .await
        .expect_err("unreachable");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains(&format!("127.0.0.1:{port}")),
        "{err:?}"
    );

    let err = pull(&mut c, "Not A Reference").await.expect_err("invalid");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert_eq!(image_count(&mut c).await, 0);
}
