//! A writable project's git directory, private to the run (issue 30, item 1).
//!
//! Git takes configuration and code from more files in its directory than guards can pin
//! (`commondir`, `config.worktree`, `objects/info/alternates`, links under `refs/`, …), and
//! must create lock files beside each of them, so the directory cannot be read-only. Instead
//! the sandbox sees the host's `.git` as an overlay: it reads the host's history, and every
//! write it makes (objects, refs, `HEAD`, the index, and whatever it plants) lands in a layer
//! in aisb's state, never in the host's directory, so the host's git (a shell prompt, the
//! editor's polling) never obeys it, during the run or after it.
//!
//! When the run ends, [`bring_back`] takes from that layer only what is data, with reduced
//! trust:
//! - objects through `git fetch` with `fsckObjects` from a repository aisb makes (its own
//!   configuration, no alternates but the host's objects), so each object's name is computed
//!   from its content and nothing the sandbox wrote is read as configuration;
//! - refs read as text (names checked, no link followed, bounded): the checked-out branch
//!   fast-forwards when the host's did not move meanwhile, the sandbox's `HEAD` is followed to
//!   a new branch it made, and everything else lands as `refs/aisb/<run>/…` with a line saying
//!   so;
//! - the index, when the host's did not change during the run and `HEAD` agrees, after git has
//!   parsed it and every path in it was checked; a gitlink it adds has its `.git` moved aside;
//! - everything git would read as configuration or location is reported and moved to the
//!   quarantine, never adopted.
//!
//! A run killed before it brought its layer back leaves it in the state; the next run of the
//! project finds it (the layer's lock is free) and brings it back as `refs/aisb/<run>/…` only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Under the state directory: `<state>/git/<slug>/{upper,work,lock,host}`.
pub const LAYER_DIR: &str = "git";
/// The host git directory and work tree a layer belongs to (two lines), aisb's own record.
pub const HOST_RECORD: &str = "host";

/// At most this many object files, refs and bytes of `packed-refs`/`HEAD`/index are read
/// from a layer: it is the sandbox's writing.
const MAX_OBJECT_FILES: usize = 1_000_000;
const MAX_REFS: usize = 100_000;
const MAX_PACKED_REFS: u64 = 64 << 20;
const MAX_INDEX: u64 = 1 << 30;
/// Ancestry checks per run (each a git process); refs beyond are kept under `refs/aisb/`.
const MAX_ANCESTRY: usize = 256;
/// Lines printed about kept refs; the rest are counted.
const MAX_LINES: usize = 8;

/// Whether an overlay's upper dir is a git directory's layer.
pub fn is_git_layer(state_dir: &Path, upper: &Path) -> bool {
    upper.starts_with(state_dir.join(LAYER_DIR))
}

/// Files and directories of a git directory that git reads as configuration, code or a
/// location: written by the sandbox, they are reported and never brought back.
const PLANTED: &[&str] = &[
    "config",
    "config.worktree",
    "commondir",
    "gitdir",
    "hooks",
    "info",
    "worktrees",
    "branches",
    "remotes",
    "shallow",
    "objects/info/alternates",
    "objects/info/http-alternates",
];

/// One run's private git directory.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The host's git directory (the overlay's lower layer).
    pub host_git: PathBuf,
    /// The host's work tree.
    pub work_tree: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// The objects the sandbox saw in place of the host's (a `git::store` version's, without
    /// the content of masked files): what it wrote is re-hashed against these, never against
    /// the host's, so a delta it crafts on a withheld blob cannot test a guess of its content.
    pub base: Option<PathBuf>,
    /// A linked work tree's own git directory under `host_git` (`worktrees/<name>`: its
    /// `HEAD` and index), when the work tree is one; `host_git` is then the common directory.
    pub admin: Option<PathBuf>,
}

impl Layer {
    /// Where the work tree's `HEAD` and index are on the host.
    pub fn host_admin(&self) -> PathBuf {
        match &self.admin {
            Some(a) => self.host_git.join(a),
            None => self.host_git.clone(),
        }
    }

    /// Where the sandbox's writes to the work tree's `HEAD` and index land; `None` when a
    /// directory on the way there is not one (a link the sandbox made: reading through it
    /// would read any file of the host's as the sandbox's index).
    fn upper_admin(&self) -> Option<PathBuf> {
        let Some(a) = &self.admin else {
            return Some(self.upper.clone());
        };
        let mut at = self.upper.clone();
        for c in a.components() {
            at.push(c);
            if !std::fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
                return None;
            }
        }
        Some(at)
    }

    /// The host's git for this work tree (reduced trust, see [`super::command`]).
    fn git(&self) -> std::process::Command {
        let mut cmd = super::command(&self.host_git, None);
        if let Some(a) = &self.admin {
            cmd.env("GIT_DIR", self.host_git.join(a));
        }
        cmd
    }
}

/// The host's side when the run started: what "did not move meanwhile" is measured against.
#[derive(Debug, Clone)]
pub struct Before {
    pub head: Option<Vec<u8>>,
    pub index: Option<super::IndexStamp>,
    /// The host's index as it was, held open: git replaces the file (a new inode) and never
    /// writes it in place, so a refresh of its stat data on the host during the run (every
    /// `git status` does one) is told from a change of what is staged. Held, not linked or
    /// copied: a link would move the index's ctime, which the project scan's cache is keyed
    /// on, and a copy costs its size on every run.
    pub index_then: Option<std::sync::Arc<std::fs::File>>,
}

impl Before {
    /// The host's side now.
    pub fn of(host_git: &Path) -> Before {
        use std::os::unix::fs::OpenOptionsExt;
        let index_then = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(host_git.join("index"))
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
            .map(std::sync::Arc::new);
        Before {
            head: read_small(host_git, "HEAD", 4096),
            index: super::index_stamp(host_git),
            index_then,
        }
    }

    /// Where git can read the index held open (this process's descriptor, through /proc).
    fn index_then_path(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        self.index_then
            .as_ref()
            .map(|f| PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), f.as_raw_fd())))
    }
}

/// How a layer is brought back: at the end of its run, or found left by a killed one (then
/// nothing of the host's moves: refs land under `refs/aisb/<run>/` only).
pub enum Mode<'a> {
    Finished(&'a Before),
    Leftover,
}

/// What happened: lines for the user, and what was moved aside (for the audit log).
#[derive(Debug, Default)]
pub struct Outcome {
    pub lines: Vec<String>,
    pub quarantined: Vec<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum BackError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("git {what} failed: {stderr}")]
    Git { what: String, stderr: String },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackError {
    let what = what.into();
    move |source| BackError::Io { what, source }
}

/// Write the record of which repository a layer belongs to (before its run starts).
pub fn record(layer_dir: &Path, layer: &Layer) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let mut text = layer.host_git.as_os_str().as_bytes().to_vec();
    text.push(b'\n');
    text.extend_from_slice(layer.work_tree.as_os_str().as_bytes());
    text.push(b'\n');
    if let Some(a) = &layer.admin {
        text.extend_from_slice(a.as_os_str().as_bytes());
        text.push(b'\n');
    }
    // Written once: every later run finds it as it would write it (no fsync on the way in).
    if read_small(layer_dir, HOST_RECORD, 8192).as_deref() == Some(&text[..]) {
        return Ok(());
    }
    crate::atomic::write_atomic(&layer_dir.join(HOST_RECORD), &text)
}

