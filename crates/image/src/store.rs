//! The image store: the in-memory index, its persistence in petrel-store,
//! imports and removals.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use petrel_store::{encode, Op, Store, Table};
use serde::{Deserialize, Serialize};

use crate::archive::{merge_unique, open_layer, Extracted, Member, Plan, PlannedLayer};
use crate::digest::HashingReader;
use crate::reference::{self, is_hex64};
use crate::registry::{LayerState, ProgressReporter, PulledImage};
use crate::unpack::unpack_layer;
use crate::{mounts, FsUsage, Image, ImageError, Limits};

mod gc;
pub use gc::{DiskStats, GcReport, Removal, GC_MIN_AGE, PRUNE_USE_GUARD};

/// Prefixes of the temp directories the store creates under `<root>/tmp/`;
/// each is followed by 16 hex characters. Only these are ever cleaned up.
const TEMP_PREFIXES: [&str; 4] = ["import-", "layer-", "gc-", "blob-"];
/// Shortest id prefix [`ImageStore::get`] accepts.
const MIN_ID_PREFIX: usize = 12;

/// An image as persisted in `Table::Images` (keyed by id).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ImageRecord {
    id: String,
    #[serde(default)]
    repo_tags: Vec<String>,
    #[serde(default)]
    repo_digests: Vec<String>,
    #[serde(default)]
    size: u64,
    config: oci_spec::image::ImageConfiguration,
    diff_ids: Vec<String>,
}

impl From<&Image> for ImageRecord {
    fn from(i: &Image) -> Self {
        Self {
            id: i.id.clone(),
            repo_tags: i.repo_tags.clone(),
            repo_digests: i.repo_digests.clone(),
            size: i.size,
            config: i.config.clone(),
            diff_ids: i.diff_ids.clone(),
        }
    }
}

impl From<ImageRecord> for Image {
    fn from(r: ImageRecord) -> Self {
        Self {
            id: r.id,
            repo_tags: r.repo_tags,
            repo_digests: r.repo_digests,
            size: r.size,
            config: r.config,
            diff_ids: r.diff_ids,
        }
    }
}

/// An unpacked layer as persisted in `Table::Layers` (keyed by diff id).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LayerRecord {
    diff_id: String,
    /// Bytes allocated to the unpacked layer.
    #[serde(default)]
    size: u64,
    /// Inodes of the unpacked layer.
    #[serde(default)]
    inodes: u64,
}

#[derive(Default)]
struct Index {
    images: BTreeMap<String, Image>,
    /// Normalised tag → image id.
    tags: HashMap<String, String>,
    /// Repo digest → image id.
    digests: HashMap<String, String>,
    layers: HashMap<String, LayerRecord>,
}

impl Index {
    fn insert(&mut self, image: Image) {
        if let Some(old) = self.images.remove(&image.id) {
            self.unlink_names(&old);
        }
        for t in &image.repo_tags {
            self.tags.insert(t.clone(), image.id.clone());
        }
        for d in &image.repo_digests {
            self.digests.insert(d.clone(), image.id.clone());
        }
        self.images.insert(image.id.clone(), image);
    }

    fn remove(&mut self, id: &str) -> Option<Image> {
        let old = self.images.remove(id)?;
        self.unlink_names(&old);
        Some(old)
    }

    fn unlink_names(&mut self, image: &Image) {
        for t in &image.repo_tags {
            if self.tags.get(t) == Some(&image.id) {
                self.tags.remove(t);
            }
        }
        for d in &image.repo_digests {
            if self.digests.get(d) == Some(&image.id) {
                self.digests.remove(d);
            }
        }
    }

    /// The id `reference` designates (see [`ImageStore::get`]).
    fn resolve(&self, reference: &str) -> Option<&Image> {
        let r = reference.trim();
        if let Some(hex) = r.strip_prefix("sha256:") {
            if is_hex64(hex) {
                return self.images.get(r);
            }
            return self.by_prefix(hex);
        }
        if is_hex64(r) {
            return self.images.get(&format!("sha256:{r}"));
        }
        if let Ok(parsed) = reference::parse(r) {
            let id = match &parsed.digest {
                Some(d) => self.digests.get(&format!("{}@{d}", parsed.name)),
                None => self.tags.get(&parsed.to_string()),
            };
            if let Some(image) = id.and_then(|id| self.images.get(id)) {
                return Some(image);
            }
        }
        self.by_prefix(r)
    }

