//! Per-registry host configuration in containerd's `hosts.toml` format:
//! `<config dir>/<registry host>/hosts.toml`, else
//! `<config dir>/_default/hosts.toml`.
//!
//! ```toml
//! server = "https://registry-1.docker.io"
//!
//! [host."http://127.0.0.1:5000"]
//!   capabilities = ["pull", "resolve"]
//!   skip_verify = false
//!   ca = "/etc/certs/mirror.pem"        # or a list of paths
//!   override_path = false
//!   [host."http://127.0.0.1:5000".header]
//!     x-custom = "value"                # or a list of values
//! ```
//!
//! Mirrors are tried in file order, then the `server` (the registry itself
//! when not set). The repository path is kept on every host.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::ImageError;

/// The registry host docker.io images are served from.
const DOCKER_HUB_SERVER: &str = "https://registry-1.docker.io";

/// What a host may be used for (containerd's capabilities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Blobs and manifests by digest.
    pub pull: bool,
    /// Tags to manifest digests.
    pub resolve: bool,
}

/// One host to try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// `scheme://host[:port]`.
    pub origin: String,
    /// `host[:port]`, for messages and the insecure check.
    pub authority: String,
    /// Path prefix before `/<repository>/...`, e.g. `/v2`.
    pub base_path: String,
    /// What this host is used for.
    pub capabilities: Capabilities,
    /// Accept any TLS certificate.
    pub skip_verify: bool,
    /// Extra CA certificates (PEM files).
    pub ca: Vec<PathBuf>,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
}

impl Host {
    /// `<origin><base path>/<repository>`: the URL prefix of a repository.
    pub fn repo_url(&self, repository: &str) -> String {
        format!("{}{}/{}", self.origin, self.base_path, repository)
    }

