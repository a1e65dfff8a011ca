//! Hostile layers, one attack each: refused with an error naming the entry,
//! or contained, and never anything written outside or through a symlink
//! (`Sandbox::run_and_check` checks both for every case).

use std::os::unix::fs::MetadataExt;

use super::E::{Dir, Fifo, File, Hard, Sym};
use super::*;

fn s(x: &str) -> String {
    x.to_string()
}

/// Runs `entries` in a fresh sandbox, checks the invariants and that the
/// outcome is an `UnsafeEntry` error naming `entry`.
fn refused(entries: &[E], entry: &str) -> Sandbox {
    let sb = Sandbox::new();
    let r = sb.run_and_check(entries);
    match &r {
        Err(ImageError::UnsafeEntry { path, .. }) => {
            assert_eq!(path, &sb.expand(entry), "{entries:?}: {r:?}")
        }
        other => panic!("{entries:?}: expected refusal of {entry:?}, got {other:?}"),
    }
    sb
}

#[test]
fn names_climbing_out_of_the_root_should_be_refused() {
    for name in ["../x", "a/../../x", "./../x", "../outside/secret", "/../x"] {
        refused(&[Dir(s("a/")), File(s(name))], name);
    }
}

#[test]
fn absolute_names_should_be_taken_relative_to_the_root() {
    let sb = Sandbox::new();
    sb.run_and_check(&[File(s("/abs/x")), File(s("$OUT/x")), File(s("a/../b"))])
        .expect("unpack");
    let r = sb.root();
    assert!(r.join("abs/x").is_file());
    assert!(r
        .join(sb.outside().strip_prefix("/").expect("absolute"))
        .join("x")
        .is_file());
    assert!(r.join("b").is_file());
}

#[test]
fn entries_below_a_symlink_should_be_refused_wherever_it_points() {
    for target in [
        "$OUT",
        "$OUT/",
        "../outside",
        "../../../../../../..",
        "/",
        "$ROOT",
        "sub",
        "./sub",
        "/sub",
        "/proc/self/root",
        "/proc/self/cwd",
        "nowhere",
    ] {
        for below in [
            File(s("evil/secret")),
            Dir(s("evil/new/")),
            Sym(s("evil/l"), s("x")),
            Fifo(s("evil/fifo")),
            Hard(s("evil/hl"), s("sub/f")),
            File(s("evil/.wh.secret")),
            File(s("evil/.wh..wh..opq")),
            File(s("evil/deeper/x")),
        ] {
            let name = below.name().to_string();
            let sb = refused(
                &[
                    Dir(s("sub/")),
                    File(s("sub/f")),
                    Sym(s("evil"), s(target)),
                    below,
                ],
                &name,
            );
            assert!(
                xattr(&sb.outside(), "trusted.overlay.opaque").is_err(),
                "{target}"
            );
        }
    }
}

#[test]
fn symlink_chains_and_dot_dot_through_symlinks_should_be_refused() {
    refused(
        &[
            Sym(s("a"), s("b")),
            Sym(s("b"), s("$OUT")),
            File(s("a/secret")),
        ],
        "a/secret",
    );
    // `l/..` is cleaned lexically to the root: `l` is never traversed.
    let sb = Sandbox::new();
    sb.run_and_check(&[Sym(s("l"), s("$OUT")), File(s("l/../x"))])
        .expect("unpack");
    assert!(sb.root().join("x").is_file());
}

#[test]
fn a_directory_replaced_by_a_symlink_should_not_be_written_through() {
    let sb = refused(
        &[
            Dir(s("d/")),
            File(s("d/keep")),
            Sym(s("d"), s("$OUT")),
            File(s("d/secret")),
        ],
        "d/secret",
    );
    let d = std::fs::symlink_metadata(sb.root().join("d")).expect("d");
    assert!(d.file_type().is_symlink());
    // Same with the symlink's target present inside the root.
    refused(
        &[
            Dir(s("$OUT/")),
            Dir(s("d/")),
            Sym(s("d"), s("$OUT")),
            File(s("d/secret")),
        ],
        "d/secret",
    );
}

