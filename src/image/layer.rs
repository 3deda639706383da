//! Layers on disk in overlayfs's own format, so that a list of them is a root filesystem with
//! no copying: a deleted file is a whiteout (a 0/0 character device), a directory that hides
//! everything below it carries `trusted.overlay.opaque=y`.

use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// Unpack an OCI layer (tar, gzip-compressed or not: detected from its first bytes) into
/// `dest`, turning OCI whiteouts into overlayfs ones. Paths leaving `dest` are refused.
pub fn unpack(reader: impl Read, dest: &Path) -> io::Result<()> {
    let mut buffered = io::BufReader::with_capacity(1 << 20, reader);
    let head = io::BufRead::fill_buf(&mut buffered)?;
    let gz = head.starts_with(&[0x1f, 0x8b]);
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "zstd-compressed layers are not supported (gzip and plain tar are)",
        ));
    }
    let inner: Box<dyn Read> = if gz {
        Box::new(flate2::read::GzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    let mut archive = tar::Archive::new(inner);
    let mut checked = std::collections::HashSet::new();
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(nix::unistd::geteuid().is_root());
    archive.set_preserve_mtime(true);
    // Restored by `kept_xattrs` below, overlayfs's own left out.
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let rel = clean(&path).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("layer entry {} leaves the layer", path.display()),
            )
        })?;
        // Raw bytes: a name that is not UTF-8 is whited out under its own name.
        let name = rel.file_name().map_or(&b""[..], |n| n.as_bytes());
        // Every entry's directory, checked (and made) before anything is written there. Only a
        // symlink or link entry can turn a checked directory into something else.
        if !matches!(
            entry.header().entry_type(),
            tar::EntryType::Regular | tar::EntryType::Directory
        ) {
            checked.clear();
        }
        let parent = dir_inside(dest, rel.parent().unwrap_or(Path::new("")), &mut checked)?;
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            if hidden == b".wh..opq" {
                set_xattr(&parent, opaque_xattr().as_bytes(), b"y")?;
            } else {
                whiteout(&parent.join(std::ffi::OsStr::from_bytes(hidden)))?;
            }
            continue;
        }
        let xattrs = kept_xattrs(&mut entry)?;
        if !entry.unpack_in(dest)? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("layer entry {} leaves the layer", path.display()),
            ));
        }
        // As the tar crate restores them: on regular files (after their permissions).
        if matches!(
            entry.header().entry_type(),
            tar::EntryType::Regular | tar::EntryType::Continuous
        ) {
            for (name, value) in &xattrs {
                set_xattr(
                    &parent.join(rel.file_name().unwrap_or_default()),
                    name,
                    value,
                )?;
            }
        }
    }
    // The rest of the stream (tar padding, gzip trailer) so the digest covers every byte.
    let mut inner = archive.into_inner();
    io::copy(&mut inner, &mut io::sink())?;
    Ok(())
}

/// The directory `rel` below `dest`, made where missing. Refused when any part of it is not a
/// real directory: a symlink the layer itself made could lead out of it (the tar crate checks
/// this for the entries it unpacks; whiteouts and opaque markers are ours). `checked`: the
/// directories found real so far (a layer's entries mostly share their directories).
fn dir_inside(
    dest: &Path,
    rel: &Path,
    checked: &mut std::collections::HashSet<PathBuf>,
) -> io::Result<PathBuf> {
    if checked.contains(rel) {
        return Ok(dest.join(rel));
    }
    let mut at = dest.to_path_buf();
    for c in rel.components() {
        at.push(c);
        let sub = at.strip_prefix(dest).unwrap_or(&at).to_path_buf();
        if checked.contains(&sub) {
            continue;
        }
        match fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "layer entry below {}, which is not a directory in the layer",
                        rel.display()
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&at)?,
            Err(e) => return Err(e),
        }
        checked.insert(sub);
    }
    Ok(at)
}

