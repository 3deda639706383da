//! The project as inotify sees it: one watch per directory, added by walking the tree through
//! directory descriptors (never a path: the sandbox can write the project, so any component
//! may be a symlink by the time we look), and the decisions each event leads to: mask this
//! path, or watch this new directory and look at what is already in it.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use rustix::fs::{openat2, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::eval::plan::LiveRules;

/// A path that appeared and must be masked inside, with the rule that matched it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Relative to the project, as the bytes of its name.
    pub rel: Vec<u8>,
    pub rule: String,
    pub dir: bool,
}

/// Filesystem timestamps come from a coarse clock: a change made just after the scan began
/// may carry a time a little before it.
const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// What each directory watch reports: an entry created or renamed in, a directory renamed
/// away (its watches then name stale paths), the directory itself gone.
fn watch_flags() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::MOVED_TO
        | WatchFlags::MOVED_FROM
        | WatchFlags::DELETE_SELF
        | WatchFlags::ONLYDIR
        | WatchFlags::EXCL_UNLINK
}

pub struct Tree {
    inotify: OwnedFd,
    root: OwnedFd,
    rules: LiveRules,
    /// Paths masked at start: never walked into, never asked for again by the walk.
    start_masked: HashSet<Vec<u8>>,
    dirs: HashMap<i32, Vec<u8>>,
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

fn io(e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

impl Tree {
    /// `project`: the host directory the sandbox sees as its project.
    pub fn new(
        project: &Path,
        rules: LiveRules,
        start_masked: HashSet<Vec<u8>>,
    ) -> std::io::Result<Tree> {
        let inotify = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)
            .map_err(io)?;
        let root = rustix::fs::open(
            project,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io)?;
        Ok(Tree {
            inotify,
            root,
            rules,
            start_masked,
            dirs: HashMap::new(),
        })
    }

    pub fn inotify(&self) -> &OwnedFd {
        &self.inotify
    }

    /// Open `rel` below the project without following any symlink on the way or at the end.
    fn open_beneath(&self, rel: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
        let rel = if rel.is_empty() { &b"."[..] } else { rel };
        openat2(
            &self.root,
            rel,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// Watch `rel` and everything below it, and ask for what is there that must be masked.
    /// `all`: look at every entry (a directory that just appeared); otherwise only at the
    /// entries of directories changed since the scan (whatever else is there, the start-up
    /// masks covered), and at every directory. Returns early when `stop` is set.
    pub fn walk(
        &mut self,
        rel: &[u8],
        all: bool,
        stop: &AtomicBool,
        out: &mut Vec<Request>,
    ) -> std::io::Result<()> {
        let since = self
            .rules
            .since
            .checked_sub(CLOCK_SLACK)
            .unwrap_or(UNIX_EPOCH);
        let mut stack = vec![rel.to_vec()];
        while let Some(dir) = stack.pop() {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let fd = match self.open_beneath(&dir, OFlags::RDONLY | OFlags::DIRECTORY) {
                Ok(fd) => fd,
                // Gone, replaced by a symlink or a file, or not ours to read: nothing to watch.
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP | Errno::XDEV | Errno::ACCESS) => {
                    continue
                }
                Err(e) => return Err(io(e)),
            };
            // The watch is on the directory this descriptor is, whatever its path is now.
            let wd = match inotify::add_watch(
                &self.inotify,
                format!("/proc/self/fd/{}", fd.as_raw_fd()),
                watch_flags(),
            ) {
                Ok(wd) => wd,
                Err(Errno::NOENT | Errno::NOTDIR | Errno::ACCESS) => continue,
                Err(e) => return Err(io(e)),
            };
            self.dirs.insert(wd, dir.clone());
            let changed = all
                || rustix::fs::fstat(&fd).is_ok_and(|st| {
                    let ctime = UNIX_EPOCH
                        + Duration::new(st.st_ctime.max(0) as u64, st.st_ctime_nsec as u32);
                    ctime >= since
                });
            let mut entries = match rustix::fs::Dir::read_from(&fd) {
                Ok(d) => d,
                Err(_) => continue,
            };
            while let Some(Ok(entry)) = entries.read() {
                let name = entry.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let mut kind = entry.file_type();
                if kind == FileType::Unknown {
                    kind = rustix::fs::statat(&fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                        .map_or(FileType::Unknown, |st| FileType::from_raw_mode(st.st_mode));
                }
                let is_dir = kind == FileType::Directory;
                let child = join(&dir, name);
                if self.start_masked.contains(&child) || (is_dir && name == b".git") {
                    continue;
                }
                let text = &child[..];
                if is_dir && self.rules.allow.covers(text, true).is_some() {
                    continue;
                }
                if is_dir || changed {
                    if let Some(rule) = self.rules.rule_for(text, is_dir) {
                        self.ask(child, rule, is_dir, out);
                        continue;
                    }
                }
                if is_dir {
                    stack.push(child);
                }
            }
        }
        Ok(())
    }

    /// Ask for a mask. Every event is a new directory entry (the old one's mask went with it),
    /// so nothing is skipped: a file the walk and an event both report is masked twice, which
    /// stacks a second identical mount and hides nothing more. (Skipping a (device, inode)
    /// seen before would miss a new file that reuses a freed inode number.)
    fn ask(&mut self, rel: Vec<u8>, rule: String, dir: bool, out: &mut Vec<Request>) {
        out.push(Request { rel, rule, dir });
    }

    /// Read what inotify has queued and decide. Returns when the queue is empty.
    pub fn events(&mut self, stop: &AtomicBool, out: &mut Vec<Request>) -> std::io::Result<()> {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 16384];
        let mut todo: Vec<(i32, ReadFlags, Vec<u8>)> = Vec::new();
        let mut overflow = false;
        {
            let mut reader = inotify::Reader::new(&self.inotify, &mut buf);
            loop {
                match reader.next() {
                    Ok(ev) => {
                        let flags = ev.events();
                        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                            overflow = true;
                            continue;
                        }
                        let name = ev
                            .file_name()
                            .map(|n| n.to_bytes().to_vec())
                            .unwrap_or_default();
                        todo.push((ev.wd(), flags, name));
                    }
                    Err(Errno::AGAIN) => break,
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(io(e)),
                }
            }
        }
        for (wd, flags, name) in todo {
            if flags.contains(ReadFlags::IGNORED) {
                self.dirs.remove(&wd);
                continue;
            }
            let Some(dir) = self.dirs.get(&wd) else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            let child = join(dir, &name);
            let is_dir = flags.contains(ReadFlags::ISDIR);
            if flags.contains(ReadFlags::MOVED_FROM) {
                if is_dir {
                    self.forget(&child);
                }
                continue;
            }
            if is_dir && name == b".git" {
                continue;
            }
            // A new entry at a path masked at start is a new file: the old mask went with the
            // old one (the kernel detaches mounts on a dentry that is unlinked or renamed over).
            let text = &child[..];
            if let Some(rule) = self.rules.rule_for(text, is_dir) {
                self.ask(child, rule, is_dir, out);
            } else if is_dir && self.rules.allow.covers(text, true).is_none() {
                // Created before its watch could exist: look at what is already in it.
                self.walk(&child, true, stop, out)?;
            }
        }
        if overflow {
            // Events were lost: look at everything again (what is masked already is skipped).
            self.walk(b"", true, stop, out)?;
        }
        Ok(())
    }

    /// A directory renamed away: its watches (and those below it) would report stale paths.
    fn forget(&mut self, rel: &[u8]) {
        let prefix = [rel, b"/"].concat();
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, d)| d.as_slice() == rel || d.starts_with(&prefix))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in gone {
            let _ = inotify::remove_watch(&self.inotify, wd);
            self.dirs.remove(&wd);
        }
    }

    pub fn watched(&self) -> usize {
        self.dirs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::masks::PatternSet;
    use std::time::SystemTime;

    /// `since` for a tree whose every directory must be looked at.
    fn epoch() -> SystemTime {
        UNIX_EPOCH
    }

    fn rules(since: SystemTime) -> LiveRules {
        LiveRules {
            block: PatternSet::new([".env", ".env.*", "*.dump", ".aws/", "id_rsa"]),
            allow: PatternSet::new([".env.example", "vendor/"]),
            explicit: ["*.dump".to_string()].into_iter().collect(),
            since,
            roles: crate::eval::deps::RoleRules {
                deps: PatternSet::new(["node_modules/"]),
                caches: PatternSet::new(["__pycache__/"]),
                not_deps: PatternSet::new(["build/"]),
                dep_block: PatternSet::new([".env"]),
                roots: vec![b"node_modules".to_vec()],
            },
        }
    }

    fn rels(out: &[Request]) -> Vec<(String, String, bool)> {
        let mut v: Vec<_> = out
            .iter()
            .map(|r| {
                (
                    String::from_utf8_lossy(&r.rel).into_owned(),
                    r.rule.clone(),
                    r.dir,
                )
            })
            .collect();
        v.sort();
        v
    }

    fn drain(t: &mut Tree) -> Vec<Request> {
        let stop = AtomicBool::new(false);
        let mut out = Vec::new();
        t.events(&stop, &mut out).unwrap();
        out
    }

    #[test]
    fn the_first_walk_finds_what_appeared_after_the_scan_and_skips_start_masks() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("src/.aws")).unwrap();
        std::fs::create_dir_all(p.join(".git/x")).unwrap();
        std::fs::write(p.join(".env"), "masked at start").unwrap();
        std::fs::write(p.join("src/.env.local"), "late").unwrap();
        std::fs::write(p.join(".env.example"), "allowed").unwrap();
        std::fs::write(p.join(".git/x/.env"), "in .git").unwrap();
        let start: HashSet<Vec<u8>> = [b".env".to_vec()].into_iter().collect();
        let mut t = Tree::new(p, rules(epoch()), start).unwrap();
        let mut out = Vec::new();
        t.walk(b"", false, &AtomicBool::new(false), &mut out)
            .unwrap();
        assert_eq!(
            rels(&out),
            vec![
                ("src/.aws".into(), "sensitive \".aws/\"".into(), true),
                (
                    "src/.env.local".into(),
                    "sensitive \".env.*\"".into(),
                    false
                ),
            ]
        );
        // Root and src are watched; .git and the masked .aws are not.
        assert_eq!(t.watched(), 2);
    }

    #[test]
    fn a_directory_unchanged_since_the_scan_is_not_looked_into() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(".env.local"), "old").unwrap();
        let later = SystemTime::now() + Duration::from_secs(60);
        let mut t = Tree::new(d.path(), rules(later), HashSet::new()).unwrap();
        let mut out = Vec::new();
        t.walk(b"", false, &AtomicBool::new(false), &mut out)
            .unwrap();
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn events_ask_for_new_files_renames_and_the_contents_of_new_directories() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("outside")).unwrap();
        std::fs::create_dir_all(p.join("proj/build")).unwrap();
        let proj = p.join("proj");
        let mut t = Tree::new(&proj, rules(SystemTime::now()), HashSet::new()).unwrap();
        let mut out = Vec::new();
        t.walk(b"", false, &AtomicBool::new(false), &mut out)
            .unwrap();
        assert!(out.is_empty());

        std::fs::write(proj.join(".env.local"), "x").unwrap();
        std::fs::write(p.join("outside/key"), "k").unwrap();
        std::fs::rename(p.join("outside/key"), proj.join("id_rsa")).unwrap();
        std::fs::write(proj.join("db.dump"), "rows").unwrap();
        std::fs::write(proj.join("build/out.txt"), "artifact").unwrap();
        std::fs::create_dir_all(proj.join("new/deeper")).unwrap();
        std::fs::write(proj.join("new/deeper/.env"), "x").unwrap();
        std::fs::create_dir_all(proj.join("vendor")).unwrap();
        std::fs::write(proj.join("vendor/.env"), "allowed").unwrap();
        // A symlink named like a secret is asked for as it is (the masker decides inside).
        std::os::unix::fs::symlink("README", proj.join(".env.link")).unwrap();
        assert_eq!(
            rels(&drain(&mut t)),
            vec![
                (".env.link".into(), "sensitive \".env.*\"".into(), false),
                (".env.local".into(), "sensitive \".env.*\"".into(), false),
                ("db.dump".into(), "block \"*.dump\"".into(), false),
                ("id_rsa".into(), "sensitive \"id_rsa\"".into(), false),
                ("new/deeper/.env".into(), "sensitive \".env\"".into(), false),
            ]
        );
        // The new directories are watched now.
        std::fs::write(proj.join("new/deeper/.env.prod"), "x").unwrap();
        assert_eq!(
            rels(&drain(&mut t)),
            vec![(
                "new/deeper/.env.prod".into(),
                "sensitive \".env.*\"".into(),
                false
            )]
        );
    }

    #[test]
    fn a_file_renamed_over_a_masked_one_is_asked_for_again() {
        let d = tempfile::tempdir().unwrap();
        let proj = d.path();
        let mut t = Tree::new(proj, rules(SystemTime::now()), HashSet::new()).unwrap();
        t.walk(b"", false, &AtomicBool::new(false), &mut Vec::new())
            .unwrap();
        std::fs::write(proj.join(".env"), "one").unwrap();
        assert_eq!(drain(&mut t).len(), 1);
        std::fs::write(proj.join(".env.tmp"), "two").unwrap();
        std::fs::rename(proj.join(".env.tmp"), proj.join(".env")).unwrap();
        let again = rels(&drain(&mut t));
        assert!(
            again.contains(&(".env".into(), "sensitive \".env\"".into(), false)),
            "{again:?}"
        );
    }

    #[test]
    fn a_file_deleted_and_created_again_is_asked_for_again() {
        // ext4 hands the freed inode number to the next file: nothing may be keyed on it.
        let d = tempfile::tempdir().unwrap();
        let proj = d.path();
        let mut t = Tree::new(proj, rules(SystemTime::now()), HashSet::new()).unwrap();
        t.walk(b"", false, &AtomicBool::new(false), &mut Vec::new())
            .unwrap();
        for _ in 0..3 {
            std::fs::write(proj.join(".env.late"), "x").unwrap();
            assert_eq!(drain(&mut t).len(), 1);
            std::fs::remove_file(proj.join(".env.late")).unwrap();
        }
    }

    #[test]
    fn a_directory_renamed_away_is_forgotten_and_renamed_in_is_walked() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("proj/a")).unwrap();
        std::fs::create_dir_all(p.join("elsewhere/cfg")).unwrap();
        std::fs::write(p.join("elsewhere/cfg/.env"), "x").unwrap();
        let proj = p.join("proj");
        let mut t = Tree::new(&proj, rules(SystemTime::now()), HashSet::new()).unwrap();
        t.walk(b"", false, &AtomicBool::new(false), &mut Vec::new())
            .unwrap();
        assert_eq!(t.watched(), 2);
        std::fs::rename(proj.join("a"), p.join("gone")).unwrap();
        std::fs::rename(p.join("elsewhere/cfg"), proj.join("cfg")).unwrap();
        assert_eq!(
            rels(&drain(&mut t)),
            vec![("cfg/.env".into(), "sensitive \".env\"".into(), false)]
        );
        // `a` moved out: a file created there now is not in the project.
        std::fs::write(p.join("gone/.env"), "x").unwrap();
        assert!(drain(&mut t).is_empty());
    }

    #[test]
    fn symlinked_directories_are_never_walked() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        std::fs::create_dir_all(p.join("proj")).unwrap();
        std::fs::create_dir_all(p.join("host")).unwrap();
        std::fs::write(p.join("host/.env.prod"), "x").unwrap();
        std::os::unix::fs::symlink(p.join("host"), p.join("proj/link")).unwrap();
        let mut t = Tree::new(&p.join("proj"), rules(epoch()), HashSet::new()).unwrap();
        let mut out = Vec::new();
        t.walk(b"", true, &AtomicBool::new(false), &mut out)
            .unwrap();
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(t.watched(), 1);
    }
}