/// The layer in `layer_dir` from its record, if it has one.
pub fn recorded(layer_dir: &Path) -> Option<Layer> {
    use std::os::unix::ffi::OsStrExt;
    let text = read_small(layer_dir, HOST_RECORD, 8192)?;
    let mut lines = text.split(|b| *b == b'\n');
    let host_git = PathBuf::from(std::ffi::OsStr::from_bytes(lines.next()?));
    let work_tree = PathBuf::from(std::ffi::OsStr::from_bytes(lines.next()?));
    // A linked work tree's own directory: `worktrees/<name>`, nothing else.
    let admin = lines
        .next()
        .filter(|l| !l.is_empty())
        .map(|l| PathBuf::from(std::ffi::OsStr::from_bytes(l)));
    let admin_ok = admin.as_ref().is_none_or(|a| {
        let c: Vec<_> = a.components().collect();
        c.len() == 2
            && c[0].as_os_str() == "worktrees"
            && matches!(c[1], std::path::Component::Normal(_))
    });
    (host_git.is_absolute() && work_tree.is_absolute() && admin_ok).then(|| Layer {
        host_git,
        work_tree,
        upper: layer_dir.join("upper"),
        work: layer_dir.join("work"),
        base: None,
        admin,
    })
}

/// Whether the layer holds anything the sandbox wrote.
pub fn is_empty(layer: &Layer) -> bool {
    std::fs::read_dir(&layer.upper).map_or(true, |mut d| d.next().is_none())
}

/// Bring back what the sandbox wrote into `layer` (see the module's text), then empty it.
/// `run` names the run (`refs/aisb/<run>/`); `scratch` is aisb's own directory for the
/// repository it fetches from; `quarantine` receives what was planted.
pub fn bring_back(
    layer: &Layer,
    mode: Mode<'_>,
    run: &str,
    scratch: &Path,
    quarantine: &Path,
) -> Result<Outcome, BackError> {
    let mut out = Outcome::default();
    if is_empty(layer) {
        // overlayfs's own scratch (`work/work`) is left by every mount, as whoever mounted
        // it (an ordinary user's image run: one of their subordinate ids).
        let _ = crate::userns::remove_all(&layer.work);
        return Ok(out);
    }
    for name in PLANTED {
        // A linked work tree's own directory is under `worktrees/`: what is planted there is
        // looked at below, the rest of `worktrees/` as a whole.
        if *name == "worktrees" && layer.admin.is_some() {
            planted_in_worktrees(layer, quarantine, &mut out);
            continue;
        }
        let p = layer.upper.join(name);
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if is_whiteout(&md) {
            continue;
        }
        // Moved out of the layer (it is the sandbox's) and reported under the host's name.
        if let Some((_, to)) = super::quarantine_beneath(&layer.upper, &p, quarantine) {
            out.quarantined.push((layer.host_git.join(name), to));
        }
    }
    planted_in_modules(layer, quarantine, &mut out);
    // The content of files Git LFS tracks that the sandbox committed or staged (its commits
    // hold only their pointers), each verified against its name.
    if let Ok(objects) =
        crate::beneath::Dir::open(&layer.upper).and_then(|u| u.dir(Path::new("lfs/objects"), false))
    {
        let lfs = super::lfs::bring_back(&objects, &layer.host_git);
        out.lines.extend(super::lfs::lines(&lfs));
    }
    let refs = sandbox_refs(&layer.upper);
    let head = layer.upper_admin().and_then(|u| sandbox_head(&u));
    let finished = match mode {
        Mode::Finished(b) => Some(b),
        Mode::Leftover => None,
    };
    // The sandbox's index, read by git from a copy, when it may become the host's.
    let index = match finished {
        Some(b) => read_index(layer, b, scratch, run, &mut out)?,
        None => None,
    };
    let head_touched = head.is_some()
        || current_branch(finished.and_then(|b| b.head.as_deref()))
            .is_some_and(|b| refs.contains_key(&b));
    let staged: Vec<String> = match &index {
        Some(ix) => missing_on_host(layer, ix)?,
        None => Vec::new(),
    };
    let mut moved_head = false;
    if !refs.is_empty() || head.is_some() || !staged.is_empty() {
        let fetched =
            if refs.is_empty() && !matches!(head, Some(Head::Detached(_))) && staged.is_empty() {
                Vec::new()
            } else {
                let t = scratch.join(run);
                let _ = crate::beneath::remove_tree(&t);
                std::fs::create_dir_all(scratch)
                    .map_err(io(format!("creating {}", scratch.display())))?;
                let result = fetch_back(layer, &refs, head.as_ref(), &staged, run, &t);
                let _ = crate::beneath::remove_tree(&t);
                result?
            };
        let head_then = host_git(layer, &["rev-parse", "--verify", "-q", "HEAD"]).ok();
        moved_head = settle(layer, finished, head.as_ref(), run, fetched, &mut out)?;
        let head_now = host_git(layer, &["rev-parse", "--verify", "-q", "HEAD"]).ok();
        // The host's checkout now holds commits of the sandbox's: a gitlink they add has its
        // repository looked at like one the index adds (the index may not come back at all).
        if let Some(now) = head_now.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
            let then = head_then
                .as_deref()
                .map(str::trim)
                .filter(|t| !t.is_empty());
            if then != Some(now) {
                match gitlinks_between(layer, then, now) {
                    Some(links) => {
                        let links: Vec<&[u8]> = links.iter().map(Vec::as_slice).collect();
                        disarm_gitlinks(layer, &links, quarantine, &mut out);
                    }
                    None => out.lines.push(format!(
                        "aisb: the gitlinks the sandbox's commits add could not be listed (git failed, or listed more than {} MiB): a repository they name was not checked for planted configuration; look before running git there",
                        LISTING_BOUNDS.output >> 20
                    )),
                }
            }
        }
    }
    if let Some(ix) = index {
        if !head_touched || moved_head {
            let before = finished.expect("an index is read only for a finished run");
            install_index_back(layer, &ix, before, scratch, run, quarantine, &mut out)?;
        } else {
            out.lines.push(
                "aisb: the sandbox's staging area (git's index) was not brought back: its HEAD is kept under refs/aisb/, not checked out".into(),
            );
        }
    }
    clear(layer);
    Ok(out)
}

/// Files of a linked work tree's own git directory that git reads as configuration or a
/// location.
const PLANTED_IN_ADMIN: &[&str] = &["commondir", "gitdir", "config.worktree", "config", "hooks"];

/// What the sandbox wrote under `worktrees/` when the run's work tree is a linked one: other
/// work trees' directories whole, and in its own what git would obey; moved to the quarantine
/// and reported. Its `HEAD`, index and logs are data, brought back as the main work tree's are.
fn planted_in_worktrees(layer: &Layer, quarantine: &Path, out: &mut Outcome) {
    let root = layer.upper.join("worktrees");
    let own = layer.upper_admin();
    let mut found: Vec<PathBuf> = Vec::new();
    if std::fs::symlink_metadata(&root).is_ok_and(|m| m.is_dir()) {
        for e in std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .take(10_000)
        {
            let p = e.path();
            if Some(&p) != own.as_ref() {
                found.push(p);
            }
        }
    } else {
        // A link or a file in its place: moved aside whole.
        found.push(root);
    }
    if let Some(own) = &own {
        found.extend(PLANTED_IN_ADMIN.iter().map(|n| own.join(n)));
    }
    for p in found {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if is_whiteout(&md) {
            continue;
        }
        let Ok(rel) = p.strip_prefix(&layer.upper).map(Path::to_path_buf) else {
            continue;
        };
        if let Some((_, to)) = super::quarantine_beneath(&layer.upper, &p, quarantine) {
            out.quarantined.push((layer.host_git.join(rel), to));
        }
    }
}

