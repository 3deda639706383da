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
//! Order of events: the helper may join the sandbox only once it is complete: bwrap reports its
//! child's pid before that child has mounted anything, so aisb's init writes a byte on a pipe
//! once the runtime's mounts and its own overlays are done; libcontainer's helper writes the
//! init's pid once the container started. The watcher then waits [`DEFER`] more (short
//! commands end first and pay nothing), walks the project, adding watches and asking for what
//! appeared since the scan began, and starts the helper.
//!
//! Fail closed: when the project cannot be watched (e.g. `fs.inotify.max_user_watches`) or a
//! path cannot be masked, the sandbox is stopped and the run fails with the reason.
//!
//! Not watched: a named sandbox's clone and an unprivileged bwrap's private copy of the
//! project (nothing the host writes reaches them), `.git` directories, directories masked at
//! start.

pub mod deny;
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
pub use crate::vocab::MASK_SOURCE;
use masker::{Masker, Outcome};
use tree::{Request, Tree};

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
    #[error("the sandbox was stopped: {0}")]
    #[diagnostic(help(
        "what it wrote is still there (a named sandbox: `aisb rm NAME` removes it); raise or set `limits {{ disk \"SIZE\" }}` in sandbox.kdl if the job needs more"
    ))]
    Disk(super::disk::Exceeded),
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
    /// Start the layer for `plan`, or `None` when it has none. The watcher thread waits for
    /// the sandbox to be complete, then for [`DEFER`], before it sets anything up.
    pub fn start(plan: &Plan, exe: &Path) -> Result<Option<Live>, LiveError> {
        let budget = super::disk::Budget::of(plan);
        let masks = match (plan.live.clone(), watched(plan)) {
            (Some(rules), Some(dirs)) => Some((rules, dirs)),
            _ => None,
        };
        if masks.is_none() && budget.is_none() && plan.masks.is_empty() {
            return Ok(None);
        }
        let (rules, (host, inside)) = match masks {
            Some((r, d)) => (Some(r), d),
            None => (None, (PathBuf::new(), PathBuf::new())),
        };
        let start_masked: HashSet<Vec<u8>> = plan
            .masks
            .iter()
            .filter_map(|m| m.path.strip_prefix(&inside).ok())
            .map(|rel| rel.as_os_str().as_encoded_bytes().to_vec())
            .collect();
        let (stop_r, stop_w) = pipe("a pipe")?;
        let (ready_r, ready_w) = pipe("a pipe")?;
        let (pid_tx, pid_rx) = channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let watcher = Watcher {
            host,
            rules,
            start_masked,
            exe: exe.to_path_buf(),
            inside,
            quarantine: plan.state_dir.join("quarantine"),
            audit: crate::audit::Log::open(&plan.state_dir.join("audit.jsonl")).ok(),
            stopping: stopping.clone(),
            budget,
            // Reported: all but those an agent meets in its normal use (`UNREPORTED`).
            masks: plan
                .masks
                .iter()
                .filter(|m| !m.rule.ends_with(crate::eval::masks::UNREPORTED))
                .cloned()
                .collect(),
            agent: crate::presets::agent_for(&plan.process.args).map(str::to_string),
            // The reporting layer's log: the helper writes there itself.
            audit_file: if std::env::var(crate::eval::BREAK_ISOLATION_ENV).as_deref()
                == Ok("report")
            {
                eprintln!(
                    "aisb: WARNING: {}=report: attempts on masked paths are not recorded in this sandbox (a test of the tests)",
                    crate::eval::BREAK_ISOLATION_ENV
                );
                None
            } else {
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(plan.state_dir.join("audit.jsonl"))
                    .ok()
            },
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

/// How long the sandbox runs before the layer is set up. Short commands (`aisb run -- make -q`)
/// end before and pay nothing: closing an inotify descriptor that had watches waits for an
/// SRCU grace period in the kernel (~12 ms measured here), and the helper is an exec of aisb.
/// Nothing is missed meanwhile: the first walk looks at every directory changed since the
/// project scan began, so a secret written in this moment is masked by it, this long after the
/// sandbox started at most (plus the walk).
const DEFER: Duration = Duration::from_millis(25);

/// The run's watcher: the live masks (`rules`, `None` when the project is not watched) and
/// the disk budget (`budget`, a thread of its own once the sandbox is complete).
struct Watcher {
    host: PathBuf,
    rules: Option<crate::eval::plan::LiveRules>,
    start_masked: HashSet<Vec<u8>>,
    exe: PathBuf,
    inside: PathBuf,
    /// Where a symbolic link made under a secret's name is moved (see [`Watcher::apply`]).
    quarantine: PathBuf,
    audit: Option<crate::audit::Log>,
    stopping: Arc<AtomicBool>,
    budget: Option<super::disk::Budget>,
    /// The masks made at start, for the reporting layer (see [`deny`]).
    masks: Vec<crate::eval::plan::Mask>,
    audit_file: Option<std::fs::File>,
    /// The agent whose run it is (the command is one), for the denials' events.
    agent: Option<String>,
}

fn readable(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    poll(&mut fds, Some(&rustix::time::Timespec::default())).is_ok_and(|n| n > 0)
}

pub(super) fn kill(init: &OwnedFd) {
    let _ = rustix::process::pidfd_send_signal(init, rustix::process::Signal::KILL);
}

/// Sleep until `stop` is readable or `timeout` passes; true when the run is stopping.
pub(super) fn wait_for(stop: &OwnedFd, stopping: &AtomicBool, timeout: Option<Duration>) -> bool {
    wait_any(&[stop], stopping, timeout)
}

/// Sleep until one of `fds` is readable (true) or `timeout` passes (false); true too when
/// the run is stopping.
fn wait_any(fds: &[&OwnedFd], stopping: &AtomicBool, timeout: Option<Duration>) -> bool {
    let mut polled: Vec<PollFd> = fds.iter().map(|f| PollFd::new(*f, PollFlags::IN)).collect();
    let timeout = timeout.map(|d| rustix::time::Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    });
    let woken = loop {
        match poll(&mut polled, timeout.as_ref()) {
            Err(rustix::io::Errno::INTR) => continue,
            Ok(n) => break n > 0,
            Err(_) => break true,
        }
    };
    woken || stopping.load(Ordering::Relaxed)
}

impl Watcher {
    fn run(self, stop: OwnedFd, ready: OwnedFd, pid: Receiver<i32>) -> Result<(), LiveError> {
        let Some((init, pid)) = self.wait_ready(&stop, ready, &pid)? else {
            return Ok(());
        };
        if self.wait(&[&stop], Some(DEFER)) {
            return Ok(());
        }
        let budget = match &self.budget {
            Some(b) => match self.watch_disk(b.clone(), &init, pid, &stop) {
                Ok(t) => Some(t),
                Err(e) => {
                    // Fail closed: no sandbox runs unwatched.
                    kill(&init);
                    return Err(e);
                }
            },
            None => None,
        };
        let result = if self.rules.is_some() {
            self.watch(&stop, &init, pid)
        } else if !self.masks.is_empty() && self.audit_file.is_some() {
            self.report_only(&stop, &init, pid)
        } else {
            self.wait(&[&stop], None);
            Ok(())
        };
        if result.is_err() {
            // Fail closed: the sandbox must not go on while it could read a secret.
            kill(&init);
        }
        let disk = match budget.map(JoinHandle::join) {
            // The watch died: the sandbox does not go on unwatched.
            Some(Err(_)) => {
                kill(&init);
                Err(LiveError::Watch {
                    what: "watching the disk budget".into(),
                    source: std::io::Error::other("its thread ended abnormally"),
                })
            }
            Some(Ok(Err(e))) => {
                if let Some(log) = &self.audit {
                    let _ = log.write(crate::audit::Kind::Limit {
                        limit: format!("disk ({})", e.what),
                        used: e.used,
                        budget: e.budget,
                        rule: e.rule.clone(),
                    });
                }
                Err(LiveError::Disk(e))
            }
            _ => Ok(()),
        };
        // The budget's stop first: it is why the masks' watch ended, if it did.
        disk.and(result)
    }

    /// The disk budget's thread (see [`super::disk`]), on copies of the init's pidfd and the
    /// stop pipe.
    fn watch_disk(
        &self,
        budget: super::disk::Budget,
        init: &OwnedFd,
        pid: i32,
        stop: &OwnedFd,
    ) -> Result<JoinHandle<Result<(), super::disk::Exceeded>>, LiveError> {
        let err = |source: std::io::Error| LiveError::Watch {
            what: "starting the disk budget's watch".into(),
            source,
        };
        let (init, stop) = (
            init.try_clone().map_err(err)?,
            stop.try_clone().map_err(err)?,
        );
        let stopping = self.stopping.clone();
        std::thread::Builder::new()
            .name("aisb-disk".into())
            .spawn(move || super::disk::watch(&budget, &init, pid, &stop, &stopping))
            .map_err(err)
    }

    /// Sleep until one of `fds` is readable (true) or `timeout` passes (false); true too when
    /// the run is stopping.
    fn wait(&self, fds: &[&OwnedFd], timeout: Option<Duration>) -> bool {
        wait_any(fds, &self.stopping, timeout)
    }

    /// The sandbox said it is complete: its init, as a pidfd (never another process that got
    /// the pid). `None`: the run stopped, or the sandbox ended first.
    fn wait_ready(
        &self,
        stop: &OwnedFd,
        ready: OwnedFd,
        pid: &Receiver<i32>,
    ) -> Result<Option<(OwnedFd, i32)>, LiveError> {
        if !self.wait(&[stop, &ready], None)
            || readable(stop)
            || self.stopping.load(Ordering::Relaxed)
        {
            return Ok(None);
        }
        let mut buf = [0u8; 32];
        let n = nix::unistd::read(ready.as_raw_fd(), &mut buf).unwrap_or(0);
        if n == 0 {
            return Ok(None);
        }
        let init = match String::from_utf8_lossy(&buf[..n]).trim().parse::<i32>() {
            Ok(p) => p,
            Err(_) => match pid.recv_timeout(Duration::from_secs(10)) {
                Ok(p) => p,
                Err(_) => return Ok(None),
            },
        };
        let Some(raw) = rustix::process::Pid::from_raw(init) else {
            return Ok(None);
        };
        // A sandbox that already ended (a short command) needs no mask: not an error.
        Ok(
            rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())
                .ok()
                .map(|fd| (fd, init)),
        )
    }

    /// Walk and watch the project, join the sandbox with the helper, then mask what appears
    /// until the run stops.
    fn watch(&self, stop: &OwnedFd, init: &OwnedFd, pid: i32) -> Result<(), LiveError> {
        let err = |what: &str| {
            let what = what.to_string();
            move |source: std::io::Error| LiveError::Watch { what, source }
        };
        let Some(mnt) = self.mount_ns(init, pid)? else {
            return Ok(());
        };
        let Some(rules) = self.rules.clone() else {
            return Ok(());
        };
        let mut tree = Tree::new(&self.host, rules, self.start_masked.clone())
            .map_err(err(&format!("watching {}", self.host.display())))?;
        let mut pending = Vec::new();
        tree.walk(b"", false, &self.stopping, &mut pending)
            .map_err(err("walking the project"))?;
        // The helper keeps the mount namespace, and a copy of the inotify descriptor: the last
        // close of each waits for the kernel (RCU), and the helper's end is not waited for.
        let mut masker = match Masker::spawn(
            &self.exe,
            &mnt,
            Some(&self.inside),
            tree.inotify(),
            self.audit_file.as_ref(),
            self.agent.as_deref(),
        ) {
            Ok(m) => m,
            Err(_) if readable(init) => return Ok(()),
            Err(e) => return Err(err("starting the mask helper in the sandbox")(e)),
        };
        drop(mnt);
        // The reporting layer over the start's masks, a batch at a time between the events:
        // a secret that appears meanwhile is masked first.
        let mut reported = 0;
        loop {
            for r in pending.drain(..) {
                self.apply(&mut masker, &r)?;
            }
            // A few at a time, and none while an event waits.
            reported = self.report_masks(&mut masker, reported, 8, || readable(tree.inotify()));
            let more = reported < self.masks.len();
            let woken = self.wait(&[stop, tree.inotify()], more.then_some(Duration::ZERO));
            if woken && (readable(stop) || self.stopping.load(Ordering::Relaxed)) {
                masker.flush();
                return Ok(());
            }
            if readable(tree.inotify()) {
                tree.events(&self.stopping, &mut pending)
                    .map_err(err("reading inotify events"))?;
            }
        }
    }

    /// The reporting layer over the masks made at start (see [`deny`]) from the `from`th on,
    /// at most `n` of them, until `pause` says to stop; the index reached (all of them when
    /// the layer is not up). A mask it cannot cover stays a mask: only the report of attempts
    /// on it is missing.
    fn report_masks(
        &self,
        masker: &mut Masker,
        from: usize,
        n: usize,
        pause: impl Fn() -> bool,
    ) -> usize {
        if !masker.reporting() {
            return self.masks.len();
        }
        let mut at = from;
        for m in self.masks.iter().skip(from).take(n) {
            if pause() {
                break;
            }
            let _ = masker.deny(&m.path, m.dir, &m.rule);
            at += 1;
        }
        at
    }

    /// Only the reporting layer (a sandbox whose project is not watched): the helper is
    /// started for it, then kept until the run stops.
    fn report_only(&self, stop: &OwnedFd, init: &OwnedFd, pid: i32) -> Result<(), LiveError> {
        let Some(mnt) = self.mount_ns(init, pid)? else {
            return Ok(());
        };
        let mut masker = match Masker::spawn(
            &self.exe,
            &mnt,
            None,
            &mnt,
            self.audit_file.as_ref(),
            self.agent.as_deref(),
        ) {
            Ok(m) => m,
            // Masks hold without it; nothing to stop the sandbox for.
            Err(_) => return Ok(()),
        };
        drop(mnt);
        self.report_masks(&mut masker, 0, usize::MAX, || {
            self.stopping.load(Ordering::Relaxed)
        });
        self.wait(&[stop], None);
        masker.flush();
        Ok(())
    }

    /// The sandbox's mount namespace; `None` when it ended.
    fn mount_ns(&self, init: &OwnedFd, pid: i32) -> Result<Option<OwnedFd>, LiveError> {
        // libcontainer reports the init before it has executed aisb's init: until then it is
        // libcontainer's own non-dumpable process, whose namespaces an ordinary user may not
        // open (EACCES). The exec follows within milliseconds; wait for it, boundedly.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mnt: OwnedFd = loop {
            match std::fs::File::open(format!("/proc/{pid}/ns/mnt")) {
                Ok(f) => break f.into(),
                // ENOENT: exiting (its namespaces go before the pidfd says so) or gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound || readable(init) => {
                    return Ok(None)
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::PermissionDenied
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(source) => {
                    return Err(LiveError::Watch {
                        what: "opening the sandbox's mount namespace".into(),
                        source,
                    })
                }
            }
        };
        // The pid still names the same process (a pidfd becomes readable when it exits).
        Ok((!readable(init)).then_some(mnt))
    }

    fn apply(&self, masker: &mut Masker, r: &Request) -> Result<(), LiveError> {
        let rel = Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&r.rel));
        let path = self.inside.join(rel);
        // A symbolic link under a secret's name that leads nowhere is a trap for a later write
        // on the host (`ln -s notes.txt .env.local`: the host's `.env.local` would create
        // notes.txt, which nothing masks): moved aside as soon as it appears, so the host's
        // write makes a regular file, masked like any other. (One that leads somewhere masks
        // what it names, below.) Never followed: only its directories are.
        let host_path = self.host.join(rel);
        let moved_before = host_path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains(".aisb-quarantined-"));
        if !moved_before
            && std::fs::symlink_metadata(&host_path).is_ok_and(|m| m.file_type().is_symlink())
            && std::fs::metadata(&host_path).is_err()
            && !crate::runtime::protect::has_link_between(&self.host, &host_path)
        {
            if let Some((from, to)) =
                crate::git::quarantine_beneath(&self.host, &host_path, &self.quarantine)
            {
                if let Some(log) = &self.audit {
                    let _ = log.write(crate::audit::Kind::Quarantine {
                        path: from.to_string_lossy().into_owned(),
                        moved_to: to.to_string_lossy().into_owned(),
                        why: format!(
                            "a symbolic link under a secret's name that leads nowhere ({}): a later write on the host would create what it names",
                            r.rule
                        ),
                    });
                }
                return Ok(());
            }
        }
        match masker.mask(&r.rel) {
            Ok(Outcome::Absent) => Ok(()),
            Ok(outcome) => {
                // Reported from now on (the mask itself is in place already).
                let _ = masker.deny(&path, outcome == Outcome::Dir, &r.rule);
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
