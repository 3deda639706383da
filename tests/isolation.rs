//! The isolation suite: every test attempts an escape from a real sandbox started by the
//! `aisb` binary and asserts that it failed, plus the positive side (project usable, tools on
//! PATH, exit codes exact). Run for every backend in `BACKENDS`.
//!
//! Needs root here (CI runs as root); an unprivileged run prints why it skips.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];
use support::{chown_r, test_user, Out};

/// Every (backend, caller) pair: root, and an ordinary user (uid, gid).
fn matrix() -> Vec<(&'static str, Option<(u32, u32)>)> {
    let user = test_user();
    let mut m: Vec<_> = BACKENDS.iter().map(|b| (*b, None)).collect();
    m.extend(BACKENDS.iter().map(|b| (*b, Some(user))));
    m
}

struct Sandbox {
    dir: tempfile::TempDir,
    /// Run as this (uid, gid) instead of root; the whole tree (and a copy of aisb) is theirs.
    user: Option<(u32, u32)>,
    exe: PathBuf,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox::as_user(None)
    }
    fn as_user(user: Option<(u32, u32)>) -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sandbox {
            dir,
            user,
            exe: PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
        };
        for d in ["home/.ssh", "home/.aws", "proj", "sibling"] {
            std::fs::create_dir_all(s.root().join(d)).unwrap();
        }
        std::fs::write(s.root().join("home/.ssh/id_ed25519"), "PRIVATE KEY").unwrap();
        std::fs::write(s.root().join("home/.aws/credentials"), "aws_secret").unwrap();
        std::fs::write(s.root().join("sibling/notes.txt"), "other project").unwrap();
        s.write(".gitignore", "ignored.txt\n");
        s.write(".gitattributes", "vault/* filter=git-crypt\n");
        s.write(".env", "API_KEY=1");
        s.write("ignored.txt", "ignored");
        s.write("vault/prod.yml", "crypted");
        s.write("src/main.rs", "fn main() {}");
        std::os::unix::fs::symlink(
            s.root().join("home/.ssh/id_ed25519"),
            s.proj().join("key-link"),
        )
        .unwrap();
        let git = |args: &[&str]| {
            let ok = Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .current_dir(s.proj())
                .output()
                .unwrap()
                .status
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        git(&["add", "-A"]);
        git(&["commit", "-qm", "init"]);
        if let Some((uid, gid)) = user {
            s.exe = support::hand_to_user(s.root(), uid, gid);
        }
        s
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn proj(&self) -> PathBuf {
        self.root().join("proj")
    }
    fn write(&self, rel: &str, content: &str) {
        let p = self.proj().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    /// `aisb` as the sandbox's owner would start it: in the project, with a clean environment
    /// whose home and cache are the fixture's.
    fn aisb(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        if let Some((uid, gid)) = self.user {
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        cmd.current_dir(self.proj())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.root().join("home"))
            .env("XDG_CACHE_HOME", self.root().join("cache"));
        cmd
    }
    fn run(&self, backend: &str, extra: &[&str], script: &str) -> Out {
        let out = self
            .aisb()
            .args(["run", "--backend", backend])
            .args(extra)
            .args(["--", "/bin/sh", "-c", script])
            .env("GITHUB_TOKEN", "ghp_leaked_value")
            .env("AWS_SECRET_ACCESS_KEY", "aws_leaked_value")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        Out::from(out)
    }
}

fn privileged() -> bool {
    support::root_or_skip("the isolation suite")
}

/// `name=$?` after a command, with its stderr kept for the message checks.
const ESCAPES: &str = r#"
try() { name=$1; shift; "$@" >/dev/null 2>>/tmp/err; echo "$name=$?"; }
try env_file cat .env
try gitignored cat ignored.txt
try gitcrypt cat vault/prod.yml
grep -c 'Permission denied' /tmp/err | sed 's/^/denied_msgs=/'
try ssh_key cat "$HOME/.ssh/id_ed25519"
try aws cat "$HOME/.aws/credentials"
try symlink_to_ssh cat key-link
try sibling cat ../sibling/notes.txt
try write_parent sh -c 'echo x > ../escape'
try write_usr sh -c 'echo x > /usr/escape'
try write_etc sh -c 'echo x > /etc/escape'
try shadow cat /etc/shadow
try proc1_root cat /proc/1/root/etc/shadow
try host_environ cat /proc/$HOST_PID/environ
echo "procs=$(ls /proc | grep -c '^[0-9]')"
echo "leaked_env=$(env | grep -c -e ghp_leaked -e aws_leaked)"
echo "capeff=$(grep CapEff /proc/self/status | cut -f2)"
echo "seccomp=$(grep '^Seccomp:' /proc/self/status | cut -f2)"
echo "nnp=$(grep NoNewPrivs /proc/self/status | cut -f2)"
try vsock python3 -c 'import socket; socket.socket(40, socket.SOCK_STREAM)'
try tiocsti python3 -c 'import pty, fcntl, termios; m, s = pty.openpty(); fcntl.ioctl(s, termios.TIOCSTI, b"x")'
try ptrace python3 -c 'import ctypes, sys; sys.exit(0 if ctypes.CDLL(None, use_errno=True).ptrace(0, 0, 0, 0) == 0 else 1)'
try keyctl python3 -c 'import ctypes, sys; l = ctypes.CDLL(None, use_errno=True); sys.exit(0 if l.syscall(250, 0, -3, 1) >= 0 else 1)'
try mount mount -t tmpfs none /tmp
try userns unshare -U true
try mountns unshare -m true
try net_out python3 -c 'import socket; socket.create_connection(("127.0.0.1", 1), timeout=1)'
echo "ifaces=$(ls /sys/class/net 2>/dev/null | tr '\n' ' ')"
try src_read cat src/main.rs
try src_write sh -c 'echo new > src/new.txt'
try tool_git git --version
try tool_python python3 -c 'print(1)'
echo "whoami=$(id -u):$(id -g)"
"#;

#[test]
fn escapes_fail_and_the_project_works() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let s = Sandbox::as_user(user);
        let script = ESCAPES.replace("$HOST_PID", &std::process::id().to_string());
        let o = s.run(backend, &[], &script);
        assert_eq!(
            o.code, 0,
            "[{backend} {user:?}] stdout:\n{}\nstderr:\n{}",
            o.stdout, o.stderr
        );
        for key in [
            "env_file",
            "gitignored",
            "gitcrypt",
            "ssh_key",
            "aws",
            "symlink_to_ssh",
            "sibling",
            "write_usr",
            "write_etc",
            "shadow",
            "proc1_root",
            "host_environ",
            "vsock",
            "tiocsti",
            "ptrace",
            "keyctl",
            "mount",
            "userns",
            "mountns",
            "net_out",
        ] {
            assert_ne!(
                o.value(key),
                Some("0"),
                "[{backend}] escape `{key}` succeeded\n{}",
                o.stdout
            );
            assert!(
                o.value(key).is_some(),
                "[{backend}] `{key}` did not run\n{}\n{}",
                o.stdout,
                o.stderr
            );
        }
        o.expect("denied_msgs", "3");
        o.expect("leaked_env", "0");
        o.expect("capeff", "0000000000000000");
        o.expect("seccomp", "2");
        o.expect("nnp", "1");
        for key in ["src_read", "src_write", "tool_git", "tool_python"] {
            o.expect(key, "0");
        }
        let procs: u32 = o.value("procs").unwrap().parse().unwrap();
        assert!(procs <= 6, "[{backend}] host processes visible: {procs}");
        let (uid, gid) = user.unwrap_or((
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        ));
        o.expect("whoami", &format!("{uid}:{gid}"));
        // Files the sandbox creates in the project belong to the caller on the host.
        let meta = std::os::unix::fs::MetadataExt::uid(
            &std::fs::metadata(s.proj().join("src/new.txt")).unwrap(),
        );
        assert_eq!(meta, uid, "[{backend}] new file owned by the caller");
        assert_eq!(
            std::fs::read_to_string(s.proj().join("src/new.txt")).unwrap(),
            "new\n"
        );
        // The project's parent is private to the sandbox (a tmpfs): a write there may succeed
        // inside, but must never reach the host.
        assert!(
            !s.root().join("escape").exists(),
            "[{backend}] a write outside the project reached the host"
        );
    }
}

