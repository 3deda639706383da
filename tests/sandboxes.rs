//! Named sandboxes: a shared clone at the repository's own path, commits synced to the host as
//! `sandbox-NAME/<branch>` (live, while the session runs), host branches never moved, a
//! second session joining the running sandbox, and `aisb ls` / `rm` / `gc`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::Out;

struct Repo {
    dir: tempfile::TempDir,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let r = Repo { dir };
        std::fs::create_dir_all(r.path().join("home")).unwrap();
        std::fs::create_dir_all(r.repo()).unwrap();
        r.git(&["init", "-q", "-b", "main"]);
        std::fs::write(r.repo().join("README"), "hello\n").unwrap();
        std::fs::write(r.repo().join(".gitignore"), "*.log\n").unwrap();
        std::fs::write(r.repo().join("debug.log"), "ignored\n").unwrap();
        std::fs::write(r.repo().join(".env"), "API_KEY=1\n").unwrap();
        r.git(&["add", "README", ".gitignore", ".env"]);
        r.git(&["commit", "-qm", "one"]);
        r
    }
    fn path(&self) -> &Path {
        self.dir.path()
    }
    fn repo(&self) -> PathBuf {
        self.path().join("repo")
    }
    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args)
            .current_dir(self.repo())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
    fn aisb(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_aisb"));
        c.current_dir(self.repo())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.path().join("home"))
            .env("XDG_CACHE_HOME", self.path().join("cache"))
            .stdin(std::process::Stdio::null());
        c
    }
    fn run(&self, args: &[&str]) -> Out {
        Out::from(self.aisb().args(args).output().unwrap())
    }
    /// A session of sandbox `name` running `script` (sh, or bash for `exec -a`) in the
    /// background: the sandbox's owner.
    fn spawn(&self, backend: &str, name: &str, shell: &str, script: &str) -> std::process::Child {
        self.aisb()
            .args([
                "run",
                "--backend",
                backend,
                "--sandbox",
                name,
                "--",
                shell,
                "-c",
                script,
            ])
            .spawn()
            .unwrap()
    }
}

const INSIDE: &str = r#"
echo "pwd=$(pwd)"
echo "readme=$(cat README)"
echo "ignored=$(cat debug.log 2>&1 | head -c 40)"
echo "env=$(cat .env 2>&1 | grep -c 'Permission denied')"
echo change >> README
git -c user.name=a -c user.email=a@a commit -qam "from the sandbox" && echo committed=yes
git fetch -q origin && echo "host_head=$(git log -1 --format=%s origin/main)"
git push -q origin HEAD:main 2>/dev/null; echo "push=$?"
git push -q origin HEAD:refs/heads/other 2>/dev/null; echo "push_new=$?"
"#;

fn privileged() -> bool {
    support::root_or_skip("the named-sandbox suite")
}

