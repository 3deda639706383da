//! Shared helpers: a fake host, a temp project, evaluation of a text, diagnostic rendering.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use aisb::config::Errors;
use aisb::eval::{self, EvalError, Host, Loaded, Plan, Request, Root};
use miette::{GraphicalReportHandler, GraphicalTheme};

pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home/dev")).unwrap();
        std::fs::create_dir_all(dir.path().join("proj")).unwrap();
        Fixture { dir }
    }
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    pub fn project(&self) -> PathBuf {
        self.dir.path().join("proj").canonicalize().unwrap()
    }
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home/dev").canonicalize().unwrap()
    }
    pub fn write(&self, rel: &str, content: &str) {
        let p = self.project().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    pub fn host(&self) -> Host {
        let mut env = BTreeMap::new();
        for (k, v) in [
            ("PATH", "/usr/bin:/bin"),
            ("TERM", "xterm"),
            ("OPENAI_API_KEY", "sk-secret"),
            ("ANTHROPIC_API_KEY", "sk-ant"),
            ("AWS_SECRET_ACCESS_KEY", "aws"),
            ("NODE_ENV", "test"),
            ("MY_VAR", "1"),
        ] {
            env.insert(k.to_string(), v.to_string());
        }
        env.insert("HOME".into(), self.home().to_string_lossy().into_owned());
        env.insert(
            "XDG_CACHE_HOME".into(),
            self.root().join("cache").to_string_lossy().into_owned(),
        );
        Host {
            env,
            cwd: self.project(),
            uid: 1000,
            gid: 1000,
            user: "dev".into(),
            home: self.home(),
            agent_policies: aisb::eval::agents::host_policies(),
            system: aisb::graph::system::system_paths(&self.root().join("cache/aisb/store")),
        }
    }
    pub fn git(&self, args: &[&str]) {
        git_in(&self.project(), args);
    }
    /// Load `text` as `proj/sandbox.kdl` (not written to disk).
    pub fn load(&self, text: &str) -> (Loaded, Errors) {
        let mut errors = Errors::default();
        let loaded = eval::load(
            Root::Text {
                path: self.project().join("sandbox.kdl"),
                text: text.into(),
            },
            &mut errors,
        )
        .unwrap();
        (loaded, errors)
    }
    pub fn eval(&self, text: &str, profile: Option<&str>) -> Result<Plan, String> {
        let (loaded, errors) = self.load(text);
        if let Err(e) = errors.into_result() {
            return Err(render(&e));
        }
        let req = Request {
            profile: profile.map(str::to_string),
            use_cache: false,
            ..Default::default()
        };
        eval::evaluate(&loaded, &self.host(), &req).map_err(|e| match e {
            EvalError::Config(c) => render(&c),
            other => render(&other),
        })
    }
    pub fn plan(&self, text: &str, profile: Option<&str>) -> Plan {
        self.eval(text, profile)
            .unwrap_or_else(|e| panic!("evaluation failed:\n{e}"))
    }
}

/// `git add -A` and a commit of everything in `dir`, as a test author.
pub fn commit_all(dir: &Path, message: &str) {
    git_in(dir, &["add", "-A"]);
    git_in(
        dir,
        &[
            "-c",
            "user.email=t@t",
            "-c",
            "user.name=t",
            "commit",
            "-qm",
            message,
        ],
    );
}

pub fn git_in(dir: &Path, args: &[&str]) {
    let st = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        st.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&st.stderr)
    );
}

/// Render a diagnostic exactly as a terminal without colours would see it.
pub fn render(d: &dyn miette::Diagnostic) -> String {
    let mut out = String::new();
    GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
        .with_width(100)
        .with_links(false)
        .render_report(&mut out, d)
        .unwrap();
    out
}

/// Whether the root-only suites can run here; otherwise prints why `suite` is skipped.
/// Under CI (`CI` set) a missing root is a failure, never a skip.
pub fn root_or_skip(suite: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        if std::env::var_os("CI").is_some() {
            panic!("{suite} needs root, and CI must run it: run the tests as root");
        }
        eprintln!("SKIPPED: {suite} needs root on this host (CI runs as root)");
        return false;
    }
    true
}

/// Whether `tool` runs here; otherwise prints why `what` is skipped. Under CI a missing tool
/// is a failure: scripts/setup-tests.sh installs every tool the tests use.
pub fn tool_or_skip(tool: &str, what: &str) -> bool {
    if Command::new(tool).arg("--version").output().is_ok() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{what} needs `{tool}`, which scripts/setup-tests.sh installs: it is missing");
    }
    eprintln!("SKIPPED: {what} needs `{tool}` (scripts/setup-tests.sh installs it)");
    false
}

const TEST_USER: &str = "aisb-test";

/// An unprivileged account to run the suite as (created once, as root), given what the
/// rootless libcontainer backend needs by the one-time root step a user would run:
/// `aisb setup-user` (subordinate ids; a delegated cgroup on cgroup v1 hosts).
pub fn test_user() -> (u32, u32) {
    static USER: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *USER.get_or_init(|| {
        let user = create_test_user();
        let out = Command::new(env!("CARGO_BIN_EXE_aisb"))
            .args(["setup-user", TEST_USER])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "aisb setup-user: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        user
    })
}

fn create_test_user() -> (u32, u32) {
    create_user(TEST_USER)
}

/// A system account `name` (no home, no login), created once, as root: (uid, gid).
#[allow(dead_code)]
pub fn create_user(name: &str) -> (u32, u32) {
    if nix::unistd::User::from_name(name).ok().flatten().is_none() {
        let out = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .output()
            .unwrap();
        // A concurrent test may have created it first.
        assert!(
            out.status.success() || nix::unistd::User::from_name(name).ok().flatten().is_some(),
            "useradd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let u = nix::unistd::User::from_name(name).unwrap().unwrap();
    (u.uid.as_raw(), u.gid.as_raw())
}

/// A finished command's output, with `key=value` lines on stdout read as probe results.
pub struct Out {
    pub stdout: String,
    pub stderr: String,
    pub code: i32,
}

impl From<std::process::Output> for Out {
    fn from(out: std::process::Output) -> Out {
        Out {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            code: out.status.code().unwrap_or(-1),
        }
    }
}

impl Out {
    pub fn value(&self, key: &str) -> Option<&str> {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
    }
    /// The attempt `key` ran and failed (a status other than 0). A missing line fails too: an
    /// attempt that never ran proves nothing.
    pub fn expect_failed(&self, key: &str, what: &str) {
        match self.value(key) {
            Some(v) if v != "0" => {}
            got => panic!(
                "check `{key}` ({what}): expected a failure, got {got:?}\nstdout:\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            ),
        }
    }
    pub fn expect(&self, key: &str, want: &str) {
        assert_eq!(
            self.value(key),
            Some(want),
            "check `{key}`\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
    }
}

/// Hand a fixture tree to an ordinary user: their own copy of aisb and aisb-init in
/// `root/bin` (the build tree may not be reachable for them), every file theirs, `root` 0755.
/// Returns the aisb they run.
pub fn hand_to_user(root: &Path, uid: u32, gid: u32) -> std::path::PathBuf {
    let exe = root.join("bin/aisb");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_aisb"), &exe).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_aisb-init"),
        exe.with_file_name("aisb-init"),
    )
    .unwrap();
    chown_r(root, uid, gid);
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    exe
}

/// `chown -R uid:gid path`.
pub fn chown_r(path: &Path, uid: u32, gid: u32) {
    let ok = Command::new("chown")
        .args(["-R", &format!("{uid}:{gid}")])
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "chown -R {uid}:{gid} {}", path.display());
}
