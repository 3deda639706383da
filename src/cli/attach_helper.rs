use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use crate::Error;

/// Join a running sandbox and run a command there (a single-threaded helper; not for direct
/// use: `aisb exec` and `aisb up NAME` start it)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// An inherited descriptor of the sandbox init's `/proc/PID` directory
    #[arg(long)]
    pub proc_fd: RawFd,
    /// The init's pid (on the host)
    #[arg(long)]
    pub pid: i32,
    /// The working directory inside
    #[arg(long)]
    pub cwd: PathBuf,
    /// An inherited Unix socket: the session gets a pseudo-terminal from the sandbox's own
    /// devpts, whose controlling side is sent back over it
    #[arg(long)]
    pub tty_sock: Option<RawFd>,
    #[arg(last = true, required = true)]
    pub command: Vec<OsString>,
}

/// An inherited descriptor named on the command line, after checking that it is open, is not
/// one of stdin/stdout/stderr, and is what it must be.
fn inherited(fd: RawFd, what: &str, is_right: impl Fn(&OwnedFd) -> bool) -> Result<OwnedFd, i32> {
    let open = fd > 2 && nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_ok();
    if !open {
        eprintln!("aisb __attach: descriptor {fd} ({what}) is not open (this helper is started by `aisb exec`)");
        return Err(125);
    }
    // SAFETY: the descriptor is open (checked above) and was handed to this process for it
    // alone: nothing else in this fresh process owns or closes it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    if !is_right(&owned) {
        eprintln!("aisb __attach: descriptor {fd} is not {what}");
        return Err(125);
    }
    Ok(owned)
}

pub fn run(a: Args) -> Result<i32, Error> {
    let init = match inherited(a.proc_fd, "a /proc/PID directory", |fd| {
        nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(fd))
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
    }) {
        Ok(fd) => fd,
        Err(code) => return Ok(code),
    };
    let tty_sock = match a.tty_sock.map(|fd| {
        inherited(fd, "a Unix socket", |fd| {
            nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(fd))
                .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK)
        })
    }) {
        None => None,
        Some(Ok(fd)) => Some(fd),
        Some(Err(code)) => return Ok(code),
    };
    Ok(crate::session::join::run(crate::session::join::Request {
        init,
        pid: a.pid,
        cwd: a.cwd,
        tty_sock,
        command: a.command,
    }))
}
