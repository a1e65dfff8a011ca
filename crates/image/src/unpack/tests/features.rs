//! Each supported feature at the unpacked-directory level: entry types,
//! metadata, whiteouts as overlayfs expects them, replacements, long names,
//! compressed layers.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use rustix::fs as rfs;
use tar::EntryType;

use super::super::whiteout::OPAQUE_XATTR;
use super::*;

#[test]
fn unpack_should_create_every_entry_type_with_its_metadata() {
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    let mut h = raw_header(EntryType::Directory, b"a/", b"", 0, 0o750);
    h.set_uid(1000);
    h.set_gid(1001);
    h.set_mtime(12345);
    h.set_cksum();
    tb.0.append(&h, &b""[..]).expect("append");
    tb.add(EntryType::Regular, "a/suid", "", b"#!/bin/sh\n", 0o4755);
    tb.0.append_pax_extensions([("SCHILY.xattr.user.petrel", &b"yes"[..])])
        .expect("pax");
    tb.file("a/xattr", b"x");
    tb.0.append_pax_extensions([
        ("uid", &b"70000"[..]),
        ("gid", &b"70001"[..]),
        ("mtime", &b"1700000000.5"[..]),
    ])
    .expect("pax");
    tb.file("a/pax", b"p");
    tb.sym("a/abs", "/etc/passwd")
        .sym("a/rel", "../../../x")
        .hard("a/hl", "a/suid");
    let mut c = raw_header(EntryType::Char, b"dev/null", b"", 0, 0o666);
    c.set_device_major(1).expect("major");
    c.set_device_minor(3).expect("minor");
    c.set_cksum();
    tb.0.append(&c, &b""[..]).expect("append");
    let mut b = raw_header(EntryType::Block, b"dev/sda", b"", 0, 0o660);
    b.set_device_major(8).expect("major");
    b.set_device_minor(0).expect("minor");
    b.set_cksum();
    tb.0.append(&b, &b""[..]).expect("append");
    tb.add(EntryType::Fifo, "run/fifo", "", b"", 0o600);
    let stats = sb.unpack(&tb.bytes()).expect("unpack");
    let r = sb.root();

    let a = std::fs::symlink_metadata(r.join("a")).expect("a");
    assert!(a.is_dir());
    assert_eq!(
        (a.uid(), a.gid(), a.mode() & 0o7777, a.mtime()),
        (1000, 1001, 0o750, 12345)
    );
    let s = std::fs::symlink_metadata(r.join("a/suid")).expect("suid");
    assert_eq!(s.mode() & 0o7777, 0o4755);
    assert_eq!(s.mtime(), 1_000_000);
    assert_eq!(
        std::fs::read(r.join("a/suid")).expect("read"),
        b"#!/bin/sh\n"
    );
    let hl = std::fs::symlink_metadata(r.join("a/hl")).expect("hl");
    assert_eq!(hl.ino(), s.ino());
    assert_eq!(s.nlink(), 2);
    let p = std::fs::symlink_metadata(r.join("a/pax")).expect("pax");
    assert_eq!(
        (p.uid(), p.gid(), p.mtime(), p.mtime_nsec()),
        (70000, 70001, 1_700_000_000, 500_000_000)
    );
    let x = xattr(&r.join("a/xattr"), "user.petrel").expect("xattr");
    assert_eq!(x, b"yes");
    assert_eq!(
        std::fs::read_link(r.join("a/abs")).expect("readlink"),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        std::fs::read_link(r.join("a/rel")).expect("readlink"),
        Path::new("../../../x")
    );
    let n = std::fs::symlink_metadata(r.join("dev/null")).expect("null");
    assert!(n.file_type().is_char_device());
    assert_eq!(
        (rfs::major(n.rdev()), rfs::minor(n.rdev()), n.mode() & 0o777),
        (1, 3, 0o666)
    );
    let d = std::fs::symlink_metadata(r.join("dev/sda")).expect("sda");
    assert!(d.file_type().is_block_device());
    assert_eq!((rfs::major(d.rdev()), rfs::minor(d.rdev())), (8, 0));
    let f = std::fs::symlink_metadata(r.join("run/fifo")).expect("fifo");
    assert!(f.file_type().is_fifo());
    assert_eq!(f.mode() & 0o777, 0o600);
    // Implicit parents get 0755.
    assert_eq!(
        std::fs::metadata(r.join("dev")).expect("dev").mode() & 0o7777,
        0o755
    );
    // a, 3 files, 2 symlinks, dev, 2 devices, run, fifo (the hard link adds none).
    assert_eq!(stats.inodes, 11);
    assert!(stats.bytes > 0);
}

