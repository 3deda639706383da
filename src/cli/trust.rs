use super::Global;
use crate::Error;

/// Approve what a configuration loosens, outside the sandbox (where a run would ask)
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb trust                       # the default profile of ./sandbox.kdl\n  aisb trust --profile investigate\n  aisb trust other/sandbox.kdl\n\nShows every loosening of the plan and records it as approved for this file and profile: \
later runs ask only about what is new. Never run it on a file you have not read (`aisb plan` shows everything it does)."
)]
pub struct Args {
    /// The configuration file (default: sandbox.kdl in this directory or a parent, or `-f`'s)
    #[arg(value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    #[arg(short, long)]
    pub profile: Option<String>,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let g = &g.with_file(a.config.clone())?;
    let host = super::host()?;
    let plan = g.plan(&host, a.profile, vec![])?;
    // Unmasking what an earlier run masked is approved here too (see `eval::masks::keep`).
    if !plan.kept_masked.is_empty() {
        let record = plan.state_dir.join(crate::eval::masks::KEPT_FILE);
        if let Err(e) = std::fs::remove_file(&record) {
            return Err(crate::trust::TrustError::Io {
                path: record,
                source: e,
            }
            .into());
        }
        eprintln!("unmasked from the next run (the rules no longer mask them):");
        for p in &plan.kept_masked {
            eprintln!("  - {}", p.display());
        }
    }
    match crate::trust::approve(&plan, &host.config_home())? {
        None => eprintln!("nothing to trust: the embedded default applies (no sandbox.kdl)"),
        Some(list) if list.is_empty() => {
            eprintln!("nothing to trust: this configuration loosens nothing")
        }
        Some(list) => {
            eprintln!("trusted (profile {}):", plan.profile);
            for l in list {
                eprintln!("  - {l}");
            }
        }
    }
    Ok(0)
}
