//! `aisb init --from-devcontainer` on the devcontainers/templates samples in
//! tests/fixtures/devcontainer/ (MIT, see the README there) and on a file with every key:
//! what maps becomes sandbox.kdl that `aisb check` accepts, placeholders are reported and
//! never guessed, compose-based configurations are refused with the reason.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/devcontainer")
        .join(name)
}

/// A project whose `.devcontainer/devcontainer.json` is the fixture `name`.
fn project(name: &str) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let proj = t.path().join("proj");
    std::fs::create_dir_all(proj.join(".devcontainer")).unwrap();
    std::fs::create_dir_all(t.path().join("home")).unwrap();
    support::git_in(&proj, &["init", "-q"]);
    std::fs::copy(fixture(name), proj.join(".devcontainer/devcontainer.json")).unwrap();
    t
}

fn aisb(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_aisb"))
        .args(args)
        .current_dir(dir.join("proj"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir.join("home"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn import(dir: &Path) -> (String, String) {
    let o = aisb(dir, &["init", "--from-devcontainer"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let kdl = std::fs::read_to_string(dir.join("proj/sandbox.kdl")).unwrap();
    (kdl, err)
}

fn check_ok(dir: &Path) {
    let o = aisb(dir, &["check", "--format", "short"]);
    assert!(
        o.status.success(),
        "aisb check refused the imported file:\n{}{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        std::fs::read_to_string(dir.join("proj/sandbox.kdl")).unwrap()
    );
}

#[test]
fn image_templates_report_their_placeholder_and_guess_nothing() {
    for name in [
        "alpine.json",
        "debian.json",
        "python.json",
        "javascript-node.json",
    ] {
        let t = project(name);
        let (kdl, err) = import(t.path());
        assert!(
            err.contains("placeholder  image: ${templateOption:imageVariant}"),
            "{name}: {err}"
        );
        // The image is there for the user to finish, commented out: no tag was invented.
        let line = kdl
            .lines()
            .find(|l| l.contains("rootfs from="))
            .unwrap_or_else(|| panic!("{name}: {kdl}"));
        assert!(
            line.starts_with("// rootfs from=\"mcr.microsoft.com/devcontainers/"),
            "{line}"
        );
        assert!(line.contains("${templateOption:imageVariant}"), "{line}");
        assert!(
            !kdl.lines().any(|l| l.starts_with("rootfs")),
            "{name}: {kdl}"
        );
        check_ok(t.path());
    }
}

#[test]
fn dockerfile_template_becomes_rootfs_dockerfile() {
    let t = project("docker-existing-dockerfile.json");
    std::fs::write(
        t.path().join("proj/.devcontainer/Dockerfile"),
        "FROM debian:12\n",
    )
    .unwrap();
    let (kdl, err) = import(t.path());
    assert!(
        kdl.lines()
            .any(|l| l == "rootfs dockerfile=\".devcontainer/Dockerfile\""),
        "{kdl}"
    );
    // The template builds with the project as context; aisb with the Dockerfile's directory.
    assert!(err.contains("not imported build.context"), "{err}");
    check_ok(t.path());
}

#[test]
fn compose_templates_are_refused_with_the_reason() {
    for (name, service) in [
        (
            "docker-existing-docker-compose.json",
            "your-service-name-here",
        ),
        ("go-postgres.json", "app"),
    ] {
        let t = project(name);
        let o = aisb(t.path(), &["init", "--from-devcontainer"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert!(err.contains("Docker Compose"), "{name}: {err}");
        assert!(err.contains(&format!("`{service}`")), "{name}: {err}");
        assert!(!t.path().join("proj/sandbox.kdl").exists(), "{name}");
    }
}

#[test]
fn every_key_maps_or_is_listed_with_its_reason() {
    let t = project("full.jsonc");
    let proj = t.path().join("proj");
    std::fs::write(proj.join(".devcontainer/Dockerfile"), "FROM debian:12\n").unwrap();
    std::fs::create_dir_all(proj.join("data")).unwrap();
    std::fs::create_dir_all(t.path().join("home/.config/app")).unwrap();
    let (kdl, err) = import(t.path());
    for want in [
        "rootfs dockerfile=\".devcontainer/Dockerfile\"",
        "    set \"APP_ENV\" \"development\"",
        "    set \"CACHE\" \"${HOME}/.cache/app\"",
        "mount \"${HOME}/.config/app\" \"/home/dev/.config/app\" access=\"ro\"",
        "mount \"${PROJECT}/data\" \"/data\" access=\"rw\"",
        "    user name=\"dev\"",
        "    localhost-port 5432",
        "task \"post-create-deps\" description=\"devcontainer postCreateCommand\" {",
        "    run \"pip install -r requirements.txt\"",
        "    run \"pre-commit\" \"install\"",
        "task \"post-start\" description=\"devcontainer postStartCommand\" {",
    ] {
        assert!(
            kdl.lines().any(|l| l == want),
            "missing `{want}` in:\n{kdl}"
        );
    }
    // A value that tries to close its string and add nodes stays one string.
    assert!(
        kdl.contains(r#"set "GREETING" "say \"hi\"\n}\nnetwork \"host\"""#),
        "{kdl}"
    );
    assert!(
        !kdl.lines().any(|l| l.starts_with("network \"host\"")),
        "{kdl}"
    );
    for (key, why) in [
        ("features", "install scripts"),
        ("runArgs", "Docker"),
        ("capAdd", "drops every capability"),
        ("privileged", "undo the sandbox"),
        ("initializeCommand", "runs on the host"),
        ("build.args", "--build-arg"),
        ("customizations", "editor"),
        ("forwardPorts \"db:6379\"", "another container"),
        ("a Docker volume", "no host path"),
    ] {
        assert!(
            err.lines().any(|l| l.contains(key) && l.contains(why)),
            "`{key}` not reported with `{why}`:\n{err}"
        );
    }
    assert!(
        err.contains("placeholder  remoteEnv.PATH: ${containerEnv:PATH}"),
        "{err}"
    );
    assert!(
        kdl.contains("// set \"PATH\" \"${containerEnv:PATH}:/opt/tools/bin\""),
        "{kdl}"
    );
    check_ok(t.path());
    // The evaluated plan carries the hostile value as one variable.
    let o = aisb(t.path(), &["plan", "--json"]);
    let plan = String::from_utf8_lossy(&o.stdout);
    assert!(plan.contains("GREETING"), "{plan}");
}

#[test]
fn an_existing_sandbox_kdl_is_never_overwritten_and_bad_input_is_refused() {
    let t = project("full.jsonc");
    std::fs::write(t.path().join("proj/sandbox.kdl"), "// mine\n").unwrap();
    let o = aisb(t.path(), &["init", "--from-devcontainer"]);
    assert!(!o.status.success());
    assert_eq!(
        std::fs::read_to_string(t.path().join("proj/sandbox.kdl")).unwrap(),
        "// mine\n"
    );
    let deep = format!("{{\"a\": {}1{}}}", "[".repeat(5000), "]".repeat(5000));
    std::fs::write(t.path().join("deep.json"), deep).unwrap();
    let o = aisb(
        t.path(),
        &["init", "--from-devcontainer", "../deep.json", "-o", "-"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("nested deeper than 64 levels"), "{err}");
    std::fs::write(t.path().join("bad.json"), "{ \"image\": ").unwrap();
    let o = aisb(
        t.path(),
        &["init", "--from-devcontainer", "../bad.json", "-o", "-"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("bad.json"), "{err}");
}
