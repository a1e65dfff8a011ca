//! Event classification: which class an informer event belongs to, and
//! which priority and delay a class deserves.
//!
//! After Pinterest's control plane: events the system made up (the initial
//! list after a restart or a re-list, periodic resyncs whose old and new
//! objects are equal) can wait; events a user or the node caused (a change,
//! a delete, a container's death) cannot. The informer
//! ([`crate::informer`]) classifies each event where it arises
//! ([`EventClass::of`]); a handler maps the class to a queue tier and a
//! delay ([`ClassPolicy`]). Pure functions: randomness is passed in.

use std::time::Duration;

use rand::Rng;

use crate::queue::Priority;
use crate::resync::spread_delay;

/// The class of an informer event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventClass {
    /// An add of an object present in the first list after start or after
    /// a re-list: a replay of state, not news.
    InitialList,
    /// An update whose old and new objects are deeply equal (the periodic
    /// resync): nothing changed.
    NoOpResync,
    /// Everything else: a create, a real change, a delete.
    UserChange,
}

impl EventClass {
    /// Classifies one event about a key.
    ///
    /// `old` and `new` are the object before and after (`None` for a
    /// create's old side and a delete's new side); `known` says whether the
    /// key was already known before this event: it is in the state
    /// recovered at start-up, or (for the informer) it is an add replayed
    /// by a list.
    ///
    /// * an update whose `old == new`, or a resync without an old object:
    ///   [`EventClass::NoOpResync`];
    /// * a create of a known key: [`EventClass::InitialList`];
    /// * anything else: [`EventClass::UserChange`].
    pub fn of<T>(source: EventSource, old: Option<&T>, new: Option<&T>, known: bool) -> Self
    where
        T: PartialEq + ?Sized,
    {
        match (source, old, new) {
            (_, Some(o), Some(n)) if o == n => Self::NoOpResync,
            // A resync replays the informer's own cache: with no old object
            // to compare it is still a replay.
            (EventSource::Resync, None, Some(_)) => Self::NoOpResync,
            (_, None, Some(_)) if known => Self::InitialList,
            _ => Self::UserChange,
        }
    }
}

/// When to queue an event of a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delay {
    /// At once.
    Now,
    /// After this long.
    Fixed(Duration),
    /// After a random delay uniform in `[0, window)` (Pinterest's resync
    /// spreading).
    Spread(Duration),
}

/// Maps each [`EventClass`] to a queue tier and a [`Delay`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassPolicy {
    /// For [`EventClass::InitialList`] (default: background, now).
    pub initial_list: (Priority, Delay),
    /// For [`EventClass::NoOpResync`] (default: background, spread over
    /// 5 s, the queue's default resync window).
    pub no_op_resync: (Priority, Delay),
    /// For [`EventClass::UserChange`] (default: urgent, now).
    pub user_change: (Priority, Delay),
}

impl Default for ClassPolicy {
    fn default() -> Self {
        Self::with_resync_window(Duration::from_secs(5))
    }
}

impl ClassPolicy {
    /// The default policy, with no-op resyncs spread over `window`.
    #[must_use]
    pub const fn with_resync_window(window: Duration) -> Self {
        Self {
            initial_list: (Priority::Background, Delay::Now),
            no_op_resync: (Priority::Background, Delay::Spread(window)),
            user_change: (Priority::Urgent, Delay::Now),
        }
    }

    /// Sets the tier and delay of one class.
    #[must_use]
    pub const fn set(mut self, class: EventClass, priority: Priority, delay: Delay) -> Self {
        match class {
            EventClass::InitialList => self.initial_list = (priority, delay),
            EventClass::NoOpResync => self.no_op_resync = (priority, delay),
            EventClass::UserChange => self.user_change = (priority, delay),
        }
        self
    }

    /// The decision for an event of `class`; `rng` draws spread delays.
    pub fn decide<R: Rng + ?Sized>(&self, class: EventClass, rng: &mut R) -> Decision {
        let (priority, delay) = match class {
            EventClass::InitialList => self.initial_list,
            EventClass::NoOpResync => self.no_op_resync,
            EventClass::UserChange => self.user_change,
        };
        let delay = match delay {
            Delay::Now => None,
            Delay::Fixed(d) => Some(d),
            Delay::Spread(w) => Some(spread_delay(w, rng)),
        };
        Decision { priority, delay }
    }
}

/// Where an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventSource {
    /// The initial list of an informer (start-up, or a relist after a
    /// broken watch).
    InitialList,
    /// A live watch event.
    Watch,
    /// A periodic resync from the informer's cache.
    Resync,
}

/// What to do with an event: its priority and an optional delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The tier to queue the key at.
    pub priority: Priority,
    /// Queue it only after this long (`None`: now).
    pub delay: Option<Duration>,
}

