//! Files have roles. Dependency and build-output directories (`node_modules/`, `.venv/`,
//! `target/`, …) are the project's, not its secrets: git ignores them because they are
//! reproducible, not because they are private. So they are exempt from the gitignored layer,
//! and inside them only credential files are masked (a library's `credentials.py` or
//! `secret_key.rs` is code the project imports). The host runs what is in them (an editor's
//! `.venv/bin/python`, a hook's `node_modules/.bin`, build scripts under `target/`), so the
//! sandbox writes them copy-on-write: its `npm install` or build lands in its own layer.
//!
//! Directories that hold state with secrets (`.terraform/`, `.bundle/` with its registry
//! credentials, `.vercel/`, `.serverless/`) are deliberately not in the list: ignored, they
//! stay masked.

use std::path::Path;

use super::host::Scope;
use super::plan::{Mount, MountKind};
use super::scan::{Role, RoleDir};
use crate::config::model::Access;
use crate::eval::masks::PatternSet;

/// Where a dependency directory's copy-on-write layer lives in the sandbox's state
/// (`<state>/deps/<slug>/upper`): the runtime gives a run its own layer when another run holds
/// this one (see [`is_dependency_layer`]).
pub const LAYER_DIR: &str = "deps";

/// How a written-through dependency directory's mount starts its `why` (trust lists it).
pub const WRITE_THROUGH: &str = "dependency dir written in place:";

/// Whether an overlay's upper dir is a dependency directory's layer.
pub fn is_dependency_layer(state_dir: &Path, upper: &Path) -> bool {
    upper.starts_with(state_dir.join(LAYER_DIR))
}

/// The mounts that give each role directory its rule: a dependency directory copy-on-write
/// over the host's (or in place, when `write-through` names it), a cache private and empty.
/// None when the project is not written in place (read-only: the host's content is seen as
/// it is; copy-on-write: the whole project is a layer already).
pub(super) fn mounts(sc: &Scope<'_>, roles: &[RoleDir]) -> Vec<Mount> {
    if sc.read_only || sc.project_access != Access::Rw {
        return Vec::new();
    }
    let through = PatternSet::new(sc.s.secrets.write_through.iter().map(|w| w.value.as_str()));
    let mut out = Vec::new();
    for r in roles {
        let rel = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&r.rel);
        let target = sc.project.join(rel);
        let name = String::from_utf8_lossy(&r.rel);
        if let Some(w) = through.matching(&r.rel, true) {
            // Bound over itself, writable: a loosening that `aisb plan` and trust can see.
            out.push(Mount {
                target: target.clone(),
                kind: MountKind::Bind {
                    source: target,
                    writable: true,
                },
                why: format!("{WRITE_THROUGH} {name}/ (write-through \"{w}\")"),
            });
            continue;
        }
        let (kind, why) = match r.role {
            Role::Dependency => {
                let d = sc
                    .state_dir
                    .join(LAYER_DIR)
                    .join(super::mounts::slug(&target));
                (
                    MountKind::Overlay {
                        lower: target.clone(),
                        upper: d.join("upper"),
                        work: d.join("work"),
                        above: None,
                    },
                    format!(
                        "dependency dir {name}/ (\"{}\"): the host's, written copy-on-write",
                        r.pattern
                    ),
                )
            }
            Role::Cache => (
                MountKind::Tmpfs {
                    size: None,
                    mode: 0o755,
                    owner: Some((sc.identity.uid, sc.identity.gid)),
                },
                format!("cache dir {name}/ (\"{}\"): private and empty", r.pattern),
            ),
        };
        out.push(Mount { target, kind, why });
    }
    out
}

/// Dependency directories a project's manifest says its tools will make, by the manifest's
/// name at the project root. Only names whose ecosystem never commits them: Go's and Ruby's
/// `vendor/` often are committed, so they are not here.
pub const MANIFEST_DIRS: &[(&str, &[&str])] = &[
    ("package.json", &["node_modules"]),
    ("Cargo.toml", &["target"]),
    ("pyproject.toml", &[".venv"]),
    ("setup.py", &[".venv"]),
    ("setup.cfg", &[".venv"]),
    ("requirements.txt", &[".venv"]),
    ("Pipfile", &[".venv"]),
    ("pom.xml", &["target"]),
    ("build.gradle", &["build", ".gradle"]),
    ("build.gradle.kts", &["build", ".gradle"]),
    ("settings.gradle", &["build", ".gradle"]),
    ("settings.gradle.kts", &["build", ".gradle"]),
    ("pubspec.yaml", &[".dart_tool"]),
    ("mix.exs", &["_build", "deps"]),
    ("composer.json", &["vendor"]),
];

/// In a dependency directory's layer dir (`<state>/deps/<slug>/`): the empty directory that
/// is the lower layer of one aisb made on the host ([`absent`]).
pub const EMPTY_LOWER: &str = "empty";
/// Beside it: the record that aisb made the host's directory (its path), so a leftover of a
/// killed run is known as aisb's and removed by a later one.
pub const MADE_RECORD: &str = "made";
/// Beside it: shared-locked by each run that uses the made directory; the last one out
/// (exclusive lock) removes it.
pub const IN_USE_LOCK: &str = "in-use";

