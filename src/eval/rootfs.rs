//! The sandbox's root filesystem: the host's system paths (read-only, `/etc` as a snapshot of
//! the entries tools need), or an image.

use super::host::Scope;
use super::plan::Rootfs;
use super::Ctx;
use crate::config::model::RootfsCfg;

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

/// `rootfs`: the host's, a Dockerfile's, an OCI source, or an `image` declared by name.
pub(super) fn resolve(cx: &mut Ctx<'_>, sc: &Scope<'_>) -> Rootfs {
    let (s, project) = (sc.s, &sc.project);
    match s.rootfs.as_ref() {
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
    }
}
