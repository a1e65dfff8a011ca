//! PullImage against a real registry (Debian's docker-registry on
//! 127.0.0.1, filled with skopeo): by tag and digest, multi-arch index,
//! htpasswd auth, a hosts.toml mirror for registry.k8s.io, an HTTPS registry
//! trusted through `ca` or `skip_verify`, a full disk, hostile manifests
//! (oversized, malformed, unsupported media types), concurrent pulls
//! downloading each blob once, a tampered blob, unknown and unreachable;
//! `petrel ctl pull`'s per-layer progress and the admin API's streaming
//! PullImage behind it.
//! Without docker-registry/skopeo/htpasswd these tests fail saying which
//! package to install.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use petrel_cri::{admin, api};
use petrel_testkit::prelude::*;
use petrel_testkit::registry::LocalRegistry as Registry;

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
    assert!(err.message().contains("401 Unauthorized"), "{err:?}");

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
async fn https_registry_should_need_its_ca_or_skip_verify() {
    let want_id = busybox_id().await;
    let reg = Registry::start_tls();
    reg.push(&busybox_archive(), "petrel/busybox:tls");
    let certs = tempfile::tempdir().expect("tempdir");
    let dir = certs.path().join(reg.host());
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::copy(reg.ca_pem(), dir.join("registry-ca.pem")).expect("copy CA");
    // Loopback is plain HTTP by default: the hosts.toml says HTTPS, and
    // how to trust it. The runtime reads the file at each pull.
    let hosts = |extra: &str| {
        std::fs::write(
            dir.join("hosts.toml"),
            format!("server = \"https://{}\"\n{extra}", reg.host()),
        )
        .expect("write hosts.toml")
    };
    let node = Node::start_with(&format!(
        "[cri.registry]\nconfig_path = {:?}\n",
        certs.path()
    ));
    let mut c = node.clients().await;
    let r = format!("{}/petrel/busybox:tls", reg.host());

    hosts("");
    let err = pull(&mut c, &r).await.expect_err("a CA nobody trusts");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains(&reg.host()), "{err:?}");
    assert!(
        err.message().to_lowercase().contains("certificate"),
        "{err:?}"
    );
    assert_eq!(image_count(&mut c).await, 0);

    // `ca` relative to the hosts.toml's directory.
    hosts("ca = \"registry-ca.pem\"\n");
    assert_eq!(pull(&mut c, &r).await.expect("pull with ca"), want_id);
    c.img
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: r.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("remove");
    assert_eq!(image_count(&mut c).await, 0);

    hosts("skip_verify = true\n");
    assert_eq!(pull(&mut c, &r).await.expect("pull skip_verify"), want_id);
}

/// Free bytes of the filesystem holding `p`.
fn free_bytes(p: &Path) -> u64 {
    let c = std::ffi::CString::new(p.display().to_string()).expect("cstring");
    // SAFETY: statvfs(3) with a valid path and a zeroed out-struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bavail * st.f_frsize
}

