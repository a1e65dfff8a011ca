//! critest (cri-tools' validation suite, built by `make peers`) against
//! Petrel's runtime, with the conformance kit's substitute images served by
//! a local registry through hosts.toml mirrors, on a private CNI network.
//! The per-spec results are held against crates/testkit/conformance/
//! petrel.expected: a spec expected to PASS that does not fails the test; a
//! newly passing spec is reported. The runtime runs the peers' runc
//! (`build/peers/bin/runc`, 1.2 or later, for the user-namespace specs)
//! unless PETREL_CONFORMANCE_RUNC names another. Fails (never skips) when
//! critest, that runc or the images are missing, unless PETREL_PEERS_SKIP
//! names `critest`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use petrel_testkit::conformance::{self, Target};
use petrel_testkit::expected::{compare, render_list, Expected};

fn expected_list() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/testkit/conformance/petrel.expected")
}

#[test]
fn critest_should_pass_every_spec_the_expected_list_passes() {
    if petrel_testkit::peers::left_out("critest") {
        eprintln!("skipped: PETREL_PEERS_SKIP names critest");
        return;
    }
    let list = expected_list();
    let expected = Expected::load(&list).unwrap_or_else(|e| panic!("{e}"));
    // Kept after the test for a look: report, logs, a list from this run.
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("conformance");
    let target = Target::Petrel {
        binary: petrel_testkit::bins::petrel_bin(),
    };
    // The peers' runc (1.2 or later): critest's user-namespace specs need
    // its idmapped mounts; PETREL_CONFORMANCE_RUNC still names another.
    let runc = match std::env::var_os("PETREL_CONFORMANCE_RUNC") {
        Some(r) => PathBuf::from(r),
        // Left out of the peers: Debian's, and the user-namespace specs fail.
        None if petrel_testkit::peers::left_out("runc") => conformance::runc(),
        None => petrel_testkit::peers::peer_binary("runc").unwrap_or_else(|e| panic!("{e}")),
    };
    let run = conformance::run_with_runc(&target, &out, &runc).unwrap_or_else(|e| panic!("{e}"));
    let (p, f, s) = run.counts();
    println!(
        "critest against petrel: {p} passed, {f} failed, {s} skipped in {:.0} s (output in {})",
        run.critest_seconds,
        out.display()
    );
    let new = out.join("petrel.expected.new");
    std::fs::write(
        &new,
        render_list(
            &run.results,
            &expected,
            "critest v1.37.0 against Petrel's runtime",
        ),
    )
    .expect("write the list of this run");
    let cmp = compare(&expected, &run.results);
    let report = cmp.render(&list);
    println!("{report}");
    if !cmp.newly_passing.is_empty() {
        println!("hint: {} holds this run's list", new.display());
    }
    assert!(
        cmp.ok(),
        "critest: {} spec(s) expected to pass did not (logs in {}):\n{report}",
        cmp.regressions.len(),
        out.display()
    );
}
