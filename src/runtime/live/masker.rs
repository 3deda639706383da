//! The helper that masks inside a running sandbox (`aisb __mask`): a process of its own,
//! because joining a mount namespace (and a user namespace) needs a single-threaded caller.
//! It joins once, when the sandbox is complete, then masks what it is asked for, one path at
//! a time: each request is its kind's byte, a project-relative path, and a NUL; each answer
//! one line. It also mounts and serves the reporting layer of masks ([`super::deny`]).
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
use std::sync::Arc;

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

/// What the helper has of the reporting layer (see [`super::deny`]).
struct Deny {
    table: super::deny::Table,
    reporter: Arc<super::deny::Reporter>,
    /// The root of the mounted file system (O_PATH), where mask `N` is looked up.
    root: OwnedFd,
}

/// The most masks the reporting layer takes (each an entry of ~100 bytes in the helper).
const DENY_MAX: usize = 1 << 20;

/// Run as the helper: join the namespaces of `mnt` (a sandbox's mount namespace), then serve
/// requests on stdin until it closes. Returns the exit code. `audit`: the audit log, where
/// the reporting layer of masks writes denials (none: no reporting layer).
pub fn serve(
    mnt: OwnedFd,
    project: Option<&Path>,
    audit: Option<std::fs::File>,
    agent: Option<String>,
) -> i32 {
    let mut host = None;
    // No project: the reporting layer alone, for a sandbox whose project is not watched (the
    // masking file may not be mounted there).
    let inside = match enter(&mnt, audit.is_some().then_some(&mut host))
        .and_then(|()| project.map(Inside::open).transpose())
    {
        Ok(i) => i,
        Err(e) => {
            eprintln!("aisb: the live mask helper cannot enter the sandbox: {e}");
            return 125;
        }
    };
    drop(mnt);
    // The reporting layer, where the host gave a log and the kernel has FUSE; masks hold
    // without it (it only tells).
    let deny = match (host, audit) {
        (Some(Ok((fuse, proc))), Some(log)) => Some(mount_deny(fuse, proc, log, agent)),
        (Some(Err(e)), Some(_)) => Some(Err(e)),
        _ => None,
    };
    let mut stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    // The host side waits for this: a helper that could not join is known at once.
    let ready = match &deny {
        Some(Ok(_)) => "ready deny\n".to_string(),
        Some(Err(e)) => format!("ready {}\n", e.to_string().replace('\n', " ")),
        None => "ready\n".to_string(),
    };
    let deny = deny.and_then(Result::ok);
    if stdout
        .write_all(ready.as_bytes())
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
        let done = match (rel[0], &deny) {
            (MASK_REQUEST, _) => match &inside {
                Some(i) => i.mask(&rel[1..]).map_err(|e| e.to_string()),
                None => Err("no project to mask in".into()),
            },
            (DENY_REQUEST, Some(d)) => d.add(&rel[1..]).map_err(|e| e.to_string()),
            (DENY_REQUEST, None) => Err("no reporting layer".into()),
            (FLUSH_REQUEST, d) => {
                if let Some(d) = d {
                    d.reporter.flush();
                }
                Ok(Outcome::Absent)
            }
            _ => return 2,
        };
        let answer = match done {
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

/// A request to mask a path: this byte, then the project-relative path, then NUL. Each
/// request starts with its kind, so that no name the sandbox chose reads as another kind.
pub const MASK_REQUEST: u8 = b'm';
/// A request to put the reporting layer over a mask: this byte, `d` or `f` (directory or
/// file), the rule, [`DENY_SEP`], the path inside (absolute), then the NUL that ends every
/// request.
pub const DENY_REQUEST: u8 = 0x01;
/// A request to write the denials counted and not written yet (the run is ending).
pub const FLUSH_REQUEST: u8 = b'F';
pub const DENY_SEP: u8 = 0x1f;

/// Mount the reporting layer on [`crate::vocab::DENY_DIR`] and start serving it.
fn mount_deny(
    fuse: OwnedFd,
    proc: OwnedFd,
    log: std::fs::File,
    agent: Option<String>,
) -> std::io::Result<Deny> {
    use nix::mount::{mount, MsFlags};
    // The owner as the sandbox's user namespace maps it (an unprivileged bwrap maps the
    // caller's own id, not 0; an id the namespace does not map is refused).
    let owner = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    let data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},allow_other",
        fuse.as_raw_fd(),
        owner.0,
        owner.1
    );
    mount(
        Some("aisb-deny"),
        crate::vocab::DENY_DIR,
        Some("fuse"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(data.as_str()),
    )
    .map_err(|e| {
        std::io::Error::other(format!("mounting FUSE on {}: {e}", crate::vocab::DENY_DIR))
    })?;
    let table: super::deny::Table = Default::default();
    let served = table.clone();
    let log = crate::audit::Log::from_file(log, std::path::PathBuf::from("audit.jsonl"));
    // The run's aisb (the helper's parent, as the proxy's): two runs of a project share its log.
    let run = Some(nix::unistd::getppid().as_raw() as u32);
    let reporter = super::deny::Reporter::new(
        move |d, count, late| {
            let _ = log.write(crate::audit::Kind::File {
                operation: d.op.to_string(),
                target: d.target.clone(),
                result: "blocked".into(),
                rule: d.rule.clone(),
                pid: d.pid,
                command: d.command.clone(),
                count,
                agent: agent.clone(),
                run,
                late,
            });
        },
        move |pid| command_of(&proc, pid),
    );
    let serving = reporter.clone();
    std::thread::Builder::new()
        .name("aisb-deny".into())
        .spawn(move || {
            let _ = super::deny::serve(fuse, served, serving, owner);
        })?;
    // Looked up through the mount once it answers (the kernel waits for INIT).
    let root = openat2(
        CWD,
        crate::vocab::DENY_DIR,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    Ok(Deny {
        table,
        reporter,
        root,
    })
}

/// A process's command line as the host's /proc has it (NULs as spaces, at most 256 bytes);
/// its name alone, or `?`, where that cannot be read (it ended).
fn command_of(proc: &OwnedFd, pid: u32) -> String {
    let read = |name: &str| -> Option<Vec<u8>> {
        let fd = rustix::fs::openat(
            proc,
            format!("{pid}/{name}"),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .ok()?;
        let mut buf = vec![0u8; 256];
        let n = rustix::io::read(&fd, &mut buf).ok()?;
        buf.truncate(n);
        Some(buf)
    };
    let text = |b: Vec<u8>| {
        String::from_utf8_lossy(&b)
            .trim_end_matches(['\0', '\n'])
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect::<String>()
    };
    match read("cmdline").map(text).filter(|s| !s.is_empty()) {
        Some(c) => c,
        None => read("comm").map(text).unwrap_or_else(|| "?".into()),
    }
}

impl Deny {
    /// Put file `N` of the layer over the mask at the request's path.
    fn add(&self, req: &[u8]) -> Result<Outcome, Errno> {
        let (&kind, rest) = req.split_first().ok_or(Errno::INVAL)?;
        let sep = rest
            .iter()
            .position(|b| *b == DENY_SEP)
            .ok_or(Errno::INVAL)?;
        let (rule, path) = (&rest[..sep], &rest[sep + 1..]);
        let dir = match kind {
            b'd' => true,
            b'f' => false,
            _ => return Err(Errno::INVAL),
        };
        // The mask itself: a mount point, reached without a link.
        let target = match openat2(
            CWD,
            path,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => {
                return Ok(Outcome::Absent)
            }
            Err(e) => return Err(e),
        };
        // Only on a mask: the root of a mount (a mask's own, not a name the sandbox put in
        // its place), a directory or an empty mode-0000 file as the plan says, never a link.
        let st = rustix::fs::fstat(&target)?;
        let kind = FileType::from_raw_mode(st.st_mode);
        let shaped = match kind {
            FileType::Directory => dir,
            FileType::RegularFile => !dir && st.st_size == 0 && st.st_mode & 0o7777 == 0,
            _ => false,
        };
        let mount_root = rustix::fs::statx(
            &target,
            c"",
            rustix::fs::AtFlags::EMPTY_PATH,
            rustix::fs::StatxFlags::BASIC_STATS,
        )
        .is_ok_and(|x| {
            let root = rustix::fs::StatxAttributes::MOUNT_ROOT;
            x.stx_attributes_mask.contains(root) && x.stx_attributes.contains(root)
        });
        if !shaped || !mount_root {
            return Ok(Outcome::Absent);
        }
        let index = {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if t.len() >= DENY_MAX {
                return Err(Errno::NOSPC);
            }
            t.push(super::deny::Entry {
                path: String::from_utf8_lossy(path).into_owned(),
                dir,
                rule: String::from_utf8_lossy(rule).into_owned(),
            });
            t.len() - 1
        };
        let file = open_tree(
            &self.root,
            index.to_string(),
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )?;
        match move_mount(
            &file,
            c"",
            &target,
            c"",
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        ) {
            Ok(()) => Ok(if dir { Outcome::Dir } else { Outcome::File }),
            Err(Errno::NOENT) => Ok(Outcome::Absent),
            Err(e) => Err(e),
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
/// second: it holds the capabilities over every namespace below its own. With `host`, what
/// the reporting layer needs from the host's side is opened in between: `/dev/fuse` (the
/// kernel takes a FUSE descriptor opened in the mounter's own user namespace only) and the
/// host's `/proc` (the connection numbers processes as the host does).
fn enter(
    mnt: &OwnedFd,
    host: Option<&mut Option<std::io::Result<(OwnedFd, OwnedFd)>>>,
) -> std::io::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        let userns = owning_user_ns(mnt)?;
        match move_into_link_name_space(userns.as_fd(), Some(LinkNameSpaceType::User)) {
            // Already ours: nothing to join.
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(host) = host {
        let open = |path: &str, flags: OFlags| {
            rustix::fs::open(path, flags | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| std::io::Error::other(format!("opening {path}: {e}")))
        };
        *host = Some(
            open("/dev/fuse", OFlags::RDWR)
                .and_then(|f| Ok((f, open("/proc", OFlags::PATH | OFlags::DIRECTORY)?))),
        );
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

/// How long the host waits for one answer of the helper.
const ANSWER_SECS: u64 = 30;

/// The host's side of the helper.
pub struct Masker {
    child: Child,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
    /// Whether the reporting layer of masks is up (the helper said `ready deny`).
    reporting: bool,
}

impl Masker {
    /// Start `exe __mask` for the sandbox whose mount namespace is `mnt`; `project`: where the
    /// project is inside (none: the reporting layer alone). `hold`: a descriptor the helper only keeps open (see the caller).
    /// `audit`: the audit log, for the reporting layer of masks (see [`super::deny`]).
    pub fn spawn(
        exe: &Path,
        mnt: &OwnedFd,
        project: Option<&Path>,
        hold: &OwnedFd,
        audit: Option<&std::fs::File>,
        agent: Option<&str>,
    ) -> std::io::Result<Masker> {
        let fd = mnt.as_raw_fd();
        let held = hold.as_raw_fd();
        let log = audit.map_or(-1, AsRawFd::as_raw_fd);
        let mut cmd = Command::new(exe);
        cmd.arg("__mask").arg(fd.to_string());
        if let Some(p) = project {
            cmd.arg(p);
        }
        if log >= 0 {
            cmd.arg("--audit-fd").arg(log.to_string());
        }
        if let Some(a) = agent {
            cmd.arg("--agent").arg(a);
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: only async-signal-safe calls (fcntl, prctl) between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                // The namespace descriptor is the helper's to keep across exec.
                for keep in [fd, held, log].into_iter().filter(|f| *f >= 0) {
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
            reporting: false,
        };
        let mut line = String::new();
        masker.answer_ready()?;
        masker.answers.read_line(&mut line)?;
        masker.reporting = line.trim_end() == "ready deny";
        if !line.starts_with("ready") {
            let status = masker.child.wait()?;
            return Err(std::io::Error::other(format!(
                "it could not join the sandbox ({status}; its reason is above)"
            )));
        }
        Ok(masker)
    }

    /// Mask `rel` inside; an error says why it could not be.
    pub fn mask(&mut self, rel: &[u8]) -> Result<Outcome, String> {
        if rel.contains(&0) {
            return Err("a NUL in the path".into());
        }
        self.ask(&[&[MASK_REQUEST][..], rel, b"\0"].concat())
    }

    /// Whether the reporting layer of masks is up.
    pub fn reporting(&self) -> bool {
        self.reporting
    }

    /// Put the reporting layer over the mask at `path` (inside), masked by `rule`; nothing
    /// (`Absent`) when the layer is not up.
    pub fn deny(&mut self, path: &Path, dir: bool, rule: &str) -> Result<Outcome, String> {
        if !self.reporting {
            return Ok(Outcome::Absent);
        }
        let path = path.as_os_str().as_encoded_bytes();
        // A byte of the framing inside either is refused, never sent.
        if path
            .iter()
            .chain(rule.as_bytes())
            .any(|b| matches!(*b, 0 | DENY_SEP))
        {
            return Err("a control character in the path or the rule".into());
        }
        let mut req = vec![DENY_REQUEST, if dir { b'd' } else { b'f' }];
        req.extend_from_slice(rule.as_bytes());
        req.push(DENY_SEP);
        req.extend_from_slice(path);
        req.push(0);
        self.ask(&req)
    }

    /// Have the reporting layer write what it counted and did not write yet.
    pub fn flush(&mut self) {
        if self.reporting {
            let _ = self.ask(&[FLUSH_REQUEST, 0]);
        }
    }

    /// Wait (at most [`ANSWER_SECS`]) until the helper's next answer is there to read: a
    /// helper that hangs (it never should) cannot hold the run's end for ever. (An answer is
    /// one short line in one write, below the pipe's atomic size: it comes whole.)
    fn answer_ready(&mut self) -> std::io::Result<()> {
        if self.answers.buffer().contains(&b'\n') {
            return Ok(());
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(ANSWER_SECS);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut fds = [rustix::event::PollFd::new(
                self.answers.get_ref(),
                rustix::event::PollFlags::IN,
            )];
            let limit = rustix::time::Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            };
            return match rustix::event::poll(&mut fds, Some(&limit)) {
                Ok(0) => {
                    let _ = self.child.kill();
                    Err(std::io::Error::other(format!(
                        "it did not answer within {ANSWER_SECS} s and was stopped"
                    )))
                }
                Ok(_) => Ok(()),
                Err(Errno::INTR) => continue,
                Err(e) => Err(e.into()),
            };
        }
    }

    fn ask(&mut self, req: &[u8]) -> Result<Outcome, String> {
        let sent = self
            .requests
            .write_all(req)
            .and_then(|()| self.requests.flush());
        let mut line = String::new();
        let ready = sent.and_then(|()| self.answer_ready());
        let read = ready.and_then(|()| self.answers.read_line(&mut line));
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
