//! `aisb suggest`: from what the last run of a sandbox was refused, a proposed change to
//! `sandbox.kdl` as a unified diff, each line with its reason. Never applied: the user applies
//! it, and the next run asks about it like any other loosening.
//!
//! Only what the host wrote is proposed as a line (the proxy's network refusals, for names
//! that are valid host names); what the sandbox reported or what protects the host (a tool
//! call the policy refused, a secret that appeared, an attempt on a masked path, a file moved
//! aside) is listed, never proposed.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde::Serialize;

use super::Global;
use crate::audit::{parse, Event, Kind};
use crate::Error;

/// The most of the log read (its end): a run's own log is bounded far below this.
const TAIL: u64 = 16 << 20;

/// Propose sandbox.kdl lines for what the last run was refused (never applied)
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb run -- npm install        # some registry refused
  aisb suggest                   # the diff that would allow it, each line with its reason
  aisb suggest > allow.diff && git apply allow.diff && aisb trust
  aisb suggest fix-42            # a named sandbox's last session
  aisb suggest --json")]
pub struct Args {
    /// The named sandbox (default: `default`, the one `aisb run` uses)
    pub name: Option<String>,
    /// One JSON object: the proposed lines and the notes
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Proposal {
    /// The KDL line to add inside `network { }`.
    line: String,
    reason: String,
    count: u64,
}

#[derive(Debug, Serialize)]
struct Suggestion {
    file: String,
    proposals: Vec<Proposal>,
    /// What was refused and is not proposed, and why.
    notes: Vec<String>,
    diff: String,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let (plan, path) = super::audit::log_of(g, &host, a.name.clone())?;
    let events = match last_run(&path) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "no audit log yet for sandbox `{}`: nothing has run in it",
                a.name.as_deref().unwrap_or("default")
            );
            return Ok(0);
        }
        Err(source) => return Err(Error::Io { path, source }),
    };
    let (proposals, notes) = propose(&events, &plan.network.allow);
    let file = plan
        .config_file
        .clone()
        .unwrap_or_else(|| host.cwd.join("sandbox.kdl"));
    let text = plan
        .config_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok());
    let shown = file
        .strip_prefix(&host.cwd)
        .unwrap_or(&file)
        .display()
        .to_string();
    let diff = if proposals.is_empty() {
        String::new()
    } else {
        diff(&shown, text.as_deref(), &proposals)
    };
    let s = Suggestion {
        file: shown,
        proposals,
        notes,
        diff,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
        return Ok(0);
    }
    if s.proposals.is_empty() && s.notes.is_empty() {
        println!("nothing was refused in the last run: nothing to suggest");
        return Ok(0);
    }
    if !s.proposals.is_empty() {
        print!("{}", s.diff);
        eprintln!(
            "aisb: proposed, not applied: each line loosens the sandbox; apply what you want, then the next run asks (or `aisb trust`)"
        );
    }
    for n in &s.notes {
        eprintln!("aisb: not proposed: {n}");
    }
    Ok(0)
}

/// The events of the log's last run (from its last `start`), reading at most [`TAIL`] bytes
/// of its end.
fn last_run(path: &Path) -> std::io::Result<Vec<Event>> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let from = len.saturating_sub(TAIL);
    f.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::new();
    f.take(TAIL).read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    // A cut first line is not an event.
    let text = if from > 0 {
        text.split_once('\n').map_or("", |(_, rest)| rest)
    } else {
        &text
    };
    let events = parse(text);
    let start = events
        .iter()
        .rposition(|e| matches!(e.kind, Kind::Start { .. }))
        .unwrap_or(0);
    Ok(events.into_iter().skip(start).collect())
}