#[test]
fn a_symlink_replaced_by_a_file_should_replace_the_link_only() {
    let sb = Sandbox::new();
    sb.run_and_check(&[Sym(s("fsym"), s("$OUT/secret")), File(s("fsym"))])
        .expect("unpack");
    let m = std::fs::symlink_metadata(sb.root().join("fsym")).expect("fsym");
    assert!(m.is_file());
    // And a symlink replaced by a directory: a real directory, empty.
    let sb = Sandbox::new();
    sb.run_and_check(&[Sym(s("d"), s("$OUT")), Dir(s("d/")), File(s("d/x"))])
        .expect("unpack");
    assert!(std::fs::symlink_metadata(sb.root().join("d"))
        .expect("d")
        .is_dir());
}

#[test]
fn hard_links_to_outside_should_be_refused() {
    for target in [
        "../outside/secret",
        "a/../../outside/secret",
        "../../etc/passwd",
    ] {
        refused(&[Dir(s("a/")), Hard(s("a/hl"), s(target))], "a/hl");
    }
    // Absolute targets are names in the layer, where they do not exist.
    refused(&[Hard(s("hl"), s("$OUT/secret"))], "hl");
    refused(&[Hard(s("hl"), s("/etc/passwd"))], "hl");
    // Through a symlinked directory, wherever it points.
    for t in ["$OUT", "sub", "/"] {
        refused(
            &[
                Dir(s("sub/")),
                File(s("sub/secret")),
                Sym(s("evil"), s(t)),
                Hard(s("hl"), s("evil/secret")),
            ],
            "hl",
        );
    }
    // To a directory, to the root, to a path not yet made.
    refused(&[Dir(s("d/")), Hard(s("hl"), s("d"))], "hl");
    refused(&[Hard(s("hl"), s("./"))], "hl");
    refused(&[Hard(s("hl"), s("later")), File(s("later"))], "hl");
}

#[test]
fn a_hard_link_to_a_symlink_pointing_outside_should_link_the_symlink() {
    let sb = Sandbox::new();
    sb.run_and_check(&[
        Sym(s("lnk"), s("$OUT/secret")),
        Hard(s("hl"), s("lnk")),
        File(s("hl")),
        Hard(s("hl2"), s("lnk")),
    ])
    .expect("unpack");
    let hl2 = std::fs::symlink_metadata(sb.root().join("hl2")).expect("hl2");
    assert!(hl2.file_type().is_symlink());
    assert_eq!(hl2.nlink(), 2);
    // A file entry at a hard link's name replaces the name only.
    let sb = Sandbox::new();
    sb.run_and_check(&[File(s("orig")), Hard(s("link"), s("orig")), File(s("link"))])
        .expect("unpack");
    assert_eq!(
        std::fs::read(sb.root().join("orig")).expect("orig"),
        b"entry #0"
    );
}

#[test]
fn the_root_should_not_be_replaced_by_a_non_directory() {
    for e in [
        Sym(s("./"), s("/")),
        Sym(s("."), s("$OUT")),
        Hard(s("."), s("x")),
        Fifo(s("/")),
    ] {
        let name = e.name().to_string();
        let sb = refused(&[File(s("x")), e], &name);
        assert!(std::fs::symlink_metadata(sb.root()).expect("root").is_dir());
    }
}

#[test]
fn huge_names_should_fail_cleanly() {
    // A 300-byte component (over NAME_MAX) and a path over PATH_MAX.
    let sb = Sandbox::new();
    assert!(sb.run_and_check(&[File(s("a/$LONG"))]).is_err());
    let long_path = vec!["d".repeat(200); 30].join("/");
    let sb = Sandbox::new();
    assert!(sb.run_and_check(&[File(long_path)]).is_err());
}
