use std::io::Write;
use std::time::Duration;

use super::*;
use crate::server::test_support::{chunk, get, head, send, start, Instance, TestServer};

fn q(s: &str) -> Result<LogRequest, ApiError> {
    LogRequest::parse(&QueryParams::parse(Some(s)), 100_000_000_000)
}

#[test]
fn parameters_should_be_read_like_kubelet_and_bad_ones_named() {
    let r = q("follow=true&tailLines=3&timestamps=1&limitBytes=10&sinceSeconds=5").unwrap();
    assert!(r.follow && !r.previous);
    assert_eq!(r.selection.tail_lines, Some(3));
    assert_eq!(r.selection.limit_bytes, Some(10));
    assert!(r.selection.timestamps);
    assert_eq!(r.selection.since, Some(95_000_000_000));
    let r = q("sinceTime=2024-01-01T00:00:00Z&previous=true").unwrap();
    assert!(r.previous);
    assert_eq!(r.selection.since, parse_rfc3339("2024-01-01T00:00:00Z"));
    for (bad, named) in [
        (
            "sinceSeconds=1&sinceTime=2024-01-01T00:00:00Z",
            "sinceSeconds",
        ),
        ("sinceSeconds=0", "sinceSeconds"),
        ("sinceTime=yesterday", "sinceTime"),
        ("tailLines=-1", "tailLines"),
        ("tailLines=x", "tailLines"),
        ("limitBytes=0", "limitBytes"),
        ("follow=yes", "follow"),
        ("timestamps=2", "timestamps"),
    ] {
        let e = q(bad).unwrap_err();
        assert!(matches!(e, ApiError::BadRequest(_)), "{bad}: {e}");
        assert!(e.to_string().contains(named), "{bad}: {e}");
    }
}

const LOG: &str = "2024-01-01T00:00:01.5Z stdout F one\n\
2024-01-01T00:00:02Z stderr F two\n\
2024-01-01T00:00:03Z stdout P thr\n\
2024-01-01T00:00:04Z stdout F ee\n";

fn instance(id: &str, restarts: i32, running: bool, path: &std::path::Path) -> Instance {
    Instance {
        id: id.into(),
        name: "app".into(),
        restart_count: restarts,
        running,
        log_path: path.display().to_string(),
    }
}

async fn with_logs(dir: &std::path::Path) -> TestServer {
    let s = start().await;
    let cur = dir.join("app/1.log");
    let old = dir.join("app/0.log");
    std::fs::create_dir_all(dir.join("app")).unwrap();
    std::fs::write(&cur, LOG).unwrap();
    std::fs::write(&old, "2023-12-31T23:59:59Z stdout F before restart\n").unwrap();
    s.put_pod(
        "u1",
        &["app", "idle"],
        Some("sb1"),
        &[
            instance("c1", 1, false, &cur),
            instance("c0", 0, false, &old),
        ],
    );
    s
}

#[tokio::test]
async fn logs_should_be_plain_text_selected_by_the_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let s = with_logs(dir.path()).await;
    let base = "/containerLogs/ns/p/app";
    assert_eq!(get(&s.addr, base).await, (200, "one\ntwo\nthree\n".into()));
    assert_eq!(
        get(&s.addr, &format!("{base}?tailLines=2")).await,
        (200, "two\nthree\n".into())
    );
    assert_eq!(
        get(&s.addr, &format!("{base}?timestamps=true&tailLines=1")).await,
        (200, "2024-01-01T00:00:03Z three\n".into())
    );
    assert_eq!(
        get(&s.addr, &format!("{base}?sinceTime=2024-01-01T00:00:02Z")).await,
        (200, "two\nthree\n".into())
    );
    assert_eq!(
        get(&s.addr, &format!("{base}?limitBytes=6")).await,
        (200, "one\ntw".into())
    );
    assert_eq!(
        get(&s.addr, &format!("{base}?previous=true")).await,
        (200, "before restart\n".into())
    );
    // Following an exited container returns what there is and ends.
    assert_eq!(
        get(&s.addr, &format!("{base}?follow=true&tailLines=1")).await,
        (200, "three\n".into())
    );
}

