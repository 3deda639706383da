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
//! | (always)                        | `sandbox.enabled: false`, a `PreToolUse` hook       |
//!
//! `sandbox.enabled` is false on purpose: aisb is the OS-level sandbox, and Claude Code's own
//! (bubblewrap) cannot start inside it, since user namespaces are refused there; a project's
//! `.claude/settings.json` turning it on would otherwise make every command fail. The hook runs
//! `/run/aisb/init agent-event claude` before each tool call, which puts the call into the
//! sandbox's audit log through the proxy socket (when the sandbox has a network proxy). An
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

use crate::eval::plan::{GeneratedFile, Mount, MountKind, NetMode, Plan};

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

/// Add what the agents in `agents` (preset names) need to mirror `plan`.
pub fn mirror(plan: &mut Plan, agents: &[&str]) {
    for (agent, dir, file, name, build, why) in MIRRORS {
        if agents.contains(&agent) {
            // The host's own file (an enterprise policy) is kept under aisb's rules.
            let host = read_json(&Path::new(dir).join(file));
            let settings = build(plan, host);
            add(plan, dir, file, name, &settings, why);
        }
    }
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Mount `settings` as `dir/file` inside, from a store entry named by its content.
fn add(plan: &mut Plan, dir: &str, file: &str, name: &str, settings: &Value, why: &str) {
    let content = serde_json::to_string_pretty(settings).unwrap_or_default() + "\n";
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
    merge_settings(host_policy, &json!({ "tools": { "exclude": exclude } }))
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
    allow.extend(domains.iter().map(|d| format!("WebFetch(domain:{d})")));
    let hook = json!({
        "matcher": "*",
        "hooks": [{
            "type": "command",
            "command": format!("{} agent-event claude", crate::vocab::INIT_PATH),
            "timeout": 5
        }]
    });

    let ours = json!({
        "permissions": { "allow": allow, "deny": deny },
        "sandbox": { "enabled": false, "network": { "allowedDomains": domains } },
        "hooks": { "PreToolUse": [hook] },
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
