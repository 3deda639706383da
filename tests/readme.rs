//! The README's 30-second tour, run as written, top to bottom, on a terminal (`script` gives
//! each line one, as a user has), in a fresh git repository with a Makefile. The programs the
//! tour starts inside the sandbox besides `make` (`claude`, and the `cargo` of the template's
//! `test` task) are stand-ins committed in the repository, first on PATH: the tour is about
//! aisb, and the real clients have their own tests (tests/agents.rs).

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// The tour's command lines: the `sh` block under "## A 30-second tour", comments removed.
fn tour() -> Vec<String> {
    let readme = include_str!("../README.md");
    let start = readme
        .find("## A 30-second tour")
        .expect("the README has a tour");
    let block = &readme[start..];
    let block = &block[block.find("```sh\n").expect("a sh block") + 6..];
    let block = &block[..block.find("```").unwrap()];
    block
        .lines()
        .map(|l| match l.find("   #").or_else(|| l.find("  #")) {
            Some(i) => l[..i].trim_end().to_string(),
            None => l.trim_end().to_string(),
        })
        .filter(|l| !l.is_empty())
        .collect()
}

fn write_exe(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

#[test]
fn the_readme_tour_runs_top_to_bottom_as_written() {
    if !support::root_or_skip("the README tour (runc, named sandboxes)") {
        return;
    }
    if !support::tool_or_skip("runc", "the README tour") {
        return;
    }
    let lines = tour();
    assert!(lines.len() >= 15, "{lines:?}");
    let t = tempfile::tempdir().unwrap();
    let proj = t.path().join("proj");
    let bin = t.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_aisb"), bin.join("aisb")).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_aisb-init"), bin.join("aisb-init")).unwrap();
    std::fs::create_dir_all(proj.join("src")).unwrap();
    std::fs::write(proj.join("src/main.c"), "int main(void) { return 0; }\n").unwrap();
    std::fs::write(proj.join("Makefile"), "test:\n\t@echo make-test-ran\n").unwrap();
    write_exe(
        &proj.join(".tools/claude"),
        "#!/bin/sh\necho \"claude-stand-in $*\"\n",
    );
    write_exe(
        &proj.join(".tools/cargo"),
        "#!/bin/sh\necho \"cargo-stand-in $*\"\n",
    );
    support::git_in(&proj, &["init", "-q", "-b", "main"]);
    support::git_in(&proj, &["add", "-A"]);
    support::git_in(
        &proj,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "one",
        ],
    );
    let path = format!(
        "{}:{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        proj.join(".tools").display(),
        bin.display()
    );
    let cleanup = || {
        let _ = std::fs::remove_dir_all("/tmp/sb");
        let _ = Command::new("runc").args(["delete", "-f", "demo"]).output();
    };
    cleanup();
    let mut transcript = String::new();
    for line in &lines {
        let mut child = Command::new("timeout")
            .args(["300", "script", "-qec", line, "/dev/null"])
            .current_dir(&proj)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", t.path().join("home"))
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .env("XDG_CONFIG_HOME", t.path().join("config"))
            .env("SHELL", "/bin/sh")
            .env("TERM", "xterm")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // What a user types: `exit` to a shell (`aisb up`; the bundle's command, the default
        // shell, under runc), `y` when aisb asks to trust sandbox.kdl.
        let typed: &[u8] = if line == "aisb up" || line.contains("runc run") {
            b"exit\n"
        } else {
            b"y\n"
        };
        let _ = child.stdin.take().unwrap().write_all(typed);
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        transcript.push_str(&format!("$ {line}\n{text}"));
        assert!(
            out.status.success(),
            "`{line}` failed ({:?}):\n{text}\n{}\n--- the tour so far:\n{transcript}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    cleanup();
    // The lines did their work, not just exit 0.
    for needle in [
        "make-test-ran",
        "claude-stand-in -p review src/",
        "claude-stand-in \r\n",
        "cargo-stand-in test --workspace",
        "wrote sandbox.kdl",
    ] {
        assert!(
            transcript.contains(needle),
            "no `{needle}` in:\n{transcript}"
        );
    }
    assert!(proj.join("config.json").is_file());
}

/// The README's lines for real projects (the `sh` block holding `aisb run -- npm test`), run as
/// written in a project that git ignores `node_modules/` and `target/` in, with both installed
/// or built on the host first and the caller's rustup cargo on PATH: `npm test` finds the
/// installed package and `cargo test` runs the crate's test, each inside the default sandbox.
#[test]
fn the_readme_s_real_project_lines_run_as_written() {
    if !support::root_or_skip("the README's real-project lines")
        || !support::tool_or_skip("npm", "the README's real-project lines")
    {
        return;
    }
    let readme = include_str!("../README.md");
    let at = readme
        .find("aisb run -- npm test")
        .expect("the README shows `aisb run -- npm test`");
    let start = readme[..at].rfind("```sh\n").unwrap() + 6;
    let lines: Vec<String> = readme[start..][..readme[start..].find("```").unwrap()]
        .lines()
        .map(|l| l.split("  #").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        lines.iter().any(|l| l == "aisb run -- npm test")
            && lines.iter().any(|l| l == "aisb run -- cargo test"),
        "{lines:?}"
    );
    let home = std::path::PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    let cargo_bin = home.join(".cargo/bin");
    assert!(
        cargo_bin.join("cargo").exists() || std::env::var_os("CI").is_none(),
        "CI builds with rustup: {} must exist",
        cargo_bin.display()
    );
    if !cargo_bin.join("cargo").exists() {
        eprintln!("SKIPPED: no rustup toolchain in {}", home.display());
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let proj = t.path().join("proj");
    let bin = t.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_aisb"), bin.join("aisb")).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_aisb-init"), bin.join("aisb-init")).unwrap();
    let write = |rel: &str, text: &str| {
        let p = proj.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(".gitignore", "node_modules/\ntarget/\n");
    write(
        "package.json",
        r#"{"name":"app","version":"1.0.0","scripts":{"test":"node test.js"}}"#,
    );
    write(
        "test.js",
        "const pad = require('left-pad');\nconsole.log('npm-test=' + pad('7', 3));\n",
    );
    write(
        "node_modules/left-pad/index.js",
        "module.exports = (s, n) => s.padStart(n, '0');\n",
    );
    write(
        "Cargo.toml",
        "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    );
    write(
        "src/lib.rs",
        "#[test]\nfn readme_crate_test() { assert_eq!(6 * 7, 42); }\n",
    );
    let path = format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        bin.display(),
        cargo_bin.display()
    );
    let host_build = Command::new(cargo_bin.join("cargo"))
        .args(["build", "--offline", "-q"])
        .current_dir(&proj)
        .env_remove("CARGO_TARGET_DIR")
        .env("PATH", &path)
        .status()
        .unwrap();
    assert!(host_build.success());
    support::git_in(&proj, &["init", "-q", "-b", "main"]);
    support::git_in(&proj, &["add", "-A"]);
    let mut transcript = String::new();
    for line in &lines {
        let out = Command::new("sh")
            .args(["-c", line])
            .current_dir(&proj)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", &home)
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .env("XDG_CONFIG_HOME", t.path().join("config"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        transcript.push_str(&format!("$ {line}\n{text}"));
        assert!(out.status.success(), "`{line}` failed:\n{transcript}");
    }
    assert!(transcript.contains("npm-test=007"), "{transcript}");
    assert!(
        transcript.contains("test readme_crate_test ... ok"),
        "{transcript}"
    );
}