/// A path inside the image, relative, with `.` removed; None when it has `..`.
fn clean(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

pub fn whiteout(path: &Path) -> io::Result<()> {
    let _ = fs::remove_file(path);
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::empty(),
        0,
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "creating the whiteout {}: {e} (layers with deletions need root)",
                path.display()
            ),
        )
    })
}

/// The attribute marking an opaque directory: `trusted.overlay.opaque` in root's layers (a
/// plain overlay mount reads it), `user.overlay.opaque` in an ordinary user's (their overlay,
/// mounted in a user namespace with `userxattr`, reads that one).
fn opaque_xattr() -> &'static str {
    if crate::userns::host_root() {
        "trusted.overlay.opaque"
    } else {
        "user.overlay.opaque"
    }
}

/// Namespaces whose attributes overlayfs reads as instructions (opaque directories,
/// redirects, metacopy files, whiteouts): in a layer they would let an image's author change
/// what the merged root shows beyond its own files, so only the unpacker sets them (the opaque
/// marker of `.wh..wh..opq`).
const OVERLAY_XATTR_PREFIXES: [&[u8]; 2] = [b"trusted.overlay.", b"user.overlay."];

/// The extended attributes an entry carries (PAX `SCHILY.xattr.NAME`), overlayfs's left out.
fn kept_xattrs<R: Read>(entry: &mut tar::Entry<R>) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let Some(exts) = entry.pax_extensions()? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for ext in exts {
        let ext = ext?;
        let Some(name) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") else {
            continue;
        };
        if OVERLAY_XATTR_PREFIXES.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        out.push((name.to_vec(), ext.value_bytes().to_vec()));
    }
    Ok(out)
}

/// On the entry itself, never through a link (the `xattr` crate's `set` is `lsetxattr`).
fn set_xattr(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    xattr::set(path, std::ffi::OsStr::from_bytes(name), value)
}

fn is_whiteout(m: &fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_char_device() && m.rdev() == 0
}

fn is_opaque(path: &Path) -> bool {
    matches!(xattr::get(path, opaque_xattr()), Ok(Some(v)) if v == b"y")
}

/// What `rel` (relative to the root) is in the merged view of `layers` (top first): the
/// topmost layer's entry, unless a whiteout or an opaque directory above hides it.
pub fn lookup(layers: &[PathBuf], rel: &Path) -> Option<(PathBuf, fs::Metadata)> {
    'layers: for l in layers {
        // An opaque directory on the way hides the same path in lower layers.
        let mut at = l.clone();
        let comps: Vec<_> = rel.components().collect();
        for (i, c) in comps.iter().enumerate() {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if is_whiteout(&m) => return None,
                Ok(m) if i + 1 == comps.len() => return Some((at, m)),
                Ok(m) if m.is_dir() => {
                    if is_opaque(&at) {
                        // Below here only this layer counts.
                        let full = l.join(rel);
                        return fs::symlink_metadata(&full)
                            .ok()
                            .filter(|m| !is_whiteout(m))
                            .map(|m| (full, m));
                    }
                }
                Ok(_) => continue 'layers,
                Err(_) => continue 'layers,
            }
        }
        if comps.is_empty() {
            return fs::symlink_metadata(l).ok().map(|m| (l.clone(), m));
        }
    }
    None
}

/// `path` (absolute, inside the image) with every symlink resolved in the merged view of
/// `layers`, the way a process inside would see it. Symlinks cannot point outside the root.
pub fn resolve(layers: &[PathBuf], path: &Path) -> io::Result<PathBuf> {
    let mut todo: Vec<PathBuf> = path
        .components()
        .rev()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(PathBuf::from(n)),
            Component::ParentDir => Some(PathBuf::from("..")),
            _ => None,
        })
        .collect();
    let mut out = PathBuf::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        if c == Path::new("..") {
            out.pop();
            continue;
        }
        let next = out.join(&c);
        match lookup(layers, &next) {
            Some((real, m)) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("too many symlinks resolving {}", path.display()),
                    ));
                }
                let target = fs::read_link(&real)?;
                if target.is_absolute() {
                    out = PathBuf::new();
                }
                for t in target.components().rev() {
                    match t {
                        Component::Normal(n) => todo.push(PathBuf::from(n)),
                        Component::ParentDir => todo.push(PathBuf::from("..")),
                        _ => {}
                    }
                }
            }
            _ => out = next,
        }
    }
    Ok(out)
}

