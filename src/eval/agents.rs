//! Agents' own permission layers, made to mirror the sandbox (seed 001), and the audit trail of
//! their tool calls.
//!
//! Claude Code reads `/etc/claude-code/managed-settings.json` first: nothing in the project,
//! the user's settings or the command line overrides it. For a sandbox that imports
//! `preset:claude`, aisb writes that file (in the store, named by its content, mounted read-only
//! over the sandbox's `/etc/claude-code`), saying what the sandbox enforces anyway:
//!
//! | sandbox                         | managed settings                                    |
//! |---------------------------------|-----------------------------------------------------|
//! | masked path `P` (file / dir)    | deny `Read(//P)`, `Edit(//P)` (dir: `//P/**`)       |
//! | ~/.ssh, ~/.aws, ~/.gnupg hidden | deny `Read(~/.ssh/**)`, …                            |
//! | read-only project               | deny `Edit(**)`, `Write(**)`, `NotebookEdit`        |
//! | network "none"                  | deny `WebFetch`, `WebSearch`                        |
//! | allowlist                       | allow `WebFetch(domain:D)`, `sandbox.network.allowedDomains` |
//! | commands run sandboxed          | allow `Bash` (seed 001's `autoAllowBashIfSandboxed`) |
//! | (always)                        | `sandbox.enabled: false`, a `PreToolUse` hook, a `PostToolUse`/`PostToolUseFailure` hook |
//!
//! `sandbox.enabled` is false on purpose: aisb is the OS-level sandbox, and Claude Code's own
//! (bubblewrap) cannot start inside it, since user namespaces are refused there; a project's
//! `.claude/settings.json` turning it on would otherwise make every command fail. The hook runs
//! `/run/aisb/init agent-event claude` before each tool call, which puts the call into the
//! sandbox's audit log through the proxy socket (when the sandbox has a network proxy), and
//! `/run/aisb/init agent-result claude` after it, which hands the model what the sandbox
//! refused during the call (`proxy::feedback`). An
//! enterprise policy already in the host's `/etc/claude-code/managed-settings.json` is kept:
//! its rules come first, aisb's are added.
//!
//! For a named sandbox the same settings are also written into the clone as
//! `.claude/settings.local.json` (excluded from git there), never into the host repository.
//!
//! Gemini CLI reads `/etc/gemini-cli/settings.json` above the user's and the workspace's
//! settings: for `preset:gemini` it lists in `tools.exclude` the tools the sandbox refuses
//! anyway (`write_file` and `replace` in a read-only profile, `web_fetch` and
//! `google_web_search` without network), so the model is never offered them.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use std::collections::BTreeMap;

use super::plan::{GeneratedFile, Mount, MountKind, NetMode, Plan};
use crate::tools::Policy;

/// Where Claude Code reads its managed (highest-precedence) settings.
pub const CLAUDE_MANAGED_DIR: &str = "/etc/claude-code";
pub const CLAUDE_MANAGED_FILE: &str = "managed-settings.json";
/// Deny rules written per masked path, at most (a project with more masked paths gets the
/// first ones; the sandbox hides them all regardless).
const MAX_PATH_RULES: usize = 2000;

/// Gemini CLI's system settings (they override the user's and the workspace's).
pub const GEMINI_SYSTEM_DIR: &str = "/etc/gemini-cli";
pub const GEMINI_SYSTEM_FILE: &str = "settings.json";

/// Each agent whose permission layer aisb writes: preset, directory and file inside, store
/// name, what builds the settings from the plan (and the host's own file), why.
type Builder = fn(&Plan, Option<Value>) -> Value;
const MIRRORS: [(&str, &str, &str, &str, Builder, &str); 2] = [
    (
        "claude",
        CLAUDE_MANAGED_DIR,
        CLAUDE_MANAGED_FILE,
        "claude-managed",
        claude_settings,
        "Claude Code's managed settings, mirroring this sandbox (preset:claude)",
    ),
    (
        "gemini",
        GEMINI_SYSTEM_DIR,
        GEMINI_SYSTEM_FILE,
        "gemini-system",
        gemini_settings,
        "Gemini CLI's system settings, mirroring this sandbox (preset:gemini)",
    ),
];

/// The host's own settings files for each agent aisb mirrors (an enterprise policy), by
/// agent: read once with the other host facts ([`super::Host`]), so evaluating stays pure.
pub fn host_policies() -> BTreeMap<String, Value> {
    MIRRORS
        .iter()
        .filter_map(|(agent, dir, file, ..)| {
            Some((agent.to_string(), read_json(&Path::new(dir).join(file))?))
        })
        .collect()
}

