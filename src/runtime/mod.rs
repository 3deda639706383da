//! Running a plan: write its bundle, start it on a backend, pass the exit status through.
//! Backends share one spec (see `spec`); each lives in its own crate under `runtimes/`.

pub mod broker;
mod bwrap;
pub mod cgroup;
pub(crate) mod console;
pub mod disk;
mod libcontainer;
pub mod limits;
pub mod live;
pub mod net;
pub mod protect;
pub mod rootless;
pub mod rootmount;
pub mod step;

use std::path::PathBuf;
use std::time::Instant;

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{SigSet, Signal};
use serde::Serialize;

use crate::eval::Plan;
use crate::spec::bundle::{self, BundleError};
use crate::spec::LimitsBy;
use rootmount::RootMount;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// bubblewrap (external `bwrap`, Debian package `bubblewrap`)
    Bwrap,
    /// youki's libcontainer, in-process (no daemon); supports copy-on-write mounts
    Libcontainer,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RuntimeError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Realise(#[from] crate::graph::realise::RealiseError),
    #[error("the bwrap backend cannot run this sandbox: {0}")]
    #[diagnostic(help("remove what it names from sandbox.kdl, or use another backend"))]
    BwrapUnsupported(#[from] aisb_bwrap::BwrapError),
    #[error("cannot start `{program}`: {source}")]
    #[diagnostic(help("install it (Debian: apt-get install bubblewrap), or run `aisb doctor`"))]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Rootless(#[from] rootless::RootlessError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Limits(#[from] limits::LimitsError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Live(#[from] live::LiveError),
    #[error("the copy-on-write layer of {target} is in use by another run of this profile")]
    #[diagnostic(help("overlayfs serves one layer to one sandbox at a time: wait for the other run to end, or give each agent its own sandbox (`aisb up NAME -- …`, one per task)"))]
    LayerBusy { target: PathBuf },
    #[error("{what}: {source}")]
    #[diagnostic(help("check that the sandbox state directory is writable"))]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// An ordinary user's user namespace over their subordinate ids could not be had.
    #[error("{what}: {source}")]
    #[diagnostic(help(
        "`aisb doctor` says what an ordinary user's images need here (subordinate ids: one-time, as root, `aisb setup-user NAME`; `newuidmap` from uidmap; overlayfs in a user namespace, Linux 5.11+)"
    ))]
    Userns {
        what: String,
        source: std::io::Error,
    },
}

impl Backend {
    /// `--backend`, else the configuration's `backend`, else the caller's default.
    pub fn choose(flag: Option<Backend>, configured: Option<&str>) -> Backend {
        flag.or_else(|| {
            configured.and_then(|c| <Backend as clap::ValueEnum>::from_str(c, false).ok())
        })
        .unwrap_or_else(Backend::default_for_caller)
    }

    /// libcontainer, unless the caller is an ordinary user who has not had the one-time root
    /// step it needs rootless (see [`rootless`]): then bwrap, which needs none. Either runs
    /// the same spec; `aisb doctor` says which one is chosen and why.
    pub fn default_for_caller() -> Backend {
        if nix::unistd::geteuid().is_root() || rootless::prepare_for_caller().is_ok() {
            Backend::Libcontainer
        } else {
            Backend::Bwrap
        }
    }
}

/// In a named sandbox's state: the host pid of its running init.
pub const INIT_PID_FILE: &str = "init.pid";

/// In a libcontainer bundle: the limits its cgroup recorded, written by the helper before the
/// container (and its cgroup) is deleted.
pub const HITS_FILE: &str = "limits-hit.json";

/// What `aisb run --json` reports.
#[derive(Debug, Serialize)]
pub struct Summary {
    pub backend: Backend,
    pub profile: String,
    pub exit_code: i32,
    pub duration_ms: u128,
    pub masked_paths: usize,
    pub network: crate::config::model::NetMode,
}

/// Removes a run's bundle whatever happens (the overlay and copy state stays: it is the work).
struct BundleGuard(PathBuf);

impl Drop for BundleGuard {
    fn drop(&mut self) {
        // An ordinary user's libcontainer run on an image sets its root up as root of a user
        // namespace over their subordinate ids: the mount points it made there are theirs.
        let _ = crate::userns::remove_all(&self.0);
    }
}

/// A file made for one run on the host, removed when the run ends.
struct RunFile(PathBuf);

impl RunFile {
    fn write(path: PathBuf, bytes: &[u8]) -> Result<RunFile, RuntimeError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::remove_file(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(|source| RuntimeError::Io {
                what: format!("writing {}", path.display()),
                source,
            })?;
        Ok(RunFile(path))
    }
}

impl Drop for RunFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The copy-on-write layers a run holds: the locks, and the layers made for this run alone
/// (removed when it ends).
struct Layers {
    _locks: Vec<Flock<std::fs::File>>,
    own: Option<PathBuf>,
    /// Dependency directories made empty on the host for this run (`Plan::made_for_run`).
    made: Vec<Made>,
    /// The project's git directory, private to this run, brought back when it ends.
    git: Option<GitRun>,
    /// The git objects it shows (held: not removed while the run lasts).
    _store: Option<crate::git::store::Store>,
}

