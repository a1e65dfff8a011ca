//! Reading image archives: the outer tar is streamed once into a private
//! directory (every member hashed on the way), then the OCI image layout or
//! docker-archive metadata is interpreted into import plans whose blobs are
//! all verified against their digests and sizes.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use oci_spec::image::{
    Arch, Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType, Os,
    ANNOTATION_REF_NAME,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::digest::HashingReader;
use crate::limits::{MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES};
use crate::reference::{self, is_hex64};
use crate::tar_guard::{Refusal, TarGuard};
use crate::ImageError;
/// Nesting limit for image indexes and member symlinks.
const MAX_DEPTH: usize = 8;
/// containerd's annotation carrying the full image name.
const CONTAINERD_NAME: &str = "io.containerd.image.name";

const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// A regular member of the archive, extracted and hashed.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// Where its content now lives.
    pub file: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// `sha256:<hex>` of its content.
    pub digest: String,
}

/// The extracted members of an archive.
pub(crate) struct Extracted {
    archive: PathBuf,
    files: HashMap<String, Member>,
    /// Symlinks and hard links between members: name → cleaned target.
    aliases: HashMap<String, String>,
}

/// One layer of an image to import.
#[derive(Debug, Clone)]
pub(crate) struct PlannedLayer {
    /// The compressed (or plain) layer blob.
    pub blob: Member,
    /// The diff id the uncompressed stream must hash to.
    pub diff_id: String,
    /// The layer's media type, when the manifest gives one (OCI layouts
    /// and registries; docker archives have none): a type declaring
    /// compression refuses a blob without it.
    pub media_type: Option<String>,
}

/// One image found in an archive, its blobs verified.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// `sha256:<hex>` of the config blob.
    pub id: String,
    pub config: ImageConfiguration,
    /// Base layer first.
    pub layers: Vec<PlannedLayer>,
    /// Normalised `name:tag` references.
    pub tags: Vec<String>,
    /// `sha256:<hex>` of the manifest, when the archive has one (OCI).
    pub manifest_digest: Option<String>,
}

fn clean_member_path(p: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c),
        }
    }
    Some(out.join("/"))
}

impl Extracted {
    fn invalid(&self, reason: impl Into<String>) -> ImageError {
        ImageError::InvalidArchive {
            path: self.archive.clone(),
            reason: reason.into(),
        }
    }

