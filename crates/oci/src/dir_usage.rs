//! Disk usage of a directory tree, counted as `du` does: allocated blocks
//! (not apparent sizes) and inodes of the directory and everything below it
//! on the same filesystem, symlinks not followed. Used for the runtime's
//! writable-layer and image-filesystem figures and the agent's ephemeral
//! storage eviction.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Allocated bytes and inodes of a tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirUsage {
    /// Allocated bytes (512-byte blocks × 512).
    pub bytes: u64,
    /// Files, directories and other inodes, the top directory included.
    pub inodes: u64,
}

/// The usage of `dir` and everything below it (zero when it does not exist;
/// entries that vanish or cannot be read while walking are skipped).
pub fn dir_usage(dir: &Path) -> DirUsage {
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return DirUsage::default();
    };
    let dev = top.dev();
    let mut u = DirUsage {
        bytes: top.blocks().saturating_mul(512),
        inodes: 1,
    };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            // DirEntry::metadata does not follow symlinks.
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            u.inodes += 1;
            u.bytes = u.bytes.saturating_add(m.blocks().saturating_mul(512));
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_should_count_allocated_blocks_and_every_inode() -> std::io::Result<()> {
        let d = tempfile::tempdir()?;
        std::fs::create_dir(d.path().join("a"))?;
        std::fs::write(d.path().join("a/f"), vec![1u8; 100_000])?;
        std::os::unix::fs::symlink("/usr", d.path().join("link"))?;
        let u = dir_usage(d.path());
        // The top directory, a, a/f and the link (not followed).
        assert_eq!(u.inodes, 4);
        assert!(u.bytes >= 100_000 && u.bytes < 1_000_000, "{u:?}");
        // A sparse file counts what it allocates.
        let sparse = std::fs::File::create(d.path().join("sparse"))?;
        sparse.set_len(1 << 30)?;
        assert!(dir_usage(d.path()).bytes < 1_000_000);
        assert_eq!(dir_usage(&d.path().join("missing")), DirUsage::default());
        Ok(())
    }
}
