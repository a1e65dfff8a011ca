//! A private CNI network for one runtime under test: its own bridge (with a
//! gateway address on the host, so the host reaches pod IPs), a /24 of its
//! own (in 10.252.0.0/16 for [`PodNetwork::new`], among 12800 for the
//! end-to-end tests' [`PodNetwork::with_chain`]), host-local leases in its
//! own directory, and the portmap plugin for host ports (also on
//! 127.0.0.1). The bridge is removed on drop; its name is also in the file
//! `bridge` of the network's directory.

use std::path::PathBuf;
use std::process::Command;

use crate::process::{kit_tempdir, random_suffix};
use crate::KitError;

/// Debian's CNI plugins (containernetworking-plugins).
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A pod network.
pub struct PodNetwork {
    dir: tempfile::TempDir,
    /// The configuration directory holding one `.conflist`.
    pub conf_dir: PathBuf,
    /// That `.conflist`.
    pub conf_file: PathBuf,
    /// Where the plugins are.
    pub bin_dir: PathBuf,
    /// The bridge's name.
    pub bridge: String,
    /// The pods' subnet, `10.252.N.0/24`.
    pub subnet: String,
    /// The subnet's first three octets (`10.x.y`).
    pub prefix: String,
    /// The network's name (host-local's lease subdirectory).
    pub name: String,
    /// host-local's lease directory (one file per leased address, below
    /// [`PodNetwork::name`]).
    pub leases: PathBuf,
}

/// The plugins after the bridge of the end-to-end tests' default network:
/// loopback, then portmap (with SNAT, for 127.0.0.1).
pub const LOOPBACK_PORTMAP: &str =
    r#"{"type":"loopback"},{"type":"portmap","capabilities":{"portMappings":true},"snat":true}"#;

impl PodNetwork {
    /// A new network; nothing exists on the host until the first pod.
    pub fn new() -> Result<PodNetwork, KitError> {
        let n = random_suffix();
        let third = u8::from_str_radix(&n[10..12], 16).unwrap_or(0);
        let prefix = format!("10.252.{third}");
        Self::create(
            &n,
            format!("pk{}", &n[..10]),
            prefix,
            "petrel-kit",
            conflist,
        )
    }

    /// An end-to-end test's network: `after_bridge` (JSON objects,
    /// comma-separated; [`LOOPBACK_PORTMAP`] by default) after the bridge,
    /// a bridge `pt<hex>` and a /24 in 10.200-249.y that no other test
    /// picks (by chance only one in ~12800; each test holds it for
    /// seconds). Panics (a test's failure) when it cannot be made.
    pub fn with_chain(after_bridge: &str) -> PodNetwork {
        let n = random_suffix();
        let x = 200 + u32::from_str_radix(&n[8..10], 16).unwrap_or(0) % 50;
        let y = u32::from_str_radix(&n[10..12], 16).unwrap_or(0);
        Self::create(
            &n,
            format!("pt{}", &n[..8]),
            format!("10.{x}.{y}"),
            "petrel-test",
            |name, bridge, subnet, leases| {
                conflist_with(name, bridge, subnet, leases, after_bridge)
            },
        )
        .unwrap_or_else(|e| panic!("test network: {e}"))
    }