/// The lines to propose (network refusals by the allowlist, for valid names) and what is
/// refused but not proposed.
fn propose(events: &[Event], allowed: &[String]) -> (Vec<Proposal>, Vec<String>) {
    let mut refused: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let mut notes: BTreeMap<String, u64> = BTreeMap::new();
    let mut note = |n: String| *notes.entry(n).or_default() += 1;
    for e in events {
        match &e.kind {
            Kind::Net {
                action,
                host,
                port,
                rule,
                ..
            } if action == "block" => {
                let clean = crate::config::domain::normalise_name(host.trim()).ok();
                let Some(name) = clean.filter(|n| n.parse::<std::net::IpAddr>().is_err()) else {
                    note(format!(
                        "a connection to {} (an address or an invalid name: allow an address by hand if you mean it)",
                        printable(host)
                    ));
                    continue;
                };
                if rule.starts_with("deny ") {
                    note(format!("{name}:{port}, refused by your own `{}`", printable(rule)));
                    continue;
                }
                let value = if *port == 443 || *port == 80 {
                    name.clone()
                } else {
                    format!("{name}:{port}")
                };
                if crate::config::domain::DomainRule::parse(&value).is_err()
                    || allowed.contains(&value)
                {
                    continue;
                }
                let entry = refused
                    .entry(value)
                    .or_insert_with(|| (0, printable(rule)));
                entry.0 += 1;
            }
            Kind::AgentBlock { tool, rule, at, .. } => note(format!(
                "{} tool calls refused by `{}` at {} (the agent was told why; narrow the rule by hand if they were wanted)",
                printable(tool),
                printable(rule),
                printable(at)
            )),
            Kind::LateMask { path, rule, .. } => note(format!(
                "{} appeared while the sandbox ran and was masked ({}): a secret is never unmasked by a suggestion",
                printable(path),
                printable(rule)
            )),
            Kind::Quarantine { path, why, .. } => note(format!(
                "{} was moved aside ({}): make it yourself, outside the sandbox, if you want it",
                printable(path),
                printable(why)
            )),
            Kind::File {
                operation,
                target,
                rule,
                ..
            } => note(format!(
                "a {} of {} was refused ({}): a masked path is never unmasked by a suggestion; `allow \"PATH\"` by hand if it holds no secret",
                printable(operation),
                printable(target),
                printable(rule)
            )),
            Kind::Dropped { events, .. } => note(format!(
                "{events} events of that run were not logged (its log's budget): run again for the rest"
            )),
            _ => {}
        }
    }
    let proposals = refused
        .into_iter()
        .map(|(value, (count, rule))| Proposal {
            line: format!("allow \"{value}\""),
            reason: format!(
                "refused {count} time{} ({rule})",
                if count == 1 { "" } else { "s" }
            ),
            count,
        })
        .collect();
    let notes = notes
        .into_iter()
        .map(|(n, c)| if c > 1 { format!("{n} ({c} times)") } else { n })
        .collect();
    (proposals, notes)
}

