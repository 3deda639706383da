//! Diagnostics for configuration errors: every error carries the file it came from and a span, so
//! it can be rendered by miette (terminal), as `file:line:col: error: …` (editors) or as JSON.

use std::path::PathBuf;
use std::sync::Arc;

use miette::{Diagnostic, NamedSource, SourceSpan};
use serde::Serialize;
use thiserror::Error;

/// One loaded configuration text: a file on disk, an embedded preset or the embedded default.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Name shown in diagnostics (a path relative to the cwd, or `preset:claude`).
    pub name: String,
    /// Absolute path on disk, `None` for embedded texts.
    pub path: Option<PathBuf>,
    pub text: Arc<String>,
}

impl SourceFile {
    pub fn named_source(&self) -> NamedSource<Arc<String>> {
        NamedSource::new(&self.name, Arc::clone(&self.text))
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let before = self.text.get(..offset).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[line_start..].chars().count() + 1;
        (line, col)
    }
}

/// A location in one of the loaded sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc {
    pub file: usize,
    pub span: SourceSpan,
}

thread_local! {
    /// The source index given to every [`Loc`] deserialized on this thread (see
    /// [`with_file`]): a cached decoded file is stored without it, as its index differs
    /// from one load to the next.
    static DESERIALIZING_FILE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Run `f` (a deserialization) with every [`Loc`] it reads pointing into source `file`.
pub fn with_file<R>(file: usize, f: impl FnOnce() -> R) -> R {
    let before = DESERIALIZING_FILE.with(|c| c.replace(file));
    let r = f();
    DESERIALIZING_FILE.with(|c| c.set(before));
    r
}

/// Serialized as `[offset, length]`: the span only.
impl Serialize for Loc {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.span.offset(), self.span.len()).serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Loc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (offset, len) = <(usize, usize)>::deserialize(d)?;
        Ok(Loc {
            file: DESERIALIZING_FILE.with(|c| c.get()),
            span: SourceSpan::new(offset.into(), len),
        })
    }
}

/// A value read from the configuration, with where it was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Spanned<T> {
    pub value: T,
    pub loc: Loc,
}

impl<T> Spanned<T> {
    pub fn new(value: T, loc: Loc) -> Self {
        Spanned { value, loc }
    }
}

impl<T> std::ops::Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// A problem found in the configuration, located in its source.
#[derive(Debug, Clone, Error, Diagnostic)]
#[error("{message}")]
pub struct ConfigError {
    pub message: String,
    #[source_code]
    pub src: NamedSource<Arc<String>>,
    #[label("{label}")]
    pub span: SourceSpan,
    pub label: String,
    #[help]
    pub help: Option<String>,
    /// Index into the source list, for `file:line:col` rendering.
    pub file: usize,
}

/// Every error found in one pass, shown together.
#[derive(Debug, Error, Diagnostic)]
#[error("{}", summary(.errors))]
#[diagnostic(help("fix the errors above, then run `aisb check` again"))]
pub struct ConfigErrors {
    #[related]
    pub errors: Vec<ConfigError>,
}

fn summary(errors: &[ConfigError]) -> String {
    match errors.len() {
        1 => "1 error in the sandbox configuration".to_string(),
        n => format!("{n} errors in the sandbox configuration"),
    }
}

impl ConfigErrors {
    pub fn new(errors: Vec<ConfigError>) -> Self {
        ConfigErrors { errors }
    }
}

/// Collects errors while decoding or evaluating; never stops at the first one.
#[derive(Debug, Default)]
pub struct Errors {
    pub list: Vec<ConfigError>,
}

impl Errors {
    pub fn push(
        &mut self,
        sources: &[SourceFile],
        loc: Loc,
        message: impl Into<String>,
        label: impl Into<String>,
        help: Option<String>,
    ) {
        let Some(file) = sources.get(loc.file) else {
            return;
        };
        self.list.push(ConfigError {
            message: message.into(),
            src: file.named_source(),
            span: loc.span,
            label: label.into(),
            help,
            file: loc.file,
        });
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn into_result(self) -> Result<(), ConfigErrors> {
        if self.list.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors::new(self.list))
        }
    }
}

/// Machine-readable form of one diagnostic (`aisb check --format json`).
#[derive(Debug, Serialize)]
pub struct JsonDiagnostic {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub end_line: usize,
    pub end_column: usize,
    pub severity: &'static str,
    pub message: String,
    pub label: String,
    pub help: Option<String>,
}

impl ConfigError {
    pub fn to_json(&self, sources: &[SourceFile]) -> JsonDiagnostic {
        let (file, (line, column), (end_line, end_column)) = match sources.get(self.file) {
            Some(f) => (
                f.path
                    .as_ref()
                    .map_or_else(|| f.name.clone(), |p| p.display().to_string()),
                f.line_col(self.span.offset()),
                f.line_col(self.span.offset() + self.span.len()),
            ),
            None => (String::new(), (0, 0), (0, 0)),
        };
        JsonDiagnostic {
            file,
            line,
            column,
            end_line,
            end_column,
            severity: "error",
            message: self.message.clone(),
            label: self.label.clone(),
            help: self.help.clone(),
        }
    }

    /// `file:line:col: error: message (help)` — the format editors' problem matchers expect.
    pub fn to_short(&self, sources: &[SourceFile]) -> String {
        let (file, (line, col)) = match sources.get(self.file) {
            Some(f) => (f.name.clone(), f.line_col(self.span.offset())),
            None => (String::from("<unknown>"), (0, 0)),
        };
        let mut out = format!("{file}:{line}:{col}: error: {}", self.message);
        if let Some(help) = &self.help {
            out.push_str(" (help: ");
            out.push_str(help);
            out.push(')');
        }
        out
    }
}

/// [`ConfigError::to_short`] from the error alone (its own source): for callers that no longer
/// hold the source list.
pub fn short_of(e: &ConfigError) -> String {
    use miette::SourceCode;
    let (line, col) = e
        .src
        .read_span(&e.span, 0, 0)
        .map_or((0, 0), |c| (c.line() + 1, c.column() + 1));
    let mut out = format!("{}:{line}:{col}: error: {}", e.src.name(), e.message);
    if let Some(help) = &e.help {
        out.push_str(" (help: ");
        out.push_str(help);
        out.push(')');
    }
    out
}

/// "did you mean" for a misspelt name among the known ones.
pub fn suggest<'a>(word: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .map(|k| (strsim::damerau_levenshtein(word, k), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4) && *d < k.len().max(word.len()))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}