    fn create(
        n: &str,
        bridge: String,
        prefix: String,
        kind: &str,
        conf: impl Fn(&str, &str, &str, &str) -> String,
    ) -> Result<PodNetwork, KitError> {
        let bin_dir = PathBuf::from(CNI_BIN_DIR);
        for p in ["bridge", "host-local", "portmap", "loopback"] {
            if !bin_dir.join(p).is_file() {
                return Err(KitError::Missing {
                    component: format!("CNI plugin {p}"),
                    path: bin_dir.join(p),
                    hint: "apt-get install containernetworking-plugins (`make deps`)".into(),
                });
            }
        }
        let dir = kit_tempdir(&format!("{kind}-cni."))?;
        let subnet = format!("{prefix}.0/24");
        let conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&conf_dir)
            .map_err(|e| KitError::io("create directory", &conf_dir, e))?;
        // For a sweep outside this process (scripts/bench.sh's trap): the
        // bridge to delete if the kit dies before its drop.
        let _ = std::fs::write(dir.path().join("bridge"), &bridge);
        let file = conf_dir.join(format!("10-{kind}.conflist"));
        let name = format!("{kind}-{n}");
        let leases = dir.path().join("leases");
        std::fs::write(
            &file,
            conf(&name, &bridge, &subnet, &leases.display().to_string()),
        )
        .map_err(|e| KitError::io("write", &file, e))?;
        Ok(PodNetwork {
            dir,
            conf_dir,
            conf_file: file,
            bin_dir,
            bridge,
            subnet,
            prefix,
            name,
            leases,
        })
    }

    /// The `[cri]` lines of a Petrel runtime on this network.
    pub fn cri_config(&self) -> String {
        format!(
            "pod_network = \"cni\"\n[cri.cni]\nconf_dir = {:?}\nbin_dirs = [{:?}]\n",
            self.conf_dir, self.bin_dir
        )
    }

    /// Leased addresses (host-local keeps one file per address).
    pub fn leased(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.leases.join(&self.name)) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    /// Interfaces enslaved to the bridge (the pods' host-side veths).
    pub fn bridge_ports(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["-o", "link", "show", "master", &self.bridge])
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default();
        String::from_utf8_lossy(&out)
            .lines()
            .filter_map(|l| {
                l.split(": ")
                    .nth(1)
                    .map(|s| s.split('@').next().unwrap_or(s).to_string())
            })
            .collect()
    }

    /// The network's own directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// The network's conflist: bridge (gateway on the host, hairpin so a pod
/// reaches its own host port) + portmap (with SNAT, for 127.0.0.1).
pub fn conflist(name: &str, bridge: &str, subnet: &str, leases: &str) -> String {
    conflist_with(name, bridge, subnet, leases, PORTMAP)
}

/// The portmap plugin with SNAT (for 127.0.0.1), as the last of a chain.
const PORTMAP: &str = r#"{"type":"portmap","capabilities":{"portMappings":true},"snat":true}"#;

/// A conflist of a bridge (gateway on the host, hairpin) followed by
/// `after_bridge` (JSON plugin objects, comma-separated).
pub fn conflist_with(
    name: &str,
    bridge: &str,
    subnet: &str,
    leases: &str,
    after_bridge: &str,
) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[
  {{"type":"bridge","bridge":"{bridge}","isGateway":true,"ipMasq":false,"hairpinMode":true,
    "ipam":{{"type":"host-local","dataDir":"{leases}","ranges":[[{{"subnet":"{subnet}"}}]],"routes":[{{"dst":"0.0.0.0/0"}}]}}}},
  {after_bridge}]}}
"#
    )
}

/// iptables rules (all tables) that mention `needle`.
pub fn iptables_rules_with(needle: &str) -> Vec<String> {
    let out = Command::new("iptables-save")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        // The bridge plugin never removes its bridge.
        if std::path::Path::new("/sys/class/net")
            .join(&self.bridge)
            .exists()
        {
            let _ = Command::new("ip")
                .args(["link", "delete", &self.bridge])
                .output();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn conflist_should_be_json_with_bridge_then_portmap() {
        let c = conflist("n", "pk1", "10.252.3.0/24", "/tmp/l");
        let v: serde_json::Value = serde_json::from_str(&c).expect("json");
        let plugins = v["plugins"].as_array().expect("plugins");
        assert_eq!(plugins[0]["type"], "bridge");
        assert_eq!(plugins[0]["isGateway"], true);
        assert_eq!(
            plugins[0]["ipam"]["ranges"][0][0]["subnet"],
            "10.252.3.0/24"
        );
        assert_eq!(plugins[1]["type"], "portmap");
        assert_eq!(plugins[1]["capabilities"]["portMappings"], true);
    }
}
