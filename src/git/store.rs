//! The sandbox's git objects without the content of masked files (issue 30, item 4).
//!
//! A mask hides a file in the work tree, but git keeps every version of it in the object
//! store: `git show HEAD:.env`, `git log -p` or `git cat-file` inside would print what the mask
//! hides. So a writable project's git directory is not shown with the host's objects: its
//! overlay (see [`super::back`]) gets one more lower layer, this store, whose `objects`
//! directory is opaque (the host's objects are not seen through it) and holds
//! - one or more packs of every object reachable from the repository's refs, reflogs and index,
//!   except the blobs that were ever at a path a mask rule matches (the built-in sensitive
//!   patterns, `block`, and inside dependency directories their credential files);
//! - for each withheld blob, an object under the blob's own name whose content is a line saying
//!   so (in packs aisb writes itself, [`placeholder_pack`]). Git trusts the name a pack's index
//!   gives an object without hashing it again (only `fsck` and a few parsers check), so trees,
//!   commits and the index keep naming the real blob, and `status`,
//!   `diff`, `add`, `commit`, `stash`, `rebase` and `log` work; what a withheld blob shows is
//!   the line. The sandbox's own writes land in the overlay's upper layer as before, and are
//!   brought back with the host's objects as their base, so the host's history never sees a
//!   placeholder. Objects reachable from nothing (what `fsck --lost-found` would find) are not
//!   in the store at all.
//!
//! The store is built by the host's git, with [`super::command`]'s reduced trust, once per
//! change of the repository: a run whose refs, reflogs, index and rules did not change reuses
//! it after a few `stat`s. After a change only the objects new since the last build are
//! packed (the earlier packs are linked into the new version); a change of the rules, or more
//! than [`MAX_PACKS`] packs, builds it whole, as does a blob newly masked that an earlier
//! version packed. A version in use by a run (a shared lock) is
//! never removed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

/// What the store withholds by: the mask rules as they apply to history (the evaluator's
/// `LiveRules` implement it).
pub trait Rules {
    /// The rule that masks `path` (as git names it, `/`-separated) or one of its directories.
    fn masked(&self, path: &[u8]) -> Option<String>;
    /// A digest of the rules: a change builds the store whole.
    fn digest(&self) -> String;
}

/// Under a state directory: `<state>/git-store/<slug>/{record.json,build.lock,v-N/{lock,layer/objects}}`.
pub const STORE_DIR: &str = "git-store";
/// In a version directory, the layer (beside the version's lock, which is not in the layer).
const LAYER: &str = "layer";
/// At most this many entries of `refs/` and `logs/` are looked at for the change key; past
/// it the key covers the first ones only (a stale store hides new objects, never old content).
const MAX_REF_FILES: usize = 100_000;
/// At most this many objects are walked; a repository larger than that is refused a store
/// (and the run told so).
const MAX_OBJECTS: usize = 50_000_000;
/// Packs a version may hold before the next build is a whole one.
const MAX_PACKS: usize = 64;
/// The placeholder line names at most this much of a path.
const MAX_NAME: usize = 512;

/// A version of the store, held for one run (a shared lock: never removed while held).
#[derive(Debug)]
pub struct Store {
    /// The lower layer to put above the host's git directory (it holds only `objects/`).
    pub layer: PathBuf,
    /// Blobs withheld in this version.
    pub withheld: usize,
    _held: Flock<std::fs::File>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("git {what} failed: {detail}")]
    Git { what: &'static str, detail: String },
    #[error("the repository has more than {MAX_OBJECTS} objects")]
    TooLarge,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}

/// What the last build recorded.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Record {
    /// The change key the build started from ([`change_key`]).
    key: String,
    /// The rules it withheld by ([`rules_digest`]).
    rules: String,
    /// The version directory (`v-N`), or none when nothing was withheld (no store needed).
    version: Option<String>,
    /// The refs' and `HEAD`'s objects at the build: the next build packs what is new since.
    tips: Vec<String>,
    withheld: usize,
    packs: usize,
}

/// How a store is shown to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// A lower layer of the run's git directory overlay, above the host's objects (which it
    /// must hide: opaque); none is needed when nothing in the history is masked.
    Overlay,
    /// A directory bound in place of the repository's objects for a sandbox that lives while
    /// the host commits (a named sandbox): always built, even with nothing masked yet (a
    /// secret committed later must not be shown through the host's objects); no overlay, so
    /// no extended attribute is needed.
    View,
}

