//! The end-to-end tests' image archives (`busybox-oci.tar`,
//! `pause-oci.tar`), built from Debian's busybox-static by
//! `scripts/build-test-image.sh`: `PETREL_TEST_IMAGES` (set by `make
//! test`), `build/images` (`make image`), or built into
//! `target/petrel-test-images` on first use.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The busybox test image's reference once imported.
pub const BUSYBOX: &str = "docker.io/petrel/busybox:latest";

/// containerd's sandbox image, built beside the busybox archives as
/// `pause-oci.tar`.
pub const PAUSE: &str = "docker.io/petrel/pause:latest";

/// The environment variable naming a directory of built archives.
pub const IMAGES_ENV: &str = "PETREL_TEST_IMAGES";

/// The workspace root (this crate lives in `crates/testkit`).
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding the archives, building them on first use.
/// Panics when they cannot be built (a test's failure).
pub fn images_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(IMAGES_ENV) {
        let d = PathBuf::from(d);
        if d.join("busybox-oci.tar").is_file() {
            return d;
        }
    }
    let ws = workspace_dir();
    if ws.join("build/images/busybox-oci.tar").is_file() {
        return ws.join("build/images");
    }
    let out = ws.join("target/petrel-test-images");
    // Build into a private directory and rename, so concurrent test
    // processes never see a half-written archive.
    if !out.join("busybox-oci.tar").is_file() {
        let tmp = ws.join(format!("target/petrel-test-images.{}", std::process::id()));
        build(&tmp);
        if std::fs::rename(&tmp, &out).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    out
}

/// Runs `scripts/build-test-image.sh OUT`; panics when it fails.
pub fn build(out: &Path) {
    let script = workspace_dir().join("scripts/build-test-image.sh");
    let st = Command::new(&script)
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        st.success(),
        "building the test images failed: {}",
        script.display()
    );
}
