//! Sessions of named sandboxes, as root and as an ordinary user, on both backends: the
//! sandbox starts, a second session joins it while it runs (`aisb exec NAME`, `aisb up NAME`),
//! the commits made inside reach the host, and a session's process is hardened exactly as the
//! init's own workload (no capabilities, no_new_privs, the seccomp filter with io_uring
//! refused). Also: commands are found and run as `execvp` finds and runs them, by the init and
//! by a session alike.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{test_user, Out};

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];

/// Every (backend, caller) pair: root, and an ordinary user (uid, gid).
fn matrix() -> Vec<(&'static str, Option<(u32, u32)>)> {
    let user = test_user();
    let mut m: Vec<_> = BACKENDS.iter().map(|b| (*b, None)).collect();
    m.extend(BACKENDS.iter().map(|b| (*b, Some(user))));
    m
}

fn who(backend: &str, user: Option<(u32, u32)>) -> String {
    format!(
        "[{backend}, {}]",
        user.map_or("root".into(), |u| format!("uid {}", u.0))
    )
}

/// A repository with one commit, owned by the caller, and the caller's own copy of aisb (the
/// build tree may not be reachable for an ordinary user).
struct Fixture {
    dir: tempfile::TempDir,
    user: Option<(u32, u32)>,
    exe: PathBuf,
}

