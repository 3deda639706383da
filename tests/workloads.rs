//! Ordinary work passes inside the sandbox on both backends: the seccomp filter
//! (src/init/seccomp.rs) refuses what an agent, a compiler, a package manager and a test runner
//! do not need, and these prove it refuses nothing they do. The agent clients start, cargo
//! builds and tests a crate (with a build script), npm installs from a registry (a minimal one
//! served here on a loopback port, reached through `localhost-port`), pytest runs a suite.
//!
//! Needs root here (CI runs as root): the Rust toolchain lives in root's home, mounted in.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::Out;

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];

/// A project with `sandbox.kdl` = `config`, and an empty home.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new(config: &str) -> Project {
        let p = Project {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir_all(p.root().join("home")).unwrap();
        p.write("sandbox.kdl", config);
        support::git_in(&p.proj(), &["init", "-q"]);
        p
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
    fn run(&self, backend: &str, script: &str) -> Out {
        Out::from(
            Command::new(env!("CARGO_BIN_EXE_aisb"))
                .current_dir(self.proj())
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", self.root().join("home"))
                .env("XDG_CACHE_HOME", self.root().join("cache"))
                .env("XDG_CONFIG_HOME", self.root().join("config"))
                .args([
                    "--trust",
                    "run",
                    "--backend",
                    backend,
                    "--",
                    "/bin/sh",
                    "-c",
                ])
                .arg(script)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap(),
        )
    }
}

/// Root, and the tools the workload needs (scripts/setup-tests.sh installs them; in CI, missing is
/// a failure).
fn ready(tools: &[&str]) -> bool {
    if !support::root_or_skip("the workload suite") {
        return false;
    }
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{tool} is not installed: scripts/setup-tests.sh installs it"
            );
            eprintln!("skipped: {tool} is not installed (scripts/setup-tests.sh installs it)");
            return false;
        }
    }
    true
}

#[test]
fn agent_clients_start() {
    if !ready(&["claude", "codex"]) {
        return;
    }
    for backend in BACKENDS {
        let p = Project::new("");
        let o = p.run(
            backend,
            "echo \"claude=$(claude --version)\"; echo \"codex=$(codex --version 2>/dev/null)\"",
        );
        assert_eq!(o.code, 0, "[{backend}] {}\n{}", o.stdout, o.stderr);
        let claude = o.value("claude").unwrap_or_default();
        assert!(claude.contains("Claude Code"), "[{backend}] {}", o.stdout);
        let codex = o.value("codex").unwrap_or_default();
        assert!(codex.starts_with("codex-cli "), "[{backend}] {}", o.stdout);
    }
}

/// The toolchain that runs this test, mounted read-only where it is (root's home is hidden).
fn toolchain() -> PathBuf {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

#[test]
fn cargo_builds_and_tests_a_crate() {
    if !ready(&["cc"]) {
        return;
    }
    let sysroot = toolchain();
    for backend in BACKENDS {
        let p = Project::new(&format!("mount \"{}\" access=\"ro\"\n", sysroot.display()));
        p.write(
            "Cargo.toml",
            "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
        );
        // A build script and threads: cargo and rustc's own process and thread use.
        p.write(
            "build.rs",
            "fn main() { println!(\"cargo:rustc-env=BUILT_BY=build.rs\"); }\n",
        );
        p.write(
            "src/main.rs",
            "fn main() {\n    let h = std::thread::spawn(|| 6 * 7);\n    \
             println!(\"answer={} {}\", h.join().unwrap(), env!(\"BUILT_BY\"));\n}\n\
             #[test]\nfn adds() { assert_eq!(2 + 2, 4); }\n",
        );
        let o = p.run(
            backend,
            &format!(
                "export PATH={bin}:$PATH CARGO_HOME=/tmp/cargo-home; \
                 cargo build --offline -q && ./target/debug/tiny && \
                 cargo test --offline -q 2>&1 | grep -c 'test result: ok' | sed 's/^/tested=/'",
                bin = sysroot.join("bin").display()
            ),
        );
        assert_eq!(o.code, 0, "[{backend}] {}\n{}", o.stdout, o.stderr);
        o.expect("answer", "42 build.rs");
        o.expect("tested", "1");
    }
}

/// A registry with one package, on a loopback port: `GET /NAME` (the packument) and the
/// tarball. One connection at a time, closed after each answer.
fn serve_registry(tarball: Vec<u8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let packument = serde_json::json!({
        "name": "aisb-left-pad",
        "dist-tags": { "latest": "1.0.0" },
        "versions": { "1.0.0": {
            "name": "aisb-left-pad",
            "version": "1.0.0",
            "main": "index.js",
            "dist": { "tarball": format!("http://127.0.0.1:{port}/aisb-left-pad/-/aisb-left-pad-1.0.0.tgz") },
        }},
    })
    .to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut first = String::new();
            let _ = reader.read_line(&mut first);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = first.split_whitespace().nth(1).unwrap_or("");
            let (status, kind, body) = match path {
                "/aisb-left-pad" => ("200 OK", "application/json", packument.as_bytes()),
                p if p.ends_with(".tgz") => ("200 OK", "application/octet-stream", &tarball[..]),
                _ => ("404 Not Found", "text/plain", &b"not found"[..]),
            };
            let mut s = &stream;
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(body);
        }
    });
    port
}

