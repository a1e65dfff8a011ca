//! A private CNI network for one runtime under test: its own bridge (with a
//! gateway address on the host, so the host reaches pod IPs), a /24 in
//! 10.252.0.0/16, host-local leases in its own directory, and the portmap
//! plugin for host ports (also on 127.0.0.1). The bridge is removed on drop;
//! its name is also in the file `bridge` of the network's directory.

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
    /// Where the plugins are.
    pub bin_dir: PathBuf,
    /// The bridge's name.
    pub bridge: String,
    /// The pods' subnet, `10.252.N.0/24`.
    pub subnet: String,
}

impl PodNetwork {
    /// A new network; nothing exists on the host until the first pod.
    pub fn new() -> Result<PodNetwork, KitError> {
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
        let dir = kit_tempdir("petrel-kit-cni.")?;
        let n = random_suffix();
        let bridge = format!("pk{}", &n[..10]);
        let third = u8::from_str_radix(&n[10..12], 16).unwrap_or(0);
        let subnet = format!("10.252.{third}.0/24");
        let conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&conf_dir)
            .map_err(|e| KitError::io("create directory", &conf_dir, e))?;
        // For a sweep outside this process (scripts/bench.sh's trap): the
        // bridge to delete if the kit dies before its drop.
        let _ = std::fs::write(dir.path().join("bridge"), &bridge);
        let file = conf_dir.join("10-petrel-kit.conflist");
        std::fs::write(
            &file,
            conflist(
                &format!("petrel-kit-{n}"),
                &bridge,
                &subnet,
                &dir.path().join("leases").display().to_string(),
            ),
        )
        .map_err(|e| KitError::io("write", &file, e))?;
        Ok(PodNetwork {
            dir,
            conf_dir,
            bin_dir,
            bridge,
            subnet,
        })
    }

    /// The network's own directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// The network's conflist: bridge (gateway on the host, hairpin so a pod
/// reaches its own host port) + portmap (with SNAT, for 127.0.0.1).
pub fn conflist(name: &str, bridge: &str, subnet: &str, leases: &str) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"{name}","plugins":[
  {{"type":"bridge","bridge":"{bridge}","isGateway":true,"ipMasq":false,"hairpinMode":true,
    "ipam":{{"type":"host-local","dataDir":"{leases}","ranges":[[{{"subnet":"{subnet}"}}]],"routes":[{{"dst":"0.0.0.0/0"}}]}}}},
  {{"type":"portmap","capabilities":{{"portMappings":true}},"snat":true}}]}}
"#
    )
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
