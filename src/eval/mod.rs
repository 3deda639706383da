//! Evaluation: the loaded configuration files + facts about the host -> a resolved [`Plan`].
//! Imports are read by `load`, profiles merged by `merge`, `$VARS` expanded by `vars`, the
//! project scanned by `scan`, the environment filtered by `env`.

pub mod agents;
pub mod deps;
pub mod env;
mod host;
pub mod load;
pub mod masks;
pub mod merge;
mod mounts;
mod network;
pub mod plan;
mod process;
pub mod protect;
pub mod rootfs;
pub mod scan;
mod tasks;
pub mod toolchains;
pub mod vars;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::config::model::{DomainsMode, ProfileDecl, Settings};
use crate::config::{ConfigErrors, Errors, Loc};
pub use load::{load, load_cached, Loaded, Root};
pub use plan::Plan;
use plan::*;

pub use host::Host;
pub use mounts::{git_config_views, git_guard_mounts};
pub use network::{default_build_network, BUILD_GROUPS, BUILTIN_GROUPS};

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

/// Test-only: `ssh` mounts the caller's ~/.ssh into the sandbox, `late-secrets` turns the live
/// mask layer off (see where each is read).
pub const BREAK_ISOLATION_ENV: &str = "AISB_TEST_BREAK_ISOLATION";

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
    let mut groups = network::Groups {
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
    agents::mirror(&mut plan, &agents, &host.agent_policies);
    if !plan.network.transparent_ports.is_empty() {
        let content = crate::vocab::RESOLV_CONF.to_string();
        let hash = format!("{:x}", Sha256::digest(content.as_bytes()));
        plan.mounts.push(Mount {
            target: PathBuf::from(crate::vocab::RESOLV_DIR),
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

fn sha_hex(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

/// Lexically normalise an absolute path (`a/./b/../c` -> `a/c`).
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
    groups: &network::Groups,
    profile_name: String,
    profiles: &HashMap<&str, &ProfileDecl>,
) -> Result<Plan, EvalError> {
    let sc = host::scope(cx, host, req, s)?;
    let system = host.system.clone();
    let mounts::Base {
        mut mounts,
        xdg_env,
        home_mode,
    } = mounts::base(cx, &sc)?;
    let shell = process::shell(cx, &sc);
    mounts::user(cx, &sc, &mut mounts, &shell, home_mode);
    let mut env = env::resolve(cx, &sc, &shell, xdg_env);
    let network = network::resolve(cx, &sc, groups, &mut env);
    let credentials = credentials(cx, s, &network, &mut env);
    let process = process::resolve(cx, &sc, shell);
    let tasks = tasks::resolve(cx, &sc, profiles);
    let masks::Resolved {
        masks: mut mask_list,
        live,
        scanned,
        mut memos,
    } = masks::resolve(cx, &sc, home_mode)?;
    mounts.extend(deps::mounts(&sc, &scanned.roles));
    let made_for_run = deps::absent(&sc, &live.roles, &mut mounts);
    let imports: Vec<(PathBuf, &str)> = cx
        .loaded
        .sources
        .iter()
        .filter_map(|src| src.path.clone())
        .filter(|p| {
            !protect::PROTECTED
                .iter()
                .any(|(rel, _)| sc.project.join(rel) == *p)
        })
        .map(|p| (p, "aisb's policy (imported)"))
        // The Dockerfile `rootfs` builds from is policy too: its FROM and RUN lines decide
        // what the next run's image holds.
        .chain(s.rootfs.as_ref().and_then(|r| match &r.value {
            crate::config::model::RootfsCfg::Dockerfile(rel) => Some((
                crate::git::lexical_join(&sc.project, Path::new(rel)),
                "aisb builds the sandbox's image from it",
            )),
            _ => None,
        }))
        .collect();
    // Looked up by path and by each parent: a scan of the whole list per protected name was
    // quadratic in a big repository (50,000 masks times a hundred names).
    let mask_index: std::collections::HashMap<&std::path::Path, bool> = mask_list
        .iter()
        .map(|m| (m.path.as_path(), m.dir))
        .collect();
    let is_masked = |p: &std::path::Path| {
        mask_index.contains_key(p)
            || p.ancestors()
                .skip(1)
                .any(|a| mask_index.get(a) == Some(&true))
    };
    let opened = unprotected(cx, s, &sc.project);
    let (protect_mounts, protected, protect_covered) = protect::resolve(
        &sc,
        &imports,
        &scanned.nested_protected,
        &mounts,
        &is_masked,
        &opened,
    );
    // The project's git directory (read once: the git-crypt keys below are in it too).
    let git_dir = crate::git::git_dir_of(&sc.project);
    let project_dirs = protect::below_top(&sc, &scanned, git_dir.as_deref(), &opened);
    mounts.extend(protect_mounts);
    if home_mode == crate::config::model::HomeMode::Empty
        && s.toolchains.as_ref().is_none_or(|t| t.value)
    {
        let before = mask_list.len();
        mounts.extend(toolchains::mounts(&sc, &mut mask_list));
        if mask_list.len() != before {
            mask_list.sort_by(|a, b| a.path.cmp(&b.path));
            mask_list.dedup_by(|a, b| a.path == b.path);
        }
    }
    // Parents before children again (stable: equal depths keep their order).
    mounts.sort_by_key(|m| m.target.components().count());
    // aisb's own state and configuration, when XDG puts them inside the project: the scan
    // cache, the kept-masks record, the layers and the trust records decide what the next
    // run masks and allows, so the sandbox never sees or writes them.
    let own = [
        sc.host.cache_home().join("aisb"),
        sc.host.config_home().join("aisb"),
    ];
    let before = mask_list.len();
    // Wherever else the sandbox could see them: through the home when it is visible, a
    // `mount` of a parent (`mount "~/.cache"`), a system directory bound whole (`/opt`),
    // each at the place inside that shows it; the default places too, where XDG points
    // elsewhere now (an earlier run's state is still there). And a brokered credential's file.
    let mut hidden: Vec<(std::path::PathBuf, String)> = own
        .iter()
        .chain(&[
            host.home.join(".cache/aisb"),
            host.home.join(".config/aisb"),
        ])
        .map(|d| {
            let why = "aisb's own state (trust records, caches, the credential broker's CA)";
            (d.clone(), why.to_string())
        })
        .collect();
    // The home's credential files wherever a mount shows them (a preset's `~/.claude` or
    // `~/.codex` copy-on-write, a `mount "~/.config"`), not only through a visible home: the
    // login a subscription keeps there (Claude Code's `.credentials.json`, Codex's
    // `auth.json`) holds tokens the sandbox could send anywhere.
    if s.secrets.defaults.as_ref().is_none_or(|d| d.value) {
        for rel in masks::HOME_SENSITIVE {
            hidden.push((host.home.join(rel), masks::home_rule(rel)));
        }
    }
    for c in &credentials {
        if let crate::config::model::CredentialSource::File(f) = &c.source {
            let path = f
                .strip_prefix("~/")
                .map_or_else(|| std::path::PathBuf::from(f), |r| host.home.join(r));
            hidden.push((path, format!("the real value of credential `{}`", c.name)));
        }
    }
    // Each source as the kernel reaches it (a home through a link: /home -> /var/home).
    let shown: Vec<(std::path::PathBuf, std::path::PathBuf)> = mounts
        .iter()
        .filter_map(|m| match &m.kind {
            MountKind::Bind { source, .. } | MountKind::Git { source, .. } => {
                Some((source.clone(), m.target.clone()))
            }
            MountKind::Overlay { lower, .. } => Some((lower.clone(), m.target.clone())),
            _ => None,
        })
        .chain(system.iter().filter_map(|sp| match sp {
            SystemPath::Bind { path } => Some((path.clone(), path.clone())),
            _ => None,
        }))
        .map(|(source, target)| (source.canonicalize().unwrap_or(source), target))
        .collect();
    // Overlays of a home directory (a preset's `~/.claude`): their lower directory as the
    // kernel reaches it, and where inside.
    let overlays: Vec<(std::path::PathBuf, &std::path::Path)> = mounts
        .iter()
        .filter_map(|m| match &m.kind {
            MountKind::Overlay { lower, .. } => Some((
                lower.canonicalize().unwrap_or_else(|_| lower.clone()),
                m.target.as_path(),
            )),
            _ => None,
        })
        .collect();
    for (path, why) in hidden {
        let home_sensitive = why.starts_with("home \"");
        // Mounted on purpose, that very path (`mount "~/.ssh"`): the user's choice, not
        // hidden where another mount shows it too.
        if home_sensitive
            && mounts.iter().any(|m| match &m.kind {
                MountKind::Bind { source, .. } | MountKind::Copy { source, .. } => *source == path,
                MountKind::Overlay { lower, .. } => *lower == path,
                _ => false,
            })
        {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            // A login the user makes on the host while the sandbox runs would appear in an
            // overlay of its directory: masked now, over an empty file that realising puts in
            // the overlay's upper layer (`graph::realise`), which hides the host's later one.
            if home_sensitive {
                let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
                    continue;
                };
                let parent = parent
                    .canonicalize()
                    .unwrap_or_else(|_| parent.to_path_buf());
                for (lower, target) in &overlays {
                    if *lower == parent {
                        mask_list.push(Mask {
                            path: target.join(name),
                            dir: false,
                            rule: match why.ends_with(masks::UNREPORTED) {
                                true => why.clone(),
                                false => {
                                    format!("{why} (not on the host yet){}", masks::UNREPORTED)
                                }
                            },
                        });
                    }
                }
            }
            continue;
        };
        let real = path.canonicalize().unwrap_or_else(|_| path.clone());
        for (source, target) in &shown {
            for p in [&real, &path] {
                let Ok(rel) = p.strip_prefix(source) else {
                    continue;
                };
                if rel.as_os_str().is_empty() {
                    continue;
                }
                let inside = target.join(rel);
                // A named sandbox's clone is the project, below aisb's state: everything
                // beside the way down to it is hidden, not the project.
                if let Ok(down) = sc.project.strip_prefix(p) {
                    let mut dir = p.to_path_buf();
                    let mut at = inside.clone();
                    for step in down.components().take(32) {
                        for e in std::fs::read_dir(&dir)
                            .into_iter()
                            .flatten()
                            .flatten()
                            .take(10_000)
                        {
                            if e.file_name() != step.as_os_str() {
                                mask_list.push(Mask {
                                    path: at.join(e.file_name()),
                                    dir: e.file_type().is_ok_and(|t| t.is_dir()),
                                    rule: why.clone(),
                                });
                            }
                        }
                        dir.push(step);
                        at.push(step);
                    }
                    continue;
                }
                mask_list.push(Mask {
                    path: inside,
                    dir: meta.is_dir(),
                    rule: why.clone(),
                });
            }
        }
    }
    for d in own {
        if d.starts_with(&sc.project) && d != sc.project {
            // Made now if absent (no link followed below the project: the sandbox writes
            // there): a mask needs something to cover, or the sandbox could make the
            // directory and plant a trust record or a scan cache in it.
            if let Ok(rel) = d.strip_prefix(&sc.project) {
                let _ = crate::beneath::Dir::open(&sc.project).and_then(|p| p.dir(rel, true));
            }
            mask_list.push(Mask {
                path: d,
                dir: true,
                rule: "aisb's own state (XDG puts it inside the project)".into(),
            });
        }
    }
    // git-crypt's key decrypts every file the git-crypt layer hides (a linked work tree's
    // are in the repository's common git directory, or its own).
    // (git-crypt keeps them in `git rev-parse --git-dir`: each work tree's own.)
    let common: Vec<PathBuf> = crate::git::linked_worktree(&sc.project)
        .map(|w| {
            let mut dirs = mounts::worktree_dirs(&w.common);
            dirs.push(w.common);
            dirs
        })
        .unwrap_or_default();
    for keys in git_dir
        .iter()
        .chain(common.iter())
        .map(|g| g.join("git-crypt"))
    {
        if std::fs::symlink_metadata(&keys).is_ok_and(|m| m.is_dir()) {
            mask_list.push(Mask {
                path: keys,
                dir: true,
                rule: "git-crypt's keys (they decrypt what the git-crypt layer hides)".into(),
            });
        }
    }
    if mask_list.len() != before {
        mask_list.sort_by(|a, b| a.path.cmp(&b.path));
        mask_list.dedup_by(|a, b| a.path == b.path);
    }
    let kept_masked = masks::keep(&sc, &mut mask_list, &mut memos);
    let rootfs = rootfs::resolve(cx, &sc);
    let build_network = network::build(cx, s, groups);
    let tools = tool_policy(cx, &s.tools);
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
    let mut exposures = exposures(cx, s, &sc.project);
    // The caller's variables written into on-disk values (`set "X" "${AWS_SECRET_ACCESS_KEY}"`,
    // a shell or tmpfs path): their values reach the sandbox.
    let mut seen = BTreeSet::new();
    for (name, loc) in sc.host_vars.borrow().iter() {
        if seen.insert(name.clone()) {
            let (file, line) = loc_line(cx, *loc);
            exposures.push(format!(
                "${name}: the caller's value is written into the sandbox (at {file}:{line})"
            ));
        }
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
        memos,
        config_file: match &cx.loaded.root_kind {
            Root::File(p) | Root::Text { path: p, .. } => Some(p.clone()),
            Root::Default { .. } => None,
        },
        config_digest,
        profile: profile_name,
        backend: s.backend.as_ref().map(|b| b.value.clone()),
        rootfs,
        build_network,
        project: sc.project,
        project_access: sc.project_access,
        read_only: sc.read_only,
        identity: sc.identity,
        state_dir: sc.state_dir,
        store: host.store(),
        system,
        mounts,
        masks: mask_list,
        kept_masked,
        protected,
        project_dirs: std::sync::Arc::new(project_dirs),
        protect_covered,
        unprotected: if sc.read_only || sc.project_access != crate::config::model::Access::Rw {
            Vec::new()
        } else {
            opened
        },
        made_for_run,
        exposures,
        live,
        scan: ScanSummary {
            git: scanned.git,
            cached: scanned.from_cache,
            entries: scanned.entries_seen,
            notes: scanned.notes,
        },
        env,
        network,
        process,
        limits: process::limits(cx, &s.limits),
        tools,
        tasks,
        profiles: profile_list,
        credentials,
    })
}

/// What `unprotect` opens, as paths in the project; a name that is not a protected file's is
/// an error at its span.
fn unprotected(cx: &mut Ctx<'_>, s: &Settings, project: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for u in &s.unprotect {
        match protect::openable(&u.value) {
            Ok(()) => out.push(project.join(u.value.trim_end_matches('/'))),
            Err(why) => cx.err(
                u.loc,
                format!("`unprotect \"{}\"`: {why}", u.value),
                "not openable",
                Some(
                    "`aisb plan` lists the protected files; `aisb why PATH` says what obeys one"
                        .into(),
                ),
            ),
        }
    }
    out
}

/// The merged `credential`s, against the network they need: the proxy adds them, so they are
/// brokered in `allow` mode only, to the hosts it allows. The variable a credential names is
/// the placeholder's alone, and the variable its value is read from stays out too: a value the
/// environment would otherwise pass under either name is dropped.
fn credentials(
    cx: &mut Ctx<'_>,
    s: &Settings,
    network: &plan::Network,
    env: &mut plan::Env,
) -> Vec<plan::Credential> {
    let mut out = Vec::new();
    let policy = crate::proxy::policy::Policy::new(&crate::proxy::policy::PolicyConfig {
        allow: network.allow.clone(),
        deny: network.deny.clone(),
        ..Default::default()
    });
    for c in &s.credentials {
        let (Some(var), Some(from), Some(header)) = (&c.env, &c.from, &c.header) else {
            continue; // the decoder said what is missing
        };
        // Without a proxy nothing is brokered. A preset's credential then leaves its variable
        // to the preset's `pass`, as before brokering (`network "host"` isolates nothing
        // anyway); one the project wrote keeps its variables out: the user said it is a
        // credential, and the real value never enters.
        let on_disk = cx.loaded.sources[c.loc.file].path.is_some();
        let proxied = network.mode == crate::config::model::NetMode::Allow;
        if !proxied && !on_disk {
            continue;
        }
        // Hosts the network does not allow (a profile that narrows it, the project's domains
        // leaving a preset's out) are never added to: `aisb plan` shows what is left.
        let mut hosts = Vec::new();
        for h in c.hosts.iter().filter(|_| proxied) {
            let Ok(name) = crate::config::domain::normalise_name(&h.value) else {
                continue;
            };
            if policy.check(&name, 443).is_ok() && !hosts.contains(&name) {
                hosts.push(name);
            }
        }
        if out.iter().any(|o: &plan::Credential| o.env == var.value) {
            cx.err(
                var.loc,
                format!("two credentials put their placeholder in ${}", var.value),
                "one variable each",
                Some("give each credential a variable of its own".into()),
            );
            continue;
        }
        // The placeholder's variable, and the variable the real value is read from.
        let source_var = match &from.value {
            crate::config::model::CredentialSource::Env(v) => Some(v.as_str()),
            _ => None,
        };
        for name in std::iter::once(var.value.as_str()).chain(source_var) {
            if let Some(i) = env.vars.iter().position(|(k, _)| k == name) {
                env.vars.remove(i);
                env.dropped.push(plan::Dropped {
                    name: name.to_string(),
                    reason: format!(
                        "brokered: the sandbox gets a placeholder (credential `{}`)",
                        c.name.value
                    ),
                });
            }
        }
        if !proxied {
            continue;
        }
        let (file, line) = loc_line(cx, c.loc);
        let rules = |list: &[crate::config::Spanned<String>]| {
            list.iter()
                .map(|r| {
                    let (file, line) = loc_line(cx, r.loc);
                    (r.value.clone(), format!("{file}:{line}"))
                })
                .collect::<Vec<_>>()
        };
        let allow_requests = rules(&c.allow_requests);
        let deny_requests = rules(&c.deny_requests);
        out.push(plan::Credential {
            name: c.name.value.clone(),
            env: var.value.clone(),
            source: from.value.clone(),
            hosts,
            allow_requests,
            deny_requests,
            header: header.value.to_ascii_lowercase(),
            scheme: c
                .scheme
                .as_ref()
                .and_then(|s| crate::config::credential::Scheme::parse(&s.value))
                .unwrap_or(crate::config::credential::Scheme::Raw),
            at: format!("{file}:{line}"),
        });
    }
    out
}

/// The merged `tools` rules, each with its `file:line` (the reason a refusal gives).
fn tool_policy(cx: &mut Ctx<'_>, t: &crate::config::model::ToolsCfg) -> crate::tools::Policy {
    let mut rules = |list: &[crate::config::Spanned<String>]| {
        let mut out: Vec<crate::tools::Rule> = Vec::new();
        for r in list {
            if out.iter().any(|o| o.rule == r.value) {
                continue; // the first place it was said is the one cited
            }
            if out.len() == crate::tools::MAX_RULES {
                cx.err(
                    r.loc,
                    format!(
                        "more than {} tool rules in one list",
                        crate::tools::MAX_RULES
                    ),
                    "one too many",
                    Some(
                        "deny a tool by its bare name (`Bash`) rather than listing its commands"
                            .into(),
                    ),
                );
                break;
            }
            let (file, line) = loc_line(cx, r.loc);
            out.push(crate::tools::Rule {
                rule: r.value.clone(),
                at: format!("{file}:{line}"),
            });
        }
        out
    };
    crate::tools::Policy {
        allow: rules(&t.allow),
        deny: rules(&t.deny),
        agents: vec![],
    }
}

/// What the configuration files on disk (never the embedded defaults or the presets) expose
/// beyond the defaults that mounts, network and env do not show: unmasking and a moved project
/// root. See [`plan::Plan::exposures`].
fn exposures(cx: &Ctx<'_>, s: &Settings, project: &std::path::Path) -> Vec<String> {
    let on_disk = |loc: Loc| cx.loaded.sources[loc.file].path.is_some();
    let at = |loc: Loc| {
        let (file, line) = loc_line(cx, loc);
        format!("{file}:{line}")
    };
    let mut out = Vec::new();
    for a in s.allow.iter().filter(|a| on_disk(a.loc)) {
        out.push(format!(
            "allow \"{}\": what it matches is not masked (at {})",
            a.value,
            at(a.loc)
        ));
    }
    let layers = [
        (
            &s.secrets.defaults,
            "defaults",
            "the built-in sensitive patterns (.env, keys, …)",
        ),
        (
            &s.secrets.gitignored,
            "gitignored",
            "everything git ignores",
        ),
        (
            &s.secrets.git_crypt,
            "git-crypt",
            "files encrypted with git-crypt",
        ),
    ];
    for (flag, name, what) in layers {
        if let Some(f) = flag.as_ref().filter(|f| !f.value && on_disk(f.loc)) {
            out.push(format!(
                "secrets {{ {name} #false }}: {what} no longer masked (at {})",
                at(f.loc)
            ));
        }
    }
    for u in s.unprotect.iter().filter(|u| on_disk(u.loc)) {
        out.push(format!(
            "unprotect \"{}\": the sandbox may write it, and the host's tools obey it (at {})",
            u.value,
            at(u.loc)
        ));
    }
    for t in s.secrets.tool_dirs.iter().filter(|t| on_disk(t.loc)) {
        out.push(format!(
            "tool-dirs \"{}\": visible although git ignores it (at {})",
            t.value,
            at(t.loc)
        ));
    }
    for d in s.secrets.dependency_dirs.iter().filter(|d| on_disk(d.loc)) {
        out.push(format!(
            "dependency-dirs \"{}\": visible although git ignores it, only credential files masked inside (at {})",
            d.value,
            at(d.loc)
        ));
    }
    // The whole node: where the value goes (header, scheme) and what may be asked with it
    // (the rules) are as much the loosening as its hosts.
    for c in s.credentials.iter().filter(|c| on_disk(c.loc)) {
        let list = |l: &[crate::config::Spanned<String>], none: &str| {
            if l.is_empty() {
                return none.to_string();
            }
            l.iter()
                .map(|r| format!("\"{}\"", r.value))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let hosts: Vec<&str> = c.hosts.iter().map(|h| h.value.as_str()).collect();
        out.push(format!(
            "credential \"{}\": {} added to requests to {} in header {} ({}), ${} inside; allow-request {}; deny-request {} (at {})",
            c.name.value,
            c.from.as_ref().map_or_else(String::new, |f| f.value.to_string()),
            hosts.join(", "),
            c.header.as_ref().map_or("?", |h| h.value.as_str()),
            c.scheme.as_ref().map_or("raw", |s| s.value.as_str()),
            c.env.as_ref().map_or("?", |e| e.value.as_str()),
            list(&c.allow_requests, "(any)"),
            list(&c.deny_requests, "(none)"),
            at(c.loc)
        ));
    }
    // What the host hands the sandbox through its environment.
    let env = &s.env;
    if let Some(i) = env
        .inherit
        .as_ref()
        .filter(|i| i.value == crate::config::model::Inherit::All && on_disk(i.loc))
    {
        out.push(format!(
            "env inherit \"all\": every variable of the caller's environment passed in (at {})",
            at(i.loc)
        ));
    }
    if let Some(f) = env
        .filter_secrets
        .as_ref()
        .filter(|f| !f.value && on_disk(f.loc))
    {
        out.push(format!(
            "env filter-secrets #false: secret-looking variables no longer held back (at {})",
            at(f.loc)
        ));
    }
    for (node, list) in [("pass", &env.pass), ("allow", &env.allow)] {
        for n in list.iter().filter(|n| on_disk(n.loc)) {
            out.push(format!(
                "env {node} \"{}\": the caller's value passed in (at {})",
                n.value,
                at(n.loc)
            ));
        }
    }
    for (file, keys) in env.from_file.iter().filter(|(f, _)| on_disk(f.loc)) {
        let keys: Vec<&str> = keys.iter().map(|k| k.value.as_str()).collect();
        out.push(format!(
            "env from-file \"{}\": {} passed in from it, masked or not (at {})",
            file.value,
            keys.join(", "),
            at(file.loc)
        ));
    }
    for t in s.tools.allow.iter().filter(|t| on_disk(t.loc)) {
        out.push(format!(
            "tools allow \"{}\": the agent may call it without asking (at {})",
            t.value,
            at(t.loc)
        ));
    }
    if let Some(r) = s.project.root.as_ref().filter(|r| on_disk(r.loc)) {
        let base = cx.loaded.base_dir();
        let base = base.canonicalize().unwrap_or(base);
        let top = crate::git::discover(&base)
            .args(["rev-parse", "--show-toplevel"])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| std::path::PathBuf::from(String::from_utf8_lossy(&o.stdout).trim_end()));
        if project != base && top.as_deref() != Some(project) {
            out.push(format!(
                "project root {}: beyond the configuration's own directory (at {})",
                project.display(),
                at(r.loc)
            ));
        }
    }
    out
}

fn loc_line(cx: &Ctx<'_>, loc: Loc) -> (String, usize) {
    let f = &cx.loaded.sources[loc.file];
    (f.name.clone(), f.line_col(loc.span.offset()).0)
}
