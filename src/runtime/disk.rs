//! The disk budget: what a sandbox may make the host's disk hold through the directories aisb
//! gives it on the host (copy-on-write layers' upper directories, private copies, state
//! directories, a named sandbox's clone). The project itself, and host paths the
//! configuration mounts writable, are the user's own: not counted.
//!
//! The budget (`limits { disk "20G" }`, see [`Disk`]) is on what those directories hold, per
//! file system, from what they held when the run started (so that a big clone is not stopped
//! at once, and runs of a named sandbox cannot add up to a full disk):
//! - by default, what they held plus half of what was free, for bytes and for inodes (a
//!   million empty files take no bytes but can end a file system's inodes);
//! - configured, that many bytes in all, and never more than what they held plus nine tenths
//!   of what was free.
//!
//! How it is watched ([`watch`]): one walk at the start, then a `statvfs` of each file system
//! every [`GLANCE_EVERY`]. Nothing is walked while what they held plus the file system's drop
//! since stays within the budget: nothing the sandbox does hides from that drop. Past it, a
//! walk (through descriptors, no link followed, each inode once, bounded) with the files the
//! sandbox's processes hold open after removing them says whether the sandbox or someone else
//! took the space; walks are spaced by [`WALK_COST`] times their own duration. What a walk
//! cannot see (a directory made unreadable to an ordinary user, a tree too deep, a process
//! whose descriptors cannot be read) is the drop itself, others' writes included (the safe
//! side); files others remove meanwhile give space back and can hide that much.
//!
//! Past the budget, the sandbox is stopped (its init killed: the runtimes take everything in
//! it down), an audit event says so, and the run fails with the reason. What it wrote stays
//! where it is: a named sandbox's `aisb rm`, or the next run's clean-up, removes it.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::FileType;
use rustix::io::Errno;

use crate::eval::plan::{Disk, MountKind, Plan};

/// A walk waits at least this many times the last walk's duration after it (≤ 1/20 of a core;
/// a quarter of that once the budget looks exceeded).
const WALK_COST: u32 = 20;
/// How often the file systems' free space is looked at between walks.
const GLANCE_EVERY: Duration = Duration::from_millis(250);

/// The watched directories of one run and its budget.
#[derive(Debug, Clone)]
pub struct Budget {
    dirs: Vec<PathBuf>,
    disk: Disk,
    /// Where the configuration set it (`sandbox.kdl:3`), `None`: aisb's default.
    at: Option<String>,
}

/// Why the sandbox was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// `bytes` or `inodes`.
    pub what: &'static str,
    pub used: u64,
    pub budget: u64,
    /// The rule, for people: `limits disk at sandbox.kdl:3`, or aisb's default's.
    pub rule: String,
    /// Where (one of the watched directories' file systems: a directory on it).
    pub on: PathBuf,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.what {
            "bytes" => write!(
                f,
                "its copy-on-write layers and private copies (on the file system of {}) hold {}, past its disk budget of {} ({})",
                self.on.display(),
                super::limits::human(self.used),
                super::limits::human(self.budget),
                self.rule
            ),
            _ => write!(
                f,
                "its copy-on-write layers and private copies (on the file system of {}) hold {} files, past its budget of {} ({})",
                self.on.display(),
                self.used,
                self.budget,
                self.rule
            ),
        }
    }
}

impl Budget {
    /// The budget of `plan`, or `None` when nothing is watched (`disk "unlimited"`, or no
    /// directory of aisb's the sandbox can write).
    pub fn of(plan: &Plan) -> Option<Budget> {
        if plan.limits.disk == Disk::Unlimited {
            return None;
        }
        // aisb's own directories: `$XDG_CACHE_HOME/aisb`, the store's parent.
        let ours = plan.store.parent()?;
        let mut dirs: Vec<PathBuf> = Vec::new();
        for m in &plan.mounts {
            match &m.kind {
                // Not the work directory: overlayfs's own (mode 0000 to all but root), where
                // a copy-up passes on its way to the upper directory.
                MountKind::Overlay { upper, .. } => dirs.push(upper.clone()),
                MountKind::State { dir } => dirs.push(dir.clone()),
                MountKind::Copy { copy, .. } => dirs.push(copy.clone()),
                MountKind::Bind {
                    source,
                    writable: true,
                } if source.starts_with(ours) => dirs.push(source.clone()),
                _ => {}
            }
        }
        dirs.sort();
        dirs.dedup();
        // One inside another is walked with it.
        let mut kept: Vec<PathBuf> = Vec::new();
        for d in dirs {
            if !kept.iter().any(|k| d.starts_with(k)) {
                kept.push(d);
            }
        }
        (!kept.is_empty()).then(|| Budget {
            dirs: kept,
            disk: plan.limits.disk,
            at: plan.limits.set_at.get("disk").cloned(),
        })
    }

