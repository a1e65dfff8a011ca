//! critest's benchmark mode (`critest -benchmark`) against a runtime, on the
//! same set-up as a conformance run: its parameters file, and the per-
//! operation durations it measures, read back from the files it writes
//! (`<op group>_benchmark_data.json`) and from the ginkgo report (the
//! "start a container from scratch" experiment, which writes no file).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::conformance::{absolute_dir, runc, with_runtime, Target};
use crate::critest::{CritestRun, Outcome, SpecResult};
use crate::KitError;

/// How many samples critest takes of each benchmark (its params file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchParams {
    /// Pod lifecycles (run, status, stop, remove).
    pub pods: usize,
    /// Container lifecycles (create, start, status, stop, remove).
    pub containers: usize,
    /// Image lifecycles (pull, status, remove) and image listings.
    pub images: usize,
    /// How many of each run at once.
    pub parallel: usize,
}

impl BenchParams {
    /// critest's `--benchmarking-params-file` (YAML; JSON is YAML). Each
    /// timeout is generous: a slow sample is a figure, not a failure.
    pub fn params_file(&self) -> String {
        format!(
            concat!(
                "{{\"containersNumber\": {c}, \"containersNumberParallel\": {p}, ",
                "\"containerBenchmarkTimeoutSeconds\": 600, ",
                "\"podsNumber\": {n}, \"podsNumberParallel\": {p}, ",
                "\"podBenchmarkTimeoutSeconds\": 600, ",
                "\"imagesNumber\": {i}, \"imagesNumberParallel\": {p}, ",
                "\"imageBenchmarkTimeoutSeconds\": 600, ",
                "\"podContainerStartBenchmarkTimeoutSeconds\": 60}}\n"
            ),
            c = self.containers,
            n = self.pods,
            i = self.images,
            p = self.parallel.max(1),
        )
    }
}

/// One CRI operation's samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    /// critest's name for it (`CreatePod`, `StatusContainer`, `PullImage`…;
    /// `RunPod+CreateContainer+StartContainer+StopPod+RemovePod` for the
    /// start-from-scratch experiment).
    pub name: String,
    /// Every sample, in critest's order.
    pub samples: Vec<Duration>,
}

impl Operation {
    /// The median sample (the upper one of an even count); `None` when
    /// there is none.
    pub fn median(&self) -> Option<Duration> {
        let mut s = self.samples.clone();
        s.sort();
        s.get(s.len() / 2).copied()
    }
}

/// A finished benchmark run.
#[derive(Debug, Clone)]
pub struct BenchRun {
    /// [`Target::name`].
    pub name: String,
    /// The operations in critest's order (pods, containers, images, image
    /// listing, start from scratch); a group whose spec failed is missing.
    pub operations: Vec<Operation>,
    /// The benchmark specs' results (a failed one says why its group is
    /// missing); the report's other specs, not focused, are left out.
    pub specs: Vec<SpecResult>,
    /// How long critest ran.
    pub critest_seconds: f64,
}

impl BenchRun {
    /// The operation named `name`.
    pub fn operation(&self, name: &str) -> Option<&Operation> {
        self.operations.iter().find(|o| o.name == name)
    }

    /// The specs that did not pass, as `spec: message` lines.
    pub fn failures(&self) -> Vec<String> {
        self.specs
            .iter()
            .filter(|s| s.outcome != Outcome::Pass)
            .map(|s| format!("{} ({}): {}", s.text, s.outcome.as_str(), s.message))
            .collect()
    }
}

/// The files critest writes, in the order it runs their specs.
const DATA_FILES: [&str; 4] = [
    "pod_benchmark_data.json",
    "container_benchmark_data.json",
    "image_lifecycle_benchmark_data.json",
    "image_listing_benchmark_data.json",
];

/// The name of the start-from-scratch experiment's one operation.
pub const FROM_SCRATCH: &str = "PodAndContainerFromScratch";

