//! Write an OCI bundle for a plan: `config.json` and a rootfs skeleton (merged-/usr symlinks).
//! What the plan needs on the host besides (the store's entries, overlay dirs, private copies,
//! the masking file) is realised before, by `graph::realise`.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::{build, Rootless, SpecError, SpecPaths};
use crate::eval::plan::{Plan, SystemPath};

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
/// `mask_file`: the masking file (`graph::realise::realise` made it, with everything else on
/// the host the plan needs: this only writes the bundle).
#[allow(clippy::too_many_arguments)]
pub fn write(
    plan: &Plan,
    dir: &Path,
    mask_file: &Path,
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
    // The init mounts the masks from a list in the bundle (see `SpecPaths::mask_list`).
    let mask_list = match init {
        Some(_) => {
            let list = dir.join("masks");
            io(&list, fs::write(&list, super::mask_list(plan)))?;
            Some(list)
        }
        None => None,
    };
    let spec = build(
        plan,
        &SpecPaths {
            rootfs: PathBuf::from("rootfs"),
            mask_file: mask_file.to_path_buf(),
            cgroups_path: cgroups_path(plan, &dir, rootless),
            init: init.map(Path::to_path_buf),
            terminal,
            proxy_dir: proxy_dir.map(Path::to_path_buf),
            rootless: rootless.cloned(),
            limits,
            mask_list,
        },
    )?;
    let json = super::to_json(&spec)?;
    let config = dir.join("config.json");
    io(&config, fs::write(&config, json))?;
    Ok(spec)
}
