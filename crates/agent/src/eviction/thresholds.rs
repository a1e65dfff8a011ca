//! Threshold evaluation, kubelet's way, as pure functions of observations
//! and time: which thresholds are met (with minimum reclaim once met), for
//! how long (grace periods), and which node conditions hold (kept for the
//! pressure transition period after their threshold was last met).

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::config::Threshold;
use super::signals::{NodeCondition, Signal};

/// One signal's observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// What is available (bytes, inodes, pids).
    pub available: i64,
    /// The total, for percentage thresholds.
    pub capacity: i64,
    /// When the statistics behind it were taken.
    pub time: Instant,
}

/// Every signal observed in one pass.
pub type Observations = HashMap<Signal, Observation>;

/// The amount below which `t` is met, for the observed capacity; with
/// `min_reclaim`, plus the threshold's minimum reclaim.
pub fn threshold_amount(t: &Threshold, capacity: i64, min_reclaim: bool) -> i64 {
    let mut amount = t.value.amount(capacity);
    if min_reclaim {
        if let Some(m) = t.min_reclaim {
            amount = amount.saturating_add(m.amount(capacity));
        }
    }
    amount
}

/// The thresholds whose signal's available amount is below the threshold
/// (plus its minimum reclaim when `enforce_min_reclaim`). Signals not
/// observed meet nothing.
pub fn thresholds_met(
    thresholds: &[Threshold],
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            observations
                .get(&t.signal)
                .is_some_and(|o| threshold_amount(t, o.capacity, enforce_min_reclaim) > o.available)
        })
        .copied()
        .collect()
}

/// What one evaluation decided.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluation {
    /// Thresholds met whose grace period has passed and whose statistics
    /// are newer than the previous pass's, most urgent first: these drive
    /// reclaim and eviction.
    pub actionable: Vec<Threshold>,
    /// Every threshold met now, grace period or not (soft thresholds
    /// waiting out theirs included).
    pub met: Vec<Threshold>,
    /// Node conditions that hold: a threshold of theirs is met, or was
    /// within the pressure transition period.
    pub conditions: BTreeSet<NodeCondition>,
}

fn same(a: &Threshold, b: &Threshold) -> bool {
    a.signal == b.signal && a.hard == b.hard
}

/// The state kept between passes: when each threshold was first met, when
/// each condition was last observed, the thresholds acted upon last time
/// (held until their minimum reclaim is reached), and the previous
/// observations.
#[derive(Debug)]
pub struct ThresholdTracker {
    transition: Duration,
    first_observed: Vec<(Threshold, Instant)>,
    condition_last_observed: HashMap<NodeCondition, Instant>,
    acted: Vec<Threshold>,
    last_observations: Observations,
}

impl ThresholdTracker {
    /// A tracker holding conditions for `transition` after their last
    /// threshold was met.
    pub fn new(transition: Duration) -> Self {
        Self {
            transition,
            first_observed: Vec::new(),
            condition_last_observed: HashMap::new(),
            acted: Vec::new(),
            last_observations: Observations::new(),
        }
    }

    /// One pass's evaluation of `thresholds` against `observations` at
    /// `now`.
    pub fn evaluate(
        &mut self,
        thresholds: &[Threshold],
        observations: &Observations,
        now: Instant,
    ) -> Evaluation {
        let mut met = thresholds_met(thresholds, observations, false);
        // A threshold acted upon stays met until the minimum reclaim is
        // reached, so pressure does not flap at the threshold's edge.
        for t in thresholds_met(&self.acted, observations, true) {
            if !met.iter().any(|m| same(m, &t)) {
                met.push(t);
            }
        }

        // When each met threshold was first met (forgotten once unmet).
        let mut first = Vec::with_capacity(met.len());
        for t in &met {
            let since = self
                .first_observed
                .iter()
                .find(|(f, _)| same(f, t))
                .map_or(now, |(_, at)| *at);
            first.push((*t, since));
        }
        self.first_observed = first;

        for t in &met {
            self.condition_last_observed
                .insert(t.signal.condition(), now);
        }
        let transition = self.transition;
        self.condition_last_observed
            .retain(|_, at| now.saturating_duration_since(*at) < transition);
        let conditions = self.condition_last_observed.keys().copied().collect();

        let graced: Vec<Threshold> = self
            .first_observed
            .iter()
            .filter(|(t, at)| now.saturating_duration_since(*at) >= t.grace_period)
            .map(|(t, _)| *t)
            .collect();
        self.acted = graced.clone();

        // Only act on statistics newer than last time: acting twice on the
        // same numbers would evict a second pod for pressure the first
        // eviction may already have relieved.
        let mut actionable: Vec<Threshold> = graced
            .into_iter()
            .filter(|t| {
                let Some(o) = observations.get(&t.signal) else {
                    return false;
                };
                self.last_observations
                    .get(&t.signal)
                    .is_none_or(|last| o.time > last.time)
            })
            .collect();
        actionable.sort_by_key(|t| (t.signal.eviction_priority(), !t.hard));
        self.last_observations = observations.clone();
        Evaluation {
            actionable,
            met,
            conditions,
        }
    }

