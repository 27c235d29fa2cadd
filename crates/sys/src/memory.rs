//! Giving back the memory of code that a long-lived process ran only while it started.

use std::io;

/// Asks the kernel to reclaim the pages of this executable's code and read-only data
/// (`MADV_PAGEOUT`, Linux 5.4+), and returns how many bytes of mappings it asked about.
///
/// Why: a supervisor idles for weeks, but the code that parsed its arguments, looked up
/// accounts and built its runtime stays mapped, and the kernel keeps mapped executable
/// pages in memory longer than others. After startup that is about 2 MiB for code the idle
/// loop never runs again. The kernel pages out only what no other process maps (another
/// railgrid process sharing the pages keeps them), and only from a file the caller owns or
/// could write, so as root or as the binary's owner; otherwise the call changes nothing.
/// Pages needed later fault back in from the file. Relocated data (anonymous after
/// startup) and libraries are left alone.
#[cfg(target_os = "linux")]
pub fn page_out_own_code() -> io::Result<u64> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let Some(exe) = exe.to_str() else {
        return Ok(0);
    };
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut advised = 0;
    let mut refused = None;
    for line in maps.lines() {
        // start-end perms offset dev inode path (the path is padded with spaces)
        let fields: Vec<&str> = line.splitn(6, ' ').collect();
        let [range, perms, offset, _, _, path] = fields[..] else {
            continue;
        };
        let code = perms == "r-xp";
        let headers_and_rodata = perms == "r--p" && offset.bytes().all(|b| b == b'0');
        if path.trim_start() != exe || !(code || headers_and_rodata) {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        // SAFETY: the range is one whole mapping of our own executable, read-only and
        // file-backed; MADV_PAGEOUT only drops clean pages, which fault back in unchanged
        // from the file, so no memory the program relies on changes.
        let rc = unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end.saturating_sub(start),
                libc::MADV_PAGEOUT,
            )
        };
        // One mapping refused (a kernel without MADV_PAGEOUT, a locked mapping) does not
        // keep the others from being released.
        if rc != 0 {
            refused = Some(io::Error::last_os_error());
            continue;
        }
        advised += end.saturating_sub(start) as u64;
    }
    match refused {
        Some(e) if advised == 0 => Err(e),
        _ => Ok(advised),
    }
}

/// Other systems: nothing to do.
#[cfg(not(target_os = "linux"))]
pub fn page_out_own_code() -> io::Result<u64> {
    Ok(0)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn finds_and_advises_the_executables_code() {
        match page_out_own_code() {
            Ok(advised) => assert!(advised > 0, "no mapping of our executable was found"),
            // A kernel before 5.4 does not know MADV_PAGEOUT.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
        }
    }
}

/// Gives the heap's free pages back to the kernel (glibc's `malloc_trim(0)`, which goes
/// through every arena). Why: after a burst of connections closes, glibc keeps their freed
/// buffers mapped for reuse, and the process stays at its peak for good; a long-lived
/// server calls this once such a burst has passed. A no-op where the C library is not glibc.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory the allocator holds free; it takes the
    // allocator's own locks and touches nothing the program holds.
    unsafe {
        libc::malloc_trim(0);
    }
}
