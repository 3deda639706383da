//! The dynamic blocklist: which paths of the project are masked, computed once from git and
//! cached.
//!
//! Cold: `git ls-files` lists tracked + untracked files and (collapsed) ignored entries,
//! `git check-attr` finds git-crypt files when some `.gitattributes` mentions git-crypt, and one
//! walk of the tree records every directory's mtime. Warm: the cached result is reused when no
//! recorded directory or git control file changed (like git's own untracked cache: creating,
//! renaming or deleting a file changes its directory's mtime). Entries modified within
//! `RACY_NS` of the scan are never trusted, so a change racing the scan forces a rescan.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::masks::PatternSet;

const CACHE_VERSION: u32 = 6;
const RACY_NS: i128 = 100_000_000;
/// From this many recorded stamps on, two threads check them.
const PARALLEL_STAMPS: usize = 4096;
/// A project bigger than this without git is almost certainly a mistake (`/` or `$HOME`).
const MAX_WALK_ENTRIES: usize = 1_000_000;

/// What to mask, as configured.
pub struct ScanRules<'a> {
    /// (pattern, rule name) pairs from `block` and the default sensitive set.
    pub block: &'a PatternSet,
    pub block_rule: &'a dyn Fn(&str) -> String,
    pub allow: &'a PatternSet,
    pub tool_dirs: &'a PatternSet,
    /// Dependency and build-output directories (exempt from the gitignored layer, written
    /// copy-on-write), caches (private and empty inside), and what is masked inside them
    /// instead of `block` (see [`super::deps`]).
    pub roles: &'a super::deps::RoleRules,
    pub gitignored: bool,
    pub git_crypt: bool,
    /// Hash of everything above, part of the cache key.
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Masked {
    /// Relative to the project root, `/`-separated, raw bytes (a name need not be UTF-8).
    #[serde(with = "rel_text")]
    pub rel: Vec<u8>,
    pub dir: bool,
    pub rule: String,
}

/// What an ignored directory is for, when it is not a secret (see [`super::deps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Installed dependencies or build outputs: the host's content, written copy-on-write.
    Dependency,
    /// A cache or report: private and empty inside.
    Cache,
}

/// A directory git ignores as a whole that has a role, with the pattern that gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleDir {
    #[serde(with = "rel_text")]
    pub rel: Vec<u8>,
    pub role: Role,
    pub pattern: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScanResult {
    pub masks: Vec<Masked>,
    /// Ignored directories with a role, outermost only, none below a mask.
    #[serde(default)]
    pub roles: Vec<RoleDir>,
    pub notes: Vec<String>,
    pub git: bool,
    pub entries_seen: usize,
    /// Files and directories the host's tools obey found below the project's top
    /// (`eval::protect::nested`), outermost only: bound read-only inside.
    #[serde(default)]
    pub nested_protected: Vec<Nested>,
    /// Every directory of the project the scan looked at (not the git dir, not below a
    /// mask), `""` for the top: where a run's end looks for protected names it created.
    /// With each its inode when the scan saw it: a directory under a known name with another
    /// inode was put there since (renamed in), and is looked at as a new one.
    #[serde(skip)]
    pub dirs: Vec<(Vec<u8>, u64)>,
    #[serde(skip)]
    pub from_cache: bool,
}

/// A protected name below the project's top (see `eval::protect::nested`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Nested {
    #[serde(with = "rel_text")]
    pub rel: Vec<u8>,
    pub dir: bool,
}

/// The protected names among `rels`, each once: `protect::nested` gives the outermost one a
/// path is in, so none is inside another.
fn nested_protected<'a>(rels: impl Iterator<Item = &'a [u8]>) -> Vec<Nested> {
    let found: BTreeSet<Nested> = rels
        .filter_map(|rel| {
            let (len, dir, _) = super::protect::nested(rel)?;
            Some(Nested {
                rel: rel[..len].to_vec(),
                dir,
            })
        })
        .collect();
    found.into_iter().collect()
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("could not run git in {root}: {source}")]
    Git {
        root: PathBuf,
        source: std::io::Error,
    },
    #[error("`git {args}` failed in {root}: {stderr}")]
    GitFailed {
        root: PathBuf,
        args: String,
        stderr: String,
    },
    #[error("could not read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{root} has more than {MAX_WALK_ENTRIES} entries and is not a git repository")]
    TooBig { root: PathBuf },
}

