//! The filter's verdicts, computed by running its programs the way the kernel does (a classic
//! BPF interpreter for the instructions seccompiler and `numbering` emit): every rule is checked
//! here, including those whose calls the kernel would refuse anyway for lack of a capability,
//! which no test from inside a sandbox could tell apart.

use super::*;

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | e as u32
}
/// `AUDIT_ARCH_I386` on x86_64, `AUDIT_ARCH_ARM` on aarch64: the compat ABI.
#[cfg(target_arch = "x86_64")]
const FOREIGN_ARCH: u32 = 3 | 0x4000_0000;
#[cfg(target_arch = "aarch64")]
const FOREIGN_ARCH: u32 = 40 | 0x4000_0000;

/// `struct seccomp_data` as the kernel lays it out (little-endian hosts).
fn data(arch: u32, nr: i64, args: [u64; 6]) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[0..4].copy_from_slice(&(nr as i32).to_le_bytes());
    d[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    d
}

fn run(prog: &[sock_filter], data: &[u8; 64]) -> u32 {
    let (mut pc, mut acc) = (0usize, 0u32);
    loop {
        let ins = &prog[pc];
        let k = ins.k;
        let branch = |taken: bool| 1 + if taken { ins.jt } else { ins.jf } as usize;
        pc += match ins.code as u32 {
            c if c == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS => {
                let at = k as usize;
                acc = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                1
            }
            c if c == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K => {
                acc &= k;
                1
            }
            c if c == libc::BPF_JMP | libc::BPF_JA => 1 + k as usize,
            c if c == libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K => branch(acc == k),
            c if c == libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K => branch(acc > k),
            c if c == libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K => branch(acc >= k),
            c if c == libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K => branch(acc & k != 0),
            c if c == libc::BPF_RET | libc::BPF_K => return k,
            other => panic!("instruction {other:#x} not interpreted"),
        };
    }
}

/// What the kernel answers: the most severe action over every program (seccomp(2)); among
/// equals, the most recently installed one's.
fn verdict_for(arch: u32, nr: i64, args: [u64; 6]) -> u32 {
    let d = data(arch, nr, args);
    let mut answer = ALLOW;
    for prog in programs().unwrap().iter().rev() {
        let r = run(prog, &d);
        let action = |v: u32| (v & libc::SECCOMP_RET_ACTION_FULL) as i32;
        if action(r) < action(answer) {
            answer = r;
        }
    }
    answer
}

fn verdict(nr: i64, args: &[u64]) -> u32 {
    let mut a = [0u64; 6];
    a[..args.len()].copy_from_slice(args);
    verdict_for(AUDIT_ARCH, nr, a)
}

#[test]
fn every_listed_call_is_refused_with_its_errno() {
    for &(nr, _) in PERMISSION_DENIED
        .iter()
        .chain(PERMISSION_DENIED_ON_THIS_ARCH)
    {
        assert_eq!(verdict(nr, &[]), errno(libc::EPERM), "syscall {nr}");
    }
    for &(nr, _) in NOT_IMPLEMENTED {
        assert_eq!(verdict(nr, &[]), errno(libc::ENOSYS), "syscall {nr}");
    }
    for nr in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        assert_eq!(verdict(nr, &[1, 0]), errno(libc::ENOSYS));
    }
    assert_eq!(
        verdict(libc::SYS_pidfd_getfd, &[3, 0, 0]),
        errno(libc::EPERM)
    );
}

/// Named one by one (not read back from the tables): taking one out of the list fails here.
/// These are the calls the kernel would refuse a sandbox anyway for lack of a capability, so
/// no attack from inside can tell whether the filter still holds them.
#[test]
fn calls_guarded_twice_stay_in_the_list() {
    let mut eperm = vec![
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_sethostname,
        libc::SYS_setdomainname,
        libc::SYS_quotactl_fd,
        libc::SYS_process_madvise,
        libc::SYS_vmsplice,
        libc::SYS_get_mempolicy,
        libc::SYS_set_mempolicy,
        libc::SYS_set_mempolicy_home_node,
        libc::SYS_mbind,
        libc::SYS_migrate_pages,
        libc::SYS_move_pages,
        libc::SYS_open_tree,
        467, // open_tree_attr
        libc::SYS_setns,
        libc::SYS_mount,
        libc::SYS_ptrace,
        libc::SYS_kcmp,
    ];
    #[cfg(target_arch = "x86_64")]
    eperm.extend([libc::SYS_modify_ldt, libc::SYS_iopl, libc::SYS_ioperm]);
    for nr in eperm {
        assert_eq!(verdict(nr, &[]), errno(libc::EPERM), "syscall {nr}");
    }
}

