//! KDL -> raw model. One small function per node; every unknown node, property or value is an
//! error at its own span, and decoding goes on so that all errors are reported at once.
//! `nodes` has the functions for the configuration's nodes, `image` those of an `image` block,
//! `values` the typed readers of arguments and properties they share.

mod image;
mod nodes;
mod values;

use miette::SourceSpan;

use super::diag::{Errors, Loc, SourceFile};

/// Decoding state for one file: where we are and what went wrong so far.
pub struct Decoder<'a> {
    pub sources: &'a [SourceFile],
    pub file: usize,
    pub errors: &'a mut Errors,
}

/// Runtime backends `backend` accepts (the runtimes themselves live outside the config).
pub const BACKENDS: [&str; 2] = ["libcontainer", "bwrap"];

pub use values::{is_env_name, parse_size};

impl Decoder<'_> {
    pub(super) fn loc(&self, span: SourceSpan) -> Loc {
        Loc {
            file: self.file,
            span,
        }
    }

    pub(super) fn err(
        &mut self,
        span: SourceSpan,
        message: impl Into<String>,
        label: &str,
        help: Option<String>,
    ) {
        let loc = self.loc(span);
        self.errors.push(self.sources, loc, message, label, help);
    }
}
