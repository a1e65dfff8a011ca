//! The PodSet sample controllers of the controller kit's tests and
//! benchmark (issue 30): the resource (`bench.petrel.dev/v1` PodSet, its CRD
//! in tools/peers/controller-runtime/crd.yaml), and a launcher for a
//! controller process that speaks the samples' stdout protocol, one line per
//! event with times in Unix nanoseconds on this machine's clock:
//!
//! ```text
//! leading <t>
//! first-reconcile <t>
//! reconciled <namespace>/<name> <generation> <changed-at> <t>
//! stopped-leading <t>
//! ```
//!
//! The reference controller is `podset-controller`, built from
//! controller-runtime by `make peers` (tools/peers/controller-runtime).
//! Every stdout line is also appended to the controller's log, beside its
//! stderr. Dropping a [`Controller`] stops it (SIGTERM, then SIGKILL).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cluster::Cluster;
use crate::kubectl::Kubectl;
use crate::process::{describe, kill_child, stop_child};
use crate::KitError;

/// The PodSet CustomResourceDefinition.
pub const CRD: &str = include_str!("../../../tools/peers/controller-runtime/crd.yaml");

/// The annotation a client stamps a user change with (Unix ns).
pub const CHANGED_AT: &str = "bench.petrel.dev/changed-at";

/// The label a PodSet's Pods carry (the PodSet's name).
pub const POD_LABEL: &str = "bench.petrel.dev/podset";

/// One line of a sample controller's stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// This replica became the leader.
    Leading(i64),
    /// Its first reconcile after becoming the leader.
    FirstReconcile(i64),
    /// A reconcile saw a user change stamped `changed_at`.
    Reconciled {
        /// `namespace/name` of the PodSet.
        key: String,
        /// The generation it saw.
        generation: i64,
        /// The change's stamp ([`CHANGED_AT`]).
        changed_at: i64,
        /// When the reconcile ended.
        at: i64,
    },
    /// It lost or gave up leadership.
    StoppedLeading(i64),
}

impl Event {
    /// Parses one stdout line; None for anything else (logs, blank lines).
    pub fn parse(line: &str) -> Option<Event> {
        let mut w = line.split_whitespace();
        let kind = w.next()?;
        let num = |s: Option<&str>| s.and_then(|s| s.parse::<i64>().ok());
        let ev = match kind {
            "leading" => Event::Leading(num(w.next())?),
            "first-reconcile" => Event::FirstReconcile(num(w.next())?),
            "stopped-leading" => Event::StoppedLeading(num(w.next())?),
            "reconciled" => Event::Reconciled {
                key: w.next()?.to_string(),
                generation: num(w.next())?,
                changed_at: num(w.next())?,
                at: num(w.next())?,
            },
            _ => return None,
        };
        w.next().is_none().then_some(ev)
    }
}

/// Now, in Unix nanoseconds (the stamps' clock).
pub fn unix_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A PodSet manifest: `replicas` busybox Pods, stamped `changed_at`.
pub fn manifest(namespace: &str, name: &str, replicas: u32, changed_at: i64) -> String {
    format!(
        r#"apiVersion: bench.petrel.dev/v1
kind: PodSet
metadata:
  name: {name}
  namespace: {namespace}
  annotations:
    {CHANGED_AT}: "{changed_at}"
spec:
  replicas: {replicas}
  template:
    spec:
      automountServiceAccountToken: false
      containers:
        - name: main
          image: busybox
          command: ["sleep", "3600"]
"#
    )
}

/// Makes `cluster` ready for a sample controller in `namespace`: the CRD
/// installed and Established, and the namespace's `default`
/// ServiceAccount (no controller-manager runs; Pod admission wants it).
/// Returns a kubectl on the cluster.
pub fn prepare(cluster: &Cluster, namespace: &str) -> Result<Kubectl, KitError> {
    let kc = cluster.kubectl()?;
    kc.apply(CRD)?;
    kc.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/podsets.bench.petrel.dev",
    ])?;
    kc.ok(&["create", "serviceaccount", "default", "-n", namespace])?;
    Ok(kc)
}

/// The Lease duration the tests and the benchmark's handoffs use.
pub const LEASE_DURATION: Duration = Duration::from_secs(4);

/// The leader-election timing flags for [`LEASE_DURATION`]: renew deadline
/// 3 s, retry 250 ms.
pub const LEASE_TIMING: [&str; 6] = [
    "--lease-duration",
    "4s",
    "--renew-deadline",
    "3s",
    "--retry-period",
    "250ms",
];

/// The arguments both sample controllers take to run on `cluster` with
/// leader election on the Lease `namespace/lease` ([`LEASE_TIMING`]), or
/// without (`lease` None).
pub fn args(cluster: &Cluster, namespace: &str, lease: Option<&str>) -> Vec<String> {
    let mut args = vec![
        "--kubeconfig".to_string(),
        cluster.admin_kubeconfig().display().to_string(),
    ];
    if let Some(lease) = lease {
        for a in [
            "--leader-elect",
            "--leader-election-id",
            lease,
            "--leader-election-namespace",
            namespace,
        ]
        .into_iter()
        .chain(LEASE_TIMING)
        {
            args.push(a.to_string());
        }
    }
    args
}

