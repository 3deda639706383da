//! The seccomp filter every sandbox gets, whatever the backend: applied by our own init, so it
//! can never be silently ignored by a runtime built without libseccomp. It is built for the
//! architecture aisb was compiled for (x86_64 or aarch64): system call numbers come from `libc`
//! for that target, and a call made through another ABI (i386 `int 0x80` on x86_64, AArch32 on
//! aarch64) kills the process (SIGSYS, seccompiler's architecture check): the per-number rules
//! below would not apply to its numbering.
//!
//! Default allow, with this deny list (the source of the table in the README). Reviewed against
//! Docker's default profile (moby `profiles/seccomp/default.json`, io_uring removed in 25.0),
//! Podman's (containers/common `pkg/seccomp/seccomp.json`) and Linux 6.18's system call table.
//! The answer is EPERM unless said otherwise; ENOSYS where callers must fall back as they do on
//! an older kernel, EAFNOSUPPORT where they must treat a socket family as absent.
//!
//! | Refused | Why |
//! |---|---|
//! | `io_uring_setup`, `io_uring_enter`, `io_uring_register` (ENOSYS) | operations submitted through a ring bypass seccomp (a connect without `connect(2)`, so the proxy notifier never sees it) and are a large share of kernel exploits; libuv and tokio fall back on ENOSYS |
//! | `clone3` (ENOSYS) | its flags live in memory a filter cannot read; libc falls back to `clone`, whose flags are checked |
//! | `memfd_secret` (ENOSYS) | memory even the host cannot inspect; nothing a build needs |
//! | `openat2` (ENOSYS) | its mode is in memory a filter cannot read (a setuid or setgid file created with it); callers fall back to `openat` |
//! | `ptrace`, `process_vm_readv`, `process_vm_writev`, `pidfd_getfd`, `process_madvise`, `kcmp` | reading, changing or stealing from other processes (an agent's API key, the init's descriptors) |
//! | `clone`/`unshare` with any `CLONE_NEW*` flag, `setns` | new namespaces: a user namespace gives back every capability |
//! | `mount`, `umount2`, `pivot_root`, `chroot`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `move_mount`, `open_tree`, `open_tree_attr`, `mount_setattr` | changing the sandbox's view of the filesystem |
//! | `bpf`, `perf_event_open`, `userfaultfd`, `fanotify_init`, `lookup_dcookie` | kernel attack surface and host-wide introspection |
//! | `keyctl`, `add_key`, `request_key` | kernel keyrings are not isolated by the sandbox's namespaces |
//! | `init_module`, `finit_module`, `delete_module`, `kexec_load`, `kexec_file_load`, `reboot`, `swapon`, `swapoff`, `acct`, `syslog`, `vhangup`, `quotactl`, `quotactl_fd` | administering the host |
//! | `open_by_handle_at`, `name_to_handle_at` | opening files by handle, around every path-based mask (the "Shocker" escape) |
//! | `settimeofday`, `clock_settime`, `sethostname`, `setdomainname` | the host's clock; the sandbox's name comes from the spec (`adjtimex`/`clock_adjtime` stay: `ntp_gettime` reads through them, setting needs CAP_SYS_TIME) |
//! | `get_mempolicy`, `set_mempolicy`, `set_mempolicy_home_node`, `mbind`, `migrate_pages`, `move_pages` | NUMA placement, of other processes too (Docker gates it behind CAP_SYS_NICE; libnuma reports "no NUMA" and callers go on) |
//! | `vmsplice` | gifting user pages to a pipe, a recurring exploit primitive (Podman refuses it too) |
//! | `chmod`, `fchmod`, `fchmodat`, `fchmodat2`, `mknod`, `mknodat` with `S_ISUID` or `S_ISGID`; `open`, `openat`, `creat` creating a file with them | a setuid or setgid file left in the project would run with its owner's rights on the host (the sandbox's root is the host's when root runs aisb) |
//! | `personality` other than Docker's values (`PER_LINUX`, `PER_LINUX32`, `UNAME26`, query) | `ADDR_NO_RANDOMIZE` and `READ_IMPLIES_EXEC` switch off exploit mitigations |
//! | `ioctl` `TIOCSTI`, `TIOCLINUX` | typing into the user's terminal |
//! | `ioctl` `TIOCSETD` | line disciplines (n_gsm, n_hdlc) load rarely used, often vulnerable kernel code |
//! | `socket`/`socketpair` outside `AF_UNIX`, `AF_INET`, `AF_INET6`, `AF_NETLINK` (EAFNOSUPPORT) | `AF_VSOCK` leaves the network namespace for the hypervisor; the others (`AF_ALG`, `AF_PACKET`, `AF_TIPC`, …) autoload modules nothing here needs |
//! | `AF_NETLINK` other than `NETLINK_ROUTE`, `NETLINK_SOCK_DIAG`, `NETLINK_KOBJECT_UEVENT` (EAFNOSUPPORT) | the kept ones serve `getifaddrs`/`AI_ADDRCONFIG`, `ip`, `ss` and libudev; audit tools treat EAFNOSUPPORT as "no audit" and go on (`useradd` in an image build) |
//! | x86_64: `iopl`, `ioperm`, `modify_ldt`, `uselib` | port I/O, 16-bit segments, a.out loading |
//! | x86_64: every x32-ABI number (bit 30) | a second numbering the per-number rules would not see |
//! | numbers above 469 (ENOSYS) | system calls newer than this review (Linux 6.18): reviewed before they are let in; libc falls back on ENOSYS |
//! | another ABI (i386 `int 0x80`, AArch32): the process is killed | its numbering differs from the rules' |
//!
//! Kept on purpose: `seccomp` and `landlock_*` (they only restrict; Codex and apt sandbox
//! themselves with them), `membarrier` (.NET), `process_mrelease` (only a dying process),
//! `fanotify_mark` (useless without `fanotify_init`), `statmount`/`listmount` (the sandbox's own
//! mounts, like `/proc/self/mountinfo`), the AIO calls (no bypass: they only read and write
//! descriptors already open), `sysfs`/`ustat` (obsolete read-only information), `mknod` (a device
//! needs CAP_MKNOD; a regular file's mode is checked like chmod's). Not listed because no x86_64 or aarch64 kernel implements them: `nfsservctl`,
//! `create_module`, `get_kernel_syms`, `query_module`, `vm86`.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("aisb's seccomp filter is written for x86_64 and aarch64 only");

