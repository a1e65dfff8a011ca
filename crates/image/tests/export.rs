//! Export as an OCI archive: a round trip through a second store unpacks
//! to the same layer trees (whiteouts, opaque directories, hard links,
//! symlinks, modes, owners), re-export is byte-identical, and skopeo
//! accepts the archive.

// A failed expectation is a failed test.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

use common::{append, write_oci_archive, Archives, TestImage};
use petrel_image::ImageStore;

fn new_store(dir: &Path, name: &str) -> ImageStore {
    ImageStore::open(&dir.join(name)).expect("open store")
}

fn gzip(tar: Vec<u8>) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    gz.finish().expect("gzip")
}

fn entry(b: &mut tar::Builder<Vec<u8>>, name: &str, kind: tar::EntryType, link: Option<&str>) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(0);
    h.set_mode(0o755);
    h.set_uid(1000);
    h.set_gid(1000);
    h.set_mtime(1_700_000_000);
    match link {
        Some(l) => b.append_link(&mut h, name, l).expect("link"),
        None => b
            .append_data(&mut h, name, std::io::empty())
            .expect("entry"),
    }
}

/// Base: dir a/ with two files, file x, a symlink; top: a/ made opaque
/// with a new file, x whited out, a hard link.
fn layers() -> Vec<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "a", tar::EntryType::Directory, None);
    append(&mut b, "a/f1", b"one");
    append(&mut b, "a/f2", b"two");
    append(&mut b, "x", b"x");
    entry(&mut b, "ln", tar::EntryType::Symlink, Some("a/f1"));
    let base = gzip(b.into_inner().expect("tar"));
    let mut b = tar::Builder::new(Vec::new());
    entry(&mut b, "a", tar::EntryType::Directory, None);
    append(&mut b, "a/.wh..wh..opq", b"");
    append(&mut b, "a/g", b"new");
    append(&mut b, ".wh.x", b"");
    entry(&mut b, "hard", tar::EntryType::Link, Some("a/g"));
    let top = gzip(b.into_inner().expect("tar"));
    vec![base, top]
}

/// A layer tree: path → (kind, mode, uid, gid, nlink, content or target).
fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").path())
            .collect();
        names.sort();
        for p in names {
            let md = std::fs::symlink_metadata(&p).expect("stat");
            let ft = md.file_type();
            let what = if ft.is_dir() {
                let mut buf = [0u8; 4];
                let opaque = rustix::fs::lgetxattr(&p, "trusted.overlay.opaque", &mut buf).is_ok();
                format!("dir opaque={opaque}")
            } else if ft.is_symlink() {
                format!("-> {}", std::fs::read_link(&p).expect("link").display())
            } else if ft.is_char_device() {
                format!("char {}", md.rdev())
            } else {
                format!("file {:?}", std::fs::read(&p).expect("read"))
            };
            let rel = p.strip_prefix(root).expect("prefix").display().to_string();
            out.insert(
                rel,
                format!(
                    "{what} mode={:o} {}:{} nlink={} mtime={}",
                    md.mode() & 0o7777,
                    md.uid(),
                    md.gid(),
                    md.nlink(),
                    // Directories' and whiteouts' times are the unpacker's.
                    if ft.is_dir() || ft.is_char_device() {
                        0
                    } else {
                        md.mtime()
                    }
                ),
            );
            if ft.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

fn layer_trees(store: &ImageStore, reference: &str) -> Vec<BTreeMap<String, String>> {
    let image = store.get(reference).expect("image");
    store
        .layer_paths(&image)
        .expect("paths")
        .iter()
        .map(|p| tree(p))
        .collect()
}

#[test]
fn export_should_round_trip_through_import_and_be_stable() {
    let a = Archives::build();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = new_store(dir.path(), "src");
    let path = dir.path().join("in.tar");
    write_oci_archive(
        &path,
        &[TestImage::new(
            Some("docker.io/petrel/wh:1"),
            "sh",
            layers(),
        )],
        false,
    );
    src.import(&path, &[]).expect("import");
    src.import(&a.oci(), &[]).expect("import busybox");

    for reference in ["docker.io/petrel/wh:1", "docker.io/petrel/busybox:latest"] {
        let out1 = dir.path().join("out1.tar");
        let e1 = src.export(reference, &out1).expect("export");
        let dst = new_store(
            dir.path(),
            &format!("dst-{}", e1.id.len() + reference.len()),
        );
        let imported = dst.import(&out1, &[]).expect("import the export");
        assert_eq!(imported.len(), 1);
        assert_eq!(imported[0].id, e1.id);
        assert_eq!(imported[0].repo_tags, vec![reference.to_string()]);
        let src_image = src.get(reference).expect("src image");
        assert_eq!(imported[0].diff_ids.len(), src_image.diff_ids.len());
        assert_eq!(
            layer_trees(&dst, reference),
            layer_trees(&src, reference),
            "{reference}"
        );

        if reference.contains("/wh:") {
            // The features under test are really there (top layer first).
            let top = &layer_trees(&dst, reference)[0];
            assert!(top["x"].starts_with("char 0"), "{top:?}");
            assert!(top["a"].starts_with("dir opaque=true"), "{top:?}");
            assert!(top["hard"].contains("nlink=2"), "{top:?}");
            assert!(top["hard"].contains("1000:1000") || top["hard"].contains("0:0"));
        }

        // Export of the re-imported image: the same bytes.
        let out2 = dir.path().join("out2.tar");
        let e2 = dst.export(reference, &out2).expect("re-export");
        assert_eq!(e2.id, e1.id);
        assert_eq!(
            std::fs::read(&out1).expect("out1"),
            std::fs::read(&out2).expect("out2")
        );

        // skopeo reads it and verifies every blob.
        let copy = dir.path().join("skopeo-dir");
        let _ = std::fs::remove_dir_all(&copy);
        let o = Command::new("skopeo")
            .arg("copy")
            .arg(format!("oci-archive:{}", out1.display()))
            .arg(format!("dir:{}", copy.display()))
            .output()
            .expect("run skopeo (Debian package skopeo)");
        assert!(
            o.status.success(),
            "skopeo: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let leftovers: Vec<_> = std::fs::read_dir(src.tmp_dir()).expect("tmp").collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

#[test]
fn export_of_an_unknown_image_should_fail_without_writing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = new_store(dir.path(), "s");
    let out = dir.path().join("o.tar");
    assert!(store.export("docker.io/petrel/none:1", &out).is_err());
    assert!(!out.exists());
}