#[test]
fn a_named_sandbox_works_in_its_own_clone_on_both_backends() {
    if !privileged() {
        return;
    }
    for backend in ["bwrap", "libcontainer"] {
        let r = Repo::new();
        // `aisb plan --sandbox` lists the shared clone among what the host must realise.
        let clone_line = || {
            let o = r.run(&["plan", "--sandbox", "fix"]);
            o.stdout
                .lines()
                .find(|l| l.trim_start().starts_with("shared clone "))
                .map(str::to_string)
                .unwrap_or_default()
        };
        assert!(
            clone_line().ends_with("made at the next run"),
            "{}",
            clone_line()
        );
        let o = r.run(&[
            "run",
            "--backend",
            backend,
            "--sandbox",
            "fix",
            "--",
            "/bin/sh",
            "-c",
            INSIDE,
        ]);
        assert_eq!(o.code, 0, "[{backend}] {}\n{}", o.stdout, o.stderr);
        o.expect("pwd", &r.repo().display().to_string());
        assert!(clone_line().ends_with("ready"), "{}", clone_line());
        o.expect("readme", "hello");
        o.expect("env", "1");
        o.expect("committed", "yes");
        o.expect("host_head", "one");
        // The host repository is read-only inside: no push moves or adds a host branch.
        o.expect_failed("push", &format!("[{backend}] pushed to the host's main"));
        o.expect_failed("push_new", &format!("[{backend}] pushed a new host branch"));
        assert_eq!(r.git(&["branch", "--list", "other"]), "");
        assert!(
            o.value("ignored")
                .is_some_and(|v| v.contains("No such file")),
            "[{backend}] untracked files are not in the clone: {:?}",
            o.value("ignored")
        );
        // The host: its working tree and branch untouched, the work fetched beside it.
        assert_eq!(
            std::fs::read_to_string(r.repo().join("README")).unwrap(),
            "hello\n"
        );
        assert_eq!(r.git(&["log", "-1", "--format=%s", "main"]), "one");
        assert_eq!(
            r.git(&["log", "-1", "--format=%s", "sandbox-fix/main"]),
            "from the sandbox"
        );
        // A commit on the host is fetchable inside, next session.
        std::fs::write(r.repo().join("HOST"), "x").unwrap();
        r.git(&["add", "HOST"]);
        r.git(&["commit", "-qm", "from the host"]);
        let o = r.run(&[
            "run",
            "--backend",
            backend,
            "--sandbox",
            "fix",
            "--",
            "/bin/sh",
            "-c",
            "git fetch -q origin && git log -1 --format=%s origin/main",
        ]);
        assert_eq!(o.stdout.trim(), "from the host", "[{backend}] {}", o.stderr);

        // A clone is not watched (nothing the host writes reaches it), but an attempt on one
        // of its masked files is in the audit log all the same (issue 32): the reporting
        // layer is up alone, its helper started without a project.
        let o = r.run(&[
            "run",
            "--backend",
            backend,
            "--sandbox",
            "fix",
            "--",
            "/bin/sh",
            "-c",
            // The layer lands on each mask after its own mount: waited for (bounded) on .env.
            "for i in $(seq 200); do grep -F \" $PWD/.env \" /proc/self/mountinfo | grep -q aisb-deny && break; sleep 0.05; done; \
             cat .env; echo done",
        ]);
        assert!(
            o.stdout.contains("done") && o.stderr.contains("Permission denied"),
            "[{backend}] {}\n{}",
            o.stdout,
            o.stderr
        );
        assert!(
            !o.stderr.contains("__mask") && !o.stderr.contains("error:"),
            "[{backend}] the mask helper failed: {}",
            o.stderr
        );
        let target = r.repo().join(".env").display().to_string();
        let reported = walkdir::WalkDir::new(r.path().join("cache"))
            .into_iter()
            .flatten()
            .filter(|e| e.file_name() == "audit.jsonl")
            .flat_map(|e| {
                std::fs::read_to_string(e.path())
                    .unwrap()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .collect::<Vec<_>>()
            })
            .any(|e| e["event"] == "file" && e["operation"] == "read" && e["target"] == target);
        assert!(
            reported,
            "[{backend}] the read of {target} is not in the audit log"
        );

        // ls: one sandbox, its unsynced commit counted; rm refuses, then --force removes it.
        let ls = r.run(&["ls", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&ls.stdout).unwrap();
        assert_eq!(v[0]["name"], "fix");
        assert_eq!(v[0]["unsynced"], 1);
        assert_eq!(v[0]["branch"], "main");
        let rm = r.run(&["rm", "fix"]);
        assert_eq!(rm.code, 125);
        assert!(
            rm.stderr
                .contains("has 1 commit(s) the repository does not have"),
            "{}",
            rm.stderr
        );
        r.git(&["merge", "-q", "--no-edit", "sandbox-fix/main"]);
        let rm = r.run(&["rm", "fix"]);
        assert_eq!(rm.code, 0, "{}", rm.stderr);
        assert!(!r.git(&["remote"]).contains("sandbox-fix"));
        assert_eq!(r.run(&["ls", "--json"]).stdout.trim(), "[]");
    }
}

#[test]
fn commits_reach_the_host_while_the_session_runs_and_a_second_session_joins_it() {
    if !privileged() {
        return;
    }
    let r = Repo::new();
    let mut session = r.spawn("bwrap", "live", "/bin/sh", "echo first > /tmp/marker; echo x >> README; git -c user.name=a -c user.email=a@a commit -qam live; sleep 8");
    let deadline = Instant::now() + Duration::from_secs(7);
    let mut seen = false;
    let mut second = None;
    while Instant::now() < deadline {
        let out = Command::new("git")
            .args(["log", "-1", "--format=%s", "sandbox-live/main"])
            .current_dir(r.repo())
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).trim() == "live" {
            seen = true;
            // A second session joins the running sandbox: it sees the first one's /tmp, and
            // is in its cgroup.
            second = Some(r.run(&[
                "run",
                "--sandbox",
                "live",
                "--",
                "/bin/sh",
                "-c",
                // In the sandbox's own cgroup (its cgroup namespace's root), under its limits.
                "cat /tmp/marker; grep -c '^Seccomp:.2' /proc/self/status; \
                 grep ':pids:' /proc/self/cgroup | cut -d: -f3",
            ]));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = session.kill();
    let _ = session.wait();
    assert!(
        seen,
        "the sandbox's commit did not reach the host while it ran"
    );
    let second = second.unwrap();
    assert_eq!(second.code, 0, "{}", second.stderr);
    assert_eq!(second.stdout, "first\n1\n/\n", "{}", second.stderr);
}

#[test]
fn gc_removes_stale_and_orphaned_state_and_keeps_unsynced_work() {
    if !privileged() {
        return;
    }
    let r = Repo::new();
    for name in ["old", "work"] {
        let script = if name == "work" {
            "echo y >> README; git -c user.name=a -c user.email=a@a commit -qam work"
        } else {
            "true"
        };
        let o = r.run(&[
            "run",
            "--backend",
            "bwrap",
            "--sandbox",
            name,
            "--",
            "/bin/sh",
            "-c",
            script,
        ]);
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    let ls: serde_json::Value = serde_json::from_str(&r.run(&["ls", "--json"]).stdout).unwrap();
    let dirs: Vec<PathBuf> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|v| PathBuf::from(v["path"].as_str().unwrap()))
        .collect();
    // Both last used three days ago; a run directory left by a pid that does not exist.
    for d in &dirs {
        let p = d.join("state.json");
        let mut st: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        st["last_used"] = serde_json::json!(st["last_used"].as_u64().unwrap() - 3 * 86400);
        std::fs::write(&p, st.to_string()).unwrap();
    }
    let orphan = dirs[0].join("run/4194303");
    std::fs::create_dir_all(&orphan).unwrap();
    // A decoded-config cache file three days old goes; the fresh ones stay.
    let kdl = r.path().join("cache/aisb/kdl");
    let fresh = std::fs::read_dir(&kdl).unwrap().count();
    assert!(fresh > 0);
    let stale = kdl.join("0000.json");
    std::fs::write(&stale, "{}").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3 * 86400))
        .unwrap();
    let gc = r.run(&["gc"]);
    assert!(!stale.exists(), "{}", gc.stdout);
    assert_eq!(std::fs::read_dir(&kdl).unwrap().count(), fresh);
    assert_eq!(gc.code, 0, "{}", gc.stderr);
    assert!(gc.stdout.contains("Pruned 1 sandbox,"), "{}", gc.stdout);
    assert!(
        gc.stdout.contains("kept sandbox `work`") && gc.stdout.contains("1 unsynced commit"),
        "{}",
        gc.stdout
    );
    assert!(!orphan.exists());
    let left: serde_json::Value = serde_json::from_str(&r.run(&["ls", "--json"]).stdout).unwrap();
    assert_eq!(left.as_array().unwrap().len(), 1);
    assert_eq!(left[0]["name"], "work");
    assert!(r.git(&["remote"]).lines().all(|l| l != "sandbox-old"));
}

