//! Which of the caller's environment variables enter the sandbox.
//!
//! Order of decisions for each inherited name (first match wins):
//! 1. `deny` globs: dropped.
//! 2. `pass` names: kept, even when they look like secrets (seed 003's pass-list).
//! 3. `allow` globs: kept.
//! 4. secret heuristics (`*_KEY`, `*_SECRET`, `*_TOKEN`, `*PASSWORD*`, `*CREDENTIAL*`, `AWS_*`,
//!    `GITHUB_*`, …) when `filter-secrets` is on (the default): dropped.
//! 5. `inherit`: `all` keeps it, `safe` keeps it only when it is on the safe list, `none` drops.
//!
//! Then `set` values are applied, and identity variables (HOME, USER, LOGNAME, SHELL) are
//! forced to the sandbox's identity.

use crate::config::pattern::wildcard;
use std::collections::BTreeMap;
use std::path::Path;

use globset::{Glob, GlobSet, GlobSetBuilder};

use super::host::Scope;
use super::plan::{Dropped, Env};
use super::Ctx;
use crate::config::model::Inherit;
use crate::config::Spanned;

pub const SECRET_PATTERNS: &[&str] = &[
    "*_KEY",
    "*_KEY_*",
    "*_SECRET",
    "*_SECRET_*",
    "*SECRET_KEY*",
    "*_TOKEN",
    "*_TOKEN_*",
    "*PASSWORD*",
    "*PASSWD*",
    "*CREDENTIAL*",
    "*_PAT",
    "*APIKEY*",
    "*API_KEY*",
    "*PRIVATE*",
    "*SESSION*",
    "*COOKIE*",
    "AWS_*",
    "GITHUB_*",
    "GH_*",
    "GITLAB_*",
    "AZURE_*",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "SSH_AUTH_SOCK",
    "GPG_AGENT_INFO",
    "DATABASE_URL",
    "*_DSN",
    "NPM_TOKEN",
    "VAULT_*",
    "KUBECONFIG",
    "DOCKER_AUTH_CONFIG",
    "*AUTH*",
];

/// Harmless names kept by `inherit "safe"`.
pub const SAFE: &[&str] = &[
    "PATH",
    "TERM",
    "COLORTERM",
    "TERM_PROGRAM",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "LESS",
    "NODE_ENV",
    "DEBUG",
    "CI",
    "NO_COLOR",
    "FORCE_COLOR",
    "CLICOLOR",
    "COLUMNS",
    "LINES",
    "RUST_BACKTRACE",
    "RUST_LOG",
    "CARGO_TERM_COLOR",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
];

/// Variable-name patterns. Names are matched on every run against ~80 built-in patterns:
/// patterns made of literals, `*` and `?` (all the built-in ones) are matched directly,
/// which saves compiling a glob set (~0.2 ms) at every start; anything richer (`[A-Z]`,
/// `{a,b}`) goes through globset.
enum Names {
    Simple(Vec<String>),
    Glob(GlobSet),
}

impl Names {
    fn new(patterns: impl IntoIterator<Item = impl AsRef<str>>) -> Names {
        let patterns: Vec<String> = patterns
            .into_iter()
            .map(|p| p.as_ref().to_string())
            .collect();
        if patterns
            .iter()
            .all(|p| !p.contains(['[', ']', '{', '}', '\\']))
        {
            return Names::Simple(patterns);
        }
        let mut b = GlobSetBuilder::new();
        for p in &patterns {
            if let Ok(g) = Glob::new(p) {
                b.add(g);
            }
        }
        Names::Glob(b.build().unwrap_or_else(|_| GlobSet::empty()))
    }

    fn is_match(&self, name: impl AsRef<str>) -> bool {
        match self {
            Names::Simple(ps) => ps
                .iter()
                .any(|p| wildcard(p.as_bytes(), name.as_ref().as_bytes())),
            Names::Glob(g) => g.is_match(name.as_ref()),
        }
    }
}

pub struct EnvPolicy<'a> {
    pub inherit: Inherit,
    pub filter_secrets: bool,
    pub allow: &'a [String],
    pub deny: &'a [String],
    pub pass: &'a [String],
    /// Already expanded, in order; later wins.
    pub set: &'a [(String, String)],
    pub forced: &'a [(&'static str, String)],
}

