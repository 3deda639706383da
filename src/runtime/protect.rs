//! After the workload: the protected files (`eval::protect`) that did not exist when the
//! sandbox started and exist now were written by the sandbox (or, rarely, by the user while it
//! ran): each is moved into the sandbox's quarantine and named on stderr and in the audit
//! log, so nothing the host runs or obeys comes from inside, and nothing is lost. A run that
//! never reaches its end (aisb killed) leaves its record behind; the next run of the sandbox
//! sweeps for it first.

use std::path::{Path, PathBuf};

use crate::eval::plan::{Plan, Protected};

/// Where each run records what it sweeps for (one file per run, named by its pid).
const PENDING: &str = "protect-pending";

/// This run's sweep: done by [`Pending::finish`] at the end of the run, or when dropped (an
/// error on the way out); a killed run leaves its record for the next.
pub struct Pending {
    project: PathBuf,
    quarantine: PathBuf,
    protected: Vec<Protected>,
    /// The protected files bound read-only, with their (device, inode) at start: one found
    /// under that name afterwards with another identity, below a directory that was replaced
    /// ([`replaced`]), was put there by the sandbox (it renamed the directory holding the
    /// original and made a new one).
    bound: Vec<(PathBuf, u64, u64)>,
    /// The directories between the project and each bound file, with their identity at start.
    bound_dirs: Vec<(PathBuf, u64, u64)>,
    /// Protected names below the top a mask covered at start, with their identity then.
    covered: Vec<(PathBuf, u64, u64)>,
    /// The project's directories written in place (the plan's `project_dirs`), and when the
    /// run started: where and since when to look for protected names made below the top.
    dirs: std::sync::Arc<crate::eval::plan::ProjectDirs>,
    since_ns: i128,
    /// The wall clock's lead over the boot clock at the mark ([`wall_lead`]): a wall clock set
    /// back during the run shows as a smaller lead at its end.
    lead_ns: i128,
    record: Option<PathBuf>,
    done: bool,
}

/// A record's first entry: when its run started (`since:<ns>`); paths start with `/`.
const SINCE: &[u8] = b"since:";
/// A record's entry: the wall clock's lead over the boot clock at the start (`lead:<ns>`).
const LEAD: &[u8] = b"lead:";
/// A record's entry per protected file bound read-only: `bound:<dev>:<ino>:<path>`. Another
/// file under that name at the next start was put there by the killed run's sandbox (it
/// renamed the directory holding the original and made a new one).
const BOUND: &[u8] = b"bound:";
/// A record's entry per directory between the project and a bound file:
/// `dir:<dev>:<ino>:<path>` (see [`replaced`]).
const DIR: &[u8] = b"dir:";

/// (path, device, inode) of `p` itself, never through a link.
fn identity(p: &Path) -> Option<(PathBuf, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::symlink_metadata(p).ok()?;
    Some((p.to_path_buf(), md.dev(), md.ino()))
}

/// The directories strictly between `project` and each of `bound`, each once, with their
/// identity now.
fn dirs_above(project: &Path, bound: &[(PathBuf, u64, u64)]) -> Vec<(PathBuf, u64, u64)> {
    let mut out: Vec<(PathBuf, u64, u64)> = Vec::new();
    for (path, ..) in bound {
        for dir in path.ancestors().skip(1) {
            if dir == project || !dir.starts_with(project) {
                break;
            }
            if !out.iter().any(|(d, ..)| d == dir) {
                out.extend(identity(dir));
            }
        }
    }
    out
}

/// The bound files the sandbox replaced: under its name another file than at start, below a
/// directory that is not the one it was (gone, or another under its name). A bound file
/// itself cannot be renamed or removed inside (it is a mount point), so a directory above it
/// renamed away is the sandbox's only way to put another there; the host's own editor saving
/// one by a rename, or `git checkout` rewriting it, leaves its directories as they were and
/// is not taken for the sandbox's.
fn replaced(bound: &[(PathBuf, u64, u64)], dirs: &[(PathBuf, u64, u64)]) -> Vec<PathBuf> {
    let changed: Vec<&Path> = dirs
        .iter()
        .filter(|(d, dev, ino)| identity(d).is_none_or(|(_, a, b)| (a, b) != (*dev, *ino)))
        .map(|(d, ..)| d.as_path())
        .collect();
    bound
        .iter()
        .filter(|(path, dev, ino)| {
            identity(path).is_some_and(|(_, a, b)| (a, b) != (*dev, *ino))
                && changed.iter().any(|d| path.starts_with(d))
        })
        .map(|(path, ..)| path.clone())
        .collect()
}

