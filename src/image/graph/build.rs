//! Executing a planned image: each missing node realised in order (layers unpacked, RUN
//! steps run, COPY sources copied), then the image entry.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use sha2::Digest;

use super::*;
use crate::graph::store;
use crate::image::layer;
use crate::image::oci;
use crate::image::step::StepRunner;

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

/// Realise every node that is missing, in order, then the image entry. RUN steps run on
/// `runner` (the runtime's; see [`crate::image::step`]).
pub fn build(
    g: &Graph,
    progress: &mut dyn Progress,
    runner: &dyn StepRunner,
) -> Result<Built, BuildError> {
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
            let r = fill(g, node, tmp, &top_first, &store_dir, i, progress, runner);
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

#[allow(clippy::too_many_arguments)]
fn fill(
    g: &Graph,
    node: &Node,
    tmp: &Path,
    layers: &[PathBuf],
    store_dir: &Path,
    index: usize,
    progress: &mut dyn Progress,
    runner: &dyn StepRunner,
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
            // An ordinary user who can build (subordinate ids): unpacked as root of a user
            // namespace with their map, so the image's files keep their owners, as in root's
            // store, shifted into those ids. Otherwise every file is theirs.
            let unpacked =
                if !nix::unistd::geteuid().is_root() && crate::userns::caller_maps().is_ok() {
                    unpack_over_subordinates(&mut v, tmp)
                } else {
                    layer::unpack(&mut v, tmp)
                };
            let rootless = !nix::unistd::geteuid().is_root();
            unpacked.map_err(|e| {
                step_err(
                    at,
                    format!("unpacking {digest}: {e}"),
                    if rootless {
                        "is the image complete? (a corrupt layer is never used) As an ordinary user, a layer unpacks over your subordinate ids: an owner above their count (/etc/subuid, /etc/subgid) or a device node cannot be made; build it as root, or widen the range"
                    } else {
                        "is the image complete? (a corrupt layer is never used)"
                    },
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
            let mut dests = Vec::new();
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
                dests.push(rel.clone());
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
            // An ordinary user cannot give files away: the copies are theirs until the helper,
            // root of their namespace, gives them the owners root's build gives them.
            if !nix::unistd::geteuid().is_root() && crate::userns::caller_maps().is_ok() {
                own_as_root_would(tmp, owner, &dests).map_err(|e| {
                    step_err(
                        at,
                        e.to_string(),
                        "`aisb doctor` checks an ordinary user's builds",
                    )
                })?;
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
            crate::image::sandbox::check_init_runs(layers, at)?;
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
            let _ = fs::remove_dir_all(&scratch).or_else(|_| runner.remove(&scratch));
            fs::create_dir_all(&scratch).map_err(|e| {
                step_err(
                    at,
                    format!("creating {}: {e}", scratch.display()),
                    "check the store",
                )
            })?;
            let run = crate::image::step::StepRun {
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
            let code = runner.run(&run, &mut |l| progress.line(l));
            // The overlay's work directory is the step's ids' (an ordinary user's: subordinate).
            let _ = runner.remove(&scratch);
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

/// [`layer::unpack`] in `aisb __userns unpack` (see [`crate::userns::spawn`]), the layer's
/// bytes streamed to it: all of them, so that the digest check covers every byte.
fn unpack_over_subordinates(v: &mut impl io::Read, dest: &Path) -> io::Result<()> {
    let dest = std::path::absolute(dest)?;
    let mut child = crate::userns::spawn(&["unpack".into(), dest.into_os_string()])?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("no pipe"))?;
    let copied = io::copy(v, &mut stdin);
    drop(stdin);
    let finished = crate::userns::finish(child, "unpacking the layer");
    // The helper's own complaint first: a broken pipe only says that it stopped reading.
    finished?;
    copied.map(|_| ())
}

/// `aisb __userns chown LAYER UID GID DEST...`: in the new layer, what a COPY wrote at or below
/// each DEST (relative) becomes UID:GID and the directories it made above them root's, as in
/// root's build (see `userns::chown_main`).
fn own_as_root_would(layer: &Path, owner: (u32, u32), dests: &[PathBuf]) -> io::Result<()> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "chown".into(),
        std::path::absolute(layer)?.into_os_string(),
        owner.0.to_string().into(),
        owner.1.to_string().into(),
    ];
    args.extend(dests.iter().map(|d| d.clone().into_os_string()));
    let mut child = crate::userns::spawn(&args)?;
    drop(child.stdin.take());
    crate::userns::finish(child, "giving the copied files their owners")
}

fn is_tar(p: &Path) -> bool {
    let mut head = [0u8; 512];
    let n = fs::File::open(p)
        .and_then(|mut f| io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    head.starts_with(&[0x1f, 0x8b]) || (n >= 262 && &head[257..262] == b"ustar")
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
