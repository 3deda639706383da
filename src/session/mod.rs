//! Named sandboxes (seed 004): `aisb up NAME` works in a shared clone of the repository, kept
//! under the sandbox's state directory, mounted at the repository's own path inside.
//!
//! Layout of `<state>` (`$XDG_CACHE_HOME/aisb/<repo>-<sha256 of its path>/<NAME>/`):
//! - `clone/`: `git clone --shared` of the repository; its objects borrow from
//!   `origin/.git/objects` (alternates), its `origin` remote is `<state>/origin`;
//! - `origin`: a symlink to the repository root on the host. Inside the sandbox the same path
//!   holds the repository's `.git`, read-only, so the alternates and `git fetch origin` work
//!   in both places (the repository's working tree is never visible inside);
//! - `state.json` (written atomically), `lock` (flock: one session per sandbox at a time).
//!
//! The repository gets the clone as remote `sandbox-NAME`. While a session runs, a watcher
//! fetches the sandbox's commits into `refs/remotes/sandbox-NAME/*` of the repository (fetch
//! only, so the sandbox never moves a branch of the host repository), and keeps what the
//! sandbox sees of the repository's objects up to date, so that `git fetch origin` inside
//! finds the host's new commits. The host's git never writes into the clone while it is the
//! sandbox's: its `.git` is the sandbox's to shape.

