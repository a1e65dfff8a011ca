//! The pod's `/etc/hosts`, managed by the agent as kubelet manages it:
//! one file per pod, `<pod dir>/etc-hosts`, bind-mounted into every
//! container that mounts nothing at `/etc/hosts` itself. It is the agent's
//! mount, not the runtime's, so every CRI runtime shows the same file
//! (a runtime's own hosts file is only used where no mount is given).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, HostAlias};
use petrel_cri::api;

use super::sandbox::{hostname, spec_of};
use super::{ConvertContext, ConvertError};
use crate::types::DesiredPod;

/// Where the file goes in a container.
const ETC_HOSTS: &str = "/etc/hosts";
/// kubelet's file name in the pod's directory.
const FILE_NAME: &str = "etc-hosts";
/// kubelet's first lines, so tools that look for them recognise the file.
const HEADER: &str = "# Kubernetes-managed hosts file.\n";
const HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";
/// The loopback and IPv6 multicast names every pod gets (kubelet's lines).
const LOCAL_LINES: &str = "127.0.0.1\tlocalhost\n\
    ::1\tlocalhost ip6-localhost ip6-loopback\n\
    fe00::0\tip6-localnet\n\
    fe00::0\tip6-mcastprefix\n\
    fe00::1\tip6-allnodes\n\
    fe00::2\tip6-allrouters\n";

/// The host's own hosts file, the base of host-network pods' file.
const HOST_HOSTS: &str = "/etc/hosts";

/// The file's path on the host: `<pod dir>/etc-hosts`.
fn hosts_path(ctx: &ConvertContext) -> PathBuf {
    ctx.pod_dir.join(FILE_NAME)
}

/// Where a pod without an address (a loopback-only pod: no CNI network)
/// finds its own name, as Debian and Petrel's runtime name the host.
/// kubelet never meets such a pod: its containers are created once the
/// pod network gave the sandbox an IP.
const NO_IP_ADDRESS: &str = "127.0.1.1";

/// Does the container mount something of its own at /etc/hosts?
fn mounts_its_own(container: &Container) -> bool {
    container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path.trim_end_matches('/') == ETC_HOSTS)
}

/// The CRI mount of the pod's hosts file for `container`, or None when it
/// mounts something at /etc/hosts itself. Writable, as kubelet mounts it:
/// a container may add names for itself.
pub(crate) fn hosts_mount(container: &Container, ctx: &ConvertContext) -> Option<api::Mount> {
    (!mounts_its_own(container)).then(|| api::Mount {
        container_path: ETC_HOSTS.to_string(),
        host_path: hosts_path(ctx).to_string_lossy().into_owned(),
        ..Default::default()
    })
}

/// kubelet's `# Entries added by HostAliases.` block: one line per IP with
/// its names; nothing without aliases.
fn alias_lines(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.iter().flatten().cloned().collect::<Vec<_>>();
        out.push_str(&format!("{}\t{}\n", a.ip, names.join("\t")));
    }
    out
}

/// The file of a pod on its own network: header, local names, each pod IP
/// (none: [`NO_IP_ADDRESS`]) with the hostname (its fully qualified name
/// first when the pod has a subdomain), then the aliases.
fn managed_content(ips: &[String], host: &str, domain: &str, aliases: &[HostAlias]) -> String {
    let mut out = String::from(HEADER);
    out.push_str(LOCAL_LINES);
    let fallback = [NO_IP_ADDRESS.to_string()];
    let ips = if ips.is_empty() { &fallback[..] } else { ips };
    for ip in ips {
        if domain.is_empty() {
            out.push_str(&format!("{ip}\t{host}\n"));
        } else {
            out.push_str(&format!("{ip}\t{host}.{domain}\t{host}\n"));
        }
    }
    out.push_str(&alias_lines(aliases));
    out
}

/// The file of a host-network pod: the host's file under kubelet's
/// header, then the aliases.
fn host_network_content(host_hosts: &str, aliases: &[HostAlias]) -> String {
    let mut out = String::from(HEADER_HOST_NETWORK);
    out.push_str(host_hosts);
    out.push_str(&alias_lines(aliases));
    out
}

/// The pod's file content, as kubelet's `ensureHostsFile` makes it;
/// `host_hosts` reads the host's file (host-network pods only).
fn content(
    pod: &DesiredPod,
    ctx: &ConvertContext,
    host_hosts: impl FnOnce() -> std::io::Result<String>,
) -> Result<String, ConvertError> {
    let spec = spec_of(pod)?;
    let aliases = spec.host_aliases.as_deref().unwrap_or(&[]);
    if spec.host_network == Some(true) {
        let text = host_hosts().map_err(|source| ConvertError::Io {
            op: "read the host's hosts file",
            path: PathBuf::from(HOST_HOSTS),
            source,
        })?;
        return Ok(host_network_content(&text, aliases));
    }
    let host = hostname(spec, &pod.name);
    let domain = match spec.subdomain.as_deref().filter(|s| !s.is_empty()) {
        Some(sub) => format!("{sub}.{}.svc.{}", pod.namespace, ctx.dns.cluster_domain),
        None => String::new(),
    };
    Ok(managed_content(&ctx.pod_ips, &host, &domain, aliases))
}

