//! Reading and writing below a directory that something untrusted shaped (a sandbox's clone, a
//! build step's upper directory, an image layer being unpacked), without ever following a
//! symbolic link: every component is opened with `O_NOFOLLOW` relative to the directory
//! before it (`openat`), so a link planted anywhere on the path is an error, not a way out,
//! and a component swapped for a link between a check and a use cannot redirect the use (there
//! is no check apart from the use).
//!
//! The root itself is a path aisb chose (its own state, its own store); only what lies below
//! it is untrusted. `..`, absolute paths and empty components are refused.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path};

use nix::fcntl::{openat, renameat, OFlag};
use nix::sys::stat::{mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// An open directory: everything below it is reached through its descriptor.
#[derive(Debug)]
pub struct Dir(OwnedFd);

fn open_at(dir: Option<&OwnedFd>, name: &OsStr, flags: OFlag, mode: Mode) -> io::Result<OwnedFd> {
    let fd = openat(
        dir.map(|d| d.as_raw_fd()),
        name,
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        mode,
    )?;
    // SAFETY: `openat` returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The names of `rel`, each a plain component.
fn names(rel: &Path) -> io::Result<Vec<&OsStr>> {
    rel.components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: only plain names below the directory", rel.display()),
            )),
        })
        .collect()
}

/// A symbolic link where a directory or file was expected reads as this error.
fn no_links(e: nix::Error, name: &OsStr) -> io::Error {
    match e {
        nix::Error::ELOOP | nix::Error::ENOTDIR => io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: a symbolic link or not a directory, refused (it would lead out of the directory)",
                Path::new(name).display()
            ),
        ),
        e => e.into(),
    }
}

impl std::os::fd::AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Dir {
    /// The descriptor, for calls relative to this directory.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }

    /// Open `root` (a path aisb chose; a link at its last component is refused all the same).
    pub fn open(root: &Path) -> io::Result<Dir> {
        open_at(
            None,
            root.as_os_str(),
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map(Dir)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: a symbolic link, refused", root.display()),
                )
            } else {
                e
            }
        })
    }

    /// The directory `rel` below this one; missing ones are created (mode `0o755` less the
    /// umask) when `create`.
    pub fn dir(&self, rel: &Path, create: bool) -> io::Result<Dir> {
        let mut cur: Option<OwnedFd> = None;
        for name in names(rel)? {
            let parent = cur.as_ref().unwrap_or(&self.0);
            let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY;
            let next = match openat(
                Some(parent.as_raw_fd()),
                name,
                flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(nix::Error::ENOENT) if create => {
                    match mkdirat(
                        Some(parent.as_raw_fd()),
                        name,
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(nix::Error::EEXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    openat(
                        Some(parent.as_raw_fd()),
                        name,
                        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| no_links(e, name))?
                }
                Err(e) => return Err(no_links(e, name)),
            };
            // SAFETY: a new descriptor from `openat`.
            cur = Some(unsafe { OwnedFd::from_raw_fd(next) });
        }
        match cur {
            Some(fd) => Ok(Dir(fd)),
            None => Ok(Dir(self.0.try_clone()?)),
        }
    }

    /// Read the regular file `name` in this directory, at most `limit` bytes (more is an
    /// error): `None` when it does not exist.
    pub fn read(&self, name: &OsStr, limit: u64) -> io::Result<Option<Vec<u8>>> {
        let fd = match open_at(
            Some(&self.0),
            name,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(no_links(nix::Error::ELOOP, name))
            }
            Err(e) => return Err(e),
        };
        let file = std::fs::File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file", Path::new(name).display()),
            ));
        }
        let mut bytes = Vec::new();
        file.take(limit + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: larger than {limit} bytes", Path::new(name).display()),
            ));
        }
        Ok(Some(bytes))
    }

    /// Replace `name` in this directory with `bytes` (mode `mode`): a new file created
    /// exclusively beside it, synced, then renamed over it (a link at `name` is replaced, never
    /// followed).
    pub fn write_atomic(&self, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = format!(".aisb-tmp-{}-{nanos}", std::process::id());
        let fd = open_at(
            Some(&self.0),
            OsStr::new(&tmp),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            Mode::from_bits_truncate(mode),
        )?;
        let mut file = std::fs::File::from(fd);
        let result = file
            .write_all(bytes)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                file.set_permissions(std::fs::Permissions::from_mode(mode))
            })
            .and_then(|()| file.sync_all())
            .and_then(|()| {
                renameat(
                    Some(self.0.as_raw_fd()),
                    tmp.as_str(),
                    Some(self.0.as_raw_fd()),
                    name,
                )
                .map_err(io::Error::from)
            });
        if result.is_err() {
            let _ = unlinkat(
                Some(self.0.as_raw_fd()),
                tmp.as_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
        result
    }

    /// Remove `name` in this directory and, when it is a directory, everything in it; links
    /// are removed, never followed. At most `depth` levels deep (0: a file or a link only).
    pub fn remove_all(&self, name: &OsStr, depth: usize) -> io::Result<()> {
        remove_below(self, name, Some(depth), Path::new(name))
    }
}

