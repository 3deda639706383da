//! `aisb store`: the content-addressed store's entries, their sizes and users; gc.

use crate::graph::store;
use crate::session::human_bytes;
use crate::Error;

/// The content-addressed store: list entries, or remove those no sandbox uses
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb store ls                  entries, sizes, which sandboxes use them
  aisb store ls --json
  aisb store gc --dry-run        what gc would remove
  aisb store gc                  remove entries no sandbox state refers to")]
pub struct Args {
    #[command(subcommand)]
    pub command: StoreCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum StoreCommand {
    /// List the store's entries
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove entries no sandbox uses, incomplete entries and leftovers of interrupted builds
    Gc {
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: Args) -> Result<i32, Error> {
    let host = super::host()?;
    let cache = host.cache_home().join("aisb");
    let root = cache.join("store");
    match a.command {
        StoreCommand::Ls { json } => {
            let entries = store::list(&root, &cache, &crate::image::lock::pinned_entries);
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&entries).unwrap_or_default()
                );
                return Ok(0);
            }
            let total: u64 = entries.iter().map(|e| e.bytes).sum();
            for e in &entries {
                let users = match e.used_by.len() {
                    _ if !e.ready => "incomplete".to_string(),
                    0 => "unused".to_string(),
                    1 => "1 sandbox".to_string(),
                    n => format!("{n} sandboxes"),
                };
                println!("{:<48} {:>10}  {users}", e.name, human_bytes(e.bytes));
            }
            println!(
                "{} entries, {} in {}",
                entries.len(),
                human_bytes(total),
                root.display()
            );
        }
        StoreCommand::Gc { dry_run, json } => {
            let start = std::time::Instant::now();
            let r = store::gc(&root, &cache, &crate::image::lock::pinned_entries, dry_run)
                .map_err(|source| Error::Io {
                    path: root.clone(),
                    source,
                })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                return Ok(0);
            }
            for name in &r.removed {
                println!(
                    "{} {name}",
                    if dry_run { "would remove" } else { "removed" }
                );
            }
            println!(
                "{} {} entries, {} in {:.1} s; {} kept",
                if dry_run { "Would prune" } else { "Pruned" },
                r.removed.len(),
                human_bytes(r.bytes),
                start.elapsed().as_secs_f64(),
                r.kept
            );
        }
    }
    Ok(0)
}
