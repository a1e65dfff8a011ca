//! A private CNI network for one test: its own bridge, subnet, host-local
//! lease directory and configuration directory, all removed on drop.

use std::path::PathBuf;
use std::process::Command;

/// A test network (bridge + host-local + loopback + portmap).
pub struct TestNet {
    /// The configuration directory (`--cni-conf-dir`).
    pub conf_dir: PathBuf,
    /// host-local's lease directory (one file per leased address).
    pub leases: PathBuf,
    /// The bridge's name.
    pub bridge: String,
    /// The subnet's first three octets (`10.x.y`).
    pub prefix: String,
    /// The network's name (host-local's lease subdirectory).
    pub name: String,
    _dir: tempfile::TempDir,
}

impl TestNet {
    /// A network whose plugins are `plugins` (JSON objects, comma-separated)
    /// after the bridge; the default chain is loopback + portmap.
    pub fn new() -> TestNet {
        Self::with_chain(
            r#"{"type":"loopback"},{"type":"portmap","capabilities":{"portMappings":true},"snat":true}"#,
        )
    }

    /// A network with `after_bridge` plugins after the bridge.
    pub fn with_chain(after_bridge: &str) -> TestNet {
        let dir = tempfile::Builder::new()
            .prefix("petrel-cni.")
            .tempdir()
            .expect("tempdir");
        let n = super::random_suffix();
        // A name of at most 15 bytes and a /24 no other test picks (by
        // chance only one in ~12000; each test holds it for seconds).
        let bridge = format!("pt{}", &n[..8]);
        let x = 200 + u32::from_str_radix(&n[8..10], 16).unwrap_or(0) % 50;
        let y = u32::from_str_radix(&n[10..12], 16).unwrap_or(0);
        let prefix = format!("10.{x}.{y}");
        let conf_dir = dir.path().join("net.d");
        let leases = dir.path().join("leases");
        std::fs::create_dir_all(&conf_dir).expect("mkdir net.d");
        let name = format!("petrel-test-{n}");
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[
                {{"type":"bridge","bridge":"{bridge}","isGateway":true,"ipMasq":false,"hairpinMode":true,
                  "ipam":{{"type":"host-local","dataDir":"{leases}","ranges":[[{{"subnet":"{prefix}.0/24"}}]],
                           "routes":[{{"dst":"0.0.0.0/0"}}]}}}},
                {after_bridge}]}}"#,
            leases = leases.display()
        );
        std::fs::write(conf_dir.join("10-test.conflist"), conf).expect("write conflist");
        TestNet {
            conf_dir,
            leases,
            bridge,
            prefix,
            name,
            _dir: dir,
        }
    }

    /// The `[cri]` lines of a runtime on this network.
    pub fn cri_config(&self) -> String {
        format!(
            "pod_network = \"cni\"\n[cri.cni]\nconf_dir = {:?}\nbin_dirs = [\"/usr/lib/cni\"]\n",
            self.conf_dir
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
            .expect("ip link");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                l.split(": ")
                    .nth(1)
                    .map(|s| s.split('@').next().unwrap_or(s).to_string())
            })
            .collect()
    }
}

/// iptables rules (all tables) that mention `needle`.
pub fn iptables_rules_with(needle: &str) -> Vec<String> {
    let out = Command::new("iptables-save")
        .output()
        .expect("iptables-save");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // The bridge plugin never removes its bridge: it is ours to remove.
        let _ = Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .status();
    }
}
