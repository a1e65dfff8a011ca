//! The runtime's seams to the host: the OCI runtime, cgroups, shims and
//! rootfs mounts, each a trait with the real implementation beside it,
//! handed to [`Runtime::with_parts`](crate::Runtime::with_parts) together
//! as one [`Parts`] ([`Parts::host`] finds and builds the real ones).
//! Unit tests build the runtime on test doubles instead (`fake`, test
//! builds only): no root, no runc, failures scripted.
//!
//! Trait objects (`Arc<dyn ...>`) rather than type parameters: every call
//! through a seam starts a process, writes a cgroup file or mounts, which
//! costs tens of microseconds to milliseconds, against which one indirect
//! call and, for the async methods, one boxed future are noise; while a
//! `Runtime<O, C, S, M>` would carry its four parameters into every
//! handler, the NRI host, the streaming backend and the embedders. The
//! measured fast paths that spare a runc process (the start through the
//! exec FIFO, the delete of a stopped container by removals) live inside
//! the runc implementation, and the List and status paths never cross a
//! seam.

pub mod cgroups;
#[cfg(test)]
pub(crate) mod fake;
pub mod oci;
pub mod rootfs;
pub mod shims;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use petrel_oci::cgroups::Cgroups;
use petrel_oci::runc::Runc;
use petrel_oci::spec::HostLimits;

use crate::config::RuntimeConfig;
use crate::error::{Result, RuntimeError};

pub use cgroups::{CgroupOps, HostCgroups};
pub use oci::{InitSeen, OciError, OciRuntime};
pub use rootfs::{OverlayMounter, RootfsMounter};
pub use shims::{
    ExitReadError, FoundShim, ProcessShims, ShimLauncher, ShimSeen, ShimWatch, StartedShim,
    WaitFailed,
};

/// Everything the runtime drives on the host.
#[derive(Debug, Clone)]
pub struct Parts {
    /// The OCI runtime (runc).
    pub oci: Arc<dyn OciRuntime>,
    /// The cgroup operations.
    pub cgroups: Arc<dyn CgroupOps>,
    /// The shims.
    pub shims: Arc<dyn ShimLauncher>,
    /// Containers' rootfs mounts.
    pub rootfs: Arc<dyn RootfsMounter>,
    /// What the host lets containers have.
    pub host: HostLimits,
}

impl Parts {
    /// The real parts: the shim and runc binaries found (a missing one is
    /// reported before anything is created), the host's cgroups and limits
    /// detected, the runtime's soft open-file limit raised (the one it
    /// started with is what containers get).
    pub fn host(config: &RuntimeConfig) -> Result<Self> {
        let shim_binary = find_shim(config.shim_binary.as_deref())?;
        let runc_binary = find_runc(&config.runtime_binary)?;
        let cgroups = Cgroups::detect().map_err(|e| RuntimeError::cgroup("detect cgroups", e))?;
        let mut host = HostLimits::detect()?;
        host.hugetlb = cgroups.has_controller("hugetlb");
        // Before anything holds descriptors; containers get what we started with.
        host.open_files = Some(crate::open_files::raise_once());
        let in_process = petrel_oci::runc::is_runc(&runc_binary);
        let runc = Runc::new(runc_binary, crate::service::Layout::of(config).runc_root())
            .with_in_process(in_process);
        Ok(Self {
            oci: Arc::new(runc),
            cgroups: Arc::new(HostCgroups::new(cgroups)),
            shims: Arc::new(ProcessShims::new(shim_binary)),
            rootfs: Arc::new(OverlayMounter),
            host,
        })
    }
}

/// Finds the shim: configured path, else beside the running executable,
/// else on PATH.
fn find_shim(configured: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = configured {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(RuntimeError::Setup(format!(
                "shim binary {} not found",
                p.display()
            )))
        };
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        // Test binaries live in target/<profile>/deps: look one level up too.
        for d in [dir.clone(), dir.join("..")] {
            let p = d.join("petrel-shim");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    on_path("petrel-shim").ok_or_else(|| {
        RuntimeError::Setup(
            "petrel-shim not found beside the petrel binary or on PATH (set shim_binary)".into(),
        )
    })
}

/// The first executable file `name` in a PATH directory.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The OCI runtime binary as an absolute path, resolved once at start so
/// that a missing runc is reported before any pod is asked for.
fn find_runc(configured: &Path) -> Result<PathBuf> {
    let found = if configured.components().count() > 1 {
        configured.is_file().then(|| configured.to_path_buf())
    } else {
        on_path(&configured.to_string_lossy())
    };
    found.ok_or_else(|| {
        RuntimeError::Setup(format!(
            "OCI runtime {} not found (install runc or set runtime_binary)",
            configured.display()
        ))
    })
}
