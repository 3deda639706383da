//! aisb: run AI coding agents and any command in a sandbox described by `sandbox.kdl`.
//!
//! Data flows one way: `config` (KDL -> spanned model) -> `eval` (imports, profiles, variables,
//! project scan -> [`eval::Plan`]) -> `graph` (realise what the plan needs on the host) ->
//! `spec` (Plan -> OCI runtime spec) -> `runtime` (run it). Nothing after `eval` sees KDL;
//! `vocab` holds the names every stage shares. docs/ARCHITECTURE.md has the stages, the
//! arrows `scripts/imports.sh` checks, and the graph's node kinds.

pub mod atomic;
pub mod audit;
pub mod beneath;
pub mod child;
pub mod ci;
pub mod cli;
pub mod config;
pub mod eval;
pub mod git;
pub mod graph;
pub mod image;
pub mod init;
pub mod lsp;
pub mod pipe;
pub mod presets;
pub mod private;
pub mod proxy;
pub mod runtime;
pub mod session;
pub mod spec;
pub mod tools;
pub mod trust;
pub mod userns;
pub mod vocab;

use std::ffi::OsString;
use std::path::PathBuf;

/// Everything that can stop a command; each variant says what to do about it.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum Error {
    #[error(transparent)]
    #[diagnostic(transparent)]
    Config(config::ConfigErrors),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Eval(eval::EvalError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Spec(#[from] spec::SpecError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Bundle(#[from] spec::bundle::BundleError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Realise(#[from] graph::realise::RealiseError),
    #[error("{path}: {source}")]
    #[diagnostic(help("check that the path exists and is readable"))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot use aisb's {what} directory {path}: {cause}")]
    #[diagnostic(help(
        "aisb keeps its {what} in ${var}/aisb (by default ~/{default}/aisb): make {path} writable for you, or point {var} at a directory you own (`export {var}=$HOME/{default}`)"
    ))]
    OwnDir {
        what: &'static str,
        var: &'static str,
        default: &'static str,
        path: String,
        cause: std::io::Error,
    },
    #[error("no configuration file at {path}")]
    #[diagnostic(help(
        "create one with `aisb init`, or omit -f to use sandbox.kdl or the embedded default"
    ))]
    NoConfig { path: PathBuf },
    #[error("{path} already exists")]
    #[diagnostic(help("aisb init never overwrites; remove it or choose another path with -o"))]
    Exists { path: PathBuf },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Build(Box<image::graph::BuildError>),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lock(Box<image::lock::LockError>),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Setup(#[from] runtime::rootless::SetupError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Session(#[from] session::SessionError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Trust(#[from] trust::TrustError),
    #[error("unknown task `{name}`")]
    #[diagnostic(help("{}", hint.as_ref().map_or_else(|| "`aisb tasks` lists the tasks in sandbox.kdl".to_string(), |h| format!("did you mean `{h}`?"))))]
    UnknownTask { name: String, hint: Option<String> },
    #[error("{0}")]
    #[diagnostic(help("`aisb help COMMAND` shows how a command is used"))]
    Usage(String),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Devcontainer(#[from] cli::DevcontainerError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    K8s(#[from] spec::k8s::K8sError),
    #[error(transparent)]
    #[diagnostic(transparent)]
    Apparmor(#[from] cli::ApparmorError),
    #[error("unknown preset `{name}`")]
    #[diagnostic(help("{}", hint.as_ref().map_or_else(|| "`aisb presets` lists them".to_string(), |h| format!("did you mean `{h}`?"))))]
    UnknownPreset { name: String, hint: Option<String> },
}

impl From<eval::EvalError> for Error {
    /// Configuration errors stay one diagnostic list whether they come from decoding or eval.
    fn from(e: eval::EvalError) -> Error {
        match e {
            eval::EvalError::Config(c) => Error::Config(c),
            other => Error::Eval(other),
        }
    }
}

/// Run the command line; returns the process exit code. Errors are printed here.
pub fn run(args: impl IntoIterator<Item = OsString>) -> i32 {
    init::keep_source_id();
    let args: Vec<OsString> = args.into_iter().collect();
    // The sandbox's init: no clap, no config; the same entry point as the `aisb-init` binary.
    // Inside a sandbox this binary may itself be the init (no `aisb-init` beside it: `cargo
    // run`, a copied binary), called by its mount path for the init's other verbs too: the
    // named sandbox's `hold`, the SSH ProxyCommand's `connect`, the agents' `agent-event` hook.
    if args.get(1).is_some_and(|a| a == "__init") || init::called_as_init(args.first()) {
        return init::main_from_args(args.into_iter().skip(1));
    }
    runtime::protect::note_process_start();
    match cli::run(args) {
        Ok(code) => code,
        // Editors' tasks ask for one `file:line:col: error: …` line per configuration
        // error, which their problem matchers read (`aisb tasks export`).
        Err(Error::Config(c))
            if std::env::var_os("AISB_DIAGNOSTICS").is_some_and(|v| v == "short") =>
        {
            for e in &c.errors {
                eprintln!("{}", config::diag::short_of(e));
            }
            1
        }
        Err(e) => {
            let code = e.exit_code();
            eprintln!("{:?}", miette::Report::new(e));
            code
        }
    }
}

/// aisb's own exit codes (`run`, `up` and `exec` otherwise pass the command's through).
pub mod exit {
    /// The configuration has errors (`aisb check` found some; any verb that read it).
    pub const CONFIG: i32 = 1;
    /// The command line is wrong.
    pub const USAGE: i32 = 2;
    /// aisb could not do it: the sandbox could not start (nothing was run), or the verb
    /// failed for a reason outside the configuration. The same number as `docker run`'s.
    pub const COULD_NOT_START: i32 = 125;
}

impl Error {
    /// The exit code this error ends aisb with (see [`exit`]).
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_)
            | Error::NoConfig { .. }
            | Error::UnknownTask { .. }
            | Error::UnknownPreset { .. }
            | Error::Eval(eval::EvalError::Config(_))
            | Error::Eval(eval::EvalError::UnknownProfile { .. })
            // `aisb init --from-devcontainer`: the devcontainer.json is the configuration read.
            | Error::Devcontainer(_) => exit::CONFIG,
            Error::Usage(_) => exit::USAGE,
            _ => exit::COULD_NOT_START,
        }
    }
}

impl From<image::graph::BuildError> for Error {
    fn from(e: image::graph::BuildError) -> Error {
        Error::Build(Box::new(e))
    }
}

impl From<image::lock::LockError> for Error {
    fn from(e: image::lock::LockError) -> Error {
        Error::Lock(Box::new(e))
    }
}
