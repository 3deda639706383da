//! An image as a sandbox's root: the plan's definition, building what is missing before a run,
//! and the plan's system paths pointed at the image's top-level directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::graph::{self, BuildError, Def, Graph, ImageConfig, Options};
use super::{dockerfile, lock, Instr, Step};
use crate::eval::plan::{Rootfs, SystemPath};
use crate::eval::Plan;

/// The image the plan's `rootfs` names, as a build definition; None for the host's root.
pub fn def_of(plan: &Plan) -> Result<Option<Def>, BuildError> {
    Ok(Some(match &plan.rootfs {
        Rootfs::Host => return Ok(None),
        Rootfs::Dockerfile { path } => {
            let text = std::fs::read_to_string(path).map_err(|source| BuildError::Io {
                what: format!("reading {} (named by `rootfs dockerfile=`)", path.display()),
                source,
            })?;
            let name = path
                .strip_prefix(&plan.project)
                .unwrap_or(path)
                .display()
                .to_string();
            Def {
                steps: dockerfile::parse(&name, &text)?,
                name,
                context: path.parent().unwrap_or(&plan.project).to_path_buf(),
            }
        }
        Rootfs::Image { name, steps } => Def {
            name: name.clone(),
            steps: steps.clone(),
            context: plan.project.clone(),
        },
        Rootfs::From { source } => Def {
            name: source.clone(),
            steps: vec![Step {
                instr: Instr::From(source.clone()),
                at: "rootfs from=".into(),
            }],
            context: plan.project.clone(),
        },
    }))
}

/// The image's build graph when the sandbox's root is an image, for the commands that show
/// the sandbox without running it (`aisb plan`, `aisb spec`); a base tag is resolved only when
/// neither sandbox.lock nor this machine has an answer for it.
pub fn graph_of(plan: &Plan) -> Option<Result<Graph, BuildError>> {
    let def = match def_of(plan) {
        Ok(Some(d)) => d,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    // A lock file that cannot be read is an error, never a build without its pins.
    let lock = match lock::Lock::read(&plan.project) {
        Ok(l) => l,
        Err(e) => return Some(Err(e.into())),
    };
    let o = options(plan, &def, &lock, &BTreeMap::new(), false);
    Some(graph::plan(&def, &o))
}

/// The plan as it runs on its image (system paths pointed at the image's directories, the
/// image's `ENV`), when the image is built; None when it is not built yet.
pub fn as_built(plan: &Plan, g: &Graph) -> Option<Plan> {
    let config = graph::load(&g.entry).filter(|_| g.cached)?;
    let mut p = plan.clone();
    apply(&mut p, &config, &mountpoint(plan));
    Some(p)
}

/// Build options for `plan`'s image: the caller's identity as build args (then `extra`), the
/// lock file's pins.
pub fn options<'a>(
    plan: &'a Plan,
    def: &Def,
    lock: &lock::Lock,
    extra: &BTreeMap<String, String>,
    pull: bool,
) -> Options<'a> {
    let mut build_args = super::identity_args(&plan.identity);
    build_args.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    Options {
        store: &plan.store,
        build_args,
        pins: lock
            .images
            .get(&def.name)
            .map(|l| l.bases.clone())
            .unwrap_or_default(),
        pull,
        allow: plan.build_network.clone(),
        masked: plan
            .masks
            .iter()
            .map(|m| {
                let why = format!(
                    "the sandbox masks it ({}), so an image may not hold it",
                    m.rule
                );
                (m.path.clone(), why)
            })
            // The lock file is the build's output: as an input of `COPY .` it would change the
            // graph's hash at every build, and `--locked` would never pass.
            .chain([(
                plan.project.join(lock::FILE),
                format!("{} is the build's output, never its input", lock::FILE),
            )])
            .collect(),
        audit: plan.state_dir.join("audit.jsonl"),
    }
}

/// The directory where a runtime process mounts the image's root privately.
pub fn mountpoint(plan: &Plan) -> PathBuf {
    plan.state_dir.join("rootfs")
}

/// Entries of `/` that the sandbox provides itself (or that an image has no business showing).
const NOT_FROM_IMAGE: &[&str] = &[
    "proc",
    "sys",
    "dev",
    "tmp",
    "run",
    "home",
    "mnt",
    "media",
    "lost+found",
];

/// Point the plan's system paths at the image: each top-level directory of its root bound
/// read-only from `mountpoint`, its top-level symlinks recreated; the image's `ENV` added
/// (its `PATH` replaces the host's).
pub fn apply(plan: &mut Plan, config: &ImageConfig, mountpoint: &Path) {
    plan.system = super::layer::top_level(&config.layers)
        .into_iter()
        .filter(|(n, _)| !NOT_FROM_IMAGE.contains(&n.as_str()))
        .map(|(name, link)| {
            let path = Path::new("/").join(&name);
            match link {
                Some(target) => SystemPath::Symlink { path, target },
                None => SystemPath::Image {
                    source: mountpoint.join(&name),
                    path,
                },
            }
        })
        .collect();
    for (k, v) in &config.env {
        match plan.env.vars.iter_mut().find(|(k2, _)| k2 == k) {
            Some(e) if k == "PATH" => e.1 = v.clone(),
            Some(_) => {}
            None => plan.env.vars.push((k.clone(), v.clone())),
        }
    }
}