/// Move a layer that could not be brought back out of the way, as `failed-<run>`, so the
/// next run starts from an empty one. Returns where it went.
pub fn set_aside(layer: &Layer, run: &str, keep: &Path) -> Option<PathBuf> {
    // Into `keep` (a run's own layers are removed with their directory), else beside itself.
    let away = keep.join(format!("failed-{run}"));
    let beside = layer.upper.with_file_name(format!("failed-{run}"));
    let _ = std::fs::create_dir_all(keep);
    let to = if std::fs::rename(&layer.upper, &away).is_ok() {
        Some(away)
    } else {
        std::fs::rename(&layer.upper, &beside)
            .is_ok()
            .then_some(beside)
    };
    let _ = crate::userns::remove_all(&layer.work);
    to
}

/// Names in a submodule's git directory (`modules/…`) that git reads as configuration, code
/// or a location.
const PLANTED_IN_MODULE: &[&str] = &[
    "config",
    "config.worktree",
    "commondir",
    "gitdir",
    "hooks",
    "info",
    "alternates",
    "http-alternates",
];

/// The submodules' git directories the sandbox wrote (`modules/…`, any depth): what git would
/// obey there is reported and moved aside like the top's; the rest (an index a `git status`
/// refreshed, objects, refs) is not brought back, and a commit made in a submodule is said so.
fn planted_in_modules(layer: &Layer, quarantine: &Path, out: &mut Outcome) {
    let root = layer.upper.join("modules");
    if !std::fs::symlink_metadata(&root).is_ok_and(|m| m.is_dir()) {
        return;
    }
    let mut planted = Vec::new();
    let mut committed = false;
    let walk = walkdir::WalkDir::new(&root)
        .follow_links(false)
        .follow_root_links(false)
        .max_depth(24);
    let mut it = walk.into_iter();
    let mut seen = 0usize;
    while let Some(Ok(e)) = it.next() {
        seen += 1;
        if seen > MAX_DIR_ENTRIES {
            break;
        }
        let name = e.file_name().to_string_lossy();
        if e.depth() > 0 && PLANTED_IN_MODULE.contains(&name.as_ref()) && !is_whiteout_entry(&e) {
            planted.push(e.path().to_path_buf());
            if e.file_type().is_dir() {
                it.skip_current_dir();
            }
            continue;
        }
        if name == "refs" && e.file_type().is_dir() {
            committed = true;
        }
    }
    for p in planted {
        let rel = p
            .strip_prefix(&layer.upper)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        if let Some((_, to)) = super::quarantine_beneath(&layer.upper, &p, quarantine) {
            out.quarantined.push((layer.host_git.join(rel), to));
        }
    }
    if committed {
        out.lines.push(
            "aisb: refs written inside submodules' git directories (.git/modules/) are not brought back: commit in a submodule on the host, or in a named sandbox".into(),
        );
    }
}

fn is_whiteout_entry(e: &walkdir::DirEntry) -> bool {
    e.metadata().is_ok_and(|m| is_whiteout(&m))
}

/// Empty the layer (the sandbox's writes are brought back or reported by now).
pub fn clear(layer: &Layer) {
    // An ordinary user's run on an image writes as their subordinate ids.
    let _ = crate::userns::remove_all(&layer.upper);
    let _ = crate::userns::remove_all(&layer.work);
}

fn is_whiteout(md: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    md.file_type().is_char_device()
}

/// A file of `dir` (at most `limit` bytes), no link followed: `None` when absent or not a
/// regular file.
fn read_small(dir: &Path, rel: &str, limit: u64) -> Option<Vec<u8>> {
    crate::beneath::read(dir, Path::new(rel), limit)
        .ok()
        .flatten()
}

