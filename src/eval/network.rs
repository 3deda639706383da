//! The network: the mode, the allowlist (rules, groups, `domains` merge/strict/replace), the
//! denylist, the host's loopback ports; the proxy's variables in the environment; and what an
//! image's RUN steps may reach.

use std::collections::{BTreeMap, BTreeSet};

use super::host::Scope;
use super::plan::{Env, Network};
use super::{loc_line, Ctx};
use crate::config::domain::DomainRule;
use crate::config::model::{DomainsMode, NetMode, Settings};
use crate::config::{Loc, Spanned};

/// The built-in domain groups presets use (`network { group "registries" }`).
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

/// Domain groups by name: every definition (the importer's wins), and those aisb ships
/// (built-in and from embedded presets), which `domains="strict"` holds presets to.
pub(super) struct Groups {
    pub all: BTreeMap<String, Vec<String>>,
    pub shipped: BTreeMap<String, Vec<String>>,
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
pub(super) fn build(cx: &mut Ctx<'_>, s: &Settings, groups: &Groups) -> Vec<String> {
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

/// The sandbox's network; with a proxy, its variables replace the caller's in `env`.
pub(super) fn resolve(cx: &mut Ctx<'_>, sc: &Scope<'_>, groups: &Groups, env: &mut Env) -> Network {
    let (s, req) = (sc.s, sc.req);
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
        crate::config::domain::transparent_ports(&allow_rules, &ports)
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
        let proxy_env = crate::vocab::sandbox_env();
        env.vars
            .retain(|(k, _)| !proxy_env.iter().any(|(p, _)| p == k));
        env.vars.extend(proxy_env);
        env.vars.sort();
    }
    network
}
