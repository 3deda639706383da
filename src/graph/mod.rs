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
//! | `masked-0000` | none: one empty mode-0000 file, shared (its hash is the empty content's) | – |
//!
//! Not in the store, listed by [`host_nodes`] with a hash all the same: the sandbox's own
//! state (copy-on-write layers, private copies, state dirs, the shared clone: named by their
//! slug, sha256 of the mount target) and the proxy's policy (sha256 of the allow, deny and
//! host-port rules; handed to the proxy at start, never written).

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
    /// Its hash: a store entry's name prefix, a state directory's slug (else its path's digest), the policy's digest
    /// (first 16 hex digits where it is a sha256).
    pub hash: String,
}

/// The hash part of a store entry's or state directory's name (`<hash>-<name>`: the slug, for
/// state, may be a parent of the path, as `overlay/<slug>/upper`); else the name itself.
fn name_hash(path: &std::path::Path) -> String {
    let hashed = path.components().rev().find_map(|c| {
        let name = c.as_os_str().to_str()?;
        let (h, _) = name.split_once('-')?;
        (h.len() >= 16 && h.bytes().all(|b| b.is_ascii_hexdigit())).then(|| h.to_string())
    });
    hashed.unwrap_or_else(|| sha16(path.as_os_str().as_encoded_bytes()))
}

fn sha16(bytes: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(bytes);
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
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
            hash: sha16(format!("clone\0{}", plan.project.display()).as_bytes()),
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
                hash: name_hash(&snapshot.dir),
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
            hash: name_hash(&path),
            path,
            target: m.target.clone(),
            ready,
        });
    }
    if !plan.masks.is_empty() {
        let path = plan.store.join("masked-0000");
        out.push(HostNode {
            kind: "masking file",
            ready: path.is_file(),
            hash: sha16(b""),
            path,
            target: crate::vocab::MASK_SOURCE.into(),
        });
    }
    if plan.network.mode == crate::eval::plan::NetMode::Allow {
        let n = &plan.network;
        let rules = serde_json::json!({
            "allow": n.allow, "deny": n.deny, "localhost_ports": n.localhost_ports,
        });
        out.push(HostNode {
            kind: "proxy policy",
            // Nothing to build: the proxy gets it on stdin when the sandbox starts.
            ready: true,
            hash: sha16(rules.to_string().as_bytes()),
            path: "(the proxy's stdin, at start)".into(),
            target: crate::vocab::PROXY_SOCKET.into(),
        });
    }
    out
}