    /// Streams `archive` once, copying every regular member into `dir` and
    /// hashing it. Names that climb out of the archive are refused. Errors
    /// never quote the file's bytes (it may be any file of the host, such
    /// as `/etc/shadow`): a file that is no tar archive is named with what
    /// was expected and where reading it failed.
    pub fn extract(archive: &Path, dir: &Path) -> Result<Self, ImageError> {
        let f = File::open(archive).map_err(|e| ImageError::io("open archive", archive, e))?;
        let reading = Reading::default();
        let refused = Cell::new(None);
        let file = Tracked {
            inner: io::BufReader::new(f),
            reading: &reading,
        };
        let mut tar = tar::Archive::new(TarGuard::new(file, &refused));
        let mut out = Extracted {
            archive: archive.to_path_buf(),
            files: HashMap::new(),
            aliases: HashMap::new(),
        };
        // The tar crate's own messages may quote header fields: never used.
        let read_err = |_: io::Error| tar_error(archive, &reading, &refused);
        let mut buf = vec![0u8; 1 << 16];
        for (n, entry) in tar.entries().map_err(read_err)?.enumerate() {
            let mut entry = entry.map_err(read_err)?;
            let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let name = clean_member_path(&raw)
                .ok_or_else(|| out.invalid(format!("member {raw:?} climbs out of the archive")))?;
            match entry.header().entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    // The documents read by name are refused from their
                    // header, before their bytes are copied.
                    if matches!(name.as_str(), "index.json" | "manifest.json")
                        && entry.size() > MAX_MANIFEST_BYTES
                    {
                        return Err(out.invalid(too_large(
                            &name,
                            entry.size(),
                            MAX_MANIFEST_BYTES,
                        )));
                    }
                    let file = dir.join(n.to_string());
                    let mut dst =
                        File::create(&file).map_err(|e| ImageError::io("create", &file, e))?;
                    let mut hr = HashingReader::new(&mut entry);
                    loop {
                        let k = match hr.read(&mut buf) {
                            Ok(0) => break,
                            Ok(k) => k,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                            Err(e) => return Err(read_err(e)),
                        };
                        dst.write_all(&buf[..k])
                            .map_err(|e| ImageError::io("write", &file, e))?;
                    }
                    let (digest, size) = hr.finish().map_err(read_err)?;
                    out.aliases.remove(&name);
                    out.files.insert(name, Member { file, size, digest });
                }
                kind @ (tar::EntryType::Symlink | tar::EntryType::Link) => {
                    let target = entry
                        .link_name_bytes()
                        .map(|t| String::from_utf8_lossy(&t).into_owned())
                        .unwrap_or_default();
                    // Symlinks are relative to their directory, hard links to
                    // the archive root.
                    let joined = if kind == tar::EntryType::Symlink && !target.starts_with('/') {
                        match name.rsplit_once('/') {
                            Some((d, _)) => format!("{d}/{target}"),
                            None => target.clone(),
                        }
                    } else {
                        target.clone()
                    };
                    let resolved = clean_member_path(&joined).ok_or_else(|| {
                        out.invalid(format!("link {raw:?} points out of the archive"))
                    })?;
                    out.files.remove(&name);
                    out.aliases.insert(name, resolved);
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// A member by name, following links between members.
    pub fn member(&self, name: &str) -> Result<&Member, ImageError> {
        let mut name = clean_member_path(name)
            .ok_or_else(|| self.invalid(format!("{name:?} points out of the archive")))?;
        for _ in 0..MAX_DEPTH {
            if let Some(m) = self.files.get(&name) {
                return Ok(m);
            }
            match self.aliases.get(&name) {
                Some(next) => name = next.clone(),
                None => return Err(self.invalid(format!("member {name:?} is missing"))),
            }
        }
        Err(self.invalid(format!("too many links resolving {name:?}")))
    }

    fn has(&self, name: &str) -> bool {
        self.files.contains_key(name) || self.aliases.contains_key(name)
    }

    /// A member's content, refused unread when over `limit` bytes.
    fn read_member(&self, m: &Member, what: &str, limit: u64) -> Result<Vec<u8>, ImageError> {
        if m.size > limit {
            return Err(self.invalid(too_large(what, m.size, limit)));
        }
        let f = File::open(&m.file).map_err(|e| ImageError::io("open", &m.file, e))?;
        let mut data = Vec::with_capacity(usize::try_from(m.size).unwrap_or(0));
        // The member is in our private directory, at the size measured
        // while extracting; the bound stays even so.
        f.take(limit)
            .read_to_end(&mut data)
            .map_err(|e| ImageError::io("read", &m.file, e))?;
        Ok(data)
    }

    /// Parses a JSON document of the archive. serde's messages may quote
    /// the document (`invalid type: string "..."`), so only where it
    /// failed is said, except for a missing field (named by our schema).
    fn parse_json<T: DeserializeOwned>(&self, data: &[u8], what: &str) -> Result<T, ImageError> {
        serde_json::from_slice(data).map_err(|e| {
            let msg = e.to_string();
            let reason = if msg.starts_with("missing field `") {
                msg
            } else {
                let kind = match e.classify() {
                    serde_json::error::Category::Syntax => "not valid JSON",
                    serde_json::error::Category::Eof => "truncated JSON",
                    serde_json::error::Category::Data => "JSON not of the expected schema",
                    serde_json::error::Category::Io => "unreadable",
                };
                format!("{kind} at line {} column {}", e.line(), e.column())
            };
            self.invalid(format!("{what}: {reason}"))
        })
    }

    /// The blob a descriptor names, verified against its digest and size.
    fn blob(&self, desc: &Descriptor, what: &str) -> Result<&Member, ImageError> {
        let digest = desc.digest().to_string();
        reference::validate_digest(&digest)
            .map_err(|r| ImageError::Unsupported(format!("{what}: {r}")))?;
        let hex = &digest["sha256:".len()..];
        let m = self.member(&format!("blobs/sha256/{hex}"))?;
        verify(m, &digest, what)?;
        if m.size != desc.size() {
            return Err(ImageError::SizeMismatch {
                what: format!("{what} {digest}"),
                expected: desc.size(),
                actual: m.size,
            });
        }
        Ok(m)
    }

    /// Interprets the archive as an OCI image layout (preferred when
    /// `index.json` exists, as in newer `docker save` output) or a docker
    /// archive.
    pub fn plans(&self) -> Result<Vec<Plan>, ImageError> {
        let plans = if self.has("index.json") {
            self.oci_plans()?
        } else if self.has("manifest.json") {
            self.docker_plans()?
        } else {
            return Err(self.invalid("neither index.json nor manifest.json found"));
        };
        if plans.is_empty() {
            return Err(self.invalid("no linux/amd64 image found"));
        }
        Ok(plans)
    }

    fn oci_plans(&self) -> Result<Vec<Plan>, ImageError> {
        let data =
            self.read_member(self.member("index.json")?, "index.json", MAX_MANIFEST_BYTES)?;
        let index: ImageIndex = self.parse_json(&data, "index.json")?;
        let mut plans: Vec<Plan> = Vec::new();
        for desc in index.manifests() {
            let names = names_from_annotations(desc);
            let Some((manifest_desc, manifest)) = self.select_manifest(desc, 0)? else {
                continue;
            };
            let digest = manifest_desc.digest().to_string();
            let Some(mut plan) = self.manifest_plan(&manifest, &digest)? else {
                continue;
            };
            plan.tags = names;
            // The same image listed twice (under two names) is one plan.
            match plans.iter_mut().find(|p| p.id == plan.id) {
                Some(p) => merge_unique(&mut p.tags, plan.tags),
                None => plans.push(plan),
            }
        }
        Ok(plans)
    }

    /// Follows a descriptor down nested indexes to the linux/amd64 manifest.
    fn select_manifest(
        &self,
        desc: &Descriptor,
        depth: usize,
    ) -> Result<Option<(Descriptor, ImageManifest)>, ImageError> {
        if depth > MAX_DEPTH {
            return Err(self.invalid("image indexes nested too deeply"));
        }
        if let Some(p) = desc.platform() {
            if !(p.os() == &Os::Linux && p.architecture() == &Arch::Amd64) {
                return Ok(None);
            }
        }
        match desc.media_type() {
            MediaType::ImageManifest => {}
            MediaType::Other(t) if t == DOCKER_MANIFEST => {}
            MediaType::ImageIndex => return self.select_from_index(desc, depth),
            MediaType::Other(t) if t == DOCKER_MANIFEST_LIST => {
                return self.select_from_index(desc, depth)
            }
            // Attestations, signatures and other artifacts.
            _ => return Ok(None),
        }
        let m = self.blob(desc, "manifest")?;
        let data = self.read_member(m, "manifest", MAX_MANIFEST_BYTES)?;
        let manifest: ImageManifest = self.parse_json(&data, "manifest")?;
        Ok(Some((desc.clone(), manifest)))
    }

    fn select_from_index(
        &self,
        desc: &Descriptor,
        depth: usize,
    ) -> Result<Option<(Descriptor, ImageManifest)>, ImageError> {
        let m = self.blob(desc, "image index")?;
        let data = self.read_member(m, "image index", MAX_MANIFEST_BYTES)?;
        let index: ImageIndex = self.parse_json(&data, "image index")?;
        for child in index.manifests() {
            if let Some(found) = self.select_manifest(child, depth + 1)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Verifies a manifest's config and layers. `None` if the config is
    /// not for linux/amd64.
    fn manifest_plan(
        &self,
        manifest: &ImageManifest,
        manifest_digest: &str,
    ) -> Result<Option<Plan>, ImageError> {
        let cm = self.blob(manifest.config(), "config")?;
        let data = self.read_member(cm, "config", MAX_CONFIG_BYTES)?;
        let config: ImageConfiguration = self.parse_json(&data, "config")?;
        if !is_host_platform(&config) {
            return Ok(None);
        }
        let diff_ids = config.rootfs().diff_ids();
        if diff_ids.len() != manifest.layers().len() {
            return Err(self.invalid(format!(
                "manifest {manifest_digest} has {} layers but its config {} diff ids",
                manifest.layers().len(),
                diff_ids.len()
            )));
        }
        let mut layers = Vec::new();
        for (desc, diff_id) in manifest.layers().iter().zip(diff_ids) {
            check_layer_media_type(desc.media_type())?;
            let blob = self.blob(desc, "layer")?.clone();
            let mut layer = self.planned_layer(blob, diff_id)?;
            layer.media_type = Some(desc.media_type().to_string());
            layers.push(layer);
        }
        Ok(Some(Plan {
            id: cm.digest.clone(),
            config,
            layers,
            tags: Vec::new(),
            manifest_digest: Some(manifest_digest.to_string()),
        }))
    }

    fn planned_layer(&self, blob: Member, diff_id: &str) -> Result<PlannedLayer, ImageError> {
        reference::validate_digest(diff_id)
            .map_err(|r| self.invalid(format!("config diff id: {r}")))?;
        Ok(PlannedLayer {
            blob,
            diff_id: diff_id.to_string(),
            media_type: None,
        })
    }

    fn docker_plans(&self) -> Result<Vec<Plan>, ImageError> {
        #[derive(Deserialize)]
        struct Entry {
            #[serde(rename = "Config")]
            config: String,
            #[serde(rename = "RepoTags", default)]
            repo_tags: Option<Vec<String>>,
            #[serde(rename = "Layers", default)]
            layers: Vec<String>,
        }
        let data = self.read_member(
            self.member("manifest.json")?,
            "manifest.json",
            MAX_MANIFEST_BYTES,
        )?;
        let entries: Vec<Entry> = self.parse_json(&data, "manifest.json")?;
        let mut plans: Vec<Plan> = Vec::new();
        for e in entries {
            let cm = self.member(&e.config)?;
            verify_named(cm, &e.config, "config")?;
            let data = self.read_member(cm, "config", MAX_CONFIG_BYTES)?;
            let config: ImageConfiguration = self.parse_json(&data, "config")?;
            if !is_host_platform(&config) {
                continue;
            }
            let diff_ids = config.rootfs().diff_ids();
            if diff_ids.len() != e.layers.len() {
                return Err(self.invalid(format!(
                    "manifest.json lists {} layers for {} but its config {} diff ids",
                    e.layers.len(),
                    e.config,
                    diff_ids.len()
                )));
            }
            let mut layers = Vec::new();
            for (path, diff_id) in e.layers.iter().zip(diff_ids) {
                let m = self.member(path)?;
                verify_named(m, path, "layer")?;
                layers.push(self.planned_layer(m.clone(), diff_id)?);
            }
            let tags = e
                .repo_tags
                .unwrap_or_default()
                .iter()
                .filter_map(|t| usable_tag(t))
                .collect();
            let plan = Plan {
                id: cm.digest.clone(),
                config,
                layers,
                tags,
                manifest_digest: None,
            };
            match plans.iter_mut().find(|p| p.id == plan.id) {
                Some(p) => merge_unique(&mut p.tags, plan.tags),
                None => plans.push(plan),
            }
        }
        Ok(plans)
    }
}

/// The reason for refusing a JSON document over its bound.
fn too_large(what: &str, size: u64, limit: u64) -> String {
    format!("{what} is {size} bytes, larger than the {limit} bytes allowed")
}

/// How reading the archive file went, for telling its own I/O errors
/// from the tar crate's complaints about its content.
#[derive(Default)]
struct Reading {
    /// Bytes read from the file.
    offset: Cell<u64>,
    /// The file's own read error, if any (kind and errno).
    failed: Cell<Option<(io::ErrorKind, Option<i32>)>>,
}

/// The archive file, reading through [`Reading`].
struct Tracked<'a, R> {
    inner: R,
    reading: &'a Reading,
}

impl<R: Read> Read for Tracked<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => {
                self.reading
                    .offset
                    .set(self.reading.offset.get() + n as u64);
                Ok(n)
            }
            Err(e) => {
                if e.kind() != io::ErrorKind::Interrupted {
                    self.reading.failed.set(Some((e.kind(), e.raw_os_error())));
                }
                Err(e)
            }
        }
    }
}