/// The branch a `HEAD` file's text points at (`refs/heads/…`), if it is a symbolic ref.
fn current_branch(head: Option<&[u8]>) -> Option<String> {
    let text = std::str::from_utf8(head?).ok()?;
    let name = text.trim_end().strip_prefix("ref: ")?;
    (name.starts_with("refs/heads/") && valid_ref_name(name)).then(|| name.to_string())
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Head {
    Branch(String),
    Detached(String),
}

fn sandbox_head(upper: &Path) -> Option<Head> {
    let text = read_small(upper, "HEAD", 4096)?;
    if let Some(b) = current_branch(Some(&text)) {
        return Some(Head::Branch(b));
    }
    let s = std::str::from_utf8(&text).ok()?.trim_end();
    is_object_name(s).then(|| Head::Detached(s.to_string()))
}

pub fn is_object_name(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64)
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A ref name git itself would accept (`git check-ref-format`'s rules), below `refs/`.
pub fn valid_ref_name(name: &str) -> bool {
    name.starts_with("refs/")
        && name.len() < 1024
        && !name.ends_with('/')
        && !name.ends_with('.')
        && !name.contains("..")
        && !name.contains("@{")
        && !name.contains("//")
        && name.bytes().all(|b| {
            b > 0x20 && b != 0x7f && !matches!(b, b'~' | b'^' | b':' | b'?' | b'*' | b'[' | b'\\')
        })
        && name
            .split('/')
            .all(|c| !c.is_empty() && !c.starts_with('.') && !c.ends_with(".lock"))
}

/// The refs the sandbox wrote: loose files under `refs/` (regular files only, no link
/// followed), over the entries of a `packed-refs` it rewrote. Bounded.
pub fn sandbox_refs(upper: &Path) -> BTreeMap<String, String> {
    let mut refs = BTreeMap::new();
    if let Some(text) = read_small(upper, "packed-refs", MAX_PACKED_REFS) {
        for line in text.split(|b| *b == b'\n').take(MAX_REFS) {
            let Ok(line) = std::str::from_utf8(line) else {
                continue;
            };
            if line.starts_with('#') || line.starts_with('^') {
                continue;
            }
            if let Some((oid, name)) = line.split_once(' ') {
                if is_object_name(oid) && valid_ref_name(name) && !name.starts_with(INTERNAL) {
                    refs.insert(name.to_string(), oid.to_string());
                }
            }
        }
    }
    let root = upper.join("refs");
    if std::fs::symlink_metadata(&root).is_ok_and(|m| m.is_dir()) {
        let walk = walkdir::WalkDir::new(&root)
            .follow_links(false)
            .follow_root_links(false)
            .max_depth(32);
        for e in walk.into_iter().flatten().take(MAX_REFS) {
            if !e.file_type().is_file() {
                continue;
            }
            let Ok(rel) = e.path().strip_prefix(upper) else {
                continue;
            };
            let Some(name) = rel.to_str() else { continue };
            if !valid_ref_name(name) || name.starts_with(INTERNAL) {
                continue;
            }
            let Some(text) = read_small(upper, name, 4096) else {
                continue;
            };
            let Ok(s) = std::str::from_utf8(&text) else {
                continue;
            };
            let s = s.trim_end();
            if is_object_name(s) {
                refs.insert(name.to_string(), s.to_string());
            }
        }
    }
    refs
}

/// Name of the sandbox's detached `HEAD` in the repository fetched from.
const DETACHED: &str = "refs/aisb-internal/detached-head";
/// Prefix of the refs that carry the blobs the sandbox staged.
const STAGED: &str = "refs/aisb-internal/staged/";
/// aisb's own names in the repository it fetches from: a ref of the sandbox's there is not
/// brought back.
const INTERNAL: &str = "refs/aisb-internal/";

/// Make a repository of aisb's own at `t` holding the sandbox's objects (validated names,
/// regular files only) with the host's objects as its only alternate and the sandbox's refs
/// as its packed refs, and fetch them into the host's as `refs/aisb/<run>/…`, every object
/// checked. Returns the fetched refs: (name in the sandbox, object).
fn fetch_back(
    layer: &Layer,
    refs: &BTreeMap<String, String>,
    head: Option<&Head>,
    staged: &[String],
    run: &str,
    t: &Path,
) -> Result<Vec<(String, String)>, BackError> {
    let host_objects = layer.host_git.join("objects");
    scratch_repo(
        t,
        layer.base.as_ref().unwrap_or(&host_objects),
        &layer.upper.join("objects"),
        layer.base.is_some(),
    )?;
    // Only refs whose object the repository now has: a ref to a missing object would stop
    // the whole fetch.
    let mut wanted: Vec<(String, String)> =
        refs.iter().map(|(n, o)| (n.clone(), o.clone())).collect();
    if let Some(Head::Detached(oid)) = head {
        wanted.push((DETACHED.to_string(), oid.clone()));
    }
    let types = object_types(
        t,
        wanted
            .iter()
            .map(|(_, o)| o.as_str())
            .chain(staged.iter().map(String::as_str)),
    )?;
    wanted.retain(|(_, o)| types.get(o).is_some_and(|t| t == "commit" || t == "tag"));
    // Staged blobs travel as refs of their own, dropped once fetched.
    wanted.extend(
        staged
            .iter()
            .filter(|o| types.get(*o).is_some_and(|t| t == "blob"))
            .map(|o| (format!("{STAGED}{o}"), o.clone())),
    );
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let mut packed = String::new();
    let mut sorted = wanted.clone();
    sorted.sort();
    for (n, o) in &sorted {
        packed.push_str(&format!("{o} {n}\n"));
    }
    std::fs::write(t.join("packed-refs"), packed).map_err(io("writing packed-refs"))?;
    // All at once; when that fails (an object the sandbox wrote is broken, and fsck refuses
    // it), ref by ref, so that one broken ref does not keep the others out.
    if fetch_refs(layer, t, &[format!("refs/*:refs/aisb/{run}/*")]).is_ok() {
        return Ok(wanted);
    }
    let (blobs, refs): (Vec<_>, Vec<_>) =
        wanted.into_iter().partition(|(n, _)| n.starts_with(STAGED));
    if refs.len() > MAX_SINGLE_FETCHES {
        return fetch_refs(layer, t, &[format!("refs/*:refs/aisb/{run}/*")]).map(|()| Vec::new());
    }
    let mut got = Vec::new();
    let mut failed = Vec::new();
    for (n, o) in refs {
        match fetch_refs(layer, t, &[format!("{n}:{}", staged_name(run, &n))]) {
            Ok(()) => got.push((n, o)),
            Err(e) => failed.push(format!("{n} ({e})")),
        }
    }
    let specs: Vec<String> = blobs
        .iter()
        .map(|(n, _)| format!("{n}:{}", staged_name(run, n)))
        .collect();
    if !specs.is_empty() && fetch_refs(layer, t, &specs).is_ok() {
        got.extend(blobs);
    }
    if got.is_empty() {
        return Err(BackError::Git {
            what: "fetch from the sandbox's git directory".into(),
            stderr: failed.join("; "),
        });
    }
    for f in failed.iter().take(MAX_LINES) {
        eprintln!("aisb: not brought back from the sandbox's git directory, git refused it: {f}");
    }
    Ok(got)
}

/// aisb's own bare repository `t`, whose alternate is `alternate`, holding the object files
/// a sandbox wrote under `objects` (linked or copied, bounded, no link followed); with
/// `rehash`, its packs are unpacked object by object against `alternate` (see
/// [`rehash_packs`]), so nothing the sandbox wrote is resolved against objects it never saw.
pub fn scratch_repo(
    t: &Path,
    alternate: &Path,
    objects: &Path,
    rehash: bool,
) -> Result<(), BackError> {
    let init = super::overridden()
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(["init", "--bare", "--quiet", "--template="])
        .arg(t)
        .stdin(Stdio::null())
        .output()
        .map_err(io("running git init"))?;
    if !init.status.success() {
        return Err(BackError::Git {
            what: "init".into(),
            stderr: String::from_utf8_lossy(&init.stderr).trim().into(),
        });
    }
    let own = t.join("objects");
    std::fs::create_dir_all(own.join("info")).map_err(io("making the objects' info"))?;
    {
        use std::os::unix::ffi::OsStrExt;
        let mut alt = alternate.as_os_str().as_bytes().to_vec();
        alt.push(b'\n');
        std::fs::write(own.join("info/alternates"), alt).map_err(io("writing alternates"))?;
    }
    copy_objects(objects, &own, rehash)?;
    if rehash {
        rehash_packs(t);
    }
    Ok(())
}

/// At most this many refs are fetched one by one after a fetch of all of them failed.
const MAX_SINGLE_FETCHES: usize = 64;

/// Where the sandbox's ref `name` lands in the host's repository.
fn staged_name(run: &str, name: &str) -> String {
    format!("refs/aisb/{run}/{}", name.trim_start_matches("refs/"))
}

/// aisb's git on what a sandbox wrote (a fetch, a pack re-hashed) ends within this, and what it
/// prints is kept up to this: a crafted pack or repository cannot hold aisb (a run's end, a
/// session's sync) forever.
const GIT_BOUNDS: crate::child::Bounds = crate::child::Bounds {
    time: std::time::Duration::from_secs(600),
    output: 1 << 20,
};

/// The same for a listing (an index's entries, a commit range's gitlinks): a big repository's
/// is tens of MB; a crafted index or tree of millions of entries is cut here, never held whole.
const LISTING_BOUNDS: crate::child::Bounds = crate::child::Bounds {
    time: std::time::Duration::from_secs(600),
    output: 512 << 20,
};

/// The arguments of a `git fetch` from aisb's repository `t` into the host's with `specs`:
/// every object checked, nothing written beside the refs (no FETCH_HEAD, commit graph, tags,
/// submodules, gc or maintenance). `prune`: the specs' destinations that `t` no longer has go.
/// The ephemeral bring-back and a named sandbox's sync both fetch with these.
pub fn fetch_args(t: &Path, specs: &[String], prune: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "-c",
        "fetch.fsckObjects=true",
        "-c",
        "transfer.fsckObjects=true",
        "-c",
        "fetch.writeCommitGraph=false",
        "fetch",
        "--quiet",
        "--no-tags",
        "--no-write-fetch-head",
        "--no-recurse-submodules",
        "--no-auto-gc",
        "--no-auto-maintenance",
    ]
    .map(String::from)
    .to_vec();
    if prune {
        args.push("--prune".into());
    }
    args.push(t.to_string_lossy().into_owned());
    args.extend(specs.iter().cloned());
    args
}

/// `git fetch` from aisb's repository `t` into the host's with `specs` (never forced: the
/// run's namespace is new), every object checked.
fn fetch_refs(layer: &Layer, t: &Path, specs: &[String]) -> Result<(), BackError> {
    let mut cmd = layer.git();
    cmd.args(fetch_args(t, specs, false)).stdin(Stdio::null());
    let fetch =
        crate::child::output_within(cmd, GIT_BOUNDS, true).map_err(io("running git fetch"))?;
    if fetch.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&fetch.stderr);
    Err(BackError::Git {
        what: "fetch from the sandbox's git directory".into(),
        stderr: stderr.lines().take(3).collect::<Vec<_>>().join(" / "),
    })
}

