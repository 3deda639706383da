//! The host writes into a named sandbox's clone (an agent's local settings, git's exclude
//! file), which the sandbox shapes: a symbolic link planted there from inside never leads a
//! host write out of the clone.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use support::Out;

fn aisb(root: &Path, args: &[&str]) -> Out {
    Out::from(
        Command::new(env!("CARGO_BIN_EXE_aisb"))
            .args(args)
            .current_dir(root.join("repo"))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", root.join("home"))
            .env("XDG_CACHE_HOME", root.join("cache"))
            .stdin(Stdio::null())
            .output()
            .unwrap(),
    )
}

#[test]
fn a_link_planted_in_the_clone_is_not_written_through() {
    if !support::root_or_skip("the clone link suite") {
        return;
    }
    for backend in ["bwrap", "libcontainer"] {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("repo");
        let outside = t.path().join("outside");
        for d in [&repo, &outside, &t.path().join("home/.claude")] {
            std::fs::create_dir_all(d).unwrap();
        }
        support::git_in(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("sandbox.kdl"), "import \"preset:claude\"\n").unwrap();
        support::git_in(&repo, &["add", "sandbox.kdl"]);
        support::git_in(&repo, &["commit", "-qm", "one"]);
        let plant = format!(
            "rm -rf .claude && ln -s {} .claude && echo planted=0",
            outside.display()
        );
        let run = |script: &str| {
            aisb(
                t.path(),
                &[
                    "--trust",
                    "run",
                    "--backend",
                    backend,
                    "--sandbox",
                    "fix",
                    "--",
                    "/bin/sh",
                    "-c",
                    script,
                ],
            )
        };
        let o = run(&plant);
        o.expect("planted", "0");
        // The next start writes the agent's settings into the clone again.
        let o = run("true");
        assert!(
            std::fs::read_dir(&outside).unwrap().next().is_none(),
            "[{backend}] the host wrote through the planted link: {:?}\n{}",
            std::fs::read_dir(&outside)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect::<Vec<_>>(),
            o.stderr
        );
        assert_ne!(o.code, 0, "[{backend}] a planted link was not refused");
        assert!(
            o.stderr.contains("symbolic link"),
            "[{backend}] {}",
            o.stderr
        );
    }
}
