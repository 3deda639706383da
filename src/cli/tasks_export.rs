//! `aisb tasks export vscode|zed|jetbrains`: each `task` of sandbox.kdl as an editor task that
//! runs `aisb run TASK`, plus one for `aisb check` whose problem matcher turns its
//! `file:line:col: error: message` lines into editor problems.
//!
//! An existing file is edited, not rewritten: its other entries, comments and formatting stay
//! as they were (VS Code's and Zed's files are JSONC; the concrete syntax tree of
//! `jsonc-parser` keeps them). aisb's entries are the ones labelled `aisb: …`; they are
//! replaced in place, new ones appended, and those of tasks no longer in sandbox.kdl removed,
//! so exporting twice changes nothing. JetBrains keeps one file per run configuration in
//! `.run/`: aisb's are `aisb_*.run.xml` with a marker comment.
//!
//! Task names come from a checked-in file; a name that could mean something to a shell is not
//! exported. Files are written below the project without following a symbolic link (a
//! checked-in `.vscode` link cannot redirect the write).

use std::path::{Path, PathBuf};

use jsonc_parser::cst::{CstInputValue, CstRootNode};
use jsonc_parser::ParseOptions;

use crate::eval::plan::Task;
use crate::Error;

/// The label prefix that marks an entry as aisb's.
pub const PREFIX: &str = "aisb: ";
/// The marker in JetBrains run configurations aisb writes.
const XML_MARKER: &str = "<!-- written by `aisb tasks export jetbrains`; re-export to update -->";
/// The regular expression of `aisb check --format short` (and of `AISB_DIAGNOSTICS=short`).
pub const SHORT_REGEXP: &str = r"^(.+?):(\d+):(\d+): (error|warning): (.*)$";
/// Existing files larger than this are refused rather than parsed.
const MAX_FILE: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Editor {
    /// .vscode/tasks.json (Zed and other editors read it too)
    Vscode,
    /// .zed/tasks.json
    Zed,
    /// .run/aisb_*.run.xml (IntelliJ IDEA, CLion, RustRover, …)
    Jetbrains,
}

/// One file to write (or remove, when `content` is None), relative to the project.
#[derive(Debug, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    pub content: Option<String>,
}

