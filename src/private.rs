//! aisb's own directories (`$XDG_CACHE_HOME/aisb`, `$XDG_CONFIG_HOME/aisb`) hold private copies
//! of host configuration, overlay upper dirs, audit logs and trust pins: mode 0700, so nothing
//! below them is reachable by another user whatever its own mode.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// Create `dir` 0700, or tighten it when it is looser.
pub fn ensure(dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => tighten(dir),
        Err(e) => Err(e),
    }
}

/// Tighten `dir` to 0700 when it exists. A symbolic link there is refused; so is a
/// directory of another user for an ordinary user (it could not use it, and its owner could
/// read or change everything in it). Root leaves another user's directory as it is (`sudo`
/// keeps a user's HOME on some systems).
pub fn tighten(dir: &Path) -> std::io::Result<()> {
    let md = match std::fs::symlink_metadata(dir) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let me = nix::unistd::geteuid();
    if !md.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory (a symbolic link?): aisb keeps private state there; remove it",
            dir.display()
        )));
    }
    if md.uid() != me.as_raw() {
        if me.is_root() {
            return Ok(());
        }
        return Err(std::io::Error::other(format!(
            "{} belongs to uid {}, not to you (made by `sudo aisb` with your HOME?): remove it, or set XDG_CACHE_HOME/XDG_CONFIG_HOME",
            dir.display(),
            md.uid()
        )));
    }
    if md.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}