/// Unpack each of the sandbox's packs in `t` (aisb's repository, whose alternate is the store
/// the sandbox saw) with `git unpack-objects --strict`, then drop it: every object is re-hashed
/// from its content, a delta resolved against the store's objects (a withheld blob's
/// placeholder, never its content), and one with a missing link is not written. A pack git
/// refuses (a delta that does not apply to what the sandbox saw) is dropped and said; what
/// other packs and loose objects hold still comes back, and a ref that needed the dropped
/// objects is refused by the fetch.
fn rehash_packs(t: &Path) {
    let dir = t.join("objects/pack");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let packs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "pack"))
        .collect();
    // One time budget for all of them: each pack a sandbox wrote could take a call's whole
    // bound, and there may be many.
    let deadline = std::time::Instant::now() + GIT_BOUNDS.time * 2;
    for pack in packs {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let bounds = crate::child::Bounds {
            time: left.min(GIT_BOUNDS.time),
            ..GIT_BOUNDS
        };
        // Out of the pack directory first: unpack-objects skips what the repository has.
        let aside = t.join(format!(
            "unpacking-{}",
            pack.file_name().unwrap_or_default().to_string_lossy()
        ));
        let _ = std::fs::remove_file(pack.with_extension("idx"));
        let moved = std::fs::rename(&pack, &aside);
        let out = moved.and_then(|()| {
            let mut cmd = super::command(t, None);
            cmd.args(["unpack-objects", "-q", "--strict"])
                .stdin(std::fs::File::open(&aside)?);
            crate::child::output_within(cmd, bounds, true)
        });
        let _ = std::fs::remove_file(&aside);
        let _ = std::fs::remove_file(&pack);
        let why = match out {
            Ok(o) if o.status.success() => continue,
            Ok(o) => String::from_utf8_lossy(&o.stderr)
                .lines()
                .take(3)
                .collect::<Vec<_>>()
                .join(" / "),
            Err(e) => e.to_string(),
        };
        eprintln!(
            "aisb: a pack the sandbox wrote was not brought back (git refused it against the objects the sandbox saw): {}",
            crate::vocab::shorten(&why)
        );
    }
}

/// At most this many entries are read from one directory of the sandbox's objects (kept or
/// not): a directory of a million junk names is refused, not walked for hours.
const MAX_DIR_ENTRIES: usize = 200_000;

/// Link (or copy) the sandbox's object files into `to`: loose objects by their two-level hex
/// names, and packs with their index. Nothing else, bounded, and read through descriptors
/// without following a link anywhere below `from` (a sandbox still running may swap a
/// directory for a link between a check and a use). With `verify`, a loose object is kept only
/// when its content hashes to its name: one forged under the name of an object the sandbox
/// never saw (a guess of its content) is dropped, so nothing of the sandbox's is ever taken
/// for one of the host's.
fn copy_objects(from: &Path, to: &Path, verify: bool) -> Result<(), BackError> {
    use rustix::fs::{openat, Dir, Mode, OFlags, CWD};
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(top) = openat(CWD, from, dir_flags, Mode::empty()) else {
        return Ok(());
    };
    let hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let too_many = |what: &str| BackError::Io {
        what: "bringing back the sandbox's objects".into(),
        source: std::io::Error::other(format!("more than {what}")),
    };
    let names = |fd: &std::os::fd::OwnedFd, what: &str| -> Result<Vec<String>, BackError> {
        let mut out = Vec::new();
        let Ok(dir) = Dir::read_from(fd) else {
            return Ok(out);
        };
        for (i, e) in dir.flatten().enumerate() {
            if i >= MAX_DIR_ENTRIES {
                return Err(too_many(&format!("{MAX_DIR_ENTRIES} entries in {what}")));
            }
            if let Ok(n) = e.file_name().to_str() {
                if n != "." && n != ".." {
                    out.push(n.to_string());
                }
            }
        }
        Ok(out)
    };
    let mut n = 0usize;
    let mut bytes = 0u64;
    for name in names(&top, "objects/")? {
        if !(name.len() == 2 && hex(&name) || name == "pack") {
            continue;
        }
        let Ok(sub) = openat(&top, name.as_str(), dir_flags, Mode::empty()) else {
            continue;
        };
        let files: std::collections::HashSet<String> = names(&sub, &format!("objects/{name}/"))?
            .into_iter()
            .collect();
        let keep: Vec<String> = if name == "pack" {
            files
                .iter()
                .filter_map(|f| {
                    let h = f.strip_prefix("pack-")?.strip_suffix(".pack")?;
                    let idx = format!("pack-{h}.idx");
                    (is_object_name(h) && files.contains(&idx)).then(|| [f.clone(), idx])
                })
                .flatten()
                .collect()
        } else {
            files
                .into_iter()
                .filter(|f| (f.len() == 38 || f.len() == 62) && hex(f))
                .collect()
        };
        if keep.is_empty() {
            continue;
        }
        let dir = to.join(&name);
        std::fs::create_dir_all(&dir).map_err(io("making an object directory"))?;
        for f in keep {
            n += 1;
            if n > MAX_OBJECT_FILES {
                return Err(too_many(&format!("{MAX_OBJECT_FILES} object files")));
            }
            let Ok(fd) = openat(
                &sub,
                f.as_str(),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            ) else {
                continue;
            };
            let mut file = std::fs::File::from(fd);
            let Ok(md) = file.metadata() else { continue };
            if !md.is_file() {
                continue;
            }
            bytes += md.len();
            if bytes > MAX_OBJECT_BYTES {
                return Err(too_many(&format!("{MAX_OBJECT_BYTES} bytes of objects")));
            }
            if verify && name != "pack" {
                let mut data = Vec::new();
                use std::io::Read;
                (&mut file)
                    .take(MAX_LOOSE)
                    .read_to_end(&mut data)
                    .map_err(io("reading a loose object"))?;
                if !loose_is(&data, &format!("{name}{f}")) {
                    continue;
                }
                std::fs::write(dir.join(&f), &data).map_err(io("writing a loose object"))?;
                continue;
            }
            link_or_copy(&mut file, &dir.join(&f))?;
        }
    }
    Ok(())
}

/// At most this many bytes of object files are taken from a sandbox, and this many of one
/// loose object (compressed, and again once inflated).
const MAX_OBJECT_BYTES: u64 = 8 << 30;
const MAX_LOOSE: u64 = 256 << 20;

/// Whether a loose object's file (`zlib("TYPE SIZE\0BODY")`) is well formed and its content
/// hashes to `name` (SHA-1 for 40 digits, SHA-256 for 64).
fn loose_is(compressed: &[u8], name: &str) -> bool {
    use sha1::Digest as _;
    use std::io::Read;
    let mut inflated = Vec::new();
    if flate2::read::ZlibDecoder::new(compressed)
        .take(MAX_LOOSE + 1)
        .read_to_end(&mut inflated)
        .is_err()
        || inflated.len() as u64 > MAX_LOOSE
    {
        return false;
    }
    let Some(nul) = inflated.iter().position(|b| *b == 0) else {
        return false;
    };
    let well_formed = std::str::from_utf8(&inflated[..nul])
        .ok()
        .and_then(|h| h.split_once(' '))
        .is_some_and(|(kind, size)| {
            matches!(kind, "blob" | "tree" | "commit" | "tag")
                && size.parse::<usize>().ok() == Some(inflated.len() - nul - 1)
        });
    well_formed
        && match name.len() {
            40 => format!("{:x}", sha1::Sha1::digest(&inflated)) == name,
            64 => format!("{:x}", sha2::Sha256::digest(&inflated)) == name,
            _ => false,
        }
}

