//! What a container's processes hold, read from `/proc`: threads, open
//! descriptors and sockets (cAdvisor's `container_threads`,
//! `container_file_descriptors`, `container_sockets`), and the interface
//! counters of a network namespace (`/proc/<pid>/net/dev`).

use std::io;
use std::path::Path;

/// Threads and descriptors of a set of processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcCounts {
    /// Processes that could be read.
    pub processes: u64,
    /// Their threads.
    pub threads: u64,
    /// Their open file descriptors.
    pub fds: u64,
    /// Those of the descriptors that are sockets.
    pub sockets: u64,
}

/// Counts the threads, descriptors and sockets of `pids`, under the proc
/// mount `proc` (normally `/proc`). A process that exits meanwhile, or a
/// descriptor closed meanwhile, is skipped.
pub fn proc_counts(proc: &Path, pids: &[u32]) -> ProcCounts {
    let mut c = ProcCounts::default();
    for pid in pids {
        let dir = proc.join(pid.to_string());
        let Ok(tasks) = std::fs::read_dir(dir.join("task")) else {
            continue;
        };
        c.processes += 1;
        c.threads += tasks.count() as u64;
        let fd_dir = dir.join("fd");
        let Ok(fds) = std::fs::read_dir(&fd_dir) else {
            continue;
        };
        for fd in fds.flatten() {
            c.fds += 1;
            if std::fs::read_link(fd.path())
                .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"socket:"))
            {
                c.sockets += 1;
            }
        }
    }
    c
}

/// The counters of one network interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InterfaceCounters {
    /// The interface's name.
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Packets dropped on receive.
    pub rx_dropped: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Transmit errors.
    pub tx_errors: u64,
    /// Packets dropped on transmit.
    pub tx_dropped: u64,
}

/// The interfaces of a `net/dev` file but loopback (as cAdvisor, which
/// counts only a pod's traffic with the outside).
pub fn parse_net_dev(text: &str) -> Vec<InterfaceCounters> {
    text.lines()
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let name = name.trim();
            let v: Vec<u64> = rest
                .split_whitespace()
                .map(|f| f.parse().ok())
                .collect::<Option<_>>()?;
            // 8 receive columns, then 8 transmit ones.
            (v.len() >= 16 && name != "lo").then(|| InterfaceCounters {
                name: name.to_string(),
                rx_bytes: v[0],
                rx_packets: v[1],
                rx_errors: v[2],
                rx_dropped: v[3],
                tx_bytes: v[8],
                tx_packets: v[9],
                tx_errors: v[10],
                tx_dropped: v[11],
            })
        })
        .collect()
}

/// The interfaces of the network namespace process `pid` is in.
pub fn net_dev_of_pid(pid: u32) -> io::Result<Vec<InterfaceCounters>> {
    Ok(parse_net_dev(&std::fs::read_to_string(format!(
        "/proc/{pid}/net/dev"
    ))?))
}

/// The interfaces of the network namespace pinned at `netns` (a pod with
/// no process to look through): read by a short-lived thread that joins
/// it, since joining one affects only the calling thread.
pub fn net_dev_in_netns(netns: &Path) -> io::Result<Vec<InterfaceCounters>> {
    let ns = std::fs::File::open(netns)?;
    std::thread::Builder::new()
        .name("petrel-netdev".into())
        .spawn(move || {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&ns),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )?;
            std::fs::read_to_string("/proc/thread-self/net/dev")
        })?
        .join()
        .map_err(|_| io::Error::other("net/dev reader thread panicked"))?
        .map(|t| parse_net_dev(&t))
}

/// The `/dev` name of block device `major:minor` (`/dev/vda`), as
/// cAdvisor labels devices; `major:minor` itself when sysfs does not say.
pub fn block_device_name(major: u64, minor: u64) -> String {
    let id = format!("{major}:{minor}");
    std::fs::read_link(format!("/sys/dev/block/{id}"))
        .ok()
        .and_then(|t| {
            t.file_name()
                .map(|n| format!("/dev/{}", n.to_string_lossy()))
        })
        .unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_DEV: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     840      10    0    0    0     0          0         0      840      10    0    0    0     0       0          0
  eth0:  123456     789    1    2    0     0          0         3    65432     456    4    5    0     0       0          0
";

    #[test]
    fn parse_net_dev_should_read_both_directions_and_skip_loopback() {
        assert_eq!(
            parse_net_dev(NET_DEV),
            vec![InterfaceCounters {
                name: "eth0".into(),
                rx_bytes: 123_456,
                rx_packets: 789,
                rx_errors: 1,
                rx_dropped: 2,
                tx_bytes: 65432,
                tx_packets: 456,
                tx_errors: 4,
                tx_dropped: 5,
            }]
        );
        assert!(parse_net_dev("garbage\nx: 1 2\n").is_empty());
    }

    #[test]
    fn proc_counts_should_count_threads_fds_and_sockets() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let p = d.path().join("42");
        std::fs::create_dir_all(p.join("task/42"))?;
        std::fs::create_dir_all(p.join("task/43"))?;
        std::fs::create_dir_all(p.join("fd"))?;
        std::os::unix::fs::symlink("/dev/null", p.join("fd/0"))?;
        std::os::unix::fs::symlink("socket:[1234]", p.join("fd/1"))?;
        std::os::unix::fs::symlink("pipe:[99]", p.join("fd/2"))?;
        let c = proc_counts(d.path(), &[42, 7]);
        assert_eq!(
            c,
            ProcCounts {
                processes: 1,
                threads: 2,
                fds: 3,
                sockets: 1
            }
        );
        Ok(())
    }

    #[test]
    fn block_device_name_should_fall_back_to_the_numbers() {
        assert_eq!(block_device_name(4095, 1_048_575), "4095:1048575");
    }

    #[test]
    fn net_dev_should_read_this_processs_namespace() -> io::Result<()> {
        let own = net_dev_of_pid(std::process::id())?;
        let via_ns = net_dev_in_netns(Path::new("/proc/self/ns/net"))?;
        let names = |v: &[InterfaceCounters]| v.iter().map(|i| i.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&own), names(&via_ns));
        Ok(())
    }
}
