//! Helpers shared by the integration tests: hand-made OCI archives.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest, Sha256};

/// The test archives, built into a temp dir of their own.
pub struct Archives {
    dir: tempfile::TempDir,
}

impl Archives {
    /// Runs scripts/build-test-image.sh into a new temp dir.
    pub fn build() -> Archives {
        assert!(
            Path::new("/bin/busybox").exists(),
            "/bin/busybox is missing: install Debian's busybox-static to build the test image"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-test-image.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(dir.path())
            .output()
            .expect("run build-test-image.sh");
        assert!(
            out.status.success(),
            "build-test-image.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Archives { dir }
    }
    /// The OCI image-layout archive.
    pub fn oci(&self) -> PathBuf {
        self.dir.path().join("busybox-oci.tar")
    }
    /// The docker archive.
    pub fn docker(&self) -> PathBuf {
        self.dir.path().join("busybox-docker.tar")
    }
    /// A path in the archives' temp dir.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// `sha256:<hex>` of `data`.
pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// The diff id of a gzip (or zstd, or plain) layer.
pub fn diff_id_of_gzip(layer: &[u8]) -> String {
    let mut raw = Vec::new();
    if layer.starts_with(ZSTD_MAGIC) {
        raw = zstd::stream::decode_all(layer).expect("unzstd");
    } else if !layer.starts_with(&[0x1f, 0x8b]) {
        raw = layer.to_vec();
    } else {
        let mut d = flate2::read::GzDecoder::new(layer);
        d.read_to_end(&mut raw).expect("gunzip");
    }
    sha256(&raw)
}

/// The OCI media type of a gzip or zstd layer blob (a plain one is
/// labelled gzip too: a hostile archive's lie).
fn layer_media_type(layer: &[u8]) -> &'static str {
    if layer.starts_with(ZSTD_MAGIC) {
        "application/vnd.oci.image.layer.v1.tar+zstd"
    } else {
        "application/vnd.oci.image.layer.v1.tar+gzip"
    }
}

/// Appends a regular file.
pub fn append(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, name, data).expect("append");
}

/// One image of a hand-made OCI archive.
pub struct TestImage<'a> {
    pub annotations: serde_json::Value,
    pub platform: Option<(&'a str, &'a str)>,
    pub cmd: &'a str,
    pub arch: &'a str,
    pub layers: Vec<Vec<u8>>,
}

impl<'a> TestImage<'a> {
    pub fn new(ref_name: Option<&str>, cmd: &'a str, layers: Vec<Vec<u8>>) -> Self {
        let annotations = match ref_name {
            Some(r) => json!({ "org.opencontainers.image.ref.name": r }),
            None => json!({}),
        };
        TestImage {
            annotations,
            platform: None,
            cmd,
            arch: "amd64",
            layers,
        }
    }
}

/// Writes an OCI image-layout archive; `nested` puts all images in one
/// nested index (a multi-platform image) under the first one's annotations.
pub fn write_oci_archive(path: &Path, images: &[TestImage], nested: bool) -> Vec<String> {
    let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut descs = Vec::new();
    let mut ids = Vec::new();
    for img in images {
        let diff_ids: Vec<String> = img.layers.iter().map(|l| diff_id_of_gzip(l)).collect();
        let config = serde_json::to_vec(&json!({
            "architecture": img.arch, "os": "linux",
            "config": { "Cmd": [img.cmd] },
            "rootfs": { "type": "layers", "diff_ids": diff_ids },
        }))
        .expect("config json");
        let cd = sha256(&config);
        ids.push(cd.clone());
        let layer_descs: Vec<_> = img
            .layers
            .iter()
            .map(|l| {
                let d = sha256(l);
                blobs.insert(d.clone(), l.clone());
                json!({ "mediaType": layer_media_type(l), "digest": d, "size": l.len() })
            })
            .collect();
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len() },
            "layers": layer_descs,
        }))
        .expect("manifest json");
        blobs.insert(cd, config);
        let md = sha256(&manifest);
        let mut desc = json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": md, "size": manifest.len(), "annotations": img.annotations,
        });
        if let Some((os, arch)) = img.platform {
            desc["platform"] = json!({ "os": os, "architecture": arch });
        }
        blobs.insert(md, manifest);
        descs.push(desc);
    }
    if nested {
        let inner = serde_json::to_vec(&json!({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": descs,
        }))
        .expect("index json");
        let d = sha256(&inner);
        descs = vec![json!({
            "mediaType": "application/vnd.oci.image.index.v1+json", "digest": d, "size": inner.len(),
            "annotations": images[0].annotations,
        })];
        blobs.insert(d, inner);
    }
    let index =
        serde_json::to_vec(&json!({ "schemaVersion": 2, "manifests": descs })).expect("index");
    let mut b = tar::Builder::new(Vec::new());
    append(&mut b, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    append(&mut b, "index.json", &index);
    for (d, data) in &blobs {
        append(&mut b, &format!("blobs/sha256/{}", &d[7..]), data);
    }
    std::fs::write(path, b.into_inner().expect("finish tar")).expect("write archive");
    ids
}

/// A small gzip layer holding one file.
pub fn small_layer(name: &str, content: &[u8]) -> Vec<u8> {
    gzip_layer(&[(name, Some(content))])
}

/// A gzip layer from `(name, Some(content))` files and `(name, None)`
/// directories, in order.
pub fn gzip_layer(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, content) in entries {
        match content {
            Some(data) => append(&mut b, name, data),
            None => {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                h.set_mode(0o755);
                h.set_cksum();
                b.append_data(&mut h, name, &b""[..]).expect("append dir");
            }
        }
    }
    let raw = b.into_inner().expect("tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &raw).expect("gzip");
    gz.finish().expect("gzip")
}