/// A run's private git directory (see [`crate::git::back`]) and the host's side when it
/// started.
struct GitRun {
    layer: crate::git::back::Layer,
    before: crate::git::back::Before,
    state_dir: PathBuf,
    run: String,
}

impl GitRun {
    /// Bring the layer back (once): the host's branch, index and objects get what the
    /// sandbox committed, what it planted is reported.
    fn finish(&self, audit: Option<&crate::audit::Log>, mode: crate::git::back::Mode<'_>) {
        let outcome = crate::git::back::bring_back(
            &self.layer,
            mode,
            &self.run,
            &self.state_dir.join("git-scratch"),
            &self.state_dir.join("quarantine"),
        );
        let keep = self.state_dir.join(crate::git::back::LAYER_DIR);
        report_git_back(audit, &self.layer, &self.run, &keep, outcome);
    }
}

/// Say what [`crate::git::back::bring_back`] did. On an error the layer is set aside as
/// `failed-<run>` (nothing the sandbox committed is lost) and said where.
fn report_git_back(
    audit: Option<&crate::audit::Log>,
    layer: &crate::git::back::Layer,
    run: &str,
    keep: &std::path::Path,
    outcome: Result<crate::git::back::Outcome, crate::git::back::BackError>,
) {
    match outcome {
        Ok(o) => {
            for (from, to) in o.quarantined {
                protect::report(
                    audit,
                    &from,
                    &to,
                    "was written by the sandbox (git on the host would have read configuration, code or a location through it; it never reached the host's git directory)",
                    "git would read configuration through it".into(),
                );
            }
            for line in o.lines {
                eprintln!("{line}");
            }
        }
        Err(e) => {
            // Kept aside, never mounted again: a layer that cannot come back would hide the
            // host's newer history from every later run.
            let kept = crate::git::back::set_aside(layer, run, keep);
            eprintln!(
                "aisb: what the sandbox did in git was not brought back: {e}\n  help: its git directory's layer is kept in {}: look at it there (`git --git-dir=… log`), or remove it",
                kept.as_deref().unwrap_or(&layer.upper).display()
            );
        }
    }
}

impl Layers {
    /// The workload ended: bring the git directory back.
    fn finish(&mut self, audit: Option<&crate::audit::Log>) {
        if let Some(g) = self.git.take() {
            g.finish(audit, crate::git::back::Mode::Finished(&g.before));
        }
    }
}

/// A dependency directory made (or found made) on the host for a run, with the shared lock
/// that says this run uses it.
struct Made {
    dir: PathBuf,
    layer: PathBuf,
    in_use: std::fs::File,
}

impl Drop for Layers {
    fn drop(&mut self) {
        // A path that skipped `finish` (an error, a panic) still brings the git directory
        // back, before its lock is released.
        self.finish(None);
        if let Some(dir) = &self.own {
            let _ = crate::beneath::remove_tree(dir);
        }
        // The last run out removes it, and only while still empty: the sandbox wrote its
        // layer, never this; a host-side install during the run keeps its directory. Removing
        // it while another run uses it would detach that run's layer, and its writes would
        // then reach the host.
        for m in &self.made {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a descriptor we own; upgrading our shared lock.
            if unsafe { libc::flock(m.in_use.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue;
            }
            match std::fs::remove_dir(&m.dir) {
                Ok(()) => {
                    let _ = std::fs::remove_file(m.layer.join(crate::eval::deps::MADE_RECORD));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let _ = std::fs::remove_file(m.layer.join(crate::eval::deps::MADE_RECORD));
                }
                Err(_) => {}
            }
        }
    }
}

/// A lock file of aisb's state (see [`crate::atomic::lock_file`]).
fn lock_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    crate::atomic::lock_file(path)
}

