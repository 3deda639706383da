//! The helper that masks inside a running sandbox (`aisb __mask`): a process of its own,
//! because joining a mount namespace (and a user namespace) needs a single-threaded caller.
//! It joins once, when the sandbox is complete, then masks what it is asked for, one path at
//! a time: each request is a project-relative path ending in NUL, each answer one line.
//!
//! How it masks is how the start-up masks are made: over a file, a read-only bind of the
//! empty mode-0000 file (reading fails with EACCES); over a directory, an empty read-only
//! tmpfs of mode 0555. The file is the one mounted at [`super::MASK_SOURCE`] in the sandbox:
//! `open_tree` may clone only a mount of the caller's namespace (before Linux 6.15, not even
//! a detached one), so the source has to be in the sandbox already.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use rustix::fs::{openat2, FileType, Mode, OFlags, ResolveFlags, CWD};
use rustix::io::Errno;
use rustix::mount::{move_mount, open_tree, MoveMountFlags, OpenTreeFlags};
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};

/// `ioctl(NS_GET_USERNS)`: the user namespace that owns a namespace (`_IO(0xb7, 0x1)`).
const NS_GET_USERNS: libc::c_ulong = 0xb701;

/// What a request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    File,
    Dir,
    /// Not there inside (removed or renamed since, or behind a symlink): nothing to hide.
    Absent,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::File => "file",
            Outcome::Dir => "dir",
            Outcome::Absent => "absent",
        }
    }
}

/// Run as the helper: join the namespaces of `mnt` (a sandbox's mount namespace), then serve
/// requests on stdin until it closes. Returns the exit code.
pub fn serve(mnt: OwnedFd, project: &Path) -> i32 {
    let inside = match enter(&mnt).and_then(|()| Inside::open(project)) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("aisb: the live mask helper cannot enter the sandbox: {e}");
            return 125;
        }
    };
    drop(mnt);
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    // The host side waits for this: a helper that could not join is known at once.
    if stdout
        .write_all(b"ready\n")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return 0;
    }
    let mut rel = Vec::new();
    loop {
        rel.clear();
        match stdin.read_until(0, &mut rel) {
            Ok(0) | Err(_) => return 0,
            Ok(_) => {}
        }
        if rel.pop() != Some(0) || rel.is_empty() {
            return 2;
        }
        let answer = match inside.mask(&rel) {
            Ok(o) => format!("ok {}\n", o.word()),
            Err(e) => format!("err {e}\n"),
        };
        if stdout
            .write_all(answer.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return 0;
        }
    }
}

/// The user namespace that owns the namespace `ns` (a descriptor of `/proc/PID/ns/*`).
pub fn owning_user_ns(ns: &OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: an ioctl on a namespace descriptor we hold; on success it returns a new
    // descriptor, which we take ownership of.
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_USERNS) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// As an ordinary user, first the user namespace that owns the mount namespace (created by
/// them, so they hold every capability there), then the mount namespace. Root needs only the
/// second: it holds the capabilities over every namespace below its own.
fn enter(mnt: &OwnedFd) -> std::io::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        let userns = owning_user_ns(mnt)?;
        match move_into_link_name_space(userns.as_fd(), Some(LinkNameSpaceType::User)) {
            // Already ours: nothing to join.
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
    }
    move_into_link_name_space(mnt.as_fd(), Some(LinkNameSpaceType::Mount))?;
    Ok(())
}

/// The project and the masking file as the sandbox sees them.
struct Inside {
    project: OwnedFd,
    source: OwnedFd,
}

impl Inside {
    fn open(project: &Path) -> std::io::Result<Inside> {
        // After setns the root and working directory are the sandbox's own.
        let beneath_root = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let project = openat2(
            CWD,
            project,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            beneath_root,
        )?;
        let source = openat2(
            CWD,
            super::MASK_SOURCE,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            beneath_root,
        )?;
        // Never bind anything readable over a secret.
        let st = rustix::fs::fstat(&source)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
            || st.st_size != 0
            || st.st_mode & 0o7777 != 0
        {
            return Err(std::io::Error::other(format!(
                "{} is not an empty mode-0000 file",
                super::MASK_SOURCE
            )));
        }
        Ok(Inside { project, source })
    }

