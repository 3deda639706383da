//! The content-addressed store (`$XDG_CACHE_HOME/aisb/store`): one directory per entry,
//! `<first 32 hex digits of its hash>-<name>`, never changed once complete.
//!
//! An entry is written into a temporary directory and renamed into place; then its ready
//! marker (`<entry>.ready`, beside it, so nothing extra appears inside) is written last. A
//! directory without its marker is a crash's leftover: it is removed and built again. Builders
//! of one entry serialise on a lock file per entry (`.locks/<entry>.lock`, flock), so two
//! concurrent runs build it once.
//!
//! Every sandbox records the entries its runs use (`<state>/store-refs.json`, each with when it
//! was last used; dropped a day after); `aisb store gc` removes the entries no existing sandbox
//! state refers to.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::Serialize;

/// The store entries a sandbox of `plan` needs: its /etc snapshot and the files aisb writes
/// for it (an agent's settings).
pub fn entries_of(plan: &crate::eval::Plan) -> BTreeSet<PathBuf> {
    use crate::eval::plan::{MountKind, SystemPath};
    let snapshots = plan.system.iter().filter_map(|s| match s {
        SystemPath::Snapshot { snapshot, .. } => Some(snapshot.dir.clone()),
        _ => None,
    });
    let generated = plan.mounts.iter().filter_map(|m| match &m.kind {
        MountKind::Generated { dir, .. } => Some(dir.clone()),
        _ => None,
    });
    snapshots.chain(generated).collect()
}

/// The file, in a sandbox's state directory, naming the store entries its last run used.
pub const REFS_FILE: &str = "store-refs.json";
/// The file, in a sandbox's state directory, naming the project's `sandbox.lock`: what it pins
/// is kept as long as the state exists.
pub const LOCK_REF_FILE: &str = "lock-file";

/// The ready marker of an entry.
pub fn marker(entry: &Path) -> PathBuf {
    let mut m = entry.as_os_str().to_owned();
    m.push(".ready");
    PathBuf::from(m)
}

/// Whether `entry` is complete.
pub fn is_ready(entry: &Path) -> bool {
    entry.is_dir() && marker(entry).is_file()
}