/// The content hash of COPY sources (see the table in `graph`): for each file below each
/// source, in sorted order, its path relative to the source, its kind, permission bits and
/// content (sha256), or a symlink's target. Never mtimes, owners or inode numbers.
pub fn hash_sources(
    srcs: &[PathBuf],
    masked: &Masked,
    cache: &mut super::statcache::StatCache,
) -> io::Result<String> {
    let mut h = Sha256::new();
    for src in srcs {
        h.update(b"source\0");
        for e in walk(src, masked)? {
            let e = e.map_err(io::Error::from)?;
            let rel = e.path().strip_prefix(src).unwrap_or(e.path());
            let m = e.metadata().map_err(io::Error::from)?;
            h.update(rel.as_os_str().as_bytes());
            h.update(b"\0");
            h.update(format!("{:o}\0", m.permissions().mode() & 0o7777).as_bytes());
            let ft = e.file_type();
            if ft.is_symlink() {
                h.update(b"l\0");
                h.update(fs::read_link(e.path())?.as_os_str().as_bytes());
            } else if ft.is_dir() {
                h.update(b"d");
            } else if ft.is_file() {
                h.update(b"f\0");
                h.update(cache.sha256(e.path(), &m)?.as_bytes());
            } else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a file, directory or symlink", e.path().display()),
                ));
            }
            h.update(b"\n");
        }
    }
    Ok(hex::encode(h.finalize()))
}

/// The sha256 (hex) of a file's content.
pub fn file_sha256(path: &Path) -> io::Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    io::copy(&mut f, &mut h)?;
    Ok(hex::encode(h.finalize()))
}

/// Host paths COPY never puts into an image, each with the reason: what the sandbox masks (a
/// secret, a key, a gitignored file: the sandbox would see it after all) and the lock file.
pub type Masked = std::collections::BTreeMap<PathBuf, String>;

/// Why `path` (or a directory above it) is never copied, if it is not.
pub fn masked_by<'a>(masked: &'a Masked, path: &Path) -> Option<&'a str> {
    if masked.is_empty() {
        return None;
    }
    path.ancestors()
        .find_map(|a| masked.get(a))
        .map(String::as_str)
}

/// Everything below `src` (itself first), in name order, symlinks not followed, masked paths
/// and all below them left out. Masks are on real paths, so the walk's are matched as such.
fn walk<'a>(
    src: &Path,
    masked: &'a Masked,
) -> io::Result<impl Iterator<Item = walkdir::Result<walkdir::DirEntry>> + 'a> {
    let real = src.canonicalize()?;
    let root = src.to_path_buf();
    Ok(walkdir::WalkDir::new(src)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(move |e| {
            let rel = e.path().strip_prefix(&root).unwrap_or(Path::new(""));
            masked_by(masked, &real.join(rel)).is_none()
        }))
}

