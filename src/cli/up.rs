use super::Global;
use crate::runtime::{self, Backend};
use crate::Error;

/// Open an interactive shell (or run a command) in the sandbox, on this terminal
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb up                          # your shell (fish if $SHELL is fish) in the sandbox
  aisb up -- claude                # an agent, interactively
  aisb up --profile investigate")]
pub struct Args {
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
    let plan = g.plan(&host, a.profile, a.command)?;
    Ok(runtime::run(
        &plan,
        Backend::choose(a.backend, plan.backend.as_deref()),
        true,
    )?
    .exit_code)
}
