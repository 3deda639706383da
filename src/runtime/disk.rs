//! The disk budget: what a sandbox may make the host's disk hold through the directories aisb
//! gives it on the host (copy-on-write layers' upper and work directories, private copies,
//! state directories, a named sandbox's clone). The project itself, and host paths the
//! configuration mounts writable, are the user's own: not counted.
//!
//! The budget (`limits { disk "20G" }`, see [`Disk`]) is on what those directories hold, not
//! on what one run added, so that runs of a named sandbox cannot add up to a full disk:
//! - by default, half of what they hold plus what is free, on each file system they are on
//!   (the host keeps at least as much free as they hold), and the same for inodes (a million
//!   empty files take no bytes but can end a file system's inodes);
//! - configured, that many bytes in all, and never more than nine tenths of what they hold
//!   plus what is free.
//!
//! How it is watched ([`watch`]): a `statvfs` of each file system every [`GLANCE_EVERY`], and a
//! walk of the directories (no link followed, each inode counted once) only when free space or
//! inodes dropped by more than a quarter of what is left of the budget, at most every
//! [`WALK_COST`] times the last walk's duration (a twentieth of a core). A sandbox writing at
//! disk speed is stopped within about a glance and a walk; one that writes little costs a
//! `statvfs` a quarter second. What a walk cannot read (a directory the sandbox made
//! unreadable to aisb, a path too deep to name) cannot hide bytes: the file system's drop in
//! free space since the start then stands for it, whoever else wrote meanwhile (the safe
//! side).
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

use crate::eval::plan::{Disk, MountKind, Plan};

/// A walk waits at least this many times the last walk's duration after it (≤ 1/20 of a core).
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
                "its copy-on-write layers and private copies (on the file system of {}) grew to {}, past its disk budget of {} ({})",
                self.on.display(),
                super::limits::human(self.used),
                super::limits::human(self.budget),
                self.rule
            ),
            _ => write!(
                f,
                "its copy-on-write layers and private copies (on the file system of {}) grew to {} files, past its budget of {} ({})",
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
    fn bytes(&self) -> u64 {
        self.per_dev
            .iter()
            .map(|e| e.1)
            .fold(0, u64::saturating_add)
    }
}

/// Walk `dirs` (no link followed; an inode with several links counted once). Stops early once
/// `stop_at` inodes were counted (already past every budget) or the run is stopping.
fn measure(dirs: &[PathBuf], stop_at: u64, stopping: &AtomicBool) -> Usage {
    let mut usage = Usage::default();
    let mut linked: HashSet<(u64, u64)> = HashSet::new();
    let mut seen = 0u64;
    for dir in dirs {
        for entry in walkdir::WalkDir::new(dir).follow_links(false) {
            let meta = match entry.and_then(|e| e.metadata()) {
                Ok(m) => m,
                // Gone since it was listed (the sandbox removing it): nothing held.
                Err(e)
                    if e.io_error().map(std::io::Error::kind)
                        == Some(std::io::ErrorKind::NotFound) =>
                {
                    continue
                }
                Err(_) => {
                    usage.unreadable += 1;
                    continue;
                }
            };
            if meta.nlink() > 1 && !meta.is_dir() && !linked.insert((meta.dev(), meta.ino())) {
                continue;
            }
            usage.add(meta.dev(), meta.blocks().saturating_mul(512), 1);
            seen += 1;
            if seen >= stop_at || (seen % 4096 == 0 && stopping.load(Ordering::Relaxed)) {
                return usage;
            }
        }
    }
    usage
}

/// The budgets of one file system, from what the layers hold on it (`used`) and what is free
/// now: (bytes, inodes; `None` where inodes are not counted).
fn budgets(disk: Disk, used: (u64, u64), free: (u64, u64, bool)) -> (u64, Option<u64>) {
    let total = used.0.saturating_add(free.0);
    let bytes = match disk {
        Disk::Bytes(b) => b.min(total / 10 * 9),
        _ => total / 2,
    };
    let inodes = free.2.then(|| used.1.saturating_add(free.1) / 2);
    (bytes, inodes)
}

