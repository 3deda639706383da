//! `aisb why TARGET`: which rule decides what the sandbox does with a path, a domain, an
//! environment variable or an agent's tool call, where that rule is written, and what would
//! change it. Read from the plan `aisb run` would use; nothing runs.

use std::path::Path;

use serde::Serialize;

use super::Global;
use crate::config::model::Settings;
use crate::eval::load::Loaded;
use crate::eval::plan::{MountKind, NetMode, Plan, SystemPath};
use crate::Error;

/// Explain which rule decides for a path, a domain, an env variable or a tool call
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb why .env                   # masked: which pattern, from where\n  aisb why config/database.yml\n  aisb why .vscode/tasks.json     # read-only inside: the host's editor runs it\n  aisb why api.github.com         # reached through the proxy, or refused\n  aisb why GITHUB_TOKEN           # passed in, or held back and why\n  aisb why 'Bash(git push)'       # an agent's tool call\n  aisb why --as domain notes.txt  # when a name could be either\n  aisb why .env --json"
)]
pub struct Args {
    /// A path (relative to here), a domain (`host` or `host:port`), an environment variable's
    /// name, or a tool call (`Tool(argument)`)
    pub target: String,
    /// What TARGET is, when its form is ambiguous
    #[arg(long = "as", value_enum, value_name = "KIND")]
    pub kind: Option<Kind>,
    #[arg(short, long)]
    pub profile: Option<String>,
    /// The agent whose names a tool call uses
    #[arg(long, default_value = "claude")]
    pub agent: String,
    /// One JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Path,
    Domain,
    Env,
    Tool,
}

/// The answer: what happens, the rule, where it is written, and what would change it.
#[derive(Debug, Serialize)]
pub struct Why {
    pub target: String,
    pub kind: Kind,
    /// One word: `masked`, `read-only`, `writable`, `copy-on-write`, `private`,
    /// `not-visible`, `moved-aside`, `allowed`, `refused`, `passed`, `dropped`, `absent`.
    pub decision: String,
    /// The rule, as `aisb plan` and the audit log name it.
    pub rule: String,
    /// Where the rule is written (`sandbox.kdl:12`), or who sets it (aisb's default).
    pub from: String,
    /// What to change to get another answer, when there is something to change.
    pub change: Option<String>,
    pub notes: Vec<String>,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let loaded = g.load_for(&host, &[])?;
    let plan = super::evaluated(
        crate::eval::evaluate(&loaded, &host, &g.request(a.profile.clone(), vec![]))
            .map_err(Error::from)?,
    );
    let kind = a.kind.unwrap_or_else(|| guess(&a.target, &host.cwd));
    let why = match kind {
        Kind::Path => path(&plan, &loaded, &host.cwd, &a.target),
        Kind::Domain => domain(&plan, &loaded, &a.target),
        Kind::Env => env(&plan, &loaded, &a.target),
        Kind::Tool => tool(&plan, &a.target, &a.agent, &host.cwd, &host.home),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&why).unwrap_or_default());
    } else {
        print!("{}", render(&why));
    }
    Ok(0)
}

/// A tool call has parentheses, a variable's name is a shell word, a domain has a dot and no
/// slash; anything that exists here, or has a slash, is a path.
fn guess(target: &str, cwd: &Path) -> Kind {
    let t = target.trim();
    if t.ends_with(')') && t.contains('(') {
        return Kind::Tool;
    }
    if t.contains('/') || cwd.join(t).symlink_metadata().is_ok() || t.starts_with('.') {
        return Kind::Path;
    }
    let word = !t.is_empty()
        && !t.starts_with(|c: char| c.is_ascii_digit())
        && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if word
        && t.chars().any(|c| c.is_ascii_uppercase())
        && !t.chars().any(|c| c.is_ascii_lowercase())
    {
        return Kind::Env;
    }
    if t.contains('.') {
        return Kind::Domain;
    }
    if word {
        return Kind::Env;
    }
    Kind::Path
}

