//! The expected list a runtime's critest results are held against: one
//! line per spec, `PASS|FAIL|SKIP|FLAKY <full spec text>`; `#` starts a
//! comment line (a FLAKY spec's reason goes in the comment above it).
//!
//! Rules of [`compare`]: a spec expected to PASS that fails, skips or did
//! not run is a regression (the check fails); a spec that passes but was
//! not expected to is reported as newly passing (update the list); other
//! changes, specs the list does not know and listed specs that did not run
//! are reported. FLAKY specs may end any way.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use crate::critest::{Outcome, SpecResult};
use crate::KitError;

/// What the list says of a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// Must pass.
    Pass,
    /// Fails today.
    Fail,
    /// Skipped today.
    Skip,
    /// Passes or fails from run to run (the reason is in a comment).
    Flaky,
}

impl Expectation {
    fn parse(word: &str) -> Option<Expectation> {
        match word {
            "PASS" => Some(Expectation::Pass),
            "FAIL" => Some(Expectation::Fail),
            "SKIP" => Some(Expectation::Skip),
            "FLAKY" => Some(Expectation::Flaky),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Expectation::Pass => "PASS",
            Expectation::Fail => "FAIL",
            Expectation::Skip => "SKIP",
            Expectation::Flaky => "FLAKY",
        }
    }
}

/// An expected list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expected {
    /// Spec text → expectation.
    pub specs: BTreeMap<String, Expectation>,
}

impl Expected {
    /// Reads the list at `path`.
    pub fn load(path: &Path) -> Result<Expected, KitError> {
        let text = std::fs::read_to_string(path).map_err(|e| KitError::io("read", path, e))?;
        Self::parse(&text).map_err(|(line, detail)| KitError::Expected {
            path: path.to_path_buf(),
            line,
            detail,
        })
    }

    /// Parses a list; errors carry the 1-based line number.
    pub fn parse(text: &str) -> Result<Expected, (usize, String)> {
        let mut specs = BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim_end();
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            let (word, spec) = line
                .split_once(' ')
                .ok_or_else(|| (i + 1, format!("expected `STATE spec text`, got {line:?}")))?;
            let state = Expectation::parse(word).ok_or_else(|| {
                (
                    i + 1,
                    format!("unknown state {word:?} (PASS, FAIL, SKIP or FLAKY)"),
                )
            })?;
            let spec = spec.trim();
            if spec.is_empty() {
                return Err((i + 1, "no spec text".into()));
            }
            if specs.insert(spec.to_string(), state).is_some() {
                return Err((i + 1, format!("spec listed twice: {spec}")));
            }
        }
        Ok(Expected { specs })
    }
}

/// A run held against a list.
#[derive(Debug, Default, PartialEq)]
pub struct Comparison {
    /// Expected PASS, did not pass: (spec, outcome or None if not run,
    /// message).
    pub regressions: Vec<(String, Option<Outcome>, String)>,
    /// Passed, expected FAIL or SKIP (or FLAKY: not reported).
    pub newly_passing: Vec<String>,
    /// Expected FAIL, skipped; or expected SKIP, failed.
    pub changed: Vec<(String, Expectation, Outcome)>,
    /// In the run, not in the list.
    pub unknown: Vec<(String, Outcome)>,
    /// In the list (not PASS), not in the run.
    pub not_run: Vec<String>,
}

impl Comparison {
    /// No regression.
    pub fn ok(&self) -> bool {
        self.regressions.is_empty()
    }

    /// A report for people: regressions with their messages first.
    pub fn render(&self, list: &Path) -> String {
        let mut s = String::new();
        if !self.regressions.is_empty() {
            let _ = writeln!(
                s,
                "REGRESSIONS: {} spec(s) expected to PASS did not:",
                self.regressions.len()
            );
            for (spec, got, msg) in &self.regressions {
                let got = got.map(Outcome::as_str).unwrap_or("NOT RUN");
                let _ = writeln!(s, "  {got} {spec}");
                for l in msg.lines().take(12) {
                    let _ = writeln!(s, "      {l}");
                }
            }
        }
        if !self.newly_passing.is_empty() {
            let _ = writeln!(
                s,
                "NEWLY PASSING: {} spec(s) pass that {} does not expect to (mark them PASS there):",
                self.newly_passing.len(),
                list.display()
            );
            for spec in &self.newly_passing {
                let _ = writeln!(s, "  PASS {spec}");
            }
        }
        if !self.changed.is_empty() {
            let _ = writeln!(s, "CHANGED (not a failure):");
            for (spec, was, now) in &self.changed {
                let _ = writeln!(s, "  {} -> {} {spec}", was.as_str(), now.as_str());
            }
        }
        if !self.unknown.is_empty() {
            let _ = writeln!(
                s,
                "UNKNOWN: {} spec(s) not in the list:",
                self.unknown.len()
            );
            for (spec, got) in &self.unknown {
                let _ = writeln!(s, "  {} {spec}", got.as_str());
            }
        }
        if !self.not_run.is_empty() {
            let _ = writeln!(
                s,
                "NOT RUN: {} listed spec(s) did not run:",
                self.not_run.len()
            );
            for spec in &self.not_run {
                let _ = writeln!(s, "  {spec}");
            }
        }
        s
    }
}

