//! Facts about the host, gathered once before evaluation, and where this sandbox stands on
//! it: the identity inside, the project root, the sandbox's state directory, the variables
//! `$HOME`, `$PROJECT`, … that paths in the configuration may use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::plan::Identity;
use super::vars::Vars;
use super::{normalise, sha_hex, Ctx, EvalError, Request};
use crate::config::model::{Access, Settings};
use crate::config::{ConfigErrors, Spanned};

/// Facts about the caller, read once (and faked in tests).
#[derive(Debug, Clone)]
pub struct Host {
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    pub home: PathBuf,
    /// The agents' own settings files on the host (`agents::host_policies`).
    pub agent_policies: BTreeMap<String, serde_json::Value>,
    /// The system paths shown inside and the `/etc` snapshot, as this host has them
    /// (`graph::system::system_paths`, given to [`Host::current`]).
    pub system: Vec<super::plan::SystemPath>,
}

impl Host {
    /// The caller's host. `system_paths` gathers the system paths given the store directory
    /// (`graph::system::system_paths`): passed in, so evaluating never reads the host itself.
    pub fn current(
        system_paths: impl FnOnce(&std::path::Path) -> Vec<super::plan::SystemPath>,
    ) -> std::io::Result<Host> {
        let env: BTreeMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        let uid = nix::unistd::getuid();
        let gid = nix::unistd::getgid();
        let pw = nix::unistd::User::from_uid(uid).ok().flatten();
        let user = pw
            .as_ref()
            .map(|u| u.name.clone())
            .or_else(|| env.get("USER").cloned())
            .unwrap_or_else(|| uid.to_string());
        let home = env
            .get("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .or_else(|| pw.as_ref().map(|u| u.dir.clone()))
            .unwrap_or_else(|| PathBuf::from("/"));
        let mut host = Host {
            env,
            cwd: std::env::current_dir()?,
            uid: uid.as_raw(),
            gid: gid.as_raw(),
            user,
            home,
            agent_policies: super::agents::host_policies(),
            system: Vec::new(),
        };
        host.system = system_paths(&host.store());
        Ok(host)
    }

    pub(super) fn xdg(&self, var: &str, fallback: &str) -> String {
        match self.env.get(var) {
            Some(v) if v.starts_with('/') => v.clone(),
            _ => self.home.join(fallback).to_string_lossy().into_owned(),
        }
    }

    /// `$XDG_CACHE_HOME` or `~/.cache`.
    /// The content-addressed store (`graph::store`).
    pub fn store(&self) -> PathBuf {
        self.cache_home().join("aisb/store")
    }
    pub fn cache_home(&self) -> PathBuf {
        PathBuf::from(self.xdg("XDG_CACHE_HOME", ".cache"))
    }
    pub fn config_home(&self) -> PathBuf {
        PathBuf::from(self.xdg("XDG_CONFIG_HOME", ".config"))
    }
}

/// What every part of the evaluation shares: the host, the request, the merged settings, and
/// what was resolved first from them.
pub(super) struct Scope<'a> {
    pub host: &'a Host,
    pub req: &'a Request,
    pub s: &'a Settings,
    pub vars: Vars<'a>,
    pub project: PathBuf,
    pub project_access: Access,
    pub read_only: bool,
    pub state_dir: PathBuf,
    pub identity: Identity,
    /// The caller's variables a value written in a configuration file on disk expanded
    /// (name, where): each is a loosening (its value reaches the sandbox or its layout).
    pub host_vars: std::cell::RefCell<Vec<(String, crate::config::Loc)>>,
}

impl Scope<'_> {
    /// A value with its variables expanded; an error at its span when one is unknown.
    pub fn expand(&self, cx: &mut Ctx<'_>, v: &Spanned<String>) -> Option<String> {
        let before = self.vars.used.borrow().len();
        let expanded = self.vars.expand(&v.value);
        if cx.loaded.sources[v.loc.file].path.is_some() {
            let used = self.vars.used.borrow();
            let mut noted = self.host_vars.borrow_mut();
            for name in &used[before..] {
                noted.push((name.clone(), v.loc));
            }
        }
        match expanded {
            Ok(x) => Some(x),
            Err(e) => {
                cx.err(v.loc, e.to_string(), "in this value", Some(e.help()));
                None
            }
        }
    }

    /// Paths: expanded, relative ones taken from the project root, normalised.
    pub fn path(&self, cx: &mut Ctx<'_>, v: &Spanned<String>) -> Option<PathBuf> {
        let x = self.expand(cx, v)?;
        Some(normalise(&self.project.join(x)))
    }
}

