//! Files have roles, and some of them are policy: aisb's own configuration, and the files the
//! host's tools run or obey — an editor's tasks and settings, direnv's `.envrc`, git's
//! `.gitmodules`, the hook managers' configuration, toolchain files, the agents' settings and
//! commands. Whatever the sandbox writes there would act on the host the next time the user
//! opens the editor, enters the directory, commits, or starts an agent. So inside a project
//! written in place they are read-only: each that exists is bound read-only over itself (an
//! agent's local settings, which the agent writes when told "always allow", are a private copy
//! instead). One that does not exist yet cannot be bound without creating it on the host; the
//! runtime moves any the sandbox created aside when the run ends (or at the next start, after
//! a crash), into the sandbox's state, and says so ([`crate::runtime::protect`]).

use std::path::{Path, PathBuf};

use super::host::Scope;
use super::plan::{Mount, MountKind, ProjectDirs, Protected};
use crate::config::model::Access;

/// How a protected file's mount starts its `why`.
pub const PROTECT: &str = "protected:";

/// Whether `m` is one of the mounts [`resolve`] makes.
pub fn is_protect_mount(m: &Mount) -> bool {
    m.why.starts_with(PROTECT)
}

/// Project-relative paths and what obeys each. A trailing `/`: a directory.
pub const PROTECTED: &[(&str, &str)] = &[
    // aisb's own policy (the files a configuration imports are added by the evaluator).
    ("sandbox.kdl", "aisb's policy"),
    ("sandbox.lock", "aisb's image pins"),
    // Editors.
    (".vscode/", "VS Code runs its tasks and obeys its settings"),
    (".idea/", "JetBrains IDEs run its run configurations"),
    (
        ".devcontainer/",
        "editors build and start the container it describes",
    ),
    (".zed/", "Zed runs its tasks and obeys its settings"),
    (
        ".devcontainer.json",
        "editors build and start the container it describes",
    ),
    (
        ".cursor/",
        "Cursor runs its rules, MCP servers and settings",
    ),
    (".helix/", "Helix obeys its settings and language servers"),
    (".nvim.lua", "Neovim runs it (exrc)"),
    (".exrc", "Vim and Neovim run it (exrc)"),
    // Files host tools load from the working directory: a `.env` made inside would set an
    // API base URL for aider or bun on the host (one that exists is masked, and read-only).
    (".env", "aider, bun, docker compose and others load it"),
    (".env.local", "frameworks' dev servers load it"),
    // Shells and git.
    (".envrc", "direnv runs it on cd"),
    (".bashrc", "a shell sources it"),
    (".bash_profile", "a shell sources it"),
    (".zshrc", "a shell sources it"),
    (".profile", "a shell sources it"),
    (".gitmodules", "git clones what it names"),
    (".lfsconfig", "git-lfs obeys it"),
    (".gitattributes", "git runs the filters it names"),
    // Hook managers.
    (".husky/", "husky's git hooks run on commit"),
    (".lefthook.yml", "lefthook's hooks run on commit"),
    ("lefthook.yml", "lefthook's hooks run on commit"),
    ("lefthook.yaml", "lefthook's hooks run on commit"),
    ("lefthook.json", "lefthook's hooks run on commit"),
    ("lefthook.toml", "lefthook's hooks run on commit"),
    ("lefthook-local.yml", "lefthook's hooks run on commit"),
    (
        ".pre-commit-config.yaml",
        "pre-commit's hooks run on commit",
    ),
    // Toolchains the host obeys in this directory.
    (".cargo/config.toml", "cargo runs what it configures"),
    (".cargo/config", "cargo runs what it configures"),
    (
        "rust-toolchain.toml",
        "rustup installs and runs what it names",
    ),
    ("rust-toolchain", "rustup installs and runs what it names"),
    (".yarnrc.yml", "yarn runs the plugins it names"),
    (".yarnrc", "yarn obeys it"),
    (".pnpmfile.cjs", "pnpm runs it on install"),
    (".npmrc", "npm obeys it"),
    ("bunfig.toml", "bun runs what it configures"),
    ("gradle.properties", "Gradle obeys it"),
    (
        "gradle/wrapper/gradle-wrapper.jar",
        "the Gradle wrapper runs it",
    ),
    (
        ".mvn/wrapper/maven-wrapper.jar",
        "the Maven wrapper runs it",
    ),
    (".mvn/jvm.config", "Maven passes it to the JVM"),
    (".mvn/maven.config", "Maven obeys it"),
    (".yarn/releases/", "yarn runs the release .yarnrc.yml names"),
    (".yarn/plugins/", "yarn runs the plugins .yarnrc.yml names"),
    (
        "gradle/wrapper/gradle-wrapper.properties",
        "the Gradle wrapper downloads what it names",
    ),
    (
        ".mvn/wrapper/maven-wrapper.properties",
        "the Maven wrapper downloads what it names",
    ),
    (".mvn/extensions.xml", "Maven loads the extensions it names"),
    ("mise.toml", "mise installs and runs what it names"),
    (".mise.toml", "mise installs and runs what it names"),
    (".tool-versions", "asdf and mise install what it names"),
    // Agents: settings, hooks, commands, MCP servers (all five presets).
    (".mcp.json", "agents start the MCP servers it names"),
    (
        ".claude/settings.json",
        "Claude Code's permissions and hooks",
    ),
    (".claude/commands/", "Claude Code's commands"),
    (".claude/agents/", "Claude Code's subagents"),
    (".claude/hooks/", "Claude Code's hooks"),
    (".claude/skills/", "Claude Code's skills"),
    (".codex/", "Codex's configuration"),
    (".gemini/", "Gemini CLI's settings"),
    ("opencode.json", "OpenCode's configuration"),
    ("opencode.jsonc", "OpenCode's configuration"),
    (".opencode/", "OpenCode's agents, commands and plugins"),
    (".aider.conf.yml", "aider's configuration"),
    (".aider.model.settings.yml", "aider's model settings"),
    (".opencode.json", "OpenCode's configuration"),
];

