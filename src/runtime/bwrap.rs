//! Start a bundle with bubblewrap, forwarding signals to the sandbox's init.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use oci_spec::runtime::Spec;

use super::{exit_code, RuntimeError};

/// `rootfs_symlinks`: (link inside, target), recreated on bwrap's empty root.
pub fn run(
    spec: &Spec,
    rootfs_symlinks: Vec<(PathBuf, PathBuf)>,
    interactive: bool,
    pid_file: Option<&std::path::Path>,
) -> Result<i32, RuntimeError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| RuntimeError::Io { what, source }
    };
    let mut inputs = aisb_bwrap::inputs(spec, rootfs_symlinks);
    let (info_r, info_w): (OwnedFd, OwnedFd) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| RuntimeError::Io {
            what: "creating a pipe".into(),
            source: e.into(),
        })?;
    inputs.info_fd = Some(info_w.as_raw_fd());
    inputs.new_session = !interactive;
    let args = aisb_bwrap::argv(spec, &inputs)?;

    // Signals meant for the sandbox are taken here and sent to its init, which forwards them
    // to the workload; bwrap itself ignores the terminal's (it would die and SIGKILL everything).
    let (blocked, set) = super::take_signals(interactive, false)?;
    let mut cmd = aisb_bwrap::command(&args);
    let w = info_w.as_raw_fd();
    // SAFETY: only async-signal-safe calls (fcntl, signal) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            nix::fcntl::fcntl(
                w,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )?;
            for s in [Signal::SIGINT, Signal::SIGQUIT] {
                nix::sys::signal::signal(s, nix::sys::signal::SigHandler::SigIgn)?;
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    drop(info_w);
    let mut child = match spawned {
        Ok(c) => c,
        Err(source) => {
            let _ = blocked.thread_unblock();
            return Err(RuntimeError::Spawn {
                program: "bwrap".into(),
                source,
            });
        }
    };
    let mut info = String::new();
    let _ = std::fs::File::from(info_r).read_to_string(&mut info);
    let init_pid = serde_json::from_str::<serde_json::Value>(&info)
        .ok()
        .and_then(|v| v["child-pid"].as_i64())
        .map(|p| Pid::from_raw(p as i32));
    if let (Some(f), Some(pid)) = (pid_file, init_pid) {
        let _ = std::fs::write(f, pid.to_string());
    }
    let bwrap_pid = Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || loop {
        if let Ok(sig) = set.wait() {
            let _ = kill(init_pid.unwrap_or(bwrap_pid), sig);
        }
    });
    let status = child.wait().map_err(io("waiting for bwrap"))?;
    Ok(exit_code(status))
}