/// Make each absent dependency directory of `plan` empty on the host, so its copy-on-write
/// layer has a mount point, after recording it as aisb's and taking its shared in-use lock
/// (see [`Layers`]). The layer's lower directory is aisb's own empty one, never the host's
/// path. One a concurrent run made meanwhile is used as it is.
fn make_for_run(plan: &Plan) -> Result<Vec<Made>, RuntimeError> {
    let mut made = Vec::new();
    for dir in &plan.made_for_run {
        let Some(lower) = plan.mounts.iter().find_map(|m| match &m.kind {
            crate::eval::plan::MountKind::Overlay { lower, .. } if m.target == *dir => {
                Some(lower.clone())
            }
            _ => None,
        }) else {
            continue;
        };
        let Some(layer) = lower.parent().map(std::path::Path::to_path_buf) else {
            continue;
        };
        let io = |what: String| move |source| RuntimeError::Io { what, source };
        std::fs::create_dir_all(&lower).map_err(io(format!("making {}", lower.display())))?;
        let in_use = lock_file(&layer.join(crate::eval::deps::IN_USE_LOCK))
            .map_err(io(format!("locking {}", layer.display())))?;
        // SAFETY: flock on a descriptor we own. Blocks only while a run ending holds it
        // exclusively to remove the directory.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&in_use), libc::LOCK_SH) } != 0 {
            return Err(io(format!("locking {}", layer.display()))(
                std::io::Error::last_os_error(),
            ));
        }
        // Recorded first: a run planned meanwhile sees an empty directory that is aisb's.
        crate::atomic::write_atomic(
            &layer.join(crate::eval::deps::MADE_RECORD),
            dir.as_os_str().as_encoded_bytes(),
        )
        .map_err(io(format!("recording {}", dir.display())))?;
        match std::fs::create_dir(dir) {
            Ok(()) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists
                    && std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) => {}
            Err(source) => {
                return Err(RuntimeError::Io {
                    what: format!(
                        "making {} for the run (its copy-on-write layer's mount point; a link or a file of that name appeared since the plan: run again)",
                        dir.display()
                    ),
                    source,
                })
            }
        }
        made.push(Made {
            dir: dir.clone(),
            layer,
            in_use,
        });
    }
    Ok(made)
}

/// The lock a run's own layers hold (`<state>/deps-run/<pid>-<nanos>/lock`), exclusive while
/// it runs.
const RUN_LAYERS_LOCK: &str = "lock";

/// Remove the layers of earlier runs that ended without removing them (killed): those whose
/// lock nobody holds. Never by pid alone: a state dir shared across pid namespaces would see
/// a live run's pid as gone.
fn sweep_dead_layers(plan: &Plan) {
    use std::os::unix::fs::OpenOptionsExt;
    let runs = plan
        .state_dir
        .join(format!("{}-run", crate::eval::deps::LAYER_DIR));
    let Ok(entries) = std::fs::read_dir(&runs) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        // `.<pid>-<nanos>`: a run making its layers (see `claim_layers`); one left by a run
        // killed in that instant is removed once a minute old.
        if e.file_name().as_encoded_bytes().starts_with(b".")
            && !e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|d| d.as_secs() > 60))
        {
            continue;
        }
        let lock = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(e.path().join(RUN_LAYERS_LOCK));
        let free = match lock {
            Ok(f) => Flock::lock(f, FlockArg::LockExclusiveNonblock).ok(),
            Err(_) => None,
        };
        if let Some(_held) = free {
            recover_git_layers(&e.path(), &plan.state_dir);
            let _ = crate::beneath::remove_tree(&e.path());
        }
    }
}

/// Bring back the git directory layers in `dir` (a dead run's own layers) that still hold
/// what the sandbox wrote: as `refs/aisb/<run>/…` only.
fn recover_git_layers(dir: &std::path::Path, state_dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Some(layer) = crate::git::back::recorded(&e.path()) {
            recover_git_layer(layer, state_dir);
        }
    }
}

/// A git layer a killed run left: brought back as `refs/aisb/<run>/…`, then emptied.
fn recover_git_layer(mut layer: crate::git::back::Layer, state_dir: &std::path::Path) {
    if crate::git::back::is_empty(&layer) {
        return;
    }
    // Brought back against the project's store, when it has one (the run that wrote the layer
    // saw one like it), held while it is.
    let store = crate::git::store::current(state_dir, &layer.host_git);
    layer.base = store.as_ref().map(|s| s.layer.join("objects"));
    eprintln!(
        "aisb: an earlier run of this project ended before it brought back what its sandbox did in git; bringing it back now"
    );
    let g = GitRun {
        layer,
        before: crate::git::back::Before {
            head: None,
            index: None,
            index_then: None,
        },
        state_dir: state_dir.to_path_buf(),
        run: run_name("left"),
    };
    let audit = crate::audit::Log::open(&state_dir.join("audit.jsonl")).ok();
    g.finish(audit.as_ref(), crate::git::back::Mode::Leftover);
}

