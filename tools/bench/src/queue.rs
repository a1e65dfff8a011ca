//! The controller kit's work queue against a plain FIFO: seed 002's storm.
//!
//! In-process, no runtime or container involved. The same `WorkQueue` runs
//! twice: as Petrel's priority queue (events classified with
//! `petrel_controller::classify`: the restart's initial list of known keys
//! and no-op resyncs are background work, resyncs spread over a window,
//! user events urgent; one of the four workers kept for urgent items), and
//! as the reference, a plain FIFO with client-go's semantics (every item
//! at one priority, no delays). Both get the same storm, and a no-storm
//! baseline of user events alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use petrel_controller::{classify, EventSource, Priority, QueueConfig, WorkQueue};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::stats::Samples;

/// Keys of the restart's initial list, and again of the resync.
pub const KEYS: u64 = 10_000;
/// User events per second, all through the run.
pub const USER_RATE: u32 = 50;
/// Workers pulling from the queue.
pub const WORKERS: usize = 4;
/// What one reconcile takes.
pub const RECONCILE: Duration = Duration::from_millis(1);
/// When the resync burst arrives (the initial list arrives at 0).
pub const RESYNC_AT: Duration = Duration::from_secs(8);
/// The window resync delays are spread over.
pub const RESYNC_WINDOW: Duration = Duration::from_secs(5);
/// The starvation bound of the priority queue (the kit's default).
pub const MAX_WAIT: Duration = Duration::from_secs(5);
/// End of the resync phase for the depth figures.
pub const RESYNC_PHASE_END: Duration = Duration::from_secs(16);
/// Keys from here up are user events (each a new key).
const USER_KEY_BASE: u64 = 1 << 32;
/// Distinct keys of the throughput figure, per round.
pub const THROUGHPUT_KEYS: u64 = 1_000_000;
/// Keys waiting at once in the throughput figure.
pub const THROUGHPUT_BATCH: u64 = 1_000;
const THROUGHPUT_ROUNDS: usize = 5;
/// Storm and no-storm runs of the priority queue, alternating: p99.9 of
/// one run's 1000 user events is its second-largest sample, which one
/// hiccup of this VM moves; three runs of each make it the third-largest
/// of 3000.
pub const PRIORITY_RUNS: usize = 3;

/// Which queue a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Classified priorities, resync spreading, starvation bound, and one
    /// worker kept for urgent items (`lower_tier_limit(WORKERS - 1)`).
    Priority,
    /// The same without the kept worker: priorities alone.
    PriorityNoReserve,
    /// Every item at one priority, no delays: client-go's FIFO.
    Fifo,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::Priority => "priority",
            Self::PriorityNoReserve => "priority-no-reserve",
            Self::Fifo => "fifo",
        }
    }
}

/// Depth figures over one phase of a run.
#[derive(Debug, Default, Clone, Copy)]
pub struct Depth {
    /// Largest sample.
    pub peak: usize,
    /// Mean of the samples.
    pub mean: f64,
    /// How many samples.
    pub samples: usize,
}

/// One run of a scenario on one queue, or several pooled.
#[derive(Debug, Default)]
pub struct Run {
    /// How many runs are pooled here.
    pub runs: usize,
    /// Length of the user-event stream.
    pub wall: Duration,
    /// User events: add → a worker's `get` returns it.
    pub user: Samples,
    /// Depth in front of a user event (the urgent tier; for the FIFO the
    /// whole queue), during the initial list and during the resync.
    pub front_initial: Depth,
    /// See `front_initial`.
    pub front_resync: Depth,
    /// Ready items of all tiers, during the resync.
    pub total_resync: Depth,
    /// Storm items handed out.
    pub storm_served: usize,
    /// Longest time a storm item waited, ready (the queue's `Item::waited`).
    pub storm_max_wait: Duration,
    /// Reconcile durations as measured around the blocking sleep.
    pub reconcile: Samples,
}