/// The error for a failure while the tar crate reads `archive`: the file's
/// own read error, a record over a bound, or a file that is not (or not
/// all) a tar archive. Never the tar crate's message, which may quote the
/// file's bytes.
fn tar_error(archive: &Path, reading: &Reading, refused: &Cell<Option<Refusal>>) -> ImageError {
    if let Some(r) = refused.get() {
        return ImageError::TooLarge {
            what: format!("archive {}: {}", archive.display(), r.describe()),
            limit: crate::limits::MAX_TAR_EXTENSION_BYTES,
        };
    }
    if let Some((kind, errno)) = reading.failed.get() {
        let e = match errno {
            Some(n) => io::Error::from_raw_os_error(n),
            None => io::Error::from(kind),
        };
        return ImageError::io("read archive", archive, e);
    }
    ImageError::InvalidArchive {
        path: archive.to_path_buf(),
        reason: format!(
            "not a tar archive (an OCI image layout or docker archive was expected), \
             or a truncated or corrupt one: unreadable tar header or data before byte {}",
            reading.offset.get()
        ),
    }
}

/// Appends the items of `more` not yet in `into`, keeping order.
pub(crate) fn merge_unique(into: &mut Vec<String>, more: impl IntoIterator<Item = String>) {
    for m in more {
        if !into.contains(&m) {
            into.push(m);
        }
    }
}

