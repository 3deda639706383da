//! The session helper (`aisb __attach`, started by [`super::attach`]): a fresh process of our
//! own binary, single-threaded by construction, that joins a running sandbox and starts a
//! command in it. It exists because the `aisb` that asks for a session may run threads (the
//! sync watcher, the thread running the sandbox): joining a user namespace needs a
//! single-threaded caller, and the child of a multi-threaded fork may not run what hardening
//! runs (seccompiler, the caps crate allocate). libcontainer re-executes itself for the same
//! reason.
//!
//! In order:
//! 1. Join the sandbox's namespaces. The user namespace that owns the others first (for
//!    bwrap run by an ordinary user it is not the init's own: bwrap puts its sandbox in a
//!    second user namespace nested in the first, which owns the mount, network and other
//!    namespaces; joining the inner one first leaves no capability over them, the EPERM
//!    this order fixes), then mount, network, IPC, UTS, PID and cgroup, then the init's own
//!    user namespace when it is another one, and the namespaces that one owns (the mount
//!    namespace the init makes to mount its masks there). The caller owns every one of them,
//!    so each join is allowed, and every capability it gives is dropped in step 3.
//!    With a terminal, open the session's pseudo-terminal in the sandbox's devpts (now that
//!    its mount namespace is ours) and send the controlling side back to the caller.
//! 2. Take the init's resource limits (never above our own), its working directory and
//!    environment, and find the program along the sandbox's `PATH`.
//! 3. Harden exactly as the init hardens itself before its workload ([`crate::init::harden`]:
//!    no capabilities, no_new_privs, the seccomp filter).
//! 4. Fork (a joined PID namespace applies to children only); the child takes the
//!    pseudo-terminal, if any, and execs. The helper waits and exits with its status.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use nix::fcntl::{openat, OFlag};
use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{SigHandler, SigSet, Signal};
use nix::sys::stat::{fstat, Mode};
use nix::unistd::{fork, ForkResult};

/// What the caller hands over: by inherited descriptors and arguments, nothing by environment
/// (the helper's own environment is the host's, never the sandbox's).
pub struct Request {
    /// `/proc/PID` of the sandbox's init, opened (and checked ready) by the caller: every file
    /// of the init is read through it, so a pid reused meanwhile cannot redirect the join.
    pub init: OwnedFd,
    pub pid: i32,
    pub cwd: PathBuf,
    /// When the session has a terminal: a socket to send the controlling side of its
    /// pseudo-terminal back over (the pseudo-terminal is the sandbox's own, see [`sandbox_pty`]).
    pub tty_sock: Option<OwnedFd>,
    pub command: Vec<OsString>,
}

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(
        "the session helper runs {0} threads: joining a sandbox needs a single-threaded process"
    )]
    Threads(usize),
    #[error("cannot open the sandbox's {what}: {source}")]
    Open { what: String, source: nix::Error },
    #[error("the sandbox's namespaces are not all owned by one user namespace ({0} is not)")]
    Owners(&'static str),
    #[error("cannot join the sandbox's {ns} namespace: {source}")]
    Setns {
        ns: &'static str,
        source: nix::Error,
    },
    #[error("cannot read the sandbox's {what}: {source}")]
    Read {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("cannot take the sandbox's resource limit {resource}: {source}")]
    Limit {
        resource: Resource,
        source: nix::Error,
    },
    #[error("the sandbox stopped while the session was joining it")]
    Stopped,
    #[error("cannot run the command: {0}")]
    Command(#[from] crate::init::exec::ExecError),
    #[error("cannot harden the session: {0}")]
    Harden(#[from] crate::init::InitError),
    #[error("cannot start the session: {0}")]
    Fork(nix::Error),
    #[error("cannot keep the helper's descriptors from the command: {0}")]
    Cloexec(std::io::Error),
    #[error("cannot make the session helper non-dumpable: {0}")]
    Dumpable(nix::Error),
    #[error("cannot open a terminal in the sandbox ({what}): {source}")]
    Pty {
        what: &'static str,
        source: nix::Error,
    },
}

/// The namespaces a session joins besides the user namespaces, in the order joined.
const NAMESPACES: [(&str, CloneFlags); 6] = [
    ("mnt", CloneFlags::CLONE_NEWNS),
    ("net", CloneFlags::CLONE_NEWNET),
    ("ipc", CloneFlags::CLONE_NEWIPC),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("pid", CloneFlags::CLONE_NEWPID),
    ("cgroup", CloneFlags::CLONE_NEWCGROUP),
];

type Resource = libc::__rlimit_resource_t;

/// Every resource limit Linux has (`RLIMIT_NLIMITS` is 16 since 2.6.25).
const RESOURCES: [Resource; 16] = [
    libc::RLIMIT_CPU,
    libc::RLIMIT_FSIZE,
    libc::RLIMIT_DATA,
    libc::RLIMIT_STACK,
    libc::RLIMIT_CORE,
    libc::RLIMIT_RSS,
    libc::RLIMIT_NPROC,
    libc::RLIMIT_NOFILE,
    libc::RLIMIT_MEMLOCK,
    libc::RLIMIT_AS,
    libc::RLIMIT_LOCKS,
    libc::RLIMIT_SIGPENDING,
    libc::RLIMIT_MSGQUEUE,
    libc::RLIMIT_NICE,
    libc::RLIMIT_RTPRIO,
    libc::RLIMIT_RTTIME,
];

/// Run the session; the exit code to exit with (125 when it could not start).
pub fn run(r: Request) -> i32 {
    match join_and_start(r) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("aisb: {e}");
            125
        }
    }
}