/// A name for a run in `refs/aisb/<name>/`: when it started, and which aisb.
fn run_name(kind: &str) -> String {
    static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{kind}-{}.{:09}-{}-{}",
        now.as_secs(),
        now.subsec_nanos(),
        std::process::id(),
        COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Claim each copy-on-write layer (`MountKind::Overlay`) of `plan` for this run: an exclusive
/// lock on `<layer>/lock`, held until the returned locks drop. overlayfs refuses an upper or
/// work dir that another mount uses (EINVAL from mount(2), deep in the backend), so a second
/// run of the same profile at once gets a clear error instead — except for a dependency
/// directory's layer (`eval::deps`), which is a convenience, not the sandbox's work: a second
/// run gets a fresh layer of its own, removed when it ends (returned as a new plan). The lock
/// file is opened without following links and never written.
fn claim_layers(plan: &Plan) -> Result<(Layers, Option<Plan>), RuntimeError> {
    let mut held = Vec::new();
    let mut own: Option<PathBuf> = None;
    let mut changed: Option<Plan> = None;
    sweep_dead_layers(plan);
    for (i, m) in plan.mounts.iter().enumerate() {
        let crate::eval::plan::MountKind::Overlay { upper, .. } = &m.kind else {
            continue;
        };
        let Some(dir) = upper.parent() else { continue };
        let io = |source| RuntimeError::Io {
            what: format!("locking the copy-on-write layer {}", dir.display()),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let f = lock_file(&dir.join("lock")).map_err(io)?;
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => held.push(l),
            Err((_, nix::errno::Errno::EWOULDBLOCK))
                if crate::eval::deps::is_dependency_layer(&plan.state_dir, upper)
                    || crate::git::back::is_git_layer(&plan.state_dir, upper) =>
            {
                if own.is_none() {
                    // Named by pid and time: never another live run's (a state dir shared
                    // across pid namespaces can see the same pid twice).
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos());
                    let runs = plan
                        .state_dir
                        .join(format!("{}-run", crate::eval::deps::LAYER_DIR));
                    let name = format!("{}-{nanos}", std::process::id());
                    // Made and locked under a name the sweep leaves alone, then renamed: a
                    // concurrent run's sweep never sees it unlocked (it took the lock between
                    // our create and our flock, and removed the directory under us).
                    let making = runs.join(format!(".{name}"));
                    std::fs::create_dir_all(&making).map_err(io)?;
                    let f = lock_file(&making.join(RUN_LAYERS_LOCK)).map_err(io)?;
                    held.push(
                        Flock::lock(f, FlockArg::LockExclusiveNonblock)
                            .map_err(|(_, e)| io(e.into()))?,
                    );
                    let run = runs.join(name);
                    std::fs::rename(&making, &run).map_err(io)?;
                    own = Some(run);
                }
                let run = own.as_ref().expect("set above");
                let fresh = run.join(dir.file_name().unwrap_or_default());
                let _ = crate::beneath::remove_tree(&fresh);
                std::fs::create_dir_all(&fresh).map_err(|source| RuntimeError::Io {
                    what: format!("making a copy-on-write layer in {}", fresh.display()),
                    source,
                })?;
                let p = changed.get_or_insert_with(|| plan.clone());
                if let crate::eval::plan::MountKind::Overlay { upper, work, .. } =
                    &mut p.mounts[i].kind
                {
                    *upper = fresh.join("upper");
                    *work = fresh.join("work");
                }
            }
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(RuntimeError::LayerBusy {
                    target: m.target.clone(),
                })
            }
            Err((_, e)) => return Err(io(e.into())),
        }
    }
    let git = claim_git_layer(changed.as_ref().unwrap_or(plan))?;
    let mut git = git;
    let now = changed.as_ref().unwrap_or(plan);
    let store = match &git {
        Some(g) => git_store(now, &g.layer.host_git, &g.layer.work_tree),
        None => read_only_git_dir(now).and_then(|dot| git_store(now, &dot, &now.project)),
    };
    if let Some(store) = &store {
        let p = changed.get_or_insert_with(|| plan.clone());
        match &mut git {
            // Above the host's git directory in the run's private one; what the sandbox
            // writes is brought back against it.
            Some(g) => {
                g.layer.base = Some(store.layer.join("objects"));
                for m in &mut p.mounts {
                    if let crate::eval::plan::MountKind::Overlay { upper, above, .. } = &mut m.kind
                    {
                        if g.layer.upper == *upper {
                            *above = Some(store.layer.clone());
                        }
                    }
                }
            }
            // In place of the objects of a git directory the sandbox only reads.
            None => p.mounts.push(crate::eval::plan::Mount {
                target: p.project.join(".git/objects"),
                kind: crate::eval::plan::MountKind::Bind {
                    source: store.layer.join("objects"),
                    writable: false,
                },
                why: "git objects without the content of masked files".into(),
            }),
        }
    }
    // Last: an error above leaves nothing made on the host.
    let made = make_for_run(plan)?;
    Ok((
        Layers {
            _locks: held,
            own,
            made,
            git,
            _store: store,
        },
        changed,
    ))
}

/// The project's git directory when the sandbox sees it read-only (a read-only project, whose
/// `.git` is a directory of its own): its objects are shown from the store.
pub fn read_only_git_dir(plan: &Plan) -> Option<PathBuf> {
    let read_only = plan.mounts.iter().any(|m| {
        m.target == plan.project
            && matches!(
                m.kind,
                crate::eval::plan::MountKind::Bind {
                    writable: false,
                    ..
                }
            )
    });
    let dot = plan.project.join(".git");
    let dir = |p: &std::path::Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    (read_only && dir(&dot) && dir(&dot.join("objects"))).then_some(dot)
}

