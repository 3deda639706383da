//! Planning an image: every node hashed from its inputs, the store consulted only to say
//! which entries are already there. Nothing is built here.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::*;
use crate::graph::store;
use crate::image::oci;
use crate::image::statcache::StatCache;
use crate::image::{expand, layer, Cmd, Instr, Source};

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
