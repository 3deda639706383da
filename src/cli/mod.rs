//! Command line: clap structs, one file per subcommand.

mod audit;
mod check;
mod completions;
mod doctor;
mod export;
mod init;
mod libcontainer_helper;
mod plan;
mod presets;
mod proxy;
mod run;
mod sandboxes;
mod setup_user;
mod spec;
mod tasks;
mod up;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::eval::{self, Host, Loaded, Request, Root};
use crate::Error;

const EXAMPLES: &str = "\
Examples:
  aisb up                        your shell in the sandbox
  aisb run -- make test          run a command in the sandbox
  aisb run --profile investigate -- claude -p \"review this\"
  aisb init                      write a commented sandbox.kdl
  aisb check                     validate sandbox.kdl (all profiles)
  aisb plan                      show mounts, masked paths, env and network
  aisb plan --profile investigate
  aisb spec > config.json        the OCI runtime spec
  aisb export bundle /tmp/b      a bundle any OCI runtime (runc) can run
  aisb audit --blocked-only      what the sandbox's network policy refused
  aisb up fix-42                 a named sandbox: its own shared clone, synced both ways
  aisb ls                        this repository's named sandboxes
  aisb rm fix-42                 remove one (refused while it has unsynced commits)
  aisb gc                        remove what old and orphaned sandboxes left";

#[derive(Debug, Parser)]
#[command(name = "aisb", version, about = "Run AI coding agents and any command in a sandbox described by sandbox.kdl",
    after_help = EXAMPLES, propagate_version = true)]
pub struct Cli {
    /// The configuration file (default: sandbox.kdl in this directory or a parent, up to the
    /// repository root; the embedded default when there is none)
    #[arg(short = 'f', long = "file", global = true, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Run as if started in DIR
    #[arg(short = 'C', global = true, value_name = "DIR")]
    pub chdir: Option<PathBuf>,
    /// Rescan the project even when the cached scan is still valid
    #[arg(long, global = true)]
    pub no_cache: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Init(init::Args),
    Run(run::Args),
    Up(up::Args),
    Check(check::Args),
    Plan(plan::Args),
    Spec(spec::Args),
    Export(export::Args),
    Tasks(tasks::Args),
    Presets(presets::Args),
    Doctor(doctor::Args),
    Audit(audit::Args),
    Ls(sandboxes::LsArgs),
    Rm(sandboxes::RmArgs),
    Gc(sandboxes::GcArgs),
    SetupUser(setup_user::Args),
    Completions(completions::Args),
    #[command(name = "__libcontainer", hide = true)]
    LibcontainerHelper(libcontainer_helper::Args),
    #[command(name = "__proxy", hide = true)]
    Proxy(proxy::Args),
}

pub fn run(args: impl IntoIterator<Item = OsString>) -> Result<i32, Error> {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return Ok(code);
        }
    };
    if let Some(dir) = &cli.chdir {
        std::env::set_current_dir(dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
    }
    let g = Global {
        file: cli.file.clone(),
        no_cache: cli.no_cache,
    };
    match cli.command {
        Command::Init(a) => init::run(&g, a),
        Command::Run(a) => run::run(&g, a),
        Command::Up(a) => up::run(&g, a),
        Command::Check(a) => check::run(&g, a),
        Command::Plan(a) => plan::run(&g, a),
        Command::Spec(a) => spec::run(&g, a),
        Command::Export(a) => export::run(&g, a),
        Command::Tasks(a) => tasks::run(&g, a),
        Command::Presets(a) => presets::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Audit(a) => audit::run(&g, a),
        Command::Ls(a) => sandboxes::ls(&g, a),
        Command::Rm(a) => sandboxes::rm(&g, a),
        Command::Gc(a) => sandboxes::gc(a),
        Command::SetupUser(a) => setup_user::run(a),
        Command::Completions(a) => completions::run(a),
        Command::LibcontainerHelper(a) => libcontainer_helper::run(a),
        Command::Proxy(a) => proxy::run(a),
    }
}

/// Options every subcommand shares.
pub struct Global {
    pub file: Option<PathBuf>,
    pub no_cache: bool,
}

/// The caller, as the evaluator sees it.
pub fn host() -> Result<Host, Error> {
    Host::current().map_err(|source| Error::Io {
        path: ".".into(),
        source,
    })
}

/// The running aisb binary (the init binary and the libcontainer helper live beside it).
pub fn current_exe() -> Result<std::path::PathBuf, Error> {
    std::env::current_exe().map_err(|source| Error::Io {
        path: "/proc/self/exe".into(),
        source,
    })
}

/// The directory a project's root defaults to: the git work tree's top, else `start`.
pub fn project_dir(start: &Path) -> PathBuf {
    let mut cur = Some(start);
    while let Some(d) = cur {
        if d.join(".git").exists() {
            return d.to_path_buf();
        }
        cur = d.parent();
    }
    start.to_path_buf()
}