/// A regular file's content at `to`, from the opened `src`: a hard link of that very inode
/// where the file system allows (through the descriptor, so no name is looked up again),
/// otherwise a copy.
fn link_or_copy(src: &mut std::fs::File, to: &Path) -> Result<(), BackError> {
    use std::os::fd::AsRawFd;
    let proc_path = format!("/proc/self/fd/{}", src.as_raw_fd());
    if rustix::fs::linkat(
        rustix::fs::CWD,
        proc_path.as_str(),
        rustix::fs::CWD,
        to,
        rustix::fs::AtFlags::SYMLINK_FOLLOW,
    )
    .is_ok()
    {
        return Ok(());
    }
    let mut dst = std::fs::File::create(to).map_err(io(format!("creating {}", to.display())))?;
    std::io::copy(src, &mut dst).map_err(io(format!("copying to {}", to.display())))?;
    Ok(())
}

/// The type of each of `oids` the repository `git_dir` has (one `cat-file --batch-check`).
fn object_types<'a>(
    git_dir: &Path,
    oids: impl Iterator<Item = &'a str>,
) -> Result<BTreeMap<String, String>, BackError> {
    let input: String = oids.map(|o| format!("{o}\n")).collect();
    if input.is_empty() {
        return Ok(BTreeMap::new());
    }
    let mut cmd = super::command(git_dir, None);
    cmd.args(["cat-file", "--batch-check=%(objectname) %(objecttype)"])
        .stderr(Stdio::null());
    let out = crate::child::output_within_input(cmd, input.into_bytes(), LISTING_BOUNDS, false)
        .map_err(io("running git cat-file"))?;
    if LISTING_BOUNDS.reached(&out.stdout) {
        return Err(BackError::Io {
            what: "reading the types of the sandbox's objects".into(),
            source: std::io::Error::other("git cat-file printed past aisb's bound"),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, t)| *t != "missing")
        .map(|(o, t)| (o.to_string(), t.to_string()))
        .collect())
}

/// The host's git (reduced trust, see [`super::command`]) with `args`: its stdout, or the
/// error with its stderr.
fn host_git(layer: &Layer, args: &[&str]) -> Result<String, BackError> {
    let mut cmd = layer.git();
    cmd.args(args).stdin(Stdio::null());
    let o = crate::child::output_within(cmd, LISTING_BOUNDS, true)
        .and_then(|o| match LISTING_BOUNDS.reached(&o.stdout) {
            false => Ok(o),
            true => Err(std::io::Error::other("it printed past aisb's bound")),
        })
        .map_err(io(format!("running git {}", args.first().unwrap_or(&""))))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(BackError::Git {
            what: args.first().unwrap_or(&"").to_string(),
            stderr: String::from_utf8_lossy(&o.stderr).trim().into(),
        })
    }
}

fn is_ancestor(layer: &Layer, a: &str, b: &str) -> bool {
    let mut cmd = layer.git();
    cmd.args(["merge-base", "--is-ancestor", a, b])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    crate::child::output_within(cmd, GIT_BOUNDS, false).is_ok_and(|o| o.status.success())
}

const ZERO: &str = "0000000000000000000000000000000000000000";

/// After the fetch: move the host's checked-out branch (or `HEAD`) forward where that loses
/// nothing, drop what brought nothing new, and say what stays under `refs/aisb/<run>/`.
/// Returns whether the host's `HEAD` now names what the sandbox's did.
/// The branches other work trees of the repository have checked out (the main one's `HEAD`
/// when the run's is a linked one, and every linked one's but the run's own).
fn checked_out_elsewhere(layer: &Layer) -> std::collections::BTreeSet<String> {
    let own = layer.host_admin();
    let mut heads = vec![layer.host_git.clone()];
    if let Ok(entries) = std::fs::read_dir(layer.host_git.join("worktrees")) {
        heads.extend(entries.flatten().map(|e| e.path()).take(256));
    }
    heads
        .into_iter()
        .filter(|d| *d != own)
        .filter_map(|d| current_branch(read_small(&d, "HEAD", 4096).as_deref()))
        .collect()
}

fn settle(
    layer: &Layer,
    finished: Option<&Before>,
    head: Option<&Head>,
    run: &str,
    fetched: Vec<(String, String)>,
    out: &mut Outcome,
) -> Result<bool, BackError> {
    let staging = |name: &str| staged_name(run, name);
    let host_refs: BTreeMap<String, String> = host_git(
        layer,
        &[
            "for-each-ref",
            "--format=%(objectname) %(refname)",
            "refs/heads",
            "refs/tags",
        ],
    )?
    .lines()
    .filter_map(|l| l.split_once(' '))
    .map(|(o, n)| (n.to_string(), o.to_string()))
    .collect();
    let host_head_now = read_small(&layer.host_admin(), "HEAD", 4096);
    // The host's HEAD did not change during the run: the sandbox's may be followed.
    let head_free = finished.is_some_and(|b| b.head == host_head_now);
    let host_branch = current_branch(host_head_now.as_deref());
    let mut kept: Vec<(String, String)> = Vec::new();
    let mut drops: Vec<String> = Vec::new();
    let mut checks = 0usize;
    let mut moved_head = false;
    let elsewhere = checked_out_elsewhere(layer);
    let target_branch = match head {
        Some(Head::Branch(b)) => Some(b.clone()),
        Some(Head::Detached(_)) => None,
        None => host_branch.clone(),
    };
    for (name, oid) in &fetched {
        let stage = staging(name);
        let mut drop_stage = || drops.push(format!("delete {stage} {oid}\n"));
        if name.starts_with(STAGED) {
            drop_stage();
            continue;
        }
        if name == DETACHED {
            let old = host_git(layer, &["rev-parse", "--verify", "-q", "HEAD"]).unwrap_or_default();
            if head_free
                && host_git(
                    layer,
                    &[
                        "update-ref",
                        "--no-deref",
                        "-m",
                        &format!("aisb: HEAD of the sandbox run {run}"),
                        "HEAD",
                        oid,
                        old.trim(),
                    ],
                )
                .is_ok()
            {
                out.lines.push(format!(
                    "aisb: HEAD is now {} (detached in the sandbox)",
                    short(oid)
                ));
                moved_head = true;
                drop_stage();
            } else {
                kept.push((stage, "the sandbox's detached HEAD".into()));
            }
            continue;
        }
        let host = host_refs.get(name);
        if host == Some(oid) {
            drop_stage();
            continue;
        }
        if let Some(h) = host {
            checks += 1;
            if checks <= MAX_ANCESTRY && is_ancestor(layer, oid, h) {
                // Nothing the host does not have.
                drop_stage();
                continue;
            }
        }
        // Never a branch another work tree has checked out: its index and files would no
        // longer match it.
        let is_target = head_free
            && target_branch.as_deref() == Some(name.as_str())
            && !elsewhere.contains(name);
        if is_target {
            let ff = match host {
                None => true,
                Some(h) => {
                    checks += 1;
                    checks <= MAX_ANCESTRY && is_ancestor(layer, h, oid)
                }
            };
            let old = host.map_or(ZERO, String::as_str);
            if ff
                && host_git(
                    layer,
                    &[
                        "update-ref",
                        "-m",
                        &format!("aisb: from the sandbox run {run}"),
                        name,
                        oid,
                        old,
                    ],
                )
                .is_ok()
            {
                let what = name.trim_start_matches("refs/heads/");
                out.lines.push(match host {
                    Some(h) => format!(
                        "aisb: {what} fast-forwarded {}..{} with the commits made in the sandbox",
                        short(h),
                        short(oid)
                    ),
                    None => format!("aisb: {what} made in the sandbox, at {}", short(oid)),
                });
                drop_stage();
                continue;
            }
            kept.push((
                stage,
                format!(
                    "{} moved on the host during the run",
                    name.trim_start_matches("refs/heads/")
                ),
            ));
            continue;
        }
        kept.push((stage, "made in the sandbox".into()));
    }
    if !drops.is_empty() {
        update_refs(layer, &drops.concat());
    }
    // The sandbox checked out another branch, and the host's HEAD did not move: follow it,
    // when that branch is now the host's with the sandbox's value, and no other work tree
    // has it checked out.
    let target_branch = target_branch.filter(|t| !elsewhere.contains(t));
    if let (true, Some(t)) = (head_free, &target_branch) {
        let now = host_git(layer, &["rev-parse", "--verify", "-q", t]).unwrap_or_default();
        let sandbox_value = fetched
            .iter()
            .find(|(n, _)| n == t)
            .map(|(_, o)| o.as_str());
        let agrees = match sandbox_value {
            Some(o) => now.trim() == o,
            // The sandbox did not write the branch: the host's value is the one it saw.
            None => !now.trim().is_empty(),
        };
        if agrees {
            moved_head = true;
            if host_branch.as_deref() != Some(t.as_str()) {
                if host_git(
                    layer,
                    &[
                        "symbolic-ref",
                        "-m",
                        &format!("aisb: the sandbox run {run} checked it out"),
                        "HEAD",
                        t,
                    ],
                )
                .is_ok()
                {
                    out.lines.push(format!(
                        "aisb: {} is checked out, as in the sandbox",
                        t.trim_start_matches("refs/heads/")
                    ));
                } else {
                    moved_head = false;
                }
            }
        }
    }
    if !kept.is_empty() {
        for (stage, why) in kept.iter().take(MAX_LINES) {
            out.lines
                .push(format!("aisb: kept the sandbox's ref as {stage} ({why})"));
        }
        if kept.len() > MAX_LINES {
            out.lines.push(format!(
                "aisb: … and {} more under refs/aisb/{run}/",
                kept.len() - MAX_LINES
            ));
        }
    }
    Ok(moved_head)
}