/// Whether a task name can be written into an editor's command line as it is.
pub fn exportable(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

fn s(v: &str) -> CstInputValue {
    CstInputValue::String(v.to_string())
}

fn obj(props: Vec<(&str, CstInputValue)>) -> CstInputValue {
    CstInputValue::Object(props.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn arr(items: &[&str]) -> CstInputValue {
    CstInputValue::Array(items.iter().map(|i| s(i)).collect())
}

fn problem_matcher() -> CstInputValue {
    obj(vec![
        ("owner", s("aisb")),
        ("source", s("aisb")),
        ("fileLocation", arr(&["autoDetect", "${workspaceFolder}"])),
        (
            "pattern",
            obj(vec![
                ("regexp", s(SHORT_REGEXP)),
                ("file", CstInputValue::Number("1".into())),
                ("line", CstInputValue::Number("2".into())),
                ("column", CstInputValue::Number("3".into())),
                ("severity", CstInputValue::Number("4".into())),
                ("message", CstInputValue::Number("5".into())),
            ]),
        ),
    ])
}

/// `(label, args, detail, group)` of every entry aisb exports, the check first.
fn entries(tasks: &[Task]) -> Vec<(String, Vec<String>, String, Option<&'static str>)> {
    let mut out = vec![(
        format!("{PREFIX}check"),
        vec!["check".into(), "--format".into(), "short".into()],
        "validate sandbox.kdl (aisb)".to_string(),
        Some("build"),
    )];
    for t in tasks.iter().filter(|t| exportable(&t.name)) {
        let group = match t.name.as_str() {
            "test" | "tests" => Some("test"),
            "build" => Some("build"),
            _ => None,
        };
        let what = t.description.clone().unwrap_or_else(|| t.args.join(" "));
        out.push((
            format!("{PREFIX}{}", t.name),
            vec!["run".into(), t.name.clone()],
            format!("{what} (aisb task, in the sandbox)"),
            group,
        ));
    }
    out
}

fn vscode_entry(label: &str, args: &[String], detail: &str, group: Option<&str>) -> CstInputValue {
    let mut props = vec![
        ("label", s(label)),
        ("type", s("process")),
        ("command", s("aisb")),
        (
            "args",
            CstInputValue::Array(args.iter().map(|a| s(a)).collect()),
        ),
        ("detail", s(detail)),
        (
            "options",
            obj(vec![
                ("cwd", s("${workspaceFolder}")),
                ("env", obj(vec![("AISB_DIAGNOSTICS", s("short"))])),
            ]),
        ),
    ];
    if let Some(g) = group {
        props.push(("group", s(g)));
    }
    props.push((
        "presentation",
        obj(vec![
            (
                "reveal",
                s(if args[0] == "check" {
                    "silent"
                } else {
                    "always"
                }),
            ),
            ("panel", s("shared")),
            ("clear", CstInputValue::Bool(true)),
        ]),
    ));
    props.push(("problemMatcher", problem_matcher()));
    obj(props)
}

fn zed_entry(label: &str, args: &[String]) -> CstInputValue {
    obj(vec![
        ("label", s(label)),
        ("command", s("aisb")),
        (
            "args",
            CstInputValue::Array(args.iter().map(|a| s(a)).collect()),
        ),
        ("cwd", s("$ZED_WORKTREE_ROOT")),
        ("env", obj(vec![("AISB_DIAGNOSTICS", s("short"))])),
        ("reveal", s("always")),
        ("tags", arr(&["aisb"])),
    ])
}

fn label_of(node: &jsonc_parser::cst::CstNode) -> Option<String> {
    node.as_object()?
        .get("label")?
        .value()?
        .as_string_lit()?
        .decoded_value()
        .ok()
}

/// Merge `wanted` (label, entry) into the array `tasks`: aisb's entries replaced in place,
/// new ones appended, stale ones removed; everything else untouched.
fn merge_array(tasks: &jsonc_parser::cst::CstArray, wanted: Vec<(String, CstInputValue)>) {
    let mut pending: Vec<Option<(String, CstInputValue)>> = wanted.into_iter().map(Some).collect();
    for el in tasks.elements() {
        let Some(label) = label_of(&el) else { continue };
        if !label.starts_with(PREFIX) {
            continue;
        }
        match pending
            .iter_mut()
            .find(|p| p.as_ref().is_some_and(|(l, _)| *l == label))
        {
            Some(slot) => {
                let (_, value) = slot.take().unwrap_or_else(|| unreachable!());
                // Same text: leave the node (and its formatting) alone.
                let now = el.to_serde_value();
                let tmp = CstRootNode::parse("null", &ParseOptions::default()).ok();
                let same = tmp.is_some_and(|r| {
                    r.set_value(value.clone());
                    r.value().and_then(|v| v.to_serde_value()) == now
                });
                if !same {
                    match el {
                        jsonc_parser::cst::CstNode::Container(c) => {
                            if let Some(o) = c.as_object() {
                                o.replace_with(value);
                            }
                        }
                        jsonc_parser::cst::CstNode::Leaf(_) => {}
                    }
                }
            }
            None => el.remove(),
        }
    }
    for (_, value) in pending.into_iter().flatten() {
        tasks.append(value);
    }
}

fn parse_jsonc(path: &Path, text: &str) -> Result<CstRootNode, Error> {
    CstRootNode::parse(text, &ParseOptions::default()).map_err(|e| {
        Error::Usage(format!(
            "{}: not valid JSON with comments ({e}); fix it or move it away, then export again",
            path.display()
        ))
    })
}

fn read(project: &Path, rel: &Path) -> Result<Option<String>, Error> {
    let io = |source| Error::Io {
        path: project.join(rel),
        source,
    };
    match crate::beneath::read(project, rel, MAX_FILE + 1).map_err(io)? {
        None => Ok(None),
        Some(b) if b.len() as u64 > MAX_FILE => Err(Error::Usage(format!(
            "{} is larger than {} MiB: not an editor's task file",
            project.join(rel).display(),
            MAX_FILE >> 20
        ))),
        Some(b) => String::from_utf8(b)
            .map(Some)
            .map_err(|_| Error::Usage(format!("{}: not UTF-8", project.join(rel).display()))),
    }
}

fn vscode(project: &Path, tasks: &[Task]) -> Result<Vec<Change>, Error> {
    let rel = PathBuf::from(".vscode/tasks.json");
    let before = read(project, &rel)?;
    let text = before
        .clone()
        .unwrap_or_else(|| "{\n  \"version\": \"2.0.0\",\n  \"tasks\": []\n}\n".into());
    let root = parse_jsonc(&rel, &text)?;
    let Some(top) = root.object_value_or_create() else {
        return Err(Error::Usage(format!(
            "{}: the top level is not an object",
            rel.display()
        )));
    };
    if top.get("version").is_none() {
        top.insert(0, "version", s("2.0.0"));
    }
    let Some(list) = top.array_value_or_create("tasks") else {
        return Err(Error::Usage(format!(
            "{}: `tasks` is not an array",
            rel.display()
        )));
    };
    let wanted = entries(tasks)
        .into_iter()
        .map(|(l, a, d, g)| {
            let v = vscode_entry(&l, &a, &d, g);
            (l, v)
        })
        .collect();
    merge_array(&list, wanted);
    Ok(change(rel, before, root.to_string()))
}

fn zed(project: &Path, tasks: &[Task]) -> Result<Vec<Change>, Error> {
    let rel = PathBuf::from(".zed/tasks.json");
    let before = read(project, &rel)?;
    let text = before.clone().unwrap_or_else(|| "[]\n".into());
    let root = parse_jsonc(&rel, &text)?;
    let Some(list) = root.array_value_or_create() else {
        return Err(Error::Usage(format!(
            "{}: the top level is not an array",
            rel.display()
        )));
    };
    let wanted = entries(tasks)
        .into_iter()
        .map(|(l, a, _, _)| {
            let v = zed_entry(&l, &a);
            (l, v)
        })
        .collect();
    merge_array(&list, wanted);
    Ok(change(rel, before, root.to_string()))
}

fn change(rel: PathBuf, before: Option<String>, after: String) -> Vec<Change> {
    let after = if after.ends_with('\n') {
        after
    } else {
        after + "\n"
    };
    if before.as_deref() == Some(after.as_str()) {
        return Vec::new();
    }
    vec![Change {
        path: rel,
        content: Some(after),
    }]
}

fn xml_escape(v: &str) -> String {
    v.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn jetbrains(project: &Path, tasks: &[Task]) -> Result<Vec<Change>, Error> {
    let mut out = Vec::new();
    let mut keep = Vec::new();
    for (label, args, _, _) in entries(tasks) {
        let file = format!(
            "aisb_{}.run.xml",
            label[PREFIX.len()..].replace([':', '.'], "_")
        );
        // The args are aisb's own words and exportable names: nothing a shell would read.
        let text = format!(
            "{XML_MARKER}\n<component name=\"ProjectRunConfigurationManager\">\n  <configuration default=\"false\" name=\"{}\" type=\"ShConfigurationType\">\n    <option name=\"SCRIPT_TEXT\" value=\"aisb {}\" />\n    <option name=\"INDEPENDENT_SCRIPT_PATH\" value=\"true\" />\n    <option name=\"SCRIPT_PATH\" value=\"\" />\n    <option name=\"SCRIPT_OPTIONS\" value=\"\" />\n    <option name=\"INDEPENDENT_SCRIPT_WORKING_DIRECTORY\" value=\"true\" />\n    <option name=\"SCRIPT_WORKING_DIRECTORY\" value=\"$PROJECT_DIR$\" />\n    <option name=\"INDEPENDENT_INTERPRETER_PATH\" value=\"true\" />\n    <option name=\"INTERPRETER_PATH\" value=\"/bin/sh\" />\n    <option name=\"INTERPRETER_OPTIONS\" value=\"\" />\n    <option name=\"EXECUTE_IN_TERMINAL\" value=\"true\" />\n    <option name=\"EXECUTE_SCRIPT_FILE\" value=\"false\" />\n    <envs>\n      <env name=\"AISB_DIAGNOSTICS\" value=\"short\" />\n    </envs>\n    <method v=\"2\" />\n  </configuration>\n</component>\n",
            xml_escape(&label),
            xml_escape(&args.join(" ")),
        );
        let rel = PathBuf::from(".run").join(&file);
        keep.push(file);
        let before = read(project, &rel)?;
        out.extend(change(rel, before, text));
    }
    // aisb's files for tasks that are gone (only regular files that carry the marker).
    let dir = project.join(".run");
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
        let list = std::fs::read_dir(&dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        for e in list.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("aisb_") || !name.ends_with(".run.xml") || keep.contains(&name) {
                continue;
            }
            let rel = PathBuf::from(".run").join(&name);
            if read(project, &rel)?.is_some_and(|t| t.starts_with(XML_MARKER)) {
                out.push(Change {
                    path: rel,
                    content: None,
                });
            }
        }
    }
    Ok(out)
}

/// What exporting `tasks` for `editor` would change in `project`.
pub fn plan(project: &Path, editor: Editor, tasks: &[Task]) -> Result<Vec<Change>, Error> {
    match editor {
        Editor::Vscode => vscode(project, tasks),
        Editor::Zed => zed(project, tasks),
        Editor::Jetbrains => jetbrains(project, tasks),
    }
}

/// Carry `changes` out below `project`, following no symbolic link.
pub fn apply(project: &Path, changes: &[Change]) -> Result<(), Error> {
    for c in changes {
        let io = |source| Error::Io {
            path: project.join(&c.path),
            source,
        };
        match &c.content {
            Some(text) => {
                crate::beneath::write(project, &c.path, text.as_bytes(), 0o644).map_err(io)?
            }
            None => {
                let dir = crate::beneath::Dir::open(project)
                    .and_then(|d| d.dir(c.path.parent().unwrap_or(Path::new("")), false))
                    .map_err(io)?;
                dir.remove_all(c.path.file_name().unwrap_or_default(), 0)
                    .map_err(io)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_shell_would_read_are_not_exported() {
        for bad in ["$(id)", "a b", "-rf", "x;y", "", "é", "a`b`"] {
            assert!(!exportable(bad), "{bad}");
        }
        for good in ["test", "lint:fix", "build-all", "e2e.smoke"] {
            assert!(exportable(good), "{good}");
        }
    }
}
