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

use petrel_testkit::conformance::{self, CgroupDriver, Target};
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
    let target = Target::petrel(petrel_testkit::bins::petrel_bin());
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

/// The critest specs that read cgroups (OOM kills, container stats, the
/// metrics RPCs), for the cgroup v2 VM where the whole suite would cost
/// too much under software emulation.
const CGROUP_SPECS: &[&str] = &[
    "Container OOM",
    "listing container stats",
    "listing stats",
    "metrics operations",
];

/// critest's cgroup specs against Petrel's runtime on a pure cgroup v2
/// host, held against the same expected list. Run by `e2e_cgroup_v2`
/// inside its VM; on this cgroup v1 host the whole suite above covers
/// them.
#[test]
#[ignore = "runs inside the cgroup v2 VM (e2e_cgroup_v2)"]
fn critest_cgroup_specs_should_pass_on_cgroup_v2() {
    assert!(
        petrel_testkit::node::Node::cgroup_v2(),
        "not a cgroup v2 host: run through e2e_cgroup_v2"
    );
    run_focused_against_expected(
        "cgroup v2",
        "conformance-v2",
        CgroupDriver::Cgroupfs,
        CGROUP_SPECS,
    );
}

/// On the systemd driver, beside [`CGROUP_SPECS`], the specs whose pods
/// and containers systemd now makes and removes: critest gives every pod
/// the parent `/test.slice` when RuntimeConfig answers SYSTEMD, so each
/// container is a scope there, started, stopped and removed through
/// runc's and the runtime's systemd paths.
const SYSTEMD_SPECS: &[&str] = &[
    "Container OOM",
    "listing container stats",
    "listing stats",
    "metrics operations",
    "runtime should support basic operations on container",
    "runtime should support basic operations on PodSandbox",
];

/// critest's cgroup specs (and the pod and container lifecycles, see
/// [`SYSTEMD_SPECS`]) against Petrel's runtime on the systemd cgroup
/// driver, held against the same expected list as on cgroupfs. Run by
/// `e2e_cgroup_v2` in its systemd guest (`IN_SYSTEMD_GUEST`); anywhere
/// systemd is not PID 1 on pure cgroup v2 it fails saying so.
#[test]
#[ignore = "needs systemd as PID 1 on cgroup v2: e2e_cgroup_v2 runs it in the systemd VM"]
fn critest_cgroup_specs_should_pass_on_the_systemd_driver() {
    let comm = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    assert_eq!(
        comm.trim(),
        "systemd",
        "systemd is not PID 1 here: run this in the systemd test VM (e2e_cgroup_v2)"
    );
    assert!(
        petrel_testkit::node::Node::cgroup_v2(),
        "not a pure cgroup v2 host: run this in the systemd test VM (e2e_cgroup_v2)"
    );
    let run = run_focused_against_expected(
        "the systemd driver",
        "conformance-systemd",
        CgroupDriver::Systemd,
        SYSTEMD_SPECS,
    );
    // Each part of the focus matched specs that ran.
    for part in SYSTEMD_SPECS {
        assert!(
            run.results.iter().any(|r| r.text.contains(part)),
            "no spec of {part:?} ran: {:?}",
            run.results
        );
    }
}

/// critest's specs containing one of `focus` against Petrel's runtime on
/// `driver` (output kept in the target's `out` directory), held against
/// the expected list's entries for those specs: fails when one expected
/// to pass did not, or when none ran.
fn run_focused_against_expected(
    host: &str,
    out: &str,
    driver: CgroupDriver,
    focus: &[&str],
) -> conformance::RunResult {
    let list = expected_list();
    let expected = Expected::load(&list).unwrap_or_else(|e| panic!("{e}"));
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(out);
    let target = Target::Petrel {
        binary: petrel_testkit::bins::petrel_bin(),
        cgroup_driver: driver,
    };
    let runc = petrel_testkit::peers::peer_binary("runc").unwrap_or_else(|e| panic!("{e}"));
    let run =
        conformance::run_focused(&target, &out, &runc, focus).unwrap_or_else(|e| panic!("{e}"));
    let (p, f, s) = run.counts();
    println!(
        "critest (cgroup specs) on {host}: {p} passed, {f} failed, {s} skipped in {:.0} s",
        run.critest_seconds
    );
    assert!(p > 0, "no spec ran: {:?}", run.results);
    let focused = Expected {
        specs: expected
            .specs
            .iter()
            .filter(|(spec, _)| focus.iter().any(|f| spec.contains(f)))
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
    };
    let cmp = compare(&focused, &run.results);
    let report = cmp.render(&list);
    println!("{report}");
    assert!(
        cmp.ok(),
        "critest on {host}: {} spec(s) expected to pass did not (logs in {}):\n{report}",
        cmp.regressions.len(),
        out.display()
    );
    run
}
