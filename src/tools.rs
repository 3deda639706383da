//! Agent tool permissions as policy (issue 23): which tools an agent in the sandbox may call.
//!
//! A profile says `tools { allow "Read" "Bash(git status:*)"; deny "Write" "Edit" }`. Names are
//! the agent-neutral ones people know from Claude Code (`Read`, `Write`, `Edit`, `Bash`,
//! `WebFetch`, `WebSearch`, `Glob`, `Grep`, `LS`, `NotebookEdit`), mapped per agent by
//! [`NEUTRAL`]; any other name is one agent's own tool and is passed through to the agents
//! whose vocabulary it is not foreign to. A rule may carry Claude's specifier in parentheses:
//! `Bash(git push:*)` (a command prefix), `Read(//etc/**)` / `Edit(~/x/**)` / `Write(src/*)` (a
//! path glob: `//` absolute, `~/` home, otherwise below the working directory),
//! `WebFetch(domain:example.com)` (that host and its subdomains).
//!
//! Decisions ([`Policy::decide`]): a matching `deny` rule refuses the call; when `allow` has
//! rules, a call none of them matches is refused too; everything else is left to the agent.
//! Profiles append to both lists, so a child profile can never remove a parent's `deny`.
//!
//! Where it is enforced: the policy is written into each agent's highest-precedence
//! permission layer (`crate::agents`), and aisb's own pre-tool hook (`init agent-event`) reads
//! it from [`POLICY_DIR`]/[`POLICY_FILE`] (generated, read-only inside) and refuses with the
//! rule's reason, whatever the agent's own settings or flags say.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where the policy is mounted inside the sandbox for the hook (read-only, generated).
pub const POLICY_DIR: &str = "/etc/aisb";
pub const POLICY_FILE: &str = "tools.json";
/// The longest rule accepted (a rule is one line of policy, not a document).
pub const MAX_RULE: usize = 1000;
/// The most rules in one list, after merging (bounds the hook's work per call).
pub const MAX_RULES: usize = 500;

/// The effective tool policy of a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    /// The agent presets the sandbox imports (their layers mirror the policy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<String>,
}

/// One rule as written, and where (`sandbox.kdl:12`, `preset:claude:3`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub rule: String,
    pub at: String,
}

/// Why a call was refused: the rule (`deny "Write"`, or the allow list it is not in) and where
/// that rule was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: String,
    pub at: String,
}

impl Refusal {
    /// The reason given to the agent (and through it to the model).
    pub fn reason(&self) -> String {
        format!(
            "aisb: this tool call is refused by the sandbox's tool policy ({}, {})",
            self.rule, self.at
        )
    }
}

/// The agents aisb knows the tool vocabulary of, in [`NEUTRAL`]'s column order.
pub const AGENTS: [&str; 5] = ["claude", "gemini", "codex", "opencode", "aider"];

/// Each neutral name and what it is called by each agent in [`AGENTS`] order (checked against
/// the installed clients: Claude Code 2.1, Gemini CLI 0.61's `*_TOOL_NAME`s, OpenCode 1.18's
/// `permission` keys). Codex and Aider have no per-tool switches (an empty list: nothing of
/// theirs to name; the README says what holds for them instead).
pub const NEUTRAL: &[(&str, [&[&str]; 5])] = &[
    (
        "Read",
        [
            &["Read"],
            &["read_file", "read_many_files"],
            &[],
            &["read"],
            &[],
        ],
    ),
    ("Write", [&["Write"], &["write_file"], &[], &["edit"], &[]]),
    (
        "Edit",
        [
            &["Edit", "MultiEdit", "NotebookEdit"],
            &["replace"],
            &[],
            &["edit"],
            &[],
        ],
    ),
    (
        "NotebookEdit",
        [&["NotebookEdit"], &[], &[], &["edit"], &[]],
    ),
    (
        "Bash",
        [&["Bash"], &["run_shell_command"], &[], &["bash"], &[]],
    ),
    (
        "WebFetch",
        [&["WebFetch"], &["web_fetch"], &[], &["webfetch"], &[]],
    ),
    (
        "WebSearch",
        [
            &["WebSearch"],
            &["google_web_search"],
            &[],
            &["websearch"],
            &[],
        ],
    ),
    ("Glob", [&["Glob"], &["glob"], &[], &["glob"], &[]]),
    ("Grep", [&["Grep"], &["grep_search"], &[], &["grep"], &[]]),
    ("LS", [&["LS"], &["list_directory"], &[], &["list"], &[]]),
];