/// Protected below the top only: a git repository inside the project (a vendored clone, a
/// submodule's checkout). The host's git obeys its configuration and hooks in that directory;
/// the project's own `.git` at the top is its git layer's (`crate::git`).
pub const BELOW_ONLY: &[(&str, &str)] = &[(
    ".git/",
    "the host's git obeys a repository's configuration and hooks",
)];

/// Whether `name` (one path component) starts a protected name (`.cargo` of
/// `.cargo/config.toml`, `.vscode`): a link the sandbox makes under such a name could put a
/// protected file where the host's tool looks through it (`ln -s . sub/.cargo`).
pub fn starts_a_name(name: &[u8]) -> bool {
    PROTECTED
        .iter()
        .chain(BELOW_ONLY)
        .chain(PRIVATE)
        .any(|(n, _)| n.trim_end_matches('/').split('/').next().map(str::as_bytes) == Some(name))
}

/// Whether the project-relative `rel` (`/`-separated, raw bytes) is, or is inside, a protected
/// file or directory below the project's top: the host's tools look for these from the
/// directory they run in upwards (direnv's `.envrc` on `cd sub`, cargo's `.cargo/config.toml`,
/// npm's `.npmrc` in a workspace package, a nested `.gitattributes`, a `sandbox.kdl` found by
/// `cd sub; aisb run`, an editor opened on a subdirectory). Returns the protected path's
/// length in `rel` (shorter than `rel` when `rel` is inside a protected directory), whether it
/// is a directory, and what obeys it. Names at the top are [`PROTECTED`]'s own (`resolve`).
pub fn nested(rel: &[u8]) -> Option<(usize, bool, &'static str)> {
    type ByFirst =
        std::collections::HashMap<&'static [u8], Vec<(&'static [u8], bool, &'static str)>>;
    // By first component: one hash lookup per component of every file of a cold scan.
    static BY_FIRST: std::sync::LazyLock<ByFirst> = std::sync::LazyLock::new(|| {
        let mut m = ByFirst::new();
        for (name, why) in PROTECTED.iter().chain(BELOW_ONLY) {
            let (name, dir) = match name.strip_suffix('/') {
                Some(n) => (n.as_bytes(), true),
                None => (name.as_bytes(), false),
            };
            let first = name.split(|b| *b == b'/').next().unwrap_or(name);
            m.entry(first).or_default().push((name, dir, *why));
        }
        m
    });
    let mut start = 0;
    // Each component after the first may start a protected name.
    while let Some(i) = rel[start..].iter().position(|b| *b == b'/') {
        start += i + 1;
        let tail = &rel[start..];
        let first = tail.split(|b| *b == b'/').next().unwrap_or(tail);
        let Some(candidates) = BY_FIRST.get(first) else {
            continue;
        };
        for &(name, dir, why) in candidates {
            if !tail.starts_with(name) {
                continue;
            }
            let exact = tail.len() == name.len();
            if exact || (dir && tail[name.len()] == b'/') {
                return Some((start + name.len(), dir, why));
            }
        }
    }
    None
}

