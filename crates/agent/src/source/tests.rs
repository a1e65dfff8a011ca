use std::time::Duration;

use tokio::sync::mpsc;

use super::*;
use crate::types::PodOrigin;

const NODE: &str = "node-a";

fn pod_yaml(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
    )
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn by_name(src: &PodSource, name: &str) -> DesiredPod {
    src.all()
        .into_iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no pod {name} in {:?}", src.all()))
}

#[test]
fn load_should_fail_on_a_missing_or_non_directory_path() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let e = PodSource::load(&missing, NODE).unwrap_err().to_string();
    assert!(e.contains(&missing.display().to_string()), "{e}");
    write(tmp.path(), "f", "");
    let e = PodSource::load(&tmp.path().join("f"), NODE)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a directory"), "{e}");
}

#[test]
fn load_should_apply_api_server_defaults() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "web.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  containers:\n  - name: app\n    image: nginx\n    ports: [{containerPort: 80}]\n    livenessProbe: {httpGet: {port: 80}}\n  - {name: side, image: 'busybox:1.36'}\n  initContainers:\n  - {name: init, image: 'busybox@sha256:00'}\n",
    );
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    let p = by_name(&src, "web");
    assert_eq!(p.invalid, None);
    assert_eq!(p.namespace, "default");
    let pod = &p.pod;
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(pod.metadata.uid.as_deref(), Some(p.uid.as_str()));
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(NODE));
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    assert_eq!(spec.termination_grace_period_seconds, Some(30));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
    assert_eq!(spec.scheduler_name.as_deref(), Some("default-scheduler"));
    let app = &spec.containers[0];
    assert_eq!(app.image_pull_policy.as_deref(), Some("Always"));
    assert_eq!(
        app.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
    assert_eq!(app.termination_message_policy.as_deref(), Some("File"));
    assert_eq!(
        app.ports.as_ref().unwrap()[0].protocol.as_deref(),
        Some("TCP")
    );
    let probe = app.liveness_probe.as_ref().unwrap();
    assert_eq!(
        (
            probe.period_seconds,
            probe.timeout_seconds,
            probe.success_threshold,
            probe.failure_threshold
        ),
        (Some(10), Some(1), Some(1), Some(3))
    );
    assert_eq!(
        probe.http_get.as_ref().unwrap().scheme.as_deref(),
        Some("HTTP")
    );
    assert_eq!(
        spec.containers[1].image_pull_policy.as_deref(),
        Some("IfNotPresent")
    );
    let init = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(init.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(init.termination_message_policy.as_deref(), Some("File"));
}

#[test]
fn load_should_keep_explicit_values_over_defaults() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "p.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns, uid: my-uid}\nspec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 0\n  containers: [{name: a, image: x, imagePullPolicy: Never}]\n",
    );
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    let p = src.get("my-uid").unwrap();
    assert_eq!((p.namespace.as_str(), p.name.as_str()), ("ns", "p"));
    let spec = p.pod.spec.as_ref().unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(spec.termination_grace_period_seconds, Some(0));
    assert_eq!(
        spec.containers[0].image_pull_policy.as_deref(),
        Some("Never")
    );
}

#[test]
fn uid_should_be_stable_across_content_changes() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "web.yaml", &pod_yaml("web", "nginx:1"));
    let a = by_name(&PodSource::load(tmp.path(), NODE).unwrap(), "web");
    assert_eq!(a.uid, uid::derive(NODE, "default", "web"));
    assert!(
        a.uid.len() == 32
            && a.uid
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    write(tmp.path(), "web.yaml", &pod_yaml("web", "nginx:2"));
    std::fs::rename(tmp.path().join("web.yaml"), tmp.path().join("renamed.yml")).unwrap();
    let b = by_name(&PodSource::load(tmp.path(), NODE).unwrap(), "web");
    assert_eq!(a.uid, b.uid);
    assert_ne!(a.pod, b.pod);
    // Another node's pod of the same name is another pod.
    let c = by_name(&PodSource::load(tmp.path(), "node-b").unwrap(), "web");
    assert_ne!(a.uid, c.uid);
}

#[test]
fn load_should_read_several_documents_and_ignore_other_files() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "two.yaml",
        &format!("{}---\n{}", pod_yaml("a", "i"), pod_yaml("b", "i")),
    );
    write(
        tmp.path(),
        "j.json",
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#,
    );
    write(tmp.path(), "notes.txt", &pod_yaml("txt", "i"));
    write(tmp.path(), ".hidden.yaml", &pod_yaml("hidden", "i"));
    write(tmp.path(), ".two.yaml.swp", "binary");
    write(tmp.path(), "two.yaml~", &pod_yaml("backup", "i"));
    std::fs::create_dir(tmp.path().join("sub.yaml")).unwrap();
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    let mut names: Vec<_> = src.all().into_iter().map(|p| p.name).collect();
    names.sort();
    assert_eq!(names, ["a", "b", "j"]);
    assert!(src.all().iter().all(|p| p.invalid.is_none()));
}

