//! A second session in a running sandbox, from the caller's side: find the sandbox's init,
//! give the session a pseudo-terminal when the caller has a terminal (its own, in a new
//! session, never the caller's; from the sandbox's own devpts, which the helper opens and
//! hands back, so that `tty` names it inside; SIGWINCH resizes it), and start the session helper (`aisb __attach`, see
//! [`super::join`]) which joins the sandbox, hardens itself as the init hardens the workload
//! and runs the command there. The caller may run threads (the sync watcher, the sandbox's
//! own thread): nothing after its fork but the helper's exec happens in it. Works on both
//! backends and rootless.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

use nix::fcntl::{fcntl, openat, FcntlArg, FdFlag, OFlag};
use nix::sys::stat::Mode;

use super::SessionError;

/// Is `pid` a sandbox init that finished setting the sandbox up? The runtimes report the pid
/// before the sandbox is complete (bwrap's info pipe, libcontainer's start): joining then
/// could see a mount namespace without its masks. The init is running once the process is
/// our init binary, and done once it has started its workload (it forks only after
/// hardening).
pub fn ready(pid: i32) -> bool {
    open_process(pid).is_ok_and(|dir| ready_at(&dir, pid))
}

/// `/proc/PID`, open: files read through it are that process's, or fail once it is gone (a
/// pid reused meanwhile cannot stand in for it).
fn open_process(pid: i32) -> nix::Result<OwnedFd> {
    let fd = openat(
        None,
        format!("/proc/{pid}").as_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: `openat` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The bytes of `path` below `dir`, if it can be read.
fn read_at(dir: &OwnedFd, path: &str) -> Option<Vec<u8>> {
    let fd = openat(
        Some(dir.as_raw_fd()),
        path,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    // SAFETY: `openat` returned a new descriptor that nothing else owns.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut file, &mut bytes).ok()?;
    Some(bytes)
}

fn ready_at(dir: &OwnedFd, pid: i32) -> bool {
    let cmdline = read_at(dir, "cmdline").unwrap_or_default();
    let is_init = cmdline.starts_with(crate::vocab::INIT_PATH.as_bytes())
        && cmdline.get(crate::vocab::INIT_PATH.len()) == Some(&0);
    // Without CONFIG_PROC_CHILDREN (no such file), the exec of the init is the best sign.
    is_init
        && read_at(dir, &format!("task/{pid}/children"))
            .is_none_or(|c| !c.iter().all(u8::is_ascii_whitespace))
}

/// Run `command` in `cwd` inside the sandbox whose init is `pid`; returns its exit code
/// (128+N for a signal, 125 when the session could not start).
pub fn attach(pid: i32, command: &[String], cwd: &std::path::Path) -> Result<i32, SessionError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source: std::io::Error| SessionError::Io { what, source }
    };
    let init = open_process(pid)
        .ok()
        .filter(|dir| ready_at(dir, pid))
        .ok_or_else(|| SessionError::Io {
            what: format!("the sandbox's init (pid {pid}) is gone"),
            source: std::io::ErrorKind::NotFound.into(),
        })?;
    if command.is_empty() {
        return Err(SessionError::Io {
            what: "the command is empty".into(),
            source: std::io::ErrorKind::InvalidInput.into(),
        });
    }
    // With a terminal, the helper opens the session's pseudo-terminal in the sandbox's own
    // devpts and sends its controlling side back over this socket pair.
    let pty = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        // CLOEXEC on both: other threads start programs too (git, from the watcher).
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| io("making the session's terminal channel")(e.into()))?;
        Some((ours, theirs))
    } else {
        None
    };
    let exe = std::env::current_exe().map_err(io("locating the aisb binary"))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("__attach")
        .arg(format!("--proc-fd={}", init.as_raw_fd()))
        .arg(format!("--pid={pid}"))
        .arg("--cwd")
        .arg(cwd);
    let inherited: Vec<i32> = [
        Some(init.as_raw_fd()),
        pty.as_ref().map(|p| p.1.as_raw_fd()),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let Some(p) = &pty {
        cmd.arg(format!("--tty-sock={}", p.1.as_raw_fd()));
    }
    cmd.arg("--").args(command);
    // The sandbox's limits hold for the session too: its cgroups, joined before the helper
    // starts (the helper copies the init's resource limits itself).
    let cgroups = crate::runtime::cgroup::open_procs_of(pid)
        .map_err(io("opening the sandbox's cgroups to join them"))?;
    let cgroup_fds: Vec<i32> = cgroups.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: runs between fork and exec in a process that may have other threads: write,
    // fcntl and prctl only, on descriptors this function keeps open until the spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            crate::runtime::cgroup::join(&cgroup_fds)?;
            // Only the descriptors named on its command line reach the helper: nothing this
            // aisb inherited or opened.
            crate::runtime::cloexec_from(3)?;
            for &fd in &inherited {
                fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty()))?;
            }
            // If this aisb dies (even by SIGKILL), its session ends too: nothing stays behind
            // holding the sandbox up.
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            Ok(())
        });
    }
    // Output on the caller's terminal without a session terminal: through aisb's own, whose
    // output is filtered as the session terminal's is.
    let mut guard = match pty {
        Some(_) => None,
        None => crate::runtime::console::TerminalGuard::install(
            crate::runtime::console::Relay::Lines,
            true,
        )
        .map_err(io("giving the session a terminal"))?,
    };
    if let Some(g) = &guard {
        g.apply(&mut cmd)
            .map_err(io("giving the session a terminal"))?;
    }
    let spawned = cmd.spawn();
    // The command keeps its copies of the terminal's descriptors: gone with it, so that the
    // relay sees the end of the session's output when it ends.
    drop(cmd);
    if let Some(g) = guard.as_mut() {
        g.spawned();
    }
    drop(init);
    drop(cgroups);
    let mut helper = spawned.map_err(io("starting the session helper"))?;
    let Some(pty) = pty else {
        let status = helper.wait().map_err(io("waiting for the session"))?;
        if let Some(g) = guard {
            g.finish();
        }
        return Ok(crate::runtime::exit_code(status));
    };
    let (ours, theirs) = pty;
    drop(theirs);
    let Some(master) = receive_fd(&ours) else {
        // The helper could not open one: it said why, and ends.
        let status = helper.wait().map_err(io("waiting for the session"))?;
        return Ok(crate::runtime::exit_code(status));
    };
    drop(ours);
    let fd = master.as_raw_fd();
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
    let status = helper.wait().map_err(io("waiting for the session"))?;
    // A process the session left behind may hold its terminal open: its output is waited
    // for a few seconds, not forever.
    crate::runtime::console::join_for(output, std::time::Duration::from_secs(5));
    drop(raw);
    Ok(crate::runtime::exit_code(status))
}

/// The one descriptor the session helper sends over `sock` (the controlling side of the
/// session's pseudo-terminal), or None when it closed the socket without sending one.
fn receive_fd(sock: &OwnedFd) -> Option<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = loop {
        match nix::sys::socket::recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::Error::EINTR) => continue,
            r => break r.ok()?,
        }
    };
    let mut fds = msg.cmsgs().ok()?.flat_map(|c| match c {
        nix::sys::socket::ControlMessageOwned::ScmRights(fds) => fds,
        _ => Vec::new(),
    });
    let fd = fds.next()?;
    // SAFETY: SCM_RIGHTS gave this process a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    for extra in fds {
        // SAFETY: as above; descriptors beyond the one expected are closed, not leaked.
        drop(unsafe { OwnedFd::from_raw_fd(extra) });
    }
    Some(fd)
}
