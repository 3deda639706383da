//! The live mask layer: secrets that appear in the project while a sandbox runs.
//!
//! The start-up masks are computed once (`eval::scan`), so a `.env.local` that the host writes
//! later (`vercel env pull`, a teammate's script) would be readable inside. While a sandbox
//! runs, a thread of aisb watches the project on the host with inotify ([`tree`]) and, when
//! something the sensitive patterns or the `block` list match appears (created, renamed in, a
//! directory whose name matches, files inside a new directory), has it masked in the sandbox's
//! mount namespace ([`masker`]) exactly as the start-up masks are, and writes a `late-mask`
//! event to the audit log. Gitignored files are not in this layer: builds write ignored
//! outputs that they must read back.
//!
//! Why inotify through rustix and not the `notify` crate: every directory is opened through
//! descriptors with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` and watched as that
//! descriptor (`/proc/self/fd/N`), because the sandbox writes the project and may swap any
//! directory for a symlink; `notify` adds recursive watches by path (following symlinks, as
//! configured) from its own thread, and reports nothing for what a new directory already holds
//! when its watch arrives, which this layer must look at. The watcher is one thread that
//! sleeps in `poll` (no polling), and ends with the run.
//!
//! Order of events: the watcher starts before the sandbox (walking the project while the
//! runtime sets the sandbox up), and the masking helper joins the sandbox only when it is
//! complete: bwrap reports its child's pid before that child has mounted anything, so aisb's
//! init writes a byte on a pipe once the runtime's mounts and its own overlays are done;
//! libcontainer's helper writes the init's pid once the container started. Masks asked for
//! before then are applied at that moment.
//!
//! Fail closed: when the project cannot be watched (e.g. `fs.inotify.max_user_watches`) or a
//! path cannot be masked, the sandbox is stopped and the run fails with the reason.
//!
//! Not watched: a named sandbox's clone and an unprivileged bwrap's private copy of the
//! project (nothing the host writes reaches them), `.git` directories, directories masked at
//! start.

pub mod masker;
pub mod tree;

use std::collections::HashSet;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags};

use crate::eval::plan::{MountKind, Plan};
use masker::{Masker, Outcome};
use tree::{Request, Tree};

/// Where the masking file is mounted in a sandbox that has the live layer (see [`masker`]).
pub const MASK_SOURCE: &str = "/run/aisb/masked";

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LiveError {
    #[error(
        "cannot watch the project for secrets that appear while the sandbox runs: {what}: {source}"
    )]
    #[diagnostic(help(
        "the sandbox was not started or was stopped; if inotify ran out of watches or instances, raise them (sysctl fs.inotify.max_user_watches / fs.inotify.max_user_instances)"
    ))]
    Watch {
        what: String,
        source: std::io::Error,
    },
    #[error(
        "cannot mask {path}, which appeared in the project while the sandbox ran ({rule}): {why}"
    )]
    #[diagnostic(help(
        "the sandbox was stopped so that it could not read it; `aisb doctor` checks the host"
    ))]
    Mask {
        path: PathBuf,
        rule: String,
        why: String,
    },
}

/// The host directory watched and where the sandbox sees it, when host writes reach it.
fn watched(plan: &Plan) -> Option<(PathBuf, PathBuf)> {
    plan.live.as_ref()?;
    plan.mounts
        .iter()
        .filter(|m| m.target == plan.project)
        .find_map(|m| match &m.kind {
            MountKind::Bind { source, .. } if *source == plan.project => {
                Some((source.clone(), m.target.clone()))
            }
            MountKind::Overlay { lower, .. } if *lower == plan.project => {
                Some((lower.clone(), m.target.clone()))
            }
            _ => None,
        })
}

/// The running live layer of one sandbox.
pub struct Live {
    stopping: Arc<AtomicBool>,
    stop: Option<OwnedFd>,
    ready: Option<OwnedFd>,
    pid: Sender<i32>,
    thread: Option<JoinHandle<Result<(), LiveError>>>,
}

fn pipe(what: &str) -> Result<(OwnedFd, OwnedFd), LiveError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| LiveError::Watch {
        what: format!("creating {what}"),
        source: e.into(),
    })
}

