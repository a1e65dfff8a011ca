//! Petrel's own binaries under test, `petrel` and `petrel-shim`: found in
//! the cargo target directory of the running test executable
//! (`target/<profile>/`, the parent of its `deps/`), where `cargo build`
//! (`make build`, a step of `make test`) puts them. A test crate other than
//! the one that defines a binary gets no `CARGO_BIN_EXE_*` for it, hence
//! the look-up. A missing binary is a failure, never a skip.

use std::path::{Path, PathBuf};

use crate::KitError;

/// What to run when a binary is missing.
const BUILD_HINT: &str = "run `cargo build -p petrel` (make test does)";

/// The cargo profile directory the running executable belongs to:
/// `target/<profile>/` for `target/<profile>/deps/<test>-<hash>` and for
/// `target/<profile>/<bin>` alike.
pub fn profile_dir() -> Result<PathBuf, KitError> {
    let exe = std::env::current_exe().map_err(|e| KitError::io("find", "current_exe", e))?;
    Ok(profile_dir_of(&exe))
}

/// [`profile_dir`] of the executable at `exe`.
pub fn profile_dir_of(exe: &Path) -> PathBuf {
    let dir = exe.parent().unwrap_or(Path::new("."));
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir).to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// The binary `name` in [`profile_dir`], or an error naming the path
/// looked at and how to build it.
pub fn find(name: &str) -> Result<PathBuf, KitError> {
    let path = profile_dir()?.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(KitError::Missing {
            component: name.to_string(),
            path,
            hint: BUILD_HINT.into(),
        })
    }
}

/// The `petrel` binary under test. Panics (a test's failure) when it is
/// missing, naming where it was looked for.
pub fn petrel_bin() -> PathBuf {
    find("petrel").unwrap_or_else(|e| panic!("{e}"))
}

/// The `petrel-shim` binary the `petrel` under test uses (the one beside
/// it). Panics when it is missing, as [`petrel_bin`].
pub fn shim_bin() -> PathBuf {
    find("petrel-shim").unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn profile_dir_of_should_skip_deps_for_a_test_executable() {
        assert_eq!(
            profile_dir_of(Path::new("/w/target/debug/deps/e2e_ctl-0123abcd")),
            PathBuf::from("/w/target/debug")
        );
        assert_eq!(
            profile_dir_of(Path::new("/w/target/release/petrel-bench")),
            PathBuf::from("/w/target/release")
        );
    }

    #[test]
    fn find_should_name_the_path_and_the_build_command_when_missing() {
        let err = find("petrel-no-such-binary").expect_err("missing");
        let msg = err.to_string();
        assert!(msg.contains("petrel-no-such-binary"), "{msg}");
        assert!(
            msg.contains(&profile_dir().expect("dir").display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("cargo build -p petrel"), "{msg}");
    }
}