    /// Whether the thresholds acted upon are all resolved, minimum reclaim
    /// included, by `observations` (taken after node-level reclaim).
    pub fn reclaimed(&self, observations: &Observations) -> bool {
        thresholds_met(&self.acted, observations, true).is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::eviction::config::ThresholdValue;

    const MI: i64 = 1 << 20;

    fn hard(signal: Signal, v: ThresholdValue) -> Threshold {
        Threshold {
            signal,
            value: v,
            grace_period: Duration::ZERO,
            min_reclaim: None,
            hard: true,
        }
    }

    fn obs(signal: Signal, available: i64, capacity: i64, time: Instant) -> Observations {
        Observations::from([(
            signal,
            Observation {
                available,
                capacity,
                time,
            },
        )])
    }

    #[test]
    fn thresholds_should_be_met_below_quantities_and_percentages() {
        let t0 = Instant::now();
        let ts = [
            hard(Signal::MemoryAvailable, ThresholdValue::Quantity(100 * MI)),
            hard(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.1)),
        ];
        let mut o = obs(Signal::MemoryAvailable, 99 * MI, 1000 * MI, t0);
        o.extend(obs(Signal::NodeFsAvailable, 100, 1000, t0));
        let met = thresholds_met(&ts, &o, false);
        assert_eq!(met.len(), 1);
        assert_eq!(met[0].signal, Signal::MemoryAvailable);
        // Exactly at the threshold is not below it.
        let o = obs(Signal::MemoryAvailable, 100 * MI, 1000 * MI, t0);
        assert!(thresholds_met(&ts, &o, false).is_empty());
        // Unobserved signals meet nothing.
        assert!(thresholds_met(&ts, &Observations::new(), false).is_empty());
    }

    #[test]
    fn soft_thresholds_should_wait_out_their_grace_period() {
        let t0 = Instant::now();
        let soft = Threshold {
            grace_period: Duration::from_secs(30),
            hard: false,
            ..hard(Signal::MemoryAvailable, ThresholdValue::Quantity(100 * MI))
        };
        let mut tr = ThresholdTracker::new(Duration::from_secs(300));
        let at = |s: u64| t0 + Duration::from_secs(s);
        let e = tr.evaluate(
            &[soft],
            &obs(Signal::MemoryAvailable, MI, 1000 * MI, at(0)),
            at(0),
        );
        assert!(e.actionable.is_empty());
        assert!(e.conditions.contains(&NodeCondition::MemoryPressure));
        let e = tr.evaluate(
            &[soft],
            &obs(Signal::MemoryAvailable, MI, 1000 * MI, at(29)),
            at(29),
        );
        assert!(e.actionable.is_empty());
        let e = tr.evaluate(
            &[soft],
            &obs(Signal::MemoryAvailable, MI, 1000 * MI, at(30)),
            at(30),
        );
        assert_eq!(e.actionable, vec![soft]);
        // Relieved for a moment: the grace period starts over.
        tr.evaluate(
            &[soft],
            &obs(Signal::MemoryAvailable, 500 * MI, 1000 * MI, at(31)),
            at(31),
        );
        let e = tr.evaluate(
            &[soft],
            &obs(Signal::MemoryAvailable, MI, 1000 * MI, at(40)),
            at(40),
        );
        assert!(e.actionable.is_empty());
    }

