//! A second session in a running sandbox: join the namespaces of its init (user first, then
//! mount, network, IPC, UTS, PID, cgroup), take its working directory and environment, apply
//! the same hardening as the init (no capabilities, no_new_privs, the seccomp filter) and run
//! the command there. Works on both backends and rootless: the sandbox's user namespace is
//! owned by the caller, so joining it gives the capabilities the other joins need, and they
//! are all dropped before the command runs. On a terminal the session gets a pseudo-terminal
//! of its own (its controlling terminal, in a new session), never the caller's.

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::sched::{setns, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::SessionError;

/// Is `pid` a sandbox init that finished setting the sandbox up? The runtimes report the pid
/// before the sandbox is complete (bwrap's info pipe, libcontainer's start): joining then
/// could see a mount namespace without its masks. The init is running once the process is
/// our init binary, and done once it has started its workload (it forks only after
/// hardening).
pub fn ready(pid: i32) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let is_init = cmdline.starts_with(crate::init::INIT_PATH.as_bytes())
        && cmdline.get(crate::init::INIT_PATH.len()) == Some(&0);
    // Without CONFIG_PROC_CHILDREN (no such file), the exec of the init is the best sign.
    is_init
        && std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .map_or(true, |c| !c.trim().is_empty())
}

/// Run `command` in `cwd` inside the sandbox whose init is `pid`; returns its exit code
/// (128+N for a signal). The joining happens in a forked child (joining a user namespace
/// requires a single-threaded caller).
pub fn attach(pid: i32, command: &[String], cwd: &std::path::Path) -> Result<i32, SessionError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source: std::io::Error| SessionError::Io { what, source }
    };
    let proc = format!("/proc/{pid}");
    let mut ns: Vec<(OwnedFd, CloneFlags)> = Vec::new();
    for (name, flag) in [
        ("mnt", CloneFlags::CLONE_NEWNS),
        ("net", CloneFlags::CLONE_NEWNET),
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("uts", CloneFlags::CLONE_NEWUTS),
        ("pid", CloneFlags::CLONE_NEWPID),
        ("cgroup", CloneFlags::CLONE_NEWCGROUP),
        ("user", CloneFlags::CLONE_NEWUSER),
    ] {
        let f = std::fs::File::open(format!("{proc}/ns/{name}"))
            .map_err(io(&format!("opening the sandbox's {name} namespace")))?;
        ns.push((f.into(), flag));
    }
    // First the user namespace that owns the others, where the caller holds the capabilities
    // to join them; the init's own comes last: an unprivileged bwrap nests one more user
    // namespace for its child, which owns nothing (joining it first made the mount namespace
    // refuse with EPERM).
    let owner = crate::runtime::live::masker::owning_user_ns(&ns[0].0)
        .map_err(io("finding the sandbox's user namespace"))?;
    ns.insert(0, (owner, CloneFlags::CLONE_NEWUSER));
    let environ = std::fs::read(format!("{proc}/environ"))
        .map_err(io("reading the sandbox's environment"))?;
    let env: Vec<CString> = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .filter_map(|v| CString::new(v).ok())
        .collect();
    let argv: Vec<CString> = command
        .iter()
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    if argv.is_empty() || argv.len() != command.len() {
        return Err(SessionError::Io {
            what: "the command is empty or has a NUL byte".into(),
            source: std::io::ErrorKind::InvalidInput.into(),
        });
    }
    let cwd = CString::new(cwd.as_os_str().as_bytes()).unwrap_or_else(|_| c"/".into());
    // The sandbox's limits: its cgroups, and its init's RLIMIT_NPROC where that stands in for
    // them (see `runtime::limits`).
    let cgroups = crate::runtime::cgroup::open_procs_of(pid)
        .map_err(io("opening the sandbox's cgroups to join them"))?;
    let cgroup_fds: Vec<std::os::fd::RawFd> = cgroups
        .iter()
        .map(std::os::fd::AsRawFd::as_raw_fd)
        .collect();
    let mut nproc = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: reads another process's limit into a local struct.
    if unsafe { libc::prlimit(pid, libc::RLIMIT_NPROC, std::ptr::null(), &mut nproc) } != 0 {
        return Err(SessionError::Io {
            what: "reading the sandbox's process limit".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let pty = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        Some(nix::pty::openpty(None, None).map_err(|e| SessionError::Io {
            what: "opening a pseudo-terminal for the session".into(),
            source: e.into(),
        })?)
    } else {
        None
    };
    // SAFETY: this process is single-threaded here (see above); the child only makes system
    // calls and allocates before its own exec.
    match unsafe { fork() }.map_err(|e| SessionError::Io {
        what: "starting the session".into(),
        source: e.into(),
    })? {
        ForkResult::Child => {
            // If this aisb dies (even by SIGKILL), its session ends too: nothing stays behind
            // holding the sandbox up.
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            let slave = pty.map(|p| {
                drop(p.master);
                p.slave
            });
            // SAFETY: setrlimit on ourselves with a struct read above.
            let limited = crate::runtime::cgroup::join(&cgroup_fds).is_ok()
                && unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &nproc) } == 0;
            if !limited {
                eprintln!("aisb: cannot put the session under the sandbox's limits");
                // SAFETY: leaving the forked child without running the parent's destructors.
                unsafe { libc::_exit(125) }
            }
            let code = join_and_run(&ns, &cwd, &argv, &env, slave.as_ref());
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            let Some(pty) = pty else {
                return Ok(wait_code(child));
            };
            drop(pty.slave);
            let master = pty.master;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&master);
            crate::runtime::console::sync_size(fd);
            let raw = crate::runtime::console::RawMode::enter();
            // Window size changes follow the caller's terminal.
            let mut winch = nix::sys::signal::SigSet::empty();
            winch.add(nix::sys::signal::Signal::SIGWINCH);
            let _ = winch.thread_block();
            std::thread::spawn(move || loop {
                if winch.wait().is_ok() {
                    crate::runtime::console::sync_size(fd);
                }
            });
            let output = crate::runtime::console::proxy(master).map_err(|e| SessionError::Io {
                what: "connecting the session's terminal".into(),
                source: e,
            })?;
            let code = wait_code(child);
            let _ = output.join();
            drop(raw);
            Ok(code)
        }
    }
}

