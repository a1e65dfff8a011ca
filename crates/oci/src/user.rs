//! Resolving users and groups inside a container's root filesystem.
//!
//! A container's `/etc/passwd` and `/etc/group` belong to the image, which is
//! untrusted: they are opened with `openat2(RESOLVE_IN_ROOT)` relative to the
//! rootfs, so a symlink (absolute or full of `..`) can never lead to a file of
//! the host. Special files are refused, and files are read up to a size limit.
//!
//! User strings follow the image `User` field and containerd: `""` (root),
//! `uid`, `name`, `uid:gid`, `name:gid`, `uid:group` and `name:group`.

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};

/// The largest `/etc/passwd` or `/etc/group` we read (bigger is hostile or broken).
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// How often an `openat2` that raced with a rename or mount (`EAGAIN`) is retried.
const OPEN_RETRIES: usize = 8;

/// Errors while resolving a user inside a rootfs.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// A user name is not in the container's `/etc/passwd` (or the file is missing).
    #[error("user {user:?} not found in /etc/passwd of the container")]
    UnknownUser {
        /// The user name looked up.
        user: String,
    },
    /// A group name is not in the container's `/etc/group` (or the file is missing).
    #[error("group {group:?} not found in /etc/group of the container")]
    UnknownGroup {
        /// The group name looked up.
        group: String,
    },
    /// The user string itself is malformed (e.g. `":1"` or a uid above `u32::MAX`).
    #[error("invalid user {user:?}: {reason}")]
    Invalid {
        /// The user string as given.
        user: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file of the rootfs could not be opened or read.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The path concerned (on the host for the rootfs, inside it for its files).
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// How supplementary groups are computed (CRI `SupplementalGroupsPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupsPolicy {
    /// The primary group, the user's groups from the image's `/etc/group`, then
    /// the requested supplementary groups.
    #[default]
    Merge,
    /// Only the primary group and the requested supplementary groups.
    Strict,
}

/// The identity a container process runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
    /// Supplementary group ids, primary group first, without duplicates.
    pub additional_gids: Vec<u32>,
}

/// One line of `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    /// The login name.
    pub name: String,
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
    /// The home directory.
    pub home: String,
}

/// One line of `/etc/group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    /// The group name.
    pub name: String,
    /// The group id.
    pub gid: u32,
    /// User names listed as members.
    pub members: Vec<String>,
}

/// The user and group databases of one container rootfs; `None` when a file is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserDb {
    /// Entries of `/etc/passwd`, if the file exists.
    pub passwd: Option<Vec<PasswdEntry>>,
    /// Entries of `/etc/group`, if the file exists.
    pub group: Option<Vec<GroupEntry>>,
}

impl UserDb {
    /// Reads `/etc/passwd` and `/etc/group` of `rootfs`, never leaving it.
    pub fn load(rootfs: &Path) -> Result<Self, UserError> {
        let root = rustix::fs::open(
            rootfs,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| UserError::Io {
            op: "open rootfs",
            path: rootfs.to_path_buf(),
            source: e.into(),
        })?;
        let passwd = read_in_root(&root, "etc/passwd")?.map(|s| parse_passwd(&s));
        let group = read_in_root(&root, "etc/group")?.map(|s| parse_group(&s));
        Ok(Self { passwd, group })
    }

    /// Builds a database from file contents (`None` = file absent), for tests and callers
    /// that already hold the files.
    pub fn from_contents(passwd: Option<&str>, group: Option<&str>) -> Self {
        Self {
            passwd: passwd.map(parse_passwd),
            group: group.map(parse_group),
        }
    }

    /// The first passwd entry named `name`.
    pub fn user_by_name(&self, name: &str) -> Option<&PasswdEntry> {
        self.passwd.as_ref()?.iter().find(|e| e.name == name)
    }

    /// The first passwd entry with user id `uid`.
    pub fn user_by_uid(&self, uid: u32) -> Option<&PasswdEntry> {
        self.passwd.as_ref()?.iter().find(|e| e.uid == uid)
    }

    /// The first group entry named `name`.
    pub fn group_by_name(&self, name: &str) -> Option<&GroupEntry> {
        self.group.as_ref()?.iter().find(|e| e.name == name)
    }

    /// Ids of the groups listing `user` as a member, in file order.
    pub fn groups_of(&self, user: &str) -> Vec<u32> {
        self.group
            .iter()
            .flatten()
            .filter(|g| g.members.iter().any(|m| m == user))
            .map(|g| g.gid)
            .collect()
    }

    /// Resolves a user string (see the module docs) against this database.
    pub fn resolve(
        &self,
        user: &str,
        supplemental_groups: &[u32],
        policy: GroupsPolicy,
    ) -> Result<ResolvedUser, UserError> {
        let (user_part, group_part) = match user.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (user, None),
        };
        if user_part.is_empty() && group_part.is_some() {
            return Err(invalid(user, "the user part is empty"));
        }
        if group_part == Some("") {
            return Err(invalid(user, "the group part is empty"));
        }

