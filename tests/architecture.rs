//! The module graph points one way (docs/ARCHITECTURE.md): `scripts/imports.sh` reads it from
//! the source and fails on a forbidden arrow, a cycle or a stale allowance. Run here on the
//! crate itself, and on small fake crates that break each rule, so the check cannot rot into
//! one that always passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/imports.sh")
}

fn run(root: &Path) -> Output {
    Command::new("sh")
        .arg(root.join("scripts/imports.sh"))
        .output()
        .expect("sh runs")
}

/// A crate of empty top-level modules, the script copied in, and `files` written under src/.
fn fake(files: &[(&str, &str)], allow: Option<&str>) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("scripts")).unwrap();
    std::fs::copy(script(), t.path().join("scripts/imports.sh")).unwrap();
    if let Some(a) = allow {
        std::fs::write(t.path().join("scripts/imports.allow"), a).unwrap();
    }
    for m in [
        "vocab", "config", "eval", "graph", "spec", "runtime", "image", "session",
    ] {
        std::fs::create_dir_all(t.path().join("src").join(m)).unwrap();
    }
    for (path, text) in files {
        std::fs::write(t.path().join("src").join(path), text).unwrap();
    }
    t
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_crate_imports_only_backwards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = run(root);
    assert!(o.status.success(), "{}", text(&o));
    // The arrows the issue names are all there to be checked.
    let out = String::from_utf8_lossy(&o.stdout);
    for arrow in [
        "eval -> config",
        "graph -> eval",
        "spec -> eval",
        "runtime -> spec",
    ] {
        assert!(out.lines().any(|l| l == arrow), "{arrow} missing:\n{out}");
    }
    assert!(
        !out.lines().any(|l| l.starts_with("config -> ")
            && l != "config -> vocab"
            && l != "config -> tools"),
        "{out}"
    );
}

#[test]
fn a_forbidden_arrow_fails_even_inside_a_use_group() {
    let t = fake(
        &[(
            "config/mod.rs",
            "use crate::{\n    vocab::X,\n    eval::{Plan, Host},\n};\n",
        )],
        None,
    );
    let o = run(t.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("forbidden arrow config -> eval"),
        "{}",
        text(&o)
    );
}

#[test]
fn comments_and_strings_are_not_arrows() {
    let t = fake(
        &[(
            "config/mod.rs",
            "// crate::eval\n/// [`crate::runtime`]\nconst S: &str = \"crate::spec // x\";\nuse crate::vocab::X;\n",
        )],
        None,
    );
    let o = run(t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "config -> vocab\n");
}

#[test]
fn a_cycle_fails() {
    let t = fake(
        &[
            ("graph/mod.rs", "use crate::image::Layer;\n"),
            ("image/mod.rs", "fn f() { crate::graph::store::x(); }\n"),
        ],
        None,
    );
    let o = run(t.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("cycle"), "{}", text(&o));
}

#[test]
fn an_allowance_hides_its_arrow_until_the_arrow_is_gone() {
    let files = [("runtime/mod.rs", "use crate::image::RootMount;\n")];
    let allow = "runtime -> image  RootMount is still image's\n";
    let t = fake(&files, Some(allow));
    let o = run(t.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("runtime -> image (allowed)"),
        "{}",
        text(&o)
    );
    // Once the arrow is removed, the allowance must go too.
    let t = fake(
        &[("runtime/mod.rs", "use crate::spec::Spec;\n")],
        Some(allow),
    );
    let o = run(t.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("no longer exists"), "{}", text(&o));
}