fn verify(m: &Member, expected: &str, what: &str) -> Result<(), ImageError> {
    if m.digest != expected {
        return Err(ImageError::DigestMismatch {
            what: format!("{what} blob"),
            expected: expected.to_string(),
            actual: m.digest.clone(),
        });
    }
    Ok(())
}

/// Docker archives name content by digest (`blobs/sha256/<hex>`, or
/// `<hex>.json` for old configs): when the name is a digest, it must match.
fn verify_named(m: &Member, name: &str, what: &str) -> Result<(), ImageError> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let hex = base.strip_suffix(".json").unwrap_or(base);
    if is_hex64(hex) && (name.starts_with("blobs/sha256/") || base.ends_with(".json")) {
        verify(m, &format!("sha256:{hex}"), &format!("{what} {name}"))?;
    }
    Ok(())
}

fn is_host_platform(config: &ImageConfiguration) -> bool {
    config.os() == &Os::Linux && config.architecture() == &Arch::Amd64
}

fn check_layer_media_type(t: &MediaType) -> Result<(), ImageError> {
    match t {
        MediaType::ImageLayer
        | MediaType::ImageLayerGzip
        | MediaType::ImageLayerNonDistributable
        | MediaType::ImageLayerNonDistributableGzip => Ok(()),
        MediaType::ImageLayerZstd | MediaType::ImageLayerNonDistributableZstd => Ok(()),
        MediaType::Other(s)
            if s.starts_with("application/vnd.docker.image.rootfs.")
                && (s.ends_with(".tar.gzip") || s.ends_with(".tar")) =>
        {
            Ok(())
        }
        other => Err(ImageError::Unsupported(format!("layer media type {other}"))),
    }
}