#[tokio::test]
async fn unknown_names_should_be_404_and_bad_requests_400() {
    let dir = tempfile::tempdir().unwrap();
    let s = with_logs(dir.path()).await;
    let (code, body) = get(&s.addr, "/containerLogs/ns/nope/app").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("ns/nope"), "{body}");
    let (code, body) = get(&s.addr, "/containerLogs/ns/p/ghost").await;
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("ghost"), "{body}");
    // Declared but never created.
    let (code, body) = get(&s.addr, "/containerLogs/ns/p/idle").await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = get(&s.addr, "/containerLogs/ns/p/app?tailLines=-2").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("tailLines"), "{body}");
    // No previous instance.
    s.put_pod(
        "u1",
        &["app"],
        None,
        &[instance("c1", 0, false, &dir.path().join("app/1.log"))],
    );
    let (code, body) = get(&s.addr, "/containerLogs/ns/p/app?previous=1").await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("previous"), "{body}");
}

async fn next_text(r: &mut crate::server::test_support::Conn) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(5), chunk(r))
        .await
        .expect("a chunk within 5s")
        .map(|c| String::from_utf8(c).unwrap())
}

/// Reads chunks until `want` has been received (chunks may merge lines).
async fn expect_text(r: &mut crate::server::test_support::Conn, want: &str) {
    let mut got = String::new();
    while got.len() < want.len() {
        match next_text(r).await {
            Some(t) => got.push_str(&t),
            None => break,
        }
    }
    assert_eq!(got, want);
}

#[tokio::test]
async fn follow_should_stream_new_lines_across_rotation_until_the_container_exits() {
    use crate::cri::RuntimeActuator;
    let dir = tempfile::tempdir().unwrap();
    let s = start().await;
    let (sb, id) = s.run_container("u2", "app").await;
    let path = dir.path().join("0.log");
    std::fs::write(&path, "2024-01-01T00:00:01Z stdout F first\n").unwrap();
    let mut inst = instance(&id, 0, true, &path);
    inst.name = "app".into();
    s.put_pod("u2", &["app"], Some(&sb), &[inst]);
    let mut r = send(
        &s.addr,
        "GET /containerLogs/ns/p/app?follow=true&timestamps=true HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    let (code, _) = head(&mut r).await;
    assert_eq!(code, 200);
    expect_text(&mut r, "2024-01-01T00:00:01Z first\n").await;

    let append = |text: &str| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    };
    // A line written in two pieces arrives once whole.
    append("2024-01-01T00:00:02Z stdout F sec");
    tokio::time::sleep(Duration::from_millis(100)).await;
    append("ond\n");
    expect_text(&mut r, "2024-01-01T00:00:02Z second\n").await;

    // Rotation: the file is renamed, written once more, and a new one
    // takes its place.
    std::fs::rename(&path, dir.path().join("0.log.1")).unwrap();
    let mut old = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.path().join("0.log.1"))
        .unwrap();
    old.write_all(b"2024-01-01T00:00:03Z stdout F late\n")
        .unwrap();
    std::fs::write(&path, "2024-01-01T00:00:04Z stderr F rotated\n").unwrap();
    expect_text(
        &mut r,
        "2024-01-01T00:00:03Z late\n2024-01-01T00:00:04Z rotated\n",
    )
    .await;

    // The container exits: the stream ends after the last line.
    append("2024-01-01T00:00:05Z stdout F last\n");
    s.rt.stop_container(&id, 0).await.unwrap();
    expect_text(&mut r, "2024-01-01T00:00:05Z last\n").await;
    assert_eq!(next_text(&mut r).await, None, "the stream must end");
}

#[tokio::test]
async fn follow_should_end_when_the_client_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let s = start().await;
    let (sb, id) = s.run_container("u3", "app").await;
    let path = dir.path().join("0.log");
    std::fs::write(&path, "2024-01-01T00:00:01Z stdout F first\n").unwrap();
    s.put_pod("u3", &["app"], Some(&sb), &[instance(&id, 0, true, &path)]);
    let mut r = send(
        &s.addr,
        "GET /containerLogs/ns/p/app?follow=1 HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    head(&mut r).await;
    expect_text(&mut r, "first\n").await;
    drop(r);
    // The follower notices on its next wake-up and stops asking the
    // runtime about the container.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let calls = s.rt.calls("container_status");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(s.rt.calls("container_status"), calls);
}
