//! Reading process facts from Linux's /proc.

use std::fs;
use std::io;

use super::ProcessId;

/// The fields of `/proc/<pid>/stat` railgrid needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    /// Start time in clock ticks since boot: with the pid, it names a process uniquely,
    /// so a recycled pid is never mistaken for the process that once had it.
    pub start_time: u64,
}

/// Parses one `/proc/<pid>/stat` line. The command name sits in parentheses and may hold
/// spaces and parentheses itself, so fields are counted from the *last* `)`.
pub fn parse_stat(line: &str) -> Option<Stat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let pid = line[..open].trim().parse().ok()?;
    let mut rest = line.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    // session, tty_nr, tpgid, flags, minflt, cminflt, majflt, cmajflt, utime, stime,
    // cutime, cstime, priority, nice, num_threads, itrealvalue, then starttime.
    let start_time = rest.nth(16)?.parse().ok()?;
    Some(Stat {
        pid,
        state,
        ppid,
        pgrp,
        start_time,
    })
}

/// The stat of `pid`, or `None` when it does not exist.
pub fn stat(pid: ProcessId) -> io::Result<Option<Stat>> {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(line) => Ok(parse_stat(&line)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // ESRCH shows up when the process exits between open and read.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The stat of every process visible in /proc. Processes that exit during the scan are
/// skipped.
pub fn processes() -> io::Result<Vec<Stat>> {
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Some(pid) = ProcessId::new(pid) else {
            continue;
        };
        if let Ok(Some(st)) = stat(pid) {
            out.push(st);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_name_with_spaces_and_parens() {
        let line = "4242 (we (ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        let st = parse_stat(line).expect("parses");
        assert_eq!(st.pid, 4242);
        assert_eq!(st.state, 'S');
        assert_eq!(st.ppid, 1);
        assert_eq!(st.pgrp, 4242);
        assert_eq!(st.start_time, 987654);
    }

    #[test]
    fn own_stat_is_readable() {
        let st = stat(ProcessId::current()).expect("reads").expect("exists");
        assert_eq!(st.pid, std::process::id() as i32);
        assert!(st.start_time > 0);
    }
}
