//! Nothing planted in a sandbox runs on the host through git. From inside, every vector git
//! has is planted in the git directory the sandbox can write (the project's in an ephemeral
//! run, the clone's in a named sandbox); then the host runs git the way a user does and every
//! aisb verb that touches the repository. Each planted program would create a file named
//! after its vector in a directory the sandbox cannot see: it must stay empty. Both backends,
//! root and an ordinary user.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{chown_r, test_user, Out};

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];

/// Plants every vector; prints `NAME=status` for each attempt (0: the write succeeded).
/// `$M` is the host directory a planted program would mark.
const PLANT: &str = r##"
p() { printf 'touch %s/%s' "$M" "$1"; }
try() { n=$1; shift; "$@" >/dev/null 2>&1 </dev/null; echo "$n=$?"; }
try fsmonitor git config core.fsmonitor "$(p fsmonitor)"
try hooks_path git config core.hooksPath "$PWD/.myhooks"
try ssh_command git config core.sshCommand "$(p ssh)"
try pager git config core.pager "$(p pager)"
try editor git config core.editor "$(p editor)"
try askpass git config core.askPass "$(p askpass)"
try credential git config credential.helper "!$(p credential)"
try diff_external git config diff.external "$(p diff-external)"
try filter git config filter.x.clean "$(p filter)"
try include git config include.path "$PWD/evil.cfg"
try include_if git config "includeIf.gitdir:/.path" "$PWD/evil.cfg"
try alias git config alias.st "!$(p alias)"
try gpg git config gpg.program "$(p gpg)"
try protocol git config protocol.ext.allow always
try upload_pack git config remote.origin.uploadpack "$(p upload-pack)"
try receive_pack git config remote.origin.receivepack "$(p receive-pack)"
try config_append sh -c 'printf "[core]\n\tfsmonitor = %s\n" "$0" >> .git/config' "$(p fsmonitor-append)"
try config_replace sh -c 'cp .git/config /tmp/c && printf "[core]\n\tfsmonitor = %s\n" "$0" >> /tmp/c && mv -f /tmp/c .git/config' "$(p fsmonitor-replace)"
try config_rename mv .git/config .git/config-old
try config_worktree sh -c 'printf "[core]\n\tfsmonitor = %s\n" "$0" > .git/config.worktree' "$(p config-worktree)"
for h in $HOOKS; do
    try "hook_$h" sh -c 'printf "#!/bin/sh\n%s\n" "$1" > ".git/hooks/$0" && chmod +x ".git/hooks/$0"' "$h" "$(p "hook-$h")"
done
try hooks_rename mv .git/hooks .git/hooks-old
try info_attributes sh -c 'echo "* filter=x diff=x" > .git/info/attributes'
try info_rename mv .git/info .git/info-old
try gitdir_rename mv .git .git-old
echo '* filter=x diff=x' > .gitattributes
# A whole git directory of the sandbox's, and `commondir` pointing at it: the one write
# guards cannot refuse; aisb moves it aside.
mkdir -p evil/hooks evil/objects evil/refs evil/info
printf '[core]\n\trepositoryformatversion = 0\n\tfsmonitor = %s\n\thooksPath = %s\n' "$(p commondir)" "$PWD/evil/hooks" > evil/config
printf '#!/bin/sh\n%s\n' "$(p commondir-hook)" > evil/hooks/pre-commit; chmod +x evil/hooks/pre-commit
try commondir sh -c 'echo ../evil > .git/commondir'
"##;

const HOOKS: &[&str] = &[
    "pre-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-push",
    "post-checkout",
    "post-merge",
    "pre-rebase",
    "post-rewrite",
    "reference-transaction",
    "pre-auto-gc",
    "post-index-change",
    "fsmonitor-watchman",
];

/// Every attempt of [`PLANT`] by name: its `try NAME` lines and one per hook.
fn attempts() -> Vec<String> {
    let mut v: Vec<String> = PLANT
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("try "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| !n.starts_with('"'))
        .map(str::to_string)
        .collect();
    v.extend(HOOKS.iter().map(|h| format!("hook_{h}")));
    v
}

