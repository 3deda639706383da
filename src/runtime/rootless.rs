//! Rootless libcontainer: what an ordinary user needs to run the libcontainer backend, and the
//! one-time root step that provides it.
//!
//! libcontainer's init process becomes root inside the sandbox's user namespace to set it up
//! (mounts, hostname) and only then switches to the caller's uid. So the namespace must map
//! two ids: container 0 to one of the caller's subordinate ids (`/etc/subuid`, written with
//! the setuid `newuidmap` from the `uidmap` package), and the caller's own uid to itself, so
//! that files the sandbox writes are the caller's on the host.
//!
//! Cgroups: on a cgroup v2 host libcontainer leaves an unprivileged caller in its own cgroup
//! when it cannot create one. On cgroup v1 (and hybrid) hosts it must create a cgroup in every
//! controller hierarchy, which an ordinary user can only do inside a directory root handed to
//! them: `aisb setup-user NAME` creates `<controller>/aisb/user-<uid>` owned by the user.

use std::fs;
use std::path::{Path, PathBuf};

use crate::spec::Rootless;

/// The cgroup mount point on every Linux host we support.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RootlessError {
    #[error("{user} has no subordinate {kind}s in {file}: the libcontainer backend needs one to run rootless")]
    #[diagnostic(help(
        "one-time, as root: `aisb setup-user {user}` (or `usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}`); or use `--backend bwrap`"
    ))]
    NoSubordinate {
        user: String,
        kind: &'static str,
        file: &'static str,
    },
    #[error(
        "`{tool}` is not installed: the libcontainer backend needs it to map ids when run rootless"
    )]
    #[diagnostic(help("install it (Debian: apt-get install uidmap); or use `--backend bwrap`"))]
    NoMapper { tool: &'static str },
    #[error("this host uses cgroup v1, and no cgroup is delegated to {user} (missing {missing})")]
    #[diagnostic(help(
        "one-time, as root: `aisb setup-user {user}` creates a cgroup {user} owns in each hierarchy; or use `--backend bwrap`"
    ))]
    NotDelegated { user: String, missing: PathBuf },
    #[error("cannot read {path}: {source}")]
    #[diagnostic(help("`aisb doctor` checks the host"))]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The first subordinate id of `user` (by name or uid) in a subuid/subgid file's text.
pub fn first_subordinate(text: &str, user: &str, id: u32) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut f = line.trim().split(':');
        let (who, start, count) = (f.next()?, f.next()?, f.next()?);
        let start: u32 = start.parse().ok()?;
        let count: u32 = count.parse().ok()?;
        ((who == user || who == id.to_string()) && count > 0).then_some(start)
    })
}

fn subordinate(
    file: &'static str,
    kind: &'static str,
    user: &str,
    id: u32,
) -> Result<u32, RootlessError> {
    let text = match fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(source) => {
            return Err(RootlessError::Read {
                path: file.into(),
                source,
            })
        }
    };
    first_subordinate(&text, user, id).ok_or_else(|| RootlessError::NoSubordinate {
        user: user.to_string(),
        kind,
        file,
    })
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// The cgroup layout of this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupLayout {
    /// cgroup v2 only.
    Unified,
    /// cgroup v1 controllers (with or without the v2 hierarchy beside them).
    V1,
}

pub fn cgroup_layout() -> CgroupLayout {
    if Path::new(CGROUP_ROOT).join("cgroup.controllers").exists() {
        CgroupLayout::Unified
    } else {
        CgroupLayout::V1
    }
}

/// The cgroup v1 hierarchies mounted here: each mount point with its super options (its
/// controllers, e.g. `rw,cpu,cpuacct`), from /proc/self/mountinfo, read once per process (a
/// run asks several times, and the mount table is long on a busy host).
pub fn v1_mounts() -> &'static [(PathBuf, Vec<String>)] {
    static MOUNTS: std::sync::OnceLock<Vec<(PathBuf, Vec<String>)>> = std::sync::OnceLock::new();
    MOUNTS.get_or_init(|| {
        let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
            return Vec::new();
        };
        info.lines()
            .filter_map(|l| {
                let (pre, post) = l.split_once(" - ")?;
                let mut post = post.split(' ');
                let (fstype, super_opts) = (post.next()?, post.nth(1)?);
                let mount_point = pre.split(' ').nth(4)?;
                (fstype == "cgroup").then(|| {
                    (
                        PathBuf::from(mount_point.replace("\\040", " ")),
                        super_opts.split(',').map(str::to_string).collect(),
                    )
                })
            })
            .collect()
    })
}