/// Runs `critest -benchmark` against `target` with `params`, writing into
/// `out/<name>-benchmark/`. Fails when something the run needs is missing
/// or critest writes no report; a failed benchmark spec leaves its
/// operations out (see [`BenchRun::failures`]).
pub fn run(target: &Target, params: &BenchParams, out: &Path) -> Result<BenchRun, KitError> {
    let name = target.name();
    let dir = absolute_dir(&out.join(format!("{name}-benchmark")))?;
    for f in DATA_FILES {
        let _ = std::fs::remove_file(dir.join(f));
    }
    let params_path = dir.join("params.yaml");
    std::fs::write(&params_path, params.params_file())
        .map_err(|e| KitError::io("write", &params_path, e))?;
    let report = dir.join("report.json");
    let start = Instant::now();
    let specs = with_runtime(
        target,
        &runc(),
        &dir.join("runtime.log"),
        |critest, endpoint, nri, tick| {
            CritestRun {
                critest: critest.to_path_buf(),
                endpoint: endpoint.to_string(),
                nri_socket: Some(nri.to_path_buf()),
                report: report.clone(),
                log: dir.join("critest.log"),
                timeout: Duration::from_secs(3600),
                extra_args: vec![
                    "-benchmark".into(),
                    format!("-benchmarking-params-file={}", params_path.display()),
                    format!("-benchmarking-output-dir={}", dir.display()),
                ],
            }
            .run(tick)
        },
    )?;
    let critest_seconds = start.elapsed().as_secs_f64();
    // The report lists every spec; only the benchmarks were focused.
    let specs: Vec<SpecResult> = specs
        .into_iter()
        .filter(|s| s.text.contains("benchmark"))
        .collect();
    let mut operations = Vec::new();
    for f in DATA_FILES {
        let path = dir.join(f);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                operations.extend(parse_lifecycle(&text).map_err(|detail| bad_file(&path, detail))?)
            }
            // The spec failed (or was skipped) before writing it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(KitError::io("read", &path, e)),
        }
    }
    let text = std::fs::read_to_string(&report).map_err(|e| KitError::io("read", &report, e))?;
    if let Some(op) = parse_from_scratch(&text).map_err(|detail| bad_file(&report, detail))? {
        operations.push(op);
    }
    Ok(BenchRun {
        name: name.to_string(),
        operations,
        specs,
        critest_seconds,
    })
}

