use std::io::{Read, Seek, SeekFrom, Write};

use super::Global;
use crate::audit::{parse, Event};
use crate::Error;

/// Show the audit log: sandbox starts and exits, every network decision
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb audit                    this project's sandbox: what it did, what was blocked
  aisb audit --blocked-only     only the refusals (network, agent tools, masked paths), with the rule
  aisb audit --json             one JSON object per line, for programs
  aisb audit --follow           keep printing new events as they happen
  aisb audit --kind file --since 1h   attempts on masked paths in the last hour")]
pub struct Args {
    /// The named sandbox (default: `default`, the one `aisb run` uses)
    pub name: Option<String>,
    /// Only what was refused: blocked network requests, agent tool calls, attempts on masked
    /// paths, and limits that stopped a sandbox
    #[arg(long)]
    pub blocked_only: bool,
    /// JSON lines instead of text
    #[arg(long)]
    pub json: bool,
    /// Wait for new events (until interrupted)
    #[arg(long)]
    pub follow: bool,
    /// Only events of these kinds (net, file, agent, agent-block, limit, quarantine,
    /// late-mask, credential, start, exit, dropped); repeatable
    #[arg(long, value_name = "KIND", value_parser = clap::builder::PossibleValuesParser::new([
        "net", "file", "agent", "agent-block", "limit", "quarantine", "late-mask", "credential",
        "start", "exit", "dropped",
    ]))]
    pub kind: Vec<String>,
    /// Only events that name this agent (its tool calls)
    #[arg(long, value_name = "AGENT")]
    pub agent: Option<String>,
    /// Only events of the last DURATION (`90s`, `10m`, `2h`, `1day`)
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub since: Option<std::time::Duration>,
}

/// The audit log of the sandbox `name` (default: `default`), with the plan it was found by.
pub(super) fn log_of(
    g: &Global,
    host: &crate::eval::Host,
    name: Option<String>,
) -> Result<(crate::eval::Plan, std::path::PathBuf), Error> {
    let loaded = g.load(host)?;
    let mut req = g.request(None, vec![]);
    req.sandbox = name;
    let plan = super::evaluated(crate::eval::evaluate(&loaded, host, &req)?);
    let path = plan.state_dir.join("audit.jsonl");
    Ok((plan, path))
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let (_, path) = log_of(g, &host, a.name.clone())?;
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !a.follow => {
            eprintln!(
                "no audit log yet for sandbox `{}` ({}): nothing has run in it",
                a.name.as_deref().unwrap_or("default"),
                path.display()
            );
            return Ok(0);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // --follow: wait for the first run to create it.
            loop {
                std::thread::sleep(std::time::Duration::from_millis(200));
                if let Ok(f) = std::fs::File::open(&path) {
                    break f;
                }
            }
        }
        Err(source) => return Err(Error::Io { path, source }),
    };
    let since = a.since.map(|d| {
        std::time::SystemTime::now()
            .checked_sub(d)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |t| t.as_millis() as u64)
    });
    let wanted = |e: &Event| {
        (!a.blocked_only || e.is_blocked())
            && (a.kind.is_empty() || a.kind.contains(&e.kind_name()))
            && a.agent
                .as_deref()
                .is_none_or(|want| e.agent() == Some(want))
            && since.is_none_or(|t| e.ts >= t)
    };
    let show = |events: Vec<Event>| {
        let mut out = std::io::stdout().lock();
        for e in events.iter().filter(|e| wanted(e)) {
            let line = if a.json {
                serde_json::to_string(&e.seed_json()).unwrap_or_default()
            } else {
                e.human()
            };
            if writeln!(out, "{line}").is_err() {
                return false; // a closed pipe (`| head`): stop quietly
            }
        }
        out.flush().is_ok()
    };
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    // Only whole lines: a line being written now is read on the next round.
    let mut done = text.rfind('\n').map_or(0, |i| i + 1);
    if !show(parse(&text[..done])) || !a.follow {
        return Ok(0);
    }
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut more = String::new();
        if file.seek(SeekFrom::Start(done as u64)).is_err()
            || file.read_to_string(&mut more).is_err()
        {
            continue;
        }
        let Some(end) = more.rfind('\n') else {
            continue;
        };
        done += end + 1;
        if !show(parse(&more[..=end])) {
            return Ok(0);
        }
    }
}
