//! `aisb tasks export vscode|zed|jetbrains`: the written tasks.json is what VS Code's tasks
//! schema accepts, its problem matcher reads `aisb check`'s output, exporting again changes
//! nothing, and the user's own entries (and comments) survive.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const KDL: &str = r#"task "test" description="unit tests" {
    run "cargo test"
}
task "lint" {
    run "cargo" "clippy"
}
"#;

const USER_VSCODE: &str = r#"{
  // my own tasks: aisb must not touch them
  "version": "2.0.0",
  "tasks": [
    {
      "label": "serve",
      "type": "shell",
      "command": "npm run dev", // keep this comment
    },
  ],
}
"#;

fn project(kdl: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("proj")).unwrap();
    support::git_in(&t.path().join("proj"), &["init", "-q"]);
    std::fs::write(t.path().join("proj/sandbox.kdl"), kdl).unwrap();
    t
}

fn aisb(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aisb"))
        .args(args)
        .current_dir(dir.join("proj"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    err
}

fn jsonc(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    jsonc_parser::parse_to_serde_value::<serde_json::Value>(&text, &Default::default()).unwrap()
}

fn schema() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vscode-tasks.schema.json")
}

/// Validate `doc` against VS Code's tasks schema with PyPI's `jsonschema`, and match the
/// check task's problem matcher against `lines` (`aisb check --format short`'s output): the
/// matches, as `file|line|col|severity|message`.
fn validate(doc: &serde_json::Value, lines: &str) -> Vec<String> {
    let script = r#"
import json, re, sys, jsonschema
schema = json.load(open(sys.argv[1]))
doc = json.loads(sys.argv[2])
jsonschema.validate(doc, schema)
check = [t for t in doc["tasks"] if t["label"] == "aisb: check"][0]
p = check["problemMatcher"]["pattern"]
# VS Code's regexps are JavaScript's; this one uses nothing Python reads differently.
for line in sys.argv[3].splitlines():
    m = re.match(p["regexp"], line)
    if m:
        print("|".join(m.group(p[k]) for k in ("file", "line", "column", "severity", "message")))
"#;
    let o = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(schema())
        .arg(doc.to_string())
        .arg(lines)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "the schema refused it:\n{}\n{doc:#}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn python_jsonschema() -> bool {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import jsonschema"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "python3-jsonschema (scripts/setup.sh installs it) is missing"
        );
        eprintln!("SKIPPED: needs python3-jsonschema (scripts/setup.sh installs it)");
    }
    ok
}