/// The git objects the sandbox sees in its private git directory: the host's without the
/// content of masked files (see [`crate::git::store`]); `None` when nothing in the history is
/// masked. A store that cannot be built is said loudly, and git inside sees no objects; where
/// not even that can be made (a file system without user extended attributes for aisb's
/// state), the run goes on with the host's objects, said loudly.
fn git_store(
    plan: &Plan,
    host_git: &std::path::Path,
    work_tree: &std::path::Path,
) -> Option<crate::git::store::Store> {
    let rules = plan.live.as_ref()?;
    if std::env::var(crate::eval::BREAK_ISOLATION_ENV).as_deref() == Ok("git-objects") {
        eprintln!(
            "aisb: WARNING: {}=git-objects: the content of masked files stays in this sandbox's git objects (a test of the tests)",
            crate::eval::BREAK_ISOLATION_ENV
        );
        return None;
    }
    match crate::git::store::prepare(
        &plan.state_dir,
        host_git,
        work_tree,
        rules,
        crate::git::store::Use::Overlay,
    ) {
        Ok(store) => store,
        // Closed: git inside sees no objects at all rather than the host's.
        Err(e) => match crate::git::store::empty(&plan.state_dir, host_git) {
            Ok(empty) => {
                eprintln!(
                    "aisb: WARNING: git in this sandbox sees no history: its objects without the content of masked files could not be prepared: {e}"
                );
                Some(empty)
            }
            Err(e2) => {
                eprintln!(
                    "aisb: WARNING: the content of masked files stays readable through git in this sandbox (`git show HEAD:PATH`): its objects without them could not be prepared: {e}; {e2}"
                );
                None
            }
        },
    }
}

/// The project's private git directory in `plan` (its layer's lock is held by now): the
/// record of which repository it belongs to written, what a killed run left in it brought
/// back first, and the host's side noted.
fn claim_git_layer(plan: &Plan) -> Result<Option<GitRun>, RuntimeError> {
    // A linked work tree's private git directory is its repository's common one.
    let worktree = crate::git::linked_worktree(&plan.project);
    let git_dir = worktree
        .as_ref()
        .map_or_else(|| plan.project.join(".git"), |w| w.common.clone());
    let Some((host_git, upper, work)) = plan.mounts.iter().find_map(|m| match &m.kind {
        crate::eval::plan::MountKind::Overlay {
            lower, upper, work, ..
        } if m.target == git_dir
            && (crate::git::back::is_git_layer(&plan.state_dir, upper)
                || upper.starts_with(
                    plan.state_dir
                        .join(format!("{}-run", crate::eval::deps::LAYER_DIR)),
                )) =>
        {
            Some((lower.clone(), upper.clone(), work.clone()))
        }
        _ => None,
    }) else {
        return Ok(None);
    };
    let work_tree = match &worktree {
        Some(_) => plan.project.clone(),
        None => host_git.parent().map(PathBuf::from).unwrap_or_default(),
    };
    let layer = crate::git::back::Layer {
        host_git,
        work_tree,
        upper,
        work,
        base: None,
        admin: worktree.map(|w| w.rel()),
    };
    let dir = layer.upper.parent().map(PathBuf::from).unwrap_or_default();
    if let Some(left) = crate::git::back::recorded(&dir) {
        recover_git_layer(left, &plan.state_dir);
    } else if !crate::git::back::is_empty(&layer) {
        recover_git_layer(layer.clone(), &plan.state_dir);
    }
    // Never mounted holding an earlier run's work: it would hide the host's newer history.
    if !crate::git::back::is_empty(&layer) {
        return Err(RuntimeError::Io {
            what: format!(
                "starting with the project's git directory: its layer {} still holds an earlier run's work that could not be brought back or set aside; move it away",
                layer.upper.display()
            ),
            source: std::io::Error::from(std::io::ErrorKind::DirectoryNotEmpty),
        });
    }
    crate::git::back::record(&dir, &layer).map_err(|source| RuntimeError::Io {
        what: format!("recording the git layer {}", dir.display()),
        source,
    })?;
    Ok(Some(GitRun {
        before: crate::git::back::Before::of(&layer.host_admin()),
        layer,
        state_dir: plan.state_dir.clone(),
        run: run_name("run"),
    }))
}

