//! Liveness, readiness and startup probes: one task per probe of each
//! running container instance, results kept for the status, and the pod
//! handed to a [`ChangeSink`] (in the agent: queued for a sync) whenever a
//! result changes.
//!
//! Like kubelet: liveness and readiness wait until the startup probe has
//! passed; a result changes only after `successThreshold` successes or
//! `failureThreshold` failures in a row; a container without a readiness
//! probe is ready when running; a failed liveness or startup probe asks the
//! pod worker to restart the container.

mod run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};
use tokio::task::JoinHandle;

use crate::cri::RuntimeActuator;
use crate::types::PodUid;

pub use run::{probe_once, Outcome};

/// What the probes of one container instance say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeResults {
    /// Readiness (None: no readiness probe).
    pub ready: Option<bool>,
    /// Startup (None: no startup probe).
    pub started: Option<bool>,
    /// Liveness or startup failed: restart the container. With why.
    pub kill_reason: Option<String>,
}

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Liveness,
    Readiness,
    Startup,
}

struct Instance {
    container_id: String,
    results: Arc<Mutex<ProbeResults>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Why a probe result changed, for the queue's priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeChange {
    /// A liveness or startup probe failed: the container must restart.
    Kill,
    /// Readiness or startup state changed: the status must be republished.
    Status,
}

/// Where probe changes go: called from the probe's task, it must not
/// block (the agent's queues the pod's sync, urgently for a kill).
pub type ChangeSink = Arc<dyn Fn(&str, ProbeChange) + Send + Sync>;

/// All probe tasks of the agent.
pub struct ProbeManager {
    runtime: Arc<dyn RuntimeActuator>,
    changes: ChangeSink,
    instances: Mutex<HashMap<(PodUid, String), Instance>>,
}

impl ProbeManager {
    /// Probe changes are reported to `changes`.
    pub fn new(runtime: Arc<dyn RuntimeActuator>, changes: ChangeSink) -> Self {
        Self {
            runtime,
            changes,
            instances: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(PodUid, String), Instance>> {
        self.instances.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes sure the probes of `container` run against the running
    /// instance `container_id` (restarting them for a new instance).
    /// `host` is the address HTTP and TCP probes use (the pod's IP).
    pub fn ensure(
        &self,
        uid: &str,
        container: &Container,
        container_id: &str,
        host: Option<String>,
    ) {
        let key = (uid.to_string(), container.name.clone());
        let mut g = self.lock();
        if g.get(&key).is_some_and(|i| i.container_id == container_id) {
            return;
        }
        let results = Arc::new(Mutex::new(ProbeResults {
            ready: container.readiness_probe.as_ref().map(|_| false),
            started: container.startup_probe.as_ref().map(|_| false),
            kill_reason: None,
        }));
        let mut tasks = Vec::new();
        for (kind, probe) in [
            (Kind::Startup, &container.startup_probe),
            (Kind::Liveness, &container.liveness_probe),
            (Kind::Readiness, &container.readiness_probe),
        ] {
            let Some(probe) = probe.clone() else { continue };
            let w = ProbeWorker {
                runtime: Arc::clone(&self.runtime),
                changes: Arc::clone(&self.changes),
                uid: uid.to_string(),
                container: container.clone(),
                container_id: container_id.to_string(),
                host: host.clone(),
                kind,
                probe,
                results: Arc::clone(&results),
            };
            tasks.push(tokio::spawn(w.run()));
        }
        // Replacing the old instance aborts its tasks (Drop).
        g.insert(
            key,
            Instance {
                container_id: container_id.to_string(),
                results,
                tasks,
            },
        );
    }

    /// The results for the instance `container_id` of `uid/name`
    /// (defaults when it has no probes running).
    pub fn results(&self, uid: &str, name: &str, container_id: &str) -> ProbeResults {
        let g = self.lock();
        match g.get(&(uid.to_string(), name.to_string())) {
            Some(i) if i.container_id == container_id => i
                .results
                .lock()
                .map(|r| r.clone())
                .unwrap_or_else(|p| p.into_inner().clone()),
            _ => ProbeResults::default(),
        }
    }

    /// Stops the probes of `uid/name` (the container is not running).
    pub fn remove(&self, uid: &str, name: &str) {
        self.lock().remove(&(uid.to_string(), name.to_string()));
    }

    /// Stops every probe of the pod `uid`.
    pub fn remove_pod(&self, uid: &str) {
        self.lock().retain(|(u, _), _| u != uid);
    }
}

struct ProbeWorker {
    runtime: Arc<dyn RuntimeActuator>,
    changes: ChangeSink,
    uid: String,
    container: Container,
    container_id: String,
    host: Option<String>,
    kind: Kind,
    probe: Probe,
    results: Arc<Mutex<ProbeResults>>,
}

impl ProbeWorker {
    fn started(&self) -> bool {
        self.results
            .lock()
            .map(|r| r.started != Some(false))
            .unwrap_or(true)
    }

    async fn run(self) {
        let period = Duration::from_secs(self.probe.period_seconds.unwrap_or(10).max(1) as u64);
        let initial =
            Duration::from_secs(self.probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
        let success_threshold = self.probe.success_threshold.unwrap_or(1).max(1);
        let failure_threshold = self.probe.failure_threshold.unwrap_or(3).max(1);
        tokio::time::sleep(initial).await;
        let (mut successes, mut failures) = (0i32, 0i32);
        loop {
            // Liveness and readiness wait for the startup probe.
            if self.kind == Kind::Startup || self.started() {
                let outcome = probe_once(
                    self.runtime.as_ref(),
                    &self.probe,
                    &self.container,
                    &self.container_id,
                    self.host.as_deref(),
                )
                .await;
                match outcome {
                    Outcome::Success => {
                        failures = 0;
                        successes += 1;
                        if successes >= success_threshold
                            && self.record(true, None)
                            && self.kind == Kind::Startup
                        {
                            // A startup probe stops once it has passed.
                            return;
                        }
                    }
                    Outcome::Failure(why) => {
                        successes = 0;
                        failures += 1;
                        tracing::debug!(uid = %self.uid, container = %self.container.name, probe = ?self.kind, %why, "probe failed");
                        if failures >= failure_threshold {
                            let stop = matches!(self.kind, Kind::Liveness | Kind::Startup);
                            self.record(false, Some(why));
                            if stop {
                                // The container will be restarted; a new
                                // instance gets new probes.
                                return;
                            }
                        }
                    }
                }
            }
            tokio::time::sleep(period).await;
        }
    }

    /// Stores a result; reports and returns true if it changed.
    fn record(&self, ok: bool, why: Option<String>) -> bool {
        let change = {
            let mut r = self.results.lock().unwrap_or_else(|p| p.into_inner());
            match self.kind {
                Kind::Readiness => {
                    let changed = r.ready != Some(ok);
                    r.ready = Some(ok);
                    changed.then_some(ProbeChange::Status)
                }
                Kind::Startup if ok => {
                    let changed = r.started != Some(true);
                    r.started = Some(true);
                    changed.then_some(ProbeChange::Status)
                }
                Kind::Liveness if ok => None,
                Kind::Startup | Kind::Liveness => {
                    let what = if self.kind == Kind::Startup {
                        "Startup"
                    } else {
                        "Liveness"
                    };
                    r.kill_reason =
                        Some(format!("{what} probe failed: {}", why.unwrap_or_default()));
                    Some(ProbeChange::Kill)
                }
            }
        };
        match change {
            Some(c) => {
                (self.changes)(&self.uid, c);
                true
            }
            None => ok,
        }
    }
}