#[test]
fn unpack_should_produce_overlay_whiteouts_and_opaque_dirs() {
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    tb.dir("etc/")
        .file("etc/.wh.hosts", b"")
        .dir("var/cache/")
        .file("var/cache/.wh..wh..opq", b"");
    tb.file("var/cache/new", b"n").file("lib/.wh..wh.plnk", b"");
    tb.0.append_pax_extensions([("SCHILY.xattr.trusted.overlay.opaque", &b"y"[..])])
        .expect("pax");
    tb.dir("forged/");
    sb.unpack(&tb.bytes()).expect("unpack");
    let r = sb.root();
    let w = std::fs::symlink_metadata(r.join("etc/hosts")).expect("whiteout");
    assert!(w.file_type().is_char_device());
    assert_eq!(w.rdev(), 0);
    assert!(!r.join("etc/.wh.hosts").exists());
    let opq = xattr(&r.join("var/cache"), OPAQUE_XATTR).expect("opaque xattr");
    assert_eq!(opq, b"y");
    assert!(!r.join("var/cache/.wh..wh..opq").exists());
    assert!(r.join("var/cache/new").exists());
    assert!(!r.join("lib/.wh..wh.plnk").exists());
    // An overlay xattr carried by the layer itself is dropped.
    assert!(xattr(&r.join("forged"), OPAQUE_XATTR).is_err());
}

#[test]
fn unpack_should_replace_entries_without_writing_through_them() {
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    // A hard link to a file, then a new file at the link's name: the
    // original must keep its content.
    tb.file("orig", b"original")
        .hard("link", "orig")
        .file("link", b"replaced");
    // A directory tree replaced by a file, a file replaced by a dir.
    tb.dir("d/")
        .dir("d/sub/")
        .file("d/sub/f", b"f")
        .file("d", b"now a file");
    tb.file("e", b"file").dir("e/").file("e/child", b"c");
    sb.unpack(&tb.bytes()).expect("unpack");
    let r = sb.root();
    assert_eq!(std::fs::read(r.join("orig")).expect("orig"), b"original");
    assert_eq!(std::fs::read(r.join("link")).expect("link"), b"replaced");
    assert_eq!(std::fs::read(r.join("d")).expect("d"), b"now a file");
    assert!(r.join("e").is_dir());
    assert_eq!(std::fs::read(r.join("e/child")).expect("child"), b"c");
}

#[test]
fn unpack_should_keep_setgid_and_sticky_bits_and_owners_of_directories() {
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    tb.add(EntryType::Directory, "tmp/", "", b"", 0o1777)
        .add(EntryType::Directory, "shared/", "", b"", 0o2775)
        .add(EntryType::Regular, "shared/sgid", "", b"x", 0o2755);
    let mut h = raw_header(EntryType::Regular, b"owned", b"", 1, 0o6711);
    h.set_uid(65534);
    h.set_gid(12);
    h.set_cksum();
    tb.0.append(&h, &b"o"[..]).expect("append");
    sb.unpack(&tb.bytes()).expect("unpack");
    let r = sb.root();
    let mode = |p: &str| std::fs::symlink_metadata(r.join(p)).expect("lstat").mode() & 0o7777;
    assert_eq!(mode("tmp"), 0o1777);
    assert_eq!(mode("shared"), 0o2775);
    assert_eq!(mode("shared/sgid"), 0o2755);
    let o = std::fs::symlink_metadata(r.join("owned")).expect("owned");
    // chown before chmod: the setuid/setgid bits survive the chown.
    assert_eq!((o.uid(), o.gid(), o.mode() & 0o7777), (65534, 12, 0o6711));
}

#[test]
fn unpack_should_read_long_gnu_and_pax_names_and_link_targets() {
    let sb = Sandbox::new();
    let deep = format!("{}/{}/file", "d".repeat(150), "e".repeat(200));
    let mut tb = Tb::new();
    tb.file(&deep, b"deep")
        .sym("to-deep", &deep)
        .hard("hl", &deep);
    let pax_name = format!("p/{}", "q".repeat(180));
    tb.0.append_pax_extensions([("path", pax_name.as_bytes())])
        .expect("pax");
    tb.file("ignored-short-name", b"pax");
    sb.unpack(&tb.bytes()).expect("unpack");
    let r = sb.root();
    assert_eq!(std::fs::read(r.join(&deep)).expect("deep"), b"deep");
    assert_eq!(
        std::fs::read_link(r.join("to-deep")).expect("readlink"),
        Path::new(&deep)
    );
    assert_eq!(
        std::fs::symlink_metadata(r.join("hl")).expect("hl").ino(),
        std::fs::symlink_metadata(r.join(&deep))
            .expect("deep")
            .ino()
    );
    assert_eq!(std::fs::read(r.join(&pax_name)).expect("pax"), b"pax");
    assert!(!r.join("ignored-short-name").exists());
}

