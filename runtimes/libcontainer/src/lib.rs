//! The libcontainer backend: create, start, wait for and delete a container from an OCI bundle
//! with youki's `libcontainer`, in-process, no daemon.
//!
//! libcontainer `clone3`s and runs Rust code in the children: from a process with threads it
//! can deadlock on a lock held at clone time. [`run`] must therefore be called from a
//! single-threaded process (aisb re-executes itself as a hidden helper for this) and it never
//! starts a thread itself: signals are waited for with `sigwait`, not a handler thread.

use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::syscall::syscall::SyscallType;
use libcontainer::workload::default::DefaultExecutor;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

#[derive(Debug, thiserror::Error)]
pub enum LibcontainerError {
    #[error("libcontainer: {0}")]
    Container(#[from] libcontainer::error::LibcontainerError),
    #[error("the container has no init pid after start")]
    NoPid,
    #[error("waiting for the container failed: {0}")]
    Wait(nix::Error),
    #[error("the calling process has {0} threads; libcontainer must run single-threaded")]
    Threaded(usize),
}

/// Signals forwarded to the container's init (which forwards them to the workload).
pub const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(1)
}

/// Remove what crashed earlier runs left in `state_root`: containers named `PREFIX-PID` whose
/// run (PID) is gone, and any container with our own id.
fn remove_stale(state_root: &Path, id: &str) {
    let Ok(entries) = std::fs::read_dir(state_root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let owner_alive = name
            .rsplit_once('-')
            .and_then(|(_, pid)| pid.parse::<i32>().ok())
            .is_some_and(|pid| kill(Pid::from_raw(pid), None).is_ok());
        if name == id || !owner_alive {
            let dir = e.path();
            if let Ok(mut c) = Container::load(dir.clone()) {
                let _ = c.delete(true);
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Say on stderr what youki reports as an error. youki logs what fails in the container's own
/// processes (the intermediate process; the init before the workload's exec: a mount, a
/// namespace, the exec itself) through `tracing` only; without a subscriber a sandbox that did
/// not start said nothing at all. Each line: `aisb: libcontainer: MESSAGE`. Call once, before
/// [`run`]; it starts no thread.
pub fn report_errors() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::ERROR)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false)
        .with_writer(|| Prefixed(std::io::stderr()))
        .try_init();
}

/// stderr with `aisb: libcontainer: ` before each event (the formatter writes one event with
/// one `write_all`).
struct Prefixed(std::io::Stderr);

impl std::io::Write for Prefixed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut line = Vec::with_capacity(buf.len() + 20);
        line.extend_from_slice(b"aisb: libcontainer: ");
        line.extend_from_slice(buf);
        self.0.write_all(&line)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Deletes the container whatever happens after it was created.
struct Created(Container);

impl Drop for Created {
    fn drop(&mut self) {
        let _ = self.0.delete(true);
    }
}

/// Run the bundle to completion; returns the init's exit code (128+N for a signal).
/// `console_socket`: where to send the pseudo-terminal's master when the spec asks for a
/// terminal (the caller listens there). `pid_file`: where to write the init's pid once it
/// runs (for sessions that attach to it). `ready`: written the init's pid (and closed) once
/// the container runs. `exited`: called once the init has exited, before the container and
/// its cgroup are deleted (to read what the cgroup recorded).
pub fn run(
    bundle: &Path,
    state_root: &Path,
    id: &str,
    console_socket: Option<&Path>,
    pid_file: Option<&Path>,
    ready: Option<std::os::fd::OwnedFd>,
    exited: &mut dyn FnMut(),
) -> Result<i32, LibcontainerError> {
    let n = threads();
    if n > 1 {
        return Err(LibcontainerError::Threaded(n));
    }
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set.add(Signal::SIGCHLD);
    set.thread_block().map_err(LibcontainerError::Wait)?;
    remove_stale(state_root, id);
    // libcontainer only takes a console socket in detached mode, where the container's init
    // may be re-parented: as a subreaper we still get it back to wait for.
    nix::sys::prctl::set_child_subreaper(true).map_err(LibcontainerError::Wait)?;
    let container = ContainerBuilder::new(id.to_string(), SyscallType::default())
        .with_executor(DefaultExecutor {})
        .with_root_path(PathBuf::from(state_root))?
        .with_console_socket(console_socket)
        .validate_id()?
        .as_init(bundle)
        .with_systemd(false)
        .with_detach(console_socket.is_some())
        .build()?;
    let mut created = Created(container);
    created.0.start()?;
    let pid = created.0.pid().ok_or(LibcontainerError::NoPid)?;
    if let Some(f) = pid_file {
        let _ = std::fs::write(f, pid.to_string());
    }
    if let Some(fd) = ready {
        let _ =
            std::io::Write::write_all(&mut std::fs::File::from(fd), format!("{pid}\n").as_bytes());
    }
    let code = wait(pid, &set)?;
    exited();
    drop(created);
    Ok(code)
}

/// Reap until the init exits, forwarding the other signals to it.
fn wait(pid: Pid, set: &SigSet) -> Result<i32, LibcontainerError> {
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(code),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(128 + sig as i32),
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(LibcontainerError::Wait(e)),
        }
        match set.wait() {
            Ok(Signal::SIGCHLD) | Err(_) => {}
            Ok(sig) => {
                let _ = kill(pid, sig);
            }
        }
    }
}