#[tokio::test]
async fn a_full_disk_should_fail_the_pull_and_leave_nothing() {
    const MIB: usize = 1 << 20;
    let reg = Registry::start();
    let layouts = tempfile::tempdir().expect("tempdir");
    // More than the whole disk: fails while downloading.
    let big =
        petrel_testkit::oci_layout::random_image(&layouts.path().join("big"), &[MIB, 24 * MIB]);
    reg.push_from(&big, "petrel/big:1");
    // The download fits, unpacking it beside the blob does not.
    let mid = petrel_testkit::oci_layout::random_image(&layouts.path().join("mid"), &[10 * MIB]);
    reg.push_from(&mid, "petrel/mid:1");
    reg.push(&busybox_archive(), "petrel/busybox:1");

    let node = Node::start_on_tmpfs("16m");
    let mut c = node.clients().await;
    let before = free_bytes(&node.root);
    // Where each fills the disk: the download, then the unpacking.
    for (name, at) in [
        ("petrel/big:1", "images/tmp/blob-"),
        ("petrel/mid:1", "write file"),
    ] {
        let err = pull(&mut c, &format!("{}/{name}", reg.host()))
            .await
            .expect_err("disk full");
        assert_eq!(
            err.code(),
            tonic::Code::ResourceExhausted,
            "{name}: {err:?}"
        );
        assert!(
            err.message().contains("No space left on device") && err.message().contains(at),
            "{name}: {err:?}"
        );
        assert_eq!(image_count(&mut c).await, 0, "{name}");
        assert_eq!(
            dir_entries(&node.root.join("images/layers")),
            Vec::<String>::new(),
            "{name}"
        );
        assert_eq!(
            dir_entries(&node.root.join("images/tmp")),
            Vec::<String>::new(),
            "{name}"
        );
        let after = free_bytes(&node.root);
        assert!(
            after + (MIB as u64) / 4 >= before,
            "{name}: {} bytes not given back",
            before - after
        );
    }
    // The runtime is fine and the space is back: a small image pulls and runs.
    let r = format!("{}/petrel/busybox:1", reg.host());
    pull(&mut c, &r).await.expect("pull after a full disk");
    run_echo(&node, &mut c, &r).await;
}

/// A hostile registry on 127.0.0.1: answers `GET <path>` with the body and
/// content type it was given, 404 otherwise; plain HTTP/1.1, one request
/// per connection. Stops with the value.
struct HostileRegistry {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostileRegistry {
    fn start(routes: Vec<(String, &'static str, Vec<u8>)>) -> HostileRegistry {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = conn.set_nonblocking(false);
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&req);
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let (status, ctype, body): (&str, &str, &[u8]) = if path == "/v2/" {
                    ("200 OK", "application/json", b"{}")
                } else {
                    match routes.iter().find(|(p, _, _)| *p == path) {
                        Some((_, t, b)) => ("200 OK", t, b),
                        None => ("404 Not Found", "application/json", b"{}"),
                    }
                };
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes());
                let _ = conn.write_all(body);
            }
        });
        HostileRegistry {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test]
