//! Attempts at the kernel surface the seccomp filter refuses, one system call each, for the
//! checks that run inside a sandbox: `aisb test` (as `/run/aisb/init probe NAME`, present in
//! every sandbox whatever its image) and the isolation scenarios (`aisb-probe NAME`).
//!
//! Each attempt says what happened in words the tests compare exactly (`refused: ENOSYS`), so a
//! refusal by the kernel itself (no capability, no such ABI) is not taken for the filter's.

use std::fmt;

use nix::errno::Errno;
use nix::sys::signal::Signal;

pub enum Outcome {
    Succeeded,
    Refused(Errno),
    Killed(Signal),
    /// The attempt was not possible here (a missing kernel feature): proves nothing.
    CannotRun(String),
}

impl Outcome {
    /// 0 when the attempt succeeded, 1 when it was refused, 127 when it could not be made (the
    /// scenario runner counts 126 and 127 as "could not run", never as a refusal).
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Succeeded => 0,
            Outcome::Refused(_) | Outcome::Killed(_) => 1,
            Outcome::CannotRun(_) => 127,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Succeeded => write!(f, "succeeded"),
            Outcome::Refused(e) => write!(f, "refused: {e:?}"),
            Outcome::Killed(s) => write!(f, "killed: {}", s.as_str()),
            Outcome::CannotRun(why) => write!(f, "cannot run: {why}"),
        }
    }
}

pub const NAMES: &[&str] = &[
    "io-uring",
    "pidfd-getfd",
    "x32",
    "foreign-abi",
    "personality",
    "memfd-secret",
    "netlink-audit",
    "netlink-route",
    "tiocsetd",
];

/// The attempt called `name`, or `None` for an unknown name.
pub fn attempt(name: &str) -> Option<Outcome> {
    // SAFETY (all blocks below): plain system calls with valid arguments; results checked.
    Some(match name {
        "io-uring" => {
            // struct io_uring_params: 120 bytes, zeroed = defaults.
            let mut params = [0u8; 120];
            let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) };
            fd_result(fd)
        }
        "pidfd-getfd" => pidfd_getfd(),
        "x32" => x32(),
        "foreign-abi" => foreign_abi(),
        "personality" => {
            let r = unsafe { libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong) };
            if r >= 0 {
                Outcome::Succeeded
            } else {
                Outcome::Refused(Errno::last())
            }
        }
        // The query Docker's profile and aisb's filter both allow (glibc, `setarch`, Java call
        // it): a rule that refuses it breaks programs for nothing.
        "personality-query" => {
            let r = unsafe { libc::personality(0xffff_ffff) };
            if r >= 0 {
                Outcome::Succeeded
            } else {
                Outcome::Refused(Errno::last())
            }
        }
        "memfd-secret" => fd_result(unsafe { libc::syscall(libc::SYS_memfd_secret, 0) }),
        // NETLINK_AUDIT (9) and NETLINK_ROUTE (0).
        "netlink-audit" => socket(libc::AF_NETLINK, libc::SOCK_RAW, 9),
        "netlink-route" => socket(libc::AF_NETLINK, libc::SOCK_RAW, 0),
        "tiocsetd" => tiocsetd(),
        _ => return None,
    })
}

fn fd_result(fd: libc::c_long) -> Outcome {
    if fd >= 0 {
        // SAFETY: a descriptor this attempt just created.
        unsafe { libc::close(fd as i32) };
        Outcome::Succeeded
    } else {
        Outcome::Refused(Errno::last())
    }
}

fn socket(family: i32, kind: i32, protocol: i32) -> Outcome {
    // SAFETY: a plain socket(2).
    fd_result(unsafe { libc::socket(family, kind, protocol) } as libc::c_long)
}

/// Take a descriptor out of another process of the sandbox: a child of ours, which holds the
/// write end of a pipe (the same access check as ptrace: same user, our descendant).
fn pidfd_getfd() -> Outcome {
    use std::os::fd::AsRawFd;
    let Ok((_read, write)) = nix::unistd::pipe() else {
        return Outcome::CannotRun("no pipe".into());
    };
    // SAFETY: the child only pauses until it is killed.
    let child = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => loop {
            nix::unistd::pause();
        },
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
        Err(e) => return Outcome::CannotRun(format!("fork: {e}")),
    };
    // SAFETY: pidfd_open and pidfd_getfd on a live child of ours; descriptors checked.
    let outcome = unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0);
        if pidfd < 0 {
            Outcome::CannotRun(format!("pidfd_open: {:?}", Errno::last()))
        } else {
            let r = fd_result(libc::syscall(
                libc::SYS_pidfd_getfd,
                pidfd,
                write.as_raw_fd(),
                0,
            ));
            libc::close(pidfd as i32);
            r
        }
    };
    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(child, None);
    outcome
}

