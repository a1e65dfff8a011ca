//! The pull: resolve a reference to a manifest for this platform, fetch
//! the config and the missing layer blobs (each verified, each digest
//! downloaded once however many pulls want it), and hand the result to the
//! store.
//!
//! A blob download runs in a task of its own, shared by every pull that
//! wants the blob while it runs. A pull that is dropped (its client gave up)
//! lets go of its downloads: one another pull still waits for goes on, one
//! nobody waits for any more is aborted at once, closing its connection.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::{watch, Semaphore};
use tokio::task::AbortHandle;

use super::auth::Credentials;
use super::client::{Clients, FetchError, RepoClient};
use super::hosts::{Host, RegistryHosts};
use super::progress::{LayerState, ProgressReporter};
use crate::reference::{self, is_hex64, Reference};
use crate::{ImageError, ImageStore};

use crate::limits::MAX_CONFIG_BYTES;
pub use crate::limits::MAX_MANIFEST_BYTES;
/// Layer downloads in flight per pull (containerd's default).
const CONCURRENT_DOWNLOADS: usize = 3;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
const LAYER_TYPES: [&str; 6] = [
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.zstd",
];

/// A verified blob in the store's temp directory, removed when the last
/// pull using it is done.
#[derive(Debug)]
pub struct Blob {
    /// Where its content lives.
    pub path: PathBuf,
    /// `sha256:<hex>` (verified).
    pub digest: String,
    /// Bytes (verified).
    pub size: u64,
}

impl Drop for Blob {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove blob");
            }
        }
    }
}

/// One layer of a pulled image.
#[derive(Debug, Clone)]
pub struct PulledLayer {
    /// The layer blob's digest (compressed).
    pub digest: String,
    /// The blob's size from the manifest.
    pub size: u64,
    /// The uncompressed layer's digest from the config.
    pub diff_id: String,
    /// The layer's media type from the manifest (says whether the blob
    /// must be compressed).
    pub media_type: String,
    /// The downloaded blob; `None` when the store already has the layer.
    pub blob: Option<Arc<Blob>>,
}