/// The kernel surface the seccomp filter refuses (src/init/seccomp.rs), attempted from inside
/// with the exact answer expected: a refusal the kernel would give anyway (no capability, no
/// x32 ABI in this kernel) must not pass for the filter's. What only a capability guards
/// (`clock_settime`, `sethostname`, namespaces) is checked on the filter itself, in its unit
/// tests.
#[test]
fn kernel_surface_is_refused() {
    if !privileged() {
        return;
    }
    let expected = [
        ("io-uring", "refused: ENOSYS"),
        ("pidfd-getfd", "refused: EPERM"),
        ("x32", "refused: EPERM"),
        ("foreign-abi", "killed: SIGSYS"),
        ("personality", "refused: EPERM"),
        ("memfd-secret", "refused: ENOSYS"),
        ("netlink-audit", "refused: EAFNOSUPPORT"),
        ("tiocsetd", "refused: EPERM"),
        // What glibc's getifaddrs and AI_ADDRCONFIG need stays.
        ("netlink-route", "succeeded"),
    ];
    for (backend, user) in matrix() {
        let s = Sandbox::as_user(user);
        let probe = s.proj().join("aisb-probe");
        std::fs::copy(env!("CARGO_BIN_EXE_aisb-probe"), &probe).unwrap();
        if let Some((uid, gid)) = user {
            chown_r(&probe, uid, gid);
        }
        let mut script = String::new();
        for (name, _) in expected {
            script.push_str(&format!("echo \"{name}=$(./aisb-probe {name})\"\n"));
        }
        script.push_str(
            "echo \"vsock=$(python3 -c 'import socket; socket.socket(40, socket.SOCK_STREAM)' 2>&1 | tail -n1)\"\n",
        );
        let o = s.run(backend, &[], &script);
        let tag = format!("[{backend} {user:?}]");
        assert_eq!(o.code, 0, "{tag} {}\n{}", o.stdout, o.stderr);
        for (name, want) in expected {
            assert_eq!(o.value(name), Some(want), "{tag} {name}\n{}", o.stdout);
        }
        assert_eq!(
            o.value("vsock"),
            Some("OSError: [Errno 97] Address family not supported by protocol"),
            "{tag}"
        );
    }
}

#[test]
fn read_only_profile_refuses_writes() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let s = Sandbox::as_user(user);
        let o = s.run(backend, &["--profile", "investigate"], "cat src/main.rs >/dev/null; echo read=$?; (echo x > src/main.rs) 2>/dev/null; echo write=$?");
        o.expect("read", "0");
        assert_ne!(
            o.value("write"),
            Some("0"),
            "[{backend}] wrote in a read-only profile"
        );
        assert_eq!(
            std::fs::read_to_string(s.proj().join("src/main.rs")).unwrap(),
            "fn main() {}"
        );
    }
}