#[derive(Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    key: String,
    scan_start_ns: i128,
    /// (path relative to root or absolute, stamp); stamp `None` = did not exist.
    stamps: Vec<(Rel, Option<Stamp>)>,
    result: ScanResult,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    // Short names: a big repository records 50,000 of these.
    #[serde(rename = "m")]
    mtime_ns: i128,
    /// The sandbox can set a directory's mtime back (`touch -d`) after the host wrote a secret
    /// into it; never its ctime, which any change moves to now.
    #[serde(rename = "c")]
    ctime_ns: i128,
    #[serde(rename = "s")]
    size: u64,
    #[serde(rename = "i")]
    ino: u64,
    #[serde(rename = "d", default)]
    dir: bool,
}

fn stamp(root: &std::os::fd::OwnedFd, rel: &[u8]) -> Option<Stamp> {
    use rustix::fs::{statat, AtFlags};
    // Relative to the project's descriptor: one lookup per recorded directory, not a walk
    // from `/` (50,000 of them in a big repository). An absolute path (a global excludes
    // file) is found from `/` either way.
    let m = statat(
        root,
        os(rel),
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::EMPTY_PATH,
    )
    .ok()?;
    Some(Stamp {
        mtime_ns: m.st_mtime as i128 * 1_000_000_000 + m.st_mtime_nsec as i128,
        ctime_ns: m.st_ctime as i128 * 1_000_000_000 + m.st_ctime_nsec as i128,
        size: m.st_size as u64,
        ino: m.st_ino as u64,
        dir: rustix::fs::FileType::from_raw_mode(m.st_mode) == rustix::fs::FileType::Directory,
    })
}

/// The project's root, opened once to stamp what is below it.
fn open_root(root: &Path) -> Option<std::os::fd::OwnedFd> {
    use rustix::fs::{open, Mode, OFlags};
    open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// A path's bytes as JSON text: valid UTF-8 as it is, `%` and every other byte as `%XX`
/// (a name need not be UTF-8; an array of numbers was four times the size to read back).
mod rel_text {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn encode(b: &[u8]) -> String {
        let mut out = String::with_capacity(b.len());
        for chunk in b.utf8_chunks() {
            for c in chunk.valid().chars() {
                if c == '%' || c.is_control() {
                    let mut buf = [0; 4];
                    for byte in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("%{byte:02X}"));
                    }
                } else {
                    out.push(c);
                }
            }
            for byte in chunk.invalid() {
                out.push_str(&format!("%{byte:02X}"));
            }
        }
        out
    }

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(b))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        crate::vocab::percent_decode(&s)
            .ok_or_else(|| D::Error::custom("a bad %-escape in a cached path"))
    }
}

/// A recorded path, as [`rel_text`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Rel(#[serde(with = "rel_text")] Vec<u8>);

