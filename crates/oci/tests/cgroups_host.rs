//! Cgroups on the real host (root only): ensure, join, stats, remove.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use petrel_oci::cgroups::{CgroupError, CgroupVersion, Cgroups};

/// Kills and reaps the child, then removes the cgroups the test created.
struct Guard {
    cgroups: Cgroups,
    created: Vec<String>,
    child: Option<Child>,
}

impl Guard {
    fn stop_child(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop_child();
        for path in self.created.iter().rev() {
            // The kernel may take a moment to let go of a cgroup whose last task exited.
            for _ in 0..50 {
                match self.cgroups.remove(path) {
                    Err(CgroupError::Busy { .. }) => std::thread::sleep(Duration::from_millis(20)),
                    _ => break,
                }
            }
        }
    }
}

fn unique_parent() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("/petrel-test-{}-{nanos:x}", std::process::id())
}

#[test]
fn cgroups_should_create_account_and_remove_a_cgroup_on_this_host() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let cgroups = Cgroups::detect().expect("detect cgroups");
    let parent = unique_parent();
    let leaf = format!("{parent}/a/b");

    let created = cgroups.ensure(&leaf).expect("ensure");
    let mut guard = Guard {
        cgroups: cgroups.clone(),
        created: created.clone(),
        child: None,
    };
    assert_eq!(
        created,
        [parent.clone(), format!("{parent}/a"), leaf.clone()]
    );

    let controllers: &[&str] = match cgroups.version() {
        CgroupVersion::V1 => &["memory", "cpu", "cpuacct", "cpuset", "pids"],
        CgroupVersion::V2 => &[""],
    };
    for c in controllers {
        let dir = cgroups.dir(c, &leaf).expect("dir");
        assert!(dir.is_dir(), "{} missing", dir.display());
    }
    let cpus = cgroups
        .read("cpuset", &leaf, "cpuset.cpus.effective")
        .or_else(|_| cgroups.read("cpuset", &leaf, "cpuset.cpus"))
        .expect("cpuset.cpus");
    assert!(!cpus.trim().is_empty(), "cpuset.cpus is empty");

    // The child waits until it was moved, then does some work whose CPU time and page
    // cache are charged to the cgroup, then sleeps.
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("data");
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(
            "read go; dd if=/dev/zero of=\"$1\" bs=1M count=8 2>/dev/null; \
             echo ready; exec sleep 5",
        )
        .arg("sh")
        .arg(&file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    guard.child = Some(child);

    let join: &[&str] = match cgroups.version() {
        CgroupVersion::V1 => &["memory", "cpuacct"],
        CgroupVersion::V2 => &[""],
    };
    for c in join {
        cgroups
            .write(c, &leaf, "cgroup.procs", &pid.to_string())
            .expect("join cgroup");
    }
    writeln!(stdin.expect("stdin"), "go").expect("signal child");
    let mut line = String::new();
    BufReader::new(stdout.expect("stdout"))
        .read_line(&mut line)
        .expect("read child");
    assert_eq!(line.trim(), "ready");

    assert!(cgroups.procs(&leaf).expect("procs").contains(&pid));
    let stats = cgroups.stats(&leaf).expect("stats");
    assert!(stats.cpu_usage_ns > 0, "{stats:?}");
    assert!(stats.memory_usage_bytes > 0, "{stats:?}");
    assert!(
        stats.memory_working_set_bytes <= stats.memory_usage_bytes,
        "{stats:?}"
    );
    assert_eq!(stats.memory_limit_bytes, None, "{stats:?}");
    assert_eq!(cgroups.oom_kill_count(&leaf), Some(0));

    // A cgroup with a process in it cannot be removed.
    assert!(matches!(
        cgroups.remove(&leaf),
        Err(CgroupError::Busy { .. })
    ));

    guard.stop_child();
    let mut left = std::mem::take(&mut guard.created);
    while let Some(path) = left.pop() {
        let mut res = cgroups.remove(&path);
        for _ in 0..50 {
            if !matches!(res, Err(CgroupError::Busy { .. })) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            res = cgroups.remove(&path);
        }
        if let Err(e) = res {
            guard.created = left.clone();
            guard.created.push(path);
            panic!("remove: {e}");
        }
    }
    for c in controllers {
        let dir = cgroups.dir(c, &parent).expect("dir");
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}

#[test]
fn release_memory_should_uncharge_the_page_cache_left_by_exited_processes() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let cgroups = Cgroups::detect().expect("detect cgroups");
    let parent = unique_parent();
    let leaf = format!("{parent}/gone");
    let created = cgroups.ensure(&leaf).expect("ensure");
    let mut guard = Guard {
        cgroups: cgroups.clone(),
        created,
        child: None,
    };

    // A process in the cgroup writes 8 MiB into a file that outlives it, then exits:
    // the file's page cache stays charged to the empty cgroup.
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("data");
    let controller = match cgroups.version() {
        CgroupVersion::V1 => "memory",
        CgroupVersion::V2 => "",
    };
    let procs = cgroups
        .dir(controller, &leaf)
        .expect("dir")
        .join("cgroup.procs");
    let status = Command::new("/bin/sh")
        .arg("-c")
        .arg("echo $$ > \"$1\" && dd if=/dev/zero of=\"$2\" bs=1M count=8 2>/dev/null")
        .arg("sh")
        .arg(&procs)
        .arg(&file)
        .status()
        .expect("run child");
    assert!(status.success());
    assert!(cgroups.procs(&leaf).expect("procs").is_empty());
    let before = cgroups.stats(&leaf).expect("stats").memory_usage_bytes;
    assert!(before >= 4 << 20, "page cache not charged: {before} bytes");

    cgroups.release_memory(&leaf).expect("release_memory");
    let after = cgroups.stats(&leaf).expect("stats").memory_usage_bytes;
    assert!(
        after < 1 << 20,
        "still charged after release: {after} bytes (was {before})"
    );

    // A cgroup that is gone already is not an error.
    let gone = std::mem::take(&mut guard.created);
    for path in gone.iter().rev() {
        cgroups.remove(path).expect("remove");
    }
    cgroups
        .release_memory(&leaf)
        .expect("release_memory of a removed cgroup");
}
