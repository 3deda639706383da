//! Start a bundle with bubblewrap, forwarding signals to the sandbox's init.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;

use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;
use oci_spec::runtime::Spec;

use super::{exit_code, RuntimeError};

/// Signals sent to aisb that are meant for the sandbox.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];
/// The terminal's own: on a terminal they already reach the sandbox's foreground process
/// group (the workload shares our session), so they are only forwarded when it does not.
const TERMINAL: [Signal; 2] = [Signal::SIGINT, Signal::SIGQUIT];

pub fn run(spec: &Spec, bundle: &Path, interactive: bool) -> Result<i32, RuntimeError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| RuntimeError::Io { what, source }
    };
    let mut inputs =
        aisb_bwrap::inputs_from_bundle(spec, bundle).map_err(io("reading the bundle"))?;
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
    let mut blocked = SigSet::empty();
    let mut set = SigSet::empty();
    for s in FORWARDED.iter().chain(&TERMINAL) {
        blocked.add(*s);
        if !(interactive && TERMINAL.contains(s)) {
            set.add(*s);
        }
    }
    blocked.thread_block().map_err(|e| RuntimeError::Io {
        what: "blocking signals".into(),
        source: e.into(),
    })?;
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
    let bwrap_pid = Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || loop {
        if let Ok(sig) = set.wait() {
            let _ = kill(init_pid.unwrap_or(bwrap_pid), sig);
        }
    });
    let status = child.wait().map_err(io("waiting for bwrap"))?;
    Ok(exit_code(status))
}
