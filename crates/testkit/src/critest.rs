//! One critest run against a CRI endpoint, and its per-spec results from
//! ginkgo's JSON report.
//!
//! critest's networking and streaming specs use fixed host ports
//! (12000-12003), so runs on one host are serialized by an exclusive lock
//! on [`LOCK_FILE`], whoever runs them.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::process::{describe, spawn_logged, stop_child, tail};
use crate::KitError;

/// The host-wide lock serializing critest runs.
pub const LOCK_FILE: &str = "/tmp/petrel-critest.lock";

/// How a spec ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Passed.
    Pass,
    /// Failed, panicked, timed out, was interrupted or aborted.
    Fail,
    /// Skipped (by the spec itself or by critest's filters) or pending.
    Skip,
}

impl Outcome {
    /// `PASS`, `FAIL` or `SKIP`, as the expected lists write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Skip => "SKIP",
        }
    }
}

/// One spec's result.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecResult {
    /// The full spec text: the containers' texts and the leaf's, joined by
    /// spaces (as ginkgo prints it).
    pub text: String,
    /// How it ended.
    pub outcome: Outcome,
    /// The failure (or skip) message, empty when it passed.
    pub message: String,
    /// Where it failed (`file:line`), when it did.
    pub location: String,
    /// How long it ran.
    pub seconds: f64,
}

/// An exclusive hold on [`LOCK_FILE`], released on drop.
pub struct CritestLock {
    _file: std::fs::File,
}

impl CritestLock {
    /// Takes the lock, waiting (and saying so on stderr) while another run
    /// holds it.
    pub fn acquire() -> Result<CritestLock, KitError> {
        use rustix::fs::{flock, FlockOperation};
        let file = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .map_err(|e| KitError::io("open", LOCK_FILE, e))?;
        if flock(file.as_fd(), FlockOperation::NonBlockingLockExclusive).is_err() {
            eprintln!("critest: waiting for another critest run on this host ({LOCK_FILE})");
            flock(file.as_fd(), FlockOperation::LockExclusive)
                .map_err(|e| KitError::io("lock", LOCK_FILE, e.into()))?;
        }
        Ok(CritestLock { _file: file })
    }
}

/// What to run critest against.
#[derive(Debug, Clone)]
pub struct CritestRun {
    /// The critest binary.
    pub critest: PathBuf,
    /// `unix:///…` of the runtime (also its image endpoint).
    pub endpoint: String,
    /// The runtime's NRI socket: NRI specs are skipped without one.
    pub nri_socket: Option<PathBuf>,
    /// Where ginkgo's JSON report goes.
    pub report: PathBuf,
    /// Where critest's output goes.
    pub log: PathBuf,
    /// The whole run's limit (critest is killed after it).
    pub timeout: Duration,
    /// More arguments, after the kit's own (e.g. `-benchmark`).
    pub extra_args: Vec<String>,
}

