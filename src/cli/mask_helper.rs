use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;

/// Mask paths inside a running sandbox (the live mask layer's helper; not for direct use)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A descriptor of the sandbox's mount namespace, inherited.
    pub ns_fd: i32,
    /// Where the project is inside the sandbox; none: the reporting layer of masks alone.
    pub project: Option<PathBuf>,
    /// A descriptor of the audit log (appended to), inherited: denials of masked paths are
    /// written there (see `runtime::live::deny`).
    #[arg(long)]
    pub audit_fd: Option<i32>,
    /// The agent whose run it is, for the denials' events.
    #[arg(long)]
    pub agent: Option<String>,
}

pub fn run(a: Args) -> i32 {
    // Only a descriptor that is open here is taken (the host side passes it, nothing else).
    if a.ns_fd <= 2 || nix::fcntl::fcntl(a.ns_fd, nix::fcntl::FcntlArg::F_GETFD).is_err() {
        eprintln!("aisb: __mask is started by aisb itself, with a namespace descriptor");
        return 2;
    }
    // SAFETY: checked open above; the parent passed it for this process alone.
    let mnt = unsafe { OwnedFd::from_raw_fd(a.ns_fd) };
    let audit = a
        .audit_fd
        .filter(|fd| *fd > 2 && nix::fcntl::fcntl(*fd, nix::fcntl::FcntlArg::F_GETFD).is_ok())
        // SAFETY: checked open above; passed for this process alone.
        .map(|fd| std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }));
    crate::runtime::live::masker::serve(mnt, a.project.as_deref(), audit, a.agent)
}