impl Fixture {
    fn new(user: Option<(u32, u32)>) -> Fixture {
        let mut f = Fixture {
            dir: tempfile::tempdir().unwrap(),
            user: None,
            exe: PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
        };
        for d in ["home", "repo"] {
            std::fs::create_dir_all(f.root().join(d)).unwrap();
        }
        std::fs::write(f.repo().join("README"), "hello\n").unwrap();
        // A secret committed by mistake: masked inside, by the init (a session joins the
        // mount namespace it masked in).
        std::fs::write(f.repo().join(".env"), "TOKEN=1\n").unwrap();
        for args in [
            &["init", "-q", "-b", "main"][..],
            &["add", "README", ".env"],
            &["commit", "-qm", "one"],
        ] {
            let o = f.git(args);
            assert_eq!(o.code, 0, "git {args:?}: {}", o.stderr);
        }
        if let Some((uid, gid)) = user {
            f.exe = support::hand_to_user(f.root(), uid, gid);
        }
        f.user = user;
        f
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn repo(&self) -> PathBuf {
        self.root().join("repo")
    }
    fn as_caller(&self, cmd: &mut Command) {
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(cmd, uid);
            std::os::unix::process::CommandExt::gid(cmd, gid);
        }
        cmd.current_dir(self.repo())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.root().join("home"))
            .env("XDG_CACHE_HOME", self.root().join("cache"))
            .stdin(Stdio::null());
    }
    /// git on the host, as the caller.
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
    /// The sandbox's owner, running `script` in sandbox `name`, in the background.
    fn spawn_owner(&self, backend: &str, name: &str, script: &str) -> Owner {
        let mut cmd = Command::new(&self.exe);
        self.as_caller(&mut cmd);
        let child = cmd
            .args(["run", "--backend", backend, "--sandbox", name, "--"])
            .args(["/bin/sh", "-c", script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Owner(Some(child))
    }
    /// `aisb exec name -- ARGS`, retried until the sandbox is up (a session is refused until
    /// then), for at most 30 s.
    fn exec_when_up(&self, name: &str, args: &[&str]) -> Out {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut full = vec!["exec", name, "--"];
        full.extend(args);
        loop {
            let o = self.aisb(&full);
            if o.code == 0 || Instant::now() > deadline {
                return o;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The sandbox's owner, killed if the test fails before it finishes (a failed assertion must
/// not leave a sandbox running; killing the owner ends the sandbox and its sessions).
struct Owner(Option<Child>);

impl Drop for Owner {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits for the owner (at most 60 s: then it is killed, and the test fails), then returns
/// its output.
fn finish(mut owner: Owner) -> Out {
    let child = owner.0.take().expect("an owner finishes once");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => Out::from(out.unwrap()),
        Err(_) => {
            // Not reaped yet (its waiter is still waiting): the pid is still this child's.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("the sandbox's owner did not finish within 60 s");
        }
    }
}

fn privileged() -> bool {
    support::root_or_skip("the session suite")
}

/// What the kernel says about a process's isolation, as `KEY=value` lines, and an io_uring
/// attempt (`/run/aisb/init probe`, present in every sandbox).
const HARDENING: &str = r#"
for k in CapInh CapPrm CapEff CapBnd CapAmb NoNewPrivs Seccomp; do
    printf '%s=%s\n' "$k" "$(grep "^$k:" /proc/self/status | cut -f2)"
done
echo "io_uring=$(/run/aisb/init probe io-uring)"
fds=$(ls /proc/self/fd)
echo "fds="$fds
for f in /proc/$$/fd/*; do
    if [ -d "$f" ]; then echo "dirfd=$f -> $(readlink "$f")"; fi
done
# The attack itself: from a descriptor of a host directory, `..` up to the host's / and down
# to a file the sandbox cannot see (its path in $AISB_TEST_SECRET_PATH, given below).
cat /proc/$$/fd/*/../../..$AISB_TEST_SECRET_PATH /proc/$$/fd/*/../..$AISB_TEST_SECRET_PATH 2>/dev/null || true
"#;

/// Each line of [`HARDENING`] as it must read, for the workload and every session.
const HARDENED: &[(&str, &str)] = &[
    ("CapInh", "0000000000000000"),
    ("CapPrm", "0000000000000000"),
    ("CapEff", "0000000000000000"),
    ("CapBnd", "0000000000000000"),
    ("CapAmb", "0000000000000000"),
    ("NoNewPrivs", "1"),
    ("Seccomp", "2"),
    ("io_uring", "refused: ENOSYS"),
    // Only the standard three (and `ls`'s own listing): a host descriptor (the session helper
    // held the init's /proc/PID) would let anything inside walk `..` from it to the host's `/`.
    ("fds", "0 1 2 3"),
];

#[test]
fn a_named_sandbox_takes_second_sessions_and_syncs_commits_as_root_and_as_a_user() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let who = who(backend, user);
        let f = Fixture::new(user);
        let owner = f.spawn_owner(
            backend,
            "live",
            "echo x >> README; \
             git -c user.name=a -c user.email=a@a commit -qam live && echo committed=yes; \
             echo up > /tmp/up; \
             while ! test -e /tmp/done; do sleep 0.1; done; echo owner=done",
        );
        // `aisb exec NAME`: a second session, in the same sandbox (it sees the owner's /tmp).
        // (Retried until the owner's command has written /tmp/up.)
        let o = f.exec_when_up(
            "live",
            &[
                "/bin/sh",
                "-c",
                "cat /tmp/up && id -u && ! cat .env 2>/dev/null",
            ],
        );
        let uid = user.map_or(0, |u| u.0);
        assert_eq!(
            (o.code, o.stdout.as_str()),
            (0, format!("up\n{uid}\n").as_str()),
            "{who} aisb exec: {}",
            o.stderr
        );
        // `aisb up NAME` while it runs joins it too; it sees the owner's commit in the clone.
        let o = f.aisb(&[
            "up",
            "live",
            "--",
            "/bin/sh",
            "-c",
            "cat /tmp/up; git log -1 --format=%s; touch /tmp/done",
        ]);
        assert_eq!(
            (o.code, o.stdout.as_str()),
            (0, "up\nlive\n"),
            "{who} aisb up: {}",
            o.stderr
        );
        let owner = finish(owner);
        assert_eq!(owner.code, 0, "{who} {}\n{}", owner.stdout, owner.stderr);
        owner.expect("committed", "yes");
        owner.expect("owner", "done");
        let synced = f.git(&["log", "-1", "--format=%s", "sandbox-live/main"]);
        assert_eq!(synced.stdout.trim(), "live", "{who} {}", synced.stderr);
        // The host's own branch never moves.
        assert_eq!(
            f.git(&["log", "-1", "--format=%s", "main"]).stdout.trim(),
            "one"
        );
    }
}

#[test]
fn a_session_is_hardened_exactly_like_the_workload() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let who = who(backend, user);
        let f = Fixture::new(user);
        // A file outside the project that only the host sees, readable by the caller.
        let secret = f.root().join("host-secret");
        std::fs::write(&secret, "host-only secret\n").unwrap();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&secret, Some(uid), Some(gid)).unwrap();
        }
        let script = format!("AISB_TEST_SECRET_PATH={}\n{HARDENING}", secret.display());
        let owner = f.spawn_owner(
            backend,
            "hard",
            &format!("{script}\nwhile ! test -e /tmp/done; do sleep 0.1; done"),
        );
        let session = f.exec_when_up("hard", &["/bin/sh", "-c", &script]);
        let _ = f.aisb(&["exec", "hard", "--", "touch", "/tmp/done"]);
        let workload = finish(owner);
        assert_eq!(
            session.code, 0,
            "{who} {}\n{}",
            session.stdout, session.stderr
        );
        assert_eq!(
            workload.code, 0,
            "{who} {}\n{}",
            workload.stdout, workload.stderr
        );
        for (what, out) in [("the workload", &workload), ("a session", &session)] {
            assert!(
                !out.stdout.contains("host-only secret"),
                "{who} {what} read a host file through a descriptor:\n{}",
                out.stdout
            );
            assert!(
                !out.stdout.contains("dirfd="),
                "{who} {what} holds a directory descriptor (`..` from one outside its root reaches the host's /):\n{}",
                out.stdout
            );
            for (key, want) in HARDENED {
                assert_eq!(
                    out.value(key),
                    Some(*want),
                    "{who} {what}: {key}\n{}\n{}",
                    out.stdout,
                    out.stderr
                );
            }
        }
    }
}

/// The init and a session find a command as `execvp` does: a name without a slash along PATH
/// (127 and "not found" when it is nowhere), a file that is not executable refused (126), a
/// script without `#!` run by `/bin/sh`.
#[test]
fn commands_are_found_and_run_as_execvp_does() {
    if !privileged() {
        return;
    }
    for backend in BACKENDS {
        let f = Fixture::new(None);
        std::fs::write(f.repo().join("plain-script"), "echo ran-by-sh\n").unwrap();
        std::fs::write(f.repo().join("data"), "not a program\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            f.repo().join("plain-script"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        // Committed: a named sandbox works in a clone, which has what is committed.
        for args in [
            &["add", "plain-script", "data"][..],
            &["commit", "-qm", "files"],
        ] {
            let o = f.git(args);
            assert_eq!(o.code, 0, "git {args:?}: {}", o.stderr);
        }
        let owner = f.spawn_owner(
            backend,
            "paths",
            "while ! test -e /tmp/done; do sleep 0.1; done",
        );
        let _ = f.exec_when_up("paths", &["true"]);
        for (how, prefix) in [
            ("the init", vec!["run", "--backend", backend, "--"]),
            ("a session", vec!["exec", "paths", "--"]),
        ] {
            let run = |cmd: &str| {
                let mut args = prefix.clone();
                args.push(cmd);
                f.aisb(&args)
            };
            let o = run("no-such-program-anywhere");
            assert_eq!(o.code, 127, "[{backend}] {how}: {}", o.stderr);
            assert!(
                o.stderr
                    .contains("aisb: cannot run `no-such-program-anywhere`: not found"),
                "[{backend}] {how}: {}",
                o.stderr
            );
            let o = run("./data");
            assert_eq!(o.code, 126, "[{backend}] {how}: {}", o.stderr);
            assert!(
                o.stderr
                    .contains("aisb: cannot run `./data`: permission denied"),
                "[{backend}] {how}: {}",
                o.stderr
            );
            let o = run("./plain-script");
            assert_eq!(
                (o.code, o.stdout.as_str()),
                (0, "ran-by-sh\n"),
                "[{backend}] {how}: {}",
                o.stderr
            );
            // Found along the sandbox's PATH.
            let o = run("id");
            assert_eq!(o.code, 0, "[{backend}] {how}: {}", o.stderr);
        }
        let _ = f.aisb(&["exec", "paths", "--", "touch", "/tmp/done"]);
        let owner = finish(owner);
        assert_eq!(owner.code, 0, "[{backend}] {}", owner.stderr);
    }
}