#[cfg(target_arch = "x86_64")]
const TARGET: TargetArch = TargetArch::x86_64;
#[cfg(target_arch = "aarch64")]
const TARGET: TargetArch = TargetArch::aarch64;

/// `seccomp_data.arch` of native system calls, for hand-written filters (`AUDIT_ARCH_X86_64`,
/// `AUDIT_ARCH_AARCH64`: the ELF machine with the 64-bit and little-endian bits).
#[cfg(target_arch = "x86_64")]
pub const AUDIT_ARCH: u32 = 62 | 0x8000_0000 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
pub const AUDIT_ARCH: u32 = 183 | 0x8000_0000 | 0x4000_0000;

/// The last system call number of the table this list was reviewed against (Linux 6.18,
/// `file_setattr`; numbers are shared by every architecture since 424).
const LAST_REVIEWED: u32 = 469;

/// Linux 6.15; not in `libc` yet (a shared number, see [`LAST_REVIEWED`]).
const SYS_OPEN_TREE_ATTR: i64 = 467;

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter failed: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("applying the seccomp filter failed: {0}")]
    Apply(#[from] seccompiler::Error),
}

/// Refused with EPERM whatever the arguments (reasons in the module docs).
const PERMISSION_DENIED: &[(i64, &str)] = &[
    (libc::SYS_ptrace, "ptrace"),
    (libc::SYS_process_vm_readv, "process_vm_readv"),
    (libc::SYS_process_vm_writev, "process_vm_writev"),
    (libc::SYS_pidfd_getfd, "pidfd_getfd"),
    (libc::SYS_process_madvise, "process_madvise"),
    (libc::SYS_kcmp, "kcmp"),
    (libc::SYS_setns, "setns"),
    (libc::SYS_mount, "mount"),
    (libc::SYS_umount2, "umount2"),
    (libc::SYS_pivot_root, "pivot_root"),
    (libc::SYS_chroot, "chroot"),
    (libc::SYS_fsopen, "fsopen"),
    (libc::SYS_fsconfig, "fsconfig"),
    (libc::SYS_fsmount, "fsmount"),
    (libc::SYS_fspick, "fspick"),
    (libc::SYS_move_mount, "move_mount"),
    (libc::SYS_open_tree, "open_tree"),
    (SYS_OPEN_TREE_ATTR, "open_tree_attr"),
    (libc::SYS_mount_setattr, "mount_setattr"),
    (libc::SYS_bpf, "bpf"),
    (libc::SYS_perf_event_open, "perf_event_open"),
    (libc::SYS_userfaultfd, "userfaultfd"),
    (libc::SYS_fanotify_init, "fanotify_init"),
    (libc::SYS_lookup_dcookie, "lookup_dcookie"),
    (libc::SYS_keyctl, "keyctl"),
    (libc::SYS_add_key, "add_key"),
    (libc::SYS_request_key, "request_key"),
    (libc::SYS_init_module, "init_module"),
    (libc::SYS_finit_module, "finit_module"),
    (libc::SYS_delete_module, "delete_module"),
    (libc::SYS_kexec_load, "kexec_load"),
    (libc::SYS_kexec_file_load, "kexec_file_load"),
    (libc::SYS_reboot, "reboot"),
    (libc::SYS_swapon, "swapon"),
    (libc::SYS_swapoff, "swapoff"),
    (libc::SYS_acct, "acct"),
    (libc::SYS_syslog, "syslog"),
    (libc::SYS_vhangup, "vhangup"),
    (libc::SYS_quotactl, "quotactl"),
    (libc::SYS_quotactl_fd, "quotactl_fd"),
    (libc::SYS_open_by_handle_at, "open_by_handle_at"),
    (libc::SYS_name_to_handle_at, "name_to_handle_at"),
    (libc::SYS_settimeofday, "settimeofday"),
    (libc::SYS_clock_settime, "clock_settime"),
    (libc::SYS_sethostname, "sethostname"),
    (libc::SYS_setdomainname, "setdomainname"),
    (libc::SYS_get_mempolicy, "get_mempolicy"),
    (libc::SYS_set_mempolicy, "set_mempolicy"),
    (libc::SYS_set_mempolicy_home_node, "set_mempolicy_home_node"),
    (libc::SYS_mbind, "mbind"),
    (libc::SYS_migrate_pages, "migrate_pages"),
    (libc::SYS_move_pages, "move_pages"),
    (libc::SYS_vmsplice, "vmsplice"),
];