/// `git update-ref --stdin` with `input` (one transaction; a ref that moved meanwhile is
/// left as it is).
fn update_refs(layer: &Layer, input: &str) {
    let mut cmd = layer.git();
    cmd.args(["update-ref", "--stdin"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _ = with_input(cmd, input.as_bytes().to_vec());
}

/// Run `cmd` with `input` on its standard input, written from a thread of its own (a command
/// that writes while it reads never blocks on a full pipe): its output.
fn with_input(cmd: std::process::Command, input: Vec<u8>) -> std::io::Result<std::process::Output> {
    crate::child::output_within_input(cmd, input, GIT_BOUNDS, true)
}

fn short(oid: &str) -> &str {
    &oid[..oid.len().min(10)]
}

/// The sandbox's index as git read it: its bytes and entries.
struct SandboxIndex {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The sandbox's index, when it may replace the host's: the host's did not change during the
/// run, it differs, git parses it (a copy, never the host's file) and every path in it is one
/// git itself would write.
fn read_index(
    layer: &Layer,
    before: &Before,
    scratch: &Path,
    run: &str,
    out: &mut Outcome,
) -> Result<Option<SandboxIndex>, BackError> {
    let Some(upper_admin) = layer.upper_admin() else {
        return Ok(None);
    };
    if !std::fs::symlink_metadata(upper_admin.join("index")).is_ok_and(|m| m.is_file()) {
        return Ok(None);
    }
    let Some(bytes) = read_small(&upper_admin, "index", MAX_INDEX) else {
        return Ok(None);
    };
    if read_small(&layer.host_admin(), "index", MAX_INDEX).as_deref() == Some(&bytes[..]) {
        return Ok(None);
    }
    if super::index_stamp(&layer.host_admin()) != before.index {
        // Rewritten on the host: only its stat data, or what is staged?
        let same = before
            .index_then_path()
            .and_then(|then| ls_stage(layer, Some(&then)))
            .is_some_and(|then| Some(then) == ls_stage(layer, None));
        if !same {
            out.lines.push("aisb: the sandbox's staging area (git's index) was not brought back: what is staged changed on the host during the run".into());
            return Ok(None);
        }
    }
    std::fs::create_dir_all(scratch).map_err(io("making the scratch directory"))?;
    let copy = scratch.join(format!("{run}.index"));
    std::fs::write(&copy, &bytes).map_err(io("copying the sandbox's index"))?;
    let entries = ls_stage(layer, Some(&copy));
    let _ = std::fs::remove_file(&copy);
    let Some(entries) = entries else {
        out.lines.push("aisb: the sandbox's staging area (git's index) was not brought back: git could not read it".into());
        return Ok(None);
    };
    if let Some(bad) = entries.iter().find(|(_, p)| !safe_index_path(p)) {
        out.lines.push(format!(
            "aisb: the sandbox's staging area (git's index) was not brought back: it names {:?}, which git never writes",
            String::from_utf8_lossy(bad.1.as_slice())
        ));
        return Ok(None);
    }
    Ok(Some(SandboxIndex { entries }))
}

/// The blobs the sandbox's index names that the host's repository does not have (staged in
/// the sandbox, not committed): they are fetched with the refs.
fn missing_on_host(layer: &Layer, ix: &SandboxIndex) -> Result<Vec<String>, BackError> {
    let oids: std::collections::BTreeSet<&str> = ix
        .entries
        .iter()
        .filter(|(m, _)| !m.starts_with(b"160000 "))
        .filter_map(|(m, _)| std::str::from_utf8(m).ok()?.split(' ').nth(1))
        .filter(|o| is_object_name(o))
        .collect();
    let have = object_types(&layer.host_git, oids.iter().copied())?;
    Ok(oids
        .into_iter()
        .filter(|o| !have.contains_key(*o))
        .map(str::to_string)
        .collect())
}

/// Install what the sandbox staged as the host's index, under git's own lock on it (taken
/// first: what is checked here stays true until the rename). Never the sandbox's bytes: the
/// host's index is copied and the entries that differ are applied to the copy with
/// `git update-index --index-info` (which checks every path again), so the sandbox's index
/// extensions (a cache tree naming trees of its choosing) and flags (assume-unchanged,
/// skip-worktree) never reach the host. Each gitlink the entries add or change has its
/// repository moved aside ([`disarm_gitlinks`]); one under a symbolic link refuses the whole.
fn install_index_back(
    layer: &Layer,
    ix: &SandboxIndex,
    before: &Before,
    scratch: &Path,
    run: &str,
    quarantine: &Path,
    out: &mut Outcome,
) -> Result<(), BackError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let not_back = |why: &str| {
        format!("aisb: the sandbox's staging area (git's index) was not brought back: {why}")
    };
    let lock_path = layer.host_admin().join("index.lock");
    let mut lock = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock_path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            out.lines
                .push(not_back("a git on the host holds index.lock"));
            return Ok(());
        }
        Err(e) => return Err(io("locking the host's index")(e)),
    };
    let tmp = scratch.join(format!("{run}.index-new"));
    let renamed = std::cell::Cell::new(false);
    let result = (|| -> Result<Option<String>, BackError> {
        let Some(host_now) = ls_stage(layer, None) else {
            return Ok(Some(not_back("git could not read the host's")));
        };
        if super::index_stamp(&layer.host_admin()) != before.index {
            let then = before
                .index_then_path()
                .and_then(|t| ls_stage(layer, Some(&t)));
            if then.as_ref() != Some(&host_now) {
                return Ok(Some(not_back(
                    "what is staged changed on the host during the run",
                )));
            }
        }
        let host_set: std::collections::HashSet<&(Vec<u8>, Vec<u8>)> = host_now.iter().collect();
        let sandbox_set: std::collections::HashSet<&(Vec<u8>, Vec<u8>)> =
            ix.entries.iter().collect();
        let added: Vec<&(Vec<u8>, Vec<u8>)> = ix
            .entries
            .iter()
            .filter(|e| !host_set.contains(e))
            .collect();
        let links: Vec<&[u8]> = added
            .iter()
            .filter(|(m, _)| m.starts_with(b"160000 "))
            .map(|(_, p)| p.as_slice())
            .collect();
        if !disarm_gitlinks(layer, &links, quarantine, out) {
            return Ok(Some(not_back(
                "a submodule's path in it is a symbolic link",
            )));
        }
        let mut input: Vec<u8> = Vec::new();
        let mut removed = std::collections::HashSet::new();
        for (meta, path) in host_now.iter().filter(|e| !sandbox_set.contains(e)) {
            if !removed.insert(path.clone()) {
                continue;
            }
            let zero = std::str::from_utf8(meta)
                .ok()
                .and_then(|m| m.split(' ').nth(1))
                .map_or(ZERO.len(), str::len);
            input.extend_from_slice(format!("0 {}\t", "0".repeat(zero)).as_bytes());
            input.extend_from_slice(path);
            input.push(0);
        }
        for (meta, path) in &added {
            input.extend_from_slice(meta);
            input.push(b'\t');
            input.extend_from_slice(path);
            input.push(0);
        }
        if input.is_empty() {
            return Ok(None);
        }
        match std::fs::read(layer.host_admin().join("index")) {
            Ok(b) => std::fs::write(&tmp, b).map_err(io("copying the host's index"))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("reading the host's index")(e)),
        }
        let mut cmd = layer.git();
        cmd.env("GIT_INDEX_FILE", &tmp)
            .args(["update-index", "-z", "--index-info"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let o = with_input(cmd, input).map_err(io("running git update-index"))?;
        if !o.status.success() {
            let e = String::from_utf8_lossy(&o.stderr);
            return Ok(Some(not_back(&format!(
                "git refused it: {}",
                e.lines().next().unwrap_or("")
            ))));
        }
        let bytes = std::fs::read(&tmp).map_err(io("reading the new index"))?;
        lock.write_all(&bytes)
            .and_then(|()| lock.sync_all())
            .map_err(io("writing the host's index.lock"))?;
        std::fs::rename(&lock_path, layer.host_admin().join("index"))
            .map_err(io("installing the host's index"))?;
        renamed.set(true);
        Ok(None)
    })();
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_file(scratch.join(format!("{run}.index-new.lock")));
    // Still ours when nothing was renamed (nothing to apply, a refusal, an error): released.
    // After the rename an index.lock there is another git's.
    if !renamed.get() {
        let _ = std::fs::remove_file(&lock_path);
    }
    if let Some(line) = result? {
        out.lines.push(line);
    }
    Ok(())
}

/// Move aside the repository at each gitlink path `links` (relative to the work tree) that is
/// not a submodule's own `.git` file pointing into the host's `modules/`: git on the host
/// looks into every gitlink with that repository's configuration. False when a path runs
/// through a symbolic link (nothing can be moved safely there).
fn disarm_gitlinks(layer: &Layer, links: &[&[u8]], quarantine: &Path, out: &mut Outcome) -> bool {
    use std::os::unix::ffi::OsStrExt;
    for path in links {
        let work = layer.work_tree.join(std::ffi::OsStr::from_bytes(path));
        if super::check_no_symlinks(&layer.work_tree, &work).is_err() {
            return false;
        }
        let dot = work.join(".git");
        let Ok(md) = std::fs::symlink_metadata(&dot) else {
            continue;
        };
        let own_module = md.is_file()
            && super::gitfile_target(&dot, &work)
                .is_some_and(|t| t.starts_with(layer.host_git.join("modules")));
        if own_module {
            continue;
        }
        if let Some(moved) = super::quarantine_beneath(&layer.work_tree, &dot, quarantine) {
            out.quarantined.push(moved);
        }
    }
    true
}

/// The gitlinks the commits from `old` to `new` add or change (`git diff-tree`), all of
/// `new`'s when `old` is none: their repositories are looked at like the index's.
/// None when git could not list them (failed, timed out, or printed past the bound).
fn gitlinks_between(layer: &Layer, old: Option<&str>, new: &str) -> Option<Vec<Vec<u8>>> {
    let mut cmd = layer.git();
    match old {
        Some(o) => cmd.args(["diff-tree", "-r", "-z", "--no-renames", "--raw", o, new]),
        None => cmd.args(["ls-tree", "-r", "-z", "--full-tree", new]),
    };
    cmd.stdin(Stdio::null()).stderr(Stdio::null());
    let o = crate::child::output_within(cmd, LISTING_BOUNDS, false)
        .ok()
        .filter(|o| o.status.success() && !LISTING_BOUNDS.reached(&o.stdout))?;
    let mut out = Vec::new();
    let mut fields = o.stdout.split(|b| *b == 0);
    if old.is_some() {
        // `:oldmode newmode oldoid newoid status` NUL `path` NUL
        while let (Some(meta), Some(path)) = (fields.next(), fields.next()) {
            if meta.split(|b| *b == b' ').nth(1) == Some(b"160000") {
                out.push(path.to_vec());
            }
        }
    } else {
        // `mode type oid` TAB `path` NUL
        for e in fields {
            if e.starts_with(b"160000 ") {
                if let Some(tab) = e.iter().position(|b| *b == b'\t') {
                    out.push(e[tab + 1..].to_vec());
                }
            }
        }
    }
    Some(out)
}

/// `git ls-files --stage -z` of the host's index, or of `index`: (mode, oid and stage; path).
fn ls_stage(layer: &Layer, index: Option<&Path>) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut cmd = layer.git();
    if let Some(i) = index {
        cmd.env("GIT_INDEX_FILE", i);
    }
    cmd.args(["ls-files", "--stage", "-z"])
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    let o = crate::child::output_within(cmd, LISTING_BOUNDS, false)
        .ok()
        .filter(|o| !LISTING_BOUNDS.reached(&o.stdout))?;
    if !o.status.success() {
        return None;
    }
    Some(
        o.stdout
            .split(|b| *b == 0)
            .filter(|e| !e.is_empty())
            .filter_map(|e| {
                let tab = e.iter().position(|b| *b == b'\t')?;
                Some((e[..tab].to_vec(), e[tab + 1..].to_vec()))
            })
            .collect(),
    )
}