fn column(agent: &str) -> Option<usize> {
    AGENTS.iter().position(|a| *a == agent)
}

/// A rule split into its tool name and its specifier (`Bash(git push:*)` is `Bash`,
/// `git push:*`), or why it is not a rule.
pub fn parse(rule: &str) -> Result<(&str, Option<&str>), String> {
    if rule.len() > MAX_RULE {
        return Err(format!("longer than {MAX_RULE} bytes"));
    }
    if rule.chars().any(char::is_control) {
        return Err("contains a control character".into());
    }
    let (name, spec) = match rule.split_once('(') {
        Some((name, rest)) => match rest.strip_suffix(')') {
            Some(spec) if !spec.is_empty() => (name, Some(spec)),
            Some(_) => return Err("has an empty `()`".into()),
            None => return Err("opens `(` without closing it at the end".into()),
        },
        None => (rule, None),
    };
    let ok = |c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c);
    if name.is_empty() || !name.chars().all(ok) || name.len() > 100 {
        return Err(format!(
            "`{name}` is not a tool name (letters, digits, `_`, `-`, `.`, `:`)"
        ));
    }
    Ok((name, spec))
}

/// What `name` (neutral or an agent's own) is called by `agent`: the neutral names mapped,
/// another agent's own name nothing, any other name itself (that agent's own tool, or an
/// MCP tool).
pub fn names_for(agent: &str, name: &str) -> Vec<String> {
    let Some(col) = column(agent) else {
        return vec![name.to_string()];
    };
    if let Some((_, per)) = NEUTRAL.iter().find(|(n, _)| *n == name) {
        return per[col].iter().map(|s| s.to_string()).collect();
    }
    let foreign = NEUTRAL.iter().any(|(_, per)| {
        per.iter()
            .enumerate()
            .any(|(i, names)| i != col && names.contains(&name) && !per[col].contains(&name))
    });
    if foreign {
        vec![]
    } else {
        vec![name.to_string()]
    }
}

/// A tool call as an agent's hook reports it.
pub struct Call<'a> {
    pub agent: &'a str,
    pub tool: &'a str,
    pub input: &'a Value,
    /// The agent's working directory (relative path rules are below it).
    pub cwd: &'a Path,
    pub home: &'a Path,
}

impl Policy {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    /// Whether `call` is refused, and by which rule.
    pub fn decide(&self, call: &Call<'_>) -> Option<Refusal> {
        if let Some(r) = self.deny.iter().find(|r| matches(&r.rule, call, true)) {
            return Some(Refusal {
                rule: format!("deny {:?}", r.rule),
                at: r.at.clone(),
            });
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|r| matches(&r.rule, call, false)) {
            let listed: Vec<String> = self.allow.iter().map(|r| format!("{:?}", r.rule)).collect();
            return Some(Refusal {
                rule: format!("not in allow {}", listed.join(" ")),
                at: self.allow[0].at.clone(),
            });
        }
        None
    }