/// The store for the git directory `host_git` (work tree `work_tree`), under `state_dir`,
/// built or brought up to date; `None` when no blob in the repository's history is at a masked
/// path and `how` is [`Use::Overlay`] (the host's objects are shown as they are). A
/// [`Use::View`] store with nothing masked holds every object and no placeholder.
pub fn prepare(
    state_dir: &Path,
    host_git: &Path,
    work_tree: &Path,
    rules: &dyn Rules,
    how: Use,
) -> Result<Option<Store>, StoreError> {
    let dir = state_dir.join(STORE_DIR).join(slug(host_git));
    std::fs::create_dir_all(&dir).map_err(io(format!("making {}", dir.display())))?;
    let key = change_key(host_git);
    let digest = rules.digest();
    let record_path = dir.join("record.json");
    let read_record = || -> Record {
        std::fs::read(&record_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    // What a record of this repository's state and rules gives: its version held, or no
    // store at all; `None`: it must be built.
    let reuse = |record: &Record| -> Result<Option<Option<Store>>, StoreError> {
        if record.key != key || record.rules != digest {
            return Ok(None);
        }
        Ok(match hold(&dir, record)? {
            Some(store) => Some(Some(store)),
            None => (record.version.is_none() && how == Use::Overlay).then_some(None),
        })
    };
    // Reused without the build lock: a record is replaced atomically, and its version is
    // locked before it is trusted to exist.
    if let Some(found) = reuse(&read_record())? {
        return Ok(found);
    }
    let build_lock = crate::atomic::lock_file(&dir.join("build.lock"))
        .map_err(io("opening the store's lock"))?;
    let _building = Flock::lock(build_lock, FlockArg::LockExclusive)
        .map_err(|(_, e)| io("locking the store")(e.into()))?;
    // Another run may have built it meanwhile.
    let record = read_record();
    if let Some(found) = reuse(&record)? {
        return Ok(found);
    }
    // Before any work: a file system that keeps no user extended attributes cannot hold a
    // store (its objects could not be made opaque).
    if how == Use::Overlay {
        opaque(&dir)?;
    }
    let tips = tips(host_git)?;
    let old_objects = record
        .version
        .as_ref()
        .map(|v| dir.join(v).join(LAYER).join("objects"));
    // From the last build on, when the rules are the same (a change walks it all again), it
    // left a version or nothing to withhold, and its packs are few enough.
    // (A shallow repository is walked whole: a deepening fetch adds history behind the
    // recorded tips, which `^tips` would leave out.)
    let mut incremental = record.rules == digest
        && !record.tips.is_empty()
        && !host_git.join("shallow").exists()
        && record.packs < MAX_PACKS
        && old_objects.as_ref().is_none_or(|o| o.is_dir());
    // The blobs withheld so far stay withheld, whatever name a later commit gives them.
    let mut set = match (&old_objects, incremental) {
        (Some(o), true) => placeholders_in(o),
        _ => Withheld::new(),
    };
    let since: &[String] = if incremental { &record.tips } else { &[] };
    // A build that takes longer than a second says what it is doing (a large repository's
    // first takes seconds).
    let _progress = Progress::after(
        std::time::Duration::from_secs(1),
        format!(
            "aisb: preparing the git history the sandbox sees, without the content of masked files ({}; later runs add only what is new)…",
            host_git.display()
        ),
    );
    let mut seen = std::collections::HashSet::new();
    names(
        host_git, work_tree, rules, &tips, since, &mut set, &mut seen,
    )?;
    // A blob newly masked that an earlier version packed (`git mv notes.txt .env`): a
    // placeholder cannot hide a packed object, so the store is built anew.
    if let (Some(old), true) = (&old_objects, incremental) {
        let fresh: Vec<&str> = set
            .iter()
            .filter(|(_, name)| name.is_some())
            .map(|(oid, _)| oid.as_str())
            .collect();
        if packed_in(host_git, old, &fresh)? {
            incremental = false;
            set = Withheld::new();
            seen.clear();
            names(host_git, work_tree, rules, &tips, &[], &mut set, &mut seen)?;
        }
    }
    // Something to withhold for the first time (the last build left no store): the pack is
    // whole, so its names must be too (a blob pass one never saw is withheld).
    if incremental && old_objects.is_none() && (how == Use::View || !set.is_empty()) {
        incremental = false;
        set = Withheld::new();
        seen.clear();
        names(host_git, work_tree, rules, &tips, &[], &mut set, &mut seen)?;
    }
    let since: &[String] = if incremental { &record.tips } else { &[] };
    if set.is_empty() && how == Use::Overlay {
        // Nothing masked in the history: the host's objects are shown as they are.
        let new = Record {
            key,
            rules: digest,
            version: None,
            tips,
            withheld: 0,
            packs: 0,
        };
        write_record(&record_path, &new)?;
        sweep(&dir, None);
        return Ok(None);
    }
    let version = format!(
        "v-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let making = dir.join(format!(".{version}"));
    let _ = crate::beneath::remove_tree(&making);
    let objects = making.join(LAYER).join("objects");
    std::fs::create_dir_all(objects.join("pack"))
        .map_err(io(format!("making {}", objects.display())))?;
    // The earlier packs linked in when there are some, and only what is new packed; else all.
    let (mut packs, since) = match (&old_objects, incremental) {
        (Some(old), true) => (link_version(old, &objects)?, since),
        _ => (0, &[][..]),
    };
    packs += pack(
        host_git,
        work_tree,
        rules,
        (&tips, since),
        &objects,
        &mut set,
        &seen,
    )?;
    let fresh: Vec<(&str, &[u8])> = set
        .iter()
        .filter_map(|(oid, name)| Some((oid.as_str(), name.as_deref()?)))
        .collect();
    placeholder_pack(rules, &objects, &fresh)?;
    if how == Use::Overlay {
        opaque(&objects)?;
    }
    crate::atomic::write_atomic(&making.join("lock"), b"")
        .map_err(io("writing the store's lock"))?;
    let at = dir.join(&version);
    std::fs::rename(&making, &at).map_err(io(format!("placing {}", at.display())))?;
    let new = Record {
        key,
        rules: digest,
        version: Some(version),
        tips,
        withheld: set.len(),
        packs,
    };
    write_record(&record_path, &new)?;
    let held = hold(&dir, &new)?;
    sweep(&dir, new.version.as_deref());
    Ok(held)
}

/// A line on stderr once `after` has passed, unless dropped first.
struct Progress {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    fn after(after: std::time::Duration, line: String) -> Progress {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(after) {
                eprintln!("{line}");
            }
        });
        Progress {
            done: Some(done),
            thread: Some(thread),
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(d) = self.done.take() {
            let _ = d.send(());
        }
        // Gone before the caller goes on (a runtime may fork next).
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The store version the last build recorded for `host_git`, held; `None` when there is none
/// (nothing withheld, or never built). Nothing is built.
pub fn current(state_dir: &Path, host_git: &Path) -> Option<Store> {
    let dir = state_dir.join(STORE_DIR).join(slug(host_git));
    let record: Record =
        serde_json::from_slice(&std::fs::read(dir.join("record.json")).ok()?).ok()?;
    hold(&dir, &record).ok().flatten()
}

fn write_record(path: &Path, record: &Record) -> Result<(), StoreError> {
    let text = serde_json::to_vec(record).unwrap_or_default();
    crate::atomic::write_atomic(path, &text).map_err(io("writing the store's record"))
}

/// A version whose `objects/` is empty and opaque: what the sandbox sees when the store
/// could not be built (git inside has no history, rather than the host's with the masked
/// content in it).
pub fn empty(state_dir: &Path, host_git: &Path) -> Result<Store, StoreError> {
    let dir = state_dir.join(STORE_DIR).join(slug(host_git));
    std::fs::create_dir_all(&dir).map_err(io(format!("making {}", dir.display())))?;
    // Under the build lock: a sweep (which holds it) never removes it between its making and
    // its hold.
    let build_lock = crate::atomic::lock_file(&dir.join("build.lock"))
        .map_err(io("opening the store's lock"))?;
    let _building = Flock::lock(build_lock, FlockArg::LockExclusive)
        .map_err(|(_, e)| io("locking the store")(e.into()))?;
    let at = dir.join("v-empty");
    let objects = at.join(LAYER).join("objects");
    std::fs::create_dir_all(objects.join("pack"))
        .map_err(io(format!("making {}", objects.display())))?;
    opaque(&objects)?;
    crate::atomic::lock_file(&at.join("lock")).map_err(io("making the store's lock"))?;
    hold(
        &dir,
        &Record {
            version: Some("v-empty".into()),
            ..Record::default()
        },
    )?
    .ok_or_else(|| io("holding the empty store")(std::io::ErrorKind::NotFound.into()))
}

/// Make `view` (a directory of aisb's, bound read-only as a git directory's `objects/` inside
/// a sandbox that lives longer than one store version: a named sandbox) hold what `store`
/// holds: its files hard-linked in (packs before their indexes, so git inside never finds an
/// index without its pack), then what the store no longer has removed (indexes first). Packs
/// are named by their content, so a name already there is the same file. Nothing is followed
/// through a link; `view` is aisb's own.
pub fn mirror(store: &Store, view: &Path) -> Result<(), StoreError> {
    let from = store.layer.join("objects");
    let pack = view.join("pack");
    std::fs::create_dir_all(&pack).map_err(io(format!("making {}", pack.display())))?;
    let listed = |dir: &Path| -> Result<Vec<std::ffi::OsString>, StoreError> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map_err(io(format!("reading {}", dir.display())))?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name())
            .take(10_000)
            .collect();
        // `.idx` after `.pack` when adding; the reverse when removing.
        names.sort_by_key(|n| n.to_string_lossy().ends_with(".idx"));
        Ok(names)
    };
    let wanted = listed(&from.join("pack"))?;
    for name in &wanted {
        let dest = pack.join(name);
        if std::fs::symlink_metadata(&dest).is_ok() {
            continue;
        }
        let tmp = pack.join(format!(".linking-{}", name.to_string_lossy()));
        let _ = std::fs::remove_file(&tmp);
        std::fs::hard_link(from.join("pack").join(name), &tmp)
            .or_else(|_| std::fs::copy(from.join("pack").join(name), &tmp).map(|_| ()))
            .map_err(io(format!("linking {}", dest.display())))?;
        std::fs::rename(&tmp, &dest).map_err(io(format!("placing {}", dest.display())))?;
    }
    let mut old = listed(&pack)?;
    old.reverse();
    for name in old.iter().filter(|n| !wanted.contains(n)) {
        let _ = std::fs::remove_file(pack.join(name));
    }
    Ok(())
}

/// The version `record` names, locked shared for the run; `None` when it has none or it is
/// gone.
fn hold(dir: &Path, record: &Record) -> Result<Option<Store>, StoreError> {
    let Some(version) = &record.version else {
        return Ok(None);
    };
    let at = dir.join(version);
    // Opened, never made: a version being swept has no lock to make again.
    let Ok(f) = open_lock(&at.join("lock")) else {
        return Ok(None);
    };
    let layer = at.join(LAYER);
    let held = Flock::lock(f, FlockArg::LockShared)
        .map_err(|(_, e)| io("locking the store's version")(e.into()))?;
    // Swept between the read of the record and the lock: not there any more.
    if !layer.join("objects").is_dir() {
        return Ok(None);
    }
    Ok(Some(Store {
        layer,
        withheld: record.withheld,
        _held: held,
    }))
}

/// A version's lock, opened (never made, never through a link).
fn open_lock(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// The blobs an earlier version withheld: the lists beside its placeholder packs (each with
/// no name: their placeholders are written already). At most [`MAX_OBJECTS`] are read.
fn placeholders_in(objects: &Path) -> Withheld {
    let mut set = Withheld::new();
    let Ok(entries) = std::fs::read_dir(objects.join("pack")) else {
        return set;
    };
    for e in entries.flatten().take(10_000) {
        if !e.file_name().to_string_lossy().ends_with(WITHHELD_LIST) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for oid in text.lines().filter(|l| is_oid(l)).take(MAX_OBJECTS) {
            set.insert(oid.to_string(), None);
        }
    }
    set
}

/// Whether any of `oids` is an object of the store version `objects` (its packs: the ones
/// asked for are not among its placeholders).
fn packed_in(git_dir: &Path, objects: &Path, oids: &[&str]) -> Result<bool, StoreError> {
    if oids.is_empty() {
        return Ok(false);
    }
    let mut cmd = super::command(git_dir, None);
    cmd.env("GIT_OBJECT_DIRECTORY", objects)
        .env_remove("GIT_ALTERNATE_OBJECT_DIRECTORIES")
        .args(["cat-file", "--batch-check=%(objectname) %(objecttype)"]);
    let input = oids
        .iter()
        .flat_map(|o| [o.as_bytes(), b"\n"])
        .flatten()
        .copied()
        .collect();
    let mut check = start(cmd, Some(input), "cat-file")?;
    let out = BufReader::new(check.child.stdout.take().expect("piped"));
    let mut found = false;
    for line in out.split(b'\n') {
        let line = line.map_err(io("reading git cat-file"))?;
        found |= !line.ends_with(b" missing");
    }
    check.finish("cat-file")?;
    Ok(found)
}

/// Every version but `keep` that no run holds is removed.
fn sweep(dir: &Path, keep: Option<&str>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten().take(10_000) {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("v-") || name.starts_with(".v-")) || Some(&*name) == keep {
            continue;
        }
        let path = e.path();
        let Ok(f) = open_lock(&path.join("lock")) else {
            // A half-made one (no lock yet) of a build that died: the build lock is ours.
            if name.starts_with('.') {
                let _ = crate::beneath::remove_tree(&path);
            }
            continue;
        };
        if let Ok(_free) = Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            let _ = crate::beneath::remove_tree(&path);
        }
    }
}

/// A directory name for the git directory `git_dir`: a digest of its path, and its name.
fn slug(git_dir: &Path) -> String {
    let h = Sha256::digest(git_dir.as_os_str().as_encoded_bytes());
    format!("{h:x}")[..16].to_string()
}

/// What decides whether the store is still the repository's: `HEAD`, `packed-refs`, the index,
/// the alternates, and every file under `refs/` and `logs/`, by inode, size and change time
/// (git replaces these files by renaming, or appends to them). No file is read.
pub fn change_key(git_dir: &Path) -> String {
    let mut h = Sha256::new();
    let mut add = |rel: &Path, md: &std::fs::Metadata| {
        h.update(rel.as_os_str().as_encoded_bytes());
        for n in [
            md.ino(),
            md.size(),
            md.ctime() as u64,
            md.ctime_nsec() as u64,
            md.mtime() as u64,
            md.mtime_nsec() as u64,
        ] {
            h.update(n.to_le_bytes());
        }
    };
    for name in [
        "HEAD",
        "packed-refs",
        "index",
        "objects/info/alternates",
        "shallow",
    ] {
        if let Ok(md) = std::fs::symlink_metadata(git_dir.join(name)) {
            add(Path::new(name), &md);
        }
    }
    // Linked work trees' `HEAD`, index and reflog (their staged and checked-out objects).
    if let Ok(entries) = std::fs::read_dir(git_dir.join("worktrees")) {
        let mut linked: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .take(MAX_WORKTREES)
            .collect();
        linked.sort();
        for w in linked {
            for name in ["HEAD", "index", "logs/HEAD"] {
                let p = w.join(name);
                if let (Ok(md), Ok(rel)) = (std::fs::symlink_metadata(&p), p.strip_prefix(git_dir))
                {
                    add(rel, &md);
                }
            }
        }
    }
    let mut seen = 0;
    for top in ["refs", "logs"] {
        for e in walkdir::WalkDir::new(git_dir.join(top))
            .follow_links(false)
            .sort_by_file_name()
            .into_iter()
            .flatten()
        {
            seen += 1;
            if seen > MAX_REF_FILES {
                break;
            }
            if let (Ok(md), Ok(rel)) = (e.metadata(), e.path().strip_prefix(git_dir)) {
                add(rel, &md);
            }
        }
    }
    format!("{:x}", h.finalize())
}

/// The objects the refs and `HEAD` name now.
fn tips(git_dir: &Path) -> Result<Vec<String>, StoreError> {
    let out = super::command(git_dir, None)
        .args(["show-ref", "--head", "--hash"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(io("running git show-ref"))?;
    // 1: no refs at all (a repository without commits).
    if !out.status.success() && out.status.code() != Some(1) {
        return Err(StoreError::Git {
            what: "show-ref",
            detail: out.status.to_string(),
        });
    }
    let mut tips: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| is_oid(l))
        .map(str::to_string)
        .collect();
    tips.sort();
    tips.dedup();
    Ok(tips)
}

fn is_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The withheld blobs: each one's name for its placeholder line (`None`: its placeholder is
/// there already, linked from an earlier version).
type Withheld = BTreeMap<String, Option<Vec<u8>>>;

/// Link the packs and placeholders of an earlier version into `to` (same file system); the
/// number of packs.
fn link_version(from: &Path, to: &Path) -> Result<usize, StoreError> {
    if !from.is_dir() {
        return Err(io(format!("reading {}", from.display()))(
            std::io::ErrorKind::NotFound.into(),
        ));
    }
    let mut packs = 0;
    for e in walkdir::WalkDir::new(from)
        .min_depth(2)
        .max_depth(2)
        .follow_links(false)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
    {
        let Ok(rel) = e.path().strip_prefix(from) else {
            continue;
        };
        let dest = to.join(rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("making {}", parent.display())))?;
        }
        std::fs::hard_link(e.path(), &dest)
            .or_else(|_| std::fs::copy(e.path(), &dest).map(|_| ()))
            .map_err(io(format!("linking {}", e.path().display())))?;
        if rel.starts_with("pack") && rel.extension().is_some_and(|x| x == "pack") {
            packs += 1;
        }
    }
    Ok(packs)
}