impl Decision {
    /// Now, at `priority`.
    #[must_use]
    pub const fn now(priority: Priority) -> Self {
        Self {
            priority,
            delay: None,
        }
    }
}

/// Classifies one event about a key and decides with the default
/// [`ClassPolicy`] (no-op resyncs spread over `resync_window`).
///
/// `old` and `new` are the object before and after (`None` for a create's
/// old side and a delete's new side); `known` says whether the key was
/// already known before this event (for instance, it is in the state
/// recovered at start-up). `resync_window` and `rng` draw the spreading
/// delay of no-op updates.
///
/// * a create (`old` none, `new` some) of a known key — an initial list
///   after a restart replays objects we already have: **Background**, now;
/// * an update whose `old == new` (a resync, or a watch echo that changed
///   nothing), or a resync without an old object: **Background**, after a
///   random delay in `[0, resync_window)`;
/// * anything else — a create of an unknown key, a real change, a delete:
///   **Urgent**, now.
pub fn classify<T, R>(
    source: EventSource,
    old: Option<&T>,
    new: Option<&T>,
    known: bool,
    resync_window: Duration,
    rng: &mut R,
) -> Decision
where
    T: PartialEq + ?Sized,
    R: Rng + ?Sized,
{
    let class = EventClass::of(source, old, new, known);
    ClassPolicy::with_resync_window(resync_window).decide(class, rng)
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    const W: Duration = Duration::from_secs(5);

    fn rng() -> StdRng {
        StdRng::seed_from_u64(3)
    }

    #[test]
    fn classify_should_put_an_initial_list_create_of_a_known_key_in_background() {
        let d = classify(
            EventSource::InitialList,
            None,
            Some(&1),
            true,
            W,
            &mut rng(),
        );
        assert_eq!(d, Decision::now(Priority::Background));
    }

    #[test]
    fn classify_should_put_a_watch_create_of_a_known_key_in_background() {
        let d = classify(EventSource::Watch, None, Some(&1), true, W, &mut rng());
        assert_eq!(d, Decision::now(Priority::Background));
    }

    #[test]
    fn classify_should_make_a_create_of_an_unknown_key_urgent() {
        for source in [EventSource::InitialList, EventSource::Watch] {
            let d = classify(source, None, Some(&1), false, W, &mut rng());
            assert_eq!(d, Decision::now(Priority::Urgent), "{source:?}");
        }
    }

    #[test]
    fn classify_should_delay_a_no_op_update_randomly_in_background() {
        let mut r = rng();
        let mut delays = vec![];
        for source in [EventSource::Resync, EventSource::Watch] {
            for _ in 0..50 {
                let d = classify(source, Some("a"), Some("a"), true, W, &mut r);
                assert_eq!(d.priority, Priority::Background);
                let delay = d.delay.expect("a no-op update is delayed");
                assert!(delay < W);
                delays.push(delay);
            }
        }
        delays.sort();
        delays.dedup();
        assert!(delays.len() > 90, "the delays are spread, not one value");
    }

    #[test]
    fn classify_should_draw_the_same_delay_from_the_same_seed() {
        let a = classify(EventSource::Resync, Some(&5), Some(&5), true, W, &mut rng());
        let b = classify(EventSource::Resync, Some(&5), Some(&5), true, W, &mut rng());
        assert_eq!(a, b);
    }

    #[test]
    fn classify_should_delay_a_resync_without_an_old_object() {
        let d = classify(EventSource::Resync, None, Some(&1), true, W, &mut rng());
        assert_eq!(d.priority, Priority::Background);
        assert!(d.delay.is_some_and(|d| d < W));
    }

    #[test]
    fn classify_should_make_a_real_update_urgent() {
        for source in [EventSource::Watch, EventSource::Resync] {
            let d = classify(source, Some(&1), Some(&2), true, W, &mut rng());
            assert_eq!(d, Decision::now(Priority::Urgent), "{source:?}");
        }
    }

    #[test]
    fn classify_should_make_a_delete_urgent() {
        for known in [true, false] {
            let d = classify(EventSource::Watch, Some(&1), None, known, W, &mut rng());
            assert_eq!(d, Decision::now(Priority::Urgent));
        }
    }

    #[test]
    fn classify_should_make_an_event_without_objects_urgent() {
        let d = classify::<u8, _>(EventSource::Watch, None, None, true, W, &mut rng());
        assert_eq!(d, Decision::now(Priority::Urgent));
    }

    #[test]
    fn classify_should_not_delay_a_no_op_update_with_an_empty_window() {
        let d = classify(
            EventSource::Resync,
            Some(&1),
            Some(&1),
            true,
            Duration::ZERO,
            &mut rng(),
        );
        assert_eq!(d.delay, Some(Duration::ZERO));
        assert_eq!(d.priority, Priority::Background);
    }
}