#[test]
fn exit_codes_and_signals_pass_through() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let s = Sandbox::as_user(user);
        assert_eq!(s.run(backend, &[], "exit 0").code, 0);
        assert_eq!(s.run(backend, &[], "exit 42").code, 42);
        assert_eq!(s.run(backend, &[], "kill -TERM $$").code, 143);
        assert_eq!(s.run(backend, &[], "kill -KILL $$").code, 137);
        let o = s.run(backend, &[], "exec /nonexistent/cmd");
        assert_eq!(o.code, 127, "{}", o.stderr);
    }
}

#[test]
fn up_gives_the_workload_the_terminal() {
    if !privileged() {
        return;
    }
    for backend in BACKENDS {
        let s = Sandbox::new();
        // `script` gives aisb a pseudo-terminal, as a user's terminal would. On libcontainer the
        // sandbox gets a terminal of its own (console socket), which must be its controlling one.
        let cmd = format!(
            "{} up --backend {backend} -- /bin/sh -c 'test -t 0 && test -t 1 && echo tty=yes; \
        ps -o tty= -p $$ | grep -q pts && echo ctty=yes; exit 7'",
            env!("CARGO_BIN_EXE_aisb")
        );
        let out = Command::new("script")
            .args(["-qec", &cmd, "/dev/null"])
            .current_dir(s.proj())
            .env("HOME", s.root().join("home"))
            .env("XDG_CACHE_HOME", s.root().join("cache"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("tty=yes"),
            "[{backend}] {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if *backend == "libcontainer" {
            assert!(
                stdout.contains("ctty=yes"),
                "[{backend}] no controlling terminal: {stdout}"
            );
        }
        assert_eq!(out.status.code(), Some(7), "[{backend}]");
    }
}

#[test]
fn copy_on_write_config_never_reaches_the_host() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let tag = format!("[{backend} {user:?}]");
        let s = Sandbox::as_user(user);
        std::fs::create_dir_all(s.root().join("home/.claude")).unwrap();
        std::fs::write(s.root().join("home/.claude/settings.json"), "host").unwrap();
        s.write("sandbox.kdl", "import \"preset:claude\"\n");
        if let Some((uid, gid)) = user {
            chown_r(s.root(), uid, gid);
        }
        // No private copies any more: an unprivileged bwrap's init mounts overlayfs too.
        let private_copy = false;
        let script = "echo sandbox > ~/.claude/settings.json; echo new > ~/.claude/new.txt; \
                      cat ~/.claude/settings.json; ls -A /run/aisb/overlay/0/rw 2>/dev/null; \
                      grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status | tr -d '\\t'";
        let o = s.run(backend, &["--trust"], script);
        assert_eq!(o.code, 0, "{tag} {}\n{}", o.stdout, o.stderr);
        assert_eq!(
            o.stderr
                .contains("is a private copy in the sandbox's state"),
            private_copy,
            "{tag} {}",
            o.stderr
        );
        // The layers are reachable only through the overlay; the init kept no capability.
        assert_eq!(
            o.stdout,
            "sandbox\nCapPrm:0000000000000000\nCapEff:0000000000000000\nCapBnd:0000000000000000\n",
            "{tag}"
        );
        assert_eq!(
            std::fs::read_to_string(s.root().join("home/.claude/settings.json")).unwrap(),
            "host",
            "{tag}"
        );
        assert!(!s.root().join("home/.claude/new.txt").exists(), "{tag}");
        // The next run sees its own earlier writes (the upper dir is kept in the sandbox's state).
        let o = s.run(backend, &["--trust"], "cat ~/.claude/new.txt");
        assert_eq!(o.stdout, "new\n", "{tag} {}", o.stderr);
        assert!(
            !o.stderr.contains("private copy"),
            "{tag} said twice: {}",
            o.stderr
        );
    }
    // With bwrap the init mounts copy-on-write dirs after everything else: a masked path inside
    // one would be uncovered, so that is refused, naming the mount, instead of run.
    let s = Sandbox::new();
    s.write("sandbox.kdl", "project access=\"overlay\"\n");
    // Masks inside are the init's now; anything else mounted inside is still refused.
    let o = s.run("bwrap", &["--trust"], "cat .env; echo done");
    assert!(
        (o.code == 125
            && o.stderr
                .contains("cannot express the copy-on-write (overlay) mount at"))
            || (o.code == 0 && o.stdout == "done\n"),
        "{} {}",
        o.stdout,
        o.stderr
    );
    let o = s.run(
        "libcontainer",
        &["--trust"],
        "cat .env; echo x > src/main.rs; echo done",
    );
    assert_eq!(o.stdout, "done\n", "{}", o.stderr);
    assert_eq!(
        std::fs::read_to_string(s.proj().join("src/main.rs")).unwrap(),
        "fn main() {}"
    );
}

/// Two runs of one profile at once cannot share its copy-on-write layer (overlayfs refuses an
/// upper dir another mount uses): the second is refused with what to do, the first is not
/// disturbed, and the layer is free again once the first ends. An unprivileged bwrap's private
/// copy is a plain directory that runs may share, so it is not claimed.
#[test]
fn a_copy_on_write_layer_serves_one_run_at_a_time() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        if backend == "bwrap" && user.is_some() {
            continue;
        }
        let tag = format!("[{backend} {user:?}]");
        let s = Sandbox::as_user(user);
        std::fs::create_dir_all(s.root().join("home/.claude")).unwrap();
        s.write("sandbox.kdl", "import \"preset:claude\"\n");
        if let Some((uid, gid)) = user {
            chown_r(s.root(), uid, gid);
        }
        let first = s
            .aisb()
            .args(["--trust", "run", "--backend", backend, "--", "/bin/sh", "-c"])
            .arg("echo first > ~/.claude/first; touch ~/.claude/started; sleep 4; cat ~/.claude/first")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The first run holds the layer once its workload wrote through it (20 s at most).
        let upper = s.root().join("cache");
        let started = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            walk_has(&upper, "started")
        });
        assert!(started, "{tag} the first run did not start");
        let o = s.run(backend, &["--trust"], "echo second > ~/.claude/first");
        assert_eq!(o.code, 125, "{tag} {}\n{}", o.stdout, o.stderr);
        // miette wraps the message; read it as one line.
        let said = o
            .stderr
            .replace('│', " ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            said.contains("copy-on-write layer of")
                && said.contains("in use by another run of this profile")
                && said.contains("aisb up NAME"),
            "{tag} {said}"
        );
        let out = first.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{tag} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "first\n", "{tag}");
        let o = s.run(backend, &["--trust"], "cat ~/.claude/first");
        assert_eq!(o.stdout, "first\n", "{tag} {}", o.stderr);
    }
}