    fn rule(&self) -> String {
        match (&self.at, self.disk) {
            (Some(at), Disk::Bytes(_)) => format!("`limits {{ disk … }}` at {at}"),
            _ => "aisb's default: half of what they hold plus what is free; `limits { disk \"SIZE\" }` sets it".into(),
        }
    }
}

/// Free bytes available to an unprivileged caller, free inodes, and whether the file system
/// counts inodes at all (Btrfs says 0), of the file system holding `path`.
fn free(path: &Path) -> Option<(u64, u64, bool)> {
    let s = rustix::fs::statvfs(path).ok()?;
    let frsize = if s.f_frsize > 0 {
        s.f_frsize
    } else {
        s.f_bsize
    };
    Some((s.f_bavail.saturating_mul(frsize), s.f_favail, s.f_files > 0))
}

/// What the watched directories hold: bytes and inodes per file system (by device), and how
/// many entries could not be looked at.
#[derive(Debug, Default, PartialEq, Eq)]
struct Usage {
    per_dev: Vec<(u64, u64, u64)>,
    unreadable: u64,
}

impl Usage {
    fn add(&mut self, dev: u64, bytes: u64, inodes: u64) {
        match self.per_dev.iter_mut().find(|(d, _, _)| *d == dev) {
            Some(e) => {
                e.1 = e.1.saturating_add(bytes);
                e.2 = e.2.saturating_add(inodes);
            }
            None => self.per_dev.push((dev, bytes, inodes)),
        }
    }
    fn on(&self, dev: u64) -> (u64, u64) {
        self.per_dev
            .iter()
            .find(|(d, _, _)| *d == dev)
            .map_or((0, 0), |e| (e.1, e.2))
    }
}

/// How deep a walk goes; what is deeper counts as unreadable (the file system's drop stands
/// for it).
const DEPTH_MAX: usize = 128;
/// The most entries one walk looks at, and the most inodes with several links it remembers
/// (aisb's own memory, outside the sandbox's cgroup); past either, the rest is unreadable.
const ENTRIES_MAX: u64 = 2_000_000;
const LINKED_MAX: usize = 1 << 20;

/// Walk `dirs` through descriptors (`openat` with `O_NOFOLLOW` from the directory above, so a
/// directory the sandbox swaps for a link is never followed out of the layer); an inode with
/// several links counted once; everything charged to the file system of the directory the
/// walk started from (a Btrfs subvolume inside has a device number of its own). Stops at
/// `stop_at` inodes (already past every budget) or when the run is stopping.
fn measure(dirs: &[PathBuf], stop_at: u64, stopping: &AtomicBool) -> Usage {
    use rustix::fs::{openat, statat, AtFlags, Dir, Mode, OFlags, CWD};
    let mut usage = Usage::default();
    let mut linked: HashSet<(u64, u64)> = HashSet::new();
    let mut seen = 0u64;
    let cap = stop_at.min(ENTRIES_MAX);
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for root in dirs {
        let Ok(top) = statat(CWD, root, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let dev = top.st_dev;
        usage.add(dev, (top.st_blocks as u64).saturating_mul(512), 1);
        if FileType::from_raw_mode(top.st_mode) != FileType::Directory {
            continue;
        }
        let Ok(fd) = openat(CWD, root, dir_flags, Mode::empty()) else {
            usage.unreadable += 1;
            continue;
        };
        // Depth-first, one descriptor per level (bounded by DEPTH_MAX).
        let mut stack: Vec<Dir> = match Dir::read_from(&fd) {
            Ok(d) => vec![d],
            Err(_) => {
                usage.unreadable += 1;
                continue;
            }
        };
        let mut fds = vec![fd];
        while let Some(dir) = stack.last_mut() {
            let Some(entry) = dir.next() else {
                stack.pop();
                fds.pop();
                continue;
            };
            let Ok(entry) = entry else {
                usage.unreadable += 1;
                stack.pop();
                fds.pop();
                continue;
            };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let parent = fds.last().expect("one descriptor per level");
            let st = match statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Gone since it was listed (the sandbox removing it): nothing held.
                Err(Errno::NOENT) => continue,
                Err(_) => {
                    usage.unreadable += 1;
                    continue;
                }
            };
            seen += 1;
            if seen >= cap || (seen % 4096 == 0 && stopping.load(Ordering::Relaxed)) {
                if seen >= ENTRIES_MAX {
                    usage.unreadable += 1;
                }
                usage.add(dev, 0, 0);
                return usage;
            }
            let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
            if st.st_nlink > 1 && !is_dir {
                if linked.len() >= LINKED_MAX {
                    usage.unreadable += 1;
                } else if !linked.insert((st.st_dev, st.st_ino)) {
                    continue;
                }
            }
            usage.add(dev, (st.st_blocks as u64).saturating_mul(512), 1);
            if !is_dir {
                continue;
            }
            if fds.len() >= DEPTH_MAX {
                usage.unreadable += 1;
                continue;
            }
            match openat(parent, name, dir_flags, Mode::empty())
                .and_then(|fd| Dir::read_from(&fd).map(|d| (fd, d)))
            {
                Ok((fd, d)) => {
                    fds.push(fd);
                    stack.push(d);
                }
                // Swapped for a link since (ELOOP, ENOTDIR) or gone: not followed.
                Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => {}
                Err(_) => usage.unreadable += 1,
            }
        }
    }
    usage
}

