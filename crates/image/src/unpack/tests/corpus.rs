//! Replays the hostile-layer corpus in `tests/corpus/*.case`: small tables
//! of entries (shrunk fuzz findings and known attacks on other unpackers),
//! each checked against the invariants and its expected outcome.
//!
//! Format, one entry per line, `#` comments, names without spaces:
//! ```text
//! expect refused <entry name> | expect ok | expect error
//! dir <name>          file <name>          fifo <name>
//! sym <name> <target> hard <name> <target>
//! ```
//! `$OUT`, `$ROOT` and `$LONG` expand as in `Sandbox::expand`.

use std::path::{Path, PathBuf};

use super::{Sandbox, E};
use crate::ImageError;

#[derive(Debug, PartialEq)]
enum Expect {
    Ok,
    Error,
    Refused(String),
}

fn parse(text: &str, file: &Path) -> (Expect, Vec<E>) {
    let mut expect = None;
    let mut entries = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        let bad = || panic!("{}:{}: cannot parse {line:?}", file.display(), no + 1);
        let e = match w.as_slice() {
            ["expect", "ok"] => {
                expect = Some(Expect::Ok);
                continue;
            }
            ["expect", "error"] => {
                expect = Some(Expect::Error);
                continue;
            }
            ["expect", "refused", name] => {
                expect = Some(Expect::Refused(name.to_string()));
                continue;
            }
            ["dir", n] => E::Dir(n.to_string()),
            ["file", n] => E::File(n.to_string()),
            ["fifo", n] => E::Fifo(n.to_string()),
            ["sym", n, t] => E::Sym(n.to_string(), t.to_string()),
            ["hard", n, t] => E::Hard(n.to_string(), t.to_string()),
            _ => bad(),
        };
        entries.push(e);
    }
    let Some(expect) = expect else {
        panic!("{}: no `expect` line", file.display())
    };
    (expect, entries)
}

fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read tests/corpus")
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "case"))
        .collect();
    out.sort();
    out
}

#[test]
fn corpus_cases_should_keep_their_outcome_and_the_invariants() {
    let cases = cases();
    assert!(cases.len() >= 10, "corpus missing: {cases:?}");
    for file in cases {
        let text = std::fs::read_to_string(&file).expect("read case");
        let (expect, entries) = parse(&text, &file);
        let sb = Sandbox::new();
        let res = sb.run_and_check(&entries);
        let ok = match (&expect, &res) {
            (Expect::Ok, Ok(_)) | (Expect::Error, Err(_)) => true,
            (Expect::Refused(name), Err(ImageError::UnsafeEntry { path, .. })) => {
                *path == sb.expand(name)
            }
            _ => false,
        };
        assert!(ok, "{}: expected {expect:?}, got {res:?}", file.display());
    }
}