/// A usable, normalised `name:tag` from a docker `RepoTags` entry or a full
/// reference annotation; anything else is ignored with a warning.
fn usable_tag(s: &str) -> Option<String> {
    match reference::parse(s) {
        Ok(r) if r.digest.is_none() => Some(r.to_string()),
        Ok(_) => None,
        Err(e) => {
            tracing::warn!(reference = %s, error = %e, "ignoring unusable image name in archive");
            None
        }
    }
}

/// Names for an image from its index descriptor's annotations:
/// `org.opencontainers.image.ref.name` is either a full reference or just a
/// tag, which then takes its name from `io.containerd.image.name`.
fn names_from_annotations(desc: &Descriptor) -> Vec<String> {
    let Some(ann) = desc.annotations() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let full_name = ann.get(CONTAINERD_NAME).and_then(|n| usable_tag(n));
    if let Some(r) = ann.get(ANNOTATION_REF_NAME) {
        if r.contains('/') || r.contains(':') || r.contains('@') {
            out.extend(usable_tag(r));
        } else if reference::is_valid_tag(r) {
            if let Some(full) = &full_name {
                let name = full.rsplit_once(':').map_or(full.as_str(), |(n, _)| n);
                out.extend(usable_tag(&format!("{name}:{r}")));
            }
        }
    }
    if let Some(full) = full_name {
        merge_unique(&mut out, [full]);
    }
    out
}

