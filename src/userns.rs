//! An ordinary user's id map over their subordinate ids, for rootless image builds.
//!
//! A RUN step as an ordinary user runs as root in a user namespace that maps, with the setuid
//! `newuidmap`/`newgidmap` (Debian's `uidmap`), every id from 0 up to one of the caller's
//! subordinate ids (`/etc/subuid`, `/etc/subgid`), in order, except the caller's own id, which
//! stays itself: container root is the first subordinate id, and a user created with the
//! caller's uid (the `USER_ID` build argument) owns its files on the host as the caller. The
//! sandbox that runs the image later uses the same map, so every file keeps its id inside.
//!
//! Such files belong to ids the caller cannot unlink as itself; [`remove_trees`] removes them
//! from inside such a namespace (`aisb __userns rm`), where the caller is root over exactly
//! the ids they own. This module imports nothing of aisb but `beneath` (removal without following a link): the store, the runtime and the
//! build all use it.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One line of a uid or gid map: (inside, outside, count).
pub type IdRange = (u32, u32, u32);

/// The caller's uid and gid maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMaps {
    pub uid: Vec<IdRange>,
    pub gid: Vec<IdRange>,
}

/// Root of the host's own user namespace: overlayfs reads `trusted.overlay.*` there. Anyone
/// else (an ordinary user, or root of a user namespace, as aisb's helpers are or as in a
/// rootless container) marks and mounts with `user.overlay.*` (`userxattr`).
pub fn host_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| {
        nix::unistd::geteuid().is_root()
            && std::fs::read_to_string("/proc/self/uid_map").map_or(true, |m| {
                m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]
            })
    })
}

/// The map of `own` over the subordinate range `(start, count)`: inside ids 0, 1, ... are the
/// range's ids in order, skipping `own`, which maps to itself.
pub fn map_over(own: u32, (start, count): (u32, u32)) -> Vec<IdRange> {
    let below = own.min(count);
    let mut m = Vec::new();
    if below > 0 {
        m.push((0, start, below));
    }
    m.push((own, own, 1));
    if count > below {
        m.push((own + 1, start + below, count - below));
    }
    m
}

/// The host id an inside id maps to under `map`.
pub fn outside(map: &[IdRange], id: u32) -> Option<u32> {
    map.iter()
        .find(|(i, _, n)| id >= *i && id - i < *n)
        .map(|(i, o, _)| o + (id - i))
}

/// The inside id of a host id under `map` (the inverse of [`outside`]).
pub fn inside(map: &[IdRange], id: u32) -> Option<u32> {
    map.iter()
        .find(|(_, o, n)| id >= *o && id - o < *n)
        .map(|(i, o, _)| i + (id - o))
}

/// `user`'s (by name or uid) first subordinate range in a subuid/subgid file's text.
pub fn subordinate_range(text: &str, user: &str, id: u32) -> Option<(u32, u32)> {
    text.lines().find_map(|line| {
        let mut f = line.trim().split(':');
        let (who, start, count) = (f.next()?, f.next()?, f.next()?);
        let start: u32 = start.parse().ok()?;
        let count: u32 = count.parse().ok()?;
        ((who == user || who == id.to_string()) && count > 0 && start.checked_add(count).is_some())
            .then_some((start, count))
    })
}

/// Why the caller has no map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// `/etc/subuid` or `/etc/subgid` gives them no range.
    Subordinate { file: &'static str, user: String },
    /// `newuidmap` or `newgidmap` is not installed.
    Mapper(&'static str),
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::Subordinate { file, user } => {
                write!(f, "{user} has no subordinate ids in {file}")
            }
            Missing::Mapper(tool) => write!(f, "`{tool}` is not installed (Debian: uidmap)"),
        }
    }
}

fn on_path(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// The maps of the user running aisb, or what is missing for them.
pub fn caller_maps() -> Result<IdMaps, Missing> {
    for tool in ["newuidmap", "newgidmap"] {
        if on_path(tool).is_none() {
            return Err(Missing::Mapper(tool));
        }
    }
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let name = nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name);
    let range = |file: &'static str, id: u32| {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        subordinate_range(&text, &name, id).ok_or(Missing::Subordinate {
            file,
            user: name.clone(),
        })
    };
    Ok(IdMaps {
        uid: map_over(uid, range("/etc/subuid", uid)?),
        gid: map_over(gid, range("/etc/subgid", gid)?),
    })
}

