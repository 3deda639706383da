//! `sandbox.lock`, checked in beside `sandbox.kdl`: for each image, the digest every base
//! source resolved to and the image's graph hash. Builds use the pinned digests (a moved tag
//! does not change what is built); `aisb build --locked` fails when anything would differ.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::borrow::Cow;

use miette::{NamedSource, SourceSpan};
use serde::{Deserialize, Serialize};

use super::oci::reference::is_digest;

pub const FILE: &str = "sandbox.lock";

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Lock {
    pub version: u32,
    pub images: BTreeMap<String, Locked>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Locked {
    /// The image's hash (see `image::graph`).
    pub graph: String,
    /// Base source as written after FROM (variables expanded) -> manifest digest.
    pub bases: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum LockError {
    #[error("{}: {message}", path.display())]
    #[diagnostic(help("it is written by `aisb build`; delete it to start over"))]
    Bad { path: PathBuf, message: String },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Invalid(Box<InvalidLock>),
    #[error("--locked: {} has no entry for image `{image}`", path.display())]
    #[diagnostic(help("run `aisb build` without --locked and commit {}", path.display()))]
    Missing { path: PathBuf, image: String },
    #[error("--locked: `{source_ref}` now points at {now}, {} pins {pinned}", path.display())]
    #[diagnostic(help("the tag moved. To take the new image: `aisb build --pull` and commit {}; to keep the old one, pin it by digest in FROM", path.display()))]
    Moved {
        path: PathBuf,
        source_ref: String,
        pinned: String,
        now: String,
    },
    #[error("--locked: image `{image}` would build as {now}, {} pins {pinned}", path.display())]
    #[diagnostic(help("its steps, build args or copied files changed since the lock was written; run `aisb build` and commit {}", path.display()))]
    Graph {
        path: PathBuf,
        image: String,
        pinned: String,
        now: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    #[diagnostic(help("is the project writable?"))]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The file as written, values borrowed from its text where they need no unescaping, so that
/// a bad one is reported at its place.
#[derive(Deserialize)]
struct RawLock<'a> {
    version: u32,
    #[serde(borrow)]
    images: BTreeMap<String, RawLocked<'a>>,
}

#[derive(Deserialize)]
struct RawLocked<'a> {
    #[serde(borrow)]
    graph: Cow<'a, str>,
    /// Borrowed (serde lends a `Cow` only as a field's own type): a pin with an escape in it
    /// is no digest anyway, and serde's error names its line.
    #[serde(borrow)]
    bases: BTreeMap<String, &'a str>,
}

/// A value (or the JSON itself) that is not what `aisb build` writes, at its place.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{}:{line}: {message}", path.display())]
#[diagnostic(help("{help}"))]
pub struct InvalidLock {
    pub path: PathBuf,
    pub line: usize,
    pub message: String,
    pub help: String,
    #[source_code]
    pub src: NamedSource<String>,
    #[label("{label}")]
    pub span: SourceSpan,
    pub label: String,
}

impl Lock {
    /// Parse the text of the lock file at `path`. Every value that names something (the
    /// image's hash: a store entry; a pin: a registry URL and the digest a manifest is checked
    /// against) is checked here, and a bad one is an error at its line.
    pub fn parse(text: &str, path: &Path) -> Result<Lock, LockError> {
        let invalid = |span: SourceSpan, message: String, label: &str, help: &str| {
            let line = text
                .get(..span.offset())
                .unwrap_or(text)
                .matches('\n')
                .count()
                + 1;
            LockError::Invalid(Box::new(InvalidLock {
                path: path.to_path_buf(),
                line,
                message,
                help: help.to_string(),
                src: NamedSource::new(path.display().to_string(), text.to_string()),
                span,
                label: label.to_string(),
            }))
        };
        let raw: RawLock = serde_json::from_str(text).map_err(|e| {
            let offset = offset_of_line_col(text, e.line(), e.column());
            invalid(
                SourceSpan::new(offset.into(), 0),
                e.to_string(),
                "here",
                "it is written by `aisb build`; delete it to start over",
            )
        })?;
        let mut images = BTreeMap::new();
        for (name, l) in raw.images {
            if !is_hash(&l.graph) {
                return Err(invalid(
                    span_of(text, &l.graph, &name),
                    format!("image `{name}`: `{}` is not an image hash", l.graph),
                    "not 64 lowercase hex digits",
                    "it is written by `aisb build`; run it again (or delete the file) to start over",
                ));
            }
            let mut bases = BTreeMap::new();
            for (source, pin) in l.bases {
                if !is_digest(pin) {
                    return Err(invalid(
                        span_of(text, pin, &source),
                        format!("`{source}` is pinned to `{pin}`, which is not a sha256 digest"),
                        "not sha256:<64 lowercase hex digits>",
                        "a pin is the digest `aisb build` resolved; delete the entry (or the file) and run `aisb build` to pin again",
                    ));
                }
                bases.insert(source, pin.to_string());
            }
            images.insert(
                name,
                Locked {
                    graph: l.graph.into_owned(),
                    bases,
                },
            );
        }
        Ok(Lock {
            version: raw.version,
            images,
        })
    }

    /// The lock file in `dir`, or an empty one when there is none.
    pub fn read(dir: &Path) -> Result<Lock, LockError> {
        let path = dir.join(FILE);
        match std::fs::read(&path) {
            Ok(b) => match String::from_utf8(b) {
                Ok(text) => Lock::parse(&text, &path),
                Err(e) => Err(LockError::Bad {
                    path,
                    message: format!("not UTF-8: {e}"),
                }),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Lock {
                version: 1,
                images: BTreeMap::new(),
            }),
            Err(e) => Err(LockError::Bad {
                path,
                message: e.to_string(),
            }),
        }
    }

    /// Write it when it changed (atomically).
    pub fn write(&self, dir: &Path) -> Result<bool, LockError> {
        let path = dir.join(FILE);
        if Lock::read(dir).ok().as_ref() == Some(self) && path.exists() {
            return Ok(false);
        }
        let mut text = serde_json::to_string_pretty(self).map_err(|e| LockError::Write {
            path: path.clone(),
            source: e.into(),
        })?;
        text.push('\n');
        crate::atomic::write_atomic(&path, text.as_bytes())
            .map_err(|source| LockError::Write { path, source })?;
        Ok(true)
    }
}

fn is_hash(h: &str) -> bool {
    h.len() == 64
        && h.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The byte offset of serde_json's 1-based line and column (a column counts bytes).
fn offset_of_line_col(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    let mut at = (start + column.saturating_sub(1)).min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// Where `value` is in `text`: exact when it was borrowed from it (no escapes); otherwise at
/// its key, the first place that names it.
fn span_of(text: &str, value: &str, key: &str) -> SourceSpan {
    // An owned (unescaped) value lives in another allocation: outside `text`.
    let start = (value.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
    if start <= text.len() && start + value.len() <= text.len() {
        return SourceSpan::new(start.into(), value.len());
    }
    let quoted = serde_json::to_string(key).unwrap_or_default();
    let at = text.find(&quoted).unwrap_or(0);
    SourceSpan::new(at.into(), if at == 0 { 0 } else { quoted.len() })
}

/// The store entries the lock file at `path` pins: each image's entry and its layers (for
/// `aisb store gc`, which keeps them).
pub fn pinned_entries(path: &Path, store: &Path) -> Vec<PathBuf> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let Ok(lock) = Lock::read(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for l in lock.images.values() {
        // Checked to be 64 hex digits when read.
        let image = store.join(format!("{}-image", l.graph.get(..32).unwrap_or(&l.graph)));
        if let Ok(b) = std::fs::read(image.join("image.json")) {
            if let Ok(c) = serde_json::from_slice::<super::graph::ImageConfig>(&b) {
                out.extend(c.layers);
            }
        }
        out.push(image);
        out.extend(
            l.bases
                .values()
                .filter_map(|d| super::graph::base_entry(store, d)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRAPH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn lock_with(dir: &Path, graph: &str, pin: &str) -> String {
        let text = format!(
            "{{\n  \"version\": 1,\n  \"images\": {{\n    \"Dockerfile\": {{\n      \"graph\": \"{graph}\",\n      \"bases\": {{\n        \"debian:12\": \"{pin}\"\n      }}\n    }}\n  }}\n}}\n"
        );
        std::fs::write(dir.join(FILE), &text).unwrap();
        text
    }

    /// The line (1-based) of the diagnostic's first label, and the text it covers.
    fn labelled(e: &LockError, text: &str) -> Option<(usize, String)> {
        let span = miette::Diagnostic::labels(e)?.next()?;
        let line = text[..span.offset()].matches('\n').count() + 1;
        Some((
            line,
            text[span.offset()..span.offset() + span.len()].to_string(),
        ))
    }

    /// A pin goes into a registry URL and stands for the digest the manifest is checked
    /// against: anything but a sha256 digest is refused when the file is read, at its line.
    #[test]
    fn a_pin_that_is_not_a_digest_is_an_error_at_its_line() {
        let t = tempfile::tempdir().unwrap();
        let digest = format!("sha256:{GRAPH}");
        lock_with(t.path(), GRAPH, &digest);
        let lock = Lock::read(t.path()).unwrap();
        assert_eq!(lock.images["Dockerfile"].bases["debian:12"], digest);
        for pin in [
            "latest",
            "../../../v2/other/manifests/x",
            "sha256:abc",
            "sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
            "sha512:0123456789abcdef",
            "é",
        ] {
            let text = lock_with(t.path(), GRAPH, pin);
            let e = Lock::read(t.path()).expect_err(pin);
            assert_eq!(
                labelled(&e, &text),
                Some((7, pin.to_string())),
                "{pin}: {e}"
            );
            assert!(e.to_string().contains("digest"), "{pin}: {e}");
        }
        // Escaped, a pin cannot be pointed at exactly; its line still is.
        let text = lock_with(t.path(), GRAPH, "lat\\u0065st");
        let e = Lock::read(t.path()).unwrap_err();
        assert_eq!(labelled(&e, &text).map(|l| l.0), Some(7), "{e}");
    }

    /// The image hash names a store entry by its first 32 characters: a short or non-ASCII
    /// one is an error at its line, never a panic.
    #[test]
    fn a_graph_hash_that_is_not_one_is_an_error_never_a_panic() {
        let t = tempfile::tempdir().unwrap();
        let digest = format!("sha256:{GRAPH}");
        for graph in [
            "",
            "abc",
            &format!("a{}", "é".repeat(20)),
            &GRAPH.to_uppercase(),
        ] {
            let text = lock_with(t.path(), graph, &digest);
            let e = Lock::read(t.path()).expect_err(graph);
            assert_eq!(
                labelled(&e, &text),
                Some((5, graph.to_string())),
                "{graph}: {e}"
            );
            assert_eq!(
                pinned_entries(&t.path().join(FILE), t.path()),
                Vec::<PathBuf>::new()
            );
        }
    }
}
