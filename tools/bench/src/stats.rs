//! Latency samples and their percentiles.

use std::time::Duration;

/// A set of latency samples of one operation.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<Duration>,
}

impl Samples {
    /// Records one sample.
    pub fn push(&mut self, d: Duration) {
        self.values.push(d);
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: &Samples) {
        self.values.extend_from_slice(&other.values);
    }

    /// The samples in the order taken.
    pub fn values(&self) -> &[Duration] {
        &self.values
    }

    /// How many samples were taken.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// The `p`-th percentile by the nearest-rank method: the smallest sample
    /// at or below which at least `p` % of the samples lie. With 100 samples
    /// p99 is the second-largest one; nothing is interpolated.
    pub fn percentile(&self, p: f64) -> Duration {
        if self.values.is_empty() {
            return Duration::ZERO;
        }
        let mut v = self.values.clone();
        v.sort_unstable();
        // The epsilon keeps float error from pushing an exact rank up one
        // (99.9 / 100 × 1000 is 999.0000000000001 in f64).
        let rank = ((p / 100.0) * v.len() as f64 - 1e-9).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    }

    /// The median.
    pub fn p50(&self) -> Duration {
        self.percentile(50.0)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> Duration {
        self.percentile(99.0)
    }

    /// The arithmetic mean.
    pub fn mean(&self) -> Duration {
        if self.values.is_empty() {
            return Duration::ZERO;
        }
        self.values.iter().sum::<Duration>() / self.values.len() as u32
    }

    /// How many samples are longer than `limit`.
    pub fn count_over(&self, limit: Duration) -> usize {
        self.values.iter().filter(|v| **v > limit).count()
    }

    /// The smallest sample.
    pub fn min(&self) -> Duration {
        self.values.iter().copied().min().unwrap_or_default()
    }

    /// The largest sample.
    pub fn max(&self) -> Duration {
        self.values.iter().copied().max().unwrap_or_default()
    }
}

/// A promise's verdict in the report.
pub fn verdict(pass: bool) -> &'static str {
    if pass {
        "**PASS**"
    } else {
        "**MISS**"
    }
}

/// Whether `a` is at most `factor` times `b` (never with a zero `b`).
pub fn within(a: Duration, b: Duration, factor: f64) -> bool {
    !b.is_zero() && a.as_secs_f64() <= b.as_secs_f64() * factor
}

/// Milliseconds with three decimals (microsecond resolution).
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// `a / b` with two decimals, or "n/a" when `b` is zero.
pub fn ratio(a: Duration, b: Duration) -> String {
    if b.is_zero() {
        return "n/a".to_string();
    }
    format!("{:.2}", a.as_secs_f64() / b.as_secs_f64())
}

/// The first line of an error, fit for a table cell (no `|`, at most 240
/// characters).
pub fn one_line(s: &str) -> String {
    let first = s.lines().next().unwrap_or("").replace('|', "\\|");
    first.chars().take(240).collect()
}

/// A row of a "samples (ms)" table for a template: `name`, `n`, `p50`,
/// `p99`, `min`, `max`, `mean`.
pub fn samples_vars(name: &str, s: &Samples) -> crate::template::Vars {
    let mut v = crate::template::Vars::new();
    v.set("name", name)
        .set("n", s.len())
        .set("p50", ms(s.p50()))
        .set("p99", ms(s.p99()))
        .set("min", ms(s.min()))
        .set("max", ms(s.max()))
        .set("mean", ms(s.mean()));
    v
}

/// The closing line of a section that stopped early, for a template's
/// `{{#each stopped}}`: the error's first line as `first` (backticks made
/// quotes, so that the code span holds); no entry otherwise.
pub fn stopped_vars(error: Option<&str>) -> Vec<crate::template::Vars> {
    error
        .map(|e| {
            let mut v = crate::template::Vars::new();
            v.set("first", e.lines().next().unwrap_or("").replace('`', "'"));
            v
        })
        .into_iter()
        .collect()
}

/// Why a section's figure is missing, for its table cell.
pub fn why_cell(error: Option<&str>) -> String {
    one_line(error.unwrap_or("the run stopped before this figure"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(ms: impl IntoIterator<Item = u64>) -> Samples {
        let mut s = Samples::default();
        for m in ms {
            s.push(Duration::from_millis(m));
        }
        s
    }

    #[test]
    fn percentile_should_use_nearest_rank() {
        let s = samples((1..=100).rev());
        assert_eq!(s.p50(), Duration::from_millis(50));
        assert_eq!(s.p99(), Duration::from_millis(99));
        assert_eq!(s.max(), Duration::from_millis(100));
        assert_eq!(s.min(), Duration::from_millis(1));
    }

    #[test]
    fn percentile_should_not_round_small_sets_down() {
        let s = samples([5, 1, 9]);
        assert_eq!(s.p50(), Duration::from_millis(5));
        assert_eq!(s.p99(), Duration::from_millis(9));
    }

    #[test]
    fn percentile_should_not_round_an_exact_rank_up() {
        let s = samples(1..=1000);
        assert_eq!(s.percentile(99.9), Duration::from_millis(999));
        assert_eq!(s.percentile(99.0), Duration::from_millis(990));
    }

    #[test]
    fn percentile_of_nothing_should_be_zero() {
        assert_eq!(Samples::default().p99(), Duration::ZERO);
    }

    #[test]
    fn count_over_should_count_only_longer_samples() {
        let mut s = Samples::default();
        for ms in [1, 5, 6, 9] {
            s.push(Duration::from_millis(ms));
        }
        assert_eq!(s.count_over(Duration::from_millis(5)), 2);
        assert_eq!(Samples::default().count_over(Duration::ZERO), 0);
    }

    #[test]
    fn ratio_should_print_two_decimals() {
        assert_eq!(
            ratio(Duration::from_millis(3), Duration::from_millis(2)),
            "1.50"
        );
        assert_eq!(ratio(Duration::from_millis(3), Duration::ZERO), "n/a");
    }

    #[test]
    fn why_cell_takes_the_first_line_and_escapes_pipes() {
        assert_eq!(why_cell(Some("a | b\nsecond")), "a \\| b");
        assert_eq!(why_cell(None), "the run stopped before this figure");
        assert_eq!(one_line(&"x".repeat(300)).len(), 240);
    }

    #[test]
    fn stopped_vars_should_hold_the_first_line_only_when_there_is_an_error() {
        assert!(stopped_vars(None).is_empty());
        let t = "{{#each stopped}}The section stopped early: `{{first}}`.{{/each}}";
        let mut v = crate::template::Vars::new();
        v.list("stopped", stopped_vars(Some("bad `x`\nmore")));
        assert_eq!(
            crate::template::render(t, &v).ok().as_deref(),
            Some("The section stopped early: `bad 'x'`.")
        );
    }
}
