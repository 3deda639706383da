//! `aisb init --from-devcontainer`: a sandbox.kdl from a `devcontainer.json` (JSONC).
//!
//! What maps is written as sandbox.kdl nodes; what does not is listed with the reason, both
//! on stderr and as comments in the file. Nothing is guessed: a value holding a template
//! placeholder (`${templateOption:imageVariant}`, `${containerEnv:PATH}`, …) is reported and
//! its node left commented out. The two substitutions with an exact aisb equivalent are
//! translated: `${localEnv:NAME}` (`${localEnv:NAME:default}`) -> `${NAME}` (`${NAME:-default}`)
//! and `${localWorkspaceFolder}` -> `$PROJECT`.
//!
//! A compose-based configuration (`dockerComposeFile`) is refused: its container is one
//! service of a Compose project, whose image, volumes and other services live in the compose
//! files; aisb runs one sandbox, not a Compose project.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Larger files are refused before parsing.
const MAX_FILE: usize = 1 << 20;
/// Deeper nesting is refused before parsing (the parser recurses).
const MAX_DEPTH: usize = 64;

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum DevcontainerError {
    #[error("{path}: {message}")]
    #[diagnostic(help("{help}"))]
    Invalid {
        path: String,
        message: String,
        help: String,
    },
    #[error("{path}: a Docker Compose configuration (`dockerComposeFile`) cannot be imported")]
    #[diagnostic(help(
        "its container is the `{service}` service of a Compose project (image, volumes and the other services are in {files}); aisb runs one sandbox, not a Compose project. Write `rootfs dockerfile=\"…\"` (or `rootfs from=\"IMAGE\"`) for that service's image in sandbox.kdl, and `network {{ localhost-port N }}` for services you run on the host"
    ))]
    Compose {
        path: String,
        service: String,
        files: String,
    },
}

/// The result: the sandbox.kdl text, and one line per setting for the report.
#[derive(Debug, Default)]
pub struct Conversion {
    pub kdl: String,
    /// `key: what it became`.
    pub mapped: Vec<String>,
    /// `key: why not`.
    pub unmapped: Vec<String>,
    /// `key: the placeholder` (left unresolved).
    pub placeholders: Vec<String>,
}

/// A KDL v2 string literal.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control()
                || matches!(
                    c,
                    '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}' | '\u{FEFF}'
                ) =>
            {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The deepest `[`/`{` nesting of a JSONC text (strings and comments skipped).
fn depth(text: &str) -> usize {
    let (mut d, mut max) = (0usize, 0usize);
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 1;
            }
            b'[' | b'{' => {
                d += 1;
                max = max.max(d);
            }
            b']' | b'}' => d = d.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    max
}

