//! The cgroup aisb makes for a bwrap sandbox (bubblewrap has no cgroup support of its own):
//! created with the plan's limits before bwrap starts, joined by bwrap's own process between
//! fork and exec (so everything the sandbox ever starts is in it), read after the run for the
//! limits it ran into, and removed.
//!
//! Only the controllers the limits need: `pids` always, `memory` and `cpu` when configured. On
//! cgroup v1 that is one directory in each of those hierarchies (libcontainer makes one in all
//! eight; cpuset's is the slow one); on v2, one directory with those controllers enabled in the
//! levels above it. Root's sandboxes go under `aisb/`; an ordinary user's under the cgroup
//! root's one-time `aisb setup-user` delegated to them (`aisb/user-<uid>`, cgroup v1 only: on
//! v2 moving a process needs write access to the common ancestor's `cgroup.procs`, which only a
//! service manager's delegation gives).

use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::rootless::{cgroup_layout, delegated_parent, CgroupLayout};
use crate::eval::plan::Limits;

const ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum CgroupError {
    #[error("cannot set up the sandbox's cgroup: {what} {path}: {source}")]
    #[diagnostic(help(
        "`aisb doctor` says how limits are enforced on this host; the `limits` node in sandbox.kdl sets them"
    ))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io<T>(what: &'static str, path: &Path, r: std::io::Result<T>) -> Result<T, CgroupError> {
    r.map_err(|source| CgroupError::Io {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The limits a finished sandbox ran into, read from its cgroup.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hits {
    /// Forks and clones refused at the pids limit.
    pub pids: u64,
    /// Processes the kernel's OOM killer killed at the memory limit.
    pub oom_kills: u64,
}

/// The controllers `limits` needs.
pub fn controllers(limits: &Limits) -> Vec<&'static str> {
    let mut c = vec!["pids"];
    if limits.memory.is_some() {
        c.push("memory");
    }
    if limits.cpus_milli.is_some() {
        c.push("cpu");
    }
    c
}

/// Mount point of the cgroup v1 hierarchy that has `controller` (the controllers are the
/// mount's super options, e.g. `rw,cpu,cpuacct`).
pub fn v1_mount(controller: &str) -> Option<PathBuf> {
    super::rootless::v1_mounts()
        .iter()
        .find(|(_, opts)| opts.iter().any(|o| o == controller))
        .map(|(p, _)| p.clone())
}

/// The directory under which `uid`'s sandbox cgroups go, relative to a hierarchy's root.
fn parent_of(uid: u32) -> String {
    if uid == 0 {
        "aisb".into()
    } else {
        delegated_parent(uid).trim_start_matches('/').to_string()
    }
}

/// Whether `uid` (the caller) can make a cgroup with these controllers here; the reason when
/// not.
pub fn available(limits: &Limits, uid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let wanted = controllers(limits);
    match cgroup_layout() {
        CgroupLayout::Unified => {
            if uid != 0 {
                return Err(
                    "cgroup v2: an ordinary user can only move a process between cgroups \
                            below one their service manager delegated to them"
                        .into(),
                );
            }
            let have =
                fs::read_to_string(Path::new(ROOT).join("cgroup.controllers")).unwrap_or_default();
            match wanted
                .iter()
                .find(|c| !have.split_whitespace().any(|h| h == **c))
            {
                Some(c) => Err(format!("cgroup v2 has no `{c}` controller here")),
                None => Ok(()),
            }
        }
        CgroupLayout::V1 => {
            for c in wanted {
                let Some(mount) = v1_mount(c) else {
                    return Err(format!("no cgroup v1 `{c}` hierarchy is mounted"));
                };
                if uid != 0 {
                    let dir = mount.join(parent_of(uid));
                    let owned = fs::metadata(&dir).is_ok_and(|m| m.uid() == uid)
                        && fs::metadata(dir.join("cgroup.procs")).is_ok_and(|m| m.uid() == uid);
                    if !owned {
                        return Err(format!(
                            "cgroup v1: {} is not delegated to this user",
                            dir.display()
                        ));
                    }
                }
            }
            Ok(())
        }
    }
}

/// Ends a per-run cgroup's name, before the pid of the aisb that made it (`proj-ab12-run4242`).
pub const RUN_PREFIX: &str = "run";

/// Remove the per-run cgroups in `above` whose aisb is gone (killed before it could), and
/// what still runs in them: a sandbox whose aisb died has nobody to forward signals to it, run
/// its proxy or remove it (bwrap's die-with-parent misses an aisb killed while bwrap sets up).
fn remove_stale(above: &Path) {
    let Ok(entries) = fs::read_dir(above) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .rsplit_once('-')
            .and_then(|(_, run)| run.strip_prefix(RUN_PREFIX))
            .and_then(|p| p.parse::<i32>().ok());
        let gone = pid.is_some_and(|p| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None)
                == Err(nix::errno::Errno::ESRCH)
        });
        if gone && e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_dir(&e.path());
        }
    }
}