/// x86-only calls (no such numbers on aarch64).
#[cfg(target_arch = "x86_64")]
const PERMISSION_DENIED_ON_THIS_ARCH: &[(i64, &str)] = &[
    (libc::SYS_iopl, "iopl"),
    (libc::SYS_ioperm, "ioperm"),
    (libc::SYS_modify_ldt, "modify_ldt"),
    (libc::SYS_uselib, "uselib"),
];
#[cfg(target_arch = "aarch64")]
const PERMISSION_DENIED_ON_THIS_ARCH: &[(i64, &str)] = &[];

/// Refused with ENOSYS, the answer of a kernel without them: callers fall back.
const NOT_IMPLEMENTED: &[(i64, &str)] = &[
    (libc::SYS_clone3, "clone3"),
    (libc::SYS_io_uring_setup, "io_uring_setup"),
    (libc::SYS_io_uring_enter, "io_uring_enter"),
    (libc::SYS_io_uring_register, "io_uring_register"),
    (libc::SYS_memfd_secret, "memfd_secret"),
    (libc::SYS_openat2, "openat2"),
];

/// `ioctl` requests refused (`TIOCSTI`, `TIOCLINUX`, `TIOCSETD`).
const IOCTLS: &[u64] = &[libc::TIOCSTI, libc::TIOCLINUX, libc::TIOCSETD];

