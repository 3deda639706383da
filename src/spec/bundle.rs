//! Write an OCI bundle for a plan: `config.json`, a rootfs skeleton (merged-/usr symlinks),
//! the mode-0000 masking file, overlay upper/work dirs and private copies. Existing overlay
//! and copy state is kept: it is the sandbox's work.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{build, Rootless, SpecError, SpecPaths};
use crate::eval::plan::{MountKind, Plan, SystemPath};

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum BundleError {
    #[error("{path} exists and is not an empty directory")]
    #[diagnostic(help("choose a new directory; aisb never overwrites an existing bundle"))]
    NotEmpty { path: PathBuf },
    #[error("could not write {path}: {source}")]
    #[diagnostic(help("check that the directory is writable and the disk is not full"))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Spec(#[from] SpecError),
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T, BundleError> {
    r.map_err(|source| BundleError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Cgroup path of a sandbox: absolute, unique per bundle, under `parent` (`/aisb` for root,
/// the caller's delegated cgroup when rootless).
pub fn cgroups_path(plan: &Plan, dir: &Path, rootless: Option<&Rootless>) -> String {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(dir.as_os_str().as_encoded_bytes());
    let tag: String = h.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let name: String = plan
        .project
        .file_name()
        .map_or("sandbox".into(), |n| n.to_string_lossy().into_owned())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let parent = rootless.map_or("/aisb", |r| r.cgroup_parent.as_str());
    format!("{parent}/{name}-{tag}")
}

/// `init`: the aisb binary to run as the sandbox's init (see [`SpecPaths::init`]).
/// `terminal`: the process gets a pseudo-terminal through the runtime's console socket.
/// `rootless`: the caller is an ordinary user (see [`SpecPaths::rootless`]).
/// `limits`: what enforces the plan's limits (see [`SpecPaths::limits`]).
pub fn write(
    plan: &Plan,
    dir: &Path,
    init: Option<&Path>,
    terminal: bool,
    rootless: Option<&Rootless>,
    proxy_dir: Option<&Path>,
    limits: super::LimitsBy,
) -> Result<oci_spec::runtime::Spec, BundleError> {
    if dir.exists() {
        let mut entries = io(dir, fs::read_dir(dir))?;
        if !dir.is_dir() || entries.next().is_some() {
            return Err(BundleError::NotEmpty {
                path: dir.to_path_buf(),
            });
        }
    }
    io(dir, fs::create_dir_all(dir))?;
    let dir = io(dir, dir.canonicalize())?;
    let rootfs = dir.join("rootfs");
    io(&rootfs, fs::create_dir_all(&rootfs))?;
    for sys in &plan.system {
        if let SystemPath::Symlink { path, target } = sys {
            let link = rootfs.join(path.strip_prefix("/").unwrap_or(path));
            io(&link, symlink(target, &link))?;
        }
    }
    let mask_file = prepare(plan)?;
    let spec = build(
        plan,
        &SpecPaths {
            rootfs: PathBuf::from("rootfs"),
            mask_file,
            cgroups_path: cgroups_path(plan, &dir, rootless),
            init: init.map(Path::to_path_buf),
            terminal,
            proxy_dir: proxy_dir.map(Path::to_path_buf),
            rootless: rootless.cloned(),
            limits,
        },
    )?;
    let json = super::to_json(&spec)?;
    let config = dir.join("config.json");
    io(&config, fs::write(&config, json))?;
    Ok(spec)
}

/// Everything on the host a sandbox of this plan needs, on any backend: overlay dirs, private
/// copies, the /etc snapshot and the masking file. Returns the masking file.
pub fn prepare(plan: &Plan) -> Result<PathBuf, BundleError> {
    realise_state(plan)?;
    for sys in &plan.system {
        if let SystemPath::Snapshot { snapshot, .. } = sys {
            io(&snapshot.dir, crate::graph::etc::realise(snapshot))?;
        }
    }
    // What this sandbox uses stays in the store until its state is removed (`aisb store gc`).
    let used = crate::graph::store::entries_of(plan);
    io(
        &plan.state_dir,
        crate::graph::store::record_refs(&plan.state_dir, &used),
    )?;
    mask_file(&plan.store)
}

/// The empty mode-0000 file bind-mounted over masked files (one in the store, shared): its
/// mode is checked on every use, so a loosened copy is put back.
pub fn mask_file(store: &Path) -> Result<PathBuf, BundleError> {
    use std::os::unix::fs::MetadataExt;
    let path = store.join("masked-0000");
    match fs::symlink_metadata(&path) {
        Ok(m) if m.is_file() && m.mode() & 0o7777 == 0 && m.len() == 0 => return Ok(path),
        Ok(_) => io(&path, fs::remove_file(&path))?,
        Err(_) => io(store, fs::create_dir_all(store))?,
    }
    let tmp = store.join(format!(".tmp-masked-{}", std::process::id()));
    io(&tmp, fs::write(&tmp, b""))?;
    io(
        &tmp,
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o000)),
    )?;
    io(&path, fs::rename(&tmp, &path))?;
    Ok(path)
}

/// Write a generated directory unless the store has it (its name comes from its content).
fn write_generated(
    dir: &Path,
    files: &[crate::eval::plan::GeneratedFile],
) -> Result<(), BundleError> {
    let fill = |tmp: &Path| {
        for f in files {
            let p = tmp.join(&f.name);
            fs::write(&p, &f.content)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
        }
        fs::set_permissions(tmp, fs::Permissions::from_mode(0o755))
    };
    io(dir, crate::graph::store::realise(dir, fill).map(|_| ()))
}

/// Create overlay dirs and take private copies that do not exist yet.
pub fn realise_state(plan: &Plan) -> Result<(), BundleError> {
    for m in &plan.mounts {
        if let Some(guard) = m.git_guard() {
            crate::git::realise(&guard).map_err(|e| BundleError::Io {
                path: guard.source.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
            continue;
        }
        match &m.kind {
            MountKind::Overlay { upper, work, .. } => {
                io(upper, fs::create_dir_all(upper))?;
                io(work, fs::create_dir_all(work))?;
            }
            MountKind::Copy { source, copy } if !copy.exists() => {
                if let Some(parent) = copy.parent() {
                    io(parent, fs::create_dir_all(parent))?;
                }
                let tmp = copy.with_extension("aisb-tmp");
                io(&tmp, fs::copy(source, &tmp))?;
                io(copy, fs::rename(&tmp, copy))?;
            }
            MountKind::State { dir } => io(dir, fs::create_dir_all(dir))?,
            MountKind::Generated { dir, files } => write_generated(dir, files)?,
            _ => {}
        }
    }
    Ok(())
}