/// The sandbox stops when its last session ends, not its first: a session that joined keeps
/// it (and its files) alive after the first one's command is done.
#[test]
fn the_last_session_keeps_the_sandbox_up() {
    if !privileged() {
        return;
    }
    for backend in ["bwrap", "libcontainer"] {
        let r = Repo::new();
        let mut first = r.spawn(
            backend,
            "pair",
            "/bin/sh",
            "echo kept > /tmp/shared; sleep 1; exit 3",
        );
        // Wait until the first aisb owns the sandbox, then join as soon as it is up (until
        // then a session is refused as busy).
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline && !r.run(&["ls", "--json"]).stdout.contains("\"running\"")
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut second = None;
        while Instant::now() < deadline && second.is_none() {
            let o = r.run(&[
                "run",
                "--sandbox",
                "pair",
                "--",
                "/bin/sh",
                "-c",
                "test -e /tmp/shared && sleep 3 && cat /tmp/shared && grep -c -e '^Seccomp:.2' -e '^CapEff:.0000000000000000' -e '^NoNewPrivs:.1' /proc/self/status",
            ]);
            if o.code == 0 {
                second = Some(o);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let second = second.unwrap_or_else(|| panic!("[{backend}] could not join the sandbox"));
        assert_eq!(
            second.stdout, "kept\n3\n",
            "[{backend}] the sandbox went down under the second session"
        );
        // The first aisb returns its own command's status once the second session is over.
        let status = first.wait().unwrap();
        assert_eq!(status.code(), Some(3), "[{backend}]");
    }
}

/// `aisb exec` runs a command in the running sandbox; `aisb stop` ends it and every session.
#[test]
fn exec_and_stop() {
    if !privileged() {
        return;
    }
    let r = Repo::new();
    std::fs::create_dir_all(r.repo().join("sub")).unwrap();
    std::fs::write(r.repo().join("sub/f"), "x").unwrap();
    r.git(&["add", "sub/f"]);
    r.git(&["commit", "-qm", "sub"]);
    let mut owner = r.spawn("bwrap", "svc", "/bin/sh", "echo up > /tmp/up; sleep 60");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = None;
    while Instant::now() < deadline {
        let o = r.run(&["exec", "svc", "--", "/bin/sh", "-c", "cat /tmp/up"]);
        if o.code == 0 {
            out = Some(o);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = out.expect("aisb exec never reached the running sandbox");
    assert_eq!(out.stdout, "up\n");
    // On a terminal, a session gets a pseudo-terminal of its own, in a session of its own
    // (`script` gives this test a terminal).
    let cmd = format!(
        "{} exec svc -- sh -c 'test -t 0 && echo tty=yes; test \"$(ps -o sid= -p $$ | tr -d \" \")\" = $$ && echo own_session=yes'",
        env!("CARGO_BIN_EXE_aisb")
    );
    let tty = Out::from(
        Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .current_dir(r.repo())
            .env("HOME", r.path().join("home"))
            .env("XDG_CACHE_HOME", r.path().join("cache"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap(),
    );
    assert!(
        tty.stdout.contains("tty=yes") && tty.stdout.contains("own_session=yes"),
        "{}\n{}",
        tty.stdout,
        tty.stderr
    );
    // A session started from a subdirectory works there, as outside.
    let here = Out::from(
        r.aisb()
            .current_dir(r.repo().join("sub"))
            .args(["exec", "svc", "--", "pwd"])
            .output()
            .unwrap(),
    );
    assert_eq!(
        here.stdout.trim(),
        r.repo().join("sub").display().to_string(),
        "{}",
        here.stderr
    );
    let stop = r.run(&["stop", "svc"]);
    assert_eq!(stop.code, 0, "{}", stop.stderr);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = owner.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the owner outlived `aisb stop`");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_ne!(status.code(), Some(0));
    let gone = r.run(&["exec", "svc", "--", "true"]);
    assert_eq!(gone.code, 125);
    assert!(
        gone.stderr.contains("sandbox `svc` is not running"),
        "{}",
        gone.stderr
    );
}

/// `kill -9` of the owning aisb mid-session: nothing is left running, the commit made inside
/// is not lost, and the next `up` works (without XDG_CACHE_HOME: the state is in ~/.cache).
#[test]
fn kill_9_mid_session_then_up_again() {
    if !privileged() {
        return;
    }
    let r = Repo::new();
    let mut owner = r.aisb();
    owner.env_remove("XDG_CACHE_HOME");
    let mut owner = owner
        .args(["run", "--backend", "libcontainer", "--sandbox", "crash", "--", "/bin/bash", "-c"])
        .arg("echo z >> README; git -c user.name=a -c user.email=a@a commit -qam saved; exec -a aisb-crash-marker sleep 60")
        .spawn()
        .unwrap();
    let marker_running = || {
        !Command::new("pgrep")
            .args(["-f", "^aisb-crash-marker"])
            .output()
            .unwrap()
            .stdout
            .is_empty()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !marker_running() {
        assert!(Instant::now() < deadline, "the session never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    owner.kill().unwrap(); // SIGKILL
    let _ = owner.wait();
    let deadline = Instant::now() + Duration::from_secs(30);
    while marker_running() {
        assert!(Instant::now() < deadline, "the session outlived its aisb");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        r.path().join("home/.cache/aisb").is_dir(),
        "state under ~/.cache"
    );
    // Up again: works, and the commit made before the crash is still there to sync.
    let mut again = r.aisb();
    again.env_remove("XDG_CACHE_HOME");
    let o = Out::from(
        again
            .args([
                "run",
                "--backend",
                "libcontainer",
                "--sandbox",
                "crash",
                "--",
                "git",
                "log",
                "-1",
                "--format=%s",
            ])
            .output()
            .unwrap(),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, "saved\n");
    assert_eq!(
        r.git(&["log", "-1", "--format=%s", "sandbox-crash/main"]),
        "saved"
    );
}

/// A fish user gets fish in their named sandbox, with their fish config (read-only).
#[test]
fn fish_users_get_fish() {
    if !privileged() || !support::tool_or_skip("fish", "fish_users_get_fish") {
        return;
    }
    let r = Repo::new();
    let conf = r.path().join("home/.config/fish");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(
        conf.join("config.fish"),
        "set -g AISB_TEST_FISH configured\n",
    )
    .unwrap();
    for backend in ["bwrap", "libcontainer"] {
        let mut c = r.aisb();
        c.env("SHELL", "/usr/bin/fish")
            .args(["up", "shell", "--backend", backend])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin
                .write_all(b"echo fish=$FISH_VERSION; echo conf=$AISB_TEST_FISH; touch ~/.config/fish/x; and echo wrote\n")
                .unwrap();
        }
        let out = Out::from(child.wait_with_output().unwrap());
        assert!(
            out.value("fish").is_some_and(|v| !v.is_empty()),
            "[{backend}] {}\n{}",
            out.stdout,
            out.stderr
        );
        out.expect("conf", "configured");
        assert!(
            !out.stdout.contains("wrote"),
            "[{backend}] the fish config was writable"
        );
    }
}

/// Seed 001's `.claude/settings.local.json`: in a named sandbox with `preset:claude` it is in
/// the clone (what Claude Code reads as the project's local settings), mirroring the sandbox,
/// ignored by git there; the host repository never gets it.
#[test]
fn claude_local_settings_are_written_into_the_clone_only() {
    if !privileged() {
        return;
    }
    let r = Repo::new();
    std::fs::create_dir_all(r.path().join("home/.claude")).unwrap();
    std::fs::write(r.repo().join("sandbox.kdl"), "import \"preset:claude\"\n").unwrap();
    r.git(&["add", "sandbox.kdl"]);
    r.git(&["commit", "-qm", "config"]);
    let script = "python3 -c 'import json; s = json.load(open(\".claude/settings.local.json\")); \
                  print(s[\"hooks\"][\"PreToolUse\"][0][\"hooks\"][0][\"command\"]); \
                  print(any(d.endswith(\"/.env)\") for d in s[\"permissions\"][\"deny\"]))'; \
                  git status --porcelain; echo status-done";
    let o = r.run(&[
        "--trust",
        "run",
        "--sandbox",
        "s1",
        "--backend",
        "bwrap",
        "--",
        "/bin/sh",
        "-c",
        script,
    ]);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    assert_eq!(
        o.stdout, "/run/aisb/init agent-event claude\nTrue\nstatus-done\n",
        "{}",
        o.stderr
    );
    assert!(!r.repo().join(".claude/settings.local.json").exists());
    assert!(!r.repo().join(".claude").exists());
}