/// Copy `src` (a file or a directory's contents, recursively) to `dest` below the new layer
/// `root`, owned by `owner`, with `chmod` instead of the sources' permission bits when given.
///
/// The layer is written through `root`'s descriptor, no link followed (an earlier source may
/// have put a link where a later one's directory goes: it is refused, never written through);
/// each source file is opened once, without following a link, and `h` is fed what was copied
/// in [`hash_sources`]'s format, so the caller can check that what went into the layer is
/// what the graph hashed.
pub fn copy_into(
    src: &Path,
    root: &crate::beneath::Dir,
    dest: &Path,
    owner: (u32, u32),
    chmod: Option<u32>,
    masked: &Masked,
    h: &mut Sha256,
) -> io::Result<()> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::{fchmod, mkdirat, Mode};
    use nix::unistd::{fchown, fchownat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let ids = (Some(Uid::from_raw(owner.0)), Some(Gid::from_raw(owner.1)));
    // An ordinary user's build cannot give files away; they stay the caller's.
    let chown_ok = |r: nix::Result<()>| match r {
        Err(nix::Error::EPERM) => Ok(()),
        r => r.map_err(io::Error::from),
    };
    let own = |fd: i32, mode: u32| -> io::Result<()> {
        chown_ok(fchown(fd, ids.0, ids.1))?;
        fchmod(fd, Mode::from_bits_truncate(mode)).map_err(io::Error::from)
    };
    for e in walk(src, masked)? {
        let e = e.map_err(io::Error::from)?;
        let rel = e.path().strip_prefix(src).unwrap_or(Path::new(""));
        let m = e.metadata().map_err(io::Error::from)?;
        let ft = e.file_type();
        let mode = chmod.unwrap_or(m.permissions().mode() & 0o7777);
        h.update(rel.as_os_str().as_bytes());
        h.update(b"\0");
        h.update(format!("{:o}\0", m.permissions().mode() & 0o7777).as_bytes());
        let to = if rel.as_os_str().is_empty() {
            dest.to_path_buf()
        } else {
            dest.join(rel)
        };
        let Some(name) = to.file_name() else {
            // The layer's root itself (a directory copied to `/`).
            if ft.is_dir() {
                h.update(b"d\n");
                own(root.fd(), mode)?;
                continue;
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: a file cannot replace the image's root",
                    e.path().display()
                ),
            ));
        };
        let dir = root.dir(to.parent().unwrap_or(Path::new("")), true)?;
        if ft.is_dir() {
            h.update(b"d\n");
            match mkdirat(Some(dir.fd()), name, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(nix::Error::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
            let d = dir.dir(Path::new(name), false)?;
            own(d.fd(), mode)?;
            continue;
        }
        match unlinkat(Some(dir.fd()), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::Error::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
        if ft.is_symlink() {
            let target = fs::read_link(e.path())?;
            h.update(b"l\0");
            h.update(target.as_os_str().as_bytes());
            h.update(b"\n");
            symlinkat(&target, Some(dir.fd()), name)?;
            chown_ok(fchownat(
                Some(dir.fd()),
                name,
                ids.0,
                ids.1,
                nix::unistd::FchownatFlags::AT_SYMLINK_NOFOLLOW,
            ))?;
            continue;
        }
        if !ft.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a file, directory or symlink", e.path().display()),
            ));
        }
        let from = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(e.path())?;
        if !from.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} changed into something else while it was copied",
                    e.path().display()
                ),
            ));
        }
        let fd = openat(
            Some(dir.fd()),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        // SAFETY: a new descriptor from `openat`.
        let mut out = fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut content = Sha256::new();
        let mut buf = vec![0u8; 64 << 10];
        let mut from = from;
        loop {
            let n = from.read(&mut buf)?;
            if n == 0 {
                break;
            }
            content.update(&buf[..n]);
            io::Write::write_all(&mut out, &buf[..n])?;
        }
        h.update(b"f\0");
        h.update(hex::encode(content.finalize()).as_bytes());
        h.update(b"\n");
        own(out.as_raw_fd(), mode)?;
    }
    Ok(())
}

/// The most of an image's /etc/passwd or /etc/group read to look a user up.
const MAX_ACCOUNT_FILE: u64 = 4 << 20;

/// An image's account file, as a process inside would read it (links resolved in the image,
/// by [`resolve`]) and never further: a regular file in a layer, opened without following a
/// link, at most [`MAX_ACCOUNT_FILE`] bytes. A layer's `/etc/passwd -> /dev/zero` (endless), a
/// FIFO (a build that hangs) or a link to the host's own file reads as no file.
fn read_account_file(path: &Path, md: &fs::Metadata) -> Option<String> {
    use std::os::unix::fs::OpenOptionsExt;
    if !md.is_file() {
        return None;
    }
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    io::Read::read_to_string(&mut io::Read::take(f, MAX_ACCOUNT_FILE), &mut text).ok()?;
    Some(text)
}

