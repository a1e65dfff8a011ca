//! Petrel's `RuntimeDefault` seccomp profile.
//!
//! Where the rules come from: the facts of the common runtime default, the
//! profile containerd (`contrib/seccomp`, 2.x) and Docker/moby
//! (`profiles/seccomp/default.json`) apply, so that workloads meet the same
//! allow list as on those runtimes. In short:
//!
//! - Every syscall not listed fails with `EPERM` (`SCMP_ACT_ERRNO`, errno 1).
//! - A base list of ordinary syscalls is allowed for everyone ([`BASE`]):
//!   files, memory, signals, sockets, timers, IPC, scheduling, identity.
//! - Syscalls guarded by a capability are allowed only when the container's
//!   bounding set holds it ([`BY_CAPABILITY`]), e.g. `mount`, `unshare`,
//!   `setns`, `sethostname` with `CAP_SYS_ADMIN`, `ptrace` with
//!   `CAP_SYS_PTRACE`, `chroot` with `CAP_SYS_CHROOT`.
//! - Without `CAP_SYS_ADMIN`, `clone` is allowed only without namespace flags
//!   (so no new user, mount, PID, network, UTS, IPC or cgroup namespace), and
//!   `clone3`, whose flags live in memory a filter cannot read, fails with
//!   `ENOSYS` so that libc falls back to `clone`.
//! - `personality` only with the common personas (Linux, Linux32, their
//!   `UNAME26` forms, and the query value `0xffffffff`).
//! - `socket` for every address family but `AF_VSOCK`.
//! - `io_uring_*` are not allowed (containerd 2.0 and moby 25 dropped them
//!   after repeated container escapes through them).
//!
//! Architectures: x86_64 with its x86 and x32 ABIs, or aarch64 with arm,
//! depending on the build; `ptrace` and `process_vm_*` with `CAP_SYS_PTRACE`
//! or on kernels since 4.8 (those Petrel supports), so always.

use std::collections::HashSet;

use oci_spec::runtime::{
    Arch, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompOperator, LinuxSyscall,
};

/// `EPERM`: what a denied syscall returns.
const EPERM: u32 = 1;
/// `ENOSYS`: what `clone3` returns without `CAP_SYS_ADMIN` (libc then
/// falls back to `clone`, whose flags a filter can check).
const ENOSYS: u32 = 38;
/// `AF_VSOCK`, the one socket family refused.
const AF_VSOCK: u64 = 40;
/// `CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC |
/// CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET`.
pub(crate) const CLONE_NAMESPACE_FLAGS: u64 =
    0x0002_0000 | 0x0200_0000 | 0x0400_0000 | 0x0800_0000 | 0x1000_0000 | 0x2000_0000 | 0x4000_0000;