/// Write `maps` for process `pid` (which has just made its user namespace) with the setuid
/// mappers; their complaint becomes the error.
pub fn write_maps(pid: i32, maps: &IdMaps) -> io::Result<()> {
    for (tool, map) in [("newuidmap", &maps.uid), ("newgidmap", &maps.gid)] {
        let mut cmd = Command::new(tool);
        cmd.arg(pid.to_string());
        for (i, o, n) in map {
            cmd.args([i.to_string(), o.to_string(), n.to_string()]);
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("running {tool}: {e}")))?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{tool} refused the map: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(())
}

/// `aisb __userns ARGS...` started in a user namespace with the caller's map, as its root:
/// the child makes the namespace and says so (one byte on its stdout), this side writes the
/// map and answers (one byte on its stdin), and the child's [`enter`] returns. Whatever the
/// caller writes to the child's stdin after that is the child's input.
pub fn spawn(args: &[std::ffi::OsString]) -> io::Result<std::process::Child> {
    let maps = caller_maps().map_err(|m| io::Error::other(m.to_string()))?;
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .arg("__userns")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let result = (|| {
        let mut ready = [0u8; 1];
        child
            .stdout
            .as_mut()
            .ok_or_else(|| io::Error::other("no pipe"))?
            .read_exact(&mut ready)?;
        write_maps(child.id() as i32, &maps)?;
        child
            .stdin
            .as_mut()
            .ok_or_else(|| io::Error::other("no pipe"))?
            .write_all(b"m")
    })();
    if let Err(e) = result {
        // Its own complaint (unshare refused, say) says more than a closed pipe.
        let _ = child.kill();
        let said = child
            .wait_with_output()
            .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
            .unwrap_or_default();
        return Err(if said.is_empty() {
            e
        } else {
            io::Error::new(e.kind(), format!("{e}: {said}"))
        });
    }
    Ok(child)
}

/// The child side of [`spawn`]: make the user namespace, wait for its map, become its root
/// (every capability over the ids it maps, which are the caller's). Must run before the
/// process has a second thread (unshare(CLONE_NEWUSER) refuses a threaded process).
pub fn enter() -> io::Result<()> {
    io::stdout().flush()?;
    enter_via(1, 0)
}

/// [`enter`], saying "ready" on descriptor `ready` and waiting for the answer on `go` (a
/// process whose stdin and stdout are its workload's).
pub fn enter_via(ready: i32, go: i32) -> io::Result<()> {
    use std::os::fd::BorrowedFd;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER)?;
    // SAFETY: descriptors the caller names, open for this call's duration.
    let (ready, go) = unsafe { (BorrowedFd::borrow_raw(ready), BorrowedFd::borrow_raw(go)) };
    if nix::unistd::write(ready, b"r")? != 1 {
        return Err(io::ErrorKind::WriteZero.into());
    }
    let mut answer = [0u8; 1];
    if nix::unistd::read(go.as_raw_fd(), &mut answer)? != 1 {
        return Err(io::Error::other("the map was not written"));
    }
    nix::unistd::setresgid(0.into(), 0.into(), 0.into())?;
    nix::unistd::setresuid(0.into(), 0.into(), 0.into())?;
    Ok(())
}

/// Wait for a [`spawn`]ed child; its stderr becomes the error.
pub fn finish(child: std::process::Child, what: &str) -> io::Result<()> {
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{what} (as the owner of the subordinate ids): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// `std::fs::remove_dir_all`, and for an ordinary user whose tree holds files of their
/// subordinate ids (which plain removal is refused), [`remove_trees`]. A missing tree is fine.
pub fn remove_all(path: &Path) -> io::Result<()> {
    match crate::beneath::remove_tree(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e)
            if e.kind() == io::ErrorKind::PermissionDenied
                && !nix::unistd::geteuid().is_root()
                && caller_maps().is_ok() =>
        {
            remove_trees(&[path.to_path_buf()])
        }
        r => r,
    }
}

/// Remove `paths` (whole trees, no link followed) from inside a user namespace with the
/// caller's map, as its root: what the caller's steps wrote under their subordinate ids goes
/// too. Root needs none of this (plain removal works).
pub fn remove_trees(paths: &[PathBuf]) -> io::Result<()> {
    let mut args: Vec<std::ffi::OsString> = vec!["rm".into()];
    args.extend(paths.iter().map(|p| p.clone().into_os_string()));
    let mut child = spawn(&args)?;
    drop(child.stdin.take());
    finish(child, "removing")
}

