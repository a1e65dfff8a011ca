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

/// A layer of one GNU sparse file `name` of `real` bytes whose data are
/// `blocks` (offset, bytes; every block but the last a multiple of 512
/// bytes), the rest holes. At most three blocks (the header's map also
/// holds the end-of-file marker).
fn sparse_layer(name: &str, real: u64, blocks: &[(u64, &[u8])]) -> Vec<u8> {
    let stored: usize = blocks.iter().map(|(_, d)| d.len()).sum();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(EntryType::GNUSparse);
    h.set_path(name).expect("path");
    h.set_size(stored as u64);
    h.set_mode(0o644);
    h.set_mtime(1_000_000);
    let g = h.as_gnu_mut().expect("gnu header");
    for (i, (off, data)) in blocks
        .iter()
        .chain(std::iter::once(&(real, &b""[..])))
        .enumerate()
    {
        g.sparse[i].set_offset(*off);
        g.sparse[i].set_length(data.len() as u64);
    }
    g.set_real_size(real);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    for (_, d) in blocks {
        out.extend_from_slice(d);
    }
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

fn limits(max: u64) -> crate::Limits {
    crate::Limits {
        max_layer_bytes: max,
    }
}

#[test]
fn sparse_files_claiming_10_gib_should_be_stored_sparse() {
    let sb = Sandbox::new();
    let real = 10u64 << 30;
    let (a, b) = (vec![b'a'; 4096], vec![b'b'; 100]);
    let layer = sparse_layer("big", real, &[(0, &a), (5 << 30, &b)]);
    let started = std::time::Instant::now();
    let stats = unpack_layer(&layer[..], &sb.root(), &crate::Limits::default()).expect("unpack");
    let took = started.elapsed();
    let path = sb.root().join("big");
    let m = std::fs::metadata(&path).expect("big");
    assert_eq!(m.len(), real);
    // The data only: two blocks, not 10 GiB of zeros.
    assert!(
        m.blocks() * 512 <= 64 << 10,
        "{} blocks allocated",
        m.blocks()
    );
    assert!(stats.bytes <= 64 << 10, "{stats:?}");
    let read_at = |off: u64, n: usize| {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(&path).expect("open");
        f.seek(SeekFrom::Start(off)).expect("seek");
        let mut buf = vec![0u8; n];
        f.read_exact(&mut buf).expect("read");
        buf
    };
    assert_eq!(read_at(0, 4096), a);
    assert_eq!(read_at(4096, 4096), vec![0; 4096]);
    assert_eq!(read_at(5 << 30, 100), b);
    assert_eq!(read_at((5 << 30) + 100, 412), vec![0; 412]);
    assert_eq!(read_at(real - 10, 10), vec![0; 10]);
    eprintln!("10 GiB sparse file unpacked in {took:?}");
}

#[test]
fn sparse_files_past_the_layer_bound_should_be_refused_before_writing() {
    let sb = Sandbox::new();
    let layer = sparse_layer("big", 10 << 30, &[(0, &[b'a'; 512][..])]);
    let started = std::time::Instant::now();
    let r = unpack_layer(&layer[..], &sb.root(), &limits(1 << 30));
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    match r {
        Err(ImageError::TooLarge { what, limit }) => {
            assert_eq!(limit, 1 << 30);
            assert!(what.contains("\"big\""), "{what}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(!sb.root().join("big").exists());
}

#[test]
fn layers_whose_files_add_up_past_the_bound_should_be_refused() {
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    tb.file("a", &[1; 400])
        .file("b", &[2; 400])
        .file("c", &[3; 400]);
    let r = unpack_layer(&tb.bytes()[..], &sb.root(), &limits(1000));
    assert!(
        matches!(&r, Err(ImageError::TooLarge { what, limit: 1000 }) if what.contains("\"c\"")),
        "{r:?}"
    );
    assert!(sb.root().join("b").is_file());
    assert!(!sb.root().join("c").exists());
    // 0: no bound.
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    tb.file("a", &[1; 400])
        .file("b", &[2; 400])
        .file("c", &[3; 400]);
    unpack_layer(&tb.bytes()[..], &sb.root(), &limits(0)).expect("unbounded");
}

#[test]
fn huge_tar_extension_records_should_be_refused_unread() {
    for kind in [
        EntryType::GNULongName,
        EntryType::GNULongLink,
        EntryType::XHeader,
    ] {
        let sb = Sandbox::new();
        // Only the header: it claims 512 MiB that are never read.
        let h = raw_header(kind, b"././@LongLink", b"", 512 << 20, 0o644);
        let r = unpack_layer(&h.as_bytes()[..], &sb.root(), &crate::Limits::default());
        match r {
            Err(ImageError::TooLarge { what, limit }) => {
                assert_eq!(limit, crate::limits::MAX_TAR_EXTENSION_BYTES);
                assert!(what.contains("536870912"), "{what}");
            }
            other => panic!("{kind:?}: expected TooLarge, got {other:?}"),
        }
    }
}