fn bad_file(path: &Path, detail: String) -> KitError {
    KitError::Run {
        component: "critest -benchmark".into(),
        detail: format!("{}: {detail}", path.display()),
        log: PathBuf::from(path),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResultsSet {
    operations_names: Vec<String>,
    #[serde(default)]
    datapoints: Vec<Datapoint>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Datapoint {
    operations_durations_ns: Vec<i64>,
}

/// The operations of one `*_benchmark_data.json`: one per name, each with
/// its duration from every datapoint.
pub fn parse_lifecycle(json: &str) -> Result<Vec<Operation>, String> {
    let set: ResultsSet = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let mut ops: Vec<Operation> = set
        .operations_names
        .iter()
        .map(|n| Operation {
            name: n.clone(),
            samples: Vec::with_capacity(set.datapoints.len()),
        })
        .collect();
    for (i, d) in set.datapoints.iter().enumerate() {
        if d.operations_durations_ns.len() != ops.len() {
            return Err(format!(
                "datapoint {i} has {} durations for {} operations",
                d.operations_durations_ns.len(),
                ops.len()
            ));
        }
        for (op, ns) in ops.iter_mut().zip(&d.operations_durations_ns) {
            let ns = u64::try_from(*ns).map_err(|_| format!("datapoint {i}: negative duration"))?;
            op.samples.push(Duration::from_nanos(ns));
        }
    }
    Ok(ops)
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Suite {
    #[serde(default)]
    spec_reports: Option<Vec<Spec>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Spec {
    #[serde(default)]
    report_entries: Option<Vec<Entry>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    name: String,
    value: EntryValue,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct EntryValue {
    #[serde(default, rename = "AsJSON")]
    as_json: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Experiment {
    #[serde(default)]
    measurements: Vec<Measurement>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Measurement {
    #[serde(default)]
    durations: Option<Vec<i64>>,
}

/// The start-from-scratch experiment's durations from ginkgo's JSON report
/// (gmeasure records it as a report entry); `None` when the report has no
/// such entry or it holds no duration.
pub fn parse_from_scratch(report_json: &str) -> Result<Option<Operation>, String> {
    // ginkgo writes an array of suites.
    let suites: Vec<Suite> = serde_json::from_str(report_json).map_err(|e| e.to_string())?;
    let mut samples = Vec::new();
    let entries = suites
        .iter()
        .flat_map(|s| s.spec_reports.iter().flatten())
        .flat_map(|s| s.report_entries.iter().flatten())
        .filter(|e| e.name == "start-container-benchmark");
    for e in entries {
        let exp: Experiment = serde_json::from_str(&e.value.as_json)
            .map_err(|err| format!("start-container-benchmark entry: {err}"))?;
        for ns in exp
            .measurements
            .iter()
            .flat_map(|m| m.durations.iter().flatten())
        {
            let ns = u64::try_from(*ns).map_err(|_| "negative duration".to_string())?;
            samples.push(Duration::from_nanos(ns));
        }
    }
    Ok((!samples.is_empty()).then(|| Operation {
        name: FROM_SCRATCH.to_string(),
        samples,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn parse_lifecycle_should_split_durations_by_operation() {
        let json = r#"{"operationsNames":["CreatePod","StatusPod"],"numParallel":1,
            "datapoints":[{"sampleIndex":0,"startTime":1,"endTime":2,"operationsDurationsNs":[3000000,1000000],"metaInfo":{}},
                          {"sampleIndex":1,"startTime":1,"endTime":2,"operationsDurationsNs":[5000000,2000000],"metaInfo":null}]}"#;
        let ops = parse_lifecycle(json).unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].name, "CreatePod");
        assert_eq!(
            ops[0].samples,
            vec![Duration::from_millis(3), Duration::from_millis(5)]
        );
        assert_eq!(ops[1].median(), Some(Duration::from_millis(2)));
    }

    #[test]
    fn parse_lifecycle_should_reject_a_short_datapoint() {
        let json = r#"{"operationsNames":["A","B"],"datapoints":[{"operationsDurationsNs":[1]}]}"#;
        assert!(parse_lifecycle(json)
            .unwrap_err()
            .contains("1 durations for 2"));
        assert!(parse_lifecycle("[]").is_err());
    }

    #[test]
    fn parse_from_scratch_should_read_the_gmeasure_entry() {
        let exp = r#"{"Name":"start-container-benchmark","Measurements":[{"Type":2,"Name":"create PodSandbox and container","Durations":[120000000]}]}"#;
        let report = serde_json::json!([{"SpecReports":[
            {"ReportEntries":null},
            {"ReportEntries":[{"Name":"other","Value":{"AsJSON":"{}"}},
                              {"Name":"start-container-benchmark","Value":{"AsJSON":exp}}]}]}]);
        let op = parse_from_scratch(&report.to_string()).unwrap().unwrap();
        assert_eq!(op.name, FROM_SCRATCH);
        assert_eq!(op.samples, vec![Duration::from_millis(120)]);
        let none = serde_json::json!([{"SpecReports":[{"ReportEntries":[]}]}]);
        assert_eq!(parse_from_scratch(&none.to_string()).unwrap(), None);
    }

    #[test]
    fn params_file_should_set_every_count_and_at_least_one_in_parallel() {
        let p = BenchParams {
            pods: 7,
            containers: 8,
            images: 9,
            parallel: 0,
        }
        .params_file();
        for want in [
            "\"podsNumber\": 7",
            "\"containersNumber\": 8",
            "\"imagesNumber\": 9",
            "\"podsNumberParallel\": 1",
        ] {
            assert!(p.contains(want), "{p}");
        }
    }

    #[test]
    fn median_should_be_none_without_samples() {
        let op = Operation {
            name: "x".into(),
            samples: vec![],
        };
        assert_eq!(op.median(), None);
    }
}
