//! The host facts a plan's root filesystem needs, gathered before evaluation (eval itself
//! reads nothing): which of the system paths exist and how (a merged-/usr symlink or a
//! directory), and the `/etc` snapshot's key, which stats the allowlisted entries and reads the
//! store's index of them. `eval::Host::current` takes this function.

use std::path::{Path, PathBuf};

use crate::eval::plan::SystemPath;
use crate::eval::rootfs::{ETC_PATHS, SYSTEM_PATHS};

/// The host paths shown inside, and the `/etc` snapshot planned into `store`.
pub fn system_paths(store: &Path) -> Vec<SystemPath> {
    let mut system = Vec::new();
    for p in SYSTEM_PATHS.iter().map(PathBuf::from) {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() && p.parent() == Some(Path::new("/")) => {
                if let Ok(target) = std::fs::read_link(&p) {
                    system.push(SystemPath::Symlink { path: p, target });
                }
            }
            Ok(_) => system.push(SystemPath::Bind { path: p }),
            Err(_) => {}
        }
    }
    let etc = super::etc::plan(Path::new("/etc"), ETC_PATHS, store);
    system.push(SystemPath::Snapshot {
        path: PathBuf::from("/etc"),
        snapshot: etc,
    });
    system
}