/// Mount points of the cgroup v1 controller hierarchies.
pub fn v1_hierarchies() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = v1_mounts().iter().map(|(p, _)| p.clone()).collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The cgroup parent delegated to `uid` (relative to each hierarchy's root).
pub fn delegated_parent(uid: u32) -> String {
    format!("/aisb/user-{uid}")
}

/// What the caller (an ordinary user) needs for a rootless libcontainer run: container root's
/// ids and the cgroup parent they may create cgroups in; or why they can't have it.
pub fn prepare(user: &str, uid: u32, gid: u32) -> Result<Rootless, RootlessError> {
    for tool in ["newuidmap", "newgidmap"] {
        if !on_path(tool) {
            return Err(RootlessError::NoMapper { tool });
        }
    }
    let root_uid = subordinate("/etc/subuid", "uid", user, uid)?;
    let root_gid = subordinate("/etc/subgid", "gid", user, gid)?;
    let cgroup_parent = delegated_parent(uid);
    if cgroup_layout() == CgroupLayout::V1 {
        use std::os::unix::fs::MetadataExt;
        for h in v1_hierarchies() {
            let dir = h.join(cgroup_parent.trim_start_matches('/'));
            let owned = fs::metadata(dir.join("cgroup.procs")).is_ok_and(|m| m.uid() == uid)
                && fs::metadata(&dir).is_ok_and(|m| m.uid() == uid);
            if !owned {
                return Err(RootlessError::NotDelegated {
                    user: user.to_string(),
                    missing: dir,
                });
            }
        }
    }
    Ok(Rootless {
        root_uid,
        root_gid,
        cgroup_parent,
        outer_userns: false,
    })
}

/// [`prepare`] for the user running aisb.
pub fn prepare_for_caller() -> Result<Rootless, RootlessError> {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid().as_raw();
    let name = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name);
    prepare(&name, uid.as_raw(), gid)
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SetupError {
    #[error("`aisb setup-user` changes the host and must run as root")]
    #[diagnostic(help("sudo aisb setup-user {0}"))]
    NotRoot(String),
    #[error("no such user: {0}")]
    #[diagnostic(help("name an existing account (see /etc/passwd)"))]
    NoUser(String),
    #[error("{what}: {source}")]
    #[diagnostic(help("check that /sys/fs/cgroup is mounted read-write"))]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("`usermod` failed: {0}")]
    #[diagnostic(help("add a range by hand to /etc/subuid and /etc/subgid: `{1}:100000:65536`"))]
    Usermod(String, String),
}

/// Free subordinate range start: above every range already in `text` and the defaults.
fn free_range(text: &str) -> u32 {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':').skip(1);
            let start: u64 = f.next()?.parse().ok()?;
            let count: u64 = f.next()?.parse().ok()?;
            Some((start + count).min(u32::MAX as u64) as u32)
        })
        .max()
        .unwrap_or(100_000)
        .max(100_000)
}

