//! The checkpoint archive: one uncompressed tar, in the layout kubelet's
//! checkpoint API asks of the CRI runtime and that containerd and CRI-O
//! write (and `checkpointctl` reads):
//!
//! ```text
//! checkpoint/       CRIU's images (inventory.img, core-*.img, pages-*.img, ...)
//! config.dump       JSON: id, name, rootfsImage, rootfsImageRef, rootfsImageName,
//!                   runtime, createdTime, checkpointedTime, restoredTime, restored
//! spec.dump         the container's OCI spec (its config.json)
//! status.dump       the container's CRI ContainerStatus as JSON (proto field names)
//! rootfs-diff.tar   what the container changed over its image, a layer tar
//!                   (overlay whiteouts as `.wh.` entries)
//! dump.log          CRIU's log of the dump
//! stats-dump        CRIU's statistics of the dump
//! container.log     the container's CRI log up to the checkpoint
//! ```
//!
//! Written to a temporary file beside the location, synced, then renamed:
//! the location holds a whole archive or nothing. Read back by a restore
//! (CreateContainer whose image is the archive's path) in two passes: the
//! metadata first (the base image must be known before anything is made),
//! then CRIU's images and the rootfs diff into the new container's
//! directories. Both passes refuse what a checkpoint archive cannot hold
//! (entries outside `checkpoint/` that are not files, nested or
//! non-regular CRIU images) rather than write it.

use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// CRIU's images.
pub const CHECKPOINT_DIR: &str = "checkpoint";
/// The container's checkpoint metadata ([`ConfigDump`]).
pub const CONFIG_DUMP: &str = "config.dump";
/// The container's OCI spec.
pub const SPEC_DUMP: &str = "spec.dump";
/// The container's CRI status.
pub const STATUS_DUMP: &str = "status.dump";
/// The container's writable layer as a layer tar.
pub const ROOTFS_DIFF: &str = "rootfs-diff.tar";
/// CRIU's log of the dump.
pub const DUMP_LOG: &str = "dump.log";
/// CRIU's statistics of the dump.
pub const STATS_DUMP: &str = "stats-dump";
/// The container's CRI log.
pub const CONTAINER_LOG: &str = "container.log";
/// The CRIU image every dump has: its absence means no checkpoint.
const INVENTORY: &str = "inventory.img";
/// Largest metadata file read into memory.
const MAX_METADATA_BYTES: u64 = 16 * 1024 * 1024;
/// Go's zero `time.Time`, which its JSON carries for "never".
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// What a checkpoint archive could not be written or read for.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The file is not a checkpoint archive; says what is missing or wrong.
    #[error("{path} is not a checkpoint archive: {reason}")]
    NotCheckpoint {
        /// The archive.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The archive was complete after its deadline: not put in place.
    #[error("{path}: not written within the checkpoint's timeout")]
    Deadline {
        /// The location asked for.
        path: PathBuf,
    },
    /// The rootfs diff could not be written or applied.
    #[error("rootfs diff {path}: {source}")]
    Diff {
        /// The archive or directory concerned.
        path: PathBuf,
        /// The layer code's error.
        source: petrel_image::ImageError,
    },
}

