//! A whole conformance run: the kit's registry and mirrors, a pod network,
//! a runtime under test, critest against it (holding the host-wide critest
//! lock throughout), and the results kept in an output directory:
//! `<name>.report.json` (ginkgo's), `<name>.critest.log`, `<name>.runtime.log`
//! and `<name>.results.tsv` (outcome, seconds, spec).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::critest::{counts, CritestLock, CritestRun, Outcome, SpecResult};
use crate::images::ConformanceImages;
use crate::network::PodNetwork;
pub use crate::petrel::CgroupDriver;
use crate::petrel::{PetrelOptions, PetrelRuntime};
use crate::registry::{write_mirror_config, LocalRegistry};
use crate::KitError;

/// The OCI runtime both runtimes use unless `PETREL_CONFORMANCE_RUNC` names
/// another: Debian's runc.
pub const DEFAULT_RUNC: &str = "/usr/sbin/runc";

/// The runtime to run critest against.
#[derive(Debug, Clone)]
pub enum Target {
    /// `petrel runtime` from this binary.
    Petrel {
        /// The `petrel` binary.
        binary: PathBuf,
        /// Its cgroup driver.
        cgroup_driver: CgroupDriver,
    },
    /// containerd 2.x from this binary (its runc shim beside it).
    Containerd {
        /// The `containerd` binary.
        binary: PathBuf,
    },
}

impl Target {
    /// Petrel's runtime from `binary` on its default (cgroupfs) driver.
    pub fn petrel(binary: PathBuf) -> Target {
        Target::Petrel {
            binary,
            cgroup_driver: CgroupDriver::Cgroupfs,
        }
    }

    /// `petrel` or `containerd`: the name of its output files.
    pub fn name(&self) -> &'static str {
        match self {
            Target::Petrel { .. } => "petrel",
            Target::Containerd { .. } => "containerd",
        }
    }
}

/// A finished run.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// [`Target::name`].
    pub name: String,
    /// Every spec's result.
    pub results: Vec<SpecResult>,
    /// How long critest ran.
    pub critest_seconds: f64,
    /// The output directory.
    pub out: PathBuf,
}

impl RunResult {
    /// (passed, failed, skipped).
    pub fn counts(&self) -> (usize, usize, usize) {
        counts(&self.results)
    }
}