/// What the sandbox named, safe to print and to put in a comment: control characters and
/// newlines as `?`, at most 200 characters.
fn printable(s: &str) -> String {
    s.chars()
        .take(200)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A unified diff of `file` (`None`: there is none yet) with the proposals inside its
/// top-level `network { … }` block, or in a new one at the end.
fn diff(file: &str, text: Option<&str>, proposals: &[Proposal]) -> String {
    let old: Vec<&str> = text.map(|t| t.lines().collect()).unwrap_or_default();
    let block = old
        .iter()
        .position(|l| l.starts_with("network") && l.trim_end().ends_with('{'));
    let lines: Vec<String> = proposals
        .iter()
        .map(|p| format!("    {} // {}", p.line, p.reason))
        .collect();
    let (at, added): (usize, Vec<String>) = match block {
        Some(i) => (i + 1, lines),
        None => {
            let mut v = Vec::new();
            if !old.is_empty() {
                v.push(String::new());
            }
            v.push("network {".to_string());
            v.extend(lines);
            v.push("}".to_string());
            (old.len(), v)
        }
    };
    let before = at.saturating_sub(3);
    let after = (at + 3).min(old.len());
    let old_len = after - before;
    let new_len = old_len + added.len();
    let (from_name, old_start) = if text.is_none() {
        ("/dev/null".to_string(), 0)
    } else {
        (
            format!("a/{file}"),
            if old_len == 0 { before } else { before + 1 },
        )
    };
    let mut o = format!(
        "--- {from_name}\n+++ b/{file}\n@@ -{old_start},{old_len} +{},{new_len} @@\n",
        if new_len == 0 { before } else { before + 1 }
    );
    for l in &old[before..at] {
        o.push_str(&format!(" {l}\n"));
    }
    for l in &added {
        o.push_str(&format!("+{l}\n"));
    }
    for l in &old[at..after] {
        o.push_str(&format!(" {l}\n"));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: &str) -> Proposal {
        Proposal {
            line: line.into(),
            reason: "refused 2 times (not in the allowlist)".into(),
            count: 2,
        }
    }

    #[test]
    fn the_diff_goes_into_the_network_block_or_a_new_one() {
        let d = diff(
            "sandbox.kdl",
            Some("block \"x\"\nnetwork {\n    allow \"a.com\"\n}\n"),
            &[p("allow \"b.com\"")],
        );
        assert_eq!(
            d,
            "--- a/sandbox.kdl\n+++ b/sandbox.kdl\n@@ -1,4 +1,5 @@\n block \"x\"\n network {\n+    allow \"b.com\" // refused 2 times (not in the allowlist)\n     allow \"a.com\"\n }\n"
        );
        let d = diff(
            "sandbox.kdl",
            Some("block \"x\"\n"),
            &[p("allow \"b.com\"")],
        );
        assert_eq!(
            d,
            "--- a/sandbox.kdl\n+++ b/sandbox.kdl\n@@ -1,1 +1,5 @@\n block \"x\"\n+\n+network {\n+    allow \"b.com\" // refused 2 times (not in the allowlist)\n+}\n"
        );
        let d = diff("sandbox.kdl", None, &[p("allow \"b.com\"")]);
        assert_eq!(
            d,
            "--- /dev/null\n+++ b/sandbox.kdl\n@@ -0,0 +1,3 @@\n+network {\n+    allow \"b.com\" // refused 2 times (not in the allowlist)\n+}\n"
        );
    }
}

#[cfg(test)]
mod propose_tests {
    use super::*;

    fn net(host: &str, port: u16, rule: &str) -> Event {
        Event::now(Kind::Net {
            action: "block".into(),
            proto: "connect".into(),
            host: host.into(),
            port,
            rule: rule.into(),
            addr: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
        })
    }

    /// What the sandbox asked for is data: a name that is no host name never becomes a line
    /// (it could close the block and open `network "host"`); an address, a name your own
    /// `deny` refused, a secret and a refused tool call are notes, not lines.
    #[test]
    fn only_valid_names_refused_by_the_allowlist_become_lines() {
        let network = vec!["ok.test".to_string()];
        let events = vec![
            net("registry.test", 443, "not in the allowlist"),
            net("registry.test", 443, "not in the allowlist"),
            net("Other.Test", 8080, "not in the allowlist"),
            net("a.com\"\n}\nnetwork \"host", 443, "not in the allowlist"),
            net("10.0.0.1", 443, "an IP address"),
            net("bad.test", 443, "deny \"bad.test\""),
            net("ok.test", 443, "not in the allowlist"),
            Event::now(Kind::LateMask {
                path: "/p/.env.local".into(),
                rule: "sensitive \".env.*\"".into(),
                dir: false,
            }),
        ];
        let (p, notes) = propose(&events, &network);
        let lines: Vec<&str> = p.iter().map(|p| p.line.as_str()).collect();
        assert_eq!(
            lines,
            ["allow \"other.test:8080\"", "allow \"registry.test\""]
        );
        assert_eq!(p[1].count, 2);
        assert!(p[1].reason.contains("refused 2 times"), "{}", p[1].reason);
        let all = notes.join("\n");
        assert!(all.contains("a.com\"?}?network \"host"), "{all}");
        assert!(all.contains("10.0.0.1"), "{all}");
        assert!(all.contains("your own `deny \"bad.test\"`"), "{all}");
        assert!(all.contains(".env.local appeared"), "{all}");
        assert!(!all.contains('\n') || notes.iter().all(|n| !n.contains('\n')));
    }
}