/// The attempts that did not fail as they must (every write but `commondir` and
/// `config.worktree`, which guards cannot refuse and aisb quarantines), a missing result
/// counting as not failed.
fn not_refused(o: &Out) -> Vec<String> {
    let all = attempts();
    assert!(all.len() > 30, "{all:?}");
    all.into_iter()
        .filter(|k| k != "commondir" && k != "config_worktree")
        .filter(|k| o.value(k).is_none_or(|v| v == "0"))
        .collect()
}

/// Work inside still works: add, commit, branch, stash.
const WORK: &str = r#"
echo new > new.txt
git add new.txt && git -c user.name=a -c user.email=a@a commit -qm inside && echo commit=ok
git branch feature && echo branch=ok
echo more >> new.txt
git -c user.name=a -c user.email=a@a stash -q && echo stash=ok
git log --oneline | wc -l | sed 's/^ */commits=/'
"#;

struct Fixture {
    dir: tempfile::TempDir,
    user: Option<(u32, u32)>,
    exe: PathBuf,
}

impl Fixture {
    fn new(user: Option<(u32, u32)>) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        // Made by root, then handed to the user.
        let mut f = Fixture {
            dir,
            user: None,
            exe: PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
        };
        for d in ["home", "proj", "marks"] {
            std::fs::create_dir_all(f.root().join(d)).unwrap();
        }
        std::fs::write(f.proj().join("README"), "hello\n").unwrap();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &["add", "README"],
            &["commit", "-qm", "one"],
        ] {
            let o = f.git(args);
            assert_eq!(o.code, 0, "git {args:?}: {}", o.stderr);
        }
        f.user = user;
        if let Some((uid, gid)) = user {
            f.exe = support::hand_to_user(f.root(), uid, gid);
        }
        f
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn proj(&self) -> PathBuf {
        self.root().join("proj")
    }
    fn marks(&self) -> PathBuf {
        self.root().join("marks")
    }
    fn as_caller(&self, cmd: &mut Command) {
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(cmd, uid);
            std::os::unix::process::CommandExt::gid(cmd, gid);
        }
        cmd.current_dir(self.proj())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.root().join("home"))
            .env("XDG_CACHE_HOME", self.root().join("cache"))
            .stdin(std::process::Stdio::null());
    }
    /// git on the host, as the user would run it (their own git, no overrides).
    fn git(&self, args: &[&str]) -> Out {
        let mut cmd = Command::new("git");
        self.as_caller(&mut cmd);
        cmd.args(["-c", "user.name=t", "-c", "user.email=t@t"])
            .args(args);
        Out::from(cmd.output().unwrap())
    }
    fn aisb(&self, args: &[&str]) -> Out {
        let mut cmd = Command::new(&self.exe);
        self.as_caller(&mut cmd);
        Out::from(cmd.args(args).output().unwrap())
    }
    fn inside(&self, backend: &str, sandbox: Option<&str>, script: &str) -> Out {
        let mut args = vec!["run", "--backend", backend];
        if let Some(name) = sandbox {
            args.extend(["--sandbox", name]);
        }
        let script = format!(
            "M={}\nHOOKS='{}'\n{script}",
            self.marks().display(),
            HOOKS.join(" ")
        );
        args.extend(["--", "/bin/sh", "-c", &script]);
        self.aisb(&args)
    }
    fn marked(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.marks())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
    /// Every file under `.git` with its content and mode.
    fn git_dir_snapshot(&self) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
        use std::os::unix::fs::PermissionsExt;
        let base = self.proj().join(".git");
        walkdir::WalkDir::new(&base)
            .follow_links(false)
            .into_iter()
            .flatten()
            .map(|e| {
                let md = e.path().symlink_metadata().unwrap();
                let content = if md.is_file() {
                    std::fs::read(e.path()).unwrap()
                } else {
                    Vec::new()
                };
                (
                    e.path().strip_prefix(&base).unwrap().to_path_buf(),
                    (content, md.permissions().mode()),
                )
            })
            .collect()
    }
    /// What a user does next on the host, and every aisb verb that touches the repository.
    fn host_uses_the_repository(&self, backend: &str, sandbox: Option<&str>) -> Vec<String> {
        let mut log = Vec::new();
        for args in [
            &["status"][..],
            &["diff"],
            &["log", "-p", "-1"],
            &["commit", "--allow-empty", "-qm", "host"],
            &["stash", "list"],
            &["st"],
            &["fetch", "-q", "."],
        ] {
            let o = self.git(args);
            log.push(format!("git {args:?}: {}", o.code));
        }
        let mut verbs: Vec<Vec<&str>> = vec![
            vec!["check"],
            vec!["plan"],
            vec!["run", "--backend", backend, "--", "true"],
        ];
        if let Some(name) = sandbox {
            verbs.extend([
                vec!["plan", "--sandbox", name],
                vec!["run", "--backend", backend, "--sandbox", name, "--", "true"],
                vec!["ls"],
                vec!["gc", "--dry-run"],
                vec!["rm", "--force", name],
            ]);
        }
        for v in verbs {
            let o = self.aisb(&v);
            log.push(format!("aisb {v:?}: {} {}", o.code, o.stderr.trim()));
        }
        log
    }
}

