//! The init's seccomp filter as an OCI seccomp profile (`linux.seccomp` of a runtime spec; the
//! JSON a Kubernetes `seccompProfile: {type: Localhost}` names), for runtimes where aisb's init
//! does not run: `aisb export seccomp`, and the pods `aisb export k8s` writes.
//!
//! Built from the same tables as the filter ([`super`]), so the two cannot drift. What an OCI
//! profile can say differs in two ways, and the rules below are written around both:
//!
//! - Runtimes (runc, crun, youki) hand each rule to libseccomp, which compares the whole 64-bit
//!   argument and allows one comparison per argument in a rule (a second one on the same
//!   argument becomes a separate rule: OR, not AND). So "none of these values" cannot be written
//!   as a list of `!=`; each refused set is spelled as a union of one-comparison rules instead:
//!   `socket`'s family as `> 16` or `== v` for each refused `v` up to 16, `personality`'s
//!   persona bit by bit (see [`personality`]). `ioctl` requests compare their low 32 bits
//!   (`SCMP_CMP_MASKED_EQ` with `0xffffffff`), as the kernel reads them: `TIOCSTI | 1 << 32`
//!   is still `TIOCSTI`.
//! - Rules name system calls, never numbers: the filter's two rules on numbers alone are not in
//!   the profile. The x32 ABI's numbers are another architecture to libseccomp, which the
//!   profile does not list: the runtime's bad-architecture action applies (libseccomp's
//!   default kills the process). Numbers newer than the filter's review (above 469) are left to
//!   the runtime's own default; a Kubernetes node's kernel and runtime decide those.
//!
//! Refusals keep the filter's answers (EPERM, ENOSYS, EAFNOSUPPORT), so programs fall back
//! the same way under either.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder,
};

use super::{
    CLONE_NAMESPACES, IOCTLS, NETLINK_PROTOCOLS, NOT_IMPLEMENTED, PERMISSION_DENIED,
    PERMISSION_DENIED_ON_THIS_ARCH, PERSONAS, SOCKET_FAMILIES,
};

#[cfg(target_arch = "x86_64")]
const ARCH: Arch = Arch::ScmpArchX86_64;
#[cfg(target_arch = "aarch64")]
const ARCH: Arch = Arch::ScmpArchAarch64;

/// One comparison: argument `index` `op` `value` (`value_two` for a masked comparison: the
/// argument ANDed with `value` must equal it).
fn arg(
    index: usize,
    op: LinuxSeccompOperator,
    value: u64,
    value_two: Option<u64>,
) -> LinuxSeccompArg {
    let b = LinuxSeccompArgBuilder::default()
        .index(index)
        .op(op)
        .value(value);
    match value_two {
        Some(v) => b.value_two(v),
        None => b,
    }
    .build()
    .expect("every field of a seccomp argument is set")
}

fn masked(index: usize, mask: u64, equals: u64) -> LinuxSeccompArg {
    arg(
        index,
        LinuxSeccompOperator::ScmpCmpMaskedEq,
        mask,
        Some(equals),
    )
}

fn eq(index: usize, value: u64) -> LinuxSeccompArg {
    arg(index, LinuxSeccompOperator::ScmpCmpEq, value, None)
}

fn gt(index: usize, value: u64) -> LinuxSeccompArg {
    arg(index, LinuxSeccompOperator::ScmpCmpGt, value, None)
}

