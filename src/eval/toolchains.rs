//! The user's own toolchains, seen through a hidden home. With the home empty (the default),
//! a developer whose `cargo` comes from rustup, whose `node` from nvm or whose `python` from
//! pyenv would find none of them inside. Each known manager whose directory is on the
//! caller's PATH gets exactly its binaries and toolchains mounted read-only, never the home,
//! never its configuration (which holds tokens: `~/.cargo/config.toml` and
//! `credentials.toml`, npmrc files, `pip.conf`, `gradle.properties`, `~/.m2/settings.xml`,
//! `~/.gem/credentials` are not among the paths below; the configuration files that live inside
//! an install prefix are masked).
//!
//! Package caches (`~/.cargo/registry`, `~/go/pkg/mod`, npm's `_cacache`, pip's, Maven's
//! repository, …) are usable, so that a build inside works offline from what the host already
//! downloaded: each is mounted copy-on-write, whatever the PATH says. The sandbox's downloads
//! land in its own layer, kept with its state; the host's cache never changes (a tool on the
//! host trusts what is in it). They hold only packages: the tokens that fetched them live in
//! the configuration files above, which stay hidden. `toolchains #false` turns this off with
//! the rest.
//!
//! PATH entries that are the home itself, `.`, relative, or not below the home are not
//! looked at; one below the home that no manager claims stays hidden (`aisb doctor` names it).

use std::path::{Path, PathBuf};

use super::host::Scope;
use super::plan::{Mount, MountKind};

/// A toolchain manager: the PATH entries (below the home) that show it is in use, and what of
/// it is mounted read-only.
pub struct Manager {
    pub name: &'static str,
    /// PATH entries, relative to the home; a `*` component matches one directory name.
    pub path: &'static [&'static str],
    pub read_only: &'static [&'static str],
    /// Configuration files inside what is mounted that may hold tokens (a `*` component
    /// matches one directory name): masked. npm's global config lives in the prefix of the
    /// node that wrote it (`npm config set -g //registry…/:_authToken=…` writes
    /// `PREFIX/etc/npmrc`), pip reads a `pip.conf` in each interpreter's prefix.
    pub secrets: &'static [&'static str],
}

pub const MANAGERS: &[Manager] = &[
    Manager {
        name: "rustup",
        path: &[".cargo/bin"],
        read_only: &[".cargo/bin", ".rustup/toolchains", ".rustup/settings.toml"],
        secrets: &[],
    },
    Manager {
        name: "nvm",
        path: &[".nvm/versions/node/*/bin"],
        read_only: &[".nvm/versions", ".nvm/alias"],
        secrets: &[".nvm/versions/node/*/etc/npmrc"],
    },
    Manager {
        name: "pyenv",
        path: &[".pyenv/shims", ".pyenv/bin"],
        read_only: &[
            ".pyenv/bin",
            ".pyenv/libexec",
            ".pyenv/shims",
            ".pyenv/versions",
            ".pyenv/plugins",
            ".pyenv/version",
        ],
        secrets: &[".pyenv/versions/*/pip.conf", ".pyenv/versions/*/pip.ini"],
    },
    Manager {
        name: "rbenv",
        path: &[".rbenv/shims", ".rbenv/bin"],
        read_only: &[
            ".rbenv/bin",
            ".rbenv/libexec",
            ".rbenv/shims",
            ".rbenv/versions",
            ".rbenv/plugins",
            ".rbenv/version",
        ],
        secrets: &[".rbenv/versions/*/etc/gemrc"],
    },
    Manager {
        name: "volta",
        path: &[".volta/bin"],
        read_only: &[".volta/bin", ".volta/tools/image", ".volta/tools/user"],
        secrets: &[".volta/tools/image/node/*/etc/npmrc"],
    },
    Manager {
        name: "asdf",
        path: &[".asdf/shims", ".asdf/bin"],
        read_only: &[
            ".asdf/bin",
            ".asdf/lib",
            ".asdf/libexec",
            ".asdf/shims",
            ".asdf/installs",
            ".asdf/plugins",
            ".asdf/asdf.sh",
            ".tool-versions",
        ],
        secrets: &[
            ".asdf/installs/nodejs/*/etc/npmrc",
            ".asdf/installs/python/*/pip.conf",
        ],
    },
    Manager {
        name: "mise",
        path: &[
            ".local/share/mise/shims",
            ".local/share/mise/installs/*/*/bin",
        ],
        read_only: &[".local/share/mise/shims", ".local/share/mise/installs"],
        secrets: &[
            ".local/share/mise/installs/node/*/etc/npmrc",
            ".local/share/mise/installs/python/*/pip.conf",
        ],
    },
    Manager {
        name: "go",
        path: &["go/bin", "sdk/*/bin", ".go/bin"],
        read_only: &["go/bin", "sdk", ".go"],
        secrets: &[],
    },
    Manager {
        name: "bun",
        path: &[".bun/bin"],
        read_only: &[".bun/bin"],
        secrets: &[],
    },
    Manager {
        name: "deno",
        path: &[".deno/bin"],
        read_only: &[".deno/bin"],
        secrets: &[],
    },
    Manager {
        name: "sdkman",
        path: &[
            ".sdkman/candidates/*/current/bin",
            ".sdkman/candidates/*/*/bin",
        ],
        read_only: &[".sdkman/candidates"],
        secrets: &[],
    },
    Manager {
        // pipx and uv install tools as links into their own directories.
        name: "~/.local/bin",
        path: &[".local/bin"],
        read_only: &[
            ".local/bin",
            ".local/share/pipx/venvs",
            ".local/share/uv/tools",
            ".local/share/uv/python",
        ],
        secrets: &[],
    },
];

