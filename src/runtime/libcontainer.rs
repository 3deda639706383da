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
    // The helper writes the init's pid there once the container runs (complete by then).
    let ready = live.as_ref().and_then(|l| l.ready_fd());
    if let Some(fd) = ready {
        cmd.arg("--ready-fd").arg(fd.to_string());
    }
    // If aisb dies (even by SIGKILL), the helper gets SIGTERM, forwards it to the sandbox,
    // waits for it and deletes the container: nothing is left running.
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            if let Some(fd) = ready {
                nix::fcntl::fcntl(
                    fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )?;
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
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
        let _ = out.join();
    }
    drop(raw);
    Ok(exit_code(status))
}
