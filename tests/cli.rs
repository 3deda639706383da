//! Black-box tests of the `aisb` binary: a fluent builder, exact stdout/stderr.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

struct Test {
    dir: tempfile::TempDir,
    args: Vec<String>,
}

struct Output {
    stdout: String,
    stderr: String,
    code: i32,
}

impl Test {
    fn new() -> Test {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        std::fs::create_dir_all(dir.path().join("proj")).unwrap();
        Test { dir, args: vec![] }
    }
    fn proj(&self) -> PathBuf {
        self.dir.path().join("proj")
    }
    fn file(self, rel: &str, content: &str) -> Test {
        let p = self.proj().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
        self
    }
    fn args(mut self, args: &[&str]) -> Test {
        self.args = args.iter().map(|s| s.to_string()).collect();
        self
    }
    fn run(&self) -> Output {
        self.with(&self.args.iter().map(String::as_str).collect::<Vec<_>>())
    }
    /// Run with other arguments, keeping the same project.
    fn with(&self, args: &[&str]) -> Output {
        let out = Command::new(env!("CARGO_BIN_EXE_aisb"))
            .args(args)
            .current_dir(self.proj())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .env("NO_COLOR", "1")
            .env("GITHUB_TOKEN", "ghp_secret_value")
            .output()
            .unwrap();
        Output {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            code: out.status.code().unwrap_or(-1),
        }
    }
}

#[test]
fn init_writes_the_template_and_refuses_to_overwrite() {
    let t = Test::new().args(&["init"]);
    let o = t.run();
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        o.stderr,
        "wrote sandbox.kdl — edit it, then run `aisb check` and `aisb plan`\n"
    );
    let written = std::fs::read_to_string(t.proj().join("sandbox.kdl")).unwrap();
    assert_eq!(written, include_str!("../sandbox.kdl.example"));
    let o = t.run();
    assert_eq!(o.code, 125);
    assert!(
        o.stderr.contains("sandbox.kdl already exists"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr.contains("aisb init never overwrites"),
        "{}",
        o.stderr
    );
    assert_eq!(
        std::fs::read_to_string(t.proj().join("sandbox.kdl")).unwrap(),
        written,
        "nothing lost"
    );
}

#[test]
fn check_formats_for_editors() {
    let t = Test::new().file(
        "sandbox.kdl",
        "projet \".\"\nnetwork {\n    allow \"*.com\"\n}\n",
    );
    let o = t.with(&["check", "--format", "short"]);
    assert_eq!(o.code, 1);
    assert_eq!(o.stdout, "\
sandbox.kdl:1:1: error: unknown node `projet` (help: did you mean `project`?)
sandbox.kdl:3:11: error: invalid domain `*.com`: `*.com` would allow a whole top-level domain (help: name the domains the tool needs, e.g. `api.github.com` or `*.githubusercontent.com`)
");
    let o = t.with(&["check", "--format", "json"]);
    assert_eq!(o.code, 1);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v[1]["line"], 3);
    assert_eq!(v[1]["column"], 11);
    assert_eq!(v[1]["end_column"], 18);
    assert!(v[1]["file"].as_str().unwrap().ends_with("proj/sandbox.kdl"));
    let o = t.with(&["check"]);
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("2 errors in the sandbox configuration"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("did you mean `project`?"), "{}", o.stderr);
}

#[test]
fn check_reports_errors_inside_profiles() {
    let t = Test::new()
        .file("sandbox.kdl", "profile \"p\" extends=\"nope\" { }\n")
        .args(&["check", "--format", "short"]);
    let o = t.run();
    assert_eq!(o.code, 1);
    assert!(
        o.stdout
            .starts_with("sandbox.kdl:1:13: error: unknown profile `nope`"),
        "{}",
        o.stdout
    );
    let ok = Test::new()
        .file("sandbox.kdl", "import \"preset:codex\"\n")
        .args(&["check"])
        .run();
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert_eq!(ok.stderr, "sandbox.kdl: ok (3 profiles)\n");
}