/// Now, in nanoseconds since the epoch (what the scan and a run's end compare times with).
pub(crate) fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// Scan `root` (or reuse the cache in `cache_dir`); a new cache goes to `memos`, unwritten.
pub fn scan(
    root: &Path,
    rules: &ScanRules<'_>,
    cache_dir: Option<&Path>,
    memos: &mut Vec<super::plan::Memo>,
) -> Result<ScanResult, ScanError> {
    let cache_path = cache_dir.map(|d| {
        let mut h = Sha256::new();
        h.update(root.as_os_str().as_encoded_bytes());
        h.update([0]);
        h.update(rules.key.as_bytes());
        d.join(format!("{:x}.json", h.finalize()))
    });
    if let Some(p) = &cache_path {
        if let Some(r) = load_cache(p, root, &rules.key) {
            return Ok(r);
        }
    }
    let start = now_ns();
    let git_dir = git_dir(root);
    let (result, mut stamped) = match &git_dir {
        Some(gd) => scan_git(root, gd, rules)?,
        None => scan_plain(root, rules)?,
    };
    if let Some(p) = &cache_path {
        stamped.sort();
        stamped.dedup();
        // No descriptor for the root: no cache (the next run scans again).
        let Some(fd) = open_root(root) else {
            return Ok(result);
        };
        let stamps = stamped
            .into_iter()
            .map(|rel| {
                let s = stamp(&fd, &rel);
                (Rel(rel), s)
            })
            .collect();
        let cache = CacheFile {
            version: CACHE_VERSION,
            key: rules.key.clone(),
            scan_start_ns: start,
            stamps,
            result: result.clone(),
        };
        if let Ok(bytes) = serde_json::to_vec(&cache) {
            memos.push(super::plan::Memo {
                path: p.clone(),
                bytes,
            });
        }
    }
    Ok(result)
}

/// `f` over `items`: from `threshold` items on, over each half on a thread of its own (both
/// joined before this returns, long before any fork), `on_panic` standing in for a half whose
/// thread panicked; on this thread alone below it, or when no thread can be had (a process
/// limit).
pub(crate) fn in_halves<T: Sync, R: Send>(
    items: &[T],
    threshold: usize,
    f: impl Fn(&[T]) -> R + Sync,
    on_panic: impl FnOnce(&[T]) -> R,
) -> Vec<R> {
    if items.len() < threshold {
        return vec![f(items)];
    }
    let (a, b) = items.split_at(items.len() / 2);
    std::thread::scope(
        |s| match std::thread::Builder::new().spawn_scoped(s, || f(b)) {
            Ok(other) => {
                let mine = f(a);
                vec![mine, other.join().unwrap_or_else(|_| on_panic(b))]
            }
            Err(_) => vec![f(a), f(b)],
        },
    )
}

fn load_cache(path: &Path, root: &Path, key: &str) -> Option<ScanResult> {
    let bytes = fs::read(path).ok()?;
    let cache: CacheFile = serde_json::from_slice(&bytes).ok()?;
    if cache.version != CACHE_VERSION || cache.key != key {
        return None;
    }
    let fd = open_root(root)?;
    let unchanged = |stamps: &[(Rel, Option<Stamp>)]| {
        stamps.iter().all(|(Rel(rel), recorded)| {
            stamp(&fd, rel) == *recorded
                && recorded
                    .is_none_or(|s| s.mtime_ns.max(s.ctime_ns) < cache.scan_start_ns - RACY_NS)
        })
    };
    // A big repository records tens of thousands of directories: two threads stat them
    // (a panicked half counts as changed).
    let fresh = in_halves(&cache.stamps, PARALLEL_STAMPS, unchanged, |_| false)
        .into_iter()
        .all(|f| f);
    if !fresh {
        return None;
    }
    let mut r = cache.result;
    r.from_cache = true;
    r.dirs = cache
        .stamps
        .into_iter()
        .filter(|(Rel(rel), _)| rel.first() != Some(&b'/'))
        .filter_map(|(Rel(rel), s)| s.filter(|s| s.dir).map(|s| (rel, s.ino)))
        .collect();
    Some(r)
}

