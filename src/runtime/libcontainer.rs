//! Start a bundle with libcontainer. libcontainer must not run in a process with threads, so
//! the work happens in a fresh helper process (`aisb __libcontainer`), which this process
//! waits for and forwards signals to.

use std::path::Path;

use nix::sys::signal::{kill, SigSet, Signal};
use nix::unistd::Pid;

use super::{exit_code, RuntimeError};

const FORWARDED: [Signal; 4] = [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGUSR1, Signal::SIGUSR2];
const TERMINAL: [Signal; 2] = [Signal::SIGINT, Signal::SIGQUIT];

pub fn run(bundle: &Path, state_root: &Path, id: &str, interactive: bool) -> Result<i32, RuntimeError> {
    let exe = std::env::current_exe().map_err(|source| RuntimeError::Io { what: "locating the aisb binary".into(), source })?;
    let mut blocked = SigSet::empty();
    let mut set = SigSet::empty();
    for s in FORWARDED.iter().chain(&TERMINAL) {
        blocked.add(*s);
        if !(interactive && TERMINAL.contains(s)) {
            set.add(*s);
        }
    }
    blocked.thread_block().map_err(|e| RuntimeError::Io { what: "blocking signals".into(), source: e.into() })?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.arg("__libcontainer").arg(bundle).arg(state_root).arg(id);
    // If aisb dies (even by SIGKILL), the helper gets SIGTERM, forwards it to the sandbox,
    // waits for it and deletes the container: nothing is left running.
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(source) => {
            let _ = blocked.thread_unblock();
            return Err(RuntimeError::Spawn { program: exe.display().to_string(), source });
        }
    };
    let helper = Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || loop {
        if let Ok(sig) = set.wait() {
            let _ = kill(helper, sig);
        }
    });
    let status = child.wait().map_err(|source| RuntimeError::Io { what: "waiting for the libcontainer helper".into(), source })?;
    Ok(exit_code(status))
}
