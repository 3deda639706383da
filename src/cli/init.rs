use std::io::Write;
use std::path::PathBuf;

use super::Global;
use crate::Error;

/// The commented template `aisb init` writes: every node of the language.
pub const TEMPLATE: &str = include_str!("../../sandbox.kdl.example");

/// Write a commented sandbox.kdl (never overwrites an existing file)
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  aisb init\n  aisb init -o other/sandbox.kdl")]
pub struct Args {
    /// Where to write it
    #[arg(short, long, default_value = "sandbox.kdl")]
    pub output: PathBuf,
}

pub fn run(_g: &Global, a: Args) -> Result<i32, Error> {
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&a.output)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::Exists { path: a.output })
        }
        Err(source) => {
            return Err(Error::Io {
                path: a.output,
                source,
            })
        }
    };
    f.write_all(TEMPLATE.as_bytes())
        .map_err(|source| Error::Io {
            path: a.output.clone(),
            source,
        })?;
    eprintln!(
        "wrote {} — edit it, then run `aisb check` and `aisb plan`",
        a.output.display()
    );
    Ok(0)
}