/// The revisions of a walk on git's standard input: `tips`, then `^since`.
fn revisions(tips: &[String], since: &[String]) -> Vec<u8> {
    let mut input = Vec::new();
    for t in tips {
        input.extend_from_slice(t.as_bytes());
        input.push(b'\n');
    }
    for t in since {
        input.push(b'^');
        input.extend_from_slice(t.as_bytes());
        input.push(b'\n');
    }
    input
}

/// A running git whose standard input is fed from a thread and whose standard error is
/// drained by another (at most 64 KiB kept), so neither can block it.
struct Running {
    child: std::process::Child,
    feeder: Option<std::thread::JoinHandle<()>>,
    errors: std::thread::JoinHandle<Vec<u8>>,
}

/// `input`: what a thread feeds it; `None`: its standard input is left to the caller
/// (`child.stdin`), and its output is not read.
fn start(
    mut cmd: std::process::Command,
    input: Option<Vec<u8>>,
    what: &str,
) -> Result<Running, StoreError> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("running git {what}")))?;
    let feeder = match input {
        Some(input) => {
            let mut stdin = child.stdin.take().expect("piped");
            Some(std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            }))
        }
        None => None,
    };
    let stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::Read::take(stderr, 64 << 10), &mut kept);
        kept
    });
    Ok(Running {
        child,
        feeder,
        errors,
    })
}

