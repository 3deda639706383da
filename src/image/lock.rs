//! `sandbox.lock`, checked in beside `sandbox.kdl`: for each image, the digest every base
//! source resolved to and the image's graph hash. Builds use the pinned digests (a moved tag
//! does not change what is built); `aisb build --locked` fails when anything would differ.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const FILE: &str = "sandbox.lock";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Lock {
    pub version: u32,
    pub images: BTreeMap<String, Locked>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Locked {
    /// The image's hash (see `image::graph`).
    pub graph: String,
    /// Base source as written after FROM (variables expanded) -> manifest digest.
    pub bases: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LockError {
    #[error("{}: {message}", path.display())]
    #[diagnostic(help("it is written by `aisb build`; delete it to start over"))]
    Bad { path: PathBuf, message: String },
    #[error("--locked: {} has no entry for image `{image}`", path.display())]
    #[diagnostic(help("run `aisb build` without --locked and commit {}", path.display()))]
    Missing { path: PathBuf, image: String },
    #[error("--locked: `{source_ref}` now points at {now}, {} pins {pinned}", path.display())]
    #[diagnostic(help("the tag moved. To take the new image: `aisb build --pull` and commit {}; to keep the old one, pin it by digest in FROM", path.display()))]
    Moved {
        path: PathBuf,
        source_ref: String,
        pinned: String,
        now: String,
    },
    #[error("--locked: image `{image}` would build as {now}, {} pins {pinned}", path.display())]
    #[diagnostic(help("its steps, build args or copied files changed since the lock was written; run `aisb build` and commit {}", path.display()))]
    Graph {
        path: PathBuf,
        image: String,
        pinned: String,
        now: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    #[diagnostic(help("is the project writable?"))]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl Lock {
    /// The lock file in `dir`, or an empty one when there is none.
    pub fn read(dir: &Path) -> Result<Lock, LockError> {
        let path = dir.join(FILE);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| LockError::Bad {
                path,
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lock {
                version: 1,
                images: BTreeMap::new(),
            }),
            Err(e) => Err(LockError::Bad {
                path,
                message: e.to_string(),
            }),
        }
    }

    /// Write it when it changed (atomically).
    pub fn write(&self, dir: &Path) -> Result<bool, LockError> {
        let path = dir.join(FILE);
        if Lock::read(dir).ok().as_ref() == Some(self) && path.exists() {
            return Ok(false);
        }
        let mut text = serde_json::to_string_pretty(self).map_err(|e| LockError::Write {
            path: path.clone(),
            source: e.into(),
        })?;
        text.push('\n');
        crate::atomic::write_atomic(&path, text.as_bytes())
            .map_err(|source| LockError::Write { path, source })?;
        Ok(true)
    }
}

/// The store entries the lock file at `path` pins: each image's entry and its layers (for
/// `aisb store gc`, which keeps them).
pub fn pinned_entries(path: &Path, store: &Path) -> Vec<PathBuf> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let Ok(lock) = Lock::read(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for l in lock.images.values().filter(|l| l.graph.len() >= 32) {
        let image = store.join(format!("{}-image", &l.graph[..32]));
        if let Ok(b) = std::fs::read(image.join("image.json")) {
            if let Ok(c) = serde_json::from_slice::<super::graph::ImageConfig>(&b) {
                out.extend(c.layers);
            }
        }
        out.push(image);
        out.extend(
            l.bases
                .values()
                .filter_map(|d| super::graph::base_entry(store, d)),
        );
    }
    out
}
