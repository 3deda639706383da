use super::Global;
use crate::spec::{self, SpecPaths};
use crate::Error;

/// Print the OCI runtime spec (config.json) for the sandbox
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb spec > config.json\n  aisb spec --profile investigate -- claude -p hello"
)]
pub struct Args {
    /// Profile to use (default: the file's `default-profile`, else the top level)
    #[arg(short, long)]
    pub profile: Option<String>,
    /// Command to run inside instead of the configured one
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let plan = g.plan(&host, a.profile, a.command)?;
    let plan = match crate::image::sandbox::graph_of(&plan) {
        None => plan,
        Some(graph) => {
            let graph = graph?;
            let Some(built) = crate::image::sandbox::as_built(&plan, &graph) else {
                return Err(crate::image::graph::BuildError::Step {
                    at: "rootfs".into(),
                    message: format!(
                        "the image {} is not built yet, so its directories are not known",
                        graph.name
                    ),
                    help: "`aisb build` builds it".into(),
                }
                .into());
            };
            eprintln!(
                "aisb: the image's directories are bound from {}, where aisb's runtime process mounts the image privately (an overlay of its layers) before it starts",
                crate::image::sandbox::mountpoint(&plan).display()
            );
            built
        }
    };
    let bundle = plan.state_dir.join("bundle");
    let exe = super::current_exe()?;
    let paths = SpecPaths {
        rootfs: "rootfs".into(),
        mask_file: plan.store.join("masked-0000"),
        cgroups_path: spec::bundle::cgroups_path(&plan, &bundle, None),
        terminal: false,
        proxy_dir: None,
        rootless: None,
        init: Some(crate::init::binary_beside(&exe)),
        limits: spec::LimitsBy::Cgroup,
        // Each mask a mount of its own: the spec is for reading and for other runtimes.
        mask_list: None,
    };
    let spec = spec::build(&plan, &paths)?;
    println!("{}", spec::to_json(&spec)?);
    Ok(0)
}