/// A pulled image, ready for [`ImageStore::import_pulled`].
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The normalised reference pulled (`docker.io/library/busybox:latest`).
    pub reference: String,
    /// `domain/path` of the reference.
    pub name: String,
    /// `name:tag`, when the reference has a tag.
    pub tag: Option<String>,
    /// Digest of the manifest (or index) the reference resolved to.
    pub manifest_digest: String,
    /// Digest of the config blob: the image id.
    pub config_digest: String,
    /// The image configuration.
    pub config: oci_spec::image::ImageConfiguration,
    /// The config blob, held until the commit so concurrent pulls of the
    /// same image share it instead of downloading it again.
    pub config_blob: Option<Arc<Blob>>,
    /// Base layer first.
    pub layers: Vec<PulledLayer>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Platform {
    architecture: String,
    os: String,
    #[serde(default)]
    variant: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<Platform>,
    #[serde(default)]
    urls: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManifestDoc {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

/// How a shared download ended, once it has.
type Outcome = Option<Result<Arc<Blob>, Arc<ImageError>>>;

/// A blob download running in a task of its own, held by every pull
/// waiting for it; the last one to let go aborts it.
struct Download {
    done: watch::Receiver<Outcome>,
    task: AbortHandle,
}

impl Drop for Download {
    fn drop(&mut self) {
        // Nobody waits for the blob any more: stop downloading it (the
        // partial file goes with the task's `Blob` guard).
        self.task.abort();
    }
}

/// What the puller knows of one digest: the download under way, and the
/// downloaded blob while a pull still holds it (a later pull shares it).
#[derive(Default)]
struct Slot {
    download: Weak<Download>,
    blob: Weak<Blob>,
}

impl Slot {
    fn is_used(&self) -> bool {
        self.download.strong_count() > 0 || self.blob.strong_count() > 0
    }
}

/// Pulls images from registries. One per runtime; cheap to share.
#[derive(Debug)]
pub struct Puller {
    hosts: RegistryHosts,
    clients: Clients,
    tmp: PathBuf,
    inflight: Mutex<HashMap<String, Slot>>,
    downloads: Arc<Semaphore>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("downloading", &(self.download.strong_count() > 0))
            .field("blob", &(self.blob.strong_count() > 0))
            .finish()
    }
}

/// The hosts of one pull, each with its own auth state.
struct Session {
    reference: String,
    registry: String,
    clients: Vec<RepoClient>,
}

fn sha256_hex(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

fn check_digest(reference: &str, d: &str) -> Result<(), ImageError> {
    match d.strip_prefix("sha256:") {
        Some(h) if is_hex64(h) => Ok(()),
        _ => Err(ImageError::InvalidManifest {
            reference: reference.to_string(),
            reason: format!("unsupported or malformed digest {d:?}"),
        }),
    }
}

/// Ranks an index entry for linux/amd64: `None` when unusable, lower is
/// better. amd64 variants (`v2`, `v3`) are microarchitecture levels; a
/// plain entry is preferred, then the lowest level.
fn platform_rank(p: &Platform) -> Option<u8> {
    if p.os != "linux" || p.architecture != "amd64" {
        return None;
    }
    match p.variant.as_deref() {
        None | Some("") => Some(0),
        Some("v1") => Some(1),
        Some("v2") => Some(2),
        Some("v3") => Some(3),
        _ => None,
    }
}

impl Session {
    fn invalid(&self, reason: impl Into<String>) -> ImageError {
        ImageError::InvalidManifest {
            reference: self.reference.clone(),
            reason: reason.into(),
        }
    }

    /// GETs from each host able to (`resolve` for tags, `pull` for digests)
    /// in order; a host that fails or lacks the object passes to the next.
    async fn get(
        &self,
        kind: &str,
        reference: &str,
        accept: &str,
        resolve: bool,
    ) -> Result<(reqwest::Response, &Host), ImageError> {
        let mut not_found = false;
        let mut last: Option<ImageError> = None;
        for c in &self.clients {
            let caps = c.host.capabilities;
            if (resolve && !caps.resolve) || (!resolve && !caps.pull) {
                continue;
            }
            match c.get(kind, reference, accept).await {
                Ok(r) => return Ok((r, &c.host)),
                Err(FetchError::NotFound) => {
                    tracing::debug!(host = %c.host.origin, kind, reference, "not on this host");
                    not_found = true;
                }
                Err(FetchError::Unavailable(reason)) => {
                    tracing::warn!(host = %c.host.origin, %reason, "registry host unavailable, trying the next");
                    last = Some(ImageError::RegistryUnavailable {
                        host: c.host.authority.clone(),
                        reason,
                    });
                }
                Err(FetchError::Denied(reason)) => {
                    last = Some(ImageError::Unauthorized {
                        host: c.host.authority.clone(),
                        reference: self.reference.clone(),
                        reason,
                    });
                }
                Err(FetchError::Other(reason)) => {
                    last = Some(ImageError::RegistryUnavailable {
                        host: c.host.authority.clone(),
                        reason,
                    });
                }
            }
        }
        // A registry that answered "no such thing" is the truth for the
        // user, unless the only answers were refusals of credentials.
        match last {
            Some(e @ ImageError::Unauthorized { .. }) => Err(e),
            _ if not_found => Err(ImageError::NotFound(format!(
                "{} ({kind} {reference} on {})",
                self.reference, self.registry
            ))),
            Some(e) => Err(e),
            None => Err(ImageError::RegistryUnavailable {
                host: self.registry.clone(),
                reason: "no configured host may resolve or pull".to_string(),
            }),
        }
    }

    /// Reads a manifest body, refusing more than [`MAX_MANIFEST_BYTES`].
    async fn manifest(
        &self,
        reference: &str,
        resolve: bool,
    ) -> Result<(Vec<u8>, String), ImageError> {
        let accept = [OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST].join(", ");
        let (mut resp, host) = self.get("manifests", reference, &accept, resolve).await?;
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.split(';').next().unwrap_or(s).trim().to_string())
            .unwrap_or_default();
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_MANIFEST_BYTES)
        {
            return Err(self.invalid(format!("manifest larger than {MAX_MANIFEST_BYTES} bytes")));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| ImageError::RegistryUnavailable {
                host: host.authority.clone(),
                reason: format!("reading manifest: {e}"),
            })?
        {
            body.extend_from_slice(&chunk);
            if body.len() as u64 > MAX_MANIFEST_BYTES {
                return Err(
                    self.invalid(format!("manifest larger than {MAX_MANIFEST_BYTES} bytes"))
                );
            }
        }
        Ok((body, content_type))
    }
}

