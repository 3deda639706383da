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

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::oci::{self, Blobs};
use super::statcache::StatCache;
use super::{expand, layer, Cmd, Instr, Source, Step};
use crate::graph::store;

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

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Work out every node's hash and whether it is cached. Reads the base's manifest (from the
/// layout, the archive, or the registry unless pinned or seen before) and hashes COPY sources.
pub fn plan(def: &Def, o: &Options) -> Result<Graph, BuildError> {
    let mut pre_from: BTreeMap<String, String> = BTreeMap::new();
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut env: Vec<(String, String)> = Vec::new();
    let mut workdir = "/".to_string();
    let mut user = String::new();
    let mut shell = vec!["/bin/sh".to_string(), "-c".to_string()];
    let mut parent = String::new();
    let mut nodes = Vec::new();
    let mut base = None;
    let mut blobs = None;
    let mut seen_from = false;
    // Variables for expansion: ARGs in scope, then ENVs over them.
    let vars = |args: &BTreeMap<String, String>, env: &[(String, String)]| {
        let mut v = args.clone();
        v.extend(env.iter().cloned());
        v
    };
    let mut stat_cache = StatCache::load(stat_cache_file(o.store, &def.context));
    for step in &def.steps {
        let at = step.at.as_str();
        let meta = |nodes: &mut Vec<Node>, parent: &mut String, text: String| {
            let h = hash(&[parent, &text]);
            nodes.push(Node {
                hash: h.clone(),
                what: text,
                at: at.to_string(),
                entry: None,
                cached: true,
                action: Action::None,
            });
            *parent = h;
        };
        match &step.instr {
            Instr::Arg(k, default) => {
                let scope = if seen_from {
                    vars(&args, &env)
                } else {
                    pre_from.clone()
                };
                let v = o
                    .build_args
                    .get(k)
                    .cloned()
                    .or_else(|| default.as_ref().map(|d| expand(d, &scope)))
                    .or_else(|| pre_from.get(k).cloned())
                    .unwrap_or_default();
                if seen_from {
                    args.insert(k.clone(), v.clone());
                    meta(&mut nodes, &mut parent, format!("ARG {k}={v}"));
                } else {
                    pre_from.insert(k.clone(), v);
                }
            }
            Instr::From(r) => {
                seen_from = true;
                let text = expand(r, &pre_from);
                let source = Source::parse(&text, &def.context).map_err(|m| {
                    step_err(
                        at,
                        m,
                        "FROM IMAGE, oci:DIR[:TAG], oci-archive:FILE[:TAG] or scratch",
                    )
                })?;
                if source == Source::Scratch {
                    parent = hash(&["scratch"]);
                    nodes.push(Node {
                        hash: parent.clone(),
                        what: "FROM scratch".into(),
                        at: at.into(),
                        entry: None,
                        cached: true,
                        action: Action::None,
                    });
                    continue;
                }
                let pinned = o.pins.get(&text).cloned().or_else(|| {
                    (matches!(source, Source::Registry(_)) && !o.pull)
                        .then(|| read_tags(o.store).get(&text).cloned())
                        .flatten()
                });
                // A base resolved before, all its layers in the store: nothing to ask anyone
                // (a sandbox on a registry image starts offline).
                let known = pinned
                    .as_deref()
                    .and_then(|d| load_base(o.store, d))
                    .filter(|b| {
                        b.layers.iter().all(|l| {
                            oci::descriptor_hex(l)
                                .is_some_and(|hex| store::is_ready(&entry(o.store, hex, "layer")))
                        })
                    });
                let (b, bl) = match known {
                    Some(b) => (b, None),
                    None => {
                        let (b, bl) = oci::resolve(&source, pinned.as_deref())?;
                        save_base(o.store, &b);
                        (b, Some(bl))
                    }
                };
                if matches!(source, Source::Registry(_)) {
                    remember_tag(o.store, &text, &b.digest);
                }
                parent = hash(&["base", &b.digest]);
                nodes.push(Node {
                    hash: parent.clone(),
                    what: format!("FROM {text}"),
                    at: at.into(),
                    entry: None,
                    cached: true,
                    action: Action::None,
                });
                for l in &b.layers {
                    // Every layer of a resolved or stored base is sha256 (`Base::is_valid`).
                    let hex = oci::descriptor_hex(l).ok_or_else(|| {
                        step_err(
                            at,
                            format!("the layer digest `{}` is not sha256", l.digest()),
                            "aisb verifies layers by sha256",
                        )
                    })?;
                    nodes.push(layer_node(
                        o.store,
                        hex,
                        format!("layer sha256:{}", hex.get(..12).unwrap_or(hex)),
                        at,
                        Action::Layer {
                            digest: l.digest().to_string(),
                            size: l.size(),
                        },
                    ));
                }
                for kv in b.config.env.iter().flatten() {
                    if let Some((k, v)) = kv.split_once('=') {
                        set_env(&mut env, k, v);
                    }
                }
                if let Some(w) = b.config.working_dir.as_ref().filter(|w| !w.is_empty()) {
                    workdir = w.clone();
                }
                if let Some(u) = &b.config.user {
                    user = u.clone();
                }
                base = Some((text, b.digest.clone()));
                blobs = bl;
            }
            Instr::Env(kv) => {
                let mut text = String::from("ENV");
                for (k, v) in kv {
                    let v = expand(v, &vars(&args, &env));
                    text.push_str(&format!(" {k}={v:?}"));
                    set_env(&mut env, k, &v);
                }
                meta(&mut nodes, &mut parent, text);
            }
            Instr::User(u) => {
                user = expand(u, &vars(&args, &env));
                meta(&mut nodes, &mut parent, format!("USER {user}"));
            }
            Instr::Shell(s) => {
                shell = s.clone();
                meta(&mut nodes, &mut parent, format!("SHELL {s:?}"));
            }
            Instr::Workdir(w) => {
                let w = expand(w, &vars(&args, &env));
                workdir = Path::new(&workdir).join(w).to_string_lossy().into_owned();
                let h = hash(&[&parent, "WORKDIR", &workdir]);
                nodes.push(layer_node(
                    o.store,
                    &h,
                    format!("WORKDIR {workdir}"),
                    at,
                    Action::Mkdir {
                        dir: workdir.clone(),
                    },
                ));
                parent = h;
            }
            Instr::Run(cmd) => {
                let argv = match cmd {
                    Cmd::Shell(s) => shell.iter().cloned().chain([s.clone()]).collect(),
                    Cmd::Exec(a) => a.clone(),
                };
                // ARGs reach RUN as environment variables; ENVs win over them.
                let mut full: BTreeMap<String, String> = args.clone();
                full.extend(env.iter().cloned());
                full.entry("PATH".into())
                    .or_insert_with(|| DEFAULT_PATH.into());
                let env_list: Vec<String> = full.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let h = hash(&[
                    &parent,
                    "RUN",
                    &serde_json::to_string(&argv).unwrap_or_default(),
                    &env_list.join("\0"),
                    &workdir,
                    &user,
                    &o.allow.join(","),
                ]);
                nodes.push(layer_node(
                    o.store,
                    &h,
                    step.instr.display(),
                    at,
                    Action::Run {
                        argv,
                        env: env_list,
                        cwd: workdir.clone(),
                        user: user.clone(),
                    },
                ));
                parent = h;
            }
            Instr::Copy {
                srcs,
                dest,
                chown,
                chmod,
                add,
            } => {
                let v = vars(&args, &env);
                let dest = expand(dest, &v);
                let dest = if dest.starts_with('/') {
                    dest
                } else {
                    format!("{}/{dest}", workdir.trim_end_matches('/'))
                };
                let chown = chown.as_ref().map(|c| expand(c, &v));
                let mut paths = Vec::new();
                for s in srcs {
                    paths.extend(sources(&def.context, &expand(s, &v)).map_err(|m| step_err(at, m, "COPY sources are files or directories inside the build context (the project)"))?);
                }
                for p in &paths {
                    let real = p.canonicalize().unwrap_or_else(|_| p.clone());
                    if let Some(rule) = layer::masked_by(&o.masked, &real) {
                        return Err(step_err(
                            at,
                            format!("{} is never copied into an image: {rule}", p.display()),
                            "leave it out of the COPY; a file the sandbox masks may be `allow`ed in sandbox.kdl if the sandbox may see it (such files below a copied directory are left out)",
                        ));
                    }
                }
                let content =
                    layer::hash_sources(&paths, &o.masked, &mut stat_cache).map_err(|e| {
                        step_err(
                            at,
                            format!("reading the sources: {e}"),
                            "are they readable?",
                        )
                    })?;
                let names: Vec<String> = paths
                    .iter()
                    .map(|p| {
                        p.file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default()
                    })
                    .collect();
                let h = hash(&[
                    &parent,
                    if *add { "ADD" } else { "COPY" },
                    &dest,
                    chown.as_deref().unwrap_or(""),
                    &format!("{chmod:?}"),
                    &names.join("\0"),
                    &content,
                ]);
                nodes.push(layer_node(
                    o.store,
                    &h,
                    step.instr.display(),
                    at,
                    Action::Copy {
                        srcs: paths,
                        dest,
                        chown,
                        chmod: *chmod,
                        add: *add,
                        content,
                    },
                ));
                parent = h;
            }
        }
    }
    env.retain(|(k, _)| !k.is_empty());
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.insert(0, ("PATH".into(), DEFAULT_PATH.into()));
    }
    let config = ImageConfig {
        layers: Vec::new(),
        env,
        workdir,
        user,
        shell,
    };
    let final_hash = hash(&[
        &parent,
        "image",
        &serde_json::to_string(&(&config.env, &config.workdir, &config.user, &config.shell))
            .unwrap_or_default(),
    ]);
    let image_entry = entry(o.store, &final_hash, "image");
    stat_cache.save();
    Ok(Graph {
        name: def.name.clone(),
        cached: store::is_ready(&image_entry) && nodes.iter().all(|n| n.cached),
        nodes,
        hash: final_hash,
        base,
        entry: image_entry,
        blobs,
        config,
        allow: o.allow.clone(),
        masked: o.masked.clone(),
        audit: o.audit.clone(),
    })
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

/// A node that makes a layer: its entry is `<hash>-layer`, cached when that is ready.
fn layer_node(store: &Path, hash: &str, what: String, at: &str, action: Action) -> Node {
    let e = entry(store, hash, "layer");
    Node {
        hash: hash.to_string(),
        what,
        at: at.to_string(),
        cached: store::is_ready(&e),
        entry: Some(e),
        action,
    }
}

fn set_env(env: &mut Vec<(String, String)>, k: &str, v: &str) {
    match env.iter_mut().find(|(k2, _)| k2 == k) {
        Some(e) => e.1 = v.to_string(),
        None => env.push((k.to_string(), v.to_string())),
    }
}

/// Where the content hashes of a build context's files are remembered: beside the store, by
/// the context's real path.
fn stat_cache_file(store: &Path, context: &Path) -> PathBuf {
    let real = context
        .canonicalize()
        .unwrap_or_else(|_| context.to_path_buf());
    let key = hash(&[&real.to_string_lossy()]);
    store
        .parent()
        .unwrap_or(store)
        .join("copy-hashes")
        .join(format!("{}.json", key.get(..32).unwrap_or(&key)))
}

/// COPY sources: a path inside the context, or a `*`/`?` pattern in its last component.
fn sources(context: &Path, src: &str) -> Result<Vec<PathBuf>, String> {
    let rel = src.trim_start_matches('/');
    let inside = |p: &Path| -> Result<PathBuf, String> {
        let ctx = context
            .canonicalize()
            .map_err(|e| format!("{}: {e}", context.display()))?;
        let real = p.canonicalize().map_err(|e| format!("{src}: {e}"))?;
        if !real.starts_with(&ctx) {
            return Err(format!(
                "{src} is outside the build context {}",
                ctx.display()
            ));
        }
        Ok(p.to_path_buf())
    };
    let path = context.join(rel);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains(['*', '?', '[']) {
        return Ok(vec![inside(&path)?]);
    }
    let glob = globset::Glob::new(&name)
        .map_err(|e| format!("{src}: {e}"))?
        .compile_matcher();
    let dir = path.parent().unwrap_or(context);
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .filter(|e| glob.is_match(e.file_name()))
        .map(|e| inside(&e.path()))
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err(format!("{src} matches nothing"));
    }
    out.sort();
    Ok(out)
}