/// The identity, the project root (which may use every variable but `$PROJECT` itself) and
/// the state directory.
pub(super) fn scope<'a>(
    cx: &mut Ctx<'_>,
    host: &'a Host,
    req: &'a Request,
    s: &'a Settings,
) -> Result<Scope<'a>, EvalError> {
    let identity_name = s
        .process
        .user
        .as_ref()
        .and_then(|u| u.name.as_ref())
        .map_or(host.user.clone(), |n| n.value.clone());
    let uid = s
        .process
        .user
        .as_ref()
        .and_then(|u| u.uid.as_ref())
        .map_or(host.uid, |v| v.value);
    let gid = s
        .process
        .user
        .as_ref()
        .and_then(|u| u.gid.as_ref())
        .map_or(host.gid, |v| v.value);
    let mut builtins: BTreeMap<&'static str, String> = BTreeMap::new();
    builtins.insert("HOME", host.home.to_string_lossy().into_owned());
    builtins.insert("USER", identity_name.clone());
    builtins.insert("UID", uid.to_string());
    builtins.insert("GID", gid.to_string());
    builtins.insert("XDG_CACHE_HOME", host.xdg("XDG_CACHE_HOME", ".cache"));
    builtins.insert("XDG_CONFIG_HOME", host.xdg("XDG_CONFIG_HOME", ".config"));
    builtins.insert("XDG_DATA_HOME", host.xdg("XDG_DATA_HOME", ".local/share"));
    builtins.insert("XDG_STATE_HOME", host.xdg("XDG_STATE_HOME", ".local/state"));

    let base_dir = cx.loaded.base_dir();
    // The project root may use every variable but $PROJECT itself.
    let root_raw = s.project.root.clone();
    let project = {
        let vars = Vars {
            builtins: builtins.clone(),
            env: &host.env,
            used: Default::default(),
        };
        match &root_raw {
            Some(r) => match vars.expand(&r.value) {
                Ok(p) => normalise(&base_dir.join(p)),
                Err(e) => {
                    cx.err(r.loc, e.to_string(), "in this path", Some(e.help()));
                    base_dir.clone()
                }
            },
            None => base_dir.clone(),
        }
    };
    let project = match project.canonicalize() {
        Ok(p) if p.is_dir() => p,
        Ok(p) => {
            return Err(EvalError::BadProject {
                path: p,
                why: "not a directory".into(),
            })
        }
        Err(e) => {
            if let Some(r) = &root_raw {
                cx.err(
                    r.loc,
                    format!("project root `{}` does not exist: {e}", project.display()),
                    "project root",
                    None,
                );
                return Err(ConfigErrors::new(std::mem::take(&mut cx.errors.list)).into());
            }
            return Err(EvalError::BadProject {
                path: project,
                why: e.to_string(),
            });
        }
    };
    // Never a root that holds the home or the system: written in place, everything under it
    // would be the sandbox's to change.
    const SYSTEM_TREES: &[&str] = &[
        "/usr", "/etc", "/boot", "/proc", "/sys", "/dev", "/bin", "/sbin", "/lib", "/lib32",
        "/lib64", "/libx32",
    ];
    const SYSTEM_DIRS: &[&str] = &[
        "/var", "/opt", "/srv", "/home", "/tmp", "/run", "/mnt", "/media", "/root", "/snap",
    ];
    if project == Path::new("/") || project == host.home {
        return Err(EvalError::BadProject {
            path: project,
            why: "it would share everything under it".into(),
        });
    }
    // The home as given and as reached (through a link).
    let home = host
        .home
        .canonicalize()
        .unwrap_or_else(|_| host.home.clone());
    if home.starts_with(&project)
        || host.home.starts_with(&project)
        || SYSTEM_TREES.iter().any(|d| project.starts_with(d))
        || SYSTEM_DIRS.iter().any(|d| project == Path::new(d))
    {
        return Err(EvalError::BadProject {
            path: project,
            why: "it holds your home or the system's files, which the sandbox would share".into(),
        });
    }
    builtins.insert("PROJECT", project.to_string_lossy().into_owned());
    let vars = Vars {
        builtins,
        env: &host.env,
        used: Default::default(),
    };
    let read_only = s.read_only.as_ref().is_some_and(|r| r.value);
    let project_access = match (read_only, s.project.access.as_ref().map(|a| a.value)) {
        (true, Some(Access::Overlay)) => Access::Overlay,
        (true, _) => Access::Ro,
        (false, a) => a.unwrap_or(Access::Rw),
    };
    let sandbox = req.sandbox.clone().unwrap_or_else(|| "default".into());
    let dir_name = project
        .file_name()
        .map_or_else(|| "root".into(), |n| n.to_string_lossy().into_owned());
    let state_dir = host
        .cache_home()
        .join("aisb")
        .join(format!(
            "{dir_name}-{}",
            sha_hex(project.as_os_str().as_encoded_bytes())
        ))
        .join(&sandbox);
    let identity = Identity {
        uid,
        gid,
        name: identity_name,
        home: host.home.clone(),
    };

    Ok(Scope {
        host,
        req,
        s,
        vars,
        project,
        project_access,
        read_only,
        state_dir,
        identity,
        host_vars: Default::default(),
    })
}
