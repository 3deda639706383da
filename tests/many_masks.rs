//! A big repository starts: 50,000 masks (one gitignored file in each of 50,000 directories,
//! which nothing can collapse into a masked directory) on both backends, as root and as an
//! ordinary user. bubblewrap caps its arguments at 9,000, so one argument pair per mask
//! refused such a project outright; the init mounts them from a list instead. Every mask
//! still holds (the first, the last, a `.env`, a directory), the tracked files beside them
//! stay readable, and the list itself is gone from inside. (tests/sessions.rs joins a
//! sandbox whose masks the init mounted, in a mount namespace of its own where bwrap runs as
//! an ordinary user.)

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::Out;

const N: usize = 50_000;

fn project(root: &Path) -> PathBuf {
    let proj = root.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    support::git_in(&proj, &["init", "-q"]);
    std::fs::write(proj.join(".gitignore"), "secret.txt\nprivate*/\n").unwrap();
    for i in 0..N {
        let d = proj.join(format!("d{i}"));
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("tracked.txt"), "t\n").unwrap();
        std::fs::write(d.join("secret.txt"), "SECRET\n").unwrap();
    }
    // Masked directories: the first is a tmpfs of the init's, the others binds of it.
    for d in ["private", "private2", "private3"] {
        std::fs::create_dir(proj.join(d)).unwrap();
        std::fs::write(proj.join(d).join("notes"), "PRIVATE\n").unwrap();
    }
    std::fs::write(proj.join(".env"), "TOKEN=1\n").unwrap();
    // A tracked link to a masked file: following it reaches the mask.
    std::os::unix::fs::symlink("d0/secret.txt", proj.join("link.txt")).unwrap();
    support::commit_all(&proj, "init");
    proj
}

fn aisb(exe: &Path, root: &Path, user: Option<(u32, u32)>, args: &[&str]) -> Out {
    let mut cmd = Command::new(exe);
    cmd.current_dir(root.join("proj"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", root.join("home"))
        .env("XDG_CACHE_HOME", root.join("cache"))
        .env("XDG_CONFIG_HOME", root.join("config"))
        .arg("--trust")
        .args(args)
        .stdin(std::process::Stdio::null());
    if let Some((uid, gid)) = user {
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
    }
    Out::from(cmd.output().unwrap())
}

const PROBE: &str = "cat d0/secret.txt >/dev/null 2>&1; echo first=$?; \
     cat d49999/secret.txt >/dev/null 2>&1; echo last=$?; \
     cat .env >/dev/null 2>&1; echo env=$?; \
     cat link.txt >/dev/null 2>&1; echo link=$?; \
     ls -A private/ private2/ private3/ 2>/dev/null | grep -c notes | sed 's/^/private-entries=/'; \
     touch private2/x 2>/dev/null; echo private-write=$?; \
     echo tracked=$(cat d0/tracked.txt d49999/tracked.txt | tr -d '\\n'); \
     echo list-bytes=$(cat /run/aisb/mask-list 2>/dev/null | wc -c | tr -d ' ')";

fn check(o: &Out, who: &str) {
    assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
    o.expect_failed("first", "the first mask holds");
    o.expect_failed("last", "the last mask holds");
    o.expect_failed("env", ".env stays masked");
    o.expect_failed("link", "a link to a masked file reaches the mask");
    o.expect("private-entries", "0");
    o.expect_failed("private-write", "a masked directory is read-only");
    o.expect("tracked", "tt");
    o.expect("list-bytes", "0");
}

fn case(user: Option<(u32, u32)>) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("home")).unwrap();
    project(root);
    let exe = match user {
        Some((uid, gid)) => support::hand_to_user(root, uid, gid),
        None => PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
    };
    for backend in ["bwrap", "libcontainer"] {
        let who = format!(
            "[{backend}, {}]",
            if user.is_some() { "user" } else { "root" }
        );
        let o = aisb(
            &exe,
            root,
            user,
            &["run", "--backend", backend, "--", "/bin/sh", "-c", PROBE],
        );
        check(&o, &who);
    }
}

#[test]
fn fifty_thousand_masks_start_as_root() {
    if !support::root_or_skip("the many-masks suite") {
        return;
    }
    case(None);
}

#[test]
fn fifty_thousand_masks_start_as_a_user() {
    if !support::root_or_skip("the many-masks suite") {
        return;
    }
    case(Some(support::test_user()));
}
