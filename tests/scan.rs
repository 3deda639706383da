//! The dynamic blocklist on real git repositories made here: ignored files (nested
//! .gitignore), git-crypt attributes, tool dirs, allow, and the cache's invalidation.

mod support;

use aisb::eval::Plan;
use support::Fixture;

fn masked(f: &Fixture, plan: &Plan) -> Vec<String> {
    plan.masks
        .iter()
        .map(|m| {
            let rel = m
                .path
                .strip_prefix(f.project())
                .unwrap()
                .display()
                .to_string();
            format!("{}{} [{}]", rel, if m.dir { "/" } else { "" }, m.rule)
        })
        .collect()
}

fn repo() -> Fixture {
    let f = Fixture::new();
    f.write(
        ".gitignore",
        ".env\n.env.*\n!.env.example\nnode_modules/\n.claude/\nbuild.log\n",
    );
    f.write("sub/.gitignore", "local.txt\n");
    f.write(
        ".gitattributes",
        "vault/** filter=git-crypt diff=git-crypt\n",
    );
    f.write("src/main.rs", "fn main() {}");
    f.write(".env", "TOKEN=1");
    f.write(".env.production", "TOKEN=2");
    f.write(".env.example", "TOKEN=");
    f.write("node_modules/pkg/index.js", "x");
    f.write("sub/local.txt", "x");
    f.write("sub/kept.txt", "x");
    f.write(".claude/settings.json", "{}");
    f.write(".claude/api.key", "k");
    f.write("vault/prod.yaml", "encrypted");
    f.write("certs/server.pem", "pem");
    f.write("config/credentials.json", "{}");
    f.write("deep/er/.ssh/id_ed25519", "key");
    f.write("build.log", "log");
    f.git(&["init", "-q"]);
    f.git(&["add", "-A"]);
    f.git(&["commit", "-qm", "init"]);
    f
}

#[test]
fn three_layers_with_tool_dirs_and_allow() {
    let f = repo();
    let plan = f.plan("allow \".env.example\"\n", None);
    assert!(plan.scan.git);
    assert_eq!(
        masked(&f, &plan),
        [
            ".claude/api.key [sensitive \"*.key\"]",
            ".env [gitignored]",
            ".env.production [gitignored]",
            "build.log [gitignored]",
            "certs/server.pem [sensitive \"*.pem\"]",
            "config/credentials.json [sensitive \"*credentials*\"]",
            "deep/er/.ssh/ [sensitive \".ssh/\"]",
            "sub/local.txt [gitignored]",
            "vault/prod.yaml [git-crypt]",
        ]
    );
}

#[test]
fn layers_can_be_turned_off_at_the_top_level() {
    let f = repo();
    let plan = f.plan(
        "secrets {\n defaults #false\n gitignored #false\n git-crypt #false\n}\nblock \"*.log\"\n",
        None,
    );
    assert_eq!(masked(&f, &plan), ["build.log [block \"*.log\"]"]);
    // Without the gitignored layer, sensitive files inside ignored dirs are still found.
    f.write("node_modules/pkg/.env", "x");
    let plan = f.plan("secrets { gitignored #false }\n", None);
    let m = masked(&f, &plan);
    assert!(
        m.contains(&"node_modules/pkg/.env [sensitive \".env\"]".to_string()),
        "{m:?}"
    );
    assert!(
        m.contains(&".env [sensitive \".env\"]".to_string()),
        "{m:?}"
    );
}

#[test]
fn not_a_git_repository() {
    let f = Fixture::new();
    f.write(".env", "x");
    f.write("a/b/key.pem", "x");
    f.write("a/ok.txt", "x");
    let plan = f.plan("", None);
    assert!(!plan.scan.git);
    assert_eq!(
        masked(&f, &plan),
        [
            ".env [sensitive \".env\"]",
            "a/b/key.pem [sensitive \"*.pem\"]"
        ]
    );
    assert!(plan.scan.notes[0].contains("not a git repository"));
}

fn cached_plan(f: &Fixture) -> Plan {
    let (loaded, errors) = f.load("");
    errors.into_result().unwrap();
    let req = aisb::eval::Request {
        use_cache: true,
        ..Default::default()
    };
    let mut plan = aisb::eval::evaluate(&loaded, &f.host(), &req).unwrap();
    // Evaluation writes nothing: its caller stores the scan's cache, as aisb does.
    aisb::graph::realise::memos(&std::mem::take(&mut plan.memos));
    plan
}

/// Let the racy window pass so the cache can be trusted.
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(150));
}

/// After a change: the first scan may still see the change as racy (too close to the scan to
/// trust); a scan after the window is written as trustworthy.
fn rewarm(f: &Fixture) {
    settle();
    let _ = cached_plan(f);
}

