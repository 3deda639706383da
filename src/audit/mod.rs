//! The audit log: one JSON object per line, appended to `<sandbox state>/audit.jsonl` by aisb
//! (sandbox start, policy summary, exit) and by the network proxy (every allow/block decision).
//! Each event is written with a single `write` on an `O_APPEND` descriptor, so lines from
//! concurrent writers never interleave.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// One event. `ts` is milliseconds since the Unix epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub ts: u64,
    #[serde(flatten)]
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Kind {
    /// A sandbox started: the policy it runs under.
    Start {
        profile: String,
        backend: String,
        command: Vec<String>,
        network: String,
        masked_paths: usize,
        /// Environment variable names kept out of the sandbox.
        env_dropped: Vec<String>,
        allow: Vec<String>,
    },
    /// The sandbox ended.
    Exit { exit_code: i32, duration_ms: u64 },
    /// A network connection or request the proxy allowed or blocked.
    Net {
        /// `allow` or `block`.
        action: String,
        /// `connect` (HTTP CONNECT), `http` (plain HTTP), `socks5`.
        proto: String,
        host: String,
        port: u16,
        /// The rule that decided: `allow "x"`, `deny "x"`, `localhost-port N`, or why not.
        rule: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        addr: Option<String>,
        #[serde(default)]
        bytes_up: u64,
        #[serde(default)]
        bytes_down: u64,
        #[serde(default)]
        duration_ms: u64,
    },
    /// Something the sandbox wrote that the host would have acted on, moved out of the way.
    Quarantine {
        path: String,
        moved_to: String,
        why: String,
    },
    /// A path that appeared in the project while the sandbox ran, masked inside by the live
    /// layer (`runtime::live`): its path inside and the rule that matched it.
    LateMask {
        path: String,
        rule: String,
        dir: bool,
    },
    /// A tool call an agent announced from inside (its pre-tool hook, see `agents`). Reported
    /// by the sandboxed side, so a record of intent, not proof: what the sandbox allowed or
    /// refused is in the other events.
    Agent {
        agent: String,
        tool: String,
        /// The command, path or (shortened) input of the call.
        input: String,
    },
    /// A tool call aisb's pre-tool hook refused by the sandbox's tool policy (`tools`): the
    /// agent was told no, with `rule` and where it was written (`at`, `file:line`). Reported
    /// from inside, like [`Kind::Agent`].
    AgentBlock {
        agent: String,
        tool: String,
        input: String,
        rule: String,
        at: String,
    },
    /// The run's byte budget for the log was spent: `events` more were counted, not written
    /// (written once when the budget runs out, and again with the final count when the run's
    /// log closes).
    Dropped { events: u64, budget_bytes: u64 },
    /// An attempt on a masked path, refused (the reporting layer of masks,
    /// `runtime::live::deny`): what was tried (`read`, `write`, `list`, `lookup`, …), the path
    /// as the sandbox names it, the rule that masks it, and the process (as the host numbers
    /// it). `count`: how many attempts the event stands for (the repeats of a quiet second are
    /// gathered; absent: one).
    File {
        operation: String,
        target: String,
        result: String,
        rule: String,
        pid: u32,
        command: String,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        count: u64,
        /// The agent whose run it was (its command is one: every process in it is its
        /// session's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<String>,
        /// The run (its aisb's pid): runs of one project at once share its log.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<u32>,
        /// Repeats gathered and written after the fact (the quiet second over, the run's
        /// end): their tool call may be over.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        late: bool,
    },
    /// A limit stopped the sandbox (`disk (bytes)`, `disk (inodes)`): what it used, its
    /// budget, and the rule that set it.
    Limit {
        limit: String,
        used: u64,
        budget: u64,
        rule: String,
    },
    /// The proxy put a brokered credential's real value in a request to a host it is bound
    /// to (`credential`): which one, where, never the value.
    Credential {
        credential: String,
        host: String,
        method: String,
        path: String,
    },
}

/// Characters that reorder or hide text on a terminal (bidirectional overrides and isolates,
/// zero-width ones): a path could show as another.
fn invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

fn one() -> u64 {
    1
}

impl Event {
    pub fn now(kind: Kind) -> Event {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Event { ts, kind }
    }