fn render(w: &Why) -> String {
    let mut o = format!(
        "{} ({})\n  {}: {}\n  from: {}\n",
        w.target,
        match w.kind {
            Kind::Path => "a path",
            Kind::Domain => "a domain",
            Kind::Env => "an environment variable",
            Kind::Tool => "a tool call",
        },
        w.decision,
        w.rule,
        w.from
    );
    for n in &w.notes {
        o.push_str(&format!("  note: {n}\n"));
    }
    if let Some(c) = &w.change {
        o.push_str(&format!("  to change it: {c}\n"));
    }
    o
}

/// Every settings block of the loaded files (each file's top level and its profiles), with the
/// file's index.
fn settings(loaded: &Loaded) -> impl Iterator<Item = (usize, &Settings)> {
    loaded.files.iter().enumerate().flat_map(|(i, f)| {
        std::iter::once((i, &f.base)).chain(f.profiles.iter().map(move |p| (i, &p.settings)))
    })
}

/// `FILE:LINE` of the first value `pick` finds equal to `value` in the loaded files.
fn written_at<'a>(
    loaded: &'a Loaded,
    value: &str,
    pick: impl Fn(&'a Settings) -> Vec<&'a crate::config::model::S<String>>,
) -> Option<String> {
    settings(loaded).find_map(|(_, s)| {
        let v = pick(s).into_iter().find(|v| v.value == value)?;
        Some(at(loaded, v.loc))
    })
}

/// `FILE:LINE` of `loc`.
fn at(loaded: &Loaded, loc: crate::config::Loc) -> String {
    let f = &loaded.sources[loc.file];
    format!("{}:{}", f.name, f.line_col(loc.span.offset()).0)
}

/// `"X"` inside the first pair of double quotes of `rule` (`block "X"` -> `X`).
fn quoted(rule: &str) -> Option<&str> {
    let start = rule.find('"')? + 1;
    let end = start + rule[start..].find('"')?;
    Some(&rule[start..end])
}

fn why(target: &str, kind: Kind, decision: &str, rule: String, from: String) -> Why {
    Why {
        target: target.to_string(),
        kind,
        decision: decision.to_string(),
        rule,
        from,
        change: None,
        notes: Vec::new(),
    }
}