impl Depth {
    fn merge(&mut self, o: Depth) {
        let n = self.samples + o.samples;
        if n > 0 {
            self.mean = (self.mean * self.samples as f64 + o.mean * o.samples as f64) / n as f64;
        }
        self.peak = self.peak.max(o.peak);
        self.samples = n;
    }
}

impl Run {
    /// Adds another run of the same kind: samples pooled, means weighted,
    /// peaks and longest waits the largest.
    fn merge(&mut self, o: Run) {
        self.runs += o.runs;
        self.wall = self.wall.max(o.wall);
        self.user.extend(&o.user);
        self.front_initial.merge(o.front_initial);
        self.front_resync.merge(o.front_resync);
        self.total_resync.merge(o.total_resync);
        self.storm_served += o.storm_served;
        self.storm_max_wait = self.storm_max_wait.max(o.storm_max_wait);
        self.reconcile.extend(&o.reconcile);
    }
}

/// Single-threaded operations per second.
#[derive(Debug, Default, Clone)]
pub struct Throughput {
    /// adds + gets per second of each round.
    pub rounds: Vec<f64>,
}

impl Throughput {
    /// The median round.
    pub fn median(&self) -> f64 {
        let mut v = self.rounds.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }
}

/// Everything the queue section measured.
#[derive(Debug, Default)]
pub struct QueueResults {
    /// Priority queue, user events alone.
    pub calm_priority: Run,
    /// Priority queue in the storm.
    pub storm_priority: Run,
    /// Priority queue without the kept worker, in the storm.
    pub storm_no_reserve: Run,
    /// FIFO, user events alone.
    pub calm_fifo: Run,
    /// FIFO in the storm.
    pub storm_fifo: Run,
    /// Priority queue (keys over the three tiers).
    pub throughput_priority: Throughput,
    /// FIFO (one tier).
    pub throughput_fifo: Throughput,
}

/// Runs the whole queue section; `seconds` is the length of each run.
pub async fn measure(seconds: u64, progress: impl Fn(&str)) -> Result<QueueResults> {
    let len = Duration::from_secs(seconds);
    ensure!(
        len >= RESYNC_PHASE_END,
        "--queue-seconds must be at least {}",
        RESYNC_PHASE_END.as_secs()
    );
    let mut r = QueueResults::default();
    progress("P9 queue throughput");
    for _ in 0..THROUGHPUT_ROUNDS {
        r.throughput_priority
            .rounds
            .push(throughput(Kind::Priority)?);
        r.throughput_fifo.rounds.push(throughput(Kind::Fifo)?);
    }
    // Calm and storm runs alternate, and the reference runs sit between
    // them, so that a slow moment of the machine does not fall on one run
    // kind only.
    for i in 0..PRIORITY_RUNS {
        progress(&format!(
            "P6-P8 queue: no storm, priority queue ({seconds} s, {}/{PRIORITY_RUNS})",
            i + 1
        ));
        r.calm_priority
            .merge(spawn_run(Kind::Priority, false, len).await?);
        progress(&format!(
            "P6-P8 queue: storm, priority queue ({seconds} s, {}/{PRIORITY_RUNS})",
            i + 1
        ));
        r.storm_priority
            .merge(spawn_run(Kind::Priority, true, len).await?);
        match i {
            0 => {
                progress(&format!("P6-P8 queue: storm, FIFO ({seconds} s)"));
                r.storm_fifo = spawn_run(Kind::Fifo, true, len).await?;
            }
            1 => {
                progress(&format!("P6-P8 queue: no storm, FIFO ({seconds} s)"));
                r.calm_fifo = spawn_run(Kind::Fifo, false, len).await?;
            }
            _ => {
                progress(&format!(
                    "P6-P8 queue: storm, priority queue without a kept worker ({seconds} s)"
                ));
                r.storm_no_reserve = spawn_run(Kind::PriorityNoReserve, true, len).await?;
            }
        }
    }
    Ok(r)
}