    fn mask(&self, rel: &[u8]) -> Result<Outcome, Errno> {
        let gone = |e: Errno| matches!(e, Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV);
        // No symlink is followed on the way: the path is exactly the project's.
        let target = match openat2(
            &self.project,
            rel,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            Err(e) if gone(e) => return Ok(Outcome::Absent),
            Err(e) => return Err(e),
        };
        let mut kind = FileType::from_raw_mode(rustix::fs::fstat(&target)?.st_mode);
        let target = if kind == FileType::Symlink {
            // A symlink with a secret's name: as at start, where the runtimes follow it, what
            // it points to is masked, but only below the project (anything else is not the
            // project's to hide, and the sandbox reaches it by its own path anyway).
            match openat2(
                &self.project,
                rel,
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
            ) {
                Ok(fd) => {
                    kind = FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode);
                    fd
                }
                Err(e) if gone(e) => return Ok(Outcome::Absent),
                Err(e) => return Err(e),
            }
        } else {
            target
        };
        let attach = |mount: &OwnedFd| {
            move_mount(
                mount,
                c"",
                &target,
                c"",
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
            )
        };
        // Removed, or renamed over, since it was opened (the run's end moved a protected file
        // the sandbox made into the quarantine meanwhile): no name reaches it to hide.
        let attached = |r: Result<(), Errno>, outcome| match r {
            Ok(()) => Ok(outcome),
            Err(Errno::NOENT) => Ok(Outcome::Absent),
            Err(e) => Err(e),
        };
        if kind == FileType::Directory {
            attached(attach(&crate::init::empty_tmpfs()?), Outcome::Dir)
        } else {
            // A clone of the source's mount: read-only, nosuid, nodev, noexec like it.
            let mount = open_tree(
                &self.source,
                c"",
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | OpenTreeFlags::AT_EMPTY_PATH,
            )?;
            attached(attach(&mount), Outcome::File)
        }
    }
}

/// The host's side of the helper.
pub struct Masker {
    child: Child,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
}

impl Masker {
    /// Start `exe __mask` for the sandbox whose mount namespace is `mnt`; `project`: where the
    /// project is inside. `hold`: a descriptor the helper only keeps open (see the caller).
    pub fn spawn(
        exe: &Path,
        mnt: &OwnedFd,
        project: &Path,
        hold: &OwnedFd,
    ) -> std::io::Result<Masker> {
        let fd = mnt.as_raw_fd();
        let held = hold.as_raw_fd();
        let mut cmd = Command::new(exe);
        cmd.arg("__mask")
            .arg(fd.to_string())
            .arg(project)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: only async-signal-safe calls (fcntl, prctl) between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                // The namespace descriptor is the helper's to keep across exec.
                for keep in [fd, held] {
                    if libc::fcntl(keep, libc::F_SETFD, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // Tied to the watcher thread that starts it: it ends with the watcher.
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        let requests = child.stdin.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let answers = BufReader::new(child.stdout.take().ok_or(std::io::ErrorKind::BrokenPipe)?);
        let mut masker = Masker {
            child,
            requests,
            answers,
        };
        let mut line = String::new();
        masker.answers.read_line(&mut line)?;
        if line != "ready\n" {
            let status = masker.child.wait()?;
            return Err(std::io::Error::other(format!(
                "it could not join the sandbox ({status}; its reason is above)"
            )));
        }
        Ok(masker)
    }

    /// Mask `rel` inside; an error says why it could not be.
    pub fn mask(&mut self, rel: &[u8]) -> Result<Outcome, String> {
        let sent = self
            .requests
            .write_all(&[rel, b"\0"].concat())
            .and_then(|()| self.requests.flush());
        let mut line = String::new();
        let read = sent.and_then(|()| self.answers.read_line(&mut line));
        match (read, line.trim_end()) {
            (Ok(_), "ok file") => Ok(Outcome::File),
            (Ok(_), "ok dir") => Ok(Outcome::Dir),
            (Ok(_), "ok absent") => Ok(Outcome::Absent),
            (Ok(_), other) if other.starts_with("err ") => Err(other[4..].to_string()),
            (Ok(_), _) => Err(match self.child.try_wait() {
                Ok(Some(status)) => format!("the helper ended ({status})"),
                _ => "the helper answered nothing".to_string(),
            }),
            (Err(e), _) => Err(format!("the helper is gone: {e}")),
        }
    }
}

impl Drop for Masker {
    /// Killed, not waited for: its end releases the sandbox's mount namespace and the inotify
    /// instance, which waits for the kernel (RCU); aisb exits meanwhile, and the init of the
    /// host reaps it.
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}