impl ArchiveError {
    fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    fn not_checkpoint(path: &Path, reason: impl Into<String>) -> Self {
        Self::NotCheckpoint {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// `config.dump`: the checkpointed container, as Podman, CRI-O and
/// containerd describe it (times in RFC 3339).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigDump {
    /// The container id.
    pub id: String,
    /// The container name.
    pub name: String,
    /// The image as the container was created with it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rootfs_image: String,
    /// The image by id or digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rootfs_image_ref: String,
    /// The image's name (a tag).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rootfs_image_name: String,
    /// The OCI runtime that ran it.
    #[serde(default, rename = "runtime", skip_serializing_if = "String::is_empty")]
    pub runtime: String,
    /// When the container was created.
    #[serde(default)]
    pub created_time: String,
    /// When the checkpoint was taken.
    #[serde(default, rename = "checkpointedTime")]
    pub checkpointed_at: String,
    /// When it was restored ([`ZERO_TIME`] for never).
    #[serde(default, rename = "restoredTime")]
    pub restored_at: String,
    /// Whether the container was itself restored.
    #[serde(default)]
    pub restored: bool,
}

/// What goes into an archive besides CRIU's images.
#[derive(Debug)]
pub struct ArchiveParts<'a> {
    /// CRIU's images.
    pub images: &'a Path,
    /// `config.dump`.
    pub config: &'a ConfigDump,
    /// `spec.dump`.
    pub spec: &'a [u8],
    /// `status.dump`.
    pub status: &'a [u8],
    /// The rootfs diff, a layer tar already written.
    pub rootfs_diff: Option<&'a Path>,
    /// CRIU's log of the dump.
    pub dump_log: Option<&'a Path>,
    /// CRIU's statistics of the dump.
    pub stats_dump: Option<&'a Path>,
    /// The container's CRI log.
    pub container_log: Option<&'a Path>,
    /// When the archive must be in place; past it, it is not.
    pub deadline: Option<std::time::Instant>,
}

/// Removes a temporary file unless it was renamed into place.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            if let Err(e) = fs::remove_file(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "temporary checkpoint archive not removed");
                }
            }
        }
    }
}

/// Writes the archive to `location` (replacing a file there) through a
/// temporary file in the same directory, synced before the rename; returns
/// its size. On failure nothing is left at `location` or beside it.
pub fn write_archive(location: &Path, parts: &ArchiveParts<'_>) -> Result<u64, ArchiveError> {
    let name = location
        .file_name()
        .ok_or_else(|| ArchiveError::io("write", location, io::ErrorKind::InvalidInput.into()))?;
    let dir = match location.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp_path = dir.join(format!(
        ".{}.petrel-tmp-{}",
        name.to_string_lossy(),
        crate::util::new_id()
            .map_err(|e| ArchiveError::io("make a name", location, e))?
            .get(..16)
            .unwrap_or_default()
    ));
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp_path)
        .map_err(|e| ArchiveError::io("create", &tmp_path, e))?;
    let mut tmp = TempFile(Some(tmp_path.clone()));
    let werr = |e| ArchiveError::io("write", &tmp_path, e);
    let mut b = tar::Builder::new(io::BufWriter::new(file));
    b.mode(tar::HeaderMode::Deterministic);
    append_images(&mut b, parts.images).map_err(werr)?;
    let config = serde_json::to_vec_pretty(parts.config)
        .map_err(|e| werr(io::Error::new(io::ErrorKind::InvalidData, e)))?;
    append_bytes(&mut b, CONFIG_DUMP, &config).map_err(werr)?;
    append_bytes(&mut b, SPEC_DUMP, parts.spec).map_err(werr)?;
    append_bytes(&mut b, STATUS_DUMP, parts.status).map_err(werr)?;
    for (name, file) in [
        (ROOTFS_DIFF, parts.rootfs_diff),
        (DUMP_LOG, parts.dump_log),
        (STATS_DUMP, parts.stats_dump),
        (CONTAINER_LOG, parts.container_log),
    ] {
        if let Some(file) = file.filter(|f| f.is_file()) {
            let mut f = File::open(file).map_err(|e| ArchiveError::io("open", file, e))?;
            b.append_file(name, &mut f)
                .map_err(|e| ArchiveError::io("archive", file, e))?;
        }
    }
    let mut w = b.into_inner().map_err(werr)?;
    w.flush().map_err(werr)?;
    let file = w.into_inner().map_err(|e| werr(e.into_error()))?;
    file.sync_all().map_err(werr)?;
    let size = file.metadata().map_err(werr)?.len();
    drop(file);
    if parts
        .deadline
        .is_some_and(|d| std::time::Instant::now() > d)
    {
        return Err(ArchiveError::Deadline {
            path: location.to_path_buf(),
        });
    }
    fs::rename(&tmp_path, location).map_err(|e| ArchiveError::io("rename", location, e))?;
    tmp.0 = None;
    // The rename is durable once the directory is.
    if let Ok(d) = File::open(dir) {
        if let Err(e) = d.sync_all() {
            tracing::warn!(dir = %dir.display(), error = %e, "checkpoint directory not synced");
        }
    }
    Ok(size)
}