    /// The one image whose id hex starts with `prefix` (>= 12 hex chars).
    fn by_prefix(&self, prefix: &str) -> Option<&Image> {
        if prefix.len() < MIN_ID_PREFIX
            || !prefix
                .bytes()
                .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        {
            return None;
        }
        let start = format!("sha256:{prefix}");
        let mut matches = self
            .images
            .range(start.clone()..)
            .take_while(|(id, _)| id.starts_with(&start));
        let first = matches.next()?;
        match matches.next() {
            Some(_) => None,
            None => Some(first.1),
        }
    }
}

/// The image store. Cheap to read from many threads; imports and removals
/// are serialised.
pub struct ImageStore {
    root: PathBuf,
    mountpoint: PathBuf,
    db: Store,
    index: RwLock<Index>,
    /// Held by import and remove for their whole duration, so the index
    /// cannot change between planning a change and committing it.
    writer: Mutex<()>,
    /// When each image was stored and last used (GC's LRU order).
    usage: gc::Usage,
    /// When the store was opened (ns): the store time of images loaded.
    loaded_at: u64,
    /// Bounds on the layers unpacked.
    limits: Limits,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn random_hex() -> Result<String, ImageError> {
    let mut b = [0u8; 8];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut b))
        .map_err(|e| ImageError::io("read", "/dev/urandom", e))?;
    Ok(hex::encode(b))
}

fn is_own_temp(name: &str) -> bool {
    TEMP_PREFIXES.iter().any(|p| {
        name.strip_prefix(p).is_some_and(|rest| {
            rest.len() == 16 && rest.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        })
    })
}

/// A temp directory removed when dropped (unless kept).
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn create(tmp_root: &Path, prefix: &str, mode: u32) -> Result<Self, ImageError> {
        let path = tmp_root.join(format!("{prefix}{}", random_hex()?));
        fs::DirBuilder::new()
            .mode(mode)
            .create(&path)
            .map_err(|e| ImageError::io("create directory", &path, e))?;
        // DirBuilder's mode is masked by the umask.
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .map_err(|e| ImageError::io("chmod", &path, e))?;
        Ok(Self { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        match fs::remove_dir_all(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove temp directory")
            }
        }
    }
}

fn fsync_dir(path: &Path) -> Result<(), ImageError> {
    fs::File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| ImageError::io("sync directory", path, e))
}

impl ImageStore {
    /// Opens the store rooted at `root` (`<runtime root>/images`): creates
    /// its directories, opens `<root>/meta.redb`, loads the index, and
    /// removes the temp directories of an interrupted import or removal
    /// (only names it creates itself under `<root>/tmp/`).
    pub fn open(root: &Path) -> Result<ImageStore, ImageError> {
        // layers/ holds image content with setuid binaries and whatever
        // secrets images carry; tmp/ holds layers being unpacked. Neither
        // may be reachable by other users of the host (overlay mounts made
        // by root do not need them to be), nor is the store's own directory.
        for dir in [root.to_path_buf(), root.join("layers"), root.join("tmp")] {
            petrel_fs::ensure_private_root(&dir, petrel_fs::PRIVATE, None)
                .map_err(|e| ImageError::io("create directory", &dir, io::Error::other(e)))?;
        }
        let root = fs::canonicalize(root).map_err(|e| ImageError::io("resolve", root, e))?;
        let store = ImageStore {
            mountpoint: mounts::mountpoint_of(&root),
            db: Store::open(&root.join("meta.redb"))?,
            root,
            index: RwLock::new(Index::default()),
            writer: Mutex::new(()),
            usage: gc::Usage::default(),
            loaded_at: gc::now_ns(),
            limits: Limits::default(),
        };
        store.clean_temp()?;
        store.load()?;
        Ok(store)
    }

