//! Eviction configuration in kubelet's syntax: the flags
//! (`--eviction-hard memory.available<100Mi,nodefs.available<10%`,
//! `--eviction-soft-grace-period memory.available=1m30s`, ...) and the same
//! settings in the config file's `[agent.eviction]` table, where each map
//! may be written in flag syntax or as a TOML table. Every value is checked
//! when it is read, and [`EvictionSettings::thresholds`] checks how they fit
//! together, so bad input stops the agent at start-up with the flag and the
//! value named.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::signals::Signal;
use crate::quantity;

/// A threshold's amount: an absolute quantity (bytes, inodes, pids) or a
/// fraction of the capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// An absolute amount.
    Quantity(i64),
    /// A fraction of the capacity, `0.0..=1.0` (written `10%`).
    Percentage(f64),
}

impl ThresholdValue {
    /// The amount for a resource of `capacity`.
    pub fn amount(self, capacity: i64) -> i64 {
        match self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::Percentage(p) => (capacity.max(0) as f64 * p).round() as i64,
        }
    }
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThresholdValue::Quantity(q) => write!(f, "{q}"),
            ThresholdValue::Percentage(p) => write!(f, "{}%", p * 100.0),
        }
    }
}

/// Parses a percentage such as `10%` or `7.5%` into a fraction.
fn percentage(s: &str) -> Option<Result<f64, String>> {
    let num = s.strip_suffix('%')?;
    Some(match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v / 100.0),
        _ => Err(format!("invalid percentage {s:?}")),
    })
}

/// A threshold value of `--eviction-hard`/`--eviction-soft`: a positive
/// quantity, or a percentage in (0%, 100%). As in kubelet, `0%` and `100%`
/// switch the signal's threshold off (they are how a default is disabled).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThresholdSpec(pub Option<ThresholdValue>);

impl FromStr for ThresholdSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(p) = percentage(s) {
            let p = p?;
            if p == 0.0 || p == 1.0 {
                return Ok(ThresholdSpec(None));
            }
            if p < 0.0 {
                return Err(format!("percentage {s} must not be negative"));
            }
            if p > 1.0 {
                return Err(format!("percentage {s} must not exceed 100%"));
            }
            return Ok(ThresholdSpec(Some(ThresholdValue::Percentage(p))));
        }
        if s.starts_with('-') {
            return Err(format!("threshold {s} must be positive"));
        }
        let q = quantity::bytes(s).map_err(|e| e.to_string())?;
        if q <= 0 {
            return Err(format!("threshold {s} must be positive"));
        }
        Ok(ThresholdSpec(Some(ThresholdValue::Quantity(q))))
    }
}

/// A value of `--eviction-minimum-reclaim`: a quantity of zero or more, or
/// a percentage in (0%, 100%].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinReclaim(pub ThresholdValue);

impl FromStr for MinReclaim {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Some(p) = percentage(s) {
            let p = p?;
            if p <= 0.0 {
                return Err(format!("minimum reclaim {s} must be positive"));
            }
            if p > 1.0 {
                return Err(format!("minimum reclaim {s} must not exceed 100%"));
            }
            return Ok(MinReclaim(ThresholdValue::Percentage(p)));
        }
        if s.starts_with('-') {
            return Err(format!("minimum reclaim {s} must not be negative"));
        }
        let q = quantity::bytes(s).map_err(|e| e.to_string())?;
        Ok(MinReclaim(ThresholdValue::Quantity(q)))
    }
}

/// A value of `--eviction-soft-grace-period`: a Go duration (`1m30s`,
/// `90s`, `1.5h`), zero or more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GracePeriod(pub Duration);

impl FromStr for GracePeriod {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_go_duration(s).map(GracePeriod)
    }
}

