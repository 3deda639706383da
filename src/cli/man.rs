use std::path::PathBuf;

use clap::CommandFactory;

use crate::Error;

/// Print the man page (from the same definitions as --help)
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb man | man -l -                                 read it now
  aisb man > ~/.local/share/man/man1/aisb.1           for `man aisb` (one user)
  sudo aisb man --dir /usr/local/share/man/man1       aisb.1 and a page per command
                                                      (`man aisb-run`), for everyone")]
pub struct Args {
    /// Write aisb.1 and one page per command (aisb-run.1, …) into DIR instead
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<i32, Error> {
    let cmd = super::Cli::command();
    let io = |path: PathBuf| move |source| Error::Io { path, source };
    match a.dir {
        None => {
            let mut out = std::io::stdout().lock();
            match clap_mangen::Man::new(cmd).render(&mut out) {
                // `aisb man | head`: the reader has what it wanted.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                r => r.map_err(io("<stdout>".into()))?,
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(io(dir.clone()))?;
            // Hidden helpers (`__init`, `__proxy`, …) are aisb's own plumbing: no page.
            clap_mangen::generate_to(cmd, &dir).map_err(io(dir.clone()))?;
            eprintln!("wrote the man pages to {}", dir.display());
        }
    }
    Ok(0)
}
