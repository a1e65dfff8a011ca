//! Reaping the orphans the runtime adopts as a child subreaper.
//!
//! The runtime is a child subreaper (so that the init of a pod's
//! PID-namespace holder is reaped where PID 1 does not reap), so whatever is
//! orphaned below it becomes its child: the init of a container whose shim
//! was killed, the stages of a runc killed half-way. Nobody waits for those,
//! and a zombie left in a container's PID namespace keeps the namespace from
//! ending. The runtime's own children (runc calls, CNI and NRI plugins,
//! shims, holders) are reaped by whoever started them as soon as they exit,
//! so a zombie child seen at two looks [`GRACE`] apart is an orphan nobody
//! will reap, and is reaped here. Looks happen only after a child exited
//! (SIGCHLD) and while zombies remain: no work while nothing exits.

use std::collections::HashMap;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};

/// How long a zombie child may wait for the code that started it.
pub const GRACE: Duration = Duration::from_secs(5);

/// A zombie child: its pid and start time (which tells a reused pid apart).
pub type Zombie = (u32, u64);

/// Zombies seen at the last look.
#[derive(Debug, Default)]
pub struct Orphans {
    seen: HashMap<u32, u64>,
}

impl Orphans {
    /// Takes a look at the zombie children there are now; returns those that
    /// were already there at the last look (orphans, to reap).
    pub fn look(&mut self, zombies: impl IntoIterator<Item = Zombie>) -> Vec<u32> {
        let now: HashMap<u32, u64> = zombies.into_iter().collect();
        let orphans = now
            .iter()
            .filter(|(pid, start)| self.seen.get(pid) == Some(start))
            .map(|(pid, _)| *pid)
            .collect::<Vec<_>>();
        self.seen = now;
        for pid in &orphans {
            self.seen.remove(pid);
        }
        orphans
    }

    /// Whether zombies are waiting for the next look.
    pub fn waiting(&self) -> bool {
        !self.seen.is_empty()
    }
}

/// Whether this process has a child that exited and was not reaped yet
/// (looked at without reaping it).
fn has_zombie_child() -> bool {
    // SAFETY: an all-zero siginfo_t is valid; waitid fills it in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: P_ALL with WNOWAIT leaves every child waitable for its owner.
    let r = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // SAFETY: si_pid is the field waitid sets (0 when no child is waitable).
    r == 0 && unsafe { info.si_pid() } != 0
}

/// This process's zombie children.
pub fn zombie_children() -> Vec<Zombie> {
    if !has_zombie_child() {
        return Vec::new();
    }
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let st = petrel_oci::proc_stat::read(pid)?;
            (st.state == 'Z' && st.ppid == me).then_some((pid, st.start_time))
        })
        .collect()
}

/// Reaps zombie child `pid`, logging what it was.
fn reap(pid: u32) {
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return;
    };
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG on one pid that is our zombie child.
    let r = unsafe { libc::waitpid(p, &mut status, libc::WNOHANG) };
    if r == p {
        tracing::info!(
            pid,
            name = name.trim_end(),
            status,
            "reaped an orphaned process adopted as child subreaper"
        );
    }
}

/// Reaps orphaned zombie children until the task is dropped.
pub async fn reap_orphans() {
    let mut sigchld = match signal(SignalKind::child()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGCHLD: orphans adopted as child subreaper are not reaped");
            return;
        }
    };
    let mut orphans = Orphans::default();
    loop {
        if !orphans.waiting() && sigchld.recv().await.is_none() {
            return;
        }
        tokio::time::sleep(GRACE).await;
        let zombies = tokio::task::spawn_blocking(zombie_children)
            .await
            .unwrap_or_default();
        for pid in orphans.look(zombies) {
            reap(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_zombies_seen_twice_should_be_orphans() {
        let mut o = Orphans::default();
        assert!(o.look([(10, 1), (11, 1)]).is_empty());
        assert!(o.waiting());
        // 10 was reaped by its owner; 11 is still there; 12 is new.
        assert_eq!(o.look([(11, 1), (12, 5)]), vec![11]);
        // 12 was reaped, and its pid reused by a new zombie.
        assert!(o.look([(12, 9)]).is_empty());
        assert_eq!(o.look([(12, 9)]), vec![12]);
        assert!(!o.waiting());
        assert!(o.look([]).is_empty());
    }

    #[test]
    fn an_orphan_should_be_found_and_reaped() -> std::io::Result<()> {
        crate::sandbox::pid_holder::become_subreaper();
        // sh leaves a sleep behind; once sh is reaped the sleep is our child.
        let out = std::process::Command::new("sh")
            .args(["-c", "sleep 0.2 & echo $!"])
            .stdout(std::process::Stdio::piped())
            .spawn()?
            .wait_with_output()?;
        let pid: u32 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(std::io::Error::other)?;
        let start = std::time::Instant::now();
        let first = loop {
            let z = zombie_children();
            if z.iter().any(|(p, _)| *p == pid) {
                break z;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{pid} never became our zombie"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut o = Orphans::default();
        assert!(!o.look(first).contains(&pid), "an orphan at the first look");
        let orphans = o.look(zombie_children());
        assert!(orphans.contains(&pid), "{orphans:?}");
        // Only this one: other tests of this process may own the rest.
        reap(pid);
        assert_eq!(petrel_oci::proc_stat::read(pid), None);
        Ok(())
    }
}
