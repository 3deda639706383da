//! The sandbox's /etc: a snapshot of the allowlisted, world-readable entries of the host's
//! /etc, mounted with one read-only bind (instead of one mount per entry, which costs ~0.2 ms
//! each in bubblewrap). Its hash covers every entry's stamp, so any change on the host gives a
//! new snapshot; nothing that only root may read is ever copied.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Kind {
    Dir,
    File,
    Symlink(PathBuf),
}

#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// Relative to /etc.
    pub rel: PathBuf,
    pub kind: Kind,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i128,
}

#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// Where the snapshot lives in the store.
    pub dir: PathBuf,
    #[serde(skip)]
    pub source: PathBuf,
    #[serde(skip)]
    pub names: Vec<String>,
}

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

/// Name the snapshot of the allowlisted `names` under `source` (normally /etc) from cheap
/// stamps: every top-level entry, and every directory below (a file added, removed or
/// replaced by rename changes its directory). Files edited in place inside a subdirectory keep
/// the old snapshot until something else changes.
pub fn plan(source: &Path, names: &[&str], store: &Path) -> Snapshot {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let stamps = collect(source, &names, true);
    let key = format!(
        "{:x}",
        Sha256::digest(serde_json::to_vec(&(source, &stamps)).unwrap_or_default())
    );
    Snapshot {
        dir: store.join(format!("{}-etc", &key[..32])),
        source: source.to_path_buf(),
        names,
    }
}

/// Write the snapshot unless it exists (a temporary directory renamed into place).
pub fn realise(s: &Snapshot) -> io::Result<()> {
    if s.dir.is_dir() {
        return Ok(());
    }
    let parent = s.dir.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = parent.join(format!(".tmp-etc-{}-{nanos}", std::process::id()));
    fs::create_dir(&tmp)?;
    let result = copy_entries(s, &tmp).and_then(|()| fs::rename(&tmp, &s.dir));
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
        // Another aisb may have written the same snapshot first.
        if s.dir.is_dir() {
            return Ok(());
        }
    }
    result
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
    // Directory modes last: a read-only directory would have refused its own contents.
    for e in entries.iter().rev().filter(|e| e.kind == Kind::Dir) {
        fs::set_permissions(to.join(&e.rel), fs::Permissions::from_mode(e.mode & 0o755))?;
    }
    fs::set_permissions(to, fs::Permissions::from_mode(0o755))
}

#[cfg(test)]
mod tests {
    use super::*;

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
