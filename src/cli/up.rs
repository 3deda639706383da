use super::Global;
use crate::runtime::Backend;
use crate::Error;

/// Open an interactive shell (or run a command) in the sandbox, on this terminal
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb up                          # your shell (fish if $SHELL is fish) in the sandbox
  aisb up -- claude                # an agent, interactively
  aisb up fix-42 -- claude         # in sandbox `fix-42`: a shared clone of this repository,
                                   # its commits fetched here as `sandbox-fix-42/<branch>`
  aisb up --profile investigate")]
pub struct Args {
    /// A named sandbox: works in its own shared clone of this repository (created on first
    /// use, kept until `aisb rm`); without a name, in the repository itself
    pub name: Option<String>,
    #[arg(short, long)]
    pub profile: Option<String>,
    /// Default: `backend` in sandbox.kdl, else libcontainer for root and bwrap otherwise
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// The command (default: your shell)
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let loaded = g.load_for(&host, &a.command)?;
    let mut req = g.request(a.profile, a.command);
    req.sandbox = a.name.clone();
    let plan = super::evaluated(crate::eval::evaluate(&loaded, &host, &req)?);
    Ok(super::run_plan(g, &host, plan, a.name.as_deref(), a.backend, true)?.exit_code)
}