/// getpid through the x32 ABI (bit 30 of the number). A kernel without x32 answers ENOSYS
/// itself, so only the filter's EPERM counts as its refusal.
fn x32() -> Outcome {
    if !cfg!(target_arch = "x86_64") {
        return Outcome::CannotRun("x32 is an x86_64 ABI".into());
    }
    // SAFETY: getpid has no arguments.
    let r = unsafe { libc::syscall(0x4000_0000 | 39) };
    match (r, Errno::last()) {
        (r, _) if r >= 0 => Outcome::Succeeded,
        (_, Errno::ENOSYS) => Outcome::CannotRun(
            "this kernel has no x32 ABI (ENOSYS from the kernel, not EPERM from the filter)".into(),
        ),
        (_, e) => Outcome::Refused(e),
    }
}

/// getpid through the other ABI of this CPU (i386 `int 0x80` on x86_64), in a child: the
/// filter kills the caller.
fn foreign_abi() -> Outcome {
    #[cfg(target_arch = "x86_64")]
    {
        use nix::sys::wait::{waitpid, WaitStatus};
        // SAFETY: the child makes one system call and exits without touching shared state.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                let ret: u64;
                // SAFETY: i386 getpid (20) takes no arguments; the registers the compat entry
                // may clear are declared clobbered.
                unsafe {
                    std::arch::asm!(
                        "int 0x80",
                        inlateout("rax") 20u64 => ret,
                        out("r8") _, out("r9") _, out("r10") _, out("r11") _,
                        out("r12") _, out("r13") _, out("r14") _, out("r15") _,
                    );
                }
                let ret = ret as u32 as i32;
                let code = if ret == std::process::id() as i32 {
                    0
                } else if ret < 0 {
                    -ret
                } else {
                    255
                };
                // SAFETY: exit without running the parent's atexit handlers.
                unsafe { libc::_exit(code) }
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, 0)) => Outcome::Succeeded,
                Ok(WaitStatus::Exited(_, 255)) => {
                    Outcome::CannotRun("int 0x80 returned something else than our pid".into())
                }
                Ok(WaitStatus::Exited(_, e)) => Outcome::Refused(Errno::from_raw(e)),
                Ok(WaitStatus::Signaled(_, Signal::SIGSYS, _)) => Outcome::Killed(Signal::SIGSYS),
                Ok(WaitStatus::Signaled(_, Signal::SIGSEGV, _)) => {
                    Outcome::CannotRun("this kernel has no i386 ABI (int 0x80 faults)".into())
                }
                other => Outcome::CannotRun(format!("the child ended with {other:?}")),
            },
            Err(e) => Outcome::CannotRun(format!("fork: {e}")),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Outcome::CannotRun("an AArch32 call needs a 32-bit binary".into())
    }
}

/// Set the line discipline of a fresh pseudo-terminal to N_TTY (the one it has): allowed by the
/// kernel to its owner, refused by the filter whatever the discipline.
fn tiocsetd() -> Outcome {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty fills two descriptors; the null pointers mean defaults.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Outcome::CannotRun("no pseudo-terminal".into());
    }
    let n_tty: libc::c_int = 0;
    // SAFETY: TIOCSETD reads one int.
    let r = unsafe { libc::ioctl(slave, libc::TIOCSETD, &n_tty) };
    let outcome = if r == 0 {
        Outcome::Succeeded
    } else {
        Outcome::Refused(Errno::last())
    };
    // SAFETY: our own descriptors.
    unsafe {
        libc::close(slave);
        libc::close(master);
    }
    outcome
}

/// `probe NAME`: run one attempt, print its outcome, return the exit code.
pub fn main(name: &str) -> i32 {
    match attempt(name) {
        Some(outcome) => {
            println!("{outcome}");
            outcome.exit_code()
        }
        None => {
            eprintln!("unknown probe `{name}`: one of {}", NAMES.join(", "));
            127
        }
    }
}
