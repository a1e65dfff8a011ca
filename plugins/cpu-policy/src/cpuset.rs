//! CPU lists as the kernel writes them: `0-3,6`.

use std::collections::BTreeSet;

/// Parses `0-3,6` (empty: no CPUs).
pub fn parse(text: &str) -> Result<BTreeSet<u32>, String> {
    let mut out = BTreeSet::new();
    for part in text.trim().split(',').filter(|p| !p.trim().is_empty()) {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let lo: u32 = lo
            .trim()
            .parse()
            .map_err(|_| format!("{text:?}: {part:?} is not a CPU or range"))?;
        let hi: u32 = hi
            .trim()
            .parse()
            .map_err(|_| format!("{text:?}: {part:?} is not a CPU or range"))?;
        if lo > hi {
            return Err(format!("{text:?}: range {part:?} runs backwards"));
        }
        out.extend(lo..=hi);
    }
    Ok(out)
}

/// Formats CPUs as `0-3,6`.
pub fn format(cpus: &BTreeSet<u32>) -> String {
    let mut parts = Vec::new();
    let mut run: Option<(u32, u32)> = None;
    for &c in cpus {
        run = match run {
            Some((lo, hi)) if c == hi + 1 => Some((lo, c)),
            Some((lo, hi)) => {
                parts.push(range(lo, hi));
                Some((c, c))
            }
            None => Some((c, c)),
        };
    }
    if let Some((lo, hi)) = run {
        parts.push(range(lo, hi));
    }
    parts.join(",")
}

fn range(lo: u32, hi: u32) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_should_round_trip() {
        let s = parse("0-3,6, 8-9").unwrap_or_default();
        assert_eq!(s.iter().copied().collect::<Vec<_>>(), [0, 1, 2, 3, 6, 8, 9]);
        assert_eq!(format(&s), "0-3,6,8-9");
        assert_eq!(format(&parse("").unwrap_or_default()), "");
        assert!(parse("3-1").is_err());
        assert!(parse("a").is_err());
    }
}