#[test]
fn invalid_documents_should_be_shown_and_not_disturb_others() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "good.yaml", &pod_yaml("good", "i"));
    write(tmp.path(), "noimage.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: noimage, namespace: team}\nspec: {containers: [{name: a}]}\n");
    write(
        tmp.path(),
        "Broken_File.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [\n",
    );
    write(tmp.path(), "badname.yaml", &pod_yaml("Foo_", "i"));
    write(
        tmp.path(),
        "deploy.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: dep}\n",
    );
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    assert_eq!(src.all().len(), 5);
    assert_eq!(by_name(&src, "good").invalid, None);

    let p = by_name(&src, "noimage");
    assert_eq!(p.namespace, "team");
    assert_eq!(
        p.invalid.as_deref(),
        Some("spec.containers[0].image: Required value")
    );

    let p = by_name(&src, "broken-file");
    assert_eq!(p.namespace, "default");
    assert!(
        p.invalid.as_deref().unwrap().starts_with("invalid YAML"),
        "{p:?}"
    );
    assert_eq!(p.pod.metadata.name.as_deref(), Some("broken-file"));
    assert_eq!(p.pod.metadata.uid.as_deref(), Some(p.uid.as_str()));

    let p = by_name(&src, "Foo_");
    assert!(p
        .invalid
        .as_deref()
        .unwrap()
        .starts_with(r#"metadata.name: Invalid value: "Foo_""#));

    let p = by_name(&src, "dep");
    assert_eq!(
        p.invalid.as_deref(),
        Some(r#"kind: Unsupported value: "Deployment": supported: Pod"#)
    );
}

/// The process's peak resident set (VmHWM), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn load_should_refuse_a_manifest_file_over_the_size_bound_unread() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "good.yaml", &pod_yaml("good", "i"));
    // 512 MiB of holes: no disk used, and reading it would show in RSS.
    let huge = std::fs::File::create(tmp.path().join("huge.yaml")).unwrap();
    huge.set_len(512 << 20).unwrap();
    // Just over the bound, and just at it.
    let over = std::fs::File::create(tmp.path().join("over.yaml")).unwrap();
    over.set_len(MAX_MANIFEST_BYTES + 1).unwrap();
    let before = peak_rss();
    let started = std::time::Instant::now();
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        peak_rss() < before + (64 << 20),
        "peak RSS grew from {before} to {}",
        peak_rss()
    );
    assert_eq!(by_name(&src, "good").invalid, None);
    for name in ["huge", "over"] {
        let p = by_name(&src, name);
        let why = p.invalid.unwrap();
        assert!(
            why.contains("is larger than 10485760 bytes; not read"),
            "{why}"
        );
    }
    let at = tmp.path().join("at.yaml");
    std::fs::write(&at, vec![b' '; MAX_MANIFEST_BYTES as usize]).unwrap();
    assert!(read_at_most(&at, MAX_MANIFEST_BYTES).unwrap().is_some());
    assert!(read_at_most(&at, MAX_MANIFEST_BYTES - 1).unwrap().is_none());
}

#[test]
fn duplicates_should_invalidate_the_later_file() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &pod_yaml("x", "first"));
    write(tmp.path(), "b.yaml", &pod_yaml("x", "second"));
    // A broken file named like the pod yields to the real one.
    write(tmp.path(), "0-x.yaml", "{");
    std::fs::rename(tmp.path().join("0-x.yaml"), tmp.path().join("x.yaml")).unwrap();
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    let all = src.all();
    assert_eq!(all.len(), 3);
    let first = src.get(&uid::derive(NODE, "default", "x")).unwrap();
    assert_eq!(first.source, PodOrigin::File(tmp.path().join("a.yaml")));
    assert_eq!(first.invalid, None);
    let dup = all
        .iter()
        .find(|p| matches!(&p.source, PodOrigin::File(f) if f.ends_with("b.yaml")))
        .unwrap();
    assert_eq!(
        dup.invalid.as_deref(),
        Some(
            format!(
                "duplicate pod default/x, also defined in {}",
                tmp.path().join("a.yaml").display()
            )
            .as_str()
        )
    );
    assert_ne!(dup.uid, first.uid);
    assert_eq!(src.owner("default", "x"), Some(first.uid.clone()));
    assert_eq!(src.owner("default", "nope"), None);
    let broken = all
        .iter()
        .find(|p| matches!(&p.source, PodOrigin::File(f) if f.ends_with("x.yaml")))
        .unwrap();
    let reason = broken.invalid.as_deref().unwrap();
    assert!(
        reason.starts_with("invalid YAML") && reason.contains("duplicate pod default/x"),
        "{reason}"
    );

    // Same name in another namespace is no duplicate.
    write(
        tmp.path(),
        "b.yaml",
        &pod_yaml("x", "second").replace("name: x", "name: x\n  namespace: other"),
    );
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    assert!(src
        .all()
        .iter()
        .filter(|p| p.name == "x" && p.namespace != "default")
        .all(|p| p.invalid.is_none()));
}

