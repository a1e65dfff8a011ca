//! A directory whose files change all at once, as kubelet's AtomicWriter
//! keeps its secret, configMap and downwardAPI volumes: a reader (a
//! container) sees the old files or the new, never a mix.
//!
//! ```text
//! <dir>/labels -> ..data/labels                 one link per top-level name
//! <dir>/..data -> ..2026_11_27_18_00_00.123456  swapped with one rename(2)
//! <dir>/..2026_11_27_18_00_00.123456/labels     the files, with their modes
//! ```
//!
//! A write makes a new timestamped directory with every file, points a
//! `..data_tmp` link at it and renames that over `..data`; then it adds
//! the links of new top-level names, removes those of names gone and the
//! old directory. A payload equal to what `..data` shows writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The link the readers go through.
const DATA: &str = "..data";
/// The new link before it is renamed over [`DATA`].
const DATA_TMP: &str = "..data_tmp";

/// One file of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// Its content.
    pub data: Vec<u8>,
    /// Its permission bits (0o644, say).
    pub mode: u32,
}

/// Relative file paths (normal components only) and their files.
pub type Payload = BTreeMap<PathBuf, FileProjection>;

fn io_at(op: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

/// The first component of each path: the names readers see in `dir`.
fn top_names(payload: &Payload) -> BTreeSet<OsString> {
    payload
        .keys()
        .filter_map(|p| p.components().next())
        .map(|c| c.as_os_str().to_os_string())
        .collect()
}

/// Does the directory `ts` hold exactly `payload` (files, contents and
/// modes)?
fn holds(ts: &Path, payload: &Payload) -> bool {
    let mut found = Vec::new();
    if list_files(ts, Path::new(""), &mut found).is_err() || found.len() != payload.len() {
        return false;
    }
    payload.iter().all(|(rel, want)| {
        let path = ts.join(rel);
        match (fs::symlink_metadata(&path), fs::read(&path)) {
            (Ok(md), Ok(data)) => {
                md.is_file() && md.permissions().mode() & 0o7777 == want.mode && data == want.data
            }
            _ => false,
        }
    })
}

/// Every regular file under `dir` (relative to it, with `prefix`).
fn list_files(dir: &Path, prefix: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let ft = e.file_type()?;
        let rel = prefix.join(e.file_name());
        if ft.is_dir() {
            list_files(&e.path(), &rel, out)?;
        } else {
            out.push(rel);
        }
    }
    Ok(())
}

/// Checks that `rel` has only normal components (the caller validated it;
/// this keeps a write inside its directory whatever it is given).
fn check_relative(rel: &Path) -> io::Result<()> {
    let normal = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if normal && rel.components().next().is_some() {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("payload path {} is not a relative path", rel.display()),
        ))
    }
}

/// A new timestamped directory in `dir`, 0755; returns its name.
fn new_ts_dir(dir: &Path) -> io::Result<String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let stamp = i128::try_from(nanos)
        .ok()
        .and_then(|n| k8s_openapi::jiff::Timestamp::from_nanosecond(n).ok())
        .map(|t| t.strftime("%Y_%m_%d_%H_%M_%S").to_string())
        .unwrap_or_else(|| "1970_01_01_00_00_00".to_string());
    loop {
        let name = format!("..{stamp}.{:09}", rand::random::<u32>() % 1_000_000_000);
        let path = dir.join(&name);
        match fs::DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => {
                // The umask may have narrowed it.
                fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
                    .map_err(|e| io_at("chmod", &path, e))?;
                return Ok(name);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_at("create", &path, e)),
        }
    }
}

