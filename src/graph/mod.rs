//! Content-addressed store entries that a sandbox needs realised on the host:
//! `$XDG_CACHE_HOME/aisb/store/<hash>-<name>/`, written to a temporary directory and renamed
//! into place, then marked ready (see `store`).
//!
//! | entry | what goes into its hash | never |
//! |-------|-------------------------|-------|
//! | `etc` | each allowlisted /etc entry and every directory below it: relative path, kind, mode, size, mtime (ns), symlink target | file contents; files below the top level (their directory's mtime stands for them) |
//! | `claude-managed` | the settings file's text (`agents`) | – |
//! | `layer` | an image's node hash (`image::graph`: base layers by their digest, steps by their inputs) | – |
//! | `image` | the image's hash (`image::graph`) | – |
//! | `mountpoints` | the paths a sandbox mounts below an image's directories that the image lacks (`image::sandbox`) | – |

pub mod etc;
pub mod realise;
pub mod store;
pub mod system;

use std::path::PathBuf;

/// One thing a sandbox needs on the host before it starts, and whether it is there.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostNode {
    /// `etc snapshot`, `generated`, `copy-on-write layer`, `private copy`, `state dir`.
    pub kind: &'static str,
    pub path: PathBuf,
    /// Where it appears inside.
    pub target: PathBuf,
    /// Already there (a store entry complete, a directory made by an earlier run).
    pub ready: bool,
}

/// What a sandbox of `plan` needs realised on the host: store entries (shared, by content)
/// and the sandbox's own state (copy-on-write layers, private copies, state directories).
/// An image's nodes are `image::graph`'s. `named`: the plan is a named sandbox's, which works
/// in its own shared clone of the repository.
pub fn host_nodes(plan: &crate::eval::Plan, named: bool) -> Vec<HostNode> {
    use crate::eval::plan::{MountKind, SystemPath};
    let mut out = Vec::new();
    if named {
        let clone = plan.state_dir.join("clone");
        out.push(HostNode {
            kind: "shared clone",
            ready: clone.join(".git").exists(),
            path: clone,
            target: plan.project.clone(),
        });
    }
    // On an image, its own /etc replaces the snapshot.
    let host_root = plan.rootfs == crate::eval::plan::Rootfs::Host;
    for s in plan.system.iter().filter(|_| host_root) {
        if let SystemPath::Snapshot { path, snapshot } = s {
            out.push(HostNode {
                kind: "etc snapshot",
                ready: store::is_ready(&snapshot.dir),
                path: snapshot.dir.clone(),
                target: path.clone(),
            });
        }
    }
    for m in &plan.mounts {
        let (kind, path, ready) = match &m.kind {
            MountKind::Generated { dir, .. } => ("generated", dir.clone(), store::is_ready(dir)),
            MountKind::Overlay { upper, .. } => {
                ("copy-on-write layer", upper.clone(), upper.is_dir())
            }
            MountKind::Copy { copy, .. } => ("private copy", copy.clone(), copy.exists()),
            MountKind::State { dir } => ("state dir", dir.clone(), dir.is_dir()),
            _ => continue,
        };
        out.push(HostNode {
            kind,
            path,
            target: m.target.clone(),
            ready,
        });
    }
    out
}