fn wait_code(child: Pid) -> i32 {
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, c)) => return c,
            Ok(WaitStatus::Signaled(_, s, _)) => return 128 + s as i32,
            Err(nix::Error::EINTR) => continue,
            Ok(_) => continue,
            Err(_) => return 125,
        }
    }
}

fn join_and_run(
    ns: &[(OwnedFd, CloneFlags)],
    cwd: &CString,
    argv: &[CString],
    env: &[CString],
    tty: Option<&OwnedFd>,
) -> i32 {
    for (fd, flag) in ns {
        if let Err(e) = setns(fd.as_fd(), *flag) {
            // The same namespace as ours (nothing to join) answers EINVAL for a user namespace.
            if !(*flag == CloneFlags::CLONE_NEWUSER && e == nix::Error::EINVAL) {
                eprintln!("aisb: cannot join the sandbox ({flag:?}): {e}");
                return 125;
            }
        }
    }
    // Joining a PID namespace takes effect for children: one more fork.
    // SAFETY: single-threaded child.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            // The session's owner ignores the terminal's signals while it waits: the command
            // gets them with their usual meaning.
            for sig in [
                nix::sys::signal::Signal::SIGINT,
                nix::sys::signal::Signal::SIGQUIT,
            ] {
                // SAFETY: restoring a default disposition.
                let _ =
                    unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
            }
            let _ = nix::sys::signal::SigSet::all().thread_unblock();
            if let Some(tty) = tty {
                // A session of its own, with the pseudo-terminal as its controlling terminal.
                let _ = nix::unistd::setsid();
                // SAFETY: TIOCSCTTY on a terminal descriptor we hold.
                unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(tty), libc::TIOCSCTTY, 0) };
                let fd = std::os::fd::AsRawFd::as_raw_fd(tty);
                for target in 0..3 {
                    let _ = nix::unistd::dup2(fd, target);
                }
                if fd > 2 {
                    // SAFETY: the command gets the terminal as 0-2 only; this process execs
                    // next, so the OwnedFd is never dropped (no double close).
                    unsafe { libc::close(fd) };
                }
            }
            let _ = nix::unistd::chdir(cwd.as_c_str());
            if let Err(e) = crate::init::harden(&crate::init::Options::default()) {
                eprintln!("aisb: cannot harden the session: {e}");
                // SAFETY: exiting the forked child.
                unsafe { libc::_exit(125) }
            }
            let err = nix::unistd::execvpe(&argv[0], argv, env).unwrap_err();
            eprintln!(
                "aisb: cannot run `{}`: {}",
                argv[0].to_string_lossy(),
                err.desc()
            );
            // SAFETY: exiting the forked child.
            unsafe { libc::_exit(if err == nix::Error::ENOENT { 127 } else { 126 }) }
        }
        Ok(ForkResult::Parent { child }) => wait_code(child),
        Err(e) => {
            eprintln!("aisb: cannot start the session: {e}");
            125
        }
    }
}
