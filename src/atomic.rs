//! Writing a file so readers see the old content or the new, never a part: a temporary file
//! in the same directory, synced (or not: [`write_atomic_unsynced`]), then renamed over the
//! target.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Write `bytes` to `path` atomically, creating the directory; the temporary file is
/// removed when anything fails.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write(path, bytes, true, 0o666)
}

/// [`write_atomic`] of a file only its owner may read (0600 from its creation: a key).
pub fn write_atomic_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write(path, bytes, true, 0o600)
}

/// [`write_atomic`] without waiting for the disk: whole or absent for any reader and after
/// the writer is killed, but not after a power loss. For records a run writes for itself at
/// every start, where an fsync (1 to 11 ms on a virtual disk) would be most of the start-up.
pub fn write_atomic_unsynced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write(path, bytes, false, 0o666)
}

fn write(path: &Path, bytes: &[u8], sync: bool, mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".tmp-{}-{nanos}", std::process::id()));
    // A new file only (a link or file planted under the temporary name is refused).
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            if sync {
                f.sync_all()?;
            }
            Ok(())
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A lock file of aisb's state (created 0600 if missing, never through a link, never
/// written): what layers', runs' and stores' locks are taken on.
pub fn lock_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}