#[test]
fn unpack_should_merge_a_repeated_directory_and_take_its_last_metadata() {
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    tb.dir("d/").file("d/a", b"a");
    tb.add(EntryType::Directory, "d/", "", b"", 0o700);
    tb.file("d/b", b"b");
    sb.unpack(&tb.bytes()).expect("unpack");
    let d = sb.root().join("d");
    assert_eq!(std::fs::read(d.join("a")).expect("a"), b"a");
    assert_eq!(std::fs::read(d.join("b")).expect("b"), b"b");
    let m = std::fs::metadata(&d).expect("d");
    assert_eq!(m.mode() & 0o7777, 0o700);
    // Directory times are applied last, after the children were made.
    assert_eq!(m.mtime(), 1_000_000);
}

#[test]
fn unpack_should_turn_a_whiteout_of_a_directory_into_a_device_and_refuse_nameless_ones() {
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    tb.dir("d/").file("d/x", b"x").file(".wh.d", b"");
    sb.unpack(&tb.bytes()).expect("unpack");
    let w = std::fs::symlink_metadata(sb.root().join("d")).expect("d");
    assert!(w.file_type().is_char_device());
    assert_eq!(w.rdev(), 0);
    for name in ["a/.wh.", "a/.wh..", "a/.wh..."] {
        let sb = Sandbox::new();
        let mut tb = Tb::new();
        tb.dir("a/").file(name, b"");
        let r = sb.unpack(&tb.bytes());
        // ".wh..." hides "..": refused, as are the others.
        assert!(is_unsafe(&r), "{name}: {r:?}");
    }
}

#[test]
fn unpack_should_read_gzip_and_zstd_layers_through_decompress() {
    let mut tb = Tb::new();
    tb.dir("etc/").file("etc/os-release", b"ID=petrel\n");
    let tar = tb.bytes();
    let gz = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, &tar).expect("gzip");
        e.finish().expect("gzip")
    };
    let zst = zstd::stream::encode_all(&tar[..], 3).expect("zstd");
    for (blob, mt) in [
        (tar.clone(), "application/vnd.oci.image.layer.v1.tar"),
        (gz, "application/vnd.oci.image.layer.v1.tar+gzip"),
        (zst, "application/vnd.oci.image.layer.v1.tar+zstd"),
    ] {
        let sb = Sandbox::new();
        let r =
            super::super::decompress(&blob[..], Some(mt), Path::new("blob")).expect("decompress");
        unpack_layer(r, &sb.root(), &crate::Limits::default()).expect("unpack");
        assert_eq!(
            std::fs::read(sb.root().join("etc/os-release")).expect("read"),
            b"ID=petrel\n",
            "{mt}"
        );
    }
}

#[test]
fn unpack_should_drop_xattrs_the_filesystem_cannot_hold_and_keep_the_others() {
    let sb = Sandbox::new();
    let mut tb = Tb::new();
    // A namespace Linux does not know (tars made on macOS carry these).
    tb.0.append_pax_extensions([
        ("SCHILY.xattr.com.apple.quarantine", &b"0081;x"[..]),
        ("SCHILY.xattr.user.kept", &b"1"[..]),
    ])
    .expect("pax");
    tb.file("f", b"f");
    // user.* is never allowed on a symlink.
    tb.0.append_pax_extensions([("SCHILY.xattr.user.on-link", &b"1"[..])])
        .expect("pax");
    tb.sym("l", "f");
    // trusted.* on a directory through its fd.
    tb.0.append_pax_extensions([("SCHILY.xattr.trusted.petrel", &b"t"[..])])
        .expect("pax");
    tb.dir("d/");
    sb.unpack(&tb.bytes()).expect("unpack");
    let r = sb.root();
    assert_eq!(xattr(&r.join("f"), "user.kept").expect("kept"), b"1");
    assert!(xattr(&r.join("f"), "com.apple.quarantine").is_err());
    assert!(std::fs::symlink_metadata(r.join("l"))
        .expect("l")
        .file_type()
        .is_symlink());
    assert_eq!(
        xattr(&r.join("d"), "trusted.petrel").expect("trusted"),
        b"t"
    );
}
