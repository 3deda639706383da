//! The build graph of an image: one node per instruction, each hashed from exactly its inputs
//! and its parent's hash, realised into the store only when its entry is missing.
//!
//! | node | store entry | what goes into its hash | never |
//! |------|-------------|-------------------------|-------|
//! | base | – | the manifest's sha256 digest (verified; a tag is resolved to one, or pinned by `sandbox.lock`) | tags, registry names |
//! | base layer | `<digest>-layer` | the layer blob's sha256 digest (verified while unpacking) | – |
//! | `FROM scratch` | – | the word `scratch` | – |
//! | `ARG`, `ENV`, `USER`, `SHELL` | – | parent hash, the instruction with variables expanded | – |
//! | `WORKDIR` | `<hash>-layer` (the directory) | parent hash, the absolute directory | – |
//! | `RUN` | `<hash>-layer` (the overlay upper dir) | parent hash, argv (shell + command), the full environment (ENVs, ARGs in scope, sorted), working dir, user, the domains the step may reach | output, time |
//! | `COPY`/`ADD` | `<hash>-layer` | parent hash, destination, `--chown`, `--chmod`, each source's name and, for every file below it that the sandbox does not mask (masked ones are never copied), in sorted order: relative path, kind, permission bits, content sha256 or symlink target (`layer::hash_sources`) | mtimes, owners, inode numbers |
//! | image | `<hash>-image` (`image.json`: layers, env, workdir, user, shell) | last node's hash, that config | – |
//!
//! Hashes are sha256 over `aisb-image-v1` and the parts, NUL-separated. Entries are named by
//! the first 32 hex digits (`store`'s convention).
//!
//! Planning (`plan`) hashes every node without building anything, so `aisb plan` can say what
//! is cached; executing (`build`) realises the missing ones in order.

mod build;
mod plan;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::oci::{self, Blobs};
use super::{layer, Step};
use crate::graph::store;

pub use build::{build, load, Built, Outcome, Progress};
pub use plan::plan;

/// An image to build: its steps and where relative COPY sources and `oci:` paths are.
#[derive(Debug, Clone)]
pub struct Def {
    /// `Dockerfile` or the KDL image's name: the key in `sandbox.lock`.
    pub name: String,
    pub steps: Vec<Step>,
    pub context: PathBuf,
}

pub struct Options<'a> {
    pub store: &'a Path,
    /// Values for `ARG`s (the caller's identity, then `--build-arg`s).
    pub build_args: BTreeMap<String, String>,
    /// Base digests pinned by the lock file, by the source's text.
    pub pins: BTreeMap<String, String>,
    /// Ask the registry what a tag points at even when this machine has seen it.
    pub pull: bool,
    /// Domain rules RUN steps may reach (the plan's `build_network`).
    pub allow: Vec<String>,
    /// What the sandbox masks: never copied into the image.
    pub masked: layer::Masked,
    /// Where RUN steps' proxy logs its decisions.
    pub audit: PathBuf,
}

#[derive(Debug, Clone, Serialize)]
pub struct Node {
    pub hash: String,
    /// The instruction (`RUN apt-get …`, `layer sha256:…`).
    pub what: String,
    /// Where it was written.
    pub at: String,
    /// Its store entry, for the nodes that make a layer.
    pub entry: Option<PathBuf>,
    pub cached: bool,
    #[serde(skip)]
    action: Action,
}

#[derive(Debug, Clone)]
enum Action {
    None,
    Layer {
        digest: String,
        size: u64,
    },
    Mkdir {
        dir: String,
    },
    Run {
        argv: Vec<String>,
        env: Vec<String>,
        cwd: String,
        user: String,
    },
    Copy {
        srcs: Vec<PathBuf>,
        dest: String,
        chown: Option<String>,
        chmod: Option<u32>,
        add: bool,
        /// What the graph hashed of the sources (`layer::hash_sources`): the copy must be it.
        content: String,
    },
}

/// What a built image is, as the sandbox uses it (`image.json` in the image's entry).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageConfig {
    /// Layer entries, top first (empty ones left out).
    pub layers: Vec<PathBuf>,
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub user: String,
    pub shell: Vec<String>,
}

#[derive(Serialize)]
pub struct Graph {
    pub name: String,
    pub nodes: Vec<Node>,
    /// The image's hash: what `sandbox.lock` pins.
    pub hash: String,
    /// (the source as written after FROM, its manifest digest), absent for scratch.
    pub base: Option<(String, String)>,
    pub entry: PathBuf,
    pub cached: bool,
    #[serde(skip)]
    blobs: Option<Blobs>,
    #[serde(skip)]
    config: ImageConfig,
    #[serde(skip)]
    allow: Vec<String>,
    #[serde(skip)]
    masked: layer::Masked,
    #[serde(skip)]
    audit: PathBuf,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum BuildError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Dockerfile(#[from] Box<super::dockerfile::DockerfileError>),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Fetch(#[from] oci::FetchError),
    #[error("{at}: {message}")]
    #[diagnostic(help("{help}"))]
    Step {
        at: String,
        message: String,
        help: String,
    },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Run(#[from] super::step::StepError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lock(Box<super::lock::LockError>),
    #[error("{what}: {source}")]
    #[diagnostic(help(
        "`aisb store gc` removes incomplete entries; `aisb doctor` checks the host"
    ))]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl From<super::lock::LockError> for BuildError {
    fn from(e: super::lock::LockError) -> BuildError {
        BuildError::Lock(Box::new(e))
    }
}

