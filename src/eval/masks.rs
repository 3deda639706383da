//! Path patterns for `block`, `allow` and `secrets tool-dirs`, and the built-in sensitive sets.
//!
//! The pattern syntax is the configuration's: see [`crate::config::pattern`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use globset::{GlobSet, GlobSetBuilder};

use super::host::Scope;
use super::plan::{LiveRules, Mask};
use super::{scan, sha_hex, Ctx, EvalError};
use crate::config::model::HomeMode;
use crate::config::pattern::{glob_for, is_outside};
use crate::config::{ConfigErrors, Spanned};

/// Seed 000 / seed 002: never readable inside, wherever they are in the project.
pub const DEFAULT_SENSITIVE: &[&str] = &[
    ".env",
    ".env.*",
    ".envrc",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.keystore",
    "*.jks",
    "*credentials*",
    "*secret*",
    ".aws/",
    ".ssh/",
    ".gnupg/",
    ".netrc",
    ".git-credentials",
    ".npmrc",
    ".pypirc",
    ".docker/",
    ".kube/",
    "id_rsa",
    "id_ed25519",
    "id_ecdsa",
    "id_dsa",
    "*.tfvars",
    "*.tfstate",
    ".vault-token",
];

/// Dirs that are gitignored by convention but needed by agents to work (seed 000's
/// GLOBAL_TOOL_ALLOWLIST): exempt from the gitignored layer, still subject to the others.
pub const DEFAULT_TOOL_DIRS: &[&str] = &[
    ".claude/",
    ".codex/",
    ".aider*",
    ".continue/",
    ".opencode/",
    ".gemini/",
    "CLAUDE.md",
    "AGENTS.md",
];

/// Paths under `$HOME` masked when the home is visible (`home "ro"` / `home "overlay"`).
pub const HOME_SENSITIVE: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".netrc",
    ".git-credentials",
    ".docker/config.json",
    ".kube",
    ".config/gcloud",
    ".config/gh/hosts.yml",
    ".azure",
    ".password-store",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials.toml",
    ".cargo/credentials",
    ".vault-token",
    ".bash_history",
    ".zsh_history",
    ".local/share/fish/fish_history",
    ".config/op",
    ".local/share/keyrings",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".terraform.d/credentials.tfrc.json",
    // The agents' own logins (their refresh tokens): Claude Code's, Codex's, Gemini CLI's
    // (Google OAuth, its keychain fallback, its MCP servers' tokens) and OpenCode's (every
    // provider's key or OAuth login).
    ".claude/.credentials.json",
    // Claude Code's backups of ~/.claude.json, with the API key a console login saved there.
    ".claude/backups",
    ".codex/auth.json",
    ".gemini/oauth_creds.json",
    ".gemini/gemini-credentials.json",
    ".gemini/mcp-oauth-tokens.json",
    ".local/share/opencode/auth.json",
    ".gemini/.env",
    // Aider's OpenRouter login.
    ".aider/oauth-keys.env",
];

/// The end of the rule of a mask whose attempts are not reported: one over a home credential
/// file the host does not have yet (an agent's login not made: it guards against one made
/// while the sandbox runs), or over what an agent reads in its normal use ([`QUIET_HOME`]).
/// The agent looks for its login at every start and lists its backups at every save of its
/// configuration: telling the audit log and the model each time would drown what matters.
pub const UNREPORTED: &str = " (attempts not reported)";

/// Home credential paths an agent touches in its normal use, masked without reports.
pub const QUIET_HOME: &[&str] = &[".claude/backups"];

/// The rule of the mask over the home credential path `rel`.
pub fn home_rule(rel: &str) -> String {
    let quiet = if QUIET_HOME.contains(&rel) {
        UNREPORTED
    } else {
        ""
    };
    format!("home \"~/{rel}\"{quiet}")
}

/// Home files an agent preset copies in whole that keep a credential in a top-level JSON field:
/// the private copy loses those fields (Claude Code keeps an API key a console login saved in
/// `~/.claude.json`'s `primaryApiKey`).
pub const HOME_SENSITIVE_FIELDS: &[(&str, &[&str])] = &[(".claude.json", &["primaryApiKey"])];

