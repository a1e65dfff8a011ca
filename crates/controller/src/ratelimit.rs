//! Rate limiters for retries: how long an item waits before its next try.
//!
//! The same trait as client-go's: [`RateLimiter::when`] is asked each time
//! an item is re-queued after a failure and answers a delay;
//! [`RateLimiter::forget`] is called once the item succeeded. Limiters
//! combine with [`MaxOf`]; [`default_controller_rate_limiter`] is
//! client-go's default (per-item exponential 5 ms .. 1000 s, and a global
//! token bucket of 10 per second with a burst of 100, whichever is longer).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Decides how long an item waits before it is retried.
pub trait RateLimiter<K>: Send + Sync {
    /// The delay before `key` is tried again; counts one more retry of it.
    fn when(&self, key: &K) -> Duration;
    /// Forgets `key`: its next failure starts from the first delay again.
    fn forget(&self, key: &K);
    /// How many times `key` has been delayed since it was last forgotten.
    fn retries(&self, key: &K) -> u32;
}

/// Per-item exponential backoff: `base × 2^retries`, at most `max`.
#[derive(Debug)]
pub struct ItemExponential<K> {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash + Clone> ItemExponential<K> {
    /// A backoff starting at `base` and doubling up to `max`.
    #[must_use]
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn delay_for(&self, retries: u32) -> Duration {
        // 2^retries overflows quickly; anything past 2^32 × base is max anyway.
        let factor = 1u64.checked_shl(retries.min(63)).unwrap_or(u64::MAX);
        let nanos = (self.base.as_nanos()).saturating_mul(u128::from(factor));
        if nanos >= self.max.as_nanos() {
            self.max
        } else {
            // Below max, which is a Duration, so it fits.
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        }
    }
}

impl<K: Eq + Hash + Clone + Send> RateLimiter<K> for ItemExponential<K> {
    fn when(&self, key: &K) -> Duration {
        let retries = {
            let mut failures = lock(&self.failures);
            let n = failures.entry(key.clone()).or_insert(0);
            let before = *n;
            *n = n.saturating_add(1);
            before
        };
        self.delay_for(retries)
    }

    fn forget(&self, key: &K) {
        lock(&self.failures).remove(key);
    }

    fn retries(&self, key: &K) -> u32 {
        lock(&self.failures).get(key).copied().unwrap_or(0)
    }
}

/// A global token bucket: `burst` items pass at once, then `qps` per second.
///
/// Each call reserves a token; when the bucket is empty the reservation is
/// in the future and the delay says when (tokens may go negative, as with
/// Go's `rate.Limiter.Reserve`), so a burst of failures is spread at `qps`.
/// It keeps no per-item state: `forget` does nothing and `retries` is 0.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Option<Instant>,
}

impl TokenBucket {
    /// A bucket refilled at `qps` tokens per second holding at most `burst`.
    /// A `qps` of zero or less is treated as a tiny rate (one per 10^6 s)
    /// rather than dividing by zero; a `burst` below 1 as 1.
    #[must_use]
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: if qps > 0.0 { qps } else { 1e-6 },
            burst,
            state: Mutex::new(Bucket {
                tokens: burst,
                at: None,
            }),
        }
    }

    /// The delay of a reservation made at `now`.
    pub(crate) fn reserve_at(&self, now: Instant) -> Duration {
        let mut b = lock(&self.state);
        if let Some(at) = b.at {
            let elapsed = now.saturating_duration_since(at).as_secs_f64();
            b.tokens = (b.tokens + elapsed * self.qps).min(self.burst);
        }
        // Time does not go back for the bucket: a caller with an older
        // `now` (raced to the lock) refills nothing.
        b.at = Some(b.at.map_or(now, |at| at.max(now)));
        b.tokens -= 1.0;
        if b.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-b.tokens / self.qps)
        }
    }
}

impl<K> RateLimiter<K> for TokenBucket {
    fn when(&self, _key: &K) -> Duration {
        self.reserve_at(Instant::now())
    }

    fn forget(&self, _key: &K) {}

    fn retries(&self, _key: &K) -> u32 {
        0
    }
}

/// The longest delay of several limiters (client-go's `MaxOfRateLimiter`).
pub struct MaxOf<K> {
    limiters: Vec<Box<dyn RateLimiter<K>>>,
}

impl<K> std::fmt::Debug for MaxOf<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaxOf")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

impl<K> MaxOf<K> {
    /// Combines `limiters`: every one is asked (so each counts the retry),
    /// the longest delay wins, `forget` reaches all, `retries` is the most
    /// any of them counted.
    #[must_use]
    pub fn new(limiters: Vec<Box<dyn RateLimiter<K>>>) -> Self {
        Self { limiters }
    }
}

impl<K> RateLimiter<K> for MaxOf<K> {
    fn when(&self, key: &K) -> Duration {
        self.limiters
            .iter()
            .map(|l| l.when(key))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    fn forget(&self, key: &K) {
        for l in &self.limiters {
            l.forget(key);
        }
    }

    fn retries(&self, key: &K) -> u32 {
        self.limiters
            .iter()
            .map(|l| l.retries(key))
            .max()
            .unwrap_or(0)
    }
}

/// client-go's `DefaultControllerRateLimiter`: the longer of a per-item
/// exponential backoff from 5 ms to 1000 s and a token bucket of 10 per
/// second with a burst of 100.
#[must_use]
pub fn default_controller_rate_limiter<K>() -> MaxOf<K>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
{
    MaxOf::new(vec![
        Box::new(ItemExponential::<K>::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        )),
        Box::new(TokenBucket::new(10.0, 100)),
    ])
}

