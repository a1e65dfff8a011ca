//! Synthetic OCI image layouts for tests: each layer one file of random
//! (incompressible) bytes in an uncompressed tar, so a test knows exactly
//! how much a pull downloads and how much its unpacking writes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use sha2::{Digest as _, Sha256};

const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// Writes blob `data` into the layout's store; returns its descriptor.
fn put_blob(dir: &Path, media_type: &str, data: &[u8]) -> serde_json::Value {
    let d = digest(data);
    let path = dir
        .join("blobs/sha256")
        .join(d.trim_start_matches("sha256:"));
    std::fs::write(&path, data).expect("write blob");
    serde_json::json!({ "mediaType": media_type, "digest": d, "size": data.len() })
}

/// A layer holding `/data-<i>`: `size` random bytes.
fn random_layer(i: usize, size: usize) -> Vec<u8> {
    let mut content = vec![0u8; size];
    for chunk in content.chunks_mut(1 << 16) {
        getrandom::getrandom(chunk).expect("random");
    }
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(size as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, format!("data-{i}"), content.as_slice())
        .expect("tar entry");
    b.into_inner().expect("tar")
}

/// Writes an OCI image layout in `dir` (created) whose image, tagged
/// `latest`, has one random layer per entry of `layer_sizes`; returns the
/// skopeo source `oci:<dir>:latest`.
pub fn random_image(dir: &Path, layer_sizes: &[usize]) -> String {
    std::fs::create_dir_all(dir.join("blobs/sha256")).expect("mkdir layout");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
        .expect("write oci-layout");
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    for (i, size) in layer_sizes.iter().enumerate() {
        let tar = random_layer(i, *size);
        diff_ids.push(digest(&tar));
        layers.push(put_blob(dir, LAYER_TAR, &tar));
    }
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Cmd": ["/bin/sh"] },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    let config = put_blob(
        dir,
        "application/vnd.oci.image.config.v1+json",
        config.to_string().as_bytes(),
    );
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": layers,
    });
    let mut desc = put_blob(
        dir,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().as_bytes(),
    );
    desc["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": "latest" });
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": [desc] });
    std::fs::write(dir.join("index.json"), index.to_string()).expect("write index.json");
    format!("oci:{}:latest", dir.display())
}