fn path(plan: &Plan, loaded: &Loaded, cwd: &Path, target: &str) -> Why {
    let abs = crate::git::lexical_join(cwd, Path::new(target));
    let rel = abs
        .strip_prefix(&plan.project)
        .ok()
        .map(|r| r.to_string_lossy().into_owned());
    let shown = abs.display().to_string();
    let allow_hint = |rel: &str| {
        format!(
            "`allow \"{rel}\"` in sandbox.kdl (a loosening: the next run asks, or approve it with `aisb trust`)"
        )
    };
    // Masked: the file or a directory above it.
    if let Some(m) = plan
        .masks
        .iter()
        .filter(|m| m.path == abs || (m.dir && abs.starts_with(&m.path)))
        .max_by_key(|m| m.path.components().count())
    {
        let mut w = why(&shown, Kind::Path, "masked", m.rule.clone(), String::new());
        let pattern = quoted(&m.rule).unwrap_or("");
        w.from = if m.rule.starts_with("block ") {
            written_at(loaded, pattern, |s| s.block.iter().collect())
                .unwrap_or_else(|| "a `block` rule of an imported preset".into())
        } else if m.rule.starts_with("sensitive ") {
            "aisb's built-in secret patterns (`secrets { defaults #false }` turns them all off)"
                .into()
        } else if m.rule == "gitignored" {
            "git ignores it, and aisb hides what git ignores (the gitignored layer)".into()
        } else if m.rule == "git-crypt" {
            "`.gitattributes` names git-crypt for it (the git-crypt layer)".into()
        } else if m.rule.starts_with("home ") {
            "aisb's built-in secret paths in the home".into()
        } else {
            "aisb".into()
        };
        if m.path != abs {
            w.notes.push(format!(
                "the directory {} is masked as a whole",
                m.path.display()
            ));
        }
        if plan.kept_masked.contains(&m.path) {
            w.notes.push(
                "kept masked: an earlier run of this sandbox masked it, and the rules no longer would; `aisb trust` approves showing it".into(),
            );
        }
        w.notes
            .push("inside it reads as empty or \"Permission denied\"; its content never enters the sandbox".into());
        w.change = rel.as_deref().map(allow_hint);
        return w;
    }
    // A file the host's tools obey.
    if let Some(m) = plan
        .mounts
        .iter()
        .filter(|m| crate::eval::protect::is_protect_mount(m))
        .find(|m| abs == m.target || abs.starts_with(&m.target))
    {
        let mut w = why(
            &shown,
            Kind::Path,
            "read-only",
            m.why.clone(),
            "aisb: files the host's tools run or obey are policy (the list is `eval::protect`)"
                .into(),
        );
        let named = m
            .target
            .strip_prefix(&plan.project)
            .map(|r| r.display().to_string())
            .ok()
            .filter(|r| crate::eval::protect::openable(r).is_ok());
        w.change = Some(match named {
            Some(named) => format!(
                "edit it outside the sandbox; what the sandbox writes never becomes what the host runs (`unprotect \"{named}\"` in sandbox.kdl lets the sandbox write it: a loosening, asked about)"
            ),
            None => "edit it outside the sandbox; what the sandbox writes never becomes what the host runs".into(),
        });
        return w;
    }
    let absent_protected = plan
        .protected
        .iter()
        .find(|p| abs == p.path || (p.dir && abs.starts_with(&p.path)))
        .map(|p| p.why.clone())
        .or_else(|| {
            let rel = rel.as_deref()?;
            crate::eval::protect::nested(rel.as_bytes())
                .filter(|_| !plan.project_dirs.dirs.is_empty())
                .map(|(_, _, why)| why.to_string())
        });
    if let Some(obeys) = absent_protected {
        if abs.symlink_metadata().is_err() {
            let mut w = why(
                &shown,
                Kind::Path,
                "moved-aside",
                format!("protected: {obeys}"),
                "aisb: files the host's tools run or obey are policy (the list is `eval::protect`)"
                    .into(),
            );
            w.notes.push(
                "not there now: if the sandbox makes it, it is moved into the sandbox's quarantine when the run ends".into(),
            );
            return w;
        }
    }
    // Not there yet, but a pattern masks it as soon as it appears (the live layer).
    if let (Some(rel), Some(live)) = (rel.as_deref(), plan.live.as_ref()) {
        if abs.symlink_metadata().is_err() {
            if let Some(rule) = live.rule_for(rel, false) {
                let pattern = quoted(&rule).unwrap_or("").to_string();
                let mut w = why(&shown, Kind::Path, "masked", rule.clone(), String::new());
                w.from = if rule.starts_with("block ") {
                    written_at(loaded, &pattern, |s| s.block.iter().collect())
                        .unwrap_or_else(|| "a `block` rule of an imported preset".into())
                } else {
                    "aisb's built-in secret patterns".into()
                };
                w.notes.push(
                    "not there now: masked as soon as it appears while a sandbox runs (the live layer)"
                        .into(),
                );
                w.change = Some(allow_hint(rel));
                return w;
            }
        }
    }
    // The deepest mount that holds it.
    if let Some(m) = plan
        .mounts
        .iter()
        .filter(|m| abs.starts_with(&m.target))
        .max_by_key(|m| m.target.components().count())
    {
        let (decision, note) = match &m.kind {
            MountKind::Bind { writable: true, .. } => ("writable", "written in place on the host"),
            MountKind::Bind { .. } | MountKind::Generated { .. } => {
                ("read-only", "the host's file, read-only")
            }
            MountKind::Git { writable: true, .. } => ("writable", "part of the git directory"),
            MountKind::Git { .. } => ("read-only", "what the host's git would run, read-only"),
            MountKind::Overlay { .. } => (
                "copy-on-write",
                "the host's content; what the sandbox writes stays in a layer of its own",
            ),
            MountKind::Copy { .. } => (
                "copy-on-write",
                "a private copy; the host's file never changes",
            ),
            MountKind::Tmpfs { .. } => ("private", "empty at start, gone when the sandbox ends"),
            MountKind::State { .. } => ("private", "the sandbox's own state, kept between runs"),
        };
        let from = if m.why.starts_with("mount at ") || m.why.contains(".kdl:") {
            m.why.clone()
        } else {
            "aisb's plan for this sandbox (`aisb plan` lists every mount)".into()
        };
        let mut w = why(
            &shown,
            Kind::Path,
            decision,
            format!("{} [{}]", m.target.display(), m.why),
            from,
        );
        w.notes.push(note.into());
        if abs.symlink_metadata().is_err() {
            w.notes.push("it does not exist on the host now".into());
        }
        return w;
    }
    // /etc is a snapshot of some of its entries: one not in it is not there at all.
    let outside_snapshot = plan.system.iter().any(|s| match s {
        SystemPath::Snapshot { path, snapshot } => abs
            .strip_prefix(path)
            .ok()
            .and_then(|r| r.components().next())
            .is_some_and(|first| {
                !snapshot
                    .names
                    .iter()
                    .any(|n| std::ffi::OsStr::new(n) == first.as_os_str())
            }),
        _ => false,
    });
    if let Some(s) = plan
        .system
        .iter()
        .filter(|_| !outside_snapshot)
        .find(|s| match s {
            SystemPath::Bind { path }
            | SystemPath::Symlink { path, .. }
            | SystemPath::Snapshot { path, .. } => abs.starts_with(path),
            _ => false,
        })
    {
        let mut w = why(
            &shown,
            Kind::Path,
            "read-only",
            format!(
                "system path {}",
                match s {
                    SystemPath::Bind { path }
                    | SystemPath::Symlink { path, .. }
                    | SystemPath::Snapshot { path, .. } => path.display().to_string(),
                    _ => String::new(),
                }
            ),
            "aisb: the system's programs and libraries, read-only".into(),
        );
        if matches!(s, SystemPath::Snapshot { .. }) {
            w.notes.push("/etc is a snapshot of its allowlisted, world-readable entries; the rest is not visible".into());
        }
        return w;
    }
    let mut w = why(
        &shown,
        Kind::Path,
        "not-visible",
        if outside_snapshot {
            "not among the /etc entries the sandbox sees (its allowlisted, world-readable ones)"
                .into()
        } else {
            "no mount holds it".into()
        },
        "aisb: only the project, the system paths and what sandbox.kdl mounts are visible".into(),
    );
    w.change = Some(format!(
        "`mount \"{}\"` in sandbox.kdl (a loosening: the next run asks)",
        abs.display()
    ));
    w
}

