use crate::Error;

/// The language server for sandbox.kdl, over stdio (for editors; see the README's "Editors")
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Diagnostics as you type (the same checks as `aisb check`, every profile evaluated),
completion of nodes, properties and values, hover documentation, go to definition
(import, extends=, group, profiles, images, tasks) and formatting.

Examples:
  aisb lsp                     started by the editor, which talks to it on stdin/stdout
  nvim: vim.lsp.start({ name = 'aisb', cmd = { 'aisb', 'lsp' }, root_dir = vim.fn.getcwd() })")]
pub struct Args {
    /// Accepted for clients that pass it (stdio is the only transport)
    #[arg(long)]
    pub stdio: bool,
}

pub fn run(_a: Args) -> Result<i32, Error> {
    crate::lsp::serve().map_err(|e| Error::Usage(format!("aisb lsp: {e}")))?;
    Ok(0)
}
