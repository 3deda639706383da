use std::path::PathBuf;

use crate::Error;

/// Run a bundle with libcontainer (a single-threaded helper; not for direct use)
#[derive(Debug, clap::Args)]
pub struct Args {
    pub bundle: PathBuf,
    pub state_root: PathBuf,
    pub id: String,
    #[arg(long)]
    pub console_socket: Option<PathBuf>,
    #[arg(long)]
    pub pid_file: Option<PathBuf>,
    /// An image root to mount in a private mount namespace first (`runtime::rootmount`).
    #[arg(long)]
    pub root_mount: Option<String>,
    /// A descriptor to write the init's pid to once the container runs (the live mask layer).
    #[arg(long)]
    pub ready_fd: Option<i32>,
    /// READY,GO: first make a user namespace, say so on READY, wait on GO while aisb writes
    /// the caller's map over their subordinate ids (`userns::enter_via`), and run as its root.
    #[arg(long, value_name = "READY,GO")]
    pub userns_fds: Option<String>,
}

pub fn run(a: Args) -> Result<i32, Error> {
    // 125: the sandbox could not start (distinct from any exit code of the workload's own).
    if let Some(fds) = &a.userns_fds {
        let parsed = fds
            .split_once(',')
            .and_then(|(r, g)| Some((r.parse::<i32>().ok()?, g.parse::<i32>().ok()?)))
            .filter(|(r, g)| *r > 2 && *g > 2);
        let entered = match parsed {
            Some((ready, go)) => {
                let r = crate::userns::enter_via(ready, go);
                let _ = nix::unistd::close(ready);
                let _ = nix::unistd::close(go);
                r
            }
            None => Err(std::io::Error::from(std::io::ErrorKind::InvalidInput)),
        };
        if let Err(e) = entered {
            eprintln!("aisb: cannot enter a user namespace over your subordinate ids: {e}\n  help: `aisb doctor` says what is missing");
            return Ok(125);
        }
    }
    if let Some(arg) = &a.root_mount {
        let mounted = crate::runtime::rootmount::RootMount::parse(arg)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))
            .and_then(|m| m.apply());
        if let Err(e) = mounted {
            eprintln!("aisb: cannot mount the image's root: {e}\n  help: images need overlayfs and root (`aisb doctor` checks the host)");
            return Ok(125);
        }
    }
    // The sandbox's cgroup goes with the container: what it recorded (a limit the workload
    // ran into) is kept in the bundle for aisb to report.
    let cgroups_path = std::fs::read(a.bundle.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["linux"]["cgroupsPath"].as_str().map(str::to_string));
    let hits_file = a.bundle.join(crate::runtime::HITS_FILE);
    let mut exited = || {
        if let Some(p) = &cgroups_path {
            let hits = crate::runtime::cgroup::hits_at(p);
            if let Ok(json) = serde_json::to_vec(&hits) {
                let _ = std::fs::write(&hits_file, json);
            }
        }
    };
    // Valid and ours only if it is open; kept from the container's processes.
    let ready = a
        .ready_fd
        .filter(|fd| {
            *fd > 2
                && nix::fcntl::fcntl(
                    *fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
                )
                .is_ok()
        })
        // SAFETY: the parent passed this descriptor for this process alone.
        .map(|fd| unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    aisb_libcontainer::report_errors();
    match aisb_libcontainer::run(
        &a.bundle,
        &a.state_root,
        &a.id,
        a.console_socket.as_deref(),
        a.pid_file.as_deref(),
        ready,
        &mut exited,
    ) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("aisb: the libcontainer backend could not run the sandbox: {e}\n  help: `aisb doctor` checks the host; `--backend bwrap` is the other backend");
            Ok(125)
        }
    }
}