/// A path git itself would put in an index: relative, no `.`/`..`/empty component, no `.git`
/// component in any case.
fn safe_index_path(p: &[u8]) -> bool {
    !p.is_empty()
        && p[0] != b'/'
        && p.split(|b| *b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b".." && !c.eq_ignore_ascii_case(b".git"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_names_follow_gits_rules() {
        for ok in [
            "refs/heads/main",
            "refs/heads/feat/x-1",
            "refs/tags/v1.0",
            "refs/stash",
        ] {
            assert!(valid_ref_name(ok), "{ok}");
        }
        for bad in [
            "HEAD",
            "refs/heads/../x",
            "refs/heads/.hidden",
            "refs/heads/a.lock",
            "refs/heads/a b",
            "refs/heads/a\nb",
            "refs/heads/a~1",
            "refs/heads/a@{1}",
            "refs/heads/",
            "refs//x",
            "refs/heads/x.",
            "refs/heads/--mirror:x",
        ] {
            assert!(!valid_ref_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn index_paths_never_leave_the_work_tree_or_name_git() {
        assert!(safe_index_path(b"src/main.rs"));
        for bad in [
            &b"../x"[..],
            b"/etc/passwd",
            b"a/.git/config",
            b".GIT/hooks/x",
            b"a//b",
            b"./a",
            b"",
        ] {
            assert!(!safe_index_path(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
