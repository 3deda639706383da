//! After the workload: the protected files (`eval::protect`) that did not exist when the
//! sandbox started and exist now were written by the sandbox (or, rarely, by the user while it
//! ran): each is moved into the sandbox's quarantine and named on stderr and in the audit
//! log, so nothing the host runs or obeys comes from inside, and nothing is lost. A run that
//! never reaches its end (aisb killed) leaves its record behind; the next run of the sandbox
//! sweeps for it first.

use std::path::{Path, PathBuf};

use crate::eval::plan::{Plan, Protected};

/// Where each run records what it sweeps for (one file per run, named by its pid).
const PENDING: &str = "protect-pending";

/// This run's sweep: done by [`Pending::finish`] at the end of the run, or when dropped (an
/// error on the way out); a killed run leaves its record for the next.
pub struct Pending {
    project: PathBuf,
    quarantine: PathBuf,
    protected: Vec<Protected>,
    /// The protected files bound read-only, with their (device, inode) at start: one found
    /// under that name afterwards with another identity was put there by the sandbox (it
    /// renamed the directory holding the original and made a new one).
    bound: Vec<(PathBuf, u64, u64)>,
    record: Option<PathBuf>,
    done: bool,
}

impl Pending {
    pub fn finish(mut self, audit: Option<&crate::audit::Log>) {
        self.done = true;
        self.sweep(audit);
    }

    /// Move aside what appeared of the protected paths, then drop the run's record.
    fn sweep(&mut self, audit: Option<&crate::audit::Log>) {
        use std::os::unix::fs::MetadataExt;
        let mut paths: Vec<PathBuf> = self.protected.iter().map(|p| p.path.clone()).collect();
        for (path, dev, ino) in &self.bound {
            if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) != (*dev, *ino)) {
                paths.push(path.clone());
            }
        }
        quarantine(
            &self.project,
            &self.quarantine,
            &self.protected,
            &paths,
            audit,
        );
        if let Some(r) = self.record.take() {
            let _ = std::fs::remove_file(r);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            self.sweep(None);
        }
    }
}

/// Sweep for runs of this sandbox that ended without doing so (aisb killed), then record
/// `plan`'s protected paths for this run. When the first moved a file `plan` binds, the plan
/// without that bind (the file is absent now, and swept for again at the end) is returned.
pub fn begin(plan: &Plan, audit: Option<&crate::audit::Log>) -> (Pending, Option<Plan>) {
    use std::os::unix::ffi::OsStrExt;
    let quarantine_dir = plan.state_dir.join("quarantine");
    let dir = plan.state_dir.join(PENDING);
    let mut moved = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let pid = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok());
            let alive = pid.is_some_and(|p| {
                p != std::process::id() as i32
                    && nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok()
            });
            if alive {
                continue;
            }
            // Our own file, never followed: a record is a list of NUL-ended paths.
            if let Ok(Some(bytes)) = crate::beneath::read(&dir, Path::new(&e.file_name()), 1 << 20)
            {
                let paths: Vec<PathBuf> = bytes
                    .split(|b| *b == 0)
                    .filter(|p| !p.is_empty())
                    .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
                    .collect();
                moved.extend(quarantine(
                    &plan.project,
                    &quarantine_dir,
                    &plan.protected,
                    &paths,
                    audit,
                ));
            }
            let _ = std::fs::remove_file(e.path());
        }
    }
    // A symbolic link under a secret's name that leads nowhere is a trap for a later write on
    // the host (`ln -s notes.txt .env.local`, planted by an earlier run): moved aside, so the
    // host's write makes a regular file that the live layer masks.
    // One lookup per mask from the project's descriptor, not a walk from `/` (a big
    // repository has 50,000 masks); only a link is looked at again.
    let project_fd = rustix::fs::open(
        &plan.project,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .ok();
    for m in &plan.masks {
        let Ok(rel) = m.path.strip_prefix(&plan.project) else {
            continue;
        };
        let is_link = match &project_fd {
            Some(fd) if !rel.as_os_str().is_empty() => {
                rustix::fs::statat(fd, rel, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
                    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
                })
            }
            _ => std::fs::symlink_metadata(&m.path).is_ok_and(|md| md.file_type().is_symlink()),
        };
        let dangling = is_link && std::fs::metadata(&m.path).is_err();
        if dangling && !has_link_between(&plan.project, &m.path) {
            if let Some((from, to)) = crate::git::quarantine_file(&m.path, &quarantine_dir) {
                report(
                    audit,
                    &from,
                    &to,
                    "is a symbolic link under a secret's name that leads nowhere (a write on the host would land where it points)",
                    format!("a dangling symbolic link under a secret's name ({})", m.rule),
                );
            }
        }
    }
    let changed =
        moved
            .iter()
            .any(|p| plan.mounts.iter().any(|m| m.target == *p))
            .then(|| {
                let mut p = plan.clone();
                for path in &moved {
                    if let Some(i) = p.mounts.iter().position(|m| {
                        m.target == *path && crate::eval::protect::is_protect_mount(m)
                    }) {
                        let m = p.mounts.remove(i);
                        p.protected.push(Protected {
                            path: path.clone(),
                            dir: false,
                            why: m.why,
                        });
                    }
                }
                p
            });
    let plan = changed.as_ref().unwrap_or(plan);
    let mut record = None;
    if !plan.protected.is_empty() {
        let mut bytes = Vec::new();
        for p in &plan.protected {
            bytes.extend_from_slice(p.path.as_os_str().as_bytes());
            bytes.push(0);
        }
        let path = dir.join(std::process::id().to_string());
        // Not synced: it is for a run killed before its end, not for a power loss (the
        // fsync was most of the start-up).
        if std::fs::create_dir_all(&dir).is_ok()
            && crate::atomic::write_atomic_unsynced(&path, &bytes).is_ok()
        {
            record = Some(path);
        }
    }
    let bound = plan
        .mounts
        .iter()
        .filter(|m| crate::eval::protect::is_protect_mount(m))
        .filter_map(|m| {
            use std::os::unix::fs::MetadataExt;
            let md = std::fs::symlink_metadata(&m.target).ok()?;
            Some((m.target.clone(), md.dev(), md.ino()))
        })
        .collect();
    let pending = Pending {
        project: plan.project.clone(),
        quarantine: quarantine_dir,
        protected: plan.protected.clone(),
        bound,
        record,
        done: false,
    };
    (pending, changed)
}