/// Runs a scenario as a task of the runtime, as a controller's event
/// handlers run (not on the thread that blocks on the runtime).
async fn spawn_run(kind: Kind, storm: bool, len: Duration) -> Result<Run> {
    tokio::spawn(run(kind, storm, len))
        .await
        .context("queue scenario task")?
}

/// A stand-in for an object of the informer's cache: equal old and new
/// objects make a no-op update.
#[derive(Debug, PartialEq)]
struct Object {
    generation: u64,
}

fn new_queue(kind: Kind, storm: bool) -> WorkQueue<u64> {
    let config = QueueConfig::default()
        .name(format!(
            "{}-{}",
            kind.name(),
            if storm { "storm" } else { "calm" }
        ))
        .max_wait(MAX_WAIT)
        .resync_window(RESYNC_WINDOW);
    WorkQueue::new(match kind {
        Kind::Priority => config.lower_tier_limit(WORKERS - 1),
        Kind::PriorityNoReserve | Kind::Fifo => config,
    })
}

/// Adds one event's key the way each queue would: classified for the
/// priority queue, at one priority and at once for the FIFO.
/// Every key of the scenario is known except the users' new ones, whose
/// events are updates, where being known does not matter.
fn offer(
    q: &WorkQueue<u64>,
    kind: Kind,
    key: u64,
    source: EventSource,
    old: Option<&Object>,
    new: Option<&Object>,
    rng: &mut StdRng,
) {
    if kind == Kind::Fifo {
        q.add(key, Priority::Normal);
        return;
    }
    let d = classify(source, old, new, true, RESYNC_WINDOW, rng);
    match d.delay {
        Some(delay) => q.add_after(key, d.priority, delay),
        None => q.add(key, d.priority),
    }
}

#[derive(Debug, Default)]
struct Record {
    user: Samples,
    storm_served: usize,
    storm_max_wait: Duration,
    reconcile: Samples,
}

