//! critest's benchmark mode (`critest -benchmark`, built by `make peers`)
//! against Petrel's runtime with a few samples of each: every benchmark spec
//! passes and every operation it times has its samples. The bench (P28)
//! runs the same with more samples beside containerd; here it is a test of
//! the CRI calls those specs make, not a measurement. Fails (never skips)
//! when critest or the images are missing, unless PETREL_PEERS_SKIP names
//! `critest`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use petrel_testkit::conformance::Target;
use petrel_testkit::critest::Outcome;
use petrel_testkit::critest_bench::{self, BenchParams, FROM_SCRATCH};

#[test]
fn critest_benchmarks_should_pass_and_time_every_operation() {
    if petrel_testkit::peers::left_out("critest") {
        eprintln!("skipped: PETREL_PEERS_SKIP names critest");
        return;
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance");
    let target = Target::petrel(petrel_testkit::bins::petrel_bin());
    let params = BenchParams {
        pods: 3,
        containers: 3,
        images: 2,
        parallel: 1,
    };
    let run = critest_bench::run(&target, &params, &out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        run.specs.len(),
        5,
        "critest's five benchmark specs: {:?}",
        run.specs.iter().map(|s| &s.text).collect::<Vec<_>>()
    );
    assert!(
        run.specs.iter().all(|s| s.outcome == Outcome::Pass),
        "every benchmark spec passes (output in {}): {:#?}",
        out.display(),
        run.failures()
    );
    for (name, n) in [
        ("CreatePod", 3),
        ("StatusPod", 3),
        ("StopPod", 3),
        ("RemovePod", 3),
        ("CreateContainer", 3),
        ("StartContainer", 3),
        ("StatusContainer", 3),
        ("StopContainer", 3),
        ("RemoveContainer", 3),
        ("PullImage", 2),
        ("StatusImage", 2),
        ("RemoveImage", 2),
        ("ListImages", 2),
        (FROM_SCRATCH, 1),
    ] {
        let op = run
            .operation(name)
            .unwrap_or_else(|| panic!("{name} was not timed: {:?}", run.operations));
        assert_eq!(op.samples.len(), n, "{name}'s samples");
        assert!(
            op.samples.iter().all(|d| !d.is_zero()),
            "{name}: {:?}",
            op.samples
        );
    }
}