/// Add what the agents in `agents` (preset names) need to mirror `plan`; `host_policies`
/// (from [`host_policies`]) are kept under aisb's rules.
pub fn mirror(plan: &mut Plan, agents: &[&str], host_policies: &BTreeMap<String, Value>) {
    plan.tools.agents = agents.iter().map(|a| a.to_string()).collect();
    for (agent, dir, file, name, build, why) in MIRRORS {
        if agents.contains(&agent) {
            let settings = build(plan, host_policies.get(agent).cloned());
            add(plan, dir, file, name, &settings, why);
        }
    }
    if agents.is_empty() || plan.tools.is_empty() {
        return;
    }
    // What aisb's own pre-tool hook decides from (`init agent-event`).
    let mut policy = plan.tools.clone();
    let env = crate::eval::BREAK_ISOLATION_ENV;
    if std::env::var(env).as_deref() == Ok("tools") {
        // A hook that refuses nothing, so `aisb test` can prove it notices (a test of the tests).
        eprintln!("aisb: WARNING: {env}=tools: the tool policy is not enforced in this sandbox (a test of the tests)");
        policy.allow.clear();
        policy.deny.clear();
    }
    let policy = serde_json::to_value(&policy).unwrap_or_default();
    add(
        plan,
        crate::tools::POLICY_DIR,
        crate::tools::POLICY_FILE,
        "tool-policy",
        &policy,
        "the tool policy aisb's pre-tool hook enforces (tools)",
    );
    if agents.contains(&"opencode") {
        let host = read_json(&Path::new(OPENCODE_MANAGED_DIR).join(OPENCODE_MANAGED_FILE));
        let settings = opencode_settings(plan, host);
        add(
            plan,
            OPENCODE_MANAGED_DIR,
            OPENCODE_MANAGED_FILE,
            "opencode-managed",
            &settings,
            "OpenCode's managed config, the sandbox's tool policy as `permission` (preset:opencode)",
        );
    }
    if agents.contains(&"codex") {
        if let Some(toml) = codex_requirements(plan) {
            add_text(
                plan,
                CODEX_SYSTEM_DIR,
                CODEX_REQUIREMENTS_FILE,
                "codex-requirements",
                toml,
                "Codex's requirements, what its format can say of the tool policy (preset:codex)",
            );
        }
    }
}

/// OpenCode's managed (highest-precedence) config directory on Linux.
pub const OPENCODE_MANAGED_DIR: &str = "/etc/opencode";
pub const OPENCODE_MANAGED_FILE: &str = "opencode.json";
/// Codex's system directory; `requirements.toml` there constrains every other config layer.
pub const CODEX_SYSTEM_DIR: &str = "/etc/codex";
pub const CODEX_REQUIREMENTS_FILE: &str = "requirements.toml";

/// OpenCode's `permission` from the tool policy: a bare rule sets the tool's action, a
/// `Bash(prefix:*)` rule a command pattern (`"git push *": "deny"`); with an allow list, the
/// tools it does not name are denied. Path specifiers have no OpenCode form (the hook-less
/// client then relies on the sandbox).
pub fn opencode_settings(plan: &Plan, host_policy: Option<Value>) -> Value {
    let mut perm = Map::new();
    let mut set = |key: &str, pattern: Option<&str>, action: &str| match pattern {
        None => {
            perm.insert(key.into(), json!(action));
        }
        Some(p) => {
            let entry = perm.entry(key.to_string()).or_insert_with(|| json!({}));
            if let Value::String(before) = entry {
                // The tool's bare action becomes the default its patterns refine.
                *entry = json!({ "*": before.clone() });
            }
            entry[p] = json!(action);
        }
    };
    let tools = &plan.tools;
    if !tools.allow.is_empty() {
        for key in [
            "read",
            "edit",
            "bash",
            "webfetch",
            "websearch",
            "glob",
            "grep",
            "list",
        ] {
            let allowed = Policy::for_agent(&tools.allow, "opencode");
            if !allowed.iter().any(|r| r.split('(').next() == Some(key)) {
                set(key, None, "deny");
            }
        }
    }
    for (list, action) in [(&tools.allow, "allow"), (&tools.deny, "deny")] {
        for r in Policy::for_agent(list, "opencode") {
            let Ok((name, spec)) = crate::tools::parse(&r) else {
                continue;
            };
            match spec {
                None => set(name, None, action),
                Some(s) if name == "bash" => {
                    let p = s
                        .strip_suffix(":*")
                        .map_or(s.to_string(), |p| format!("{p} *"));
                    set(name, Some(&p), action);
                }
                Some(_) => {}
            }
        }
    }
    // Denials last, so a bare deny overrides an allow pattern for the same tool.
    for r in Policy::for_agent(&tools.deny, "opencode") {
        if let Ok((name, None)) = crate::tools::parse(&r) {
            set(name, None, "deny");
        }
    }
    merge_settings(host_policy, &json!({ "permission": perm }))
}

