//! Who is on the other end of the unix socket: the peer's credentials as
//! the kernel recorded them at connect(2) (`SO_PEERCRED`, and
//! `SO_PEERGROUPS` for the supplementary groups), checked against the
//! socket's policy: root, or a member of the configured group. The
//! socket file's mode (0660, root and that group) already keeps others
//! out; this is the second lock.

use std::os::fd::AsFd;

/// Who may use the socket besides root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerPolicy {
    /// Members of this group (primary or supplementary) are admitted.
    pub group: Option<u32>,
}

/// A peer's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The peer's effective uid at connect time.
    pub uid: u32,
    /// Its effective gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
    /// Its pid (for logs only: it may be gone or reused).
    pub pid: i32,
}

impl PeerPolicy {
    /// None if `peer` may use the socket, else why not.
    pub fn refusal(&self, peer: &Peer) -> Option<String> {
        if peer.uid == 0 {
            return None;
        }
        match self.group {
            Some(g) if peer.gid == g || peer.groups.contains(&g) => None,
            Some(g) => Some(format!(
                "forbidden: uid {} is neither root nor a member of group {g}",
                peer.uid
            )),
            None => Some(format!(
                "forbidden: uid {} is not root (the agent socket admits root only; see --agent-socket-group)",
                peer.uid
            )),
        }
    }
}

/// The credentials of the peer of `sock`.
pub fn peer_of(sock: impl AsFd) -> std::io::Result<Peer> {
    let cred = rustix::net::sockopt::socket_peercred(&sock)?;
    Ok(Peer {
        uid: cred.uid.as_raw(),
        gid: cred.gid.as_raw(),
        groups: peer_groups(sock.as_fd())?,
        pid: cred.pid.as_raw_nonzero().get(),
    })
}

/// `SO_PEERGROUPS` (Linux 4.13): not in the libc crate for glibc targets;
/// 59 in asm-generic, which x86-64 and arm64 use.
const SO_PEERGROUPS: libc::c_int = 59;

/// The peer's supplementary groups, as recorded at connect(2).
#[allow(unsafe_code)]
fn peer_groups(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // JUSTIFICATION: rustix has no wrapper for SO_PEERGROUPS.
        // SAFETY: `fd` is a live socket borrowed for the call; the buffer
        // is `len` bytes of writable gid_t, and the kernel writes at most
        // `len` bytes, reporting the size it needs in `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let err = std::io::Error::last_os_error();
        // ERANGE: the buffer was too small; `len` says how big it must be.
        if err.raw_os_error() == Some(libc::ERANGE) && n > groups.len() {
            groups.resize(n, 0);
            continue;
        }
        return Err(err);
    }
}

/// Parses `--agent-socket-group`: a numeric gid, or a name looked up in
/// `group_file` (`/etc/group`; NSS sources such as LDAP are not asked).
pub fn resolve_group(spec: &str, group_file: &str) -> Result<u32, String> {
    if let Ok(gid) = spec.parse::<u32>() {
        return Ok(gid);
    }
    for line in group_file.lines() {
        let mut f = line.split(':');
        if f.next() == Some(spec) {
            if let Some(gid) = f.nth(1).and_then(|g| g.trim().parse().ok()) {
                return Ok(gid);
            }
        }
    }
    Err(format!(
        "unknown group {spec:?} (not a gid, not a name in /etc/group)"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
        Peer {
            uid,
            gid,
            groups: groups.to_vec(),
            pid: 1,
        }
    }

    #[test]
    fn root_and_group_members_should_be_admitted_and_others_refused() {
        let root_only = PeerPolicy::default();
        assert_eq!(root_only.refusal(&peer(0, 0, &[])), None);
        let e = root_only.refusal(&peer(1000, 0, &[0])).unwrap();
        assert!(e.contains("uid 1000"), "{e}");
        let group = PeerPolicy { group: Some(990) };
        assert_eq!(group.refusal(&peer(1000, 990, &[])), None);
        assert_eq!(group.refusal(&peer(1000, 1000, &[4, 990])), None);
        assert!(group.refusal(&peer(1000, 1000, &[4])).is_some());
    }

    #[test]
    fn groups_should_resolve_by_gid_or_name() {
        let file = "root:x:0:\npetrel:x:990:alice,bob\nbroken:x:\n";
        assert_eq!(resolve_group("990", file), Ok(990));
        assert_eq!(resolve_group("petrel", file), Ok(990));
        assert_eq!(resolve_group("root", file), Ok(0));
        assert!(resolve_group("broken", file).is_err());
        assert!(resolve_group("nobody-here", file)
            .unwrap_err()
            .contains("nobody-here"));
    }

    #[test]
    fn peer_of_should_see_our_own_credentials() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let p = peer_of(&a).unwrap();
        assert_eq!(p.uid, rustix::process::geteuid().as_raw());
        assert_eq!(p.gid, rustix::process::getegid().as_raw());
        assert_eq!(p.pid as u32, std::process::id());
        // Our supplementary groups, as the kernel has them.
        let mut mine: Vec<u32> = std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .unwrap()
            .split_whitespace()
            .map(|g| g.parse().unwrap())
            .collect();
        mine.sort();
        let mut got = p.groups.clone();
        got.sort();
        assert_eq!(got, mine);
    }
}