#[test]
fn plan_without_config_uses_the_embedded_default_and_never_prints_values() {
    let t = Test::new().file(".env", "SECRET=1").args(&["plan"]);
    let o = t.run();
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.starts_with(
            "config    embedded default (no sandbox.kdl found; `aisb init` writes one)\n"
        ),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("  file .env   [sensitive \".env\"]\n"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("looks like a secret: GITHUB_TOKEN"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("none: loopback only"), "{}", o.stdout);
    assert!(!o.stdout.contains("ghp_secret_value"));
    let j = Test {
        dir: t.dir,
        args: vec!["plan".into(), "--json".into()],
    }
    .run();
    assert!(!j.stdout.contains("ghp_secret_value"));
    let v: serde_json::Value = serde_json::from_str(&j.stdout).unwrap();
    assert_eq!(v["config_file"], serde_json::Value::Null);
    assert_eq!(v["network"]["mode"], "none");
    assert_eq!(v["masks"][0]["rule"], "sensitive \".env\"");
}

/// `aisb plan` shows every limit and where it came from, as text and as JSON.
#[test]
fn plan_shows_the_limits_and_where_they_were_set() {
    let t = Test::new();
    let o = t.with(&["plan"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // aisb's default memory limit is half the host's memory where a cgroup can hold it.
    let memory = o
        .stdout
        .lines()
        .find(|l| l.starts_with("  memory    "))
        .unwrap_or_default();
    assert!(
        o.stdout
            .contains("  pids      4096 processes and threads   [aisb's default]\n")
            && o.stdout
                .contains("  cpus      unlimited   [aisb's default]\n")
            && o.stdout.contains(
                "  disk      half of what the layers hold plus what is free   [aisb's default]\n"
            )
            && memory.ends_with("   [aisb's default]")
            && (memory.contains("M, swap included") || memory.contains("unlimited")),
        "{}",
        o.stdout
    );
    let t = t.file(
        "sandbox.kdl",
        "limits {\n    memory \"512M\"\n    cpus 1.5\n    disk \"2G\"\n}\n",
    );
    let o = t.with(&["plan"]);
    assert!(
        o.stdout.contains("  memory    512M, swap included   [sandbox.kdl:2]\n  cpus      1.5   [sandbox.kdl:3]\n  disk      2G in copy-on-write layers and private copies   [sandbox.kdl:4]\n"),
        "{}",
        o.stdout
    );
    let o = t.with(&["plan", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(
        v["limits"],
        serde_json::json!({
            "pids": 4096,
            "memory": 512u64 << 20,
            "cpus_milli": 1500,
            "disk": {"bytes": 2u64 << 30},
            "set_at": {"memory": "sandbox.kdl:2", "cpus": "sandbox.kdl:3", "disk": "sandbox.kdl:4"},
        })
    );
}

#[test]
fn host_network_is_loud() {
    let o = Test::new()
        .file("sandbox.kdl", "network \"host\"\n")
        .args(&["plan"])
        .run();
    assert!(
        o.stdout
            .contains("HOST: the sandbox shares the host's network; nothing is filtered"),
        "{}",
        o.stdout
    );
}

#[test]
fn spec_is_valid_oci_json_with_the_command() {
    let o = Test::new().args(&["spec", "--", "echo", "hi"]).run();
    assert_eq!(o.code, 0, "{}", o.stderr);
    let spec: oci_spec::runtime::Spec = serde_json::from_str(&o.stdout).unwrap();
    let args = spec.process().as_ref().unwrap().args().clone().unwrap();
    assert_eq!(
        args[..2],
        ["/run/aisb/init", "__init"],
        "every sandbox starts with our init"
    );
    assert_eq!(args[args.len() - 3..], ["--", "echo", "hi"]);
    assert!(
        !o.stdout.contains("ghp_secret_value"),
        "secret env must not reach the spec"
    );
}

#[test]
fn export_bundle_refuses_a_non_empty_dir() {
    let t = Test::new().file("out/x", "keep");
    let o = t.with(&["export", "bundle", "out"]);
    assert_eq!(o.code, 125);
    assert!(
        o.stderr
            .contains("out exists and is not an empty directory"),
        "{}",
        o.stderr
    );
    assert_eq!(
        std::fs::read_to_string(Path::new(&t.proj()).join("out/x")).unwrap(),
        "keep"
    );
}

/// What fails inside the container's own processes (youki's intermediate process, the init
/// before the workload's exec) is said on stderr: youki reports it only through `tracing`, and
/// a sandbox that did not start used to say only "failed to prepare rootfs".
#[test]
fn the_libcontainer_backend_says_why_a_container_did_not_start() {
    if !support::root_or_skip("the libcontainer backend's errors") {
        return;
    }
    let t = Test::new();
    support::git_in(&t.proj(), &["init", "-q"]);
    let o = t.with(&["export", "bundle", "bundle"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let config = t.proj().join("bundle/config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    spec["mounts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "destination": "/mnt/gone", "source": "/nonexistent-aisb-source",
            "type": "bind", "options": ["rbind", "ro"]
        }));
    spec["process"]["args"] = serde_json::json!(["/bin/true"]);
    std::fs::write(&config, serde_json::to_vec(&spec).unwrap()).unwrap();
    let state = t.dir.path().join("lc-state");
    std::fs::create_dir_all(&state).unwrap();
    let (bundle, state) = (t.proj().join("bundle"), state);
    let o = t.with(&[
        "__libcontainer",
        bundle.to_str().unwrap(),
        state.to_str().unwrap(),
        "aisb-errors-test",
    ]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.lines().any(
            |l| l.starts_with("aisb: libcontainer: ") && l.contains("/nonexistent-aisb-source")
        ),
        "the reason (the mount's missing source) is not said:\n{}",
        o.stderr
    );
}

#[test]
fn unknown_profile_and_bad_usage() {
    let o = Test::new().args(&["plan", "--profile", "fixx"]).run();
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("unknown profile `fixx`") && o.stderr.contains("did you mean `fix`?"),
        "{}",
        o.stderr
    );
    let o = Test::new().args(&["plann"]).run();
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("unrecognized subcommand 'plann'"),
        "{}",
        o.stderr
    );
    let o = Test::new().args(&["--help"]).run();
    assert_eq!(o.code, 0);
    assert!(
        o.stdout.contains("Examples:") && o.stdout.contains("aisb export bundle"),
        "{}",
        o.stdout
    );
}

#[test]
fn presets_tasks_completions() {
    let o = Test::new().args(&["presets"]).run();
    assert_eq!(
        o.stdout,
        "profiles\nclaude\ncodex\naider\nopencode\ngemini\n"
    );
    let o = Test::new().args(&["presets", "claude"]).run();
    assert!(o.stdout.contains("mount \"~/.claude\" access=\"overlay\""));
    let o = Test::new()
        .file(
            "sandbox.kdl",
            "task \"test\" { run \"cargo test\"; profile \"investigate\" }\n",
        )
        .args(&["tasks", "--json"])
        .run();
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v[0]["name"], "test");
    assert_eq!(v[0]["profile"], "investigate");
    let o = Test::new().args(&["completions", "bash"]).run();
    assert!(o.stdout.contains("_aisb()"));
}

#[test]
fn dash_c_runs_as_if_started_there() {
    let t = Test::new().file("sandbox.kdl", "process { hostname \"from-c\" }\n");
    let out = Command::new(env!("CARGO_BIN_EXE_aisb"))
        .args(["-C", "proj", "plan", "--json"])
        .current_dir(t.dir.path())
        .env("HOME", t.dir.path().join("home"))
        .env("XDG_CACHE_HOME", t.dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["process"]["hostname"], "from-c");
}

#[test]
fn doctor_reports_checks_and_backends() {
    let o = Test::new().args(&["doctor", "--json"]).run();
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let names: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for n in [
        "user namespaces",
        "network namespaces",
        "overlayfs",
        "cgroups",
        "resource limits",
        "seccomp",
        "bwrap",
    ] {
        assert!(names.contains(&n), "{n} missing: {names:?}");
    }
    let backends: Vec<&str> = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(backends, ["bwrap", "libcontainer"]);
    let any_works = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["works"] == true);
    assert_eq!(o.code, if any_works { 0 } else { 1 });
}

#[test]
fn both_init_entry_points_harden_and_refuse_bad_usage() {
    for (exe, args) in [
        (env!("CARGO_BIN_EXE_aisb-init"), vec!["__init", "--"]),
        (env!("CARGO_BIN_EXE_aisb"), vec!["__init", "--"]),
    ] {
        let out = Command::new(exe)
            .args(&args)
            .args([
                "/bin/sh",
                "-c",
                "grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status; exit 3",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(3), "{exe}: {stdout}");
        assert!(
            stdout.contains("Seccomp:\t2") && stdout.contains("NoNewPrivs:\t1"),
            "{exe}: {stdout}"
        );
        assert!(
            stdout.contains("CapEff:\t0000000000000000"),
            "{exe}: {stdout}"
        );
        let bad = Command::new(exe)
            .args(["__init", "--bogus", "--", "true"])
            .output()
            .unwrap();
        assert_eq!(bad.status.code(), Some(125), "{exe}");
    }
}

/// Decoded files come from the cache on the second run; what the user sees is the same: the
/// plan, and errors found after decoding, located in the right file and line.
#[test]
fn decoded_config_cache_changes_nothing_visible() {
    let t = Test::new()
        .file(
            "sandbox.kdl",
            "import \"extra.kdl\"\nprofile \"p\" {\n    read-only\n}\ndefault-profile \"nope\"\n",
        )
        .file("extra.kdl", "block \"*.pem\"\n");
    let first = t.with(&["check", "--format", "short"]);
    let cache = t.dir.path().join("cache/aisb/kdl");
    let cached = std::fs::read_dir(&cache).map_or(0, |d| d.count());
    assert!(
        cached >= 3,
        "profiles preset, sandbox.kdl and extra.kdl cached: {cached}"
    );
    let second = t.with(&["check", "--format", "short"]);
    assert_eq!(first.code, 1);
    assert!(
        first.stdout.contains("sandbox.kdl:5:") && first.stdout.contains("unknown profile `nope`"),
        "{}",
        first.stdout
    );
    assert_eq!((first.stdout, first.stderr), (second.stdout, second.stderr));
    let uncached = t.with(&["--no-cache", "plan", "--json", "--profile", "p"]);
    let warm = t.with(&["plan", "--json", "--profile", "p"]);
    assert_eq!(uncached.code, 0, "{}", uncached.stderr);
    // The same plan, except whether the project scan came from its own cache.
    let without_scan_cache = |json: &str| {
        let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
        v["scan"]["cached"] = serde_json::Value::Null;
        v
    };
    assert_eq!(
        without_scan_cache(&uncached.stdout),
        without_scan_cache(&warm.stdout)
    );
    // An entry is named by the text: an edited file is decoded again.
    std::fs::write(t.proj().join("extra.kdl"), "block \"*.key\"\n").unwrap();
    std::fs::write(t.proj().join("a.key"), "k").unwrap();
    let edited = t.with(&["plan", "--json", "--profile", "p"]);
    assert!(
        edited.stdout.contains("block \\\"*.key\\\""),
        "{}",
        edited.stdout
    );
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), cached + 1);
}