/// A sandbox's cgroup: one directory per v1 hierarchy, or one on v2. Removed on drop.
pub struct Cgroup {
    dirs: Vec<PathBuf>,
    /// Each directory's `cgroup.procs`, opened before the fork: the child only writes to them.
    procs: Vec<OwnedFd>,
}

impl Cgroup {
    /// Make the cgroup `name` for `uid` with `limits` set (see [`available`] first).
    pub fn create(name: &str, limits: &Limits, uid: u32) -> Result<Cgroup, CgroupError> {
        let parent = parent_of(uid);
        let mut cg = Cgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        match cgroup_layout() {
            CgroupLayout::Unified => {
                let root = Path::new(ROOT);
                let above = root.join(&parent);
                io("creating", &above, fs::create_dir_all(&above))?;
                // A controller's files exist in a cgroup only when every level above enables
                // it; levels without processes of their own may (v2's no-internal-process rule).
                for level in [root, above.as_path()] {
                    let control = level.join("cgroup.subtree_control");
                    for c in controllers(limits) {
                        let _ = fs::write(&control, format!("+{c}"));
                    }
                }
                let dir = cg.make(&above.join(name))?;
                write(&dir, "pids.max", limits.pids)?;
                if let Some(m) = limits.memory {
                    write(&dir, "memory.max", m)?;
                    if dir.join("memory.swap.max").exists() {
                        write(&dir, "memory.swap.max", 0)?;
                    }
                }
                if let Some(c) = limits.cpus_milli {
                    let period = crate::spec::CPU_PERIOD_US;
                    let quota = u64::from(c) * period / 1000;
                    write(&dir, "cpu.max", format!("{quota} {period}"))?;
                }
            }
            CgroupLayout::V1 => {
                for c in controllers(limits) {
                    let mount = v1_mount(c).ok_or_else(|| CgroupError::Io {
                        what: "finding the cgroup v1 hierarchy",
                        path: PathBuf::from(ROOT).join(c),
                        source: std::io::ErrorKind::NotFound.into(),
                    })?;
                    let above = mount.join(&parent);
                    if uid == 0 {
                        io("creating", &above, fs::create_dir_all(&above))?;
                    }
                    let dir = cg.make(&above.join(name))?;
                    match c {
                        "pids" => write(&dir, "pids.max", limits.pids)?,
                        "memory" => {
                            let m = limits.memory.unwrap_or(u64::MAX);
                            write(&dir, "memory.limit_in_bytes", m)?;
                            // Memory plus swap: present only with swap accounting.
                            if dir.join("memory.memsw.limit_in_bytes").exists() {
                                write(&dir, "memory.memsw.limit_in_bytes", m)?;
                            }
                        }
                        _ => {
                            let period = crate::spec::CPU_PERIOD_US;
                            let quota = u64::from(limits.cpus_milli.unwrap_or(0)) * period / 1000;
                            write(&dir, "cpu.cfs_period_us", period)?;
                            write(&dir, "cpu.cfs_quota_us", quota)?;
                        }
                    }
                }
            }
        }
        Ok(cg)
    }

    /// mkdir (a leftover of a crashed run by the same name is removed first) and open its
    /// `cgroup.procs`.
    fn make(&mut self, dir: &Path) -> Result<PathBuf, CgroupError> {
        if let Some(above) = dir.parent() {
            remove_stale(above);
        }
        if dir.exists() {
            remove_dir(dir);
        }
        io("creating", dir, fs::create_dir(dir))?;
        self.dirs.push(dir.to_path_buf());
        let procs = dir.join(join_file(dir));
        let f = io(
            "opening",
            &procs,
            fs::OpenOptions::new().write(true).open(&procs),
        )?;
        self.procs.push(f.into());
        Ok(dir.to_path_buf())
    }

    /// The descriptors a child writes `0` (itself) into, between fork and exec.
    pub fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// What the sandbox ran into (read before the cgroup goes).
    pub fn hits(&self) -> Hits {
        let mut h = Hits::default();
        for d in &self.dirs {
            let got = hits_in(d);
            h.pids = h.pids.max(got.pids);
            h.oom_kills = h.oom_kills.max(got.oom_kills);
        }
        h
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.procs.clear();
        for d in &self.dirs {
            remove_dir(d);
        }
    }
}