async fn run(kind: Kind, storm: bool, len: Duration) -> Result<Run> {
    let q = new_queue(kind, storm);
    let added: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let record: Arc<Mutex<Record>> = Arc::default();
    let start = Instant::now();

    let mut workers = vec![];
    for _ in 0..WORKERS {
        let (q, added, record) = (q.clone(), added.clone(), record.clone());
        workers.push(tokio::spawn(async move {
            while let Some(item) = q.get().await {
                let got = Instant::now();
                {
                    let mut r = lock(&record);
                    if item.key >= USER_KEY_BASE {
                        if let Some(t) = lock(&added).remove(&item.key) {
                            r.user.push(got.saturating_duration_since(t));
                        }
                    } else {
                        r.storm_served += 1;
                        r.storm_max_wait = r.storm_max_wait.max(item.waited);
                    }
                }
                // A blocking sleep on tokio's blocking pool: precise to
                // tens of microseconds (tokio's timer would round a 1 ms
                // sleep up to the next millisecond tick, 1-2 ms), and like
                // a real reconcile's API calls it waits without using CPU.
                let t = Instant::now();
                let slept = tokio::task::spawn_blocking(|| std::thread::sleep(RECONCILE)).await;
                let took = t.elapsed();
                q.done(&item.key);
                slept.context("reconcile task")?;
                lock(&record).reconcile.push(took);
            }
            anyhow::Ok(())
        }));
    }

    // Depth in front of a user event, sampled every millisecond.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (q, stop) = (q.clone(), stop.clone());
        async move {
            let mut samples = vec![];
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let front = match kind {
                    Kind::Fifo => q.len(),
                    Kind::Priority | Kind::PriorityNoReserve => q.depth(Priority::Urgent),
                };
                samples.push((start.elapsed(), front, q.len()));
            }
            samples
        }
    });

    let storm_task = storm.then(|| {
        let q = q.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(2);
            let cached = Object { generation: 1 };
            // The controller restarted: its informer lists every object,
            // all of them known from before.
            for k in 0..KEYS {
                offer(
                    &q,
                    kind,
                    k,
                    EventSource::InitialList,
                    None,
                    Some(&cached),
                    &mut rng,
                );
            }
            tokio::time::sleep_until((start + RESYNC_AT).into()).await;
            // The periodic resync replays the cache: old == new.
            for k in 0..KEYS {
                offer(
                    &q,
                    kind,
                    k,
                    EventSource::Resync,
                    Some(&cached),
                    Some(&cached),
                    &mut rng,
                );
            }
        })
    });

    // User events: a change of a new key every 1/USER_RATE s.
    let period = Duration::from_secs(1) / USER_RATE;
    let mut rng = StdRng::seed_from_u64(3);
    let (old, new) = (Object { generation: 1 }, Object { generation: 2 });
    let mut i = 0u32;
    loop {
        // Offset by half a period: the initial list is in first.
        let at = start + period / 2 + period * i;
        if at >= start + len {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let key = USER_KEY_BASE + u64::from(i);
        lock(&added).insert(key, Instant::now());
        offer(
            &q,
            kind,
            key,
            EventSource::Watch,
            Some(&old),
            Some(&new),
            &mut rng,
        );
        i += 1;
    }
    let wall = start.elapsed();
    if let Some(t) = storm_task {
        t.await.context("storm task")?;
    }
    // Let the last user event through, then stop.
    q.shut_down_with_drain().await;
    for w in workers {
        w.await.context("worker")??;
    }
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.context("sampler")?;

    let record = std::mem::take(&mut *lock(&record));
    ensure!(
        record.user.len() == i as usize,
        "{} of {i} user events were served",
        record.user.len()
    );
    let phase = |from: Duration, to: Duration, pick: fn(&(Duration, usize, usize)) -> usize| {
        let v: Vec<usize> = samples
            .iter()
            .filter(|s| s.0 >= from && s.0 < to)
            .map(pick)
            .collect();
        Depth {
            peak: v.iter().copied().max().unwrap_or(0),
            mean: if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<usize>() as f64 / v.len() as f64
            },
            samples: v.len(),
        }
    };
    Ok(Run {
        runs: 1,
        wall,
        user: record.user,
        front_initial: phase(Duration::ZERO, RESYNC_AT, |s| s.1),
        front_resync: phase(RESYNC_AT, RESYNC_PHASE_END, |s| s.1),
        total_resync: phase(RESYNC_AT, RESYNC_PHASE_END, |s| s.2),
        storm_served: record.storm_served,
        storm_max_wait: record.storm_max_wait,
        reconcile: record.reconcile,
    })
}

/// One round: `add` + `try_get` + `done` of THROUGHPUT_KEYS distinct keys,
/// THROUGHPUT_BATCH waiting at a time, on this thread. Returns (adds +
/// gets) per second.
fn throughput(kind: Kind) -> Result<f64> {
    let q: WorkQueue<u64> = WorkQueue::new(QueueConfig::default().name("throughput"));
    let prio = |k: u64| match kind {
        Kind::Fifo => Priority::Normal,
        Kind::Priority | Kind::PriorityNoReserve => Priority::ALL[(k % 3) as usize],
    };
    let mut gets = 0u64;
    let t = Instant::now();
    let mut k = 0;
    while k < THROUGHPUT_KEYS {
        for j in k..k + THROUGHPUT_BATCH {
            q.add(j, prio(j));
        }
        while let Some(item) = q.try_get() {
            q.done(&item.key);
            gets += 1;
        }
        k += THROUGHPUT_BATCH;
    }
    let elapsed = t.elapsed();
    ensure!(
        gets == THROUGHPUT_KEYS,
        "{gets} of {THROUGHPUT_KEYS} keys came out"
    );
    Ok((THROUGHPUT_KEYS + gets) as f64 / elapsed.as_secs_f64())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