/// The Pods of PodSet `set` in `namespace` (by [`POD_LABEL`]).
pub fn pods_of(
    kc: &Kubectl,
    namespace: &str,
    set: &str,
) -> Result<Vec<serde_json::Value>, KitError> {
    let sel = format!("{POD_LABEL}={set}");
    let list = kc.get_json(&["pods", "-n", namespace, "-l", &sel])?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// Whether PodSet `set` has exactly `replicas` Pods, each controlled by it,
/// and a status of `replicas` for its current generation.
pub fn converged(kc: &Kubectl, namespace: &str, set: &str, replicas: u32) -> bool {
    let pods_ok = pods_of(kc, namespace, set).is_ok_and(|pods| {
        pods.len() == replicas as usize
            && pods.iter().all(|p| {
                let owner = &p["metadata"]["ownerReferences"][0];
                owner["kind"] == "PodSet" && owner["name"] == set && owner["controller"] == true
            })
    });
    pods_ok
        && kc
            .get_json(&["podsets.bench.petrel.dev", set, "-n", namespace])
            .is_ok_and(|ps| {
                ps["status"]["replicas"] == replicas
                    && ps["status"]["observedGeneration"] == ps["metadata"]["generation"]
            })
}

/// Polls `ok` every 100 ms until it holds. Panics (the test's failure)
/// naming `what` when it does not within `within`.
pub fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A running sample controller.
#[derive(Debug)]
pub struct Controller {
    child: Child,
    events: Receiver<Event>,
    log: PathBuf,
    command: String,
}

impl Controller {
    /// Starts `bin` with `args`, its output in `log`.
    pub fn start(bin: &Path, args: &[String], log: &Path) -> Result<Controller, KitError> {
        let mut cmd = Command::new(bin);
        cmd.args(args).env_remove("KUBECONFIG");
        let command = describe(&cmd);
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| KitError::io("open", log, e))?;
        let err = out.try_clone().map_err(|e| KitError::io("open", log, e))?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| KitError::Start {
                component: "controller".into(),
                command: command.clone(),
                log: log.to_path_buf(),
                detail: e.to_string(),
            })?;
        let (tx, events) = mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut out = out;
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let _ = writeln!(out, "{line}");
                    if let Some(ev) = Event::parse(&line) {
                        if tx.send(ev).is_err() {
                            break;
                        }
                    }
                }
            });
        }
        Ok(Controller {
            child,
            events,
            log: log.to_path_buf(),
            command,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log (stdout and stderr).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The next event matching `want` within `within`; other events are
    /// dropped. Fails naming the command and its log.
    pub fn wait_for(
        &mut self,
        within: Duration,
        what: &str,
        mut want: impl FnMut(&Event) -> bool,
    ) -> Result<Event, KitError> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(ev) if want(&ev) => return Ok(ev),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return Err(self.failed(what, "not seen in time")),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.failed(what, "the controller's stdout closed"))
                }
            }
        }
    }

    /// Every event received so far, without waiting.
    pub fn drain(&mut self) -> Vec<Event> {
        self.events.try_iter().collect()
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Returns whether it
    /// exited by itself.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        matches!(stop_child(&mut self.child, grace), Some((_, false)))
    }

    /// SIGKILL (a crash).
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    fn failed(&self, what: &str, detail: &str) -> KitError {
        KitError::Start {
            component: "controller".into(),
            command: self.command.clone(),
            log: self.log.clone(),
            detail: format!("{what}: {detail}"),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_should_read_every_event_and_nothing_else() {
        assert_eq!(Event::parse("leading 12"), Some(Event::Leading(12)));
        assert_eq!(
            Event::parse("first-reconcile 13"),
            Some(Event::FirstReconcile(13))
        );
        assert_eq!(
            Event::parse("stopped-leading 14"),
            Some(Event::StoppedLeading(14))
        );
        assert_eq!(
            Event::parse("reconciled ns/a 3 100 150"),
            Some(Event::Reconciled {
                key: "ns/a".into(),
                generation: 3,
                changed_at: 100,
                at: 150
            })
        );
        for other in [
            "",
            "leading",
            "leading x",
            "leading 1 2",
            "reconciled ns/a 3 100",
            "I1128 log line",
        ] {
            assert_eq!(Event::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn manifest_should_stamp_the_change_and_name_the_replicas() {
        let m = manifest("ns", "a", 2, 42);
        assert!(m.contains("bench.petrel.dev/changed-at: \"42\""));
        assert!(m.contains("replicas: 2"));
        assert!(m.contains("namespace: ns"));
    }
}