/// The `cgroup.procs` of the sandbox cgroups (below an `aisb` directory) that `pid` is in,
/// opened for writing: a second session in a running sandbox joins them before it enters,
/// or it would run outside the sandbox's limits.
pub fn open_procs_of(pid: i32) -> std::io::Result<Vec<OwnedFd>> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let mut files: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if !path.starts_with("/aisb/") {
            continue;
        }
        let rel = path.trim_start_matches('/');
        if ctrls.is_empty() {
            if cgroup_layout() == CgroupLayout::Unified {
                let dir = Path::new(ROOT).join(rel);
                files.push(dir.join(join_file(&dir)));
            }
            continue;
        }
        for c in ctrls
            .split(',')
            .filter(|c| ["pids", "memory", "cpu"].contains(c))
        {
            if let Some(m) = v1_mount(c) {
                let dir = m.join(rel);
                files.push(dir.join(join_file(&dir)));
            }
        }
    }
    files.sort();
    files.dedup();
    files
        .iter()
        .map(|p| Ok(fs::OpenOptions::new().write(true).open(p)?.into()))
        .collect()
}

/// The file a single-threaded child joins `dir` through: v1's `tasks`, which moves the calling
/// thread (the whole process, when it has one), else `cgroup.procs`. Moving a thread group
/// (`cgroup.procs`) takes the cgroup threadgroup lock for writing, which waits for an RCU
/// grace period: measured here, a median of 9 ms per sandbox start (0.4 ms at best); moving
/// one thread takes no such lock. v2 has no `tasks`.
fn join_file(dir: &Path) -> &'static str {
    if dir.join("tasks").exists() {
        "tasks"
    } else {
        "cgroup.procs"
    }
}

/// Join the cgroups whose `tasks` (v1) or `cgroup.procs` (v2) are `fds`, as the calling
/// process, which must have one thread: for a child between fork and exec (only `write(2)`,
/// which is async-signal-safe).
pub fn join(fds: &[RawFd]) -> std::io::Result<()> {
    for fd in fds {
        // SAFETY: a plain write of a static buffer to a descriptor we own.
        if unsafe { nix::libc::write(*fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn write(dir: &Path, file: &str, value: impl std::fmt::Display) -> Result<(), CgroupError> {
    let path = dir.join(file);
    let r = fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|mut f| f.write_all(value.to_string().as_bytes()));
    io("writing", &path, r)
}

/// `key N` from a flat keyed cgroup file.
fn keyed(path: &Path, key: &str) -> u64 {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// What the cgroup at `dir` (any hierarchy, either version) recorded.
fn hits_in(dir: &Path) -> Hits {
    Hits {
        pids: keyed(&dir.join("pids.events"), "max"),
        // v2 `memory.events`; v1 `memory.oom_control` (oom_kill since Linux 4.13).
        oom_kills: keyed(&dir.join("memory.events"), "oom_kill")
            .max(keyed(&dir.join("memory.oom_control"), "oom_kill")),
    }
}

/// What the cgroup a runtime made at `rel` (an OCI `cgroupsPath`) recorded, in the pids and
/// memory hierarchies (v1) or the unified one.
pub fn hits_at(rel: &str) -> Hits {
    let rel = rel.trim_start_matches('/');
    let dirs: Vec<PathBuf> = match cgroup_layout() {
        CgroupLayout::Unified => vec![Path::new(ROOT).join(rel)],
        CgroupLayout::V1 => ["pids", "memory"]
            .iter()
            .filter_map(|c| Some(v1_mount(c)?.join(rel)))
            .collect(),
    };
    dirs.iter().fold(Hits::default(), |h, d| {
        let got = hits_in(d);
        Hits {
            pids: h.pids.max(got.pids),
            oom_kills: h.oom_kills.max(got.oom_kills),
        }
    })
}

/// rmdir, once the processes are gone: after bwrap exits the kernel kills what is left in the
/// sandbox's pid namespace, but they leave the cgroup only when reaped. Whatever is still there
/// after a moment is killed (`cgroup.kill` on v2, each pid on v1).
fn remove_dir(dir: &Path) {
    let start = Instant::now();
    let mut killed = false;
    loop {
        let err = match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => e,
        };
        if err.raw_os_error() != Some(nix::libc::EBUSY) || start.elapsed() > Duration::from_secs(5)
        {
            eprintln!(
                "aisb: warning: could not remove the sandbox's cgroup {}: {err}",
                dir.display()
            );
            return;
        }
        if !killed && start.elapsed() > Duration::from_millis(100) {
            kill_all(dir);
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn kill_all(dir: &Path) {
    if fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    for pid in fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
