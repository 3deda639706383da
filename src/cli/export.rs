use std::path::PathBuf;

use super::Global;
use crate::Error;

/// Export the sandbox for other runtimes: an OCI bundle, aisb's seccomp filter as a profile
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb export bundle /tmp/sb && runc run --bundle /tmp/sb sb1\n  aisb export bundle /tmp/sb -- make test\n  aisb export seccomp > aisb-seccomp.json     # a Kubernetes Localhost profile, linux.seccomp of a spec"
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
    /// The seccomp filter aisb's init applies, as an OCI seccomp profile (JSON): for runtimes
    /// where aisb's init does not run (a Kubernetes `seccompProfile: {type: Localhost}`)
    Seccomp {
        /// Write it here instead of stdout
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    match a.what {
        What::Bundle {
            dir,
            profile,
            command,
        } => bundle(g, dir, profile, command),
        What::Seccomp { output } => {
            let profile = crate::init::seccomp::oci::profile();
            let mut text = serde_json::to_string_pretty(&profile)
                .expect("a seccomp profile always serializes");
            text.push('\n');
            write_out(output.as_deref(), &text)
        }
    }
}

/// `text` to `path` (atomically: a reader never sees half of it), or to stdout.
fn write_out(path: Option<&std::path::Path>, text: &str) -> Result<i32, Error> {
    match path {
        Some(p) => crate::atomic::write_atomic(p, text.as_bytes()).map_err(|source| Error::Io {
            path: p.to_path_buf(),
            source,
        })?,
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is not an error worth a message.
            let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
        }
    }
    Ok(0)
}

fn bundle(
    g: &Global,
    dir: PathBuf,
    profile: Option<String>,
    command: Vec<String>,
) -> Result<i32, Error> {
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
