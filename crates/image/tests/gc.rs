//! Removal with untag semantics, prune and threshold GC on a real store.

// A failed expectation is a failed test.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use common::{small_layer, write_oci_archive, TestImage};
use petrel_image::{DiskStats, ImageStore, Removal};

fn new_store() -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(&dir.path().join("images")).expect("open store");
    (dir, store)
}

fn layer_dirs(store: &ImageStore) -> usize {
    std::fs::read_dir(store.root().join("layers"))
        .expect("read layers")
        .count()
}

/// Imports an image of `layers` tagged `tag`; returns its id.
fn import(store: &ImageStore, dir: &Path, tag: &str, layers: Vec<Vec<u8>>) -> String {
    let path = dir.join(format!("{}.tar", tag.replace(['/', ':'], "_")));
    write_oci_archive(&path, &[TestImage::new(Some(tag), tag, layers)], false);
    let images = store.import(&path, &[]).expect("import");
    images[0].id.clone()
}

#[test]
fn removing_one_of_several_tags_should_untag_and_the_last_should_delete() {
    let (d, store) = new_store();
    let id = import(
        &store,
        d.path(),
        "docker.io/petrel/a:v1",
        vec![small_layer("a", b"a")],
    );
    store
        .import(
            &d.path().join("docker.io_petrel_a_v1.tar"),
            &["docker.io/petrel/b:v2".to_string()],
        )
        .expect("tag again");

    let r = store.plan_removal("petrel/b:v2").expect("plan");
    assert_eq!(
        r,
        Removal::Untag {
            image_id: id.clone(),
            tag: "docker.io/petrel/b:v2".into()
        }
    );
    assert_eq!(store.apply_removal(&r).expect("untag"), 0);
    let img = store.get(&id).expect("image stays");
    assert_eq!(img.repo_tags, vec!["docker.io/petrel/a:v1".to_string()]);
    assert!(
        img.repo_digests
            .iter()
            .all(|d| !d.starts_with("docker.io/petrel/b@")),
        "{:?}",
        img.repo_digests
    );
    assert!(store.get("petrel/b:v2").is_none());
    assert_eq!(layer_dirs(&store), 1);

    // The last tag deletes the image and its layer.
    let r = store.plan_removal("petrel/a:v1").expect("plan");
    assert_eq!(
        r,
        Removal::Delete {
            image_id: id.clone()
        }
    );
    assert!(store.apply_removal(&r).expect("delete") > 0);
    assert!(store.get(&id).is_none());
    assert_eq!(layer_dirs(&store), 0);
    assert!(store.plan_removal("petrel/a:v1").is_none());
}

#[test]
fn removing_by_id_or_digest_should_delete_the_image_with_all_its_tags() {
    let (d, store) = new_store();
    let id = import(
        &store,
        d.path(),
        "docker.io/petrel/a:v1",
        vec![small_layer("a", b"a")],
    );
    store
        .import(
            &d.path().join("docker.io_petrel_a_v1.tar"),
            &["docker.io/petrel/a:v2".to_string()],
        )
        .expect("tag again");
    let img = store.get(&id).expect("image");
    assert_eq!(img.repo_tags.len(), 2);
    let digest = img.repo_digests[0].clone();
    assert_eq!(
        store.plan_removal(&digest),
        Some(Removal::Delete {
            image_id: id.clone()
        })
    );
    assert_eq!(
        store.plan_removal(&id[7..19]),
        Some(Removal::Delete {
            image_id: id.clone()
        })
    );
    store
        .apply_removal(&store.plan_removal(&id).expect("plan"))
        .expect("delete");
    assert!(store.list().is_empty());
    assert!(store.get("petrel/a:v2").is_none());
    assert_eq!(layer_dirs(&store), 0);
}

#[test]
fn prune_should_delete_unused_images_and_only_layers_no_kept_image_shares() {
    let (d, store) = new_store();
    let shared = small_layer("base", &[7u8; 4096]);
    let used = import(
        &store,
        d.path(),
        "docker.io/petrel/used:1",
        vec![shared.clone(), small_layer("u", b"u")],
    );
    let unused = import(
        &store,
        d.path(),
        "docker.io/petrel/unused:1",
        vec![shared, small_layer("x", b"x")],
    );
    let lone = import(
        &store,
        d.path(),
        "docker.io/petrel/lone:1",
        vec![small_layer("l", b"l")],
    );
    assert_eq!(layer_dirs(&store), 4);
    let in_use = HashSet::from([used.clone()]);
    let report = store.prune(&in_use).expect("prune");
    let mut removed: Vec<String> = report.removed.iter().map(|i| i.id.clone()).collect();
    removed.sort();
    let mut want = vec![unused, lone];
    want.sort();
    assert_eq!(removed, want);
    assert!(report.freed_bytes > 0);
    assert_eq!(layer_dirs(&store), 2, "the shared base stays");
    assert!(store.get(&used).is_some());
    let used_img = store.get(&used).expect("used");
    assert_eq!(store.layer_paths(&used_img).expect("paths").len(), 2);
}

#[test]
fn threshold_gc_should_delete_least_recently_used_until_below_low() {
    let (d, store) = new_store();
    let a = import(
        &store,
        d.path(),
        "docker.io/petrel/a:1",
        vec![small_layer("a", &[1u8; 8192])],
    );
    let b = import(
        &store,
        d.path(),
        "docker.io/petrel/b:1",
        vec![small_layer("b", &[2u8; 8192])],
    );
    let c = import(
        &store,
        d.path(),
        "docker.io/petrel/c:1",
        vec![small_layer("c", &[3u8; 8192])],
    );
    // Use order: b, then a; c never used since its import (oldest).
    std::thread::sleep(Duration::from_millis(5));
    store.mark_used(&b);
    std::thread::sleep(Duration::from_millis(5));
    store.mark_used(&a);
    let one_layer = store.fs_usage().used_bytes / 3;
    assert!(one_layer > 0);
    let none = HashSet::new();

    // Below high: nothing happens.
    let disk = DiskStats {
        capacity_bytes: 100 * one_layer,
        available_bytes: 30 * one_layer,
    };
    let r = store
        .gc_with(disk, 80, 60, &none, Duration::ZERO)
        .expect("gc");
    assert_eq!(r.usage_before_percent, Some(70));
    assert!(r.removed.is_empty());

    // 85 % used, high = low = 84 %: one layer's worth to free, so only c goes.
    let disk = DiskStats {
        capacity_bytes: 100 * one_layer,
        available_bytes: 15 * one_layer,
    };
    let r = store
        .gc_with(disk, 84, 84, &none, Duration::ZERO)
        .expect("gc");
    assert_eq!(
        r.removed.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        vec![c.clone()]
    );
    assert_eq!(r.wanted_bytes, one_layer);
    assert!(r.freed_bytes >= one_layer);

    // An image in use, and images younger than the minimum age, stay.
    let in_use = HashSet::from([b.clone()]);
    let r = store
        .gc_with(disk, 80, 0, &in_use, Duration::from_secs(3600))
        .expect("gc");
    assert!(r.removed.is_empty());
    let r = store
        .gc_with(disk, 80, 0, &in_use, Duration::ZERO)
        .expect("gc");
    assert_eq!(
        r.removed.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        vec![a]
    );
    assert_eq!(store.list().len(), 1);
    assert_eq!(layer_dirs(&store), 1);

    assert!(store
        .gc_with(disk, 50, 60, &in_use, Duration::ZERO)
        .is_err());
}
