//! The conformance kit's images: substitutes for every image critest pulls,
//! built from Debian packages by `scripts/conformance-images.sh` into
//! `<cache>/<hash of the script>/` (`make conformance-images`), where
//! `registry/` is a docker-registry storage holding them under the upstream
//! repository paths and `images.tsv` lists the upstream references.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::KitError;

/// The default cache of built image sets.
pub const DEFAULT_CACHE: &str = "/var/cache/petrel/conformance";

/// The build script, in the workspace.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/conformance-images.sh")
}

/// The cache key of a build script: the first 16 hex digits of its SHA-256
/// (what the script computes of itself with `sha256sum`).
pub fn script_hash(script: &[u8]) -> String {
    hex::encode(Sha256::digest(script))[..16].to_string()
}

/// One upstream reference the set serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// e.g. `registry.k8s.io/e2e-test-images/busybox:1.29-2`.
    pub reference: String,
    /// The manifest's digest.
    pub manifest_digest: String,
    /// The image id (its config's digest).
    pub image_id: String,
}

/// A built image set.
#[derive(Debug, Clone)]
pub struct ConformanceImages {
    /// `<cache>/<hash>`.
    pub dir: PathBuf,
    /// What it serves.
    pub refs: Vec<ImageRef>,
}

impl ConformanceImages {
    /// The set built from the workspace's script: `PETREL_CONFORMANCE_IMAGES`
    /// names its directory explicitly, else it is looked up in
    /// `PETREL_CONFORMANCE_CACHE` (default [`DEFAULT_CACHE`]) by the script's
    /// hash. Fails, naming the remedy, when it has not been built.
    pub fn locate() -> Result<ConformanceImages, KitError> {
        let dir = match std::env::var_os("PETREL_CONFORMANCE_IMAGES") {
            Some(d) => PathBuf::from(d),
            None => {
                let script = build_script();
                let bytes = std::fs::read(&script).map_err(|e| KitError::io("read", &script, e))?;
                let cache = std::env::var_os("PETREL_CONFORMANCE_CACHE")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_CACHE));
                cache.join(script_hash(&bytes))
            }
        };
        Self::open(&dir)
    }

    /// The set in `dir`, which must be complete.
    pub fn open(dir: &Path) -> Result<ConformanceImages, KitError> {
        if !dir.join(".complete").is_file() {
            return Err(KitError::Missing {
                component: "conformance images".into(),
                path: dir.to_path_buf(),
                hint: "run `make conformance-images` (scripts/conformance-images.sh)".into(),
            });
        }
        let tsv = dir.join("images.tsv");
        let text = std::fs::read_to_string(&tsv).map_err(|e| KitError::io("read", &tsv, e))?;
        Ok(ConformanceImages {
            dir: dir.to_path_buf(),
            refs: parse_tsv(&text),
        })
    }

    /// The docker-registry storage directory (serve it read-only).
    pub fn registry_storage(&self) -> PathBuf {
        self.dir.join("registry")
    }
}

fn parse_tsv(text: &str) -> Vec<ImageRef> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            Some(ImageRef {
                reference: f.next()?.to_string(),
                manifest_digest: f.next()?.to_string(),
                image_id: f.next()?.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn script_hash_should_be_the_sha256sum_prefix() {
        // sha256("") = e3b0c442 98fc1c14 9afbf4c8 ...
        assert_eq!(script_hash(b""), "e3b0c44298fc1c14");
    }

    #[test]
    fn open_should_refuse_an_incomplete_set_naming_the_make_target() {
        let d = tempfile::tempdir().expect("tempdir");
        let e = ConformanceImages::open(d.path()).expect_err("incomplete");
        assert!(e.to_string().contains("make conformance-images"), "{e}");
        std::fs::write(d.path().join(".complete"), "").expect("write");
        std::fs::write(
            d.path().join("images.tsv"),
            "registry.k8s.io/pause:3.9\tsha256:aa\tsha256:bb\n",
        )
        .expect("write");
        let set = ConformanceImages::open(d.path()).expect("complete");
        assert_eq!(
            set.refs,
            vec![ImageRef {
                reference: "registry.k8s.io/pause:3.9".into(),
                manifest_digest: "sha256:aa".into(),
                image_id: "sha256:bb".into(),
            }]
        );
    }
}