impl Live {
    /// Start watching for `plan`, or `None` when it has no live layer. Returns once inotify
    /// is set up (so its errors stop the run before the sandbox starts); the project is walked
    /// in the background.
    pub fn start(plan: &Plan, exe: &Path) -> Result<Option<Live>, LiveError> {
        let (Some(rules), Some((host, inside))) = (plan.live.clone(), watched(plan)) else {
            return Ok(None);
        };
        let start_masked: HashSet<Vec<u8>> = plan
            .masks
            .iter()
            .filter_map(|m| m.path.strip_prefix(&inside).ok())
            .map(|rel| rel.as_os_str().as_encoded_bytes().to_vec())
            .collect();
        let tree = Tree::new(&host, rules, start_masked).map_err(|source| LiveError::Watch {
            what: format!("watching {}", host.display()),
            source,
        })?;
        let (stop_r, stop_w) = pipe("a pipe")?;
        let (ready_r, ready_w) = pipe("a pipe")?;
        let (pid_tx, pid_rx) = channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let watcher = Watcher {
            tree,
            exe: exe.to_path_buf(),
            inside,
            audit: crate::audit::Log::open(&plan.state_dir.join("audit.jsonl")).ok(),
            stopping: stopping.clone(),
        };
        // Signals meant for the sandbox must never land on the watcher (SIGTERM's default
        // action would end aisb): it starts with all of them blocked, from its first instant.
        let all = nix::sys::signal::SigSet::all();
        let before = all.thread_swap_mask(nix::sys::signal::SigmaskHow::SIG_BLOCK);
        let thread = std::thread::Builder::new()
            .name("aisb-live-masks".into())
            .spawn(move || watcher.run(stop_r, ready_r, pid_rx));
        if let Ok(before) = before {
            let _ = before.thread_set_mask();
        }
        let thread = thread.map_err(|source| LiveError::Watch {
            what: "starting the watcher".into(),
            source,
        })?;
        Ok(Some(Live {
            stopping,
            stop: Some(stop_w),
            ready: Some(ready_w),
            pid: pid_tx,
            thread: Some(thread),
        }))
    }

    /// The descriptor the sandbox's side reports readiness on: aisb's init under bwrap
    /// (`--ready-fd`, one byte once the sandbox is complete), libcontainer's helper (the
    /// init's pid). It must survive the runtime's exec; [`Live::spawned`] closes ours.
    pub fn ready_fd(&self) -> Option<RawFd> {
        self.ready.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// The runtime was started with the ready descriptor: close this process's copy, so the
    /// watcher sees the end of it if the sandbox never gets ready.
    pub fn spawned(&mut self) {
        self.ready = None;
    }

    /// The sandbox's init, as the host sees it (bwrap reports it before the sandbox is ready).
    pub fn init_pid(&self, pid: i32) {
        let _ = self.pid.send(pid);
    }

    /// Stop watching; the error, if the layer failed (the sandbox was then stopped).
    pub fn finish(mut self) -> Result<(), LiveError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), LiveError> {
        self.stopping.store(true, Ordering::Relaxed);
        self.ready = None;
        // Closing the write end wakes the watcher's poll.
        self.stop = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) | None => Ok(()),
        }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// The joined sandbox: its init (a pidfd: never another process that got the pid) and the
/// helper in its namespaces.
struct Joined {
    init: OwnedFd,
    mnt: OwnedFd,
    /// Started at the first mask, or once the sandbox has run for [`PRESPAWN`].
    masker: Option<Masker>,
    since: std::time::Instant,
}

/// How long a sandbox runs before its mask helper is started ahead of need. A helper is an
/// exec of aisb (milliseconds of CPU): a short command (`aisb run -- make -q`) ends before it
/// would be any use, and would otherwise pay for it; a secret that appears in this first moment
/// waits for the helper's start.
const PRESPAWN: Duration = Duration::from_millis(25);

struct Watcher {
    tree: Tree,
    exe: PathBuf,
    inside: PathBuf,
    audit: Option<crate::audit::Log>,
    stopping: Arc<AtomicBool>,
}

fn readable(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    poll(&mut fds, Some(&rustix::time::Timespec::default())).is_ok_and(|n| n > 0)
}