    /// The event's kind as the log names it (`net`, `file`, `agent-block`, …).
    pub fn kind_name(&self) -> String {
        serde_json::to_value(&self.kind)
            .ok()
            .and_then(|v| v["event"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// The agent an event names, when it names one (its tool calls).
    pub fn agent(&self) -> Option<&str> {
        match &self.kind {
            Kind::Agent { agent, .. } | Kind::AgentBlock { agent, .. } => Some(agent),
            Kind::File { agent, .. } => agent.as_deref(),
            _ => None,
        }
    }

    /// The event as one JSON object in the audit format people and tools expect (the seed's
    /// `timestamp`, `agent`, `operation`, `target`, `result`, `policy`, `reason`) followed by
    /// aisb's own fields (`ts`, `event`, and the kind's).
    pub fn seed_json(&self) -> serde_json::Value {
        let (operation, target, result, policy, reason): (String, String, &str, &str, String) =
            match &self.kind {
                Kind::Start { command, .. } => (
                    "start".into(),
                    command.join(" "),
                    "started",
                    "",
                    String::new(),
                ),
                Kind::Exit { exit_code, .. } => (
                    "exit".into(),
                    String::new(),
                    "exited",
                    "",
                    format!("exit code {exit_code}"),
                ),
                Kind::Net {
                    action,
                    proto,
                    host,
                    port,
                    rule,
                    ..
                } => (
                    proto.clone(),
                    format!("{host}:{port}"),
                    if action == "block" {
                        "blocked"
                    } else {
                        "allowed"
                    },
                    "network",
                    rule.clone(),
                ),
                Kind::Quarantine { path, why, .. } => (
                    "write".into(),
                    path.clone(),
                    "quarantined",
                    "protected-file",
                    why.clone(),
                ),
                Kind::LateMask { path, rule, .. } => (
                    "appear".into(),
                    path.clone(),
                    "masked",
                    "mask",
                    rule.clone(),
                ),
                Kind::Agent { tool, input, .. } => (
                    "tool".into(),
                    format!("{tool} {input}"),
                    "announced",
                    "",
                    String::new(),
                ),
                Kind::AgentBlock {
                    tool,
                    input,
                    rule,
                    at,
                    ..
                } => (
                    "tool".into(),
                    format!("{tool} {input}"),
                    "blocked",
                    "tools",
                    format!("{rule} (at {at})"),
                ),
                Kind::Dropped { events, .. } => (
                    "log".into(),
                    String::new(),
                    "dropped",
                    "audit-budget",
                    format!("{events} events past the run's budget"),
                ),
                Kind::Credential {
                    credential, host, ..
                } => (
                    "credential".into(),
                    host.clone(),
                    "injected",
                    "credential",
                    credential.clone(),
                ),
                Kind::File {
                    operation,
                    target,
                    rule,
                    ..
                } => (
                    operation.clone(),
                    target.clone(),
                    "blocked",
                    "mask",
                    format!("masked by {rule}"),
                ),
                Kind::Limit { limit, rule, .. } => (
                    "write".into(),
                    limit.clone(),
                    "stopped",
                    "limits",
                    rule.clone(),
                ),
            };
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.ts);
        let mut out = serde_json::json!({
            "timestamp": humantime::format_rfc3339_millis(time).to_string(),
            "agent": self.agent(),
            "operation": operation,
            "target": target,
            "result": result,
            "policy": policy,
            "reason": reason,
        });
        if let (Some(o), Ok(serde_json::Value::Object(own))) =
            (out.as_object_mut(), serde_json::to_value(self))
        {
            for (k, v) in own {
                o.entry(k).or_insert(v);
            }
        }
        out
    }

    pub fn is_blocked(&self) -> bool {
        matches!(&self.kind, Kind::Net { action, .. } if action == "block")
            || matches!(
                self.kind,
                Kind::AgentBlock { .. } | Kind::Limit { .. } | Kind::File { .. }
            )
    }

    /// One line for people: `12:03:04.512  BLOCK connect evil.com:443  not in the allowlist`.
    pub fn human(&self) -> String {
        // Paths and names the sandbox chose may hold line breaks and terminal sequences: one
        // line, nothing a terminal acts on.
        self.human_raw()
            .chars()
            .map(|c| {
                if c.is_control() || invisible(c) {
                    '?'
                } else {
                    c
                }
            })
            .collect()
    }

    fn human_raw(&self) -> String {
        let secs = self.ts / 1000;
        let t = format!(
            "{:02}:{:02}:{:02}.{:03}",
            (secs / 3600) % 24,
            (secs / 60) % 60,
            secs % 60,
            self.ts % 1000
        );
        match &self.kind {
            Kind::Start {
                profile,
                backend,
                command,
                network,
                masked_paths,
                env_dropped,
                ..
            } => format!(
                "{t}  START  profile {profile}, {backend}, network {network}, {masked_paths} masked paths, {} env vars dropped: {}",
                env_dropped.len(),
                command.join(" ")
            ),
            Kind::Exit {
                exit_code,
                duration_ms,
            } => format!("{t}  EXIT   code {exit_code} after {duration_ms} ms"),
            Kind::Net {
                action,
                proto,
                host,
                port,
                rule,
                bytes_up,
                bytes_down,
                ..
            } => {
                let verb = if action == "block" { "BLOCK" } else { "ALLOW" };
                let bytes = if action == "block" {
                    String::new()
                } else {
                    format!("  ({bytes_up} B up, {bytes_down} B down)")
                };
                format!("{t}  {verb}  {proto} {host}:{port}  {rule}{bytes}")
            }
            Kind::LateMask { path, rule, dir } => {
                let what = if *dir { "directory" } else { "file" };
                format!("{t}  MASK   {what} {path}  {rule} (appeared while the sandbox ran)")
            }
            Kind::Agent { agent, tool, input } => {
                format!("{t}  AGENT  {agent} {tool}: {input}  (reported from inside)")
            }
            Kind::AgentBlock {
                agent,
                tool,
                input,
                rule,
                at,
            } => format!("{t}  AGENT-BLOCK {agent} {tool}: {input} (rule {rule}, {at})"),
            Kind::Quarantine {
                path,
                moved_to,
                why,
            } => format!("{t}  QUARANTINE  {path}: {why}; moved to {moved_to}"),
            Kind::Dropped {
                events,
                budget_bytes,
            } => format!(
                "{t}  DROPPED {events} event(s): this run's log reached its {} MiB budget",
                budget_bytes >> 20
            ),
            Kind::File {
                operation,
                target,
                rule,
                pid,
                command,
                count,
                ..
            } => format!(
                "{t}  DENY   {operation} {target}  {rule}  (pid {pid} {command}){}",
                if *count > 1 { format!(" ×{count}") } else { String::new() }
            ),
            Kind::Limit {
                limit,
                used,
                budget,
                rule,
            } => format!("{t}  STOP   {limit} limit: used {used}, budget {budget}  {rule}"),
            Kind::Credential {
                credential,
                host,
                method,
                path,
            } => format!("{t}  CREDENTIAL {credential} put in {method} https://{host}{path}"),
        }
    }
}

/// Appends events to one log file.
#[derive(Debug)]
pub struct Log {
    file: File,
    pub path: PathBuf,
    /// Bytes this handle may still write (`u64::MAX`: unbounded), and the events it dropped.
    left: std::sync::atomic::AtomicU64,
    dropped: std::sync::atomic::AtomicU64,
    budget: u64,
}

/// A run's log writes at most this much (a sandbox can make the proxy and the hooks log an
/// event per request it sends: 400 refused `CONNECT`s with 60 KB names were 47 MB).
pub const RUN_BUDGET: u64 = 16 << 20;

/// Each string of an event is cut to this many bytes (a name, a path, a command).
pub const MAX_FIELD: usize = 1024;

/// `s` cut to [`MAX_FIELD`] bytes at a character boundary, saying how much was cut.
fn cut(s: &mut String) {
    if s.len() <= MAX_FIELD {
        return;
    }
    let mut at = MAX_FIELD;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    let more = s.len() - at;
    s.truncate(at);
    s.push_str(&format!("…[{more} more bytes]"));
}

fn cut_all(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => cut(s),
        serde_json::Value::Array(a) => {
            // A command of a million arguments is cut too.
            a.truncate(256);
            a.iter_mut().for_each(cut_all);
        }
        serde_json::Value::Object(o) => o.values_mut().for_each(cut_all),
        _ => {}
    }
}

impl Log {
    pub fn open(path: &Path) -> std::io::Result<Log> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Log {
            file,
            path: path.to_path_buf(),
            left: std::sync::atomic::AtomicU64::new(RUN_BUDGET),
            dropped: std::sync::atomic::AtomicU64::new(0),
            budget: RUN_BUDGET,
        })
    }

    /// A log appended to through `file` (a descriptor the mask helper inherited).
    pub fn from_file(file: File, path: PathBuf) -> Log {
        Log {
            file,
            path,
            left: std::sync::atomic::AtomicU64::new(RUN_BUDGET),
            dropped: std::sync::atomic::AtomicU64::new(0),
            budget: RUN_BUDGET,
        }
    }

    /// Events as JSON lines on standard output (`aisb proxy serve`: the cluster's logging
    /// collects a container's stdout).
    pub fn stdout() -> std::io::Result<Log> {
        use std::os::fd::AsFd;
        let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
        Ok(Log {
            file: File::from(fd),
            path: PathBuf::from("/dev/stdout"),
            left: std::sync::atomic::AtomicU64::new(u64::MAX),
            dropped: std::sync::atomic::AtomicU64::new(0),
            budget: u64::MAX,
        })
    }

    /// Write one event as one line (one `write` call). Errors are returned, not hidden: the
    /// caller decides whether a lost audit line is fatal.
    pub fn write(&self, kind: Kind) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        let event = Event::now(kind);
        let mut line = serde_json::to_vec(&event)?;
        // Only an oversized event is cut (its keys then come in name order).
        if line.len() > MAX_FIELD {
            let mut v = serde_json::to_value(&event)?;
            cut_all(&mut v);
            line = serde_json::to_vec(&v)?;
        }
        line.push(b'\n');
        let n = line.len() as u64;
        let taken = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(n));
        if taken.is_err() {
            // The first event past the budget says so (outside the budget, once).
            if self.dropped.fetch_add(1, Ordering::SeqCst) == 0 {
                self.raw(Kind::Dropped {
                    events: 1,
                    budget_bytes: self.budget,
                })?;
            }
            return Ok(());
        }
        (&self.file).write_all(&line)
    }

    fn raw(&self, kind: Kind) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&Event::now(kind))?;
        line.push(b'\n');
        (&self.file).write_all(&line)
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        let events = *self.dropped.get_mut();
        if events > 1 {
            let _ = self.raw(Kind::Dropped {
                events,
                budget_bytes: self.budget,
            });
        }
    }
}