/// A value in aisb's variable syntax: `Ok` with the translation, or `Err` naming the first
/// placeholder aisb has no equivalent for. A literal `$` becomes `$$`.
fn translate(v: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = v;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if let Some(body) = after.strip_prefix("${") {
            let Some(end) = body.find('}') else {
                return Err(after.to_string());
            };
            let inner = &body[..end];
            let whole = &after[..end + 3];
            if inner == "localWorkspaceFolder" {
                out.push_str("${PROJECT}");
            } else if let Some(var) = inner.strip_prefix("localEnv:") {
                let (name, default) = match var.split_once(':') {
                    Some((n, d)) => (n, Some(d)),
                    None => (var, None),
                };
                if !crate::config::decode::is_env_name(name)
                    || default.is_some_and(|d| d.contains(['$', '}']))
                {
                    return Err(whole.to_string());
                }
                match default {
                    Some(d) => out.push_str(&format!("${{{name}:-{d}}}")),
                    None => out.push_str(&format!("${{{name}}}")),
                }
            } else {
                return Err(whole.to_string());
            }
            rest = &body[end + 1..];
        } else {
            out.push_str("$$");
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Why each devcontainer.json key aisb does not map is left out.
fn why_not(key: &str) -> Option<&'static str> {
    Some(match key {
        "features" => "Dev Container Features are install scripts fetched from a registry and run as root at build time; put what they install in the Dockerfile (RUN steps) instead",
        "runArgs" => "extra `docker run` arguments have no meaning without Docker; say what they do with sandbox.kdl's own nodes",
        "capAdd" => "the sandbox drops every capability; aisb never adds one back",
        "privileged" => "a privileged container would undo the sandbox; aisb has no such mode",
        "securityOpt" => "aisb applies its own seccomp filter and no_new_privs; they cannot be loosened",
        "init" => "aisb's own init is always PID 1",
        "initializeCommand" => "it runs on the host, outside any sandbox: run it yourself if you trust it",
        "workspaceFolder" | "workspaceMount" => "aisb keeps the project at its own path on the host (`project` node)",
        "appPort" | "portsAttributes" | "otherPortsAttributes" => "ports the editor forwards out of the container: a sandbox's services are reached through its loopback, nothing to forward",
        "overrideCommand" | "shutdownAction" | "waitFor" | "userEnvProbe" | "updateRemoteUserUID" => "an editor session setting: aisb runs the command you give it",
        "customizations" => "editor settings and extensions: they belong to the editor, not the sandbox",
        "hostRequirements" => "aisb runs on this host as it is (`limits` caps what the sandbox may use)",
        "containerUser" => "the container's process user: aisb runs as you (`process { user … }` for the name)",
        "build.args" => "build args are given at build time: `aisb build --build-arg KEY=VALUE` (your USER_NAME, USER_ID and GROUP_ID are passed already)",
        "build.target" => "multi-stage targets are not supported; aisb builds the Dockerfile's last stage",
        "build.context" => "aisb builds with the Dockerfile's own directory as context",
        "build.cacheFrom" | "build.options" => "Docker build options: aisb caches each step by the hash of its inputs",
        _ => return None,
    })
}

struct Out {
    c: Conversion,
    body: Vec<String>,
}

impl Out {
    fn placeholder(&mut self, key: &str, value: &str, node: &str) {
        self.c.placeholders.push(format!("{key}: {value}"));
        self.body.push(format!(
            "// {key} holds a placeholder aisb does not resolve ({value}): fill it in, then uncomment\n// {node}"
        ));
    }
}

/// Convert the text of `path` (a devcontainer.json, as the user named it; in directory
/// `dc_dir`) for a sandbox.kdl written to `out_dir` (both absolute).
pub fn convert(
    path: &Path,
    dc_dir: &Path,
    text: &str,
    out_dir: &Path,
) -> Result<Conversion, DevcontainerError> {
    let shown = path.display().to_string();
    let invalid = |message: String, help: &str| DevcontainerError::Invalid {
        path: shown.clone(),
        message,
        help: help.to_string(),
    };
    if text.len() > MAX_FILE {
        return Err(invalid(
            format!("larger than {} KiB", MAX_FILE >> 10),
            "a devcontainer.json is a few kilobytes",
        ));
    }
    if depth(text) > MAX_DEPTH {
        return Err(invalid(
            format!("nested deeper than {MAX_DEPTH} levels"),
            "a devcontainer.json nests a few levels",
        ));
    }
    let doc: Value =
        jsonc_parser::parse_to_serde_value(text, &Default::default()).map_err(|e| {
            invalid(
                e.to_string(),
                "devcontainer.json is JSON with comments and trailing commas",
            )
        })?;
    let Some(obj) = doc.as_object() else {
        return Err(invalid(
            "the top level is not an object".into(),
            "see https://containers.dev/implementors/json_reference/",
        ));
    };
    if let Some(files) = obj.get("dockerComposeFile") {
        let files = match files {
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", "),
            v => v.as_str().unwrap_or("the compose files").to_string(),
        };
        return Err(DevcontainerError::Compose {
            path: shown,
            service: obj
                .get("service")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
            files,
        });
    }
    let mut o = Out {
        c: Conversion::default(),
        body: Vec::new(),
    };
    let mut tasks = Vec::new();
    let mut env = Vec::new();
    let mut ports = Vec::new();
    for (key, value) in obj {
        match key.as_str() {
            "name" => {}
            "image" => match value.as_str() {
                Some(img) => match translate(img) {
                    Ok(_) if img.contains('$') => {
                        o.placeholder(key, img, &format!("rootfs from={}", quote(img)))
                    }
                    Ok(_) => {
                        o.body.push(format!("rootfs from={}", quote(img)));
                        o.c.mapped.push(format!("image: rootfs from=\"{img}\""));
                    }
                    Err(p) => o.placeholder(key, &p, &format!("rootfs from={}", quote(img))),
                },
                None => o.c.unmapped.push("image: not a string".into()),
            },
            "build" | "dockerFile" | "dockerfile" => {
                let (file, build) = match value {
                    Value::Object(b) => (
                        b.get("dockerfile")
                            .or_else(|| b.get("dockerFile"))
                            .and_then(Value::as_str),
                        Some(b),
                    ),
                    Value::String(s) => (Some(s.as_str()), None),
                    _ => (None, None),
                };
                if let Some(file) = file {
                    let df = normalize(&dc_dir.join(file));
                    let rel = relative(&df, out_dir);
                    if file.contains('$') {
                        o.placeholder(key, file, &format!("rootfs dockerfile={}", quote(&rel)));
                    } else {
                        o.body.push(format!("rootfs dockerfile={}", quote(&rel)));
                        o.c.mapped
                            .push(format!("build.dockerfile: rootfs dockerfile=\"{rel}\""));
                    }
                    if let Some(b) = build {
                        for (k, v) in b {
                            let full = format!("build.{k}");
                            if k == "dockerfile" || k == "dockerFile" {
                                continue;
                            }
                            if k == "context" {
                                let ctx = v.as_str().map(|c| normalize(&dc_dir.join(c)));
                                if ctx.as_deref() == df.parent() {
                                    continue;
                                }
                            }
                            let why = why_not(&full).unwrap_or("unknown to aisb");
                            o.c.unmapped.push(format!("{full}: {why}"));
                        }
                    }
                } else {
                    o.c.unmapped.push(format!(
                        "{key}: no `dockerfile` in it; aisb builds from a Dockerfile"
                    ));
                }
            }
            "containerEnv" | "remoteEnv" => {
                let Some(m) = value.as_object() else {
                    o.c.unmapped.push(format!("{key}: not an object"));
                    continue;
                };
                for (k, v) in m {
                    let Some(v) = v.as_str() else {
                        o.c.unmapped.push(format!("{key}.{k}: not a string"));
                        continue;
                    };
                    if !crate::config::decode::is_env_name(k) {
                        o.c.unmapped.push(format!("{key}.{k}: not a variable name"));
                        continue;
                    }
                    match translate(v) {
                        Ok(t) => {
                            env.push(format!("    set {} {}", quote(k), quote(&t)));
                            o.c.mapped.push(format!("{key}.{k}: env set"));
                        }
                        Err(p) => {
                            o.c.placeholders.push(format!("{key}.{k}: {p}"));
                            env.push(format!(
                                "    // {key}.{k} holds a placeholder aisb does not resolve ({p})\n    // set {} {}",
                                quote(k),
                                quote(v)
                            ));
                        }
                    }
                }
            }
            "mounts" => {
                let Some(list) = value.as_array() else {
                    o.c.unmapped.push("mounts: not a list".into());
                    continue;
                };
                for m in list {
                    mount(&mut o, m);
                }
            }
            "remoteUser" => match value.as_str() {
                Some(u) if !u.contains('$') => {
                    o.body
                        .push(format!("process {{\n    user name={}\n}}", quote(u)));
                    o.c.mapped.push(format!(
                        "remoteUser: process {{ user name=\"{u}\" }} (the uid stays yours: files in the project keep your ownership)"
                    ));
                }
                Some(u) => o.placeholder(key, u, &format!("process {{ user name={} }}", quote(u))),
                None => o.c.unmapped.push("remoteUser: not a string".into()),
            },
            "onCreateCommand"
            | "updateContentCommand"
            | "postCreateCommand"
            | "postStartCommand"
            | "postAttachCommand" => {
                let base = kebab(key.trim_end_matches("Command"));
                command_tasks(&mut o, &mut tasks, key, &base, value);
            }
            "forwardPorts" => {
                let Some(list) = value.as_array() else {
                    o.c.unmapped.push("forwardPorts: not a list".into());
                    continue;
                };
                for p in list {
                    match p.as_u64().filter(|n| (1..=65535).contains(n)) {
                        Some(n) => {
                            ports.push(n);
                            o.c.mapped.push(format!(
                                "forwardPorts {n}: network {{ localhost-port {n} }} (the host's 127.0.0.1:{n} reachable inside)"
                            ));
                        }
                        None => o.c.unmapped.push(format!(
                            "forwardPorts {p}: names another container's port; aisb reaches the host's own loopback ports only"
                        )),
                    }
                }
            }
            other => {
                let why = why_not(other).unwrap_or("unknown to aisb");
                o.c.unmapped.push(format!("{other}: {why}"));
            }
        }
    }
    if !env.is_empty() {
        o.body.push(format!("env {{\n{}\n}}", env.join("\n")));
    }
    if !ports.is_empty() {
        let lines: Vec<String> = ports
            .iter()
            .map(|p| format!("    localhost-port {p}"))
            .collect();
        o.body.push(format!("network {{\n{}\n}}", lines.join("\n")));
    }
    o.body.extend(tasks);
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("devcontainer");
    let mut kdl = format!(
        "// sandbox.kdl — imported by `aisb init --from-devcontainer` from {} ({}).\n// Check it with `aisb check`; see the result with `aisb plan`.\n",
        shown,
        name.replace(['\n', '\r'], " ")
    );
    if !o.c.unmapped.is_empty() {
        kdl.push_str("//\n// Not imported:\n");
        for u in &o.c.unmapped {
            kdl.push_str(&format!("//   {}\n", u.replace(['\n', '\r'], " ")));
        }
    }
    for b in &o.body {
        kdl.push('\n');
        kdl.push_str(b);
        kdl.push('\n');
    }
    o.c.kdl = kdl;
    Ok(o.c)
}

