//! The content hashes of COPY sources, remembered by each file's identity, so a sandbox on an
//! image does not read and hash its whole build context at every start (`COPY . /src` of a
//! large project). The hash of a node never contains these stat fields: they only decide
//! whether a remembered content hash still holds.
//!
//! A file's remembered hash is used while its device, inode, size, mtime and ctime are all
//! unchanged. A write to a file always moves its ctime, which no user can set back; a file
//! changed less than [`RACY`] before it was hashed is not remembered at all, since a second
//! write in the same timestamp tick would leave every field as it was (git's "racily clean").

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// How recent a change must be for its hash not to be remembered.
const RACY: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stat {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stat {
    fn of(m: &fs::Metadata) -> Stat {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Stat {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    stat: Stat,
    sha256: String,
}

/// Remembered hashes for one build context, loaded once per build plan and saved after it
/// with only the files it saw (so files gone from the project are forgotten).
#[derive(Debug)]
pub struct StatCache {
    path: Option<PathBuf>,
    racy: Duration,
    old: BTreeMap<PathBuf, Entry>,
    seen: BTreeMap<PathBuf, Entry>,
    hits: usize,
    misses: usize,
}

impl Default for StatCache {
    fn default() -> StatCache {
        StatCache {
            path: None,
            racy: RACY,
            old: BTreeMap::new(),
            seen: BTreeMap::new(),
            hits: 0,
            misses: 0,
        }
    }
}

impl StatCache {
    /// The cache in `file`; an unreadable or damaged one is an empty cache.
    pub fn load(file: PathBuf) -> StatCache {
        let old = fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        StatCache {
            path: Some(file),
            old,
            ..StatCache::default()
        }
    }

    /// A cache that remembers nothing (tests, one-off hashing).
    pub fn none() -> StatCache {
        StatCache::default()
    }

    /// The sha256 (hex) of the file at `path` whose metadata is `m`: remembered, or read.
    pub fn sha256(&mut self, path: &Path, m: &fs::Metadata) -> std::io::Result<String> {
        let stat = Stat::of(m);
        if let Some(e) = self.old.get(path).filter(|e| e.stat == stat) {
            self.hits += 1;
            let sha256 = e.sha256.clone();
            self.seen.insert(path.to_path_buf(), e.clone());
            return Ok(sha256);
        }
        self.misses += 1;
        let sha256 = super::layer::file_sha256(path)?;
        // A time before 1970 counts as far in the future: never settled, never remembered.
        let latest = u64::try_from(stat.ctime_ns.max(stat.mtime_ns)).unwrap_or(u64::MAX);
        let changed = UNIX_EPOCH + Duration::from_nanos(latest);
        let settled = SystemTime::now()
            .duration_since(changed)
            .is_ok_and(|age| age >= self.racy);
        if settled {
            self.seen.insert(
                path.to_path_buf(),
                Entry {
                    stat,
                    sha256: sha256.clone(),
                },
            );
        }
        Ok(sha256)
    }

    /// Files whose hash was remembered, and files read.
    pub fn counts(&self) -> (usize, usize) {
        (self.hits, self.misses)
    }

    /// Write what this build saw, when it differs from what was loaded. Failing to write a
    /// cache costs only time, so errors are ignored.
    pub fn save(self) {
        let Some(path) = self.path else { return };
        let same = self.old.len() == self.seen.len()
            && self
                .old
                .iter()
                .zip(&self.seen)
                .all(|((a, x), (b, y))| a == b && x.stat == y.stat);
        if same {
            return;
        }
        if let Some(dir) = path.parent() {
            let _ = fs::create_dir_all(dir);
        }
        if let Ok(bytes) = serde_json::to_vec(&self.seen) {
            let _ = crate::atomic::write_atomic(&path, &bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_hash_holds_only_while_the_file_is_unchanged() {
        let t = tempfile::tempdir().unwrap();
        let (f, file) = (t.path().join("f"), t.path().join("cache.json"));
        fs::write(&f, "one").unwrap();
        let meta = || fs::symlink_metadata(&f).unwrap();
        let one = StatCache::none().sha256(&f, &meta()).unwrap();
        let load = |racy: Duration| StatCache {
            racy,
            ..StatCache::load(file.clone())
        };

        // Just written: not remembered (a second write in the same tick would go unseen).
        let mut c = load(RACY);
        assert_eq!(c.sha256(&f, &meta()).unwrap(), one);
        c.save();
        let mut c = load(RACY);
        c.sha256(&f, &meta()).unwrap();
        assert_eq!(c.counts(), (0, 1), "a racily clean file was remembered");

        // Settled (here: at once): remembered, and used while nothing changes.
        let mut c = load(Duration::ZERO);
        c.sha256(&f, &meta()).unwrap();
        c.save();
        let mut c = load(Duration::ZERO);
        assert_eq!(c.sha256(&f, &meta()).unwrap(), one);
        assert_eq!(c.counts(), (1, 0));
        c.save();

        // Any write moves the ctime, even one that puts the mtime back: read again (after a
        // pause longer than a timestamp tick, which is what `RACY` guards in real use).
        let before = meta().modified().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        fs::write(&f, "two").unwrap();
        fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(before)
            .unwrap();
        let mut c = load(Duration::ZERO);
        let two = c.sha256(&f, &meta()).unwrap();
        assert_ne!(two, one);
        assert_eq!(c.counts(), (0, 1));
    }
}