/// Gives `path` (not following a link) group `gid`, and a directory the
/// setgid bit and read and search for the group, as kubelet's volume
/// ownership does for read-only volumes (a file's mode was set already).
fn own(path: &Path, gid: u32) -> io::Result<()> {
    std::os::unix::fs::lchown(path, None, Some(gid)).map_err(|e| io_at("chown", path, e))?;
    let md = fs::symlink_metadata(path).map_err(|e| io_at("stat", path, e))?;
    if md.is_dir() {
        let mode = md.permissions().mode() | 0o2550;
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| io_at("chmod", path, e))?;
    }
    Ok(())
}

/// [`own`] of `dir` and everything under it (links not followed).
fn own_tree(dir: &Path, gid: u32) -> io::Result<()> {
    own(dir, gid)?;
    for e in fs::read_dir(dir).map_err(|e| io_at("list", dir, e))? {
        let e = e.map_err(|e| io_at("list", dir, e))?;
        if e.file_type()
            .map_err(|err| io_at("stat", &e.path(), err))?
            .is_dir()
        {
            own_tree(&e.path(), gid)?;
        } else {
            own(&e.path(), gid)?;
        }
    }
    Ok(())
}

/// Writes the payload's files under `ts` (a new, empty directory).
fn write_files(ts: &Path, payload: &Payload) -> io::Result<()> {
    for (rel, file) in payload {
        check_relative(rel)?;
        let path = ts.join(rel);
        if let Some(parent) = path.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| io_at("create", parent, e))?;
        }
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| io_at("create", &path, e))?;
        f.write_all(&file.data)
            .map_err(|e| io_at("write", &path, e))?;
        // Set on the open file: its mode whatever the umask.
        f.set_permissions(fs::Permissions::from_mode(file.mode))
            .map_err(|e| io_at("chmod", &path, e))?;
    }
    Ok(())
}

/// Makes `dir` (created 0755 if missing) show exactly `payload`, all at
/// once, every file and directory of the new version (and `dir`) in group
/// `gid` when given (a pod's `fsGroup`; the payload's modes carry the
/// group's read bits already). Returns whether anything was written (an
/// equal payload is not).
pub fn write(dir: &Path, payload: &Payload, gid: Option<u32>) -> io::Result<bool> {
    if !dir.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| io_at("create", dir, e))?;
    }
    let data = dir.join(DATA);
    let old = fs::read_link(&data).ok();
    let old_names = match &old {
        Some(ts) if holds(&dir.join(ts), payload) => {
            // Unchanged; the links may still be missing (a crash between
            // the swap and their creation).
            link_names(dir, &top_names(payload))?;
            return Ok(false);
        }
        Some(ts) => {
            let mut files = Vec::new();
            if let Err(e) = list_files(&dir.join(ts), Path::new(""), &mut files) {
                // Its links are kept then: a link to nothing, not a risk.
                tracing::warn!(path = %dir.join(ts).display(), error = %e, "reading the old volume version failed");
            }
            files
                .iter()
                .filter_map(|p| p.components().next())
                .map(|c| c.as_os_str().to_os_string())
                .collect()
        }
        None => BTreeSet::new(),
    };

    let ts = new_ts_dir(dir)?;
    let written = write_files(&dir.join(&ts), payload).and_then(|()| match gid {
        Some(g) => own(dir, g).and_then(|()| own_tree(&dir.join(&ts), g)),
        None => Ok(()),
    });
    if let Err(e) = written {
        if let Err(rm) = fs::remove_dir_all(dir.join(&ts)) {
            tracing::warn!(path = %dir.join(&ts).display(), error = %rm, "removing a half-written volume version failed");
        }
        return Err(e);
    }
    let tmp = dir.join(DATA_TMP);
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_at("remove", &tmp, e)),
    }
    std::os::unix::fs::symlink(&ts, &tmp).map_err(|e| io_at("link", &tmp, e))?;
    // The swap: readers see the old files or the new.
    fs::rename(&tmp, &data).map_err(|e| io_at("rename", &tmp, e))?;

    let names = top_names(payload);
    link_names(dir, &names)?;
    for gone in old_names.difference(&names) {
        let link = dir.join(gone);
        if fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            fs::remove_file(&link).map_err(|e| io_at("remove", &link, e))?;
        }
    }
    if let Some(old) = old {
        let old = dir.join(old);
        if let Err(e) = fs::remove_dir_all(&old) {
            tracing::warn!(path = %old.display(), error = %e, "removing an old volume version failed");
        }
    }
    Ok(true)
}