/// How a node went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Its entry was in the store.
    Cached,
    Built,
    /// No entry (ARG, ENV, USER, SHELL, FROM).
    Config,
}

/// What `build` tells its caller as it goes.
pub trait Progress {
    fn start(&mut self, index: usize, node: &Node);
    fn line(&mut self, line: &str);
    fn done(&mut self, index: usize, node: &Node, outcome: Outcome, secs: f64);
}

/// A built image: its config (`layers` filled in) and what happened to each node.
#[derive(Debug, Clone, Serialize)]
pub struct Built {
    pub hash: String,
    pub entry: PathBuf,
    pub config: ImageConfig,
    pub outcomes: Vec<Outcome>,
}

/// Realise every node that is missing, in order, then the image entry.
pub fn build(g: &Graph, progress: &mut dyn Progress) -> Result<Built, BuildError> {
    let store_dir = g.entry.parent().unwrap_or(Path::new(".")).to_path_buf();
    let mut below: Vec<PathBuf> = Vec::new(); // bottom first
    let mut outcomes = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        progress.start(i, node);
        let t0 = Instant::now();
        let Some(e) = &node.entry else {
            outcomes.push(Outcome::Config);
            progress.done(i, node, Outcome::Config, 0.0);
            continue;
        };
        let top_first: Vec<PathBuf> = below.iter().rev().cloned().collect();
        let io_err = |what: String| move |source| BuildError::Io { what, source };
        let mut failure: Option<BuildError> = None;
        let built = store::realise(e, |tmp| {
            let r = fill(g, node, tmp, &top_first, &store_dir, i, progress);
            r.map_err(|err| {
                let msg = err.to_string();
                failure = Some(err);
                io::Error::other(msg)
            })
        });
        let built = match built {
            Ok(b) => b,
            Err(e) => {
                return Err(failure
                    .unwrap_or_else(|| io_err(format!("{}: storing {}", node.at, node.what))(e)))
            }
        };
        let outcome = if built {
            Outcome::Built
        } else {
            Outcome::Cached
        };
        outcomes.push(outcome);
        progress.done(i, node, outcome, t0.elapsed().as_secs_f64());
        if fs::read_dir(e)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
        {
            below.push(e.clone());
        }
    }
    let mut config = g.config.clone();
    config.layers = below.iter().rev().cloned().collect();
    let json = serde_json::to_vec_pretty(&config).map_err(|e| BuildError::Io {
        what: "encoding image.json".into(),
        source: e.into(),
    })?;
    store::realise(&g.entry, |tmp| fs::write(tmp.join("image.json"), &json)).map_err(|source| {
        BuildError::Io {
            what: format!("storing {}", g.entry.display()),
            source,
        }
    })?;
    Ok(Built {
        hash: g.hash.clone(),
        entry: g.entry.clone(),
        config,
        outcomes,
    })
}