fn refuse(names: &[&str], errno: i32, args: Vec<LinuxSeccompArg>) -> LinuxSyscall {
    let b = LinuxSyscallBuilder::default()
        .names(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(errno as u32);
    if args.is_empty() { b } else { b.args(args) }
        .build()
        .expect("every field of a seccomp rule is set")
}

/// `personality` is refused unless the persona is one of [`PERSONAS`] (0, `PER_LINUX32` = bit 3,
/// `UNAME26` = bit 17, both, and the query `0xffffffff`). With one comparison per rule: with
/// bit 31 clear, any bit other than 3 and 17 set is refused; with bit 31 set, any of bits 0–30
/// clear is (only the query has bit 31 and all others set). The kernel reads the low 32 bits,
/// and so do these masks.
fn personality() -> Vec<LinuxSeccompArg> {
    const TOP: u64 = 1 << 31;
    let allowed_bits: u64 = PERSONAS
        .iter()
        .filter(|&&p| p & TOP == 0)
        .fold(0, |acc, &p| acc | p);
    let mut args = Vec::new();
    for bit in 0..31 {
        let b = 1u64 << bit;
        args.push(masked(0, b | TOP, TOP));
        if b & allowed_bits == 0 {
            args.push(masked(0, b | TOP, b));
        }
    }
    args
}

/// "Argument `index` is none of `allowed`" for small non-negative values (socket families) as
/// one-comparison rules: greater than the largest, or equal to each refused value below it.
fn none_of_small(index: usize, allowed: &[u64]) -> Vec<LinuxSeccompArg> {
    let max = allowed.iter().copied().max().unwrap_or(0);
    std::iter::once(gt(index, max))
        .chain(
            (0..=max)
                .filter(|v| !allowed.contains(v))
                .map(|v| eq(index, v)),
        )
        .collect()
}

/// The profile: allow by default, refuse what the init's filter refuses, with its answers.
pub fn profile() -> LinuxSeccomp {
    let mut rules = Vec::new();
    let denied: Vec<&str> = PERMISSION_DENIED
        .iter()
        .chain(PERMISSION_DENIED_ON_THIS_ARCH)
        .map(|&(_, name)| name)
        .collect();
    rules.push(refuse(&denied, libc::EPERM, vec![]));
    let enosys: Vec<&str> = NOT_IMPLEMENTED.iter().map(|&(_, name)| name).collect();
    rules.push(refuse(&enosys, libc::ENOSYS, vec![]));
    for &request in IOCTLS {
        rules.push(refuse(
            &["ioctl"],
            libc::EPERM,
            vec![masked(1, 0xffff_ffff, request)],
        ));
    }
    for &flag in CLONE_NAMESPACES {
        let f = flag as u64;
        rules.push(refuse(&["clone"], libc::EPERM, vec![masked(0, f, f)]));
    }
    for &flag in CLONE_NAMESPACES.iter().chain(&[libc::CLONE_NEWTIME]) {
        let f = flag as u64;
        rules.push(refuse(&["unshare"], libc::EPERM, vec![masked(0, f, f)]));
    }
    for a in personality() {
        rules.push(refuse(&["personality"], libc::EPERM, vec![a]));
    }
    // No setuid or setgid file (see the init's filter).
    for bit in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
        let mut by_index: Vec<(&[&str], usize)> =
            vec![(&["fchmod"], 1), (&["fchmodat", "fchmodat2", "mknodat"], 2)];
        if cfg!(target_arch = "x86_64") {
            by_index.push((&["chmod", "creat", "mknod"], 1));
        }
        for (names, index) in by_index {
            rules.push(refuse(names, libc::EPERM, vec![masked(index, bit, bit)]));
        }
        for create in [libc::O_CREAT as u64, libc::O_TMPFILE as u64] {
            let mut opens: Vec<(&[&str], usize)> = vec![(&["openat"], 2)];
            if cfg!(target_arch = "x86_64") {
                opens.push((&["open"], 1));
            }
            for (names, flags) in opens {
                rules.push(refuse(
                    names,
                    libc::EPERM,
                    vec![masked(flags, create, create), masked(flags + 1, bit, bit)],
                ));
            }
        }
    }
    let families: Vec<u64> = SOCKET_FAMILIES.iter().map(|&f| f as u64).collect();
    for a in none_of_small(0, &families) {
        rules.push(refuse(
            &["socket", "socketpair"],
            libc::EAFNOSUPPORT,
            vec![a],
        ));
    }
    for a in none_of_small(2, NETLINK_PROTOCOLS) {
        rules.push(refuse(
            &["socket"],
            libc::EAFNOSUPPORT,
            vec![eq(0, libc::AF_NETLINK as u64), a],
        ));
    }
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .architectures(vec![ARCH])
        .syscalls(rules)
        .build()
        .expect("every field of the seccomp profile is set")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluate the profile's rules for one call as libseccomp would: any rule whose
    /// comparisons all hold refuses it.
    fn refused(p: &LinuxSeccomp, name: &str, args: [u64; 6]) -> Option<u32> {
        p.syscalls().as_ref()?.iter().find_map(|r| {
            if !r.names().iter().any(|n| n == name) {
                return None;
            }
            let holds = r.args().as_ref().map_or(true, |a| {
                a.iter().all(|c| {
                    let v = args[c.index()];
                    match c.op() {
                        LinuxSeccompOperator::ScmpCmpEq => v == c.value(),
                        LinuxSeccompOperator::ScmpCmpGt => v > c.value(),
                        LinuxSeccompOperator::ScmpCmpMaskedEq => {
                            v & c.value() == c.value_two().unwrap()
                        }
                        other => panic!("unexpected operator {other:?}"),
                    }
                })
            });
            holds.then(|| r.errno_ret().unwrap())
        })
    }

    #[test]
    fn no_rule_compares_one_argument_twice() {
        // libseccomp would split such a rule into an OR of its comparisons.
        for r in profile().syscalls().as_ref().unwrap() {
            let mut seen = std::collections::HashSet::new();
            for a in r.args().iter().flatten() {
                assert!(seen.insert(a.index()), "{r:?}");
            }
        }
    }

    #[test]
    fn personality_allows_exactly_dockers_personas() {
        let p = profile();
        for persona in [0u64, 8, 0x2_0000, 0x2_0008, 0xffff_ffff, 0x1_ffff_ffff] {
            assert_eq!(
                refused(&p, "personality", [persona, 0, 0, 0, 0, 0]),
                None,
                "{persona:#x}"
            );
        }
        // ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, with bit 31, with high bits, everything else.
        for persona in [
            0x4_0000u64,
            0x40_0000,
            0x8004_0000,
            0x1_0004_0000,
            1,
            0x7fff_ffff,
            0xffff_fffe,
            0x8000_0000,
        ] {
            assert_eq!(
                refused(&p, "personality", [persona, 0, 0, 0, 0, 0]),
                Some(libc::EPERM as u32),
                "{persona:#x}"
            );
        }
    }

    #[test]
    fn socket_families_and_netlink_protocols() {
        let p = profile();
        let s = |fam: i32, proto: u64| refused(&p, "socket", [fam as u64, 1, proto, 0, 0, 0]);
        for fam in SOCKET_FAMILIES {
            if *fam != libc::AF_NETLINK {
                assert_eq!(s(*fam, 0), None);
            }
        }
        for proto in [0, 4, 15] {
            assert_eq!(s(libc::AF_NETLINK, proto), None);
        }
        let no = Some(libc::EAFNOSUPPORT as u32);
        assert_eq!(s(libc::AF_NETLINK, 9), no, "NETLINK_AUDIT");
        assert_eq!(s(libc::AF_NETLINK, 16), no);
        assert_eq!(s(libc::AF_VSOCK, 0), no);
        assert_eq!(s(libc::AF_PACKET, 0), no);
        assert_eq!(s(0, 0), no);
        assert_eq!(s(libc::AF_ALG, 0), no);
        assert_eq!(
            refused(&p, "socketpair", [libc::AF_VSOCK as u64, 1, 0, 0, 0, 0]),
            no
        );
        assert_eq!(
            refused(&p, "socketpair", [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]),
            None
        );
    }

    #[test]
    fn ioctl_requests_compare_their_low_32_bits() {
        let p = profile();
        let tiocsti = libc::TIOCSTI as u64;
        assert_eq!(
            refused(&p, "ioctl", [0, tiocsti, 0, 0, 0, 0]),
            Some(libc::EPERM as u32)
        );
        assert_eq!(
            refused(&p, "ioctl", [0, tiocsti | 1 << 32, 0, 0, 0, 0]),
            Some(libc::EPERM as u32)
        );
        assert_eq!(
            refused(&p, "ioctl", [0, libc::TIOCGWINSZ as u64, 0, 0, 0, 0]),
            None
        );
    }

    #[test]
    fn namespaces_refused_in_clone_and_unshare() {
        let p = profile();
        let user = libc::CLONE_NEWUSER as u64;
        assert!(refused(&p, "clone", [user | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]).is_some());
        assert!(refused(&p, "unshare", [libc::CLONE_NEWTIME as u64, 0, 0, 0, 0, 0]).is_some());
        assert_eq!(
            refused(
                &p,
                "clone",
                [libc::CLONE_VM as u64 | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]
            ),
            None
        );
        assert_eq!(
            refused(&p, "unshare", [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]),
            None
        );
        assert_eq!(
            refused(&p, "io_uring_setup", [0; 6]),
            Some(libc::ENOSYS as u32)
        );
        assert_eq!(refused(&p, "ptrace", [0; 6]), Some(libc::EPERM as u32));
    }
}