/// Parses a Go duration: one or more `<number><unit>` with units `ns`,
/// `us`, `µs`, `ms`, `s`, `m`, `h` (`1m30s`, `2.5s`), or a bare `0`.
/// Negative durations are refused: no grace period can be.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let bad = || format!("invalid duration {s:?}: expected e.g. 30s, 1m30s, 2h");
    if t.starts_with('-') {
        return Err(format!("invalid duration {s:?}: must not be negative"));
    }
    let t = t.strip_prefix('+').unwrap_or(t);
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(bad());
    }
    let mut rest = t;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, after) = rest.split_at(num_len);
        let n: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = next;
    }
    if !total.is_finite() {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

/// A map from signal to value, written as in kubelet's flags:
/// `memory.available<100Mi,nodefs.available<10%` (thresholds) or
/// `memory.available=1m30s` (grace periods, minimum reclaims). Each signal
/// appears at most once.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalMap<T>(pub Vec<(Signal, T)>);

impl<T> Default for SignalMap<T> {
    fn default() -> Self {
        SignalMap(Vec::new())
    }
}

impl<T: Copy> SignalMap<T> {
    /// The value of `signal`, if set.
    pub fn get(&self, signal: Signal) -> Option<T> {
        self.0.iter().find(|(s, _)| *s == signal).map(|(_, v)| *v)
    }
}

/// How the values of a [`SignalMap`] are separated from their signal.
pub trait MapSyntax: FromStr<Err = String> {
    /// `<` for thresholds, `=` for the others.
    const SEPARATOR: char;
}

impl MapSyntax for ThresholdSpec {
    const SEPARATOR: char = '<';
}
impl MapSyntax for MinReclaim {
    const SEPARATOR: char = '=';
}
impl MapSyntax for GracePeriod {
    const SEPARATOR: char = '=';
}

impl<T: MapSyntax> SignalMap<T> {
    fn from_pairs<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> Result<Self, String> {
        let mut out: Vec<(Signal, T)> = Vec::new();
        for (k, v) in pairs {
            let signal: Signal = k
                .trim()
                .parse()
                .map_err(|e: super::UnknownSignal| e.to_string())?;
            if out.iter().any(|(s, _)| *s == signal) {
                return Err(format!("signal {signal} is given twice"));
            }
            let value = v
                .trim()
                .parse::<T>()
                .map_err(|e| format!("{signal}: {e}"))?;
            out.push((signal, value));
        }
        Ok(SignalMap(out))
    }
}

impl<T: MapSyntax> FromStr for SignalMap<T> {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut pairs = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item.split_once(T::SEPARATOR).ok_or_else(|| {
                format!(
                    "{item:?} is not of the form <signal>{}<value>",
                    T::SEPARATOR
                )
            })?;
            pairs.push((k, v));
        }
        Self::from_pairs(pairs.into_iter())
    }
}

impl<'de, T: MapSyntax> Deserialize<'de> for SignalMap<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(String),
            Table(BTreeMap<String, String>),
        }
        let parsed = match Raw::deserialize(d)? {
            Raw::Flag(s) => s.parse::<Self>(),
            Raw::Table(m) => Self::from_pairs(m.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        };
        parsed.map_err(serde::de::Error::custom)
    }
}

/// `--kube-reserved`/`--system-reserved`: `cpu=100m,memory=1Gi,
/// ephemeral-storage=1Gi,pid=1000` (or a TOML table with those keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Millicores.
    pub cpu_millis: i64,
    /// Bytes of memory.
    pub memory: i64,
    /// Bytes of ephemeral storage.
    pub ephemeral_storage: i64,
    /// Process ids.
    pub pid: i64,
}

impl Reserved {
    fn from_pairs<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> Result<Self, String> {
        let mut r = Reserved::default();
        for (k, v) in pairs {
            let (k, v) = (k.trim(), v.trim());
            let amount = |parse: fn(&str) -> Result<i64, quantity::QuantityError>| {
                parse(v).map_err(|e| format!("{k}: {e}"))
            };
            match k {
                "cpu" => r.cpu_millis = amount(quantity::cpu_millis)?,
                "memory" => r.memory = amount(quantity::bytes)?,
                "ephemeral-storage" => r.ephemeral_storage = amount(quantity::bytes)?,
                "pid" => r.pid = amount(quantity::bytes)?,
                other => {
                    return Err(format!(
                        "unknown resource {other:?}: expected cpu, memory, ephemeral-storage or pid"
                    ))
                }
            }
        }
        Ok(r)
    }

    /// The sum of two reservations.
    pub fn plus(self, o: Reserved) -> Reserved {
        Reserved {
            cpu_millis: self.cpu_millis.saturating_add(o.cpu_millis),
            memory: self.memory.saturating_add(o.memory),
            ephemeral_storage: self.ephemeral_storage.saturating_add(o.ephemeral_storage),
            pid: self.pid.saturating_add(o.pid),
        }
    }
}

