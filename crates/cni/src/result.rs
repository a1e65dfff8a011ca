//! The result of ADD: the addresses given to the pod.

use std::net::IpAddr;

use serde_json::Value;

use crate::config::parse_version;
use crate::error::CniError;

/// One address of the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    /// The address.
    pub address: IpAddr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// The gateway, when the plugin gave one.
    pub gateway: Option<IpAddr>,
    /// The name of the interface it belongs to, when the result says.
    pub interface: Option<String>,
    /// Whether that interface is inside the pod (`sandbox` set).
    pub in_sandbox: bool,
}

/// What the last plugin of an ADD returned.
#[derive(Debug, Clone, PartialEq)]
pub struct AddResult {
    /// The addresses, in the plugin's order.
    pub ips: Vec<IpConfig>,
    /// The result as the plugin wrote it: stored with the pod and given
    /// back as `prevResult` to DEL and CHECK.
    pub raw: Value,
}

impl AddResult {
    /// Reads a result of `version` (0.1.0 and 0.2.0 have `ip4`/`ip6`;
    /// later versions `interfaces` and `ips`).
    pub(crate) fn parse(plugin: &str, version: &str, raw: Value) -> Result<Self, CniError> {
        let bad = |reason: String| CniError::BadResult {
            plugin: plugin.to_string(),
            reason,
        };
        let legacy = parse_version(version).is_some_and(|v| v < (0, 3, 0));
        let mut ips = Vec::new();
        if legacy {
            for key in ["ip4", "ip6"] {
                if let Some(ip) = raw.get(key) {
                    let cidr = ip.get("ip").and_then(Value::as_str).unwrap_or_default();
                    let (address, prefix_len) = parse_cidr(cidr).map_err(bad)?;
                    ips.push(IpConfig {
                        address,
                        prefix_len,
                        gateway: parse_gateway(ip).map_err(bad)?,
                        interface: None,
                        in_sandbox: true,
                    });
                }
            }
        } else {
            let interfaces = raw
                .get("interfaces")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (i, ip) in raw
                .get("ips")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let cidr = ip
                    .get("address")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let (address, prefix_len) =
                    parse_cidr(cidr).map_err(|e| bad(format!("ips[{i}]: {e}")))?;
                let iface = ip
                    .get("interface")
                    .and_then(Value::as_u64)
                    .and_then(|n| usize::try_from(n).ok())
                    .and_then(|n| interfaces.get(n));
                ips.push(IpConfig {
                    address,
                    prefix_len,
                    gateway: parse_gateway(ip).map_err(|e| bad(format!("ips[{i}]: {e}")))?,
                    interface: iface
                        .and_then(|f| f.get("name"))
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    in_sandbox: iface.is_none_or(|f| {
                        f.get("sandbox")
                            .and_then(Value::as_str)
                            .is_some_and(|s| !s.is_empty())
                    }),
                });
            }
        }
        Ok(Self { ips, raw })
    }

    /// The pod's addresses on `ifname`: IPv4 first, then IPv6, as CRI
    /// reports them (the first is the pod IP). Addresses of host-side
    /// interfaces and of other interfaces are left out; loopback addresses
    /// too.
    pub fn pod_ips(&self, ifname: &str) -> Vec<IpAddr> {
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for ip in &self.ips {
            let on_if = ip.interface.as_deref().is_none_or(|n| n == ifname);
            if !ip.in_sandbox || !on_if || ip.address.is_loopback() {
                continue;
            }
            match ip.address {
                IpAddr::V4(_) => v4.push(ip.address),
                IpAddr::V6(_) => v6.push(ip.address),
            }
        }
        v4.extend(v6);
        v4
    }
}

fn parse_cidr(cidr: &str) -> Result<(IpAddr, u8), String> {
    let (addr, len) = cidr
        .split_once('/')
        .ok_or_else(|| format!("address {cidr:?} is not in CIDR form"))?;
    let address: IpAddr = addr.parse().map_err(|e| format!("address {cidr:?}: {e}"))?;
    let prefix_len: u8 = len
        .parse()
        .map_err(|e| format!("prefix of {cidr:?}: {e}"))?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    if prefix_len > max {
        return Err(format!("prefix of {cidr:?} is longer than {max}"));
    }
    Ok((address, prefix_len))
}

fn parse_gateway(ip: &Value) -> Result<Option<IpAddr>, String> {
    match ip.get("gateway").and_then(Value::as_str) {
        None | Some("") => Ok(None),
        Some(g) => g
            .parse()
            .map(Some)
            .map_err(|e| format!("gateway {g:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(version: &str, raw: Value) -> AddResult {
        AddResult::parse("bridge", version, raw).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parse_should_read_current_results_and_pick_pod_ips() {
        let r = parse(
            "1.0.0",
            json!({
                "cniVersion": "1.0.0",
                "interfaces": [
                    {"name": "cni0", "mac": "aa:bb:cc:dd:ee:ff"},
                    {"name": "veth1", "mac": "aa:bb:cc:dd:ee:00"},
                    {"name": "eth0", "mac": "aa:bb:cc:dd:ee:01", "sandbox": "/run/x/net"}
                ],
                "ips": [
                    {"interface": 2, "address": "fd00::5/64", "gateway": "fd00::1"},
                    {"interface": 2, "address": "10.88.0.5/16", "gateway": "10.88.0.1"},
                    {"interface": 0, "address": "10.88.0.1/16"}
                ]
            }),
        );
        assert_eq!(r.ips.len(), 3);
        assert_eq!(r.ips[1].prefix_len, 16);
        assert_eq!(r.ips[1].gateway, "10.88.0.1".parse().ok());
        let pod: Vec<String> = r.pod_ips("eth0").iter().map(ToString::to_string).collect();
        assert_eq!(pod, ["10.88.0.5", "fd00::5"]);
        assert!(r.pod_ips("eth1").is_empty());
    }

    #[test]
    fn parse_should_read_legacy_results() {
        let r = parse(
            "0.2.0",
            json!({"ip4": {"ip": "10.1.0.2/24", "gateway": "10.1.0.1"}}),
        );
        assert_eq!(
            r.pod_ips("eth0"),
            ["10.1.0.2"
                .parse::<IpAddr>()
                .unwrap_or(IpAddr::from([0, 0, 0, 0]))]
        );
    }

    #[test]
    fn parse_should_refuse_malformed_addresses() {
        for bad in ["10.0.0.1", "10.0.0.1/33", "x/24", "10.0.0.1/x"] {
            let r = AddResult::parse("p", "1.0.0", json!({"ips": [{"address": bad}]}));
            assert!(matches!(r, Err(CniError::BadResult { .. })), "{bad}: {r:?}");
        }
        let r = AddResult::parse(
            "p",
            "1.0.0",
            json!({"ips": [{"address": "10.0.0.1/8", "gateway": "g"}]}),
        );
        assert!(r.is_err());
    }
}