/// `checkpoint/` and every regular file in `images`, sorted by name.
fn append_images<W: Write>(b: &mut tar::Builder<W>, images: &Path) -> io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o700);
    h.set_size(0);
    b.append_data(&mut h, format!("{CHECKPOINT_DIR}/"), io::empty())?;
    let mut names: Vec<_> = fs::read_dir(images)?
        .collect::<io::Result<Vec<_>>>()?
        .into_iter()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for name in names {
        let mut f = File::open(images.join(&name))?;
        b.append_file(Path::new(CHECKPOINT_DIR).join(&name), &mut f)?;
    }
    Ok(())
}

fn append_bytes<W: Write>(b: &mut tar::Builder<W>, name: &str, data: &[u8]) -> io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o600);
    h.set_size(data.len() as u64);
    b.append_data(&mut h, name, data)
}

/// The metadata of an archive, read without unpacking it.
#[derive(Debug, Clone)]
pub struct Metadata {
    /// `config.dump`.
    pub config: ConfigDump,
    /// `spec.dump`, parsed.
    pub spec: serde_json::Value,
    /// `status.dump`, parsed, if the archive has one.
    pub status: Option<serde_json::Value>,
}

/// An entry's name as the archive's layout sees it (`./` dropped), or
/// `None` for a name that climbs out or is absolute.
fn entry_name(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Where an entry of the archive belongs.
enum Place {
    /// A CRIU image: `checkpoint/<name>`.
    Image(PathBuf),
    /// The `checkpoint/` directory itself.
    ImagesDir,
    /// A top-level file with this name.
    File(String),
}

fn place(archive: &Path, entry: &tar::Entry<'_, impl Read>) -> Result<Place, ArchiveError> {
    let raw = entry
        .path()
        .map_err(|e| ArchiveError::not_checkpoint(archive, format!("bad entry name: {e}")))?;
    let name = entry_name(&raw).ok_or_else(|| {
        ArchiveError::not_checkpoint(archive, format!("entry {} is outside it", raw.display()))
    })?;
    let mut comps = name.components();
    let first = comps
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    let rest: PathBuf = comps.collect();
    let kind = entry.header().entry_type();
    match first.as_deref() {
        Some(CHECKPOINT_DIR) if rest.as_os_str().is_empty() => {
            if kind.is_dir() {
                Ok(Place::ImagesDir)
            } else {
                Err(ArchiveError::not_checkpoint(
                    archive,
                    "checkpoint is not a directory",
                ))
            }
        }
        Some(CHECKPOINT_DIR) => {
            if rest.components().count() != 1 || !kind.is_file() {
                return Err(ArchiveError::not_checkpoint(
                    archive,
                    format!("{} is not a CRIU image", name.display()),
                ));
            }
            Ok(Place::Image(rest))
        }
        Some(top) => Ok(Place::File(top.to_owned())),
        None => Ok(Place::File(String::new())),
    }
}

fn read_small(
    archive: &Path,
    name: &str,
    entry: &mut tar::Entry<'_, impl Read>,
) -> Result<Vec<u8>, ArchiveError> {
    if entry.header().size().unwrap_or(u64::MAX) > MAX_METADATA_BYTES {
        return Err(ArchiveError::not_checkpoint(
            archive,
            format!("{name} is larger than {MAX_METADATA_BYTES} bytes"),
        ));
    }
    let mut data = Vec::new();
    entry
        .take(MAX_METADATA_BYTES)
        .read_to_end(&mut data)
        .map_err(|e| ArchiveError::io("read", &archive.join(name), e))?;
    Ok(data)
}

fn parse<T: serde::de::DeserializeOwned>(
    archive: &Path,
    name: &str,
    data: &[u8],
) -> Result<T, ArchiveError> {
    serde_json::from_slice(data)
        .map_err(|e| ArchiveError::not_checkpoint(archive, format!("{name}: {e}")))
}

/// Opens the archive and walks its entries (skipping content by seeking).
fn walk<R: Read + Seek>(
    archive: &Path,
    file: R,
    mut each: impl FnMut(Place, &mut tar::Entry<'_, R>) -> Result<(), ArchiveError>,
) -> Result<(), ArchiveError> {
    let not_tar = |e: io::Error| ArchiveError::not_checkpoint(archive, format!("not a tar: {e}"));
    let mut tar = tar::Archive::new(file);
    let entries = tar.entries_with_seek().map_err(not_tar)?;
    for entry in entries {
        let mut entry = entry.map_err(not_tar)?;
        let place = place(archive, &entry)?;
        each(place, &mut entry)?;
    }
    Ok(())
}

/// Reads an archive's metadata and checks that it holds a checkpoint
/// (`config.dump`, `spec.dump` and CRIU's `inventory.img`).
pub fn read_metadata(archive: &Path) -> Result<Metadata, ArchiveError> {
    let file = File::open(archive).map_err(|e| ArchiveError::io("open", archive, e))?;
    if !file
        .metadata()
        .map_err(|e| ArchiveError::io("stat", archive, e))?
        .is_file()
    {
        return Err(ArchiveError::not_checkpoint(archive, "not a regular file"));
    }
    let (mut config, mut spec, mut status, mut inventory) = (None, None, None, false);
    walk(archive, file, |place, entry| {
        match place {
            Place::Image(name) => inventory |= name == Path::new(INVENTORY),
            Place::File(name) if name == CONFIG_DUMP => {
                config = Some(read_small(archive, CONFIG_DUMP, entry)?)
            }
            Place::File(name) if name == SPEC_DUMP => {
                spec = Some(read_small(archive, SPEC_DUMP, entry)?)
            }
            Place::File(name) if name == STATUS_DUMP => {
                status = Some(read_small(archive, STATUS_DUMP, entry)?)
            }
            Place::File(_) | Place::ImagesDir => {}
        }
        Ok(())
    })?;
    let missing = |what: &str| ArchiveError::not_checkpoint(archive, format!("it has no {what}"));
    let config = config.ok_or_else(|| missing(CONFIG_DUMP))?;
    let spec = spec.ok_or_else(|| missing(SPEC_DUMP))?;
    if !inventory {
        return Err(missing("checkpoint/inventory.img (CRIU's images)"));
    }
    Ok(Metadata {
        config: parse(archive, CONFIG_DUMP, &config)?,
        spec: parse(archive, SPEC_DUMP, &spec)?,
        status: status
            .map(|s| parse(archive, STATUS_DUMP, &s))
            .transpose()?,
    })
}

/// Unpacks what a restore needs: CRIU's images into `images` (made here,
/// 0700) and the rootfs diff applied to the empty directory `upper`
/// within `limits`. What it made is the caller's to remove on failure.
pub fn unpack_for_restore(
    archive: &Path,
    images: &Path,
    upper: &Path,
    limits: &petrel_image::Limits,
) -> Result<(), ArchiveError> {
    let file = File::open(archive).map_err(|e| ArchiveError::io("open", archive, e))?;
    petrel_fs::create_private_dir_all(images, petrel_fs::PRIVATE)
        .map_err(|e| ArchiveError::io("create", images, io::Error::other(e.to_string())))?;
    // CRIU's images count against the same bound as a layer (a sparse
    // entry would otherwise unpack to whatever it claims).
    let mut claimed = 0u64;
    walk(archive, file, |place, entry| match place {
        Place::Image(name) => {
            claimed = claimed.saturating_add(entry.size());
            if limits.max_layer_bytes > 0 && claimed > limits.max_layer_bytes {
                return Err(ArchiveError::not_checkpoint(
                    archive,
                    format!(
                        "its CRIU images exceed {} bytes (max_layer_bytes)",
                        limits.max_layer_bytes
                    ),
                ));
            }
            let path = images.join(name);
            let mut out = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| ArchiveError::io("create", &path, e))?;
            io::copy(entry, &mut out).map_err(|e| ArchiveError::io("write", &path, e))?;
            Ok(())
        }
        Place::File(name) if name == ROOTFS_DIFF => {
            if !entry.header().entry_type().is_file() {
                return Err(ArchiveError::not_checkpoint(
                    archive,
                    format!("{ROOTFS_DIFF} is not a file"),
                ));
            }
            petrel_image::apply_diff(entry, upper, limits).map_err(|source| ArchiveError::Diff {
                path: archive.to_path_buf(),
                source,
            })
        }
        Place::File(_) | Place::ImagesDir => Ok(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ConfigDump {
        ConfigDump {
            id: "c1".into(),
            name: "counter".into(),
            rootfs_image: "busybox:latest".into(),
            rootfs_image_ref: "sha256:abc".into(),
            rootfs_image_name: "busybox:latest".into(),
            runtime: "runc".into(),
            created_time: "2026-11-28T05:00:00.000000000Z".into(),
            checkpointed_at: "2026-11-28T05:01:00.000000000Z".into(),
            restored_at: ZERO_TIME.into(),
            restored: false,
        }
    }

    /// A fake dump: CRIU's images, logs and a rootfs diff of one file and
    /// one whiteout (an overlay upper directory made without root: the
    /// whiteout is written as the `.wh.` entry a layer tar has).
    struct Dump {
        _dir: tempfile::TempDir,
        images: PathBuf,
        diff: PathBuf,
        log: PathBuf,
    }

    impl Dump {
        fn new() -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let images = dir.path().join("images");
            fs::create_dir(&images).expect("mkdir");
            fs::write(images.join(INVENTORY), b"inventory").expect("write");
            fs::write(images.join("pages-1.img"), vec![7u8; 10_000]).expect("write");
            fs::write(
                dir.path().join(DUMP_LOG),
                b"Dumping finished successfully\n",
            )
            .expect("write");
            let diff = dir.path().join("diff.tar");
            let mut b = tar::Builder::new(File::create(&diff).expect("create"));
            let mut h = tar::Header::new_gnu();
            h.set_size(2);
            h.set_mode(0o644);
            b.append_data(&mut h, "tmp/count", &b"41"[..])
                .expect("append");
            let mut h = tar::Header::new_gnu();
            h.set_size(0);
            h.set_mode(0o644);
            b.append_data(&mut h, "etc/.wh.motd", io::empty())
                .expect("append");
            b.finish().expect("finish");
            let log = dir.path().join(DUMP_LOG);
            Self {
                _dir: dir,
                images,
                diff,
                log,
            }
        }

        fn parts<'a>(&'a self, config: &'a ConfigDump) -> ArchiveParts<'a> {
            ArchiveParts {
                images: &self.images,
                config,
                spec: br#"{"ociVersion":"1.0.2"}"#,
                status: br#"{"id":"c1","metadata":{"name":"counter"}}"#,
                rootfs_diff: Some(&self.diff),
                dump_log: Some(&self.log),
                stats_dump: None,
                container_log: None,
                deadline: None,
            }
        }
    }

    fn names(archive: &Path) -> Vec<String> {
        let mut tar = tar::Archive::new(File::open(archive).expect("open"));
        tar.entries()
            .expect("entries")
            .map(|e| {
                e.expect("entry")
                    .path()
                    .expect("path")
                    .display()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn write_archive_should_lay_out_what_kubelet_and_checkpointctl_expect() {
        let dump = Dump::new();
        let out = tempfile::tempdir().expect("tempdir");
        let location = out.path().join("checkpoint.tar");
        let config = config();
        let size = write_archive(&location, &dump.parts(&config)).expect("write");
        assert_eq!(size, fs::metadata(&location).expect("stat").len());
        assert_eq!(
            names(&location),
            [
                "checkpoint/",
                "checkpoint/inventory.img",
                "checkpoint/pages-1.img",
                "config.dump",
                "spec.dump",
                "status.dump",
                "rootfs-diff.tar",
                "dump.log",
            ]
        );
        // config.dump has the field names Go's readers use.
        let mut tar = tar::Archive::new(File::open(&location).expect("open"));
        let mut entry = tar
            .entries()
            .expect("entries")
            .map(|e| e.expect("entry"))
            .find(|e| e.path().expect("path") == Path::new(CONFIG_DUMP))
            .expect("config.dump");
        let mut text = String::new();
        entry.read_to_string(&mut text).expect("read");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["rootfsImageRef"], "sha256:abc");
        assert_eq!(v["checkpointedTime"], "2026-11-28T05:01:00.000000000Z");
        assert_eq!(v["restoredTime"], ZERO_TIME);
        assert_eq!(v["runtime"], "runc");
        // Nothing but the archive is left in its directory.
        let left: Vec<_> = fs::read_dir(out.path()).expect("read").flatten().collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }

    #[test]
    fn write_archive_should_leave_nothing_when_it_fails() {
        let out = tempfile::tempdir().expect("tempdir");
        let location = out.path().join("checkpoint.tar");
        let config = config();
        let parts = ArchiveParts {
            images: Path::new("/nonexistent/images"),
            config: &config,
            spec: b"{}",
            status: b"{}",
            rootfs_diff: None,
            dump_log: None,
            stats_dump: None,
            container_log: None,
            deadline: None,
        };
        let err = write_archive(&location, &parts).expect_err("must fail");
        assert!(err.to_string().contains(".petrel-tmp-"), "{err}");
        let left: Vec<_> = fs::read_dir(out.path()).expect("read").flatten().collect();
        assert!(left.is_empty(), "{left:?}");
        let err = write_archive(&out.path().join("missing/x.tar"), &parts).expect_err("no dir");
        assert!(err.to_string().contains("missing"), "{err}");
        // Past its deadline the archive is not put in place.
        let dump = Dump::new();
        let mut late = dump.parts(&config);
        late.deadline = Some(std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(2));
        let err = write_archive(&location, &late).expect_err("late");
        assert!(matches!(err, ArchiveError::Deadline { .. }), "{err}");
        let left: Vec<_> = fs::read_dir(out.path()).expect("read").flatten().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn read_metadata_should_read_back_what_was_written() {
        let dump = Dump::new();
        let out = tempfile::tempdir().expect("tempdir");
        let location = out.path().join("cp.tar");
        let config = config();
        write_archive(&location, &dump.parts(&config)).expect("write");
        let meta = read_metadata(&location).expect("read");
        assert_eq!(meta.config, config);
        assert_eq!(meta.spec["ociVersion"], "1.0.2");
        assert_eq!(meta.status.expect("status")["metadata"]["name"], "counter");
    }

    #[test]
    fn read_metadata_should_refuse_what_is_not_a_checkpoint() {
        let out = tempfile::tempdir().expect("tempdir");
        let garbage = out.path().join("garbage.tar");
        fs::write(&garbage, vec![0x5au8; 4096]).expect("write");
        let err = read_metadata(&garbage).expect_err("garbage");
        assert!(matches!(err, ArchiveError::NotCheckpoint { .. }), "{err}");

        // A tar, but no CRIU images.
        let plain = out.path().join("plain.tar");
        let mut b = tar::Builder::new(File::create(&plain).expect("create"));
        append_bytes(&mut b, CONFIG_DUMP, b"{\"id\":\"x\",\"name\":\"y\"}").expect("append");
        append_bytes(&mut b, SPEC_DUMP, b"{}").expect("append");
        b.finish().expect("finish");
        drop(b);
        let err = read_metadata(&plain).expect_err("no images");
        assert!(err.to_string().contains("inventory.img"), "{err}");

        // An entry that climbs out.
        let evil = out.path().join("evil.tar");
        let mut data = Vec::new();
        {
            let mut b = tar::Builder::new(&mut data);
            append_bytes(&mut b, "checkpoint/inventory.img", b"x").expect("append");
            b.finish().expect("finish");
        }
        // Rewrite the name in place (the tar crate refuses to write `..`).
        let name = b"checkpoint/inventory.img";
        let evil_name = b"../../../../etc/passwd\0\0";
        data[..name.len()].copy_from_slice(&evil_name[..name.len()]);
        let sum: u32 = data[..512]
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u32::from(*b)
                }
            })
            .sum();
        data[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        fs::write(&evil, &data).expect("write");
        let err = read_metadata(&evil).expect_err("evil");
        assert!(err.to_string().contains("outside"), "{err}");

        let err = read_metadata(out.path()).expect_err("a directory");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    /// Needs root, as every unpack of a layer does (whiteouts are devices).
    #[test]
    fn unpack_for_restore_should_give_criu_its_images_and_the_layer_its_changes() {
        let dump = Dump::new();
        let out = tempfile::tempdir().expect("tempdir");
        let location = out.path().join("cp.tar");
        let config = config();
        write_archive(&location, &dump.parts(&config)).expect("write");
        let (images, upper) = (out.path().join("images"), out.path().join("upper"));
        fs::create_dir(&upper).expect("mkdir");
        unpack_for_restore(&location, &images, &upper, &petrel_image::Limits::default())
            .expect("unpack");
        let mut got: Vec<_> = fs::read_dir(&images)
            .expect("read")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        got.sort();
        assert_eq!(got, ["inventory.img", "pages-1.img"]);
        assert_eq!(
            fs::read(images.join("pages-1.img")).expect("read"),
            vec![7u8; 10_000]
        );
        assert_eq!(fs::read(upper.join("tmp/count")).expect("read"), b"41");
        // The deleted file is an overlay whiteout again.
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let wh = fs::symlink_metadata(upper.join("etc/motd")).expect("whiteout");
        assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{wh:?}");
    }

    #[test]
    fn unpack_for_restore_should_refuse_nested_or_oversized_images() {
        let out = tempfile::tempdir().expect("tempdir");
        let nested = out.path().join("nested.tar");
        let mut b = tar::Builder::new(File::create(&nested).expect("create"));
        append_bytes(&mut b, "checkpoint/sub/inventory.img", b"x").expect("append");
        b.finish().expect("finish");
        drop(b);
        let upper = out.path().join("upper");
        fs::create_dir(&upper).expect("mkdir");
        let err = unpack_for_restore(
            &nested,
            &out.path().join("images"),
            &upper,
            &petrel_image::Limits::default(),
        )
        .expect_err("nested");
        assert!(err.to_string().contains("not a CRIU image"), "{err}");

        // Images larger than the bound are refused before they are written.
        let dump = Dump::new();
        let location = out.path().join("cp.tar");
        let config = config();
        write_archive(&location, &dump.parts(&config)).expect("write");
        let small = petrel_image::Limits {
            max_layer_bytes: 5_000,
        };
        let err = unpack_for_restore(&location, &out.path().join("images2"), &upper, &small)
            .expect_err("too large");
        assert!(err.to_string().contains("exceed 5000 bytes"), "{err}");
    }
}
