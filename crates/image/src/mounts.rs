//! Finding the mount point of the filesystem that holds a path.

use std::path::{Path, PathBuf};

/// The longest mount point in `/proc/self/mountinfo` that contains `path`
/// (which should be canonical); `/` if mountinfo cannot be read.
pub(crate) fn mountpoint_of(path: &Path) -> PathBuf {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return PathBuf::from("/");
    };
    longest_mount(&info, path)
}

fn longest_mount(info: &str, path: &Path) -> PathBuf {
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape(m)))
        .filter(|m| path.starts_with(m))
        .max_by_key(|m| m.components().count())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let (b'\\', Some(d)) = (b[i], octal) {
            let v =
                u32::from(d[0] - b'0') * 64 + u32::from(d[1] - b'0') * 8 + u32::from(d[2] - b'0');
            out.push(u8::try_from(v).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_mount_should_pick_the_deepest_containing_mount() {
        let info = "22 1 8:1 / / rw - ext4 /dev/root rw\n\
                    30 22 0:5 / /var rw - tmpfs t rw\n\
                    31 22 0:6 / /var/lib\\040x rw - tmpfs t rw\n\
                    32 22 0:7 / /variant rw - tmpfs t rw\n";
        assert_eq!(
            longest_mount(info, Path::new("/var/run/x")),
            Path::new("/var")
        );
        assert_eq!(
            longest_mount(info, Path::new("/var/lib x/y")),
            Path::new("/var/lib x")
        );
        assert_eq!(longest_mount(info, Path::new("/variable")), Path::new("/"));
    }
}