/// `clone`'s first argument carries the exit signal in its low byte, so `CLONE_NEWTIME` (0x80)
/// only exists for `unshare` (and `clone3`, refused whole).
const CLONE_NAMESPACES: &[i32] = &[
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
];

/// Docker's allowed personas: `PER_LINUX`, `PER_LINUX32`, `UNAME26`, both, and the query.
const PERSONAS: &[u64] = &[0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

const SOCKET_FAMILIES: &[i32] = &[
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// `NETLINK_ROUTE`, `NETLINK_SOCK_DIAG`, `NETLINK_KOBJECT_UEVENT` (linux/netlink.h; not in
/// `libc` for glibc targets).
const NETLINK_PROTOCOLS: &[u64] = &[0, 4, 15];

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SeccompError> {
    // Every argument checked here is an int or has its meaning in the low 32 bits (`ioctl`
    // and `clone` truncate, `unshare` refuses high bits with EINVAL).
    Ok(SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?)
}

/// A rule that matches when argument `arg` is none of `values`.
fn none_of(arg: u8, values: &[u64]) -> Result<SeccompRule, SeccompError> {
    let conds = values
        .iter()
        .map(|&v| cond(arg, SeccompCmpOp::Ne, v))
        .collect::<Result<_, _>>()?;
    Ok(SeccompRule::new(conds)?)
}

/// One rule per flag: any of `flags` set in argument `arg`.
fn any_flag(arg: u8, flags: &[i32]) -> Result<Vec<SeccompRule>, SeccompError> {
    flags
        .iter()
        .map(|&f| {
            let f = f as u64;
            Ok(SeccompRule::new(vec![cond(
                arg,
                SeccompCmpOp::MaskedEq(f),
                f,
            )?])?)
        })
        .collect()
}

fn program(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, SeccompError> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        TARGET,
    )?;
    Ok(filter.try_into()?)
}

fn permission_denied(setid: bool) -> Result<BpfProgram, SeccompError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = PERMISSION_DENIED
        .iter()
        .chain(PERMISSION_DENIED_ON_THIS_ARCH)
        .map(|&(n, _)| (n, vec![]))
        .collect();
    rules.insert(
        libc::SYS_ioctl,
        IOCTLS
            .iter()
            .map(|&r| Ok(SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, r)?])?))
            .collect::<Result<_, SeccompError>>()?,
    );
    rules.insert(libc::SYS_clone, any_flag(0, CLONE_NAMESPACES)?);
    let unshare: Vec<i32> = CLONE_NAMESPACES
        .iter()
        .copied()
        .chain([libc::CLONE_NEWTIME])
        .collect();
    rules.insert(libc::SYS_unshare, any_flag(0, &unshare)?);
    rules.insert(libc::SYS_personality, vec![none_of(0, PERSONAS)?]);
    if !setid {
        return program(rules, libc::EPERM);
    }
    // No setuid or setgid file: the project is the host's, and when root runs aisb the
    // sandbox's root is the host's, so such a file would run as root there later.
    let setid = [libc::S_ISUID as i32, libc::S_ISGID as i32];
    rules.insert(libc::SYS_fchmod, any_flag(1, &setid)?);
    rules.insert(libc::SYS_fchmodat, any_flag(2, &setid)?);
    rules.insert(libc::SYS_fchmodat2, any_flag(2, &setid)?);
    rules.insert(libc::SYS_openat, created_with(2, 3, &setid)?);
    // A regular file needs no CAP_MKNOD: its mode is checked like chmod's.
    rules.insert(libc::SYS_mknodat, any_flag(2, &setid)?);
    #[cfg(target_arch = "x86_64")]
    {
        rules.insert(libc::SYS_chmod, any_flag(1, &setid)?);
        rules.insert(libc::SYS_creat, any_flag(1, &setid)?);
        rules.insert(libc::SYS_open, created_with(1, 2, &setid)?);
        rules.insert(libc::SYS_mknod, any_flag(1, &setid)?);
    }
    program(rules, libc::EPERM)
}