fn join_and_start(r: Request) -> Result<i32, JoinError> {
    let threads = std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count());
    if threads != 1 {
        return Err(JoinError::Threads(threads));
    }
    let joined_pid_namespace = join_namespaces(r.init.as_fd())?;
    let tty = match &r.tty_sock {
        Some(sock) => Some(sandbox_pty(sock.as_fd())?),
        None => None,
    };
    drop(r.tty_sock);
    // How the child sees this helper while it lives: from inside a joined PID namespace, not
    // at all (pid 0); otherwise by its pid.
    let helper = if joined_pid_namespace {
        0
    } else {
        nix::unistd::getpid().as_raw()
    };
    let limits = init_limits(r.pid)?;
    let environ = read_at(r.init.as_fd(), "environ")?;
    // The init was alive after the reads above, so `pid` was still its own during them.
    read_at(r.init.as_fd(), "stat").map_err(|_| JoinError::Stopped)?;
    // The host's `/proc/PID` must never reach the command: from a descriptor outside the
    // sandbox's root, `..` walks up to the host's `/` (runc's CVE-2024-21626), and anything
    // inside may open the command's descriptors through its own /proc. Nothing else this
    // helper inherited goes either (the terminal's side is dup'ed onto 0-2 in `start`).
    drop(r.init);
    crate::runtime::cloexec_from(3).map_err(JoinError::Cloexec)?;
    for (resource, limit) in limits {
        set_limit(resource, limit)?;
    }
    if let Err(e) = nix::unistd::chdir(&r.cwd) {
        eprintln!(
            "aisb: {} is not reachable inside the sandbox ({e}); the session starts in /",
            r.cwd.display()
        );
    }
    let env = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(<[u8]>::to_vec);
    let program = crate::init::exec::Exec::prepare(&r.command, env)?;
    crate::init::harden(&crate::init::Options::default())?;
    // The child is born inside the sandbox's PID namespace, holding the caller's terminal on
    // 0-2 until it makes the session's its own: not dumpable from birth (runc's
    // CVE-2016-9962), nothing inside may open its descriptors through /proc. Its exec makes
    // the command dumpable again, holding only what it should. (This helper itself is in no
    // namespace's /proc inside: it joined the PID namespace for its children only.)
    nix::sys::prctl::set_dumpable(false).map_err(JoinError::Dumpable)?;
    // SAFETY: this process is single-threaded (checked above), so the child inherits no lock
    // another thread held; it still calls only async-signal-safe functions (`start`).
    match unsafe { fork() }.map_err(JoinError::Fork)? {
        ForkResult::Child => start(tty.as_ref(), helper, &program),
        ForkResult::Parent { child } => {
            drop(tty);
            Ok(wait_code(child))
        }
    }
}