/// The dynamic loader aisb's init (a glibc program) needs inside the image.
const INIT_LOADER: &str = if cfg!(target_arch = "aarch64") {
    "/lib/ld-linux-aarch64.so.1"
} else {
    "/lib64/ld-linux-x86-64.so.2"
};

/// Refuse, with a reason, an image aisb's init cannot run in (no glibc loader): otherwise the
/// sandbox or step would die at its first exec with nothing but an exit code.
pub fn check_init_runs(layers: &[PathBuf], at: &str) -> Result<(), BuildError> {
    let found = super::layer::resolve(layers, Path::new(INIT_LOADER))
        .ok()
        .and_then(|real| super::layer::lookup(layers, &real));
    match found {
        Some((_, m)) if m.is_file() => Ok(()),
        _ => Err(BuildError::Step {
            at: at.into(),
            message: format!("the image has no {INIT_LOADER}: aisb's init (a glibc program) cannot start in it"),
            help: "use a glibc-based image (Debian, Ubuntu, Fedora, …); musl-only images such as Alpine or busybox are not supported yet".into(),
        }),
    }
}

/// Mount points the image lacks for the sandbox's own mounts below its directories (an agent's
/// managed settings in /etc, a `mount` into /opt): one more read-only layer on top, in the
/// store under a name from the list, holding an empty directory (or file) at each.
fn mount_points(plan: &Plan, layers: &[PathBuf]) -> Result<Option<PathBuf>, BuildError> {
    use crate::eval::plan::MountKind;
    use sha2::Digest;
    let io = |what: String| move |source| BuildError::Io { what, source };
    let mut need: Vec<(PathBuf, bool)> = Vec::new();
    for m in &plan.mounts {
        let Ok(rel) = m.target.strip_prefix("/") else {
            continue;
        };
        let top = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned());
        if top.is_none_or(|t| NOT_FROM_IMAGE.contains(&t.as_str())) {
            continue;
        }
        let real = super::layer::resolve(layers, &m.target)
            .map_err(io(format!("resolving {} in the image", m.target.display())))?;
        if super::layer::lookup(layers, &real).is_some() {
            continue;
        }
        let file = match &m.kind {
            MountKind::Bind { source, .. }
            | MountKind::Copy { source, .. }
            | MountKind::Git { source, .. } => source.is_file(),
            _ => false,
        };
        need.push((real, file));
    }
    if need.is_empty() {
        return Ok(None);
    }
    let mut h = sha2::Sha256::new();
    for (p, file) in &need {
        h.update(p.as_os_str().as_encoded_bytes());
        h.update(if *file { b"\0f\n" } else { b"\0d\n" });
    }
    let entry = plan
        .store
        .join(format!("{}-mountpoints", &hex::encode(h.finalize())[..32]));
    crate::graph::store::realise(&entry, |tmp| {
        for (p, file) in &need {
            let at = tmp.join(p);
            if *file {
                std::fs::create_dir_all(at.parent().unwrap_or(tmp))?;
                std::fs::write(&at, b"")?;
            } else {
                std::fs::create_dir_all(&at)?;
            }
        }
        // The top layer's root is the sandbox's "/", and these are the image's directories:
        // root's, as in root's store, for an ordinary user who builds over subordinate ids.
        if !nix::unistd::geteuid().is_root() && crate::userns::caller_maps().is_ok() {
            let tmp = std::path::absolute(tmp)?;
            let mut c = crate::userns::spawn(&[
                "chown".into(),
                tmp.into_os_string(),
                "0".into(),
                "0".into(),
            ])?;
            drop(c.stdin.take());
            crate::userns::finish(c, "giving the mount points to root")?;
        }
        Ok(())
    })
    .map_err(io(format!("storing {}", entry.display())))?;
    Ok(Some(entry))
}

/// Before a run: the image built (what is missing, with progress on stderr; RUN steps on
/// `runner`) and the plan pointed at it. Returns the plan to run, the image's layers (top
/// first) and where the runtime process must mount them.
pub fn prepare_run(
    plan: &Plan,
    runner: &dyn crate::image::step::StepRunner,
) -> Result<Option<(Plan, Vec<PathBuf>, PathBuf)>, BuildError> {
    let Some(def) = def_of(plan)? else {
        return Ok(None);
    };
    let lock = lock::Lock::read(&plan.project)?;
    let o = options(plan, &def, &lock, &BTreeMap::new(), false);
    let g: Graph = graph::plan(&def, &o)?;
    let config = match graph::load(&g.entry) {
        Some(c) if g.cached => c,
        _ => {
            let mut p = super::progress::Bar::new(g.nodes.len(), false);
            eprintln!("aisb: building image {} ({} steps)", g.name, g.nodes.len());
            graph::build(&g, &mut p, runner)?.config
        }
    };
    check_init_runs(&config.layers, "rootfs")?;
    let mut layers = config.layers.clone();
    if let Some(points) = mount_points(plan, &layers)? {
        layers.insert(0, points);
    }
    let config = ImageConfig { layers, ..config };
    let mp = mountpoint(plan);
    std::fs::create_dir_all(&mp).map_err(|source| BuildError::Io {
        what: format!("creating {}", mp.display()),
        source,
    })?;
    let mut used = g.entries();
    used.extend(config.layers.iter().cloned());
    let _ = crate::graph::store::record_refs(&plan.state_dir, &used);
    let mut p = plan.clone();
    apply(&mut p, &config, &mp);
    Ok(Some((p, config.layers, mp)))
}
