//! No git credentials inside (issue 30, item 3): a remote URL's `user:token@`, an
//! `http.<url>.extraheader` (what `actions/checkout` persists), any `credential.*` setting and
//! an include of a host file never reach the sandbox through `.git/config`, read-only or
//! writable project alike; git-crypt's key directory is masked. Git inside still reads the
//! remotes and branches. `aisb test` checks the same, and that a committed `.env` is not read
//! through git. Both backends, as root and as an ordinary user.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use support::Out;

const CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\
[remote \"origin\"]\n\turl = https://x-access-token:ghs_SECRET1@github.com/o/r.git\n\
\tfetch = +refs/heads/*:refs/remotes/origin/*\n\
[http \"https://github.com/\"]\n\textraheader = AUTHORIZATION: basic SECRET2\n\
[credential]\n\thelper = store --file /root/SECRET3\n\
[include]\n\tpath = /nonexistent-aisb/SECRET4.inc\n\
[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n";

fn case(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        for access in ["rw", "ro"] {
            let who = format!(
                "[{backend}, {access}, {}]",
                if user.is_some() { "user" } else { "root" }
            );
            let dir = tempfile::tempdir().unwrap();
            let proj = dir.path().join("proj");
            std::fs::create_dir_all(dir.path().join("home")).unwrap();
            std::fs::create_dir_all(&proj).unwrap();
            support::git_in(&proj, &["init", "-q", "-b", "main"]);
            std::fs::write(proj.join("README"), "hi\n").unwrap();
            std::fs::write(proj.join(".env"), "TOKEN=sk-live-COMMITTED\n").unwrap();
            if access == "ro" {
                std::fs::write(proj.join("sandbox.kdl"), "project \".\" access=\"ro\"\n").unwrap();
            }
            support::commit_all(&proj, "init");
            std::fs::write(proj.join(".git/config"), CONFIG).unwrap();
            std::fs::create_dir_all(proj.join(".git/git-crypt/keys")).unwrap();
            std::fs::write(proj.join(".git/git-crypt/keys/default"), "GITCRYPT-KEY").unwrap();
            let exe = match user {
                Some((uid, gid)) => support::hand_to_user(dir.path(), uid, gid),
                None => PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
            };
            let mut cmd = Command::new(&exe);
            cmd.current_dir(&proj)
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", dir.path().join("home"))
                .env("XDG_CACHE_HOME", dir.path().join("cache"))
                .env("XDG_CONFIG_HOME", dir.path().join("config"))
                .args([
                    "--trust",
                    "run",
                    "--backend",
                    backend,
                    "--",
                    "/bin/sh",
                    "-c",
                ])
                .arg(
                    "cat .git/config; git config --list; git remote -v; \
                     echo branch=$(git config branch.main.remote); \
                     cat .git/git-crypt/keys/default >/dev/null 2>&1; echo key=$?",
                )
                .stdin(Stdio::null());
            if let Some((uid, gid)) = user {
                std::os::unix::process::CommandExt::uid(&mut cmd, uid);
                std::os::unix::process::CommandExt::gid(&mut cmd, gid);
            }
            let o = Out::from(cmd.output().unwrap());
            assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
            assert!(!o.stdout.contains("SECRET"), "{who} {}", o.stdout);
            assert!(!o.stdout.contains("GITCRYPT-KEY"), "{who} {}", o.stdout);
            assert!(
                o.stdout.contains("https://github.com/o/r.git"),
                "{who} the remote is still there: {}",
                o.stdout
            );
            o.expect("branch", "origin");
            o.expect_failed("key", "git-crypt's key is masked");
            // `aisb test` checks the same from inside.
            let mut cmd = Command::new(&exe);
            cmd.current_dir(&proj)
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", dir.path().join("home"))
                .env("XDG_CACHE_HOME", dir.path().join("cache"))
                .env("XDG_CONFIG_HOME", dir.path().join("config"))
                .args(["--trust", "test", "--backend", backend, "--json"])
                .stdin(Stdio::null());
            if let Some((uid, gid)) = user {
                std::os::unix::process::CommandExt::uid(&mut cmd, uid);
                std::os::unix::process::CommandExt::gid(&mut cmd, gid);
            }
            let checks = |cmd: &mut Command| -> Vec<serde_json::Value> {
                let t = Out::from(cmd.output().unwrap());
                serde_json::from_str(&t.stdout)
                    .unwrap_or_else(|e| panic!("{who} {e}: {}\n{}", t.stdout, t.stderr))
            };
            let found = checks(&mut cmd);
            let check = |checks: &[serde_json::Value], start: &str| -> serde_json::Value {
                checks
                    .iter()
                    .find(|c| c["check"].as_str().is_some_and(|n| n.starts_with(start)))
                    .unwrap_or_else(|| panic!("{who} no check {start:?}: {checks:#?}"))
                    .clone()
            };
            for name in [
                "read a credential in the project's git configuration",
                "list git-crypt's keys",
                "read the content of .env through git",
            ] {
                let c = check(&found, name);
                assert_eq!(c["ok"], true, "{who} {c:#}");
            }
            // The test of the check: with the store off, the committed `.env` is read.
            cmd.env("AISB_TEST_BREAK_ISOLATION", "git-objects");
            let c = check(&checks(&mut cmd), "read the content of .env through git");
            assert_eq!(c["ok"], false, "{who} {c:#}");
            // The host's file is untouched.
            assert_eq!(
                std::fs::read_to_string(proj.join(".git/config")).unwrap(),
                CONFIG,
                "{who}"
            );
        }
    }
}

#[test]
fn no_git_credentials_inside_as_root() {
    if support::root_or_skip("the git credentials suite") {
        case(None);
    }
}

#[test]
fn no_git_credentials_inside_as_a_user() {
    if support::root_or_skip("the git credentials suite") {
        case(Some(support::test_user()));
    }
}
