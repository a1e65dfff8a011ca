//! Property test: random layers from a grammar of dangerous names and link
//! targets (`..`, absolute paths into and out of the sandbox, symlink
//! chains, directories swapped for symlinks, hard links to symlinks,
//! whiteouts of `..`, huge names, duplicates). Whatever the outcome, nothing
//! outside the root changes and nothing is written through a symlink
//! (`Sandbox::run_and_check`).
//!
//! Failures proptest finds are shrunk and their seeds kept in
//! `tests/corpus/fuzz.proptest-regressions` (replayed first on every run);
//! a case worth keeping for good goes into `tests/corpus/` as a table.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

use super::{Sandbox, E};

/// Few components, so that random names collide and build on each other.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just("a"),
        6 => Just("b"),
        3 => Just("c"),
        3 => Just(".."),
        1 => Just("."),
        1 => Just(""),
        1 => Just(".wh.a"),
        1 => Just(".wh.."),
        1 => Just(".wh..."),
        1 => Just(".wh..wh..opq"),
        1 => Just("outside"),
        1 => Just("secret"),
        1 => Just("root"),
        1 => Just("$LONG"),
    ]
    .prop_map(str::to_string)
}

fn name() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(component(), 1..4),
        prop_oneof![
            8 => Just(""),
            2 => Just("/"),
            1 => Just("$OUT/"),
            1 => Just("$ROOT/"),
        ],
    )
        .prop_map(|(cs, prefix)| format!("{prefix}{}", cs.join("/")))
}

/// Plain names only: the directories gadgets point symlinks at.
fn simple_name() -> impl Strategy<Value = String> {
    prop::collection::vec(prop_oneof![Just("a"), Just("b"), Just("c")], 1..3)
        .prop_map(|cs| cs.join("/"))
}

fn link_target() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => name(),
        3 => simple_name(),
        2 => simple_name().prop_map(|n| format!("/{n}")),
        1 => simple_name().prop_map(|n| format!("../{n}")),
        1 => simple_name().prop_map(|n| format!("$ROOT/{n}")),
        1 => Just("/".to_string()),
        1 => Just(".".to_string()),
        1 => Just("..".to_string()),
        1 => Just("../..".to_string()),
        1 => Just("../outside".to_string()),
        1 => Just("../../outside/secret".to_string()),
        2 => Just("$OUT".to_string()),
        1 => Just("$OUT/secret".to_string()),
        1 => Just("$OUT/to-root".to_string()),
        2 => Just("$ROOT".to_string()),
        1 => Just("/proc/self/root".to_string()),
        1 => Just("/proc/self/cwd/..".to_string()),
    ]
}

fn entry() -> impl Strategy<Value = E> {
    prop_oneof![
        3 => name().prop_map(|n| E::Dir(format!("{n}/"))),
        4 => name().prop_map(E::File),
        4 => (name(), link_target()).prop_map(|(n, t)| E::Sym(n, t)),
        3 => (name(), name()).prop_map(|(n, t)| E::Hard(n, t)),
        1 => name().prop_map(E::Fifo),
    ]
}

/// Something below `parent`: the entry kinds an attacker would write
/// through a symlink.
fn below(parent: String) -> impl Strategy<Value = E> {
    let p = parent;
    prop_oneof![
        3 => Just(E::File(format!("{p}/x"))),
        1 => Just(E::Dir(format!("{p}/d/"))),
        1 => Just(E::File(format!("{p}/d/x"))),
        1 => Just(E::Sym(format!("{p}/l"), "x".to_string())),
        1 => Just(E::Fifo(format!("{p}/f"))),
        1 => Just(E::File(format!("{p}/.wh.x"))),
        1 => Just(E::File(format!("{p}/.wh..wh..opq"))),
        1 => simple_name().prop_map(move |t| E::Hard(format!("{p}/h"), t)),
    ]
}

/// Known attack shapes with random parameters, so each family is tried
/// often, not only when random entries happen to line up.
fn gadget() -> impl Strategy<Value = Vec<E>> {
    let swap = (simple_name(), link_target()).prop_flat_map(|(d, t)| {
        below(d.clone()).prop_map(move |b| {
            vec![
                E::Dir(format!("{d}/")),
                E::File(format!("{d}/keep")),
                E::Sym(d.clone(), t.clone()),
                b,
            ]
        })
    });
    let through = (simple_name(), simple_name(), link_target()).prop_flat_map(|(dir, l, t)| {
        below(l.clone())
            .prop_map(move |b| vec![E::Dir(format!("{dir}/")), E::Sym(l.clone(), t.clone()), b])
    });
    let chain = (simple_name(), simple_name(), link_target()).prop_flat_map(|(a, b, t)| {
        below(a.clone()).prop_map(move |x| {
            vec![
                E::Sym(b.clone(), t.clone()),
                E::Sym(a.clone(), b.clone()),
                x,
            ]
        })
    });
    let hard_to_link = (simple_name(), simple_name(), link_target()).prop_map(|(l, h, t)| {
        vec![
            E::Sym(l.clone(), t),
            E::Hard(h.clone(), l),
            E::File(h.clone()),
            E::Dir(format!("{h}/")),
        ]
    });
    prop_oneof![swap, through, chain, hard_to_link]
}

fn layer() -> impl Strategy<Value = Vec<E>> {
    prop::collection::vec(
        prop_oneof![
            3 => entry().prop_map(|e| vec![e]),
            1 => gadget(),
        ],
        1..10,
    )
    .prop_map(|groups| groups.into_iter().flatten().collect())
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // A few seconds in `make test`; PROPTEST_CASES=100000 for a long run.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(400),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/corpus/fuzz.proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn hostile_layers_should_never_write_outside_or_through_symlinks(
        entries in layer()
    ) {
        let sb = Sandbox::new();
        // Errors are fine; escapes are not (checked inside).
        let _ = sb.run_and_check(&entries);
    }
}