/// The dependency directories the project's manifests promise but that do not exist yet (a
/// fresh clone before its first `npm install` or build): each gets a copy-on-write layer over
/// an empty lower directory of aisb's own (never the host's path, which a concurrent sandbox
/// could swap for a link before the runtime resolves it), mounted at an empty directory made
/// on the host for the run and removed after it while still empty (`Plan::made_for_run`).
/// An empty directory aisb made for an earlier run that could not remove it (killed, or
/// another run still used it) is taken the same way, replacing the mount the scan gave it.
/// Without this the sandbox's first install would write the host's `node_modules/.bin`,
/// which the host's hooks run.
pub(super) fn absent(
    sc: &Scope<'_>,
    rules: &RoleRules,
    mounts: &mut Vec<Mount>,
) -> Vec<std::path::PathBuf> {
    let mut made = Vec::new();
    if sc.read_only || sc.project_access != Access::Rw {
        return made;
    }
    let through = PatternSet::new(sc.s.secrets.write_through.iter().map(|w| w.value.as_str()));
    for (manifest, dirs) in MANIFEST_DIRS {
        if std::fs::symlink_metadata(sc.project.join(manifest)).is_err() {
            continue;
        }
        for name in *dirs {
            let target = sc.project.join(name);
            if made.contains(&target) || through.matching(name.as_bytes(), true).is_some() {
                continue;
            }
            let Some((Role::Dependency, pattern)) = rules.role_of(name.as_bytes()) else {
                continue;
            };
            let d = sc
                .state_dir
                .join(LAYER_DIR)
                .join(super::mounts::slug(&target));
            let ours = match std::fs::symlink_metadata(&target) {
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                Ok(m) => {
                    m.is_dir()
                        && std::fs::read_dir(&target).is_ok_and(|mut r| r.next().is_none())
                        && std::fs::read(d.join(MADE_RECORD))
                            .is_ok_and(|r| r == target.as_os_str().as_encoded_bytes())
                }
            };
            if !ours {
                continue;
            }
            mounts.retain(|m| m.target != target);
            mounts.push(Mount {
                target: target.clone(),
                kind: MountKind::Overlay {
                    lower: d.join(EMPTY_LOWER),
                    upper: d.join("upper"),
                    work: d.join("work"),
                above: None,
                },
                why: format!(
                    "dependency dir {name}/ (\"{pattern}\", promised by {manifest}): not there yet, \
                     made empty on the host for the run and written copy-on-write"
                ),
            });
            made.push(target);
        }
    }
    made
}

/// The role patterns, compiled: which directories are dependency or cache directories, and
/// what is masked inside them.
#[derive(Debug, Clone)]
pub struct RoleRules {
    pub deps: PatternSet,
    pub caches: PatternSet,
    /// `not-dependency-dirs`: names neither list may claim.
    pub not_deps: PatternSet,
    /// Masked inside a role directory instead of the `block` set.
    pub dep_block: PatternSet,
    /// The role directories the project scan found (ignored as a whole), project-relative:
    /// only below these is `dep_block` the rule.
    pub roots: Vec<Vec<u8>>,
}

impl RoleRules {
    /// The role a directory has by its own name (`not-dependency-dirs` wins), with the
    /// pattern that gave it.
    pub fn role_of(&self, dir: &[u8]) -> Option<(Role, &str)> {
        if self.not_deps.matching(dir, true).is_some() {
            return None;
        }
        if let Some(p) = self.caches.matching(dir, true) {
            return Some((Role::Cache, p));
        }
        self.deps.matching(dir, true).map(|p| (Role::Dependency, p))
    }

    /// Whether `rel` is one of the scan's role directories or inside one.
    pub fn inside(&self, rel: &[u8], is_dir: bool) -> bool {
        self.roots
            .iter()
            .any(|r| (is_dir && rel == r.as_slice()) || super::scan::below(rel, r))
    }
}

/// Whether `m` is one of the mounts [`mounts`] makes (a named sandbox's clone has none of
/// the host's ignored directories: it drops them).
pub fn is_role_mount(m: &Mount) -> bool {
    m.why.starts_with("dependency dir") || m.why.starts_with("cache dir")
}

/// Caches and reports a tool recreates at will, found by the dozen in a source tree (one
/// `__pycache__/` per package): the sandbox gets each as a private, empty, writable directory
/// (one tmpfs, as cheap as the mask it replaces), never the host's content, which the host's
/// tools read back (a planted `.pyc` runs in the host's Python).
pub const DEFAULT_CACHE_DIRS: &[&str] = &[
    "__pycache__/",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".hypothesis/",
    ".parcel-cache/",
    ".nyc_output/",
    "htmlcov/",
    "coverage/",
];

