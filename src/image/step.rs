//! One `RUN` step as the image build sees it: what to run, on which layers, into which new
//! layer. Running it is the runtime's business: the build is handed a [`StepRunner`] (the
//! command line joins the two), so `image` never imports the runtime, the spec or the init.

use std::path::{Path, PathBuf};

pub struct StepRun<'a> {
    /// The layers below, top first (at least one: an empty directory for `FROM scratch`).
    pub layers: &'a [PathBuf],
    /// The new layer (the overlay's upper directory).
    pub upper: &'a Path,
    /// A scratch directory on the store's filesystem (overlay work dir, bundle).
    pub scratch: &'a Path,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub user: (u32, u32),
    /// Domain rules the step may reach through the proxy; empty: no network at all.
    pub allow: Vec<String>,
    /// Where the proxy's decisions are logged.
    pub audit: PathBuf,
}

/// How RUN steps run: root's (libcontainer, 65,536 ids of its own) or an ordinary user's (a
/// user namespace over their subordinate ids). Implemented by the runtime.
pub trait StepRunner {
    /// Run the step; every line it prints goes to `on_line`. Returns its exit code. Leaves
    /// nothing of the runtime's own (mount points) in the new layer.
    fn run(&self, step: &StepRun, on_line: &mut dyn FnMut(&str)) -> Result<i32, StepError>;
    /// Remove a tree a step wrote (a failed layer, a scratch directory). A step's files may
    /// belong to ids the caller cannot unlink as itself (an ordinary user's subordinate ids).
    fn remove(&self, path: &Path) -> std::io::Result<()>;
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StepError {
    #[error("{what}: {source}")]
    #[diagnostic(help("`aisb doctor` checks the host"))]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// What the runtime said, with its advice.
    #[error("{message}")]
    #[diagnostic(help("{help}"))]
    Runner { message: String, help: String },
}
