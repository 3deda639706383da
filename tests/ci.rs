//! CI: the recipes in ci-examples/ are parsed and their steps run in order, locally, on a
//! scratch project (as the CI service would: `CI` set, a fresh checkout, each step a shell);
//! `aisb check --format github`, CI mode's refusal of an untrusted loosening, and
//! `--strict-audit` failing a run whose sandbox refused a network request.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_aisb"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A scratch checkout: a git repository with `sandbox.kdl`, a home and a cache of its own.
struct Checkout {
    dir: tempfile::TempDir,
}

impl Checkout {
    fn new(kdl: &str) -> Checkout {
        let dir = tempfile::tempdir().unwrap();
        for d in ["proj", "home"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        support::git_in(&dir.path().join("proj"), &["init", "-q"]);
        std::fs::write(dir.path().join("proj/sandbox.kdl"), kdl).unwrap();
        Checkout { dir }
    }
    fn proj(&self) -> PathBuf {
        self.dir.path().join("proj")
    }
    /// A command as a CI job sees it: `CI` set, aisb on PATH, nothing else of ours.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.current_dir(self.proj())
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/local/bin:/usr/bin:/bin", bin_dir().display()),
            )
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("CI", "true")
            .stdin(Stdio::null());
        c
    }
    fn aisb(&self, args: &[&str]) -> Output {
        let mut c = self.command(env!("CARGO_BIN_EXE_aisb"));
        c.args(args);
        c.output().unwrap()
    }
}

/// One step of a recipe: its shell text, its own env, and whether it runs after a failure.
struct Step {
    name: String,
    run: String,
    env: Vec<(String, String)>,
    always: bool,
}

fn yaml(file: &str) -> serde_yaml::Value {
    let text = std::fs::read_to_string(repo().join("ci-examples").join(file)).unwrap();
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("ci-examples/{file}: {e}"))
}

