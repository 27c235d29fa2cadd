//! Landlock (Linux 5.13+): a ruleset of the file hierarchies a job may use, applied by the
//! job's process to itself just before it execs.
//!
//! Landlock is an allow-list: once a process restricts itself, every file access it makes
//! (and its descendants make) must lie beneath a hierarchy of the ruleset, or fails with
//! EACCES. From ABI 6 on, the ruleset also scopes signals and abstract Unix sockets: the
//! process can no longer signal or connect to anything outside its own domain. The kernel
//! has no call to undo it; a child process inherits it.
//!
//! What this module does not decide: which hierarchies. See `runner::confine`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

// From <linux/landlock.h>; stable kernel ABI.
const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: libc::c_int = 1;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

/// Rights that apply to files (the rest apply to directories only).
const FILE_RIGHTS: u64 = (1 << 0) // EXECUTE
    | (1 << 1) // WRITE_FILE
    | (1 << 2) // READ_FILE
    | (1 << 14) // TRUNCATE (ABI 3)
    | (1 << 15); // IOCTL_DEV (ABI 5)

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI version this kernel offers, or `None` when it has none (too old, or
/// Landlock not enabled at boot).
pub fn abi() -> Option<i32> {
    // SAFETY: the version query takes no attribute and returns a number or -1.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    (v > 0).then_some(v as i32)
}

/// Every file-system right the given ABI knows.
fn fs_rights(abi: i32) -> u64 {
    let mut rights = (1 << 13) - 1; // ABI 1: EXECUTE ..= MAKE_SYM
    if abi >= 2 {
        rights |= 1 << 13; // REFER
    }
    if abi >= 3 {
        rights |= 1 << 14; // TRUNCATE
    }
    if abi >= 5 {
        rights |= 1 << 15; // IOCTL_DEV
    }
    rights
}

/// A ruleset handling every file-system right (and, from ABI 6, signal and abstract-socket
/// scoping), to which hierarchies are added with [`Ruleset::allow`].
#[derive(Debug)]
pub struct Ruleset {
    fd: OwnedFd,
    rights: u64,
    /// Whether the ruleset also keeps signals inside the domain.
    pub scopes_signals: bool,
}

impl Ruleset {
    pub fn new(abi: i32) -> io::Result<Self> {
        let rights = fs_rights(abi);
        let scoped = abi >= 6;
        let attr = RulesetAttr {
            handled_access_fs: rights,
            handled_access_net: 0,
            scoped: if scoped {
                SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
            } else {
                0
            },
        };
        // Older kernels refuse an attribute larger than theirs unless the extra is zero;
        // pass only the part they know.
        let size = if scoped {
            std::mem::size_of::<RulesetAttr>()
        } else {
            std::mem::size_of::<u64>()
        };
        // SAFETY: `attr` is a valid ruleset attribute of at least `size` bytes.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                size,
                0u32,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: the kernel returned a new descriptor (O_CLOEXEC) that we now own.
            fd: unsafe { OwnedFd::from_raw_fd(fd as RawFd) },
            rights,
            scopes_signals: scoped,
        })
    }

    /// Allows every right beneath `target` (an `O_PATH` descriptor of a directory or a
    /// file).
    pub fn allow(&mut self, target: BorrowedFd<'_>, is_dir: bool) -> io::Result<()> {
        let attr = PathBeneathAttr {
            allowed_access: if is_dir {
                self.rights
            } else {
                self.rights & FILE_RIGHTS
            },
            parent_fd: target.as_raw_fd(),
        };
        // SAFETY: `attr` is a valid path-beneath rule; the kernel only reads it.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                self.fd.as_raw_fd(),
                RULE_PATH_BENEATH,
                &attr as *const PathBeneathAttr,
                0u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// In a freshly cloned child, before exec: `no_new_privs` (which Landlock requires of an
/// unprivileged process, and which keeps set-user-id programs from lifting the job out of
/// its account), then the ruleset. Raw system calls only: no allocation, no lock.
///
/// # Safety
/// Call only in the launch child (see `sys::launch`); `ruleset` must be a ruleset fd.
pub(super) unsafe fn restrict_self(ruleset: RawFd) -> bool {
    libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) == 0
        && libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) == 0
}
