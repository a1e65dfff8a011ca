//! `petrel agent` and `petrel node` refusing bad eviction settings at
//! start-up, naming the flag (or config key) and the value, before they
//! touch anything.
#![allow(clippy::expect_used)]

use std::process::{Command, Output};

fn petrel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_petrel"))
        .args(args)
        .env_remove("PETREL_CONFIG")
        .output()
        .expect("run petrel")
}

fn refused(args: &[&str]) -> String {
    let out = petrel(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    err
}

#[test]
fn agent_should_refuse_bad_eviction_flags_naming_flag_and_value() {
    for (args, needles) in [
        (
            vec!["--eviction-hard", "memory.available<lots"],
            vec!["--eviction-hard", "memory.available<lots", "lots"],
        ),
        (
            vec!["--eviction-hard", "memory.free<1Gi"],
            vec!["--eviction-hard", "memory.free"],
        ),
        (
            vec!["--eviction-hard", "nodefs.available<150%"],
            vec!["--eviction-hard", "150%"],
        ),
        (
            vec!["--eviction-soft-grace-period", "memory.available=soon"],
            vec!["--eviction-soft-grace-period", "soon"],
        ),
        (
            vec!["--eviction-minimum-reclaim", "memory.available=-1Mi"],
            vec!["--eviction-minimum-reclaim", "-1Mi"],
        ),
        (
            vec!["--eviction-pressure-transition-period", "5 minutes"],
            vec!["--eviction-pressure-transition-period", "5 minutes"],
        ),
        (
            vec!["--kube-reserved", "gpu=1"],
            vec!["--kube-reserved", "gpu"],
        ),
        (
            vec!["--eviction-soft", "memory.available<1Gi"],
            vec![
                "--eviction-soft",
                "memory.available",
                "--eviction-soft-grace-period",
            ],
        ),
        (
            vec!["--node-cgroup", "petrel/../x"],
            vec!["--node-cgroup", "petrel/../x"],
        ),
    ] {
        for cmd in ["agent", "node"] {
            let mut full = vec![cmd];
            full.extend(&args);
            let err = refused(&full);
            for n in &needles {
                assert!(err.contains(n), "{full:?}: {n:?} not in {err}");
            }
        }
    }
}

#[test]
fn agent_should_refuse_bad_eviction_settings_in_the_config_file() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("config.toml");
    std::fs::write(
        &file,
        "[agent.eviction]\nhard = { \"memory.available\" = \"-5Mi\" }\n",
    )
    .expect("write config");
    let path = file.to_str().expect("utf-8 path");
    let err = refused(&["agent", "--config", path]);
    assert!(err.contains("hard") && err.contains("-5Mi"), "{err}");
}
