//! Keeping the repository and a sandbox's clone in sync while a session runs: when the clone's
//! refs change, the repository fetches them (into remote-tracking refs with a fixed refspec,
//! so no branch of the host repository is ever moved from inside, and a ref named like an
//! option (`--mirror`) is data, never an argument); when the repository's change, the view of
//! its objects the sandbox sees is brought up to date (its own `git fetch origin` takes them).
//!
//! Changes are found by polling the stamps of each side's ref files every 300 ms (one `stat`
//! per ref file): no extra dependency, nothing to tear down, and the sandbox's clone is
//! usually a handful of refs.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::{Duration, Instant, SystemTime};

use super::{git, SessionError};

/// The clone's branches into `refs/remotes/sandbox-NAME/*` of the repository, fetched from
/// aisb's own repository holding what the sandbox wrote, every object re-hashed against the
/// view of the repository's objects the sandbox sees (see [`super::History`]): a delta it
/// crafted on a withheld blob is never resolved against the real one (the fetch's success
/// would tell it whether a guess of the content was right). A `commondir` the sandbox
/// planted is moved aside first.
pub fn fetch_into_repo(repo: &Path, name: &str, state: &Path) -> Result<(), SessionError> {
    let clone = state.join("clone");
    super::disarm_clone(&clone, state);
    bring_back_lfs(&clone, &repo.join(".git"));
    let refspec = format!("+refs/heads/*:refs/remotes/sandbox-{name}/*");
    let view = state.join(super::OBJECTS_VIEW);
    if std::fs::symlink_metadata(view.join("pack")).is_ok_and(|m| m.is_dir()) {
        return fetch_rehashed(repo, &clone, &view, &refspec, state);
    }
    // Never a fetch straight from the clone: its upload-pack would reuse a delta the sandbox
    // crafted against a masked blob, and the repository would resolve it against the real
    // one (a test of a guess), or follow its links to another repository's objects. A sandbox
    // made before views were kept for every named sandbox gets one at its next session.
    Err(SessionError::Git {
        args: format!("fetch sandbox-{name}"),
        stderr: "the sandbox has no view of the repository's objects to check its commits against yet (its next session makes one)".into(),
        state: state.to_path_buf(),
    })
}

/// The Git LFS objects the sandbox stored in its clone (the content of files its commits hold
/// only pointers of) into the repository's, each verified against its name (`git::lfs`).
fn bring_back_lfs(clone: &Path, repo_git: &Path) {
    if !std::fs::symlink_metadata(repo_git).is_ok_and(|m| m.is_dir()) {
        return;
    }
    let Ok(objects) =
        crate::beneath::Dir::open(clone).and_then(|c| c.dir(Path::new(".git/lfs/objects"), false))
    else {
        return;
    };
    for line in crate::git::lfs::lines(&crate::git::lfs::bring_back(&objects, repo_git)) {
        eprintln!("{line}");
    }
}

/// At most this many of the clone's branches are fetched one by one when fetching them all
/// failed (one needs an object that did not come through).
const MAX_SINGLE_FETCHES: usize = 64;