fn env_of(v: &serde_yaml::Value) -> Vec<(String, String)> {
    v.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.as_str().unwrap().to_string(),
                        v.as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn github_steps() -> Vec<Step> {
    let doc = yaml("github-actions.yml");
    let jobs = doc["jobs"].as_mapping().expect("jobs");
    assert_eq!(jobs.len(), 1, "one job");
    let job = jobs.values().next().unwrap();
    let mut steps = Vec::new();
    for (i, s) in job["steps"]
        .as_sequence()
        .expect("steps")
        .iter()
        .enumerate()
    {
        // `uses:` steps are the service's own actions (checkout, artifacts): the test does
        // their part itself.
        let Some(run) = s["run"].as_str() else {
            assert!(s["uses"].is_string(), "step {i} has neither run nor uses");
            continue;
        };
        steps.push(Step {
            name: s["name"].as_str().unwrap_or(run).to_string(),
            run: run.to_string(),
            env: env_of(&s["env"]),
            always: s["if"].as_str() == Some("always()"),
        });
    }
    steps
}

fn gitlab_steps() -> Vec<Step> {
    let doc = yaml("gitlab-ci.yml");
    let job = &doc["sandbox"];
    let env = env_of(&job["variables"]);
    let mut steps = Vec::new();
    for (key, always) in [
        ("before_script", false),
        ("script", false),
        ("after_script", true),
    ] {
        for line in job[key].as_sequence().expect(key) {
            let run = line.as_str().unwrap().to_string();
            steps.push(Step {
                name: format!("{key}: {run}"),
                run,
                env: env.clone(),
                always,
            });
        }
    }
    steps
}

/// Run `steps` in order as the service would (bash -e per step; after a failure only the
/// `always` ones); returns each step's name, exit code and output.
fn run_steps(
    c: &Checkout,
    steps: &[Step],
    extra_env: &[(&str, &str)],
) -> Vec<(String, i32, String)> {
    let mut failed = false;
    let mut out = Vec::new();
    for s in steps {
        if failed && !s.always {
            continue;
        }
        let mut cmd = c.command("bash");
        cmd.args(["-e", "-o", "pipefail", "-c", &s.run]);
        for (k, v) in &s.env {
            cmd.env(k, v);
        }
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let o = cmd.output().unwrap();
        let code = o.status.code().unwrap_or(-1);
        failed |= code != 0;
        out.push((
            s.name.clone(),
            code,
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ));
    }
    out
}

const GOOD: &str = "task \"test\" {\n    run \"sh\" \"-c\" \"echo tests ran in the sandbox\"\n}\n";
const BROKEN: &str = "task \"test\" {\n    run \"true\"\n}\nnetwrok \"none\"\n";

fn recipe(steps: Vec<Step>, extra: &[(&str, &str)]) {
    assert!(steps.len() >= 3, "the recipe has its steps");
    let c = Checkout::new(GOOD);
    let ran = run_steps(&c, &steps, extra);
    for (name, code, out) in &ran {
        assert_eq!(*code, 0, "step `{name}` failed:\n{out}");
    }
    let all: String = ran.iter().map(|r| r.2.as_str()).collect();
    assert!(all.contains("tests ran in the sandbox"), "{all}");
    // The run's JSON summary (CI mode) and the audit log the recipe keeps.
    assert!(all.contains("\"exit_code\":0"), "{all}");
    let audit = std::fs::read_to_string(c.proj().join("aisb-audit.jsonl")).unwrap();
    assert!(audit.contains("\"event\":\"start\""), "{audit}");

    // A broken sandbox.kdl stops the job at the check, with the error on its line.
    let c = Checkout::new(BROKEN);
    let ran = run_steps(&c, &steps, extra);
    let check = ran
        .iter()
        .find(|r| r.0.contains("check") || r.0.contains("Check"))
        .unwrap();
    assert_ne!(check.1, 0, "the check step must fail:\n{}", check.2);
    assert!(
        !ran.iter().any(|r| r.2.contains("tests ran")),
        "nothing runs after a failed check"
    );
    let all: String = ran.iter().map(|r| r.2.as_str()).collect();
    assert!(all.contains("netwrok"), "{all}");
}

#[test]
fn github_actions_recipe_runs_in_order() {
    if !support::root_or_skip("the CI recipes (they run a sandbox)") {
        return;
    }
    let steps = github_steps();
    recipe(steps, &[("GITHUB_ACTIONS", "true")]);
}

#[test]
fn gitlab_recipe_runs_in_order() {
    if !support::root_or_skip("the CI recipes (they run a sandbox)") {
        return;
    }
    recipe(gitlab_steps(), &[("GITLAB_CI", "true")]);
}

#[test]
fn check_format_github_annotates_the_line() {
    let c = Checkout::new(BROKEN);
    let o = c.aisb(&["check", "--format", "github"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().next().unwrap();
    assert!(
        line.starts_with("::error file=sandbox.kdl,line=4,col=1,endLine=4,endColumn=8,title=aisb check::unknown node `netwrok`"),
        "{out}"
    );
    // The help is in the message, on an escaped new line: still one workflow command.
    assert!(line.contains("%0Ahelp: "), "{out}");
    assert_eq!(out.lines().count(), 1, "{out}");
}

#[test]
fn check_format_json_lists_every_error() {
    let c = Checkout::new("netwrok \"none\"\nlimits {\n    pids \"many\"\n}\n");
    let o = c.aisb(&["check", "--format", "json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let list = v.as_array().unwrap();
    assert_eq!(list.len(), 2, "{v}");
    assert_eq!(list[0]["line"], 1);
    assert_eq!(list[1]["line"], 3);
    assert!(list[0]["help"].as_str().unwrap().contains("network"), "{v}");
}

const BLOCKING: &str = "network {\n    allow \"good.test\"\n}\ntask \"fetch\" {\n    run \"sh\" \"-c\" \"curl -s -m 10 -o /dev/null http://evil.test/; echo fetched\"\n}\n";

#[test]
fn ci_mode_refuses_an_untrusted_loosening_with_the_list() {
    if !support::root_or_skip("CI mode (it would run a sandbox)") {
        return;
    }
    let c = Checkout::new(BLOCKING);
    let o = c.aisb(&["run", "fetch"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("loosens the sandbox"), "{err}");
    assert!(err.contains("good.test"), "{err}");
    assert!(!err.contains("fetched"), "{err}");
}

#[test]
fn strict_audit_fails_a_run_whose_network_request_was_blocked() {
    if !support::root_or_skip("--strict-audit (it runs a sandbox)")
        || !support::tool_or_skip("curl", "--strict-audit")
    {
        return;
    }
    for backend in ["libcontainer", "bwrap"] {
        let c = Checkout::new(BLOCKING);
        // Without --strict-audit the command's own exit code (curl's failure is swallowed).
        let o = c.aisb(&["--trust", "run", "--backend", backend, "fetch"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "[{backend}] {err}");
        let summary: serde_json::Value = serde_json::from_str(
            err.lines()
                .rev()
                .find(|l| l.starts_with('{'))
                .expect("JSON summary"),
        )
        .unwrap();
        assert_eq!(summary["exit_code"], 0);
        assert!(
            summary["blocked"][0]
                .as_str()
                .unwrap()
                .starts_with("evil.test:80"),
            "{summary}"
        );

        let o = c.aisb(&[
            "--trust",
            "run",
            "--backend",
            backend,
            "--strict-audit",
            "fetch",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "[{backend}] {err}");
        assert!(
            err.contains("refused 1 network request"),
            "[{backend}] {err}"
        );
        assert!(err.contains("evil.test:80"), "[{backend}] {err}");
        assert!(String::from_utf8_lossy(&o.stdout).contains("fetched"));
    }
}

#[test]
fn strict_audit_passes_a_run_that_reached_nothing_refused() {
    if !support::root_or_skip("--strict-audit (it runs a sandbox)") {
        return;
    }
    for backend in ["libcontainer", "bwrap"] {
        let c = Checkout::new(GOOD);
        let o = c.aisb(&["run", "--backend", backend, "--strict-audit", "test"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "[{backend}] {err}");
        assert!(err.contains("\"blocked\":[]"), "[{backend}] {err}");
    }
}

#[test]
fn ci_mode_runs_an_image_only_as_sandbox_lock_pins_it() {
    let c = Checkout::new("rootfs dockerfile=\"Dockerfile\"\n");
    std::fs::write(c.proj().join("Dockerfile"), "FROM scratch\n").unwrap();
    let o = c.aisb(&["run", "--", "true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("--locked"), "{err}");
    assert!(err.contains("has no entry for image"), "{err}");
    assert!(err.contains("run `aisb build`"), "{err}");
}
