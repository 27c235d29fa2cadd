//! The seccomp filter of every sandboxed job (docs/security.md, "The sandbox's seccomp
//! filter"): in the spirit of Docker's default profile, the system calls a build or a test
//! has no use for and that widen the kernel's attack surface are refused with `EPERM`;
//! everything else is allowed. Compiled once, at the runner's start, with rust-vmm's
//! seccompiler; installed by each job's process after `no_new_privs`, last before exec.
//!
//! `clone3` is answered `ENOSYS`, as Docker does: its flags are behind a pointer a filter
//! cannot read, and glibc falls back to `clone`, whose flags it can. `clone` and `unshare`
//! are refused only with `CLONE_NEWUSER`: a job makes no user namespace of its own (the
//! kernel's largest unprivileged surface), while threads and processes work as ever.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::sys::sandbox::Filter;

/// Refused with EPERM, by name (what `runner.sandbox_allow_syscalls` may take off).
pub(super) const DENIED: &[(&str, libc::c_long)] = &[
    // The kernel keyring: per-user state shared across jobs, and a history of bugs.
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    // BPF programs, performance counters, userfaultfd: kernel surface builds do not use.
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    // io_uring: refused by Docker since 2023 for the same reason.
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    // Replacing the kernel or its modules.
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    // Opening files by handle, around every path check.
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    // The machine's own state.
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("quotactl", libc::SYS_quotactl),
    // Namespaces and mounts: the job's are made for it, and it makes none.
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("setns", libc::SYS_setns),
];

/// The filters a sandboxed job installs, less the system calls in `allow`; an unknown
/// name is an error that lists the known ones.
pub(super) fn filter(allow: &[String]) -> Result<Filter, String> {
    for name in allow {
        if !DENIED.iter().any(|(n, _)| n == name) && name != "clone3" {
            let known: Vec<&str> = DENIED.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "{name:?} is not on the deny list, which has: clone3, {}",
                known.join(", ")
            ));
        }
    }
    let allowed = |name: &str| allow.iter().any(|a| a == name);
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let newuser = || {
        SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
            libc::CLONE_NEWUSER as u64,
        )
        .map_err(|e| e.to_string())?])
        .map_err(|e| e.to_string())
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED
        .iter()
        .filter(|(name, _)| !allowed(name))
        .map(|(_, nr)| (*nr, Vec::new()))
        .collect();
    rules.insert(libc::SYS_clone, vec![newuser()?]);
    rules.insert(libc::SYS_unshare, vec![newuser()?]);
    let mut programs = vec![compile(rules, libc::EPERM, arch)?];
    if !allowed("clone3") {
        let clone3 = [(libc::SYS_clone3, Vec::new())].into();
        programs.push(compile(clone3, libc::ENOSYS, arch)?);
    }
    Ok(Filter::new(programs))
}

/// One filter: the calls in `rules` answered `errno`, the rest allowed.
fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    errno: libc::c_int,
    arch: TargetArch,
) -> Result<Vec<libc::sock_filter>, String> {
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    let bpf: BpfProgram = f
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())?;
    Ok(bpf
        .into_iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_and_take_only_known_names_off() {
        assert!(filter(&[]).is_ok());
        assert!(filter(&["io_uring_setup".into(), "clone3".into()]).is_ok());
        let e = filter(&["read".into()]).expect_err("not on the list");
        assert!(e.contains("keyctl"), "{e}");
    }
}
