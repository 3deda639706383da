use super::Global;
use crate::eval;
use crate::runtime::Backend;
use crate::Error;

/// Run a command (or a task from sandbox.kdl) in the sandbox, non-interactively
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb run -- make test
  aisb run --profile investigate -- claude -p \"explain src/main.rs\"
  aisb run test                      # the task named `test` in sandbox.kdl
  aisb run --json -- true            # a JSON summary on stderr after the exit
  aisb run --sandbox fix-42 -- make  # in the named sandbox `fix-42` (its own clone)
  aisb run --strict-audit test       # fail when the sandbox refused any network request

CI mode (`CI` set, as GitHub Actions and GitLab CI do): no prompt ever (a sandbox.kdl that
loosens the defaults is refused with the list unless `--trust`), the image must match
sandbox.lock (`--locked`), and a JSON summary is printed on stderr after every run.

The exit code is the command's own (128+N when a signal N ended it); 125 means the sandbox
could not start; with --strict-audit, a command that succeeded but was refused network
access exits 1.")]
pub struct Args {
    /// A task defined in sandbox.kdl (`aisb tasks` lists them)
    pub task: Option<String>,
    #[arg(short, long)]
    pub profile: Option<String>,
    /// Default: `backend` in sandbox.kdl, else libcontainer for root and bwrap otherwise
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Print a JSON summary (exit code, duration, profile) to stderr when done
    #[arg(long)]
    pub json: bool,
    /// Refuse to run when the image (`rootfs`) differs from sandbox.lock, or has no entry
    /// there (always on in CI)
    #[arg(long)]
    pub locked: bool,
    /// Exit non-zero when the sandbox refused any network request during this run, listing
    /// them (the audit log has the details)
    #[arg(long)]
    pub strict_audit: bool,
    /// Run in this named sandbox (its own shared clone of the repository; see `aisb up NAME`)
    #[arg(long, value_name = "NAME")]
    pub sandbox: Option<String>,
    /// The command and its arguments
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let loaded = g.load_for(&host, &a.command)?;
    let mut req = g.request(a.profile, a.command);
    req.sandbox = a.sandbox.clone();
    // A task's own variables and directory, applied to the plan its command runs under.
    let mut task_env: Vec<(String, String)> = Vec::new();
    let mut task_cwd = None;
    if let Some(task) = &a.task {
        // Evaluate once to read the task, then again with its profile and command.
        let plan = super::evaluated(eval::evaluate(&loaded, &host, &req)?);
        let Some(t) = plan.tasks.iter().find(|t| &t.name == task) else {
            let hint =
                crate::config::diag::suggest(task, plan.tasks.iter().map(|t| t.name.as_str()))
                    .map(str::to_string);
            return Err(Error::UnknownTask {
                name: task.clone(),
                hint,
            });
        };
        if !req.command.is_empty() {
            return Err(Error::Usage(
                "give either a task or a command after --, not both".into(),
            ));
        }
        req.command = t.args.clone();
        req.profile = req.profile.or_else(|| t.profile.clone());
        task_env = t.env.clone();
        task_cwd = t.cwd.clone();
    }
    if req.command.is_empty() {
        return Err(Error::Usage(
            "nothing to run: give a command after -- (or a task name); `aisb up` is for a shell"
                .into(),
        ));
    }
    let mut plan = super::evaluated(eval::evaluate(&loaded, &host, &req)?);
    for (k, v) in task_env {
        // What aisb sets itself (the identity, XDG directories, the proxy) stays aisb's.
        let own = matches!(k.as_str(), "HOME" | "USER" | "LOGNAME" | "SHELL")
            || k.starts_with("XDG_")
            || crate::vocab::sandbox_env().iter().any(|(n, _)| *n == k);
        if own {
            eprintln!("aisb: the task's `env \"{k}\"` is ignored: aisb sets {k} in the sandbox");
            continue;
        }
        plan.env.vars.retain(|(n, _)| *n != k);
        plan.env.vars.push((k, v));
    }
    plan.env.vars.sort();
    if let Some(cwd) = task_cwd {
        plan.process.cwd = cwd;
    }
    let ci = crate::ci::is_ci();
    if a.locked || ci {
        locked(&plan)?;
    }
    let audit_path = plan.state_dir.join("audit.jsonl");
    let audit_from = std::fs::metadata(&audit_path).map_or(0, |m| m.len());
    let summary = super::run_plan(g, &host, plan, a.sandbox.as_deref(), a.backend, false)?;
    let blocked = blocked_since(&audit_path, audit_from);
    if a.json || ci {
        let mut v = serde_json::to_value(&summary).unwrap_or_default();
        v["blocked"] = serde_json::Value::from(blocked.clone());
        eprintln!("{}", serde_json::to_string(&v).unwrap_or_default());
    }
    if a.strict_audit && !blocked.is_empty() {
        eprintln!(
            "aisb: --strict-audit: the sandbox refused {} network request(s):",
            blocked.len()
        );
        for b in &blocked {
            eprintln!("  - {b}");
            if crate::ci::is_github_actions() {
                println!(
                    "{}",
                    crate::ci::annotation(
                        "error",
                        &crate::ci::At::default(),
                        "aisb: blocked network request",
                        b
                    )
                );
            }
        }
        eprintln!("  help: allow what the command needs in sandbox.kdl's `network` block (`aisb audit --blocked-only` says how), or stop it from asking");
        return Ok(if summary.exit_code == 0 {
            1
        } else {
            summary.exit_code
        });
    }
    Ok(summary.exit_code)
}

/// `--locked`: the plan's image must be the one sandbox.lock pins (its graph hash: the steps,
/// their inputs and the pinned bases). Nothing is built or resolved here; a base that moved is
/// `aisb build --locked`'s to find.
fn locked(plan: &eval::Plan) -> Result<(), Error> {
    use crate::image::lock::{Lock, LockError, FILE};
    use crate::image::sandbox;
    let Some(def) = sandbox::def_of(plan)? else {
        return Ok(());
    };
    let path = plan.project.join(FILE);
    let lock = Lock::read(&plan.project)?;
    let Some(entry) = lock.images.get(&def.name) else {
        return Err(LockError::Missing {
            path,
            image: def.name,
        }
        .into());
    };
    let o = sandbox::options(plan, &def, &lock, &Default::default(), false);
    let graph = crate::image::graph::plan(&def, &o)?;
    if graph.hash != entry.graph {
        return Err(LockError::Graph {
            path,
            image: def.name,
            pinned: entry.graph.clone(),
            now: graph.hash,
        }
        .into());
    }
    Ok(())
}

/// The network requests the proxy refused in events appended to the audit log after `from`
/// (its length before this run): `host:port (proto): rule`.
fn blocked_since(path: &std::path::Path, from: u64) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let mut text = String::new();
    // Bounded: a run's own events, never more than 64 MiB of them.
    if f.seek(SeekFrom::Start(from)).is_err() || f.take(64 << 20).read_to_string(&mut text).is_err()
    {
        return Vec::new();
    }
    crate::audit::parse(&text)
        .into_iter()
        .filter_map(|e| match e.kind {
            crate::audit::Kind::Net {
                action,
                proto,
                host,
                port,
                rule,
                ..
            } if action == "block" => Some(format!("{host}:{port} ({proto}): {rule}")),
            _ => None,
        })
        .collect()
}
