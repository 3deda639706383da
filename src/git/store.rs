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
//! - for each withheld blob, a loose object under the blob's own name whose content is a line
//!   saying so. Git trusts a loose object's name without hashing it again (only `fsck` and a few
//!   parsers check), so trees, commits and the index keep naming the real blob, and `status`,
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
//! than [`MAX_PACKS`] packs, builds it whole. A version in use by a run (a shared lock) is
//! never removed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

use crate::eval::plan::LiveRules;

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
const MAX_PACKS: usize = 16;
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

/// The store for the git directory `host_git` (work tree `work_tree`), under `state_dir`,
/// built or brought up to date; `None` when no blob in the repository's history is at a masked
/// path (the host's objects are shown as they are).
pub fn prepare(
    state_dir: &Path,
    host_git: &Path,
    work_tree: &Path,
    rules: &LiveRules,
) -> Result<Option<Store>, StoreError> {
    let dir = state_dir.join(STORE_DIR).join(slug(host_git));
    std::fs::create_dir_all(&dir).map_err(io(format!("making {}", dir.display())))?;
    let key = change_key(host_git);
    let digest = rules_digest(rules);
    let record_path = dir.join("record.json");
    let read_record = || -> Record {
        std::fs::read(&record_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    // Reused without the build lock: a record is replaced atomically, and its version is
    // locked before it is trusted to exist.
    let record = read_record();
    if record.key == key && record.rules == digest {
        if let Some(store) = hold(&dir, &record)? {
            return Ok(Some(store));
        }
        if record.version.is_none() {
            return Ok(None);
        }
    }
    let build_lock = crate::runtime::lock_file(&dir.join("build.lock"))
        .map_err(io("opening the store's lock"))?;
    let _building = Flock::lock(build_lock, FlockArg::LockExclusive)
        .map_err(|(_, e)| io("locking the store")(e.into()))?;
    // Another run may have built it meanwhile.
    let record = read_record();
    if record.key == key && record.rules == digest {
        if let Some(store) = hold(&dir, &record)? {
            return Ok(Some(store));
        }
        if record.version.is_none() {
            return Ok(None);
        }
    }
    let tips = tips(host_git)?;
    let incremental = record.rules == digest
        && record.version.is_some()
        && record.packs < MAX_PACKS
        && !record.tips.is_empty();
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
    let mut packs = 0;
    let mut withheld = 0;
    if incremental {
        let old = dir.join(record.version.as_deref().unwrap_or_default());
        (packs, withheld) = link_version(&old.join(LAYER).join("objects"), &objects)?;
    }
    let since = if incremental { &record.tips[..] } else { &[] };
    let built = build(host_git, work_tree, rules, &tips, since, &objects)?;
    packs += built.packs;
    withheld += built.withheld;
    let new = if withheld == 0 {
        let _ = crate::beneath::remove_tree(&making);
        Record {
            key,
            rules: digest,
            version: None,
            tips,
            withheld: 0,
            packs: 0,
        }
    } else {
        opaque(&objects)?;
        crate::atomic::write_atomic(&making.join("lock"), b"")
            .map_err(io("writing the store's lock"))?;
        let at = dir.join(&version);
        std::fs::rename(&making, &at).map_err(io(format!("placing {}", at.display())))?;
        Record {
            key,
            rules: digest,
            version: Some(version),
            tips,
            withheld,
            packs,
        }
    };
    let text = serde_json::to_vec(&new).unwrap_or_default();
    crate::atomic::write_atomic(&record_path, &text).map_err(io("writing the store's record"))?;
    let held = hold(&dir, &new)?;
    sweep(&dir, new.version.as_deref());
    Ok(held)
}

/// The version `record` names, locked shared for the run; `None` when it has none or it is
/// gone.
fn hold(dir: &Path, record: &Record) -> Result<Option<Store>, StoreError> {
    let Some(version) = &record.version else {
        return Ok(None);
    };
    let at = dir.join(version);
    let Ok(f) = crate::runtime::lock_file(&at.join("lock")) else {
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
        let Ok(f) = crate::runtime::lock_file(&path.join("lock")) else {
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
    format!("{}", &format!("{h:x}")[..16])
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

/// The rules the store withholds by, as a digest: a change builds it whole.
fn rules_digest(rules: &LiveRules) -> String {
    let mut h = Sha256::new();
    h.update(b"aisb git store 1\0");
    for set in [
        &rules.block,
        &rules.allow,
        &rules.roles.dep_block,
        &rules.roles.deps,
        &rules.roles.caches,
        &rules.roles.not_deps,
    ] {
        for (p, d) in set.patterns().iter().zip(set.dir_only()) {
            h.update(p.as_bytes());
            h.update([0, u8::from(*d)]);
        }
        h.update([1]);
    }
    for r in &rules.roles.roots {
        h.update(r);
        h.update([0]);
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

/// Link the packs and placeholders of an earlier version into `to` (same file system):
/// (packs, placeholders).
fn link_version(from: &Path, to: &Path) -> Result<(usize, usize), StoreError> {
    let mut packs = 0;
    let mut loose = 0;
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
        if rel.starts_with("pack") {
            packs += usize::from(rel.extension().is_some_and(|x| x == "pack"));
        } else {
            loose += 1;
        }
    }
    Ok((packs, loose))
}

/// What one build added.
struct Built {
    packs: usize,
    withheld: usize,
}

/// Walk the objects reachable from `tips` (and the reflogs and index) but not from `since`,
/// pack every one but the blobs at masked paths into `objects/pack/`, and write a placeholder
/// for each of those.
fn build(
    git_dir: &Path,
    work_tree: &Path,
    rules: &LiveRules,
    tips: &[String],
    since: &[String],
    objects: &Path,
) -> Result<Built, StoreError> {
    let mut walk = super::command(git_dir, Some(work_tree))
        .args([
            "rev-list",
            "--objects",
            "--reflog",
            "--indexed-objects",
            "--ignore-missing",
            "--stdin",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io("running git rev-list"))?;
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
    let mut stdin = walk.stdin.take().expect("piped");
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    // Each object's type beside its name (`%(rest)`: the path rev-list printed).
    let walked = walk.stdout.take().expect("piped");
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
    let mut pack: Option<std::process::Child> = None;
    let pack_base = objects.join("pack").join("pack");
    let mut packed = 0usize;
    let mut withheld = Vec::new();
    let mut seen = 0usize;
    let reader = BufReader::new(typed.stdout.take().expect("piped"));
    for line in reader.split(b'\n') {
        let line = line.map_err(io("reading git's object list"))?;
        seen += 1;
        if seen > MAX_OBJECTS {
            let _ = typed.kill();
            let _ = walk.kill();
            if let Some(mut p) = pack.take() {
                let _ = p.kill();
                let _ = p.wait();
            }
            let _ = typed.wait();
            let _ = walk.wait();
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
        if kind == b"blob" && !path.is_empty() {
            if let Some(rule) = masked(rules, path) {
                withheld.push((oid.to_string(), path.to_vec(), rule));
                continue;
            }
        }
        let p = match &mut pack {
            Some(p) => p,
            None => pack.insert(
                super::command(git_dir, None)
                    .args(["pack-objects", "-q"])
                    .arg(&pack_base)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(io("running git pack-objects"))?,
            ),
        };
        let sink = p.stdin.as_mut().expect("piped");
        sink.write_all(oid.as_bytes())
            .and_then(|()| sink.write_all(b"\n"))
            .map_err(io("feeding git pack-objects"))?;
        packed += 1;
    }
    let _ = feeder.join();
    let walked = walk
        .wait_with_output()
        .map_err(io("waiting for git rev-list"))?;
    let typed = typed.wait().map_err(io("waiting for git cat-file"))?;
    if !walked.status.success() {
        return Err(StoreError::Git {
            what: "rev-list",
            detail: String::from_utf8_lossy(&walked.stderr).trim().to_string(),
        });
    }
    if !typed.success() {
        return Err(StoreError::Git {
            what: "cat-file",
            detail: typed.to_string(),
        });
    }
    let mut packs = 0;
    if let Some(mut p) = pack {
        drop(p.stdin.take());
        let out = p
            .wait_with_output()
            .map_err(io("waiting for git pack-objects"))?;
        if !out.status.success() {
            return Err(StoreError::Git {
                what: "pack-objects",
                detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        packs = usize::from(packed > 0);
    }
    for (oid, path, rule) in &withheld {
        placeholder(objects, oid, path, rule)?;
    }
    Ok(Built {
        packs,
        withheld: withheld.len(),
    })
}

/// The rule that masks the path `path` (as git names it, `/`-separated) or one of its
/// directories.
fn masked(rules: &LiveRules, path: &[u8]) -> Option<String> {
    if let Some(r) = rules.rule_for(path, false) {
        return Some(r);
    }
    path.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .find_map(|(i, _)| rules.rule_for(&path[..i], true))
}

/// The loose object standing for a withheld blob: its name, a line as its content.
fn placeholder(objects: &Path, oid: &str, path: &[u8], rule: &str) -> Result<(), StoreError> {
    let shown: String = String::from_utf8_lossy(&path[..path.len().min(MAX_NAME)])
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    let body = format!(
        "aisb: withheld: {shown} matches the mask rule {rule}, so its content is not in this sandbox's git objects (`aisb why {shown}` on the host explains)\n"
    );
    let mut raw = format!("blob {}\0", body.len()).into_bytes();
    raw.extend_from_slice(body.as_bytes());
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&raw).map_err(io("compressing a placeholder"))?;
    let bytes = z.finish().map_err(io("compressing a placeholder"))?;
    let dir = objects.join(&oid[..2]);
    std::fs::create_dir_all(&dir).map_err(io(format!("making {}", dir.display())))?;
    std::fs::write(dir.join(&oid[2..]), bytes).map_err(io("writing a placeholder"))
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
