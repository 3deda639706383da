//! Many sandboxes at once, as an orchestrator starts them: 20 named sandboxes of one repository
//! started together all come up (each adds a remote and fetches in the same repository), and
//! 20 ephemeral runs per backend in one project all finish with their own exit code.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

const N: usize = 20;

fn git(dir: &Path, args: &[&str]) {
    let ok = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap()
        .status
        .success();
    assert!(ok, "git {args:?}");
}

fn aisb(root: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_aisb"));
    c.current_dir(root.join("repo"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", root.join("home"))
        .env("XDG_CACHE_HOME", root.join("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn repo() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("home")).unwrap();
    let repo = t.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "hello\n").unwrap();
    git(&repo, &["add", "README"]);
    git(&repo, &["commit", "-qm", "one"]);
    t
}

#[test]
fn twenty_named_sandboxes_start_at_once() {
    if !support::root_or_skip("the concurrency suite") {
        return;
    }
    let t = repo();
    let children: Vec<_> = (0..N)
        .map(|i| {
            let backend = if i % 2 == 0 { "bwrap" } else { "libcontainer" };
            let script = format!("echo {i} > mine.txt && git add mine.txt && git -c user.name=a -c user.email=a@a commit -qm s{i} && echo done={i}");
            aisb(t.path())
                .args(["run", "--backend", backend, "--sandbox", &format!("s{i}")])
                .args(["--", "/bin/sh", "-c", &script])
                .spawn()
                .unwrap()
        })
        .collect();
    let mut failed = Vec::new();
    for (i, c) in children.into_iter().enumerate() {
        let o = support::Out::from(c.wait_with_output().unwrap());
        if o.code != 0 || o.value("done") != Some(&i.to_string()) {
            failed.push(format!("s{i}: exit {}: {}", o.code, o.stderr.trim()));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {N} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    let ls = support::Out::from(aisb(t.path()).args(["ls", "--json"]).output().unwrap());
    assert_eq!(ls.code, 0, "{}", ls.stderr);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&ls.stdout).unwrap();
    assert_eq!(rows.len(), N, "{}", ls.stdout);
    // Every sandbox's commit reached the repository as its own remote branch.
    for i in 0..N {
        let out = Command::new("git")
            .args(["log", "-1", "--format=%s", &format!("sandbox-s{i}/main")])
            .current_dir(t.path().join("repo"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("s{i}"));
    }
}

#[test]
fn twenty_ephemeral_runs_per_backend_at_once() {
    if !support::root_or_skip("the concurrency suite") {
        return;
    }
    let t = repo();
    for backend in ["bwrap", "libcontainer"] {
        let children: Vec<_> = (0..N)
            .map(|i| {
                aisb(t.path())
                    .args(["run", "--backend", backend, "--"])
                    .args([
                        "/bin/sh",
                        "-c",
                        &format!("cat README >/dev/null && exit {}", i + 1),
                    ])
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut failed = Vec::new();
        for (i, c) in children.into_iter().enumerate() {
            let o = support::Out::from(c.wait_with_output().unwrap());
            if o.code != i as i32 + 1 {
                failed.push(format!("run {i}: exit {}: {}", o.code, o.stderr.trim()));
            }
        }
        assert!(
            failed.is_empty(),
            "[{backend}] {} of {N} failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }
}