impl FromStr for Reserved {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut pairs = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?} is not of the form <resource>=<quantity>"))?;
            pairs.push((k, v));
        }
        Self::from_pairs(pairs.into_iter())
    }
}

impl<'de> Deserialize<'de> for Reserved {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(String),
            Table(BTreeMap<String, String>),
        }
        match Raw::deserialize(d)? {
            Raw::Flag(s) => s.parse(),
            Raw::Table(m) => Self::from_pairs(m.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// The eviction settings: `[agent.eviction]` in the config file, each
/// overridden by its `--eviction-*` flag. Defaults are kubelet's.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvictionSettings {
    /// `--eviction-hard`. kubelet's default: memory.available<100Mi,
    /// nodefs.available<10%, nodefs.inodesFree<5%, imagefs.available<15%.
    /// Setting it replaces the whole default (as kubelet does); `0%`
    /// switches a signal off.
    pub hard: SignalMap<ThresholdSpec>,
    /// `--eviction-soft` (none by default).
    pub soft: SignalMap<ThresholdSpec>,
    /// `--eviction-soft-grace-period`: one per soft threshold.
    pub soft_grace_period: SignalMap<GracePeriod>,
    /// `--eviction-minimum-reclaim` (none by default).
    pub minimum_reclaim: SignalMap<MinReclaim>,
    /// `--eviction-pressure-transition-period` (5 min): how long a
    /// pressure condition stays true after its threshold was last met.
    #[serde(deserialize_with = "go_duration")]
    pub pressure_transition_period: Duration,
    /// `--eviction-max-pod-grace-period` in seconds (0): the most a pod
    /// evicted for a soft threshold is given to stop; 0 or less gives it
    /// its own terminationGracePeriodSeconds.
    pub max_pod_grace_period: i64,
    /// `--eviction-monitoring-interval` (10 s, kubelet's housekeeping
    /// period): the pass period when no notification comes.
    #[serde(deserialize_with = "go_duration")]
    pub monitoring_interval: Duration,
    /// `--eviction-notifications` (true): react to memory cgroup threshold
    /// events (v1) or PSI triggers (v2) instead of only polling.
    pub notifications: bool,
    /// `--kube-reserved`.
    pub kube_reserved: Reserved,
    /// `--system-reserved`.
    pub system_reserved: Reserved,
}

fn go_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse_go_duration(&s).map_err(serde::de::Error::custom)
}

impl Default for EvictionSettings {
    fn default() -> Self {
        let hard = [
            (Signal::MemoryAvailable, ThresholdValue::Quantity(100 << 20)),
            (Signal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
            (Signal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
            (Signal::ImageFsAvailable, ThresholdValue::Percentage(0.15)),
        ];
        Self {
            hard: SignalMap(
                hard.into_iter()
                    .map(|(s, v)| (s, ThresholdSpec(Some(v))))
                    .collect(),
            ),
            soft: SignalMap::default(),
            soft_grace_period: SignalMap::default(),
            minimum_reclaim: SignalMap::default(),
            pressure_transition_period: Duration::from_secs(300),
            max_pod_grace_period: 0,
            monitoring_interval: Duration::from_secs(10),
            notifications: true,
            kube_reserved: Reserved::default(),
            system_reserved: Reserved::default(),
        }
    }
}

/// One threshold to enforce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    /// The signal observed.
    pub signal: Signal,
    /// Met when the signal's available amount is below this.
    pub value: ThresholdValue,
    /// How long it must be met before pods are evicted (zero for hard
    /// thresholds).
    pub grace_period: Duration,
    /// Once met, it is resolved only when this much more is available.
    pub min_reclaim: Option<ThresholdValue>,
    /// Hard (evict at once, grace 1 s) or soft.
    pub hard: bool,
}

/// Settings that contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvictionConfigError {
    /// A soft threshold without a grace period.
    #[error("--eviction-soft {signal}: a soft threshold needs a grace period in --eviction-soft-grace-period")]
    SoftWithoutGrace {
        /// The signal.
        signal: Signal,
    },
    /// A grace period for a signal without a soft threshold.
    #[error(
        "--eviction-soft-grace-period {signal}={period:?}: there is no soft threshold for {signal}"
    )]
    GraceWithoutSoft {
        /// The signal.
        signal: Signal,
        /// The grace period given.
        period: Duration,
    },
    /// The pass period is too short.
    #[error("--eviction-monitoring-interval {0:?}: must be at least 100ms")]
    Interval(Duration),
    /// The node cgroup is not an absolute, plain cgroup path.
    #[error("--node-cgroup {0:?}: must be an absolute cgroup path below the root, without . or .. components")]
    NodeCgroup(String),
}

