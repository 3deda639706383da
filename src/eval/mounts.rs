//! The sandbox's mounts: home, the XDG directories in its state, /tmp, the project (and the
//! guard over its git directory), the user's shell config, and the configured `mount`s and
//! `tmpfs`es, parents before children.

use std::path::{Component, Path, PathBuf};

use super::host::Scope;
use super::plan::{Mount, MountKind};
use super::{loc_line, sha_hex, Ctx, EvalError, BREAK_ISOLATION_ENV};
use crate::config::model::{Access, HomeMode, XdgMode};

/// The XDG base directories `xdg "sandbox"` relocates: variable, place under the home,
/// directory in the sandbox's state.
pub const XDG_DIRS: [(&str, &str, &str); 4] = [
    ("XDG_CONFIG_HOME", ".config", "config"),
    ("XDG_DATA_HOME", ".local/share", "data"),
    ("XDG_CACHE_HOME", ".cache", "cache"),
    ("XDG_STATE_HOME", ".local/state", "state"),
];

/// The mounts every sandbox has, before the shell is known.
pub(super) struct Base {
    pub mounts: Vec<Mount>,
    /// The XDG variables pointing at the relocated directories.
    pub xdg_env: Vec<(&'static str, String)>,
    pub home_mode: HomeMode,
}

/// A state directory's name for a mount target: a hash of the path and its last component.
pub(super) fn slug(target: &Path) -> String {
    let name = target
        .file_name()
        .map_or_else(|| "root".into(), |n| n.to_string_lossy().into_owned());
    format!(
        "{}-{name}",
        &sha_hex(target.as_os_str().as_encoded_bytes())[..16]
    )
}

/// Copy-on-write: an overlay over a directory, a private copy of a file, in the state.
fn cow(sc: &Scope<'_>, source: &Path, target: &Path) -> MountKind {
    if source.is_dir() {
        let d = sc.state_dir.join("overlay").join(slug(target));
        MountKind::Overlay {
            lower: source.to_path_buf(),
            upper: d.join("upper"),
            work: d.join("work"),
            above: None,
        }
    } else {
        let name = target
            .file_name()
            .map_or_else(|| "file".into(), |n| n.to_os_string());
        MountKind::Copy {
            source: source.to_path_buf(),
            copy: sc.state_dir.join("copy").join(slug(target)).join(name),
        }
    }
}

fn bind(sc: &Scope<'_>, source: &Path, access: Access, target: &Path) -> MountKind {
    match access {
        Access::Overlay => cow(sc, source, target),
        a => MountKind::Bind {
            source: source.to_path_buf(),
            writable: a == Access::Rw && !sc.read_only,
        },
    }
}

/// Home, the XDG directories, /tmp, the project and its git guard.
pub(super) fn base(cx: &mut Ctx<'_>, sc: &Scope<'_>) -> Result<Base, EvalError> {
    let (s, host, project, project_access, state_dir) =
        (sc.s, sc.host, &sc.project, sc.project_access, &sc.state_dir);
    let (uid, gid) = (sc.identity.uid, sc.identity.gid);
    let mut mounts: Vec<Mount> = Vec::new();
    let home_mode = s.home.as_ref().map_or(HomeMode::Empty, |h| h.value);
    let home = host.home.clone();
    if home != Path::new("/") {
        let kind = match home_mode {
            // Its pages are the host's memory, like /tmp's.
            HomeMode::Empty => MountKind::Tmpfs {
                size: Some(super::plan::Limits::default_tmp_size()),
                mode: 0o700,
                owner: Some((uid, gid)),
            },
            HomeMode::Ro => bind(sc, &home, Access::Ro, &home),
            HomeMode::Overlay => cow(sc, &home, &home),
        };
        mounts.push(Mount {
            target: home.clone(),
            kind,
            why: format!(
                "home ({})",
                match home_mode {
                    HomeMode::Empty => "empty",
                    HomeMode::Ro => "read-only",
                    HomeMode::Overlay => "copy-on-write",
                }
            ),
        });
    }
    // Seed 003's state relocation: the XDG directories are the sandbox's own, kept in its
    // state between runs; tools that ignore the variables land there too.
    let mut xdg_env: Vec<(&str, String)> = Vec::new();
    if let Some(x) = s.xdg.as_ref().filter(|x| x.value == XdgMode::Sandbox) {
        for (var, rel, name) in XDG_DIRS {
            let target = home.join(rel);
            if home_mode == HomeMode::Ro && !target.is_dir() {
                cx.err(
                    x.loc,
                    format!(
                        "`{}` does not exist, and a read-only home cannot get it",
                        target.display()
                    ),
                    "xdg \"sandbox\" mounts over it",
                    Some(format!(
                        "create it on the host (mkdir -p {}), or use home \"empty\" or home \"overlay\"",
                        target.display()
                    )),
                );
                continue;
            }
            mounts.push(Mount {
                target: target.clone(),
                kind: MountKind::State {
                    dir: state_dir.join("xdg").join(name),
                },
                why: format!("{var} in the sandbox's state (xdg \"sandbox\")"),
            });
            xdg_env.push((var, target.to_string_lossy().into_owned()));
        }
    }
    mounts.push(Mount {
        target: PathBuf::from("/tmp"),
        kind: MountKind::Tmpfs {
            size: Some(super::plan::Limits::default_tmp_size()),
            mode: 0o1777,
            owner: None,
        },
        why: "private /tmp".into(),
    });
    let project_mount = bind(sc, project, project_access, project);
    let project_writable = matches!(project_mount, MountKind::Bind { writable: true, .. });
    mounts.push(Mount {
        target: project.clone(),
        kind: project_mount,
        why: "project".into(),
    });
    // A writable project's git directory: nothing in it that git would run on the host may
    // change from inside (a test of the tests can leave it writable, to prove they notice).
    if project_writable && std::env::var(BREAK_ISOLATION_ENV).as_deref() != Ok("git") {
        mounts.extend(private_git_dir(
            sc,
            project,
            git_guard_mounts(project, project)?,
        ));
    } else if project_writable {
        eprintln!(
            "aisb: WARNING: {BREAK_ISOLATION_ENV}=git: the project's .git is writable in this sandbox (a test of the tests)"
        );
    }
    credential_free_git_config(sc, project, &mut mounts);

    Ok(Base {
        mounts,
        xdg_env,
        home_mode,
    })
}

/// The user's shell config, the configured `mount`s and `tmpfs`es; then parents before
/// children.
pub(super) fn user(
    cx: &mut Ctx<'_>,
    sc: &Scope<'_>,
    mounts: &mut Vec<Mount>,
    shell: &Path,
    home_mode: HomeMode,
) {
    let (s, home) = (sc.s, &sc.host.home);
    let path = |cx: &mut Ctx<'_>, v| sc.path(cx, v);
    // Seed 004: a fish user gets fish inside, with their fish config read-only.
    if shell.file_name().is_some_and(|n| n == "fish") {
        let fish = home.join(".config/fish");
        if fish.is_dir() && home_mode == HomeMode::Empty {
            mounts.push(Mount {
                target: fish.clone(),
                kind: MountKind::Bind {
                    source: fish,
                    writable: false,
                },
                why: "fish config (your shell is fish)".into(),
            });
        }
    }

    for m in &s.mounts {
        let Some(source) = path(cx, &m.source) else {
            continue;
        };
        let target = match &m.target {
            Some(t) => match path(cx, t) {
                Some(p) => p,
                None => continue,
            },
            None => source.clone(),
        };
        if !source.exists() {
            if !m.optional {
                cx.err(
                    m.source.loc,
                    format!("`{}` does not exist", source.display()),
                    "mount source",
                    Some(
                        "create it, fix the path, or add optional=#true to skip it when missing"
                            .into(),
                    ),
                );
            }
            continue;
        }
        if matches!(target.components().nth(1), Some(Component::Normal(n)) if n == "proc" || n == "dev" || n == "sys")
        {
            cx.err(
                m.loc,
                format!("cannot mount over `{}`", target.display()),
                "mount target",
                Some("/proc, /dev and /sys are managed by the sandbox".into()),
            );
            continue;
        }
        let (file, line) = loc_line(cx, m.loc);
        mounts.retain(|x| x.target != target);
        mounts.push(Mount {
            target: target.clone(),
            kind: bind(sc, &source, m.access, &target),
            why: format!("mount at {file}:{line}"),
        });
    }
    for t in &s.tmpfs {
        let Some(target) = path(cx, &t.target) else {
            continue;
        };
        let (file, line) = loc_line(cx, t.loc);
        mounts.retain(|x| x.target != target);
        mounts.push(Mount {
            target,
            kind: MountKind::Tmpfs {
                // Sized like /tmp unless it says (a larger size is a loosening).
                size: Some(t.size.unwrap_or_else(super::plan::Limits::default_tmp_size)),
                mode: 0o1777,
                owner: None,
            },
            why: format!("tmpfs at {file}:{line}"),
        });
    }
    // Parents before children; stable, so equal depths keep their declared order.
    mounts.sort_by_key(|m| m.target.components().count());
}

/// The project's git configuration as the sandbox sees it: without the credentials git keeps
/// there (a remote URL's token, `http.*.extraheader`, `credential.*`, includes of host files;
/// see [`crate::git::view`]). When the host's file holds any, a view without them is written
/// to the sandbox's state and bound read-only in its place (over the guard's bind of the
/// host's file, or alone when the project is read-only); otherwise nothing changes.
fn credential_free_git_config(sc: &Scope<'_>, project: &Path, mounts: &mut Vec<Mount>) {
    // A linked work tree: its repository's configuration, and each work tree's own
    // `config.worktree` (the run sees the whole common directory).
    if let Some(w) = crate::git::linked_worktree(project) {
        let store = sc.host.store();
        git_config_views(&sc.state_dir, &store, &w.common, &w.common, mounts);
        for dir in worktree_dirs(&w.common) {
            git_config_views(&sc.state_dir, &store, &dir, &dir, mounts);
        }
        return;
    }
    let Some(git_dir) = crate::git::git_dir_of(project) else {
        return;
    };
    git_config_views(&sc.state_dir, &sc.host.store(), &git_dir, &git_dir, mounts);
}

/// The linked work trees' own directories of the common git directory `common` (real
/// directories only, at most 256).
pub fn worktree_dirs(common: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(common.join("worktrees"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .take(256)
        .collect()
}

/// The views of `git_dir`'s configuration files (on the host), bound at `inside` (the same
/// git dir as the sandbox sees it): see [`credential_free_git_config`]. Named sandboxes use it
/// for the repository's git directory they see read-only.
pub fn git_config_views(
    state_dir: &Path,
    store: &Path,
    git_dir: &Path,
    inside: &Path,
    mounts: &mut Vec<Mount>,
) {
    for name in ["config", "config.worktree"] {
        let file = inside.join(name);
        let Ok(text) = crate::beneath::read(
            git_dir,
            Path::new(name),
            crate::git::view::MAX_CONFIG as u64,
        ) else {
            continue;
        };
        let Some(text) = text else { continue };
        let view = crate::git::view::credential_free(&text);
        if view == text {
            continue;
        }
        let path = state_dir.join("git-views").join(slug(&file));
        let written = std::fs::create_dir_all(path.parent().unwrap_or(state_dir))
            .and_then(|()| crate::atomic::write_atomic(&path, &view));
        if written.is_err() {
            // No view: the file is hidden rather than shown with its credentials.
            mounts.push(Mount {
                target: file.clone(),
                kind: MountKind::Bind {
                    source: store.join("masked-0000"),
                    writable: false,
                },
                why: "git configuration with credentials (no view could be written)".into(),
            });
            continue;
        }
        match mounts.iter_mut().find(|m| m.target == file) {
            Some(m) => {
                if let MountKind::Git { source, .. } | MountKind::Bind { source, .. } = &mut m.kind
                {
                    *source = path;
                }
                m.why = "git configuration, without its credentials, read-only".into();
            }
            None => mounts.push(Mount {
                target: file,
                kind: MountKind::Bind {
                    source: path,
                    writable: false,
                },
                why: "git configuration, without its credentials, read-only".into(),
            }),
        }
    }
}

/// A writable project's git directory, private to the run (see [`crate::git::back`]): an
/// overlay over the host's, whose layer aisb brings back with reduced trust when the run
/// ends. The guards' pins of git directories inside it are dropped (they would bind the
/// host's directories, writable, over the overlay); their read-only binds stay. A `.git` that
/// is a file (a linked work tree, a submodule's) keeps the guards alone.
fn private_git_dir(sc: &Scope<'_>, project: &Path, guards: Vec<Mount>) -> Vec<Mount> {
    let mut dot = project.join(".git");
    let mut guards = guards;
    if !std::fs::symlink_metadata(&dot).is_ok_and(|m| m.is_dir()) {
        // A linked work tree: the repository's common git directory (which holds this work
        // tree's own) is the run's private one, at its own path; the `.git` file stays pinned.
        let Some(w) = crate::git::linked_worktree(project) else {
            return guards;
        };
        // The common directory's own guards (its configuration, hooks and info read-only
        // inside, as a main work tree's are), but none over the work tree's own directory,
        // which its git writes.
        // (Those of the git directory alone: the main work tree's own hooks path is not this
        // work tree's and stays out of the sandbox. One that cannot be guarded, a link, keeps
        // the older way: no private git directory.)
        let Some(Ok(main_guards)) = w.common.parent().map(|m| git_guard_mounts(m, m)) else {
            return guards;
        };
        guards.extend(
            main_guards
                .into_iter()
                .filter(|g| g.target.starts_with(&w.common) && !w.admin.starts_with(&g.target)),
        );
        dot = w.common;
    }
    let layer = sc
        .state_dir
        .join(crate::git::back::LAYER_DIR)
        .join(slug(&dot));
    let mut out = vec![Mount {
        target: dot.clone(),
        kind: MountKind::Overlay {
            lower: dot.clone(),
            upper: layer.join("upper"),
            work: layer.join("work"),
            above: None,
        },
        why: "git directory, private to the run (brought back when it ends)".into(),
    }];
    out.extend(guards.into_iter().filter(|m| {
        !(m.target.starts_with(&dot) && matches!(m.kind, MountKind::Git { writable: true, .. }))
    }));
    out
}

/// The mounts that keep a writable work tree's git directory from naming programs the host
/// would run (see [`crate::git`]): `source` is the work tree on the host, `target` inside.
pub fn git_guard_mounts(
    target: &Path,
    source: &Path,
) -> Result<Vec<Mount>, crate::git::GuardError> {
    Ok(crate::git::guards(target, source)?
        .into_iter()
        .map(|g| Mount {
            target: g.target,
            kind: MountKind::Git {
                source: g.source,
                writable: g.writable,
                create_dir: g.create_dir,
            },
            why: if g.writable {
                "git directory, pinned in place".into()
            } else {
                "git: what the host would run, read-only".into()
            },
        })
        .collect())
}