#[test]
fn npm_installs_from_a_local_registry() {
    if !ready(&["npm", "node", "tar"]) {
        return;
    }
    let pkg = tempfile::tempdir().unwrap();
    let dir = pkg.path().join("package");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("package.json"),
        r#"{"name":"aisb-left-pad","version":"1.0.0","main":"index.js"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("index.js"),
        "module.exports = (s, n) => s.padStart(n, '.');\n",
    )
    .unwrap();
    let tgz = pkg.path().join("pkg.tgz");
    let ok = Command::new("tar")
        .arg("czf")
        .arg(&tgz)
        .arg("-C")
        .arg(pkg.path())
        .arg("package")
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar");
    let port = serve_registry(std::fs::read(&tgz).unwrap());
    for backend in BACKENDS {
        let p = Project::new(&format!("network {{\n    localhost-port {port}\n}}\n"));
        p.write(
            "package.json",
            r#"{"name":"app","version":"0.0.0","private":true}"#,
        );
        // On the command line: a project's .npmrc is masked (it holds tokens).
        let o = p.run(
            backend,
            &format!(
                "export npm_config_cache=/tmp/npm-cache; \
                 npm install --registry=http://127.0.0.1:{port}/ --no-audit --no-fund \
                 --loglevel=error aisb-left-pad && \
                 node -e 'console.log(\"padded=\" + require(\"aisb-left-pad\")(\"x\", 3))'"
            ),
        );
        assert_eq!(o.code, 0, "[{backend}] {}\n{}", o.stdout, o.stderr);
        o.expect("padded", "..x");
    }
}

#[test]
fn pytest_runs_a_suite() {
    if !ready(&["python3"]) {
        return;
    }
    let has_pytest = Command::new("/usr/bin/python3")
        .args(["-c", "import pytest"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_pytest {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "pytest is not installed: scripts/setup-tests.sh installs python3-pytest"
        );
        eprintln!(
            "skipped: pytest is not installed (scripts/setup-tests.sh installs python3-pytest)"
        );
        return;
    }
    for backend in BACKENDS {
        let p = Project::new("");
        // Subprocesses, threads and a temporary directory: what test suites do.
        p.write(
            "test_things.py",
            "import subprocess, threading\n\
             def test_subprocess():\n    assert subprocess.run(['true']).returncode == 0\n\
             def test_thread():\n    t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
             def test_tmp(tmp_path):\n    (tmp_path / 'f').write_text('x'); assert (tmp_path / 'f').read_text() == 'x'\n",
        );
        let o = p.run(
            backend,
            "/usr/bin/python3 -m pytest -q -p no:cacheprovider test_things.py | tail -n1 | sed 's/ in .*//; s/^/result=/'",
        );
        assert_eq!(o.code, 0, "[{backend}] {}\n{}", o.stdout, o.stderr);
        o.expect("result", "3 passed");
    }
}