impl CritestRun {
    /// critest's command line.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.critest);
        cmd.arg(format!("-runtime-endpoint={}", self.endpoint))
            .arg(format!("-image-endpoint={}", self.endpoint))
            .arg(format!("-ginkgo.json-report={}", self.report.display()))
            .arg("-ginkgo.no-color")
            .arg(format!("-ginkgo.timeout={}s", self.timeout.as_secs()));
        if let Some(nri) = &self.nri_socket {
            cmd.arg(format!("-nri-socket={}", nri.display()));
        }
        cmd.args(&self.extra_args);
        cmd
    }

    /// Runs critest (the caller holds the [`CritestLock`]) and returns every
    /// spec's result. critest failing specs is not an error; no report is.
    /// `tick` runs about every second while critest runs.
    pub fn run(&self, mut tick: impl FnMut()) -> Result<Vec<SpecResult>, KitError> {
        let _ = std::fs::remove_file(&self.report);
        let mut cmd = self.command();
        // critest writes nothing of its own there; its cwd is kept apart all
        // the same (a relative report path would then miss).
        if let Some(parent) = self.report.parent().filter(|_| self.report.is_absolute()) {
            cmd.current_dir(parent);
        }
        let command = describe(&cmd);
        let mut child = spawn_logged("critest", &mut cmd, &self.log)?;
        let start = Instant::now();
        let mut last_tick = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) => {}
                Err(_) => break None,
            }
            // ginkgo's own timeout ends it first; this is the backstop.
            if start.elapsed() > self.timeout + Duration::from_secs(120) {
                stop_child(&mut child, Duration::from_secs(5));
                break None;
            }
            if last_tick.elapsed() >= Duration::from_secs(1) {
                tick();
                last_tick = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let text = std::fs::read_to_string(&self.report).map_err(|e| KitError::Run {
            component: "critest".into(),
            detail: format!(
                "no JSON report at {} ({e}); exit {status:?}; command: {command}; last output:\n{}",
                self.report.display(),
                tail(&self.log, 20)
            ),
            log: self.log.clone(),
        })?;
        parse_report(&text).map_err(|detail| KitError::Run {
            component: "critest".into(),
            detail: format!("report {}: {detail}", self.report.display()),
            log: self.log.clone(),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SuiteReport {
    #[serde(default)]
    spec_reports: Option<Vec<SpecReport>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SpecReport {
    /// `null` for suite nodes.
    #[serde(default)]
    container_hierarchy_texts: Option<Vec<String>>,
    #[serde(default)]
    leaf_node_type: String,
    #[serde(default)]
    leaf_node_text: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    run_time: i64,
    #[serde(default)]
    failure: Option<Failure>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Failure {
    #[serde(default)]
    message: String,
    #[serde(default)]
    location: Option<Location>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Location {
    #[serde(default)]
    file_name: String,
    #[serde(default)]
    line_number: i64,
}

/// The specs (`It` nodes) of a ginkgo JSON report, in report order; suite
/// set-up nodes are left out.
pub fn parse_report(json: &str) -> Result<Vec<SpecResult>, String> {
    let suites: Vec<SuiteReport> =
        serde_json::from_str(json).map_err(|e| format!("not a ginkgo JSON report: {e}"))?;
    let mut out = Vec::new();
    for s in suites {
        for r in s.spec_reports.unwrap_or_default() {
            if r.leaf_node_type != "It" {
                continue;
            }
            let mut text = r.container_hierarchy_texts.unwrap_or_default().join(" ");
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(&r.leaf_node_text);
            let outcome = match r.state.as_str() {
                "passed" => Outcome::Pass,
                "skipped" | "pending" => Outcome::Skip,
                _ => Outcome::Fail,
            };
            let (message, location) = match (&r.failure, outcome) {
                (Some(f), Outcome::Fail | Outcome::Skip) => (
                    f.message.trim().to_string(),
                    f.location
                        .as_ref()
                        .filter(|l| !l.file_name.is_empty())
                        .map(|l| format!("{}:{}", short_path(&l.file_name), l.line_number))
                        .unwrap_or_default(),
                ),
                _ => (String::new(), String::new()),
            };
            out.push(SpecResult {
                text,
                outcome,
                message,
                location,
                seconds: r.run_time as f64 / 1e9,
            });
        }
    }
    Ok(out)
}

/// A source path from the module cache, from the module on.
fn short_path(p: &str) -> String {
    match p.find("cri-tools") {
        Some(i) => p[i..].to_string(),
        None => Path::new(p)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }
}

/// (passed, failed, skipped).
pub fn counts(results: &[SpecResult]) -> (usize, usize, usize) {
    let n = |o| results.iter().filter(|r| r.outcome == o).count();
    (n(Outcome::Pass), n(Outcome::Fail), n(Outcome::Skip))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const REPORT: &str = r#"[{"SuitePath":"/x","SuiteSucceeded":false,"SpecReports":[
      {"ContainerHierarchyTexts":null,"LeafNodeType":"SynchronizedBeforeSuite","LeafNodeText":"","State":"passed","RunTime":1},
      {"ContainerHierarchyTexts":["[sig-node] Container","runtime should support basic operations on container"],
       "LeafNodeType":"It","LeafNodeText":"runtime should support creating container [Conformance]","State":"passed","RunTime":1500000000},
      {"ContainerHierarchyTexts":["[sig-node] Image Manager"],"LeafNodeType":"It",
       "LeafNodeText":"public image with digest should be pulled and removed [Conformance]","State":"failed","RunTime":2000000000,
       "Failure":{"Message":"rpc error: code = NotFound\n","Location":{"FileName":"/root/go/pkg/mod/sigs.k8s.io/cri-tools@v1.37.0/pkg/framework/util.go","LineNumber":340}}},
      {"ContainerHierarchyTexts":["[sig-node] AppArmor"],"LeafNodeType":"It","LeafNodeText":"should fail","State":"skipped","RunTime":0,
       "Failure":{"Message":"apparmor not enabled","Location":{"FileName":"a.go","LineNumber":3}}},
      {"ContainerHierarchyTexts":["[sig-node] X"],"LeafNodeType":"It","LeafNodeText":"times out","State":"timedout","RunTime":0}
    ]}]"#;

    #[test]
    fn parse_report_should_keep_specs_with_full_text_outcome_and_failure() {
        let r = parse_report(REPORT).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.len(), 4, "the suite node is left out");
        assert_eq!(
            r[0].text,
            "[sig-node] Container runtime should support basic operations on container runtime should support creating container [Conformance]"
        );
        assert_eq!(r[0].outcome, Outcome::Pass);
        assert!(r[0].message.is_empty());
        assert!((r[0].seconds - 1.5).abs() < 1e-9);
        assert_eq!(r[1].outcome, Outcome::Fail);
        assert_eq!(r[1].message, "rpc error: code = NotFound");
        assert_eq!(r[1].location, "cri-tools@v1.37.0/pkg/framework/util.go:340");
        assert_eq!(r[2].outcome, Outcome::Skip);
        assert_eq!(r[2].message, "apparmor not enabled");
        assert_eq!(r[3].outcome, Outcome::Fail, "a timeout is a failure");
        assert_eq!(counts(&r), (1, 2, 1));
    }

    #[test]
    fn parse_report_should_reject_what_is_not_a_report() {
        assert!(parse_report("{}").is_err());
        assert!(parse_report("not json").is_err());
    }

    #[test]
    fn command_should_name_both_endpoints_the_report_and_nri() {
        let run = CritestRun {
            critest: "/bin/critest".into(),
            endpoint: "unix:///tmp/s.sock".into(),
            nri_socket: Some("/tmp/nri.sock".into()),
            report: "/tmp/r.json".into(),
            log: "/tmp/l".into(),
            timeout: Duration::from_secs(900),
            extra_args: vec!["-benchmark".into()],
        };
        let line = describe(&run.command());
        for a in [
            "-runtime-endpoint=unix:///tmp/s.sock",
            "-image-endpoint=unix:///tmp/s.sock",
            "-ginkgo.json-report=/tmp/r.json",
            "-nri-socket=/tmp/nri.sock",
            "-ginkgo.timeout=900s",
            "-benchmark",
        ] {
            assert!(line.contains(a), "{line}");
        }
        assert!(!line.contains("parallel"), "default parallelism: {line}");
    }
}