impl Puller {
    /// A puller using `hosts` for registry resolution, downloading into
    /// `store`'s temp directory.
    pub fn new(hosts: RegistryHosts, store: &ImageStore) -> Self {
        Self {
            hosts,
            clients: Clients::default(),
            tmp: store.tmp_dir(),
            inflight: Mutex::new(HashMap::new()),
            downloads: Arc::new(Semaphore::new(CONCURRENT_DOWNLOADS * 4)),
        }
    }

    /// Pulls `reference` (normalised like containerd) with `creds`; returns
    /// what the store needs to commit it. Nothing is stored here. Each
    /// layer's course (waiting, downloading with its byte count, already
    /// in the store, downloaded and verified) goes to `progress`.
    pub async fn pull(
        &self,
        store: &ImageStore,
        reference: &str,
        creds: &Credentials,
        progress: &ProgressReporter,
    ) -> Result<PulledImage, ImageError> {
        let parsed: Reference = reference::parse(reference)?;
        let normalized = parsed.to_string();
        let (registry, repository) =
            parsed
                .name
                .split_once('/')
                .ok_or_else(|| ImageError::InvalidReference {
                    reference: reference.to_string(),
                    reason: "no repository".to_string(),
                })?;
        let hosts = self.hosts.resolve(registry)?;
        let mut clients = Vec::new();
        for h in hosts {
            let c = self.clients.for_host(&h)?;
            clients.push(RepoClient::new(c, h, repository, creds.clone())?);
        }
        let session = Arc::new(Session {
            reference: normalized.clone(),
            registry: registry.to_string(),
            clients,
        });
        tracing::info!(reference = %normalized, "pulling image");

        // 1. The top-level manifest or index.
        let (top_ref, resolve) = match (&parsed.digest, &parsed.tag) {
            (Some(d), _) => (d.clone(), false),
            (None, Some(t)) => (t.clone(), true),
            (None, None) => ("latest".to_string(), true),
        };
        let (body, content_type) = session.manifest(&top_ref, resolve).await?;
        let top_digest = sha256_hex(&body);
        if let Some(want) = &parsed.digest {
            if *want != top_digest {
                return Err(ImageError::DigestMismatch {
                    what: format!("manifest of {normalized}"),
                    expected: want.clone(),
                    actual: top_digest,
                });
            }
        }
        let mut doc: ManifestDoc = serde_json::from_slice(&body)
            .map_err(|e| session.invalid(format!("not a manifest: {e}")))?;
        let mut media_type = doc.media_type.clone().unwrap_or(content_type);

        // 2. An index: this platform's manifest, fetched by digest.
        if media_type == OCI_INDEX || media_type == DOCKER_LIST || doc.manifests.is_some() {
            let entries = doc.manifests.take().unwrap_or_default();
            let chosen = entries
                .iter()
                .filter(|d| d.media_type == OCI_MANIFEST || d.media_type == DOCKER_MANIFEST)
                .filter_map(|d| d.platform.as_ref().and_then(platform_rank).map(|r| (r, d)))
                .min_by_key(|(r, _)| *r)
                .map(|(_, d)| d)
                .ok_or_else(|| {
                    ImageError::NotFound(format!(
                        "{normalized} for linux/amd64 (its index has none)"
                    ))
                })?;
            check_digest(&normalized, &chosen.digest)?;
            if chosen.size > MAX_MANIFEST_BYTES {
                return Err(session.invalid("manifest larger than 4 MiB"));
            }
            let (body, ct) = session.manifest(&chosen.digest, false).await?;
            let actual = sha256_hex(&body);
            if actual != chosen.digest {
                return Err(ImageError::DigestMismatch {
                    what: format!("manifest of {normalized}"),
                    expected: chosen.digest.clone(),
                    actual,
                });
            }
            if body.len() as u64 != chosen.size {
                return Err(ImageError::SizeMismatch {
                    what: format!("manifest of {normalized}"),
                    expected: chosen.size,
                    actual: body.len() as u64,
                });
            }
            doc = serde_json::from_slice(&body)
                .map_err(|e| session.invalid(format!("not a manifest: {e}")))?;
            media_type = doc.media_type.clone().unwrap_or(ct);
        }
        if media_type != OCI_MANIFEST && media_type != DOCKER_MANIFEST {
            return Err(ImageError::Unsupported(format!(
                "manifest media type {media_type:?} of {normalized} (schema {})",
                doc.schema_version
            )));
        }
        if doc.schema_version != 2 {
            return Err(session.invalid(format!("schemaVersion {}", doc.schema_version)));
        }
        let config_desc = doc
            .config
            .ok_or_else(|| session.invalid("manifest has no config"))?;
        let layers = doc.layers.unwrap_or_default();
        if config_desc.media_type != OCI_CONFIG && config_desc.media_type != DOCKER_CONFIG {
            return Err(ImageError::Unsupported(format!(
                "config media type {:?} of {normalized}",
                config_desc.media_type
            )));
        }
        check_digest(&normalized, &config_desc.digest)?;
        for l in &layers {
            check_digest(&normalized, &l.digest)?;
            if !LAYER_TYPES.contains(&l.media_type.as_str()) {
                return Err(ImageError::Unsupported(format!(
                    "layer media type {:?} of {normalized}",
                    l.media_type
                )));
            }
            if l.urls.as_ref().is_some_and(|u| !u.is_empty()) {
                return Err(ImageError::Unsupported(format!(
                    "foreign layer {} of {normalized} (external URLs)",
                    l.digest
                )));
            }
        }
        if config_desc.size > MAX_CONFIG_BYTES {
            return Err(session.invalid(format!("config larger than {MAX_CONFIG_BYTES} bytes")));
        }
        // The layers are known: a progress reader can show them while the
        // config is fetched.
        progress.layers(layers.iter().map(|l| (l.digest.clone(), l.size)));

        // 3. The config: from the store when the image is there already.
        // Re-checked after waiting for a concurrent pull of the same config:
        // it may have committed the image meanwhile.
        let stored = || {
            store
                .get(&config_desc.digest)
                .filter(|img| img.id == config_desc.digest)
        };
        let (config, config_blob) = match stored() {
            Some(img) => (img.config, None),
            None => match self
                .blob(
                    &session,
                    &config_desc.digest,
                    config_desc.size,
                    None,
                    None,
                    || stored().is_some(),
                )
                .await?
            {
                Some(blob) => {
                    let data = tokio::fs::read(&blob.path)
                        .await
                        .map_err(|e| ImageError::io("read", &blob.path, e))?;
                    let config = serde_json::from_slice(&data)
                        .map_err(|e| session.invalid(format!("malformed image config: {e}")))?;
                    (config, Some(blob))
                }
                None => (
                    stored()
                        .ok_or_else(|| session.invalid("image vanished during the pull"))?
                        .config,
                    None,
                ),
            },
        };
        let diff_ids = config.rootfs().diff_ids().clone();
        if diff_ids.len() != layers.len() {
            return Err(session.invalid(format!(
                "{} layers but {} diff ids in the config",
                layers.len(),
                diff_ids.len()
            )));
        }
        for d in &diff_ids {
            check_digest(&normalized, d)?;
        }

        // 4. The layers the store lacks, a few at a time.
        let mut tasks = Vec::new();
        for (index, (l, diff_id)) in layers.iter().zip(&diff_ids).enumerate() {
            let session = &session;
            tasks.push(async move {
                let blob = if store.has_layer(diff_id) {
                    progress.set(index, LayerState::Exists);
                    None
                } else {
                    self.blob(
                        session,
                        &l.digest,
                        l.size,
                        Some((progress, index)),
                        Some(&self.downloads),
                        || store.has_layer(diff_id),
                    )
                    .await?
                };
                Ok::<_, ImageError>(PulledLayer {
                    digest: l.digest.clone(),
                    size: l.size,
                    diff_id: diff_id.clone(),
                    media_type: l.media_type.clone(),
                    blob,
                })
            });
        }
        let pulled_layers = futures_util::future::try_join_all(tasks).await?;
        Ok(PulledImage {
            reference: normalized,
            name: parsed.name.clone(),
            tag: parsed.tag.as_ref().map(|t| format!("{}:{t}", parsed.name)),
            manifest_digest: top_digest,
            config_digest: config_desc.digest.clone(),
            config,
            config_blob,
            layers: pulled_layers,
        })
    }