/// `KEY=value` lines of a dotenv file: `export ` allowed, comments and blank lines skipped,
/// values unquoted when wrapped in matching single or double quotes.
pub fn parse_dotenv(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                return None;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let (k, v) = line.split_once('=')?;
            let v = v.trim();
            let v = ['"', '\'']
                .iter()
                .find_map(|q| v.strip_prefix(*q).and_then(|r| r.strip_suffix(*q)))
                .unwrap_or(v);
            Some((k.trim().to_string(), v.to_string()))
        })
        .collect()
}

/// The value a dotenv file gives `key`: its last assignment, as a shell sourcing the file,
/// docker's `env_file` and python-dotenv all read it.
pub fn dotenv_value<'a>(values: &'a [(String, String)], key: &str) -> Option<&'a str> {
    values
        .iter()
        .rev()
        .find(|(name, _)| name == key)
        .map(|(_, v)| v.as_str())
}

/// Does this variable name look like a secret (the built-in patterns)?
pub fn looks_secret(name: &str) -> bool {
    static SECRET: std::sync::OnceLock<Names> = std::sync::OnceLock::new();
    SECRET
        .get_or_init(|| Names::new(SECRET_PATTERNS))
        .is_match(name.to_ascii_uppercase())
}

pub fn filter(host_env: &BTreeMap<String, String>, p: &EnvPolicy<'_>) -> Env {
    let deny = Names::new(p.deny);
    let allow = Names::new(p.allow);
    let secret = Names::new(SECRET_PATTERNS);
    let safe = Names::new(SAFE);
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut dropped = Vec::new();
    for (name, value) in host_env {
        let keep = if deny.is_match(name) {
            Err("denied by `env deny`")
        } else if p.pass.iter().any(|n| n == name) || allow.is_match(name) {
            Ok(())
        } else if p.filter_secrets && secret.is_match(name.to_ascii_uppercase()) {
            Err("looks like a secret")
        } else {
            match p.inherit {
                Inherit::All => Ok(()),
                Inherit::Safe if safe.is_match(name) => Ok(()),
                Inherit::Safe => Err("not on the safe list (inherit \"safe\")"),
                Inherit::None => Err("inherit \"none\""),
            }
        };
        match keep {
            Ok(()) => {
                vars.insert(name.clone(), value.clone());
            }
            Err(reason) => dropped.push(Dropped {
                name: name.clone(),
                reason: reason.into(),
            }),
        }
    }
    for (k, v) in p.set {
        vars.insert(k.clone(), v.clone());
    }
    for (k, v) in p.forced {
        vars.insert((*k).to_string(), v.clone());
    }
    dropped.retain(|d| !vars.contains_key(&d.name));
    Env {
        vars: vars.into_iter().collect(),
        dropped,
    }
}

