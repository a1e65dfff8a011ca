//! critest's counts for the kubelet section: the table of the last
//! `make conformance`, or a run of both runtimes in the bench.

use std::path::Path;

use anyhow::{Context, Result};

use crate::kubelet::Critest;
use crate::Args;

/// critest's counts: a run here with `--kubelet-critest`, else the table of
/// the last `make conformance` (`<build>/conformance/summary.md`).
pub fn critest(args: &Args, progress: &dyn Fn(&str)) -> Critest {
    let out = args.build_dir.join("conformance");
    if args.kubelet_critest {
        progress("critest against Petrel's runtime and containerd 2.x (about 30 minutes)");
        return match run_critest(args, &out) {
            Ok(table) => Critest {
                source: "this run (`--kubelet-critest`)".to_string(),
                table: Some(table),
                missing: None,
            },
            Err(e) => Critest {
                source: "this run (`--kubelet-critest`)".to_string(),
                table: None,
                missing: Some(format!("{e:#}")),
            },
        };
    }
    let summary = out.join("summary.md");
    match std::fs::read_to_string(&summary) {
        Ok(text) => Critest {
            source: format!(
                "`{}` of {}, written by `make conformance`",
                summary.display(),
                modified(&summary)
            ),
            table: Some(count_table(&text)),
            missing: None,
        },
        Err(e) => Critest {
            source: summary.display().to_string(),
            table: None,
            missing: Some(format!(
                "no critest counts: {} ({e}); `make conformance` writes it, or run the bench with --kubelet-critest",
                summary.display()
            )),
        },
    }
}

pub fn run_critest(args: &Args, out: &Path) -> Result<String> {
    use petrel_testkit::conformance::{self, summary_markdown, Target};
    let petrel = std::path::absolute(&args.petrel)
        .with_context(|| format!("resolve {}", args.petrel.display()))?;
    let runs = vec![
        conformance::run(&Target::petrel(petrel), out)?,
        conformance::run(
            &Target::Containerd {
                binary: petrel_testkit::containerd::binaries()?,
            },
            out,
        )?,
    ];
    let text = summary_markdown(&runs);
    let summary = out.join("summary.md");
    std::fs::write(&summary, &text).with_context(|| format!("write {}", summary.display()))?;
    Ok(count_table(&text))
}

/// The count table at the head of a conformance summary (up to its first
/// blank line).
pub fn count_table(summary: &str) -> String {
    summary
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A file's modification time, UTC, as `date` prints it.
pub fn modified(path: &Path) -> String {
    std::process::Command::new("date")
        .args(["-u", "-r"])
        .arg(path)
        .arg("+%Y-%m-%d %H:%M:%S UTC")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "an unknown date".to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    #[test]
    fn count_table_should_stop_at_the_first_blank_line() {
        let s = "| a | b |\n|---|---|\n| passed | 1 |\n\nSpecs on which they differ:\n";
        assert_eq!(count_table(s), "| a | b |\n|---|---|\n| passed | 1 |\n");
    }
}