impl Watcher {
    fn run(mut self, stop: OwnedFd, ready: OwnedFd, pid: Receiver<i32>) -> Result<(), LiveError> {
        let mut pending: Vec<Request> = Vec::new();
        let mut failure: Option<LiveError> = None;
        if let Err(source) = self.tree.walk(b"", false, &self.stopping, &mut pending) {
            failure = Some(LiveError::Watch {
                what: "walking the project".into(),
                source,
            });
        }
        let mut ready = Some(ready);
        let mut joined: Option<Joined> = None;
        loop {
            if let Some(j) = &mut joined {
                let due = !pending.is_empty() || j.since.elapsed() >= PRESPAWN;
                if j.masker.is_none() && due && failure.is_none() {
                    match Masker::spawn(&self.exe, &j.mnt, &self.inside) {
                        Ok(m) => j.masker = Some(m),
                        Err(_) if readable(&j.init) => {
                            // It ended: nothing left to protect.
                            joined = None;
                            ready = None;
                            pending.clear();
                            continue;
                        }
                        Err(e) => {
                            failure = Some(LiveError::Watch {
                                what: "starting the mask helper in the sandbox".into(),
                                source: e,
                            });
                        }
                    }
                }
                if let Some(m) = &mut j.masker {
                    for r in pending.drain(..) {
                        if let Err(e) = self.apply(m, &r) {
                            failure.get_or_insert(e);
                            break;
                        }
                    }
                }
            }
            if let Some(f) = failure.take() {
                if let Some(j) = &joined {
                    // Fail closed: the sandbox must not go on while it can read a secret.
                    let _ =
                        rustix::process::pidfd_send_signal(&j.init, rustix::process::Signal::KILL);
                    return Err(f);
                }
                if ready.is_none() {
                    return Err(f);
                }
                // Not joined yet: stopped as soon as it is complete.
                failure = Some(f);
            }
            let mut fds = vec![PollFd::new(&stop, PollFlags::IN)];
            if failure.is_none() {
                fds.push(PollFd::new(self.tree.inotify(), PollFlags::IN));
            }
            if let Some(r) = &ready {
                fds.push(PollFd::new(r, PollFlags::IN));
            }
            // Wake up to start the helper ahead of need (see PRESPAWN).
            let timeout = joined
                .as_ref()
                .filter(|j| j.masker.is_none())
                .map(|j| PRESPAWN.saturating_sub(j.since.elapsed()))
                .map(|d| rustix::time::Timespec {
                    tv_sec: d.as_secs() as _,
                    tv_nsec: d.subsec_nanos() as _,
                });
            match poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(LiveError::Watch {
                        what: "waiting for events".into(),
                        source: e.into(),
                    })
                }
            }
            drop(fds);
            if self.stopping.load(Ordering::Relaxed) || readable(&stop) {
                return failure.map_or(Ok(()), Err);
            }
            if let Some(r) = ready.take_if(|r| readable(r)) {
                match self.join(&r, &pid) {
                    Ok(j) => joined = j,
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
            if failure.is_none() && readable(self.tree.inotify()) {
                if let Err(source) = self.tree.events(&self.stopping, &mut pending) {
                    failure = Some(LiveError::Watch {
                        what: "reading inotify events".into(),
                        source,
                    });
                }
            }
        }
    }

    /// The sandbox said it is complete: find its init and its mount namespace.
    fn join(&self, ready: &OwnedFd, pid: &Receiver<i32>) -> Result<Option<Joined>, LiveError> {
        let err = |what: &str| {
            let what = what.to_string();
            move |source: std::io::Error| LiveError::Watch { what, source }
        };
        let mut buf = [0u8; 32];
        let n = nix::unistd::read(ready.as_raw_fd(), &mut buf)
            .map_err(|e| err("reading the sandbox's readiness")(e.into()))?;
        if n == 0 {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        let init = match text.trim().parse::<i32>() {
            Ok(p) => p,
            Err(_) => match pid.recv_timeout(Duration::from_secs(10)) {
                Ok(p) => p,
                Err(_) => return Ok(None),
            },
        };
        let Some(pid) = rustix::process::Pid::from_raw(init) else {
            return Ok(None);
        };
        // A sandbox that already ended (a short command) needs no mask: not an error.
        let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        else {
            return Ok(None);
        };
        // libcontainer reports the init before it has executed aisb's init: until then it is
        // libcontainer's own non-dumpable process, whose namespaces an ordinary user may not
        // open (EACCES). The exec follows within milliseconds; wait for it, boundedly.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mnt: OwnedFd = loop {
            match std::fs::File::open(format!("/proc/{init}/ns/mnt")) {
                Ok(f) => break f.into(),
                // ENOENT: exiting (its namespaces go before the pidfd says so) or gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound || readable(&pidfd) => {
                    return Ok(None)
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::PermissionDenied
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => {
                    let _ =
                        rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
                    return Err(err("opening the sandbox's mount namespace")(e));
                }
            }
        };
        // The pid still names the same process (a pidfd becomes readable when it exits).
        if readable(&pidfd) {
            return Ok(None);
        }
        Ok(Some(Joined {
            init: pidfd,
            mnt,
            masker: None,
            since: std::time::Instant::now(),
        }))
    }

    fn apply(&self, masker: &mut Masker, r: &Request) -> Result<(), LiveError> {
        let rel = Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&r.rel));
        let path = self.inside.join(rel);
        match masker.mask(&r.rel) {
            Ok(Outcome::Absent) => Ok(()),
            Ok(outcome) => {
                if let Some(log) = &self.audit {
                    let _ = log.write(crate::audit::Kind::LateMask {
                        path: path.to_string_lossy().into_owned(),
                        rule: r.rule.clone(),
                        dir: outcome == Outcome::Dir,
                    });
                }
                Ok(())
            }
            Err(why) => Err(LiveError::Mask {
                path,
                rule: r.rule.clone(),
                why,
            }),
        }
    }
}