/// Locks `m`, recovering from poisoning: the guarded data are counters
/// that stay consistent whatever panicked while holding the lock.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn item_exponential_should_double_up_to_max() {
        let l = ItemExponential::new(5 * MS, 100 * MS);
        let got: Vec<Duration> = (0..7).map(|_| l.when(&"a")).collect();
        assert_eq!(got, [5, 10, 20, 40, 80, 100, 100].map(|m| m * MS).to_vec());
        assert_eq!(l.retries(&"a"), 7);
        assert_eq!(l.retries(&"b"), 0);
    }

    #[test]
    fn item_exponential_should_count_items_apart_and_restart_after_forget() {
        let l = ItemExponential::new(MS, Duration::from_secs(1));
        l.when(&1);
        l.when(&1);
        assert_eq!(l.when(&2), MS);
        l.forget(&1);
        assert_eq!(l.retries(&1), 0);
        assert_eq!(l.when(&1), MS);
    }

    #[test]
    fn item_exponential_should_not_overflow_after_many_retries() {
        let l = ItemExponential::new(Duration::from_secs(1), Duration::from_secs(1000));
        for _ in 0..200 {
            assert!(l.when(&0) <= Duration::from_secs(1000));
        }
        assert_eq!(l.when(&0), Duration::from_secs(1000));
    }

    #[test]
    fn token_bucket_should_pass_a_burst_then_space_at_qps() {
        let b = TokenBucket::new(10.0, 3);
        let t0 = Instant::now();
        let d: Vec<Duration> = (0..5).map(|_| b.reserve_at(t0)).collect();
        assert_eq!(d[..3], [Duration::ZERO; 3]);
        assert_eq!(d[3], 100 * MS);
        assert_eq!(d[4], 200 * MS);
        // 300 ms later the two borrowed tokens and one more came back.
        assert_eq!(b.reserve_at(t0 + 300 * MS), Duration::ZERO);
        assert_eq!(b.reserve_at(t0 + 300 * MS), 100 * MS);
    }

    #[test]
    fn token_bucket_should_keep_no_per_item_state() {
        let b = TokenBucket::new(1.0, 1);
        assert_eq!(RateLimiter::<u8>::when(&b, &1), Duration::ZERO);
        RateLimiter::<u8>::forget(&b, &1);
        assert_eq!(RateLimiter::<u8>::retries(&b, &1), 0);
        assert!(RateLimiter::<u8>::when(&b, &1) > Duration::from_millis(900));
    }

    #[test]
    fn max_of_should_take_the_longest_and_forget_everywhere() {
        let l: MaxOf<&str> = MaxOf::new(vec![
            Box::new(ItemExponential::new(MS, Duration::from_secs(10))),
            Box::new(ItemExponential::new(3 * MS, 4 * MS)),
        ]);
        assert_eq!(l.when(&"k"), 3 * MS);
        assert_eq!(l.when(&"k"), 4 * MS);
        assert_eq!(l.when(&"k"), 4 * MS);
        assert_eq!(l.when(&"k"), 8 * MS);
        assert_eq!(l.retries(&"k"), 4);
        l.forget(&"k");
        assert_eq!(l.retries(&"k"), 0);
        assert_eq!(l.when(&"k"), 3 * MS);
    }

    #[test]
    fn default_controller_rate_limiter_should_match_client_go() {
        let l = default_controller_rate_limiter::<u32>();
        // Per item: 5 ms, 10 ms, ... (the bucket's burst of 100 is not
        // exhausted by these few calls).
        assert_eq!(l.when(&1), 5 * MS);
        assert_eq!(l.when(&1), 10 * MS);
        assert_eq!(l.when(&2), 5 * MS);
        assert_eq!(l.retries(&1), 2);
        // Past the burst, the bucket's 100 ms spacing dominates a fresh item.
        for k in 100..200 {
            l.when(&k);
        }
        assert!(l.when(&3) > 50 * MS);
    }

    proptest! {
        #[test]
        fn item_exponential_should_grow_monotonically_within_bounds(
            base_us in 1u64..10_000,
            max_ms in 1u64..100_000,
            n in 1usize..80,
        ) {
            let base = Duration::from_micros(base_us);
            let max = Duration::from_millis(max_ms);
            let l = ItemExponential::new(base, max);
            let mut last = Duration::ZERO;
            for i in 0..n {
                let d = l.when(&0u8);
                prop_assert!(d <= max.max(base));
                prop_assert!(d >= last);
                if i == 0 {
                    prop_assert_eq!(d, base.min(max));
                }
                last = d;
            }
            prop_assert_eq!(l.retries(&0u8) as usize, n);
            l.forget(&0u8);
            prop_assert_eq!(l.when(&0u8), base.min(max));
        }

        #[test]
        fn token_bucket_should_never_grant_more_than_burst_plus_rate(
            qps in 1u32..200,
            burst in 1u32..50,
            gaps_ms in proptest::collection::vec(0u64..50, 1..300),
        ) {
            let b = TokenBucket::new(f64::from(qps), burst);
            let t0 = Instant::now();
            let mut now = t0;
            let mut granted = vec![];
            for g in gaps_ms {
                now += Duration::from_millis(g);
                granted.push(now + b.reserve_at(now));
            }
            // The grant times, in any window [a, a + w], hold at most
            // burst + qps × w of them (a whisker of slack for rounding).
            granted.sort();
            for i in 0..granted.len() {
                for j in i..granted.len() {
                    let w = (granted[j] - granted[i]).as_secs_f64();
                    let count = (j - i + 1) as f64;
                    prop_assert!(count <= f64::from(burst) + f64::from(qps) * w + 1e-6,
                        "{count} grants within {w} s");
                }
            }
        }
    }
}