    /// The store with `limits` on the layers it unpacks instead of the
    /// defaults.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn layer_dir(&self, diff_id: &str) -> PathBuf {
        self.root
            .join("layers")
            .join(diff_id.strip_prefix("sha256:").unwrap_or(diff_id))
    }

    fn read_index(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_index(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn clean_temp(&self) -> Result<(), ImageError> {
        let tmp = self.tmp();
        let entries = fs::read_dir(&tmp).map_err(|e| ImageError::io("read directory", &tmp, e))?;
        let mut removed = 0usize;
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io("read directory", &tmp, e))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !is_own_temp(name) {
                continue;
            }
            let path = entry.path();
            let res = if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            res.map_err(|e| ImageError::io("remove leftover", &path, e))?;
            removed += 1;
        }
        if removed > 0 {
            tracing::info!(root = %self.root.display(), removed, "removed leftovers of an interrupted import");
        }
        Ok(())
    }

    fn load(&self) -> Result<(), ImageError> {
        let mut index = Index::default();
        for (key, rec) in self.db.list::<LayerRecord>(Table::Layers)? {
            match rec {
                Ok(r) => {
                    index.layers.insert(key, r);
                }
                Err(e) => {
                    tracing::warn!(layer = %key, error = %e, "skipping unreadable layer record")
                }
            }
        }
        for (key, rec) in self.db.list::<ImageRecord>(Table::Images)? {
            match rec {
                Ok(r) => {
                    if let Some(missing) =
                        r.diff_ids.iter().find(|d| !index.layers.contains_key(*d))
                    {
                        tracing::warn!(image.id = %key, layer = %missing, "image refers to a layer that is not unpacked");
                    }
                    index.insert(Image::from(r));
                }
                Err(e) => {
                    tracing::warn!(image.id = %key, error = %e, "skipping unreadable image record")
                }
            }
        }
        tracing::debug!(
            images = index.images.len(),
            layers = index.layers.len(),
            "image store loaded"
        );
        *self.write_index() = index;
        Ok(())
    }

    /// Imports every linux/amd64 image of an OCI image-layout archive or a
    /// docker archive, and tags each with its names from the archive plus
    /// `extra_tags`. Blocks until the layers are unpacked and the metadata
    /// is committed. Re-importing an image only adds tags; a tag held by
    /// another image moves to the imported one.
    pub fn import(&self, archive: &Path, extra_tags: &[String]) -> Result<Vec<Image>, ImageError> {
        let mut extra = Vec::new();
        for t in extra_tags {
            let r = reference::parse(t)?;
            if r.digest.is_some() {
                return Err(ImageError::InvalidReference {
                    reference: t.clone(),
                    reason: "a tag cannot pin a digest".to_string(),
                });
            }
            extra.push(r.to_string());
        }
        let _writer = self.lock_writer();
        let work = TempDir::create(&self.tmp(), "import-", 0o700)?;
        let extracted = Extracted::extract(archive, &work.path)?;
        let plans = extracted.plans()?;
        if plans.len() > 1 && !extra.is_empty() {
            return Err(ImageError::InvalidArchive {
                path: archive.to_path_buf(),
                reason: format!("extra tags given for an archive of {} images", plans.len()),
            });
        }
        let mut new_layers: Vec<LayerRecord> = Vec::new();
        let result = self
            .unpack_layers(&plans, &mut new_layers, &|_, _| {})
            .and_then(|()| self.commit(&plans, &extra, &[], &new_layers));
        if result.is_err() {
            for l in &new_layers {
                self.discard_layer_dir(&l.diff_id);
            }
        }
        drop(work);
        let images = result?;
        tracing::info!(
            archive = %archive.display(),
            images = images.len(),
            new_layers = new_layers.len(),
            "imported images"
        );
        Ok(images)
    }

    /// Commits an image pulled from a registry: unpacks the layers the
    /// store lacks from the pulled (already verified) blobs, checks each
    /// diff id, and records the image under its tag (or, for a pull by
    /// digest, its repo digest) in one transaction, as [`import`](Self::import)
    /// does. On failure nothing is stored. Each layer unpacked here is
    /// reported `Unpacking` to `progress`, and every layer not already in
    /// the store `Done` once the image is committed.
    pub fn import_pulled(
        &self,
        pulled: &PulledImage,
        progress: &ProgressReporter,
    ) -> Result<Image, ImageError> {
        let mut layers = Vec::new();
        for l in &pulled.layers {
            let blob = match &l.blob {
                Some(b) => Member {
                    file: b.path.clone(),
                    size: b.size,
                    digest: b.digest.clone(),
                },
                // The store had this layer when the pull checked;
                // unpack_layers skips it. Should it have gone since, the
                // missing file makes the commit fail rather than succeed
                // without the layer.
                None => Member {
                    file: self.tmp().join("absent-layer"),
                    size: l.size,
                    digest: l.digest.clone(),
                },
            };
            layers.push(PlannedLayer {
                blob,
                diff_id: l.diff_id.clone(),
                media_type: Some(l.media_type.clone()),
            });
        }
        let plan = Plan {
            id: pulled.config_digest.clone(),
            config: pulled.config.clone(),
            layers,
            tags: pulled.tag.iter().cloned().collect(),
            manifest_digest: Some(pulled.manifest_digest.clone()),
        };
        let digest_names = if pulled.tag.is_none() {
            vec![pulled.name.clone()]
        } else {
            Vec::new()
        };
        let plans = [plan];
        let _writer = self.lock_writer();
        let mut new_layers: Vec<LayerRecord> = Vec::new();
        // With one plan, a layer's position among the plans' layers is its
        // index in the image, as the progress entries are numbered.
        let result = self
            .unpack_layers(&plans, &mut new_layers, &|i, state| progress.set(i, state))
            .and_then(|()| self.commit(&plans, &[], &digest_names, &new_layers));
        if result.is_err() {
            for l in &new_layers {
                self.discard_layer_dir(&l.diff_id);
            }
        }
        let image = result?
            .into_iter()
            .next()
            .ok_or_else(|| ImageError::NotFound(format!("image {}", pulled.config_digest)))?;
        progress.finish();
        tracing::info!(
            reference = %pulled.reference,
            image.id = %image.id,
            new_layers = new_layers.len(),
            "pulled image stored"
        );
        Ok(image)
    }

    /// Whether the layer with this diff id is unpacked in the store.
    pub fn has_layer(&self, diff_id: &str) -> bool {
        self.read_index().layers.contains_key(diff_id) && self.layer_dir(diff_id).is_dir()
    }

    /// The store's temp directory (`<root>/tmp`), where pulls put blobs
    /// (named `blob-<16 hex>`, so an interrupted pull's are removed at the
    /// next open).
    pub fn tmp_dir(&self) -> PathBuf {
        self.tmp()
    }

    /// Unpacks the plans' layers the store lacks (each diff id once).
    /// `report(i, state)` hears of the `i`th layer of the plans (counted
    /// across plans, base first) being unpacked (`Unpacking`), then
    /// unpacked and verified (`Done`).
    fn unpack_layers(
        &self,
        plans: &[Plan],
        new_layers: &mut Vec<LayerRecord>,
        report: &dyn Fn(usize, LayerState),
    ) -> Result<(), ImageError> {
        let mut seen = HashSet::new();
        for (i, layer) in plans.iter().flat_map(|p| &p.layers).enumerate() {
            if !seen.insert(layer.diff_id.clone()) {
                continue;
            }
            let present = self.read_index().layers.contains_key(&layer.diff_id);
            if present && self.layer_dir(&layer.diff_id).is_dir() {
                continue;
            }
            report(i, LayerState::Unpacking);
            let rec = self.unpack_one(
                &layer.blob.file,
                &layer.diff_id,
                layer.media_type.as_deref(),
            )?;
            new_layers.push(rec);
            report(i, LayerState::Done);
        }
        if !new_layers.is_empty() {
            fsync_dir(&self.root.join("layers"))?;
        }
        Ok(())
    }

    /// Unpacks one layer into a temp directory, verifies its diff id, and
    /// renames it into `layers/`.
    fn unpack_one(
        &self,
        blob: &Path,
        diff_id: &str,
        media_type: Option<&str>,
    ) -> Result<LayerRecord, ImageError> {
        let dir = TempDir::create(&self.tmp(), "layer-", 0o755)?;
        let mut hr = HashingReader::new(open_layer(blob, media_type)?);
        let stats = unpack_layer(&mut hr, &dir.path, &self.limits)?;
        let (actual, _) = hr
            .finish()
            .map_err(|e| ImageError::io("read layer blob", blob, e))?;
        if actual != diff_id {
            return Err(ImageError::DigestMismatch {
                what: "uncompressed layer".to_string(),
                expected: diff_id.to_string(),
                actual,
            });
        }
        // Flush the unpacked files before the rename makes them visible.
        let d = fs::File::open(&dir.path).map_err(|e| ImageError::io("open", &dir.path, e))?;
        rustix::fs::syncfs(&d).map_err(|e| ImageError::io("sync filesystem", &dir.path, e))?;
        let dest = self.layer_dir(diff_id);
        if dest.exists() {
            // Unpacked by an import that failed to commit: replace it.
            self.discard_layer_dir(diff_id);
        }
        fs::rename(&dir.path, &dest)
            .map_err(|e| ImageError::io("rename layer into place", &dest, e))?;
        tracing::debug!(layer = %diff_id, bytes = stats.bytes, inodes = stats.inodes, "layer unpacked");
        Ok(LayerRecord {
            diff_id: diff_id.to_string(),
            size: stats.bytes,
            inodes: stats.inodes,
        })
    }

    /// Moves a layer directory out of `layers/` (atomically) and deletes it.
    /// Failures are logged: what is left sits in tmp/ and goes at the next
    /// open.
    fn discard_layer_dir(&self, diff_id: &str) {
        let dir = self.layer_dir(diff_id);
        let gc = match random_hex() {
            Ok(r) => self.tmp().join(format!("gc-{r}")),
            Err(e) => {
                tracing::warn!(layer = %diff_id, error = %e, "cannot remove layer directory");
                return;
            }
        };
        match fs::rename(&dir, &gc) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => {
                tracing::warn!(layer = %diff_id, error = %e, "cannot move layer directory away");
                return;
            }
        }
        if let Err(e) = fs::remove_dir_all(&gc) {
            tracing::warn!(path = %gc.display(), error = %e, "cannot remove layer directory");
        }
    }

    /// Merges the plans into the index and commits images and new layers
    /// in one transaction.
    fn commit(
        &self,
        plans: &[Plan],
        extra: &[String],
        digest_names: &[String],
        new_layers: &[LayerRecord],
    ) -> Result<Vec<Image>, ImageError> {
        let mut changed: BTreeMap<String, Image> = BTreeMap::new();
        let mut result_ids = Vec::new();
        {
            let index = self.read_index();
            for plan in plans {
                let mut image = changed
                    .get(&plan.id)
                    .or_else(|| index.images.get(&plan.id))
                    .cloned()
                    .unwrap_or_else(|| Image {
                        id: plan.id.clone(),
                        repo_tags: Vec::new(),
                        repo_digests: Vec::new(),
                        size: plan.layers.iter().map(|l| l.blob.size).sum(),
                        config: plan.config.clone(),
                        diff_ids: plan.layers.iter().map(|l| l.diff_id.clone()).collect(),
                    });
                let mut tags = plan.tags.clone();
                merge_unique(&mut tags, extra.iter().cloned());
                if let Some(md) = &plan.manifest_digest {
                    let digests = tags
                        .iter()
                        .filter_map(|t| reference::parse(t).ok())
                        .map(|r| r.name)
                        .chain(digest_names.iter().cloned())
                        .map(|name| format!("{name}@{md}"));
                    merge_unique(&mut image.repo_digests, digests.collect::<Vec<_>>());
                }
                for tag in &tags {
                    let holder = changed
                        .values()
                        .find(|i| i.id != plan.id && i.repo_tags.contains(tag))
                        .map(|i| i.id.clone())
                        .or_else(|| index.tags.get(tag).filter(|id| **id != plan.id).cloned());
                    if let Some(other_id) = holder {
                        let other = changed
                            .get(&other_id)
                            .or_else(|| index.images.get(&other_id))
                            .cloned();
                        if let Some(mut other) = other {
                            other.repo_tags.retain(|t| t != tag);
                            changed.insert(other_id, other);
                        }
                    }
                }
                merge_unique(&mut image.repo_tags, tags);
                if !result_ids.contains(&plan.id) {
                    result_ids.push(plan.id.clone());
                }
                changed.insert(plan.id.clone(), image);
            }
        }
        let mut ops = Vec::new();
        for image in changed.values() {
            ops.push(Op::Put(
                Table::Images,
                image.id.clone(),
                encode(Table::Images, &image.id, &ImageRecord::from(image))?,
            ));
        }
        for l in new_layers {
            ops.push(Op::Put(
                Table::Layers,
                l.diff_id.clone(),
                encode(Table::Layers, &l.diff_id, l)?,
            ));
        }
        self.db.apply(ops)?;
        let mut index = self.write_index();
        for l in new_layers {
            index.layers.insert(l.diff_id.clone(), l.clone());
        }
        for image in changed.into_values() {
            index.insert(image);
        }
        self.usage.stored(&result_ids);
        Ok(result_ids
            .iter()
            .filter_map(|id| index.images.get(id).cloned())
            .collect())
    }

    /// Every image in the store, ordered by id.
    pub fn list(&self) -> Vec<Image> {
        self.list_map(Image::clone)
    }

    /// Every image in the store, ordered by id, each mapped by `f` under
    /// the index's read lock, so a caller that needs a few fields copies
    /// only those (ListImages: not every image's whole OCI config).
    pub fn list_map<T>(&self, f: impl FnMut(&Image) -> T) -> Vec<T> {
        self.read_index().images.values().map(f).collect()
    }

    /// Finds an image by full id (`sha256:<hex>`), bare 64-hex id, unique id
    /// prefix of at least 12 hex characters, reference (normalised like
    /// containerd: `busybox` is `docker.io/library/busybox:latest`) or repo
    /// digest (`name@sha256:<hex>`).
    pub fn get(&self, reference: &str) -> Option<Image> {
        self.read_index().resolve(reference).cloned()
    }

    /// Removes the image `id` (anything [`get`](Self::get) accepts) with all
    /// its tags and digests, and deletes the layers no remaining image
    /// uses. Whether a container still uses the image is the caller's
    /// business.
    pub fn remove(&self, id: &str) -> Result<(), ImageError> {
        let _writer = self.lock_writer();
        let (image_id, unused) = {
            let index = self.read_index();
            let image = index
                .resolve(id)
                .ok_or_else(|| ImageError::NotFound(format!("image {id}")))?;
            let still_used: HashSet<&String> = index
                .images
                .values()
                .filter(|i| i.id != image.id)
                .flat_map(|i| &i.diff_ids)
                .collect();
            let unused: Vec<String> = image
                .diff_ids
                .iter()
                .filter(|d| !still_used.contains(d))
                .cloned()
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            (image.id.clone(), unused)
        };
        let mut ops = vec![Op::Delete(Table::Images, image_id.clone())];
        ops.extend(unused.iter().map(|d| Op::Delete(Table::Layers, d.clone())));
        self.db.apply(ops)?;
        {
            let mut index = self.write_index();
            index.remove(&image_id);
            for d in &unused {
                index.layers.remove(d);
            }
        }
        // Metadata first: a crash now leaves unreferenced directories, never
        // an image whose layer is gone.
        for d in &unused {
            self.discard_layer_dir(d);
        }
        tracing::info!(image.id = %image_id, removed_layers = unused.len(), "image removed");
        Ok(())
    }

    /// The image's layer directories for overlayfs `lowerdir=`, topmost
    /// layer first. A layer that occurs several times in one image is
    /// listed once, at its topmost position (overlayfs refuses repeated
    /// lower directories, and the lower copy cannot change the result).
    pub fn layer_paths(&self, image: &Image) -> Result<Vec<PathBuf>, ImageError> {
        let index = self.read_index();
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for d in image.diff_ids.iter().rev() {
            if !seen.insert(d) {
                continue;
            }
            if !index.layers.contains_key(d) {
                return Err(ImageError::NotFound(format!(
                    "layer {d} of image {}",
                    image.id
                )));
            }
            out.push(self.layer_dir(d));
        }
        Ok(out)
    }

    /// Bytes and inodes used by the store's unpacked layers, as measured
    /// when they were unpacked (no compressed blobs are kept), and the mount
    /// point of the filesystem holding the store.
    pub fn fs_usage(&self) -> FsUsage {
        let index = self.read_index();
        FsUsage {
            mountpoint: self.mountpoint.clone(),
            used_bytes: index.layers.values().map(|l| l.size).sum(),
            inodes_used: index.layers.values().map(|l| l.inodes).sum(),
        }
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_own_temp_should_only_match_names_the_store_creates() {
        assert!(is_own_temp("import-0123456789abcdef"));
        assert!(is_own_temp("layer-0123456789abcdef"));
        assert!(is_own_temp("gc-0123456789abcdef"));
        assert!(!is_own_temp("import-0123456789abcde"));
        assert!(!is_own_temp("import-0123456789abcdeF"));
        assert!(!is_own_temp("foo-0123456789abcdef"));
        assert!(!is_own_temp("import-0123456789abcdef0"));
    }
}