    /// The blob `digest`: shared with a pull holding or downloading it
    /// now, else downloaded (in a task of its own, see [`Download`]).
    /// `None` when `present()` says it is not needed (the store has it).
    /// `layer` is the progress entry of a layer blob (none for the config):
    /// it stays `Waiting` while another pull's download runs, then becomes
    /// `Downloaded`; a download this pull starts reports its bytes there.
    /// A download with `limit` waits for one of its permits first.
    async fn blob(
        &self,
        session: &Arc<Session>,
        digest: &str,
        size: u64,
        layer: Option<(&ProgressReporter, usize)>,
        limit: Option<&Arc<Semaphore>>,
        present: impl Fn() -> bool,
    ) -> Result<Option<Arc<Blob>>, ImageError> {
        let report = |state| {
            if let Some((p, i)) = layer {
                p.set(i, state);
            }
        };
        let download = {
            let mut m = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
            let slot = m.entry(digest.to_string()).or_default();
            if let Some(b) = slot.blob.upgrade() {
                report(LayerState::Downloaded);
                return Ok(Some(b));
            }
            match slot.download.upgrade() {
                Some(d) => d,
                None if present() => {
                    report(LayerState::Exists);
                    return Ok(None);
                }
                None => {
                    let d = self.start_download(
                        session,
                        digest,
                        size,
                        layer.map(|(p, i)| (p.clone(), i)),
                        limit.cloned(),
                    );
                    slot.download = Arc::downgrade(&d);
                    d
                }
            }
        };
        let mut done = download.done.clone();
        let outcome = done
            .wait_for(Option::is_some)
            .await
            .map(|o| o.clone())
            .ok()
            .flatten();
        let result = match outcome {
            Some(Ok(b)) => {
                let mut m = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
                m.entry(digest.to_string()).or_default().blob = Arc::downgrade(&b);
                report(LayerState::Downloaded);
                Ok(Some(b))
            }
            Some(Err(e)) => Err(e.duplicate()),
            // The task ended without a word: the runtime is going down.
            None => Err(ImageError::RegistryUnavailable {
                host: session.registry.clone(),
                reason: format!("download of {digest} ended unexpectedly"),
            }),
        };
        drop(done);
        drop(download);
        // Forget digests nobody downloads or holds any more.
        let mut m = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, s| s.is_used());
        result
    }

    /// Starts downloading `digest` in a task of its own; its outcome is
    /// published to every holder of the returned [`Download`].
    fn start_download(
        &self,
        session: &Arc<Session>,
        digest: &str,
        size: u64,
        layer: Option<(ProgressReporter, usize)>,
        limit: Option<Arc<Semaphore>>,
    ) -> Arc<Download> {
        let (tx, rx) = watch::channel(None);
        let session = session.clone();
        let digest = digest.to_string();
        let tmp = self.tmp.clone();
        let task = tokio::spawn(async move {
            let result = async {
                let _permit = match limit {
                    Some(l) => Some(l.acquire_owned().await.map_err(|_| {
                        ImageError::Unsupported("puller is shutting down".to_string())
                    })?),
                    None => None,
                };
                let layer = layer.as_ref().map(|(p, i)| (p, *i));
                download(&tmp, &session, &digest, size, layer).await
            }
            .await;
            tx.send_replace(Some(result.map(Arc::new).map_err(Arc::new)));
        });
        Arc::new(Download {
            done: rx,
            task: task.abort_handle(),
        })
    }
}