/// A pseudo-terminal from the sandbox's own devpts (this process has joined its mount
/// namespace), so that inside `tty` names it and `/dev/pts/N` opens it, as for the sandbox's
/// own workload; one from the host's devpts would be a name that does not exist inside. The
/// controlling side is sent over `sock` to the aisb that relays the caller's terminal; the
/// session's side is returned. `/dev/pts` is the sandbox's mount point (its workload cannot
/// mount, nor replace a mount point), and what is opened is checked to be a devpts ptmx.
fn sandbox_pty(sock: BorrowedFd<'_>) -> Result<OwnedFd, JoinError> {
    let err = |what: &'static str| move |source| JoinError::Pty { what, source };
    // O_NONBLOCK: opening cannot hang on something else at that name.
    let fd = nix::fcntl::open(
        "/dev/pts/ptmx",
        OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(err("/dev/pts/ptmx"))?;
    // SAFETY: `open` returned a new descriptor that nothing else owns.
    let master = unsafe { OwnedFd::from_raw_fd(fd) };
    let fs = nix::sys::statfs::fstatfs(&master).map_err(err("/dev/pts/ptmx"))?;
    if fs.filesystem_type() != nix::sys::statfs::DEVPTS_SUPER_MAGIC {
        return Err(JoinError::Pty {
            what: "/dev/pts is not a devpts",
            source: nix::Error::ENOTTY,
        });
    }
    nix::fcntl::fcntl(
        master.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(OFlag::O_RDWR),
    )
    .map_err(err("blocking mode"))?;
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int through the pointer, which outlives the call.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } != 0 {
        return Err(err("unlocking it")(nix::Error::last()));
    }
    // SAFETY: TIOCGPTPEER opens the peer of this master and returns a new descriptor (or -1).
    let peer = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if peer < 0 {
        return Err(err("opening its peer")(nix::Error::last()));
    }
    // SAFETY: the ioctl returned a new descriptor that nothing else owns.
    let peer = unsafe { OwnedFd::from_raw_fd(peer) };
    let fds = [master.as_raw_fd()];
    nix::sys::socket::sendmsg::<()>(
        sock.as_raw_fd(),
        &[std::io::IoSlice::new(b"t")],
        &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .map_err(err("handing it to aisb"))?;
    Ok(peer)
}

fn open_at(dir: BorrowedFd<'_>, path: &str) -> Result<OwnedFd, JoinError> {
    let fd = openat(
        Some(dir.as_raw_fd()),
        path,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|source| JoinError::Open {
        what: path.to_string(),
        source,
    })?;
    // SAFETY: `openat` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn read_at(dir: BorrowedFd<'_>, what: &'static str) -> Result<Vec<u8>, JoinError> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::fs::File::from(open_at(dir, what)?), &mut bytes)
        .map_err(|source| JoinError::Read { what, source })?;
    Ok(bytes)
}

/// The same namespace (nsfs gives each one inode)?
fn same(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    match (fstat(a.as_raw_fd()), fstat(b.as_raw_fd())) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
        _ => false,
    }
}

/// The user namespace that owns namespace `ns`.
fn owner(ns: BorrowedFd<'_>, name: &'static str) -> Result<OwnedFd, JoinError> {
    // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor (or -1).
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), libc::NS_GET_USERNS) };
    if fd < 0 {
        return Err(JoinError::Open {
            what: format!("{name} namespace's owner"),
            source: nix::Error::last(),
        });
    }
    // SAFETY: the ioctl returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn join(ns: BorrowedFd<'_>, name: &'static str, flag: CloneFlags) -> Result<(), JoinError> {
    setns(ns, flag).map_err(|source| JoinError::Setns { ns: name, source })
}

/// Step 1 of the module docs. A namespace the sandbox shares with us is not joined (nothing to
/// join, and it may be one we hold no capability over). Returns whether a PID namespace was
/// joined.
fn join_namespaces(init: BorrowedFd<'_>) -> Result<bool, JoinError> {
    let own_dir: OwnedFd = std::fs::File::open("/proc/self/ns")
        .map_err(|source| JoinError::Read {
            what: "own namespaces",
            source,
        })?
        .into();
    let own_user = open_at(own_dir.as_fd(), "user")?;
    let target_user = open_at(init, "ns/user")?;
    let mut namespaces = Vec::new();
    for (name, flag) in NAMESPACES {
        let target = open_at(init, &format!("ns/{name}"))?;
        let own = open_at(own_dir.as_fd(), name)?;
        namespaces.push((name, flag, target, own));
    }
    // Each namespace is owned by the outer user namespace or by the init's own (the mount
    // namespace the init made to mount its masks and overlays, where bwrap's was not its).
    let mut by_init = Vec::new();
    let mut outer: Option<OwnedFd> = None;
    for (name, _, target, _) in &namespaces {
        let o = owner(target.as_fd(), name)?;
        if same(o.as_fd(), target_user.as_fd()) {
            by_init.push(true);
            continue;
        }
        by_init.push(false);
        match &outer {
            Some(x) if !same(x.as_fd(), o.as_fd()) => return Err(JoinError::Owners(name)),
            Some(_) => {}
            None => outer = Some(o),
        }
    }
    let mut current = own_user;
    let mut joined_pid_namespace = false;
    for (owned, user) in [(false, outer), (true, Some(target_user))] {
        let Some(user) = user else { continue };
        if !same(user.as_fd(), current.as_fd()) {
            join(user.as_fd(), "user", CloneFlags::CLONE_NEWUSER)?;
            current = user;
        }
        for ((name, flag, target, own), _) in namespaces
            .iter()
            .zip(&by_init)
            .filter(|(_, b)| **b == owned)
        {
            if !same(target.as_fd(), own.as_fd()) {
                join(target.as_fd(), name, *flag)?;
                joined_pid_namespace |= *flag == CloneFlags::CLONE_NEWPID;
            }
        }
    }
    Ok(joined_pid_namespace)
}

