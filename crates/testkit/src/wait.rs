//! Polling for a condition a test waits on.

use std::time::{Duration, Instant};

/// The environment variable that stretches every wait of the kit: a
/// factor (`3`, `2.5`) for machines slower than the one the tests' own
/// deadlines were chosen on. `e2e_cgroup_v2` sets it for the tests it
/// runs in its software-emulated guest.
pub const TIME_SCALE_ENV: &str = "PETREL_TIME_SCALE";

/// `within` stretched by `PETREL_TIME_SCALE` (unset, unreadable or below
/// 1: as given).
pub fn scaled(within: Duration) -> Duration {
    within.mul_f64(factor(std::env::var(TIME_SCALE_ENV).ok().as_deref()))
}

/// The factor a `PETREL_TIME_SCALE` value gives: at least 1.
fn factor(value: Option<&str>) -> f64 {
    value
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f >= 1.0)
        .unwrap_or(1.0)
}

/// Waits up to `within` until `f` holds; returns whether it did.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let within = scaled(within);
    let start = Instant::now();
    while start.elapsed() < within {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

/// Polls `f` every 100 ms until it gives a value and returns it; panics
/// naming `what` after `within` (a test's wait for a state it must reach).
pub async fn wait_for<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let within = scaled(within);
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factor_should_be_the_value_and_ignore_nonsense() {
        assert_eq!(factor(None), 1.0);
        assert_eq!(factor(Some("2.5")), 2.5);
        assert_eq!(factor(Some(" 4 ")), 4.0);
        for bad in ["0.5", "x", "-3", "NaN", "inf"] {
            assert_eq!(factor(Some(bad)), 1.0, "{bad}");
        }
        assert_eq!(
            Duration::from_secs(10).mul_f64(factor(Some("2.5"))),
            Duration::from_secs(25)
        );
    }
}