/// The image entry's config, when it was built before and every layer is still there.
pub fn load(entry: &Path) -> Option<ImageConfig> {
    if !store::is_ready(entry) {
        return None;
    }
    let c: ImageConfig = serde_json::from_slice(&fs::read(entry.join("image.json")).ok()?).ok()?;
    c.layers.iter().all(|l| store::is_ready(l)).then_some(c)
}

fn fill(
    g: &Graph,
    node: &Node,
    tmp: &Path,
    layers: &[PathBuf],
    store_dir: &Path,
    index: usize,
    progress: &mut dyn Progress,
) -> Result<(), BuildError> {
    let at = node.at.as_str();
    match &node.action {
        Action::None => Ok(()),
        Action::Layer { digest, size } => {
            let blobs = g
                .blobs
                .as_ref()
                .ok_or_else(|| step_err(at, "no base to read layers from", "internal"))?;
            let reader = blobs.open(digest, *size, at)?;
            let mut v = oci::Verified::new(reader);
            layer::unpack(&mut v, tmp).map_err(|e| {
                step_err(
                    at,
                    format!("unpacking {digest}: {e}"),
                    "is the image complete? (a corrupt layer is never used)",
                )
            })?;
            v.check(digest, *size).map_err(|e| {
                step_err(
                    at,
                    e.to_string(),
                    "nothing of it was used; check the source",
                )
            })
        }
        Action::Mkdir { dir } => {
            let rel = layer::resolve(layers, Path::new(dir))
                .map_err(|e| step_err(at, e.to_string(), "fix the WORKDIR"))?;
            fs::create_dir_all(tmp.join(rel))
                .map_err(|e| step_err(at, format!("creating {dir}: {e}"), "fix the WORKDIR"))
        }
        Action::Copy {
            srcs,
            dest,
            chown,
            chmod,
            add,
            content,
        } => {
            let owner = match chown {
                Some(c) => layer::user_ids(layers, c).map_err(|m| step_err(at, m, "--chown takes USER[:GROUP] as the image's /etc/passwd knows them, or numbers"))?,
                None => (0, 0),
            };
            let into_dir = dest.ends_with('/') || srcs.len() > 1;
            let root = crate::beneath::Dir::open(tmp)
                .map_err(|e| step_err(at, e.to_string(), "check the store"))?;
            let mut h = sha2::Sha256::new();
            for src in srcs {
                let name = src.file_name().map(PathBuf::from).unwrap_or_default();
                let is_dir = src.is_dir();
                let target = if into_dir && !is_dir {
                    format!("{}/{}", dest.trim_end_matches('/'), name.display())
                } else {
                    dest.clone()
                };
                let rel = layer::resolve(layers, Path::new(&target))
                    .map_err(|e| step_err(at, e.to_string(), "fix the destination"))?;
                let archive = *add && !is_dir && is_tar(src);
                h.update(b"source\0");
                let r = if archive {
                    unpack_hashed(src, &root, tmp, &rel, &mut h)
                } else {
                    layer::copy_into(src, &root, &rel, owner, *chmod, &g.masked, &mut h)
                };
                r.map_err(|e| {
                    step_err(
                        at,
                        format!("copying {}: {e}", src.display()),
                        "check the source and destination",
                    )
                })?;
            }
            if hex::encode(h.finalize()) != *content {
                return Err(step_err(
                    at,
                    "the sources changed while they were copied: the layer is not what the graph hashed".to_string(),
                    "build again once nothing writes them",
                ));
            }
            Ok(())
        }
        Action::Run {
            argv,
            env,
            cwd,
            user,
        } => {
            let ids = if user.is_empty() {
                (0, 0)
            } else {
                layer::user_ids(layers, user).map_err(|m| step_err(at, m, "USER names a user the image has (create it in an earlier RUN), or uid[:gid]"))?
            };
            super::sandbox::check_init_runs(layers, at)?;
            let empty;
            let lowers: &[PathBuf] = if layers.is_empty() {
                empty = [store_dir.join(".empty")];
                fs::create_dir_all(&empty[0])
                    .map_err(|e| step_err(at, e.to_string(), "check the store"))?;
                &empty
            } else {
                layers
            };
            let scratch = store_dir
                .join(".work")
                .join(format!("{}-{index}", std::process::id()));
            let _ = fs::remove_dir_all(&scratch);
            fs::create_dir_all(&scratch).map_err(|e| {
                step_err(
                    at,
                    format!("creating {}: {e}", scratch.display()),
                    "check the store",
                )
            })?;
            let run = super::step::StepRun {
                layers: lowers,
                upper: tmp,
                scratch: &scratch,
                argv: argv.clone(),
                env: env.clone(),
                cwd: cwd.clone(),
                user: ids,
                allow: g.allow.clone(),
                audit: g.audit.clone(),
            };
            let code = super::step::run(&run, &mut |l| progress.line(l));
            let _ = fs::remove_dir_all(&scratch);
            match code? {
                0 => Ok(()),
                c => Err(step_err(
                    at,
                    format!("`{}` exited with {c}", node.what),
                    "fix the step; the steps before it stay cached",
                )),
            }
        }
    }
}