fn step_err(at: &str, message: impl Into<String>, help: impl Into<String>) -> BuildError {
    BuildError::Step {
        at: at.to_string(),
        message: message.into(),
        help: help.into(),
    }
}

fn hash(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(b"aisb-image-v1");
    for p in parts {
        h.update(b"\0");
        h.update(p.as_bytes());
    }
    hex::encode(h.finalize())
}

/// `hash` is hex (ours, or a digest's checked hex part); a shorter one is used whole.
fn entry(store: &Path, hash: &str, name: &str) -> PathBuf {
    store.join(format!("{}-{name}", hash.get(..32).unwrap_or(hash)))
}

/// The tags this machine has resolved (`<store>/.tags.json`: source text -> digest), so a
/// sandbox starts without asking the registry each time. `aisb build --pull` refreshes.
fn tags_file(store: &Path) -> PathBuf {
    store.join(".tags.json")
}

fn read_tags(store: &Path) -> BTreeMap<String, String> {
    fs::read(tags_file(store))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn remember_tag(store: &Path, source: &str, digest: &str) {
    let mut tags = read_tags(store);
    if tags.get(source).map(String::as_str) != Some(digest) {
        tags.insert(source.to_string(), digest.to_string());
        if let Ok(b) = serde_json::to_vec_pretty(&tags) {
            let _ = fs::create_dir_all(store);
            let _ = crate::atomic::write_atomic(&tags_file(store), &b);
        }
    }
}

/// A resolved base's manifest (digest, config, layer list) in the store (`<digest>-base`).
pub fn base_entry(store: &Path, digest: &str) -> Option<PathBuf> {
    oci::sha256_hex_of(digest).map(|hex| entry(store, hex, "base"))
}

fn load_base(store: &Path, digest: &str) -> Option<oci::Base> {
    let e = base_entry(store, digest)?;
    if !store::is_ready(&e) {
        return None;
    }
    let b: oci::Base = serde_json::from_slice(&fs::read(e.join("base.json")).ok()?).ok()?;
    // A record is the store's, but read back it is checked like any input.
    (b.digest == digest && b.is_valid()).then_some(b)
}

fn save_base(store: &Path, b: &oci::Base) {
    if let (Some(e), Ok(json)) = (base_entry(store, &b.digest), serde_json::to_vec_pretty(b)) {
        let _ = store::realise(&e, |tmp| fs::write(tmp.join("base.json"), &json));
    }
}

impl Graph {
    /// Every store entry this image uses: its base's manifest record, its layers, its own.
    pub fn entries(&self) -> std::collections::BTreeSet<PathBuf> {
        let store = self.entry.parent().unwrap_or(Path::new("."));
        let mut out: std::collections::BTreeSet<PathBuf> =
            self.nodes.iter().filter_map(|n| n.entry.clone()).collect();
        out.extend(self.base.as_ref().and_then(|(_, d)| base_entry(store, d)));
        out.insert(self.entry.clone());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::Instr;

    /// A base's record in the store names its layers' digests, and those name store entries
    /// (`<hex>-layer`): a record that is not what aisb writes (a short digest, another
    /// algorithm) is not used, never sliced into a panic.
    #[test]
    fn a_corrupt_base_record_is_not_used_and_never_panics() {
        let t = tempfile::tempdir().unwrap();
        let store_dir = t.path().join("store");
        let pin = format!("sha256:{}", "1".repeat(64));
        let sha512 = format!("sha512:{}", "2".repeat(128));
        for layer_digest in ["x", "sha256:", "sha256:é", sha512.as_str()] {
            let record = serde_json::json!({
                "digest": pin,
                "config": {},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": layer_digest, "size": 1}],
            });
            let e = base_entry(&store_dir, &pin).unwrap();
            let _ = fs::remove_dir_all(&e);
            store::realise(&e, |tmp| {
                fs::write(tmp.join("base.json"), serde_json::to_vec(&record).unwrap())
            })
            .unwrap();
            let def = Def {
                name: "Dockerfile".into(),
                steps: vec![Step {
                    instr: Instr::From("oci:/nonexistent/layout".into()),
                    at: "Dockerfile:1".into(),
                }],
                context: t.path().to_path_buf(),
            };
            let o = Options {
                store: &store_dir,
                build_args: BTreeMap::new(),
                pins: [("oci:/nonexistent/layout".to_string(), pin.clone())].into(),
                pull: false,
                allow: Vec::new(),
                masked: layer::Masked::new(),
                audit: t.path().join("audit.jsonl"),
            };
            // Not used: the layout itself is asked (and is missing).
            let err = plan(&def, &o).err().expect(layer_digest);
            assert!(
                err.to_string().contains("index.json"),
                "{layer_digest}: {err}"
            );
        }
    }
}