/// The OCI runtime binary the runs use.
pub fn runc() -> PathBuf {
    std::env::var_os("PETREL_CONFORMANCE_RUNC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNC))
}

/// Runs critest against `target`, writing into `out`. Fails when something
/// the run needs is missing or does not start; failing specs are results.
pub fn run(target: &Target, out: &Path) -> Result<RunResult, KitError> {
    run_with_runc(target, out, &runc())
}

/// [`run`] with OCI runtime `runc` (e.g. the peers' newer runc, whose
/// idmapped mounts critest's user-namespace specs need).
pub fn run_with_runc(target: &Target, out: &Path, runc: &Path) -> Result<RunResult, KitError> {
    run_specs(target, out, runc, &[])
}

/// [`run_with_runc`] of only the specs whose text contains one of `focus`
/// (critest's `--ginkgo.focus`); the results hold those specs alone. For
/// runs where the whole suite costs too much (the cgroup v2 VM).
pub fn run_focused(
    target: &Target,
    out: &Path,
    runc: &Path,
    focus: &[&str],
) -> Result<RunResult, KitError> {
    run_specs(target, out, runc, focus)
}

fn run_specs(
    target: &Target,
    out: &Path,
    runc: &Path,
    focus: &[&str],
) -> Result<RunResult, KitError> {
    let out = &absolute_dir(out)?;
    let name = target.name();
    let _ = std::fs::remove_file(out.join(format!("{name}.critest.log")));
    let start = Instant::now();
    let results = with_runtime(
        target,
        runc,
        &out.join(format!("{name}.runtime.log")),
        |critest, endpoint, nri, tick| {
            CritestRun {
                critest: critest.to_path_buf(),
                endpoint: endpoint.to_string(),
                nri_socket: Some(nri.to_path_buf()),
                report: out.join(format!("{name}.report.json")),
                log: out.join(format!("{name}.critest.log")),
                timeout: Duration::from_secs(1200),
                extra_args: focus_args(focus),
            }
            .run(tick)
        },
    )?;
    // ginkgo reports the specs left out by a focus as skipped.
    let results: Vec<SpecResult> = results
        .into_iter()
        .filter(|r| focus.is_empty() || focus.iter().any(|f| r.text.contains(f)))
        .collect();
    let critest_seconds = start.elapsed().as_secs_f64();
    let tsv = out.join(format!("{name}.results.tsv"));
    std::fs::write(&tsv, results_tsv(&results)).map_err(|e| KitError::io("write", &tsv, e))?;
    Ok(RunResult {
        name: name.to_string(),
        results,
        critest_seconds,
        out: out.to_path_buf(),
    })
}

/// critest's focus on specs containing any of `focus`: one regular
/// expression of the parts, each with its metacharacters escaped.
fn focus_args(focus: &[&str]) -> Vec<String> {
    if focus.is_empty() {
        return Vec::new();
    }
    let escaped: Vec<String> = focus
        .iter()
        .map(|f| {
            f.chars()
                .flat_map(|c| {
                    let meta = "\\.+*?()|[]{}^$".contains(c);
                    meta.then_some('\\').into_iter().chain([c])
                })
                .collect()
        })
        .collect();
    vec![format!("--ginkgo.focus={}", escaped.join("|"))]
}

/// `out` made absolute (critest runs in it) and created.
pub(crate) fn absolute_dir(out: &Path) -> Result<PathBuf, KitError> {
    let out = std::path::absolute(out).map_err(|e| KitError::io("resolve", out, e))?;
    std::fs::create_dir_all(&out).map_err(|e| KitError::io("create directory", &out, e))?;
    Ok(out)
}

/// Sets up what a critest run needs (the host-wide critest lock, the kit's
/// registry and mirrors, a pod network), starts `target` with OCI runtime
/// `runc` on them and calls
/// `f` with critest's binary, the runtime's endpoint, its NRI socket and a
/// tick to call about every second; the runtime's log is copied to
/// `runtime_log` before the runtime goes.
pub(crate) fn with_runtime<T>(
    target: &Target,
    runc: &Path,
    runtime_log: &Path,
    f: impl FnOnce(&Path, &str, &Path, &mut dyn FnMut()) -> Result<T, KitError>,
) -> Result<T, KitError> {
    let critest = crate::peers::peer_binary("critest")?;
    let images = ConformanceImages::locate()?;
    let runc = runc.to_path_buf();
    if !runc.is_file() {
        return Err(KitError::Missing {
            component: "runc".into(),
            path: runc,
            hint: "apt-get install runc, or set PETREL_CONFORMANCE_RUNC".into(),
        });
    }
    let _lock = CritestLock::acquire()?;
    let registry = LocalRegistry::serve_read_only(&images.registry_storage())?;
    let mirrors = crate::process::kit_tempdir("petrel-kit-mirrors.")?;
    write_mirror_config(mirrors.path(), &registry.host())?;
    let net = PodNetwork::new()?;
    let result = match target {
        Target::Petrel {
            binary,
            cgroup_driver,
        } => {
            let opts = PetrelOptions {
                cgroup_driver: *cgroup_driver,
                ..PetrelOptions::default()
            };
            let rt = PetrelRuntime::start_with(binary, &runc, &net, mirrors.path(), &opts)?;
            let r = f(&critest, &rt.endpoint(), &rt.nri_socket, &mut || {});
            // Copied before the runtime (and its directory) goes.
            let _ = std::fs::copy(rt.log_path(), runtime_log);
            r
        }
        Target::Containerd { binary } => {
            let cd = crate::containerd::Containerd::start(binary, &runc, &net, mirrors.path())?;
            let r = f(&critest, &cd.endpoint(), &cd.nri_socket, &mut || {
                cd.reap_exited_shims()
            });
            let _ = std::fs::copy(cd.log_path(), runtime_log);
            r
        }
    };
    drop(net);
    drop(registry);
    result
}

/// `OUTCOME<TAB>seconds<TAB>spec` per spec, sorted by spec.
pub fn results_tsv(results: &[SpecResult]) -> String {
    let mut rows: Vec<&SpecResult> = results.iter().collect();
    rows.sort_by(|a, b| a.text.cmp(&b.text));
    let mut s = String::new();
    for r in rows {
        let _ = writeln!(s, "{}\t{:.1}\t{}", r.outcome.as_str(), r.seconds, r.text);
    }
    s
}

/// The side-by-side summary in Markdown: a count table (for
/// docs/PERFORMANCE.md) and every spec on which the runs differ.
pub fn summary_markdown(runs: &[RunResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| critest v1.37.0 specs | {} |", header(runs));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(runs.len()));
    for (label, pick) in [
        ("passed", 0usize),
        ("failed", 1),
        ("skipped", 2),
        ("total", 3),
    ] {
        let cells: Vec<String> = runs
            .iter()
            .map(|r| {
                let (p, f, k) = r.counts();
                [p, f, k, p + f + k][pick].to_string()
            })
            .collect();
        let _ = writeln!(s, "| {label} | {} |", cells.join(" | "));
    }
    let times: Vec<String> = runs
        .iter()
        .map(|r| format!("{:.0} s", r.critest_seconds))
        .collect();
    let _ = writeln!(s, "| critest run time | {} |", times.join(" | "));
    if runs.len() > 1 {
        let mut texts: Vec<&str> = runs
            .iter()
            .flat_map(|r| r.results.iter().map(|x| x.text.as_str()))
            .collect();
        texts.sort();
        texts.dedup();
        let mut diff = String::new();
        for t in texts {
            let per: Vec<Option<Outcome>> = runs
                .iter()
                .map(|r| r.results.iter().find(|x| x.text == t).map(|x| x.outcome))
                .collect();
            if per.windows(2).any(|w| w[0] != w[1]) {
                let cells: Vec<&str> = per
                    .iter()
                    .map(|o| o.map(Outcome::as_str).unwrap_or("-"))
                    .collect();
                let _ = writeln!(
                    diff,
                    "| {} | {} |",
                    cells.join(" | "),
                    t.replace('|', "\\|")
                );
            }
        }
        if !diff.is_empty() {
            let _ = writeln!(s, "\nSpecs on which they differ:\n");
            let _ = writeln!(s, "| {} | spec |", header(runs));
            let _ = writeln!(s, "|{}---|", "---|".repeat(runs.len()));
            s.push_str(&diff);
        }
    }
    s
}

fn header(runs: &[RunResult]) -> String {
    runs.iter()
        .map(|r| r.name.as_str())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn focus_args_should_escape_each_part_and_join_them() {
        assert!(focus_args(&[]).is_empty());
        assert_eq!(
            focus_args(&["Container OOM", "metrics [Conformance]"]),
            ["--ginkgo.focus=Container OOM|metrics \\[Conformance\\]"]
        );
    }

    fn r(text: &str, outcome: Outcome) -> SpecResult {
        SpecResult {
            text: text.into(),
            outcome,
            message: String::new(),
            location: String::new(),
            seconds: 1.0,
        }
    }

    #[test]
    fn summary_should_count_side_by_side_and_list_differences() {
        let a = RunResult {
            name: "petrel".into(),
            results: vec![r("x", Outcome::Pass), r("y", Outcome::Fail)],
            critest_seconds: 100.0,
            out: PathBuf::new(),
        };
        let b = RunResult {
            name: "containerd".into(),
            results: vec![r("x", Outcome::Pass), r("y", Outcome::Pass)],
            critest_seconds: 90.0,
            out: PathBuf::new(),
        };
        let s = summary_markdown(&[a, b]);
        assert!(
            s.contains("| critest v1.37.0 specs | petrel | containerd |"),
            "{s}"
        );
        assert!(s.contains("| passed | 1 | 2 |"), "{s}");
        assert!(s.contains("| failed | 1 | 0 |"), "{s}");
        assert!(s.contains("| total | 2 | 2 |"), "{s}");
        assert!(s.contains("| FAIL | PASS | y |"), "{s}");
        assert!(!s.contains("| PASS | PASS | x |"), "{s}");
    }

    #[test]
    fn results_tsv_should_sort_by_spec() {
        let t = results_tsv(&[r("b", Outcome::Skip), r("a", Outcome::Pass)]);
        assert_eq!(t, "PASS\t1.0\ta\nSKIP\t1.0\tb\n");
    }
}