/// Remove `path` and, when it is a directory, everything below it, however deep, with a
/// handful of descriptors: a tree something untrusted shaped (a build step's upper directory,
/// a layer) may nest deeper than the descriptor limit allows a recursive removal (std's
/// `remove_dir_all` holds one per level, so 1,100 levels fail with EMFILE under a soft limit of
/// 1,024 and the tree stays). Every component is opened with `O_NOFOLLOW` relative to the one
/// before it, and the way back up is `..` checked against the directory it must be, so a link
/// is removed, never followed. A directory whose mode forbids removing its entries is made
/// 0700 first (its owner may; so may root, and root in a user namespace over its ids). The
/// path itself is aisb's own (its store, its state); a missing one is fine.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a removable path", path.display()),
        ));
    };
    let parent = Dir::open(if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    })?;
    remove_below(&parent, name, None, path)
}

/// The walker behind [`remove_tree`] and [`Dir::remove_all`]: `name` below `parent`, with at
/// most `max_depth` levels of directories (None: any); `path` names it in errors.
fn remove_below(
    parent: &Dir,
    name: &OsStr,
    max_depth: Option<usize>,
    path: &Path,
) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    match unlinkat(Some(parent.fd()), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::Error::ENOENT) => return Ok(()),
        Err(nix::Error::EISDIR) | Err(nix::Error::EPERM) => {}
        Err(e) => return Err(e.into()),
    }
    let id = |fd: &OwnedFd| nix::sys::stat::fstat(fd.as_raw_fd()).map(|st| (st.st_dev, st.st_ino));
    let open_dir = |at: &OwnedFd, name: &OsStr| {
        let open = || {
            open_at(
                Some(at),
                name,
                OFlag::O_DIRECTORY | OFlag::O_RDONLY,
                Mode::empty(),
            )
        };
        match open() {
            // A directory its owner made unreadable (0300, 000): made 0700 first, through a
            // descriptor that names it without following a link (fchmod refuses O_PATH
            // descriptors; /proc/self/fd/N is the same inode).
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                let path = open_at(
                    Some(at),
                    name,
                    OFlag::O_PATH | OFlag::O_DIRECTORY,
                    Mode::empty(),
                )?;
                nix::sys::stat::fchmodat(
                    None,
                    format!("/proc/self/fd/{}", path.as_raw_fd()).as_str(),
                    Mode::from_bits_truncate(0o700),
                    nix::sys::stat::FchmodatFlags::FollowSymlink,
                )?;
                open()
            }
            r => r,
        }
    };
    // The directories from `path` down to the current one: each one's name in its parent,
    // its identity (to check the way back up) and, once listed, its subdirectories still to
    // empty (each directory is listed once).
    struct Level {
        name: std::ffi::OsString,
        id: (u64, u64),
        pending: Option<Vec<std::ffi::OsString>>,
    }
    // A directory `level` levels down (`name` itself is 0) is entered only within the bound.
    let enter = |level: usize| match max_depth {
        Some(d) if level >= d => Err(io::Error::other(format!(
            "{}: nested too deep to remove",
            path.display()
        ))),
        _ => Ok(()),
    };
    enter(0)?;
    let mut cur = open_dir(&parent.0, name)?;
    let top = id(&cur)?;
    let mut trail = vec![Level {
        name: name.to_os_string(),
        id: top,
        pending: None,
    }];
    // Times a directory was found not empty after its listing (entries added meanwhile, or
    // missed by a listing that unlinked as it read): listed again, a bounded number of times.
    let mut relisted = 0;
    loop {
        // The level of the directories in `cur`.
        let trail_len = trail.len();
        let level = trail
            .last_mut()
            .expect("the trail holds the current directory");
        if level.pending.is_none() {
            let _ = nix::sys::stat::fchmod(cur.as_raw_fd(), Mode::from_bits_truncate(0o700));
            let mut dirs = Vec::new();
            let listing = nix::dir::Dir::openat(
                Some(cur.as_raw_fd()),
                ".",
                OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            for e in listing.into_iter() {
                let e = e?;
                let n = OsStr::from_bytes(e.file_name().to_bytes());
                if n == "." || n == ".." {
                    continue;
                }
                match unlinkat(Some(cur.as_raw_fd()), n, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(nix::Error::ENOENT) => {}
                    Err(nix::Error::EISDIR) | Err(nix::Error::EPERM) => {
                        // A directory beyond the bound is an error, even an empty one.
                        enter(trail_len)?;
                        match unlinkat(Some(cur.as_raw_fd()), n, UnlinkatFlags::RemoveDir) {
                            Ok(()) | Err(nix::Error::ENOENT) => {}
                            Err(_) => dirs.push(n.to_os_string()),
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            level.pending = Some(dirs);
        }
        if let Some(n) = level.pending.as_mut().and_then(Vec::pop) {
            enter(trail_len)?;
            let next = open_dir(&cur, n.as_os_str())?;
            let next_id = id(&next)?;
            if next_id.0 != top.0 {
                return Err(io::Error::other(format!(
                    "{}: a mount point below it ({}), not removed",
                    path.display(),
                    Path::new(&n).display()
                )));
            }
            trail.push(Level {
                name: n,
                id: next_id,
                pending: None,
            });
            cur = next;
            continue;
        }
        // `cur` is empty: remove it from its parent, and go on there.
        let done = trail.pop().expect("the trail holds the current directory");
        let up = match trail.last() {
            None => None,
            Some(above) => {
                let up = open_dir(&cur, OsStr::new(".."))?;
                if id(&up)? != above.id {
                    return Err(io::Error::other(format!(
                        "{}: a directory moved while it was being removed",
                        path.display()
                    )));
                }
                Some(up)
            }
        };
        let from = up.as_ref().map_or(parent.fd(), |u| u.as_raw_fd());
        match unlinkat(Some(from), done.name.as_os_str(), UnlinkatFlags::RemoveDir) {
            // Entries appeared meanwhile, or a listing that unlinked as it read missed some:
            // this directory again.
            Err(nix::Error::ENOTEMPTY) if relisted < 16 => {
                relisted += 1;
                trail.push(Level {
                    pending: None,
                    ..done
                });
                continue;
            }
            r => r?,
        }
        match up {
            None => return Ok(()),
            Some(up) => cur = up,
        }
    }
}

/// Write `bytes` to `root/rel` (its directories created), no link followed below `root`.
pub fn write(root: &Path, rel: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let (dir, name) = split(rel)?;
    Dir::open(root)?
        .dir(dir, true)?
        .write_atomic(name, bytes, mode)
}

/// Read `root/rel` (at most `limit` bytes), no link followed below `root`: `None` when it or
/// its directory does not exist.
pub fn read(root: &Path, rel: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let (dir, name) = split(rel)?;
    match Dir::open(root)?.dir(dir, false) {
        Ok(d) => d.read(name, limit),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn split(rel: &Path) -> io::Result<(&Path, &OsStr)> {
    match (rel.parent(), rel.file_name()) {
        (Some(dir), Some(name)) if !names(rel)?.is_empty() => Ok((dir, name)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file name below the directory", rel.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    /// A tree nested deeper than the descriptor limit (what a build step can make to leave
    /// files behind that a recursive removal cannot reach), with a read-only directory and
    /// links to outside on the way, goes entirely; what the links point at stays.
    #[test]
    fn a_tree_deeper_than_the_descriptor_limit_is_removed_and_no_link_followed() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        let tree = t.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: getrlimit writes one rlimit into `limit`.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        let depth = (limit.rlim_cur as usize + 100).min(200_000);
        let mut cur = Dir::open(&tree).unwrap();
        let mut middle = None;
        for i in 0..depth {
            if i % 1000 == 0 {
                let fd = cur.fd();
                nix::unistd::symlinkat(&outside, Some(fd), "link").unwrap();
                std::fs::write(format!("/proc/self/fd/{fd}/file"), "x").unwrap();
            }
            cur = cur.dir(Path::new("d"), true).unwrap();
            if i == depth / 2 {
                middle = Some(cur.0.try_clone().unwrap());
            }
        }
        // A directory its owner made unreadable and unsearchable, with files in it.
        std::fs::create_dir_all(tree.join("locked/inner")).unwrap();
        std::fs::write(tree.join("locked/inner/f"), "x").unwrap();
        for d in ["locked/inner", "locked"] {
            std::fs::set_permissions(tree.join(d), std::fs::Permissions::from_mode(0o000)).unwrap();
        }
        drop(cur);
        let middle = middle.unwrap();
        nix::sys::stat::fchmod(middle.as_raw_fd(), Mode::from_bits_truncate(0o500)).unwrap();
        drop(middle);
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "k");
        remove_tree(&tree).unwrap();
        // A link at the top is removed itself.
        symlink(&outside, &tree).unwrap();
        remove_tree(&tree).unwrap();
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn writes_and_reads_below_the_root() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), Path::new("a/b/c.json"), b"{}", 0o644).unwrap();
        assert_eq!(
            read(t.path(), Path::new("a/b/c.json"), 10)
                .unwrap()
                .unwrap(),
            b"{}"
        );
        assert_eq!(read(t.path(), Path::new("a/x/c.json"), 10).unwrap(), None);
        assert!(read(t.path(), Path::new("a/b/c.json"), 1).is_err());
    }

    #[test]
    fn a_link_anywhere_on_the_path_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        symlink(&outside, root.join("dir")).unwrap();
        symlink(outside.join("secret"), root.join("file")).unwrap();
        assert!(write(&root, Path::new("dir/new"), b"x", 0o644).is_err());
        assert!(!outside.join("new").exists());
        assert!(read(&root, Path::new("dir/secret"), 10).is_err());
        assert!(read(&root, Path::new("file"), 10).is_err());
        // A link at the file's own name is replaced, not written through.
        write(&root, Path::new("file"), b"mine", 0o600).unwrap();
        assert_eq!(
            std::fs::read_to_string(outside.join("secret")).unwrap(),
            "s"
        );
        assert!(write(&root, Path::new("../escape"), b"x", 0o644).is_err());
        assert!(write(&root, Path::new("/etc/escape"), b"x", 0o644).is_err());
    }

    #[test]
    fn remove_all_never_follows_links() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        let outside = t.path().join("outside");
        std::fs::create_dir_all(root.join("tree/deep")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        symlink(&outside, root.join("tree/link")).unwrap();
        symlink(&outside, root.join("tree/deep/link")).unwrap();
        Dir::open(&root)
            .unwrap()
            .remove_all(OsStr::new("tree"), 16)
            .unwrap();
        assert!(!root.join("tree").exists());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "k");
        // The link itself as the thing to remove: the link goes, its target stays.
        symlink(&outside, root.join("run")).unwrap();
        Dir::open(&root)
            .unwrap()
            .remove_all(OsStr::new("run"), 16)
            .unwrap();
        assert!(outside.join("keep").exists());
        // The bound on depth holds: a directory one level too deep is an error, and 0 takes a
        // file (or link) only.
        std::fs::create_dir_all(root.join("two/levels")).unwrap();
        let d = Dir::open(&root).unwrap();
        assert!(d.remove_all(OsStr::new("two"), 1).is_err());
        assert!(d.remove_all(OsStr::new("two"), 0).is_err());
        d.remove_all(OsStr::new("two"), 2).unwrap();
        assert!(!root.join("two").exists());
        std::fs::write(root.join("file"), "f").unwrap();
        d.remove_all(OsStr::new("file"), 0).unwrap();
        assert!(!root.join("file").exists());
    }
}