/// The clone's branches fetched through aisb's repository `<state>/sync`, whose alternate is
/// `view` and which holds the clone's own objects re-hashed.
fn fetch_rehashed(
    repo: &Path,
    clone: &Path,
    view: &Path,
    refspec: &str,
    state: &Path,
) -> Result<(), SessionError> {
    // What a killed aisb left: the directories of processes that are gone.
    for e in std::fs::read_dir(state)
        .into_iter()
        .flatten()
        .flatten()
        .take(10_000)
    {
        if crate::git::lfs::left_by_dead_process(&e.file_name().to_string_lossy(), "sync") {
            let _ = crate::beneath::remove_tree(&e.path());
        }
    }
    // A directory of this call's own: `aisb ls` and the session's watcher may sync at once.
    let t = state.join(format!(
        "sync-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let _ = crate::beneath::remove_tree(&t);
    let failed = |e: crate::git::back::BackError| SessionError::Git {
        args: "fetch from the sandbox's clone".into(),
        stderr: e.to_string(),
        state: state.to_path_buf(),
    };
    if let Err(e) = crate::git::back::scratch_repo(&t, view, &clone.join(".git/objects"), true) {
        let _ = crate::beneath::remove_tree(&t);
        return Err(failed(e));
    }
    // The clone's branches, read as text without following a link or opening anything but a
    // regular file (names and objects checked, bounded): git's own `for-each-ref` would read
    // through a link the sandbox made to another repository's refs, or hang on a FIFO.
    let mut packed = String::new();
    let mut names = Vec::new();
    for (name, oid) in crate::git::back::sandbox_refs(&clone.join(".git")) {
        if name.starts_with("refs/heads/") {
            packed.push_str(&format!("{oid} {name}\n"));
            names.push(name);
        }
    }
    if let Err(e) = std::fs::write(t.join("packed-refs"), packed) {
        let _ = crate::beneath::remove_tree(&t);
        return Err(super::io(format!(
            "writing {}",
            t.join("packed-refs").display()
        ))(e));
    }
    let fetch = |specs: &[String], prune: bool| {
        let args = crate::git::back::fetch_args(&t, specs, prune);
        git(
            repo,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            state,
        )
    };
    let result = match fetch(&[refspec.to_string()], true) {
        Ok(_) => Ok(()),
        Err(e) => {
            // Branch by branch, so that one the repository cannot take keeps no other out.
            let prefix = refspec
                .split_once(':')
                .map(|(_, to)| to.trim_end_matches('*'))
                .unwrap_or_default()
                .to_string();
            // Still an error when one did not come: `aisb rm` must not count a branch that
            // could not be fetched as synced.
            // And within one more GIT_BOUNDS time in all, not one each.
            let began = Instant::now();
            for n in names.iter().take(MAX_SINGLE_FETCHES) {
                if began.elapsed() > Duration::from_secs(300) {
                    break;
                }
                let spec = format!(
                    "+{n}:{prefix}{}",
                    n.strip_prefix("refs/heads/").unwrap_or(n)
                );
                let _ = fetch(&[spec], false);
            }
            Err(e)
        }
    };
    let _ = crate::beneath::remove_tree(&t);
    result
}

/// At most this many ref files are stamped per side: a sandbox can make any number.
const MAX_REF_FILES: usize = 10_000;

/// Stamps of a repository's refs: loose refs under refs/heads, packed-refs, HEAD. No link is
/// followed, not even `refs/heads` itself (the clone's is the sandbox's to replace).
fn stamp(git_dir: &Path) -> Vec<(PathBuf, SystemTime, u64)> {
    let walk = |p: PathBuf| {
        walkdir::WalkDir::new(p)
            .follow_links(false)
            .follow_root_links(false)
            .max_depth(64)
    };
    let mut out: Vec<(PathBuf, SystemTime, u64)> = walk(git_dir.join("refs/heads"))
        .into_iter()
        .flatten()
        .take(MAX_REF_FILES)
        .chain(
            ["packed-refs", "HEAD", "shallow"]
                .iter()
                .filter_map(|f| walk(git_dir.join(f)).into_iter().flatten().next()),
        )
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((e.path().to_path_buf(), m.modified().ok()?, m.len()))
        })
        .collect();
    out.sort();
    out
}

/// The least time between two syncs the sandbox's commits start (the last one, at the end of
/// the session, is never held back).
const MIN_SYNC_GAP: Duration = Duration::from_secs(2);

/// Runs until dropped: a thread that fetches across whenever either side's refs change.
pub struct Watcher {
    /// Dropping it wakes the thread at once (no waiting out the poll interval).
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn watch(
    repo: PathBuf,
    clone: PathBuf,
    name: String,
    state: PathBuf,
    history: Option<super::History>,
) -> Watcher {
    let (stop, stopped) = channel::<()>();
    let thread = std::thread::spawn(move || {
        let (repo_git, clone_git) = (repo.join(".git"), clone.join(".git"));
        let mut seen = (stamp(&repo_git), stamp(&clone_git));
        // A sync the sandbox's commits asked for and not yet made, and when the next may be.
        let (mut pending, mut not_before) = (false, Instant::now());
        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::from_millis(300))
        {
            let now = (stamp(&repo_git), stamp(&clone_git));
            pending |= now.1 != seen.1;
            if pending && Instant::now() >= not_before {
                // Each sync re-hashes what the sandbox wrote: one that commits in a loop gets
                // its work synced at most every few seconds (and the host spends at most a
                // fifth of its time on it), never a sync per poll.
                let began = Instant::now();
                let _ = fetch_into_repo(&repo, &name, &state);
                not_before = Instant::now() + (began.elapsed() * 4).max(MIN_SYNC_GAP);
                pending = false;
            }
            if now.0 != seen.0 {
                // What the sandbox sees of the repository's objects first, then its refs.
                // What the sandbox sees of the repository's objects, brought up to date: its
                // `git fetch origin` then finds the new commits. Nothing is written into the
                // clone from here: its `.git` is the sandbox's to shape (a link under `refs/`
                // or `logs/` would make the host's git write, append to or delete any file).
                if let Some(h) = &history {
                    h.refresh(&state, &repo);
                }
                let _ = super::refresh_origin_files(&state.join(super::ORIGIN_GIT), &repo);
            }
            // The stamps from before the fetches: a change made while they ran (the host
            // committing during a slow fetch) is seen on the next round. A change the fetches
            // made themselves costs one fetch more, which finds nothing new.
            seen = now;
        }
        // A last fetch, so work committed just before the end is on the host.
        let _ = fetch_into_repo(&repo, &name, &state);
    });
    Watcher {
        stop: Some(stop),
        thread: Some(thread),
    }
}
