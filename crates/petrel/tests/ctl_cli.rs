//! `petrel ctl` as a user runs it, for the paths that need no runtime:
//! messages and exit codes of connection, input and usage errors.
#![allow(clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs `petrel ctl <args>` against `endpoint`.
fn ctl(endpoint: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_petrel"))
        .arg("ctl")
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .env_remove("PETREL_ENDPOINT")
        .output()
        .expect("run petrel ctl")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn ctl_should_name_the_unreachable_socket_and_exit_1() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let sock = dir.path().join("none.sock");
    let out = ctl(&sock, &["pods"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("petrel ctl: cannot reach the runtime at "),
        "{err}"
    );
    assert!(err.contains(&sock.display().to_string()), "{err}");
    assert!(err.contains("--endpoint"), "{err}");
}

#[test]
fn ctl_run_should_reject_unknown_keys_before_connecting() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("pod.yaml");
    std::fs::write(&file, "pod: {name: demo, lables: {a: b}}\n").expect("write run file");
    let out = ctl(
        &dir.path().join("none.sock"),
        &["run", &file.display().to_string()],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("unknown field `lables`"), "{err}");
    assert!(!err.contains("cannot reach"), "{err}");
}

#[test]
fn ctl_streaming_commands_should_name_bad_ports_and_an_unreachable_runtime() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let sock = dir.path().join("none.sock");
    // A bad port pair is a usage error, before any connection.
    let out = ctl(&sock, &["port-forward", "abc", "80:0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("\"80:0\""), "{}", stderr(&out));
    // exec -it and attach go to the runtime first: it is not there.
    for args in [
        &["exec", "-it", "abc", "sh"][..],
        &["attach", "-i", "abc"][..],
    ] {
        let out = ctl(&sock, args);
        let err = stderr(&out);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.contains("cannot reach the runtime"), "{args:?}: {err}");
    }
}

#[test]
fn ctl_should_exit_2_on_usage_errors() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let sock = dir.path().join("none.sock");
    assert_eq!(ctl(&sock, &["pods", "-o", "xml"]).status.code(), Some(2));
    assert_eq!(
        ctl(&sock, &["pods", "--label", "novalue"]).status.code(),
        Some(2)
    );
    let relative = Path::new("relative.sock");
    assert_eq!(ctl(relative, &["version"]).status.code(), Some(2));
}