/// Holds `results` against `expected` (rules in the module doc).
pub fn compare(expected: &Expected, results: &[SpecResult]) -> Comparison {
    let mut c = Comparison::default();
    let mut seen = BTreeSet::new();
    for r in results {
        seen.insert(r.text.as_str());
        match (expected.specs.get(&r.text), r.outcome) {
            (None, o) => c.unknown.push((r.text.clone(), o)),
            (Some(Expectation::Flaky), _) => {}
            (Some(Expectation::Pass), Outcome::Pass) => {}
            (Some(Expectation::Pass), o) => {
                let msg = if r.location.is_empty() {
                    r.message.clone()
                } else {
                    format!("{}\n(at {})", r.message, r.location)
                };
                c.regressions.push((r.text.clone(), Some(o), msg));
            }
            (Some(_), Outcome::Pass) => c.newly_passing.push(r.text.clone()),
            (Some(Expectation::Fail), Outcome::Fail) | (Some(Expectation::Skip), Outcome::Skip) => {
            }
            (Some(&e), o) => c.changed.push((r.text.clone(), e, o)),
        }
    }
    for (spec, e) in &expected.specs {
        if seen.contains(spec.as_str()) {
            continue;
        }
        match e {
            Expectation::Pass => c.regressions.push((spec.clone(), None, String::new())),
            _ => c.not_run.push(spec.clone()),
        }
    }
    c
}

/// A list written from a run: each spec with its outcome, except those the
/// `previous` list calls FLAKY (kept FLAKY, with a comment to keep their
/// reason). Sorted by spec text.
pub fn render_list(results: &[SpecResult], previous: &Expected, header: &str) -> String {
    let mut rows: Vec<(String, &str)> = results
        .iter()
        .map(|r| {
            let word = match previous.specs.get(&r.text) {
                Some(Expectation::Flaky) => "FLAKY",
                _ => r.outcome.as_str(),
            };
            (r.text.clone(), word)
        })
        .collect();
    rows.sort();
    rows.dedup();
    let mut s = String::new();
    for l in header.lines() {
        let _ = writeln!(s, "# {l}");
    }
    for (spec, word) in rows {
        let _ = writeln!(s, "{word} {spec}");
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn res(text: &str, outcome: Outcome) -> SpecResult {
        SpecResult {
            text: text.into(),
            outcome,
            message: if outcome == Outcome::Pass {
                String::new()
            } else {
                format!("why {text}")
            },
            location: String::new(),
            seconds: 0.0,
        }
    }

    const LIST: &str = "# a comment\n\
        PASS a passes\n\
        PASS b passes\n\
        FAIL c fails\n\
        SKIP d skips\n\
        # e: a port race\n\
        FLAKY e flaky\n\
        PASS f listed [Conformance]\n\
        FAIL g gone\n";

    #[test]
    fn parse_should_read_states_and_refuse_bad_lines() {
        let e = Expected::parse(LIST).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(e.specs.len(), 7);
        assert_eq!(e.specs["f listed [Conformance]"], Expectation::Pass);
        assert_eq!(e.specs["e flaky"], Expectation::Flaky);
        assert_eq!(Expected::parse("MAYBE x").err().map(|e| e.0), Some(1));
        assert_eq!(Expected::parse("\nPASS\n").err().map(|e| e.0), Some(2));
        assert_eq!(
            Expected::parse("PASS x\nFAIL x\n").err().map(|e| e.0),
            Some(2)
        );
    }

    #[test]
    fn compare_should_fail_on_a_pass_lost_and_report_the_rest() {
        let e = Expected::parse(LIST).unwrap_or_else(|e| panic!("{e:?}"));
        let run = vec![
            res("a passes", Outcome::Pass),
            res("b passes", Outcome::Fail),
            res("c fails", Outcome::Pass),
            res("d skips", Outcome::Fail),
            res("e flaky", Outcome::Fail),
            res("h new", Outcome::Skip),
        ];
        let c = compare(&e, &run);
        assert!(!c.ok());
        assert_eq!(
            c.regressions,
            vec![
                (
                    "b passes".into(),
                    Some(Outcome::Fail),
                    "why b passes".into()
                ),
                ("f listed [Conformance]".into(), None, String::new()),
            ]
        );
        assert_eq!(c.newly_passing, vec!["c fails".to_string()]);
        assert_eq!(
            c.changed,
            vec![("d skips".into(), Expectation::Skip, Outcome::Fail)]
        );
        assert_eq!(c.unknown, vec![("h new".into(), Outcome::Skip)]);
        assert_eq!(c.not_run, vec!["g gone".to_string()]);
        let text = c.render(Path::new("petrel.expected"));
        assert!(text.contains("REGRESSIONS: 2"), "{text}");
        assert!(text.contains("why b passes"), "{text}");
        assert!(text.contains("NOT RUN f listed"), "{text}");
        assert!(text.contains("mark them PASS there"), "{text}");
    }

    #[test]
    fn compare_should_pass_when_every_pass_still_passes() {
        let e = Expected::parse("PASS a\nFAIL b\nFLAKY c\n").unwrap_or_else(|e| panic!("{e:?}"));
        let c = compare(
            &e,
            &[
                res("a", Outcome::Pass),
                res("b", Outcome::Fail),
                res("c", Outcome::Pass),
            ],
        );
        assert!(c.ok());
        assert_eq!(c, Comparison::default());
    }

    #[test]
    fn render_list_should_round_trip_and_keep_flaky_marks() {
        let prev = Expected::parse("FLAKY b\n").unwrap_or_else(|e| panic!("{e:?}"));
        let text = render_list(
            &[res("b", Outcome::Pass), res("a", Outcome::Fail)],
            &prev,
            "header",
        );
        assert_eq!(text, "# header\nFAIL a\nFLAKY b\n");
        let back = Expected::parse(&text).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(back.specs["a"], Expectation::Fail);
    }
}
