//! `sandbox.kdl` -> the raw, spanned configuration model. See `sandbox.kdl.example` for the
//! language; `decode` has one function per node.

pub mod decode;
pub mod depth;
pub mod diag;
pub mod model;
pub mod schema;

pub use diag::{ConfigError, ConfigErrors, Errors, Loc, SourceFile, Spanned};
pub use model::ConfigFile;

/// [`parse`], through a cache of decoded files in `cache` (when given): the KDL parser takes
/// ~0.2 ms per kilobyte, on every command. An entry is named by the hash of the text and of
/// this binary's identity (a rebuilt aisb never reads an older one's entries) and is written
/// only for a file that decoded without errors, so every error is still reported from the
/// text itself.
pub fn parse_cached(
    sources: &[SourceFile],
    file: usize,
    errors: &mut Errors,
    cache: Option<&std::path::Path>,
) -> ConfigFile {
    let Some(dir) = cache else {
        return parse(sources, file, errors);
    };
    let path = dir.join(format!("{}.json", cache_key(&sources[file].text)));
    if let Ok(bytes) = std::fs::read(&path) {
        if let Ok(decoded) = diag::with_file(file, || serde_json::from_slice(&bytes)) {
            return decoded;
        }
    }
    let before = errors.list.len();
    let decoded = parse(sources, file, errors);
    if errors.list.len() == before {
        if let Ok(json) = serde_json::to_vec(&decoded) {
            let _ = crate::atomic::write_atomic(&path, &json);
        }
    }
    decoded
}

fn cache_key(text: &str) -> String {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::MetadataExt;
    static EXE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let exe = EXE.get_or_init(|| {
        std::env::current_exe()
            .and_then(std::fs::metadata)
            .map_or_else(
                |_| format!("unknown-{}", std::process::id()),
                |m| {
                    format!(
                        "{}:{}:{}:{}.{}",
                        m.dev(),
                        m.ino(),
                        m.size(),
                        m.mtime(),
                        m.mtime_nsec()
                    )
                },
            )
    });
    let mut h = Sha256::new();
    h.update(env!("CARGO_PKG_VERSION"));
    h.update([0]);
    h.update(exe);
    h.update([0]);
    h.update(text);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

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
