//! The Dockerfile subset aisb builds: `FROM`, `RUN`, `COPY`, `ADD` (local files), `ENV`, `ARG`,
//! `WORKDIR`, `USER`, `SHELL`. Anything else is an error at its line, so an image is never
//! built differently from what its file says.
//!
//! Line continuations (`\` at the end of a line), comments, the shell and JSON (exec) forms,
//! `--chown`/`--chmod` on COPY/ADD and the `escape` parser directive (backslash only) are
//! understood. Variables are left as written here; the build expands them (see
//! [`super::expand`]) where Docker does.

use miette::{NamedSource, SourceSpan};

use super::{Cmd, Instr, Step};

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{file}:{line}: {message}")]
pub struct DockerfileError {
    pub file: String,
    pub line: usize,
    pub message: String,
    #[source_code]
    pub src: NamedSource<String>,
    #[label("here")]
    pub span: SourceSpan,
    #[help]
    pub help: Option<String>,
}

/// The instructions aisb builds, for messages.
pub const SUPPORTED: &str = "FROM, RUN, COPY, ADD (local files), ENV, ARG, WORKDIR, USER, SHELL";

/// Parse a Dockerfile's text; `file` names it in messages.
pub fn parse(file: &str, text: &str) -> Result<Vec<Step>, Box<DockerfileError>> {
    let err = |line: usize, start: usize, len: usize, message: String, help: Option<String>| {
        Box::new(DockerfileError {
            file: file.to_string(),
            line,
            message,
            src: NamedSource::new(file, text.to_string()),
            span: (start, len.max(1)).into(),
            help,
        })
    };
    let mut steps = Vec::new();
    let mut froms = 0;
    // Logical lines: (first line number, byte offset of its start, joined text).
    let mut offset = 0;
    let mut pending: Option<(usize, usize, String)> = None;
    let mut directives = true;
    for (i, raw) in text.split_inclusive('\n').enumerate() {
        let start = offset;
        offset += raw.len();
        let line = raw.trim_end_matches(['\n', '\r']);
        let trimmed = line.trim_start();
        if trimmed.starts_with('#') {
            if directives && pending.is_none() {
                if let Some((k, v)) = trimmed.trim_start_matches('#').split_once('=') {
                    let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                    if k == "escape" && v != "\\" {
                        return Err(err(
                            i + 1,
                            start,
                            line.len(),
                            format!("escape={v} is not supported"),
                            Some(
                                "aisb reads Dockerfiles with the default escape character `\\`"
                                    .into(),
                            ),
                        ));
                    }
                    continue;
                }
            }
            // A comment, also inside a continued instruction (Docker drops those lines).
            continue;
        }
        if trimmed.is_empty() && pending.is_none() {
            continue;
        }
        directives = false;
        let (cont, body) = match line.strip_suffix('\\') {
            Some(b) => (true, b),
            None => (false, line),
        };
        let entry = pending.get_or_insert_with(|| (i + 1, start, String::new()));
        if !entry.2.is_empty() {
            entry.2.push(' ');
        }
        entry.2.push_str(body.trim());
        if cont {
            continue;
        }
        let (line_no, at, logical) = pending.take().unwrap_or_default();
        let span_len = offset - at;
        let (word, rest) = logical
            .split_once(char::is_whitespace)
            .map_or((logical.as_str(), ""), |(w, r)| (w, r.trim()));
        let upper = word.to_ascii_uppercase();
        let fail =
            |message: String, help: Option<String>| err(line_no, at, span_len, message, help);
        if rest.is_empty() && upper != "RUN" {
            return Err(fail(format!("{upper} needs arguments"), None));
        }
        if rest.starts_with("<<") {
            return Err(fail(
                format!("{upper} with a here-document is not supported"),
                Some(
                    "write the commands on one line (joined with `&&`, continued with `\\`)".into(),
                ),
            ));
        }
        let instr = match upper.as_str() {
            "FROM" => {
                froms += 1;
                if froms > 1 {
                    return Err(fail(
                        "multi-stage builds (a second FROM) are not supported".into(),
                        Some("one FROM per Dockerfile; copy artefacts in with COPY instead".into()),
                    ));
                }
                let mut words = rest.split_whitespace();
                let image = words.next().unwrap_or_default().to_string();
                if image.starts_with("--") {
                    return Err(fail(format!("FROM {image} is not supported"), None));
                }
                if words.next().is_some() {
                    return Err(fail(
                        "FROM … AS NAME (build stages) is not supported".into(),
                        Some("drop `AS NAME`: aisb builds one stage".into()),
                    ));
                }
                Instr::From(image)
            }
            "RUN" => {
                if rest.starts_with("--") {
                    return Err(fail(
                        format!("RUN flags (`{}`) are not supported", rest.split_whitespace().next().unwrap_or_default()),
                        Some("steps run in aisb's sandbox; what they reach is set by `rootfs … { network … }` in sandbox.kdl".into()),
                    ));
                }
                if rest.is_empty() {
                    return Err(fail("RUN needs a command".into(), None));
                }
                match json_array(rest) {
                    Some(argv) if !argv.is_empty() => Instr::Run(Cmd::Exec(argv)),
                    Some(_) => return Err(fail("RUN [] has no command".into(), None)),
                    None => Instr::Run(Cmd::Shell(rest.to_string())),
                }
            }
            "COPY" | "ADD" => {
                let add = upper == "ADD";
                let mut chown = None;
                let mut chmod = None;
                let mut words = rest;
                while let Some(flag) = words.strip_prefix("--") {
                    let (f, r) = flag.split_once(char::is_whitespace).unwrap_or((flag, ""));
                    words = r.trim_start();
                    if let Some(v) = f.strip_prefix("chown=") {
                        chown = Some(v.to_string());
                    } else if let Some(v) = f.strip_prefix("chmod=") {
                        match u32::from_str_radix(v, 8) {
                            Ok(m) if m <= 0o7777 => chmod = Some(m),
                            _ => return Err(fail(format!("--chmod={v} is not an octal mode"), Some("e.g. --chmod=0755".into()))),
                        }
                    } else {
                        return Err(fail(
                            format!("{upper} --{f} is not supported"),
                            Some(format!("{upper} takes --chown=USER[:GROUP] and --chmod=MODE here; `--from` needs build stages")),
                        ));
                    }
                }
                let mut parts = match json_array(words) {
                    Some(p) => p,
                    None => words.split_whitespace().map(str::to_string).collect(),
                };
                if parts.len() < 2 {
                    return Err(fail(format!("{upper} needs a source and a destination"), Some(format!("{upper} SRC... DEST"))));
                }
                let dest = parts.pop().unwrap_or_default();
                if add {
                    if let Some(url) = parts.iter().find(|p| p.contains("://") || p.starts_with("git@")) {
                        return Err(fail(
                            format!("ADD of a URL ({url}) is not supported"),
                            Some("download it in a RUN step (its network policy applies), or COPY a local file".into()),
                        ));
                    }
                }
                Instr::Copy { srcs: parts, dest, chown, chmod, add }
            }
            "ENV" => Instr::Env(key_values(rest).ok_or_else(|| {
                fail("ENV needs KEY=VALUE pairs (or `ENV KEY VALUE`)".into(), None)
            })?),
            "ARG" => {
                let (k, v) = match rest.split_once('=') {
                    Some((k, v)) => (k.trim(), Some(unquote(v.trim()))),
                    None => (rest, None),
                };
                if !crate::config::decode::is_env_name(k) {
                    return Err(fail(format!("ARG `{k}` is not a valid name"), Some("one ARG NAME[=DEFAULT] per line".into())));
                }
                Instr::Arg(k.to_string(), v)
            }
            "WORKDIR" => Instr::Workdir(unquote(rest)),
            "USER" => Instr::User(rest.to_string()),
            "SHELL" => match json_array(rest) {
                Some(argv) if !argv.is_empty() => Instr::Shell(argv),
                _ => return Err(fail("SHELL takes a JSON array".into(), Some(r#"SHELL ["/bin/bash", "-c"]"#.into()))),
            },
            other => {
                return Err(fail(
                    format!("{other} is not in the subset aisb builds"),
                    Some(format!("aisb builds {SUPPORTED}; remove the line (a sandbox image needs no CMD, EXPOSE or LABEL)")),
                ))
            }
        };
        if froms == 0 && !matches!(instr, Instr::From(_) | Instr::Arg(..)) {
            return Err(fail(
                format!("{upper} before FROM"),
                Some("only ARG may come before FROM".into()),
            ));
        }
        steps.push(Step {
            instr,
            at: format!("{file}:{line_no}"),
        });
    }
    if let Some((line_no, at, _)) = pending {
        return Err(err(
            line_no,
            at,
            text.len() - at,
            "the file ends inside a continued line".into(),
            Some("remove the trailing `\\`".into()),
        ));
    }
    if froms == 0 {
        return Err(err(
            1,
            0,
            0,
            "no FROM line".into(),
            Some("start with `FROM IMAGE` (`FROM scratch` for an empty base)".into()),
        ));
    }
    Ok(steps)
}

/// `["a", "b"]` as a list of strings; None when the text is not a JSON array of strings.
fn json_array(s: &str) -> Option<Vec<String>> {
    if !s.starts_with('[') {
        return None;
    }
    serde_json::from_str(s).ok()
}

/// Strip one level of matching quotes.
fn unquote(s: &str) -> String {
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner.to_string();
        }
    }
    s.to_string()
}

/// `ENV K=V K2="v 2"` or the legacy `ENV K some value`.
fn key_values(s: &str) -> Option<Vec<(String, String)>> {
    let first = s.split_whitespace().next()?;
    if !first.contains('=') {
        let (k, v) = s.split_once(char::is_whitespace)?;
        return Some(vec![(k.to_string(), v.trim().to_string())]);
    }
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if !crate::config::decode::is_env_name(&key) {
            return None;
        }
        let mut val = String::new();
        let mut quote = None;
        while let Some(&c) = chars.peek() {
            match (quote, c) {
                (None, c) if c.is_whitespace() => break,
                (None, '"' | '\'') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (_, '\\') => {
                    chars.next();
                    if let Some(n) = chars.next() {
                        val.push(n);
                    }
                    continue;
                }
                _ => val.push(c),
            }
            chars.next();
        }
        if quote.is_some() {
            return None;
        }
        out.push((key, val));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Vec<Instr> {
        parse("Dockerfile", text)
            .unwrap()
            .into_iter()
            .map(|s| s.instr)
            .collect()
    }

    fn bad(text: &str) -> Box<DockerfileError> {
        parse("Dockerfile", text).unwrap_err()
    }

    #[test]
    fn the_subset_parses() {
        let steps = ok("# syntax=docker/dockerfile:1\nARG BASE=scratch\nFROM $BASE\nARG USER_NAME\nENV A=1 B=\"two words\"\nENV LEGACY some value\nRUN apt-get update && \\\n    # a comment inside\n    apt-get install -y fish\nRUN [\"/bin/echo\", \"hi\"]\nCOPY --chown=1000:1000 --chmod=0644 a b /dst/\nADD x.tar /opt/\nWORKDIR /work\nUSER ${USER_NAME}\nSHELL [\"/bin/bash\", \"-c\"]\n");
        assert_eq!(steps.len(), 12);
        assert_eq!(steps[1], Instr::From("$BASE".into()));
        assert_eq!(
            steps[3],
            Instr::Env(vec![
                ("A".into(), "1".into()),
                ("B".into(), "two words".into())
            ])
        );
        assert_eq!(
            steps[4],
            Instr::Env(vec![("LEGACY".into(), "some value".into())])
        );
        assert_eq!(
            steps[5],
            Instr::Run(Cmd::Shell(
                "apt-get update && apt-get install -y fish".into()
            ))
        );
        assert_eq!(
            steps[6],
            Instr::Run(Cmd::Exec(vec!["/bin/echo".into(), "hi".into()]))
        );
        assert_eq!(
            steps[7],
            Instr::Copy {
                srcs: vec!["a".into(), "b".into()],
                dest: "/dst/".into(),
                chown: Some("1000:1000".into()),
                chmod: Some(0o644),
                add: false
            }
        );
        assert_eq!(steps[10], Instr::User("${USER_NAME}".into()));
    }

    #[test]
    fn lines_are_numbered_from_the_instructions_first_line() {
        let steps = parse("Dockerfile", "FROM scratch\n\nRUN a \\\n  b\nRUN c\n").unwrap();
        assert_eq!(steps[1].at, "Dockerfile:3");
        assert_eq!(steps[2].at, "Dockerfile:5");
    }

    #[test]
    fn everything_else_is_an_error_naming_its_line() {
        for (text, line, what) in [
            (
                "FROM scratch\nCMD [\"sh\"]\n",
                2,
                "CMD is not in the subset",
            ),
            ("FROM scratch\nEXPOSE 80\n", 2, "EXPOSE"),
            ("FROM a\nFROM b\n", 2, "multi-stage"),
            ("FROM a AS build\n", 1, "build stages"),
            ("FROM a\nCOPY --from=x a b\n", 2, "--from"),
            ("FROM a\nADD https://x.test/f /f\n", 2, "URL"),
            ("FROM a\nRUN --mount=type=cache x\n", 2, "RUN flags"),
            ("FROM a\nRUN <<EOF\nx\nEOF\n", 2, "here-document"),
            ("RUN x\n", 1, "before FROM"),
            ("ARG A\n", 1, "no FROM"),
            ("FROM a\nRUN x \\\n", 2, "ends inside"),
            ("FROM a\nCOPY onlyone\n", 2, "source and a destination"),
            ("FROM a\nSHELL /bin/bash -c\n", 2, "JSON array"),
            ("# escape=`\nFROM a\n", 1, "escape"),
        ] {
            let e = bad(text);
            assert_eq!(e.line, line, "{text}");
            assert!(e.to_string().contains(what), "{text}: {e}");
            assert!(
                e.to_string().starts_with(&format!("Dockerfile:{line}:")),
                "{e}"
            );
        }
    }
}
