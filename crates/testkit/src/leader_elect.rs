//! A client-go leader-election candidate: the peer `leader-elect` (built by
//! `make peers` from tools/peers/controller-runtime/leader-elect/main.go with client-go's
//! `leaderelection` package), for tests that put it on the same Lease as
//! Petrel's candidates.
//!
//! It prints `lead <unix ns>` when it becomes leader and `stop <unix ns>`
//! when it stops (before releasing on SIGTERM); a reader thread keeps those
//! events with their wall-clock times. Its stderr (klog) goes to a log file.
//! Dropping a [`GoCandidate`] kills it by pid and reaps it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::process::{describe, kill_child, stop_child};
use crate::KitError;

/// The peer binary's name.
pub const BINARY: &str = "leader-elect";

/// Why client-go candidate tests are left out (`PETREL_PEERS_SKIP` names
/// `controller-runtime`, its component, or `leader-elect`), if they are.
pub fn left_out() -> Option<String> {
    ["controller-runtime", BINARY]
        .into_iter()
        .find(|c| crate::peers::left_out(c))
        .map(|c| format!("{c} left out (PETREL_PEERS_SKIP)"))
}

/// What the candidate reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoEvent {
    /// Became leader.
    Lead,
    /// Stopped leading.
    Stop,
}

/// The Lease and timing a candidate campaigns with.
#[derive(Debug, Clone)]
pub struct GoCandidateOptions {
    /// Admin (or any permitted) kubeconfig.
    pub kubeconfig: PathBuf,
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// `holderIdentity`.
    pub identity: String,
    /// client-go's LeaseDuration, RenewDeadline, RetryPeriod.
    pub timing: (Duration, Duration, Duration),
    /// Where its stderr goes.
    pub log: PathBuf,
}

/// A running `leader-elect`.
#[derive(Debug)]
pub struct GoCandidate {
    child: Option<Child>,
    events: Arc<Mutex<Vec<(GoEvent, SystemTime)>>>,
    log: PathBuf,
    exited: Option<SystemTime>,
}

impl GoCandidate {
    /// Starts a candidate.
    pub fn start(o: &GoCandidateOptions) -> Result<Self, KitError> {
        let bin = crate::peers::peer_binary(BINARY)?;
        let err = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&o.log)
            .map_err(|e| KitError::io("open", &o.log, e))?;
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut cmd = Command::new(&bin);
        cmd.arg(format!("--kubeconfig={}", o.kubeconfig.display()))
            .arg(format!("--namespace={}", o.namespace))
            .arg(format!("--name={}", o.name))
            .arg(format!("--identity={}", o.identity))
            .arg(format!("--lease-duration={}", ms(o.timing.0)))
            .arg(format!("--renew-deadline={}", ms(o.timing.1)))
            .arg(format!("--retry-period={}", ms(o.timing.2)))
            .arg("--v=2")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err);
        let mut child = cmd.spawn().map_err(|e| KitError::Start {
            component: BINARY.into(),
            command: describe(&cmd),
            log: o.log.clone(),
            detail: e.to_string(),
        })?;
        let events = Arc::new(Mutex::new(Vec::new()));
        if let Some(out) = child.stdout.take() {
            let events = events.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let mut w = line.split_whitespace();
                    let ev = match w.next() {
                        Some("lead") => GoEvent::Lead,
                        Some("stop") => GoEvent::Stop,
                        _ => continue,
                    };
                    let Some(ns) = w.next().and_then(|n| n.parse::<u64>().ok()) else {
                        continue;
                    };
                    let at = UNIX_EPOCH + Duration::from_nanos(ns);
                    if let Ok(mut e) = events.lock() {
                        e.push((ev, at));
                    }
                }
            });
        }
        Ok(Self {
            child: Some(child),
            events,
            log: o.log.clone(),
            exited: None,
        })
    }

    /// The events so far, in order, with the candidate's wall-clock times.
    pub fn events(&self) -> Vec<(GoEvent, SystemTime)> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Whether its last event was `Lead`.
    pub fn is_leading(&self) -> bool {
        self.events().last().map(|e| e.0) == Some(GoEvent::Lead)
    }

    /// Its stderr log.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// When it was seen to have exited (reaped by [`terminate`](Self::terminate)
    /// or [`kill`](Self::kill)): a leader killed while leading led until
    /// at most then.
    pub fn exited(&self) -> Option<SystemTime> {
        self.exited
    }

    /// SIGTERM (it stops, releases the Lease and exits), up to `grace`,
    /// then SIGKILL. Returns whether it exited by itself.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        match self.child.take() {
            Some(mut c) => {
                let st = stop_child(&mut c, grace);
                self.exited = Some(SystemTime::now());
                matches!(st, Some((_, false)))
            }
            None => false,
        }
    }

    /// SIGKILL (a crash: no release).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_child(&mut c);
            self.exited = Some(SystemTime::now());
        }
    }
}

impl Drop for GoCandidate {
    fn drop(&mut self) {
        self.kill();
    }
}
