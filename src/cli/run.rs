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

The exit code is the command's own (128+N when a signal N ended it); 125 means the sandbox
could not start.")]
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
    if let Some(task) = &a.task {
        // Evaluate once to read the task, then again with its profile and command.
        let plan = eval::evaluate(&loaded, &host, &req)?;
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
    }
    if req.command.is_empty() {
        return Err(Error::Usage(
            "nothing to run: give a command after -- (or a task name); `aisb up` is for a shell"
                .into(),
        ));
    }
    let plan = eval::evaluate(&loaded, &host, &req)?;
    let summary = super::run_plan(g, &host, plan, a.sandbox.as_deref(), a.backend, false)?;
    if a.json {
        eprintln!("{}", serde_json::to_string(&summary).unwrap_or_default());
    }
    Ok(summary.exit_code)
}
