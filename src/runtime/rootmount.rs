//! An image's root filesystem, mounted for one runtime process only: the process (bwrap, or
//! the libcontainer helper) first moves to a private mount namespace, then mounts the layers
//! there, so the host never sees the mount and nothing is left when the process ends.
//!
//! Read-only (a sandbox): an overlay of the layers, or a bind of the only one. Writable (a
//! build step): an overlay with the step's new layer as its upper directory.
//!
//! An ordinary user's process first enters a user namespace of its own (its uid and gid mapped
//! to themselves, nothing else), which owns the new mount namespace: overlayfs may be mounted
//! there (Linux 5.11+), reading the `user.overlay.*` attributes (`userxattr`) that layers
//! unpacked by an ordinary user carry. bwrap then starts from inside it as usual.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A prepared mount: every string built before the fork, so [`RootMount::apply`] allocates
/// nothing and is safe between fork and exec.
#[derive(Debug, Clone)]
pub struct RootMount {
    target: CString,
    source: CString,
    data: Option<CString>,
    /// For an ordinary user: (`/proc/self/uid_map` text, `gid_map` text), written after
    /// entering a user namespace of its own.
    userns: Option<(CString, CString)>,
    /// The text form (`aisb __libcontainer --root-mount`).
    pub arg: String,
}

/// The kernel takes mount options up to a page.
const MAX_OPTIONS: usize = 4000;