/// The wall clock minus the boot clock (which never goes back, and counts suspend): it
/// changes only when the wall clock is set.
fn wall_lead() -> i128 {
    use rustix::time::{clock_gettime, ClockId};
    let ns = |t: rustix::time::Timespec| t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128;
    // The wall clock read between two reads of CLOCK_BOOTTIME, the tightest of a few tries:
    // a preemption between two plain reads (a loaded host) would look like a step of the
    // wall clock, and move the start back over the host's own last files (CI saw it).
    let mut best: Option<(i128, i128)> = None;
    for _ in 0..8 {
        let before = ns(clock_gettime(ClockId::Boottime));
        let wall = ns(clock_gettime(ClockId::Realtime));
        let after = ns(clock_gettime(ClockId::Boottime));
        let width = after - before;
        if best.is_none_or(|(w, _)| width < w) {
            best = Some((width, wall - before - width / 2));
        }
        if width < 20_000 {
            break;
        }
    }
    best.map_or(0, |(_, lead)| lead)
}

/// A drop of the wall clock's lead smaller than this is not taken for a step back (what is
/// left of the reads' jitter): the sandbox's first write comes later than that after its
/// start anyway (the runtime's own set-up takes longer).
const STEP_TOLERANCE: i128 = 2_000_000;

/// `since`, moved back by how far the wall clock was set back since `lead` was read (an NTP
/// step, a VM's resume): a change after the start is stamped by the wall clock, so after a
/// step back it looks older than the start. Plus a tick, for the coarse clock.
fn stepped_back(since: i128, lead: Option<i128>) -> i128 {
    let now = wall_lead();
    match lead {
        Some(lead) if now < lead - STEP_TOLERANCE => since - (lead - now) - 4_000_000,
        _ => since,
    }
}

/// What [`created_below`] found, as protected files to move aside (and a warning when it
/// could not look everywhere).
fn nested_created(
    project: &Path,
    dirs: &crate::eval::plan::ProjectDirs,
    since_ns: i128,
    bound: &[(PathBuf, u64, u64)],
) -> Vec<Protected> {
    if dirs.dirs.is_empty() {
        return Vec::new();
    }
    let (found, short) = created_below(project, dirs, since_ns, bound);
    if short {
        eprintln!(
            "aisb: WARNING: could not look through every directory the sandbox made or changed in {} for files the host's tools obey (.envrc, .npmrc, .vscode/ ...)\n  help: look for them yourself before running tools there",
            project.display()
        );
    }
    found
        .into_iter()
        .map(|(path, why)| Protected {
            path,
            dir: false,
            why: why.to_string(),
        })
        .collect()
}

impl Pending {
    /// Before the sandbox starts: see [`settle`].
    pub fn settle(&self) {
        settle(self.since_ns);
    }

    pub fn finish(mut self, audit: Option<&crate::audit::Log>) {
        self.done = true;
        self.sweep(audit);
    }

    /// Move aside what appeared of the protected paths, then drop the run's record.
    fn sweep(&mut self, audit: Option<&crate::audit::Log>) {
        // What the check below the top found goes first: a link it found (`ln -s . .cargo`)
        // is moved before a protected path through it (`.cargo/config`) would resolve to the
        // user's own file (`config/`).
        let known: Vec<_> = self.bound.iter().chain(&self.covered).cloned().collect();
        let since = stepped_back(self.since_ns, Some(self.lead_ns));
        let mut protected = nested_created(&self.project, &self.dirs, since, &known);
        let mut paths: Vec<PathBuf> = protected.iter().map(|p| p.path.clone()).collect();
        paths.extend(self.protected.iter().map(|p| p.path.clone()));
        paths.extend(replaced(&self.bound, &self.bound_dirs));
        protected.extend(self.protected.iter().cloned());
        quarantine(&self.project, &self.quarantine, &protected, &paths, audit);
        if let Some(r) = self.record.take() {
            let _ = std::fs::remove_file(r);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            self.sweep(None);
        }
    }
}