/// An exclusive flock, released when dropped (or when the process dies).
struct EntryLock(#[allow(dead_code)] Flock<fs::File>);

impl EntryLock {
    fn take(entry: &Path) -> io::Result<EntryLock> {
        let store = entry.parent().unwrap_or(Path::new("."));
        let locks = store.join(".locks");
        fs::create_dir_all(&locks)?;
        let name = entry.file_name().unwrap_or_default();
        let mut file = name.to_owned();
        file.push(".lock");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(locks.join(file))?;
        // Blocks until the other builder is done.
        Flock::lock(f, FlockArg::LockExclusive)
            .map(EntryLock)
            .map_err(|(_, errno)| errno.into())
    }
}

/// Make `entry` exist and be complete: nothing to do when it is ready; otherwise, under its
/// lock, `fill` writes it into a temporary directory that is then renamed into place and
/// marked ready. Returns whether it was built (false: a cache hit).
pub fn realise(entry: &Path, fill: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<bool> {
    if is_ready(entry) {
        return Ok(false);
    }
    let store = entry.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(store)?;
    let _lock = EntryLock::take(entry)?;
    // Another builder may have finished while we waited.
    if is_ready(entry) {
        return Ok(false);
    }
    if entry.exists() {
        // No marker: an interrupted build. Never trusted, rebuilt.
        remove(entry)?;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = store.join(format!(
        ".tmp-{}-{}-{nanos}",
        entry.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    fs::create_dir(&tmp)?;
    let built = fill(&tmp).and_then(|()| fs::rename(&tmp, entry));
    if let Err(e) = built {
        let _ = remove(&tmp);
        return Err(e);
    }
    fs::write(marker(entry), b"")?;
    Ok(true)
}

/// Remove an entry (or a temporary directory), making read-only directories writable first.
fn remove(dir: &Path) -> io::Result<()> {
    // However deep a step nested its directories, whatever modes it left them.
    match crate::beneath::remove_tree(dir) {
        // An ordinary user's image layers hold files of their subordinate ids (rootless RUN
        // steps): removed from inside a user namespace where the caller is root over them.
        Err(e)
            if e.kind() == io::ErrorKind::PermissionDenied && !nix::unistd::geteuid().is_root() =>
        {
            crate::userns::remove_trees(&[dir.to_path_buf()])
        }
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct EntryInfo {
    pub name: String,
    pub path: PathBuf,
    pub bytes: u64,
    pub ready: bool,
    /// Sandbox state directories whose runs used it (within [`REF_TTL_SECS`]).
    pub used_by: Vec<PathBuf>,
}

/// The store entries a project's lock file pins (`image::lock::pinned_entries`): given by
/// the caller, so the store knows nothing of what a lock file is.
pub type Pinned<'a> = &'a dyn Fn(&Path, &Path) -> Vec<PathBuf>;

/// Every entry of the store at `store`, with its size and the sandboxes that use it; `cache`
/// is aisb's cache directory, where sandbox states live (`<cache>/<repo>-<hash>/<name>/`).
pub fn list(store: &Path, cache: &Path, pinned: Pinned) -> Vec<EntryInfo> {
    let refs = references(cache, pinned);
    let mut out: Vec<EntryInfo> = fs::read_dir(store)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            let path = e.path();
            EntryInfo {
                name: e.file_name().to_string_lossy().into_owned(),
                bytes: disk_use(&path),
                ready: is_ready(&path),
                used_by: refs
                    .iter()
                    .filter(|(_, entries)| entries.contains(&path))
                    .map(|(state, _)| state.clone())
                    .collect(),
                path,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// How long a state keeps referring to an entry its runs no longer use: a run still going
/// (started before /etc changed, say) keeps its entries at least this long.
pub const REF_TTL_SECS: u64 = 24 * 3600;

type Refs = std::collections::BTreeMap<PathBuf, u64>;

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn read_refs(state: &Path) -> Refs {
    fs::read(state.join(REFS_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// (sandbox state dir, the store entries it refers to) for every state under `cache`.
fn references(cache: &Path, pinned: Pinned) -> Vec<(PathBuf, BTreeSet<PathBuf>)> {
    let mut out = Vec::new();
    for repo in fs::read_dir(cache).into_iter().flatten().flatten() {
        for state in fs::read_dir(repo.path()).into_iter().flatten().flatten() {
            let mut entries: BTreeSet<PathBuf> = BTreeSet::new();
            if state.path().join(REFS_FILE).is_file() {
                entries.extend(read_refs(&state.path()).into_keys());
            }
            // The image the project's sandbox.lock pins, whenever it was last used.
            if let Ok(lock) = fs::read_to_string(state.path().join(LOCK_REF_FILE)) {
                let store = cache.join("store");
                entries.extend(pinned(Path::new(lock.trim()), &store));
            }
            if !entries.is_empty() {
                out.push((state.path(), entries));
            }
        }
    }
    out
}

/// Record that a sandbox's run uses `entries` (kept by `gc` while the state exists); entries
/// of earlier runs are kept for [`REF_TTL_SECS`] after their last use.
pub fn record_refs(state: &Path, entries: &BTreeSet<PathBuf>) -> io::Result<()> {
    let now = now_secs();
    let mut refs = read_refs(state);
    let before = refs.len();
    refs.retain(|_, used| now.saturating_sub(*used) < REF_TTL_SECS);
    // Written at most once a minute while nothing changes (most runs write nothing).
    let unchanged = refs.len() == before
        && entries
            .iter()
            .all(|e| refs.get(e).is_some_and(|t| now.saturating_sub(*t) < 60));
    if unchanged && state.join(REFS_FILE).is_file() {
        return Ok(());
    }
    for e in entries {
        refs.insert(e.clone(), now);
    }
    fs::create_dir_all(state)?;
    let bytes = serde_json::to_vec_pretty(&refs).unwrap_or_default();
    crate::atomic::write_atomic(&state.join(REFS_FILE), &bytes)
}

#[derive(Debug, Default, Serialize)]
pub struct GcReport {
    pub removed: Vec<String>,
    pub bytes: u64,
    pub kept: usize,
}

/// Remove every entry no sandbox state refers to, incomplete entries, and temporary
/// directories and locks of builds that are over (`dry_run`: only report). An entry being
/// built is skipped (its lock is held).
pub fn gc(store: &Path, cache: &Path, pinned: Pinned, dry_run: bool) -> io::Result<GcReport> {
    let mut report = GcReport::default();
    for e in list(store, cache, pinned) {
        if e.ready && !e.used_by.is_empty() {
            report.kept += 1;
            continue;
        }
        let Some(_lock) = try_lock(&e.path) else {
            report.kept += 1;
            continue;
        };
        if !dry_run {
            // The marker first: a half-removed entry is then never taken for complete.
            let _ = fs::remove_file(marker(&e.path));
            remove(&e.path)?;
        }
        report.bytes += e.bytes;
        report.removed.push(e.name);
    }
    // Leftovers of interrupted builds (their builder is gone: the temp name has its pid).
    for e in fs::read_dir(store).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(".tmp-") else {
            continue;
        };
        // `.tmp-NAME-PID-NANOS`
        let pid = rest.rsplit('-').nth(1).and_then(|p| p.parse::<i32>().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            report.bytes += disk_use(&e.path());
            report.removed.push(name);
            if !dry_run {
                remove(&e.path())?;
            }
        }
    }
    // Scratch directories of build steps whose builder is gone (`.work/PID-N`).
    for e in fs::read_dir(store.join(".work"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<i32>().ok());
        if !pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists()) {
            report.bytes += disk_use(&e.path());
            report.removed.push(format!(".work/{name}"));
            if !dry_run {
                remove(&e.path())?;
            }
        }
    }
    // Markers whose entry is gone.
    for e in fs::read_dir(store).into_iter().flatten().flatten() {
        let p = e.path();
        if let Some(entry) = p.to_str().and_then(|s| s.strip_suffix(".ready")) {
            if !Path::new(entry).exists() && !dry_run {
                let _ = fs::remove_file(&p);
            }
        }
    }
    Ok(report)
}

/// The entry's lock if nobody holds it (a build in progress keeps its entry).
fn try_lock(entry: &Path) -> Option<Flock<fs::File>> {
    let locks = entry.parent()?.join(".locks");
    let mut name = entry.file_name()?.to_owned();
    name.push(".lock");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(locks.join(name))
        .ok()?;
    Flock::lock(f, FlockArg::LockExclusiveNonblock).ok()
}

/// Disk use of a directory tree (apparent sizes), not following symlinks.
pub fn disk_use(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .follow_links(false)
        .into_iter()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_built_once_and_an_incomplete_one_again() {
        let t = tempfile::tempdir().unwrap();
        let entry = t.path().join("store/0123-thing");
        let built = realise(&entry, |d| fs::write(d.join("f"), "1")).unwrap();
        assert!(built && is_ready(&entry));
        // A hit does not call fill.
        assert!(!realise(&entry, |_| panic!("rebuilt a ready entry")).unwrap());
        // Without its marker (a crash between rename and marker): rebuilt.
        fs::remove_file(marker(&entry)).unwrap();
        fs::write(entry.join("f"), "half").unwrap();
        assert!(realise(&entry, |d| fs::write(d.join("f"), "2")).unwrap());
        assert_eq!(fs::read_to_string(entry.join("f")).unwrap(), "2");
        // A failing fill leaves nothing behind.
        let other = t.path().join("store/4567-other");
        assert!(realise(&other, |_| Err(io::Error::other("boom"))).is_err());
        assert!(!other.exists());
        let leftovers: Vec<_> = fs::read_dir(t.path().join("store"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn concurrent_builders_build_an_entry_once() {
        let t = tempfile::tempdir().unwrap();
        let entry = t.path().join("store/89ab-shared");
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (entry, count) = (entry.clone(), count.clone());
                std::thread::spawn(move || {
                    realise(&entry, |d| {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        fs::write(d.join("f"), "x")
                    })
                    .unwrap()
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[test]
    fn gc_keeps_what_a_sandbox_uses() {
        let t = tempfile::tempdir().unwrap();
        let (cache, store) = (t.path().join("cache"), t.path().join("cache/store"));
        let used = store.join("aaaa-used");
        let unused = store.join("bbbb-unused");
        realise(&used, |d| fs::write(d.join("f"), "12345")).unwrap();
        realise(&unused, |d| fs::write(d.join("f"), "123")).unwrap();
        fs::create_dir_all(store.join(".tmp-x-999999999-1")).unwrap();
        let state = cache.join("repo-0000/default");
        record_refs(&state, &BTreeSet::from([used.clone()])).unwrap();
        let l = list(&store, &cache, &|_, _| Vec::new());
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].used_by, vec![state.clone()]);
        let dry = gc(&store, &cache, &|_, _| Vec::new(), true).unwrap();
        assert!(unused.exists() && dry.removed.contains(&"bbbb-unused".to_string()));
        let r = gc(&store, &cache, &|_, _| Vec::new(), false).unwrap();
        assert_eq!(r.bytes, 3);
        assert!(used.exists() && !unused.exists() && !marker(&unused).exists());
        assert!(!store.join(".tmp-x-999999999-1").exists());
        // A later run using something else keeps the earlier entry (a run may still use it)
        // until it has not been used for a day.
        let other = store.join("cccc-other");
        realise(&other, |d| fs::write(d.join("f"), "1")).unwrap();
        record_refs(&state, &BTreeSet::from([other.clone()])).unwrap();
        gc(&store, &cache, &|_, _| Vec::new(), false).unwrap();
        assert!(used.exists() && other.exists());
        let mut refs = read_refs(&state);
        *refs.get_mut(&used).unwrap() -= REF_TTL_SECS + 1;
        fs::write(state.join(REFS_FILE), serde_json::to_vec(&refs).unwrap()).unwrap();
        record_refs(&state, &BTreeSet::from([other.clone()])).unwrap();
        gc(&store, &cache, &|_, _| Vec::new(), false).unwrap();
        assert!(!used.exists() && other.exists());
        // Once the sandbox's state is gone, so is what only it used.
        fs::remove_dir_all(&state).unwrap();
        gc(&store, &cache, &|_, _| Vec::new(), false).unwrap();
        assert!(!other.exists());
    }
}
