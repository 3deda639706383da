use super::Global;
use crate::Error;

/// List the tasks defined in sandbox.kdl
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  aisb tasks\n  aisb tasks --json")]
pub struct Args {
    /// Machine-readable output for editors' task runners
    #[arg(long)]
    pub json: bool,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let plan = g.plan(&host, None, vec![])?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&plan.tasks).unwrap_or_default()
        );
        return Ok(0);
    }
    if plan.tasks.is_empty() {
        println!("no tasks (define one with `task \"test\" {{ run \"cargo test\" }}`)");
    }
    for t in &plan.tasks {
        let profile = t.profile.as_deref().unwrap_or("default");
        println!(
            "{:<16} [{profile}] {}",
            t.name,
            t.description.clone().unwrap_or_else(|| t.args.join(" "))
        );
    }
    Ok(0)
}