/// Run `plan` on `backend` to the end. On an image, `root_mount` is the image's root, which
/// the runtime process mounts in a private mount namespace (the caller realised the image and
/// pointed the plan's system paths at it: `image::sandbox::prepare_run`); runtime builds
/// nothing.
pub fn run(
    plan: &Plan,
    root_mount: Option<&RootMount>,
    backend: Backend,
    interactive: bool,
) -> Result<Summary, RuntimeError> {
    let start = Instant::now();
    let git_before = git_before(plan);
    let exe = std::env::current_exe().map_err(|source| RuntimeError::Io {
        what: "locating the aisb binary".into(),
        source,
    })?;
    let held = limits::held(plan);
    let plan = held.as_ref().unwrap_or(plan);
    let limits_by = limits::decide(plan)?;
    let audit = crate::audit::Log::open(&plan.state_dir.join("audit.jsonl")).ok();
    let (protect_record, swept) = protect::begin(plan, audit.as_ref());
    let plan = swept.as_ref().unwrap_or(plan);
    let net::Started {
        proxy,
        env: brokered,
        withheld,
    } = net::start(plan, &exe)?;
    for name in &withheld {
        eprintln!(
            "aisb: ${name} is kept out of the sandbox: its value holds a brokered credential"
        );
    }
    // The placeholders of brokered credentials, in place of any value of theirs.
    let with_placeholders = (!brokered.is_empty()).then(|| {
        let mut p = plan.clone();
        p.env
            .vars
            .retain(|(k, _)| !brokered.iter().any(|(b, _)| b == k) && !withheld.contains(k));
        p.env.vars.extend(brokered);
        p
    });
    let plan = with_placeholders.as_ref().unwrap_or(plan);
    // From here on, what changes in the project is stamped at or after the run's start.
    protect_record.settle();
    if let Some(log) = &audit {
        let _ = log.write(crate::audit::Kind::Start {
            profile: plan.profile.clone(),
            backend: clap::ValueEnum::to_possible_value(&backend)
                .map_or_else(String::new, |v| v.get_name().to_string()),
            command: plan.process.args.clone(),
            network: format!("{:?}", plan.network.mode).to_lowercase(),
            masked_paths: plan.masks.len(),
            env_dropped: plan.env.dropped.iter().map(|d| d.name.clone()).collect(),
            allow: plan.network.allow.clone(),
        });
    }
    // Named sandboxes (they have a state.json) record their init's pid, so a second session
    // can join it (`aisb up NAME` while it runs).
    let pid_file = plan
        .state_dir
        .join("state.json")
        .exists()
        .then(|| plan.state_dir.join(INIT_PID_FILE));
    // Secrets written into the project while the sandbox runs (see `live`); started before
    // the sandbox, so the project is walked while the runtime sets it up.
    let mut live: Option<live::Live>;
    let (exit_code, hits) = match backend {
        // bwrap needs no bundle on disk: the spec goes straight into its arguments, and it
        // hands the sandbox our terminal as it is.
        Backend::Bwrap => {
            let (mut layers, own_layers) = claim_layers(plan)?;
            let plan = own_layers.as_ref().unwrap_or(plan);
            let mask_file = crate::graph::realise::realise(plan)?;
            // The init's list of masks, for this run alone (removed when it ends).
            let mask_list = RunFile::write(
                plan.state_dir.join(format!("masks-{}", std::process::id())),
                &crate::spec::mask_list(plan),
            )?;
            let paths = crate::spec::SpecPaths {
                mask_list: Some(mask_list.0.clone()),
                rootfs: PathBuf::from("rootfs"),
                mask_file,
                cgroups_path: bundle::cgroups_path(plan, &plan.state_dir, None),
                init: Some(crate::init::binary_beside(&exe)),
                terminal: false,
                proxy_dir: proxy.as_ref().map(|p| p.dir.clone()),
                rootless: None,
                limits: match limits_by {
                    LimitsBy::Cgroup => LimitsBy::OwnCgroup,
                    other => other,
                },
            };
            let spec = crate::spec::build(plan, &paths).map_err(BundleError::from)?;
            let mask_file = paths.mask_file.clone();
            // Unique per run: two runs of one project at once each get their own.
            let cgroup = match limits_by {
                LimitsBy::Cgroup => {
                    let base = bundle::cgroups_path(plan, &plan.state_dir, None);
                    let name = base.rsplit('/').next().unwrap_or("sandbox");
                    let run = format!("{}{}", cgroup::RUN_PREFIX, std::process::id());
                    Some(own_cgroup(&format!("{name}-{run}"), plan)?)
                }
                _ => None,
            };
            let symlinks = plan
                .system
                .iter()
                .filter_map(|s| match s {
                    crate::eval::plan::SystemPath::Symlink { path, target } => {
                        Some((path.clone(), target.clone()))
                    }
                    _ => None,
                })
                .collect();
            live = live::Live::start(plan, &exe)?;
            let code = bwrap::run(
                &spec,
                symlinks,
                interactive,
                pid_file.as_deref(),
                root_mount,
                cgroup
                    .as_ref()
                    .map(cgroup::Cgroup::procs_fds)
                    .unwrap_or_default(),
                live.as_mut(),
                Some(&mask_file),
            )?;
            layers.finish(audit.as_ref());
            (
                code,
                cgroup
                    .as_ref()
                    .map(cgroup::Cgroup::hits)
                    .unwrap_or_default(),
            )
        }
        // libcontainer reads `config.json` from a bundle; it also needs a pseudo-terminal of
        // its own on a terminal, passed back through a console socket.
        Backend::Libcontainer => {
            let (mut layers, own_layers) = claim_layers(plan)?;
            let plan = own_layers.as_ref().unwrap_or(plan);
            // An ordinary user's image holds files of their subordinate ids: the helper runs
            // in a user namespace with their whole map, and the spec makes none of its own.
            let userns = match root_mount {
                Some(_) if !nix::unistd::geteuid().is_root() => crate::userns::caller_maps().ok(),
                _ => None,
            };
            let rootless = if nix::unistd::geteuid().is_root() {
                None
            } else {
                let id = &plan.identity;
                let mut r = rootless::prepare(&id.name, id.uid, id.gid)?;
                r.outer_userns = userns.is_some();
                Some(r)
            };
            let runs = plan.state_dir.join("run");
            let dir = runs.join(std::process::id().to_string());
            // A bundle left by a crashed run with our pid is stale by construction.
            if dir.exists() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            std::fs::create_dir_all(&runs).map_err(|source| RuntimeError::Io {
                what: format!("creating {}", runs.display()),
                source,
            })?;
            let guard = BundleGuard(dir.clone());
            let terminal = interactive && nix::unistd::isatty(0).unwrap_or(false);
            let limits_by = match limits_by {
                LimitsBy::Cgroup if rootless.is_some() => LimitsBy::OwnCgroup,
                other => other,
            };
            let mask_file = crate::graph::realise::realise(plan)?;
            let spec = bundle::write(
                plan,
                &dir,
                &mask_file,
                Some(&crate::init::binary_beside(&exe)),
                terminal,
                rootless.as_ref(),
                proxy.as_ref().map(|p| p.dir.as_path()),
                limits_by,
            )?;
            // Made where libcontainer looks for it; libcontainer removes it with the container.
            let _cgroup = match limits_by {
                LimitsBy::OwnCgroup => {
                    let path = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone());
                    let name = path
                        .as_ref()
                        .and_then(|p| p.file_name())
                        .map(|n| n.to_string_lossy().into_owned());
                    Some(own_cgroup(name.as_deref().unwrap_or("sandbox"), plan)?)
                }
                _ => None,
            };
            let id = format!("aisb-{}", std::process::id());
            // Made here, so that it is the caller's even when the helper runs as root of a
            // user namespace over their subordinate ids (libcontainer removes what it adds).
            let state_root = plan.state_dir.join("libcontainer");
            std::fs::create_dir_all(&state_root).map_err(|source| RuntimeError::Io {
                what: format!("creating {}", state_root.display()),
                source,
            })?;
            live = live::Live::start(plan, &exe)?;
            let code = libcontainer::run(
                &exe,
                &guard.0,
                &state_root,
                &id,
                interactive,
                terminal,
                pid_file.as_deref(),
                root_mount,
                live.as_mut(),
                userns.as_ref(),
            )?;
            layers.finish(audit.as_ref());
            let hits = std::fs::read(guard.0.join(HITS_FILE))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            (code, hits)
        }
    };
    let late = live.map_or(Ok(()), live::Live::finish);
    if let Some(f) = &pid_file {
        let _ = std::fs::remove_file(f);
    }
    drop(proxy);
    for line in limits::report(&plan.limits, hits, exit_code) {
        eprintln!("{line}");
    }
    disarm_git(plan, audit.as_ref(), &git_before);
    protect_record.finish(audit.as_ref());
    if let Some(log) = &audit {
        let _ = log.write(crate::audit::Kind::Exit {
            exit_code,
            duration_ms: start.elapsed().as_millis() as u64,
        });
    }
    late?;
    Ok(Summary::new(plan, backend, exit_code, start))
}

