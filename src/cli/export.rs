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
    if plan.rootfs != crate::eval::plan::Rootfs::Host {
        // The image's root is an overlay that aisb's runtime process mounts privately; a bundle
        // for another runtime would bind empty directories in its place.
        return Err(crate::image::graph::BuildError::Step {
            at: "rootfs".into(),
            message: "a sandbox on an image cannot be exported as a bundle yet: its root is an overlay of the image's layers that only aisb's runtime mounts".into(),
            help: "run it with `aisb run` / `aisb up`; `aisb spec` shows its spec; export a sandbox on the host's root (`rootfs \"host\"`) for other runtimes".into(),
        }
        .into());
    }
    let exe = super::current_exe()?;
    crate::spec::bundle::write(
        &plan,
        &dir,
        Some(&crate::init::binary_beside(&exe)),
        false,
        None,
        None,
        // Another OCI runtime applies `linux.resources` itself.
        crate::spec::LimitsBy::Cgroup,
    )?;
    eprintln!(
        "wrote bundle {} (profile {}, {} masked paths)",
        dir.display(),
        plan.profile,
        plan.masks.len()
    );
    Ok(0)
}