/// What `unprotect "REL"` names, when it names a protected file or directory the sandbox may
/// then write: one of [`PROTECTED`] or [`PRIVATE`] at the top, or a protected name below it
/// (`sub/.envrc`). Else why not. aisb's own policy is never opened.
///
/// Below the top, files only: a protected directory there (`pkg/.vscode/`) may hold other
/// protected names, which the check below the top finds by their outermost name alone.
/// Never a git repository's `.git` (the host's git would run what its configuration names).
pub fn openable(rel: &str) -> Result<(), &'static str> {
    let rel = rel.trim_end_matches('/');
    let base = rel.rsplit('/').next().unwrap_or(rel);
    if matches!(base, "sandbox.kdl" | "sandbox.lock") {
        return Err("aisb's own policy is never writable inside: edit it outside the sandbox");
    }
    if rel.split('/').any(|c| c == ".git") {
        return Err(
            "a git repository's configuration and hooks run on the host: never writable inside",
        );
    }
    let top = PROTECTED
        .iter()
        .chain(PRIVATE)
        .any(|(name, _)| name.trim_end_matches('/') == rel);
    if top {
        return Ok(());
    }
    match nested(rel.as_bytes()) {
        Some((len, false, _)) if len == rel.len() => Ok(()),
        Some((len, true, _)) if len == rel.len() => Err(
            "a protected directory below the top cannot be opened (it may hold other protected files): name the files in it instead",
        ),
        _ => Err("not a file the host's tools run or obey: only those are protected"),
    }
}

/// Written by the agent itself (an "always allow" answer): a private copy inside, never the
/// host's file.
pub const PRIVATE: &[(&str, &str)] = &[(
    ".claude/settings.local.json",
    "Claude Code's local permissions",
)];

/// The read-only binds and private copies for the protected files that exist, and the list of
/// those that do not (the runtime's to check after the run). Nothing when the project is not
/// written in place. `imports`: the other files aisb reads as policy (imported configuration,
/// the Dockerfile `rootfs` names), by host path, and what reads each. A path another mount
/// already covers (a dependency directory, an agent preset's own mount) or that a mask hides
/// is left to that.
pub(super) fn resolve(
    sc: &Scope<'_>,
    imports: &[(PathBuf, &str)],
    nested_found: &[super::scan::Nested],
    mounts: &[Mount],
    masked: &dyn Fn(&Path) -> bool,
    opened: &[PathBuf],
) -> (Vec<Mount>, Vec<Protected>, Vec<PathBuf>) {
    if sc.read_only || sc.project_access != Access::Rw {
        return (Vec::new(), Vec::new(), Vec::new());
    }
    let project = &sc.project;
    // Mounts below the project (those above it, such as a private /tmp, hold it whole).
    let covered = |p: &Path| {
        masked(p)
            || mounts.iter().any(|m| {
                m.target != *project
                    && m.target.starts_with(project)
                    && (p.starts_with(&m.target) || m.target.starts_with(p))
            })
    };
    let mut out = Vec::new();
    let mut absent = Vec::new();
    let listed = PROTECTED
        .iter()
        .map(|(rel, why)| {
            (
                project.join(rel.trim_end_matches('/')),
                rel.ends_with('/'),
                why.to_string(),
                Place::Top,
            )
        })
        .chain(
            PRIVATE
                .iter()
                .map(|(rel, why)| (project.join(rel), false, why.to_string(), Place::Private)),
        )
        .chain(
            imports
                .iter()
                .filter(|(p, _)| p.starts_with(project))
                .map(|(p, why)| (p.clone(), false, why.to_string(), Place::Top)),
        )
        .chain(nested_found.iter().filter_map(|n| {
            use std::os::unix::ffi::OsStrExt;
            let (_, _, why) = nested(&n.rel)?;
            Some((
                project.join(std::ffi::OsStr::from_bytes(&n.rel)),
                n.dir,
                why.to_string(),
                Place::Below,
            ))
        }));
    // Protected names below the top that a mask or another mount covers: the sandbox cannot
    // replace them, so the run's end must not take them for its own.
    let mut kept = Vec::new();
    // Opened by `unprotect` (imports stay aisb's policy whatever it says).
    let listed = listed
        .filter(|(path, ..)| !opened.contains(path) || imports.iter().any(|(p, _)| p == path));
    for (path, dir, why, place) in listed {
        if covered(&path) {
            if place == Place::Below {
                kept.push(path);
            }
            continue;
        }
        match std::fs::symlink_metadata(&path) {
            // A link is never bound over (the bind would follow it); it is the user's, or, made
            // by a sandbox, moved aside like any other protected file it creates.
            Ok(md) if md.file_type().is_symlink() => continue,
            Ok(md) if place == Place::Private && md.is_file() => out.push(Mount {
                target: path.clone(),
                kind: MountKind::Copy {
                    source: path.clone(),
                    copy: sc
                        .state_dir
                        .join("protected")
                        .join(super::mounts::slug(&path)),
                },
                why: format!("{PROTECT} {why}, written to a private copy"),
            }),
            Ok(_) => out.push(Mount {
                target: path.clone(),
                kind: MountKind::Bind {
                    source: path.clone(),
                    writable: false,
                },
                why: format!("{PROTECT} {why}, read-only"),
            }),
            Err(_) => absent.push(Protected { path, dir, why }),
        }
    }
    (out, absent, kept)
}