impl RootMount {
    /// `layers` top first; `upper` and `work` for a writable root.
    pub fn new(
        layers: &[PathBuf],
        rw: Option<(&Path, &Path)>,
        target: &Path,
    ) -> io::Result<RootMount> {
        let bad = |p: &Path| {
            let s = p.to_string_lossy();
            s.contains([':', ',', '\n']) || !p.is_absolute()
        };
        if layers
            .iter()
            .map(PathBuf::as_path)
            .chain(rw.iter().flat_map(|(u, w)| [*u, *w]))
            .any(bad)
        {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a layer path has `:` or `,` or is relative: overlayfs cannot take it (move XDG_CACHE_HOME)"));
        }
        let lower = layers
            .iter()
            .map(|l| l.to_string_lossy())
            .collect::<Vec<_>>()
            .join(":");
        // Layers an ordinary user unpacked mark opaque directories with user.overlay.opaque
        // (as does root of a user namespace: the same predicate as the unpacker's).
        let root = crate::userns::host_root();
        let lower = if root {
            lower
        } else {
            format!("{lower},userxattr")
        };
        let (source, data) = match (layers.len(), rw) {
            (0, None) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "an image with no layers has no root to mount",
                ))
            }
            (1, None) => (layers[0].clone(), None),
            (_, None) => (PathBuf::from("overlay"), Some(format!("lowerdir={lower}"))),
            (_, Some((u, w))) => (
                PathBuf::from("overlay"),
                Some(format!(
                    "lowerdir={lower},upperdir={},workdir={}",
                    u.display(),
                    w.display()
                )),
            ),
        };
        if data.as_ref().is_some_and(|d| d.len() > MAX_OPTIONS) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} layers are too many for one overlay mount (options over {MAX_OPTIONS} bytes)", layers.len())));
        }
        let cs =
            |b: &[u8]| CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
        // An ordinary user's process needs a user namespace of its own to mount anything.
        let userns = if nix::unistd::geteuid().is_root() {
            None
        } else {
            let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
            Some((
                cs(format!("{uid} {uid} 1\n").as_bytes())?,
                cs(format!("{gid} {gid} 1\n").as_bytes())?,
            ))
        };
        let arg = format!(
            "{}\n{}\n{}",
            target.display(),
            source.display(),
            data.clone().unwrap_or_default()
        );
        Ok(RootMount {
            target: cs(target.as_os_str().as_bytes())?,
            source: cs(source.as_os_str().as_bytes())?,
            data: data.map(|d| cs(d.as_bytes())).transpose()?,
            userns,
            arg,
        })
    }

    /// The inverse of `arg`.
    pub fn parse(arg: &str) -> Option<RootMount> {
        let mut it = arg.splitn(3, '\n');
        let (t, s, d) = (it.next()?, it.next()?, it.next()?);
        Some(RootMount {
            target: CString::new(t).ok()?,
            source: CString::new(s).ok()?,
            data: (!d.is_empty()).then(|| CString::new(d).ok()).flatten(),
            // The libcontainer helper, the one user of the text form, runs as root.
            userns: None,
            arg: arg.to_string(),
        })
    }

    /// Mount the root in the mount namespace of process `pid` (bwrap's sandbox, blocked until
    /// its user namespace has its map), from a forked child that joins its user namespace
    /// (where the caller is owner, so root) and then its mount namespace.
    pub fn mount_into(&self, pid: i32) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let open = |ns: &str| std::fs::File::open(format!("/proc/{pid}/ns/{ns}"));
        let (user, mnt) = (open("user")?, open("mnt")?);
        let (user, mnt) = (user.as_raw_fd(), mnt.as_raw_fd());
        let data = self.data.as_ref().map(|d| d.as_ptr());
        // SAFETY: the child makes raw syscalls on descriptors and strings prepared before the
        // fork, then _exits: async-signal-safe in a threaded parent.
        unsafe {
            match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => {
                    let ok = libc::setns(user, libc::CLONE_NEWUSER) == 0
                        && libc::setns(mnt, libc::CLONE_NEWNS) == 0
                        && match data {
                            Some(d) => {
                                libc::mount(
                                    c"overlay".as_ptr(),
                                    self.target.as_ptr(),
                                    c"overlay".as_ptr(),
                                    libc::MS_NOSUID | libc::MS_NODEV,
                                    d.cast(),
                                ) == 0
                            }
                            // A single layer: bound, then made read-only.
                            None => {
                                libc::mount(
                                    self.source.as_ptr(),
                                    self.target.as_ptr(),
                                    std::ptr::null(),
                                    libc::MS_BIND | libc::MS_REC,
                                    std::ptr::null(),
                                ) == 0
                                    && libc::mount(
                                        std::ptr::null(),
                                        self.target.as_ptr(),
                                        std::ptr::null(),
                                        libc::MS_BIND
                                            | libc::MS_REMOUNT
                                            | libc::MS_RDONLY
                                            | libc::MS_REC,
                                        std::ptr::null(),
                                    ) == 0
                            }
                        };
                    let errno = if ok { 0 } else { *libc::__errno_location() };
                    libc::_exit(errno.min(255));
                }
                child => {
                    let mut status = 0;
                    if libc::waitpid(child, &mut status, 0) != child {
                        return Err(io::Error::last_os_error());
                    }
                    match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
                        Some(0) => Ok(()),
                        Some(errno) => Err(io::Error::from_raw_os_error(errno)),
                        None => Err(io::Error::other("the mounting child died")),
                    }
                }
            }
        }
    }

    /// Move this (single-threaded) process to a private mount namespace and mount the root
    /// there. Async-signal-safe.
    pub fn apply(&self) -> io::Result<()> {
        // SAFETY: raw syscalls on prepared, NUL-terminated strings.
        unsafe {
            if let Some((uid_map, gid_map)) = &self.userns {
                if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) != 0 {
                    return Err(io::Error::last_os_error());
                }
                for (file, text) in [
                    (c"/proc/self/setgroups", c"deny"),
                    (c"/proc/self/uid_map", uid_map.as_c_str()),
                    (c"/proc/self/gid_map", gid_map.as_c_str()),
                ] {
                    let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let n = text.to_bytes().len();
                    let w = libc::write(fd, text.as_ptr().cast(), n);
                    libc::close(fd);
                    if w != n as isize {
                        return Err(io::Error::last_os_error());
                    }
                }
            } else if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            let root = c"/";
            if libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            let r = match &self.data {
                Some(d) => libc::mount(
                    c"overlay".as_ptr(),
                    self.target.as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    d.as_ptr().cast(),
                ),
                None => libc::mount(
                    self.source.as_ptr(),
                    self.target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ),
            };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            // A bind is remounted read-only; an overlay without an upper dir already is.
            if self.data.is_none()
                && libc::mount(
                    std::ptr::null(),
                    self.target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_REC,
                    std::ptr::null(),
                ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}