/// The init's resource limits, each no higher than ours (raising a hard limit would take
/// CAP_SYS_RESOURCE on the host; lower is what the workload has anyway). The sandbox can
/// only ever lower the init's, never raise them, so nothing it did loosens a session.
fn init_limits(pid: i32) -> Result<Vec<(Resource, libc::rlimit64)>, JoinError> {
    let mut limits = Vec::new();
    for resource in RESOURCES {
        let theirs = get_limit(pid, resource)?;
        let ours = get_limit(0, resource)?;
        let hard = theirs.rlim_max.min(ours.rlim_max);
        limits.push((
            resource,
            libc::rlimit64 {
                rlim_cur: theirs.rlim_cur.min(hard),
                rlim_max: hard,
            },
        ));
    }
    Ok(limits)
}

fn get_limit(pid: i32, resource: Resource) -> Result<libc::rlimit64, JoinError> {
    let mut limit = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64 only writes one rlimit64 into `limit`, which outlives the call.
    let r = unsafe { libc::prlimit64(pid, resource, std::ptr::null(), &mut limit) };
    if r != 0 {
        return Err(JoinError::Limit {
            resource,
            source: nix::Error::last(),
        });
    }
    Ok(limit)
}

fn set_limit(resource: Resource, limit: libc::rlimit64) -> Result<(), JoinError> {
    // SAFETY: prlimit64 only reads `limit`, which outlives the call; no old value is asked for.
    let r = unsafe { libc::prlimit64(0, resource, &limit, std::ptr::null_mut()) };
    if r != 0 {
        return Err(JoinError::Limit {
            resource,
            source: nix::Error::last(),
        });
    }
    Ok(())
}

/// In the forked child: the session's own signals and terminal, then the command.
/// Async-signal-safe only (prctl, sigaction, pthread_sigmask, getppid, setsid, ioctl, dup2,
/// close, then [`crate::init::exec::Exec::run`]).
fn start(tty: Option<&OwnedFd>, helper: i32, program: &crate::init::exec::Exec) -> ! {
    // If the helper dies (even by SIGKILL), the session ends too.
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // Another parent means the helper died before the line above took effect.
    if nix::unistd::getppid().as_raw() != helper {
        // SAFETY: _exit ends the child without running the parent's destructors.
        unsafe { libc::_exit(125) }
    }
    // The terminal's signals keep their usual meaning for the command (the aisb that owns
    // the session ignores them while it waits).
    for sig in [Signal::SIGINT, Signal::SIGQUIT] {
        // SAFETY: restoring the default disposition installs no handler.
        let _ = unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) };
    }
    let _ = SigSet::all().thread_unblock();
    // A session of its own, always: without one, /dev/tty inside would be the caller's
    // terminal (the session's own pseudo-terminal, when it has one, is its controlling one).
    let _ = nix::unistd::setsid();
    if let Some(tty) = tty {
        let fd = tty.as_raw_fd();
        // SAFETY: TIOCSCTTY on a terminal descriptor we hold; the argument is an int.
        unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) };
        for target in 0..3 {
            let _ = nix::unistd::dup2(fd, target);
        }
        if fd > 2 {
            // SAFETY: the command gets the terminal as 0-2 only; this process execs or exits
            // next, so the OwnedFd is never dropped here (no double close).
            unsafe { libc::close(fd) };
        }
    }
    program.run()
}

fn wait_code(child: nix::unistd::Pid) -> i32 {
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, c)) => return c,
            Ok(WaitStatus::Signaled(_, s, _)) => return 128 + s as i32,
            Ok(_) | Err(nix::Error::EINTR) => continue,
            Err(_) => return 125,
        }
    }
}