#[test]
fn cache_is_reused_and_invalidated_by_any_new_file() {
    let f = repo();
    std::fs::create_dir_all(f.project().join("empty/nested")).unwrap();
    settle();
    let first = cached_plan(&f);
    assert!(!first.scan.cached);
    let second = cached_plan(&f);
    assert!(second.scan.cached, "an unchanged repo reuses the scan");
    assert_eq!(masked(&f, &first), masked(&f, &second));

    // A new untracked secret in a tracked dir.
    f.write("src/server.key", "x");
    let third = cached_plan(&f);
    assert!(!third.scan.cached);
    assert!(masked(&f, &third).contains(&"src/server.key [sensitive \"*.key\"]".to_string()));
    rewarm(&f);
    assert!(cached_plan(&f).scan.cached);

    // A new secret in a directory git does not list at all (empty, nested).
    f.write("empty/nested/id_rsa", "x");
    let fourth = cached_plan(&f);
    assert!(
        !fourth.scan.cached,
        "a file in an empty dir must invalidate the cache"
    );
    assert!(masked(&f, &fourth).contains(&"empty/nested/id_rsa [sensitive \"id_rsa\"]".to_string()));
    rewarm(&f);
    assert!(cached_plan(&f).scan.cached);

    // Editing .gitignore in place (no directory changes) changes what is ignored.
    f.write("sub/new.txt", "x");
    rewarm(&f);
    assert!(cached_plan(&f).scan.cached);
    let gi = f.project().join("sub/.gitignore");
    std::fs::write(&gi, "new.txt\n").unwrap();
    let fifth = cached_plan(&f);
    assert!(!fifth.scan.cached);
    let m = masked(&f, &fifth);
    assert!(m.contains(&"sub/new.txt [gitignored]".to_string()), "{m:?}");
    assert!(
        !m.contains(&"sub/local.txt [gitignored]".to_string()),
        "{m:?}"
    );
}

#[test]
fn changed_rules_do_not_reuse_another_rules_cache() {
    let f = repo();
    settle();
    let _ = cached_plan(&f);
    let (loaded, _) = f.load("block \"src/\"\n");
    let plan = aisb::eval::evaluate(
        &loaded,
        &f.host(),
        &aisb::eval::Request {
            use_cache: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!plan.scan.cached);
    assert!(masked(&f, &plan).contains(&"src/ [block \"src/\"]".to_string()));
}

/// A secret whose path is not UTF-8 is masked under its own name (it was masked under a
/// lossily decoded name, that is, not at all), with git and without. An OCI spec cannot name
/// such a path, so a run is refused with the reason rather than started without the mask.
#[test]
fn a_secret_with_a_name_that_is_not_utf8_is_masked() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    for git in [true, false] {
        let f = Fixture::new();
        let dir = f.project().join(OsStr::from_bytes(b"caf\xe9"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(".env"), "TOKEN=1").unwrap();
        let key = f.project().join(OsStr::from_bytes(b"id_\xff.pem"));
        std::fs::write(&key, "KEY").unwrap();
        f.write("src/main.rs", "fn main() {}");
        if git {
            f.git(&["init", "-q"]);
            f.git(&["add", "src/main.rs"]);
        }
        let plan = f.plan("", None);
        let paths: Vec<&std::path::Path> = plan.masks.iter().map(|m| m.path.as_path()).collect();
        for want in [dir.join(".env"), key.clone()] {
            assert!(
                paths.contains(&want.as_path()),
                "[git={git}] {want:?} not in {paths:?}"
            );
        }
        if !nix::unistd::geteuid().is_root() {
            continue;
        }
        for backend in ["bwrap", "libcontainer"] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_aisb"))
                .args(["run", "--backend", backend, "--", "/bin/sh", "-c"])
                .arg("cat caf?/.env; echo env=$?; cat id_?.pem; echo key=$?")
                .current_dir(f.project())
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", f.home())
                .env("XDG_CACHE_HOME", f.root().join("cache"))
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let o = support::Out::from(out);
            assert!(
                !o.stdout.contains("TOKEN") && !o.stdout.contains("KEY"),
                "[{backend}, git={git}] {}",
                o.stdout
            );
            // Refused before anything ran: a spec cannot name the file, so it could not be
            // masked, and the sandbox does not start without the mask.
            assert_eq!(
                o.code, 125,
                "[{backend}, git={git}] {}\n{}",
                o.stdout, o.stderr
            );
            assert!(
                o.stderr.contains("is not valid UTF-8") && o.stderr.contains("nothing was"),
                "[{backend}, git={git}] {}",
                o.stderr
            );
        }
    }
}

/// Evaluation is pure: with caching on, it writes nothing on the host; the scan's cache comes
/// back as a memo for its caller to store.
#[test]
fn evaluating_writes_nothing_and_returns_the_cache_to_store() {
    let f = repo();
    settle();
    // The host's facts are gathered first (the /etc snapshot's index is the `host` step's).
    let host = f.host();
    let before: Vec<_> = walkdir::WalkDir::new(f.root())
        .into_iter()
        .flatten()
        .map(|e| e.path().to_path_buf())
        .collect();
    let (loaded, errors) = f.load("");
    errors.into_result().unwrap();
    let req = aisb::eval::Request {
        use_cache: true,
        ..Default::default()
    };
    let plan = aisb::eval::evaluate(&loaded, &host, &req).unwrap();
    let after: Vec<_> = walkdir::WalkDir::new(f.root())
        .into_iter()
        .flatten()
        .map(|e| e.path().to_path_buf())
        .collect();
    assert_eq!(before, after, "evaluation wrote on the host");
    // The scan's cache, and the record of what was masked (`eval::masks::keep`).
    assert_eq!(
        plan.memos.len(),
        2,
        "{:?}",
        plan.memos.iter().map(|m| &m.path).collect::<Vec<_>>()
    );
    assert!(plan
        .memos
        .iter()
        .all(|m| m.path.starts_with(host.cache_home())));
    assert!(plan
        .memos
        .iter()
        .any(|m| m.path.ends_with(aisb::eval::masks::KEPT_FILE)));
}
