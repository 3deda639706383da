use super::tasks_export::{self, Editor};
use super::Global;
use crate::Error;

/// List the tasks defined in sandbox.kdl, or export them as an editor's tasks
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb tasks
  aisb tasks --json
  aisb tasks export vscode            .vscode/tasks.json (Zed reads it too)
  aisb tasks export zed --dry-run     print .zed/tasks.json as it would be
  aisb tasks export jetbrains         .run/aisb_*.run.xml")]
pub struct Args {
    /// Machine-readable output for editors' task runners
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub action: Option<Action>,
}

#[derive(Debug, clap::Subcommand)]
pub enum Action {
    Export(ExportArgs),
}

/// Write each task as an editor task running `aisb run TASK`, plus `aisb: check` with a
/// problem matcher; merged into an existing file without touching its other entries
#[derive(Debug, clap::Args)]
#[command(after_help = "\
aisb's entries are labelled `aisb: NAME`; exporting again replaces them, adds new tasks,
removes those no longer in sandbox.kdl and leaves everything else (comments included) as it
was. A task whose name has characters a shell would read is not exported.

Examples:
  aisb tasks export vscode
  aisb tasks export zed --dry-run")]
pub struct ExportArgs {
    #[arg(value_enum)]
    pub editor: Editor,
    /// Print what would be written instead of writing it
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let plan = g.plan(&host, None, vec![])?;
    if let Some(Action::Export(e)) = a.action {
        // The editor runs what is written: approved like a run.
        crate::trust::check(&plan, &host.config_home(), g.trust)?;
        return export(&plan, e);
    }
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

fn export(plan: &crate::eval::Plan, a: ExportArgs) -> Result<i32, Error> {
    for t in plan
        .tasks
        .iter()
        .filter(|t| !tasks_export::exportable(&t.name))
    {
        eprintln!(
            "aisb: task `{}` not exported: its name has characters an editor's shell would read (use letters, digits, `_-.:`)",
            t.name.escape_debug()
        );
    }
    let changes = tasks_export::plan(&plan.project, a.editor, &plan.tasks)?;
    if a.dry_run {
        for c in &changes {
            match &c.content {
                Some(text) => println!("// {}\n{text}", c.path.display()),
                None => println!("// remove {}", c.path.display()),
            }
        }
        if changes.is_empty() {
            eprintln!("aisb: nothing to change");
        }
        return Ok(0);
    }
    tasks_export::apply(&plan.project, &changes)?;
    if changes.is_empty() {
        eprintln!("aisb: editor tasks already up to date");
    }
    for c in &changes {
        let verb = if c.content.is_some() {
            "wrote"
        } else {
            "removed"
        };
        eprintln!("aisb: {verb} {}", c.path.display());
    }
    Ok(0)
}