#[test]
fn what_a_workload_needs_is_allowed() {
    let thread = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_THREAD) as u64;
    for (nr, args) in [
        (libc::SYS_read, vec![]),
        (libc::SYS_write, vec![]),
        (libc::SYS_openat, vec![]),
        (libc::SYS_execve, vec![]),
        (libc::SYS_clone, vec![thread]),
        (libc::SYS_clone, vec![libc::SIGCHLD as u64]),
        (libc::SYS_unshare, vec![libc::CLONE_FILES as u64]),
        (libc::SYS_socket, vec![libc::AF_INET as u64, 1, 0]),
        (libc::SYS_socket, vec![libc::AF_INET6 as u64, 2, 0]),
        (libc::SYS_socket, vec![libc::AF_UNIX as u64, 1, 0]),
        (libc::SYS_socket, vec![libc::AF_NETLINK as u64, 3, 0]),
        (libc::SYS_socket, vec![libc::AF_NETLINK as u64, 3, 4]),
        (libc::SYS_socket, vec![libc::AF_NETLINK as u64, 3, 15]),
        (libc::SYS_socketpair, vec![libc::AF_UNIX as u64, 1, 0]),
        (libc::SYS_ioctl, vec![0, libc::TCGETS]),
        (libc::SYS_ioctl, vec![0, libc::TIOCGWINSZ]),
        (libc::SYS_personality, vec![0xffff_ffff]),
        (libc::SYS_personality, vec![0]),
        (libc::SYS_seccomp, vec![]),
        (libc::SYS_landlock_create_ruleset, vec![]),
        (libc::SYS_adjtimex, vec![]),
        (libc::SYS_memfd_create, vec![]),
        (libc::SYS_membarrier, vec![]),
        (libc::SYS_pidfd_open, vec![]),
        (libc::SYS_io_setup, vec![]),
        (libc::SYS_mseal, vec![]),
        (LAST_REVIEWED as i64, vec![]),
    ] {
        assert_eq!(verdict(nr, &args), ALLOW, "syscall {nr} {args:?}");
    }
}

#[test]
fn namespace_flags_are_refused_whatever_else_is_set() {
    for &flag in CLONE_NAMESPACES {
        let flags = flag as u64 | libc::SIGCHLD as u64;
        assert_eq!(verdict(libc::SYS_clone, &[flags]), errno(libc::EPERM));
        assert_eq!(
            verdict(libc::SYS_unshare, &[flag as u64]),
            errno(libc::EPERM)
        );
    }
    assert_eq!(
        verdict(libc::SYS_unshare, &[libc::CLONE_NEWTIME as u64]),
        errno(libc::EPERM)
    );
}

#[test]
fn argument_rules() {
    for r in [libc::TIOCSTI, libc::TIOCLINUX, libc::TIOCSETD] {
        assert_eq!(verdict(libc::SYS_ioctl, &[0, r]), errno(libc::EPERM));
        // The kernel reads the request as a 32-bit int: high bits change nothing.
        assert_eq!(
            verdict(libc::SYS_ioctl, &[0, r | 0xffff_ffff_0000_0000]),
            errno(libc::EPERM)
        );
    }
    for persona in [
        libc::ADDR_NO_RANDOMIZE as u64,
        libc::READ_IMPLIES_EXEC as u64,
        0x8_0000,
    ] {
        assert_eq!(
            verdict(libc::SYS_personality, &[persona]),
            errno(libc::EPERM)
        );
    }
    for family in [
        libc::AF_VSOCK,
        libc::AF_PACKET,
        libc::AF_ALG,
        libc::AF_TIPC,
        255,
    ] {
        for nr in [libc::SYS_socket, libc::SYS_socketpair] {
            assert_eq!(
                verdict(nr, &[family as u64, 1, 0]),
                errno(libc::EAFNOSUPPORT),
                "family {family}"
            );
        }
    }
    // NETLINK_AUDIT, NETLINK_NETFILTER, NETLINK_GENERIC
    for protocol in [9, 12, 16] {
        assert_eq!(
            verdict(libc::SYS_socket, &[libc::AF_NETLINK as u64, 3, protocol]),
            errno(libc::EAFNOSUPPORT)
        );
    }
}