/// Move each of `paths` that exists into `into`; returns those moved.
fn quarantine(
    project: &Path,
    into: &Path,
    protected: &[Protected],
    paths: &[PathBuf],
    audit: Option<&crate::audit::Log>,
) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for path in paths {
        if !path.starts_with(project) {
            continue;
        }
        // Through a linked parent (`ln -s x .claude`): what the host's tool would read is where
        // the link leads; moved when that is below the project, by a path without links.
        let path = if has_link_between(project, path) {
            match std::fs::canonicalize(path) {
                Ok(real) if real.starts_with(project) && !has_link_between(project, &real) => real,
                _ => continue,
            }
        } else {
            path.clone()
        };
        let path = &path;
        if std::fs::symlink_metadata(path).is_err() {
            continue;
        }
        let mut moved = crate::git::quarantine_file(path, into);
        if moved.is_none() {
            // A directory made read-only inside (`chmod 555 .vscode`) keeps what is in it:
            // made writable for its owner again, then moved.
            if let Some(parent) = path.parent().filter(|p| p.starts_with(project)) {
                use std::os::unix::fs::PermissionsExt;
                if let Ok(md) = std::fs::symlink_metadata(parent) {
                    if md.is_dir() {
                        let mode = md.permissions().mode() | 0o700;
                        let _ =
                            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(mode));
                    }
                }
            }
            if let Ok(md) = std::fs::symlink_metadata(path) {
                if md.is_dir() {
                    use std::os::unix::fs::PermissionsExt;
                    let mode = md.permissions().mode() | 0o700;
                    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
                }
            }
            moved = crate::git::quarantine_file(path, into);
        }
        let Some((from, to)) = moved else {
            eprintln!(
                "aisb: WARNING: {} was created by the sandbox and could not be moved aside: remove it before any tool reads it",
                path.display()
            );
            if let Some(log) = audit {
                let _ = log.write(crate::audit::Kind::Quarantine {
                    path: path.to_string_lossy().into_owned(),
                    moved_to: String::new(),
                    why: "could not be moved aside".into(),
                });
            }
            continue;
        };
        let why = protected
            .iter()
            .find(|p| p.path == from)
            .map_or("the host runs or obeys it", |p| p.why.as_str());
        report(
            audit,
            &from,
            &to,
            &format!(
                "was created by the sandbox ({why}); nothing inside may write what the host runs"
            ),
            why.to_string(),
        );
        out.push(from);
    }
    out
}

/// Whether a directory strictly between `root` and `path` is a symbolic link (or missing).
pub(crate) fn has_link_between(root: &Path, path: &Path) -> bool {
    let Ok(rel) = path.strip_prefix(root) else {
        return true;
    };
    let mut at = root.to_path_buf();
    let mut parts = rel.components().peekable();
    while let Some(c) = parts.next() {
        if parts.peek().is_none() {
            break;
        }
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(md) if md.is_dir() => {}
            _ => return true,
        }
    }
    false
}

/// Say that `from` was moved to `to`: on stderr (`what` it was) and in the audit log (`why`).
pub(crate) fn report(
    audit: Option<&crate::audit::Log>,
    from: &Path,
    to: &Path,
    what: &str,
    why: String,
) {
    eprintln!(
        "aisb: {} {what}; moved to {}\n  help: look at it there, and move it back yourself if you want it",
        from.display(),
        to.display()
    );
    if let Some(log) = audit {
        let _ = log.write(crate::audit::Kind::Quarantine {
            path: from.to_string_lossy().into_owned(),
            moved_to: to.to_string_lossy().into_owned(),
            why,
        });
    }
}