/// Look `user` (a name or number, `USER[:GROUP]`) up in the image's /etc/passwd and
/// /etc/group (merged view of `layers`): (uid, gid).
pub fn user_ids(layers: &[PathBuf], user: &str) -> Result<(u32, u32), String> {
    let read = |file: &str| -> String {
        resolve(layers, Path::new(file))
            .ok()
            .and_then(|inside| lookup(layers, &inside))
            .and_then(|(p, m)| read_account_file(&p, &m))
            .unwrap_or_default()
    };
    let (u, g) = user
        .split_once(':')
        .map_or((user, None), |(u, g)| (u, Some(g)));
    let passwd = read("etc/passwd");
    let entry = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && (f[0] == u || f[2] == u));
    let uid = match (u.parse::<u32>(), &entry) {
        (Ok(n), _) => n,
        (Err(_), Some(f)) => f[2]
            .parse()
            .map_err(|_| format!("bad uid for {u} in /etc/passwd"))?,
        (Err(_), None) => return Err(format!("user `{u}` is not in the image's /etc/passwd")),
    };
    let gid = match g {
        None => entry
            .and_then(|f| f[3].parse().ok())
            .unwrap_or(if uid == 0 { 0 } else { uid }),
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => read("etc/group")
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() > 2 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| format!("group `{g}` is not in the image's /etc/group"))?,
        },
    };
    Ok((uid, gid))
}