/// One rule per mode bit: a file created (`O_CREAT` or `O_TMPFILE` in argument `flags`) with
/// that bit in argument `mode` (without them, `mode` is not read and may hold anything).
fn created_with(flags: u8, mode: u8, bits: &[i32]) -> Result<Vec<SeccompRule>, SeccompError> {
    let mut out = Vec::new();
    for create in [libc::O_CREAT, libc::O_TMPFILE] {
        for &b in bits {
            out.push(SeccompRule::new(vec![
                cond(flags, SeccompCmpOp::MaskedEq(create as u64), create as u64)?,
                cond(mode, SeccompCmpOp::MaskedEq(b as u64), b as u64)?,
            ])?);
        }
    }
    Ok(out)
}

fn not_implemented() -> Result<BpfProgram, SeccompError> {
    program(
        NOT_IMPLEMENTED.iter().map(|&(n, _)| (n, vec![])).collect(),
        libc::ENOSYS,
    )
}

fn family_not_supported() -> Result<BpfProgram, SeccompError> {
    let families: Vec<u64> = SOCKET_FAMILIES.iter().map(|&f| f as u64).collect();
    let socket = vec![
        none_of(0, &families)?,
        SeccompRule::new(
            std::iter::once(cond(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64))
                .chain(
                    NETLINK_PROTOCOLS
                        .iter()
                        .map(|&p| cond(2, SeccompCmpOp::Ne, p)),
                )
                .collect::<Result<_, _>>()?,
        )?,
    ];
    let socketpair = vec![none_of(0, &families)?];
    program(
        BTreeMap::from([
            (libc::SYS_socket, socket),
            (libc::SYS_socketpair, socketpair),
        ]),
        libc::EAFNOSUPPORT,
    )
}

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Numbers no per-number rule covers: the x32 ABI's (bit 30, on x86_64; EPERM, so a kernel
/// without x32, which answers ENOSYS itself, still shows the filter at work) and those newer
/// than the review (ENOSYS). Runs on the number alone: a foreign ABI is killed by the others.
fn numbering() -> BpfProgram {
    use libc::{BPF_ABS, BPF_JGE, BPF_JGT, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let errno = |e: i32| stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ERRNO | e as u32);
    let mut prog = vec![stmt(BPF_LD | BPF_W | BPF_ABS, 0)];
    if cfg!(target_arch = "x86_64") {
        prog.push(jump(BPF_JMP | BPF_JGE | BPF_K, 0x4000_0000, 0, 1));
        prog.push(errno(libc::EPERM));
    }
    prog.extend([
        jump(BPF_JMP | BPF_JGT | BPF_K, LAST_REVIEWED, 0, 1),
        errno(libc::ENOSYS),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW),
    ]);
    prog
}

/// Every program of the filter, in the order they are installed. The kernel runs them all and
/// takes the most severe answer; their denials do not overlap.
pub fn programs() -> Result<Vec<BpfProgram>, SeccompError> {
    programs_for(true)
}

/// `setid`: refuse setuid and setgid files (every sandbox; not an image build step, whose
/// package manager installs `su`, `mount` and `passwd` as they are, into the image's own
/// layer in aisb's store, never the project).
fn programs_for(setid: bool) -> Result<Vec<BpfProgram>, SeccompError> {
    Ok(vec![
        numbering(),
        not_implemented()?,
        family_not_supported()?,
        permission_denied(setid)?,
    ])
}

/// Install the filters on the calling thread (inherited by everything it starts).
/// `no_new_privs` must already be set. `build_step`: an image build step's (see
/// [`programs_for`]).
pub fn apply(build_step: bool) -> Result<(), SeccompError> {
    for prog in programs_for(!build_step)? {
        seccompiler::apply_filter(&prog)?;
    }
    Ok(())
}

#[path = "seccomp/oci.rs"]
pub mod oci;

#[cfg(test)]
#[path = "seccomp/tests.rs"]
mod tests;
