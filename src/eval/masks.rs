//! Path patterns for `block`, `allow` and `secrets tool-dirs`, and the built-in sensitive sets.
//!
//! The pattern syntax is the configuration's: see [`crate::config::pattern`].

use std::path::Path;

use globset::{GlobSet, GlobSetBuilder};

use crate::config::pattern::{glob_for, is_outside};

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
    ".claude/.credentials.json",
    ".codex/auth.json",
];

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