#[test]
fn vscode_export_is_schema_valid_idempotent_and_keeps_user_tasks() {
    if !python_jsonschema() {
        return;
    }
    let t = project(KDL);
    let dir = t.path();
    let file = dir.join("proj/.vscode/tasks.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, USER_VSCODE).unwrap();

    ok(&aisb(dir, &["tasks", "export", "vscode"]));
    let text = std::fs::read_to_string(&file).unwrap();
    // The user's entry, with its comments, is still there, first.
    assert!(
        text.contains("// my own tasks: aisb must not touch them"),
        "{text}"
    );
    assert!(
        text.contains("\"command\": \"npm run dev\", // keep this comment"),
        "{text}"
    );
    let doc = jsonc(&file);
    let labels: Vec<&str> = doc["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["serve", "aisb: check", "aisb: lint", "aisb: test"]);
    let test = &doc["tasks"][3];
    assert_eq!(test["command"], "aisb");
    assert_eq!(test["args"], serde_json::json!(["run", "test"]));
    assert_eq!(test["group"], "test");
    assert_eq!(
        test["type"], "process",
        "no shell between the editor and aisb"
    );

    // The check task's matcher turns `aisb check`'s lines into problems.
    std::fs::write(dir.join("proj/broken.kdl"), "netwrok \"none\"\n").unwrap();
    let o = aisb(dir, &["-f", "broken.kdl", "check", "--format", "short"]);
    let lines = String::from_utf8_lossy(&o.stdout).into_owned();
    let problems = validate(&doc, &lines);
    assert_eq!(problems.len(), 1, "{lines}");
    assert!(
        problems[0].starts_with("broken.kdl|1|1|error|unknown node `netwrok`"),
        "{problems:?}"
    );

    // Again: nothing changes, byte for byte.
    let err = ok(&aisb(dir, &["tasks", "export", "vscode"]));
    assert!(err.contains("already up to date"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);

    // A task removed from sandbox.kdl leaves; a new one arrives; the user's stays.
    std::fs::write(
        dir.join("proj/sandbox.kdl"),
        "task \"build\" {\n    run \"make\"\n}\n",
    )
    .unwrap();
    ok(&aisb(dir, &["tasks", "export", "vscode"]));
    let doc = jsonc(&file);
    let labels: Vec<&str> = doc["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["serve", "aisb: check", "aisb: build"]);
    validate(&doc, "");
}

#[test]
fn vscode_export_from_nothing_and_dry_run_writes_nothing() {
    if !python_jsonschema() {
        return;
    }
    let t = project(KDL);
    let dir = t.path();
    let o = aisb(dir, &["tasks", "export", "vscode", "--dry-run"]);
    ok(&o);
    assert!(!dir.join("proj/.vscode").exists());
    let out = String::from_utf8_lossy(&o.stdout);
    let body = out.split_once('\n').unwrap().1;
    assert!(out.starts_with("// .vscode/tasks.json"), "{out}");
    let doc: serde_json::Value = serde_json::from_str(body).unwrap();
    validate(&doc, "");
    ok(&aisb(dir, &["tasks", "export", "vscode"]));
    assert_eq!(jsonc(&dir.join("proj/.vscode/tasks.json")), doc);
}

#[test]
fn zed_export_merges_into_the_array() {
    let t = project(KDL);
    let dir = t.path();
    let file = dir.join("proj/.zed/tasks.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(
        &file,
        "[\n  // mine\n  { \"label\": \"serve\", \"command\": \"npm run dev\" },\n]\n",
    )
    .unwrap();
    ok(&aisb(dir, &["tasks", "export", "zed"]));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("// mine"), "{text}");
    let doc = jsonc(&file);
    assert_eq!(doc[0]["label"], "serve");
    assert_eq!(doc[3]["label"], "aisb: test");
    assert_eq!(doc[3]["args"], serde_json::json!(["run", "test"]));
    assert_eq!(doc[3]["tags"], serde_json::json!(["aisb"]));
    let err = ok(&aisb(dir, &["tasks", "export", "zed"]));
    assert!(err.contains("already up to date"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
}

#[test]
fn jetbrains_export_writes_one_file_per_task_and_removes_only_its_own() {
    let t = project(KDL);
    let dir = t.path();
    let run = dir.join("proj/.run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("mine.run.xml"), "<component/>\n").unwrap();
    std::fs::write(run.join("aisb_hand.run.xml"), "<component/>\n").unwrap();
    ok(&aisb(dir, &["tasks", "export", "jetbrains"]));
    let test = std::fs::read_to_string(run.join("aisb_test.run.xml")).unwrap();
    assert!(test.contains("name=\"aisb: test\""), "{test}");
    assert!(test.contains("value=\"aisb run test\""), "{test}");
    assert!(run.join("aisb_check.run.xml").exists());
    let err = ok(&aisb(dir, &["tasks", "export", "jetbrains"]));
    assert!(err.contains("already up to date"), "{err}");
    std::fs::write(
        dir.join("proj/sandbox.kdl"),
        "task \"lint\" {\n    run \"x\"\n}\n",
    )
    .unwrap();
    ok(&aisb(dir, &["tasks", "export", "jetbrains"]));
    assert!(!run.join("aisb_test.run.xml").exists());
    assert!(run.join("aisb_lint.run.xml").exists());
    // Not aisb's (no marker), whatever the name: kept.
    assert!(run.join("mine.run.xml").exists());
    assert!(run.join("aisb_hand.run.xml").exists());
}

#[test]
fn a_checked_in_link_cannot_redirect_the_export() {
    let t = project(KDL);
    let dir = t.path();
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, dir.join("proj/.vscode")).unwrap();
    let o = aisb(dir, &["tasks", "export", "vscode"]);
    assert!(!o.status.success());
    assert!(!elsewhere.join("tasks.json").exists());
    // A link as the file itself: replaced by the write, its target untouched.
    std::fs::remove_file(dir.join("proj/.vscode")).unwrap();
    std::fs::create_dir_all(dir.join("proj/.zed")).unwrap();
    std::fs::write(elsewhere.join("victim"), "[]\n").unwrap();
    std::os::unix::fs::symlink(elsewhere.join("victim"), dir.join("proj/.zed/tasks.json")).unwrap();
    let o = aisb(dir, &["tasks", "export", "zed"]);
    assert!(!o.status.success(), "a link is refused, not read");
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("victim")).unwrap(),
        "[]\n"
    );
}