#[test]
fn other_numberings_are_refused() {
    // Another ABI of this CPU: killed, whatever the number means there.
    assert_eq!(verdict_for(FOREIGN_ARCH, 20, [0; 6]), KILL);
    assert_eq!(verdict_for(FOREIGN_ARCH, libc::SYS_read, [0; 6]), KILL);
    assert_eq!(
        verdict(LAST_REVIEWED as i64 + 1, &[]),
        errno(libc::ENOSYS),
        "a call newer than the review"
    );
    if cfg!(target_arch = "x86_64") {
        // x32's getpid
        assert_eq!(verdict(0x4000_0000 | 39, &[]), errno(libc::EPERM));
    }
}

/// `cargo test --lib seccomp -- --nocapture` prints the size (the README quotes it).
#[test]
fn the_filter_stays_small() {
    let sizes: Vec<usize> = programs().unwrap().iter().map(Vec::len).collect();
    let total: usize = sizes.iter().sum();
    println!("seccomp programs: {sizes:?} instructions, {total} in all");
    // BPF_MAXINSNS is 4096 per program; staying far below keeps every call cheap (640 with
    // the setuid rules on chmod and on creating opens).
    assert!(total < 700, "{sizes:?}");
}

/// No setuid or setgid file is made inside: chmod with either bit, or a file created with it,
/// is refused; the same calls without them, and opens that create nothing, are allowed.
#[test]
fn setuid_and_setgid_files_are_refused() {
    let (suid, sgid) = (libc::S_ISUID as u64, libc::S_ISGID as u64);
    let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
    for bit in [suid, sgid] {
        assert_eq!(
            verdict(libc::SYS_fchmod, &[3, 0o755 | bit]),
            errno(libc::EPERM)
        );
        assert_eq!(
            verdict(libc::SYS_fchmodat, &[3, 0, 0o755 | bit]),
            errno(libc::EPERM)
        );
        assert_eq!(
            verdict(libc::SYS_fchmodat2, &[3, 0, 0o755 | bit, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(
            verdict(libc::SYS_openat, &[3, 0, creat, 0o755 | bit]),
            errno(libc::EPERM)
        );
        // A regular file by mknodat needs no capability: its mode is checked too.
        assert_eq!(
            verdict(
                libc::SYS_mknodat,
                &[3, 0, libc::S_IFREG as u64 | 0o644 | bit, 0]
            ),
            errno(libc::EPERM)
        );
        assert_eq!(
            verdict(
                libc::SYS_openat,
                &[3, 0, libc::O_TMPFILE as u64 | 2, 0o700 | bit]
            ),
            errno(libc::EPERM)
        );
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(
                verdict(libc::SYS_chmod, &[0, 0o755 | bit]),
                errno(libc::EPERM)
            );
            assert_eq!(
                verdict(libc::SYS_creat, &[0, 0o755 | bit]),
                errno(libc::EPERM)
            );
            assert_eq!(
                verdict(libc::SYS_open, &[0, creat, 0o755 | bit]),
                errno(libc::EPERM)
            );
        }
    }
    let allow = libc::SECCOMP_RET_ALLOW;
    assert_eq!(verdict(libc::SYS_fchmod, &[3, 0o755]), allow);
    assert_eq!(verdict(libc::SYS_fchmodat, &[3, 0, 0o1777]), allow);
    assert_eq!(verdict(libc::SYS_openat, &[3, 0, creat, 0o644]), allow);
    // Without O_CREAT the mode is not read: whatever it holds, the open goes on.
    assert_eq!(verdict(libc::SYS_openat, &[3, 0, 0, 0o7777]), allow);
}