fn kebab(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// A lifecycle command as tasks: a string runs in a shell, an array is an argv, an object is
/// one named command each (run in parallel by the devcontainer CLI; here one task each).
fn command_tasks(o: &mut Out, tasks: &mut Vec<String>, key: &str, base: &str, value: &Value) {
    let run = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(quote(s)),
            Value::Array(a) if !a.is_empty() => a
                .iter()
                .map(|x| x.as_str().map(quote))
                .collect::<Option<Vec<_>>>()
                .map(|v| v.join(" ")),
            _ => None,
        }
    };
    let mut add = |name: String, v: &Value, o: &mut Out| match run(v) {
        Some(r) => {
            tasks.push(format!(
                "task {} description={} {{\n    run {r}\n}}",
                quote(&name),
                quote(&format!("devcontainer {key}"))
            ));
            o.c.mapped
                .push(format!("{key}: task \"{name}\" (`aisb run {name}`)"));
        }
        None => o.c.unmapped.push(format!("{key}: not a command")),
    };
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                let safe: String = k
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                            c
                        } else {
                            '-'
                        }
                    })
                    .collect();
                add(format!("{base}-{safe}"), v, o);
            }
        }
        v => add(base.to_string(), v, o),
    }
}

/// One `mounts` entry: `source=…,target=…,type=bind[,readonly]` or the object form.
fn mount(o: &mut Out, m: &Value) {
    let (mut source, mut target, mut kind, mut ro) = (None, None, "volume".to_string(), false);
    match m {
        Value::String(s) => {
            for part in s.split(',') {
                let (k, v) = part.split_once('=').unwrap_or((part, ""));
                match k.trim() {
                    "source" | "src" => source = Some(v.to_string()),
                    "target" | "destination" | "dst" => target = Some(v.to_string()),
                    "type" => kind = v.to_string(),
                    "readonly" | "ro" => ro = v.is_empty() || v == "true" || v == "1",
                    _ => {}
                }
            }
        }
        Value::Object(m) => {
            source = m.get("source").and_then(Value::as_str).map(str::to_string);
            target = m.get("target").and_then(Value::as_str).map(str::to_string);
            if let Some(t) = m.get("type").and_then(Value::as_str) {
                kind = t.to_string();
            }
        }
        _ => {}
    }
    let shown = m.as_str().map_or_else(|| m.to_string(), str::to_string);
    if kind != "bind" {
        o.c.unmapped.push(format!(
            "mounts {shown}: a Docker {kind} has no host path; aisb mounts host paths (`mount`) or a private `tmpfs`"
        ));
        return;
    }
    let (Some(source), Some(target)) = (source, target) else {
        o.c.unmapped
            .push(format!("mounts {shown}: needs a source and a target"));
        return;
    };
    let access = if ro { "ro" } else { "rw" };
    match (translate(&source), translate(&target)) {
        (Ok(s), Ok(t)) => {
            o.body.push(format!(
                "mount {} {} access=\"{access}\"",
                quote(&s),
                quote(&t)
            ));
            o.c.mapped.push(format!("mounts {shown}: mount ({access})"));
        }
        (Err(p), _) | (_, Err(p)) => o.placeholder(
            "mounts",
            &p,
            &format!(
                "mount {} {} access=\"{access}\"",
                quote(&source),
                quote(&target)
            ),
        ),
    }
}