/// clap's own consistency checks over every subcommand (duplicate short flags, …), which would
/// otherwise only fire when that subcommand is used.
#[test]
fn command_line_definition_is_consistent() {
    <aisb::cli::Cli as clap::CommandFactory>::command().debug_assert();
}

/// A sandbox.kdl that loosens the defaults runs only once trusted: refused without a
/// terminal (naming what it loosens), asked once on a terminal and pinned to the file's text,
/// asked again when the file changes; `--trust` runs it (CI).
#[test]
fn a_loosening_config_must_be_trusted() {
    let t = Test::new().file(
        "sandbox.kdl",
        "network {\n    allow \"api.example.com\"\n}\n",
    );
    let _ = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(t.proj())
        .status();
    let refused = t.with(&["run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(refused.code, 125);
    assert!(
        refused.stderr.contains("loosens the sandbox")
            && refused.stderr.contains("api.example.com"),
        "{}",
        refused.stderr
    );
    // Running a sandbox below needs root on this host.
    if !support::root_or_skip("the trusted half of this test") {
        return;
    }
    let trusted_once = t.with(&["--trust", "run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(trusted_once.code, 0, "{}", trusted_once.stderr);
    // On a terminal (`script` gives one), aisb asks; "y" pins this text.
    let cmd = format!(
        "{} run --backend bwrap -- echo ran",
        env!("CARGO_BIN_EXE_aisb")
    );
    let asked = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("echo y | script -qec '{cmd}' /dev/null"))
        .current_dir(t.proj())
        // A person at a terminal, not CI (which never asks; tests/ci.rs).
        .env_remove("CI")
        .env("HOME", t.dir.path().join("home"))
        .env("XDG_CACHE_HOME", t.dir.path().join("cache"))
        .output()
        .unwrap();
    let asked_out = String::from_utf8_lossy(&asked.stdout);
    assert!(
        asked_out.contains("Trust this configuration") && asked_out.contains("ran"),
        "{asked_out}"
    );
    let pinned = t.with(&["run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(
        pinned.code, 0,
        "trusted text runs without asking: {}",
        pinned.stderr
    );
    std::fs::write(
        t.proj().join("sandbox.kdl"),
        "network {\n    allow \"evil.example.com\"\n}\n",
    )
    .unwrap();
    let changed = t.with(&["run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(changed.code, 125, "a changed file asks again");
    assert!(
        changed.stderr.contains("evil.example.com"),
        "{}",
        changed.stderr
    );
}

/// Each kind of exposure a checked-in sandbox.kdl can add beyond what the mounts and the
/// network show is a loosening, refused without a terminal and named: a variable of the
/// caller's passed in (by name, by pattern, every one, secrets unfiltered, keys of a file), a
/// tool the agent may call without asking, and an image whose files come from outside the
/// project (another directory's Dockerfile, an OCI layout or archive elsewhere, named by
/// `rootfs`, an `image`'s `from` or the project Dockerfile's own FROM). What narrows runs.
#[test]
fn every_exposure_a_configuration_adds_must_be_trusted() {
    let cases: &[(&str, &str)] = &[
        ("env {\n    pass \"BUILD_ID\"\n}\n", "env pass \"BUILD_ID\""),
        ("env {\n    allow \"NPM_*\"\n}\n", "env allow \"NPM_*\""),
        ("env {\n    inherit \"all\"\n}\n", "env inherit \"all\""),
        (
            "env {\n    filter-secrets #false\n}\n",
            "env filter-secrets #false",
        ),
        (
            "env {\n    from-file \".env\" \"DB_URL\"\n}\n",
            "env from-file \".env\": DB_URL",
        ),
        (
            "tools {\n    allow \"Bash(*)\"\n}\n",
            "tools allow \"Bash(*)\"",
        ),
        (
            "limits {\n    memory \"unlimited\"\n}\n",
            "memory limit lifted",
        ),
        (
            "limits {\n    memory \"1T\"\n}\n",
            "memory limit raised to 1T",
        ),
        (
            "env {\n    set \"HARMLESS\" \"${PATH}\"\n}\n",
            "$PATH: the caller's value is written into the sandbox",
        ),
        ("tmpfs \"/scratch\" size=\"1T\"\n", "tmpfs /scratch of 1T"),
        (
            "rootfs dockerfile=\"Dockerfile.arg\"\n",
            "Dockerfile.arg's image is built from /srv/argued",
        ),
        (
            "rootfs dockerfile=\"../elsewhere/Dockerfile\"\n",
            "elsewhere/Dockerfile, outside the project",
        ),
        (
            "rootfs from=\"oci:/srv/layout:v1\"\n",
            "built from /srv/layout, outside the project",
        ),
        (
            "image \"x\" {\n    from \"oci-archive:../other.tar\"\n}\nrootfs image=\"x\"\n",
            "image \"x\" is built from",
        ),
        (
            "rootfs dockerfile=\"Dockerfile\"\n",
            "Dockerfile's image is built from /srv/other",
        ),
    ];
    for (text, named) in cases {
        let t = Test::new()
            .file("sandbox.kdl", text)
            .file(".env", "DB_URL=postgres://secret\n")
            .file("Dockerfile", "FROM oci:/srv/other\nRUN true\n")
            .file("Dockerfile.arg", "ARG B=oci:/srv/argued\nFROM $B\n");
        let refused = t.with(&["run", "--backend", "bwrap", "--", "true"]);
        assert_eq!(refused.code, 125, "{text}: {}", refused.stderr);
        // miette wraps long lines (at `/` too): compared without the frame and the spaces.
        let flat = |s: &str| s.replace(['│', ' ', '\n'], "");
        assert!(
            refused.stderr.contains("loosens the sandbox")
                && flat(&refused.stderr).contains(&flat(named)),
            "{text}: expected `{named}` in: {}",
            refused.stderr
        );
    }
    // The Dockerfile the image is built from is policy: read-only inside like sandbox.kdl.
    let t = Test::new()
        .file("sandbox.kdl", "rootfs dockerfile=\"Dockerfile\"\n")
        .file("Dockerfile", "FROM scratch\n");
    let plan = t.with(&["plan"]);
    assert!(
        plan.stdout.lines().any(|l| l.contains("/Dockerfile")
            && l.contains("protected: aisb builds the sandbox's image from it, read-only")),
        "{}",
        plan.stdout
    );
    // Narrowing asks nothing.
    let t = Test::new().file(
        "sandbox.kdl",
        "env {\n    deny \"LANG\"\n}\ntools {\n    deny \"WebFetch\"\n}\n",
    );
    let narrowed = t.with(&["run", "--backend", "bwrap", "--", "true"]);
    assert!(
        !narrowed.stderr.contains("loosens")
            && (narrowed.code == 0 || !support::root_or_skip("running the narrowed sandbox")),
        "{}",
        narrowed.stderr
    );
}

/// `aisb run TASK` runs the task's command with the task's own variables (not those aisb
/// sets itself) and in its own directory (they were parsed and never applied).
#[test]
fn a_task_runs_with_its_env_and_cwd() {
    if !support::root_or_skip("running a task") {
        return;
    }
    let t = Test::new()
        .file(
            "sandbox.kdl",
            "task \"t\" {\n    run \"sh\" \"-c\" \"echo V=$TASKVAR H=$HOME; pwd\"\n    env \"TASKVAR\" \"hello\"\n    env \"HOME\" \"/tmp/fake\"\n    cwd \"sub\"\n}\n",
        )
        .file("sub/README", "x\n");
    let o = t.with(&["run", "--backend", "bwrap", "t"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("V=hello H="), "{}", o.stdout);
    // What aisb sets itself stays aisb's.
    assert!(!o.stdout.contains("H=/tmp/fake"), "{}", o.stdout);
    assert!(
        o.stderr.contains("the task's `env \"HOME\"` is ignored"),
        "{}",
        o.stderr
    );
    assert!(o.stdout.trim_end().ends_with("/sub"), "{}", o.stdout);
}

#[test]
fn presets_list_and_show() {
    let t = Test::new();
    let list = t.with(&["presets"]);
    for p in ["claude", "codex", "aider", "opencode", "gemini"] {
        assert!(list.stdout.lines().any(|l| l == p), "{}", list.stdout);
    }
    let shown = t.with(&["presets", "show", "claude"]);
    assert_eq!(shown.code, 0);
    assert!(
        shown
            .stdout
            .contains("mount \"~/.claude\" access=\"overlay\""),
        "{}",
        shown.stdout
    );
    assert_eq!(t.with(&["presets", "claude"]).stdout, shown.stdout);
    let unknown = t.with(&["presets", "show", "claud"]);
    assert_eq!(unknown.code, 1);
    assert!(
        unknown.stderr.contains("did you mean `claude`"),
        "{}",
        unknown.stderr
    );
}

/// With no sandbox.kdl, an agent's command brings its preset (`aisb up -- claude`): its
/// config dir copy-on-write and its API through the proxy; any other command does not.
#[test]
fn no_config_agent_command_brings_its_preset() {
    let t = Test::new();
    std::fs::create_dir_all(t.dir.path().join("home/.claude")).unwrap();
    let spec = |cmd: &[&str]| {
        let mut args = vec!["spec", "--"];
        args.extend_from_slice(cmd);
        let o = t.with(&args);
        assert_eq!(o.code, 0, "{}", o.stderr);
        serde_json::from_str::<serde_json::Value>(&o.stdout).unwrap()
    };
    let has = |s: &serde_json::Value, dest: &str| {
        s["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"].as_str().unwrap().ends_with(dest))
    };
    let env = |s: &serde_json::Value, name: &str| {
        s["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().unwrap().starts_with(&format!("{name}=")))
    };
    let claude = spec(&["/usr/bin/claude", "--version"]);
    assert!(has(&claude, "/.claude"), "{claude}");
    assert!(env(&claude, "HTTPS_PROXY"), "{claude}");
    let other = spec(&["sh", "-c", "true"]);
    assert!(!has(&other, "/.claude"));
    assert!(!env(&other, "HTTPS_PROXY"));
}

/// aisb's cache and configuration directories (private copies of host config, overlay upper
/// dirs, audit logs, trust pins) are 0700, created so or tightened.
#[test]
fn aisb_directories_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let t = Test::new().args(&["plan"]);
    let cache = t.dir.path().join("cache/aisb");
    let config = t.dir.path().join("home/.config/aisb");
    for dir in [&cache, &config] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let o = t.run();
    assert_eq!(o.code, 0, "{}", o.stderr);
    for dir in [&cache, &config] {
        let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
    // A link there is refused, not followed.
    std::fs::remove_dir_all(&cache).unwrap();
    std::os::unix::fs::symlink(t.dir.path(), &cache).unwrap();
    let o = t.run();
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("is not a directory (a symbolic link?)"),
        "{}",
        o.stderr
    );
}

/// Issue 23: `aisb plan` shows the tool rules with their places, then each agent preset's own
/// names for them and how that agent is held to them; `--json` has the same lists.
#[test]
fn plan_shows_the_tool_policy_per_agent() {
    let t = Test::new().file(
        "sandbox.kdl",
        "import \"preset:claude\"\nimport \"preset:gemini\"\ntools {\n    deny \"Write\" \"Bash(git push:*)\"\n}\n",
    );
    let o = t.with(&["plan"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let section: Vec<&str> = o
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("tools "))
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(
        section,
        [
            "tools (`tools { allow …; deny … }`, per agent preset)",
            "  deny   Write                          [sandbox.kdl:4]",
            "  deny   Bash(git push:*)               [sandbox.kdl:4]",
            "  allow  (no list: every tool not denied)",
            "  claude:",
            "    deny   Write Bash(git push:*)",
            "    by     managed settings: allow rules, and aisb's PreToolUse hook refusing and logging the denials (--dangerously-skip-permissions too)",
            "  gemini:",
            "    deny   write_file run_shell_command(git push:*)",
            "    by     system settings tools.exclude/core + aisb's BeforeTool hook (refuses and logs, --yolo too)",
        ],
        "{}",
        o.stdout
    );
    let o = t.with(&["plan", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(
        v["tools"],
        serde_json::json!({
            "allow": [],
            "deny": [
                {"rule": "Write", "at": "sandbox.kdl:4"},
                {"rule": "Bash(git push:*)", "at": "sandbox.kdl:4"},
            ],
            "agents": ["claude", "gemini"],
        })
    );
}

/// Issue 29: a sandbox that writes policy gets nothing from it. The attack's configuration —
/// unmasking `.env`, turning the built-in secrets layer off, moving the project root up — as
/// a `sub/sandbox.kdl` planted inside (found by a later `cd sub; aisb run`): without a
/// terminal it is refused, each exposure named with where it was written. Once approved (on a
/// terminal: `--trust` here), moving its lines or narrowing it asks nothing; exposing one more
/// thing asks again, naming only that. A project root may not hold the home.
#[test]
fn self_written_policy_is_refused_until_approved() {
    let planted = "project \"..\"\nallow \".env\"\nsecrets {\n    defaults #false\n}\n";
    let t = Test::new()
        .file(".env", "TOKEN=1\n")
        .file("sub/sandbox.kdl", planted);
    // `sub` is a repository of its own: the root moves above its top level.
    let _ = Command::new("git")
        .args(["init", "-q"])
        .current_dir(t.proj().join("sub"))
        .status();
    let in_sub = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_aisb"))
            .args(args)
            .current_dir(t.proj().join("sub"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", t.dir.path().join("home"))
            .env("XDG_CACHE_HOME", t.dir.path().join("cache"))
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = in_sub(&["run", "--backend", "bwrap", "--", "cat", "../.env"]);
    assert_eq!(code, 125, "{err}");
    for needle in [
        "allow \".env\": what it matches is not masked (at sandbox.kdl:2)",
        "secrets { defaults #false }",
        "beyond the configuration's own",
    ] {
        assert!(err.contains(needle), "no `{needle}` in:\n{err}");
    }
    // `--trust` runs it once and records nothing; `aisb trust`, outside, approves it.
    if !support::root_or_skip("the approved half of this test") {
        return;
    }
    let (code, err) = in_sub(&["--trust", "run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(code, 0, "{err}");
    let (code, err) = in_sub(&["run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(code, 125, "--trust recorded nothing: {err}");
    let (code, err) = in_sub(&["trust"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("allow \".env\""), "{err}");
    let (code, err) = in_sub(&["run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(code, 0, "approved: {err}");
    // Lines moved, and a narrowing added: nothing new exposed, nothing asked.
    std::fs::write(
        t.proj().join("sub/sandbox.kdl"),
        format!("block \"notes.txt\"\n\n{planted}"),
    )
    .unwrap();
    let (code, err) = in_sub(&["run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(code, 0, "moved lines ask nothing: {err}");
    // One more exposure: asked again, and only it is listed.
    std::fs::write(
        t.proj().join("sub/sandbox.kdl"),
        format!("{planted}allow \"*.key\"\n"),
    )
    .unwrap();
    let (code, err) = in_sub(&["run", "--backend", "bwrap", "--", "true"]);
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("allow \"*.key\""), "{err}");
    assert!(!err.contains("allow \".env\""), "only what is new: {err}");
}

/// A project root that holds the home (or is a system directory) is refused outright.
#[test]
fn a_project_root_never_holds_the_home() {
    let t = Test::new().file("sandbox.kdl", "project \"..\"\n");
    let o = t.with(&["--trust", "plan"]);
    assert_ne!(o.code, 0, "{}", o.stdout);
    assert!(o.stderr.contains("holds your home"), "{}", o.stderr);
}

/// Issue 29: a checked-in sandbox.kdl cannot write structure into what aisb generates from
/// it. A newline in a mount target (which `aisb export k8s` quoted into YAML as a second,
/// attacker-written object) or an escape in a task's description is refused at decode, with
/// the span; a command's argument and an environment value may still span lines. `export`
/// asks for trust like `run`.
#[test]
fn control_characters_in_names_and_paths_are_refused_and_export_checks_trust() {
    let t = Test::new().file(
        "sandbox.kdl",
        "mount \"/opt/data\" \"/data\\n---\\napiVersion: v1\\nkind: Pod\"\n",
    );
    let o = t.with(&["check"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("control character"), "{}", o.stderr);
    assert!(o.stderr.contains("sandbox.kdl:1"), "{}", o.stderr);
    let o = t.with(&[
        "export",
        "k8s",
        "--image",
        &format!("r@sha256:{}", "a".repeat(64)),
    ]);
    assert_ne!(o.code, 0);
    assert!(!o.stdout.contains("kind: Pod"), "{}", o.stdout);
    let t = Test::new().file(
        "sandbox.kdl",
        "task \"build\" description=\"ok\\u{1b}]52;c;Y2xpcA==\\u{7}\" {\n    run \"make\"\n}\n",
    );
    let o = t.with(&["check"]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("control character"), "{}", o.stderr);
    let t = Test::new().file(
        "sandbox.kdl",
        "env {\n    set \"CERT\" \"line one\\nline two\"\n}\ntask \"t\" {\n    run \"sh\" \"-c\" \"echo a\\necho b\"\n}\n",
    );
    let o = t.with(&["check"]);
    assert_eq!(
        o.code, 0,
        "values and commands may span lines: {}",
        o.stderr
    );
    // A loosening configuration is exported only once trusted.
    let t = Test::new().file(
        "sandbox.kdl",
        "network {\n    allow \"api.example.com\"\n}\n",
    );
    let bundle = t.dir.path().join("bundle");
    let bundle = bundle.to_str().unwrap();
    let o = t.with(&["export", "bundle", bundle]);
    assert_eq!(o.code, 125, "{}\n{}", o.stdout, o.stderr);
    assert!(o.stderr.contains("loosens the sandbox"), "{}", o.stderr);
    let o = t.with(&["--trust", "export", "bundle", bundle]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

/// `aisb why` names the rule that decides, where it is written, and what would change it: for
/// paths (a built-in secret pattern, a `block` line, a file inside a gitignored directory, a
/// build output, a protected file, one not there yet, the project, /etc outside its snapshot),
/// domains (allowed and denied by a line, refused by the allowlist), variables (passed, set,
/// held back as a secret) and tool calls.
#[test]
fn why_names_the_rule_where_it_is_written_and_what_changes_it() {
    let t = Test::new()
        .file(
            "sandbox.kdl",
            "block \"notes.txt\"\nnetwork {\n    allow \"example.com\"\n    deny \"bad.example.com\"\n}\nenv {\n    set \"BAR\" \"1\"\n}\ntools {\n    deny \"Bash(git push:*)\"\n}\n",
        )
        .file("notes.txt", "n\n")
        .file(".env", "K=1\n")
        .file(".gitignore", "out/\nprivate/\n")
        .file("out/report.txt", "r\n")
        .file("private/notes.txt", "p\n")
        .file("src/main.rs", "fn main() {}\n");
    support::git_in(&t.proj(), &["init", "-q"]);
    let why = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["--trust", "why", "--json"];
        all.extend_from_slice(args);
        let o = t.with(&all);
        assert_eq!(o.code, 0, "{args:?}: {}", o.stderr);
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}\n{}", o.stdout))
    };
    let check = |args: &[&str], decision: &str, rule: &str, from: &str| {
        let v = why(args);
        assert_eq!(v["decision"], decision, "{args:?}: {v}");
        assert!(
            v["rule"].as_str().unwrap().contains(rule),
            "{args:?}: rule {v}"
        );
        assert!(
            v["from"].as_str().unwrap().contains(from),
            "{args:?}: from {v}"
        );
        v
    };
    let v = check(
        &[".env"],
        "masked",
        "sensitive \".env\"",
        "built-in secret patterns",
    );
    assert!(
        v["change"].as_str().unwrap().contains("allow \".env\""),
        "{v}"
    );
    check(
        &["notes.txt"],
        "masked",
        "block \"notes.txt\"",
        "sandbox.kdl:1",
    );
    let v = check(
        &["private/notes.txt"],
        "masked",
        "gitignored",
        "git ignores it",
    );
    assert!(v["notes"].to_string().contains("masked as a whole"), "{v}");
    check(
        &["sandbox.kdl"],
        "read-only",
        "aisb's policy",
        "eval::protect",
    );
    // A build output git ignores is the project's, written copy-on-write.
    check(
        &["out/report.txt"],
        "copy-on-write",
        "dependency dir out/",
        "aisb's plan",
    );
    check(&["sub/.envrc"], "moved-aside", "direnv", "eval::protect");
    check(&[".env.production"], "masked", ".env", "built-in");
    check(&["src/main.rs"], "writable", "[project]", "aisb's plan");
    check(
        &["/etc/shadow"],
        "not-visible",
        "/etc entries",
        "only the project",
    );
    check(
        &["example.com"],
        "allowed",
        "allow \"example.com\"",
        "sandbox.kdl:3",
    );
    check(
        &["bad.example.com"],
        "refused",
        "deny \"bad.example.com\"",
        "sandbox.kdl:4",
    );
    let v = check(
        &["evil.example.org"],
        "refused",
        "not in the allowlist",
        "allowlist",
    );
    assert!(
        v["change"].as_str().unwrap().contains("evil.example.org"),
        "{v}"
    );
    check(
        &["--as", "domain", "notes.txt"],
        "refused",
        "not in the allowlist",
        "allowlist",
    );
    let v = check(&["GITHUB_TOKEN"], "dropped", "secret", "environment filter");
    assert!(
        v["change"]
            .as_str()
            .unwrap()
            .contains("pass \"GITHUB_TOKEN\""),
        "{v}"
    );
    check(&["BAR"], "passed", "env set", "sandbox.kdl:7");
    check(
        &["Bash(git push origin main)"],
        "refused",
        "git push",
        "sandbox.kdl:10",
    );
    check(&["Bash(ls)"], "allowed", "no rule denies it", "none match");
    // Never a value: the token's is in the caller's environment only.
    let o = t.with(&["--trust", "why", "GITHUB_TOKEN"]);
    assert!(!o.stdout.contains("ghp_secret_value"), "{}", o.stdout);
    assert!(
        o.stdout.contains("dropped: looks like a secret"),
        "{}",
        o.stdout
    );
}

/// `aisb suggest` turns the last run's network refusals into a diff of sandbox.kdl, each line
/// with its reason, applied by nobody: the file is unchanged, and once the user applies it
/// the next run asks like any loosening.
#[test]
fn suggest_proposes_the_lines_the_last_runs_refusals_call_for() {
    if !support::root_or_skip("suggest (a sandbox with a network)") {
        return;
    }
    let config = "network {\n    allow \"allowed.test\"\n}\n";
    let t = Test::new().file("sandbox.kdl", config);
    support::git_in(&t.proj(), &["init", "-q"]);
    let o = t.with(&["suggest"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("no audit log yet"), "{}", o.stderr);
    let o = t.with(&[
        "--trust",
        "run",
        "--backend",
        "bwrap",
        "--",
        "sh",
        "-c",
        "curl -s -m 10 -o /dev/null https://registry.test/x; curl -s -m 10 -o /dev/null https://registry.test/y; curl -s -m 10 -o /dev/null http://other.test:8080/; true",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = t.with(&["suggest"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        o.stdout,
        "--- a/sandbox.kdl\n+++ b/sandbox.kdl\n@@ -1,3 +1,5 @@\n network {\n+    allow \"other.test:8080\" // refused 1 time (not in the allowlist)\n+    allow \"registry.test\" // refused 2 times (not in the allowlist)\n     allow \"allowed.test\"\n }\n",
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("proposed, not applied"), "{}", o.stderr);
    assert_eq!(
        std::fs::read_to_string(t.proj().join("sandbox.kdl")).unwrap(),
        config
    );
    let v: serde_json::Value =
        serde_json::from_str(&t.with(&["suggest", "--json"]).stdout).unwrap();
    assert_eq!(v["proposals"][1]["count"], 2, "{v}");
    // Applied by the user: the next run refuses without a terminal until it is approved.
    let applied = "network {\n    allow \"other.test:8080\"\n    allow \"registry.test\"\n    allow \"allowed.test\"\n}\n";
    std::fs::write(t.proj().join("sandbox.kdl"), applied).unwrap();
    let o = t.with(&["run", "--backend", "bwrap", "--", "true"]);
    assert_ne!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("registry.test"), "{}", o.stderr);
}

/// A workload whose output the caller sends to /dev/null (`aisb run … > /dev/null`, as CI and
/// task runners do) still writes it, on both backends: youki's init reopened the host's
/// /dev/null read-only, and `echo` failed with EBADF under libcontainer.
#[test]
fn output_sent_to_dev_null_can_be_written() {
    if !support::root_or_skip("output to /dev/null on both backends") {
        return;
    }
    let t = Test::new();
    for backend in ["bwrap", "libcontainer"] {
        let null = || {
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .unwrap()
        };
        let status = Command::new(env!("CARGO_BIN_EXE_aisb"))
            .args(["run", "--backend", backend, "--", "sh", "-c"])
            .arg("echo out && echo err >&2")
            .current_dir(t.proj())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .env("HOME", t.dir.path().join("home"))
            .env("XDG_CACHE_HOME", t.dir.path().join("cache"))
            .stdin(std::process::Stdio::null())
            .stdout(null())
            .stderr(null())
            .status()
            .unwrap();
        assert_eq!(
            status.code(),
            Some(0),
            "[{backend}] writing to /dev/null failed"
        );
    }
}
