//! The large image of the pull figures (P14, P15), built by the bench as
//! an OCI layout: the busybox test image's layer (so that the image runs
//! `sleep` like the small one), then layers of real files of this machine
//! (shared libraries, programs, /usr/share data, ...) so that compression
//! and unpacking meet realistic content. Each generated layer is cut when
//! its gzip stream reaches its share of the requested compressed size.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

/// The tag of the image in its OCI layout.
pub const TAG: &str = "large";

/// Where the generated layers take their files from, in this order; a
/// layer starts at its own source (layer i at source i) and moves on to
/// the next when that one is used up. Missing directories are skipped.
const SOURCES: [&str; 7] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/bin",
    "/usr/share",
    "/usr/lib",
    "/usr/sbin",
    "/usr/libexec",
    "/usr/include",
];

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// One layer of the image.
#[derive(Debug, Clone, Default)]
pub struct LayerInfo {
    /// Where its files come from.
    pub source: String,
    /// Entries of the archive that are files or symlinks.
    pub files: usize,
    /// Bytes of the tar stream.
    pub uncompressed: u64,
    /// Bytes of the gzip blob.
    pub compressed: u64,
}

/// The image as built.
#[derive(Debug, Clone, Default)]
pub struct LargeImage {
    /// Its layers, lowest first.
    pub layers: Vec<LayerInfo>,
}

impl LargeImage {
    /// Bytes of all layer blobs.
    pub fn compressed(&self) -> u64 {
        self.layers.iter().map(|l| l.compressed).sum()
    }

