//! The runtime's seams to the host: the OCI runtime, cgroups, shims,
//! rootfs mounts, pod sandboxes' kernel operations and pod networks (CNI),
//! each a trait with the real implementation beside it,
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
//! exec FIFO, the delete of a stopped container by removals) are an
//! implementation of the OCI seam of their own ([`RuncFastPaths`]), chosen
//! here by [`Parts::host`]; the List and status paths never cross a seam.

pub mod cgroups;
#[cfg(test)]
pub(crate) mod fake;
pub mod networks;
pub mod oci;
pub mod pods;
pub mod rootfs;
pub mod runc_fast;
pub mod shims;
pub mod systemd;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use petrel_oci::cgroups::systemd::CgroupDriver;
use petrel_oci::cgroups::Cgroups;
use petrel_oci::features::{kernel_release, recursive_read_only, user_namespaces, RuntimeFeatures};
use petrel_oci::runc::Runc;
use petrel_oci::spec::HostLimits;

use crate::config::RuntimeConfig;
use crate::error::{Result, RuntimeError};

pub use cgroups::{CgroupOps, HostCgroups};
pub use networks::{CniNetworks, PodNetworking, Readiness};
pub use oci::{InitSeen, OciError, OciRuntime};
pub use pods::{HostPods, PodKernel};
pub use rootfs::{OverlayMounter, RootfsMounter};
pub use runc_fast::{RuncFastPaths, RuncVersion};
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
    /// Pod sandboxes' namespaces, shm mounts and PID-namespace holders.
    pub pods: Arc<dyn PodKernel>,
    /// Pod networks (CNI, or loopback only).
    pub networks: Arc<dyn PodNetworking>,
    /// What the host lets containers have.
    pub host: HostLimits,
}

impl Parts {
    /// The real parts: the shim and runc binaries found (a missing one is
    /// reported before anything is created), the host's cgroups and limits
    /// detected (recursive read-only mounts and user namespaces from the
    /// kernel release and `runc features`), the runtime's soft open-file limit raised (the one it
    /// started with is what containers get), pod networks as `[cri]
    /// pod_network` and `[cri.cni]` say. The OCI runtime is runc with
    /// its fast paths when `fast_paths` is on and the runc version is one
    /// they mirror (see [`oci_runtime`]), else the typed runc.
    pub fn host(config: &RuntimeConfig) -> Result<Self> {
        let shim_binary = find_shim(config.shim_binary.as_deref())?;
        let runc_binary = find_runc(&config.runtime_binary)?;
        // `runc features` is a Go start-up (tens of ms): asked while the
        // rest is detected.
        let features = {
            let binary = runc_binary.clone();
            std::thread::spawn(move || RuntimeFeatures::query(&binary))
        };
        let cgroups = Cgroups::detect().map_err(|e| RuntimeError::cgroup("detect cgroups", e))?;
        let mut host = HostLimits::detect()?;
        host.hugetlb = cgroups.has_controller("hugetlb");
        let features = features.join().unwrap_or_default();
        let release = kernel_release();
        host.recursive_read_only = recursive_read_only(&release, features.as_ref());
        host.user_namespaces = user_namespaces(&release, features.as_ref());
        host.cgroup_namespaces = cgroups.version() == petrel_oci::cgroups::CgroupVersion::V2;
        tracing::debug!(
            kernel = %release,
            runtime_features = features.is_some(),
            recursive_read_only = host.recursive_read_only,
            user_namespaces = host.user_namespaces,
            "OCI runtime features"
        );
        // Before anything holds descriptors; containers get what we started with.
        host.open_files = Some(crate::open_files::raise_once());
        let systemd = config.cgroup_driver == CgroupDriver::Systemd;
        let runc = Runc::new(runc_binary, crate::service::Layout::of(config).runc_root())
            .with_systemd_cgroup(systemd);
        let cgroups = cgroup_ops(config, cgroups)?;
        Ok(Self {
            oci: oci_runtime(runc, config.fast_paths),
            cgroups,
            shims: Arc::new(ProcessShims::new(shim_binary)),
            rootfs: Arc::new(OverlayMounter),
            pods: Arc::new(HostPods),
            networks: Arc::new(CniNetworks::new(config)),
            host,
        })
    }
}