    /// The rules of `list` as `agent` names them (a neutral rule may become several, another
    /// agent's own rule none), the specifier kept.
    pub fn for_agent(list: &[Rule], agent: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in list {
            let Ok((name, spec)) = parse(&r.rule) else {
                continue;
            };
            for n in names_for(agent, name) {
                let s = match spec {
                    Some(s) => format!("{n}({s})"),
                    None => n,
                };
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out
    }
}

/// How each agent is held to the policy (the README's table, in one line each).
pub fn enforcement(agent: &str) -> &'static str {
    match agent {
        "claude" => "managed settings: allow rules, and aisb's PreToolUse hook refusing and logging the denials (--dangerously-skip-permissions too)",
        "gemini" => "system settings tools.exclude/core + aisb's BeforeTool hook (refuses and logs, --yolo too)",
        "opencode" => "managed config `permission` (no hook: refusals are not in the audit log)",
        "codex" => "requirements.toml: web search off when denied; shell and edits only by the sandbox",
        "aider" => "no tool switches: only the sandbox (read-only project, network policy)",
        _ => "not an agent aisb knows",
    }
}

impl Policy {
    /// The effective lists per agent preset, for `aisb plan` and `aisb test`: one line per
    /// list, then how that agent is held to them.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, list) in [("allow", &self.allow), ("deny", &self.deny)] {
            for r in list {
                out.push(format!("{name:<6} {:<30} [{}]", r.rule, r.at));
            }
        }
        if self.allow.is_empty() {
            out.push("allow  (no list: every tool not denied)".into());
        }
        for agent in &self.agents {
            out.push(format!("{agent}:"));
            for (name, list) in [("allow", &self.allow), ("deny", &self.deny)] {
                let names = Policy::for_agent(list, agent);
                if !list.is_empty() {
                    let shown = if names.is_empty() {
                        "(nothing this agent can name)".to_string()
                    } else {
                        names.join(" ")
                    };
                    out.push(format!("  {name:<6} {shown}"));
                }
            }
            out.push(format!("  by     {}", enforcement(agent)));
        }
        out
    }
}

/// Whether `rule` covers `call`. `deny` decides how a compound shell command is read: a deny
/// matches when any of its parts does, an allow only when all do.
fn matches(rule: &str, call: &Call<'_>, deny: bool) -> bool {
    let Ok((name, spec)) = parse(rule) else {
        return false;
    };
    if !names_for(call.agent, name).iter().any(|n| n == call.tool) {
        return false;
    }
    let Some(spec) = spec else {
        return true;
    };
    let field = |k: &str| call.input.get(k).and_then(Value::as_str);
    if let Some(command) = field("command") {
        let parts = shell_parts(command);
        let hit = |p: &&str| command_matches(spec, p);
        return if deny {
            command_matches(spec, command.trim()) || parts.iter().any(hit)
        } else {
            !parts.is_empty() && parts.iter().all(hit)
        };
    }
    if let Some(url) = field("url") {
        if let Some(domain) = spec.strip_prefix("domain:") {
            return host_of(url).is_some_and(|h| {
                let d = domain.trim_end_matches('.').to_ascii_lowercase();
                h == d || h.ends_with(&format!(".{d}"))
            });
        }
    }
    let path = [
        "file_path",
        "notebook_path",
        "absolute_path",
        "path",
        "dir_path",
    ]
    .iter()
    .find_map(|k| field(k));
    if let Some(path) = path {
        // Both the path as named and where its links lead: a link the model made
        // (`ln -s /etc e`) does not step around `Read(//etc/**)`.
        let p = Path::new(path);
        let p = normal(&if p.is_absolute() {
            p.to_path_buf()
        } else {
            call.cwd.join(p)
        });
        let forms = [resolved(&p), p];
        let hit = |f: &PathBuf| path_matches(spec, f, call.cwd, call.home);
        return if deny {
            forms.iter().any(hit)
        } else {
            forms.iter().all(hit)
        };
    }
    // Any other input: the specifier as a glob over the input's JSON text.
    glob(spec).is_some_and(|g| g.is_match(call.input.to_string()))
}

/// `git push:*` is a prefix (the command or the command and arguments); otherwise a glob over
/// the whole command.
fn command_matches(spec: &str, command: &str) -> bool {
    if let Some(prefix) = spec.strip_suffix(":*") {
        return command == prefix
            || command
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with(char::is_whitespace));
    }
    if spec.contains('*') {
        return glob_text(spec).is_some_and(|g| g.is_match(command));
    }
    command == spec
}

/// The simple commands of a shell line (split at `;`, `&`, `|`, newlines, `$(`, backquotes),
/// trimmed, so `true && git push` is seen as `git push` too. Not a shell parser: a deny on a
/// command prefix is best effort (deny `Bash` to be sure), which the README says.
fn shell_parts(command: &str) -> Vec<&str> {
    command
        .split([';', '&', '|', '\n', '`', '(', ')'])
        .map(|p| p.trim().trim_start_matches('$').trim())
        .filter(|p| !p.is_empty())
        .collect()
}