/// The git dir of `root` when `root` is the top of a work tree (or inside one).
fn git_dir(root: &Path) -> Option<PathBuf> {
    let out = crate::git::discover(root)
        .args(["rev-parse", "--absolute-git-dir"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(PathBuf::from(
        String::from_utf8_lossy(&out.stdout).trim_end(),
    ))
}

fn git(root: &Path, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, ScanError> {
    // The project is the sandbox's to write: nothing its git configuration names may run here.
    let mut cmd = crate::git::for_work_tree(root);
    cmd.args(args);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| ScanError::Git {
        root: root.into(),
        source,
    })?;
    let writer = stdin.map(|input| {
        let mut w = child.stdin.take().expect("stdin piped");
        let input = input.to_vec();
        std::thread::spawn(move || w.write_all(&input))
    });
    let out = child.wait_with_output().map_err(|source| ScanError::Git {
        root: root.into(),
        source,
    })?;
    if let Some(w) = writer {
        let _ = w.join();
    }
    if !out.status.success() {
        return Err(ScanError::GitFailed {
            root: root.into(),
            args: args.join(" "),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out.stdout)
}

fn split_z(bytes: &[u8]) -> impl Iterator<Item = &[u8]> + '_ {
    bytes.split(|b| *b == 0).filter(|s| !s.is_empty())
}

fn bytes(p: &Path) -> &[u8] {
    std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())
}

fn os(b: &[u8]) -> &std::ffi::OsStr {
    std::os::unix::ffi::OsStrExt::from_bytes(b)
}

/// Collects masks, never masking beneath an already masked directory.
#[derive(Default)]
struct Collector {
    masks: BTreeMap<Vec<u8>, Masked>,
}

impl Collector {
    fn add(&mut self, rel: &[u8], dir: bool, rule: String) {
        self.masks.entry(rel.to_vec()).or_insert(Masked {
            rel: rel.to_vec(),
            dir,
            rule,
        });
    }

    fn finish(self) -> Vec<Masked> {
        // Drop entries under a masked directory: the directory mask hides them already.
        let mut out: Vec<Masked> = Vec::new();
        for m in self.masks.into_values() {
            let covered = out
                .iter()
                .rev()
                .take_while(|p| m.rel.starts_with(&p.rel))
                .any(|p| p.dir && below(&m.rel, &p.rel));
            if !covered {
                out.push(m);
            }
        }
        out
    }
}

/// Whether the project-relative `inner` is strictly below the directory `outer`.
pub fn below(inner: &[u8], outer: &[u8]) -> bool {
    inner.len() > outer.len() && inner.starts_with(outer) && inner[outer.len()] == b'/'
}

/// Directories seen so far, each with whether it is inside a dependency or cache directory
/// that git ignores as a whole (recorded as such when found): decided once per directory,
/// top down, never per file. A directory only named like one (a tracked `build/` with some
/// ignored files, any directory of a project without git) keeps every mask.
type Dirs = HashMap<Vec<u8>, bool>;

/// Whether `rel` is below a recorded role directory (or is one), recording every ancestor on
/// the way; each newly seen ancestor is checked against allow and the masks that apply there.
fn in_role_dir(
    rules: &ScanRules<'_>,
    dirs: &mut Dirs,
    col: &mut Collector,
    rel: &[u8],
    is_dir: bool,
) -> bool {
    let mut inside = false;
    for (i, c) in rel.iter().enumerate() {
        if *c == b'/' {
            let dir = &rel[..i];
            inside = match dirs.get(dir) {
                Some(d) => *d,
                None => {
                    dirs.insert(dir.to_vec(), inside);
                    if rules.allow.covers(dir, true).is_none() {
                        if let Some(p) = masks_at(rules, inside).matching(dir, true) {
                            col.add(dir, true, (rules.block_rule)(p));
                        }
                    }
                    inside
                }
            };
        }
    }
    if is_dir {
        if let Some(d) = dirs.get(rel) {
            return *d;
        }
    }
    inside
}

fn masks_at<'r>(rules: &'r ScanRules<'_>, in_role: bool) -> &'r PatternSet {
    if in_role {
        &rules.roles.dep_block
    } else {
        rules.block
    }
}

/// Role directories outermost first, without any inside another or below a masked directory
/// (the mask or the outer one decides there).
fn outside_masks(mut roles: Vec<RoleDir>, masks: &[Masked]) -> Vec<RoleDir> {
    roles.sort_by(|a, b| a.rel.cmp(&b.rel));
    let mut out: Vec<RoleDir> = Vec::new();
    for r in roles {
        let covered = out.iter().any(|o| below(&r.rel, &o.rel))
            || masks
                .iter()
                .any(|m| m.rel == r.rel || (m.dir && below(&r.rel, &m.rel)));
        if !covered {
            out.push(r);
        }
    }
    out
}

/// Check one path (and its not-yet-checked ancestor dirs) against allow and block (inside a
/// dependency directory: against the credential patterns).
fn classify(rules: &ScanRules<'_>, dirs: &mut Dirs, col: &mut Collector, rel: &[u8], is_dir: bool) {
    if is_dir && dirs.contains_key(rel) {
        return;
    }
    let in_role = in_role_dir(rules, dirs, col, rel, is_dir);
    if is_dir {
        dirs.insert(rel.to_vec(), in_role);
    }
    if rules.allow.covers(rel, is_dir).is_some() {
        return;
    }
    if let Some(p) = masks_at(rules, in_role).matching(rel, is_dir) {
        col.add(rel, is_dir, (rules.block_rule)(p));
    }
}

fn scan_git(
    root: &Path,
    git_dir: &Path,
    rules: &ScanRules<'_>,
) -> Result<(ScanResult, Vec<Vec<u8>>), ScanError> {
    let mut col = Collector::default();
    let mut dirs = Dirs::new();
    let mut roles: Vec<RoleDir> = Vec::new();
    let mut notes = Vec::new();
    let mut entries_seen = 0;

    let visible = git(
        root,
        &[
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
        None,
    )?;
    let mut attr_files: Vec<&[u8]> = Vec::new();
    let mut tracked_or_visible: Vec<&[u8]> = Vec::new();
    for rel in split_z(&visible) {
        entries_seen += 1;
        classify(rules, &mut dirs, &mut col, rel, false);
        if rel == b".gitattributes" || rel.ends_with(b"/.gitattributes") {
            attr_files.push(rel);
        }
        tracked_or_visible.push(rel);
    }

    let mut ignored_args = vec![
        "ls-files",
        "-z",
        "--others",
        "--ignored",
        "--exclude-standard",
    ];
    if rules.gitignored {
        ignored_args.push("--directory");
    }
    let ignored = git(root, &ignored_args, None)?;
    let mut ignored_policy: Vec<Vec<u8>> = Vec::new();
    for entry in split_z(&ignored) {
        entries_seen += 1;
        let is_dir = entry.ends_with(b"/");
        let rel = entry.strip_suffix(b"/").unwrap_or(entry);
        if rel.is_empty() {
            continue;
        }
        let exempt = rules.allow.covers(rel, is_dir).is_some()
            || rules.tool_dirs.covers(rel, is_dir).is_some();
        // A dependency or cache directory that git ignores as a whole is the project's, not
        // a secret: exempt from the gitignored layer, and its own name still checked against
        // `block` (a mask on it wins: `outside_masks`).
        let own = if rules.gitignored && is_dir {
            rules.roles.role_of(rel)
        } else {
            None
        };
        let inside = rules.gitignored && in_role_dir(rules, &mut dirs, &mut col, rel, is_dir);
        if rules.gitignored && !exempt && own.is_none() && !inside {
            col.add(rel, is_dir, "gitignored".into());
            continue;
        }
        if let (Some((role, pattern)), false) = (own, inside) {
            classify(rules, &mut dirs, &mut col, rel, true);
            roles.push(RoleDir {
                rel: rel.to_vec(),
                role,
                pattern: pattern.to_string(),
            });
            if role == Role::Cache {
                // Private and empty inside: nothing of the host's to check.
                continue;
            }
            dirs.insert(rel.to_vec(), true);
        }
        // Visible although git ignores it: a policy name there is bound read-only like a
        // tracked one (not inside a dependency directory, whose writes stay in a layer).
        let policy_here = own.is_none() && !inside;
        if is_dir {
            // An exempt ignored dir (a tool dir such as `.claude/`, a dependency dir): check
            // what is inside.
            classify(rules, &mut dirs, &mut col, rel, true);
            let dir = root.join(os(rel));
            walk(&dir, &mut |sub, sub_dir| {
                let r = [rel, b"/", bytes(sub)].concat();
                entries_seen += 1;
                if policy_here && super::protect::nested(&r).is_some() {
                    ignored_policy.push(r.clone());
                }
                classify(rules, &mut dirs, &mut col, &r, sub_dir);
            })?;
        } else {
            if policy_here && super::protect::nested(rel).is_some() {
                ignored_policy.push(rel.to_vec());
            }
            classify(rules, &mut dirs, &mut col, rel, false);
        }
    }
    if !rules.gitignored {
        notes.push(
            "gitignored layer off: ignored files are masked only when a pattern matches".into(),
        );
    }

    if rules.git_crypt {
        let mentions = attr_files.iter().any(|f| {
            fs::read(root.join(os(f))).is_ok_and(|b| b.windows(9).any(|w| w == b"git-crypt"))
        }) || fs::read(git_dir.join("info/attributes"))
            .is_ok_and(|b| b.windows(9).any(|w| w == b"git-crypt"));
        if mentions {
            let mut input = Vec::new();
            for f in &tracked_or_visible {
                input.extend_from_slice(f);
                input.push(0);
            }
            let out = git(
                root,
                &["check-attr", "-z", "--stdin", "filter"],
                Some(&input),
            )?;
            let fields: Vec<&[u8]> = split_z(&out).collect();
            for chunk in fields.chunks(3) {
                if let [path, _attr, value] = chunk {
                    if *value == b"git-crypt" && rules.allow.covers(*path, false).is_none() {
                        col.add(path, false, "git-crypt".into());
                    }
                }
            }
        }
    }

    let masks = col.finish();
    let roles = outside_masks(roles, &masks);
    // Record every directory not hidden by a mask or a cache's private one, and git's
    // control files.
    let masked_dirs: BTreeSet<&[u8]> = masks
        .iter()
        .filter(|m| m.dir)
        .map(|m| m.rel.as_slice())
        .chain(
            roles
                .iter()
                .filter(|r| r.role == Role::Cache)
                .map(|r| r.rel.as_slice()),
        )
        .collect();
    let git_rel = git_dir.strip_prefix(root).ok().map(bytes);
    let dirs = walk_dirs(root, &masked_dirs, git_rel)?;
    let mut stamped: Vec<Vec<u8>> = dirs.iter().map(|(d, _)| d.clone()).collect();
    let nested_protected = nested_protected(
        tracked_or_visible
            .iter()
            .copied()
            .chain(ignored_policy.iter().map(Vec::as_slice))
            .chain(dirs.iter().map(|(d, _)| d.as_slice())),
    );
    for f in ["index", "HEAD", "info/exclude", "info/attributes", "config"] {
        stamped.push(bytes(&git_dir.join(f)).to_vec());
    }
    for f in &attr_files {
        stamped.push(f.to_vec());
    }
    for f in &tracked_or_visible {
        if *f == b".gitignore" || f.ends_with(b"/.gitignore") {
            stamped.push(f.to_vec());
        }
    }
    if let Some(global) = global_excludes() {
        stamped.push(bytes(&global).to_vec());
    }
    Ok((
        ScanResult {
            masks,
            roles,
            notes,
            git: true,
            entries_seen,
            nested_protected,
            dirs,
            from_cache: false,
        },
        stamped,
    ))
}

fn global_excludes() -> Option<PathBuf> {
    let out = crate::git::discover(Path::new("/"))
        .args(["config", "--global", "--path", "core.excludesFile"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !s.is_empty() {
        return Some(PathBuf::from(s));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("git/ignore"))
}

fn scan_plain(root: &Path, rules: &ScanRules<'_>) -> Result<(ScanResult, Vec<Vec<u8>>), ScanError> {
    let mut col = Collector::default();
    let mut dirs = Dirs::new();
    let mut entries_seen = 0usize;
    let mut too_big = false;
    let mut policy: Vec<Vec<u8>> = Vec::new();
    walk(root, &mut |rel, is_dir| {
        entries_seen += 1;
        if entries_seen > MAX_WALK_ENTRIES {
            too_big = true;
            return;
        }
        if super::protect::nested(bytes(rel)).is_some() {
            policy.push(bytes(rel).to_vec());
        }
        classify(rules, &mut dirs, &mut col, bytes(rel), is_dir);
    })?;
    let nested_protected = nested_protected(policy.iter().map(Vec::as_slice));
    if too_big {
        return Err(ScanError::TooBig { root: root.into() });
    }
    let masks = col.finish();
    let masked_dirs: BTreeSet<&[u8]> = masks
        .iter()
        .filter(|m| m.dir)
        .map(|m| m.rel.as_slice())
        .collect();
    let dirs = walk_dirs(root, &masked_dirs, None)?;
    let stamped: Vec<Vec<u8>> = dirs.iter().map(|(d, _)| d.clone()).collect();
    let notes =
        vec!["not a git repository: the gitignored and git-crypt layers do not apply".to_string()];
    Ok((
        ScanResult {
            masks,
            roles: Vec::new(),
            notes,
            git: false,
            entries_seen,
            nested_protected,
            dirs,
            from_cache: false,
        },
        stamped,
    ))
}

/// Walk `dir`, calling `f(relative path, is_dir)` for every entry (not following symlinks).
fn walk(dir: &Path, f: &mut dyn FnMut(&Path, bool)) -> Result<(), ScanError> {
    for entry in walkdir::WalkDir::new(dir).min_depth(1).follow_links(false) {
        let entry = match entry {
            Ok(e) => e,
            Err(e)
                if e.io_error()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied) =>
            {
                continue
            }
            Err(e) => {
                return Err(ScanError::Io {
                    path: e.path().unwrap_or(dir).to_path_buf(),
                    source: e.into(),
                })
            }
        };
        if let Ok(rel) = entry.path().strip_prefix(dir) {
            f(rel, entry.file_type().is_dir());
        }
    }
    Ok(())
}

/// `root` (as `""`) and every directory under it except the git dir and masked directories,
/// each with its inode.
fn walk_dirs(
    root: &Path,
    masked: &BTreeSet<&[u8]>,
    git_rel: Option<&[u8]>,
) -> Result<Vec<(Vec<u8>, u64)>, ScanError> {
    use std::os::unix::fs::MetadataExt;
    use walkdir::DirEntryExt;
    let mut out = vec![(Vec::new(), fs::metadata(root).map_or(0, |m| m.ino()))];
    let mut it = walkdir::WalkDir::new(root)
        .min_depth(1)
        .follow_links(false)
        .into_iter();
    while let Some(entry) = it.next() {
        let entry = match entry {
            Ok(e) => e,
            Err(_) => continue,
        };
        if !entry.file_type().is_dir() {
            continue;
        }
        let rel = entry.path().strip_prefix(root).unwrap_or(Path::new(""));
        let raw = bytes(rel);
        if masked.contains(raw) || Some(raw) == git_rel || raw == b".git" {
            it.skip_current_dir();
            continue;
        }
        // The inode as stat(2) gives it, as the end of a run compares it: a readdir's d_ino can
        // differ on overlayfs and under a mount point.
        let ino = entry.metadata().map_or(entry.ino(), |m| m.ino());
        out.push((raw.to_vec(), ino));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::rel_text::encode;
    use crate::vocab::percent_decode as decode;

    #[test]
    fn cached_paths_read_back_as_the_same_bytes() {
        for b in [
            &b"d0/secret.txt"[..],
            b"",
            b"100%/x",
            b"%41",
            b"caf\xc3\xa9/\xe2\x82\xac",
            b"bad\xff\xfe/name\xc3",
            b"tab\there\nnew\x7f",
        ] {
            let text = encode(b);
            assert!(!text.chars().any(char::is_control), "{text:?}");
            assert_eq!(decode(&text).as_deref(), Some(b), "{text:?}");
        }
        assert_eq!(encode(b"d0/secret.txt"), "d0/secret.txt");
        assert_eq!(encode(b"caf\xc3\xa9"), "café");
        assert_eq!(decode("%4"), None);
        assert_eq!(decode("%zz"), None);
        assert_eq!(decode("%+f"), None);
        assert_eq!(decode("%e2%82"), Some(vec![0xe2, 0x82]));
    }
}