impl EvictionSettings {
    /// The thresholds to enforce: hard ones, soft ones with their grace
    /// periods, each with its minimum reclaim; plus, as kubelet does when
    /// node allocatable is enforced on the pods' cgroup, an
    /// allocatableMemory.available threshold equal to the hard
    /// memory.available one.
    pub fn thresholds(&self) -> Result<Vec<Threshold>, EvictionConfigError> {
        if self.monitoring_interval < Duration::from_millis(100) {
            return Err(EvictionConfigError::Interval(self.monitoring_interval));
        }
        for (signal, period) in &self.soft_grace_period.0 {
            if self.soft.get(*signal).is_none() {
                return Err(EvictionConfigError::GraceWithoutSoft {
                    signal: *signal,
                    period: period.0,
                });
            }
        }
        let mut out = Vec::new();
        let min_reclaim = |s: Signal| self.minimum_reclaim.get(s).map(|m| m.0);
        for (signal, spec) in &self.hard.0 {
            let Some(value) = spec.0 else { continue };
            out.push(Threshold {
                signal: *signal,
                value,
                grace_period: Duration::ZERO,
                min_reclaim: min_reclaim(*signal),
                hard: true,
            });
            if *signal == Signal::MemoryAvailable
                && self.hard.get(Signal::AllocatableMemoryAvailable).is_none()
            {
                out.push(Threshold {
                    signal: Signal::AllocatableMemoryAvailable,
                    value,
                    grace_period: Duration::ZERO,
                    min_reclaim: min_reclaim(*signal),
                    hard: true,
                });
            }
        }
        for (signal, spec) in &self.soft.0 {
            let grace = self
                .soft_grace_period
                .get(*signal)
                .ok_or(EvictionConfigError::SoftWithoutGrace { signal: *signal })?;
            let Some(value) = spec.0 else { continue };
            out.push(Threshold {
                signal: *signal,
                value,
                grace_period: grace.0,
                min_reclaim: min_reclaim(*signal),
                hard: false,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn thresholds(s: &str) -> Result<SignalMap<ThresholdSpec>, String> {
        s.parse()
    }

    #[test]
    fn thresholds_should_parse_kubelet_syntax() {
        let m =
            thresholds(" memory.available<100Mi, nodefs.available<10%,pid.available<1k").unwrap();
        assert_eq!(
            m.get(Signal::MemoryAvailable),
            Some(ThresholdSpec(Some(ThresholdValue::Quantity(100 << 20))))
        );
        assert_eq!(
            m.get(Signal::NodeFsAvailable),
            Some(ThresholdSpec(Some(ThresholdValue::Percentage(0.10))))
        );
        assert_eq!(
            m.get(Signal::PidAvailable),
            Some(ThresholdSpec(Some(ThresholdValue::Quantity(1000))))
        );
        assert_eq!(thresholds("").unwrap(), SignalMap::default());
    }

    #[test]
    fn thresholds_should_treat_zero_and_full_percentages_as_off() {
        let m = thresholds("memory.available<0%,nodefs.available<100%").unwrap();
        assert_eq!(m.get(Signal::MemoryAvailable), Some(ThresholdSpec(None)));
        assert_eq!(m.get(Signal::NodeFsAvailable), Some(ThresholdSpec(None)));
    }

    #[test]
    fn thresholds_should_reject_bad_input_naming_it() {
        for (input, needle) in [
            ("memory.avail<1Mi", "memory.avail"),
            ("memory.available>1Mi", "memory.available>1Mi"),
            ("memory.available=1Mi", "memory.available=1Mi"),
            ("memory.available<0", "must be positive"),
            ("memory.available<-1Mi", "must be positive"),
            ("memory.available<1Xi", "1Xi"),
            ("nodefs.available<101%", "100%"),
            ("nodefs.available<-5%", "negative"),
            ("nodefs.available<abc%", "abc%"),
            ("memory.available<1Mi,memory.available<2Mi", "twice"),
        ] {
            let e = thresholds(input).unwrap_err();
            assert!(e.contains(needle), "{input}: {e}");
        }
    }

    #[test]
    fn go_durations_should_parse_compound_values() {
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "10", "1d", "-1s", "m", "1m30", "s1"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn min_reclaim_should_allow_zero_quantities_but_not_zero_percent() {
        let m: SignalMap<MinReclaim> = "memory.available=0Mi,nodefs.available=5%".parse().unwrap();
        assert_eq!(
            m.get(Signal::MemoryAvailable),
            Some(MinReclaim(ThresholdValue::Quantity(0)))
        );
        assert!("nodefs.available=0%"
            .parse::<SignalMap<MinReclaim>>()
            .is_err());
        assert!("nodefs.available=-1Gi"
            .parse::<SignalMap<MinReclaim>>()
            .is_err());
        assert!("nodefs.available<1Gi"
            .parse::<SignalMap<MinReclaim>>()
            .is_err());
    }

    #[test]
    fn reserved_should_parse_known_resources_only() {
        let r: Reserved = "cpu=100m,memory=1Gi,ephemeral-storage=2Gi,pid=100"
            .parse()
            .unwrap();
        assert_eq!(
            r,
            Reserved {
                cpu_millis: 100,
                memory: 1 << 30,
                ephemeral_storage: 2 << 30,
                pid: 100
            }
        );
        assert!("gpu=1".parse::<Reserved>().is_err());
        assert!("memory".parse::<Reserved>().is_err());
        assert!("memory=lots".parse::<Reserved>().is_err());
    }

    #[test]
    fn defaults_should_be_kubelets() {
        let t = EvictionSettings::default().thresholds().unwrap();
        let names: Vec<String> = t
            .iter()
            .map(|t| format!("{}<{}", t.signal, t.value))
            .collect();
        assert_eq!(
            names,
            [
                "memory.available<104857600",
                "allocatableMemory.available<104857600",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%",
                "imagefs.available<15%",
            ]
        );
        assert!(t.iter().all(|t| t.hard && t.grace_period.is_zero()));
        assert_eq!(
            EvictionSettings::default().pressure_transition_period,
            Duration::from_secs(300)
        );
    }

    #[test]
    fn soft_thresholds_should_need_a_grace_period_each() {
        let mut s = EvictionSettings {
            soft: "memory.available<1Gi".parse().unwrap(),
            ..Default::default()
        };
        let e = s.thresholds().unwrap_err();
        assert!(
            e.to_string().contains("--eviction-soft memory.available"),
            "{e}"
        );
        s.soft_grace_period = "memory.available=1m".parse().unwrap();
        let t = s.thresholds().unwrap();
        let soft = t.iter().find(|t| !t.hard).unwrap();
        assert_eq!(soft.grace_period, Duration::from_secs(60));
        s.soft_grace_period = "memory.available=1m,nodefs.available=1m".parse().unwrap();
        let e = s.thresholds().unwrap_err();
        assert!(e.to_string().contains("nodefs.available"), "{e}");
    }

    #[test]
    fn config_file_should_take_flag_syntax_or_tables() {
        #[derive(Deserialize)]
        struct File {
            eviction: EvictionSettings,
        }
        let f: File = toml::from_str(
            "[eviction]\nhard = \"memory.available<200Mi\"\nsoft = { \"memory.available\" = \"1Gi\" }\n\
             soft_grace_period = \"memory.available=30s\"\npressure_transition_period = \"1m\"\n\
             kube_reserved = { memory = \"100Mi\" }\n",
        )
        .unwrap();
        let e = f.eviction;
        assert_eq!(
            e.hard.get(Signal::MemoryAvailable),
            Some(ThresholdSpec(Some(ThresholdValue::Quantity(200 << 20))))
        );
        assert_eq!(e.hard.get(Signal::NodeFsAvailable), None);
        assert_eq!(e.pressure_transition_period, Duration::from_secs(60));
        assert_eq!(e.kube_reserved.memory, 100 << 20);
        assert_eq!(e.thresholds().unwrap().len(), 3);
        let err = toml::from_str::<File>("[eviction]\nhard = \"memory.available<lots\"\n")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("hard") && err.contains("lots"), "{err}");
    }

    #[test]
    fn percentages_should_scale_with_capacity() {
        assert_eq!(ThresholdValue::Percentage(0.1).amount(1000), 100);
        assert_eq!(ThresholdValue::Quantity(5).amount(1000), 5);
    }
}