fn host_of(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

/// Claude Code's path rule forms: `//abs`, `~/below-home`, `/below-cwd` and `below-cwd`;
/// `path` is absolute and normal.
fn path_matches(spec: &str, path: &Path, cwd: &Path, home: &Path) -> bool {
    let pattern = if let Some(abs) = spec.strip_prefix("//") {
        PathBuf::from("/").join(abs)
    } else if let Some(h) = spec.strip_prefix("~/") {
        home.join(h)
    } else {
        cwd.join(spec.trim_start_matches('/'))
    };
    glob(&pattern.to_string_lossy()).is_some_and(|g| g.is_match(path))
}

/// `p` with the links of its longest existing ancestor resolved (the rest may not exist yet:
/// a file about to be written). The hook runs inside the sandbox, so this is the agent's view.
fn resolved(p: &Path) -> PathBuf {
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    let mut cur = p;
    loop {
        if let Ok(real) = std::fs::canonicalize(cur) {
            return rest.iter().rev().fold(real, |acc, c| acc.join(c));
        }
        match (cur.parent(), cur.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                cur = parent;
            }
            _ => return p.to_path_buf(),
        }
    }
}

/// `..` and `.` resolved by text (the path names a file the agent is about to touch, which may
/// not exist yet), so `/p/src/../.env` is `/p/.env` for matching.
fn normal(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

fn glob(pattern: &str) -> Option<globset::GlobMatcher> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .ok()
        .map(|g| g.compile_matcher())
}