        // Numeric users need no passwd entry; named users must have one.
        let (uid, entry) = if user_part.is_empty() {
            (0, self.user_by_uid(0))
        } else if is_numeric(user_part) {
            let uid = parse_id(user, user_part)?;
            (uid, self.user_by_uid(uid))
        } else {
            let entry = self
                .user_by_name(user_part)
                .ok_or_else(|| UserError::UnknownUser {
                    user: user_part.to_string(),
                })?;
            (entry.uid, Some(entry))
        };

        let gid = match group_part {
            Some(g) if is_numeric(g) => parse_id(user, g)?,
            Some(g) => {
                self.group_by_name(g)
                    .ok_or_else(|| UserError::UnknownGroup {
                        group: g.to_string(),
                    })?
                    .gid
            }
            None => entry.map_or(0, |e| e.gid),
        };

        let mut additional_gids = vec![gid];
        if policy == GroupsPolicy::Merge {
            if let Some(e) = entry {
                push_unique(&mut additional_gids, self.groups_of(&e.name));
            }
        }
        push_unique(&mut additional_gids, supplemental_groups.iter().copied());
        Ok(ResolvedUser {
            uid,
            gid,
            additional_gids,
        })
    }
}

/// Resolves `user` (image `User` syntax, `""` = root) inside `rootfs`.
///
/// The primary gid comes from the group part, else the user's passwd entry, else 0.
/// `additional_gids` holds the primary gid, then (with [`GroupsPolicy::Merge`]) the
/// groups of `/etc/group` listing the user, then `supplemental_groups`.
pub fn resolve_user(
    rootfs: &Path,
    user: &str,
    supplemental_groups: &[u32],
    policy: GroupsPolicy,
) -> Result<ResolvedUser, UserError> {
    UserDb::load(rootfs)?.resolve(user, supplemental_groups, policy)
}

/// Parses `/etc/passwd`; malformed lines, comments and NIS `+`/`-` lines are skipped.
pub fn parse_passwd(contents: &str) -> Vec<PasswdEntry> {
    contents
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with(['#', '+', '-']))
        .filter_map(|line| {
            let mut f = line.split(':');
            let name = f.next()?;
            let _password = f.next()?;
            let uid = f.next()?.trim().parse().ok()?;
            let gid = f.next()?.trim().parse().ok()?;
            let _gecos = f.next();
            let home = f.next().unwrap_or_default();
            (!name.is_empty()).then(|| PasswdEntry {
                name: name.to_string(),
                uid,
                gid,
                home: home.to_string(),
            })
        })
        .collect()
}

/// Parses `/etc/group`; malformed lines, comments and NIS `+`/`-` lines are skipped.
pub fn parse_group(contents: &str) -> Vec<GroupEntry> {
    contents
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with(['#', '+', '-']))
        .filter_map(|line| {
            let mut f = line.split(':');
            let name = f.next()?;
            let _password = f.next()?;
            let gid = f.next()?.trim().parse().ok()?;
            let members = f
                .next()
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect();
            (!name.is_empty()).then(|| GroupEntry {
                name: name.to_string(),
                gid,
                members,
            })
        })
        .collect()
}

