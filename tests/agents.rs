//! Real agent clients inside their presets (installed by scripts/setup.sh from npm): they start,
//! read and write their config directories, and nothing they write reaches the host.

use std::path::Path;
use std::process::Command;

mod support;

use support::Out;

fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn claude_and_codex_run_in_their_presets_and_their_writes_stay_inside() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root on this host (CI runs as root)");
        return;
    }
    if !installed("claude") || !installed("codex") {
        // CI runs scripts/setup.sh, which installs them: there, missing is a failure.
        assert!(
            std::env::var_os("CI").is_none(),
            "claude or codex is not installed: scripts/setup.sh should have installed them"
        );
        eprintln!(
            "skipped: claude or codex is not installed (scripts/setup.sh installs them from npm)"
        );
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (home, proj) = (t.path().join("home"), t.path().join("proj"));
    for d in [home.join(".claude"), home.join(".codex"), proj.clone()] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(home.join(".claude.json"), "{}\n").unwrap();
    std::fs::write(
        home.join(".claude/settings.json"),
        "{\"theme\": \"dark\"}\n",
    )
    .unwrap();
    let _ = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&proj)
        .status();
    std::fs::write(
        proj.join("sandbox.kdl"),
        "import \"preset:claude\"\nimport \"preset:codex\"\n",
    )
    .unwrap();
    let before = (
        entries(&home.join(".claude")),
        entries(&home.join(".codex")),
    );
    let script = "claude --version && echo claude=ok; \
                  codex --version && echo codex=ok; \
                  claude config list >/dev/null 2>&1; codex login status >/dev/null 2>&1; \
                  cat ~/.claude/settings.json | grep -q dark && echo reads_config=ok; \
                  echo changed > ~/.claude/settings.json && echo writes_config=ok";
    // The presets mount the agents' dirs copy-on-write: libcontainer (bwrap 0.8 cannot).
    let out = Out::from(
        Command::new(env!("CARGO_BIN_EXE_aisb"))
            .args([
                "--trust",
                "run",
                "--backend",
                "libcontainer",
                "--",
                "/bin/sh",
                "-c",
                script,
            ])
            .current_dir(&proj)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home)
            .env("XDG_CACHE_HOME", t.path().join("cache"))
            .env("ANTHROPIC_API_KEY", "sk-ant-test")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    for key in ["claude", "codex", "reads_config", "writes_config"] {
        out.expect(key, "ok");
    }
    assert_eq!(
        (
            entries(&home.join(".claude")),
            entries(&home.join(".codex"))
        ),
        before
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".claude/settings.json")).unwrap(),
        "{\"theme\": \"dark\"}\n",
        "a write inside reached the host's config"
    );
}