/// Opens a layer blob as its uncompressed tar stream (gzip, zstd or plain,
/// told by magic bytes and checked against `media_type` when known: see
/// `unpack::decompress`).
pub(crate) fn open_layer(
    path: &Path,
    media_type: Option<&str>,
) -> Result<Box<dyn Read>, ImageError> {
    let f = File::open(path).map_err(|e| ImageError::io("open layer blob", path, e))?;
    let r = io::BufReader::with_capacity(1 << 16, f);
    crate::unpack::decompress(r, media_type, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::image::DescriptorBuilder;

    fn desc(ann: &[(&str, &str)]) -> Descriptor {
        let map: HashMap<String, String> = ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        DescriptorBuilder::default()
            .media_type(MediaType::ImageManifest)
            .digest(
                format!("sha256:{}", "a".repeat(64))
                    .parse::<oci_spec::image::Digest>()
                    .expect("digest"),
            )
            .size(1u64)
            .annotations(map)
            .build()
            .expect("descriptor")
    }

    #[test]
    fn names_should_come_from_ref_name_and_containerd_annotations() {
        let full = desc(&[(ANNOTATION_REF_NAME, "quay.io/a/b:1")]);
        assert_eq!(names_from_annotations(&full), vec!["quay.io/a/b:1"]);
        let short = desc(&[(ANNOTATION_REF_NAME, "busybox:1")]);
        assert_eq!(
            names_from_annotations(&short),
            vec!["docker.io/library/busybox:1"]
        );
        // docker save (v25+): a bare tag plus containerd's full name.
        let docker = desc(&[
            (ANNOTATION_REF_NAME, "1.36"),
            (CONTAINERD_NAME, "docker.io/library/busybox:1.36"),
        ]);
        assert_eq!(
            names_from_annotations(&docker),
            vec!["docker.io/library/busybox:1.36"]
        );
        let retag = desc(&[(ANNOTATION_REF_NAME, "v2"), (CONTAINERD_NAME, "x/y:v1")]);
        assert_eq!(
            names_from_annotations(&retag),
            vec!["docker.io/x/y:v2", "docker.io/x/y:v1"]
        );
        // A bare tag with no name, or garbage: untagged.
        assert!(names_from_annotations(&desc(&[(ANNOTATION_REF_NAME, "latest")])).is_empty());
        assert!(names_from_annotations(&desc(&[(ANNOTATION_REF_NAME, "Bad/Name:x")])).is_empty());
        assert!(names_from_annotations(&desc(&[])).is_empty());
    }

    /// Looks like `/etc/shadow`: what an import of the wrong file must
    /// never quote back.
    const SHADOW: &str = "root:$y$j9T$SECRETsaltSECRET$SECREThashSECREThashSECREThash:19700:0:99999:7:::\n\
        daemon:*:19700:0:99999:7:::\nbin:*:19700:0:99999:7:::\nalice:$6$SECRET2salt$SECRET2hash:19700:0:99999:7:::\n";

    fn assert_quotes_nothing(msg: &str) {
        for secret in ["SECRET", "$y$j9T", "root:", "daemon", "19700"] {
            assert!(!msg.contains(secret), "error quotes the file: {msg}");
        }
    }

    #[test]
    fn extract_should_never_quote_a_file_that_is_not_an_archive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("work dir");
        // Shorter than a tar block, a few blocks, and a block whose
        // checksum field is text (the tar crate then quotes the field and
        // the first 100 bytes as the member's name).
        for (i, content) in [SHADOW.to_string(), SHADOW.repeat(20)].iter().enumerate() {
            let file = dir.path().join(format!("shadow-{i}"));
            std::fs::write(&file, content).expect("write");
            // The hazard is real: the tar crate's own error quotes it.
            if content.len() >= 512 {
                let raw = tar::Archive::new(content.as_bytes())
                    .entries()
                    .and_then(|mut e| e.next().transpose())
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                assert!(raw.contains("SECRET"), "{raw}");
            }
            let err = match Extracted::extract(&file, &work) {
                Err(e) => e,
                Ok(_) => panic!("a shadow file extracted"),
            };
            let msg = err.to_string();
            assert!(matches!(err, ImageError::InvalidArchive { .. }), "{msg}");
            assert!(msg.contains(&file.display().to_string()), "{msg}");
            assert!(msg.contains("not a tar archive"), "{msg}");
            assert_quotes_nothing(&msg);
        }
    }

    /// A tar archive of `members` (name, content).
    fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).expect("append");
        }
        b.into_inner().expect("tar")
    }

    fn plans_of(archive: &[u8]) -> Result<Vec<Plan>, ImageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a.tar");
        std::fs::write(&file, archive).expect("write");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("work dir");
        Extracted::extract(&file, &work)?.plans()
    }

    #[test]
    fn json_errors_should_say_where_not_what() {
        let quoted = serde_json::to_string(SHADOW).expect("json string");
        let bad_type = format!(r#"{{"schemaVersion": 2, "manifests": {quoted}}}"#);
        let bad_syntax = format!("{{\"schemaVersion\": 2, {SHADOW}");
        for index in [bad_type, bad_syntax] {
            let err = plans_of(&tar_of(&[("index.json", index.as_bytes())]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("index.json: "), "{err}");
            assert!(err.contains("at line 1 column"), "{err}");
            assert_quotes_nothing(&err);
        }
        // A missing field names our schema's field, not the file's bytes.
        let err = plans_of(&tar_of(&[("manifest.json", br#"[{"Layers": []}]"#)]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("missing field `Config`"), "{err}");
    }

    #[test]
    fn json_documents_over_their_bound_should_be_refused_unread() {
        let big = vec![b' '; (MAX_MANIFEST_BYTES + 1) as usize];
        for name in ["index.json", "manifest.json"] {
            let err = plans_of(&tar_of(&[(name, &big)]))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains(&format!("{name} is {} bytes, larger than", big.len())),
                "{err}"
            );
        }
    }

    #[test]
    fn index_and_manifest_json_over_the_bound_should_be_refused_from_their_header() {
        // Only the header: the 512 MiB it claims are not there to read.
        for name in ["index.json", "./manifest.json"] {
            let mut h = tar::Header::new_gnu();
            h.set_path(name).expect("path");
            h.set_size(512 << 20);
            h.set_mode(0o644);
            h.set_cksum();
            let err = plans_of(h.as_bytes())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains("is 536870912 bytes, larger than"), "{err}");
        }
    }

    #[test]
    fn huge_tar_extension_records_in_an_archive_should_be_refused_unread() {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_path("././@LongLink").expect("path");
        h.set_size(512 << 20);
        h.set_cksum();
        match plans_of(h.as_bytes()) {
            Err(ImageError::TooLarge { what, limit }) => {
                assert_eq!(limit, crate::limits::MAX_TAR_EXTENSION_BYTES);
                assert!(what.contains("long name record"), "{what}");
            }
            other => panic!("expected TooLarge, got {:?}", other.map(|p| p.len())),
        }
    }

    #[test]
    fn clean_member_path_should_refuse_climbing() {
        assert_eq!(clean_member_path("./a//b/./c").as_deref(), Some("a/b/c"));
        assert_eq!(clean_member_path("a/../b").as_deref(), Some("b"));
        assert_eq!(clean_member_path("../b"), None);
        assert_eq!(clean_member_path("a/../../b"), None);
    }
}