/// The sandbox's environment: the configured dotenv keys and `set` values, the forced
/// identity and XDG variables, filtered from the caller's by the configured policy.
pub(super) fn resolve(
    cx: &mut Ctx<'_>,
    sc: &Scope<'_>,
    shell: &Path,
    xdg_env: Vec<(&'static str, String)>,
) -> Env {
    let (s, host, project, identity) = (sc.s, sc.host, &sc.project, &sc.identity);
    let home = &host.home;
    let expand = |cx: &mut Ctx<'_>, v: &Spanned<String>| sc.expand(cx, v);
    let path = |cx: &mut Ctx<'_>, v: &Spanned<String>| sc.path(cx, v);
    let mut set: Vec<(String, String)> = Vec::new();
    // Seed 003's pass-list: only the named keys of a dotenv file the user names enter.
    for (file, keys) in &s.env.from_file {
        let Some(p) = path(cx, file) else { continue };
        match read_dotenv(project, &p) {
            Ok(text) => {
                let values = parse_dotenv(&text);
                for k in keys {
                    match dotenv_value(&values, &k.value) {
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
    let mut env = filter(
        &host.env,
        &EnvPolicy {
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
    env
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotenv_lines() {
        let v = parse_dotenv("# c\nA=1\nexport B = \"two words\"\n\nC='x'\nnot a line\nD=\n");
        assert_eq!(
            v,
            [("A", "1"), ("B", "two words"), ("C", "x"), ("D", "")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
    }

    #[test]
    fn wildcards_agree_with_globset() {
        let cases = [
            ("*_KEY", "AWS_SECRET_KEY", true),
            ("*_KEY", "KEY", false),
            ("*_KEY_*", "A_KEY_B", true),
            ("AWS_*", "AWS_", true),
            ("AWS_*", "XAWS_A", false),
            ("*AUTH*", "OAUTH_X", true),
            ("LC_*", "LC_ALL", true),
            ("PATH", "PATH", true),
            ("PATH", "PATHX", false),
            ("A?C", "ABC", true),
            ("A?C", "AC", false),
            ("*", "", true),
            ("**X", "AX", true),
            ("*A*B*", "XAYBZ", true),
            ("*A*B*", "XBYAZ", false),
        ];
        for (p, t, want) in cases {
            assert_eq!(wildcard(p.as_bytes(), t.as_bytes()), want, "{p} {t}");
            assert_eq!(
                Glob::new(p).unwrap().compile_matcher().is_match(t),
                want,
                "globset {p} {t}"
            );
        }
        assert!(
            Names::new(["[A-C]X"]).is_match("BX"),
            "rich patterns go through globset"
        );
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn names(e: &Env) -> Vec<&str> {
        e.vars.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn secrets_dropped_and_pass_wins() {
        let host = env(&[
            ("PATH", "/bin"),
            ("OPENAI_API_KEY", "x"),
            ("ANTHROPIC_API_KEY", "y"),
            ("AWS_PROFILE", "p"),
            ("GITHUB_TOKEN", "t"),
            ("DB_PASSWORD", "p"),
            ("MY_VAR", "v"),
            ("NODE_ENV", "dev"),
        ]);
        let pass = vec!["ANTHROPIC_API_KEY".to_string()];
        let p = EnvPolicy {
            inherit: Inherit::All,
            filter_secrets: true,
            allow: &[],
            deny: &[],
            pass: &pass,
            set: &[],
            forced: &[],
        };
        let e = filter(&host, &p);
        assert_eq!(
            names(&e),
            ["ANTHROPIC_API_KEY", "MY_VAR", "NODE_ENV", "PATH"]
        );
        let dropped: Vec<&str> = e.dropped.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            dropped,
            [
                "AWS_PROFILE",
                "DB_PASSWORD",
                "GITHUB_TOKEN",
                "OPENAI_API_KEY"
            ]
        );
    }

    #[test]
    fn safe_none_deny_set_forced() {
        let host = env(&[
            ("PATH", "/bin"),
            ("MY_VAR", "v"),
            ("LC_ALL", "C"),
            ("HOME", "/real"),
            ("EDITOR", "vi"),
        ]);
        let allow = vec!["MY_*".to_string()];
        let deny = vec!["EDITOR".to_string()];
        let set = vec![("X".to_string(), "1".to_string())];
        let forced = [("HOME", "/home/me".to_string())];
        let p = EnvPolicy {
            inherit: Inherit::Safe,
            filter_secrets: true,
            allow: &allow,
            deny: &deny,
            pass: &[],
            set: &set,
            forced: &forced,
        };
        let e = filter(&host, &p);
        assert_eq!(
            e.vars,
            vec![
                ("HOME".into(), "/home/me".into()),
                ("LC_ALL".into(), "C".into()),
                ("MY_VAR".into(), "v".into()),
                ("PATH".into(), "/bin".into()),
                ("X".into(), "1".into())
            ]
        );
        assert_eq!(e.dropped.len(), 1);
        assert_eq!(e.dropped[0].name, "EDITOR");
        let p = EnvPolicy {
            inherit: Inherit::None,
            filter_secrets: true,
            allow: &[],
            deny: &[],
            pass: &[],
            set: &[],
            forced: &[],
        };
        assert!(filter(&host, &p).vars.is_empty());
    }
}