/// The cgroup operations of the configured driver: the host's cgroupfs,
/// or with systemd the same reads and systemd's units
/// ([`systemd::SystemdCgroups`]), which needs cgroup v2.
fn cgroup_ops(config: &RuntimeConfig, cgroups: Cgroups) -> Result<Arc<dyn CgroupOps>> {
    config
        .check_cgroups()
        .map_err(|e| RuntimeError::Setup(format!("default_cgroup_parent: {e}")))?;
    if config.cgroup_driver == CgroupDriver::Cgroupfs {
        return Ok(Arc::new(HostCgroups::new(cgroups)));
    }
    let root = match (cgroups.version(), cgroups.unified_dir("/")) {
        (petrel_oci::cgroups::CgroupVersion::V2, Some(root)) => root,
        _ => {
            return Err(RuntimeError::Setup(
                "the systemd cgroup driver needs a pure cgroup v2 host (this one is v1 or \
                 hybrid): use --cgroup-driver cgroupfs"
                    .into(),
            ))
        }
    };
    let host: Arc<dyn CgroupOps> = Arc::new(HostCgroups::new(cgroups));
    Ok(Arc::new(systemd::SystemdCgroups::new(
        host,
        Arc::new(systemd::Systemctl::default()),
        root,
    )))
}

/// The OCI runtime to drive: `runc` with its fast paths when `fast_paths`
/// is on and `runc --version` names a version they were checked against;
/// the typed `runc` otherwise, said once at info naming the version.
pub fn oci_runtime(runc: Runc, fast_paths: bool) -> Arc<dyn OciRuntime> {
    if !fast_paths {
        tracing::info!(
            "fast paths off ([cri] fast_paths = false): runc starts and deletes every container"
        );
        return Arc::new(runc);
    }
    let line = runc_fast::version_line(runc.binary());
    match line.as_deref().and_then(RuncVersion::parse) {
        Some(version) => match RuncFastPaths::new(runc, version) {
            Ok(fast) => {
                tracing::debug!(%version, "runc fast paths on (exec-fifo start, runc-free delete)");
                Arc::new(fast)
            }
            Err(runc) => {
                tracing::info!(
                    %version,
                    "runc version not verified for the fast paths: runc starts and deletes every container"
                );
                Arc::new(*runc)
            }
        },
        None => {
            tracing::info!(
                binary = %runc.binary().display(),
                version = line.as_deref().unwrap_or("unknown"),
                "not a runc the fast paths know: it starts and deletes every container"
            );
            Arc::new(runc)
        }
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
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in runtime binary whose `--version` prints `line`.
    fn binary(dir: &Path, name: &str, line: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\necho '{line}'\n")).expect("write script");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    fn chosen(binary: &Path, fast_paths: bool) -> String {
        let oci = oci_runtime(Runc::new(binary, "/run/unit-runc"), fast_paths);
        let debug = format!("{oci:?}");
        debug
            .split([' ', '{'])
            .next()
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn oci_runtime_should_take_the_fast_paths_only_when_on_and_verified() {
        let dir = tempfile::tempdir().expect("tempdir");
        let debian = binary(dir.path(), "runc-debian", "runc version 1.1.5+ds1");
        let peers = binary(dir.path(), "runc-peers", "runc version 1.5.3");
        let future = binary(dir.path(), "runc-future", "runc version 1.6.0");
        let crun = binary(dir.path(), "crun", "crun version 1.8.1");
        assert_eq!(chosen(&debian, true), "RuncFastPaths");
        assert_eq!(chosen(&peers, true), "RuncFastPaths");
        assert_eq!(chosen(&debian, false), "Runc");
        assert_eq!(chosen(&future, true), "Runc");
        assert_eq!(chosen(&crun, true), "Runc");
        assert_eq!(chosen(&dir.path().join("missing"), true), "Runc");
    }
}