/// `personality` values allowed: `PER_LINUX`, `PER_LINUX32`,
/// `UNAME26`, `UNAME26 | PER_LINUX32`, and the query `0xffffffff`.
const PERSONAS: [u64; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// Allowed for every container (names unknown to an architecture are
/// skipped by the OCI runtime).
#[rustfmt::skip]
const BASE: &[&str] = &[
    // Files and directories.
    "access", "chdir", "chmod", "chown", "chown32", "close", "close_range", "copy_file_range",
    "creat", "dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fadvise64_64",
    "fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown",
    "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr",
    "flock", "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs",
    "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futimesat", "getcwd", "getdents",
    "getdents64", "getxattr", "inotify_add_watch", "inotify_init", "inotify_init1",
    "inotify_rm_watch", "lchown", "lchown32", "lgetxattr", "link", "linkat", "listxattr",
    "llistxattr", "_llseek", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "mkdir",
    "mkdirat", "mknod", "mknodat", "newfstatat", "open", "openat", "openat2", "pread64",
    "preadv", "preadv2", "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink",
    "readlinkat", "readv", "removexattr", "rename", "renameat", "renameat2", "rmdir",
    "sendfile", "sendfile64", "setxattr", "splice", "stat", "stat64", "statfs", "statfs64",
    "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate",
    "truncate64", "umask", "unlink", "unlinkat", "utime", "utimensat", "utimensat_time64",
    "utimes", "vmsplice", "write", "writev",
    // Asynchronous I/O and polling (not io_uring).
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
    "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "io_cancel",
    "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "io_setup",
    "io_submit", "ioctl", "_newselect", "pause", "pipe", "pipe2", "poll", "ppoll",
    "ppoll_time64", "pselect6", "pselect6_time64", "select", "signalfd", "signalfd4",
    // Memory.
    "brk", "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mlock",
    "mlock2", "mlockall", "mmap", "mmap2", "mprotect", "mremap", "msync", "munlock",
    "munlockall", "munmap", "pkey_alloc", "pkey_free", "pkey_mprotect", "remap_file_pages",
    // Processes, threads, signals.
    "capget", "capset", "execve", "execveat", "exit", "exit_group", "fork", "futex",
    "futex_time64", "futex_waitv", "get_robust_list", "get_thread_area", "getcpu", "getpgid",
    "getpgrp", "getpid", "getppid", "getpriority", "getrlimit", "getrusage", "getsid",
    "gettid", "ioprio_get", "ioprio_set", "kill", "landlock_add_rule",
    "landlock_create_ruleset", "landlock_restrict_self", "pidfd_open", "pidfd_send_signal",
    "prctl", "prlimit64", "process_mrelease", "restart_syscall", "rseq", "rt_sigaction",
    "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getaffinity", "sched_getattr", "sched_getparam",
    "sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64",
    "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler",
    "sched_yield", "seccomp", "set_robust_list", "set_thread_area", "set_tid_address",
    "setpgid", "setpriority", "setrlimit", "setsid", "sigaltstack", "sigprocmask", "sigreturn",
    "tgkill", "tkill", "ugetrlimit", "vfork", "wait4", "waitid", "waitpid",
    // Debugging one's own children (kernels since 4.8 keep seccomp across it).
    "ptrace", "process_vm_readv", "process_vm_writev",
    // Identity.
    "getegid", "getegid32", "geteuid", "geteuid32", "getgid", "getgid32", "getgroups",
    "getgroups32", "getresgid", "getresgid32", "getresuid", "getresuid32", "getuid",
    "getuid32", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32",
    "setgroups", "setgroups32", "setregid", "setregid32", "setresgid", "setresgid32",
    "setresuid", "setresuid32", "setreuid", "setreuid32", "setuid", "setuid32",
    // Sockets (`socket` itself is checked apart).
    "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt",
    "listen", "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg",
    "sendmsg", "sendto", "setsockopt", "shutdown", "socketcall", "socketpair",
    // System V and POSIX IPC.
    "ipc", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "msgctl",
    "msgget", "msgrcv", "msgsnd", "semctl", "semget", "semop", "semtimedop",
    "semtimedop_time64", "shmat", "shmctl", "shmdt", "shmget",
    // Time and system information.
    "adjtimex", "alarm", "clock_adjtime", "clock_adjtime64", "clock_getres",
    "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep",
    "clock_nanosleep_time64", "getitimer", "getrandom", "gettimeofday", "nanosleep",
    "setitimer", "sysinfo", "time", "timer_create", "timer_delete", "timer_getoverrun",
    "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create",
    "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times",
    "uname",
];

/// Allowed only when the container's bounding set holds the capability.
const BY_CAPABILITY: &[(Capability, &[&str])] = &[
    (Capability::DacReadSearch, &["open_by_handle_at"]),
    (
        Capability::SysAdmin,
        &[
            "bpf",
            "clone",
            "clone3",
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "name_to_handle_at",
            "open_tree",
            "perf_event_open",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "syslog",
            "umount",
            "umount2",
            "unshare",
        ],
    ),
    (Capability::SysBoot, &["reboot"]),
    (Capability::SysChroot, &["chroot"]),
    (
        Capability::SysModule,
        &["delete_module", "finit_module", "init_module"],
    ),
    (Capability::SysPacct, &["acct"]),
    (
        Capability::SysPtrace,
        &["kcmp", "pidfd_getfd", "process_madvise"],
    ),
    (Capability::SysRawio, &["ioperm", "iopl"]),
    (
        Capability::SysTime,
        &["clock_settime", "clock_settime64", "settimeofday", "stime"],
    ),
    (Capability::SysTtyConfig, &["vhangup"]),
    (
        Capability::SysNice,
        &[
            "get_mempolicy",
            "mbind",
            "set_mempolicy",
            "set_mempolicy_home_node",
        ],
    ),
    (Capability::Syslog, &["syslog"]),
    (Capability::Bpf, &["bpf"]),
    (Capability::Perfmon, &["perf_event_open"]),
];

/// The architectures the filter covers, and the syscalls only they have.
fn arch_specific() -> (Vec<Arch>, &'static [&'static str]) {
    if cfg!(target_arch = "x86_64") {
        (
            vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32],
            &["arch_prctl", "modify_ldt"],
        )
    } else if cfg!(target_arch = "aarch64") {
        (
            vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm],
            &[
                "arm_fadvise64_64",
                "arm_sync_file_range",
                "breakpoint",
                "cacheflush",
                "set_tls",
                "sync_file_range2",
            ],
        )
    } else {
        // Native only: the OCI runtime then filters the build's own ABI.
        (Vec::new(), &[])
    }
}

