//! Running plugins: the environment and stdin the CNI specification
//! defines, the result or error on stdout, the chain for ADD, DEL and CHECK.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;

use crate::config::NetworkList;
use crate::error::CniError;
use crate::result::AddResult;

/// A port mapping as the `portMappings` capability carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortMapping {
    /// The port on the host.
    pub host_port: u16,
    /// The port in the pod.
    pub container_port: u16,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// The host address to bind (empty: all).
    #[serde(rename = "hostIP", skip_serializing_if = "String::is_empty")]
    pub host_ip: String,
}

/// The pod's DNS settings as the `dns` capability carries them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DnsCapability {
    /// Name servers.
    pub servers: Vec<String>,
    /// Search domains.
    pub searches: Vec<String>,
    /// resolv.conf options.
    pub options: Vec<String>,
}

/// One container (pod) attached to a network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachment {
    /// The id plugins key their state by (the pod sandbox's id).
    pub container_id: String,
    /// The network namespace; `None` when it is gone (DEL still runs, so
    /// that addresses and host-side rules are released).
    pub netns: Option<PathBuf>,
    /// The interface name in the namespace (`eth0`).
    pub ifname: String,
    /// `CNI_ARGS` pairs (`K8S_POD_NAME`, ...). Pairs containing `;` or `=`
    /// are left out, since they cannot be encoded.
    pub args: Vec<(String, String)>,
    /// The `portMappings` capability.
    pub port_mappings: Vec<PortMapping>,
    /// The `dns` capability.
    pub dns: Option<DnsCapability>,
}

/// Finds and runs plugin binaries.
#[derive(Debug, Clone)]
pub struct PluginRunner {
    bin_dirs: Vec<PathBuf>,
    timeout: Duration,
}

#[derive(Debug, Clone, Copy)]
enum Command {
    Add,
    Del,
    Check,
}

impl Command {
    fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
        }
    }
}

impl PluginRunner {
    /// Plugins are looked up in `bin_dirs` in order; each run may take at
    /// most `timeout` before it is killed.
    pub fn new(bin_dirs: Vec<PathBuf>, timeout: Duration) -> Self {
        Self { bin_dirs, timeout }
    }

