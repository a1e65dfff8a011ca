//! Tests of the unpacker: a raw tar builder (hostile names need raw
//! headers), a sandbox with sentinels around the layer root, and the
//! containment invariant every hostile case is checked against.

mod corpus;
mod features;
mod fuzz;
mod gnu_tar;
mod hostile;
mod model;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs as rfs;
use tar::EntryType;

use super::{unpack_layer, UnpackStats};
use crate::ImageError;

/// One tar entry of a test archive. Names and targets are written raw (GNU
/// long-name records beyond 100 bytes), so `..`, absolute and huge names
/// reach the unpacker as given. `$OUT` and `$ROOT` stand for the absolute
/// host paths of the sandbox's outside directory and of the layer root.
#[derive(Clone, Debug)]
pub(super) enum E {
    Dir(String),
    File(String),
    Sym(String, String),
    Hard(String, String),
    Fifo(String),
}

impl E {
    fn name(&self) -> &str {
        match self {
            E::Dir(n) | E::File(n) | E::Sym(n, _) | E::Hard(n, _) | E::Fifo(n) => n,
        }
    }
}

pub(super) fn raw_header(
    kind: EntryType,
    name: &[u8],
    link: &[u8],
    size: u64,
    mode: u32,
) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_000_000);
    let old = h.as_old_mut();
    let n = name.len().min(old.name.len());
    old.name[..n].copy_from_slice(&name[..n]);
    let l = link.len().min(old.linkname.len());
    old.linkname[..l].copy_from_slice(&link[..l]);
    h.set_cksum();
    h
}

/// A tar archive built in memory.
pub(super) struct Tb(pub tar::Builder<Vec<u8>>);

impl Tb {
    pub fn new() -> Self {
        Tb(tar::Builder::new(Vec::new()))
    }

    /// A GNU long name (`L`) or long link (`K`) record for the next entry.
    fn long(&mut self, kind: EntryType, value: &[u8]) {
        let mut data = value.to_vec();
        data.push(0);
        let h = raw_header(kind, b"././@LongLink", b"", data.len() as u64, 0o644);
        self.0
            .append(&h, &data[..])
            .expect("append to in-memory tar");
    }

    pub fn add(
        &mut self,
        kind: EntryType,
        name: &str,
        link: &str,
        data: &[u8],
        mode: u32,
    ) -> &mut Self {
        if name.len() > 100 {
            self.long(EntryType::GNULongName, name.as_bytes());
        }
        if link.len() > 100 {
            self.long(EntryType::GNULongLink, link.as_bytes());
        }
        let h = raw_header(
            kind,
            name.as_bytes(),
            link.as_bytes(),
            data.len() as u64,
            mode,
        );
        self.0.append(&h, data).expect("append to in-memory tar");
        self
    }
    pub fn dir(&mut self, name: &str) -> &mut Self {
        self.add(EntryType::Directory, name, "", b"", 0o755)
    }
    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.add(EntryType::Regular, name, "", data, 0o644)
    }
    pub fn sym(&mut self, name: &str, target: &str) -> &mut Self {
        self.add(EntryType::Symlink, name, target, b"", 0o777)
    }
    pub fn hard(&mut self, name: &str, target: &str) -> &mut Self {
        self.add(EntryType::Link, name, target, b"", 0o644)
    }
    pub fn bytes(self) -> Vec<u8> {
        self.0.into_inner().expect("finish in-memory tar")
    }
}

/// Metadata of one path outside the root, as compared before and after.
type Snap = BTreeMap<PathBuf, String>;

