//! Layer unpacking through the store: a hostile layer fails the whole
//! import and leaves nothing (no layer directory, no temp debris, no image,
//! nothing outside), and zstd layers import like gzip ones.

use std::path::Path;

mod common;

use common::{small_layer, write_oci_archive, TestImage};
use petrel_image::{ImageError, ImageStore};

fn tar_header(kind: tar::EntryType, name: &str, link: &str, size: usize) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size as u64);
    h.set_mode(0o644);
    // Raw fields: tar's own setters refuse the hostile names under test.
    let old = h.as_old_mut();
    old.name[..name.len()].copy_from_slice(name.as_bytes());
    old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_cksum();
    h
}

fn gzip(raw: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, raw).expect("gzip");
    gz.finish().expect("gzip")
}

fn dir_names(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_hostile_layer_should_fail_the_import_and_leave_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(outside.join("secret"), b"secret").expect("write");
    let store = ImageStore::open(&dir.path().join("images")).expect("open store");

    // A good base layer, then one writing through a symlink to the host.
    let mut b = tar::Builder::new(Vec::new());
    let target = outside.display().to_string();
    b.append(
        &tar_header(tar::EntryType::Symlink, "evil", &target, 0),
        &b""[..],
    )
    .expect("append");
    b.append(
        &tar_header(tar::EntryType::Regular, "evil/secret", "", 5),
        &b"pwned"[..],
    )
    .expect("append");
    let hostile = gzip(&b.into_inner().expect("tar"));
    let archive = dir.path().join("hostile.tar");
    write_oci_archive(
        &archive,
        &[TestImage::new(
            Some("docker.io/petrel/hostile:1"),
            "/bin/sh",
            vec![small_layer("etc/hostname", b"base\n"), hostile],
        )],
        false,
    );

    let r = store.import(&archive, &[]);
    match &r {
        Err(ImageError::UnsafeEntry { path, .. }) => assert_eq!(path, "evil/secret"),
        other => panic!("expected the entry refused, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(outside.join("secret")).expect("sentinel"),
        b"secret"
    );
    assert_eq!(dir_names(&outside), ["secret"]);
    assert!(store.list().is_empty());
    let root = store.root();
    // The base layer unpacked before the failure is gone too.
    assert!(dir_names(&root.join("layers")).is_empty());
    assert!(dir_names(&root.join("tmp")).is_empty());
    assert_eq!(store.fs_usage().inodes_used, 0);
}

#[test]
fn a_zstd_layer_should_import_like_a_gzip_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(&dir.path().join("images")).expect("open store");
    let mut b = tar::Builder::new(Vec::new());
    common::append(&mut b, "etc/zstd", b"compressed with zstd\n");
    let zst = zstd::stream::encode_all(&b.into_inner().expect("tar")[..], 3).expect("zstd");
    let archive = dir.path().join("zstd.tar");
    write_oci_archive(
        &archive,
        &[TestImage::new(
            Some("docker.io/petrel/zstd:1"),
            "/bin/sh",
            vec![small_layer("etc/gzip", b"gzip\n"), zst],
        )],
        false,
    );
    let images = store.import(&archive, &[]).expect("import");
    assert_eq!(images.len(), 1);
    let paths = store.layer_paths(&images[0]).expect("layer paths");
    // Topmost first, as overlayfs lowerdir= wants them.
    assert_eq!(paths.len(), 2);
    assert_eq!(
        std::fs::read(paths[1].join("etc/gzip")).expect("gzip layer"),
        b"gzip\n"
    );
    assert_eq!(
        std::fs::read(paths[0].join("etc/zstd")).expect("zstd layer"),
        b"compressed with zstd\n"
    );
}
