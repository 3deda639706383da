//! CI mode: what changes when `CI` is set (GitHub Actions, GitLab CI and most others set it),
//! and GitHub Actions' workflow commands (`::error file=…,line=…::message`).
//!
//! In CI nobody answers a prompt, so aisb never asks: a configuration that loosens the defaults
//! and is not trusted is refused with the list of what it loosens (unless `--trust`), images
//! must match sandbox.lock (`--locked`), and every run prints a JSON summary on stderr.

/// Whether this process runs in CI: `CI` set to anything but empty, `0` or `false`.
pub fn is_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| {
        let v = v.to_string_lossy().to_ascii_lowercase();
        !(v.is_empty() || v == "0" || v == "false")
    })
}

/// Whether GitHub Actions reads our stdout (it sets `GITHUB_ACTIONS=true`).
pub fn is_github_actions() -> bool {
    std::env::var_os("GITHUB_ACTIONS").is_some_and(|v| v == "true")
}

/// The message of a workflow command: `%`, CR and LF escaped, so a message can never end the
/// command early or start another one on a new line.
pub fn escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// A property value of a workflow command: also `:` and `,`, which end a property.
pub fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// Where a GitHub annotation points: a location in a file of the repository.
#[derive(Debug, Default)]
pub struct At<'a> {
    pub file: Option<&'a str>,
    pub line: Option<usize>,
    pub col: Option<usize>,
    pub end_line: Option<usize>,
    pub end_col: Option<usize>,
}

/// `::error file=F,line=L,col=C,endLine=…,endColumn=…,title=T::message`.
pub fn annotation(level: &str, at: &At, title: &str, message: &str) -> String {
    let mut props = Vec::new();
    if let Some(f) = at.file {
        props.push(format!("file={}", escape_property(f)));
    }
    for (k, v) in [
        ("line", at.line),
        ("col", at.col),
        ("endLine", at.end_line),
        ("endColumn", at.end_col),
    ] {
        if let Some(v) = v {
            props.push(format!("{k}={v}"));
        }
    }
    props.push(format!("title={}", escape_property(title)));
    format!("::{level} {}::{}", props.join(","), escape_data(message))
}

/// `path` as GitHub wants it in an annotation: relative to the workspace (`GITHUB_WORKSPACE`,
/// else the current directory) when it is inside it.
pub fn repo_relative(path: &str) -> String {
    let base = std::env::var_os("GITHUB_WORKSPACE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::current_dir().ok());
    match base {
        Some(b) => std::path::Path::new(path)
            .strip_prefix(&b)
            .map_or_else(|_| path.to_string(), |p| p.display().to_string()),
        None => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_cannot_inject_a_second_command() {
        let line = annotation(
            "error",
            &At {
                file: Some("a,b:c.kdl"),
                line: Some(3),
                col: Some(7),
                ..At::default()
            },
            "aisb",
            "bad\n::add-mask::x 100%",
        );
        assert_eq!(
            line,
            "::error file=a%2Cb%3Ac.kdl,line=3,col=7,title=aisb::bad%0A::add-mask::x 100%25"
        );
        assert_eq!(line.lines().count(), 1);
    }
}