fn glob_text(pattern: &str) -> Option<globset::GlobMatcher> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(false)
        .build()
        .ok()
        .map(|g| g.compile_matcher())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        let rule = |r: &&str| Rule {
            rule: r.to_string(),
            at: "sandbox.kdl:1".into(),
        };
        Policy {
            allow: allow.iter().map(rule).collect(),
            deny: deny.iter().map(rule).collect(),
            agents: vec![],
        }
    }

    fn decide(p: &Policy, agent: &str, tool: &str, input: Value) -> Option<String> {
        p.decide(&Call {
            agent,
            tool,
            input: &input,
            cwd: Path::new("/p"),
            home: Path::new("/home/u"),
        })
        .map(|r| r.rule)
    }

    #[test]
    fn neutral_names_are_mapped_per_agent_and_foreign_ones_dropped() {
        assert_eq!(names_for("gemini", "Write"), ["write_file"]);
        assert_eq!(
            names_for("claude", "Edit"),
            ["Edit", "MultiEdit", "NotebookEdit"]
        );
        assert_eq!(names_for("claude", "write_file"), Vec::<String>::new());
        assert_eq!(names_for("gemini", "write_file"), ["write_file"]);
        assert_eq!(names_for("claude", "mcp__gh__push"), ["mcp__gh__push"]);
        let p = policy(&[], &["Write", "Bash(git push:*)", "read_many_files"]);
        assert_eq!(
            Policy::for_agent(&p.deny, "gemini"),
            [
                "write_file",
                "run_shell_command(git push:*)",
                "read_many_files"
            ]
        );
        assert_eq!(
            Policy::for_agent(&p.deny, "claude"),
            ["Write", "Bash(git push:*)"]
        );
    }

    #[test]
    fn deny_wins_and_an_allow_list_refuses_the_rest() {
        let p = policy(&["Read", "Bash"], &["Write", "Edit"]);
        let w = json!({"file_path": "/p/x", "content": "y"});
        assert_eq!(
            decide(&p, "claude", "Write", w.clone()).as_deref(),
            Some("deny \"Write\"")
        );
        assert_eq!(
            decide(&p, "claude", "MultiEdit", w.clone()).as_deref(),
            Some("deny \"Edit\"")
        );
        assert_eq!(
            decide(&p, "gemini", "write_file", w.clone()).as_deref(),
            Some("deny \"Write\"")
        );
        assert_eq!(decide(&p, "claude", "Read", w.clone()), None);
        assert_eq!(
            decide(&p, "claude", "WebFetch", json!({"url": "https://x.test/"})).as_deref(),
            Some("not in allow \"Read\" \"Bash\"")
        );
        // No allow list: only the denials.
        let p = policy(&[], &["Write"]);
        assert_eq!(
            decide(&p, "claude", "WebFetch", json!({"url": "https://x"})),
            None
        );
    }

    #[test]
    fn specifiers_follow_claude_code_syntax() {
        let p = policy(
            &[],
            &[
                "Bash(git push:*)",
                "Read(//etc/**)",
                "Edit(~/.ssh/**)",
                "Write(*.lock)",
                "WebFetch(domain:evil.test)",
            ],
        );
        let bash = |c: &str| decide(&p, "claude", "Bash", json!({"command": c}));
        assert!(bash("git push origin main").is_some());
        assert!(bash("git push").is_some());
        assert!(
            bash("true && git push -f").is_some(),
            "a compound command is split"
        );
        assert!(bash("echo $(git push)").is_some());
        assert!(bash("git pushx").is_none());
        assert!(bash("git status").is_none());
        let read = |f: &str| decide(&p, "claude", "Read", json!({"file_path": f}));
        assert!(read("/etc/passwd").is_some());
        assert!(
            read("/p/../etc/shadow").is_some(),
            "`..` does not step around a rule"
        );
        assert!(read("/p/etc/x").is_none());
        assert!(decide(
            &p,
            "claude",
            "Edit",
            json!({"file_path": "/home/u/.ssh/id"})
        )
        .is_some());
        assert!(decide(&p, "claude", "Write", json!({"file_path": "Cargo.lock"})).is_some());
        assert!(decide(
            &p,
            "claude",
            "Write",
            json!({"file_path": "/p/sub/Cargo.lock"})
        )
        .is_none());
        let fetch = |u: &str| decide(&p, "claude", "WebFetch", json!({"url": u}));
        assert!(fetch("https://evil.test/a").is_some());
        assert!(fetch("https://A.Evil.Test./a").is_some());
        assert!(fetch("https://user@evil.test:8443/a").is_some());
        assert!(fetch("https://notevil.test/").is_none());
        // An allow with a specifier admits a compound command only when every part is allowed.
        let p = policy(&["Bash(git status:*)", "Read"], &[]);
        let bash = |c: &str| decide(&p, "claude", "Bash", json!({"command": c}));
        assert!(bash("git status -s").is_none());
        assert!(bash("git status; rm -rf /").is_some());
    }

    /// A link planted below the working directory does not step around a path denial, and
    /// does not smuggle a denied target into an allowed path.
    #[test]
    fn links_are_followed_for_path_rules() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("key"), "k").unwrap();
        let work = t.path().join("work");
        std::fs::create_dir(&work).unwrap();
        std::os::unix::fs::symlink(&secret, work.join("innocent")).unwrap();
        let deny = format!("Read(/{}/**)", secret.display());
        let p = policy(&[], &[&deny]);
        let call = |p: &Policy, file: &str| {
            p.decide(&Call {
                agent: "claude",
                tool: "Read",
                input: &json!({ "file_path": file }),
                cwd: &work,
                home: Path::new("/home/u"),
            })
        };
        assert!(call(&p, "innocent/key").is_some());
        assert!(call(&p, "innocent/not-yet").is_some());
        assert!(call(&p, "other").is_none());
        let allow = format!("Read(/{}/**)", work.display());
        let p = policy(&[&allow], &[]);
        assert!(call(&p, "other").is_none());
        assert!(
            call(&p, "innocent/key").is_some(),
            "the link leads out of the allowed tree"
        );
    }

    #[test]
    fn bad_rules_are_named() {
        assert!(parse("Bash(git").is_err());
        assert!(parse("Bash()").is_err());
        assert!(parse("Ba sh").is_err());
        assert!(parse("Read\n").is_err());
        assert!(parse(&"R".repeat(MAX_RULE + 1)).is_err());
        assert_eq!(parse("Bash(a(b))").unwrap(), ("Bash", Some("a(b)")));
    }
}
