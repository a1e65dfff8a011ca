//! Mounts imported layers with overlayfs (as root) to check that the
//! unpacked format is what the kernel expects: whiteouts hide, opaque
//! directories mask, the base layer comes last, and busybox runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{gzip_layer, write_oci_archive, Archives, TestImage};
use petrel_image::ImageStore;
use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};

/// An overlay mount in a temp dir of its own, unmounted on drop.
struct Overlay {
    merged: PathBuf,
    _dir: tempfile::TempDir,
}

impl Overlay {
    fn mount(lowers: &[PathBuf]) -> Overlay {
        let dir = tempfile::tempdir().expect("tempdir");
        let (upper, work, merged) = (
            dir.path().join("u"),
            dir.path().join("w"),
            dir.path().join("m"),
        );
        for d in [&upper, &work, &merged] {
            std::fs::create_dir(d).expect("mkdir");
        }
        let lower: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
        let data = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            upper.display(),
            work.display()
        );
        mount(
            "overlay",
            &merged,
            "overlay",
            MountFlags::empty(),
            std::ffi::CString::new(data).expect("mount data").as_c_str(),
        )
        .expect("mount overlay");
        Overlay { merged, _dir: dir }
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = unmount(&self.merged, UnmountFlags::DETACH);
    }
}

fn store() -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(&dir.path().join("images")).expect("open store");
    (dir, store)
}

#[test]
fn overlay_should_apply_whiteouts_and_opaque_dirs_of_imported_layers() {
    let a = Archives::build();
    let (_d, store) = store();
    let base = gzip_layer(&[
        ("etc", None),
        ("etc/gone", Some(b"old")),
        ("etc/kept", Some(b"kept")),
        ("var/cache", None),
        ("var/cache/stale", Some(b"stale")),
        ("file", Some(b"base")),
    ]);
    let top = gzip_layer(&[
        ("etc/.wh.gone", Some(b"")),
        ("var/cache", None),
        ("var/cache/.wh..wh..opq", Some(b"")),
        ("var/cache/fresh", Some(b"fresh")),
        ("file", Some(b"top")),
    ]);
    let path = a.path("layers.tar");
    write_oci_archive(
        &path,
        &[TestImage::new(
            Some("petrel/layers:1"),
            "sh",
            vec![base, top],
        )],
        false,
    );
    let images = store.import(&path, &[]).expect("import");
    let lowers = store.layer_paths(&images[0]).expect("layer paths");
    let ov = Overlay::mount(&lowers);
    let m = &ov.merged;
    assert!(!m.join("etc/gone").exists());
    assert_eq!(std::fs::read(m.join("etc/kept")).expect("kept"), b"kept");
    assert!(!m.join("var/cache/stale").exists());
    assert_eq!(
        std::fs::read(m.join("var/cache/fresh")).expect("fresh"),
        b"fresh"
    );
    assert_eq!(std::fs::read(m.join("file")).expect("file"), b"top");
}

#[test]
fn busybox_should_run_from_its_overlay_root() {
    let a = Archives::build();
    let (_d, store) = store();
    let images = store.import(&a.oci(), &[]).expect("import");
    let ov = Overlay::mount(&store.layer_paths(&images[0]).expect("layer paths"));
    let out = Command::new("/usr/sbin/chroot")
        .arg(&ov.merged)
        .args([
            "/bin/sh",
            "-c",
            "id -u nobody && ls /bin | wc -l && echo ok > /tmp/x && cat /tmp/x",
        ])
        .env("PATH", "/bin")
        .output()
        .expect("chroot");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "65534");
    assert!(
        lines[1].trim().parse::<u32>().expect("count") > 200,
        "{stdout}"
    );
    assert_eq!(lines[2], "ok");
    // The write went to the upper dir, not the shared layer.
    assert!(
        !Path::new(&store.layer_paths(&images[0]).expect("paths")[0])
            .join("tmp/x")
            .exists()
    );
}