/// Bytes of files that the sandbox's processes hold open after removing them (`rm` of an
/// open file, `O_TMPFILE`): no walk finds them, their blocks stay taken until closed. Those on
/// `devs`, per device, from the host's `/proc`: every process in the init's pid namespace
/// (bounded by its pids limit), every descriptor that names a deleted file. `None`: some
/// could not be looked at.
fn held_open(init_pid: i32, devs: &[u64]) -> Option<Vec<(u64, u64)>> {
    use std::os::unix::fs::MetadataExt;
    const FDS_MAX: usize = 1_000_000;
    let ns = std::fs::read_link(format!("/proc/{init_pid}/ns/pid")).ok()?;
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut counted: HashSet<(u64, u64)> = HashSet::new();
    let mut looked = 0usize;
    let mut complete = true;
    for p in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = p.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if std::fs::read_link(format!("/proc/{pid}/ns/pid"))
            .ok()
            .as_ref()
            != Some(&ns)
        {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            // Not ours to look at (ended meanwhile is fine).
            if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                complete = false;
            }
            continue;
        };
        for fd in fds.flatten() {
            looked += 1;
            if looked > FDS_MAX {
                return None;
            }
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if !target
                .as_os_str()
                .as_encoded_bytes()
                .ends_with(b" (deleted)")
            {
                continue;
            }
            let Ok(m) = std::fs::metadata(fd.path()) else {
                continue;
            };
            if m.nlink() == 0 && devs.contains(&m.dev()) && counted.insert((m.dev(), m.ino())) {
                match out.iter_mut().find(|e| e.0 == m.dev()) {
                    Some(e) => e.1 = e.1.saturating_add(m.blocks().saturating_mul(512)),
                    None => out.push((m.dev(), m.blocks().saturating_mul(512))),
                }
            }
        }
    }
    complete.then_some(out)
}

/// The budgets of one file system from what the layers held at the start and what was free
/// then: (bytes, inodes; `None` where inodes are not counted). The host keeps at least half
/// of what was free; a configured budget never takes more than nine tenths of it.
fn budgets(disk: Disk, held: (u64, u64), free: (u64, u64, bool)) -> (u64, Option<u64>) {
    let bytes = match disk {
        Disk::Bytes(b) => b.min(held.0.saturating_add(free.0 / 10 * 9)),
        _ => held.0.saturating_add(free.0 / 2),
    };
    let inodes = free.2.then(|| held.1.saturating_add(free.1 / 2));
    (bytes, inodes)
}

/// One file system the directories are on: a device, a directory on it, what the directories
/// held there and what was free at the start, and its budgets.
struct Fs {
    dev: u64,
    probe: PathBuf,
    held: (u64, u64),
    free0: (u64, u64, bool),
    bytes: u64,
    inodes: Option<u64>,
}

impl Fs {
    /// The least the directories can hold now: what they held plus the file system's drop
    /// since (nothing the sandbox does hides from that; others' writes count too).
    fn floor(&self, now: (u64, u64, bool)) -> (u64, u64) {
        (
            self.held
                .0
                .saturating_add(self.free0.0.saturating_sub(now.0)),
            self.held
                .1
                .saturating_add(self.free0.1.saturating_sub(now.1)),
        )
    }
    fn over(&self, used: (u64, u64)) -> bool {
        used.0 > self.bytes || self.inodes.is_some_and(|b| used.1 > b)
    }
}