/// The one-time root step for `user`: subordinate ids if they have none, and on cgroup v1
/// hosts a cgroup in every hierarchy that they own. Returns what it did, one line each.
pub fn setup_user(user: &str) -> Result<Vec<String>, SetupError> {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        return Err(SetupError::NotRoot(user.to_string()));
    }
    let u = nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .ok_or_else(|| SetupError::NoUser(user.to_string()))?;
    let (uid, gid) = (u.uid.as_raw(), u.gid.as_raw());
    let mut done = Vec::new();
    let subuid = fs::read_to_string("/etc/subuid").unwrap_or_default();
    let subgid = fs::read_to_string("/etc/subgid").unwrap_or_default();
    let has_uid = first_subordinate(&subuid, user, uid).is_some();
    let has_gid = first_subordinate(&subgid, user, gid).is_some();
    if !has_uid || !has_gid {
        let start = free_range(&subuid).max(free_range(&subgid));
        let range = format!("{start}-{}", start + 65535);
        let mut cmd = std::process::Command::new("usermod");
        if !has_uid {
            cmd.args(["--add-subuids", &range]);
        }
        if !has_gid {
            cmd.args(["--add-subgids", &range]);
        }
        let out = cmd
            .arg(user)
            .output()
            .map_err(|e| SetupError::Usermod(e.to_string(), user.to_string()))?;
        if !out.status.success() {
            return Err(SetupError::Usermod(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
                user.to_string(),
            ));
        }
        done.push(format!("subordinate ids {range} for {user}"));
    }
    // Attempts on masked paths are recorded through a FUSE file system the user mounts in
    // the sandbox's user namespace (`runtime::live::deny`): /dev/fuse must be theirs to open,
    // as udev makes it (0666) wherever it runs. Only the FUSE device, only when it is not.
    if let Ok(m) = fs::metadata("/dev/fuse") {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let fuse = nix::sys::stat::makedev(10, 229);
        if m.file_type().is_char_device() && m.rdev() == fuse && m.mode() & 0o006 != 0o006 {
            match fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)) {
                Ok(()) => done.push(
                    "/dev/fuse opened to every user (mode 0666, as udev makes it): attempts on masked paths are recorded for them too".to_string(),
                ),
                Err(e) => done.push(format!(
                    "/dev/fuse stays root's ({e}): attempts on masked paths are not recorded for ordinary users"
                )),
            }
        }
    }
    if cgroup_layout() == CgroupLayout::V1 {
        let parent = delegated_parent(uid);
        for h in v1_hierarchies() {
            let dir = h.join(parent.trim_start_matches('/'));
            let io = |what: String| move |source| SetupError::Io { what, source };
            fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
            // cpuset: a cgroup with no cpus or mems takes no task; each level inherits its
            // parent's (top down: `aisb`, then the user's).
            for level in [dir.parent().unwrap_or(&h), &dir] {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let mine = level.join(f);
                    if fs::read_to_string(&mine).is_ok_and(|s| s.trim().is_empty()) {
                        let up = level.parent().unwrap_or(&h).join(f);
                        let from = fs::read_to_string(&up)
                            .map_err(io(format!("reading {}", up.display())))?;
                        fs::write(&mine, from.trim())
                            .map_err(io(format!("writing {}", mine.display())))?;
                    }
                }
            }
            // The directory and its control files: the user creates cgroups below it and
            // moves their own processes into them; the parent `aisb` stays root's.
            let mut changed = false;
            for e in std::iter::once(dir.clone()).chain(
                fs::read_dir(&dir)
                    .map_err(io(format!("listing {}", dir.display())))?
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                    .map(|e| e.path()),
            ) {
                if fs::metadata(&e).is_ok_and(|m| m.uid() != uid) {
                    std::os::unix::fs::chown(&e, Some(uid), Some(gid))
                        .map_err(io(format!("chown {}", e.display())))?;
                    changed = true;
                }
            }
            if changed {
                done.push(format!("cgroup {} delegated to {user}", dir.display()));
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subordinate_by_name_or_uid() {
        let t = "alice:100000:65536\n1001:200000:65536\nbob:300000:0\n";
        assert_eq!(first_subordinate(t, "alice", 1000), Some(100000));
        assert_eq!(first_subordinate(t, "carol", 1001), Some(200000));
        assert_eq!(first_subordinate(t, "bob", 1002), None, "empty range");
        assert_eq!(first_subordinate("garbage\n", "x", 1), None);
    }

    #[test]
    fn free_range_is_above_every_range() {
        assert_eq!(free_range(""), 100_000);
        assert_eq!(free_range("a:100000:65536\nb:165536:65536\n"), 231_072);
    }
}
