use std::io::Write;
use std::path::PathBuf;

use super::Global;
use crate::Error;

/// The commented template `aisb init` writes: every node of the language.
pub const TEMPLATE: &str = include_str!("../../sandbox.kdl.example");

/// Write a commented sandbox.kdl (never overwrites an existing file)
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  aisb init
  aisb init -o other/sandbox.kdl
  aisb init --from-devcontainer             from .devcontainer/devcontainer.json
  aisb init --from-devcontainer path/devcontainer.json -o -    print it instead

From a devcontainer.json: the image or Dockerfile becomes `rootfs`, containerEnv/remoteEnv
`env`, bind mounts `mount`, remoteUser `process { user }`, lifecycle commands tasks,
forwardPorts `localhost-port`; what does not map (features, runArgs, capAdd, privileged, …)
is listed with the reason, and template placeholders are reported, never guessed.
Compose-based configurations are refused.")]
pub struct Args {
    /// Where to write it (`-`: standard output)
    #[arg(short, long, default_value = "sandbox.kdl")]
    pub output: PathBuf,
    /// Import a devcontainer.json (default: .devcontainer/devcontainer.json, else
    /// .devcontainer.json)
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = DEFAULT_DEVCONTAINER)]
    pub from_devcontainer: Option<PathBuf>,
}

pub fn run(_g: &Global, a: Args) -> Result<i32, Error> {
    let template = match &a.from_devcontainer {
        Some(p) => from_devcontainer(p, &a.output)?,
        None => TEMPLATE.to_string(),
    };
    if a.output.as_os_str() == "-" {
        print!("{template}");
        return Ok(0);
    }
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
    f.write_all(template.as_bytes())
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

const DEFAULT_DEVCONTAINER: &str = ".devcontainer/devcontainer.json";

fn from_devcontainer(path: &std::path::Path, output: &std::path::Path) -> Result<String, Error> {
    let path = if path == std::path::Path::new(DEFAULT_DEVCONTAINER) && !path.exists() {
        let other = PathBuf::from(".devcontainer.json");
        if !other.is_file() {
            return Err(Error::Usage(
                "no .devcontainer/devcontainer.json or .devcontainer.json here; give its path: `aisb init --from-devcontainer PATH`".into(),
            ));
        }
        other
    } else {
        path.to_path_buf()
    };
    let io = |source| Error::Io {
        path: path.clone(),
        source,
    };
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(std::fs::File::open(&path).map_err(io)?, 2 << 20),
        &mut text,
    )
    .map_err(io)?;
    let out_dir = if output.as_os_str() == "-" {
        std::path::Path::new(".")
    } else {
        output
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."))
    };
    // Absolute, so that `..` in build.context and dockerfile resolve against real directories.
    let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let dc_dir = abs(&path)
        .parent()
        .map_or_else(|| PathBuf::from("/"), std::path::Path::to_path_buf);
    let c = super::devcontainer::convert(&path, &dc_dir, &text, &abs(out_dir))?;
    for m in &c.mapped {
        eprintln!("  imported     {m}");
    }
    for p in &c.placeholders {
        eprintln!("  placeholder  {p} (not guessed: fill it in, the node is commented out)");
    }
    for u in &c.unmapped {
        eprintln!("  not imported {u}");
    }
    Ok(c.kdl)
}