/// Sweep for runs of this sandbox that ended without doing so (aisb killed), then record
/// `plan`'s protected paths for this run. When the first moved a file `plan` binds, the plan
/// without that bind (the file is absent now, and swept for again at the end) is returned.
pub fn begin(plan: &Plan, audit: Option<&crate::audit::Log>) -> (Pending, Option<Plan>) {
    use std::os::unix::ffi::OsStrExt;
    let quarantine_dir = plan.state_dir.join("quarantine");
    let dir = plan.state_dir.join(PENDING);
    let mut moved = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let pid = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok());
            let alive = pid.is_some_and(|p| {
                p != std::process::id() as i32
                    && nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok()
            });
            if alive {
                continue;
            }
            let mut keep_record = false;
            // What a kept record holds from here on: its bound files were looked at now, once
            // (a file the user puts back later is the user's).
            let mut kept_bytes = Vec::new();
            // Our own file, never followed: a record is a list of NUL-ended paths (a big
            // repository's bound files and their directories: up to 16 MiB).
            if let Ok(Some(bytes)) = crate::beneath::read(&dir, Path::new(&e.file_name()), 16 << 20)
            {
                kept_bytes = bytes
                    .split(|b| *b == 0)
                    .filter(|p| !p.is_empty() && !p.starts_with(BOUND) && !p.starts_with(DIR))
                    .flat_map(|p| p.iter().copied().chain([0]))
                    .collect();
                let mut paths: Vec<PathBuf> = bytes
                    .split(|b| *b == 0)
                    .filter(|p| p.first() == Some(&b'/'))
                    .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
                    .collect();
                let mut protected = plan.protected.clone();
                // What the killed run's sandbox made below the top since it started: the scan
                // of this start saw it as the project's own.
                let number = |tag: &[u8]| {
                    bytes
                        .split(|b| *b == 0)
                        .find_map(|p| p.strip_prefix(tag))
                        .and_then(|n| std::str::from_utf8(n).ok()?.parse::<i128>().ok())
                };
                let since = number(SINCE).map(|s| stepped_back(s, number(LEAD)));
                // A protected file bound at the killed run's start that its sandbox replaced.
                let entries = |tag: &[u8]| -> Vec<(PathBuf, u64, u64)> {
                    bytes
                        .split(|b| *b == 0)
                        .filter_map(|entry| {
                            let mut parts = entry.strip_prefix(tag)?.splitn(3, |b| *b == b':');
                            let (dev, ino, path) = (parts.next()?, parts.next()?, parts.next()?);
                            let parse = |n: &[u8]| std::str::from_utf8(n).ok()?.parse::<u64>().ok();
                            let path = PathBuf::from(std::ffi::OsStr::from_bytes(path));
                            Some((path, parse(dev)?, parse(ino)?))
                        })
                        .collect()
                };
                paths.extend(replaced(&entries(BOUND), &entries(DIR)));
                if let Some(since) = since {
                    if plan.project_dirs.dirs.is_empty() {
                        // This run does not write the project in place (read-only, a named
                        // sandbox's clone): the record waits for one that does.
                        keep_record = true;
                    }
                    // First, as at a run's end (see `Pending::sweep`).
                    let found = nested_created(&plan.project, &plan.project_dirs, since, &[]);
                    paths.splice(0..0, found.iter().map(|p| p.path.clone()));
                    protected.extend(found);
                }
                moved.extend(quarantine(
                    &plan.project,
                    &quarantine_dir,
                    &protected,
                    &paths,
                    audit,
                ));
            }
            if !keep_record {
                let _ = std::fs::remove_file(e.path());
            } else {
                // Off its pid (this run's own record may take that name), and without what
                // was looked at now.
                let pid_named = e
                    .file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<i32>().is_ok());
                let kept = if pid_named {
                    dir.join(format!("kept-{}", crate::eval::scan::now_ns()))
                } else {
                    e.path()
                };
                if crate::atomic::write_atomic_unsynced(&kept, &kept_bytes).is_ok() && pid_named {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    // A symbolic link under a secret's name that leads nowhere is a trap for a later write on
    // the host (`ln -s notes.txt .env.local`, planted by an earlier run): moved aside, so the
    // host's write makes a regular file that the live layer masks.
    // One lookup per mask from the project's descriptor, not a walk from `/` (a big
    // repository has 50,000 masks); only a link is looked at again.
    let project_fd = rustix::fs::open(
        &plan.project,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok();
    for m in &plan.masks {
        let Ok(rel) = m.path.strip_prefix(&plan.project) else {
            continue;
        };
        let is_link = match &project_fd {
            Some(fd) if !rel.as_os_str().is_empty() => {
                rustix::fs::statat(fd, rel, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
                    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
                })
            }
            _ => std::fs::symlink_metadata(&m.path).is_ok_and(|md| md.file_type().is_symlink()),
        };
        let dangling = is_link && std::fs::metadata(&m.path).is_err();
        if dangling && !has_link_between(&plan.project, &m.path) {
            if let Some((from, to)) =
                crate::git::quarantine_beneath(&plan.project, &m.path, &quarantine_dir)
            {
                report(
                    audit,
                    &from,
                    &to,
                    "is a symbolic link under a secret's name that leads nowhere (a write on the host would land where it points)",
                    format!("a dangling symbolic link under a secret's name ({})", m.rule),
                );
            }
        }
    }
    let changed = moved
        .iter()
        .any(|p| {
            plan.mounts.iter().any(|m| m.target == *p) || plan.masks.iter().any(|m| m.path == *p)
        })
        .then(|| {
            let mut p = plan.clone();
            // A mask on what was moved would have nothing to cover (a name the killed run's
            // sandbox made that the sensitive patterns match).
            p.masks.retain(|m| !moved.contains(&m.path));
            for path in &moved {
                if let Some(i) = p
                    .mounts
                    .iter()
                    .position(|m| m.target == *path && crate::eval::protect::is_protect_mount(m))
                {
                    let m = p.mounts.remove(i);
                    p.protected.push(Protected {
                        path: path.clone(),
                        dir: false,
                        why: m.why,
                    });
                }
            }
            p
        });
    let plan = changed.as_ref().unwrap_or(plan);
    let since_ns = start_mark(&plan.project);
    let lead_ns = wall_lead();
    if !plan.project_dirs.dirs.is_empty() && !ctimes_trusted(&plan.project) {
        eprintln!(
            "aisb: WARNING: {} is on a file system whose file times this machine does not stamp itself (a network or FUSE file system, FAT): a file your tools obey that the sandbox makes below the project's top may go unnoticed\n  help: `project access=\"overlay\"` in sandbox.kdl keeps the sandbox's writes out of the project",
            plan.project.display()
        );
    }
    let bound: Vec<(PathBuf, u64, u64)> = plan
        .mounts
        .iter()
        .filter(|m| crate::eval::protect::is_protect_mount(m))
        .filter_map(|m| identity(&m.target))
        .collect();
    let bound_dirs = dirs_above(&plan.project, &bound);
    let mut record = None;
    if !plan.protected.is_empty() || !plan.project_dirs.dirs.is_empty() || !bound.is_empty() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(SINCE);
        bytes.extend_from_slice(since_ns.to_string().as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(LEAD);
        bytes.extend_from_slice(lead_ns.to_string().as_bytes());
        bytes.push(0);
        for (tag, list) in [(BOUND, &bound), (DIR, &bound_dirs)] {
            for (path, dev, ino) in list {
                bytes.extend_from_slice(tag);
                bytes.extend_from_slice(format!("{dev}:{ino}:").as_bytes());
                bytes.extend_from_slice(path.as_os_str().as_bytes());
                bytes.push(0);
            }
        }
        for p in &plan.protected {
            bytes.extend_from_slice(p.path.as_os_str().as_bytes());
            bytes.push(0);
        }
        let path = dir.join(std::process::id().to_string());
        // Not synced: it is for a run killed before its end, not for a power loss (the
        // fsync was most of the start-up).
        if std::fs::create_dir_all(&dir).is_ok()
            && crate::atomic::write_atomic_unsynced(&path, &bytes).is_ok()
        {
            record = Some(path);
        }
    }
    // Known at start under a mask (or another mount): kept by the end's check, never compared
    // by the sweep above (a mask is no bind of ours).
    let covered: Vec<(PathBuf, u64, u64)> = plan
        .protect_covered
        .iter()
        .filter_map(|p| identity(p))
        .collect();
    let pending = Pending {
        project: plan.project.clone(),
        quarantine: quarantine_dir,
        protected: plan.protected.clone(),
        bound,
        bound_dirs,
        covered,
        dirs: plan.project_dirs.clone(),
        since_ns,
        lead_ns,
        record,
        done: false,
    };
    (pending, changed)
}