fn domain(plan: &Plan, loaded: &Loaded, target: &str) -> Why {
    let (host, port) = match target.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => {
            (h.to_string(), p.parse::<u16>().unwrap_or(443))
        }
        _ => (target.to_string(), 443),
    };
    match plan.network.mode {
        NetMode::None => {
            let mut w = why(
                target,
                Kind::Domain,
                "refused",
                "network \"none\": the sandbox has no network at all".into(),
                written_at_mode(loaded).unwrap_or_else(|| "aisb's default".into()),
            );
            w.change = Some(format!(
                "`network {{ allow \"{host}\" }}` in sandbox.kdl (a loosening: the next run asks)"
            ));
            w
        }
        NetMode::Host => why(
            target,
            Kind::Domain,
            "allowed",
            "network \"host\": no network isolation at all".into(),
            written_at_mode(loaded).unwrap_or_else(|| "sandbox.kdl".into()),
        ),
        NetMode::Allow => {
            let policy = crate::proxy::policy::Policy::new(&crate::proxy::policy::PolicyConfig {
                allow: plan.network.allow.clone(),
                deny: plan.network.deny.clone(),
                localhost_ports: plan.network.localhost_ports.clone(),
                ..Default::default()
            });
            match policy.check(&host, port) {
                Ok(a) => {
                    let from = quoted(&a.rule)
                        .and_then(|r| written_at(loaded, r, |s| s.network.allow.iter().collect()))
                        .unwrap_or_else(|| {
                            "a preset's or a group's list (`aisb plan` shows the whole allowlist)"
                                .into()
                        });
                    let mut w = why(target, Kind::Domain, "allowed", a.rule, from);
                    w.notes.push(format!(
                        "port {port}, through the filtering proxy; every request is in `aisb audit`"
                    ));
                    w
                }
                Err(b) => {
                    let from = quoted(&b.rule)
                        .and_then(|r| written_at(loaded, r, |s| s.network.deny.iter().collect()))
                        .unwrap_or_else(|| {
                            "the allowlist (aisb refuses what it does not name)".into()
                        });
                    let mut w = why(target, Kind::Domain, "refused", b.rule, from);
                    w.notes.push(format!("port {port}"));
                    w.change = b
                        .hint
                        .map(|h| format!("{h} (a loosening: the next run asks)"));
                    w
                }
            }
        }
    }
}