/// Whether a file named `name` exists anywhere below `dir` (links not followed).
fn walk_has(dir: &Path, name: &str) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        e.file_name() == name
            || (e.file_type().is_ok_and(|t| t.is_dir()) && walk_has(&e.path(), name))
    })
}

/// `kill -9` of aisb while a sandbox runs leaves no process behind, on either backend.
#[test]
fn killing_aisb_leaves_no_process() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let s = Sandbox::as_user(user);
        let who = user.map_or("root".to_string(), |(uid, _)| uid.to_string());
        let marker = format!("aisb-orphan-{}-{backend}-{who}", std::process::id());
        let mut child = s
            .aisb()
            .args([
                "run",
                "--backend",
                backend,
                "--",
                "/bin/bash",
                "-c",
                &format!("exec -a {marker} sleep 300"),
            ])
            .spawn()
            .unwrap();
        let running = || {
            // Only the workload's own command line starts with the marker.
            let out = Command::new("pgrep")
                .args(["-f", &format!("^{marker} 300$")])
                .output()
                .unwrap();
            !out.stdout.is_empty()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !running() {
            assert!(
                std::time::Instant::now() < deadline,
                "[{backend} {who}] the sandbox never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        child.kill().unwrap();
        let _ = child.wait();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while running() {
            assert!(
                std::time::Instant::now() < deadline,
                "[{backend} {who}] the workload outlived aisb"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// An ordinary user who has not had the one-time root step gets told what it is.
#[test]
fn rootless_libcontainer_without_setup_names_the_root_step() {
    if !privileged() {
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let s = Sandbox::as_user(Some((nobody.uid.as_raw(), nobody.gid.as_raw())));
    let o = s.run("libcontainer", &[], "true");
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("nobody has no subordinate uids")
            && o.stderr.contains("aisb setup-user nobody"),
        "{}",
        o.stderr
    );
}

/// State left by a crashed libcontainer run (its aisb process is gone) is removed by the next.
#[test]
fn stale_libcontainer_state_is_removed() {
    if !privileged() {
        return;
    }
    let s = Sandbox::new();
    let plan = s.aisb().args(["plan", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let stale = PathBuf::from(v["state_dir"].as_str().unwrap()).join("libcontainer/aisb-4194303");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("state.json"), "{}").unwrap();
    let o = s.run("libcontainer", &[], "true");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!stale.exists(), "stale container state was left behind");
}

/// SIGTERM to aisb reaches the workload through the init: it ends, and aisb exits 128+15.
#[test]
fn sigterm_to_aisb_is_forwarded() {
    if !privileged() {
        return;
    }
    for backend in BACKENDS {
        let s = Sandbox::new();
        let mut child = s
            .aisb()
            .args([
                "run",
                "--backend",
                backend,
                "--",
                "/bin/sh",
                "-c",
                "echo started; exec sleep 300",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line, "started\n", "[{backend}]");
        let start = std::time::Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(143), "[{backend}]");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "[{backend}] took {:?}",
            start.elapsed()
        );
    }
}

#[test]
fn backend_from_config_and_flag() {
    if !privileged() {
        return;
    }
    let s = Sandbox::new();
    std::fs::write(s.proj().join("sandbox.kdl"), "backend \"bwrap\"\n").unwrap();
    let out = s
        .aisb()
        .args(["run", "--json", "--", "true"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"backend\":\"bwrap\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s
        .aisb()
        .args(["run", "--backend", "libcontainer", "--json", "--", "true"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"backend\":\"libcontainer\""),
        "the flag wins"
    );
}

/// `aisb test` attacks the configured sandbox from inside: every protection holds on both
/// backends, and a sandbox that leaks ~/.ssh is reported (exit 1).
#[test]
fn aisb_test_reports_expected_against_observed() {
    if !privileged() {
        return;
    }
    for backend in BACKENDS {
        let s = Sandbox::new();
        let out = Out::from(
            s.aisb()
                .args(["test", "--json", "--backend", backend])
                .env("GITHUB_TOKEN", "ghp_leaked_value")
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "[{backend}] {}\n{}", out.stdout, out.stderr);
        let checks: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let names: Vec<&str> = checks
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["check"].as_str().unwrap())
            .collect();
        for want in [
            ".env",
            "ignored.txt",
            "vault/prod.yml",
            "$GITHUB_TOKEN",
            "seccomp",
            "/.ssh",
            "io_uring_setup",
            "pidfd_getfd",
            "(pids limit 4096)",
        ] {
            assert!(
                names.iter().any(|n| n.contains(want)),
                "[{backend}] no check for {want}: {names:?}"
            );
        }
        let leaky = Out::from(
            s.aisb()
                .args(["test", "--backend", backend])
                .env("AISB_TEST_BREAK_ISOLATION", "ssh")
                .output()
                .unwrap(),
        );
        assert_eq!(leaky.code, 1, "[{backend}] {}", leaky.stdout);
        assert!(
            leaky
                .stdout
                .lines()
                .any(|l| l.starts_with("FAIL") && l.contains("/.ssh")),
            "[{backend}] {}",
            leaky.stdout
        );
    }
}

/// `xdg "sandbox"` (seed 003): the XDG variables point at the sandbox's own state dirs,
/// mounted over their places in the home, so neither a tool honouring the variables nor one
/// hard-coding `~/.config` sees or changes the host's; the next run sees the last one's writes.
#[test]
fn xdg_state_is_relocated_into_the_sandbox() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let s = Sandbox::as_user(user);
        for d in [".config", ".local/share", ".cache", ".local/state"] {
            std::fs::create_dir_all(s.root().join("home").join(d)).unwrap();
        }
        std::fs::write(s.root().join("home/.config/host-secret"), "host").unwrap();
        s.write("sandbox.kdl", "home \"ro\"\nxdg \"sandbox\"\n");
        if let Some((uid, gid)) = user {
            chown_r(s.root(), uid, gid);
        }
        let home = s.root().join("home");
        let script = "echo \"$XDG_CONFIG_HOME|$XDG_DATA_HOME|$XDG_CACHE_HOME|$XDG_STATE_HOME\"; \
             ls -A ~/.config; mkdir -p \"$XDG_CONFIG_HOME/app\" && echo mine > \"$XDG_CONFIG_HOME/app/rc\" \
             && echo cached > ~/.cache/c && echo written";
        let o = s.run(backend, &["--trust"], script);
        let tag = format!("[{backend} {user:?}]");
        assert_eq!(o.code, 0, "{tag} {}\n{}", o.stdout, o.stderr);
        let h = home.display();
        assert_eq!(
            o.stdout,
            format!("{h}/.config|{h}/.local/share|{h}/.cache|{h}/.local/state\nwritten\n"),
            "{tag} {}",
            o.stderr
        );
        // Nothing reached the host's directories.
        assert!(!home.join(".config/app").exists(), "{tag}");
        assert!(!home.join(".cache/c").exists(), "{tag}");
        let o = s.run(backend, &["--trust"], "cat ~/.config/app/rc ~/.cache/c");
        assert_eq!(o.stdout, "mine\ncached\n", "{tag} {}", o.stderr);
    }
}

/// `aisb test` holds for every built-in preset and per-task profile, and fails loudly for a
/// configuration weakened on purpose (the SSH directory mounted in).
#[test]
fn aisb_test_passes_for_every_preset_and_fails_for_a_weakened_one() {
    if !privileged() {
        return;
    }
    let s = Sandbox::new();
    std::fs::create_dir_all(s.root().join("home/.claude")).unwrap();
    // A masked file: its refused read must be in the audit log (issue 32).
    s.write(".env", "TOKEN=x\n");
    let run = |config: &str, args: &[&str]| {
        s.write("sandbox.kdl", config);
        Out::from(
            s.aisb()
                .args(["--trust", "test"])
                .args(args)
                .env("GITHUB_TOKEN", "ghp_leaked_value")
                .output()
                .unwrap(),
        )
    };
    // Every preset on both backends (as root, bwrap's init mounts the copy-on-write dirs);
    // the files aisb writes for claude and gemini must not be writable from inside.
    for backend in BACKENDS {
        for preset in ["claude", "codex", "aider", "opencode", "gemini"] {
            let o = run(
                &format!("import \"preset:{preset}\"\n"),
                &["--backend", backend],
            );
            let tag = format!("[{backend} {preset}]");
            assert_eq!(o.code, 0, "{tag} {}\n{}", o.stdout, o.stderr);
            assert!(o.stdout.contains(" 0 failed"), "{tag} {}", o.stdout);
            assert!(
                o.stdout.lines().any(|l| l.starts_with("ok")
                    && l.contains("refused reads of masked files are in the audit log")),
                "{tag} {}",
                o.stdout
            );
            let dir = match preset {
                "claude" => Some("/etc/claude-code"),
                "gemini" => Some("/etc/gemini-cli"),
                _ => None,
            };
            if let Some(dir) = dir {
                assert!(
                    o.stdout
                        .lines()
                        .any(|l| l.starts_with("ok") && l.contains(dir)),
                    "{tag} {}",
                    o.stdout
                );
            }
        }
    }
    for backend in BACKENDS {
        for profile in ["investigate", "fix", "implement"] {
            let o = run("", &["--backend", backend, "--profile", profile]);
            assert_eq!(
                o.code, 0,
                "[{backend} {profile}] {}\n{}",
                o.stdout, o.stderr
            );
        }
        // Refused but not reported: `aisb test` says so.
        s.write("sandbox.kdl", "");
        let o = Out::from(
            s.aisb()
                .args(["--trust", "test", "--backend", backend])
                .env("AISB_TEST_BREAK_ISOLATION", "report")
                .output()
                .unwrap(),
        );
        assert_eq!(o.code, 1, "[{backend}] {}\n{}", o.stdout, o.stderr);
        assert!(
            o.stdout.lines().any(|l| l.starts_with("FAIL")
                && l.contains("refused reads of masked files are in the audit log")),
            "[{backend}] {}",
            o.stdout
        );
        let o = run("mount \"~/.ssh\"\n", &["--backend", backend]);
        assert_eq!(o.code, 1, "[{backend}] {}\n{}", o.stdout, o.stderr);
        assert!(
            o.stdout
                .lines()
                .any(|l| l.starts_with("FAIL") && l.contains("/.ssh") && l.contains("SUCCEEDED")),
            "{}",
            o.stdout
        );
    }
}

/// The store keeps what a sandbox's run used and gc removes the rest; an entry left without
/// its ready marker (a crash) is rebuilt, not used.
#[test]
fn store_entries_are_kept_while_used_and_rebuilt_when_incomplete() {
    if !privileged() {
        return;
    }
    let s = Sandbox::new();
    s.write("sandbox.kdl", "import \"preset:claude\"\n");
    std::fs::create_dir_all(s.root().join("home/.claude")).unwrap();
    // `aisb plan` says what the store lacks, then that it has it.
    let store_lines = || {
        let o = Out::from(s.aisb().arg("plan").output().unwrap());
        o.stdout
            .lines()
            .filter(|l| {
                let l = l.trim_start();
                l.starts_with("etc snapshot ") || l.starts_with("generated ")
            })
            .map(|l| {
                if l.ends_with("made at the next run") {
                    "made at the next run"
                } else if l.ends_with("ready") {
                    "ready"
                } else {
                    "?"
                }
            })
            .collect::<Vec<_>>()
    };
    // The /etc snapshot, Claude's managed settings, the DNS stub's resolv.conf.
    assert_eq!(store_lines(), ["made at the next run"; 3]);
    let o = s.run(
        "bwrap",
        &["--trust"],
        "cat /etc/claude-code/managed-settings.json >/dev/null && echo ok",
    );
    assert_eq!(o.stdout, "ok\n", "{}", o.stderr);
    assert_eq!(store_lines(), ["ready"; 3]);
    // Every node `aisb plan` lists has its hash, the masking file and the proxy's policy too.
    let o = Out::from(s.aisb().args(["plan", "--json"]).output().unwrap());
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let nodes = v["host_nodes"].as_array().unwrap();
    for n in nodes {
        let h = n["hash"].as_str().unwrap_or("");
        assert!(
            h.len() >= 16 && h.bytes().take(16).all(|b| b.is_ascii_hexdigit()),
            "a node without its hash: {n}"
        );
    }
    let kinds: Vec<&str> = nodes.iter().filter_map(|n| n["kind"].as_str()).collect();
    for k in ["etc snapshot", "generated", "masking file", "proxy policy"] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    let ls = || {
        let o = Out::from(s.aisb().args(["store", "ls", "--json"]).output().unwrap());
        serde_json::from_str::<Vec<serde_json::Value>>(&o.stdout).unwrap()
    };
    let entries = ls();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(names.iter().any(|n| n.ends_with("-etc")), "{names:?}");
    let claude = entries
        .iter()
        .find(|e| e["name"].as_str().unwrap().ends_with("-claude-managed"))
        .unwrap();
    assert_eq!(claude["ready"], true);
    assert_eq!(claude["used_by"].as_array().unwrap().len(), 1);
    // An unused entry goes; the used ones stay.
    let store = s.root().join("cache/aisb/store");
    std::fs::create_dir_all(store.join("0000-stale")).unwrap();
    let o = Out::from(s.aisb().args(["store", "gc"]).output().unwrap());
    assert!(o.stdout.contains("removed 0000-stale"), "{}", o.stdout);
    assert_eq!(ls().len(), entries.len());
    // Without its marker the managed settings entry is not trusted: the next run rebuilds it.
    let dir = std::path::PathBuf::from(claude["path"].as_str().unwrap());
    let mut marker = dir.clone().into_os_string();
    marker.push(".ready");
    std::fs::remove_file(&marker).ok();
    std::fs::write(dir.join("managed-settings.json"), "tampered").unwrap();
    let o = s.run(
        "bwrap",
        &["--trust"],
        "head -c 1 /etc/claude-code/managed-settings.json",
    );
    assert_eq!(o.stdout, "{", "{}", o.stderr);
}

/// Every process below `pid` (children first found by their parent in /proc/*/stat).
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        out.extend(parents.iter().filter(|(_, pp)| *pp == cur).map(|(p, _)| *p));
        i += 1;
    }
    out.split_off(1)
}

/// The host directory of the `controller` cgroup `pid` is in (its v1 hierarchy's line, or
/// v2's one), when it is one aisb made.
fn cgroup_of(pid: u32, controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
        let dir = match ctrl {
            c if c == controller => Path::new("/sys/fs/cgroup")
                .join(c)
                .join(path.trim_start_matches('/')),
            "" if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() => {
                Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'))
            }
            _ => return None,
        };
        // aisb's sandboxes' cgroups are below an `aisb` directory (root's, or a user's there).
        path.starts_with("/aisb/").then_some(dir)
    })
}