/// After the workload: move out of the way what the sandbox wrote that git on the host would
/// read configuration through and that guards cannot refuse (the git directory must stay
/// writable for commits): a new `commondir` or `config.worktree`, and the `.git` of a
/// submodule it added or changed (`git status` at the top looks into every submodule).
fn disarm_git(plan: &Plan, audit: Option<&crate::audit::Log>, before: &GitBefore) {
    let guards: Vec<crate::git::Guard> = plan.mounts.iter().filter_map(|m| m.git_guard()).collect();
    let quarantine = plan.state_dir.join("quarantine");
    let mut moved = crate::git::disarm(&guards, &quarantine);
    if let Some((work_tree, git_dir, stamp, since)) = before {
        // A gitlink the index had before the run is looked into too: the sandbox may have made
        // a repository of its own where one was (the index unchanged).
        if crate::git::index_stamp(git_dir) != *stamp
            || crate::git::may_have_gitlinks(git_dir, &plan.state_dir.join("git-gitlinks"))
        {
            for dot in crate::git::changed_submodules(work_tree, git_dir, *since) {
                moved.extend(crate::git::quarantine_beneath(work_tree, &dot, &quarantine));
            }
        }
    }
    for (from, to) in moved {
        protect::report(
            audit,
            &from,
            &to,
            "was written by the sandbox (git on the host would have read configuration, and the programs it names, through it)",
            "git would read configuration through it".into(),
        );
    }
}

