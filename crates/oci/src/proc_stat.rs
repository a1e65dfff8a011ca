//! The fields of `/proc/<pid>/stat` that process identity checks need.

/// State, parent and start time of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The state letter (field 3): `R`, `S`, `Z`, `X`...
    pub state: char,
    /// The parent's pid (field 4).
    pub ppid: u32,
    /// The start time in clock ticks after boot (field 22).
    pub start_time: u64,
}

/// Reads `pid`'s stat, or `None` when the process does not exist.
pub fn read(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields that follow start after its last ')', with the state first.
    let mut fields = stat[stat.rfind(')')? + 1..].split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let start_time = fields.nth(17)?.parse().ok()?;
    Some(ProcStat {
        state,
        ppid,
        start_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_should_give_this_processs_parent_and_start_time() -> std::io::Result<()> {
        let mut child = std::process::Command::new("sleep").arg("10").spawn()?;
        let st = read(child.id());
        child.kill()?;
        child.wait()?;
        let st = st.ok_or_else(|| std::io::Error::other("no stat"))?;
        assert_eq!(st.ppid, std::process::id());
        assert!(st.start_time > 0);
        assert_eq!(read(child.id()), None);
        Ok(())
    }
}