/// Reads `rel` (relative to the rootfs) with every path component resolved inside
/// the rootfs. `Ok(None)` when it does not exist.
fn read_in_root(root: &OwnedFd, rel: &str) -> Result<Option<String>, UserError> {
    let path = || Path::new("/").join(rel);
    let io_err = |op, e: io::Error| UserError::Io {
        op,
        path: path(),
        source: e,
    };
    // NONBLOCK so that a FIFO planted by the image cannot hang us; it is refused below.
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
    let mut attempt = 0;
    let fd = loop {
        match rustix::fs::openat2(root, rel, flags, Mode::empty(), resolve) {
            Ok(fd) => break fd,
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => return Ok(None),
            Err(rustix::io::Errno::AGAIN) if attempt < OPEN_RETRIES => attempt += 1,
            Err(e) => return Err(io_err("open", e.into())),
        }
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| io_err("stat", e.into()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(io_err(
            "read",
            io::Error::new(io::ErrorKind::InvalidData, "not a regular file"),
        ));
    }
    let mut buf = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| io_err("read", e))?;
    if buf.len() as u64 > MAX_FILE_BYTES {
        return Err(io_err(
            "read",
            io::Error::new(io::ErrorKind::InvalidData, "file too large"),
        ));
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

fn is_numeric(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn parse_id(user: &str, s: &str) -> Result<u32, UserError> {
    s.parse()
        .map_err(|_| invalid(user, &format!("id {s} is out of range")))
}

fn invalid(user: &str, reason: &str) -> UserError {
    UserError::Invalid {
        user: user.to_string(),
        reason: reason.to_string(),
    }
}

fn push_unique(list: &mut Vec<u32>, more: impl IntoIterator<Item = u32>) {
    for id in more {
        if !list.contains(&id) {
            list.push(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/sh
# a comment
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
app:x:1000:1001:App:/home/app:/bin/sh
broken-line
nis:x:notanumber:1::/:/bin/sh
+nisplus
";
    const GROUP: &str = "\
root:x:0:
wheel:x:10:root,app
app:x:1001:
video:x:44:app
audio:x:29: daemon , app
";

    fn db() -> UserDb {
        UserDb::from_contents(Some(PASSWD), Some(GROUP))
    }

    fn rootfs_with(passwd: Option<&str>, group: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("etc")).expect("mkdir etc");
        if let Some(p) = passwd {
            fs::write(dir.path().join("etc/passwd"), p).expect("write passwd");
        }
        if let Some(g) = group {
            fs::write(dir.path().join("etc/group"), g).expect("write group");
        }
        dir
    }

    #[test]
    fn parse_passwd_should_skip_comments_and_malformed_lines() {
        let entries = parse_passwd(PASSWD);
        let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["root", "daemon", "app"]);
        assert_eq!(entries[2].uid, 1000);
        assert_eq!(entries[2].gid, 1001);
        assert_eq!(entries[2].home, "/home/app");
    }

    #[test]
    fn parse_group_should_read_trimmed_members() {
        let groups = parse_group(GROUP);
        assert_eq!(groups.len(), 5);
        assert_eq!(groups[4].members, ["daemon", "app"]);
        assert!(groups[0].members.is_empty());
    }

    #[test]
    fn resolve_should_default_to_root() {
        let u = db().resolve("", &[], GroupsPolicy::Merge).expect("resolve");
        assert_eq!((u.uid, u.gid), (0, 0));
        assert_eq!(u.additional_gids, [0, 10]);
    }

    #[test]
    fn resolve_should_take_gid_and_groups_of_a_named_user() {
        let u = db()
            .resolve("app", &[], GroupsPolicy::Merge)
            .expect("resolve");
        assert_eq!((u.uid, u.gid), (1000, 1001));
        assert_eq!(u.additional_gids, [1001, 10, 44, 29]);
    }

    #[test]
    fn resolve_should_look_up_the_passwd_entry_of_a_numeric_uid() {
        let u = db()
            .resolve("1000", &[], GroupsPolicy::Merge)
            .expect("resolve");
        assert_eq!((u.uid, u.gid), (1000, 1001));
        assert_eq!(u.additional_gids, [1001, 10, 44, 29]);
    }

    #[test]
    fn resolve_should_use_gid_zero_for_an_unknown_numeric_uid() {
        let u = db()
            .resolve("4242", &[], GroupsPolicy::Merge)
            .expect("resolve");
        assert_eq!((u.uid, u.gid), (4242, 0));
        assert_eq!(u.additional_gids, [0]);
    }

    #[test]
    fn resolve_should_take_an_explicit_numeric_group() {
        let u = db()
            .resolve("app:5", &[], GroupsPolicy::Merge)
            .expect("resolve");
        assert_eq!((u.uid, u.gid), (1000, 5));
        assert_eq!(u.additional_gids, [5, 10, 44, 29]);
        let u = db()
            .resolve("7:8", &[], GroupsPolicy::Merge)
            .expect("resolve");
        assert_eq!((u.uid, u.gid), (7, 8));
    }

    #[test]
    fn resolve_should_look_up_a_named_group() {
        let u = db()
            .resolve("1000:video", &[], GroupsPolicy::Merge)
            .expect("resolve");
        assert_eq!((u.uid, u.gid), (1000, 44));
        let u = db()
            .resolve("daemon:audio", &[], GroupsPolicy::Merge)
            .expect("resolve");
        assert_eq!((u.uid, u.gid), (1, 29));
    }

    #[test]
    fn resolve_should_reject_unknown_names() {
        let err = db()
            .resolve("nobody", &[], GroupsPolicy::Merge)
            .expect_err("should fail");
        assert!(
            matches!(&err, UserError::UnknownUser { user } if user == "nobody"),
            "{err}"
        );
        let err = db()
            .resolve("app:nogroup", &[], GroupsPolicy::Merge)
            .expect_err("should fail");
        assert!(
            matches!(&err, UserError::UnknownGroup { group } if group == "nogroup"),
            "{err}"
        );
    }

    #[test]
    fn resolve_should_reject_malformed_strings() {
        for bad in [":1", "app:", "99999999999", "1:99999999999"] {
            let err = db()
                .resolve(bad, &[], GroupsPolicy::Merge)
                .expect_err("should fail");
            assert!(matches!(err, UserError::Invalid { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn resolve_should_append_supplemental_groups_without_duplicates() {
        let u = db()
            .resolve("app", &[44, 5000, 5000], GroupsPolicy::Merge)
            .expect("resolve");
        assert_eq!(u.additional_gids, [1001, 10, 44, 29, 5000]);
    }

    #[test]
    fn resolve_should_ignore_etc_group_with_strict_policy() {
        let u = db()
            .resolve("app", &[5000], GroupsPolicy::Strict)
            .expect("resolve");
        assert_eq!(u.additional_gids, [1001, 5000]);
    }

    #[test]
    fn resolve_user_should_read_files_of_the_rootfs() {
        let root = rootfs_with(Some(PASSWD), Some(GROUP));
        let u = resolve_user(root.path(), "app", &[], GroupsPolicy::Merge).expect("resolve");
        assert_eq!((u.uid, u.gid), (1000, 1001));
        assert_eq!(u.additional_gids, [1001, 10, 44, 29]);
    }

    #[test]
    fn resolve_user_should_accept_numeric_users_without_passwd() {
        let root = rootfs_with(None, None);
        let u = resolve_user(root.path(), "123:456", &[7], GroupsPolicy::Merge).expect("resolve");
        assert_eq!((u.uid, u.gid), (123, 456));
        assert_eq!(u.additional_gids, [456, 7]);
        let u = resolve_user(root.path(), "", &[], GroupsPolicy::Merge).expect("resolve");
        assert_eq!((u.uid, u.gid), (0, 0));
        // Not even an /etc directory.
        let empty = tempfile::tempdir().expect("tempdir");
        let u = resolve_user(empty.path(), "5", &[], GroupsPolicy::Merge).expect("resolve");
        assert_eq!((u.uid, u.gid), (5, 0));
    }

    #[test]
    fn resolve_user_should_name_the_user_when_passwd_is_missing() {
        let root = rootfs_with(None, None);
        let err =
            resolve_user(root.path(), "app", &[], GroupsPolicy::Merge).expect_err("should fail");
        assert!(err.to_string().contains("\"app\""), "{err}");
    }

    #[test]
    fn resolve_user_should_not_follow_an_absolute_symlink_to_the_host() {
        // /etc/passwd -> /etc/passwd resolves to itself inside the rootfs (a loop),
        // never to the host's file, whose root entry would otherwise be found.
        let root = rootfs_with(None, None);
        std::os::unix::fs::symlink("/etc/passwd", root.path().join("etc/passwd")).expect("symlink");
        let res = resolve_user(root.path(), "root", &[], GroupsPolicy::Merge);
        assert!(matches!(res, Err(UserError::Io { .. })), "{res:?}");
    }

    #[test]
    fn resolve_user_should_resolve_symlinks_inside_the_rootfs() {
        let root = rootfs_with(None, Some(GROUP));
        fs::write(
            root.path().join("etc/passwd.real"),
            "only:x:77:88::/:/bin/sh\n",
        )
        .expect("write");
        // Absolute and escaping relative targets both land inside the rootfs.
        std::os::unix::fs::symlink("/etc/passwd.real", root.path().join("etc/passwd"))
            .expect("symlink");
        let u = resolve_user(root.path(), "only", &[], GroupsPolicy::Merge).expect("resolve");
        assert_eq!((u.uid, u.gid), (77, 88));
        assert!(resolve_user(root.path(), "root", &[], GroupsPolicy::Merge).is_err());

        fs::remove_file(root.path().join("etc/passwd")).expect("rm");
        std::os::unix::fs::symlink(
            "../../../../../../etc/passwd.real",
            root.path().join("etc/passwd"),
        )
        .expect("symlink");
        let u = resolve_user(root.path(), "only", &[], GroupsPolicy::Merge).expect("resolve");
        assert_eq!(u.uid, 77);
    }

    #[test]
    fn resolve_user_should_not_follow_a_symlinked_etc_out_of_the_rootfs() {
        let root = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink("/etc", root.path().join("etc")).expect("symlink");
        // Inside the rootfs, /etc -> /etc is a loop: an error, never the host's file.
        let err =
            resolve_user(root.path(), "root", &[], GroupsPolicy::Merge).expect_err("should fail");
        assert!(matches!(err, UserError::Io { .. }), "{err}");
    }

    #[test]
    fn resolve_user_should_refuse_a_fifo() {
        let root = rootfs_with(None, None);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.path().join("etc/passwd"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        let err =
            resolve_user(root.path(), "root", &[], GroupsPolicy::Merge).expect_err("should fail");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}