    fn cni_path(&self) -> String {
        self.bin_dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    fn find(&self, plugin: &str) -> Result<PathBuf, CniError> {
        self.bin_dirs
            .iter()
            .map(|d| d.join(plugin))
            .find(|p| p.is_file())
            .ok_or_else(|| CniError::PluginNotFound {
                plugin: plugin.to_string(),
                dirs: self.cni_path(),
            })
    }

    /// Runs one plugin and returns what it printed on success.
    async fn run(
        &self,
        plugin: &str,
        command: Command,
        att: &Attachment,
        stdin: Vec<u8>,
    ) -> Result<Vec<u8>, CniError> {
        let binary = self.find(plugin)?;
        let exec_err = |source| CniError::Exec {
            plugin: plugin.to_string(),
            source,
        };
        let netns = att
            .netns
            .as_deref()
            .filter(|p| p.exists())
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let mut child = tokio::process::Command::new(&binary)
            .env("CNI_COMMAND", command.as_str())
            .env("CNI_CONTAINERID", &att.container_id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", &att.ifname)
            .env("CNI_ARGS", cni_args(&att.args))
            .env("CNI_PATH", self.cni_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(exec_err)?;
        if let Some(mut input) = child.stdin.take() {
            // A plugin that exits without reading its config closes the
            // pipe; its exit status tells what happened.
            let _ = input.write_all(&stdin).await;
        }
        let out = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(r) => r.map_err(exec_err)?,
            Err(_) => {
                return Err(CniError::Timeout {
                    plugin: plugin.to_string(),
                    command: command.as_str(),
                    seconds: self.timeout.as_secs(),
                })
            }
        };
        if out.status.success() {
            return Ok(out.stdout);
        }
        Err(CniError::Plugin {
            plugin: plugin.to_string(),
            command: command.as_str(),
            message: plugin_message(&out.stdout, &out.stderr, out.status),
        })
    }
}

/// `CNI_ARGS`: `IgnoreUnknown=1;K=V;...`.
fn cni_args(args: &[(String, String)]) -> String {
    let mut s = String::from("IgnoreUnknown=1");
    for (k, v) in args {
        if k.is_empty() || [k, v].iter().any(|x| x.contains([';', '='])) {
            tracing::debug!(key = %k, "CNI argument left out: it cannot be encoded");
            continue;
        }
        s.push(';');
        s.push_str(k);
        s.push('=');
        s.push_str(v);
    }
    s
}

/// The error a failed plugin reported: the `msg` and `details` of its JSON
/// error on stdout, else whatever it printed.
fn plugin_message(stdout: &[u8], stderr: &[u8], status: std::process::ExitStatus) -> String {
    if let Ok(Value::Object(err)) = serde_json::from_slice::<Value>(stdout) {
        let msg = err.get("msg").and_then(Value::as_str).unwrap_or_default();
        let details = err
            .get("details")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !msg.is_empty() {
            return if details.is_empty() {
                msg.to_string()
            } else {
                format!("{msg}: {details}")
            };
        }
    }
    let text = [stdout, stderr]
        .iter()
        .map(|b| String::from_utf8_lossy(b).trim().to_string())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if text.is_empty() {
        format!("exited with {status}")
    } else {
        format!("{text} ({status})")
    }
}

impl NetworkList {
    /// The configuration one plugin reads on stdin: its object with the
    /// list's name and version, the previous result and the runtime
    /// capabilities it declares.
    fn plugin_config(
        &self,
        plugin: &Map<String, Value>,
        prev: Option<&Value>,
        att: &Attachment,
    ) -> Vec<u8> {
        let mut conf = plugin.clone();
        conf.insert("name".into(), Value::String(self.name.clone()));
        conf.insert("cniVersion".into(), Value::String(self.cni_version.clone()));
        if let Some(prev) = prev {
            conf.insert("prevResult".into(), prev.clone());
        } else {
            conf.remove("prevResult");
        }
        let declared = |cap: &str| {
            plugin
                .get("capabilities")
                .and_then(|c| c.get(cap))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        let mut runtime = Map::new();
        if declared("portMappings") && !att.port_mappings.is_empty() {
            runtime.insert("portMappings".into(), to_value(&att.port_mappings));
        }
        if let Some(dns) = att.dns.as_ref().filter(|_| declared("dns")) {
            runtime.insert("dns".into(), to_value(dns));
        }
        if !runtime.is_empty() {
            conf.insert("runtimeConfig".into(), Value::Object(runtime));
        }
        Value::Object(conf).to_string().into_bytes()
    }

    /// ADD: runs the plugins in order, each given the previous one's
    /// result, and returns the last result. On failure the caller runs
    /// [`NetworkList::del`] to release what the first plugins made.
    pub async fn add(
        &self,
        runner: &PluginRunner,
        att: &Attachment,
    ) -> Result<AddResult, CniError> {
        let mut prev: Option<(String, Value)> = None;
        for plugin in &self.plugins {
            let ty = plugin_type(plugin);
            let conf = self.plugin_config(plugin, prev.as_ref().map(|(_, v)| v), att);
            let out = runner.run(ty, Command::Add, att, conf).await?;
            let value: Value = serde_json::from_slice(&out).map_err(|e| CniError::BadResult {
                plugin: ty.to_string(),
                reason: e.to_string(),
            })?;
            prev = Some((ty.to_string(), value));
        }
        let (ty, value) = prev.ok_or_else(|| CniError::InvalidConfig {
            file: self.source.clone(),
            reason: "the list has no plugins".into(),
        })?;
        AddResult::parse(&ty, &self.cni_version, value)
    }

    /// DEL: runs the plugins in reverse order with the result of the ADD
    /// (when known and the version allows it). Every plugin runs even when
    /// one fails, so that as much as possible is released; the first
    /// failure is returned. Deleting twice is harmless, as the
    /// specification asks of plugins.
    pub async fn del(
        &self,
        runner: &PluginRunner,
        att: &Attachment,
        prev: Option<&Value>,
    ) -> Result<(), CniError> {
        let prev = prev.filter(|_| self.has_check());
        let mut first = None;
        for plugin in self.plugins.iter().rev() {
            let conf = self.plugin_config(plugin, prev, att);
            if let Err(e) = runner
                .run(plugin_type(plugin), Command::Del, att, conf)
                .await
            {
                tracing::warn!(container.id = %att.container_id, error = %e, "CNI DEL failed");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// CHECK: asks each plugin whether what ADD made is still in place.
    /// Returns `Ok(false)` when the list's version has no CHECK or the list
    /// disables it (nothing was checked), `Ok(true)` when all plugins agree.
    pub async fn check(
        &self,
        runner: &PluginRunner,
        att: &Attachment,
        prev: &Value,
    ) -> Result<bool, CniError> {
        if !self.has_check() || self.disable_check {
            return Ok(false);
        }
        for plugin in &self.plugins {
            let conf = self.plugin_config(plugin, Some(prev), att);
            runner
                .run(plugin_type(plugin), Command::Check, att, conf)
                .await?;
        }
        Ok(true)
    }
}

fn plugin_type(plugin: &Map<String, Value>) -> &str {
    plugin
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str) -> NetworkList {
        NetworkList::parse(Path::new("test.conflist"), text.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn conf_of(list: &NetworkList, i: usize, prev: Option<&Value>, att: &Attachment) -> Value {
        serde_json::from_slice(&list.plugin_config(&list.plugins[i], prev, att))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn plugin_config_should_inject_name_version_prev_result_and_declared_capabilities() {
        let l = list(
            r#"{"cniVersion":"1.0.0","name":"net","plugins":[
                {"type":"bridge","bridge":"br0"},
                {"type":"portmap","capabilities":{"portMappings":true}}]}"#,
        );
        let att = Attachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            port_mappings: vec![PortMapping {
                host_port: 8080,
                container_port: 80,
                protocol: "tcp".into(),
                host_ip: String::new(),
            }],
            dns: Some(DnsCapability::default()),
            ..Default::default()
        };
        let first = conf_of(&l, 0, None, &att);
        assert_eq!(first["name"], "net");
        assert_eq!(first["cniVersion"], "1.0.0");
        assert_eq!(first["bridge"], "br0");
        assert!(first.get("prevResult").is_none());
        assert!(
            first.get("runtimeConfig").is_none(),
            "bridge declares no capability"
        );
        let prev = serde_json::json!({"cniVersion":"1.0.0","ips":[]});
        let second = conf_of(&l, 1, Some(&prev), &att);
        assert_eq!(second["prevResult"], prev);
        assert_eq!(
            second["runtimeConfig"]["portMappings"],
            serde_json::json!([{"hostPort":8080,"containerPort":80,"protocol":"tcp"}])
        );
        assert!(
            second["runtimeConfig"].get("dns").is_none(),
            "dns not declared"
        );
    }

    #[test]
    fn cni_args_should_leave_out_what_cannot_be_encoded() {
        let args = vec![
            ("K8S_POD_NAME".to_string(), "web".to_string()),
            ("K8S_POD_NAMESPACE".to_string(), "a;b".to_string()),
        ];
        assert_eq!(cni_args(&args), "IgnoreUnknown=1;K8S_POD_NAME=web");
    }

    #[test]
    fn plugin_message_should_prefer_the_json_error() {
        let status = std::process::ExitStatus::default();
        assert_eq!(
            plugin_message(
                br#"{"code":7,"msg":"no IP","details":"range full"}"#,
                b"",
                status
            ),
            "no IP: range full"
        );
        assert!(plugin_message(b"", b"panic: boom\n", status).starts_with("panic: boom"));
    }

    /// A named network namespace made with `ip netns`, deleted on drop.
    struct NetNs(String);
    impl NetNs {
        fn new() -> Self {
            let name = format!("petrel-cni-unit-{}", std::process::id());
            let ok = std::process::Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip netns add {name}");
            Self(name)
        }
        fn path(&self) -> PathBuf {
            PathBuf::from("/run/netns").join(&self.0)
        }
    }
    impl Drop for NetNs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "delete", &self.0])
                .status();
        }
    }

    /// Runs the real loopback plugin of Debian's containernetworking-plugins
    /// (installed by `make deps`) in a fresh network namespace: ADD, CHECK
    /// and DEL through the chain, and the errors when things are missing.
    #[tokio::test]
    async fn chain_should_run_a_real_plugin() -> Result<(), CniError> {
        let bin = PathBuf::from("/usr/lib/cni");
        let runner = PluginRunner::new(
            vec![PathBuf::from("/nonexistent"), bin],
            Duration::from_secs(30),
        );
        let l = list(r#"{"cniVersion":"1.0.0","name":"lo","plugins":[{"type":"loopback"}]}"#);
        let mut att = Attachment {
            container_id: "petrel-cni-unit".into(),
            netns: None,
            ifname: "lo".into(),
            ..Default::default()
        };
        // Without a namespace ADD fails with the plugin's own message.
        match l.add(&runner, &att).await {
            Err(CniError::Plugin {
                plugin,
                command,
                message,
            }) => {
                assert_eq!((plugin.as_str(), command), ("loopback", "ADD"));
                assert!(!message.is_empty());
            }
            other => panic!("ADD without netns: {other:?}"),
        }
        let ns = NetNs::new();
        att.netns = Some(ns.path());
        let result = l.add(&runner, &att).await?;
        let ips: Vec<String> = result.ips.iter().map(|ip| ip.address.to_string()).collect();
        assert!(ips.contains(&"127.0.0.1".to_string()), "{result:?}");
        assert!(l.check(&runner, &att, &result.raw).await?);
        l.del(&runner, &att, Some(&result.raw)).await?;
        // DEL again, and DEL once the namespace is gone, are harmless.
        l.del(&runner, &att, Some(&result.raw)).await?;
        drop(ns);
        l.del(&runner, &att, Some(&result.raw)).await?;
        let missing =
            list(r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"no-such-plugin"}]}"#);
        match missing.add(&runner, &att).await {
            Err(e @ CniError::PluginNotFound { .. }) => {
                assert!(e.to_string().contains("/nonexistent:/usr/lib/cni"), "{e}");
            }
            other => panic!("missing plugin: {other:?}"),
        }
        Ok(())
    }
}