/// A compiled set of project-relative patterns that remembers which pattern matched.
#[derive(Debug, Clone)]
pub struct PatternSet {
    /// Compiled on first use: a run whose project scan comes from the cache never matches
    /// anything, and compiling the defaults costs ~0.1 ms.
    set: std::sync::OnceLock<GlobSet>,
    patterns: Vec<String>,
    dir_only: Vec<bool>,
}

impl PatternSet {
    /// Outside-the-project patterns are skipped here (they are resolved as literal paths by
    /// the evaluator). Patterns must have passed [`crate::config::pattern::validate`].
    pub fn new<'a>(patterns: impl IntoIterator<Item = &'a str>) -> PatternSet {
        let mut kept = Vec::new();
        let mut dir_only = Vec::new();
        for p in patterns {
            if is_outside(p) || glob_for(p).is_err() {
                continue;
            }
            kept.push(p.to_string());
            dir_only.push(p.ends_with('/'));
        }
        PatternSet {
            set: std::sync::OnceLock::new(),
            patterns: kept,
            dir_only,
        }
    }

    fn set(&self) -> &GlobSet {
        self.set.get_or_init(|| {
            let mut b = GlobSetBuilder::new();
            for p in &self.patterns {
                if let Ok(g) = glob_for(p) {
                    b.add(g);
                }
            }
            b.build().unwrap_or_else(|_| GlobSet::empty())
        })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The first pattern matching `rel` (a `/`-separated path relative to the project, as
    /// raw bytes: a name that is not UTF-8 is matched as it is, never under another name).
    /// The patterns, as written.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// For each pattern, whether it matches directories only (`dir/`).
    pub fn dir_only(&self) -> &[bool] {
        &self.dir_only
    }

    pub fn matching(&self, rel: &(impl AsRef<[u8]> + ?Sized), is_dir: bool) -> Option<&str> {
        if self.patterns.is_empty() {
            return None;
        }
        let rel =
            Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(rel.as_ref()));
        self.set()
            .matches(rel)
            .into_iter()
            .find(|&i| is_dir || !self.dir_only[i])
            .map(|i| self.patterns[i].as_str())
    }

    /// Does `rel` or one of its ancestor directories match?
    pub fn covers(&self, rel: &(impl AsRef<[u8]> + ?Sized), is_dir: bool) -> Option<&str> {
        let rel = rel.as_ref();
        for (i, c) in rel.iter().enumerate() {
            if *c == b'/' {
                if let Some(p) = self.matching(&rel[..i], true) {
                    return Some(p);
                }
            }
        }
        self.matching(rel, is_dir)
    }
}

/// What the masks section resolves: the masks, the live layer's rules, the project scan.
pub(super) struct Resolved {
    pub masks: Vec<Mask>,
    pub live: LiveRules,
    pub scanned: scan::ScanResult,
    /// The scan's cache, when it made a new one.
    pub memos: Vec<super::plan::Memo>,
}