/// Dependency and build-output directories of the common ecosystems, by name at any depth.
/// Researched from the ecosystems' own `.gitignore` templates (github/gitignore) and their
/// tools' defaults; each is a directory a tool recreates from the project's sources or lock
/// file.
pub const DEFAULT_DEPENDENCY_DIRS: &[&str] = &[
    // JavaScript and TypeScript: npm/yarn/pnpm/bun installs, framework build outputs, caches.
    "node_modules/",
    "bower_components/",
    ".pnpm-store/",
    ".next/",
    ".nuxt/",
    ".output/",
    ".svelte-kit/",
    ".turbo/",
    ".angular/",
    ".vite/",
    ".docusaurus/",
    "storybook-static/",
    // Python: virtual environments, packaging.
    ".venv/",
    "venv/",
    ".tox/",
    ".nox/",
    ".eggs/",
    "*.egg-info/",
    // Rust, Go, PHP, Ruby (Bundler's `vendor/bundle`), Java/Kotlin, .NET, Dart, Swift, C/C++.
    "target/",
    "vendor/",
    ".gradle/",
    ".dart_tool/",
    "Pods/",
    "DerivedData/",
    ".build/",
    "obj/",
    "cmake-build-*/",
    // Elixir, Haskell, Zig, Elm.
    "_build/",
    "deps/",
    "dist-newstyle/",
    ".stack-work/",
    ".zig-cache/",
    "zig-cache/",
    "zig-out/",
    "elm-stuff/",
    // Generic build outputs.
    "build/",
    "dist/",
    "out/",
];

/// The built-in sensitive patterns (`masks::DEFAULT_SENSITIVE`) that match library code and
/// CA bundles rather than credentials, left out inside a dependency or build directory:
/// `botocore/credentials.py`, `google/auth/credentials.py`, a Go `vendor/…/aws/credentials/`
/// package, a crate's `secret_key.rs`, certifi's `cacert.pem`.
const TOO_BROAD_FOR_DEPENDENCIES: &[&str] = &["*credentials*", "*secret*", "*.pem"];

/// Credential files by name, masked inside dependency directories in place of the broad ones.
const DEPENDENCY_CREDENTIALS: &[&str] = &[
    "*key*.pem",
    "*private*.pem",
    "credentials",
    "credentials.json",
    "credentials.toml",
    "credentials.yml",
    "credentials.yaml",
    "client_secret*.json",
    "secrets.json",
    "secrets.toml",
    "secrets.yml",
    "secrets.yaml",
    "service-account*.json",
];

/// What is masked inside a dependency or build directory when the built-in sensitive set is
/// on: the built-in set without its broad globs, and credential files by name. The project's
/// own `block` patterns still apply there in full.
pub fn dependency_sensitive() -> impl Iterator<Item = &'static str> {
    super::masks::DEFAULT_SENSITIVE
        .iter()
        .copied()
        .filter(|p| !TOO_BROAD_FOR_DEPENDENCIES.contains(p))
        .chain(DEPENDENCY_CREDENTIALS.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::masks::{PatternSet, DEFAULT_SENSITIVE};

    #[test]
    fn every_pattern_is_valid() {
        for p in DEFAULT_DEPENDENCY_DIRS
            .iter()
            .chain(DEFAULT_CACHE_DIRS)
            .copied()
            .chain(dependency_sensitive())
        {
            crate::config::pattern::validate(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        }
        assert!(DEFAULT_DEPENDENCY_DIRS
            .iter()
            .chain(DEFAULT_CACHE_DIRS)
            .all(|p| p.ends_with('/')));
    }

    #[test]
    fn library_code_is_not_a_credential_but_credential_files_are() {
        let inside = PatternSet::new(dependency_sensitive());
        for code in [
            "botocore/credentials.py",
            "google/auth/credentials.py",
            "github.com/aws/aws-sdk-go/aws/credentials/provider.go",
            "ring/src/secret_key.rs",
            "lib/secrets.js",
            "certifi/cacert.pem",
        ] {
            assert_eq!(inside.matching(code, false), None, "{code}");
        }
        let everywhere = PatternSet::new(DEFAULT_SENSITIVE.iter().copied());
        assert!(everywhere
            .matching("botocore/credentials.py", false)
            .is_some());
        for secret in [
            "some-pkg/.env",
            "some-pkg/.env.local",
            "certs/server-key.pem",
            "certs/private.pem",
            "pkg/.npmrc",
            "gcloud/credentials.json",
            "cfg/secrets.yml",
        ] {
            assert!(inside.matching(secret, false).is_some(), "{secret}");
        }
    }

    #[test]
    fn state_with_secrets_is_not_a_dependency_dir() {
        let deps = PatternSet::new(DEFAULT_DEPENDENCY_DIRS.iter().copied());
        for d in [".terraform", ".bundle", ".vercel", ".serverless", "config"] {
            assert_eq!(deps.matching(d, true), None, "{d}");
        }
        for d in [
            "node_modules",
            "a/b/node_modules",
            ".venv",
            "target",
            "x.egg-info",
        ] {
            assert!(deps.matching(d, true).is_some(), "{d}");
        }
        assert_eq!(deps.matching("target", false), None, "directories only");
    }
}