async fn hostile_manifests_should_be_refused_and_nothing_stored() {
    let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let oci = "application/vnd.oci.image.manifest.v1+json";
    let odd_layer = format!(
        r#"{{"schemaVersion":2,"mediaType":"{oci}","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":2}},"layers":[{{"mediaType":"application/x-petrel-thing","digest":"{}","size":2}}]}}"#,
        digest('a'),
        digest('b')
    );
    let routes = vec![
        // Over the 4 MiB limit.
        (
            "/v2/h/big/manifests/1".to_string(),
            oci,
            vec![b' '; 5 * 1024 * 1024],
        ),
        (
            "/v2/h/bad/manifests/1".to_string(),
            oci,
            b"{not json".to_vec(),
        ),
        (
            "/v2/h/v1/manifests/1".to_string(),
            "application/vnd.docker.distribution.manifest.v1+prettyjws",
            br#"{"schemaVersion":1,"name":"h/v1","tag":"1","fsLayers":[]}"#.to_vec(),
        ),
        (
            "/v2/h/odd/manifests/1".to_string(),
            oci,
            odd_layer.into_bytes(),
        ),
    ];
    let hostile = HostileRegistry::start(routes);
    let node = Node::start();
    let mut c = node.clients().await;
    for (name, says) in [
        ("big", "larger than"),
        ("bad", "not a manifest"),
        ("v1", "manifest media type"),
        ("odd", "layer media type"),
    ] {
        let r = format!("127.0.0.1:{}/h/{name}:1", hostile.port);
        let err = pull(&mut c, &r).await.expect_err(name);
        assert_eq!(
            err.code(),
            tonic::Code::FailedPrecondition,
            "{name}: {err:?}"
        );
        assert!(err.message().contains(says), "{name}: {err:?}");
        assert!(err.message().contains(&r), "{name}: {err:?}");
    }
    assert_eq!(image_count(&mut c).await, 0);
    assert_eq!(
        dir_entries(&node.root.join("images/tmp")),
        Vec::<String>::new()
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

/// Pushes an image of three random 256 KiB layers as `<host>/<name_tag>`.
fn push_three_layers(reg: &Registry, name_tag: &str) {
    let dir = reg
        .dir()
        .join(format!("layout-{}", name_tag.replace(['/', ':'], "_")));
    let source = petrel_testkit::oci_layout::random_image(&dir, &[256 << 10; 3]);
    reg.push_from(&source, name_tag);
}

/// The layer digests and config digest (the image id) of a pushed image.
fn layers_and_id(reg: &Registry, name_tag: &str) -> (Vec<String>, String) {
    let (raw, _) = reg.manifest(name_tag);
    let m: serde_json::Value = serde_json::from_slice(&raw).expect("manifest json");
    let layers = m["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| l["digest"].as_str().expect("digest").to_string())
        .collect();
    let id = m["config"]["digest"].as_str().expect("config").to_string();
    (layers, id)
}

/// `sha256:` and 12 hex digits, as `petrel ctl pull` names a layer.
fn short(digest: &str) -> &str {
    &digest[..7 + 12]
}

#[tokio::test]
async fn ctl_pull_should_show_each_layer_then_the_image_id() {
    let reg = Registry::start();
    push_three_layers(&reg, "petrel/layered:1");
    let (layers, id) = layers_and_id(&reg, "petrel/layered:1");
    assert_eq!(layers.len(), 3, "{layers:?}");
    let r = format!("{}/petrel/layered:1", reg.host());

    // Not a terminal: a line per layer and state change, then the id.
    let node = Node::start();
    let out = ok(&node, &["pull", &r]);
    let lines: Vec<&str> = out.lines().collect();
    for d in &layers {
        let done = format!("{}  done ", short(d));
        assert!(
            lines.iter().any(|l| l.starts_with(&done)),
            "no {done:?} line in:\n{out}"
        );
    }
    assert_eq!(
        lines.last().copied(),
        Some(format!("Image is up to date for {id}").as_str()),
        "{out}"
    );
    let mut c = node.clients().await;
    assert_eq!(status(&mut c, &r).await.map(|i| i.id), Some(id.clone()));
    assert_eq!(
        dir_entries(&node.root.join("images/layers")).len(),
        3,
        "a directory per layer"
    );

    // Again: every layer is in the store already.
    let out = ok(&node, &["pull", &r]);
    for d in &layers {
        let line = format!("{}  already exists", short(d));
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    assert!(!out.contains("downloading"), "{out}");

    // -q: the id alone.
    let node2 = Node::start();
    assert_eq!(ok(&node2, &["pull", "-q", &r]), format!("{id}\n"));

    // A failure is reported with its code, and nothing is stored.
    let o = ctl(
        &node2,
        &["pull", &format!("{}/petrel/layered:nope", reg.host())],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("NotFound"), "{err}");
    assert_eq!(image_count(&mut node2.clients().await).await, 1);
}

/// Reads a streamed pull to its end: every message, or the error status.
async fn stream_pull(
    c: &mut Clients,
    reference: &str,
) -> (Vec<admin::PullImageProgress>, Result<String, tonic::Status>) {
    let req = admin::AdminPullImageRequest {
        image: reference.to_string(),
        auth: None,
    };
    let mut msgs = Vec::new();
    let mut stream = match c.admin.pull_image(req).await {
        Ok(s) => s.into_inner(),
        Err(e) => return (msgs, Err(e)),
    };
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                let id = m.image_ref.clone();
                msgs.push(m);
                if !id.is_empty() {
                    return (msgs, Ok(id));
                }
            }
            Ok(None) => return (msgs, Err(tonic::Status::unknown("stream ended early"))),
            Err(e) => return (msgs, Err(e)),
        }
    }
}

#[tokio::test]
async fn streaming_pull_should_report_every_layer_or_the_cri_error() {
    let reg = Registry::start();
    push_three_layers(&reg, "petrel/layered:2");
    let (layers, id) = layers_and_id(&reg, "petrel/layered:2");
    let r = format!("{}/petrel/layered:2", reg.host());
    let node = Node::start();
    let mut c = node.clients().await;

    let (msgs, result) = stream_pull(&mut c, &r).await;
    assert_eq!(result.expect("streamed pull"), id);
    let last = msgs.last().expect("messages");
    let digests: Vec<&str> = last.layers.iter().map(|l| l.digest.as_str()).collect();
    assert_eq!(digests, layers);
    for l in &last.layers {
        assert_eq!(l.state(), admin::LayerState::Done, "{l:?}");
        assert_eq!(l.done, l.size, "{l:?}");
    }
    // Snapshots only move forward, and each layer was seen downloaded.
    for (i, _) in layers.iter().enumerate() {
        let states: Vec<i32> = msgs
            .iter()
            .filter_map(|m| m.layers.get(i).map(|l| l.state))
            .collect();
        assert!(states.windows(2).all(|w| w[0] <= w[1]), "{states:?}");
        let dones: Vec<u64> = msgs
            .iter()
            .filter_map(|m| m.layers.get(i).map(|l| l.done))
            .collect();
        assert!(dones.windows(2).all(|w| w[0] <= w[1]), "{dones:?}");
    }

    // Unknown tag: NOT_FOUND naming the reference, as CRI PullImage says,
    // and nothing stored.
    let node2 = Node::start();
    let mut c2 = node2.clients().await;
    let unknown = format!("{}/petrel/layered:nope", reg.host());
    let (_, result) = stream_pull(&mut c2, &unknown).await;
    let err = result.expect_err("unknown tag");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert!(err.message().contains(&unknown), "{err:?}");
    let cri = pull(&mut c2, &unknown).await.expect_err("unknown tag");
    assert_eq!(cri.code(), err.code());
    let (_, result) = stream_pull(&mut c2, "").await;
    assert_eq!(
        result.expect_err("empty").code(),
        tonic::Code::InvalidArgument
    );
    assert_eq!(image_count(&mut c2).await, 0);
    assert_eq!(
        dir_entries(&node2.root.join("images/tmp")),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_client_leaving_a_streamed_pull_should_leave_no_debris() {
    let reg = Registry::start();
    push_three_layers(&reg, "petrel/layered:3");
    let (_, id) = layers_and_id(&reg, "petrel/layered:3");
    let node = Node::start();
    let mut c = node.clients().await;
    let req = admin::AdminPullImageRequest {
        image: format!("{}/petrel/layered:3", reg.host()),
        auth: None,
    };
    let mut stream = c.admin.pull_image(req).await.expect("pull").into_inner();
    let first = stream.message().await.expect("first message");
    assert!(first.is_some());
    drop(stream);
    // The pull stops with its client; a commit already begun completes.
    // Either way: the whole image or nothing, and no temp files.
    let root = node.root.clone();
    assert!(
        eventually(Duration::from_secs(5), || dir_entries(
            &root.join("images/tmp")
        )
        .is_empty())
        .await,
        "temp files left: {:?}",
        dir_entries(&root.join("images/tmp"))
    );
    let mut c2 = node.clients().await;
    let layers = dir_entries(&root.join("images/layers")).len();
    match status(&mut c2, &id).await {
        Some(_) => assert_eq!(layers, 3, "{}", node.log()),
        None => assert_eq!(image_count(&mut c2).await, 0),
    }
    // And the image can be pulled again from there.
    let r = format!("{}/petrel/layered:3", reg.host());
    assert_eq!(pull(&mut c2, &r).await.expect("pull again"), id);
    assert_eq!(dir_entries(&root.join("images/layers")).len(), 3);
}

#[tokio::test]
async fn ctl_pull_should_fall_back_to_cri_pull_on_containerd() {
    let Some(cd) = petrel_testkit::local_containerd::Containerd::start(
        petrel_testkit::local_containerd::Version::V17,
    ) else {
        return;
    };
    let reg = Registry::start();
    push_three_layers(&reg, "petrel/layered:cd");
    let (_, id) = layers_and_id(&reg, "petrel/layered:cd");
    let r = format!("{}/petrel/layered:cd", reg.host());
    let run = |args: &[&str]| {
        let o = std::process::Command::new(petrel_bin())
            .arg("ctl")
            .arg("--endpoint")
            .arg(cd.endpoint())
            .args(args)
            .output()
            .expect("run petrel ctl");
        assert!(
            o.status.success(),
            "petrel ctl {args:?}: {}\ncontainerd log:\n{}",
            String::from_utf8_lossy(&o.stderr),
            cd.log()
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // containerd has no Petrel admin API: CRI PullImage, the result only.
    assert_eq!(
        run(&["pull", &r]),
        format!("Image is up to date for {id}\n")
    );
    assert_eq!(run(&["pull", "-q", &r]), format!("{id}\n"));
}

#[tokio::test]
async fn concurrent_streamed_pulls_should_download_once_and_both_finish() {
    let reg = Registry::start();
    push_three_layers(&reg, "petrel/layered:4");
    let (layers, id) = layers_and_id(&reg, "petrel/layered:4");
    let r = format!("{}/petrel/layered:4", reg.host());
    let node = Node::start();
    let c = node.clients().await;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let mut c = c.clone();
        let r = r.clone();
        tasks.push(tokio::spawn(async move { stream_pull(&mut c, &r).await }));
    }
    let mut runs = Vec::new();
    for t in tasks {
        let (msgs, result) = t.await.expect("join");
        assert_eq!(result.expect("streamed pull"), id);
        runs.push(msgs);
    }
    for (i, d) in layers.iter().enumerate() {
        assert_eq!(
            reg.gets(&format!("/v2/petrel/layered/blobs/{d}")),
            1,
            "{d} fetched once"
        );
        // The pull that waited for the other's download never downloads:
        // at most one of them shows the layer downloading.
        let downloading = runs
            .iter()
            .filter(|msgs| {
                msgs.iter().any(|m| {
                    m.layers.get(i).map(|l| l.state()) == Some(admin::LayerState::Downloading)
                })
            })
            .count();
        assert!(downloading <= 1, "layer {d} downloaded by both");
        for msgs in &runs {
            let last = msgs.last().and_then(|m| m.layers.get(i)).map(|l| l.state());
            assert!(
                matches!(
                    last,
                    Some(admin::LayerState::Done) | Some(admin::LayerState::Exists)
                ),
                "{last:?}"
            );
        }
    }
}

/// What a [`StallRegistry`] does with a request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stall {
    /// Accepts connections and never answers anything.
    Everything,
    /// Answers the manifest and the config; a layer blob gets its headers
    /// and its first 64 KiB, then nothing more.
    Blobs,
}

/// One request seen by a [`StallRegistry`]: its path, and when the client
/// closed the connection (None while it is open).
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    closed: Option<std::time::Instant>,
}

/// A registry peer on 127.0.0.1 that stalls (see [`Stall`]), one thread
/// per connection, recording when each connection is closed by the
/// runtime. Image `stall/img:1`: one layer of 8 MiB, never delivered.
struct StallRegistry {
    port: u16,
    layer_digest: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl StallRegistry {
    fn start(mode: Stall) -> StallRegistry {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        use std::sync::{Arc, Mutex};
        let sha = |b: &[u8]| {
            use sha2::Digest;
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
        };
        let layer_size = 8u64 << 20;
        let layer_digest = sha(b"never sent");
        let config = format!(
            r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
            sha(b"never unpacked")
        )
        .into_bytes();
        let config_digest = sha(&config);
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{layer_digest}","size":{layer_size}}}]}}"#,
            config.len()
        )
        .into_bytes();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        let layer_digest2 = layer_digest.clone();
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = conn.set_nonblocking(false);
                let (seen, stop) = (seen2.clone(), stop2.clone());
                let (manifest, config) = (manifest.clone(), config.clone());
                let (config_digest, layer_digest) = (config_digest.clone(), layer_digest2.clone());
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
                    let mut req = Vec::new();
                    let mut buf = [0u8; 4096];
                    let mut index = None;
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let n = match conn.read(&mut buf) {
                            Ok(0) => 0,
                            Ok(n) => n,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) =>
                            {
                                continue
                            }
                            Err(_) => 0,
                        };
                        if n == 0 {
                            // The runtime closed the connection.
                            if let Some(i) = index {
                                let mut s = seen.lock().expect("seen");
                                let e: Option<&mut Seen> = s.get_mut(i);
                                if let Some(e) = e {
                                    e.closed = Some(std::time::Instant::now());
                                }
                            }
                            return;
                        }
                        req.extend_from_slice(&buf[..n]);
                        let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") else {
                            continue;
                        };
                        let head = String::from_utf8_lossy(&req[..end]).into_owned();
                        req.drain(..end + 4);
                        let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                        {
                            let mut s = seen.lock().expect("seen");
                            index = Some(s.len());
                            s.push(Seen {
                                path: path.clone(),
                                closed: None,
                            });
                        }
                        if mode == Stall::Everything {
                            continue;
                        }
                        let reply = |conn: &mut std::net::TcpStream, ctype: &str, body: &[u8]| {
                            let head = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            );
                            let _ = conn.write_all(head.as_bytes());
                            let _ = conn.write_all(body);
                        };
                        if path == "/v2/stall/img/manifests/1" {
                            reply(
                                &mut conn,
                                "application/vnd.oci.image.manifest.v1+json",
                                &manifest,
                            );
                        } else if path == format!("/v2/stall/img/blobs/{config_digest}") {
                            reply(&mut conn, "application/octet-stream", &config);
                        } else if path == format!("/v2/stall/img/blobs/{layer_digest}") {
                            let head = format!(
                                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {layer_size}\r\n\r\n"
                            );
                            let _ = conn.write_all(head.as_bytes());
                            let _ = conn.write_all(&vec![0x1f; 64 << 10]);
                            // Then nothing: read until the runtime hangs up.
                        } else {
                            let _ = conn
                                .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                        }
                    }
                });
            }
        });
        StallRegistry {
            port,
            layer_digest,
            seen,
            stop,
        }
    }

    fn reference(&self) -> String {
        format!("127.0.0.1:{}/stall/img:1", self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    /// The requests for the layer blob, in order.
    fn layer_requests(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.path.ends_with(&self.layer_digest))
            .collect()
    }

    /// Waits until `n` requests for the layer were seen.
    async fn wait_layer_requests(&self, n: usize) {
        assert!(
            eventually(Duration::from_secs(20), || self.layer_requests().len() >= n).await,
            "layer requested {} times: {:?}",
            self.layer_requests().len(),
            self.seen()
        );
    }
}