/// A PATH entry's manager, when it is below `home` and one claims it.
pub fn manager_for(home: &Path, entry: &str) -> Option<&'static Manager> {
    let rel = below_home(home, entry)?;
    MANAGERS.iter().find(|m| {
        m.path.iter().any(|p| {
            let want: Vec<&str> = p.split('/').collect();
            let got: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
            want.len() == got.len() && want.iter().zip(&got).all(|(w, g)| *w == "*" || w == g)
        })
    })
}

/// `entry` relative to `home`, for an absolute entry strictly below it (`.`, relative entries,
/// the home itself and anything with `..` are not).
pub fn below_home(home: &Path, entry: &str) -> Option<String> {
    let p = Path::new(entry);
    if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
        return None;
    }
    let rel = p.strip_prefix(home).ok()?;
    let rel = rel.to_str()?.trim_end_matches('/');
    (!rel.is_empty()).then(|| rel.to_string())
}

/// What the mounts show and must not: each manager's `secrets` that exist, as masks.
fn secret_masks(home: &Path, m: &Manager, out: &mut Vec<super::plan::Mask>) {
    for pattern in m.secrets {
        let mut found = vec![home.to_path_buf()];
        for part in pattern.split('/') {
            let mut next = Vec::new();
            for dir in &found {
                if part == "*" {
                    let Ok(rd) = std::fs::read_dir(dir) else {
                        continue;
                    };
                    // Bounded: a toolchain has a handful of versions, not thousands.
                    for e in rd.flatten().take(256) {
                        if e.file_type().is_ok_and(|t| t.is_dir()) {
                            next.push(e.path());
                        }
                    }
                } else {
                    next.push(dir.join(part));
                }
            }
            found = next;
        }
        for p in found {
            if let Ok(md) = std::fs::symlink_metadata(&p) {
                out.push(super::plan::Mask {
                    dir: md.is_dir(),
                    path: p,
                    rule: format!("toolchain {} \"~/{pattern}\"", m.name),
                });
            }
        }
    }
}

/// The mounts for every manager on the caller's PATH: read-only binaries and toolchains, in
/// PATH order, each path once (masks for the configuration inside them go to `masks`). Only under an empty home (a visible home shows them anyway)
/// and unless `home … toolchains=#false`.
pub(super) fn mounts(sc: &Scope<'_>, masks: &mut Vec<super::plan::Mask>) -> Vec<Mount> {
    let home = &sc.host.home;
    if home == Path::new("/") {
        return Vec::new();
    }
    let Some(path) = sc.host.env.get("PATH") else {
        return Vec::new();
    };
    let mut seen: Vec<&'static str> = Vec::new();
    let mut out = Vec::new();
    let mut taken: Vec<PathBuf> = Vec::new();
    for entry in path.split(':') {
        let Some(m) = manager_for(home, entry) else {
            continue;
        };
        if seen.contains(&m.name) {
            continue;
        }
        seen.push(m.name);
        secret_masks(home, m, masks);
        for rel in m.read_only {
            let p = home.join(rel);
            // The real thing only: a link could lead anywhere on the host.
            let Ok(md) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if md.file_type().is_symlink() || taken.iter().any(|t| p.starts_with(t)) {
                continue;
            }
            taken.push(p.clone());
            out.push(Mount {
                target: p.clone(),
                kind: MountKind::Bind {
                    source: p,
                    writable: false,
                },
                why: format!("toolchain {} on PATH (read-only)", m.name),
            });
        }
    }
    out.extend(package_caches(sc, &taken));
    out
}

