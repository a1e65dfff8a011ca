//! `petrel-conformance`: critest against Petrel's runtime and containerd
//! 2.x, side by side (`make conformance`; `make bench` may copy its table).
//!
//! Writes into `--out` (default `build/conformance`): per runtime its
//! ginkgo report, critest and runtime logs and `<name>.results.tsv`; then
//! `summary.md` (the counts side by side and the specs on which the
//! runtimes differ) and, with `--expected`, Petrel's results held against
//! that list and a candidate list `petrel.expected.new` written from the run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use petrel_testkit::conformance::{self, summary_markdown, Target};
use petrel_testkit::expected::{compare, render_list, Expected};

#[derive(Parser)]
#[command(about = "critest against Petrel's runtime and containerd 2.x, side by side")]
struct Args {
    /// Runtimes to run, in order (petrel, containerd).
    #[arg(long = "runtime", value_delimiter = ',', default_values = ["petrel", "containerd"])]
    runtimes: Vec<String>,
    /// The petrel binary.
    #[arg(long, default_value = "target/debug/petrel")]
    petrel: PathBuf,
    /// The output directory.
    #[arg(long, default_value = "build/conformance")]
    out: PathBuf,
    /// Petrel's expected list, to hold its results against.
    #[arg(long)]
    expected: Option<PathBuf>,
    /// Exit non-zero when Petrel regresses against --expected.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("petrel-conformance: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<bool> {
    let mut runs = Vec::new();
    let mut ok = true;
    for name in &args.runtimes {
        let target = match name.as_str() {
            "petrel" => Target::petrel(
                std::path::absolute(&args.petrel)
                    .with_context(|| format!("path {}", args.petrel.display()))?,
            ),
            "containerd" => {
                if petrel_testkit::peers::left_out("containerd") {
                    eprintln!("containerd: left out (PETREL_PEERS_SKIP)");
                    continue;
                }
                Target::Containerd {
                    binary: petrel_testkit::containerd::binaries()?,
                }
            }
            other => anyhow::bail!("unknown runtime {other:?} (petrel, containerd)"),
        };
        eprintln!("critest against {name} ...");
        let r = conformance::run(&target, &args.out)?;
        let (p, f, s) = r.counts();
        eprintln!(
            "{name}: {p} passed, {f} failed, {s} skipped in {:.0} s",
            r.critest_seconds
        );
        if let (Target::Petrel { .. }, Some(list)) = (&target, &args.expected) {
            let expected = Expected::load(list)?;
            let cmp = compare(&expected, &r.results);
            print!("{}", cmp.render(list));
            let new = args.out.join("petrel.expected.new");
            std::fs::write(
                &new,
                render_list(
                    &r.results,
                    &expected,
                    "critest v1.37.0 against Petrel's runtime (written by petrel-conformance)",
                ),
            )
            .with_context(|| format!("write {}", new.display()))?;
            eprintln!("a list from this run: {}", new.display());
            ok &= cmp.ok() || !args.check;
        }
        runs.push(r);
    }
    let summary = args.out.join("summary.md");
    let text = summary_markdown(&runs);
    std::fs::write(&summary, &text).with_context(|| format!("write {}", summary.display()))?;
    print!("{text}");
    eprintln!("summary: {}", summary.display());
    Ok(ok)
}