    /// Whether this host is reached over plain HTTP.
    pub fn is_plain_http(&self) -> bool {
        self.origin.starts_with("http://")
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsFile {
    server: Option<String>,
    capabilities: Option<Vec<String>>,
    skip_verify: Option<bool>,
    ca: Option<OneOrMany>,
    #[serde(default)]
    header: BTreeMap<String, OneOrMany>,
    override_path: Option<bool>,
    /// Kept in file order (toml's `preserve_order`).
    #[serde(default)]
    host: toml::map::Map<String, toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostEntry {
    capabilities: Option<Vec<String>>,
    skip_verify: Option<bool>,
    ca: Option<OneOrMany>,
    #[serde(default)]
    header: BTreeMap<String, OneOrMany>,
    override_path: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// Registry configuration: the hosts.toml directory and the registries
/// that may be reached over plain HTTP.
#[derive(Debug, Clone, Default)]
pub struct RegistryHosts {
    /// `<dir>/<host>/hosts.toml`; none: every registry is its own server.
    pub config_dir: Option<PathBuf>,
    /// `host[:port]` names allowed over plain HTTP (loopback always is).
    pub insecure: Vec<String>,
}

fn config_err(path: &Path, reason: impl Into<String>) -> ImageError {
    ImageError::RegistryConfig {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Whether `authority` (`host[:port]`) names a loopback address or localhost.
pub fn is_loopback(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Splits `scheme://authority/path` into its three parts.
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if authority.is_empty() {
        return None;
    }
    Some((scheme, authority, path))
}

fn capabilities(list: Option<Vec<String>>, path: &Path) -> Result<Capabilities, ImageError> {
    let Some(list) = list else {
        return Ok(Capabilities {
            pull: true,
            resolve: true,
        });
    };
    let mut caps = Capabilities {
        pull: false,
        resolve: false,
    };
    for c in list {
        match c.as_str() {
            "pull" => caps.pull = true,
            "resolve" => caps.resolve = true,
            // Pushing is not something a node does; accepted and ignored.
            "push" => {}
            other => return Err(config_err(path, format!("unknown capability {other:?}"))),
        }
    }
    Ok(caps)
}

struct EntryParts {
    capabilities: Option<Vec<String>>,
    skip_verify: Option<bool>,
    ca: Option<OneOrMany>,
    header: BTreeMap<String, OneOrMany>,
    override_path: Option<bool>,
}

fn make_host(
    url: &str,
    parts: EntryParts,
    file: &Path,
    base_dir: &Path,
) -> Result<Host, ImageError> {
    let (scheme, authority, path) =
        split_url(url).ok_or_else(|| config_err(file, format!("invalid host URL {url:?}")))?;
    let path = path.trim_end_matches('/');
    // containerd's rule: the URL's path is the API root; `/v2` is appended
    // unless it is there already or `override_path` says the path is exact.
    let base_path = if parts.override_path.unwrap_or(false) || path.ends_with("/v2") {
        path.to_string()
    } else {
        format!("{path}/v2")
    };
    let ca = parts
        .ca
        .map(OneOrMany::into_vec)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                base_dir.join(p)
            }
        })
        .collect();
    let headers = parts
        .header
        .into_iter()
        .flat_map(|(k, v)| v.into_vec().into_iter().map(move |v| (k.clone(), v)))
        .collect();
    Ok(Host {
        origin: format!("{scheme}://{authority}"),
        authority: authority.to_string(),
        base_path,
        capabilities: capabilities(parts.capabilities, file)?,
        skip_verify: parts.skip_verify.unwrap_or(false),
        ca,
        headers,
    })
}

impl RegistryHosts {
    /// Whether plain HTTP may be used for `authority`.
    pub fn allows_http(&self, authority: &str) -> bool {
        is_loopback(authority) || self.insecure.iter().any(|h| h == authority)
    }

    /// The default server of `registry` when no hosts.toml names one.
    fn default_server(&self, registry: &str) -> String {
        if registry == "docker.io" {
            DOCKER_HUB_SERVER.to_string()
        } else if self.allows_http(registry) {
            // Loopback and insecure registries are plain HTTP unless a
            // hosts.toml says otherwise.
            format!("http://{registry}")
        } else {
            format!("https://{registry}")
        }
    }

    /// The hosts to try for `registry` (a reference's domain), in order:
    /// the mirrors of its hosts.toml, then its server.
    pub fn resolve(&self, registry: &str) -> Result<Vec<Host>, ImageError> {
        let file = self.config_dir.as_ref().and_then(|dir| {
            [registry, "_default"]
                .iter()
                .map(|d| dir.join(d).join("hosts.toml"))
                .find(|p| p.is_file())
        });
        let mut hosts = Vec::new();
        let server_host = match file {
            None => {
                let server = self.default_server(registry);
                make_host(
                    &server,
                    EntryParts {
                        capabilities: None,
                        skip_verify: None,
                        ca: None,
                        header: BTreeMap::new(),
                        override_path: None,
                    },
                    Path::new("<default>"),
                    Path::new("/"),
                )?
            }
            Some(path) => {
                let text =
                    std::fs::read_to_string(&path).map_err(|e| ImageError::io("read", &path, e))?;
                let parsed: HostsFile =
                    toml::from_str(&text).map_err(|e| config_err(&path, e.to_string()))?;
                let base_dir = path.parent().unwrap_or(Path::new("/")).to_path_buf();
                for (url, value) in parsed.host {
                    let entry: HostEntry = value
                        .try_into()
                        .map_err(|e: toml::de::Error| config_err(&path, format!("{url}: {e}")))?;
                    hosts.push(make_host(
                        &url,
                        EntryParts {
                            capabilities: entry.capabilities,
                            skip_verify: entry.skip_verify,
                            ca: entry.ca,
                            header: entry.header,
                            override_path: entry.override_path,
                        },
                        &path,
                        &base_dir,
                    )?);
                }
                let server = parsed
                    .server
                    .unwrap_or_else(|| self.default_server(registry));
                make_host(
                    &server,
                    EntryParts {
                        capabilities: parsed.capabilities,
                        skip_verify: parsed.skip_verify,
                        ca: parsed.ca,
                        header: parsed.header,
                        override_path: parsed.override_path,
                    },
                    &path,
                    &base_dir,
                )?
            }
        };
        hosts.push(server_host);
        for h in &hosts {
            if h.is_plain_http() && !self.allows_http(&h.authority) {
                return Err(config_err(
                    self.config_dir.as_deref().unwrap_or(Path::new("<default>")),
                    format!(
                        "{} uses plain HTTP but {} is not listed as an insecure registry",
                        h.origin, h.authority
                    ),
                ));
            }
        }
        Ok(hosts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, registry: &str, text: &str) {
        let d = dir.join(registry);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join("hosts.toml"), text).expect("write");
    }

    #[test]
    fn hosts_should_be_tried_in_file_order_then_the_server() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "registry.k8s.io",
            r#"
server = "https://registry.k8s.io"

[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]

[host."https://mirror.example.com/custom"]
  capabilities = ["pull"]
  skip_verify = true
  ca = ["certs/a.pem", "/abs/b.pem"]
  [host."https://mirror.example.com/custom".header]
    x-one = "1"
    x-many = ["a", "b"]

[host."https://exact.example.com/api/v9"]
  override_path = true
"#,
        );
        let cfg = RegistryHosts {
            config_dir: Some(dir.path().to_path_buf()),
            insecure: vec![],
        };
        let hosts = cfg.resolve("registry.k8s.io").expect("resolve");
        let urls: Vec<String> = hosts.iter().map(|h| h.repo_url("pause")).collect();
        assert_eq!(
            urls,
            vec![
                "http://127.0.0.1:5000/v2/pause",
                "https://mirror.example.com/custom/v2/pause",
                "https://exact.example.com/api/v9/pause",
                "https://registry.k8s.io/v2/pause",
            ]
        );
        assert!(hosts[0].capabilities.resolve && hosts[0].capabilities.pull);
        assert!(!hosts[1].capabilities.resolve && hosts[1].capabilities.pull);
        assert!(hosts[1].skip_verify);
        assert_eq!(
            hosts[1].ca,
            vec![
                dir.path().join("registry.k8s.io/certs/a.pem"),
                PathBuf::from("/abs/b.pem")
            ]
        );
        assert_eq!(
            hosts[1].headers,
            vec![
                ("x-many".to_string(), "a".to_string()),
                ("x-many".to_string(), "b".to_string()),
                ("x-one".to_string(), "1".to_string())
            ]
        );
    }

    #[test]
    fn default_file_and_upstream_defaults_should_apply() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = RegistryHosts {
            config_dir: Some(dir.path().to_path_buf()),
            insecure: vec!["reg.lan:5000".to_string()],
        };
        let h = cfg.resolve("docker.io").expect("resolve");
        assert_eq!(
            h[0].repo_url("library/busybox"),
            "https://registry-1.docker.io/v2/library/busybox"
        );
        assert_eq!(
            cfg.resolve("quay.io").expect("resolve")[0].origin,
            "https://quay.io"
        );
        assert_eq!(
            cfg.resolve("reg.lan:5000").expect("resolve")[0].origin,
            "http://reg.lan:5000"
        );
        assert_eq!(
            cfg.resolve("127.0.0.1:5000").expect("resolve")[0].origin,
            "http://127.0.0.1:5000"
        );
        write(dir.path(), "_default", "[host.\"http://localhost:7000\"]\n");
        let h = cfg.resolve("quay.io").expect("resolve");
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].origin, "http://localhost:7000");
        assert_eq!(h[1].origin, "https://quay.io");
    }

    #[test]
    fn plain_http_should_need_loopback_or_the_insecure_list() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "docker.io", "[host.\"http://mirror.lan\"]\n");
        let mut cfg = RegistryHosts {
            config_dir: Some(dir.path().to_path_buf()),
            insecure: vec![],
        };
        let err = cfg.resolve("docker.io").expect_err("refused");
        assert!(
            err.to_string().contains("not listed as an insecure"),
            "{err}"
        );
        cfg.insecure.push("mirror.lan".to_string());
        assert_eq!(cfg.resolve("docker.io").expect("resolve").len(), 2);
    }

    #[test]
    fn malformed_files_should_be_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = RegistryHosts {
            config_dir: Some(dir.path().to_path_buf()),
            insecure: vec![],
        };
        write(dir.path(), "a.io", "[host.\"ftp://x\"]\n");
        assert!(cfg.resolve("a.io").is_err());
        write(
            dir.path(),
            "b.io",
            "[host.\"https://x\"]\ncapabilities = [\"fly\"]\n",
        );
        assert!(cfg
            .resolve("b.io")
            .expect_err("bad capability")
            .to_string()
            .contains("fly"));
        write(dir.path(), "c.io", "bogus = 1\n");
        assert!(cfg.resolve("c.io").is_err());
    }

    #[test]
    fn loopback_should_be_recognised() {
        assert!(is_loopback("127.0.0.1:5000"));
        assert!(is_loopback("localhost"));
        assert!(is_loopback("[::1]:5000"));
        assert!(!is_loopback("10.0.0.1:5000"));
        assert!(!is_loopback("registry.k8s.io"));
    }
}
