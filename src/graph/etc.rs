//! The sandbox's /etc: a snapshot of the allowlisted, world-readable entries of the host's
//! /etc, mounted with one read-only bind (instead of one mount per entry, which costs ~0.2 ms
//! each in bubblewrap). Its hash covers every entry's stamp, so any change on the host gives a
//! new snapshot; nothing that only root may read is ever copied.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Directories every snapshot has (mount points for files aisb writes, see `agents`).
/// Part of the snapshot's key: changing the list names new snapshots.
pub const ALWAYS_DIRS: &[&str] = &["claude-code", "gemini-cli", "aisb", "opencode", "codex"];

/// `resolv.conf` is always a regular file in the snapshot, with what the host's resolves to: a
/// mount point for the DNS stub's (transparent egress binds over it; a bind target cannot be
/// made in a read-only /etc), and readable under `network "host"` where the host's is a link
/// into /run (systemd-resolved's), which would dangle inside. Empty when the host has none.
const RESOLV: &str = "resolv.conf";
/// The most of the host's resolv.conf copied (glibc reads a few KiB).
const RESOLV_MAX: u64 = 64 * 1024;

/// What the snapshot's `resolv.conf` depends on beyond its own stamp: the stamp of what it
/// resolves to (a link's target changes without the link changing).
fn resolv_stamp(source: &Path) -> Option<(u64, i128, u32)> {
    let m = fs::metadata(source.join(RESOLV)).ok()?;
    Some((
        m.size(),
        m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        m.mode(),
    ))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Dir,
    File,
    Symlink(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Relative to /etc.
    pub rel: PathBuf,
    pub kind: Kind,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i128,
}

/// The plan's description of a snapshot (eval owns the type; this module plans and makes it).
pub use crate::eval::plan::EtcSnapshot as Snapshot;

fn entry(source: &Path, rel: &Path) -> Option<Entry> {
    let p = source.join(rel);
    let m = fs::symlink_metadata(&p).ok()?;
    let mode = m.mode() & 0o7777;
    let kind = if m.file_type().is_symlink() {
        Kind::Symlink(fs::read_link(&p).ok()?)
    } else if m.is_dir() {
        // Only directories anyone may list and enter.
        if mode & 0o005 != 0o005 {
            return None;
        }
        Kind::Dir
    } else if m.is_file() {
        // Only files anyone may read: nothing root-only ends up in a user's cache.
        if mode & 0o004 == 0 {
            return None;
        }
        Kind::File
    } else {
        return None;
    };
    Some(Entry {
        rel: rel.to_path_buf(),
        kind,
        mode,
        size: m.size(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
    })
}

/// Each allowlisted entry and, below a directory, everything anyone may read (`dirs_only`:
/// only the directories). An unreadable directory is left out with everything in it.
fn collect(source: &Path, names: &[String], dirs_only: bool) -> Vec<Entry> {
    let mut out = Vec::new();
    for name in names {
        let Some(e) = entry(source, Path::new(name)) else {
            continue;
        };
        let is_dir = e.kind == Kind::Dir;
        out.push(e);
        if !is_dir {
            continue;
        }
        let mut it = walkdir::WalkDir::new(source.join(name))
            .min_depth(1)
            .follow_links(false)
            .sort_by_file_name()
            .into_iter();
        while let Some(Ok(d)) = it.next() {
            let is_dir = d.file_type().is_dir();
            if dirs_only && !is_dir {
                continue;
            }
            let Ok(rel) = d.path().strip_prefix(source) else {
                continue;
            };
            match entry(source, rel) {
                Some(e) => out.push(e),
                None if is_dir => it.skip_current_dir(),
                None => {}
            }
        }
    }
    out
}

/// What the last full walk found, so the next run can check it with one `stat` per entry
/// instead of listing every directory: the directories it saw and the snapshot's key.
#[derive(Debug, Serialize, Deserialize)]
struct Index {
    source: PathBuf,
    names: Vec<String>,
    /// The top-level names, then every directory below: relative path and stamp (`None`:
    /// missing or unreadable then).
    checked: Vec<(PathBuf, Option<Entry>)>,
    key: String,
    /// [`ALWAYS_DIRS`] when the key was made (it is part of the key).
    #[serde(default)]
    always: Vec<String>,
    /// [`resolv_stamp`] when the key was made (part of the key).
    #[serde(default)]
    resolv: Option<(u64, i128, u32)>,
    /// Whether the key covers [`resolv_stamp`] (indexes from before do not).
    #[serde(default)]
    resolv_keyed: bool,
}

/// Stamps this close to now may still change within the same timestamp tick: an index
/// holding one is not written (the next run walks again), like git's racy-index rule.
const RACY_NS: i128 = 2_000_000_000;

/// Name the snapshot of the allowlisted `names` under `source` (normally /etc) from cheap
/// stamps: every top-level entry, and every directory below (a file added, removed or
/// replaced by rename changes its directory). Files edited in place inside a subdirectory keep
/// the old snapshot until something else changes.
///
/// The walk that finds the directories is remembered in the store (`etc-index.json`): while
/// every remembered entry has the same stamp, no directory gained or lost a subdirectory, so
/// a new walk would find the same list and the same key.
pub fn plan(source: &Path, names: &[&str], store: &Path) -> Snapshot {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let index_path = store.join("etc-index.json");
    let remembered = fs::read(&index_path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Index>(&b).ok())
        .filter(|i| i.source == source && i.names == names && i.always == ALWAYS_DIRS)
        .filter(|i| i.resolv_keyed && i.resolv == resolv_stamp(source))
        .filter(|i| {
            i.checked
                .iter()
                .all(|(rel, stamp)| entry(source, rel) == *stamp)
        });
    let key = match remembered {
        Some(i) => i.key,
        None => {
            let stamps = collect(source, &names, true);
            let key = format!(
                "{:x}",
                Sha256::digest(
                    serde_json::to_vec(&(source, &stamps, ALWAYS_DIRS, resolv_stamp(source)))
                        .unwrap_or_default()
                )
            );
            remember(source, &names, &stamps, &key, &index_path);
            key
        }
    };
    Snapshot {
        dir: store.join(format!("{}-etc", &key[..32])),
        source: source.to_path_buf(),
        names,
    }
}

fn remember(source: &Path, names: &[String], stamps: &[Entry], key: &str, path: &Path) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    if stamps.iter().any(|e| now - e.mtime_ns < RACY_NS) {
        return;
    }
    let top = names
        .iter()
        .map(|n| (PathBuf::from(n), entry(source, Path::new(n))));
    let below = stamps
        .iter()
        .filter(|e| e.kind == Kind::Dir && e.rel.components().count() > 1)
        .map(|e| (e.rel.clone(), Some(e.clone())));
    let index = Index {
        source: source.to_path_buf(),
        names: names.to_vec(),
        checked: top.chain(below).collect(),
        key: key.to_string(),
        always: ALWAYS_DIRS.iter().map(|d| d.to_string()).collect(),
        resolv: resolv_stamp(source),
        resolv_keyed: true,
    };
    let Ok(bytes) = serde_json::to_vec(&index) else {
        return;
    };
    let _ = crate::atomic::write_atomic(path, &bytes);
}

/// Write the snapshot unless the store has it (see `store::realise`).
pub fn realise(s: &Snapshot) -> io::Result<()> {
    super::store::realise(&s.dir, |tmp| copy_entries(s, tmp)).map(|_| ())
}

fn copy_entries(s: &Snapshot, to: &Path) -> io::Result<()> {
    let entries = collect(&s.source, &s.names, false);
    for e in &entries {
        let dst = to.join(&e.rel);
        match &e.kind {
            Kind::Dir => fs::create_dir_all(&dst)?,
            Kind::File => {
                fs::copy(s.source.join(&e.rel), &dst)?;
                fs::set_permissions(&dst, fs::Permissions::from_mode(e.mode & 0o755))?;
            }
            Kind::Symlink(target) => symlink(target, &dst)?,
        }
    }
    // resolv.conf: a regular file holding what the host's resolves to (see [`RESOLV`]).
    let resolv = to.join(RESOLV);
    if fs::symlink_metadata(&resolv).is_ok_and(|m| !m.is_file()) {
        fs::remove_file(&resolv)?;
    }
    if !resolv.exists() {
        // Like every entry: only a regular file anyone may read (nothing root-only ends up in
        // a user's cache; no FIFO or device is opened).
        let mut text = Vec::new();
        let host = s.source.join(RESOLV);
        if fs::metadata(&host).is_ok_and(|m| m.is_file() && m.mode() & 0o004 != 0) {
            if let Ok(f) = fs::File::open(&host) {
                use std::io::Read;
                let _ = f.take(RESOLV_MAX).read_to_end(&mut text);
            }
        }
        fs::write(&resolv, text)?;
        fs::set_permissions(&resolv, fs::Permissions::from_mode(0o644))?;
    }
    // Mount points aisb may use inside /etc, present whether or not the host has them.
    for dir in ALWAYS_DIRS {
        let p = to.join(dir);
        if !p.exists() {
            fs::create_dir(&p)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755))?;
        }
    }
    // Directory modes last: a read-only directory would have refused its own contents.
    for e in entries.iter().rev().filter(|e| e.kind == Kind::Dir) {
        fs::set_permissions(to.join(&e.rel), fs::Permissions::from_mode(e.mode & 0o755))?;
    }
    fs::set_permissions(to, fs::Permissions::from_mode(0o755))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set every entry's times an hour back, out of the racy window.
    fn backdate(root: &Path) {
        let past = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        for e in walkdir::WalkDir::new(root).contents_first(true) {
            let e = e.unwrap();
            if !e.path_is_symlink() {
                let f = fs::File::open(e.path()).unwrap();
                f.set_modified(past).unwrap();
            }
        }
    }

    #[test]
    fn the_index_skips_the_walk_until_a_directory_changes() {
        let t = tempfile::tempdir().unwrap();
        let etc = t.path().join("etc");
        fs::create_dir_all(etc.join("ssl/certs/java")).unwrap();
        fs::write(etc.join("hosts"), "127.0.0.1 localhost").unwrap();
        fs::write(etc.join("ssl/certs/ca.pem"), "CA").unwrap();
        backdate(&etc);
        let store = t.path().join("store");
        let names = ["hosts", "ssl", "resolv.conf"];
        let s1 = plan(&etc, &names, &store);
        let index = store.join("etc-index.json");
        let i: Index = serde_json::from_slice(&fs::read(&index).unwrap()).unwrap();
        let rels: Vec<_> = i.checked.iter().map(|(r, _)| r.clone()).collect();
        assert_eq!(
            rels,
            ["hosts", "ssl", "resolv.conf", "ssl/certs", "ssl/certs/java"].map(PathBuf::from),
            "top-level names (even missing ones), then every directory below"
        );
        assert_eq!(plan(&etc, &names, &store).dir, s1.dir);

        // The index's key is used as long as its stamps hold: prove it by planting one.
        let mut planted = i;
        planted.key = "f".repeat(64);
        fs::write(&index, serde_json::to_vec(&planted).unwrap()).unwrap();
        assert!(plan(&etc, &names, &store)
            .dir
            .ends_with(format!("{}-etc", "f".repeat(32))));

        // A file added two levels down changes its directory's stamp: walked again.
        fs::write(etc.join("ssl/certs/java/cacerts"), "J").unwrap();
        let s2 = plan(&etc, &names, &store);
        assert_ne!(s2.dir, s1.dir);
        assert!(!s2.dir.to_string_lossy().contains("ffffffff"));
        // A missing top-level name that appears is seen too.
        backdate(&etc);
        let s3 = plan(&etc, &names, &store);
        fs::write(etc.join("resolv.conf"), "nameserver 127.0.0.1").unwrap();
        assert_ne!(plan(&etc, &names, &store).dir, s3.dir);
        // A broken index is ignored.
        fs::write(&index, "{not json").unwrap();
        let s4 = plan(&etc, &names, &store);
        assert!(s4.dir.starts_with(&store));
    }

    /// resolv.conf is a regular file in every snapshot: empty without one on the host, the
    /// content of what a link resolves to (systemd-resolved's link into /run would dangle
    /// inside), and a new snapshot when the link's target changes though the link does not.
    #[test]
    fn resolv_conf_is_always_a_regular_file_with_what_the_host_resolves_to() {
        let t = tempfile::tempdir().unwrap();
        let etc = t.path().join("etc");
        fs::create_dir_all(&etc).unwrap();
        let store = t.path().join("store");
        let none = plan(&etc, &["resolv.conf"], &store);
        realise(&none).unwrap();
        let m = fs::symlink_metadata(none.dir.join("resolv.conf")).unwrap();
        assert!(m.is_file() && m.len() == 0, "{m:?}");
        let run = t.path().join("run");
        fs::create_dir_all(&run).unwrap();
        fs::write(run.join("stub-resolv.conf"), "nameserver 127.0.0.53\n").unwrap();
        symlink(run.join("stub-resolv.conf"), etc.join("resolv.conf")).unwrap();
        let linked = plan(&etc, &["resolv.conf"], &store);
        assert_ne!(linked.dir, none.dir);
        realise(&linked).unwrap();
        let f = linked.dir.join("resolv.conf");
        assert!(fs::symlink_metadata(&f).unwrap().is_file());
        assert_eq!(fs::read_to_string(&f).unwrap(), "nameserver 127.0.0.53\n");
        backdate(&etc);
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(run.join("stub-resolv.conf"), "nameserver 10.0.0.1\n").unwrap();
        let changed = plan(&etc, &["resolv.conf"], &store);
        assert_ne!(changed.dir, linked.dir, "the link's target changed");
        realise(&changed).unwrap();
        assert_eq!(
            fs::read_to_string(changed.dir.join("resolv.conf")).unwrap(),
            "nameserver 10.0.0.1\n"
        );
        // What only root may read is not copied, through a link or not.
        fs::set_permissions(
            run.join("stub-resolv.conf"),
            fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let private = plan(&etc, &["resolv.conf"], &store);
        realise(&private).unwrap();
        assert_eq!(fs::read(private.dir.join("resolv.conf")).unwrap(), b"");
    }

    #[test]
    fn snapshot_copies_only_world_readable_and_changes_with_the_host() {
        let t = tempfile::tempdir().unwrap();
        let etc = t.path().join("etc");
        fs::create_dir_all(etc.join("ssl/private")).unwrap();
        fs::create_dir_all(etc.join("ssl/certs")).unwrap();
        fs::write(etc.join("passwd"), "root:x:0:0").unwrap();
        fs::write(etc.join("shadow"), "secret").unwrap();
        fs::set_permissions(etc.join("shadow"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::write(etc.join("ssl/private/key.pem"), "KEY").unwrap();
        fs::set_permissions(etc.join("ssl/private"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(etc.join("ssl/certs/ca.pem"), "CA").unwrap();
        symlink("ca.pem", etc.join("ssl/certs/link.pem")).unwrap();
        let store = t.path().join("store");
        let s = plan(&etc, &["passwd", "shadow", "ssl", "missing"], &store);
        realise(&s).unwrap();
        assert_eq!(
            fs::read_to_string(s.dir.join("passwd")).unwrap(),
            "root:x:0:0"
        );
        assert!(
            !s.dir.join("shadow").exists(),
            "not world-readable: never copied"
        );
        assert!(
            !s.dir.join("ssl/private").exists(),
            "unreadable dir: skipped with its contents"
        );
        assert_eq!(
            fs::read_to_string(s.dir.join("ssl/certs/link.pem")).unwrap(),
            "CA"
        );
        assert_eq!(
            plan(&etc, &["passwd", "shadow", "ssl"], &store).dir,
            s.dir,
            "same host, same snapshot"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(etc.join("passwd"), "root:x:0:0\nnew:x:1:1").unwrap();
        let s2 = plan(&etc, &["passwd", "shadow", "ssl"], &store);
        assert_ne!(s2.dir, s.dir, "a changed host file gives a new snapshot");
        realise(&s2).unwrap();
        assert!(fs::read_to_string(s2.dir.join("passwd"))
            .unwrap()
            .contains("new:x"));
        fs::write(etc.join("ssl/certs/added.pem"), "NEW").unwrap();
        let s3 = plan(&etc, &["passwd", "shadow", "ssl"], &store);
        assert_ne!(
            s3.dir, s2.dir,
            "a file added below the top level gives a new snapshot"
        );
        realise(&s3).unwrap();
        assert_eq!(
            fs::read_to_string(s3.dir.join("ssl/certs/added.pem")).unwrap(),
            "NEW"
        );
    }
}