#[test]
fn diff_should_report_only_real_changes() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &pod_yaml("a", "i"));
    write(tmp.path(), "b.yaml", &pod_yaml("b", "i"));
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    assert!(src.refresh(None).is_empty());
    write(tmp.path(), "a.yaml", &pod_yaml("a", "i"));
    std::fs::rename(tmp.path().join("b.yaml"), tmp.path().join("c.yaml")).unwrap();
    assert!(
        src.refresh(None).is_empty(),
        "rewrite and rename are no change"
    );
    write(tmp.path(), "a.yaml", &pod_yaml("a", "j"));
    write(tmp.path(), "d.yaml", &pod_yaml("d", "i"));
    std::fs::remove_file(tmp.path().join("c.yaml")).unwrap();
    let mut got: Vec<_> = src
        .refresh(None)
        .into_iter()
        .map(|c| (c.pod.name, c.kind))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("a".to_string(), ChangeKind::Updated),
            ("b".to_string(), ChangeKind::Removed),
            ("d".to_string(), ChangeKind::Added)
        ]
    );
    // Becoming invalid is an update, with the reason.
    write(
        tmp.path(),
        "a.yaml",
        &pod_yaml("a", "j").replace("image: j", "image: ''"),
    );
    let c = src.refresh(Some(&["a.yaml".into()]));
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].kind, ChangeKind::Updated);
    assert!(c[0].pod.invalid.is_some());
}

/// The workers tell an unchanged pod by the identity of its `Arc`: a
/// re-read that changes nothing (the watcher's scan, an edit of another
/// file, a rewrite with the same content) must hand out the same one.
#[test]
fn refresh_should_keep_the_same_pod_object_for_an_unchanged_pod() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", &pod_yaml("a", "i"));
    write(tmp.path(), "b.yaml", &pod_yaml("b", "i"));
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    let (a0, b0) = (by_name(&src, "a"), by_name(&src, "b"));
    assert!(src.refresh(None).is_empty());
    write(tmp.path(), "a.yaml", &pod_yaml("a", "i"));
    write(tmp.path(), "b.yaml", &pod_yaml("b", "j"));
    assert_eq!(src.refresh(None).len(), 1);
    let (a1, b1) = (by_name(&src, "a"), by_name(&src, "b"));
    assert!(Arc::ptr_eq(&a0.pod, &a1.pod), "a is unchanged");
    assert!(!Arc::ptr_eq(&b0.pod, &b1.pod), "b changed");
    assert!(src.refresh(Some(&["a.yaml".into()])).is_empty());
    assert!(Arc::ptr_eq(&a0.pod, &by_name(&src, "a").pod));
    assert!(Arc::ptr_eq(&b1.pod, &by_name(&src, "b").pod));
}

/// Receives changes until `want` arrived (as (name, kind), any order) or
/// the bound passes; then checks nothing else arrives shortly after.
async fn expect(
    rx: &mut mpsc::UnboundedReceiver<SourceChange>,
    want: &[(&str, ChangeKind)],
) -> Vec<SourceChange> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while got.len() < want.len() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(c)) => got.push(c),
            _ => break,
        }
    }
    // Nothing spurious (an editor's rename-away must not be a removal).
    if let Ok(Some(c)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        got.push(c);
    }
    let mut a: Vec<(String, ChangeKind)> = got
        .iter()
        .map(|c| (c.pod.name.clone(), c.kind.clone()))
        .collect();
    let mut b: Vec<(String, ChangeKind)> = want
        .iter()
        .map(|(n, k)| (n.to_string(), k.clone()))
        .collect();
    a.sort_by(|x, y| x.0.cmp(&y.0));
    b.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(a, b);
    got
}

