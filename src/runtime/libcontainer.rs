//! Start a bundle with libcontainer. libcontainer must not run in a process with threads, so
//! the work happens in a fresh helper process (`aisb __libcontainer`), which this process
//! waits for and forwards signals to.

use std::path::Path;

use nix::sys::signal::{kill, Signal};
use std::os::fd::AsRawFd;

use nix::unistd::Pid;

use super::{exit_code, RuntimeError};

/// `exe`: the running aisb binary, re-executed as the helper.
#[allow(clippy::too_many_arguments)]
pub fn run(
    exe: &Path,
    bundle: &Path,
    state_root: &Path,
    id: &str,
    interactive: bool,
    terminal: bool,
    pid_file: Option<&Path>,
    root_mount: Option<&super::rootmount::RootMount>,
    mut live: Option<&mut super::live::Live>,
    userns: Option<&crate::userns::IdMaps>,
) -> Result<i32, RuntimeError> {
    let console = if terminal {
        Some(
            super::console::ConsoleSocket::listen().map_err(|source| RuntimeError::Io {
                what: "creating the console socket".into(),
                source,
            })?,
        )
    } else {
        None
    };
    // Without a console of its own, the sandbox gets aisb's pseudo-terminal in place of each
    // of the caller's standard descriptors that is a terminal: what it prints there is
    // filtered as the console's is.
    let guard_io = |source| RuntimeError::Io {
        what: "giving the sandbox a terminal".into(),
        source,
    };
    let mut guard = if terminal {
        None
    } else {
        super::console::TerminalGuard::install(super::console::Relay::Lines, !super::detached())
            .map_err(guard_io)?
    };
    let (blocked, set) = super::take_signals(interactive, terminal)?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("__libcontainer")
        .arg(bundle)
        .arg(state_root)
        .arg(id);
    if let Some(c) = &console {
        cmd.arg("--console-socket").arg(&c.path);
    }
    if let Some(f) = pid_file {
        cmd.arg("--pid-file").arg(f);
    }
    if let Some(m) = root_mount {
        cmd.arg("--root-mount").arg(&m.arg);
    }
    // An ordinary user's image: the helper runs in a user namespace with their whole map
    // (spec `Rootless::outer_userns`), made by itself and mapped from here.
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
            what: "creating a pipe".into(),
            source: e.into(),
        })
    };
    let handshake = match userns {
        Some(_) => Some((pipe()?, pipe()?)),
        None => None,
    };
    let child_ends = handshake
        .as_ref()
        .map(|((_, ready_w), (go_r, _))| (ready_w.as_raw_fd(), go_r.as_raw_fd()));
    if let Some((r, g)) = child_ends {
        cmd.arg("--userns-fds").arg(format!("{r},{g}"));
    }
    // The helper writes the init's pid there once the container runs (complete by then).
    let ready = live.as_ref().and_then(|l| l.ready_fd());
    if let Some(fd) = ready {
        cmd.arg("--ready-fd").arg(fd.to_string());
    }
    // If aisb dies (even by SIGKILL), the helper gets SIGTERM, forwards it to the sandbox,
    // waits for it and deletes the container: nothing is left running.
    // SAFETY: prctl is async-signal-safe.
    // Nothing aisb inherited reaches the helper, hence the container: not a descriptor beyond
    // those named above, and not systemd's socket activation, which youki would honour by
    // keeping LISTEN_FDS descriptors open into the container.
    for var in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
        cmd.env_remove(var);
    }
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            super::cloexec_from(3)?;
            let handshake = child_ends.map(|(r, g)| [r, g]).unwrap_or([-1, -1]);
            for fd in [ready.unwrap_or(-1)].into_iter().chain(handshake) {
                if fd >= 0 {
                    nix::fcntl::fcntl(
                        fd,
                        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                    )?;
                }
            }
            Ok(())
        });
    }
    let _drains = null_outputs(&mut cmd).map_err(|source| RuntimeError::Io {
        what: "giving the sandbox an output in place of /dev/null".into(),
        source,
    })?;
    if let Some(g) = &guard {
        g.apply(&mut cmd).map_err(guard_io)?;
    }
    if super::detached() {
        cmd.stdin(std::process::Stdio::null());
    }
    let spawned = cmd.spawn();
    // The command keeps its copies of the terminal's descriptors: gone with it, so that the
    // relay sees the end of the sandbox's output when the sandbox ends.
    drop(cmd);
    if let Some(g) = guard.as_mut() {
        g.spawned();
    }
    if let Some(l) = live.as_mut() {
        l.spawned();
    }
    let mut child = match spawned {
        Ok(c) => c,
        Err(source) => {
            let _ = blocked.thread_unblock();
            return Err(RuntimeError::Spawn {
                program: exe.display().to_string(),
                source,
            });
        }
    };
    let helper = Pid::from_raw(child.id() as i32);
    if let (Some(((ready_r, ready_w), (go_r, go_w))), Some(maps)) = (handshake, userns) {
        drop((ready_w, go_r));
        let mapped = (|| {
            let mut b = [0u8; 1];
            if nix::unistd::read(ready_r.as_raw_fd(), &mut b)? != 1 {
                return Err(std::io::Error::other(
                    "the libcontainer helper made no user namespace",
                ));
            }
            crate::userns::write_maps(helper.as_raw(), maps)?;
            nix::unistd::write(&go_w, b"m")?;
            Ok(())
        })();
        if let Err(source) = mapped {
            let _ = child.kill();
            let _ = child.wait();
            let _ = blocked.thread_unblock();
            return Err(RuntimeError::Userns {
                what: "mapping the sandbox's user namespace over your subordinate ids".into(),
                source,
            });
        }
    }
    let io = |what: &'static str| {
        move |source| RuntimeError::Io {
            what: what.into(),
            source,
        }
    };
    let mut master_fd = None;
    let mut output = None;
    let mut raw = None;
    if let Some(c) = &console {
        if let Some(master) = c
            .receive(&mut child)
            .map_err(io("receiving the sandbox's terminal"))?
        {
            super::console::sync_size(master.as_raw_fd());
            master_fd = Some(master.as_raw_fd());
            raw = Some(super::console::RawMode::enter());
            output = Some(
                super::console::proxy(master).map_err(io("connecting the sandbox's terminal"))?,
            );
        }
    }
    std::thread::spawn(move || loop {
        match set.wait() {
            Ok(Signal::SIGWINCH) => {
                if let Some(fd) = master_fd {
                    super::console::sync_size(fd);
                }
            }
            Ok(sig) => {
                let _ = kill(helper, sig);
            }
            Err(_) => {}
        }
    });
    let status = child
        .wait()
        .map_err(io("waiting for the libcontainer helper"))?;
    if let Some(out) = output {
        // A process left behind may hold the console open: waited for, not forever.
        super::console::join_for(out, std::time::Duration::from_secs(5));
    }
    if let Some(g) = guard {
        g.finish();
    }
    drop(raw);
    Ok(exit_code(status))
}

/// youki's init reopens each standard descriptor that is the host's `/dev/null` with the
/// container's own `/dev/null`, read-only: a workload whose output the caller sends to
/// `/dev/null` (`aisb run … > /dev/null`, a task runner, CI) could not write it (EBADF). Such an
/// output is given a pipe instead, whose other end a thread reads and drops; it ends when the
/// sandbox's last writer does.
fn null_outputs(
    cmd: &mut std::process::Command,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let Ok(null) = nix::sys::stat::stat("/dev/null") else {
        return Ok(Vec::new());
    };
    let mut drains = Vec::new();
    for fd in [1, 2] {
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            continue;
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFCHR || st.st_rdev != null.st_rdev {
            continue;
        }
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let w = std::fs::File::from(w);
        if fd == 1 {
            cmd.stdout(w);
        } else {
            cmd.stderr(w);
        }
        drains.push(std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::fs::File::from(r), &mut std::io::sink());
        }));
    }
    Ok(drains)
}