/// The masks: the project scanned by the block/allow/tool-dir patterns (and, by default,
/// gitignored and git-crypt files), the home's sensitive paths, the paths `block` names outside
/// the project; the rules the live layer keeps applying while the sandbox runs.
pub(super) fn resolve(
    cx: &mut Ctx<'_>,
    sc: &Scope<'_>,
    home_mode: HomeMode,
) -> Result<Resolved, EvalError> {
    let (s, host, req, project) = (sc.s, sc.host, sc.req, &sc.project);
    let home = &host.home;
    let path = |cx: &mut Ctx<'_>, v: &Spanned<String>| sc.path(cx, v);
    let defaults = s.secrets.defaults.as_ref().is_none_or(|b| b.value);
    let mut block_patterns: Vec<String> = Vec::new();
    let mut explicit: BTreeSet<String> = BTreeSet::new();
    let mut outside: Vec<(PathBuf, String)> = Vec::new();
    for b in &s.block {
        if crate::config::pattern::is_outside(&b.value) {
            if let Some(p) = path(cx, b) {
                outside.push((p, format!("block \"{}\"", b.value)));
            }
        } else {
            block_patterns.push(b.value.clone());
            explicit.insert(b.value.clone());
        }
    }
    if defaults {
        block_patterns.extend(DEFAULT_SENSITIVE.iter().map(|s| s.to_string()));
    }
    let allow_patterns: Vec<&str> = s.allow.iter().map(|a| a.value.as_str()).collect();
    let tool_patterns: Vec<&str> = DEFAULT_TOOL_DIRS
        .iter()
        .copied()
        .chain(s.secrets.tool_dirs.iter().map(|t| t.value.as_str()))
        .collect();
    if !cx.errors.is_empty() {
        return Err(ConfigErrors::new(std::mem::take(&mut cx.errors.list)).into());
    }
    let tool_set = PatternSet::new(tool_patterns.iter().copied());
    let dep_patterns: Vec<&str> = super::deps::DEFAULT_DEPENDENCY_DIRS
        .iter()
        .copied()
        .chain(s.secrets.dependency_dirs.iter().map(|t| t.value.as_str()))
        .collect();
    let not_dep_patterns: Vec<&str> = s
        .secrets
        .not_dependency_dirs
        .iter()
        .map(|t| t.value.as_str())
        .collect();
    // Inside dependency directories: the project's own `block` list, and credential files
    // instead of the broad built-in globs.
    let mut dep_block_patterns: Vec<&str> = s
        .block
        .iter()
        .map(|b| b.value.as_str())
        .filter(|p| !crate::config::pattern::is_outside(p))
        .collect();
    if defaults {
        // Pushed one by one: each `&'static str` shortens to the list's lifetime.
        for p in super::deps::dependency_sensitive() {
            dep_block_patterns.push(p);
        }
    }
    let roles = super::deps::RoleRules {
        deps: PatternSet::new(dep_patterns.iter().copied()),
        caches: PatternSet::new(super::deps::DEFAULT_CACHE_DIRS.iter().copied()),
        not_deps: PatternSet::new(not_dep_patterns.iter().copied()),
        dep_block: PatternSet::new(dep_block_patterns.iter().copied()),
        roots: Vec::new(),
    };
    let mut live = LiveRules {
        block: PatternSet::new(block_patterns.iter().map(String::as_str)),
        allow: PatternSet::new(allow_patterns.iter().copied()),
        explicit,
        since: std::time::SystemTime::now(),
        roles,
    };
    let gitignored = s.secrets.gitignored.as_ref().is_none_or(|b| b.value);
    let git_crypt = s.secrets.git_crypt.as_ref().is_none_or(|b| b.value);
    let block_rule = |p: &str| live.rule_name(p);
    let key = sha_hex(
        serde_json::to_string(&(
            &block_patterns,
            &allow_patterns,
            &tool_patterns,
            &dep_patterns,
            &not_dep_patterns,
            &dep_block_patterns,
            gitignored,
            git_crypt,
            "v2",
        ))
        .unwrap_or_default()
        .as_bytes(),
    );
    let rules = scan::ScanRules {
        block: &live.block,
        block_rule: &block_rule,
        allow: &live.allow,
        tool_dirs: &tool_set,
        roles: &live.roles,
        gitignored,
        git_crypt,
        key,
    };
    let cache_dir = req
        .use_cache
        .then(|| host.cache_home().join("aisb").join("scan"));
    let mut memos = Vec::new();
    let scanned = scan::scan(project, &rules, cache_dir.as_deref(), &mut memos)?;
    live.roles.roots = scanned.roles.iter().map(|r| r.rel.clone()).collect();
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
        for rel in HOME_SENSITIVE {
            let p = home.join(rel);
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                mask_list.push(Mask {
                    dir: m.is_dir(),
                    path: p,
                    rule: home_rule(rel),
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
    Ok(Resolved {
        masks: mask_list,
        live,
        scanned,
        memos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unanchored_patterns_match_at_any_depth() {
        let s = PatternSet::new([".env", "*.pem", ".aws/"]);
        assert_eq!(s.matching(".env", false), Some(".env"));
        assert_eq!(s.matching("deep/er/.env", false), Some(".env"));
        assert_eq!(s.matching("certs/x.pem", false), Some("*.pem"));
        assert_eq!(s.matching("a/.aws", true), Some(".aws/"));
        assert_eq!(
            s.matching("a/.aws", false),
            None,
            "dir-only pattern must not match a file"
        );
        assert_eq!(s.matching(".envx", false), None);
    }

    #[test]
    fn anchored_patterns_and_separators() {
        let s = PatternSet::new(["config/*.yml", "./top.txt"]);
        assert_eq!(s.matching("config/prod.yml", false), Some("config/*.yml"));
        assert_eq!(
            s.matching("config/sub/prod.yml", false),
            None,
            "* must not cross /"
        );
        assert_eq!(
            s.matching("sub/config/prod.yml", false),
            None,
            "anchored at the root"
        );
        assert_eq!(s.matching("top.txt", false), Some("./top.txt"));
        assert_eq!(s.matching("a/top.txt", false), None);
    }

    #[test]
    fn covers_checks_ancestors() {
        let s = PatternSet::new([".ssh/"]);
        assert_eq!(s.covers("home/.ssh/id_ed25519", false), Some(".ssh/"));
        assert_eq!(s.covers("home/ssh/id", false), None);
    }
}

/// Where a sandbox's state records what its last evaluation masked in the project.
pub const KEPT_FILE: &str = "masked-before";

/// Masks never weaken because of what a sandbox wrote: a `!secret` line in a nested
/// `.gitignore`, a secret staged as tracked, a `.gitattributes` edit all change what the rules
/// mask, and all can be written inside. So what an earlier evaluation of this sandbox masked
/// in the project stays masked while it exists, whatever the rules say now, until the user
/// approves unmasking it (`aisb trust` drops the record). Adds those masks to `masks` and
/// returns their paths; the new record (everything masked now) goes to `memos`.
pub(super) fn keep(
    sc: &super::host::Scope<'_>,
    masks: &mut Vec<Mask>,
    memos: &mut Vec<super::plan::Memo>,
) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let record = sc.state_dir.join(KEPT_FILE);
    let project = &sc.project;
    // Below the project, as bytes (masks are absolute and normal: a byte prefix is a path
    // prefix when a `/` follows it, and much cheaper than comparing components).
    fn rel_of<'a>(project: &Path, p: &'a Path) -> Option<&'a [u8]> {
        let project = project.as_os_str().as_bytes();
        let rest = p.as_os_str().as_bytes().strip_prefix(project)?;
        match rest {
            [] => Some(rest),
            [b'/', r @ ..] => Some(r),
            _ if project.ends_with(b"/") => Some(rest),
            _ => None,
        }
    }
    let now: std::collections::HashSet<&[u8]> = masks
        .iter()
        .filter_map(|m| rel_of(project, &m.path))
        .collect();
    let mut kept = Vec::new();
    let before = crate::beneath::read(&sc.state_dir, Path::new(KEPT_FILE), 64 << 20)
        .ok()
        .flatten();
    if let Some(bytes) = &before {
        for rel in bytes.split(|b| *b == 0).filter(|r| !r.is_empty()) {
            if now.contains(rel) {
                continue;
            }
            let rel = Path::new(std::ffi::OsStr::from_bytes(rel));
            if rel.is_absolute()
                || rel
                    .components()
                    .any(|c| c == std::path::Component::ParentDir)
            {
                continue;
            }
            let path = project.join(rel);
            // Gone: nothing to hide. A link is never masked (what it names has its own rule).
            let Ok(md) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if md.file_type().is_symlink() {
                continue;
            }
            kept.push(Mask {
                path: path.clone(),
                dir: md.is_dir(),
                rule: "kept: masked in an earlier run; `aisb trust` approves unmasking it".into(),
            });
        }
    }
    let paths: Vec<std::path::PathBuf> = kept.iter().map(|m| m.path.clone()).collect();
    if !kept.is_empty() {
        masks.extend(kept);
        masks.sort_by(|a, b| a.path.cmp(&b.path));
        masks.dedup_by(|a, b| a.path == b.path);
    }
    let mut bytes = Vec::new();
    for m in masks.iter() {
        if let Some(rel) = rel_of(project, &m.path).filter(|r| !r.is_empty()) {
            bytes.extend_from_slice(rel);
            bytes.push(0);
        }
    }
    if before.as_ref() != Some(&bytes) {
        memos.push(super::plan::Memo {
            path: record,
            bytes,
        });
    }
    paths
}