/// Where the run's end looks for protected names the sandbox made below the top
/// (`runtime::protect`): the scan's directories written in place, and those it never walks,
/// whose writes stay in a layer of the sandbox's own (dependency and cache directories, masked
/// directories, a git directory inside the project). Nothing when the project is not written
/// in place, or under `AISB_TEST_BREAK_ISOLATION=policy-below` (a test of the tests, and the
/// benchmark's way to show the check's cost).
pub(super) fn below_top(
    sc: &Scope<'_>,
    scanned: &super::scan::ScanResult,
    git_dir: Option<&Path>,
    opened: &[PathBuf],
) -> ProjectDirs {
    let env = super::BREAK_ISOLATION_ENV;
    if std::env::var(env).as_deref() == Ok("policy-below") {
        eprintln!(
            "aisb: WARNING: {env}=policy-below: files the host obeys that this sandbox makes below the project's top stay there (a test of the tests)"
        );
        return ProjectDirs::default();
    }
    if sc.read_only || sc.project_access != Access::Rw {
        return ProjectDirs::default();
    }
    let skip: Vec<Vec<u8>> = scanned
        .roles
        .iter()
        .map(|r| r.rel.clone())
        .chain(
            scanned
                .masks
                .iter()
                .filter(|m| m.dir)
                .map(|m| m.rel.clone()),
        )
        .chain(
            git_dir
                .and_then(|g| g.strip_prefix(&sc.project).ok())
                .map(|r| r.as_os_str().as_encoded_bytes().to_vec())
                .filter(|r| !r.is_empty()),
        )
        .collect();
    ProjectDirs {
        dirs: scanned
            .dirs
            .iter()
            .filter(|(d, _)| !skip.iter().any(|r| d == r || super::scan::below(d, r)))
            .cloned()
            .collect(),
        skip,
        opened: opened
            .iter()
            .filter_map(|p| p.strip_prefix(&sc.project).ok())
            .map(|r| r.as_os_str().as_encoded_bytes().to_vec())
            .collect(),
    }
}

/// Where a protected file of `resolve`'s list is: one at the top (bound read-only), the agent's
/// own settings (a private copy), or one below the top (bound read-only; kept by the run's
/// end when a mask covers it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Top,
    Private,
    Below,
}

#[cfg(test)]
mod tests {
    use super::nested;

    #[test]
    fn nested_names_are_found_below_the_top_only() {
        let hit = |rel: &'static str| nested(rel.as_bytes()).map(move |(n, d, _)| (&rel[..n], d));
        assert_eq!(hit("sub/.envrc"), Some(("sub/.envrc", false)));
        assert_eq!(
            hit("a/b/.cargo/config.toml"),
            Some(("a/b/.cargo/config.toml", false))
        );
        assert_eq!(hit("pkg/.vscode/tasks.json"), Some(("pkg/.vscode", true)));
        assert_eq!(hit("pkg/.vscode"), Some(("pkg/.vscode", true)));
        assert_eq!(hit("packages/x/.npmrc"), Some(("packages/x/.npmrc", false)));
        assert_eq!(hit("sub/sandbox.kdl"), Some(("sub/sandbox.kdl", false)));
        // The top is `resolve`'s; look-alikes are not protected.
        assert_eq!(hit(".envrc"), None);
        assert_eq!(hit(".vscode/tasks.json"), None);
        assert_eq!(hit("sub/.envrc.bak"), None);
        assert_eq!(hit("sub/x.envrc"), None);
        assert_eq!(hit("sub/.vscodeX/a"), None);
        assert_eq!(hit("sub/.cargo/other.toml"), None);
        assert_eq!(hit("sub/"), None);
        // A repository below the top is policy; the project's own is its git layer's.
        assert_eq!(
            hit("vendor/lib/.git/config"),
            Some(("vendor/lib/.git", true))
        );
        assert_eq!(hit(".git/config"), None);
        assert!(super::starts_a_name(b".cargo") && super::starts_a_name(b".git"));
        assert!(!super::starts_a_name(b"src"));
    }
}