/// When this aisb started ([`note_process_start`]).
static PROCESS_START: std::sync::OnceLock<i128> = std::sync::OnceLock::new();

/// Up to this long after aisb started, a run's start is taken as aisb's: the set-up in between
/// (config, scan, plan) is longer than a tick, so [`settle`] waits for nothing. Past it (an
/// image built, a question answered), the host's own changes meanwhile are not the sandbox's:
/// the run's start is read anew.
const PROCESS_START_FOR: i128 = 2_000_000_000;

/// Read the clock as aisb starts: the mark of its run (see [`start_mark`]).
pub fn note_process_start() {
    let _ = PROCESS_START.set(crate::eval::scan::now_ns());
}

/// When a run starts, for "made since" (compared with ctimes): read after everything the host
/// made before aisb was started (aisb's own start, or now when that was long ago). A change
/// made before it was stamped before it (the kernel's stamp is never ahead of the clock read
/// here), and [`settle`] makes every change after the sandbox starts stamped at or after it:
/// no slack either way, so a file the host made a millisecond before the run (an
/// orchestrator's fresh checkout) is never taken for the sandbox's. On a file system that
/// keeps whole seconds (`project`'s times have no nanoseconds: ext4 with small inodes, some
/// network file systems), the second's start: a change in this second is stamped with it.
pub fn start_mark(project: &Path) -> i128 {
    let now = crate::eval::scan::now_ns();
    let now = match PROCESS_START.get() {
        Some(&t) if (0..PROCESS_START_FOR).contains(&(now - t)) => t,
        _ => now,
    };
    let whole_seconds =
        rustix::fs::lstat(project).is_ok_and(|st| st.st_ctime_nsec == 0 && st.st_mtime_nsec == 0);
    if whole_seconds {
        now - now.rem_euclid(1_000_000_000)
    } else {
        now
    }
}

/// File systems whose times this kernel stamps itself, from its own clock, and that no one
/// can set a ctime on: ext2/3/4, XFS, Btrfs, tmpfs, ramfs, overlayfs, F2FS, ZFS, bcachefs.
/// Elsewhere (NFS, SMB, FUSE and sshfs, 9p, virtiofs, FAT) a server's clock or the file's
/// mtime stands in for the ctime, and the check below the top cannot rely on it.
const STAMPED_HERE: &[i64] = &[
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0x8584_58f6,
    0x794c_7630,
    0xF2F5_2010,
    0x2FC1_2FC1,
    0xca45_1a4e,
];

/// Whether the ctimes of `project`'s file system can be trusted (see [`STAMPED_HERE`]);
/// true when it cannot be asked.
// `f_type`'s type differs between architectures (i64 here, u32 on s390x).
#[allow(clippy::unnecessary_cast)]
fn ctimes_trusted(project: &Path) -> bool {
    rustix::fs::statfs(project).map_or(true, |st| STAMPED_HERE.contains(&(st.f_type as i64)))
}