/// Top-level entries of the merged view: (name, Some(symlink target) or None for anything
/// else), sorted.
pub fn top_level(layers: &[PathBuf]) -> Vec<(String, Option<PathBuf>)> {
    let mut names = std::collections::BTreeSet::new();
    for l in layers {
        for e in fs::read_dir(l).into_iter().flatten().flatten() {
            names.insert(e.file_name().to_string_lossy().into_owned());
        }
    }
    names
        .into_iter()
        .filter_map(|n| {
            let (p, m) = lookup(layers, Path::new(&n))?;
            let link = m
                .file_type()
                .is_symlink()
                .then(|| fs::read_link(&p).ok())
                .flatten();
            Some((n, link))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer is untrusted input (a registry's image): an entry that climbs out through a
    /// symlink the layer itself made must not touch, create or link anything outside it (as
    /// root, a whiteout there would have replaced a host file with a device node).
    #[test]
    fn a_layer_cannot_reach_outside_through_its_own_symlinks() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("victim"), "host file").unwrap();
        type Attack<'a> = (&'a str, &'a dyn Fn(&mut tar::Builder<Vec<u8>>));
        let attempts: [Attack; 5] = [
            ("a whiteout", &|b| append(b, "esc/.wh.victim", b"")),
            ("an opaque marker", &|b| append(b, "esc/.wh..wh..opq", b"")),
            ("a file", &|b| append(b, "esc/planted", b"x")),
            ("a directory through a dangling link", &|b| {
                let mut h = header(tar::EntryType::Symlink);
                b.append_link(&mut h, "dangling", "../outside/planted")
                    .unwrap();
                append(b, "dangling/sub/file", b"x");
            }),
            ("a hard link", &|b| {
                let mut h = header(tar::EntryType::Link);
                b.append_link(&mut h, "stolen", "esc/victim").unwrap();
            }),
        ];
        for (what, attack) in attempts {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = header(tar::EntryType::Symlink);
            b.append_link(&mut h, "esc", &outside).unwrap();
            attack(&mut b);
            let dest = t.path().join(format!("layer-{}", what.replace(' ', "-")));
            fs::create_dir_all(&dest).unwrap();
            let r = unpack(&b.into_inner().unwrap()[..], &dest);
            assert!(r.is_err(), "{what} through a symlink was unpacked");
            // The layer's own symlink was fine: the refusal is the attack's.
            assert!(
                fs::symlink_metadata(dest.join("esc")).is_ok_and(|m| m.file_type().is_symlink()),
                "{what}: {r:?}"
            );
            assert_eq!(
                fs::read_to_string(outside.join("victim")).unwrap(),
                "host file",
                "{what}"
            );
            assert!(!outside.join("planted").exists(), "{what}");
            assert!(
                !dest.join("stolen").exists(),
                "{what}: a link to a file outside"
            );
            assert!(
                !is_opaque(&outside),
                "{what}: the outside directory was marked opaque"
            );
        }
    }

    /// A layer's /etc/passwd is read as the image sees it and never beyond the layers: a link
    /// to an endless device, to a FIFO, or to the host's own account file reads as no file
    /// (the user is not found), while a link inside the image is followed as inside.
    #[test]
    fn user_lookup_never_reads_through_a_layers_links() {
        let t = tempfile::tempdir().unwrap();
        let host_passwd = t.path().join("host-passwd");
        fs::write(&host_passwd, "hostonly:x:4242:4242::/:/bin/sh\n").unwrap();
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for target in [Path::new("/dev/zero"), &fifo, &host_passwd] {
            let layer = t
                .path()
                .join(format!("l{}", target.display().to_string().len()));
            fs::create_dir_all(layer.join("etc")).unwrap();
            std::os::unix::fs::symlink(target, layer.join("etc/passwd")).unwrap();
            let start = std::time::Instant::now();
            let r = user_ids(std::slice::from_ref(&layer), "hostonly");
            assert!(r.is_err(), "{}: {r:?}", target.display());
            assert!(start.elapsed() < std::time::Duration::from_secs(5));
        }
        // A link that stays inside the image is what a process inside reads.
        let layer = t.path().join("inside");
        fs::create_dir_all(layer.join("etc")).unwrap();
        fs::create_dir_all(layer.join("usr/lib")).unwrap();
        fs::write(
            layer.join("usr/lib/passwd"),
            "dev:x:1234:1235::/home/dev:/bin/sh\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("../usr/lib/passwd", layer.join("etc/passwd")).unwrap();
        assert_eq!(user_ids(&[layer], "dev"), Ok((1234, 1235)));
    }

    fn header(kind: tar::EntryType) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(0);
        h.set_mode(0o755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h
    }

    fn append(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]) {
        let mut h = header(tar::EntryType::Regular);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).unwrap();
    }

    /// A PAX extended header carrying `xattrs` for the entry after it.
    fn append_xattrs(b: &mut tar::Builder<Vec<u8>>, xattrs: &[(&str, &[u8])]) {
        let mut data = Vec::new();
        for (name, value) in xattrs {
            let body_len = " SCHILY.xattr.".len() + name.len() + 1 + value.len() + 1;
            // The record's length counts its own digits.
            let mut len = body_len + 1;
            while len != body_len + len.to_string().len() {
                len = body_len + len.to_string().len();
            }
            data.extend_from_slice(format!("{len} SCHILY.xattr.{name}=").as_bytes());
            data.extend_from_slice(value);
            data.push(b'\n');
        }
        let mut h = header(tar::EntryType::XHeader);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, "PaxHeader", &data[..]).unwrap();
    }

    fn xattr_of(path: &Path, name: &str) -> Option<Vec<u8>> {
        xattr::get(path, name).ok().flatten()
    }

    /// overlayfs reads `trusted.overlay.*` (root's layers) and `user.overlay.*` (an ordinary
    /// user's) as instructions: a redirect, a metacopy, an opaque directory, a whiteout. A
    /// layer from a registry may not give them: they are dropped, other attributes kept, and
    /// the opaque marker that the unpacker itself makes for `.wh..wh..opq` stays.
    #[test]
    fn overlay_attributes_from_a_layer_are_dropped_and_others_kept() {
        let t = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let planted: &[(&str, &[u8])] = &[
            ("trusted.overlay.redirect", b"/etc/shadow"),
            ("trusted.overlay.metacopy", b""),
            ("trusted.overlay.opaque", b"y"),
            ("user.overlay.redirect", b"/etc/shadow"),
            ("user.overlay.metacopy", b""),
            ("user.overlay.opaque", b"y"),
            ("user.overlay.whiteout", b""),
            ("user.kept", b"1"),
        ];
        append_xattrs(&mut b, planted);
        append(&mut b, "file", b"x");
        append_xattrs(&mut b, planted);
        let mut h = header(tar::EntryType::Directory);
        b.append_data(&mut h, "dir", &b""[..]).unwrap();
        append(&mut b, "marked/.wh..wh..opq", b"");
        let dest = t.path().join("layer");
        fs::create_dir(&dest).unwrap();
        unpack(&b.into_inner().unwrap()[..], &dest).unwrap();
        // Attributes are restored at all (the test would pass on dropping everything).
        assert_eq!(
            xattr_of(&dest.join("file"), "user.kept"),
            Some(b"1".to_vec())
        );
        for target in ["file", "dir"] {
            for (name, _) in &planted[..planted.len() - 1] {
                assert_eq!(xattr_of(&dest.join(target), name), None, "{target}: {name}");
            }
        }
        assert!(is_opaque(&dest.join("marked")));
    }

    #[test]
    fn resolve_follows_symlinks_in_the_merged_view() {
        let t = tempfile::tempdir().unwrap();
        let (lo, hi) = (t.path().join("lo"), t.path().join("hi"));
        fs::create_dir_all(lo.join("usr/bin")).unwrap();
        std::os::unix::fs::symlink("usr/bin", lo.join("bin")).unwrap();
        fs::create_dir_all(hi.join("opt")).unwrap();
        std::os::unix::fs::symlink("/etc/../../usr", hi.join("opt/u")).unwrap();
        let layers = vec![hi.clone(), lo.clone()];
        assert_eq!(
            resolve(&layers, Path::new("/bin/x")).unwrap(),
            PathBuf::from("usr/bin/x")
        );
        assert_eq!(
            resolve(&layers, Path::new("/opt/u/bin")).unwrap(),
            PathBuf::from("usr/bin")
        );
        assert_eq!(
            resolve(&layers, Path::new("/../../x")).unwrap(),
            PathBuf::from("x")
        );
        assert_eq!(
            top_level(&layers)
                .iter()
                .map(|(n, l)| (n.as_str(), l.is_some()))
                .collect::<Vec<_>>(),
            [("bin", true), ("opt", false), ("usr", false)]
        );
    }

    #[test]
    fn the_source_hash_sees_content_and_mode_never_mtime() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("a");
        fs::write(&f, "one").unwrap();
        let hash = || {
            hash_sources(
                std::slice::from_ref(&f),
                &Masked::new(),
                &mut super::super::statcache::StatCache::none(),
            )
            .unwrap()
        };
        let h1 = hash();
        let old = fs::File::options().write(true).open(&f).unwrap();
        old.set_modified(std::time::SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(hash(), h1, "mtime changed the hash");
        fs::write(&f, "two").unwrap();
        assert_ne!(hash(), h1);
        fs::write(&f, "one").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o755)).unwrap();
        assert_ne!(hash(), h1);
    }

    #[test]
    fn unpack_refuses_paths_leaving_the_layer() {
        let t = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        // Written raw: the builder itself refuses `..`.
        h.as_gnu_mut().unwrap().name[..8].copy_from_slice(b"../evil\0");
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        let dest = t.path().join("layer");
        fs::create_dir(&dest).unwrap();
        assert!(unpack(&bytes[..], &dest).is_err());
        assert!(!t.path().join("evil").exists());
    }
}
