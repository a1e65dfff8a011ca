//! Cheap checks of two performance promises of docs/PERFORMANCE.md, so that
//! CI fails when they break between two `make bench` runs: the shipped shim
//! (`make release`'s, statically linked: `make shim-release`) stays within
//! 1 MB of RSS per container (P2), and a runtime with running containers
//! uses no CPU while nothing changes (P5). The bench measures both fully.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use petrel_testkit::prelude::*;

/// P2's bound: 1 MB = 10^6 bytes, as docs/PERFORMANCE.md counts.
const SHIM_RSS_MAX: u64 = 1_000_000;
/// Containers kept running for the check.
const CONTAINERS: usize = 10;
/// The idle window and the CPU allowed in it: P5's 0.1 % of one core.
const IDLE_WINDOW: Duration = Duration::from_secs(20);
const IDLE_CPU_MAX: Duration = Duration::from_millis(20);

/// The shim users run: `target/release/petrel-shim`, as `make release` and
/// `make shim-release` build it (PETREL_RELEASE_SHIM points elsewhere).
fn shipped_shim() -> PathBuf {
    let p = std::env::var_os("PETREL_RELEASE_SHIM").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/petrel-shim"),
        PathBuf::from,
    );
    assert!(
        p.is_file(),
        "{} is missing: `make shim-release` builds the shipped shim",
        p.display()
    );
    p
}

/// Whether the ELF file at `path` asks for a program interpreter (is
/// dynamically linked): a PT_INTERP program header.
fn has_interpreter(path: &std::path::Path) -> bool {
    let b = std::fs::read(path).expect("read the shim");
    assert!(
        b.len() > 64 && &b[..4] == b"\x7fELF" && b[4] == 2,
        "not a 64-bit ELF file"
    );
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().expect("8 bytes")) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let o = phoff + i * size;
        u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes")) == 3
    })
}

/// `VmRSS` of a process, in bytes.
fn rss_bytes(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// utime + stime of a process (all its threads, exited ones included).
fn cpu_time(pid: u32) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // Fields after the command's closing parenthesis: state is field 3.
    let rest = &s[s.rfind(')').expect("stat") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf(3) has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

#[tokio::test]
async fn shipped_shim_and_idle_runtime_should_keep_their_promises() {
    let shim = shipped_shim();
    assert!(
        !has_interpreter(&shim),
        "{} is dynamically linked: the shipped shim is static (make shim-release)",
        shim.display()
    );
    let node = Node::start_with(&format!("shim_binary = {:?}\n", shim));
    let mut c = node.clients().await;
    node.import_busybox(&mut c).await;
    for i in 0..CONTAINERS {
        let pc = node.pod_config(&format!("promise-{i}"));
        let pod = c.run_pod(pc.clone()).await;
        c.run(&pod, &pc, sh_container("sleeper", "sleep 100000"))
            .await;
    }
    let shims = node.live_shims();
    assert_eq!(shims.len(), CONTAINERS, "one shim per container: {shims:?}");

    // Let start-up work (the first stats, the containers' own start) end.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut pids: Vec<u32> = shims.values().copied().collect();
    pids.push(node.pid());
    let before: Duration = pids.iter().map(|p| cpu_time(*p)).sum();
    tokio::time::sleep(IDLE_WINDOW).await;
    let used: Duration = pids.iter().map(|p| cpu_time(*p)).sum::<Duration>() - before;
    assert!(
        used <= IDLE_CPU_MAX,
        "runtime + {CONTAINERS} shims used {used:?} of CPU in {IDLE_WINDOW:?} with nothing \
         changing (promise P5: at most {IDLE_CPU_MAX:?})"
    );

    for (id, pid) in &shims {
        let rss = rss_bytes(*pid);
        assert!(
            rss <= SHIM_RSS_MAX,
            "shim of {id} (pid {pid}) has {rss} bytes of RSS (promise P2: at most {SHIM_RSS_MAX})"
        );
    }
}