/// At most this long is waited for the coarse clock (a tick is 1 to 10 ms).
const SETTLE_MAX: std::time::Duration = std::time::Duration::from_millis(50);

/// Wait until the clock the kernel stamps ctimes from (the coarse one, which lags the precise
/// one by up to a tick) has reached `mark`: from then on every change is stamped at or after
/// it. Called before the sandbox starts; usually aisb's set-up since the mark took longer
/// than a tick and nothing is waited for.
pub fn settle(mark: i128) {
    let coarse = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::RealtimeCoarse);
        t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128
    };
    let deadline = std::time::Instant::now() + SETTLE_MAX;
    loop {
        let behind = mark - coarse();
        if behind <= 0 || std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_nanos(
            (behind as u64).min(1_000_000) + 50_000,
        ));
    }
}

/// At most this many entries are looked at (a run that unpacked a huge tree into the project):
/// past it, what the sandbox made and was not looked at is moved aside.
const MAX_ENTRIES: usize = 2_000_000;

/// From this many directories on, two threads look at them.
const PARALLEL_DIRS: usize = 4096;

/// A directory (not a link) made read-only or unreadable inside: all of it for its owner
/// again (`u+rwx`), so that it can be looked into and what is in it moved.
/// Opened beneath `project` (never through a link, whatever the sandbox swaps meanwhile) and
/// changed through that descriptor: a link put in its place cannot turn the chmod onto a
/// directory outside the project.
fn open_to_owner(project: &Path, path: &Path) {
    use rustix::fs::{fstat, FileType, Mode};
    use std::os::fd::AsRawFd;
    let Ok(rel) = path.strip_prefix(project) else {
        return;
    };
    let Ok(fd) = crate::git::dir_beneath(project, rel) else {
        return;
    };
    let Ok(st) = fstat(&fd) else { return };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return;
    }
    // An O_PATH descriptor cannot be fchmod'ed; its /proc entry names the very inode.
    let mode = (st.st_mode & 0o7777) | 0o700;
    let _ = rustix::fs::chmod(
        format!("/proc/self/fd/{}", fd.as_raw_fd()),
        Mode::from_raw_mode(mode),
    );
}

/// Whether the directory `fd` holds a `HEAD` file, `objects/` and `refs/`: what git takes for
/// a bare repository.
fn bare_repo(fd: &std::os::fd::OwnedFd) -> bool {
    use rustix::fs::{statat, AtFlags, FileType};
    let is = |n: &str, t: FileType| {
        statat(fd, n, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == t)
    };
    is("HEAD", FileType::RegularFile)
        && is("objects", FileType::Directory)
        && is("refs", FileType::Directory)
}

fn ctime_ns(st: &rustix::fs::Stat) -> i128 {
    st.st_ctime as i128 * 1_000_000_000 + st.st_ctime_nsec as i128
}

