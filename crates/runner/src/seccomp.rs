//! The seccomp filter of every sandboxed job (docs/security.md, "The sandbox's seccomp
//! filter"): in the spirit of Docker's default profile, the system calls a build or a test
//! has no use for and that widen the kernel's attack surface are refused with `EPERM`;
//! everything else is allowed. Built once, at the runner's start; installed by each job's
//! process after `no_new_privs`, last before exec.
//!
//! `clone3` is answered `ENOSYS`, as Docker does: its flags are behind a pointer a filter
//! cannot read, and glibc falls back to `clone`, whose flags it can. `clone` and `unshare`
//! are refused only with `CLONE_NEWUSER`: a job makes no user namespace of its own (the
//! kernel's largest unprivileged surface), while threads and processes work as ever. A
//! call of another architecture (i386 through `int 0x80`) ends the process, and an x32
//! call is answered `ENOSYS`: neither numbering is the one the list is written in.
//!
//! One classic BPF program, the calls it names found by a binary search: installing a
//! filter costs the kernel a JIT compile and, for its allow cache, an emulation of the
//! program for every system call number, so both grow with the program's length and the
//! path it takes (docs/benchmarks.md, "A sandbox for every job"). Written here rather
//! than with a general filter compiler, which emits a linear chain and no x32 guard.

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

/// The filter a sandboxed job installs, less the system calls in `allow`; an unknown name
/// is an error that lists the known ones.
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
    let arch = audit_arch().ok_or_else(|| {
        format!(
            "no seccomp filter is written for {}",
            std::env::consts::ARCH
        )
    })?;
    Ok(Filter::new(vec![program(arch, &calls(allow))?]))
}

/// What the filter answers one system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Errno(u16),
    /// `EPERM` with `CLONE_NEWUSER` in its first argument, allowed without.
    NoNewUser,
}

/// The calls the filter names, by number, each with its verdict.
fn calls(allow: &[String]) -> Vec<(u32, Verdict)> {
    let allowed = |name: &str| allow.iter().any(|a| a == name);
    let mut calls: Vec<(u32, Verdict)> = DENIED
        .iter()
        .filter(|(name, _)| !allowed(name))
        .map(|(_, nr)| (*nr as u32, Verdict::Errno(libc::EPERM as u16)))
        .collect();
    calls.push((libc::SYS_clone as u32, Verdict::NoNewUser));
    calls.push((libc::SYS_unshare as u32, Verdict::NoNewUser));
    if !allowed("clone3") {
        calls.push((libc::SYS_clone3 as u32, Verdict::Errno(libc::ENOSYS as u16)));
    }
    calls.sort_unstable();
    calls.dedup_by_key(|(nr, _)| *nr);
    calls
}

/// `AUDIT_ARCH_*` of the architecture this is built for (<linux/audit.h>).
fn audit_arch() -> Option<u32> {
    match std::env::consts::ARCH {
        "x86_64" => Some(0xC000_003E),
        "aarch64" => Some(0xC000_00B7),
        "riscv64" => Some(0xC000_00F3),
        _ => None,
    }
}

/// x86-64's x32 calls: the native numbers with this bit set.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// Where `struct seccomp_data` keeps the call's number, its architecture and the low 32
/// bits of its first argument (little-endian).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;
/// Leaves the whole tree to a linear run of comparisons below this many calls.
const LEAF: usize = 4;