/// A bounded fork bomb (at most 6,000 `sleep 60`s, all gone with the sandbox)
/// under the default limits: it gets no more than the pids limit, the host still starts
/// processes while the bomb holds every slot, aisb says which limit stopped it and how to
/// raise it, the workload's exit code passes through, and the sandbox's cgroup is gone after.
#[test]
fn a_fork_bomb_is_contained_by_the_default_pids_limit() {
    if !privileged() {
        return;
    }
    const BOMB: &str = r#"
import os, sys
n = 0
try:
    while n < 6000:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "60"])
        n += 1
except OSError as e:
    print("errno=%d" % e.errno)
print("forked=%d" % n, flush=True)
sys.stdin.read()
sys.exit(3)
"#;
    for (backend, user) in matrix() {
        let tag = format!("[{backend} {user:?}]");
        let s = Sandbox::as_user(user);
        let mut child = s
            .aisb()
            .args(["run", "--backend", backend, "--", "python3", "-c", BOMB])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() == 0 {
                break;
            }
            let done = line.starts_with("forked=");
            lines.push(line.trim().to_string());
            if done {
                break;
            }
        }
        let forked: u64 = lines
            .iter()
            .find_map(|l| l.strip_prefix("forked="))
            .unwrap_or_else(|| panic!("{tag} {lines:?}"))
            .parse()
            .unwrap();
        // EAGAIN at the limit, less the few tasks the runtime and the init take.
        assert!(
            (4096 - 16..4096).contains(&forked),
            "{tag} the bomb started {forked} processes (pids limit 4096)"
        );
        assert_eq!(
            lines.first().map(String::as_str),
            Some("errno=11"),
            "{tag} {lines:?}"
        );
        // The bomb holds every slot it got: the host still starts processes, and the sandbox
        // is in a cgroup of its own.
        let host = Command::new("/bin/true").status();
        assert!(
            host.is_ok_and(|st| st.success()),
            "{tag} the host cannot start a process"
        );
        let cgroup = descendants(child.id())
            .into_iter()
            .find_map(|p| cgroup_of(p, "pids"))
            .unwrap_or_else(|| panic!("{tag} the sandbox is in no pids cgroup of its own"));
        assert!(cgroup.is_dir(), "{tag} {}", cgroup.display());
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{tag} {stderr}");
        assert!(
            stderr.contains(
                "the sandbox hit its pids limit of 4096 processes and threads (aisb's default)"
            ) && stderr.contains("`limits { pids 8192 }`"),
            "{tag} {stderr}"
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while cgroup.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            !cgroup.exists(),
            "{tag} {} was left behind",
            cgroup.display()
        );
    }
}

