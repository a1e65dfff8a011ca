//! kubelet's own mount namespace: what it sees of the host that it would
//! otherwise change for everyone.
//!
//! - `/proc/sys`: kubelet checks six kernel settings at start and, unless
//!   `protectKernelDefaults`, rewrites them host-wide; with it, it refuses
//!   to start when they differ. Files holding the values it expects are
//!   bind-mounted over them, in its namespace only.
//! - `/var/log`: kubelet keeps symlinks to container logs in the fixed
//!   `/var/log/containers` (no setting moves it) and makes that directory;
//!   an empty directory of the kit is bind-mounted over `/var/log`.
//!
//! Both mounts are made after `/proc` and the mount holding `/var/log` are
//! made private in the new namespace, so they never propagate to the host,
//! even where the host's mounts are shared (systemd). The namespace keeps
//! the host's other propagation (`unshare --propagation unchanged`): the
//! kubelet root directory, which the kit bind-mounts shared on the host
//! beforehand, stays a peer of the host's, so the volumes kubelet mounts
//! there (tmpfs for secrets and projected volumes) are seen by the runtime,
//! which runs in the host's namespace.
//!
//! kubelet is exec'd by the shell, so the pid the kit started is kubelet's.

use std::path::Path;
use std::process::Command;

use crate::KitError;

/// The kernel settings kubelet checks (`/proc/sys/<path>`) and the values
/// it wants (kubelet's `setupKernelTunables`).
pub const KERNEL_TUNABLES: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The shell script run in the new namespace: `$1` is the kit's directory
/// (holding `sysctl/` and `var-log/`), the rest is the command to exec.
pub fn script() -> String {
    let mut s = String::from(
        "set -eu\n\
         d=$1; shift\n\
         mount --make-rprivate /proc\n\
         mount --make-private \"$(findmnt -n -o TARGET --target /var/log)\"\n\
         mount --bind \"$d/var-log\" /var/log\n",
    );
    for (path, _) in KERNEL_TUNABLES {
        s.push_str(&format!(
            "mount --bind \"$d/sysctl/{}\" /proc/sys/{path}\n",
            file_name(path)
        ));
    }
    s.push_str("exec \"$@\"\n");
    s
}

/// Writes the files the script mounts into `dir`.
pub fn prepare(dir: &Path) -> Result<(), KitError> {
    let sysctl = dir.join("sysctl");
    for d in [&sysctl, &dir.join("var-log")] {
        std::fs::create_dir_all(d).map_err(|e| KitError::io("create directory", d, e))?;
    }
    for (path, value) in KERNEL_TUNABLES {
        let f = sysctl.join(file_name(path));
        std::fs::write(&f, format!("{value}\n")).map_err(|e| KitError::io("write", &f, e))?;
    }
    Ok(())
}

/// `program ARGS` to be run in a new mount namespace prepared from `dir`.
pub fn command(dir: &Path, program: &Path) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "unchanged", "--", "sh", "-c"])
        .arg(script())
        .arg("sh")
        .arg(dir)
        .arg(program);
    cmd
}

fn file_name(sysctl_path: &str) -> String {
    sysctl_path.replace('/', ".")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn script_should_privatize_before_mounting_and_exec_the_command() {
        let s = script();
        let private = s.find("--make-rprivate /proc").unwrap();
        let first_bind = s.find("mount --bind").unwrap();
        assert!(private < first_bind);
        assert!(s.contains(
            "mount --bind \"$d/sysctl/kernel.panic_on_oops\" /proc/sys/kernel/panic_on_oops"
        ));
        assert!(s.ends_with("exec \"$@\"\n"));
    }

    #[test]
    fn command_should_show_the_expected_values_and_leave_the_host_alone() {
        let d = tempfile::tempdir().unwrap();
        prepare(d.path()).unwrap();
        let before = std::fs::read_to_string("/proc/sys/kernel/panic_on_oops").unwrap();
        let out = command(d.path(), Path::new("cat"))
            .args([
                "/proc/sys/kernel/panic_on_oops",
                "/proc/sys/vm/overcommit_memory",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n1\n");
        let after = std::fs::read_to_string("/proc/sys/kernel/panic_on_oops").unwrap();
        assert_eq!(before, after);
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(&d.path().display().to_string()));
    }
}