/// `p` with `.` and `..` resolved lexically.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// `p` relative to `base` (both absolute or both relative to the same directory).
fn relative(p: &Path, base: &Path) -> String {
    let base = normalize(base);
    let (pc, bc): (Vec<_>, Vec<_>) = (p.components().collect(), base.components().collect());
    let common = pc.iter().zip(&bc).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..bc.len() {
        out.push("..");
    }
    for c in &pc[common..] {
        out.push(c);
    }
    out.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_reported_and_exact_substitutions_translated() {
        assert_eq!(
            translate("${localEnv:HOME}/.cache").unwrap(),
            "${HOME}/.cache"
        );
        assert_eq!(translate("${localEnv:X:d}").unwrap(), "${X:-d}");
        assert_eq!(
            translate("${localWorkspaceFolder}/a").unwrap(),
            "${PROJECT}/a"
        );
        assert_eq!(translate("a$b").unwrap(), "a$$b");
        assert_eq!(
            translate("base:${templateOption:imageVariant}").unwrap_err(),
            "${templateOption:imageVariant}"
        );
        assert_eq!(
            translate("${containerEnv:PATH}:/x").unwrap_err(),
            "${containerEnv:PATH}"
        );
    }

    #[test]
    fn a_value_cannot_break_out_of_its_kdl_string() {
        assert_eq!(quote("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        assert_eq!(quote("\u{1b}[2J"), r#""\u{1b}[2J""#);
    }

    #[test]
    fn depth_skips_strings_and_comments() {
        assert_eq!(depth(r#"{"a": "[[[[", /* {{{ */ "b": [1]} // [[["#), 2);
        assert_eq!(depth(&"[".repeat(100)), 100);
    }
}