/// `aisb run --backend BACKEND -- /bin/sh -c SCRIPT` in `s`, its standard streams piped; the
/// child and a reader of its output.
fn spawn_piped(
    s: &Sandbox,
    backend: &str,
    script: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = s
        .aisb()
        .args(["run", "--backend", backend, "--", "/bin/sh", "-c"])
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

/// An allocation over `limits { memory … }` is killed by the kernel: only that process (the
/// shell that started it carries on), aisb names the memory limit, and 137 passes through.
/// The sandbox's memory cgroup is gone after.
#[test]
fn an_allocation_over_the_memory_limit_kills_only_the_workload() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let tag = format!("[{backend} {user:?}]");
        let s = Sandbox::as_user(user);
        s.write("sandbox.kdl", "limits {\n    memory \"64M\"\n}\n");
        if let Some((uid, gid)) = user {
            chown_r(s.root(), uid, gid);
        }
        let (mut child, mut stdout) = spawn_piped(
            &s,
            backend,
            "echo ready; read go; python3 -c 'b = b\"x\" * (256 << 20); print(\"allocated\")'; r=$?; echo survivor=$r; exit $r",
        );
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert_eq!(line, "ready\n", "{tag}");
        let cgroup = descendants(child.id())
            .into_iter()
            .find_map(|p| cgroup_of(p, "memory"))
            .unwrap_or_else(|| panic!("{tag} the sandbox is in no memory cgroup of its own"));
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let out = child.wait_with_output().unwrap();
        let o = Out {
            stdout: rest,
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            code: out.status.code().unwrap_or(-1),
        };
        assert_eq!(o.stdout, "survivor=137\n", "{tag} {}", o.stderr);
        assert!(
            !cgroup.exists(),
            "{tag} {} was left behind",
            cgroup.display()
        );
        assert_eq!(o.code, 137, "{tag} {}", o.stderr);
        assert!(
            o.stderr.contains("the sandbox ran out of memory: the kernel killed 1 process at its memory limit of 64M (set at ")
                && o.stderr.contains("`limits { memory \"128M\" }`"),
            "{tag} {}",
            o.stderr
        );
        // Under the limit, the same allocation's smaller sibling works.
        let o = s.run(
            backend,
            &["--trust"],
            "python3 -c 'b = b\"x\" * (16 << 20); print(\"ok\")'",
        );
        assert_eq!(
            (o.code, o.stdout.as_str()),
            (0, "ok\n"),
            "{tag} {}",
            o.stderr
        );
        assert!(!o.stderr.contains("out of memory"), "{tag} {}", o.stderr);
    }
}