/// Downloads a blob into `tmp`, verifying size and digest as it streams;
/// on any failure (or when the task is aborted) the partial file is
/// removed. Each chunk's bytes go to `layer`'s progress entry, if any.
async fn download(
    tmp: &Path,
    session: &Session,
    digest: &str,
    size: u64,
    layer: Option<(&ProgressReporter, usize)>,
) -> Result<Blob, ImageError> {
    let (mut resp, host) = session
        .get("blobs", digest, "application/octet-stream, */*", false)
        .await?;
    let what = format!("blob {digest} of {}", session.reference);
    if let Some(n) = resp.content_length() {
        if n != size {
            return Err(ImageError::SizeMismatch {
                what,
                expected: size,
                actual: n,
            });
        }
    }
    let path = tmp.join(format!("blob-{}", random_hex()?));
    // The guard removes the file on every early return below, and when the
    // task is aborted.
    let mut blob = Blob {
        path,
        digest: digest.to_string(),
        size,
    };
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&blob.path)
        .await
        .map_err(|e| ImageError::io("create", &blob.path, e))?;
    let mut hasher = Sha256::new();
    let mut count = 0u64;
    let started = std::time::Instant::now();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| ImageError::RegistryUnavailable {
            host: host.authority.clone(),
            reason: format!("downloading {digest}: {e}"),
        })?
    {
        count += chunk.len() as u64;
        if count > size {
            return Err(ImageError::SizeMismatch {
                what,
                expected: size,
                actual: count,
            });
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| ImageError::io("write", &blob.path, e))?;
        if let Some((p, i)) = layer {
            p.add_bytes(i, chunk.len() as u64);
        }
    }
    file.flush()
        .await
        .map_err(|e| ImageError::io("write", &blob.path, e))?;
    drop(file);
    if count != size {
        return Err(ImageError::SizeMismatch {
            what,
            expected: size,
            actual: count,
        });
    }
    let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
    if actual != digest {
        return Err(ImageError::DigestMismatch {
            what,
            expected: digest.to_string(),
            actual,
        });
    }
    blob.size = count;
    tracing::debug!(digest, bytes = count, host = %host.origin, elapsed_ms = started.elapsed().as_millis() as u64, "blob downloaded");
    Ok(blob)
}

fn random_hex() -> Result<String, ImageError> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .map_err(|e| ImageError::io("read", Path::new("/dev/urandom"), e))?;
    Ok(hex::encode(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_rank_should_prefer_plain_amd64_then_lowest_level() {
        let p = |os: &str, arch: &str, v: Option<&str>| Platform {
            os: os.into(),
            architecture: arch.into(),
            variant: v.map(Into::into),
        };
        assert_eq!(platform_rank(&p("linux", "amd64", None)), Some(0));
        assert_eq!(platform_rank(&p("linux", "amd64", Some("v3"))), Some(3));
        assert_eq!(platform_rank(&p("linux", "amd64", Some("v9"))), None);
        assert_eq!(platform_rank(&p("linux", "arm64", None)), None);
        assert_eq!(platform_rank(&p("windows", "amd64", None)), None);
    }
}
