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
}

impl Event {
    pub fn now(kind: Kind) -> Event {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Event { ts, kind }
    }

    pub fn is_blocked(&self) -> bool {
        matches!(&self.kind, Kind::Net { action, .. } if action == "block")
            || matches!(self.kind, Kind::AgentBlock { .. })
    }

    /// One line for people: `12:03:04.512  BLOCK connect evil.com:443  not in the allowlist`.
    pub fn human(&self) -> String {
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
        }
    }
}

/// Appends events to one log file.
#[derive(Debug)]
pub struct Log {
    file: File,
    pub path: PathBuf,
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
        })
    }

    /// Events as JSON lines on standard output (`aisb proxy serve`: the cluster's logging
    /// collects a container's stdout).
    pub fn stdout() -> std::io::Result<Log> {
        use std::os::fd::AsFd;
        let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
        Ok(Log {
            file: File::from(fd),
            path: PathBuf::from("/dev/stdout"),
        })
    }

    /// Write one event as one line (one `write` call). Errors are returned, not hidden: the
    /// caller decides whether a lost audit line is fatal.
    pub fn write(&self, kind: Kind) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&Event::now(kind))?;
        line.push(b'\n');
        (&self.file).write_all(&line)
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
}