impl Drop for StallRegistry {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Asserts every connection that requested the layer was closed by the
/// runtime within `within` of `since`.
async fn assert_layer_closed(reg: &StallRegistry, since: std::time::Instant, within: Duration) {
    let closed = eventually(within + Duration::from_secs(2), || {
        reg.layer_requests().iter().all(|s| s.closed.is_some())
    })
    .await;
    let seen = reg.layer_requests();
    assert!(closed, "download still open: {seen:?}");
    for s in seen {
        let after = s.closed.map(|c| c.saturating_duration_since(since));
        assert!(
            after.is_some_and(|a| a <= within),
            "layer connection closed {after:?} after the client gave up"
        );
    }
}

#[tokio::test]
async fn a_cancelled_cri_pull_should_stop_its_download_within_a_second() {
    let reg = StallRegistry::start(Stall::Blobs);
    let node = Node::start();
    let c = node.clients().await;
    let r = reg.reference();
    let mut c1 = c.clone();
    let pulling = tokio::spawn(async move { pull(&mut c1, &r).await });
    reg.wait_layer_requests(1).await;
    // The client gives up: its call is dropped (RST_STREAM).
    pulling.abort();
    let gave_up = std::time::Instant::now();
    assert_layer_closed(&reg, gave_up, Duration::from_secs(1)).await;
    // The partial blob went with the download.
    let tmp = node.root.join("images/tmp");
    assert!(
        eventually(Duration::from_secs(2), || dir_entries(&tmp).is_empty()).await,
        "{:?}",
        dir_entries(&tmp)
    );
    assert_eq!(reg.layer_requests().len(), 1);

    // A deadline (grpc-timeout) gives up the same way.
    let mut c2 = c.clone();
    let mut req = tonic::Request::new(pull_req(&reg.reference(), None));
    req.set_timeout(Duration::from_secs(3));
    let started = std::time::Instant::now();
    let err = c2.img.pull_image(req).await.expect_err("stalled pull");
    assert!(
        matches!(
            err.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    reg.wait_layer_requests(2).await;
    assert_layer_closed(
        &reg,
        started + Duration::from_secs(3),
        Duration::from_secs(1),
    )
    .await;
}

#[tokio::test]
async fn a_cancelled_streamed_pull_should_stop_its_download_within_a_second() {
    let reg = StallRegistry::start(Stall::Blobs);
    let node = Node::start();
    let mut c = node.clients().await;
    let req = admin::AdminPullImageRequest {
        image: reg.reference(),
        auth: None,
    };
    let mut stream = c.admin.pull_image(req).await.expect("pull").into_inner();
    assert!(stream.message().await.expect("first message").is_some());
    reg.wait_layer_requests(1).await;
    drop(stream);
    let gave_up = std::time::Instant::now();
    assert_layer_closed(&reg, gave_up, Duration::from_secs(1)).await;
    let tmp = node.root.join("images/tmp");
    assert!(eventually(Duration::from_secs(2), || dir_entries(&tmp).is_empty()).await);
    assert_eq!(image_count(&mut c).await, 0);
}

#[tokio::test]
async fn a_download_shared_with_a_live_pull_should_go_on_until_both_give_up() {
    let reg = StallRegistry::start(Stall::Blobs);
    let node = Node::start();
    let c = node.clients().await;
    let (mut c1, mut c2) = (c.clone(), c.clone());
    let (r1, r2) = (reg.reference(), reg.reference());
    let first = tokio::spawn(async move { pull(&mut c1, &r1).await });
    reg.wait_layer_requests(1).await;
    let second = tokio::spawn(async move { pull(&mut c2, &r2).await });
    // The second pull waits for the first one's download (one request).
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.abort();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seen = reg.layer_requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        seen[0].closed.is_none(),
        "the download a live pull waits for was stopped: {seen:?}"
    );
    assert!(!second.is_finished());
    second.abort();
    let gave_up = std::time::Instant::now();
    assert_layer_closed(&reg, gave_up, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn ctl_pull_with_a_timeout_should_give_up_on_a_registry_that_never_answers() {
    let reg = StallRegistry::start(Stall::Everything);
    let node = Node::start();
    let r = reg.reference();
    for quiet in [false, true] {
        let before = reg.seen().len();
        let started = std::time::Instant::now();
        let mut args = vec!["--timeout", "2", "pull"];
        if quiet {
            args.push("-q");
        }
        args.push(&r);
        let o = ctl(&node, &args);
        let took = started.elapsed();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert!(
            took >= Duration::from_secs(2) && took < Duration::from_secs(3),
            "petrel ctl --timeout 2 pull took {took:?}: {err}"
        );
        assert!(err.contains("not pulled within 2s"), "{err}");
        assert!(err.contains("DeadlineExceeded"), "{err}");
        // The runtime let go of the registry too.
        let gave_up = std::time::Instant::now();
        let closed = eventually(Duration::from_secs(3), || {
            let s = reg.seen();
            s.len() > before && s[before..].iter().all(|s| s.closed.is_some())
        })
        .await;
        assert!(closed, "registry connection still open: {:?}", reg.seen());
        for s in &reg.seen()[before..] {
            let after = s.closed.map(|c| c.saturating_duration_since(gave_up));
            assert!(
                after.is_some_and(|a| a <= Duration::from_secs(1)),
                "{after:?}"
            );
        }
    }
}
