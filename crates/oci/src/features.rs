//! What the host's kernel and OCI runtime can do for containers, found once
//! at start-up: recursive read-only mounts and user namespaces need both.
//!
//! A recursive read-only bind mount (`rro`, KEP-3857) makes every submount
//! of the source read-only too, which only `mount_setattr(2)` with
//! `AT_RECURSIVE` can do: Linux 5.12 or later. The OCI runtime must know the
//! `rro` option (runc 1.1 and later); `<runtime> features` lists the mount
//! options it knows (runtime-spec `features.md`), and a runtime without the
//! `features` command is one that predates them.
//!
//! A pod in a user namespace needs the runtime to create or join a user
//! namespace (`linux.namespaces` lists `user`) and to make idmapped bind
//! mounts (`linux.mountExtensions.idmap.enabled`, runc 1.2 and later), and
//! a kernel whose overlayfs takes idmapped lower layers (Linux 5.19), which
//! is how the image's files keep their owners inside.

use std::path::Path;
use std::process::{Command, Stdio};

use serde::Deserialize;

/// The first kernel with `mount_setattr(2)`.
pub const RRO_KERNEL: (u32, u32) = (5, 12);

/// The first kernel whose overlayfs accepts idmapped layers.
pub const IDMAPPED_OVERLAY_KERNEL: (u32, u32) = (5, 19);

/// The part of an OCI runtime's `features` output Petrel reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeFeatures {
    /// The mount options the runtime recognizes (`rro`, `rbind`, ...).
    #[serde(default)]
    pub mount_options: Vec<String>,
    /// Its Linux-specific features.
    #[serde(default)]
    pub linux: LinuxFeatures,
}

/// `linux` of the `features` output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinuxFeatures {
    /// The namespace types it can create or join (`user`, `pid`, ...).
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Mount extensions (`idmap`).
    #[serde(default)]
    pub mount_extensions: MountExtensions,
}

/// `linux.mountExtensions` of the `features` output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MountExtensions {
    /// Idmapped mounts (`uidMappings`/`gidMappings` on a mount).
    #[serde(default)]
    pub idmap: Option<Enabled>,
}

/// A feature switch of the `features` output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Enabled {
    /// Whether the feature is there.
    #[serde(default)]
    pub enabled: bool,
}

impl RuntimeFeatures {
    /// Parses the JSON of `<runtime> features`.
    pub fn parse(json: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(json)
    }

    /// Asks the runtime `binary` (`<binary> features`). `None` when it has
    /// no such command, fails, or prints what is not its JSON: it then
    /// supports nothing this module asks about.
    pub fn query(binary: &Path) -> Option<Self> {
        let out = Command::new(binary)
            .arg("features")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        Self::parse(&out.stdout).ok()
    }

    /// Whether the runtime knows the `rro` mount option.
    pub fn has_mount_option(&self, option: &str) -> bool {
        self.mount_options.iter().any(|o| o == option)
    }

    /// Whether the runtime can put a container in a user namespace and
    /// make idmapped mounts.
    pub fn user_namespaces(&self) -> bool {
        let userns = self.linux.namespaces.iter().any(|n| n == "user");
        let idmap = self.linux.mount_extensions.idmap.is_some_and(|i| i.enabled);
        userns && idmap
    }
}

/// `(major, minor)` of a kernel release string (`6.1.0-18-amd64`,
/// `5.12.0`); `None` when it does not start with two numbers.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// Whether recursive read-only mounts work: the kernel `release` is at
/// least [`RRO_KERNEL`] and the runtime knows `rro`.
pub fn recursive_read_only(release: &str, runtime: Option<&RuntimeFeatures>) -> bool {
    let kernel = kernel_version(release).is_some_and(|v| v >= RRO_KERNEL);
    kernel && runtime.is_some_and(|f| f.has_mount_option("rro"))
}

/// Whether pods may have user namespaces: the kernel `release` is at least
/// [`IDMAPPED_OVERLAY_KERNEL`] and the runtime has user namespaces and
/// idmapped mounts.
pub fn user_namespaces(release: &str, runtime: Option<&RuntimeFeatures>) -> bool {
    let kernel = kernel_version(release).is_some_and(|v| v >= IDMAPPED_OVERLAY_KERNEL);
    kernel && runtime.is_some_and(RuntimeFeatures::user_namespaces)
}