/// Parse a log's text; lines that are not events (a torn last line) are skipped.
pub fn parse(text: &str) -> Vec<Event> {
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox that makes the host log without end gets a bounded file: each field cut,
    /// the run's budget kept, and one line (then the final count) saying what was dropped.
    #[test]
    fn a_run_s_log_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        {
            let log = Log::open(&path).unwrap();
            for i in 0..400 {
                log.write(Kind::Net {
                    action: "block".into(),
                    proto: "connect".into(),
                    host: format!("{i}{}", "x".repeat(60_000)),
                    port: 443,
                    rule: "not in the allowlist".into(),
                    bytes_up: 0,
                    bytes_down: 0,
                    duration_ms: 0,
                    addr: None,
                })
                .unwrap();
            }
            for _ in 0..20_000 {
                log.write(Kind::Agent {
                    agent: "claude".into(),
                    tool: "Bash".into(),
                    input: "y".repeat(5_000),
                })
                .unwrap();
            }
        }
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len <= RUN_BUDGET + 4096, "{len}");
        let events = parse(&std::fs::read_to_string(&path).unwrap());
        let first = &events[0];
        let Kind::Net { host, .. } = &first.kind else {
            panic!("{first:?}")
        };
        assert!(
            host.len() < MAX_FIELD + 40 && host.ends_with("more bytes]"),
            "{host}"
        );
        let dropped: Vec<u64> = events
            .iter()
            .filter_map(|e| match e.kind {
                Kind::Dropped { events, .. } => Some(events),
                _ => None,
            })
            .collect();
        assert_eq!(dropped.len(), 2, "{dropped:?}");
        let written = events.len() as u64 - 2;
        assert_eq!(written + dropped[1], 20_400);
    }

    #[test]
    fn events_round_trip_one_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(&dir.path().join("a/audit.jsonl")).unwrap();
        log.write(Kind::Net {
            action: "block".into(),
            proto: "connect".into(),
            host: "evil.test".into(),
            port: 443,
            rule: "not in the allowlist".into(),
            addr: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
        })
        .unwrap();
        log.write(Kind::Exit {
            exit_code: 3,
            duration_ms: 12,
        })
        .unwrap();
        let text = std::fs::read_to_string(&log.path).unwrap();
        assert_eq!(text.lines().count(), 2);
        let events = parse(&format!("{text}{{\"torn"));
        assert_eq!(events.len(), 2);
        assert!(events[0].is_blocked());
        assert!(events[0].human().contains("BLOCK  connect evil.test:443"));
        assert!(text.lines().next().unwrap().contains("\"event\":\"net\""));
        let block = Event::now(Kind::AgentBlock {
            agent: "claude".into(),
            tool: "Write".into(),
            input: "/p/README".into(),
            rule: "deny \"Write\"".into(),
            at: "sandbox.kdl:3".into(),
        });
        assert!(block.is_blocked());
        assert!(block
            .human()
            .ends_with("AGENT-BLOCK claude Write: /p/README (rule deny \"Write\", sandbox.kdl:3)"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&log.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn what_the_sandbox_named_cannot_disguise_a_line() {
        let e = Event::now(Kind::File {
            operation: "read".into(),
            target: "/p/a\u{202E}vne.\nnext line\u{200B}".into(),
            result: "blocked".into(),
            rule: "r".into(),
            pid: 1,
            command: "cat".into(),
            count: 1,
            agent: None,
            run: None,
            late: false,
        });
        let line = e.human();
        assert!(line.contains("/p/a?vne.?next line?"), "{line}");
        assert!(!line.chars().any(|c| c.is_control() || invisible(c)));
    }
}