/// The protected names below the project's top (`eval::protect::nested`: a `sub/.envrc`, a
/// `packages/x/.npmrc`, a `pkg/.vscode/`) that the sandbox made, with what obeys each. Looked
/// for in each of `dirs` (the scan's, relative) whose ctime moved since `since_ns` (an entry
/// made, renamed in or removed moves it; the sandbox cannot set a ctime), and throughout any
/// directory the scan did not know (made or renamed in by the sandbox, or a skipped one made
/// anew: a dependency directory whose parent was renamed away with its layer). An entry of a
/// known directory counts when its own ctime moved and it is not one of the files bound
/// read-only (`bound`: their identity at start); in a new directory every one counts, whatever
/// its ctime (a tree written by an earlier run and renamed into place keeps its old times).
/// Also found: a git repository made below the top (the host's git would obey its
/// configuration), and a new link to a directory the check does not look through (outside the
/// project, below a skipped directory): the host's tool would find its files through it.
/// Directories are opened beneath the project without following links; one that cannot be
/// opened or read (made unreadable) is the find itself when it is new; so is every new
/// directory left when [`MAX_ENTRIES`] is reached. The second value: the check could not look
/// everywhere (a known directory it could not read).
fn created_below(
    project: &Path,
    dirs: &crate::eval::plan::ProjectDirs,
    since_ns: i128,
    bound: &[(PathBuf, u64, u64)],
) -> (Vec<(PathBuf, &'static str)>, bool) {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
    use std::os::unix::ffi::OsStrExt;
    const GIT: &str = "the host's git obeys a repository's configuration and hooks";
    const LINK: &str =
        "a link under a protected name, or to where aisb does not look: the host's tools would read what is there";
    const UNREAD: &str = "a directory made so that aisb could not look into it";
    const TOO_BIG: &str = "a directory too big for aisb to look through";
    let mut found = Vec::new();
    let Ok(root) = rustix::fs::open(
        project,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return (found, !dirs.dirs.is_empty());
    };
    let since = since_ns;
    let stat = |rel: &[u8]| {
        rustix::fs::statat(
            &root,
            std::ffi::OsStr::from_bytes(rel),
            AtFlags::SYMLINK_NOFOLLOW | AtFlags::EMPTY_PATH,
        )
        .ok()
    };
    // A directory changed since (its ctime), or another one under its name (renamed in: a
    // tree made by an earlier run keeps its times, so all of it is looked at, as new).
    let changed = |part: &[(Vec<u8>, u64)]| -> Vec<(Vec<u8>, bool)> {
        part.iter()
            .filter_map(|(d, ino)| {
                let st = stat(d)?;
                if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                    return None;
                }
                if st.st_ino != *ino {
                    Some((d.clone(), true))
                } else {
                    (ctime_ns(&st) >= since).then(|| (d.clone(), false))
                }
            })
            .collect()
    };
    // One stat per directory: a big repository has tens of thousands, so two threads share
    // them (as the scan's own check does at start).
    let mut todo =
        crate::eval::scan::in_halves(&dirs.dirs, PARALLEL_DIRS, changed, |b| changed(b)).concat();
    if todo.is_empty() {
        return (found, false);
    }
    let known: std::collections::HashSet<&[u8]> =
        dirs.dirs.iter().map(|(d, _)| d.as_slice()).collect();
    let skipped: std::collections::HashSet<&[u8]> = dirs.skip.iter().map(Vec::as_slice).collect();
    // Where a new link may lead without being a find, by its text alone: below the project,
    // not into a skipped directory or a git directory (which the check does not look
    // through), or into the read-only Nix store (`result -> /nix/store/…`).
    let leads_to_looked_at = |dir: &[u8], target: &[u8]| -> bool {
        if target.starts_with(b"/nix/store/") {
            return true;
        }
        let project_bytes = project.as_os_str().as_bytes();
        let mut parts: Vec<&[u8]> = Vec::new();
        let rest = match target.strip_prefix(project_bytes) {
            Some(r) if r.is_empty() || r[0] == b'/' => r,
            _ if target.first() == Some(&b'/') => return false,
            _ => {
                parts.extend(dir.split(|b| *b == b'/').filter(|c| !c.is_empty()));
                target
            }
        };
        for c in rest.split(|b| *b == b'/') {
            match c {
                b"" | b"." => {}
                b".." => {
                    if parts.pop().is_none() {
                        return false;
                    }
                }
                c => parts.push(c),
            }
        }
        let rel = parts.join(&b'/');
        !dirs
            .skip
            .iter()
            .any(|s| rel == *s || crate::eval::scan::below(&rel, s))
            && !parts.iter().any(|c| *c == b".git")
    };
    let path_of = |rel: &[u8]| project.join(std::ffi::OsStr::from_bytes(rel));
    let mut entries_read = 0usize;
    let mut short = false;
    while let Some((dir, new_dir)) = todo.pop() {
        let open = || {
            if dir.is_empty() {
                rustix::io::dup(&root)
            } else {
                rustix::fs::openat2(
                    &root,
                    std::ffi::OsStr::from_bytes(&dir),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
                )
            }
        };
        let fd = match open() {
            Ok(fd) => fd,
            Err(rustix::io::Errno::ACCESS) => {
                // Made unreadable inside (`chmod 311`): readable for its owner again, as the
                // quarantine does, then looked at; or, when that is not ours to do, the find.
                let p = path_of(&dir);
                open_to_owner(project, &p);
                match open() {
                    Ok(fd) => fd,
                    Err(_) if new_dir => {
                        found.push((p, UNREAD));
                        continue;
                    }
                    Err(_) => {
                        short = true;
                        continue;
                    }
                }
            }
            // Gone (removed, renamed: its new name is looked at where it is now) or swapped
            // for a link: nothing under this name for a host tool to obey.
            Err(_) => continue,
        };
        let Ok(mut entries) = rustix::fs::Dir::read_from(&fd) else {
            if new_dir {
                found.push((path_of(&dir), UNREAD));
            } else {
                short = true;
            }
            continue;
        };
        // This directory's `HEAD` is a find once, whichever of its names shows it first.
        let mut bare_found = false;
        loop {
            let entry = match entries.read() {
                None => break,
                Some(Ok(e)) => e,
                Some(Err(_)) => {
                    if new_dir {
                        found.push((path_of(&dir), UNREAD));
                    } else {
                        short = true;
                    }
                    break;
                }
            };
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            entries_read += 1;
            if entries_read > MAX_ENTRIES {
                // Fail closed: what was not looked at of what the sandbox made is moved aside.
                if new_dir {
                    found.push((path_of(&dir), TOO_BIG));
                }
                found.extend(
                    todo.iter()
                        .filter(|(_, new)| *new)
                        .map(|(d, _)| (path_of(d), TOO_BIG)),
                );
                return (found, true);
            }
            let rel = if dir.is_empty() {
                name.to_vec()
            } else {
                [&dir[..], b"/", name].concat()
            };
            let Ok(st) = rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let kind = FileType::from_raw_mode(st.st_mode);
            let is_dir = kind == FileType::Directory;
            let fresh = new_dir || ctime_ns(&st) >= since;
            let path = path_of(&rel);
            let top = dir.is_empty();
            // Unless `unprotect` opened it.
            if let Some((_, _, why)) = crate::eval::protect::nested(&rel)
                .filter(|(len, _, _)| !dirs.opened.iter().any(|o| *o == rel[..*len]))
            {
                let kept = bound
                    .iter()
                    .any(|(p, dev, ino)| *p == path && (*dev, *ino) == (st.st_dev, st.st_ino));
                if fresh && !kept {
                    found.push((path, why));
                    continue;
                }
            }
            if top && name == b".git" {
                // The project's own: its git layer's.
                continue;
            }
            if !bare_found
                && fresh
                && matches!(name, b"HEAD" | b"objects" | b"refs" | b"config")
                && bare_repo(&fd)
            {
                // `HEAD`, `objects/` and `refs/` side by side, one of them (or `config`) new:
                // the host's git, run in this directory, takes it for a bare repository and
                // obeys its `config`. Its `HEAD` moved aside, it is none.
                let head = path_of(&if dir.is_empty() {
                    b"HEAD".to_vec()
                } else {
                    [&dir[..], b"/HEAD"].concat()
                });
                found.push((head, GIT));
                bare_found = true;
            }
            if kind == FileType::Symlink {
                // Never followed (an automount or a network path would hang the host's aisb or
                // reach out): read, and resolved by name only.
                if fresh
                    && (crate::eval::protect::starts_a_name(name)
                        || rustix::fs::readlinkat(&fd, entry.file_name(), Vec::new())
                            .map(|t| !leads_to_looked_at(&dir, t.as_bytes()))
                            .unwrap_or(true))
                {
                    found.push((path, LINK));
                }
                continue;
            }
            if !is_dir {
                continue;
            }
            let is_known = known.contains(rel.as_slice());
            if skipped.contains(rel.as_slice()) {
                // A dependency, cache or masked directory: its writes stay in the sandbox's
                // layer, unless this is a new one in its place (the old one renamed away
                // with its layer mounted on it).
                if fresh {
                    todo.push((rel, true));
                }
                continue;
            }
            if !is_known {
                todo.push((rel, true));
            }
        }
    }
    (found, short)
}