/// Writes the pod's hosts file before a container is created. An
/// unchanged file is left alone; a
/// changed one is replaced in one rename, so no container ever reads a
/// half-written file (kubelet rewrites in place). The file is 0644 (the
/// containers' users read it) in the pod's directory (0700: the runtime
/// binds it as root).
pub fn write_hosts_file(pod: &DesiredPod, ctx: &ConvertContext) -> Result<(), ConvertError> {
    let text = content(pod, ctx, || fs::read_to_string(HOST_HOSTS))?;
    let path = hosts_path(ctx);
    if fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
        return Ok(());
    }
    petrel_fs::create_private_dir_all(&ctx.pod_dir, petrel_fs::PRIVATE).map_err(|e| {
        ConvertError::Io {
            op: "create pod directory",
            path: ctx.pod_dir.clone(),
            source: std::io::Error::other(e),
        }
    })?;
    replace(&path, text.as_bytes()).map_err(|source| ConvertError::Io {
        op: "write hosts file",
        path,
        source,
    })
}

/// Writes `bytes` to a temporary file beside `path` (0644, synced) and
/// renames it over `path`.
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)?;
    f.write_all(bytes)?;
    // The umask may have narrowed the mode given at creation.
    f.set_permissions(fs::Permissions::from_mode(0o644))?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::convert::test_support::{ctx, desired};

    const POD: &str =
        "metadata: {name: web, namespace: prod}\nspec:\n  containers: [{name: a, image: x}]\n";

    fn ctx_in(dir: &Path) -> ConvertContext {
        let mut c = ctx();
        c.pod_dir = dir.join("pods/uid");
        c.dns.cluster_domain = "cluster.local".into();
        c
    }

    #[test]
    fn managed_content_should_name_the_pod_on_each_ip() {
        let c = ctx();
        let text = content(&desired(POD), &c, || unreachable!()).unwrap();
        assert_eq!(
            text,
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n\
             10.0.0.5\tweb\nfd00::5\tweb\n"
        );
    }

    #[test]
    fn managed_content_should_add_the_subdomain_name_and_aliases() {
        let pod = desired(
            "metadata: {name: web-0, namespace: prod}\nspec:\n  hostname: www\n  subdomain: back\n\
             \x20 hostAliases:\n  - {ip: 10.1.2.3, hostnames: [foo.local, bar.local]}\n  - {ip: 10.1.2.4, hostnames: [baz]}\n\
             \x20 containers: [{name: a, image: x}]\n",
        );
        let mut c = ctx();
        c.dns.cluster_domain = "cluster.local".into();
        c.pod_ips.truncate(1);
        let text = content(&pod, &c, || unreachable!()).unwrap();
        assert!(
            text.ends_with(
                "fe00::2\tip6-allrouters\n10.0.0.5\twww.back.prod.svc.cluster.local\twww\n\
                 \n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n10.1.2.4\tbaz\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn host_network_content_should_be_the_hosts_file_with_aliases() {
        let pod = desired(
            "metadata: {name: h}\nspec:\n  hostNetwork: true\n  hostAliases: [{ip: 10.9.9.9, hostnames: [x]}]\n  containers: [{name: a, image: x}]\n",
        );
        let text = content(&pod, &ctx(), || Ok("127.0.0.1 localhost\n".into())).unwrap();
        assert_eq!(
            text,
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n10.9.9.9\tx\n"
        );
    }

    #[test]
    fn hosts_mount_should_go_to_containers_without_their_own() {
        let pod = desired(
            "metadata: {name: web}\nspec:\n  volumes: [{name: h, emptyDir: {}}]\n  containers:\n  - {name: a, image: x}\n  - {name: b, image: x, volumeMounts: [{name: h, mountPath: /etc/hosts/}]}\n",
        );
        let spec = pod.pod.spec.clone().unwrap();
        let c = ctx();
        let m = hosts_mount(&spec.containers[0], &c).unwrap();
        assert_eq!(m.container_path, "/etc/hosts");
        assert_eq!(m.host_path, "/var/lib/petrel/pods/uid/etc-hosts");
        assert!(!m.readonly);
        assert_eq!(hosts_mount(&spec.containers[1], &c), None);
    }

    #[test]
    fn managed_content_without_an_ip_should_name_the_pod_on_127_0_1_1() {
        let c = ConvertContext {
            pod_ips: vec![],
            ..ctx()
        };
        let text = content(&desired(POD), &c, || unreachable!()).unwrap();
        assert!(
            text.ends_with("fe00::2\tip6-allrouters\n127.0.1.1\tweb\n"),
            "{text}"
        );
    }

    #[test]
    fn write_hosts_file_should_write_0644_and_replace_only_on_change() {
        let tmp = tempfile::tempdir().unwrap();
        let c = ctx_in(tmp.path());
        let pod = desired(POD);
        write_hosts_file(&pod, &c).unwrap();
        let path = c.pod_dir.join("etc-hosts");
        let md = fs::metadata(&path).unwrap();
        assert_eq!(md.mode() & 0o777, 0o644);
        assert!(fs::read_to_string(&path)
            .unwrap()
            .contains("10.0.0.5\tweb\n"));
        let ino = md.ino();
        write_hosts_file(&pod, &c).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().ino(),
            ino,
            "unchanged: left alone"
        );
        let moved = ConvertContext {
            pod_ips: vec!["10.0.0.6".into()],
            ..c.clone()
        };
        write_hosts_file(&pod, &moved).unwrap();
        assert_ne!(
            fs::metadata(&path).unwrap().ino(),
            ino,
            "replaced by a rename"
        );
        assert!(fs::read_to_string(&path)
            .unwrap()
            .contains("10.0.0.6\tweb\n"));
        assert!(!c.pod_dir.join("etc-hosts.tmp").exists());
    }
}
