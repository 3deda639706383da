//! `sandbox.kdl` -> the raw, spanned configuration model. See `sandbox.kdl.example` for the
//! language; `decode` has one function per node.

pub mod credential;
pub mod decode;
pub mod depth;
pub mod diag;
pub mod domain;
pub mod instr;
pub mod model;
pub mod pattern;
pub mod schema;

/// The stack a thread that parses `sandbox.kdl` gets: that of a process's main thread (8 MiB),
/// where aisb's commands parse. The KDL parser recurses in its error recovery, and a checked-in
/// file is untrusted input.
pub const PARSE_STACK: usize = 8 << 20;

pub use diag::{ConfigError, ConfigErrors, Errors, Loc, SourceFile, Spanned};
pub use model::ConfigFile;

/// Parse and decode one loaded source. KDL syntax errors and decoding errors all land in
/// `errors`; the returned model holds whatever could be decoded.
pub fn parse(sources: &[SourceFile], file: usize, errors: &mut Errors) -> ConfigFile {
    let text = &sources[file].text;
    if let Some(at) = depth::too_deep(text) {
        errors.push(
            sources,
            Loc {
                file,
                span: (at, 1).into(),
            },
            format!("blocks nested deeper than {} levels", depth::MAX_DEPTH),
            "too deep",
            Some("sandbox.kdl nests three levels at most (`profile { network { … } }`)".into()),
        );
        return ConfigFile::default();
    }
    match kdl::KdlDocument::parse_v2(text) {
        Ok(doc) => decode::Decoder {
            sources,
            file,
            errors,
        }
        .file(&doc),
        Err(err) => {
            for d in err.diagnostics {
                let loc = Loc { file, span: d.span };
                let message = d.message.unwrap_or_else(|| "invalid KDL".into());
                let label = d.label.unwrap_or_else(|| "here".into());
                let help = d.help.or_else(|| {
                    Some(
                        "sandbox.kdl is KDL v2: strings are quoted, booleans are #true/#false"
                            .into(),
                    )
                });
                errors.push(sources, loc, message, label, help);
            }
            ConfigFile::default()
        }
    }
}
