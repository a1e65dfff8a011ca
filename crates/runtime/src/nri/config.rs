//! NRI settings: the `[nri]` section of Petrel's config file, with containerd's
//! keys and defaults (`disable`, `disable_connections`, `plugin_path`,
//! `plugin_config_path`, `socket_path`, `plugin_registration_timeout`,
//! `plugin_request_timeout`) plus per-plugin overrides.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use petrel_nri::adaptation::DefaultValidatorConfig;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `[nri]`. NRI is on by default, as in containerd 2.x.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NriConfig {
    /// Turn NRI off: no plugins are launched or accepted, no hook runs.
    pub disable: bool,
    /// Accept no external plugins: the socket is not created; only the
    /// pre-registered plugins of `plugin_path` run.
    pub disable_connections: bool,
    /// Where pre-registered plugins are: executables named `NN-name`.
    pub plugin_path: PathBuf,
    /// Where their configuration is: `NN-name.conf`, else `name.conf`.
    pub plugin_config_path: PathBuf,
    /// The socket external plugins dial (its directory is made 0700).
    pub socket_path: PathBuf,
    /// How long a plugin may take from connecting to registering and
    /// answering Configure and Synchronize (Go duration syntax: `5s`).
    #[serde(with = "go_duration")]
    pub plugin_registration_timeout: Duration,
    /// How long one hook call to a plugin may take (`2s`).
    #[serde(with = "go_duration")]
    pub plugin_request_timeout: Duration,
    /// Per-plugin overrides, keyed by the plugin's name (`logger`) or its
    /// indexed name (`10-logger`); the indexed key wins.
    pub plugins: BTreeMap<String, PluginOverride>,
    /// `[nri.default_validator]`: the built-in validator (off by default;
    /// containerd's option names).
    pub default_validator: DefaultValidatorConfig,
}

/// Settings of one plugin that differ from the section's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PluginOverride {
    /// Its own request timeout.
    #[serde(with = "go_duration_opt")]
    pub request_timeout: Option<Duration>,
    /// A timed-out call fails the CRI call (and disconnects the plugin)
    /// instead of skipping the plugin for that call, which is the default.
    pub timeout_fatal: bool,
    /// Do not launch this pre-registered plugin, and refuse it on the socket.
    pub disable: bool,
}

impl Default for NriConfig {
    fn default() -> Self {
        Self {
            disable: false,
            disable_connections: false,
            plugin_path: PathBuf::from("/opt/nri/plugins"),
            plugin_config_path: PathBuf::from("/etc/nri/conf.d"),
            socket_path: PathBuf::from(petrel_nri::api::DEFAULT_SOCKET_PATH),
            plugin_registration_timeout: Duration::from_secs(5),
            plugin_request_timeout: Duration::from_secs(2),
            plugins: BTreeMap::new(),
            default_validator: DefaultValidatorConfig::default(),
        }
    }
}

impl NriConfig {
    /// The override for plugin `idx`-`name`, if the section has one.
    pub fn plugin(&self, idx: &str, name: &str) -> Option<&PluginOverride> {
        self.plugins
            .get(&format!("{idx}-{name}"))
            .or_else(|| self.plugins.get(name))
    }

    /// The request timeout of plugin `idx`-`name`.
    pub fn request_timeout(&self, idx: &str, name: &str) -> Duration {
        self.plugin(idx, name)
            .and_then(|o| o.request_timeout)
            .unwrap_or(self.plugin_request_timeout)
    }
}

/// Parses Go's duration syntax (`300ms`, `5s`, `1m30s`, `1.5h`): what
/// containerd's configuration uses for these keys.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err("an empty duration".to_string());
    }
    let mut total = 0f64;
    let mut rest = text;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{s:?}: a number without a unit"))?;
        if num_len == 0 {
            return Err(format!("{s:?}: expected a number at {rest:?}"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("{s:?}: {:?} is not a number", &rest[..num_len]))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            u => return Err(format!("{s:?}: unknown unit {u:?} (ns, us, ms, s, m, h)")),
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    if !total.is_finite() || total > 1e9 {
        return Err(format!("{s:?}: out of range"));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way [`parse_duration`] reads it back.
fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}ns", d.as_nanos())
    }
}

mod go_duration {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

mod go_duration_opt {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_should_parse_go_syntax() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "5", "s", "5x", "1..2s", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn config_should_default_like_containerd_and_read_overrides() {
        let c = NriConfig::default();
        assert!(!c.disable);
        assert_eq!(c.socket_path, PathBuf::from("/var/run/nri/nri.sock"));
        assert_eq!(c.plugin_registration_timeout, Duration::from_secs(5));
        assert_eq!(c.plugin_request_timeout, Duration::from_secs(2));

        let c: NriConfig = toml::from_str(
            r#"
            plugin_request_timeout = "500ms"
            [plugins.logger]
            timeout_fatal = true
            [plugins."10-logger"]
            request_timeout = "1s"
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.request_timeout("10", "logger"), Duration::from_secs(1));
        assert_eq!(
            c.request_timeout("20", "logger"),
            Duration::from_millis(500)
        );
        assert!(c.plugin("20", "logger").is_some_and(|o| o.timeout_fatal));
        assert_eq!(c.request_timeout("10", "other"), Duration::from_millis(500));

        let err = toml::from_str::<NriConfig>("plugin_request_timeout = \"2 seconds\"")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("2 seconds"), "{err}");
        assert!(toml::from_str::<NriConfig>("bogus = 1").is_err());
    }

    #[test]
    fn durations_should_round_trip_through_toml() {
        let mut c = NriConfig {
            plugin_request_timeout: Duration::from_millis(1500),
            ..Default::default()
        };
        c.plugins.insert(
            "x".into(),
            PluginOverride {
                request_timeout: Some(Duration::from_millis(20)),
                ..Default::default()
            },
        );
        let text = toml::to_string(&c).unwrap_or_else(|e| panic!("{e}"));
        let back: NriConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, c);
    }
}
