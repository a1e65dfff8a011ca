//! P28: critest's own benchmarks (`critest -benchmark`) against Petrel's
//! runtime and containerd 2.x, one after the other in the same run, on the
//! conformance kit's set-up (its registry, mirrors and pod network).

use petrel_testkit::conformance::Target;
use petrel_testkit::critest_bench::{self, BenchParams, BenchRun};

use crate::sweep::Work;
use crate::Args;

/// P28's results: each runtime's run, or why it is missing.
#[derive(Debug, Clone)]
pub struct CritestBenchResults {
    /// The sample counts critest was given.
    pub params: BenchParams,
    /// Petrel's runtime.
    pub petrel: Result<BenchRun, String>,
    /// containerd 2.x.
    pub containerd: Result<BenchRun, String>,
    /// `containerd --version`'s version field.
    pub containerd_version: String,
    /// `critest --version`'s version.
    pub critest_version: String,
}

impl Default for CritestBenchResults {
    fn default() -> Self {
        let none = || Err("not run".to_string());
        CritestBenchResults {
            params: BenchParams {
                pods: 0,
                containers: 0,
                images: 0,
                parallel: 1,
            },
            petrel: none(),
            containerd: none(),
            containerd_version: String::new(),
            critest_version: String::new(),
        }
    }
}

/// The counts from the command line.
pub fn params(args: &Args) -> BenchParams {
    BenchParams {
        pods: args.critest_pods,
        containers: args.critest_containers,
        images: args.critest_images,
        parallel: 1,
    }
}

/// Runs critest's benchmarks against both runtimes (Petrel first), its
/// files kept in `<build-dir>/conformance/<runtime>-benchmark/`.
pub async fn measure(args: &Args, _work: &Work, progress: &dyn Fn(&str)) -> CritestBenchResults {
    let params = params(args);
    let out = args.build_dir.join("conformance");
    let petrel = match std::path::absolute(&args.petrel) {
        Ok(binary) => {
            progress("critest -benchmark against Petrel's runtime");
            run(Target::petrel(binary), params, out.clone()).await
        }
        Err(e) => Err(format!("resolve {}: {e}", args.petrel.display())),
    };
    let mut containerd_version = String::new();
    let containerd = match petrel_testkit::containerd::binaries() {
        Ok(binary) => {
            containerd_version = petrel_testkit::containerd::version_of(&binary);
            progress("critest -benchmark against containerd 2.x");
            run(Target::Containerd { binary }, params, out).await
        }
        Err(e) => Err(e.to_string()),
    };
    CritestBenchResults {
        params,
        petrel,
        containerd,
        containerd_version,
        critest_version: critest_version(),
    }
}

async fn run(
    target: Target,
    params: BenchParams,
    out: std::path::PathBuf,
) -> Result<BenchRun, String> {
    // critest runs for minutes: off the async workers.
    tokio::task::spawn_blocking(move || critest_bench::run(&target, &params, &out))
        .await
        .map_err(|e| format!("critest -benchmark task: {e}"))?
        .map_err(|e| e.to_string())
}

/// `critest --version`'s version ("1.37.0"), or "" when it does not say.
fn critest_version() -> String {
    let Ok(critest) = petrel_testkit::peers::peer_binary("critest") else {
        return String::new();
    };
    std::process::Command::new(critest)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("critest version: ").map(str::to_string))
        })
        .unwrap_or_default()
}
