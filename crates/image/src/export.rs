//! Export of an image as an OCI image-layout archive.
//!
//! The store keeps no blobs, only unpacked layers, so each layer is
//! re-archived from its directory: an uncompressed tar, entries sorted by
//! name (directories before their contents), overlay whiteouts turned back
//! into OCI whiteouts (`0:0` character device → `.wh.<name>`,
//! `trusted.overlay.opaque=y` → `.wh..wh..opq`), hard links within the
//! layer as link entries, other xattrs as PAX `SCHILY.xattr.*`. Such a tar
//! does not hash to the original diff id (tar writers differ), so the
//! exported config carries the new diff ids and the image gets a new id;
//! the re-archived layers unpack to the same trees. Re-exporting an
//! imported export gives the same bytes.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::{ImageError, ImageStore};

const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MEDIA_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct Exported {
    /// The image exported (as in the store).
    pub source_id: String,
    /// The id (config digest) of the exported image.
    pub id: String,
    /// The manifest's digest.
    pub manifest_digest: String,
    /// Bytes written.
    pub size: u64,
}

/// A sha256-hashing writer.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    len: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

impl ImageStore {
    /// Writes the image `reference` names to `out` as an OCI image-layout
    /// tar (one manifest, uncompressed layers, named by the image's first
    /// tag). The file appears complete or not at all (temp file + rename).
    pub fn export(&self, reference: &str, out: &Path) -> Result<Exported, ImageError> {
        let image = self
            .get(reference)
            .ok_or_else(|| ImageError::NotFound(format!("image {reference}")))?;
        let paths = self.layer_paths(&image)?;
        // layer_paths lists each layer once, topmost first; map back.
        let mut dirs: HashMap<&str, PathBuf> = HashMap::new();
        let mut distinct: Vec<&String> = Vec::new();
        for d in image.diff_ids.iter().rev() {
            if !distinct.contains(&d) {
                distinct.push(d);
            }
        }
        for (d, p) in distinct.iter().zip(paths) {
            dirs.insert(d.as_str(), p);
        }
        let tmp = self.tmp_dir();
        let mut blobs: Vec<(String, PathBuf, u64)> = Vec::new();
        let mut by_diff_id: HashMap<&str, (String, u64)> = HashMap::new();
        let mut cleanup = Cleanup(Vec::new());
        let mut new_diff_ids = Vec::new();
        let mut layer_descs = Vec::new();
        for d in &image.diff_ids {
            let (digest, size) = match by_diff_id.get(d.as_str()) {
                Some(known) => known.clone(),
                None => {
                    let dir = dirs.get(d.as_str()).ok_or_else(|| {
                        ImageError::NotFound(format!("layer {d} of image {}", image.id))
                    })?;
                    // blob-<hex>: the store removes leftovers at its next open.
                    let file = tmp.join(format!("blob-{}", random_hex()?));
                    cleanup.0.push(file.clone());
                    let (digest, size) = archive_layer(dir, &file)?;
                    blobs.push((digest.clone(), file, size));
                    by_diff_id.insert(d.as_str(), (digest.clone(), size));
                    (digest, size)
                }
            };
            new_diff_ids.push(digest.clone());
            layer_descs.push(json!({ "mediaType": MEDIA_LAYER, "digest": digest, "size": size }));
        }
        let mut config = serde_json::to_value(&image.config)
            .map_err(|e| ImageError::Unsupported(format!("image config: {e}")))?;
        config["rootfs"] = json!({ "type": "layers", "diff_ids": new_diff_ids });
        let config = serde_json::to_vec(&config)
            .map_err(|e| ImageError::Unsupported(format!("image config: {e}")))?;
        let config_digest = sha256(&config);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": { "mediaType": MEDIA_CONFIG, "digest": config_digest, "size": config.len() },
            "layers": layer_descs,
        }))
        .map_err(|e| ImageError::Unsupported(format!("manifest: {e}")))?;
        let manifest_digest = sha256(&manifest);
        let mut desc = json!({
            "mediaType": MEDIA_MANIFEST, "digest": manifest_digest, "size": manifest.len(),
        });
        if let Some(tag) = image.repo_tags.first() {
            let short = tag.rsplit_once(':').map_or("latest", |(_, t)| t);
            desc["annotations"] = json!({
                "io.containerd.image.name": tag,
                "org.opencontainers.image.ref.name": short,
            });
        }
        let index = serde_json::to_vec(&json!({ "schemaVersion": 2, "manifests": [desc] }))
            .map_err(|e| ImageError::Unsupported(format!("index: {e}")))?;

        let parent = out.parent().filter(|p| !p.as_os_str().is_empty());
        let partial = parent
            .unwrap_or_else(|| Path::new("."))
            .join(format!(".petrel-export-{}", random_hex()?));
        cleanup.0.push(partial.clone());
        let f = fs::File::create(&partial).map_err(|e| ImageError::io("create", &partial, e))?;
        let mut b = tar::Builder::new(io::BufWriter::new(f));
        let io_err = |e| ImageError::io("write", out, e);
        append_bytes(&mut b, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io_err)?;
        append_bytes(&mut b, "index.json", &index).map_err(io_err)?;
        append_bytes(&mut b, &blob_name(&manifest_digest), &manifest).map_err(io_err)?;
        append_bytes(&mut b, &blob_name(&config_digest), &config).map_err(io_err)?;
        for (digest, file, size) in &blobs {
            let mut h = file_header(*size);
            let f = fs::File::open(file).map_err(|e| ImageError::io("open", file, e))?;
            b.append_data(&mut h, blob_name(digest), f)
                .map_err(io_err)?;
        }
        let w = b.into_inner().map_err(io_err)?;
        let f = w
            .into_inner()
            .map_err(|e| ImageError::io("write", out, e.into_error()))?;
        f.sync_all().map_err(|e| ImageError::io("sync", out, e))?;
        let size = f
            .metadata()
            .map_err(|e| ImageError::io("stat", out, e))?
            .len();
        fs::rename(&partial, out).map_err(|e| ImageError::io("rename", out, e))?;
        tracing::info!(image.id = %image.id, exported.id = %config_digest, path = %out.display(), "image exported");
        Ok(Exported {
            source_id: image.id.clone(),
            id: config_digest,
            manifest_digest,
            size,
        })
    }
}