pub mod attach;
pub mod join;
pub mod sync;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::eval::plan::{Mount, MountKind, Plan};

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SessionError {
    #[error("`{0}` is not a valid sandbox name")]
    #[diagnostic(help("use letters, digits, `-`, `_` and `.`, not starting with `-` or `.`"))]
    BadName(String),
    #[error(
        "{path} is not a git repository with a commit: a named sandbox works in a clone of it"
    )]
    #[diagnostic(help("run `git init` and commit, or use `aisb up` without a name"))]
    NotARepo { path: PathBuf },
    #[error("`git {args}` failed: {stderr}")]
    #[diagnostic(help("the sandbox's state is in {}; `aisb rm` removes it", state.display()))]
    Git {
        args: String,
        stderr: String,
        state: PathBuf,
    },
    #[error("sandbox `{0}` is in use by another aisb (pid {1})")]
    #[diagnostic(help(
        "wait for that session to end; attaching a second session to a running sandbox is not supported yet"
    ))]
    Busy(String, String),
    #[error("sandbox `{0}` is not running")]
    #[diagnostic(help("`aisb up {0}` starts it; `aisb ls` shows which are running"))]
    NotRunning(String),
    #[error("no sandbox named `{0}` for this repository")]
    #[diagnostic(help("`aisb ls` lists them"))]
    Missing(String),
    #[error("sandbox `{name}` has {commits} commit(s) the repository does not have on any branch")]
    #[diagnostic(help(
        "merge them from `sandbox-{name}/<branch>` first, or `aisb rm --force {name}` to drop them"
    ))]
    Unsynced { name: String, commits: u64 },
    #[error("sandbox `{name}` ended before a session could join it (its init exited with {code})")]
    #[diagnostic(help(
        "the lines above say why; `aisb run --sandbox {name} -- true` shows the same start alone, `aisb doctor` checks the host"
    ))]
    Ended { name: String, code: i32 },
    #[error("sandbox `{name}` did not start within {secs} s: its init never reported its process")]
    #[diagnostic(help(
        "a loaded machine may need longer: try again; `aisb doctor` checks the host, `aisb stop {name}` ends what is left"
    ))]
    StartTimeout { name: String, secs: u64 },
    #[error("{what}: {source}")]
    #[diagnostic(help("check that the cache directory is writable"))]
    Io {
        what: String,
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SessionError {
    let what = what.into();
    move |source| SessionError::Io { what, source }
}

/// What `state.json` records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct State {
    pub name: String,
    pub repo: PathBuf,
    pub created: u64,
    pub last_used: u64,
}

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['-', '.'])
        && name != "default"
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Run git in `dir`: the repository, the state directory, or the sandbox's clone
/// (`<state>/clone`), which the sandbox writes: there git is told its git directory outright,
/// after a planted `commondir` is moved aside (see [`crate::git`]). Either way, nothing the
/// repository's configuration names is run.
///
/// Git in the repository holds a lock shared by every sandbox of that repository: named
/// sandboxes started at once each add a remote and fetch, and git refuses a second writer of
/// `.git/config` or `packed-refs` instead of waiting.
pub fn git(dir: &Path, args: &[&str], state: &Path) -> Result<String, SessionError> {
    let (mut cmd, _repo_lock) = if dir == state.join("clone") {
        disarm_clone(dir, state);
        (crate::git::command(&dir.join(".git"), Some(dir)), None)
    } else {
        (crate::git::discover(dir), Some(repo_lock(state)?))
    };
    // Paths we pass are paths, never pathspec patterns.
    cmd.args(args)
        .env("GIT_LITERAL_PATHSPECS", "1")
        .stdin(std::process::Stdio::null());
    let out = crate::child::output_within(cmd, GIT_BOUNDS, true).map_err(io("running git"))?;
    if GIT_BOUNDS.reached(&out.stdout) {
        return Err(SessionError::Git {
            args: args.join(" "),
            stderr: format!("it printed more than {} bytes", GIT_BOUNDS.output - 1),
            state: state.to_path_buf(),
        });
    }
    if !out.status.success() {
        return Err(SessionError::Git {
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            state: state.to_path_buf(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Any git aisb runs for a named sandbox is stopped after 300 s, and what it prints is read up
/// to 64 MiB (aisb reads refs, names and counts): the clone is the sandbox's to shape, and
/// nothing it makes may hold the host (a session's end, `aisb gc`) forever.
const GIT_BOUNDS: crate::child::Bounds = crate::child::Bounds {
    time: std::time::Duration::from_secs(300),
    output: 64 << 20,
};

/// Git LFS's filter as the repository's git has it (its own configuration or, usually, the
/// user's `~/.gitconfig`, which the sandbox does not see): in the clone's own configuration
/// file too, which is read-only inside (`git lfs install` cannot write it there). Without it a
/// file Git LFS tracks was committed whole inside, not as a pointer. The commands run inside
/// the sandbox, by its own git; `required` is left out, so an image without git-lfs still
/// commits (whole files, as before). The file is written only when it is a regular file
/// (`disarm_clone` moved anything else aside): never through a link to another of the host's.
fn lfs_filter_into_clone(repo: &Path, clone: &Path, state: &Path) -> Result<(), SessionError> {
    let file = clone.join(".git/config");
    disarm_clone(clone, state);
    if !fs::symlink_metadata(&file).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    let file_s = file.to_string_lossy().into_owned();
    let regexp = r"^filter\.lfs\.(clean|smudge|process)$";
    let want = git(repo, &["config", "--get-regexp", regexp], state).unwrap_or_default();
    let have = git(
        state,
        &["config", "--file", &file_s, "--get-regexp", regexp],
        state,
    )
    .unwrap_or_default();
    if want == have {
        return Ok(());
    }
    for key in ["clean", "smudge", "process"] {
        let _ = git(
            state,
            &[
                "config",
                "--file",
                &file_s,
                "--unset-all",
                &format!("filter.lfs.{key}"),
            ],
            state,
        );
    }
    for line in want.lines().take(16) {
        if let Some((key, value)) = line.split_once(' ') {
            git(
                state,
                &["config", "--file", &file_s, "--add", key, value],
                state,
            )?;
        }
    }
    Ok(())
}

/// Move a `commondir` the sandbox planted in its clone's git directory into
/// `<state>/quarantine`, telling the user once.
pub fn disarm_clone(clone: &Path, state: &Path) {
    let dot = clone.join(".git");
    let quarantine = state.join("quarantine");
    // What aisb's git reads or replaces there must be what git itself would have made: a
    // link would make it read or rewrite another file of the host's (another repository's
    // index), a FIFO would make it wait forever.
    for (name, dir) in [
        ("config", false),
        ("index", false),
        ("HEAD", false),
        ("packed-refs", false),
        ("refs", true),
        ("refs/heads", true),
        ("logs", true),
    ] {
        let p = dot.join(name);
        let Ok(md) = fs::symlink_metadata(&p) else {
            continue;
        };
        if (dir && md.is_dir()) || (!dir && md.is_file()) {
            continue;
        }
        if let Some((from, to)) = crate::git::quarantine_file(&p, &quarantine) {
            eprintln!(
                "aisb: the sandbox made {} something git would not have (a link, a FIFO); moved to {}",
                from.display(),
                to.display()
            );
        }
    }
    for (from, to) in crate::git::disarm_git_dir(&dot, &quarantine) {
        eprintln!(
            "aisb: the sandbox wrote {} (git on the host would have read configuration, and the programs it names, through it); moved to {}",
            from.display(),
            to.display()
        );
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SessionError> {
    crate::atomic::write_atomic(path, bytes).map_err(io(format!("writing {}", path.display())))
}

/// An exclusive lock on a sandbox, held while the value lives (flock: released by the kernel
/// even when aisb is killed).
pub struct Lock(#[allow(dead_code)] Flock<fs::File>);

fn open_lock_file(path: &Path) -> Result<fs::File, SessionError> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io(format!("opening {}", path.display())))
}

fn flock(f: fs::File, how: FlockArg) -> Result<Flock<fs::File>, std::io::Error> {
    Flock::lock(f, how).map_err(|(_, errno)| errno.into())
}

/// Can the lock file at `path` be taken exclusively right now (nobody holds it)? A missing
/// file counts as free. The probe's own hold ends when this returns.
pub fn is_free(path: &Path) -> bool {
    match fs::OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => flock(f, FlockArg::LockExclusiveNonblock).is_ok(),
        Err(_) => true,
    }
}

pub fn lock(state: &Path, name: &str) -> Result<Lock, SessionError> {
    fs::create_dir_all(state).map_err(io(format!("creating {}", state.display())))?;
    let path = state.join("lock");
    let Ok(mut f) = flock(open_lock_file(&path)?, FlockArg::LockExclusiveNonblock) else {
        let holder = fs::read_to_string(&path).unwrap_or_default();
        return Err(SessionError::Busy(
            name.to_string(),
            holder.trim().to_string(),
        ));
    };
    let _ = f.set_len(0);
    let _ = write!(f, "{}", std::process::id());
    Ok(Lock(f))
}

/// The lock on the repository of the sandbox whose state is `state`, held while the value
/// lives (blocking: the other holder is a git command of another sandbox, soon done).
fn repo_lock(state: &Path) -> Result<Lock, SessionError> {
    let dir = state.parent().unwrap_or(state);
    fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let path = dir.join("repo.lock");
    flock(open_lock_file(&path)?, FlockArg::LockExclusive)
        .map(Lock)
        .map_err(io(format!("locking {}", path.display())))
}

/// A session's hold on a running sandbox: a shared flock on `<state>/sessions`. The sandbox's
/// owner stops it when it can take the lock exclusively (no session left).
pub fn join(state: &Path) -> Result<Lock, SessionError> {
    let path = state.join("sessions");
    flock(open_lock_file(&path)?, FlockArg::LockShared)
        .map(Lock)
        .map_err(io(format!("locking {}", path.display())))
}

/// True when no session holds the sandbox (the caller must not hold one itself).
pub fn no_sessions(state: &Path) -> bool {
    is_free(&state.join("sessions"))
}

/// The host pid of the init of the sandbox whose state is `state`, once that sandbox is up
/// (see [`attach::ready`]).
pub fn running_init(state: &Path) -> Option<i32> {
    fs::read_to_string(state.join(crate::runtime::INIT_PID_FILE))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|&p| attach::ready(p))
}

pub struct Session {
    pub name: String,
    pub state: PathBuf,
    pub clone: PathBuf,
    pub repo: PathBuf,
    /// The repository's objects seen inside without masked content; `None`: as they are.
    pub history: Option<History>,
    pub _lock: Lock,
}

/// Make `plan` (evaluated for sandbox `name`) work in the sandbox's shared clone: create the
/// clone on first use, point the project mount at it, show the repository's `.git` read-only
/// at the origin path, and drop masks for files the clone does not have.
pub fn prepare(plan: &mut Plan, name: &str) -> Result<Session, SessionError> {
    if !valid_name(name) {
        return Err(SessionError::BadName(name.to_string()));
    }
    let repo = plan.project.clone();
    let state = plan.state_dir.clone();
    let lock = lock(&state, name)?;
    if git(&repo, &["rev-parse", "--verify", "-q", "HEAD"], &state).is_err() {
        return Err(SessionError::NotARepo { path: repo });
    }
    let clone = state.join("clone");
    let origin = state.join("origin");
    if !clone.join(".git").exists() {
        eprintln!(
            "aisb: creating sandbox `{name}`: a shared clone of {}",
            repo.display()
        );
        let _ = fs::remove_dir_all(&clone);
        let _ = fs::remove_file(&origin);
        std::os::unix::fs::symlink(&repo, &origin)
            .map_err(io(format!("linking {}", origin.display())))?;
        let clone_s = clone.to_string_lossy().into_owned();
        let origin_s = origin.to_string_lossy().into_owned();
        git(
            &state,
            &["clone", "--quiet", "--shared", "--", &origin_s, &clone_s],
            &state,
        )?;
        write_in_clone(
            &clone,
            ".git/objects/info/alternates",
            format!("{}\n", origin.join(".git/objects").display()).as_bytes(),
        )?;
    }
    lfs_filter_into_clone(&repo, &clone, &state)?;
    let remote = format!("sandbox-{name}");
    let clone_s = clone.to_string_lossy().into_owned();
    if git(&repo, &["remote", "get-url", &remote], &state).is_err() {
        git(&repo, &["remote", "add", "--", &remote, &clone_s], &state)?;
    }
    let st = State {
        name: name.to_string(),
        repo: repo.clone(),
        created: read_state(&state).map_or_else(now, |s| s.created),
        last_used: now(),
    };
    write_atomic(
        &state.join("state.json"),
        &serde_json::to_vec_pretty(&st).unwrap_or_default(),
    )?;

    // The host's ignored dependency and cache directories are not the clone's.
    plan.mounts.retain(|m| !crate::eval::deps::is_role_mount(m));
    plan.made_for_run.clear();
    // Nor are the host's protected files: the clone's own never act on the host.
    plan.mounts
        .retain(|m| !crate::eval::protect::is_protect_mount(m));
    plan.protected.clear();
    plan.project_dirs = Default::default();
    plan.protect_covered.clear();
    for m in &mut plan.mounts {
        if m.target != repo {
            continue;
        }
        match &mut m.kind {
            MountKind::Bind { source, .. } => *source = clone.clone(),
            MountKind::Overlay { lower, .. } => *lower = clone.clone(),
            _ => {}
        }
        m.why = format!("sandbox `{name}`: shared clone {}", clone.display());
    }
    // The guards evaluation made are for the repository's own .git, which the sandbox does
    // not see: the clone's git directory is the one it writes.
    let writable_clone = plan
        .mounts
        .iter()
        .any(|m| m.target == repo && matches!(m.kind, MountKind::Bind { writable: true, .. }));
    plan.mounts.retain(|m| {
        !matches!(m.kind, MountKind::Git { .. })
            && !matches!(&m.kind, MountKind::Overlay { lower, .. } if *lower == repo.join(".git"))
    });
    if writable_clone {
        disarm_clone(&clone, &state);
        let guards =
            crate::eval::git_guard_mounts(&repo, &clone).map_err(|e| SessionError::Io {
                what: "protecting the clone's git directory".into(),
                source: std::io::Error::other(e.to_string()),
            })?;
        plan.mounts.extend(guards);
    }
    // Of the repository's git directory, what `git fetch origin` reads (its refs, `HEAD`, its
    // configuration and objects), read-only; never its index, logs, `COMMIT_EDITMSG`,
    // `rr-cache` or a rebase's patches, which hold content the masks hide. It is a directory
    // of aisb's: `HEAD`, `packed-refs` and `shallow` are copies that the session's watcher
    // renews when the host's change (git replaces them by renaming: a bind of the file would
    // keep showing the old one, and a branch packed meanwhile would be missing inside), and
    // the repository's `refs/` and the objects view are bound into it.
    let origin_git = state.join(ORIGIN_GIT);
    refresh_origin_files(&origin_git, &repo)
        .map_err(io(format!("preparing {}", origin_git.display())))?;
    plan.mounts.push(Mount {
        target: origin.join(".git"),
        kind: MountKind::Bind {
            source: origin_git.clone(),
            writable: false,
        },
        why: format!("sandbox `{name}`: what git fetch reads of the repository"),
    });
    for part in ["config", "refs", "objects"] {
        let source = repo.join(".git").join(part);
        if fs::symlink_metadata(&source).is_ok_and(|m| !m.file_type().is_symlink()) {
            plan.mounts.push(Mount {
                target: origin.join(".git").join(part),
                kind: MountKind::Bind {
                    source,
                    writable: false,
                },
                why: format!("sandbox `{name}`: the repository's {part}, read-only"),
            });
        }
    }
    // Its configuration without the credentials git keeps there.
    crate::eval::git_config_views(
        &state,
        &plan.store.clone(),
        &repo.join(".git"),
        &origin.join(".git"),
        &mut plan.mounts,
    );
    // Untracked files of the repository never enter the clone, so nothing the host writes
    // there later can appear inside: no live mask layer to run. Its rules still say what of
    // the repository's history the sandbox may not read.
    let history = plan
        .live
        .take()
        .and_then(|rules| objects_view(plan, &repo, &origin, name, rules));
    // Masks are paths in the repository; the clone has only what is committed.
    plan.masks.retain(|m| match m.path.strip_prefix(&repo) {
        Ok(rel) => fs::symlink_metadata(clone.join(rel)).is_ok(),
        Err(_) => true,
    });
    // A masked file that is tracked reads as unreadable inside: git would see it modified and
    // `commit -a` would fail (or, worse, commit it emptied). Tell the clone's index to leave
    // those paths alone (skip-worktree); their committed content stays as it is.
    let masked: Vec<String> = plan
        .masks
        .iter()
        .filter_map(|m| m.path.strip_prefix(&repo).ok())
        .map(|rel| rel.to_string_lossy().into_owned())
        .collect();
    if !masked.is_empty() {
        let mut args = vec!["ls-files", "-z", "--"];
        args.extend(masked.iter().map(String::as_str));
        let tracked = git(&clone, &args, &state)?;
        let tracked: Vec<&str> = tracked.split('\0').filter(|p| !p.is_empty()).collect();
        if !tracked.is_empty() {
            let mut args = vec!["update-index", "--skip-worktree", "--"];
            args.extend(tracked);
            git(&clone, &args, &state)?;
        }
    }
    write_agent_settings(plan, &clone, &state)?;
    Ok(Session {
        name: name.to_string(),
        state,
        clone,
        repo,
        history,
        _lock: lock,
    })
}

/// Under a sandbox's state: the repository's git directory as the sandbox's `git fetch origin`
/// reads it (copies of its small files, mount points for the rest).
pub const ORIGIN_GIT: &str = "origin-git";

/// The files of the repository's git directory that git replaces by renaming, copied into
/// `dir` as they are now (each by rename, so git inside reads an old or a new one, never half);
/// one the repository does not have (or has as anything but a regular file) is removed. The
/// mount points of what is bound there (`config`, `refs/`, `objects/`) are made once.
pub fn refresh_origin_files(dir: &Path, repo: &Path) -> std::io::Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    fs::create_dir_all(dir)?;
    for d in ["refs", "objects"] {
        match fs::create_dir(dir.join(d)) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    // Mount points: `config` always, `config.worktree` when the repository has one (its view
    // without credentials is bound there, `eval::git_config_views`).
    for (name, needed) in [
        ("config", true),
        (
            "config.worktree",
            fs::symlink_metadata(repo.join(".git/config.worktree")).is_ok(),
        ),
    ] {
        if needed && fs::symlink_metadata(dir.join(name)).is_err() {
            fs::write(dir.join(name), "")?;
        }
    }
    for part in ["HEAD", "packed-refs", "shallow"] {
        let source = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(repo.join(".git").join(part))
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
        let Some(f) = source else {
            match fs::remove_file(dir.join(part)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            continue;
        };
        let mut bytes = Vec::new();
        f.take(MAX_ORIGIN_FILE + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_ORIGIN_FILE {
            return Err(std::io::Error::other(format!(
                "the repository's {part} is larger than {} MiB",
                MAX_ORIGIN_FILE >> 20
            )));
        }
        if fs::read(dir.join(part)).is_ok_and(|old| old == bytes) {
            continue;
        }
        crate::atomic::write_atomic(&dir.join(part), &bytes)?;
    }
    Ok(())
}

/// The largest `packed-refs` copied (a million branches is about 60 MiB).
const MAX_ORIGIN_FILE: u64 = 256 << 20;

/// Under a sandbox's state: the repository's objects as the sandbox sees them.
pub const OBJECTS_VIEW: &str = "git-objects";

/// What of the repository's history a named sandbox may read (issue 30 item 4): its objects
/// without the content of masked files, from the store (`git::store`), kept in a directory of
/// aisb's that is bound read-only over the repository's `objects/` inside (where the clone's
/// alternates point) and brought up to date while the session runs.
#[derive(Debug, Clone)]
pub struct History {
    pub rules: crate::eval::plan::LiveRules,
    pub view: PathBuf,
}

impl History {
    /// The store brought up to date with the repository and mirrored into the view. Where
    /// that fails the view stays as it was: objects new on the host are missing inside,
    /// nothing withheld appears.
    pub fn refresh(&self, state: &Path, repo: &Path) -> bool {
        match crate::git::store::prepare(
            state,
            &repo.join(".git"),
            repo,
            &self.rules,
            crate::git::store::Use::View,
        ) {
            Ok(Some(store)) => crate::git::store::mirror(&store, &self.view).is_ok(),
            _ => false,
        }
    }
}

/// The view of the repository's objects for a sandbox of `plan` (its mount added), or `None`
/// when nothing in the history is masked (the repository's objects are seen as they are).
/// A store that cannot be built leaves the view empty: git inside sees no history rather than
/// the masked content.
fn objects_view(
    plan: &mut Plan,
    repo: &Path,
    origin: &Path,
    name: &str,
    rules: crate::eval::plan::LiveRules,
) -> Option<History> {
    let state = plan.state_dir.clone();
    let view = state.join(OBJECTS_VIEW);
    if !fs::symlink_metadata(repo.join(".git")).is_ok_and(|m| m.is_dir()) {
        return None;
    }
    if std::env::var(crate::eval::BREAK_ISOLATION_ENV).as_deref() == Ok("git-objects") {
        eprintln!(
            "aisb: WARNING: {}=git-objects: the content of masked files stays in this sandbox's git objects (a test of the tests)",
            crate::eval::BREAK_ISOLATION_ENV
        );
        let _ = crate::beneath::remove_tree(&view);
        return None;
    }
    let history = History { rules, view };
    let made = crate::git::store::prepare(
        &state,
        &repo.join(".git"),
        repo,
        &history.rules,
        crate::git::store::Use::View,
    )
    .map_err(|e| e.to_string())
    .and_then(|store| match store {
        Some(store) => crate::git::store::mirror(&store, &history.view)
            .map(|()| true)
            .map_err(|e| e.to_string()),
        None => Ok(false),
    });
    match made {
        Ok(false) => {
            let _ = crate::beneath::remove_tree(&history.view);
            return None;
        }
        Ok(true) => {}
        Err(e) => {
            eprintln!(
                "aisb: WARNING: git in sandbox `{name}` sees none of the repository's history: its objects without the content of masked files could not be prepared: {e}"
            );
            let _ = crate::beneath::remove_tree(&history.view);
            if let Err(e) = fs::create_dir_all(history.view.join("pack")) {
                eprintln!(
                    "aisb: WARNING: the content of masked files stays readable through git in sandbox `{name}`: {e}"
                );
                return None;
            }
        }
    }
    plan.mounts.push(Mount {
        target: origin.join(".git/objects"),
        kind: MountKind::Bind {
            source: history.view.clone(),
            writable: false,
        },
        why: format!(
            "sandbox `{name}`: the repository's objects without the content of masked files"
        ),
    });
    Some(history)
}

/// Seed 001's `.claude/settings.local.json`, in the clone (the agent's working tree, never the
/// host repository): the settings mirroring this sandbox (as in its managed settings), over
/// whatever local settings the clone already had; git is told to ignore the file there. A tracked one is left
/// alone (the managed settings apply regardless).
fn write_agent_settings(plan: &Plan, clone: &Path, state: &Path) -> Result<(), SessionError> {
    let claude = plan
        .mounts
        .iter()
        .any(|m| m.target == Path::new(crate::eval::agents::CLAUDE_MANAGED_DIR));
    if !claude {
        return Ok(());
    }
    const REL: &str = ".claude/settings.local.json";
    if git(clone, &["ls-files", "--error-unmatch", "--", REL], state).is_ok() {
        return Ok(());
    }
    let existing = read_in_clone(clone, REL)?
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let merged = crate::eval::agents::claude_settings(plan, existing);
    write_in_clone(
        clone,
        REL,
        (serde_json::to_string_pretty(&merged).unwrap_or_default() + "\n").as_bytes(),
    )?;
    const EXCLUDE: &str = ".git/info/exclude";
    let current = read_in_clone(clone, EXCLUDE)?
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    if !current.lines().any(|l| l == REL) {
        let mut text = current;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(REL);
        text.push('\n');
        write_in_clone(clone, EXCLUDE, text.as_bytes())?;
    }
    Ok(())
}

/// At most this much of a file in the clone is read back: the sandbox writes the clone.
const MAX_CLONE_FILE: u64 = 1 << 20;

/// Files aisb writes into the clone, which the sandbox shapes: no link below it is followed.
fn write_in_clone(clone: &Path, rel: &str, bytes: &[u8]) -> Result<(), SessionError> {
    crate::beneath::write(clone, Path::new(rel), bytes, 0o644)
        .map_err(io(format!("writing {}", clone.join(rel).display())))
}

fn read_in_clone(clone: &Path, rel: &str) -> Result<Option<Vec<u8>>, SessionError> {
    crate::beneath::read(clone, Path::new(rel), MAX_CLONE_FILE)
        .map_err(io(format!("reading {}", clone.join(rel).display())))
}

pub fn read_state(state: &Path) -> Option<State> {
    serde_json::from_slice(&fs::read(state.join("state.json")).ok()?).ok()
}

/// Commits on the clone's branches that no branch or tag of the repository has (after
/// fetching them into `refs/remotes/sandbox-NAME/*`).
pub fn unsynced(repo: &Path, name: &str, state: &Path) -> Result<u64, SessionError> {
    sync::fetch_into_repo(repo, name, state)?;
    let n = git(
        repo,
        &[
            "rev-list",
            "--count",
            &format!("--remotes=sandbox-{name}"),
            "--not",
            "--branches",
            "--tags",
        ],
        state,
    )?;
    Ok(n.parse().unwrap_or(0))
}

/// Remove a sandbox: its remote in the repository, its state. Refuses unsynced work unless
/// `force`.
pub fn remove(state: &Path, name: &str, force: bool) -> Result<(), SessionError> {
    let Some(st) = read_state(state) else {
        return Err(SessionError::Missing(name.to_string()));
    };
    let _lock = lock(state, name)?;
    if st.repo.join(".git").exists() {
        if !force {
            let commits = unsynced(&st.repo, name, state)?;
            if commits > 0 {
                return Err(SessionError::Unsynced {
                    name: name.to_string(),
                    commits,
                });
            }
        }
        let _ = git(
            &st.repo,
            &["remote", "remove", &format!("sandbox-{name}")],
            state,
        );
    }
    crate::userns::remove_all(state).map_err(io(format!("removing {}", state.display())))
}

pub use crate::graph::store::disk_use;

pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["fix-123", "a", "agent_2", "v1.2"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", "-x", ".hidden", "a/b", "default", "--mirror", "a b"] {
            assert!(!valid_name(bad), "{bad}");
        }
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