/// `aisb __userns rm PATH...`: the child side of [`remove_trees`].
pub fn remove_main(paths: &[PathBuf]) -> i32 {
    if paths.iter().any(|p| !p.is_absolute()) {
        eprintln!("usage: aisb __userns rm ABSOLUTE-PATH...");
        return 2;
    }
    if let Err(e) = enter() {
        eprintln!("cannot enter a user namespace over the subordinate ids: {e}");
        return 1;
    }
    let mut status = 0;
    for p in paths {
        match std::fs::symlink_metadata(p) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Ok(m) if !m.is_dir() => {
                if let Err(e) = std::fs::remove_file(p) {
                    eprintln!("{}: {e}", p.display());
                    status = 1;
                }
            }
            _ => {
                // Each directory opened beneath the last (O_NOFOLLOW), however deep: a link
                // the step made is removed, never followed.
                if let Err(e) = crate::beneath::remove_tree(p) {
                    eprintln!("{}: {e}", p.display());
                    status = 1;
                }
            }
        }
    }
    status
}

/// `aisb __userns chown LAYER UID GID DEST...`: below LAYER (a COPY's new layer, written by
/// aisb itself), every entry at or below a DEST (relative to LAYER) becomes UID:GID, every
/// other (the directories made above them) 0:0; modes are put back after (chown clears the
/// set-id bits). No link is followed: links are changed themselves.
pub fn chown_main(args: &[PathBuf]) -> i32 {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let parsed = match args {
        [layer, uid, gid, dests @ ..] if layer.is_absolute() => uid
            .to_str()
            .and_then(|u| u.parse::<u32>().ok())
            .zip(gid.to_str().and_then(|g| g.parse::<u32>().ok()))
            .map(|ids| (layer, ids, dests)),
        _ => None,
    };
    let Some((layer, (uid, gid), dests)) = parsed else {
        eprintln!("usage: aisb __userns chown ABSOLUTE-LAYER UID GID DEST...");
        return 2;
    };
    if let Err(e) = enter() {
        eprintln!("cannot enter a user namespace over the subordinate ids: {e}");
        return 1;
    }
    for e in walkdir::WalkDir::new(layer).follow_links(false) {
        let e = match e {
            Ok(e) => e,
            Err(err) => {
                eprintln!("{err}");
                return 1;
            }
        };
        let rel = e.path().strip_prefix(layer).unwrap_or(Path::new(""));
        let copied = dests.iter().any(|d| rel.starts_with(d));
        let (u, g) = if copied { (uid, gid) } else { (0, 0) };
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if (m.uid(), m.gid()) == (u, g) {
            continue;
        }
        if let Err(err) = std::os::unix::fs::lchown(e.path(), Some(u), Some(g)) {
            eprintln!("{}: {err}", e.path().display());
            return 1;
        }
        if !m.file_type().is_symlink() {
            let mode = std::fs::Permissions::from_mode(m.mode() & 0o7777);
            if let Err(err) = std::fs::set_permissions(e.path(), mode) {
                eprintln!("{}: {err}", e.path().display());
                return 1;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_own_id_stays_itself() {
        let m = map_over(1000, (100_000, 65_536));
        assert_eq!(
            m,
            vec![(0, 100_000, 1000), (1000, 1000, 1), (1001, 101_000, 64_536)]
        );
        assert_eq!(outside(&m, 0), Some(100_000));
        assert_eq!(outside(&m, 42), Some(100_042));
        assert_eq!(outside(&m, 1000), Some(1000));
        assert_eq!(outside(&m, 1001), Some(101_000));
        assert_eq!(outside(&m, 65_536), Some(165_535));
        assert_eq!(outside(&m, 65_537), None);
        for id in [0, 42, 999, 1000, 1001, 65_536] {
            assert_eq!(inside(&m, outside(&m, id).unwrap()), Some(id));
        }
        // A range smaller than the caller's uid: what fits below it, and the caller.
        assert_eq!(
            map_over(5000, (100_000, 100)),
            vec![(0, 100_000, 100), (5000, 5000, 1)]
        );
        // Root's own id 0 maps to itself; everything else follows.
        assert_eq!(
            map_over(0, (100_000, 10)),
            vec![(0, 0, 1), (1, 100_000, 10)]
        );
    }

    #[test]
    fn subordinate_ranges_by_name_or_uid() {
        let t = "alice:100000:65536\n1001:200000:65536\nbob:300000:0\nx:4294967295:2\n";
        assert_eq!(subordinate_range(t, "alice", 1000), Some((100_000, 65_536)));
        assert_eq!(subordinate_range(t, "carol", 1001), Some((200_000, 65_536)));
        assert_eq!(subordinate_range(t, "bob", 1002), None, "empty range");
        assert_eq!(subordinate_range(t, "x", 7), None, "overflowing range");
        assert_eq!(subordinate_range("garbage\n", "x", 1), None);
    }
}