/// `sandbox.kdl` in `start` or a parent, not above the repository root.
pub fn find_config(start: &Path) -> Option<PathBuf> {
    let mut cur = Some(start);
    while let Some(d) = cur {
        let f = d.join("sandbox.kdl");
        if f.is_file() {
            return Some(f);
        }
        if d.join(".git").exists() {
            return None;
        }
        cur = d.parent();
    }
    None
}

impl Global {
    pub fn root(&self, host: &Host) -> Result<Root, Error> {
        match &self.file {
            Some(f) => {
                let f = if f.is_absolute() {
                    f.clone()
                } else {
                    host.cwd.join(f)
                };
                if !f.is_file() {
                    return Err(Error::NoConfig { path: f });
                }
                Ok(Root::File(f))
            }
            None => Ok(match find_config(&host.cwd) {
                Some(f) => Root::File(f),
                None => Root::Default {
                    dir: project_dir(&host.cwd),
                },
            }),
        }
    }

    /// Load the configuration; syntax and decoding errors are returned all together.
    pub fn load(&self, host: &Host) -> Result<Loaded, Error> {
        let (loaded, errors) = self.load_with_errors(host)?;
        errors.into_result().map_err(Error::Config)?;
        Ok(loaded)
    }

    /// Load what can be loaded; configuration errors are returned beside it, not raised
    /// (`aisb check` reports them with the evaluation's own).
    pub fn load_with_errors(&self, host: &Host) -> Result<(Loaded, crate::config::Errors), Error> {
        let root = self.root(host)?;
        let mut errors = crate::config::Errors::default();
        let path = match &root {
            Root::File(p) | Root::Text { path: p, .. } => p.clone(),
            Root::Default { dir } => dir.clone(),
        };
        let cache = (!self.no_cache).then(|| host.cache_home().join("aisb").join("kdl"));
        let loaded = eval::load_cached(root, &mut errors, cache)
            .map_err(|source| Error::Io { path, source })?;
        Ok((loaded, errors))
    }

    /// What to evaluate: a profile and a command, with this invocation's cache setting.
    pub fn request(&self, profile: Option<String>, command: Vec<String>) -> Request {
        Request {
            profile,
            command,
            use_cache: !self.no_cache,
            ..Request::default()
        }
    }

    pub fn plan(
        &self,
        host: &Host,
        profile: Option<String>,
        command: Vec<String>,
    ) -> Result<eval::Plan, Error> {
        let loaded = self.load(host)?;
        eval::evaluate(&loaded, host, &self.request(profile, command)).map_err(Error::from)
    }
}

/// The host pid of the named sandbox's running init, if it runs.
fn running_init(plan: &eval::Plan) -> Option<i32> {
    std::fs::read_to_string(plan.state_dir.join(crate::runtime::INIT_PID_FILE))
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|&p| crate::session::attach::alive(p))
}

/// Run `plan` on `backend`; in the named sandbox `sandbox` when given: its shared clone, kept
/// in sync with the repository while it runs (see `session`).
pub fn run_plan(
    mut plan: eval::Plan,
    sandbox: Option<&str>,
    backend: Option<crate::runtime::Backend>,
    interactive: bool,
) -> Result<crate::runtime::Summary, Error> {
    let backend = crate::runtime::Backend::choose(backend, plan.backend.as_deref());
    let Some(name) = sandbox else {
        return Ok(crate::runtime::run(&plan, backend, interactive)?);
    };
    let s = match crate::session::prepare(&mut plan, name) {
        Ok(s) => s,
        // Running already: a second session joins it instead of starting another sandbox.
        Err(crate::session::SessionError::Busy(..)) if running_init(&plan).is_some() => {
            let pid = running_init(&plan).unwrap_or(0);
            let start = std::time::Instant::now();
            let exit_code = crate::session::attach::attach(pid, &plan.process.args)?;
            return Ok(crate::runtime::Summary {
                backend,
                profile: plan.profile.clone(),
                exit_code,
                duration_ms: start.elapsed().as_millis(),
                masked_paths: plan.masks.len(),
                network: plan.network.mode,
            });
        }
        Err(e) => return Err(e.into()),
    };
    let watcher = crate::session::sync::watch(
        s.repo.clone(),
        s.clone.clone(),
        s.name.clone(),
        s.state.clone(),
    );
    let summary = crate::runtime::run(&plan, backend, interactive);
    drop(watcher);
    if let Ok(branch) =
        crate::session::git(&s.clone, &["rev-parse", "--abbrev-ref", "HEAD"], &s.state)
    {
        eprintln!(
            "aisb: sandbox `{name}`: its commits are in this repository as `sandbox-{name}/{branch}` (and its other branches)"
        );
    }
    Ok(summary?)
}