/// What is over its budget: `usage` from a walk (with what is held open, `open`), the free
/// space seen with it (`now`). What a walk could not see is the file system's drop.
fn over(
    budget: &Budget,
    fss: &[Fs],
    usage: &Usage,
    open: Option<&[(u64, u64)]>,
    now: &[Option<(u64, u64, bool)>],
) -> Option<Exceeded> {
    let rule = budget.rule();
    let mut total = 0u64;
    let mut found = None;
    for (fs, now) in fss.iter().zip(now) {
        let (mut bytes, mut inodes) = usage.on(fs.dev);
        if let Some(o) = open {
            bytes = bytes.saturating_add(o.iter().find(|e| e.0 == fs.dev).map_or(0, |e| e.1));
        }
        if usage.unreadable > 0 || open.is_none() {
            if let Some(now) = now {
                let floor = fs.floor(*now);
                bytes = bytes.max(floor.0);
                inodes = inodes.max(floor.1);
            }
        }
        total = total.saturating_add(bytes);
        if found.is_none() && fs.over((bytes, inodes)) {
            let inode_over = fs.inodes.is_some_and(|b| inodes > b) && bytes <= fs.bytes;
            found = Some(Exceeded {
                what: if inode_over { "inodes" } else { "bytes" },
                used: if inode_over { inodes } else { bytes },
                budget: if inode_over {
                    fs.inodes.unwrap_or(0)
                } else {
                    fs.bytes
                },
                rule: rule.clone(),
                on: fs.probe.clone(),
            });
        }
    }
    if let (None, Disk::Bytes(b)) = (&found, budget.disk) {
        if total > b {
            found = Some(Exceeded {
                what: "bytes",
                used: total,
                budget: b,
                rule,
                on: fss.first().map(|f| f.probe.clone()).unwrap_or_default(),
            });
        }
    }
    found
}

/// How long a walk is waited for at the longest when nothing else asks for one.
const BACKSTOP: Duration = Duration::from_secs(30);

