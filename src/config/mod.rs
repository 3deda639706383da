//! `sandbox.kdl` -> the raw, spanned configuration model. See `sandbox.kdl.example` for the
//! language; `decode` has one function per node.

pub mod decode;
pub mod diag;
pub mod model;

pub use diag::{ConfigError, ConfigErrors, Errors, Loc, SourceFile, Spanned};
pub use model::ConfigFile;

/// Parse and decode one loaded source. KDL syntax errors and decoding errors all land in
/// `errors`; the returned model holds whatever could be decoded.
pub fn parse(sources: &[SourceFile], file: usize, errors: &mut Errors) -> ConfigFile {
    let text = &sources[file].text;
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