fn matrix() -> Vec<(&'static str, Option<(u32, u32)>)> {
    let user = test_user();
    let mut m: Vec<_> = BACKENDS.iter().map(|b| (*b, None)).collect();
    m.extend(BACKENDS.iter().map(|b| (*b, Some(user))));
    m
}

#[test]
fn nothing_planted_in_the_project_git_dir_runs_on_the_host() {
    if !support::root_or_skip("the git planting suite") {
        return;
    }
    for (backend, user) in matrix() {
        let who = format!(
            "[{backend}, {}]",
            user.map_or("root".into(), |u| format!("uid {}", u.0))
        );
        let f = Fixture::new(user);
        let before = f.git_dir_snapshot();
        let o = f.inside(backend, None, PLANT);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        assert_eq!(
            not_refused(&o),
            Vec::<String>::new(),
            "{who} attempts that were not refused inside:\n{}\n{}",
            o.stdout,
            o.stderr
        );
        o.expect("commondir", "0");
        o.expect("config_worktree", "0");
        for planted in ["commondir", "config.worktree"] {
            assert!(
                o.stderr.contains(&format!(
                    ".git/{planted} was written by the sandbox (git on the host"
                )),
                "{who} the planted {planted} was not moved aside: {}",
                o.stderr
            );
        }
        assert!(
            before == f.git_dir_snapshot(),
            "{who} the host's .git changed after a run that only tried to plant"
        );
        let log = f.host_uses_the_repository(backend, None);
        assert_eq!(
            f.marked(),
            Vec::<String>::new(),
            "{who} planted code ran on the host:\n{}",
            log.join("\n")
        );

        // The work itself: git inside still adds, commits, branches and stashes.
        let o = f.inside(backend, None, WORK);
        for k in ["commit", "branch", "stash"] {
            o.expect(k, "ok");
        }
        assert_eq!(
            f.git(&["log", "-1", "--format=%s", "main"]).stdout.trim(),
            "inside",
            "{who}"
        );
    }
}

#[test]
fn nothing_planted_in_a_named_sandbox_clone_runs_on_the_host() {
    if !support::root_or_skip("the git planting suite") {
        return;
    }
    for (backend, user) in matrix() {
        let who = format!(
            "[{backend}, {}]",
            user.map_or("root".into(), |u| format!("uid {}", u.0))
        );
        let f = Fixture::new(user);
        // The work first (the watcher fetches it while the session runs), then the plants,
        // which the watcher's last fetch and every later verb meet.
        let script = format!("{WORK}\nsleep 1\n{PLANT}\nsleep 1\n");
        let o = f.inside(backend, Some("fix"), &script);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        assert_eq!(
            not_refused(&o),
            Vec::<String>::new(),
            "{who} attempts that were not refused inside:\n{}\n{}",
            o.stdout,
            o.stderr
        );
        o.expect("commondir", "0");
        o.expect("config_worktree", "0");
        for k in ["commit", "branch", "stash"] {
            o.expect(k, "ok");
        }
        let synced = f.git(&["log", "-1", "--format=%s", "sandbox-fix/main"]);
        assert_eq!(synced.stdout.trim(), "inside", "{who} {}", synced.stderr);
        let log = f.host_uses_the_repository(backend, Some("fix"));
        assert_eq!(
            f.marked(),
            Vec::<String>::new(),
            "{who} planted code ran on the host:\n{}",
            log.join("\n")
        );
    }
}