/// What is over its budget in `usage`, given the free space seen with it (`now`) and at the
/// watch's start (`first`), per file system of `fss` (a device and a directory on it).
fn over(
    budget: &Budget,
    fss: &[(u64, PathBuf)],
    usage: &Usage,
    now: &[Option<(u64, u64, bool)>],
    first: &[Option<(u64, u64, bool)>],
) -> Option<Exceeded> {
    let rule = budget.rule();
    if let Disk::Bytes(b) = budget.disk {
        if usage.bytes() > b {
            return Some(Exceeded {
                what: "bytes",
                used: usage.bytes(),
                budget: b,
                rule,
                on: fss.first().map(|f| f.1.clone()).unwrap_or_default(),
            });
        }
    }
    for (i, (dev, probe)) in fss.iter().enumerate() {
        let Some(free) = now.get(i).copied().flatten() else {
            continue;
        };
        let (mut bytes, inodes) = usage.on(*dev);
        let (bytes_budget, inodes_budget) = budgets(budget.disk, (bytes, inodes), free);
        if usage.unreadable > 0 {
            // What the walk could not see: the file system's drop since the start stands
            // for it (whoever else wrote meanwhile: the safe side).
            let drop = first
                .get(i)
                .copied()
                .flatten()
                .map_or(0, |f| f.0.saturating_sub(free.0));
            bytes = bytes.max(drop);
        }
        if bytes > bytes_budget {
            return Some(Exceeded {
                what: "bytes",
                used: bytes,
                budget: bytes_budget,
                rule,
                on: probe.clone(),
            });
        }
        if let Some(b) = inodes_budget.filter(|b| inodes > *b) {
            return Some(Exceeded {
                what: "inodes",
                used: inodes,
                budget: b,
                rule,
                on: probe.clone(),
            });
        }
    }
    None
}

/// How long a walk is waited for at the longest when nothing else asks for one: writes that
/// others' deletions hid from the glances are found by then.
const BACKSTOP: Duration = Duration::from_secs(30);

/// The watch, until `stop` is readable or `stopping` is set. `Err`: the budget was exceeded
/// (the init was then killed).
///
/// Nothing is walked while the file systems' free space holds: a glance (`statvfs`) every
/// [`GLANCE_EVERY`] asks for a walk once free bytes or inodes dropped by more than a quarter of
/// what the last walk left of the budget (a configured budget is also walked at once), and a
/// walk waits [`WALK_COST`] times the last one's duration after it. A short run, or one that
/// writes little, never walks.
pub fn watch(
    budget: &Budget,
    init: &OwnedFd,
    stop: &OwnedFd,
    stopping: &Arc<AtomicBool>,
) -> Result<(), Exceeded> {
    let mut fss: Vec<(u64, PathBuf)> = Vec::new();
    for dir in &budget.dirs {
        if let Ok(meta) = std::fs::symlink_metadata(dir) {
            if !fss.iter().any(|f| f.0 == meta.dev()) {
                fss.push((meta.dev(), dir.clone()));
            }
        }
    }
    let glance = || -> Vec<Option<(u64, u64, bool)>> { fss.iter().map(|f| free(&f.1)).collect() };
    let first = glance();
    // The last walk: what it found, the free space seen with it, when it ended, how long.
    let mut usage = Usage::default();
    let mut base = first.clone();
    let mut walked: Option<(Instant, Duration)> = None;
    let mut due = matches!(budget.disk, Disk::Bytes(_));
    loop {
        if due {
            let began = Instant::now();
            let now = glance();
            // Past the largest inode budget there is nothing more to learn.
            let stop_at = fss
                .iter()
                .zip(&now)
                .filter_map(|((dev, _), f)| {
                    f.and_then(|f| budgets(budget.disk, usage.on(*dev), f).1)
                })
                .max()
                .map_or(u64::MAX, |b| b.saturating_mul(2).saturating_add(1));
            usage = measure(&budget.dirs, stop_at, stopping);
            if let Some(e) = over(budget, &fss, &usage, &now, &first) {
                super::live::kill(init);
                return Err(e);
            }
            base = now;
            walked = Some((Instant::now(), began.elapsed()));
        }
        if super::live::wait_for(stop, stopping, Some(GLANCE_EVERY)) {
            return Ok(());
        }
        let now = glance();
        let dropped = fss.iter().enumerate().any(|(i, (dev, _))| {
            let (Some(then), Some(now)) = (base[i], now[i]) else {
                return false;
            };
            let used = usage.on(*dev);
            let (b, n) = budgets(budget.disk, used, then);
            let left_bytes = b.saturating_sub(used.0);
            let left_inodes = n.map_or(u64::MAX, |n| n.saturating_sub(used.1));
            then.0.saturating_sub(now.0) > left_bytes / 4
                || then.1.saturating_sub(now.1) > left_inodes / 4
        });
        due = match walked {
            None => dropped,
            Some((at, took)) => {
                let gap = (took * WALK_COST).max(GLANCE_EVERY);
                at.elapsed() >= gap && (dropped || at.elapsed() >= BACKSTOP)
            }
        };
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
        let u = measure(&[d.clone()], u64::MAX, &AtomicBool::new(false));
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
}
