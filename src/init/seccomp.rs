//! The seccomp filter every sandbox gets, whatever the backend: applied by our own init, so it
//! can never be silently ignored by a runtime built without libseccomp.
//!
//! Default allow; these fail with EPERM (ENOSYS for clone3, whose flags a filter cannot read,
//! so libc falls back to clone, which is filtered):
//! - kernel attack surface and introspection: `bpf`, `perf_event_open`, `userfaultfd`,
//!   `keyctl`/`add_key`/`request_key`, module and kexec calls, `open_by_handle_at`, `iopl`…;
//! - escaping the namespaces: new user or mount namespaces (`unshare`, `clone` flags),
//!   `setns`, `mount` and the new mount API, `pivot_root`, `chroot`;
//! - `ptrace` and `process_vm_readv/writev` (reading other processes' memory);
//! - `socket(AF_VSOCK)` (a way out of the network namespace to the hypervisor);
//! - `ioctl(TIOCSTI)` / `ioctl(TIOCLINUX)` (typing into the user's terminal);
//! - every x32-ABI syscall number (a classic way around per-number rules).

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("building the seccomp filter failed: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("applying the seccomp filter failed: {0}")]
    Apply(#[from] seccompiler::Error),
}

const DENIED: &[i64] = &[
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_uselib,
    libc::SYS_lookup_dcookie,
    libc::SYS_kcmp,
    libc::SYS_fanotify_init,
    libc::SYS_vhangup,
];

fn cond(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, SeccompError> {
    Ok(SeccompCondition::new(arg, len, op, value)?)
}

fn eperm_filter() -> Result<BpfProgram, SeccompError> {
    use SeccompCmpArgLen::{Dword, Qword};
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|&n| (n, vec![])).collect();
    rules.insert(
        libc::SYS_socket,
        vec![SeccompRule::new(vec![cond(
            0,
            Dword,
            SeccompCmpOp::Eq,
            libc::AF_VSOCK as u64,
        )?])?],
    );
    rules.insert(
        libc::SYS_ioctl,
        vec![
            SeccompRule::new(vec![cond(1, Dword, SeccompCmpOp::Eq, libc::TIOCSTI)?])?,
            SeccompRule::new(vec![cond(1, Dword, SeccompCmpOp::Eq, libc::TIOCLINUX)?])?,
        ],
    );
    let ns = |arg| -> Result<Vec<SeccompRule>, SeccompError> {
        Ok(vec![
            SeccompRule::new(vec![cond(
                arg,
                Qword,
                SeccompCmpOp::MaskedEq(libc::CLONE_NEWUSER as u64),
                libc::CLONE_NEWUSER as u64,
            )?])?,
            SeccompRule::new(vec![cond(
                arg,
                Qword,
                SeccompCmpOp::MaskedEq(libc::CLONE_NEWNS as u64),
                libc::CLONE_NEWNS as u64,
            )?])?,
        ])
    };
    rules.insert(libc::SYS_unshare, ns(0)?);
    rules.insert(libc::SYS_clone, ns(0)?);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )?;
    Ok(filter.try_into()?)
}

fn enosys_filter() -> Result<BpfProgram, SeccompError> {
    let rules = BTreeMap::from([(libc::SYS_clone3, vec![])]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )?;
    Ok(filter.try_into()?)
}

/// Refuse x32 syscall numbers (`nr & 0x40000000`): the per-number rules above would not see them.
fn x32_filter() -> BpfProgram {
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
    vec![
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: BPF_JGE_K,
            jt: 0,
            jf: 1,
            k: 0x4000_0000,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: SECCOMP_RET_ALLOW,
        },
    ]
}

/// Install the filters on the calling thread (inherited by everything it starts).
/// `no_new_privs` must already be set.
pub fn apply() -> Result<(), SeccompError> {
    for prog in [x32_filter(), enosys_filter()?, eperm_filter()?] {
        seccompiler::apply_filter(&prog)?;
    }
    Ok(())
}