impl Running {
    fn finish(mut self, what: &'static str) -> Result<(), StoreError> {
        if let Some(f) = self.feeder.take() {
            let _ = f.join();
        }
        let status = self
            .child
            .wait()
            .map_err(io(format!("waiting for git {what}")))?;
        let errors = self.errors.join().unwrap_or_default();
        if status.success() {
            Ok(())
        } else {
            Err(StoreError::Git {
                what,
                detail: String::from_utf8_lossy(&errors).trim().to_string(),
            })
        }
    }
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pass one: every name a blob had in the range (each path a commit of `tips` but not of
/// `since` or a reflog gave it, `git log --raw` with merges against each parent, and each
/// path of the index), and the blobs any masked name had go into `set`. By the blob, not by
/// one of its names: the same content committed again under another name, or staged under
/// one, stays withheld.
fn names(
    git_dir: &Path,
    work_tree: &Path,
    rules: &dyn Rules,
    tips: &[String],
    since: &[String],
    set: &mut Withheld,
    seen: &mut std::collections::HashSet<String>,
) -> Result<(), StoreError> {
    if !tips.is_empty() {
        let mut cmd = super::command(git_dir, None);
        cmd.args([
            "log",
            "--raw",
            "-z",
            "--no-renames",
            "--no-abbrev",
            "--format=",
            "--root",
            "--diff-merges=separate",
            "--reflog",
            "--ignore-missing",
            "--stdin",
        ]);
        let mut log = start(cmd, Some(revisions(tips, since)), "log")?;
        let out = BufReader::new(log.child.stdout.take().expect("piped"));
        let mut meta: Option<Vec<u8>> = None;
        let mut count = 0usize;
        for token in out.split(0) {
            let token = token.map_err(io("reading git log"))?;
            count += 1;
            if count > 2 * MAX_OBJECTS {
                log.kill();
                return Err(StoreError::TooLarge);
            }
            // `:MODE MODE OID OID STATUS` then the path (which may itself start with `:`).
            let Some(m) = meta.take() else {
                let token = token.strip_prefix(b"\n").unwrap_or(&token);
                if token.first() == Some(&b':') {
                    meta = Some(token.to_vec());
                }
                continue;
            };
            let fields: Vec<&[u8]> = m[1..].split(|b| *b == b' ').collect();
            let (Some(mode), Some(oid)) = (fields.get(1), fields.get(3)) else {
                continue;
            };
            note(rules, set, seen, mode, oid, &token);
        }
        log.finish("log")?;
    }
    // The index, and each linked work tree's (what `--indexed-objects` packs).
    let linked = std::fs::read_dir(git_dir.join("worktrees"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("index"))
        .filter(|i| std::fs::symlink_metadata(i).is_ok_and(|m| m.is_file()))
        .take(MAX_WORKTREES);
    for index_file in std::iter::once(None).chain(linked.map(Some)) {
        let mut cmd = super::command(git_dir, Some(work_tree));
        if let Some(i) = &index_file {
            cmd.env("GIT_INDEX_FILE", i);
        }
        cmd.args(["ls-files", "--stage", "-z"]);
        let mut index = start(cmd, Some(Vec::new()), "ls-files")?;
        let out = BufReader::new(index.child.stdout.take().expect("piped"));
        for entry in out.split(0) {
            let entry = entry.map_err(io("reading git ls-files"))?;
            // `MODE OID STAGE\tPATH`
            let Some(tab) = entry.iter().position(|b| *b == b'\t') else {
                continue;
            };
            let fields: Vec<&[u8]> = entry[..tab].split(|b| *b == b' ').collect();
            let (Some(mode), Some(oid)) = (fields.first(), fields.get(1)) else {
                continue;
            };
            note(rules, set, seen, mode, oid, &entry[tab + 1..]);
        }
        index.finish("ls-files")?;
    }
    Ok(())
}

/// At most this many linked work trees' indexes are read for the store's names.
const MAX_WORKTREES: usize = 256;

/// A blob `oid` (of `mode`) named `path`: into `set` when the name is masked.
fn note(
    rules: &dyn Rules,
    set: &mut Withheld,
    seen: &mut std::collections::HashSet<String>,
    mode: &[u8],
    oid: &[u8],
    path: &[u8],
) {
    // Files and links; not gitlinks (a submodule's commit) or trees.
    if !matches!(mode, b"100644" | b"100755" | b"120000" | b"100664") {
        return;
    }
    let Ok(oid) = std::str::from_utf8(oid) else {
        return;
    };
    if !is_oid(oid) || oid.bytes().all(|b| b == b'0') {
        return;
    }
    seen.insert(oid.to_string());
    if set.contains_key(oid) {
        return;
    }
    if rules.masked(path).is_some() {
        set.insert(oid.to_string(), Some(path.to_vec()));
    }
}

/// Pass two: pack every object reachable from `tips` (and the reflogs and index) but not
/// from `since`, except the blobs in `set` and any blob whose walked name is masked (added to
/// `set`); the number of packs written (0 or 1).
fn pack(
    git_dir: &Path,
    work_tree: &Path,
    rules: &dyn Rules,
    (tips, since): (&[String], &[String]),
    objects: &Path,
    set: &mut Withheld,
    seen: &std::collections::HashSet<String>,
) -> Result<usize, StoreError> {
    let mut cmd = super::command(git_dir, Some(work_tree));
    cmd.args([
        "rev-list",
        "--objects",
        "--reflog",
        "--indexed-objects",
        "--ignore-missing",
        "--stdin",
    ]);
    let mut walk = start(cmd, Some(revisions(tips, since)), "rev-list")?;
    // Each object's type beside its name (`%(rest)`: the path rev-list printed).
    let walked = walk.child.stdout.take().expect("piped");
    let mut typed = super::command(git_dir, None)
        .args([
            "cat-file",
            "--batch-check=%(objectname) %(objecttype) %(rest)",
        ])
        .stdin(Stdio::from(walked))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(io("running git cat-file"))?;
    let mut packer: Option<Running> = None;
    let mut sink: Option<std::process::ChildStdin> = None;
    let mut packed = 0usize;
    let mut count = 0usize;
    let reader = BufReader::new(typed.stdout.take().expect("piped"));
    let result = (|| -> Result<(), StoreError> {
        for line in reader.split(b'\n') {
            let line = line.map_err(io("reading git's object list"))?;
            count += 1;
            if count > MAX_OBJECTS {
                return Err(StoreError::TooLarge);
            }
            let mut parts = line.splitn(3, |b| *b == b' ');
            let (Some(oid), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let path = parts.next().unwrap_or_default();
            let Ok(oid) = std::str::from_utf8(oid) else {
                continue;
            };
            if !is_oid(oid) || !matches!(kind, b"blob" | b"tree" | b"commit" | b"tag") {
                // `<name> missing`: a name that is not an object here.
                continue;
            }
            if kind == b"blob" {
                if set.contains_key(oid) {
                    continue;
                }
                if !path.is_empty() && rules.masked(path).is_some() {
                    set.insert(oid.to_string(), Some(path.to_vec()));
                    continue;
                }
                // A blob no name of pass one gave (a tag's, another work tree's index): its
                // names were not all checked, so it is withheld.
                if !seen.contains(oid) {
                    set.insert(oid.to_string(), Some(Vec::new()));
                    continue;
                }
            }
            let s = match &mut sink {
                Some(s) => s,
                None => {
                    let mut cmd = super::command(git_dir, None);
                    cmd.args(["pack-objects", "-q"])
                        .arg(objects.join("pack").join("pack"));
                    // Fed here: the list is known as it is read.
                    let mut p = start(cmd, None, "pack-objects")?;
                    let stdin = p.child.stdin.take().expect("piped");
                    packer = Some(p);
                    sink.insert(stdin)
                }
            };
            s.write_all(oid.as_bytes())
                .and_then(|()| s.write_all(b"\n"))
                .map_err(io("feeding git pack-objects"))?;
            packed += 1;
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = typed.kill();
        let _ = typed.wait();
        walk.kill();
        if let Some(p) = packer {
            p.kill();
        }
        return Err(e);
    }
    let typed = typed.wait().map_err(io("waiting for git cat-file"))?;
    walk.finish("rev-list")?;
    if !typed.success() {
        return Err(StoreError::Git {
            what: "cat-file",
            detail: typed.to_string(),
        });
    }
    drop(sink);
    match packer {
        Some(p) => {
            p.finish("pack-objects")?;
            Ok(usize::from(packed > 0))
        }
        None => Ok(0),
    }
}

/// Beside a placeholder pack, the list of the blobs it stands for (one name a line).
const WITHHELD_LIST: &str = ".withheld";

/// The placeholders of `withheld` (blob name, one of its masked paths), as one pack in
/// `objects/pack/`: under each blob's own name, a line saying it is withheld. Git finds an
/// object in a pack by the name its index gives it and does not hash it again (only `fsck`
/// and `index-pack` do), so the index names the real blob; pack-objects would name the line
/// by its own content, so the pack and its index are written here (format version 2). A
/// pack, not loose files: a new version links a few files, not one per placeholder.
fn placeholder_pack(
    rules: &dyn Rules,
    objects: &Path,
    withheld: &[(&str, &[u8])],
) -> Result<(), StoreError> {
    if withheld.is_empty() {
        return Ok(());
    }
    let sha256 = withheld[0].0.len() == 64;
    let digest = |data: &[u8]| -> Vec<u8> {
        if sha256 {
            Sha256::digest(data).to_vec()
        } else {
            <sha1::Sha1 as sha1::Digest>::digest(data).to_vec()
        }
    };
    let mut entries: Vec<(Vec<u8>, u32, u64)> = Vec::with_capacity(withheld.len());
    let mut pack = Vec::new();
    pack.extend_from_slice(b"PACK");
    pack.extend_from_slice(&2u32.to_be_bytes());
    let count = u32::try_from(withheld.len()).map_err(|_| StoreError::TooLarge)?;
    pack.extend_from_slice(&count.to_be_bytes());
    let mut list = String::new();
    for (oid, path) in withheld {
        let Ok(raw) = hex::decode(oid) else { continue };
        let rule = rules.masked(path).unwrap_or_else(|| "a mask rule".into());
        let shown: String = String::from_utf8_lossy(&path[..path.len().min(MAX_NAME)])
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        let body = if path.is_empty() {
            "aisb: withheld: no path aisb checked names this blob (a tag's, another work tree's index), so its content is not in this sandbox's git objects\n".to_string()
        } else {
            format!(
                "aisb: withheld: {shown} matches the mask rule {rule}, so its content is not in this sandbox's git objects (`aisb why {shown}` on the host explains)\n"
            )
        };
        let offset = pack.len() as u64;
        let start = pack.len();
        // Type 3 (blob) and the size, 4 bits then 7 a byte.
        let mut size = body.len();
        let mut byte = (3u8 << 4) | (size & 0x0f) as u8;
        size >>= 4;
        while size > 0 {
            pack.push(byte | 0x80);
            byte = (size & 0x7f) as u8;
            size >>= 7;
        }
        pack.push(byte);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(body.as_bytes())
            .map_err(io("compressing a placeholder"))?;
        pack.extend_from_slice(&z.finish().map_err(io("compressing a placeholder"))?);
        let crc = crc32fast::hash(&pack[start..]);
        entries.push((raw, crc, offset));
        list.push_str(oid);
        list.push('\n');
    }
    if entries.len() != withheld.len() || pack.len() as u64 >= 1 << 31 {
        return Err(StoreError::TooLarge);
    }
    let trailer = digest(&pack);
    pack.extend_from_slice(&trailer);
    entries.sort();
    let mut idx = Vec::new();
    idx.extend_from_slice(&[0xff, b't', b'O', b'c']);
    idx.extend_from_slice(&2u32.to_be_bytes());
    for first in 0..=255u8 {
        let upto = entries.iter().filter(|(o, _, _)| o[0] <= first).count() as u32;
        idx.extend_from_slice(&upto.to_be_bytes());
    }
    for (oid, _, _) in &entries {
        idx.extend_from_slice(oid);
    }
    for (_, crc, _) in &entries {
        idx.extend_from_slice(&crc.to_be_bytes());
    }
    for (_, _, offset) in &entries {
        idx.extend_from_slice(&(*offset as u32).to_be_bytes());
    }
    idx.extend_from_slice(&trailer);
    let check = digest(&idx);
    idx.extend_from_slice(&check);
    let name = format!("pack-{}", hex::encode(&trailer));
    let dir = objects.join("pack");
    std::fs::create_dir_all(&dir).map_err(io(format!("making {}", dir.display())))?;
    // The list and the pack first, the index (what git looks for) last.
    for (ext, bytes) in [
        (WITHHELD_LIST, list.as_bytes()),
        (".pack", &pack[..]),
        (".idx", &idx[..]),
    ] {
        let dest = dir.join(format!("{name}{ext}"));
        let tmp = dir.join(format!(".{name}{ext}.tmp"));
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &dest))
            .map_err(io("writing the placeholders' pack"))?;
    }
    Ok(())
}

/// Mark `objects` opaque for overlayfs mounted with `userxattr` (as aisb mounts every
/// overlay): the host's objects below it are not seen through.
fn opaque(objects: &Path) -> Result<(), StoreError> {
    rustix::fs::setxattr(
        objects,
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(|e| {
        io(format!(
            "marking {} opaque (user extended attributes: the file system of aisb's state must keep them)",
            objects.display()
        ))(e.into())
    })
}
