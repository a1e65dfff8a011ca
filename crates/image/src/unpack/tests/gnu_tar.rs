//! Interoperability: a tree with every supported feature, archived by GNU
//! tar (the host's, in its GNU and POSIX formats, with xattrs), unpacks to
//! the same tree: types, modes with setuid/setgid/sticky, owners, mtimes,
//! contents, link targets, device numbers, xattrs and hard links.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use rustix::fs::{self as rfs, Mode, Timespec, Timestamps};

use super::{list_tree, xattr, Sandbox};

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Builds the source tree under `src`.
fn build_tree(src: &Path) {
    let long = "n".repeat(200);
    for d in ["etc", "tmp", "shared", "dev", &format!("deep/{long}")] {
        std::fs::create_dir_all(src.join(d)).expect("mkdir");
    }
    std::fs::write(src.join("etc/passwd"), b"root:x:0:0::/root:/bin/sh\n").expect("write");
    std::fs::write(src.join("suid"), b"#!/bin/sh\n").expect("write");
    std::fs::write(src.join(format!("deep/{long}/f")), b"deep").expect("write");
    std::fs::hard_link(src.join("suid"), src.join("suid-link")).expect("link");
    std::os::unix::fs::symlink("/etc/passwd", src.join("abs")).expect("symlink");
    std::os::unix::fs::symlink("../../nowhere", src.join("dangling")).expect("symlink");
    std::os::unix::fs::symlink(format!("deep/{long}/f"), src.join("long-link")).expect("symlink");
    rfs::mknodat(
        rfs::CWD,
        src.join("dev/null"),
        rfs::FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rfs::makedev(1, 3),
    )
    .expect("mknod");
    rfs::mknodat(
        rfs::CWD,
        src.join("dev/fifo"),
        rfs::FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .expect("mkfifo");
    rfs::setxattr(
        src.join("etc/passwd"),
        "user.petrel",
        b"v",
        rfs::XattrFlags::empty(),
    )
    .expect("setxattr");
    let owner = |p: &str, u: u32, g: u32| {
        rfs::chown(
            src.join(p),
            Some(rfs::Uid::from_raw(u)),
            Some(rfs::Gid::from_raw(g)),
        )
        .expect("chown");
    };
    owner("etc/passwd", 1234, 5678);
    owner("shared", 0, 50);
    chmod(&src.join("suid"), 0o4755);
    chmod(&src.join("tmp"), 0o1777);
    chmod(&src.join("shared"), 0o2775);
    // Times last, deepest first, so creating children does not change them.
    let mut all = Vec::new();
    list_tree(src, "", &mut all);
    for (i, (rel, _)) in all.iter().enumerate() {
        let t = Timespec {
            tv_sec: 1_600_000_000 + i as i64,
            tv_nsec: 0,
        };
        rfs::utimensat(
            rfs::CWD,
            src.join(rel),
            &Timestamps {
                last_access: t,
                last_modification: t,
            },
            rfs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .expect("utimensat");
    }
}

/// What must survive the round trip, per path.
fn describe(root: &Path) -> BTreeMap<String, String> {
    let mut found = Vec::new();
    list_tree(root, "", &mut found);
    let mut inode_names: BTreeMap<u64, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for (rel, m) in found {
        let p = root.join(&rel);
        let ft = m.file_type();
        let what = if ft.is_file() {
            let first = inode_names.entry(m.ino()).or_insert_with(|| rel.clone());
            format!(
                "file {:?} inode-of {first}",
                String::from_utf8_lossy(&std::fs::read(&p).expect("read"))
            )
        } else if ft.is_symlink() {
            format!(
                "symlink {}",
                std::fs::read_link(&p).expect("readlink").display()
            )
        } else if ft.is_char_device() {
            format!("char {}:{}", rfs::major(m.rdev()), rfs::minor(m.rdev()))
        } else if ft.is_fifo() {
            "fifo".to_string()
        } else {
            "dir".to_string()
        };
        let mode = if ft.is_symlink() {
            0
        } else {
            m.mode() & 0o7777
        };
        let x = xattr(&p, "user.petrel").unwrap_or_default();
        out.insert(
            rel,
            format!(
                "{what} mode {mode:o} owner {}:{} mtime {} xattr {:?}",
                m.uid(),
                m.gid(),
                m.mtime(),
                String::from_utf8_lossy(&x)
            ),
        );
    }
    out
}

#[test]
fn layers_made_by_gnu_tar_should_unpack_to_the_same_tree() {
    let sb = Sandbox::new();
    let work = tempfile::tempdir().expect("tempdir");
    let src = work.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    build_tree(&src);
    let want = describe(&src);
    assert!(want.len() >= 14, "{want:?}");
    for format in ["gnu", "posix"] {
        let layer = work.path().join(format!("{format}.tar"));
        // Only the POSIX (PAX) format carries xattrs.
        let xattrs: &[&str] = if format == "posix" {
            &["--xattrs", "--xattrs-include=*"]
        } else {
            &[]
        };
        let out = Command::new("tar")
            .args(xattrs)
            .args(["--numeric-owner", &format!("--format={format}"), "-C"])
            .arg(&src)
            .arg("-cf")
            .arg(&layer)
            .arg(".")
            .output()
            .expect("run GNU tar (Debian's tar package)");
        assert!(
            out.status.success(),
            "tar: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let root = sb.root().join(format);
        std::fs::create_dir(&root).expect("mkdir");
        let data = std::fs::read(&layer).expect("read layer");
        super::unpack_layer(&data[..], &root, &crate::Limits::default()).expect("unpack");
        let got = describe(&root);
        for (p, w) in &want {
            let w = if format == "posix" {
                w.clone()
            } else {
                w.replace("xattr \"v\"", "xattr \"\"")
            };
            assert_eq!(got.get(p), Some(&w), "{format}: {p}");
        }
        assert_eq!(got.len(), want.len(), "{format}: {got:?}");
    }
}