/// The project's work tree on the host and its git directory, the index's stamp and the
/// time, before the workload runs: when a run changes the index, its submodules are looked
/// at afterwards.
type GitBefore = Option<(
    PathBuf,
    PathBuf,
    Option<crate::git::IndexStamp>,
    std::time::SystemTime,
)>;

fn git_before(plan: &Plan) -> GitBefore {
    let work_tree = plan.mounts.iter().find_map(|m| match &m.kind {
        crate::eval::plan::MountKind::Bind {
            source,
            writable: true,
        } if m.target == plan.project => Some(source.clone()),
        _ => None,
    })?;
    let git_dir = plan.mounts.iter().find_map(|m| match &m.kind {
        crate::eval::plan::MountKind::Git {
            source,
            writable: true,
            ..
        }
        | crate::eval::plan::MountKind::Overlay { lower: source, .. }
            if m.target == plan.project.join(".git") =>
        {
            Some(source.clone())
        }
        _ => None,
    })?;
    // Settled with the protected files' mark, which is read later (`protect::settle`).
    let since = std::time::UNIX_EPOCH
        + std::time::Duration::from_nanos(protect::start_mark(&work_tree).max(0) as u64);
    let stamp = crate::git::index_stamp(&git_dir);
    Some((work_tree, git_dir, stamp, since))
}

/// The cgroup `name` aisb makes itself, with the plan's limits, for the caller.
fn own_cgroup(name: &str, plan: &Plan) -> Result<cgroup::Cgroup, RuntimeError> {
    Ok(cgroup::Cgroup::create(
        name,
        &plan.limits,
        nix::unistd::geteuid().as_raw(),
    )?)
}

impl Summary {
    pub fn new(plan: &Plan, backend: Backend, exit_code: i32, start: Instant) -> Summary {
        Summary {
            backend,
            profile: plan.profile.clone(),
            exit_code,
            duration_ms: start.elapsed().as_millis(),
            masked_paths: plan.masks.len(),
            network: plan.network.mode,
        }
    }
}

/// Signals sent to aisb that are meant for the sandbox.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];
/// The terminal's own (^C, ^\). On a terminal they reach the sandbox by themselves (as a
/// signal to the process group it shares with us, or as a byte through its own
/// pseudo-terminal), so they are forwarded only when the run is not interactive.
const TERMINAL: [Signal; 2] = [Signal::SIGINT, Signal::SIGQUIT];

/// Block, in this thread, every signal meant for the sandbox (threads started later inherit
/// the mask; children get it reset). Returns (blocked, to forward): a thread `sigwait`s on the
/// second and passes them on. `winch`: also take SIGWINCH (the caller resizes a terminal).
pub(crate) fn take_signals(
    interactive: bool,
    winch: bool,
) -> Result<(SigSet, SigSet), RuntimeError> {
    let mut blocked = SigSet::empty();
    let mut forward = SigSet::empty();
    for s in FORWARDED.iter().chain(&TERMINAL) {
        blocked.add(*s);
        if !(interactive && TERMINAL.contains(s)) {
            forward.add(*s);
        }
    }
    if winch {
        blocked.add(Signal::SIGWINCH);
        forward.add(Signal::SIGWINCH);
    }
    blocked.thread_block().map_err(|e| RuntimeError::Io {
        what: "blocking signals".into(),
        source: e.into(),
    })?;
    Ok((blocked, forward))
}

thread_local! {
    static DETACHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the run on this thread is detached from the caller's input ([`run_detached`]).
pub(crate) fn detached() -> bool {
    DETACHED.with(std::cell::Cell::get)
}

/// [`run`] for a sandbox that only holds a named one's place while sessions join it (`aisb
/// up NAME`, on a thread of its own): it reads nothing (its standard input is /dev/null), and
/// what it prints on the caller's terminal is filtered like a session's.
pub fn run_detached(
    plan: &Plan,
    root_mount: Option<&RootMount>,
    backend: Backend,
) -> Result<Summary, RuntimeError> {
    DETACHED.with(|d| d.set(true));
    let r = run(plan, root_mount, backend, false);
    DETACHED.with(|d| d.set(false));
    r
}

/// Mark every descriptor from `first` up close-on-exec (`close_range(2)` with
/// CLOSE_RANGE_CLOEXEC, Linux 5.11+; else one `fcntl` each up to the soft limit).
/// Async-signal-safe: for `pre_exec`.
pub(crate) fn cloexec_from(first: i32) -> std::io::Result<()> {
    // SAFETY: raw syscalls on integers.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) == 0
        {
            return Ok(());
        }
        let mut lim: libc::rlimit = std::mem::zeroed();
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur.min(1 << 20) as i32
        } else {
            1024
        };
        for fd in first..max {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

/// Exit code of a finished child: its code, or 128+N for a signal.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
