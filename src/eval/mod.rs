//! Evaluation: the loaded configuration files + facts about the host -> a resolved [`Plan`].
//! Imports are read by `load`, profiles merged by `merge`, `$VARS` expanded by `vars`, the
//! project scanned by `scan`, the environment filtered by `env`.

pub mod env;
pub mod load;
pub mod masks;
pub mod merge;
pub mod plan;
pub mod scan;
pub mod vars;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::config::model::{
    Access, DomainsMode, HomeMode, Inherit, NetMode, ProfileDecl, RootfsCfg, Settings, XdgMode,
    RLIMITS,
};
use crate::config::{ConfigErrors, Errors, Loc, Spanned};
use crate::proxy::domain::DomainRule;
pub use load::{load, load_cached, Loaded, Root};
use masks::PatternSet;
pub use plan::Plan;
use plan::*;
use vars::Vars;

/// Facts about the caller, read once (and faked in tests).
#[derive(Debug, Clone)]
pub struct Host {
    pub env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    pub home: PathBuf,
}

impl Host {
    pub fn current() -> std::io::Result<Host> {
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
        Ok(Host {
            env,
            cwd: std::env::current_dir()?,
            uid: uid.as_raw(),
            gid: gid.as_raw(),
            user,
            home,
        })
    }

    fn xdg(&self, var: &str, fallback: &str) -> String {
        match self.env.get(var) {
            Some(v) if v.starts_with('/') => v.clone(),
            _ => self.home.join(fallback).to_string_lossy().into_owned(),
        }
    }

    /// `$XDG_CACHE_HOME` or `~/.cache`.
    pub fn cache_home(&self) -> PathBuf {
        PathBuf::from(self.xdg("XDG_CACHE_HOME", ".cache"))
    }
    pub fn config_home(&self) -> PathBuf {
        PathBuf::from(self.xdg("XDG_CONFIG_HOME", ".config"))
    }
}

#[derive(Debug, Clone, Default)]
pub struct Request {
    pub profile: Option<String>,
    /// `--domains`: overrides the configuration's `network domains=…`.
    pub domains: Option<DomainsMode>,
    /// A command given on the command line replaces the configured one.
    pub command: Vec<String>,
    /// Named sandbox (`aisb up NAME`); `default` otherwise.
    pub sandbox: Option<String>,
    /// Reuse the cached project scan when it is still valid.
    pub use_cache: bool,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum EvalError {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Config(#[from] ConfigErrors),
    #[error("unknown profile `{name}`")]
    #[diagnostic(help("{help}"))]
    UnknownProfile { name: String, help: String },
    #[error("scanning the project failed: {0}")]
    #[diagnostic(help(
        "aisb needs `git` on PATH for git projects; check that the project is readable"
    ))]
    Scan(#[from] scan::ScanError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Git(#[from] crate::git::GuardError),
    #[error("refusing to use {path} as the project root: {why}")]
    #[diagnostic(help(
        "run aisb inside a project directory, or name one with `project \"…\"` in sandbox.kdl"
    ))]
    BadProject { path: PathBuf, why: String },
}

/// The built-in domain groups presets use (`network { group "registries" }`).
/// Test-only: `ssh` mounts the caller's ~/.ssh into the sandbox, `late-secrets` turns the live
/// mask layer off (see where each is read).
pub const BREAK_ISOLATION_ENV: &str = "AISB_TEST_BREAK_ISOLATION";

pub const BUILTIN_GROUPS: &[(&str, &[&str])] = &[
    (
        "registries",
        &[
            "registry.npmjs.org",
            "registry.yarnpkg.com",
            "pypi.org",
            "files.pythonhosted.org",
            "crates.io",
            "index.crates.io",
            "static.crates.io",
            "proxy.golang.org",
            "sum.golang.org",
            "rubygems.org",
            "index.rubygems.org",
            "repo.maven.apache.org",
            "repo1.maven.org",
        ],
    ),
    (
        // Distributions' package archives (apt, dnf): an image's `RUN apt-get install …`.
        "os-packages",
        &[
            "deb.debian.org",
            "security.debian.org",
            "archive.ubuntu.com",
            "security.ubuntu.com",
            "ports.ubuntu.com",
            "mirrors.fedoraproject.org",
            "dl.fedoraproject.org",
        ],
    ),
    (
        "github",
        &[
            "github.com",
            "api.github.com",
            "codeload.github.com",
            "objects.githubusercontent.com",
            "raw.githubusercontent.com",
            "uploads.github.com",
        ],
    ),
    (
        "anthropic",
        &[
            "api.anthropic.com",
            "statsig.anthropic.com",
            "console.anthropic.com",
        ],
    ),
    (
        "openai",
        &["api.openai.com", "auth.openai.com", "chatgpt.com"],
    ),
    (
        "google",
        &[
            "generativelanguage.googleapis.com",
            "oauth2.googleapis.com",
            "cloudcode-pa.googleapis.com",
        ],
    ),
];