fn rule(names: &[&str], action: LinuxSeccompAction, args: Vec<LinuxSeccompArg>) -> LinuxSyscall {
    let mut s = LinuxSyscall::default();
    s.set_names(names.iter().map(|n| n.to_string()).collect())
        .set_action(action)
        .set_args((!args.is_empty()).then_some(args));
    s
}

fn arg(index: usize, value: u64, op: LinuxSeccompOperator) -> LinuxSeccompArg {
    // Every field is set, so the builder cannot fail; its default is a
    // harmless `index 0 == 0` never reached.
    LinuxSeccompArgBuilder::default()
        .index(index)
        .value(value)
        .op(op)
        .build()
        .unwrap_or_default()
}

/// The `RuntimeDefault` profile for a container whose bounding capability
/// set is `bounding`.
pub fn runtime_default(bounding: &HashSet<Capability>) -> LinuxSeccomp {
    use LinuxSeccompAction::{ScmpActAllow as Allow, ScmpActErrno as Errno};
    use LinuxSeccompOperator::{ScmpCmpEq as Eq, ScmpCmpMaskedEq as MaskedEq, ScmpCmpNe as Ne};

    let (arches, arch_calls) = arch_specific();
    let mut rules = vec![rule(BASE, Allow, Vec::new())];
    if !arch_calls.is_empty() {
        rules.push(rule(arch_calls, Allow, Vec::new()));
    }
    rules.push(rule(&["socket"], Allow, vec![arg(0, AF_VSOCK, Ne)]));
    // Conditions on one syscall are ANDed, so each persona is a rule of its own.
    for p in PERSONAS {
        rules.push(rule(&["personality"], Allow, vec![arg(0, p, Eq)]));
    }
    for (cap, names) in BY_CAPABILITY {
        if bounding.contains(cap) {
            rules.push(rule(names, Allow, Vec::new()));
        }
    }
    if !bounding.contains(&Capability::SysAdmin) {
        // s390 passes the flags second; Petrel builds for x86_64 and aarch64.
        rules.push(rule(
            &["clone"],
            Allow,
            vec![arg(0, CLONE_NAMESPACE_FLAGS, MaskedEq)],
        ));
        let mut clone3 = rule(&["clone3"], Errno, Vec::new());
        clone3.set_errno_ret(Some(ENOSYS));
        rules.push(clone3);
    }
    let mut s = LinuxSeccomp::default();
    s.set_default_action(Errno)
        .set_default_errno_ret(Some(EPERM))
        .set_architectures((!arches.is_empty()).then_some(arches))
        .set_syscalls(Some(rules));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(p: &LinuxSeccomp, name: &str) -> Vec<LinuxSyscall> {
        p.syscalls()
            .iter()
            .flatten()
            .filter(|s| {
                s.action() == LinuxSeccompAction::ScmpActAllow
                    && s.names().iter().any(|n| n == name)
            })
            .cloned()
            .collect()
    }

    fn default_caps() -> HashSet<Capability> {
        super::super::super::DEFAULT_CAPS
            .iter()
            .filter_map(|n| super::super::super::capability_by_name(n))
            .collect()
    }

    #[test]
    fn runtime_default_should_deny_with_eperm_by_default() {
        let p = runtime_default(&default_caps());
        assert_eq!(p.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(p.default_errno_ret(), Some(EPERM));
        if cfg!(target_arch = "x86_64") {
            assert_eq!(
                p.architectures().as_deref(),
                Some(&[Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32][..])
            );
        }
    }

    #[test]
    fn runtime_default_should_allow_ordinary_syscalls_unconditionally() {
        let p = runtime_default(&default_caps());
        for name in [
            "read", "openat", "execve", "mkdir", "chmod", "futex", "rseq",
        ] {
            let rules = allowed(&p, name);
            assert_eq!(rules.len(), 1, "{name}");
            assert!(rules[0].args().is_none(), "{name}");
        }
    }

    #[test]
    fn runtime_default_should_gate_namespace_syscalls_on_sys_admin() {
        let p = runtime_default(&default_caps());
        for name in [
            "unshare",
            "setns",
            "mount",
            "sethostname",
            "clone3",
            "bpf",
            "io_uring_setup",
        ] {
            assert!(
                allowed(&p, name).is_empty(),
                "{name} allowed without SYS_ADMIN"
            );
        }
        // clone: only without namespace flags; clone3: ENOSYS.
        let clone = allowed(&p, "clone");
        assert_eq!(clone.len(), 1);
        let a = clone[0].args().as_ref().expect("args")[0];
        assert_eq!(
            (a.index(), a.value(), a.op()),
            (
                0,
                CLONE_NAMESPACE_FLAGS,
                LinuxSeccompOperator::ScmpCmpMaskedEq
            )
        );
        assert_eq!(CLONE_NAMESPACE_FLAGS, 2_114_060_288);
        let clone3: Vec<_> = p
            .syscalls()
            .iter()
            .flatten()
            .filter(|s| s.names() == &["clone3".to_string()])
            .collect();
        assert_eq!(clone3.len(), 1);
        assert_eq!(clone3[0].action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(clone3[0].errno_ret(), Some(ENOSYS));

        let mut admin = default_caps();
        admin.insert(Capability::SysAdmin);
        let p = runtime_default(&admin);
        for name in [
            "unshare",
            "setns",
            "mount",
            "sethostname",
            "clone",
            "clone3",
        ] {
            let rules = allowed(&p, name);
            assert!(
                rules.iter().any(|r| r.args().is_none()),
                "{name} not allowed with SYS_ADMIN"
            );
        }
        assert!(!p
            .syscalls()
            .iter()
            .flatten()
            .any(|s| s.action() == LinuxSeccompAction::ScmpActErrno));
    }

    #[test]
    fn runtime_default_should_gate_other_syscalls_on_their_capability() {
        let p = runtime_default(&default_caps());
        // The default set has SYS_CHROOT but neither SYS_PTRACE nor SYS_TIME.
        assert_eq!(allowed(&p, "chroot").len(), 1);
        assert!(allowed(&p, "kcmp").is_empty());
        assert!(allowed(&p, "settimeofday").is_empty());
        let mut caps = default_caps();
        caps.extend([Capability::SysPtrace, Capability::SysTime]);
        let p = runtime_default(&caps);
        assert_eq!(allowed(&p, "kcmp").len(), 1);
        assert_eq!(allowed(&p, "settimeofday").len(), 1);
    }

    #[test]
    fn runtime_default_should_allow_only_common_personalities_and_socket_families() {
        let p = runtime_default(&default_caps());
        let personas: Vec<u64> = allowed(&p, "personality")
            .iter()
            .map(|r| {
                let args = r.args().as_ref().expect("args");
                assert_eq!(args.len(), 1);
                assert_eq!(args[0].op(), LinuxSeccompOperator::ScmpCmpEq);
                args[0].value()
            })
            .collect();
        assert_eq!(personas, PERSONAS);
        let socket = allowed(&p, "socket");
        assert_eq!(socket.len(), 1);
        let a = socket[0].args().as_ref().expect("args")[0];
        assert_eq!(
            (a.value(), a.op()),
            (AF_VSOCK, LinuxSeccompOperator::ScmpCmpNe)
        );
    }

    #[test]
    fn runtime_default_should_list_each_name_once_per_rule_set() {
        let mut seen = HashSet::new();
        for n in BASE {
            assert!(seen.insert(*n), "{n} twice in BASE");
        }
        for (_, names) in BY_CAPABILITY {
            for n in *names {
                assert!(!seen.contains(n), "{n} both in BASE and gated");
            }
        }
    }
}