/// Move each of `paths` that exists into `into`; returns those moved.
fn quarantine(
    project: &Path,
    into: &Path,
    protected: &[Protected],
    paths: &[PathBuf],
    audit: Option<&crate::audit::Log>,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    // Looked up per file moved: a sandbox can make a million of them.
    let whys: std::collections::HashMap<&Path, &str> = protected
        .iter()
        .map(|p| (p.path.as_path(), p.why.as_str()))
        .collect();
    for path in paths {
        if !path.starts_with(project) {
            continue;
        }
        // Through a linked parent (`ln -s x .claude`): what the host's tool would read is where
        // the link leads; moved when that is below the project, by a path without links.
        let path = if has_link_between(project, path) {
            match std::fs::canonicalize(path) {
                Ok(real) if real.starts_with(project) && !has_link_between(project, &real) => real,
                _ => continue,
            }
        } else {
            path.clone()
        };
        let path = &path;
        match std::fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => {
                eprintln!(
                    "aisb: WARNING: {} was created by the sandbox under a path too long to move aside: remove it before any tool reads it",
                    path.display()
                );
                continue;
            }
            Err(_) => continue,
        }
        let mut moved = crate::git::quarantine_beneath(project, path, into);
        if moved.is_none() {
            // A directory made read-only inside (`chmod 555 .vscode`) keeps what is in it:
            // made writable for its owner again, then moved.
            if let Some(parent) = path.parent().filter(|p| p.starts_with(project)) {
                open_to_owner(project, parent);
            }
            open_to_owner(project, path);
            moved = crate::git::quarantine_beneath(project, path, into);
        }
        let Some((from, to)) = moved else {
            eprintln!(
                "aisb: WARNING: {} was created by the sandbox and could not be moved aside: remove it before any tool reads it",
                path.display()
            );
            if let Some(log) = audit {
                let _ = log.write(crate::audit::Kind::Quarantine {
                    path: path.to_string_lossy().into_owned(),
                    moved_to: String::new(),
                    why: "could not be moved aside".into(),
                });
            }
            continue;
        };
        let why = whys
            .get(from.as_path())
            .copied()
            .unwrap_or("the host runs or obeys it");
        report(
            audit,
            &from,
            &to,
            &format!(
                "was created by the sandbox ({why}); nothing inside may write what the host runs"
            ),
            why.to_string(),
        );
        out.push(from);
    }
    out
}

/// Whether a directory strictly between `root` and `path` is a symbolic link (or missing).
pub(crate) fn has_link_between(root: &Path, path: &Path) -> bool {
    let Ok(rel) = path.strip_prefix(root) else {
        return true;
    };
    let mut at = root.to_path_buf();
    let mut parts = rel.components().peekable();
    while let Some(c) = parts.next() {
        if parts.peek().is_none() {
            break;
        }
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(md) if md.is_dir() => {}
            _ => return true,
        }
    }
    false
}