fn is_tar(p: &Path) -> bool {
    let mut head = [0u8; 512];
    let n = fs::File::open(p)
        .and_then(|mut f| io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    head.starts_with(&[0x1f, 0x8b]) || (n >= 262 && &head[257..262] == b"ustar")
}

#[cfg(test)]
mod tests {
    use super::*;

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

/// ADD of a local archive: unpacked below the layer `root` (at `root_path`) at `rel`, its
/// directory made without following a link (nothing else writes the layer meanwhile, and
/// `layer::unpack` refuses links below it itself), `h` fed the archive's entry in
/// `layer::hash_sources`' format from the very bytes unpacked.
fn unpack_hashed(
    src: &Path,
    root: &crate::beneath::Dir,
    root_path: &Path,
    rel: &Path,
    h: &mut sha2::Sha256,
) -> std::io::Result<()> {
    use std::io::Read;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(src)?;
    let m = file.metadata()?;
    if !m.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            src.display()
        )));
    }
    root.dir(rel, true)?;
    struct Tee<R> {
        inner: R,
        h: sha2::Sha256,
    }
    impl<R: Read> Read for Tee<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.h.update(&buf[..n]);
            Ok(n)
        }
    }
    let mut tee = Tee {
        inner: file,
        h: sha2::Sha256::new(),
    };
    layer::unpack(&mut tee, &root_path.join(rel))?;
    std::io::copy(&mut tee, &mut std::io::sink())?;
    h.update(b"\0");
    h.update(format!("{:o}\0", m.permissions().mode() & 0o7777).as_bytes());
    h.update(b"f\0");
    h.update(hex::encode(tee.h.finalize()).as_bytes());
    h.update(b"\n");
    Ok(())
}
