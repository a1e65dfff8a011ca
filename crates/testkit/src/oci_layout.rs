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

/// Writes to `out` an OCI image-layout archive of the image in the
/// `base` archive (one image, as `busybox-oci.tar`) with one more layer
/// holding `files` (path in the image, contents; mode 0644), named
/// `reference`: an image of the test's own, e.g. with an `/etc/group` of
/// its choosing.
pub fn archive_with_files(base: &Path, out: &Path, reference: &str, files: &[(&str, &str)]) {
    use std::collections::BTreeMap;
    use std::io::Read as _;
    let mut entries: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let file = std::fs::File::open(base).unwrap_or_else(|e| panic!("open {}: {e}", base.display()));
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries().expect("read base archive") {
        let mut entry = entry.expect("archive entry");
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path().expect("entry path").display().to_string();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).expect("read entry");
        entries.insert(path.trim_start_matches("./").to_string(), data);
    }
    let blob = |entries: &BTreeMap<String, Vec<u8>>, d: &str| -> serde_json::Value {
        let path = format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
        serde_json::from_slice(entries.get(&path).expect("blob in base archive"))
            .expect("json blob")
    };
    let index: serde_json::Value =
        serde_json::from_slice(entries.get("index.json").expect("index.json")).expect("index");
    let desc = &index["manifests"][0];
    let mut manifest = blob(&entries, desc["digest"].as_str().expect("manifest digest"));
    let mut config = blob(
        &entries,
        manifest["config"]["digest"]
            .as_str()
            .expect("config digest"),
    );

    let mut b = tar::Builder::new(Vec::new());
    let mut dirs: Vec<String> = Vec::new();
    for (path, _) in files {
        let mut parent = Path::new(path).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.push(format!("{}/", p.display()));
            parent = p.parent();
        }
    }
    dirs.sort();
    dirs.dedup();
    for dir in dirs {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_mtime(0);
        b.append_data(&mut h, dir, std::io::empty())
            .expect("tar dir");
    }
    for (path, contents) in files {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(contents.len() as u64);
        h.set_mtime(0);
        b.append_data(&mut h, path, contents.as_bytes())
            .expect("tar file");
    }
    let layer = b.into_inner().expect("tar");

    let mut put = |media_type: &str, data: Vec<u8>| -> serde_json::Value {
        let d = digest(&data);
        let desc = serde_json::json!({ "mediaType": media_type, "digest": d, "size": data.len() });
        entries.insert(
            format!("blobs/sha256/{}", d.trim_start_matches("sha256:")),
            data,
        );
        desc
    };
    config["rootfs"]["diff_ids"]
        .as_array_mut()
        .expect("diff_ids")
        .push(digest(&layer).into());
    let layer_desc = put(LAYER_TAR, layer);
    manifest["layers"]
        .as_array_mut()
        .expect("layers")
        .push(layer_desc);
    manifest["config"] = put(
        "application/vnd.oci.image.config.v1+json",
        config.to_string().into_bytes(),
    );
    let mut desc = put(
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().into_bytes(),
    );
    desc["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": reference });
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [desc],
    });
    entries.insert("index.json".into(), index.to_string().into_bytes());

    let out_file =
        std::fs::File::create(out).unwrap_or_else(|e| panic!("create {}: {e}", out.display()));
    let mut b = tar::Builder::new(out_file);
    for (path, data) in &entries {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        b.append_data(&mut h, path, data.as_slice())
            .expect("tar entry");
    }
    b.finish().expect("write archive");
}
