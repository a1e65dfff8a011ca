//! CRIU for the checkpoint/restore tests: `PETREL_CRIU` (a path) if set,
//! else the workspace's `build/criu/criu` (`make criu`, a step of `make
//! test`: Debian trixie's criu with its own libraries, see
//! `scripts/criu.sh`). Missing is a failure, never a skip.

use std::path::PathBuf;

use crate::test_images::workspace_dir;
use crate::KitError;

/// The variable naming a CRIU binary to use instead of `build/criu/criu`.
pub const CRIU_ENV: &str = "PETREL_CRIU";

/// The CRIU binary, or where it was looked for and how to get it.
pub fn find_criu() -> Result<PathBuf, KitError> {
    let path = std::env::var_os(CRIU_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_dir().join("build/criu/criu"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(KitError::Missing {
            component: "criu".into(),
            path,
            hint: format!("run `make criu` or set {CRIU_ENV}"),
        })
    }
}

/// [`find_criu`], panicking (the test's failure) when it is missing.
pub fn criu_bin() -> PathBuf {
    find_criu().unwrap_or_else(|e| panic!("{e}"))
}