/// Nothing configured, the sandbox still has a memory limit (half the host's memory, in its
/// own memory cgroup) and its private /tmp a size (a quarter of the host's memory): a runaway
/// allocation or a /tmp filled from inside never takes the host's last pages (issue 29,
/// item 6). Both backends, root and a user.
#[test]
fn a_sandbox_has_a_memory_limit_and_a_bounded_tmp_by_default() {
    if !privileged() {
        return;
    }
    let total: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .unwrap()
        * 1024;
    let memory = ((total / 2).max(1 << 30) >> 20) << 20;
    let tmp = ((total / 4).max(64 << 20) >> 20) << 20;
    for (backend, user) in matrix() {
        let tag = format!("[{backend} {user:?}]");
        let s = Sandbox::as_user(user);
        s.write("README", "hi\n");
        if let Some((uid, gid)) = user {
            chown_r(s.root(), uid, gid);
        }
        let (mut child, mut stdout) = spawn_piped(
            &s,
            backend,
            "stat -f -c 'tmp=%b*%S' /tmp; echo ready; read go",
        );
        let mut line = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        let blocks = line
            .trim()
            .strip_prefix("tmp=")
            .unwrap_or_else(|| panic!("{tag} {line}"));
        let (b, sz) = blocks.split_once('*').unwrap();
        let size: u64 = b.parse::<u64>().unwrap() * sz.parse::<u64>().unwrap();
        assert_eq!(size, tmp, "{tag} /tmp's size");
        line.clear();
        std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert_eq!(line, "ready\n", "{tag}");
        let cgroup = descendants(child.id())
            .into_iter()
            .find_map(|p| cgroup_of(p, "memory"))
            .unwrap_or_else(|| panic!("{tag} the sandbox is in no memory cgroup of its own"));
        let limit = ["memory.limit_in_bytes", "memory.max"]
            .iter()
            .find_map(|f| std::fs::read_to_string(cgroup.join(f)).ok())
            .unwrap_or_else(|| panic!("{tag} no memory limit file in {}", cgroup.display()));
        assert_eq!(
            limit.trim(),
            memory.to_string(),
            "{tag} {}",
            cgroup.display()
        );
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"go\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{tag} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `aisb test` proves the pids limit holds (more processes than it allows are refused) and
/// fails when it does not: a sandbox run without its limits (the test switch) is reported.
#[test]
fn aisb_test_checks_the_pids_limit() {
    if !privileged() {
        return;
    }
    for (backend, user) in matrix() {
        let tag = format!("[{backend} {user:?}]");
        let s = Sandbox::as_user(user);
        s.write("sandbox.kdl", "limits {\n    pids 64\n}\n");
        if let Some((uid, gid)) = user {
            chown_r(s.root(), uid, gid);
        }
        let line = |o: &Out| {
            o.stdout
                .lines()
                .find(|l| l.contains("start 65 processes (pids limit 64)"))
                .map(str::to_string)
        };
        let o = Out::from(
            s.aisb()
                .args(["test", "--backend", backend])
                .output()
                .unwrap(),
        );
        assert_eq!(o.code, 0, "{tag} {}\n{}", o.stdout, o.stderr);
        let ok = line(&o).unwrap_or_default();
        assert!(
            ok.starts_with("ok") && ok.contains("refused"),
            "{tag} {}",
            o.stdout
        );
        let o = Out::from(
            s.aisb()
                .args(["test", "--backend", backend])
                .env("AISB_TEST_BREAK_ISOLATION", "pids")
                .output()
                .unwrap(),
        );
        assert_eq!(o.code, 1, "{tag} {}\n{}", o.stdout, o.stderr);
        let failed = line(&o).unwrap_or_default();
        assert!(
            failed.starts_with("FAIL") && failed.contains("SUCCEEDED"),
            "{tag} {}",
            o.stdout
        );
    }
}

/// An ordinary user with no cgroup of their own (no `aisb setup-user`): the pids limit is the
/// init's RLIMIT_NPROC, counted in the sandbox's own user namespace (the user's 80 processes
/// outside do not count against it, and it still stops a bomb); a memory limit, which nothing
/// can enforce for them, is refused before anything runs.
#[test]
fn without_a_cgroup_the_pids_limit_is_an_rlimit_and_memory_is_refused() {
    if !privileged() {
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let (uid, gid) = (nobody.uid.as_raw(), nobody.gid.as_raw());
    let s = Sandbox::as_user(Some((uid, gid)));
    s.write("sandbox.kdl", "limits {\n    pids 64\n}\n");
    chown_r(s.root(), uid, gid);
    let mut outside: Vec<std::process::Child> = (0..80)
        .map(|_| {
            let mut c = Command::new("sleep");
            std::os::unix::process::CommandExt::uid(&mut c, uid);
            std::os::unix::process::CommandExt::gid(&mut c, gid);
            c.arg("60").spawn().unwrap()
        })
        .collect();
    let o = s.run(
        "bwrap",
        &[],
        "python3 -c 'import os\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n            os.execv(\"/bin/sleep\", [\"sleep\", \"60\"])\n        n += 1\nexcept OSError as e:\n    print(\"errno=%d\" % e.errno)\nprint(\"forked=%d\" % n)'",
    );
    for c in &mut outside {
        let _ = c.kill();
        let _ = c.wait();
    }
    o.expect("errno", "11");
    let forked: u32 = o.value("forked").unwrap().parse().unwrap();
    assert!((56..64).contains(&forked), "forked {forked}\n{}", o.stderr);
    s.write("sandbox.kdl", "limits {\n    memory \"1G\"\n}\n");
    let o = s.run("bwrap", &[], "echo ran");
    assert_eq!((o.code, o.stdout.as_str()), (125, ""), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("the memory limit set at sandbox.kdl:2 cannot be enforced here")
            && o.stderr.contains("aisb setup-user nobody"),
        "{}",
        o.stderr
    );
}

/// The cgroup aisb makes for a bwrap sandbox outlives an aisb killed with SIGKILL (nothing
/// can run at that point), and so may the sandbox when aisb dies while bwrap sets up; the next
/// run removes both.
#[test]
fn a_killed_run_s_cgroup_is_removed_by_the_next() {
    if !privileged() {
        return;
    }
    for user in [None, Some(test_user())] {
        let tag = format!("[bwrap {user:?}]");
        let s = Sandbox::as_user(user);
        let mut child = s
            .aisb()
            .args(["run", "--backend", "bwrap", "--", "sleep", "300"])
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let cgroup = loop {
            if let Some(c) = descendants(child.id())
                .into_iter()
                .find_map(|p| cgroup_of(p, "pids"))
            {
                break c;
            }
            assert!(std::time::Instant::now() < deadline, "{tag} no cgroup");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        child.kill().unwrap();
        let _ = child.wait();
        assert!(
            cgroup.is_dir(),
            "{tag} nothing to clean up: {}",
            cgroup.display()
        );
        let o = s.run("bwrap", &[], "true");
        assert_eq!(o.code, 0, "{tag} {}", o.stderr);
        assert!(
            !cgroup.exists(),
            "{tag} {} was left behind",
            cgroup.display()
        );
    }
}
