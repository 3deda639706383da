//! Git LFS objects a sandbox stored, brought into the host's git directory. A commit made
//! inside holds only the pointer of a file that Git LFS tracks; the content is in the
//! sandbox's `lfs/objects/<aa>/<bb>/<sha256>`. Without this, a named sandbox's work reached the
//! host as pointers whose content was gone with the sandbox (`git lfs push` then fails).
//!
//! The sandbox wrote that directory, so nothing of it is trusted: it is read through
//! descriptors with no link followed, only names git-lfs itself makes are looked at, only
//! regular files are read, and an object is kept only when its content hashes to its name (a
//! file planted under the name of an object the host has or will fetch cannot stand for it).
//! Counts and bytes are bounded.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{openat, Dir, Mode, OFlags};
use sha2::{Digest, Sha256};

/// What one bring-back did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Brought {
    /// Objects the host did not have, now in its `lfs/objects`.
    pub copied: usize,
    /// Objects refused: (name, why).
    pub refused: Vec<(String, String)>,
}

/// At most this many objects, and bytes of them, are taken from one sandbox at a time.
const MAX_OBJECTS: usize = 100_000;
const MAX_BYTES: u64 = 16 << 30;
/// At most this many entries are read from one of the sandbox's directories.
const MAX_ENTRIES: usize = 100_000;

const DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The names in directory `fd` that `keep` accepts, at most [`MAX_ENTRIES`] read.
fn names(fd: impl AsFd, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let Ok(dir) = Dir::read_from(fd) else {
        return Vec::new();
    };
    dir.flatten()
        .take(MAX_ENTRIES)
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_string))
        .filter(|n| keep(n))
        .collect()
}

/// Bring the objects below `objects` (the sandbox's `lfs/objects`, opened without following
/// a link) that `host_git` lacks into `host_git/lfs/objects`, each verified.
pub fn bring_back(objects: &crate::beneath::Dir, host_git: &Path) -> Brought {
    let mut out = Brought::default();
    remove_stale_copies(&host_git.join("lfs/tmp"));
    let top = objects.as_fd();
    let (mut seen, mut bytes) = (0usize, 0u64);
    for a in names(top, |n| lower_hex(n, 2)) {
        let Ok(a_fd) = openat(top, a.as_str(), DIR, Mode::empty()) else {
            continue;
        };
        for b in names(&a_fd, |n| lower_hex(n, 2)) {
            let Ok(b_fd) = openat(&a_fd, b.as_str(), DIR, Mode::empty()) else {
                continue;
            };
            let prefix = format!("{a}{b}");
            for oid in names(&b_fd, |n| lower_hex(n, 64) && n.starts_with(&prefix)) {
                let target = host_git.join("lfs/objects").join(&a).join(&b).join(&oid);
                if std::fs::symlink_metadata(&target).is_ok() {
                    continue;
                }
                seen += 1;
                if seen > MAX_OBJECTS {
                    out.refused
                        .push((oid, format!("more than {MAX_OBJECTS} objects at once")));
                    return out;
                }
                match take(&b_fd, &oid, host_git, &target, &mut bytes) {
                    Ok(()) => out.copied += 1,
                    Err(why) => out.refused.push((oid, why)),
                }
            }
        }
    }
    out
}

