//! Keeping the repository and a sandbox's clone in sync while a session runs: when the refs of
//! either side change, fetch across. Fetch only, into remote-tracking refs with a fixed
//! refspec, so no branch of the host repository is ever moved from inside, and a ref named
//! like an option (`--mirror`) is data, never an argument.
//!
//! Changes are found by polling the stamps of each side's ref files every 300 ms (one `stat`
//! per ref file): no extra dependency, nothing to tear down, and the sandbox's clone is
//! usually a handful of refs.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::{Duration, SystemTime};

use super::{git, SessionError};

/// `git fetch sandbox-NAME` into `refs/remotes/sandbox-NAME/*` of the repository.
/// The upload-pack on the clone's side is told the clone's git directory is its own common
/// directory (git clears the caller's GIT_* variables for it), and a `commondir` the sandbox
/// planted is moved aside first.
pub fn fetch_into_repo(repo: &Path, name: &str, state: &Path) -> Result<(), SessionError> {
    let clone = state.join("clone");
    super::disarm_clone(&clone, state);
    let refspec = format!("+refs/heads/*:refs/remotes/sandbox-{name}/*");
    let upload_pack = format!(
        "GIT_COMMON_DIR={} git-upload-pack",
        shell_quote(&clone.join(".git").to_string_lossy())
    );
    git(
        repo,
        &[
            "fetch",
            "--quiet",
            "--no-write-fetch-head",
            "--prune",
            "--upload-pack",
            &upload_pack,
            &format!("sandbox-{name}"),
            &refspec,
        ],
        state,
    )
    .map(|_| ())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// `git fetch origin` in the clone: the host's branches as `refs/remotes/origin/*`.
pub fn fetch_into_clone(clone: &Path, state: &Path) -> Result<(), SessionError> {
    git(
        clone,
        &[
            "fetch",
            "--quiet",
            "--no-write-fetch-head",
            "origin",
            "+refs/heads/*:refs/remotes/origin/*",
        ],
        state,
    )
    .map(|_| ())
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
            ["packed-refs", "HEAD"]
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

pub fn watch(repo: PathBuf, clone: PathBuf, name: String, state: PathBuf) -> Watcher {
    let (stop, stopped) = channel::<()>();
    let thread = std::thread::spawn(move || {
        let (repo_git, clone_git) = (repo.join(".git"), clone.join(".git"));
        let mut seen = (stamp(&repo_git), stamp(&clone_git));
        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::from_millis(300))
        {
            let now = (stamp(&repo_git), stamp(&clone_git));
            if now.1 != seen.1 {
                let _ = fetch_into_repo(&repo, &name, &state);
            }
            if now.0 != seen.0 {
                let _ = fetch_into_clone(&clone, &state);
            }
            // The fetches changed the stamps they wrote; read them again so they are not
            // taken for new work on the next round.
            seen = (stamp(&repo_git), stamp(&clone_git));
        }
        // A last fetch, so work committed just before the end is on the host.
        let _ = fetch_into_repo(&repo, &name, &state);
    });
    Watcher {
        stop: Some(stop),
        thread: Some(thread),
    }
}
