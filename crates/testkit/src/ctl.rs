//! `petrel ctl` (the crictl-like CLI) run against a runtime under test.

#![allow(clippy::expect_used)]

use crate::bins::petrel_bin;
use crate::node::Node;

/// Runs `petrel ctl ARGS` against the node's socket.
pub fn ctl(node: &Node, args: &[&str]) -> std::process::Output {
    std::process::Command::new(petrel_bin())
        .arg("ctl")
        .arg("--endpoint")
        .arg(format!("unix://{}", node.socket.display()))
        .args(args)
        .output()
        .expect("run petrel ctl")
}

/// Runs `petrel ctl ARGS`, asserts success and returns its stdout.
pub fn ok(node: &Node, args: &[&str]) -> String {
    let o = ctl(node, args);
    assert!(
        o.status.success(),
        "petrel ctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}