/// Say that `from` was moved to `to`: on stderr (`what` it was) and in the audit log (`why`).
pub(crate) fn report(
    audit: Option<&crate::audit::Log>,
    from: &Path,
    to: &Path,
    what: &str,
    why: String,
) {
    eprintln!(
        "aisb: {} {what}; moved to {}\n  help: look at it there, and move it back yourself if you want it",
        from.display(),
        to.display()
    );
    if let Some(log) = audit {
        let _ = log.write(crate::audit::Kind::Quarantine {
            path: from.to_string_lossy().into_owned(),
            moved_to: to.to_string_lossy().into_owned(),
            why,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctime_of(p: &Path) -> i128 {
        ctime_ns(&rustix::fs::lstat(p).unwrap())
    }

    /// A directory of the project swapped for a link (by a sandbox still running, or another
    /// run's) never turns the quarantine's move or its chmod onto what lies outside: both
    /// go through descriptors opened beneath the project without links.
    #[test]
    fn a_linked_directory_never_leads_the_move_or_the_chmod_outside() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let project = t.path().join("proj");
        let outside = t.path().join("outside");
        let quarantine = t.path().join("q");
        std::fs::create_dir_all(project.join("real")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join(".envrc"), "the user's").unwrap();
        std::fs::write(project.join("real/.envrc"), "planted").unwrap();
        std::os::unix::fs::symlink(&outside, project.join("sub")).unwrap();
        // Through the link: nothing moved.
        assert!(
            crate::git::quarantine_beneath(&project, &project.join("sub/.envrc"), &quarantine)
                .is_none()
        );
        assert_eq!(
            std::fs::read_to_string(outside.join(".envrc")).unwrap(),
            "the user's"
        );
        // Without one: moved.
        let (from, to) =
            crate::git::quarantine_beneath(&project, &project.join("real/.envrc"), &quarantine)
                .unwrap();
        assert_eq!(from, project.join("real/.envrc"));
        assert_eq!(std::fs::read_to_string(to).unwrap(), "planted");
        // The chmod: the directory outside keeps its mode; one inside is opened to its owner.
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o555)).unwrap();
        open_to_owner(&project, &project.join("sub"));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&outside), 0o555);
        std::fs::set_permissions(project.join("real"), std::fs::Permissions::from_mode(0o555))
            .unwrap();
        open_to_owner(&project, &project.join("real"));
        assert_eq!(mode(&project.join("real")), 0o755);
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// The project's own file system (here: what the tests' temporary directories are on)
    /// is trusted; one whose times are not this kernel's own stamps (here: procfs) is not.
    #[test]
    fn ctimes_are_trusted_only_where_this_kernel_stamps_them() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ctimes_trusted(dir.path()));
        assert!(!ctimes_trusted(Path::new("/proc")));
    }

    /// A wall clock set back since the start moves the start back as far (and a tick more):
    /// what the sandbox wrote after the step is stamped before the start. Set forward, or
    /// left alone, it stays.
    #[test]
    fn a_clock_set_back_moves_the_start_back() {
        let since = 1_000_000_000_000;
        let back = stepped_back(since, Some(wall_lead() + 5_000_000_000));
        // Within a millisecond: the two leads are read a moment apart.
        let expected = since - 5_000_000_000 - 4_000_000;
        assert!((back - expected).abs() < 1_000_000, "{back} vs {expected}");
        assert_eq!(
            stepped_back(since, Some(wall_lead() - 1_000_000_000)),
            since
        );
        assert_eq!(stepped_back(since, None), since);
        // The reads' own jitter (a preemption between them on a loaded host) is no step.
        assert_eq!(stepped_back(since, Some(wall_lead() + 1_000_000)), since);
    }

    /// The lead is read tightly: a thousand reads agree within the tolerance, on a host as
    /// loaded as the tests make it.
    #[test]
    fn the_wall_clocks_lead_reads_steadily() {
        let reads: Vec<i128> = (0..1000).map(|_| wall_lead()).collect();
        let (min, max) = (reads.iter().min().unwrap(), reads.iter().max().unwrap());
        assert!(max - min < STEP_TOLERANCE, "{}", max - min);
    }

    /// The start mark tells the host's files from the sandbox's with no slack: made before
    /// the mark is stamped before it, made after `settle` is stamped at or after it (many
    /// times over, so a lagging tick would show).
    #[test]
    fn the_start_mark_parts_before_from_after() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..200 {
            let before = dir.path().join(format!("b{i}"));
            std::fs::write(&before, "x").unwrap();
            let mark = start_mark(dir.path());
            assert!(
                ctime_of(&before) < mark,
                "round {i}: made before, stamped after"
            );
            settle(mark);
            let after = dir.path().join(format!("a{i}"));
            std::fs::write(&after, "x").unwrap();
            assert!(
                ctime_of(&after) >= mark,
                "round {i}: made after, stamped before"
            );
        }
    }
}