/// This host's kernel release (`uname -r`).
pub fn kernel_release() -> String {
    rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_version_should_read_major_and_minor_of_release_strings() {
        assert_eq!(kernel_version("6.18.0"), Some((6, 18)));
        assert_eq!(kernel_version("6.1.0-18-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.12-rc3"), Some((5, 12)));
        assert_eq!(kernel_version("5.4.0+"), Some((5, 4)));
        assert_eq!(kernel_version("4.19"), Some((4, 19)));
        assert_eq!(kernel_version("linux"), None);
        assert_eq!(kernel_version("6"), None);
        assert_eq!(kernel_version(""), None);
    }

    #[test]
    fn recursive_read_only_should_need_kernel_5_12_and_the_rro_option() {
        let with = RuntimeFeatures {
            mount_options: vec!["ro".into(), "rro".into(), "rbind".into()],
            ..Default::default()
        };
        let without = RuntimeFeatures {
            mount_options: vec!["ro".into(), "rbind".into()],
            ..Default::default()
        };
        assert!(recursive_read_only("5.12.0", Some(&with)));
        assert!(recursive_read_only("6.18.0-petrel", Some(&with)));
        assert!(!recursive_read_only("5.11.22", Some(&with)));
        assert!(!recursive_read_only("4.19.0", Some(&with)));
        assert!(!recursive_read_only("garbage", Some(&with)));
        assert!(!recursive_read_only("6.18.0", Some(&without)));
        assert!(!recursive_read_only("6.18.0", None));
    }

    #[test]
    fn parse_should_read_runc_features_and_ignore_what_it_does_not_need() {
        let json = br#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.0.2-dev",
            "hooks":["prestart"],"mountOptions":["acl","rro","rbind"],
            "linux":{"namespaces":["pid"]},"annotations":{"a":"b"}}"#;
        let f = RuntimeFeatures::parse(json).expect("parse");
        assert!(f.has_mount_option("rro"));
        assert!(!f.has_mount_option("ro"));
        let none = RuntimeFeatures::parse(br#"{"ociVersionMin":"1.0.0"}"#).expect("parse");
        assert!(none.mount_options.is_empty());
        assert!(RuntimeFeatures::parse(b"runc: unknown command").is_err());
    }

    /// runc 1.5's `features` (abridged): user namespaces and idmap mounts.
    const RUNC_1_5: &[u8] = br#"{"ociVersionMin":"1.0.0","mountOptions":["rro"],
        "linux":{"namespaces":["cgroup","ipc","mount","network","pid","time","user","uts"],
        "mountExtensions":{"idmap":{"enabled":true}}}}"#;

    /// runc 1.1's `features` (abridged): a user namespace but no idmap.
    const RUNC_1_1: &[u8] = br#"{"ociVersionMin":"1.0.0","mountOptions":["rro"],
        "linux":{"namespaces":["cgroup","ipc","mount","network","pid","user","uts"]}}"#;

    #[test]
    fn user_namespaces_should_need_idmap_mounts_the_user_namespace_and_kernel_5_19() {
        let new = RuntimeFeatures::parse(RUNC_1_5).expect("parse");
        let old = RuntimeFeatures::parse(RUNC_1_1).expect("parse");
        assert!(new.user_namespaces());
        assert!(!old.user_namespaces());
        assert!(user_namespaces("6.18.0", Some(&new)));
        assert!(user_namespaces("5.19.0-1-amd64", Some(&new)));
        assert!(
            !user_namespaces("5.15.0", Some(&new)),
            "no idmapped overlay layers"
        );
        assert!(!user_namespaces("6.18.0", Some(&old)));
        assert!(!user_namespaces("6.18.0", None));
        let disabled = br#"{"linux":{"namespaces":["user"],
            "mountExtensions":{"idmap":{"enabled":false}}}}"#;
        let disabled = RuntimeFeatures::parse(disabled).expect("parse");
        assert!(!disabled.user_namespaces());
        let no_user = br#"{"linux":{"namespaces":["pid"],
            "mountExtensions":{"idmap":{"enabled":true}}}}"#;
        assert!(!RuntimeFeatures::parse(no_user)
            .expect("parse")
            .user_namespaces());
    }

    #[test]
    fn query_should_be_none_for_a_runtime_without_the_features_command() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("old-runc");
        std::fs::write(
            &bin,
            "#!/bin/sh\necho 'No help topic for features' >&2\nexit 1\n",
        )
        .expect("write");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(RuntimeFeatures::query(&bin), None);
        assert_eq!(RuntimeFeatures::query(&dir.path().join("missing")), None);
        let good = dir.path().join("new-runc");
        std::fs::write(
            &good,
            "#!/bin/sh\n[ \"$1\" = features ] && echo '{\"mountOptions\":[\"rro\"]}'\n",
        )
        .expect("write");
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let f = RuntimeFeatures::query(&good).expect("features");
        assert!(f.has_mount_option("rro"));
    }
}
