//! Resync spreading: a periodic resync re-adds every object at once; a
//! random delay for each, uniform over a window, turns that burst into a
//! steady trickle the workers absorb beside live events.

use std::time::Duration;

use rand::Rng;

/// A delay uniform in `[0, window)` drawn from `rng` (zero for an empty
/// window). Pass a seeded RNG for reproducible delays.
pub fn spread_delay<R: Rng + ?Sized>(window: Duration, rng: &mut R) -> Duration {
    if window.is_zero() {
        return Duration::ZERO;
    }
    // Nanosecond resolution; windows beyond u64::MAX ns (584 years) are capped.
    let nanos = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.gen_range(0..nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn spread_delay_should_stay_within_the_window() {
        let mut rng = StdRng::seed_from_u64(7);
        let window = Duration::from_secs(5);
        let delays: Vec<Duration> = (0..10_000)
            .map(|_| spread_delay(window, &mut rng))
            .collect();
        assert!(delays.iter().all(|d| *d < window));
        // Uniform: each of 5 one-second slices gets about a fifth.
        for s in 0..5 {
            let n = delays.iter().filter(|d| d.as_secs() == s).count();
            assert!((1_700..2_300).contains(&n), "slice {s} has {n}");
        }
    }

    #[test]
    fn spread_delay_should_be_zero_for_an_empty_window() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(spread_delay(Duration::ZERO, &mut rng), Duration::ZERO);
    }

    #[test]
    fn spread_delay_should_repeat_with_the_same_seed() {
        let w = Duration::from_secs(30);
        let a: Vec<_> = {
            let mut r = StdRng::seed_from_u64(42);
            (0..10).map(|_| spread_delay(w, &mut r)).collect()
        };
        let mut r = StdRng::seed_from_u64(42);
        let b: Vec<_> = (0..10).map(|_| spread_delay(w, &mut r)).collect();
        assert_eq!(a, b);
    }
}
