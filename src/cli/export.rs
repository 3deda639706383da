use std::path::PathBuf;

use super::Global;
use crate::Error;

/// Export the sandbox as an OCI bundle
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb export bundle /tmp/sb && runc run --bundle /tmp/sb sb1\n  aisb export bundle /tmp/sb -- make test"
)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// A bundle directory: config.json, rootfs skeleton, masking file; overlay dirs are created
    /// under the sandbox's state dir
    Bundle {
        /// New (or empty) directory to write
        dir: PathBuf,
        #[arg(short, long)]
        profile: Option<String>,
        /// Command to run inside instead of the configured one
        #[arg(last = true)]
        command: Vec<String>,
    },
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let What::Bundle {
        dir,
        profile,
        command,
    } = a.what;
    let host = super::host()?;
    let plan = g.plan(&host, profile, command)?;
    let exe = super::current_exe()?;
    crate::spec::bundle::write(
        &plan,
        &dir,
        Some(&crate::init::binary_beside(&exe)),
        false,
        None,
        None,
    )?;
    eprintln!(
        "wrote bundle {} (profile {}, {} masked paths)",
        dir.display(),
        plan.profile,
        plan.masks.len()
    );
    Ok(0)
}