/// A temp directory with the layer root inside it, sentinels around it (a
/// sibling directory with a secret file, a file beside the root, a symlink
/// into the root) that no layer may touch. Removed on drop, also when a
/// test fails.
pub(super) struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("petrel-unpack-")
            .tempdir()
            .expect("tempdir");
        let p = dir.path();
        std::fs::create_dir(p.join("root")).expect("create root");
        std::fs::create_dir(p.join("outside")).expect("create outside");
        std::fs::write(p.join("outside/secret"), b"secret").expect("write sentinel");
        std::fs::write(p.join("beside"), b"beside").expect("write sentinel");
        std::os::unix::fs::symlink("../root", p.join("outside/to-root")).expect("symlink");
        Sandbox { dir }
    }
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    pub fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }
    /// Substitutes `$OUT` and `$ROOT` in a name or link target.
    pub fn expand(&self, s: &str) -> String {
        s.replace("$OUT", &self.outside().display().to_string())
            .replace("$ROOT", &self.root().display().to_string())
            .replace("$LONG", &"l".repeat(300))
    }
    pub fn unpack(&self, tar: &[u8]) -> Result<UnpackStats, ImageError> {
        unpack_layer(tar, &self.root(), &crate::Limits::default())
    }
    /// Everything outside the layer root (the sandbox directory itself
    /// included): type, mode, owner, links, size, mtime, content or link
    /// target.
    pub fn snapshot_outside(&self) -> Snap {
        let mut out = BTreeMap::new();
        out.insert(self.dir.path().to_path_buf(), describe(self.dir.path()));
        walk(self.dir.path(), &self.root(), &mut out);
        out
    }

    /// Builds the archive of `entries` (names expanded; each file's
    /// content is its entry index, so the checker can tell which entry
    /// wrote it).
    pub fn archive(&self, entries: &[E]) -> Vec<u8> {
        let mut tb = Tb::new();
        for (i, e) in entries.iter().enumerate() {
            let x = |s: &str| self.expand(s);
            match e {
                E::Dir(n) => tb.dir(&x(n)),
                E::File(n) => tb.file(&x(n), tag(i).as_bytes()),
                E::Sym(n, t) => tb.sym(&x(n), &x(t)),
                E::Hard(n, t) => tb.hard(&x(n), &x(t)),
                E::Fifo(n) => tb.add(EntryType::Fifo, &x(n), "", b"", 0o644),
            };
        }
        tb.bytes()
    }

    /// Unpacks `entries` and checks the containment invariant whatever the
    /// outcome; returns the outcome.
    pub fn run_and_check(&self, entries: &[E]) -> Result<UnpackStats, ImageError> {
        let before = self.snapshot_outside();
        let tar = self.archive(entries);
        let res = self.unpack(&tar);
        assert_eq!(
            self.snapshot_outside(),
            before,
            "something outside the root changed: {entries:?} -> {res:?}"
        );
        self.check_no_symlink_followed(entries, &res);
        res
    }

    /// Everything in the root must have been made under its own name: a
    /// path that is no entry's name (nor a parent of one, nor the name a
    /// whiteout hides) could only come from writing through a symlink,
    /// even one resolved inside the root. A file's content names the entry
    /// that wrote it, which must be an entry of that name (or a hard link
    /// of that name sharing its inode).
    fn check_no_symlink_followed(&self, entries: &[E], res: &Result<UnpackStats, ImageError>) {
        let mut allowed = BTreeSet::new();
        let mut named: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, e) in entries.iter().enumerate() {
            let Some(c) = lexical_clean(&self.expand(e.name())) else {
                continue;
            };
            let mut c = c;
            if let Some(hidden) = c
                .last()
                .and_then(|l| l.strip_prefix(".wh."))
                .map(str::to_string)
            {
                c.pop();
                c.push(hidden);
            }
            for k in 1..=c.len() {
                allowed.insert(c[..k].join("/"));
            }
            named.entry(c.join("/")).or_default().push(i);
        }
        let mut found = Vec::new();
        list_tree(&self.root(), "", &mut found);
        for (rel, meta) in found {
            assert!(
                allowed.contains(&rel),
                "{rel:?} is no entry's name (written through a symlink?): {entries:?} -> {res:?}"
            );
            let here = named.get(&rel).cloned().unwrap_or_default();
            let has_hard = here.iter().any(|i| matches!(entries[*i], E::Hard(..)));
            if meta.file_type().is_file() && !has_hard {
                let data = std::fs::read(self.root().join(&rel)).expect("read unpacked file");
                let ok = here
                    .iter()
                    .any(|i| matches!(entries[*i], E::File(_)) && tag(*i).as_bytes() == data);
                assert!(
                    ok,
                    "{rel:?} holds {:?}, written by another entry: {entries:?} -> {res:?}",
                    String::from_utf8_lossy(&data)
                );
            }
            if meta.file_type().is_symlink() {
                assert!(
                    here.iter()
                        .any(|i| matches!(entries[*i], E::Sym(..) | E::Hard(..))),
                    "symlink {rel:?} made by no symlink entry: {entries:?} -> {res:?}"
                );
            }
        }
    }
}

/// A file entry's content.
fn tag(i: usize) -> String {
    format!("entry #{i}")
}

/// The test's own lexical cleaning (independent of the unpacker's):
/// `None` for a name climbing above the root.
fn lexical_clean(name: &str) -> Option<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            c => out.push(c.to_string()),
        }
    }
    Some(out)
}

fn list_tree(dir: &Path, rel: &str, out: &mut Vec<(String, std::fs::Metadata)>) {
    for e in std::fs::read_dir(dir).expect("read dir") {
        let e = e.expect("dir entry");
        let name = e.file_name().to_string_lossy().into_owned();
        let r = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let m = std::fs::symlink_metadata(e.path()).expect("lstat");
        if m.is_dir() {
            list_tree(&e.path(), &r, out);
        }
        out.push((r, m));
    }
}

fn describe(p: &Path) -> String {
    let m = std::fs::symlink_metadata(p).expect("lstat");
    let content = if m.is_file() {
        String::from_utf8_lossy(&std::fs::read(p).expect("read")).into_owned()
    } else if m.file_type().is_symlink() {
        std::fs::read_link(p)
            .expect("readlink")
            .display()
            .to_string()
    } else {
        String::new()
    };
    format!(
        "mode {:o} owner {}:{} links {} size {} mtime {}.{} dev {} {content:?}",
        m.mode(),
        m.uid(),
        m.gid(),
        m.nlink(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.file_type().is_char_device() as u8,
    )
}

fn walk(dir: &Path, skip: &Path, out: &mut Snap) {
    for e in std::fs::read_dir(dir).expect("read dir") {
        let p = e.expect("dir entry").path();
        if p == skip {
            continue;
        }
        out.insert(p.clone(), describe(&p));
        if std::fs::symlink_metadata(&p).expect("lstat").is_dir() {
            walk(&p, skip, out);
        }
    }
}

pub(super) fn xattr(p: &Path, name: &str) -> rustix::io::Result<Vec<u8>> {
    let mut buf = [0u8; 256];
    let n = rfs::lgetxattr(p, name, &mut buf)?;
    Ok(buf[..n].to_vec())
}

pub(super) fn is_unsafe(r: &Result<UnpackStats, ImageError>) -> bool {
    matches!(r, Err(ImageError::UnsafeEntry { .. }))
}
