//! The command line: the reference's flags (Go syntax for durations and
//! booleans, so the benchmark passes both controllers the same arguments)
//! plus `--fifo` and `--background-share`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};

/// The PodSet sample controller on Petrel's controller kit.
#[derive(Debug, Clone, Parser)]
#[command(name = "petrel-podset-controller", version)]
pub struct Args {
    /// The kubeconfig (default: $KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Watch only this namespace (all when empty).
    #[arg(long, default_value = "")]
    pub namespace: String,
    /// Elect a leader on a Lease.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value_t = false,
          default_missing_value = "true", action = ArgAction::Set)]
    pub leader_elect: bool,
    /// The Lease's name.
    #[arg(long, default_value = "podset-controller")]
    pub leader_election_id: String,
    /// The Lease's namespace.
    #[arg(long, default_value = "default")]
    pub leader_election_namespace: String,
    /// Lease duration (Go syntax: 15s, 250ms, 1m30s).
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// How long a leader keeps leading without a renewal.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,
    /// How often the leader renews (and a standby retries).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,
    /// Give the Lease up on SIGTERM.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value_t = true,
          default_missing_value = "true", action = ArgAction::Set)]
    pub release_on_cancel: bool,
    /// The informers' resync period.
    #[arg(long, default_value = "10h", value_parser = parse_duration)]
    pub sync_period: Duration,
    /// Concurrent reconciles.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Metrics address (`0`: off; `:8080`: every interface).
    #[arg(long, default_value = "0", value_parser = parse_bind)]
    pub metrics_bind_address: Bind,
    /// `/readyz` and `/healthz` address (`0`: off).
    #[arg(long, default_value = "0", value_parser = parse_bind)]
    pub health_probe_bind_address: Bind,
    /// One FIFO for every event instead of the tiered policy (the
    /// benchmark's FIFO reference).
    #[arg(long)]
    pub fifo: bool,
    /// The share of time background work (initial list, resyncs) may
    /// keep its workers busy, 0.01 to 1 (tiered only): the rest of the
    /// API server's room is left to user changes.
    #[arg(long, default_value_t = 1.0, value_parser = parse_share)]
    pub background_share: f64,
}

/// A share of time: a number in 0.01..=1.
fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.01..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0.01 and 1")),
    }
}

/// A listen address, or off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bind {
    /// Not served (`0`).
    Off,
    /// Served on this address.
    At(SocketAddr),
}

/// Parses a bind address as controller-runtime does: `0` is off, `:port`
/// every interface.
pub fn parse_bind(s: &str) -> Result<Bind, String> {
    if s == "0" || s.is_empty() {
        return Ok(Bind::Off);
    }
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.replace("localhost:", "127.0.0.1:"),
    };
    full.parse()
        .map(Bind::At)
        .map_err(|e| format!("bad address {s:?}: {e}"))
}

/// Parses a Go duration: a sequence of decimal numbers with units
/// (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), e.g. `1m30s`, `1.5s`; `0` alone.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration {s:?} (want e.g. 15s, 250ms, 1m30s)");
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..num_len].parse().map_err(|_| bad())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let secs = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * secs;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_duration_should_read_go_durations_and_refuse_the_rest() {
        let ok = |s: &str| parse_duration(s).unwrap_or(Duration::MAX);
        assert_eq!(ok("250ms"), Duration::from_millis(250));
        assert_eq!(ok("4s"), Duration::from_secs(4));
        assert_eq!(ok("10h"), Duration::from_secs(36_000));
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("0"), Duration::ZERO);
        for bad in ["", "4", "s", "4x", "-1s", "1..2s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_bind_should_read_off_ports_and_addresses() {
        assert_eq!(parse_bind("0"), Ok(Bind::Off));
        assert_eq!(
            parse_bind(":8080"),
            Ok(Bind::At(
                "0.0.0.0:8080".parse().unwrap_or_else(|_| unreachable!())
            ))
        );
        assert!(matches!(parse_bind("127.0.0.1:0"), Ok(Bind::At(_))));
        assert!(parse_bind("nowhere").is_err());
    }

    #[test]
    fn args_should_take_the_references_flags() {
        let a = Args::try_parse_from([
            "x",
            "--kubeconfig",
            "/k",
            "--leader-elect",
            "--leader-election-id",
            "l",
            "--lease-duration",
            "4s",
            "--renew-deadline",
            "3s",
            "--retry-period",
            "250ms",
            "--release-on-cancel=false",
            "--workers",
            "2",
            "--fifo",
            "--background-share",
            "0.25",
        ]);
        let a = a.map_err(|e| e.to_string());
        assert!(a.is_ok(), "{a:?}");
        if let Ok(a) = a {
            assert!(a.leader_elect && !a.release_on_cancel && a.fifo);
            assert_eq!(a.retry_period, Duration::from_millis(250));
            assert_eq!(a.workers, 2);
            assert!((a.background_share - 0.25).abs() < f64::EPSILON);
            assert_eq!(a.sync_period, Duration::from_secs(36_000));
        }
    }
}