/// Copy the sandbox's object `oid` (in directory `dir`) to `target` if its content hashes to
/// its name, through a temporary file in the host's `lfs/tmp`.
fn take(
    dir: &OwnedFd,
    oid: &str,
    host_git: &Path,
    target: &Path,
    bytes: &mut u64,
) -> Result<(), String> {
    let fd = openat(
        dir,
        oid,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open it: {e}"))?;
    let mut file = std::fs::File::from(fd);
    let md = file.metadata().map_err(|e| e.to_string())?;
    if !md.is_file() {
        return Err("not a regular file".into());
    }
    // A sparse file costs the sandbox nothing and the host its whole length.
    {
        use std::os::unix::fs::MetadataExt;
        if md.len() > 64 << 10 && md.blocks() * 512 < md.len() / 2 {
            return Err("a sparse file".into());
        }
    }
    *bytes += md.len();
    if *bytes > MAX_BYTES {
        return Err(format!(
            "more than {} GiB of objects at once",
            MAX_BYTES >> 30
        ));
    }
    let tmp_dir = host_git.join("lfs/tmp");
    std::fs::create_dir_all(&tmp_dir).map_err(|e| e.to_string())?;
    // Room for it, and 1 GiB more for everything else on that disk.
    let free = nix::sys::statvfs::statvfs(&tmp_dir)
        .map(|v| v.blocks_available() as u64 * v.fragment_size() as u64)
        .unwrap_or(0);
    if free < md.len().saturating_add(1 << 30) {
        return Err("too little free space on the repository's disk".into());
    }
    // Hashed before anything is written: a forged object costs the host no write.
    if hash_copy(&mut file, md.len(), None)? != oid {
        return Err("its content does not hash to its name".into());
    }
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = tmp_dir.join(format!(
        "aisb-{}-{}-{oid}",
        std::process::id(),
        COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let result = (|| {
        let mut w = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| e.to_string())?;
        let hashed = hash_copy(&mut file, md.len(), Some(&mut w))?;
        w.sync_all().map_err(|e| e.to_string())?;
        // Again: the sandbox may have changed it since.
        if hashed != oid {
            return Err("its content changed while it was copied".to_string());
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::rename(&tmp, target).map_err(|e| e.to_string())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The SHA-256 (hex) of the first `len` bytes of `file` (never more: a sandbox still writing it
/// cannot make it longer), written to `to` as they are read.
fn hash_copy(
    file: &mut std::fs::File,
    len: u64,
    mut to: Option<&mut std::fs::File>,
) -> Result<String, String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut r = file.take(len);
    loop {
        let n = r.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        if let Some(w) = to.as_mut() {
            w.write_all(&buf[..n]).map_err(|e| e.to_string())?;
        }
    }
    Ok(hex::encode(h.finalize()))
}

/// Whether the entry `name` is `PREFIX-PID-…` of a process that is gone: left by an aisb that
/// was killed, and free to remove.
pub fn left_by_dead_process(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('-'))
        .and_then(|r| r.split('-').next())
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists())
}

/// What this process's bring-backs copied half when aisb was killed: `aisb-PID-…` of processes
/// that are gone.
fn remove_stale_copies(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten().take(MAX_ENTRIES) {
        if left_by_dead_process(&e.file_name().to_string_lossy(), "aisb") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// What to tell the user about a bring-back that refused something (at most six lines). An
/// object is told about once per aisb process (a named sandbox syncs every few seconds).
pub fn lines(b: &Brought) -> Vec<String> {
    static TOLD: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let refused: Vec<&(String, String)> = match TOLD.lock() {
        Ok(mut told) => b
            .refused
            .iter()
            .filter(|(oid, _)| {
                let new = !told.contains(oid);
                if new && told.len() < 10_000 {
                    told.push(oid.clone());
                }
                new
            })
            .collect(),
        Err(_) => b.refused.iter().collect(),
    };
    let mut out: Vec<String> = refused
        .iter()
        .take(5)
        .map(|(oid, why)| {
            format!("aisb: a Git LFS object the sandbox stored was not brought back ({why}): {oid}")
        })
        .collect();
    if refused.len() > 5 {
        out.push(format!(
            "aisb: … and {} more Git LFS objects not brought back",
            refused.len() - 5
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(root: &Path, content: &[u8]) -> String {
        let oid = hex::encode(Sha256::digest(content));
        let d = root.join(&oid[..2]).join(&oid[2..4]);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(&oid), content).unwrap();
        oid
    }

    #[test]
    fn only_what_a_process_that_is_gone_left_is_stale() {
        let me = std::process::id();
        assert!(!left_by_dead_process(&format!("aisb-{me}-0-ab"), "aisb"));
        assert!(left_by_dead_process("aisb-999999999-0-ab", "aisb"));
        assert!(!left_by_dead_process("aisbx-999999999-0-ab", "aisb"));
        assert!(!left_by_dead_process("sync-999999999-1", "aisb"));
        assert!(!left_by_dead_process("aisb-notapid", "aisb"));
    }

    #[test]
    fn verified_objects_come_back_and_forged_or_linked_ones_do_not() {
        let t = tempfile::tempdir().unwrap();
        let sandbox = t.path().join("sandbox/lfs/objects");
        let host = t.path().join("host");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::create_dir_all(host.join("lfs/objects")).unwrap();
        let good = put(&sandbox, b"real content\n");
        // Forged: a name that is not its content's hash.
        let forged = hex::encode(Sha256::digest(b"what the host will fetch"));
        let d = sandbox.join(&forged[..2]).join(&forged[2..4]);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(&forged), b"a guess").unwrap();
        // A link to a file of the host's, under the name of that file's hash.
        let secret = t.path().join("secret");
        std::fs::write(&secret, b"host secret\n").unwrap();
        let linked = hex::encode(Sha256::digest(b"host secret\n"));
        let d = sandbox.join(&linked[..2]).join(&linked[2..4]);
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::symlink(&secret, d.join(&linked)).unwrap();
        // A directory of the tree as a link: not followed.
        let elsewhere = t.path().join("elsewhere");
        let via = (0..)
            .map(|i| put(&elsewhere, format!("through a link {i}\n").as_bytes()))
            .find(|oid| !sandbox.join(&oid[..2]).exists())
            .unwrap();
        std::os::unix::fs::symlink(elsewhere.join(&via[..2]), sandbox.join(&via[..2])).unwrap();
        // Sparse: 16 MiB of zeros that cost the sandbox nothing.
        let zeros = {
            let mut h = Sha256::new();
            let block = vec![0u8; 1 << 20];
            for _ in 0..16 {
                h.update(&block);
            }
            hex::encode(h.finalize())
        };
        let d = sandbox.join(&zeros[..2]).join(&zeros[2..4]);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::File::create(d.join(&zeros))
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        let b = bring_back(&crate::beneath::Dir::open(&sandbox).unwrap(), &host);
        assert_eq!(b.copied, 1, "{b:?}");
        assert!(
            b.refused
                .iter()
                .any(|(o, why)| *o == zeros && why.contains("sparse")),
            "{b:?}"
        );
        let kept = |oid: &str| {
            host.join("lfs/objects")
                .join(&oid[..2])
                .join(&oid[2..4])
                .join(oid)
        };
        assert_eq!(std::fs::read(kept(&good)).unwrap(), b"real content\n");
        for oid in [&forged, &linked, &via] {
            assert!(!kept(oid).exists(), "{oid} came back");
        }
        assert_eq!(b.refused.len(), 3, "{b:?}");
        // Each refusal is told once per process.
        assert_eq!(lines(&b).len(), 3);
        assert!(lines(&b).is_empty());
        // Nothing left in the host's temporary directory.
        assert_eq!(std::fs::read_dir(host.join("lfs/tmp")).unwrap().count(), 0);
        // What the host already has is not read again.
        let again = bring_back(&crate::beneath::Dir::open(&sandbox).unwrap(), &host);
        assert_eq!(again.copied, 0);
    }
}
