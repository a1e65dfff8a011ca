//! The machine and the run, as recorded in the report.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::Args;

/// Facts about the machine and the run.
pub struct Machine {
    /// `uname -r`.
    pub kernel: String,
    /// Online CPUs.
    pub cpus: usize,
    /// CPU model name.
    pub cpu_model: String,
    /// MemTotal.
    pub memory: String,
    /// The load averages when the run began.
    pub load_before: String,
    /// cgroup v1 (hybrid) or v2.
    pub cgroups: String,
    /// File system type of the work directory.
    pub work_fs: String,
    /// `runc --version`, first line.
    pub runc: String,
    /// UTC date and time.
    pub date: String,
    /// `git describe --always --dirty`.
    pub commit: String,
    /// The command that ran the bench.
    pub command: String,
    /// The shim binary and what it is.
    pub shim: String,
}

impl Machine {
    /// Collects the facts (before any load is put on the machine).
    pub fn collect(args: &Args, work: &Path) -> Result<Machine> {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".to_string());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0))
            .unwrap_or_else(|| "unknown".to_string());
        let cgroups = if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            "v2 (unified)".to_string()
        } else if Path::new("/sys/fs/cgroup/unified").is_dir() {
            "v1 (hybrid, cgroupfs driver)".to_string()
        } else {
            "v1 (cgroupfs driver)".to_string()
        };
        let work_fs = output("stat", &["-f", "-c", "%T", &work.display().to_string()]);
        let command = args.command.clone().unwrap_or_else(|| {
            std::env::args()
                .map(|a| shell_quote(&a))
                .collect::<Vec<_>>()
                .join(" ")
        });
        let shim = match &args.shim {
            Some(p) => describe_binary(p),
            None => format!(
                "default: petrel-shim beside {} ({})",
                args.petrel.display(),
                describe_binary(&args.petrel.with_file_name("petrel-shim"))
            ),
        };
        let commit = commit();
        Ok(Machine {
            kernel: rustix::system::uname()
                .release()
                .to_string_lossy()
                .into_owned(),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            cpu_model,
            memory,
            load_before: load_average(),
            cgroups,
            work_fs,
            runc: output(&args.runc.display().to_string(), &["--version"]),
            date: output("date", &["-u", "+%Y-%m-%d %H:%M:%S UTC"]),
            commit,
            command,
            shim,
        })
    }
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "unknown".to_string())
}

/// HEAD, and whether the code that is measured (crates, Cargo files,
/// the bench script) differs from it: others edit the tree meanwhile.
fn commit() -> String {
    let head = output("git", &["rev-parse", "--short=12", "HEAD"]);
    let changed = Command::new("git")
        .args([
            "status",
            "--porcelain",
            "--",
            "crates",
            "Cargo.toml",
            "Cargo.lock",
        ])
        .arg("scripts/bench.sh")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0);
    if changed == 0 {
        head
    } else {
        format!(
            "{head} plus {changed} uncommitted paths under crates/, Cargo.* or scripts/bench.sh"
        )
    }
}

/// The first line of a command's standard output, or "unknown".
fn output(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// "`<path>`, `<size>` bytes, static|dynamic".
fn describe_binary(path: &Path) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return format!("{} (unreadable)", path.display());
    };
    let kind = match elf_has_interpreter(&bytes) {
        Some(true) => "dynamically linked",
        Some(false) => "statically linked",
        None => "not an ELF64 file",
    };
    format!("`{}`, {} bytes, {kind}", path.display(), bytes.len())
}

/// Whether an ELF64 little-endian file asks for a program interpreter
/// (a PT_INTERP program header): that is, whether it is dynamically linked.
fn elf_has_interpreter(b: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if b.get(..4)? != b"\x7fELF" || *b.get(4)? != 2 || *b.get(5)? != 1 {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        if u32_at(phoff + i * phentsize)? == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_check_should_see_this_test_binary_as_dynamic() -> std::io::Result<()> {
        let me = std::fs::read("/proc/self/exe")?;
        assert_eq!(elf_has_interpreter(&me), Some(true));
        assert_eq!(elf_has_interpreter(b"#!/bin/sh\n"), None);
        Ok(())
    }

    #[test]
    fn shell_quote_should_quote_only_when_needed() {
        assert_eq!(shell_quote("--pods"), "--pods");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