/// Makes the link `<dir>/<name> -> ..data/<name>` of each name that has
/// none.
fn link_names(dir: &Path, names: &BTreeSet<OsString>) -> io::Result<()> {
    for name in names {
        let link = dir.join(name);
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA).join(name), &link)
                .map_err(|e| io_at("link", &link, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| {
                (
                    PathBuf::from(p),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    fn ts_dirs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("..") && n != DATA)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn write_should_swap_the_data_link_and_link_top_level_names() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let first = payload(&[("name", "web", 0o644), ("sub/dir/uid", "u1", 0o400)]);
        assert!(write(&dir, &first, None).unwrap());
        assert_eq!(fs::read_to_string(dir.join("name")).unwrap(), "web");
        assert_eq!(fs::read_to_string(dir.join("sub/dir/uid")).unwrap(), "u1");
        assert_eq!(
            fs::read_link(dir.join("sub")).unwrap(),
            PathBuf::from("..data/sub")
        );
        let ts = fs::read_link(dir.join(DATA)).unwrap();
        let ts = ts.to_str().unwrap().to_string();
        // `..YYYY_MM_DD_HH_MM_SS.<random>`
        assert_eq!(ts.len(), "..2026_11_27_18_00_00.".len() + 9, "{ts}");
        assert_eq!(ts_dirs(&dir), std::slice::from_ref(&ts));
        let mode = |p: &str| fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("name"), 0o644);
        assert_eq!(mode("sub/dir/uid"), 0o400);
        assert_eq!(mode(&ts), 0o755);

        // The same again: nothing written.
        assert!(!write(&dir, &first, None).unwrap());
        assert_eq!(ts_dirs(&dir), std::slice::from_ref(&ts));

        // A change: a new version, the old one and links of names gone
        // removed.
        let second = payload(&[("name", "web2", 0o600), ("labels", "a=\"b\"", 0o644)]);
        assert!(write(&dir, &second, None).unwrap());
        assert_eq!(fs::read_to_string(dir.join("name")).unwrap(), "web2");
        assert_eq!(mode("name"), 0o600);
        assert_eq!(fs::read_to_string(dir.join("labels")).unwrap(), "a=\"b\"");
        assert!(fs::symlink_metadata(dir.join("sub")).is_err());
        let now = ts_dirs(&dir);
        assert_eq!(now.len(), 1);
        assert_ne!(now[0], ts);
        assert!(!dir.join(DATA_TMP).exists());

        // A mode change alone is a change.
        let third = payload(&[("name", "web2", 0o644), ("labels", "a=\"b\"", 0o644)]);
        assert!(write(&dir, &third, None).unwrap());
        assert_eq!(mode("name"), 0o644);
    }

    #[test]
    fn write_should_refuse_paths_that_leave_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        for bad in ["../x", "/etc/x", "a/../../x"] {
            let err = write(&dir, &payload(&[(bad, "x", 0o644)]), None).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
        assert!(!tmp.path().join("x").exists());
        assert_eq!(
            ts_dirs(&dir),
            Vec::<String>::new(),
            "the attempt left nothing"
        );
    }

    #[test]
    fn write_should_restore_missing_links_of_an_unchanged_payload() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("vol");
        let p = payload(&[("name", "web", 0o644)]);
        write(&dir, &p, None).unwrap();
        fs::remove_file(dir.join("name")).unwrap();
        assert!(!write(&dir, &p, None).unwrap());
        assert_eq!(fs::read_to_string(dir.join("name")).unwrap(), "web");
    }
}