/// Codex's `requirements.toml`, when the policy says something Codex can be held to: a denied
/// `WebSearch` allows only the `disabled` web search mode. Codex has no per-tool switches for
/// shell or edits (its own sandbox modes cannot start inside aisb's); those rest on the sandbox.
pub fn codex_requirements(plan: &Plan) -> Option<String> {
    let denied = Policy::for_agent(&plan.tools.deny, "claude");
    let allow = Policy::for_agent(&plan.tools.allow, "claude");
    let no_search = denied.iter().any(|r| r == "WebSearch")
        || (!allow.is_empty() && !allow.iter().any(|r| r == "WebSearch"));
    no_search.then(|| "allowed_web_search_modes = [\"disabled\"]\n".to_string())
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Mount `settings` as `dir/file` inside, from a store entry named by its content.
fn add(plan: &mut Plan, dir: &str, file: &str, name: &str, settings: &Value, why: &str) {
    let content = serde_json::to_string_pretty(settings).unwrap_or_default() + "\n";
    add_text(plan, dir, file, name, content, why);
}

fn add_text(plan: &mut Plan, dir: &str, file: &str, name: &str, content: String, why: &str) {
    let hash = format!("{:x}", Sha256::digest(content.as_bytes()));
    plan.mounts.push(Mount {
        target: PathBuf::from(dir),
        kind: MountKind::Generated {
            dir: plan.store.join(format!("{}-{name}", &hash[..32])),
            files: vec![GeneratedFile {
                name: file.into(),
                content,
            }],
        },
        why: why.into(),
    });
}

/// Gemini CLI settings that say what `plan` enforces, on top of `host_policy`: the tools the
/// sandbox would refuse anyway are excluded (edits in a read-only profile, web tools without
/// network), so the model is not offered them.
pub fn gemini_settings(plan: &Plan, host_policy: Option<Value>) -> Value {
    let mut exclude: Vec<&str> = Vec::new();
    if !plan.project_writable() {
        exclude.extend(["write_file", "replace"]);
    }
    if plan.network.mode == NetMode::None {
        exclude.extend(["web_fetch", "google_web_search"]);
    }
    let mut exclude: Vec<String> = exclude.into_iter().map(String::from).collect();
    // The tool policy: Gemini's own syntax for a command prefix is `run_shell_command(git push)`;
    // a path specifier has no Gemini form (the hook decides those).
    let gemini_rule = |r: String| match crate::tools::parse(&r) {
        Ok((name, Some(spec))) if name == "run_shell_command" => {
            spec.strip_suffix(":*").map(|p| format!("{name}({p})"))
        }
        Ok((_, Some(_))) | Err(_) => None,
        Ok((_, None)) => Some(r),
    };
    for r in Policy::for_agent(&plan.tools.deny, "gemini")
        .into_iter()
        .filter_map(gemini_rule)
    {
        if !exclude.contains(&r) {
            exclude.push(r);
        }
    }
    let mut tools = json!({ "exclude": exclude });
    if !plan.tools.allow.is_empty() {
        let core: Vec<String> = Policy::for_agent(&plan.tools.allow, "gemini")
            .into_iter()
            .filter_map(gemini_rule)
            .collect();
        tools["core"] = json!(core);
    }
    // Before each call (the tool policy, the audit log, the call's start) and after it (what
    // the sandbox refused during it, for the model).
    let ours = json!({
        "tools": tools,
        "hooks": { "BeforeTool": [hook("gemini")], "AfterTool": [after_hook("gemini")] },
    });
    merge_settings(host_policy, &ours)
}

/// aisb's pre-tool hook for `agent`, in the form Claude Code and Gemini CLI share (Claude
/// Code counts the timeout in seconds, Gemini CLI in milliseconds).
fn hook(agent: &str) -> Value {
    json!({
        "matcher": "*",
        "hooks": [{
            "type": "command",
            "command": format!("{} agent-event {agent}", crate::vocab::INIT_PATH),
            "timeout": if agent == "gemini" { 5000 } else { 5 }
        }]
    })
}

/// aisb's post-tool hook for `agent`: what the sandbox refused during the call goes back to
/// the model with the tool's result (`init agent-result`, `proxy::feedback`).
fn after_hook(agent: &str) -> Value {
    json!({
        "matcher": "*",
        "hooks": [{
            "type": "command",
            "command": format!("{} agent-result {agent}", crate::vocab::INIT_PATH),
            "timeout": if agent == "gemini" { 5000 } else { 5 }
        }]
    })
}

/// Claude Code settings that say what `plan` enforces, on top of `host_policy`.
pub fn claude_settings(plan: &Plan, host_policy: Option<Value>) -> Value {
    let mut deny: Vec<String> = Vec::new();
    for m in plan.masks.iter().take(MAX_PATH_RULES) {
        let p = m.path.to_string_lossy();
        let pattern = if m.dir {
            format!("/{p}/**")
        } else {
            format!("/{p}")
        };
        deny.push(format!("Read({pattern})"));
        deny.push(format!("Edit({pattern})"));
    }
    for d in [".ssh", ".aws", ".gnupg"] {
        deny.push(format!("Read(~/{d}/**)"));
        deny.push(format!("Edit(~/{d}/**)"));
    }
    let mut allow = vec!["Bash".to_string()];
    if plan.project_writable() {
        allow.extend(["Edit".into(), "Write".into(), "NotebookEdit".into()]);
    } else {
        deny.extend(["Edit(**)".into(), "Write(**)".into(), "NotebookEdit".into()]);
    }
    // The tool policy, as Claude Code names it: its allow rules pre-approve, and a tool it
    // refuses is not pre-approved by the sandbox's own rules above. Its denials are the
    // managed PreToolUse hook's to enforce, not `permissions.deny`: Claude Code checks its own
    // rules before any hook runs (a bare name even takes the tool from the model), so the
    // attempt would be refused without a trace in the audit log.
    let refused = |t: &str| {
        plan.tools
            .decide(&crate::tools::Call {
                agent: "claude",
                tool: t,
                input: &Value::Null,
                cwd: Path::new("/"),
                home: Path::new("/"),
            })
            .is_some()
    };
    allow.retain(|a| !refused(a));
    for r in Policy::for_agent(&plan.tools.allow, "claude") {
        if !allow.contains(&r) {
            allow.push(r);
        }
    }

    let domains: Vec<String> = match plan.network.mode {
        NetMode::Allow => plan
            .network
            .allow
            .iter()
            // Only names: an IP literal or a port-qualified rule is not a WebFetch domain.
            .filter(|d| !d.contains(':') && d.parse::<std::net::IpAddr>().is_err())
            .cloned()
            .collect(),
        NetMode::None => {
            deny.extend(["WebFetch".into(), "WebSearch".into()]);
            vec![]
        }
        NetMode::Host => vec![],
    };
    if !refused("WebFetch") {
        allow.extend(domains.iter().map(|d| format!("WebFetch(domain:{d})")));
    }
    let hook = hook("claude");

    let ours = json!({
        "permissions": { "allow": allow, "deny": deny },
        "sandbox": { "enabled": false, "network": { "allowedDomains": domains } },
        // After a call, failed or not: what the sandbox refused during it, for the model.
        "hooks": {
            "PreToolUse": [hook],
            "PostToolUse": [after_hook("claude")],
            "PostToolUseFailure": [after_hook("claude")],
            "PermissionDenied": [after_hook("claude")],
        },
    });
    merge_settings(host_policy, &ours)
}

/// `ours` over `base`: list entries appended (once), `sandbox.enabled` and
/// `sandbox.network.allowedDomains` replaced, everything else of `base` kept.
fn merge_settings(base: Option<Value>, ours: &Value) -> Value {
    fn merge(base: &mut Map<String, Value>, ours: &Map<String, Value>) {
        for (k, v) in ours {
            match (base.get_mut(k), v) {
                (Some(Value::Object(b)), Value::Object(o)) => merge(b, o),
                (Some(Value::Array(b)), Value::Array(o)) if k != "allowedDomains" => {
                    for item in o {
                        if !b.contains(item) {
                            b.push(item.clone());
                        }
                    }
                }
                _ => {
                    base.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let mut root = match base {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    if let Value::Object(o) = ours {
        merge(&mut root, o);
    }
    Value::Object(root)
}
