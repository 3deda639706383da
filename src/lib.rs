//! aisb: run AI coding agents and any command in a sandbox described by `sandbox.kdl`.
//!
//! Data flows one way: `config` (KDL -> spanned model) -> `eval` (imports, profiles, variables,
//! project scan -> [`eval::Plan`]) -> `spec` (Plan -> OCI runtime spec). Nothing after `eval`
//! sees KDL.

pub mod agents;
pub mod atomic;
pub mod audit;
pub mod beneath;
pub mod cli;
pub mod config;
pub mod eval;
pub mod git;
pub mod graph;
pub mod image;
pub mod init;
pub mod presets;
pub mod private;
pub mod proxy;
pub mod runtime;
pub mod session;
pub mod spec;
pub mod trust;
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
    #[error("{path}: {source}")]
    #[diagnostic(help("check that the path exists and is readable"))]
    Io {
        path: PathBuf,
        source: std::io::Error,
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
    #[diagnostic(help("see `aisb run --help`"))]
    Usage(String),
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
    let args: Vec<OsString> = args.into_iter().collect();
    // The sandbox's init: no clap, no config; the same entry point as the `aisb-init` binary.
    if args.get(1).is_some_and(|a| a == "__init") {
        return init::main_from_args(args.into_iter().skip(1));
    }
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{:?}", miette::Report::new(e));
            1
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
