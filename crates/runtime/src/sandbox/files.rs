//! Files a pod shares with its containers: /etc/hostname, /etc/hosts,
//! /etc/resolv.conf and the /dev/shm tmpfs.

use std::path::{Path, PathBuf};

use petrel_cri::api;

use crate::error::{Result, RuntimeError};

/// Paths of the shared files inside a sandbox directory.
#[derive(Debug, Clone)]
pub struct SandboxFiles {
    /// `/etc/hostname` content.
    pub hostname: PathBuf,
    /// `/etc/hosts` content.
    pub hosts: PathBuf,
    /// `/etc/resolv.conf` content.
    pub resolv_conf: PathBuf,
    /// The pod's shared memory mount point.
    pub shm: PathBuf,
}

impl SandboxFiles {
    /// The files of the sandbox whose directory is `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            hostname: dir.join("hostname"),
            hosts: dir.join("hosts"),
            resolv_conf: dir.join("resolv.conf"),
            shm: dir.join("shm"),
        }
    }
}

fn write(path: &Path, content: &str) -> Result<()> {
    std::fs::write(path, content).map_err(|e| RuntimeError::io("write", path, e))
}

/// Writes hostname, hosts and resolv.conf for a pod.
///
/// Host-network pods see the host's own files, as with containerd.
pub fn write_etc_files(
    files: &SandboxFiles,
    hostname: &str,
    config: &api::PodSandboxConfig,
    host_network: bool,
) -> Result<()> {
    write(&files.hostname, &format!("{hostname}\n"))?;
    if host_network {
        copy_or_empty(Path::new("/etc/hosts"), &files.hosts)?;
    } else {
        write_hosts(&files.hosts, hostname, None)?;
    }
    match &config.dns_config {
        Some(dns)
            if !(dns.servers.is_empty() && dns.searches.is_empty() && dns.options.is_empty()) =>
        {
            write(&files.resolv_conf, &resolv_conf(dns))?;
        }
        _ => copy_or_empty(Path::new("/etc/resolv.conf"), &files.resolv_conf)?,
    }
    Ok(())
}

/// Writes a pod's /etc/hosts: loopback names, and the hostname on the pod's
/// address once the network gave it one (before that, on 127.0.1.1).
pub fn write_hosts(path: &Path, hostname: &str, pod_ip: Option<std::net::IpAddr>) -> Result<()> {
    let own = pod_ip.map_or_else(|| "127.0.1.1".to_string(), |ip| ip.to_string());
    write(
        path,
        &format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n{own}\t{hostname}\n"
        ),
    )
}

fn copy_or_empty(from: &Path, to: &Path) -> Result<()> {
    let content = std::fs::read(from).unwrap_or_default();
    std::fs::write(to, content).map_err(|e| RuntimeError::io("write", to, e))
}

/// Renders a resolv.conf from the CRI DNS config.
pub fn resolv_conf(dns: &api::DnsConfig) -> String {
    let mut out = String::new();
    if !dns.searches.is_empty() {
        out.push_str("search ");
        out.push_str(&dns.searches.join(" "));
        out.push('\n');
    }
    for s in &dns.servers {
        out.push_str("nameserver ");
        out.push_str(s);
        out.push('\n');
    }
    if !dns.options.is_empty() {
        out.push_str("options ");
        out.push_str(&dns.options.join(" "));
        out.push('\n');
    }
    out
}

/// Validates the DNS config's fields (no newlines that would inject lines).
pub fn validate_dns(dns: &api::DnsConfig) -> Result<()> {
    for (field, values) in [
        ("dns_config.servers", &dns.servers),
        ("dns_config.searches", &dns.searches),
        ("dns_config.options", &dns.options),
    ] {
        for (i, v) in values.iter().enumerate() {
            if v.is_empty() || v.contains(['\n', '\r']) || v.contains(char::is_whitespace) {
                return Err(RuntimeError::invalid(
                    format!("config.{field}[{i}]"),
                    format!("{v:?} is not a valid entry"),
                ));
            }
        }
    }
    Ok(())
}

/// Mounts the pod's /dev/shm tmpfs at `path` (created if missing).
pub fn mount_shm(path: &Path, size: u64) -> Result<()> {
    petrel_fs::create_private_dir_all(path, petrel_fs::PRIVATE)
        .map_err(|e| RuntimeError::dir("create shm mount point", e))?;
    let data = std::ffi::CString::new(format!("mode=1777,size={size}"))
        .map_err(|e| RuntimeError::Invariant(format!("shm mount options: {e}")))?;
    rustix::mount::mount(
        "shm",
        path,
        "tmpfs",
        rustix::mount::MountFlags::NOSUID
            | rustix::mount::MountFlags::NODEV
            | rustix::mount::MountFlags::NOEXEC,
        data.as_c_str(),
    )
    .map_err(|e| RuntimeError::io("mount shm at", path, e.into()))
}

/// Unmounts a mount point the runtime made (missing or not mounted is fine).
pub fn unmount(path: &Path) -> Result<()> {
    match rustix::mount::unmount(path, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOENT => Ok(()),
        Err(e) => Err(RuntimeError::io("unmount", path, e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_should_render_searches_servers_and_options() {
        let dns = api::DnsConfig {
            servers: vec!["10.0.0.10".into()],
            searches: vec!["ns.svc.cluster.local".into(), "svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(&dns),
            "search ns.svc.cluster.local svc.cluster.local\nnameserver 10.0.0.10\noptions ndots:5\n"
        );
        assert!(validate_dns(&dns).is_ok());
    }

    #[test]
    fn validate_dns_should_reject_injected_lines() {
        let dns = api::DnsConfig {
            servers: vec!["1.1.1.1\nnameserver 6.6.6.6".into()],
            ..Default::default()
        };
        let err = validate_dns(&dns)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("config.dns_config.servers[0]"), "{err}");
    }
}