/// Removes its files when dropped (temp blobs, a partial archive).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

fn random_hex() -> Result<String, ImageError> {
    let mut b = [0u8; 8];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| ImageError::io("read", "/dev/urandom", e))?;
    Ok(hex::encode(b))
}

fn blob_name(digest: &str) -> String {
    format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))
}

/// A deterministic header for a regular file of an OCI layout.
fn file_header(size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn append_bytes<W: Write>(b: &mut tar::Builder<W>, name: &str, data: &[u8]) -> io::Result<()> {
    let mut h = file_header(data.len() as u64);
    b.append_data(&mut h, name, data)
}

/// Archives a layer directory into `file`; returns its digest and size.
pub(crate) fn archive_layer(dir: &Path, file: &Path) -> Result<(String, u64), ImageError> {
    let f = fs::File::create(file).map_err(|e| ImageError::io("create", file, e))?;
    let w = Hashing {
        inner: io::BufWriter::new(f),
        hash: Sha256::new(),
        len: 0,
    };
    let mut b = tar::Builder::new(w);
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    walk(&mut b, dir, Path::new(""), &mut links)?;
    let mut w = b
        .into_inner()
        .map_err(|e| ImageError::io("write", file, e))?;
    w.flush().map_err(|e| ImageError::io("write", file, e))?;
    Ok((format!("sha256:{}", hex::encode(w.hash.finalize())), w.len))
}

/// Appends the entries of `root/rel` (a directory), sorted by name, each
/// directory before its contents. Never follows a symlink.
fn walk<W: Write>(
    b: &mut tar::Builder<W>,
    root: &Path,
    rel: &Path,
    links: &mut HashMap<(u64, u64), PathBuf>,
) -> Result<(), ImageError> {
    let dir = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| ImageError::io("read directory", &dir, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| ImageError::io("read directory", &dir, e))?;
    names.sort();
    if rel.as_os_str().is_empty() && opaque(&dir) {
        // An opaque root hides nothing below it: overlay ignores it.
    } else if opaque(&dir) {
        append_bytes_entry(b, &rel.join(".wh..wh..opq"))?;
    }
    for name in names {
        let path = dir.join(&name);
        let r = rel.join(&name);
        let md = fs::symlink_metadata(&path).map_err(|e| ImageError::io("stat", &path, e))?;
        let ft = md.file_type();
        if ft.is_char_device() && md.rdev() == 0 {
            let wh = rel.join(format!(".wh.{}", name.to_string_lossy()));
            append_bytes_entry(b, &wh)?;
            continue;
        }
        let mut h = tar::Header::new_gnu();
        h.set_mode(md.mode() & 0o7777);
        h.set_uid(u64::from(md.uid()));
        h.set_gid(u64::from(md.gid()));
        h.set_mtime(md.mtime().max(0) as u64);
        h.set_size(0);
        let xattrs = xattrs(&path)?;
        if !xattrs.is_empty() {
            b.append_pax_extensions(xattrs.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
                .map_err(|e| ImageError::io("write", &path, e))?;
        }
        let werr = |e| ImageError::io("write", &path, e);
        if ft.is_dir() {
            h.set_entry_type(tar::EntryType::Directory);
            b.append_data(&mut h, &r, io::empty()).map_err(werr)?;
            walk(b, root, &r, links)?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&path).map_err(|e| ImageError::io("readlink", &path, e))?;
            h.set_entry_type(tar::EntryType::Symlink);
            b.append_link(&mut h, &r, target).map_err(werr)?;
        } else if md.nlink() > 1 && links.contains_key(&(md.dev(), md.ino())) {
            let first = links[&(md.dev(), md.ino())].clone();
            h.set_entry_type(tar::EntryType::Link);
            b.append_link(&mut h, &r, first).map_err(werr)?;
        } else {
            if md.nlink() > 1 {
                links.insert((md.dev(), md.ino()), r.clone());
            }
            if ft.is_file() {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(md.len());
                let f = fs::File::open(&path).map_err(|e| ImageError::io("open", &path, e))?;
                b.append_data(&mut h, &r, f).map_err(werr)?;
            } else {
                let kind = if ft.is_char_device() {
                    tar::EntryType::Char
                } else if ft.is_block_device() {
                    tar::EntryType::Block
                } else if ft.is_fifo() {
                    tar::EntryType::Fifo
                } else {
                    return Err(ImageError::Unsupported(format!(
                        "cannot archive socket {}",
                        path.display()
                    )));
                };
                h.set_entry_type(kind);
                let rdev = md.rdev();
                h.set_device_major(rustix::fs::major(rdev)).map_err(werr)?;
                h.set_device_minor(rustix::fs::minor(rdev)).map_err(werr)?;
                b.append_data(&mut h, &r, io::empty()).map_err(werr)?;
            }
        }
    }
    Ok(())
}

/// An empty regular file entry (a whiteout marker).
fn append_bytes_entry<W: Write>(b: &mut tar::Builder<W>, name: &Path) -> Result<(), ImageError> {
    let mut h = file_header(0);
    b.append_data(&mut h, name, io::empty())
        .map_err(|e| ImageError::io("write", name, e))
}

fn opaque(dir: &Path) -> bool {
    let mut buf = [0u8; 8];
    matches!(
        rustix::fs::lgetxattr(dir, "trusted.overlay.opaque", &mut buf),
        Ok(n) if &buf[..n] == b"y"
    )
}

/// The entry's xattrs as PAX records, overlay's own left out (they are
/// whiteouts, expressed as entries), sorted for determinism.
fn xattrs(path: &Path) -> Result<Vec<(String, Vec<u8>)>, ImageError> {
    let mut names = vec![0u8; 4096];
    let n = match rustix::fs::llistxattr(path, &mut names) {
        Ok(n) => n,
        Err(rustix::io::Errno::NOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(ImageError::io("list xattrs", path, e)),
    };
    let mut out = Vec::new();
    for name in names[..n].split(|c| *c == 0).filter(|s| !s.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        if name.starts_with("trusted.overlay.") {
            continue;
        }
        let mut value = vec![0u8; 65536];
        let len = rustix::fs::lgetxattr(path, name.as_str(), &mut value)
            .map_err(|e| ImageError::io("read xattr", path, e))?;
        value.truncate(len);
        out.push((format!("SCHILY.xattr.{name}"), value));
    }
    out.sort();
    Ok(out)
}