    #[test]
    fn conditions_should_hold_for_the_transition_period() {
        let t0 = Instant::now();
        let t = hard(Signal::PidAvailable, ThresholdValue::Quantity(10));
        let mut tr = ThresholdTracker::new(Duration::from_secs(60));
        let at = |s: u64| t0 + Duration::from_secs(s);
        let e = tr.evaluate(&[t], &obs(Signal::PidAvailable, 5, 100, at(0)), at(0));
        assert_eq!(e.conditions, BTreeSet::from([NodeCondition::PidPressure]));
        let e = tr.evaluate(&[t], &obs(Signal::PidAvailable, 50, 100, at(10)), at(10));
        assert!(e.met.is_empty());
        assert_eq!(e.conditions, BTreeSet::from([NodeCondition::PidPressure]));
        let e = tr.evaluate(&[t], &obs(Signal::PidAvailable, 50, 100, at(59)), at(59));
        assert_eq!(e.conditions.len(), 1);
        let e = tr.evaluate(&[t], &obs(Signal::PidAvailable, 50, 100, at(60)), at(60));
        assert!(e.conditions.is_empty());
    }

    #[test]
    fn min_reclaim_should_hold_a_met_threshold_until_reached() {
        let t0 = Instant::now();
        let t = Threshold {
            min_reclaim: Some(ThresholdValue::Quantity(50 * MI)),
            ..hard(Signal::MemoryAvailable, ThresholdValue::Quantity(100 * MI))
        };
        let mut tr = ThresholdTracker::new(Duration::ZERO);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let e = tr.evaluate(
            &[t],
            &obs(Signal::MemoryAvailable, 90 * MI, 1000 * MI, at(0)),
            at(0),
        );
        assert_eq!(e.actionable.len(), 1);
        // Above the threshold but not above threshold + min reclaim: still met.
        let o = obs(Signal::MemoryAvailable, 120 * MI, 1000 * MI, at(1));
        assert!(!tr.reclaimed(&o));
        let e = tr.evaluate(&[t], &o, at(1));
        assert_eq!(e.actionable.len(), 1);
        let o = obs(Signal::MemoryAvailable, 151 * MI, 1000 * MI, at(2));
        assert!(tr.reclaimed(&o));
        let e = tr.evaluate(&[t], &o, at(2));
        assert!(e.met.is_empty());
        // Without having been acted upon, min reclaim does not apply.
        let e = tr.evaluate(
            &[t],
            &obs(Signal::MemoryAvailable, 120 * MI, 1000 * MI, at(3)),
            at(3),
        );
        assert!(e.met.is_empty());
    }

    #[test]
    fn stale_statistics_should_not_be_acted_upon_twice() {
        let t0 = Instant::now();
        let t = hard(Signal::ImageFsAvailable, ThresholdValue::Quantity(10));
        let mut tr = ThresholdTracker::new(Duration::ZERO);
        let o = obs(Signal::ImageFsAvailable, 1, 100, t0);
        assert_eq!(tr.evaluate(&[t], &o, t0).actionable.len(), 1);
        let later = t0 + Duration::from_secs(1);
        let e = tr.evaluate(&[t], &o, later);
        assert_eq!(e.met.len(), 1);
        assert!(e.actionable.is_empty());
    }

    #[test]
    fn memory_thresholds_should_come_first() {
        let t0 = Instant::now();
        let ts = [
            hard(Signal::NodeFsAvailable, ThresholdValue::Quantity(10)),
            hard(Signal::MemoryAvailable, ThresholdValue::Quantity(10)),
        ];
        let mut o = obs(Signal::NodeFsAvailable, 1, 100, t0);
        o.extend(obs(Signal::MemoryAvailable, 1, 100, t0));
        let e = ThresholdTracker::new(Duration::ZERO).evaluate(&ts, &o, t0);
        assert_eq!(e.actionable[0].signal, Signal::MemoryAvailable);
        assert_eq!(e.actionable[1].signal, Signal::NodeFsAvailable);
    }
}