    /// Bytes of all tar streams.
    pub fn uncompressed(&self) -> u64 {
        self.layers.iter().map(|l| l.uncompressed).sum()
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .with_context(|| format!("not a sha256 digest: {digest:?}"))?;
    Ok(layout.join("blobs").join("sha256").join(hex))
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let bytes = std::fs::read(path).with_context(|| format!("read {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parse {}", path.display()))
}

/// Writes `bytes` as a blob and returns its descriptor.
fn put_blob(layout: &Path, media_type: &str, bytes: &[u8]) -> Result<serde_json::Value> {
    let digest = format!("sha256:{}", sha256_hex(bytes));
    let path = blob_path(layout, &digest)?;
    std::fs::write(&path, bytes).with_context(|| format!("write {}", path.display()))?;
    Ok(serde_json::json!({"mediaType": media_type, "digest": digest, "size": bytes.len()}))
}

/// Builds the image in `layout` (created): the layers of the busybox OCI
/// archive `busybox`, then `layers` layers of this machine's files, each of
/// about `(total_bytes − busybox) / layers` compressed bytes.
pub fn build(busybox: &Path, layout: &Path, layers: usize, total_bytes: u64) -> Result<LargeImage> {
    ensure!(
        layers > 0,
        "the large image needs at least one generated layer"
    );
    std::fs::create_dir_all(layout).with_context(|| format!("create {}", layout.display()))?;
    let archive = File::open(busybox).with_context(|| format!("open {}", busybox.display()))?;
    tar::Archive::new(archive)
        .unpack(layout)
        .with_context(|| format!("unpack {} into {}", busybox.display(), layout.display()))?;

    let index = read_json(&layout.join("index.json"))?;
    let manifest_digest = index["manifests"][0]["digest"]
        .as_str()
        .context("the busybox archive's index.json names no manifest")?;
    let mut manifest = read_json(&blob_path(layout, manifest_digest)?)?;
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .context("the busybox manifest names no config")?;
    let mut config = read_json(&blob_path(layout, config_digest)?)?;

    let mut image = LargeImage { layers: vec![] };
    let base = manifest["layers"]
        .as_array()
        .context("the busybox manifest has no layers")?
        .clone();
    for l in &base {
        let digest = l["digest"].as_str().context("a layer without digest")?;
        let path = blob_path(layout, digest)?;
        let f = File::open(&path).with_context(|| format!("open {}", path.display()))?;
        let uncompressed =
            std::io::copy(&mut flate2::read::GzDecoder::new(f), &mut std::io::sink())
                .with_context(|| format!("decompress {}", path.display()))?;
        image.layers.push(LayerInfo {
            source: "the busybox test image".to_string(),
            files: 0,
            uncompressed,
            compressed: l["size"].as_u64().unwrap_or(0),
        });
    }
    let budget = total_bytes.saturating_sub(image.compressed()) / layers as u64;
    ensure!(
        budget > 0,
        "the large image's size is below the busybox layer's"
    );

    let sources: Vec<&Path> = SOURCES
        .iter()
        .map(Path::new)
        .filter(|p| p.is_dir())
        .collect();
    ensure!(!sources.is_empty(), "none of {SOURCES:?} exists");
    let mut used = HashSet::new();
    let mut new_layers = vec![];
    for i in 0..layers {
        let (info, digest, diff_id) = write_layer(layout, &sources, i, budget, &mut used)?;
        new_layers.push(serde_json::json!({
            "mediaType": OCI_LAYER_GZIP, "digest": digest, "size": info.compressed
        }));
        let rootfs = &mut config["rootfs"]["diff_ids"];
        let Some(ids) = rootfs.as_array_mut() else {
            bail!("the busybox config has no rootfs.diff_ids");
        };
        ids.push(serde_json::Value::String(diff_id));
        if let Some(history) = config["history"].as_array_mut() {
            history.push(serde_json::json!({
                "created": "1970-01-01T00:00:00Z",
                "created_by": format!("petrel-bench: files of {}", info.source)
            }));
        }
        image.layers.push(info);
    }

    let config_bytes = serde_json::to_vec(&config)?;
    manifest["config"] = put_blob(layout, OCI_CONFIG, &config_bytes)?;
    let mut all = base;
    all.extend(new_layers);
    manifest["layers"] = serde_json::Value::Array(all);
    let manifest_bytes = serde_json::to_vec(&manifest)?;
    let mut desc = put_blob(layout, OCI_MANIFEST, &manifest_bytes)?;
    desc["annotations"] = serde_json::json!({"org.opencontainers.image.ref.name": TAG});
    let index = serde_json::json!({
        "schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [desc]
    });
    let index_path = layout.join("index.json");
    std::fs::write(&index_path, serde_json::to_vec(&index)?)
        .with_context(|| format!("write {}", index_path.display()))?;
    Ok(image)
}

/// A writer that counts and hashes what passes through it.
struct Tee<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> Tee<W> {
    fn new(inner: W) -> Tee<W> {
        Tee {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    fn digest(&self) -> String {
        format!("sha256:{}", hex::encode(self.hasher.clone().finalize()))
    }
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

type LayerWriter = tar::Builder<Tee<GzEncoder<Tee<BufWriter<File>>>>>;

/// Filling one layer from the sources.
struct Fill<'a> {
    b: LayerWriter,
    budget: u64,
    /// Larger files are left out, so that one file cannot overshoot the
    /// layer's share by much.
    max_file: u64,
    used: &'a mut HashSet<PathBuf>,
    dirs: HashSet<PathBuf>,
    files: usize,
}

impl Fill<'_> {
    fn compressed(&self) -> u64 {
        self.b.get_ref().inner.get_ref().bytes
    }

    fn full(&self) -> bool {
        self.compressed() >= self.budget
    }

    /// Adds the directories above `path` not yet in this layer, outermost
    /// first, with their own modes and owners.
    fn parents(&mut self, path: &Path) -> Result<()> {
        let mut missing: Vec<&Path> = path
            .ancestors()
            .skip(1)
            .take_while(|a| *a != Path::new("/"))
            .filter(|a| !self.dirs.contains(*a))
            .collect();
        missing.reverse();
        for d in missing {
            self.b
                .append_path_with_name(d, name_of(d))
                .with_context(|| format!("add directory {}", d.display()))?;
            self.dirs.insert(d.to_path_buf());
        }
        Ok(())
    }

    /// Adds files below `dir` in name order until the layer is full;
    /// returns whether it is.
    fn walk(&mut self, dir: &Path) -> Result<bool> {
        // Unreadable directories are skipped: the image is a sample.
        let Ok(it) = std::fs::read_dir(dir) else {
            return Ok(false);
        };
        let mut entries: Vec<PathBuf> = it.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for p in entries {
            if self.full() {
                return Ok(true);
            }
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                if self.walk(&p)? {
                    return Ok(true);
                }
                continue;
            }
            if self.used.contains(&p) || !(ft.is_file() || ft.is_symlink()) {
                continue;
            }
            if ft.is_file() {
                if meta.len() > self.max_file {
                    continue;
                }
                let Ok(mut f) = File::open(&p) else {
                    continue;
                };
                self.parents(&p)?;
                self.b
                    .append_file(name_of(&p), &mut f)
                    .with_context(|| format!("add {}", p.display()))?;
            } else {
                self.parents(&p)?;
                self.b
                    .append_path_with_name(&p, name_of(&p))
                    .with_context(|| format!("add {}", p.display()))?;
            }
            self.used.insert(p);
            self.files += 1;
        }
        Ok(self.full())
    }
}

/// The name of `path` in a layer: relative to `/`.
fn name_of(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

/// Writes generated layer `i` as a blob; returns it, its digest and its
/// diff id.
fn write_layer(
    layout: &Path,
    sources: &[&Path],
    i: usize,
    budget: u64,
    used: &mut HashSet<PathBuf>,
) -> Result<(LayerInfo, String, String)> {
    let tmp = layout.join(format!("layer-{i}.tmp"));
    let file = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let gz = GzEncoder::new(
        Tee::new(BufWriter::new(file)),
        flate2::Compression::default(),
    );
    let mut b = tar::Builder::new(Tee::new(gz));
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    let mut fill = Fill {
        b,
        budget,
        max_file: budget / 4,
        used,
        dirs: HashSet::new(),
        files: 0,
    };
    let mut walked = vec![];
    for k in 0..sources.len() {
        let src = sources[(i + k) % sources.len()];
        walked.push(src.display().to_string());
        if fill.walk(src)? {
            break;
        }
    }
    ensure!(fill.files > 0, "no files left for generated layer {i}");
    let files = fill.files;
    let tar = fill.b.into_inner().context("finish a layer's tar stream")?;
    let diff_id = tar.digest();
    let uncompressed = tar.bytes;
    let mut blob = tar.inner.finish().context("finish a layer's gzip stream")?;
    blob.flush().context("write a layer")?;
    let digest = blob.digest();
    let compressed = blob.bytes;
    let dest = blob_path(layout, &digest)?;
    std::fs::rename(&tmp, &dest).with_context(|| format!("rename to {}", dest.display()))?;
    Ok((
        LayerInfo {
            source: walked.join(", "),
            files,
            uncompressed,
            compressed,
        },
        digest,
        diff_id,
    ))
}