/// What an image's RUN steps may reach unless `rootfs … { network … }` says otherwise.
pub const BUILD_GROUPS: &[&str] = &["registries", "os-packages"];

/// The XDG base directories `xdg "sandbox"` relocates: variable, place under the home,
/// directory in the sandbox's state.
pub const XDG_DIRS: [(&str, &str, &str); 4] = [
    ("XDG_CONFIG_HOME", ".config", "config"),
    ("XDG_DATA_HOME", ".local/share", "data"),
    ("XDG_CACHE_HOME", ".cache", "cache"),
    ("XDG_STATE_HOME", ".local/state", "state"),
];

/// Host system paths shown read-only inside. `/etc` is not shared whole (seed 002: `/etc` is
/// blocked): only the entries tools need to run.
pub const SYSTEM_PATHS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
];
pub const ETC_PATHS: &[&str] = &[
    "passwd",
    "group",
    "hosts",
    "resolv.conf",
    "nsswitch.conf",
    "host.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "alternatives",
    "gitconfig",
    "fish",
    "bash.bashrc",
    "profile",
    "profile.d",
    "inputrc",
    "terminfo",
    "os-release",
    "debian_version",
    "mime.types",
    "protocols",
    "services",
    "locale.alias",
    "locale.conf",
    "vim",
    "zsh",
    "zshrc",
    "python3",
    "perl",
    // Debian's JREs read their security and network configuration here: without it, every
    // JVM (Gradle, Maven) fails at start with "Error loading java.security file".
    "java-17-openjdk",
    "java-21-openjdk",
    "magic",
    "magic.mime",
    "manpath.config",
    // Claude Code's managed settings (an enterprise policy): kept, and extended by
    // `preset:claude` (see `agents`). The snapshot always has the directory. Gemini CLI's
    // system settings likewise.
    "claude-code",
    "gemini-cli",
];

/// Domain groups by name: every definition (the importer's wins), and those aisb ships
/// (built-in and from embedded presets), which `domains="strict"` holds presets to.
struct Groups {
    all: BTreeMap<String, Vec<String>>,
    shipped: BTreeMap<String, Vec<String>>,
}

fn unknown_group(cx: &mut Ctx<'_>, groups: &Groups, g: &Spanned<String>) {
    let hint = crate::config::diag::suggest(&g.value, groups.all.keys().map(String::as_str));
    cx.err(
        g.loc,
        format!("unknown domain group `{}`", g.value),
        "no such group",
        Some(hint.map_or_else(
            || {
                format!(
                    "known groups: {}; define one with `domains \"NAME\" \"a.com\" …`",
                    groups.all.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            },
            |h| format!("did you mean `{h}`?"),
        )),
    );
}

/// The domain rules an image's RUN steps may reach: `rootfs … { network … }`, else aisb's
/// [`BUILD_GROUPS`] (a project cannot widen those by redefining their names here: it says
/// what it adds in its own `network` block, where `aisb plan` and the trust prompt show it).
fn build_network(cx: &mut Ctx<'_>, s: &Settings, groups: &Groups) -> Vec<String> {
    let mut rules: BTreeSet<String> = BTreeSet::new();
    match &s.build_network {
        None => return default_build_network(),
        Some(n) if n.mode.as_ref().is_some_and(|m| m.value == NetMode::None) => {}
        Some(n) => {
            rules.extend(rules_of(n.allow.iter().map(|d| d.value.as_str())));
            for g in &n.groups {
                match groups.all.get(&g.value) {
                    Some(list) => rules.extend(rules_of(list.iter().map(String::as_str))),
                    None => unknown_group(cx, groups, g),
                }
            }
        }
    }
    rules.into_iter().collect()
}

/// The rules of [`BUILD_GROUPS`], as aisb ships them.
pub fn default_build_network() -> Vec<String> {
    let rules: BTreeSet<String> = rules_of(
        BUILTIN_GROUPS
            .iter()
            .filter(|(n, _)| BUILD_GROUPS.contains(n))
            .flat_map(|(_, d)| d.iter().copied()),
    )
    .collect();
    rules.into_iter().collect()
}

/// Domains as the proxy's rules (lowercased, IDNA, trailing dot dropped); ones that are not
/// valid rules were reported when their file was decoded.
fn rules_of<'a>(
    domains: impl IntoIterator<Item = &'a str> + 'a,
) -> impl Iterator<Item = String> + 'a {
    domains
        .into_iter()
        .filter_map(|d| DomainRule::parse(d).ok())
        .map(|r| r.to_string())
}

struct Ctx<'a> {
    loaded: &'a Loaded,
    errors: Errors,
}

impl Ctx<'_> {
    fn err(&mut self, loc: Loc, msg: impl Into<String>, label: &str, help: Option<String>) {
        self.errors
            .push(&self.loaded.sources, loc, msg, label, help);
    }
}