#[tokio::test]
async fn watch_should_follow_adds_edits_renames_and_deletes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "a.yaml", &pod_yaml("a", "i"));
    let src = PodSource::load(&dir, NODE).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(
        src.watch(move |c| {
            let _ = tx.send(c);
        })
        .unwrap(),
    );

    // New file.
    write(&dir, "b.yaml", &pod_yaml("b", "i"));
    let c = expect(&mut rx, &[("b", ChangeKind::Added)]).await;
    assert_eq!(c[0].uid, uid::derive(NODE, "default", "b"));
    assert!(src.get(&c[0].uid).is_some());

    // Touch and identical rewrite: nothing.
    write(&dir, "a.yaml", &pod_yaml("a", "i"));
    expect(&mut rx, &[]).await;

    // In-place edit.
    write(&dir, "a.yaml", &pod_yaml("a", "i2"));
    let c = expect(&mut rx, &[("a", ChangeKind::Updated)]).await;
    assert_eq!(c[0].uid, uid::derive(NODE, "default", "a"));

    // Editor style: swap file, move the original away, write a new one,
    // rename into place, delete the backup.
    write(&dir, ".a.yaml.swp", "x");
    std::fs::rename(dir.join("a.yaml"), dir.join("a.yaml~")).unwrap();
    write(&dir, ".a.yaml.tmp", &pod_yaml("a", "i3"));
    std::fs::rename(dir.join(".a.yaml.tmp"), dir.join("a.yaml")).unwrap();
    std::fs::remove_file(dir.join("a.yaml~")).unwrap();
    std::fs::remove_file(dir.join(".a.yaml.swp")).unwrap();
    let c = expect(&mut rx, &[("a", ChangeKind::Updated)]).await;
    let image = c[0].pod.pod.spec.as_ref().unwrap().containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("i3"));

    // Broken edit: shown invalid; fixed: valid again.
    write(
        &dir,
        "b.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: b}\nspec: {containers: [{name: app}]}\n",
    );
    let c = expect(&mut rx, &[("b", ChangeKind::Updated)]).await;
    assert!(c[0].pod.invalid.is_some());
    write(&dir, "b.yaml", &pod_yaml("b", "i"));
    let c = expect(&mut rx, &[("b", ChangeKind::Updated)]).await;
    assert!(c[0].pod.invalid.is_none());

    // Delete.
    std::fs::remove_file(dir.join("b.yaml")).unwrap();
    let c = expect(&mut rx, &[("b", ChangeKind::Removed)]).await;
    assert!(src.get(&c[0].uid).is_none());

    // Moved in from elsewhere.
    write(tmp.path(), "c.yaml", &pod_yaml("c", "i"));
    std::fs::rename(tmp.path().join("c.yaml"), dir.join("c.yaml")).unwrap();
    expect(&mut rx, &[("c", ChangeKind::Added)]).await;

    // Moved out.
    std::fs::rename(dir.join("c.yaml"), tmp.path().join("c.yaml")).unwrap();
    expect(&mut rx, &[("c", ChangeKind::Removed)]).await;

    task.abort();
}

#[tokio::test]
async fn watch_should_survive_the_directory_being_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "a.yaml", &pod_yaml("a", "i"));
    write(&dir, "b.yaml", &pod_yaml("b", "i"));
    let src = PodSource::load(&dir, NODE).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(
        src.watch(move |c| {
            let _ = tx.send(c);
        })
        .unwrap(),
    );

    // A new directory renamed over the old one's place.
    let new = tmp.path().join("manifests.new");
    std::fs::create_dir(&new).unwrap();
    write(&new, "a.yaml", &pod_yaml("a", "i"));
    write(&new, "c.yaml", &pod_yaml("c", "i"));
    std::fs::rename(&dir, tmp.path().join("manifests.old")).unwrap();
    std::fs::rename(&new, &dir).unwrap();
    expect(
        &mut rx,
        &[("b", ChangeKind::Removed), ("c", ChangeKind::Added)],
    )
    .await;

    // The new directory is watched.
    write(&dir, "d.yaml", &pod_yaml("d", "i"));
    expect(&mut rx, &[("d", ChangeKind::Added)]).await;
    // The old one no longer is.
    write(
        &tmp.path().join("manifests.old"),
        "e.yaml",
        &pod_yaml("e", "i"),
    );
    expect(&mut rx, &[]).await;

    // Deleted, then created again later.
    std::fs::remove_dir_all(&dir).unwrap();
    expect(
        &mut rx,
        &[
            ("a", ChangeKind::Removed),
            ("c", ChangeKind::Removed),
            ("d", ChangeKind::Removed),
        ],
    )
    .await;
    std::fs::create_dir(&dir).unwrap();
    write(&dir, "f.yaml", &pod_yaml("f", "i"));
    expect(&mut rx, &[("f", ChangeKind::Added)]).await;
    task.abort();
}

#[tokio::test]
async fn watch_should_let_go_of_its_callback_when_aborted() {
    let tmp = tempfile::tempdir().unwrap();
    let src = PodSource::load(tmp.path(), NODE).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(
        src.watch(move |c| {
            let _ = tx.send(c);
        })
        .unwrap(),
    );
    task.abort();
    // The callback (and the sender in it) is dropped with the watch.
    let end = tokio::time::timeout(Duration::from_secs(2), rx.recv()).await;
    assert!(matches!(end, Ok(None)), "{end:?}");
}
