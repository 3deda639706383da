//! Realise what a plan needs on the host, on any backend, before a spec is written or run:
//! the store's entries (the /etc snapshot, generated files) and the references that keep them,
//! the sandbox's own state (overlay upper/work dirs, private copies, state dirs, git guards),
//! and the mode-0000 masking file. Existing overlay and copy state is kept: it is the
//! sandbox's work.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::eval::plan::{MountKind, Plan, SystemPath};

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RealiseError {
    #[error("could not write {path}: {source}")]
    #[diagnostic(help("check that the directory is writable and the disk is not full"))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T, RealiseError> {
    r.map_err(|source| RealiseError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Everything on the host a sandbox of this plan needs, on any backend: overlay dirs, private
/// copies, the /etc snapshot and the masking file. Returns the masking file.
pub fn realise(plan: &Plan) -> Result<PathBuf, RealiseError> {
    realise_state(plan)?;
    for sys in &plan.system {
        if let SystemPath::Snapshot { snapshot, .. } = sys {
            io(&snapshot.dir, super::etc::realise(snapshot))?;
        }
    }
    // What this sandbox uses stays in the store until its state is removed (`aisb store gc`).
    let used = super::store::entries_of(plan);
    io(
        &plan.state_dir,
        super::store::record_refs(&plan.state_dir, &used),
    )?;
    mask_file(&plan.store)
}

/// Store the caches evaluation computed (it writes nothing itself). A cache that cannot be
/// written only costs time on the next run.
pub fn memos(memos: &[crate::eval::plan::Memo]) {
    for m in memos {
        let _ = crate::atomic::write_atomic(&m.path, &m.bytes);
    }
}

/// The empty mode-0000 file bind-mounted over masked files (one in the store, shared): its
/// mode is checked on every use, so a loosened copy is put back.
pub fn mask_file(store: &Path) -> Result<PathBuf, RealiseError> {
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
) -> Result<(), RealiseError> {
    let fill = |tmp: &Path| {
        for f in files {
            let p = tmp.join(&f.name);
            fs::write(&p, &f.content)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
        }
        fs::set_permissions(tmp, fs::Permissions::from_mode(0o755))
    };
    io(dir, super::store::realise(dir, fill).map(|_| ()))
}

/// Remove the top-level `fields` of the JSON file `path` (a private copy aisb made; read
/// without following a link, whole, at most 256 MiB: a larger one is an error). A file that
/// holds one of their names but is not a JSON object is emptied to `{}`: nothing could read it
/// as configuration anyway.
fn scrub_json_fields(path: &Path, fields: &[&str]) -> std::io::Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut bytes = Vec::new();
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    // Read whole or not at all: a field past a cut would stay, a cut text would not parse.
    const MAX: u64 = 256 << 20;
    if file.metadata()?.len() > MAX {
        return Err(std::io::Error::other(format!(
            "larger than {} MiB: too large to check for a credential; remove it to start afresh",
            MAX >> 20
        )));
    }
    file.take(MAX).read_to_end(&mut bytes)?;
    let named = |f: &str| bytes.windows(f.len()).any(|w| w == f.as_bytes());
    if !fields.iter().any(|f| named(f)) {
        return Ok(());
    }
    let scrubbed = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(mut map)) => {
            for f in fields {
                map.remove(*f);
            }
            serde_json::to_vec_pretty(&serde_json::Value::Object(map))
                .map_err(std::io::Error::other)?
        }
        _ => b"{}".to_vec(),
    };
    crate::atomic::write_atomic_private(path, &scrubbed)
}

/// Create overlay dirs (with an empty file under each mask of a file neither layer has) and take
/// private copies that do not exist yet (scrubbed of credential fields, old ones too).
fn realise_state(plan: &Plan) -> Result<(), RealiseError> {
    // The masks an empty file may be owed to (over a home credential file the host does not
    // have yet, `eval::masks::UNREPORTED`): picked once, not walked again per overlay (a big
    // project has tens of thousands of masks, and every start realises).
    let unreported: Vec<&crate::eval::plan::Mask> = plan
        .masks
        .iter()
        .filter(|k| !k.dir && k.rule.ends_with(crate::eval::masks::UNREPORTED))
        .collect();
    for m in &plan.mounts {
        if let Some(guard) = m.git_guard() {
            crate::git::realise(&guard).map_err(|e| RealiseError::Io {
                path: guard.source.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
            continue;
        }
        match &m.kind {
            MountKind::Overlay {
                lower, upper, work, ..
            } => {
                io(upper, fs::create_dir_all(upper))?;
                io(work, fs::create_dir_all(work))?;
                // A file masked directly below the overlay that neither layer has (an agent's
                // login not made yet): an empty one in the upper layer, so the mask has
                // something to cover, and the host's later file never shows through.
                for mask in &unreported {
                    let Some(name) = mask
                        .path
                        .strip_prefix(&m.target)
                        .ok()
                        .filter(|rel| rel.components().count() == 1)
                    else {
                        continue;
                    };
                    if fs::symlink_metadata(lower.join(name)).is_err()
                        && fs::symlink_metadata(upper.join(name)).is_err()
                    {
                        use std::os::unix::fs::OpenOptionsExt;
                        let made = fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .mode(0o600)
                            .custom_flags(libc::O_NOFOLLOW)
                            .open(upper.join(name));
                        match made {
                            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                                return Err(RealiseError::Io {
                                    path: upper.join(name),
                                    source: e,
                                })
                            }
                            _ => {}
                        }
                    }
                }
            }
            MountKind::Copy { source, copy } => {
                if !copy.exists() {
                    if let Some(parent) = copy.parent() {
                        io(parent, fs::create_dir_all(parent))?;
                    }
                    let tmp = copy.with_extension("aisb-tmp");
                    io(&tmp, fs::copy(source, &tmp))?;
                    io(copy, fs::rename(&tmp, copy))?;
                }
                // A copy of a home file that keeps a credential in a field: that field goes,
                // from new copies and from those earlier runs made.
                // The source as written or as the kernel reaches it (a home through a link).
                let real = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
                let fields = crate::eval::masks::HOME_SENSITIVE_FIELDS
                    .iter()
                    .find(|(rel, _)| {
                        let want = plan.identity.home.join(rel);
                        want == *source || real(&want) == real(source)
                    })
                    .map(|(_, f)| *f);
                if let Some(fields) = fields {
                    io(copy, scrub_json_fields(copy, fields))?;
                }
            }
            MountKind::State { dir } => io(dir, fs::create_dir_all(dir))?,
            MountKind::Generated { dir, files } => write_generated(dir, files)?,
            _ => {}
        }
    }
    Ok(())
}