/// The names of all profiles visible from the loaded files (for completion and errors).
pub fn profile_names(loaded: &Loaded) -> Vec<String> {
    let mut names: BTreeSet<String> = BTreeSet::new();
    for &i in &loaded.order {
        for p in &loaded.files[i].profiles {
            names.insert(p.name.value.clone());
        }
    }
    names.into_iter().collect()
}

pub fn evaluate(loaded: &Loaded, host: &Host, req: &Request) -> Result<Plan, EvalError> {
    let mut cx = Ctx {
        loaded,
        errors: Errors::default(),
    };

    // Top levels, imports first; profiles and groups by name, the importer's definition wins.
    let mut settings = Settings::default();
    let mut profiles: HashMap<&str, &ProfileDecl> = HashMap::new();
    let builtin: BTreeMap<String, Vec<String>> = BUILTIN_GROUPS
        .iter()
        .map(|(n, d)| (n.to_string(), d.iter().map(|s| s.to_string()).collect()))
        .collect();
    let mut groups = Groups {
        all: builtin.clone(),
        shipped: builtin,
    };
    for &i in &loaded.order {
        let f = &loaded.files[i];
        merge::merge(
            &mut settings,
            &f.base,
            false,
            &loaded.sources,
            &mut cx.errors,
        );
        for p in &f.profiles {
            profiles.insert(&p.name.value, p);
        }
        let embedded = loaded.sources[i].path.is_none();
        for g in &f.groups {
            let domains: Vec<String> = g.domains.iter().map(|d| d.value.clone()).collect();
            if embedded {
                groups.shipped.insert(g.name.value.clone(), domains.clone());
            }
            groups.all.insert(g.name.value.clone(), domains);
        }
    }

    let root_file = &loaded.files[loaded.root];
    let chosen = req
        .profile
        .clone()
        .or_else(|| root_file.default_profile.as_ref().map(|p| p.value.clone()));
    let profile_name = chosen.clone().unwrap_or_else(|| "default".to_string());
    if let Some(name) = chosen.filter(|n| n != "default") {
        let Some(&decl) = profiles.get(name.as_str()) else {
            let known: Vec<&str> = profiles.keys().copied().collect();
            let help = match crate::config::diag::suggest(&name, known.iter().copied()) {
                Some(s) => format!("did you mean `{s}`?"),
                None => {
                    let mut k = known.clone();
                    k.sort();
                    format!("defined profiles: {}", k.join(", "))
                }
            };
            if let (None, Some(dp)) = (&req.profile, &root_file.default_profile) {
                cx.err(
                    dp.loc,
                    format!("unknown profile `{name}`"),
                    "no such profile",
                    Some(help),
                );
                return Err(ConfigErrors::new(cx.errors.list).into());
            }
            return Err(EvalError::UnknownProfile { name, help });
        };
        // Linearise `extends` (child last), refusing cycles.
        let mut chain = vec![decl];
        let mut seen = vec![decl.name.value.as_str()];
        let mut cur = decl;
        while let Some(parent) = &cur.extends {
            if parent.value == "default" {
                break;
            }
            if seen.contains(&parent.value.as_str()) {
                seen.push(&parent.value);
                cx.err(
                    parent.loc,
                    format!("profile inheritance cycle: {}", seen.join(" -> ")),
                    "extends here",
                    Some("a profile may not extend itself, directly or through others".into()),
                );
                break;
            }
            match profiles.get(parent.value.as_str()) {
                Some(&p) => {
                    seen.push(&p.name.value);
                    chain.push(p);
                    cur = p;
                }
                None => {
                    let hint = crate::config::diag::suggest(
                        &parent.value,
                        profiles.keys().copied().chain(["default"]),
                    );
                    cx.err(
                        parent.loc,
                        format!("unknown profile `{}`", parent.value),
                        "extends an unknown profile",
                        Some(hint.map_or_else(
                            || {
                                "profiles extend `default` (the top level) unless they name another"
                                    .into()
                            },
                            |h| format!("did you mean `{h}`?"),
                        )),
                    );
                    break;
                }
            }
        }
        for p in chain.iter().rev() {
            merge::merge(
                &mut settings,
                &p.settings,
                true,
                &loaded.sources,
                &mut cx.errors,
            );
        }
    }
    if !cx.errors.is_empty() {
        return Err(ConfigErrors::new(cx.errors.list).into());
    }
    let mut plan = resolve(
        &mut cx,
        host,
        req,
        &settings,
        &groups,
        profile_name,
        &profiles,
    )?;
    // The agents whose presets are imported get their own permission layers to mirror it.
    let agents: Vec<&str> = crate::presets::AGENTS
        .iter()
        .copied()
        .filter(|a| {
            loaded
                .sources
                .iter()
                .any(|f| f.path.is_none() && f.name == format!("preset:{a}"))
        })
        .collect();
    crate::agents::mirror(&mut plan, &agents);
    if !plan.network.transparent_ports.is_empty() {
        let content = crate::init::dns::RESOLV_CONF.to_string();
        let hash = format!("{:x}", Sha256::digest(content.as_bytes()));
        plan.mounts.push(Mount {
            target: PathBuf::from(crate::init::dns::RESOLV_DIR),
            kind: MountKind::Generated {
                dir: plan.store.join(format!("{}-resolv", &hash[..32])),
                files: vec![GeneratedFile {
                    name: "resolv.conf".into(),
                    content,
                }],
            },
            why: "transparent egress: names are answered by the sandbox's DNS stub (also bound at /etc/resolv.conf)".into(),
        });
    }
    Ok(plan)
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

fn sha_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Lexically normalise an absolute path (`a/./b/../c` -> `a/c`).
/// Larger than any dotenv file: past it, reading stops with an error.
const MAX_DOTENV: u64 = 1 << 20;

/// A dotenv file `from-file` names. The project is the sandbox's to write, so one below it is
/// read without following any link there (a planted `.env.agent -> ~/.aws/credentials` would
/// hand the sandbox values from that host file); one outside it is the user's own path.
fn read_dotenv(project: &Path, p: &Path) -> std::io::Result<String> {
    let bytes = match p.strip_prefix(project) {
        Ok(rel) if !rel.as_os_str().is_empty() => {
            crate::beneath::read(project, rel, MAX_DOTENV)?
                .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?
        }
        _ => return std::fs::read_to_string(p),
    };
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn resolve(
    cx: &mut Ctx<'_>,
    host: &Host,
    req: &Request,
    s: &Settings,
    groups: &Groups,
    profile_name: String,
    profiles: &HashMap<&str, &ProfileDecl>,
) -> Result<Plan, EvalError> {
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
    if project == Path::new("/") || project == host.home {
        return Err(EvalError::BadProject {
            path: project,
            why: "it would share everything under it".into(),
        });
    }
    builtins.insert("PROJECT", project.to_string_lossy().into_owned());
    let vars = Vars {
        builtins,
        env: &host.env,
    };
    let expand = |cx: &mut Ctx<'_>, v: &Spanned<String>| -> Option<String> {
        match vars.expand(&v.value) {
            Ok(x) => Some(x),
            Err(e) => {
                cx.err(v.loc, e.to_string(), "in this value", Some(e.help()));
                None
            }
        }
    };
    // Paths: expanded, relative ones taken from the project root, normalised.
    let path = |cx: &mut Ctx<'_>, v: &Spanned<String>| -> Option<PathBuf> {
        let x = expand(cx, v)?;
        Some(normalise(&project.join(x)))
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

    // ---- system paths ---------------------------------------------------------------------
    let mut system = Vec::new();
    for p in SYSTEM_PATHS.iter().map(PathBuf::from) {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() && p.parent() == Some(Path::new("/")) => {
                if let Ok(target) = std::fs::read_link(&p) {
                    system.push(SystemPath::Symlink { path: p, target });
                }
            }
            Ok(_) => system.push(SystemPath::Bind { path: p }),
            Err(_) => {}
        }
    }
    let store = host.cache_home().join("aisb/store");
    let etc = crate::graph::etc::plan(Path::new("/etc"), ETC_PATHS, &store);
    system.push(SystemPath::Snapshot {
        path: PathBuf::from("/etc"),
        snapshot: etc,
    });

    // ---- mounts ----------------------------------------------------------------------------
    let slug = |target: &Path| {
        let name = target
            .file_name()
            .map_or_else(|| "root".into(), |n| n.to_string_lossy().into_owned());
        format!(
            "{}-{name}",
            &sha_hex(target.as_os_str().as_encoded_bytes())[..16]
        )
    };
    let cow = |source: &Path, target: &Path| -> MountKind {
        if source.is_dir() {
            let d = state_dir.join("overlay").join(slug(target));
            MountKind::Overlay {
                lower: source.to_path_buf(),
                upper: d.join("upper"),
                work: d.join("work"),
            }
        } else {
            let name = target
                .file_name()
                .map_or_else(|| "file".into(), |n| n.to_os_string());
            MountKind::Copy {
                source: source.to_path_buf(),
                copy: state_dir.join("copy").join(slug(target)).join(name),
            }
        }
    };
    let bind = |source: &Path, access: Access, target: &Path| -> MountKind {
        match access {
            Access::Overlay => cow(source, target),
            a => MountKind::Bind {
                source: source.to_path_buf(),
                writable: a == Access::Rw && !read_only,
            },
        }
    };
    let mut mounts: Vec<Mount> = Vec::new();
    let home_mode = s.home.as_ref().map_or(HomeMode::Empty, |h| h.value);
    let home = host.home.clone();
    if home != Path::new("/") {
        let kind = match home_mode {
            HomeMode::Empty => MountKind::Tmpfs {
                size: None,
                mode: 0o700,
                owner: Some((uid, gid)),
            },
            HomeMode::Ro => bind(&home, Access::Ro, &home),
            HomeMode::Overlay => cow(&home, &home),
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
            size: None,
            mode: 0o1777,
            owner: None,
        },
        why: "private /tmp".into(),
    });
    let project_mount = bind(&project, project_access, &project);
    let project_writable = matches!(project_mount, MountKind::Bind { writable: true, .. });
    mounts.push(Mount {
        target: project.clone(),
        kind: project_mount,
        why: "project".into(),
    });
    // A writable project's git directory: nothing in it that git would run on the host may
    // change from inside (a test of the tests can leave it writable, to prove they notice).
    if project_writable && std::env::var(BREAK_ISOLATION_ENV).as_deref() != Ok("git") {
        mounts.extend(git_guard_mounts(&project, &project)?);
    } else if project_writable {
        eprintln!(
            "aisb: WARNING: {BREAK_ISOLATION_ENV}=git: the project's .git is writable in this sandbox (a test of the tests)"
        );
    }

    let shell = match &s.process.shell {
        Some(sh) => expand(cx, sh).map(PathBuf::from),
        None => None,
    }
    .or_else(|| {
        host.env
            .get("SHELL")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.exists())
    })
    .unwrap_or_else(|| {
        PathBuf::from(if Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        })
    });
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
            kind: bind(&source, m.access, &target),
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
                size: t.size,
                mode: 0o1777,
                owner: None,
            },
            why: format!("tmpfs at {file}:{line}"),
        });
    }
    // Parents before children; stable, so equal depths keep their declared order.
    mounts.sort_by_key(|m| m.target.components().count());

    // ---- env -------------------------------------------------------------------------------
    let mut set: Vec<(String, String)> = Vec::new();
    // Seed 003's pass-list: only the named keys of a dotenv file the user names enter.
    for (file, keys) in &s.env.from_file {
        let Some(p) = path(cx, file) else { continue };
        match read_dotenv(&project, &p) {
            Ok(text) => {
                let values = env::parse_dotenv(&text);
                for k in keys {
                    match env::dotenv_value(&values, &k.value) {
                        Some(v) => set.push((k.value.clone(), v.to_string())),
                        None => cx.err(
                            k.loc,
                            format!("`{}` is not in {}", k.value, p.display()),
                            "no such key",
                            Some("name keys the file defines (`KEY=value` lines)".into()),
                        ),
                    }
                }
            }
            Err(e) => cx.err(
                file.loc,
                format!("cannot read {}: {e}", p.display()),
                "this file",
                Some("the path is relative to the project root".into()),
            ),
        }
    }
    set.extend(
        s.env
            .set
            .iter()
            .filter_map(|(k, v)| Some((k.value.clone(), expand(cx, v)?))),
    );
    let mut forced = vec![
        ("HOME", home.to_string_lossy().into_owned()),
        ("USER", identity.name.clone()),
        ("LOGNAME", identity.name.clone()),
        ("SHELL", shell.to_string_lossy().into_owned()),
    ];
    forced.extend(xdg_env);
    let strings = |v: &[Spanned<String>]| v.iter().map(|x| x.value.clone()).collect::<Vec<_>>();
    let (allow, deny, pass) = (
        strings(&s.env.allow),
        strings(&s.env.deny),
        strings(&s.env.pass),
    );
    let mut env = env::filter(
        &host.env,
        &env::EnvPolicy {
            inherit: s.env.inherit.as_ref().map_or(Inherit::Safe, |i| i.value),
            filter_secrets: s.env.filter_secrets.as_ref().is_none_or(|b| b.value),
            allow: &allow,
            deny: &deny,
            pass: &pass,
            set: &set,
            forced: &forced,
        },
    );
    if !env.vars.iter().any(|(k, _)| k == "PATH") {
        env.vars.push((
            "PATH".into(),
            "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin".into(),
        ));
        env.vars.sort();
    }

    // ---- network ---------------------------------------------------------------------------
    let mode = s.network.mode.as_ref().map_or(NetMode::None, |m| m.value);
    let domains = req
        .domains
        .or(s.network.domains.as_ref().map(|d| d.value))
        .unwrap_or(DomainsMode::Merge);
    // A rule is built-in when an embedded preset or profile says it; the project's own files
    // are everything read from disk. `strict` keeps only the former, `replace` the latter.
    let loaded = cx.loaded;
    let builtin = |loc: Loc| {
        loaded
            .sources
            .get(loc.file)
            .is_some_and(|f| f.path.is_none())
    };
    let keep = |loc: Loc| match domains {
        DomainsMode::Merge => true,
        DomainsMode::Strict => builtin(loc),
        DomainsMode::Replace => !builtin(loc),
    };
    let ignored: Vec<String> = s
        .network
        .allow
        .iter()
        .map(|d| (d, ""))
        .chain(s.network.groups.iter().map(|g| (g, "group ")))
        .filter(|(d, _)| !keep(d.loc))
        .map(|(d, what)| {
            let (file, line) = loc_line(cx, d.loc);
            format!("{what}{} ({file}:{line})", d.value)
        })
        .collect();
    let allow_kept: Vec<&Spanned<String>> =
        s.network.allow.iter().filter(|d| keep(d.loc)).collect();
    let groups_kept: Vec<(&Spanned<String>, bool)> = s
        .network
        .groups
        .iter()
        .filter(|g| keep(g.loc))
        .map(|g| (g, builtin(g.loc)))
        .collect();
    let mut allow_rules: BTreeSet<String> =
        rules_of(allow_kept.iter().map(|d| d.value.as_str())).collect();
    for (g, from_builtin) in groups_kept {
        // Under `strict`, a built-in preset's group means aisb's own list even when the
        // project redefines that name.
        let shipped = (domains == DomainsMode::Strict && from_builtin)
            .then(|| groups.shipped.get(&g.value))
            .flatten();
        match shipped.or_else(|| groups.all.get(&g.value)) {
            Some(list) => allow_rules.extend(rules_of(list.iter().map(String::as_str))),
            None => unknown_group(cx, groups, g),
        }
    }
    let deny_rules: BTreeSet<String> =
        rules_of(s.network.deny.iter().map(|d| d.value.as_str())).collect();
    let mut ports: Vec<u16> = s.network.localhost_ports.iter().map(|p| p.value).collect();
    ports.sort_unstable();
    ports.dedup();
    // `strict`/`replace` that leave nothing to allow mean no network at all (the
    // `investigate` profile without an agent preset): no proxy to start.
    let mode = if mode == NetMode::Allow
        && domains != DomainsMode::Merge
        && allow_rules.is_empty()
        && ports.is_empty()
    {
        NetMode::None
    } else {
        mode
    };
    let transparent_ports = if s.network.transparent.as_ref().is_none_or(|t| t.value) {
        crate::init::transparent::ports_for(&allow_rules, &ports)
    } else {
        vec![]
    };
    let network = match mode {
        NetMode::Allow => Network {
            mode,
            domains,
            ignored,
            allow: allow_rules.into_iter().collect(),
            deny: deny_rules.into_iter().collect(),
            transparent_ports,
            localhost_ports: ports,
        },
        _ => Network {
            mode,
            domains,
            ignored,
            allow: vec![],
            deny: vec![],
            localhost_ports: vec![],
            transparent_ports: vec![],
        },
    };

    if mode == NetMode::Allow {
        let proxy_env = crate::proxy::sandbox_env();
        env.vars
            .retain(|(k, _)| !proxy_env.iter().any(|(p, _)| p == k));
        env.vars.extend(proxy_env);
        env.vars.sort();
    }

    // ---- process ---------------------------------------------------------------------------
    let cwd = match &s.process.cwd {
        Some(c) => path(cx, c).unwrap_or_else(|| project.clone()),
        None if host.cwd.starts_with(&project) => host.cwd.clone(),
        None => project.clone(),
    };
    let args = if !req.command.is_empty() {
        req.command.clone()
    } else if let Some(c) = &s.process.command {
        c.value.clone()
    } else {
        vec![shell.to_string_lossy().into_owned()]
    };
    let mut rlimits: Vec<Rlimit> = Vec::new();
    for r in &s.process.rlimits {
        let kind = RLIMITS
            .iter()
            .find(|(n, _)| *n == r.resource.value)
            .map_or("", |(_, k)| k)
            .to_string();
        rlimits.retain(|x| x.kind != kind);
        rlimits.push(Rlimit {
            kind,
            soft: r.soft,
            hard: r.hard,
        });
    }
    let hostname = s
        .process
        .hostname
        .as_ref()
        .map_or_else(|| "aisb".to_string(), |h| h.value.clone());

    // ---- tasks -----------------------------------------------------------------------------
    let mut tasks: BTreeMap<String, Task> = BTreeMap::new();
    for &i in &cx.loaded.order {
        for t in &cx.loaded.files[i].tasks {
            if let Some(p) = &t.profile {
                if p.value != "default" && !profiles.contains_key(p.value.as_str()) {
                    let hint = crate::config::diag::suggest(&p.value, profiles.keys().copied());
                    cx.err(
                        p.loc,
                        format!(
                            "task `{}` names unknown profile `{}`",
                            t.name.value, p.value
                        ),
                        "no such profile",
                        hint.map(|h| format!("did you mean `{h}`?")),
                    );
                }
            }
            let args = if t.run.value.len() == 1 {
                vec!["/bin/sh".into(), "-c".into(), t.run.value[0].clone()]
            } else {
                t.run.value.clone()
            };
            let cwd = t.cwd.as_ref().and_then(|c| path(cx, c));
            let env = t
                .env
                .iter()
                .filter_map(|(k, v)| Some((k.value.clone(), expand(cx, v)?)))
                .collect();
            tasks.insert(
                t.name.value.clone(),
                Task {
                    name: t.name.value.clone(),
                    description: t.description.clone(),
                    args,
                    profile: t.profile.as_ref().map(|p| p.value.clone()),
                    cwd,
                    env,
                },
            );
        }
    }

    // ---- masks -----------------------------------------------------------------------------
    let defaults = s.secrets.defaults.as_ref().is_none_or(|b| b.value);
    let mut block_patterns: Vec<String> = Vec::new();
    let mut explicit: BTreeSet<String> = BTreeSet::new();
    let mut outside: Vec<(PathBuf, String)> = Vec::new();
    for b in &s.block {
        if masks::is_outside(&b.value) {
            if let Some(p) = path(cx, b) {
                outside.push((p, format!("block \"{}\"", b.value)));
            }
        } else {
            block_patterns.push(b.value.clone());
            explicit.insert(b.value.clone());
        }
    }
    if defaults {
        block_patterns.extend(masks::DEFAULT_SENSITIVE.iter().map(|s| s.to_string()));
    }
    let allow_patterns: Vec<&str> = s.allow.iter().map(|a| a.value.as_str()).collect();
    let tool_patterns: Vec<&str> = masks::DEFAULT_TOOL_DIRS
        .iter()
        .copied()
        .chain(s.secrets.tool_dirs.iter().map(|t| t.value.as_str()))
        .collect();
    if !cx.errors.is_empty() {
        return Err(ConfigErrors::new(std::mem::take(&mut cx.errors.list)).into());
    }
    let live = LiveRules {
        block: PatternSet::new(block_patterns.iter().map(String::as_str)),
        allow: PatternSet::new(allow_patterns.iter().copied()),
        explicit,
        since: std::time::SystemTime::now(),
    };
    let tool_set = PatternSet::new(tool_patterns.iter().copied());
    let gitignored = s.secrets.gitignored.as_ref().is_none_or(|b| b.value);
    let git_crypt = s.secrets.git_crypt.as_ref().is_none_or(|b| b.value);
    let block_rule = |p: &str| live.rule_name(p);
    let key = sha_hex(
        serde_json::to_string(&(
            &block_patterns,
            &allow_patterns,
            &tool_patterns,
            gitignored,
            git_crypt,
            "v1",
        ))
        .unwrap_or_default()
        .as_bytes(),
    );
    let rules = scan::ScanRules {
        block: &live.block,
        block_rule: &block_rule,
        allow: &live.allow,
        tool_dirs: &tool_set,
        gitignored,
        git_crypt,
        key,
    };
    let cache_dir = req
        .use_cache
        .then(|| host.cache_home().join("aisb").join("scan"));
    let scanned = scan::scan(&project, &rules, cache_dir.as_deref())?;
    let mut mask_list: Vec<Mask> = scanned
        .masks
        .iter()
        .map(|m| Mask {
            path: project
                .join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&m.rel)),
            dir: m.dir,
            rule: m.rule.clone(),
        })
        .collect();
    let home_visible = home_mode != HomeMode::Empty;
    if home_visible && defaults {
        for rel in masks::HOME_SENSITIVE {
            let p = home.join(rel);
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                mask_list.push(Mask {
                    dir: m.is_dir(),
                    path: p,
                    rule: format!("home \"~/{rel}\""),
                });
            }
        }
    }
    for (p, rule) in outside {
        if let Ok(m) = std::fs::symlink_metadata(&p) {
            mask_list.push(Mask {
                dir: m.is_dir(),
                path: p,
                rule,
            });
        }
    }
    // A mask only matters where something is mounted; it must also never hide a mount's root
    // parent chain in a way that breaks it, so keep the list sorted and free of duplicates.
    mask_list.sort_by(|a, b| a.path.cmp(&b.path));
    mask_list.dedup_by(|a, b| a.path == b.path);

    // ---- root filesystem -------------------------------------------------------------------
    let rootfs = match s.rootfs.as_ref() {
        None => Rootfs::Host,
        Some(r) => {
            match &r.value {
                RootfsCfg::Host => Rootfs::Host,
                RootfsCfg::Dockerfile(p) => Rootfs::Dockerfile {
                    path: project.join(p),
                },
                RootfsCfg::From(source) => Rootfs::From {
                    source: source.clone(),
                },
                RootfsCfg::Image(name) => {
                    // The importer's definition wins (files are in import order).
                    let found = cx
                        .loaded
                        .order
                        .iter()
                        .rev()
                        .flat_map(|&i| cx.loaded.files[i].images.iter())
                        .find(|d| &d.name.value == name);
                    match found {
                        Some(d) => Rootfs::Image {
                            name: name.clone(),
                            steps: d.steps.clone(),
                        },
                        None => {
                            let names: Vec<String> = cx
                                .loaded
                                .order
                                .iter()
                                .flat_map(|&i| cx.loaded.files[i].images.iter())
                                .map(|d| d.name.value.clone())
                                .collect();
                            cx.err(
                            r.loc,
                            format!("no image named `{name}`"),
                            "unknown image",
                            Some(if names.is_empty() {
                                format!("declare it: `image \"{name}\" {{ from \"…\"; run \"…\" }}`")
                            } else {
                                format!("images declared: {}", names.join(", "))
                            }),
                        );
                            Rootfs::Host
                        }
                    }
                }
            }
        }
    };
    let build_network = build_network(cx, s, groups);
    if !cx.errors.is_empty() {
        return Err(ConfigErrors::new(std::mem::take(&mut cx.errors.list)).into());
    }
    // A deliberately broken sandbox, so the isolation suites and the VM testbed can prove they
    // catch a leak. Loud, and no more than a `mount "~/.ssh"` in sandbox.kdl could do.
    // Another test of the tests: no live layer, so a secret written while the sandbox runs
    // stays readable inside.
    let live = if std::env::var(BREAK_ISOLATION_ENV).as_deref() == Ok("late-secrets") {
        eprintln!(
            "aisb: WARNING: {BREAK_ISOLATION_ENV}=late-secrets: secrets written into the project while this sandbox runs stay readable in it (a test of the tests)"
        );
        None
    } else {
        Some(live)
    };
    if std::env::var(BREAK_ISOLATION_ENV).as_deref() == Ok("ssh") {
        let ssh = host.home.join(".ssh");
        eprintln!(
            "aisb: WARNING: {BREAK_ISOLATION_ENV}=ssh: {} is visible in this sandbox (a test of the tests)",
            ssh.display()
        );
        mask_list.retain(|m| !m.path.starts_with(&ssh));
        mounts.push(Mount {
            target: ssh.clone(),
            kind: MountKind::Bind {
                source: ssh,
                writable: false,
            },
            why: format!("{BREAK_ISOLATION_ENV}=ssh"),
        });
    }
    let mut profile_list: Vec<String> = profiles.keys().map(|s| s.to_string()).collect();
    profile_list.sort();
    let config_digest = cx
        .loaded
        .sources
        .iter()
        .any(|src| src.path.is_some())
        .then(|| {
            let mut h = Sha256::new();
            for src in cx.loaded.sources.iter().filter(|src| src.path.is_some()) {
                h.update(src.name.as_bytes());
                h.update([0]);
                h.update(src.text.as_bytes());
                h.update([0]);
            }
            format!("{:x}", h.finalize())
        });
    Ok(Plan {
        config_file: match &cx.loaded.root_kind {
            Root::File(p) | Root::Text { path: p, .. } => Some(p.clone()),
            Root::Default { .. } => None,
        },
        config_digest,
        profile: profile_name,
        backend: s.backend.as_ref().map(|b| b.value.clone()),
        rootfs,
        build_network,
        project,
        project_access,
        read_only,
        identity,
        state_dir,
        store,
        system,
        mounts,
        masks: mask_list,
        live,
        scan: ScanSummary {
            git: scanned.git,
            cached: scanned.from_cache,
            entries: scanned.entries_seen,
            notes: scanned.notes,
        },
        env,
        network,
        process: Process {
            args,
            cwd,
            shell,
            hostname,
            rlimits,
        },
        limits: limits(cx, &s.limits),
        tasks: tasks.into_values().collect(),
        profiles: profile_list,
    })
}

/// The configured limits over aisb's defaults, each with where it was set.
fn limits(cx: &Ctx<'_>, l: &crate::config::model::LimitsCfg) -> plan::Limits {
    let mut out = plan::Limits::default();
    let mut at = |name: &str, loc: Loc| {
        let (file, line) = loc_line(cx, loc);
        out.set_at
            .insert(name.to_string(), format!("{file}:{line}"));
    };
    if let Some(p) = &l.pids {
        at("pids", p.loc);
    }
    if let Some(m) = &l.memory {
        at("memory", m.loc);
    }
    if let Some(c) = &l.cpus {
        at("cpus", c.loc);
    }
    if let Some(p) = &l.pids {
        out.pids = p.value;
    }
    out.memory = l.memory.as_ref().and_then(|m| m.value);
    out.cpus_milli = l.cpus.as_ref().and_then(|c| c.value);
    out
}

fn loc_line(cx: &Ctx<'_>, loc: Loc) -> (String, usize) {
    let f = &cx.loaded.sources[loc.file];
    (f.name.clone(), f.line_col(loc.span.offset()).0)
}
