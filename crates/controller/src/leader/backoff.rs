//! The retry backoff of a candidate that is not leading.
//!
//! Pinterest found the hard-coded 1–16 s exponential backoff of
//! operator-lib's leader-for-life dominating their leaderless time: a
//! candidate that had tried a few times slept 16 s even when the lock came
//! free just after. Here every number is configuration, and a standby is
//! also woken early when the lock object changes (see the electors).

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with jitter: attempt `n` (from 0) waits
/// `min(initial * factor^n, max) * (1 + jitter * r)`, `r` uniform in [0, 1).
///
/// `factor = 1` gives a fixed period, as client-go's lease candidates use
/// (retry period with jitter 1.2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait before jitter.
    pub max: Duration,
    /// Growth per failed attempt (>= 1).
    pub factor: f64,
    /// The random extra, as a fraction of the wait (0 = none).
    pub jitter: f64,
}

impl Default for Backoff {
    /// 200 ms doubling to 2 s, 20 % jitter: short enough that a lock that
    /// comes free is taken within a couple of seconds even without the
    /// change notification.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(2),
            factor: 2.0,
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// A fixed period with jitter (client-go's `RetryPeriod`, `JitterFactor`).
    #[must_use]
    pub fn fixed(period: Duration, jitter: f64) -> Self {
        Self {
            initial: period,
            max: period,
            factor: 1.0,
            jitter,
        }
    }

    /// The wait before retry number `attempt` (0 = the first retry).
    pub fn delay(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let base = self.base(attempt);
        let jitter = self.jitter.max(0.0);
        if jitter == 0.0 {
            return base;
        }
        base.mul_f64(1.0 + jitter * rng.gen::<f64>())
    }

    /// The wait before retry number `attempt`, without jitter.
    pub fn base(&self, attempt: u32) -> Duration {
        let factor = self.factor.max(1.0);
        // powi saturates to infinity; the min below brings it back.
        let grown = self.initial.as_secs_f64() * factor.powi(attempt.min(1024) as i32);
        let capped = grown.min(self.max.as_secs_f64()).max(0.0);
        Duration::try_from_secs_f64(capped).unwrap_or(self.max)
    }

    /// Whether the numbers make sense (positive, `max >= initial`,
    /// `factor >= 1`, `jitter >= 0`); names the first bad field.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.initial.is_zero() {
            return Err("backoff.initial");
        }
        if self.max < self.initial {
            return Err("backoff.max");
        }
        if !(self.factor >= 1.0 && self.factor.is_finite()) {
            return Err("backoff.factor");
        }
        if !(self.jitter >= 0.0 && self.jitter.is_finite()) {
            return Err("backoff.jitter");
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn backoff_should_grow_by_factor_up_to_max() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            factor: 3.0,
            jitter: 0.0,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let got: Vec<_> = (0..5).map(|n| b.delay(n, &mut rng).as_millis()).collect();
        assert_eq!(got, [100, 300, 900, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX, &mut rng), Duration::from_millis(1000));
    }

    #[test]
    fn backoff_should_add_at_most_jitter_fraction() {
        let b = Backoff::fixed(Duration::from_millis(1000), 0.5);
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut seen_extra = false;
        for _ in 0..100 {
            let d = b.delay(3, &mut rng);
            assert!(d >= Duration::from_millis(1000) && d < Duration::from_millis(1500));
            seen_extra |= d > Duration::from_millis(1000);
        }
        assert!(seen_extra, "jitter never added anything");
    }

    #[test]
    fn backoff_should_reject_nonsense() {
        let ok = Backoff::default();
        assert_eq!(ok.check(), Ok(()));
        let bad = Backoff {
            max: Duration::from_millis(1),
            ..ok
        };
        assert_eq!(bad.check(), Err("backoff.max"));
        let bad = Backoff { factor: 0.5, ..ok };
        assert_eq!(bad.check(), Err("backoff.factor"));
        let bad = Backoff {
            jitter: f64::NAN,
            ..ok
        };
        assert_eq!(bad.check(), Err("backoff.jitter"));
    }
}