fn written_at_mode(loaded: &Loaded) -> Option<String> {
    settings(loaded).find_map(|(_, s)| Some(at(loaded, s.network.mode.as_ref()?.loc)))
}

fn env(plan: &Plan, loaded: &Loaded, name: &str) -> Why {
    fn pick_pass(s: &Settings) -> Vec<&crate::config::model::S<String>> {
        s.env.pass.iter().chain(s.env.allow.iter()).collect()
    }
    if plan.env.vars.iter().any(|(k, _)| k == name) {
        let set_at = settings(loaded).find_map(|(_, s)| {
            s.env
                .set
                .iter()
                .find(|(k, _)| k.value == name)
                .map(|(k, _)| at(loaded, k.loc))
        });
        let (rule, from) = if let Some(at) = set_at {
            ("env set: a value the configuration gives".to_string(), at)
        } else if let Some(at) = written_at(loaded, name, pick_pass) {
            ("env pass: the caller's value passed in".to_string(), at)
        } else {
            (
                "set by aisb or on its safe list (inherit \"safe\")".to_string(),
                "aisb".to_string(),
            )
        };
        let mut w = why(name, Kind::Env, "passed", rule, from);
        w.notes.push("values are never shown".into());
        return w;
    }
    if let Some(d) = plan.env.dropped.iter().find(|d| d.name == name) {
        let mut w = why(
            name,
            Kind::Env,
            "dropped",
            d.reason.clone(),
            "aisb's environment filter".into(),
        );
        w.change = Some(format!(
            "`env {{ pass \"{name}\" }}` in sandbox.kdl passes your value in (a loosening: the next run asks)"
        ));
        return w;
    }
    let mut w = why(
        name,
        Kind::Env,
        "absent",
        "not in your environment here, and nothing sets it".into(),
        "-".into(),
    );
    w.change = Some(format!(
        "`env {{ set \"{name}\" \"VALUE\" }}` in sandbox.kdl"
    ));
    w
}

fn tool(plan: &Plan, target: &str, agent: &str, cwd: &Path, home: &Path) -> Why {
    let t = target.trim();
    let (name, arg) = match t.split_once('(') {
        Some((n, rest)) => (n.trim(), rest.strip_suffix(')').unwrap_or(rest)),
        None => (t, ""),
    };
    let input = match name {
        "Bash" | "Shell" | "run_shell_command" => serde_json::json!({ "command": arg }),
        "WebFetch" | "web_fetch" => serde_json::json!({ "url": arg }),
        "Read" | "Write" | "Edit" | "MultiEdit" | "read_file" | "write_file" | "replace" => {
            serde_json::json!({ "file_path": arg, "absolute_path": arg })
        }
        _ => serde_json::json!({}),
    };
    let call = crate::tools::Call {
        agent,
        tool: name,
        input: &input,
        cwd,
        home,
    };
    match plan.tools.decide(&call) {
        Some(r) => {
            let mut w = why(target, Kind::Tool, "refused", r.rule, r.at);
            w.notes
                .push(format!("for {agent}: {}", crate::tools::enforcement(agent)));
            w
        }
        None => {
            let rule = if plan.tools.is_empty() {
                "no tool rules: the agent's own permission prompts decide".to_string()
            } else {
                "no rule denies it".to_string()
            };
            let mut w = why(
                target,
                Kind::Tool,
                "allowed",
                rule,
                "sandbox.kdl's `tools` (none match)".into(),
            );
            w.notes
                .push("the sandbox still holds whatever the call does (files, network)".into());
            w
        }
    }
}
