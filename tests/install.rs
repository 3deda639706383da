//! aisb as a user installs it: `cargo install --path . --root DIR`, then every verb from that
//! DIR, and the same with `aisb` alone (what `cargo run` or a copied binary gives: no
//! `aisb-init` beside it, so the full binary serves as the sandbox's init). Each layout runs,
//! on both backends: `run`, `up NAME -- true`, `exec NAME` into a running named sandbox, an SSH
//! tunnel through the init's `connect` (git's ProxyCommand), and an agent's hook event
//! (`agent-event`) that reaches the audit log. The test probe is not installed.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::Out;

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];

/// `cargo install` into `root`, reusing this build's target directory (a debug install: the
/// release profile's fat LTO takes minutes on a shared 2-core machine, and the test is about
/// what is installed, not how it is optimised).
fn cargo_install(root: &Path) -> Out {
    let target = PathBuf::from(env!("CARGO_BIN_EXE_aisb"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let out = Command::new(env!("CARGO"))
        .args([
            "install",
            "--debug",
            "--locked",
            "--offline",
            "--quiet",
            "--path",
        ])
        .arg(env!("CARGO_MANIFEST_DIR"))
        .arg("--root")
        .arg(root)
        .env("CARGO_TARGET_DIR", target)
        // Not into the user's ~/.cargo/bin list of installs: only DIR.
        .env("CARGO_INSTALL_ROOT", root)
        .output()
        .unwrap();
    Out::from(out)
}

/// A one-file HTTP server on a loopback port: `GET /hello.txt` answers `hello`.
fn serve() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(100).flatten() {
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 2 {
                    line.clear();
                }
                let mut conn = conn;
                let _ = conn.write_all(
                    b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n",
                );
            });
        }
    });
    port
}

struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(port: u16) -> Project {
        let p = Project {
            dir: tempfile::tempdir().unwrap(),
        };
        for d in ["home", "repo"] {
            std::fs::create_dir_all(p.dir.path().join(d)).unwrap();
        }
        std::fs::write(
            p.repo().join("sandbox.kdl"),
            format!("network {{\n    allow \"good.test:{port}\"\n}}\n"),
        )
        .unwrap();
        support::git_in(&p.repo(), &["init", "-q", "-b", "main"]);
        support::git_in(&p.repo(), &["add", "sandbox.kdl"]);
        support::git_in(
            &p.repo(),
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "one",
            ],
        );
        p
    }
    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }
    fn cmd(&self, exe: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(exe);
        c.arg("--trust")
            .args(args)
            .current_dir(self.repo())
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.dir.path().join("home"))
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .env("AISB_PROXY_RESOLVE", "good.test=127.0.0.1")
            .stdin(Stdio::null());
        c
    }
    fn aisb(&self, exe: &Path, args: &[&str]) -> Out {
        Out::from(self.cmd(exe, args).output().unwrap())
    }
}

/// Every verb through `exe`, on `backend`; `what` names the layout in failures.
fn every_verb(exe: &Path, backend: &str, what: &str, port: u16) {
    let p = Project::new(port);
    let who = format!("[{what}, {backend}]");
    let script = format!(
        "echo ran=ok\n\
         echo \"ssh_tunnel=$(printf 'GET /hello.txt HTTP/1.0\\r\\n\\r\\n' | /run/aisb/init connect good.test {port} | tail -1)\"\n\
         printf '%s' '{{\"tool_name\":\"Bash\",\"tool_input\":{{\"command\":\"make installed-check\"}}}}' | /run/aisb/init agent-event claude\n\
         echo hook=$?\n"
    );
    let o = p.aisb(
        exe,
        &["run", "--backend", backend, "--", "/bin/sh", "-c", &script],
    );
    assert_eq!(o.code, 0, "{who} run: {}\n{}", o.stdout, o.stderr);
    o.expect("ran", "ok");
    o.expect("ssh_tunnel", "hello");
    o.expect("hook", "0");
    let audit = p.aisb(exe, &["audit"]);
    assert!(
        audit
            .stdout
            .contains("AGENT  claude Bash: make installed-check"),
        "{who} the hook's event is not in the audit log:\n{}\n{}",
        audit.stdout,
        audit.stderr
    );

    // `up NAME -- true`: the named sandbox's placeholder is the init's `hold`.
    let o = p.aisb(exe, &["up", "--backend", backend, "t1", "--", "true"]);
    assert_eq!(o.code, 0, "{who} up t1 -- true: {}\n{}", o.stdout, o.stderr);

    // `exec NAME` into a running one; the owner waits (at most 60 s) for the exec's mark.
    let mut owner = p
        .cmd(
            exe,
            &[
                "up",
                "--backend",
                backend,
                "t2",
                "--",
                "/bin/sh",
                "-c",
                "i=0; while [ ! -e /tmp/mark ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; cat /tmp/mark",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let exec = loop {
        let o = p.aisb(
            exe,
            &[
                "exec",
                "t2",
                "--",
                "/bin/sh",
                "-c",
                "echo from-exec > /tmp/mark",
            ],
        );
        if o.code == 0 || Instant::now() > deadline {
            break o;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let done = Instant::now() + Duration::from_secs(60);
    while owner.try_wait().unwrap().is_none() && Instant::now() < done {
        std::thread::sleep(Duration::from_millis(100));
    }
    if owner.try_wait().unwrap().is_none() {
        let _ = owner.kill();
    }
    let owned = Out::from(owner.wait_with_output().unwrap());
    assert_eq!(
        exec.code, 0,
        "{who} exec t2: {}\n{}",
        exec.stdout, exec.stderr
    );
    assert_eq!(
        (owned.code, owned.stdout.as_str()),
        (0, "from-exec\n"),
        "{who} up t2: {}",
        owned.stderr
    );
    let _ = p.aisb(exe, &["stop", "t2"]);
}

#[test]
fn every_verb_works_from_a_cargo_install_and_from_a_lone_binary() {
    if !support::root_or_skip("the install test") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("installed");
    let o = cargo_install(&root);
    assert_eq!(o.code, 0, "cargo install: {}\n{}", o.stdout, o.stderr);
    let mut bins: Vec<String> = std::fs::read_dir(root.join("bin"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    bins.sort();
    // The test probe stays out of a user's PATH.
    assert_eq!(bins, ["aisb", "aisb-init"], "installed: {bins:?}");

    // `cargo run`, `cargo build` of the main binary only, a copied binary: aisb alone.
    let alone = t.path().join("alone/aisb");
    std::fs::create_dir_all(alone.parent().unwrap()).unwrap();
    std::fs::copy(root.join("bin/aisb"), &alone).unwrap();

    let port = serve();
    for backend in BACKENDS {
        every_verb(&root.join("bin/aisb"), backend, "cargo install", port);
        every_verb(&alone, backend, "aisb alone", port);
    }
}