/// The program: the architecture checked, x32 refused, then a search of `calls` (sorted).
fn program(arch: u32, calls: &[(u32, Verdict)]) -> Result<Vec<libc::sock_filter>, String> {
    let mut a = Asm::default();
    let (kill, eperm, enosys, newuser) = (a.label(), a.label(), a.label(), a.label());
    a.load(ARCH);
    a.jump(JEQ, arch, None, Some(kill));
    a.load(NR);
    if std::env::consts::ARCH == "x86_64" {
        a.jump(JGE, X32_SYSCALL_BIT, Some(enosys), None);
    }
    let ends = Ends {
        eperm,
        enosys,
        newuser,
    };
    a.search(calls, &ends)?;
    a.bind(newuser);
    a.load(ARG0_LOW);
    a.jump(JSET, libc::CLONE_NEWUSER as u32, Some(eperm), None);
    a.ret(libc::SECCOMP_RET_ALLOW);
    a.bind(eperm);
    a.ret(libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
    a.bind(enosys);
    a.ret(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
    a.bind(kill);
    a.ret(libc::SECCOMP_RET_KILL_PROCESS);
    a.finish()
}

// Classic BPF opcodes (<linux/bpf_common.h>): class | size or operation | source.
/// `BPF_LD | BPF_W | BPF_ABS`.
const LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JEQ | BPF_K`, `BPF_JGE`, `BPF_JSET`.
const JEQ: u16 = 0x15;
const JGE: u16 = 0x35;
const JSET: u16 = 0x45;
/// `BPF_RET | BPF_K`.
const RET_K: u16 = 0x06;

/// Where each verdict but `Allow` is answered.
struct Ends {
    eperm: usize,
    enosys: usize,
    newuser: usize,
}

/// A program being written, its jumps to labels resolved at the end (classic BPF only
/// jumps forward, at most 255 instructions).
#[derive(Default)]
struct Asm {
    code: Vec<(u16, Option<usize>, Option<usize>, u32)>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }

    fn bind(&mut self, label: usize) {
        self.labels[label] = Some(self.code.len());
    }

    fn load(&mut self, offset: u32) {
        self.code.push((LD_W_ABS, None, None, offset));
    }

    /// A comparison with `k`: to `jt` when true, `jf` when false (`None`: the next).
    fn jump(&mut self, op: u16, k: u32, jt: Option<usize>, jf: Option<usize>) {
        self.code.push((op, jt, jf, k));
    }

    fn ret(&mut self, k: u32) {
        self.code.push((RET_K, None, None, k));
    }

    /// The verdict of the number in the accumulator, among `calls` (sorted); `Allow` for
    /// any other.
    fn search(&mut self, calls: &[(u32, Verdict)], ends: &Ends) -> Result<(), String> {
        if calls.len() <= LEAF {
            for (nr, verdict) in calls {
                let to = match verdict {
                    Verdict::Errno(e) if *e == libc::EPERM as u16 => ends.eperm,
                    Verdict::Errno(e) if *e == libc::ENOSYS as u16 => ends.enosys,
                    Verdict::Errno(e) => return Err(format!("no ending answers errno {e}")),
                    Verdict::NoNewUser => ends.newuser,
                };
                self.jump(JEQ, *nr, Some(to), None);
            }
            self.ret(libc::SECCOMP_RET_ALLOW);
            return Ok(());
        }
        let mid = calls.len() / 2;
        let upper = self.label();
        self.jump(JGE, calls[mid].0, Some(upper), None);
        self.search(&calls[..mid], ends)?;
        self.bind(upper);
        self.search(&calls[mid..], ends)
    }

    fn finish(self) -> Result<Vec<libc::sock_filter>, String> {
        let at = |label: usize| self.labels[label].ok_or("a label never bound".to_owned());
        let mut out = Vec::with_capacity(self.code.len());
        for (i, (code, jt, jf, k)) in self.code.iter().enumerate() {
            let offset = |to: Option<usize>| -> Result<u8, String> {
                let Some(label) = to else { return Ok(0) };
                let to = at(label)?;
                to.checked_sub(i + 1)
                    .and_then(|d| u8::try_from(d).ok())
                    .ok_or_else(|| format!("a jump from {i} to {to} does not fit"))
            };
            out.push(libc::sock_filter {
                code: *code,
                jt: offset(*jt)?,
                jf: offset(*jf)?,
                k: *k,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `prog` as the kernel would on a call: its return value.
    fn run(prog: &[libc::sock_filter], arch: u32, nr: u32, arg0: u64) -> u32 {
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let i = &prog[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    acc = match i.k {
                        NR => nr,
                        ARCH => arch,
                        ARG0_LOW => arg0 as u32,
                        k => panic!("load of offset {k}"),
                    }
                }
                RET_K => return i.k,
                op => {
                    let taken = match op {
                        JEQ => acc == i.k,
                        JGE => acc >= i.k,
                        JSET => acc & i.k != 0,
                        op => panic!("opcode {op:#x}"),
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
            }
        }
    }

    const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

    #[test]
    fn every_call_number_gets_the_verdict_the_list_gives() {
        let arch = audit_arch().expect("an architecture with a filter");
        let prog = program(arch, &calls(&[])).expect("program");
        let newuser = libc::CLONE_NEWUSER as u64;
        for nr in 0..1024u32 {
            let listed = DENIED.iter().any(|(_, n)| *n as u32 == nr);
            let got = run(&prog, arch, nr, 0);
            if listed {
                assert_eq!(got, EPERM, "call {nr}");
            } else if nr == libc::SYS_clone3 as u32 {
                assert_eq!(got, ENOSYS, "clone3");
            } else if nr == libc::SYS_clone as u32 || nr == libc::SYS_unshare as u32 {
                assert_eq!(
                    got,
                    libc::SECCOMP_RET_ALLOW,
                    "call {nr} without CLONE_NEWUSER"
                );
                assert_eq!(run(&prog, arch, nr, newuser | 0x11), EPERM, "call {nr}");
            } else {
                assert_eq!(got, libc::SECCOMP_RET_ALLOW, "call {nr}");
            }
        }
        // Another architecture's numbering ends the process; x32's is not served.
        assert_eq!(
            run(&prog, 0x4000_0003, libc::SYS_keyctl as u32, 0),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        if std::env::consts::ARCH == "x86_64" {
            let x32_keyctl = X32_SYSCALL_BIT | libc::SYS_keyctl as u32;
            assert_eq!(run(&prog, arch, x32_keyctl, 0), ENOSYS);
        }
        assert!(prog.len() < 128, "{} instructions", prog.len());
    }

    #[test]
    fn names_taken_off_the_list_are_allowed_and_only_known_names_are_taken() {
        let arch = audit_arch().expect("an architecture with a filter");
        let allow = ["io_uring_setup".to_owned(), "clone3".to_owned()];
        let prog = program(arch, &calls(&allow)).expect("program");
        for nr in [libc::SYS_io_uring_setup, libc::SYS_clone3] {
            assert_eq!(run(&prog, arch, nr as u32, 0), libc::SECCOMP_RET_ALLOW);
        }
        assert_eq!(run(&prog, arch, libc::SYS_keyctl as u32, 0), EPERM);
        assert!(filter(&allow).is_ok());
        let e = filter(&["read".into()]).expect_err("not on the list");
        assert!(e.contains("keyctl"), "{e}");
    }
}