/// The watch, until `stop` is readable or `stopping` is set. `Err`: the budget was exceeded
/// (the init was then killed). `init_pid`: the init as the host numbers it (its pid namespace
/// names the sandbox's processes).
///
/// One walk at the start (what the directories hold then). Then a glance (`statvfs`) every
/// [`GLANCE_EVERY`]: while what they held plus the file system's drop since stays within the
/// budget, nothing is walked (a sandbox cannot make the file system lose space it does not
/// show); past it, a walk (with the files held open after removal) says whether the sandbox
/// or someone else took it, at most every [`WALK_COST`]/4 times the last walk's duration. A
/// walk at least every [`BACKSTOP`] (cost permitting) finds what others' deletions hid.
pub fn watch(
    budget: &Budget,
    init: &OwnedFd,
    init_pid: i32,
    stop: &OwnedFd,
    stopping: &Arc<AtomicBool>,
) -> Result<(), Exceeded> {
    let mut roots: Vec<(u64, PathBuf)> = Vec::new();
    for dir in &budget.dirs {
        if let Ok(meta) = std::fs::symlink_metadata(dir) {
            if !roots.iter().any(|f| f.0 == meta.dev()) {
                roots.push((meta.dev(), dir.clone()));
            }
        }
    }
    let glance = || -> Vec<Option<(u64, u64, bool)>> { roots.iter().map(|f| free(&f.1)).collect() };
    let free0 = glance();
    let began = Instant::now();
    let held0 = measure(&budget.dirs, u64::MAX, stopping);
    let fss: Vec<Fs> = roots
        .iter()
        .zip(&free0)
        .filter_map(|((dev, probe), f)| {
            let f = (*f)?;
            let held = held0.on(*dev);
            let (bytes, inodes) = budgets(budget.disk, held, f);
            Some(Fs {
                dev: *dev,
                probe: probe.clone(),
                held,
                free0: f,
                bytes,
                inodes,
            })
        })
        .collect();
    let devs: Vec<u64> = fss.iter().map(|f| f.dev).collect();
    let mut walked = (Instant::now(), began.elapsed());
    // A configured budget the directories already exceed: said at once.
    let now = fss.iter().map(|f| free(&f.probe)).collect::<Vec<_>>();
    let check = |usage: &Usage, now: &[Option<(u64, u64, bool)>]| {
        let open = held_open(init_pid, &devs);
        over(budget, &fss, usage, open.as_deref(), now)
    };
    if let Some(e) = check(&held0, &now) {
        super::live::kill(init);
        return Err(e);
    }
    loop {
        if super::live::wait_for(stop, stopping, Some(GLANCE_EVERY)) {
            return Ok(());
        }
        let now: Vec<_> = fss.iter().map(|f| free(&f.probe)).collect();
        let past = fss
            .iter()
            .zip(&now)
            .any(|(fs, n)| n.is_some_and(|n| fs.over(fs.floor(n))));
        let since = walked.0.elapsed();
        let due = if past {
            since >= (walked.1 * WALK_COST / 4).max(GLANCE_EVERY)
        } else {
            since >= BACKSTOP.max(walked.1 * WALK_COST)
        };
        if !due {
            continue;
        }
        let began = Instant::now();
        let stop_at = fss
            .iter()
            .filter_map(|f| f.inodes)
            .max()
            .map_or(u64::MAX, |b| b.saturating_mul(2).saturating_add(1));
        let usage = measure(&budget.dirs, stop_at, stopping);
        walked = (Instant::now(), began.elapsed());
        if let Some(e) = check(&usage, &now) {
            super::live::kill(init);
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_counts_each_inode_once_and_follows_no_link() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("upper");
        std::fs::create_dir_all(d.join("a")).unwrap();
        std::fs::write(d.join("a/f"), vec![1u8; 1 << 20]).unwrap();
        std::fs::hard_link(d.join("a/f"), d.join("g")).unwrap();
        // A link out of the directory: what it names is not the layer's.
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("big"), vec![1u8; 4 << 20]).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("out")).unwrap();
        let u = measure(std::slice::from_ref(&d), u64::MAX, &AtomicBool::new(false));
        let dev = std::fs::metadata(&d).unwrap().dev();
        let (bytes, inodes) = u.on(dev);
        // upper, a, a/f (= g), out: four inodes; the file's MiB once.
        assert_eq!(inodes, 4, "{u:?}");
        assert!((1 << 20..2 << 20).contains(&bytes), "{bytes}");
        assert_eq!(u.unreadable, 0);
    }

    #[test]
    fn a_walk_stops_once_past_the_inode_budget() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..50 {
            std::fs::write(t.path().join(i.to_string()), b"").unwrap();
        }
        let u = measure(&[t.path().to_path_buf()], 10, &AtomicBool::new(false));
        assert_eq!(u.per_dev.iter().map(|e| e.2).sum::<u64>(), 10);
    }

    #[test]
    fn the_budget_starts_from_what_the_layers_held() {
        const G: u64 = 1 << 30;
        // A 30 GiB clone with 20 GiB free: it may grow by half of the free space, not be
        // stopped at once for holding more than is free.
        let (bytes, inodes) = budgets(Disk::Default, (30 * G, 1000), (20 * G, 5000, true));
        assert_eq!(bytes, 40 * G);
        assert_eq!(inodes, Some(1000 + 2500));
        // A configured budget is the budget, never more than held + nine tenths of free.
        assert_eq!(budgets(Disk::Bytes(G), (0, 0), (20 * G, 0, true)).0, G);
        assert_eq!(
            budgets(Disk::Bytes(100 * G), (G, 0), (10 * G, 0, true)).0,
            G + 9 * G
        );
        // No inode count (Btrfs): no inode budget.
        assert_eq!(budgets(Disk::Default, (0, 0), (G, 0, false)).1, None);
    }

    #[test]
    fn what_a_walk_cannot_see_is_the_file_systems_drop() {
        const M: u64 = 1 << 20;
        let fs = Fs {
            dev: 7,
            probe: PathBuf::from("/layers/upper"),
            held: (10 * M, 10),
            free0: (100 * M, 1000, true),
            bytes: 40 * M,
            inodes: Some(500),
        };
        let budget = Budget {
            dirs: vec![],
            disk: Disk::Default,
            at: None,
        };
        let mut usage = Usage::default();
        usage.add(7, 12 * M, 20);
        let now = [Some((50 * M, 990, true))];
        // Everything seen: 12 MiB held, under the budget whatever the drop (others' writes).
        assert!(over(&budget, std::slice::from_ref(&fs), &usage, Some(&[]), &now).is_none());
        // Removed-but-open files count.
        assert!(over(
            &budget,
            std::slice::from_ref(&fs),
            &usage,
            Some(&[(7, 30 * M)]),
            &now
        )
        .is_some());
        // Something unreadable: held + the drop (10 + 50 MiB) stands for it.
        usage.unreadable = 1;
        let e = over(&budget, std::slice::from_ref(&fs), &usage, Some(&[]), &now).unwrap();
        assert_eq!((e.what, e.used, e.budget), ("bytes", 60 * M, 40 * M));
    }
}