/// The tests of the tests: with the guards switched off, the same plants run on the host, so
/// the tests above would notice.
#[test]
fn a_writable_git_dir_is_caught() {
    if !support::root_or_skip("the git planting suite") {
        return;
    }
    for backend in BACKENDS {
        let f = Fixture::new(None);
        let mut cmd = Command::new(&f.exe);
        f.as_caller(&mut cmd);
        // Two plants of the list (the rest would rename .git away once it is writable).
        let script = format!(
            "M={m}\n\
             git config core.fsmonitor 'touch {m}/fsmonitor' && echo fsmonitor=0\n\
             printf '#!/bin/sh\\ntouch {m}/pre-commit\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit && echo hook=0\n",
            m = f.marks().display()
        );
        let o = Out::from(
            cmd.env("AISB_TEST_BREAK_ISOLATION", "git")
                .args(["run", "--backend", backend, "--", "/bin/sh", "-c", &script])
                .output()
                .unwrap(),
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.expect("fsmonitor", "0");
        o.expect("hook", "0");
        f.host_uses_the_repository(backend, None);
        assert_eq!(
            f.marked(),
            vec!["fsmonitor".to_string(), "pre-commit".to_string()],
            "[{backend}] with the project's .git writable, the plants did not run: the planting test proves nothing"
        );
    }
}

/// `aisb test` checks the git directory from inside, and fails when it is writable.
#[test]
fn aisb_test_checks_the_git_dir() {
    if !support::root_or_skip("the git planting suite") {
        return;
    }
    for backend in BACKENDS {
        let f = Fixture::new(None);
        let o = f.aisb(&["test", "--backend", backend, "--json"]);
        assert_eq!(o.code, 0, "[{backend}] {}\n{}", o.stdout, o.stderr);
        let checks: Vec<serde_json::Value> = serde_json::from_str(&o.stdout).unwrap();
        let git: Vec<&serde_json::Value> = checks
            .iter()
            .filter(|c| c["check"].as_str().unwrap().contains("/.git"))
            .collect();
        assert!(git.len() >= 4, "[{backend}] {checks:#?}");
        assert!(git.iter().all(|c| c["ok"] == true), "[{backend}] {git:#?}");

        let mut cmd = Command::new(&f.exe);
        f.as_caller(&mut cmd);
        let o = Out::from(
            cmd.env("AISB_TEST_BREAK_ISOLATION", "git")
                .args(["test", "--backend", backend, "--json"])
                .output()
                .unwrap(),
        );
        assert_eq!(
            o.code, 1,
            "[{backend}] a writable .git passed `aisb test`: {}",
            o.stdout
        );
        let checks: Vec<serde_json::Value> = serde_json::from_str(&o.stdout).unwrap();
        let failed: Vec<&str> = checks
            .iter()
            .filter(|c| c["ok"] == false)
            .map(|c| c["check"].as_str().unwrap())
            .collect();
        assert!(
            failed.iter().any(|c| c.contains(".git/hooks"))
                && failed.iter().any(|c| c.contains(".git/config")),
            "[{backend}] {failed:?}"
        );
    }
}

/// A submodule added from inside, whose own git directory names a program: `git status` at
/// the top of the host repository looks into it. aisb moves its `.git` aside after the run.
#[test]
fn a_planted_submodule_does_not_run_on_the_host() {
    if !support::root_or_skip("the git planting suite") {
        return;
    }
    for (backend, user) in matrix() {
        let who = format!(
            "[{backend}, {}]",
            user.map_or("root".into(), |u| format!("uid {}", u.0))
        );
        let f = Fixture::new(user);
        let o = f.inside(
            backend,
            None,
            r#"
mkdir sub && cd sub && git init -q && git -c user.name=a -c user.email=a@a commit -q --allow-empty -m s &&
git config core.fsmonitor "touch $M/submodule-fsmonitor" && h=$(git rev-parse HEAD) && cd .. &&
git update-index --add --cacheinfo "160000,$h,sub" && echo planted=ok
"#,
        );
        o.expect("planted", "ok");
        assert!(
            o.stderr
                .contains("sub/.git was written by the sandbox (git on the host"),
            "{who} the planted submodule was not moved aside: {}",
            o.stderr
        );
        let log = f.host_uses_the_repository(backend, None);
        assert_eq!(
            f.marked(),
            Vec::<String>::new(),
            "{who} planted code ran on the host:\n{}",
            log.join("\n")
        );
    }
}

/// Hooks kept in the work tree (`core.hooksPath`, as husky sets it) run on the host as surely
/// as `.git/hooks`: read-only inside, on both backends.
#[test]
fn hooks_in_the_work_tree_are_read_only() {
    if !support::root_or_skip("the git planting suite") {
        return;
    }
    for (backend, user) in matrix() {
        let who = format!(
            "[{backend}, {}]",
            user.map_or("root".into(), |u| format!("uid {}", u.0))
        );
        let f = Fixture::new(None);
        std::fs::create_dir_all(f.proj().join(".husky")).unwrap();
        assert_eq!(f.git(&["config", "core.hooksPath", ".husky"]).code, 0);
        let mut f = f;
        if let Some((uid, gid)) = user {
            chown_r(f.root(), uid, gid);
            f.user = user;
        }
        let o = f.inside(
            backend,
            None,
            "printf '#!/bin/sh\\ntouch %s/husky\\n' \"$M\" > .husky/pre-commit; echo husky=$?",
        );
        o.expect_failed("husky", &format!("{who} wrote a hook into core.hooksPath"));
        let log = f.host_uses_the_repository(backend, None);
        assert_eq!(
            f.marked(),
            Vec::<String>::new(),
            "{who} planted code ran on the host:\n{}",
            log.join("\n")
        );
    }
}

/// A named sandbox cannot import another repository through the host's sync (issue 30): it
/// appends that repository's objects to its clone's alternates (or swaps the `objects/info`
/// directory for one of its own) and links a ref to that repository's branch. The host's
/// fetch must bring none of it into the user's repository.
#[test]
fn a_named_sandbox_cannot_import_another_repository() {
    if !support::root_or_skip("the git planting suite") {
        return;
    }
    for (backend, user) in matrix() {
        let who = format!(
            "[{backend}, {}]",
            user.map_or("root".into(), |u| format!("uid {}", u.0))
        );
        let f = Fixture::new(user);
        // Another repository on the machine, with a private commit.
        let other = f.root().join("other");
        support::git_in(f.root(), &["init", "-q", "-b", "main", "other"]);
        std::fs::write(other.join("private.txt"), "PRIVATE\n").unwrap();
        support::commit_all(&other, "private");
        let secret = Command::new("git")
            .args(["-C"])
            .arg(&other)
            .args(["rev-parse", "main"])
            .output()
            .unwrap();
        let secret = String::from_utf8_lossy(&secret.stdout).trim().to_string();
        let script = format!(
            "o={o}\n\
             echo \"$o/.git/objects\" >> .git/objects/info/alternates; echo append=$?\n\
             mv .git/objects/info .git/objects/info-old; echo swap_info=$?\n\
             mv .git/objects .git/objects-old; echo swap_objects=$?\n\
             ln -s \"$o/.git/refs/heads/main\" .git/refs/heads/stolen; echo link=$?\n\
             git update-ref refs/heads/touched HEAD\n\
             sleep 1\n",
            o = other.display()
        );
        let o = f.inside(backend, Some("imp"), &script);
        assert_eq!(o.code, 0, "{who} {}\n{}", o.stdout, o.stderr);
        o.expect_failed("append", "the clone's alternates are read-only");
        o.expect_failed("swap_info", "objects/info is pinned");
        o.expect_failed("swap_objects", "objects is pinned");
        // Whatever the sandbox managed, the user's repository holds nothing of the other's.
        f.aisb(&[
            "run",
            "--backend",
            backend,
            "--sandbox",
            "imp",
            "--",
            "true",
        ]);
        let has = f.git(&["cat-file", "-e", &secret]);
        assert_ne!(
            has.code, 0,
            "{who} the other repository's commit reached the user's"
        );
        let refs = f.git(&["for-each-ref", "--format=%(refname) %(objectname)"]);
        assert!(
            !refs.stdout.contains(&secret),
            "{who} a ref of the user's names the other repository's commit:\n{}",
            refs.stdout
        );
    }
}
