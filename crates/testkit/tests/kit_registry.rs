//! The built conformance images, served by the kit's read-only registry:
//! every upstream reference critest pulls resolves, through the path the
//! hosts.toml mirrors send it to, to the manifest the build recorded, and
//! the shared storage refuses writes. Fails when the images are not built
//! (`make conformance-images`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use petrel_testkit::images::ConformanceImages;
use petrel_testkit::registry::LocalRegistry;

/// `curl` with the given arguments; (HTTP status, headers).
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-D", "-", "-w", "%{http_code}"])
        .args(args)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = text
        .rsplit('\n')
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    (code, text)
}

#[test]
fn kit_registry_should_serve_every_reference_critest_pulls() {
    let images = ConformanceImages::locate().unwrap_or_else(|e| panic!("{e}"));
    let reg = LocalRegistry::serve_read_only(&images.registry_storage())
        .unwrap_or_else(|e| panic!("{e}"));
    for want in [
        "registry.k8s.io/e2e-test-images/busybox:1.29-2",
        "registry.k8s.io/e2e-test-images/nginx:1.14-2",
        "registry.k8s.io/e2e-test-images/httpd:2.4.39-4",
        "registry.k8s.io/e2e-test-images/nonewprivs:1.3",
        "registry.k8s.io/pause:3.9",
        "k8s.gcr.io/pause:3.9",
        "gcr.io/k8s-staging-cri-tools/hostnet-nginx-amd64:latest",
        "gcr.io/k8s-staging-cri-tools/test-image-tags:3",
        "gcr.io/k8s-staging-cri-tools/test-image-predefined-group:latest",
        "public.ecr.aws/docker/library/busybox:1-musl",
    ] {
        assert!(
            images.refs.iter().any(|r| r.reference == want),
            "{want} is not in {}",
            images.dir.display()
        );
    }
    for r in &images.refs {
        // The mirror path: the reference without its registry host.
        let (_, path) = r.reference.split_once('/').expect("host/path");
        let (repo, tag) = path.rsplit_once(':').expect("tag");
        let url = format!("http://{}/v2/{repo}/manifests/{tag}", reg.host());
        let (code, headers) = curl(&[
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json",
            &url,
        ]);
        assert_eq!(code, 200, "{}: {headers}", r.reference);
        assert!(
            headers
                .to_ascii_lowercase()
                .contains(&format!("docker-content-digest: {}", r.manifest_digest)),
            "{}: {headers}",
            r.reference
        );
    }
    // Several runs share the storage: it must stay as built.
    let (code, _) = curl(&[
        "-X",
        "POST",
        &format!("http://{}/v2/petrel/write-test/blobs/uploads/", reg.host()),
    ]);
    assert_eq!(code, 405, "a read-only registry refuses uploads");
}

#[test]
fn kit_images_should_share_ids_where_critest_expects_one_image() {
    let images = ConformanceImages::locate().unwrap_or_else(|e| panic!("{e}"));
    let id = |r: &str| {
        images
            .refs
            .iter()
            .find(|x| x.reference == r)
            .map(|x| x.image_id.clone())
            .unwrap_or_else(|| panic!("{r} missing"))
    };
    let cri = "gcr.io/k8s-staging-cri-tools";
    // One image under several tags and registries...
    assert_eq!(
        id(&format!("{cri}/test-image-tags:1")),
        id(&format!("{cri}/test-image-tags:3"))
    );
    assert_eq!(id("registry.k8s.io/pause:3.9"), id("k8s.gcr.io/pause:3.9"));
    // ... and different images where critest counts three.
    let three = [1, 2, 3].map(|n| id(&format!("{cri}/test-image-{n}:latest")));
    assert!(three[0] != three[1] && three[1] != three[2] && three[0] != three[2]);
    assert_ne!(
        id(&format!("{cri}/test-image-tag:test")),
        id(&format!("{cri}/test-image-tag:all"))
    );
}