/// Package caches below the home (tool, path relative to the home): packages only, never the
/// configuration that holds a registry's token.
pub const PACKAGE_CACHES: &[(&str, &str)] = &[
    ("cargo", ".cargo/registry"),
    ("cargo", ".cargo/git"),
    ("go", "go/pkg/mod"),
    ("npm", ".npm/_cacache"),
    ("yarn", ".cache/yarn"),
    ("yarn", ".yarn/berry/cache"),
    ("pnpm", ".local/share/pnpm/store"),
    ("bun", ".bun/install/cache"),
    ("pip", ".cache/pip"),
    ("uv", ".cache/uv"),
    ("maven", ".m2/repository"),
    ("gradle", ".gradle/caches"),
    ("gradle", ".gradle/wrapper/dists"),
    ("composer", ".cache/composer"),
    ("deno", ".cache/deno"),
];

/// Each package cache that exists (a real directory, never a link), copy-on-write: the
/// layer is kept in the sandbox's state beside the dependency directories' (so a second run
/// at once gets one of its own, see `runtime::claim_layers`).
fn package_caches(sc: &Scope<'_>, taken: &[PathBuf]) -> Vec<Mount> {
    let home = &sc.host.home;
    let mut out = Vec::new();
    for (tool, rel) in PACKAGE_CACHES {
        let p = home.join(rel);
        let real_dir = std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir())
            && p.ancestors()
                .skip(1)
                .take_while(|a| *a != home.as_path())
                .all(|a| std::fs::symlink_metadata(a).is_ok_and(|m| m.is_dir()));
        if !real_dir || taken.iter().any(|t| p.starts_with(t)) {
            continue;
        }
        let d = sc
            .state_dir
            .join(super::deps::LAYER_DIR)
            .join(super::mounts::slug(&p));
        out.push(Mount {
            target: p.clone(),
            kind: MountKind::Overlay {
                lower: p,
                upper: d.join("upper"),
                work: d.join("work"),
                above: None,
            },
            why: format!(
                "package cache of {tool}: the host's, written copy-on-write (the sandbox's downloads stay in its layer)"
            ),
        });
    }
    out
}

/// The caller's PATH entries below the home that no manager claims: hidden inside.
pub fn hidden_path_entries(home: &Path, path: &str) -> Vec<String> {
    path.split(':')
        .filter(|e| below_home(home, e).is_some() && manager_for(home, e).is_none())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_entries_find_their_manager() {
        let home = Path::new("/home/u");
        let name = |e: &str| manager_for(home, e).map(|m| m.name);
        assert_eq!(name("/home/u/.cargo/bin"), Some("rustup"));
        assert_eq!(name("/home/u/.cargo/bin/"), Some("rustup"));
        assert_eq!(name("/home/u/.nvm/versions/node/v20.1.0/bin"), Some("nvm"));
        assert_eq!(name("/home/u/.pyenv/shims"), Some("pyenv"));
        assert_eq!(name("/home/u/go/bin"), Some("go"));
        assert_eq!(name("/home/u/.local/bin"), Some("~/.local/bin"));
        // Not below the home, the home itself, relative, `.`, or climbing out: never.
        for e in [
            "/usr/bin",
            "/home/u",
            "/home/u/",
            ".",
            "bin",
            "/home/u/../u/.cargo/bin",
            "/home/u/.cargo",
            "/home/u/.cargo/bin/../../.ssh",
        ] {
            assert_eq!(name(e), None, "{e}");
        }
    }

    #[test]
    fn configuration_with_tokens_is_never_mounted() {
        for m in MANAGERS {
            for p in m.read_only {
                for secret in [
                    ".cargo/config.toml",
                    ".cargo/credentials.toml",
                    ".cargo/credentials",
                    ".npmrc",
                    ".config/pip",
                    ".pip",
                    ".gradle",
                    ".m2",
                    ".gem",
                    ".config",
                    ".ssh",
                ] {
                    assert!(
                        !Path::new(secret).starts_with(p),
                        "{}: {p} covers {secret}",
                        m.name
                    );
                }
                assert!(!p.is_empty() && !p.starts_with('/') && !p.contains(".."));
            }
        }
    }

    #[test]
    fn a_global_npmrc_in_a_toolchain_is_masked() {
        let home = tempfile::tempdir().unwrap();
        let etc = home.path().join(".nvm/versions/node/v20.1.0/etc");
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            etc.join("npmrc"),
            "//registry.npmjs.org/:_authToken=npm_x\n",
        )
        .unwrap();
        let nvm = MANAGERS.iter().find(|m| m.name == "nvm").unwrap();
        let mut masks = Vec::new();
        secret_masks(home.path(), nvm, &mut masks);
        assert_eq!(masks.len(), 1);
        assert_eq!(masks[0].path, etc.join("npmrc"));
        assert!(!masks[0].dir);
    }

    #[test]
    fn unclaimed_entries_below_home_are_reported() {
        let home = Path::new("/home/u");
        assert_eq!(
            hidden_path_entries(home, "/home/u/.cargo/bin:/home/u/bin:/usr/bin:.:/home/u"),
            vec!["/home/u/bin".to_string()]
        );
    }
}
