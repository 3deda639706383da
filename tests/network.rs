//! The network suite: a sandbox with `network { allow … }` reaches only what its policy allows,
//! through the host-side proxy, on both backends. Servers run on the host's loopback; test
//! names are mapped by the proxy's resolver override (`AISB_PROXY_RESOLVE`), never real DNS.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod support;

use support::Out;

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];

/// A small HTTP/1.1 file server on 127.0.0.1 (one thread per connection, at most `limit`
/// connections, each with a read timeout): `/echo` answers with the Host header it got,
/// anything else is a file under `root`.
fn serve(root: PathBuf, limit: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(limit).flatten() {
            let root = root.clone();
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                // Requests kept alive are answered one after another (so a proxy that passed a
                // second request on would have it answered), until one says `close`.
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let target = line.split(' ').nth(1).unwrap_or("/");
                    let path = target.split('?').next().unwrap_or("/").to_string();
                    let (mut host, mut close) = (String::new(), false);
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        let h = h.to_ascii_lowercase();
                        if let Some(v) = h.strip_prefix("host:") {
                            host = v.trim().to_string();
                        }
                        close |= h.starts_with("connection:") && h.contains("close");
                    }
                    let (status, body) = if path == "/echo" {
                        ("200 OK", format!("host={host}\n").into_bytes())
                    } else {
                        let file = root.join(path.trim_start_matches('/'));
                        match std::fs::read(&file) {
                            Ok(b) => ("200 OK", b),
                            Err(_) => ("404 Not Found", b"missing\n".to_vec()),
                        }
                    };
                    let connection = if close { "close" } else { "keep-alive" };
                    let _ = write!(
                        conn,
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(&body);
                    if close {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A child process killed when dropped (also when the test fails).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        // SIGTERM, which `timeout` passes on to the server (SIGKILL would orphan it).
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

/// The same files over HTTPS (Python's server, a self-signed certificate for good.test made
/// with openssl; the sandbox trusts it by path). Killed when the test process ends.
fn serve_tls(www: &Path, dir: &Path) -> (u16, Killed) {
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=good.test",
        ])
        .args(["-addext", "subjectAltName=DNS:good.test"])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(www.join("cert.pem"))
        .output()
        .unwrap()
        .status
        .success();
    assert!(ok, "openssl");
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let code = format!(
        "import http.server, ssl, functools\n\
         h = functools.partial(http.server.SimpleHTTPRequestHandler, directory={www:?})\n\
         s = http.server.ThreadingHTTPServer(('127.0.0.1', {port}), h)\n\
         c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n\
         c.load_cert_chain({cert:?}, {key:?})\n\
         s.socket = c.wrap_socket(s.socket, server_side=True)\n\
         s.timeout = 10\n\
         s.serve_forever()\n",
        www = www.display().to_string(),
        cert = www.join("cert.pem").display().to_string(),
        key = dir.join("key.pem").display().to_string(),
    );
    let child = Command::new("timeout")
        .args(["300", "python3", "-c", &code])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let guard = Killed(child);
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (port, guard);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the TLS server did not start");
}

/// Run `script` in the project's sandbox as root (`user` None) or as that (uid, gid), each
/// caller with a cache of its own.
fn run(dir: &Path, backend: &str, user: Option<(u32, u32)>, resolve: &str, script: &str) -> Out {
    run_with(
        dir,
        backend,
        user,
        &[("AISB_PROXY_RESOLVE", resolve)],
        script,
    )
}

/// [`run`] with the caller's environment for the proxy (`AISB_PROXY_RESOLVE`, `AISB_PROXY_PIN`).
fn run_with(
    dir: &Path,
    backend: &str,
    user: Option<(u32, u32)>,
    names: &[(&str, &str)],
    script: &str,
) -> Out {
    let who = user.map_or("root".to_string(), |(uid, _)| uid.to_string());
    let mut cmd = match user {
        // Their own copy of aisb: the build tree may not be reachable for them.
        Some((uid, gid)) => {
            let bin = dir.join("bin");
            if !bin.join("aisb").exists() {
                std::fs::create_dir_all(&bin).unwrap();
                std::fs::copy(env!("CARGO_BIN_EXE_aisb"), bin.join("aisb")).unwrap();
                std::fs::copy(env!("CARGO_BIN_EXE_aisb-init"), bin.join("aisb-init")).unwrap();
            }
            let mut c = Command::new(bin.join("aisb"));
            std::os::unix::process::CommandExt::uid(&mut c, uid);
            std::os::unix::process::CommandExt::gid(&mut c, gid);
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_aisb")),
    };
    let out = cmd
        // As CI does: this test's sandbox.kdl loosens the defaults (see tests/cli.rs for trust).
        .args([
            "--trust",
            "run",
            "--backend",
            backend,
            "--",
            "/bin/sh",
            "-c",
            script,
        ])
        .current_dir(dir.join("proj"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir.join("home"))
        .env("XDG_CACHE_HOME", dir.join(format!("cache-{who}")))
        .envs(names.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    Out::from(out)
}

fn privileged() -> bool {
    if !support::root_or_skip("the network suite") {
        return false;
    }
    support::tool_or_skip("curl", "the network suite")
}

#[test]
fn only_the_allowlist_goes_out_and_every_decision_is_logged() {
    if !privileged() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let www = t.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("hello.txt"), "hello from the host\n").unwrap();
    // A repository served over plain ("dumb") HTTP, for `git clone` through the proxy.
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    support::git_in(&src, &["init", "-q"]);
    std::fs::write(src.join("README"), "cloned through the proxy\n").unwrap();
    support::git_in(&src, &["add", "-A"]);
    support::git_in(&src, &["commit", "-qm", "one"]);
    support::git_in(t.path(), &["clone", "-q", "--bare", "src", "www/repo.git"]);
    support::git_in(&www.join("repo.git"), &["update-server-info"]);

    let port = serve(www.clone(), 400);
    let (tls, _tls_server) = serve_tls(&www, t.path());
    let db = serve(t.path().join("db"), 50); // a "dev database" on a host loopback port
    for d in ["home", "proj"] {
        std::fs::create_dir_all(t.path().join(d)).unwrap();
    }
    support::git_in(&t.path().join("proj"), &["init", "-q"]);
    std::fs::write(
        t.path().join("proj/sandbox.kdl"),
        format!(
            "network transparent=#false {{\n    allow \"good.test:{port}\" \"good.test:{tls}\" \"*.sub.test\" \"rebind.test\"\n    deny \"bad.sub.test\"\n    localhost-port {db}\n}}\n"
        ),
    )
    .unwrap();
    let resolve =
        "good.test=127.0.0.1,a.sub.test=127.0.0.1,bad.sub.test=127.0.0.1,rebind.test=127.0.0.1";
    // The sandbox sees the project only: the certificate goes there (`*.pem` would be masked).
    std::fs::copy(
        t.path().join("www/cert.pem"),
        t.path().join("proj/good-test-ca.crt"),
    )
    .unwrap();
    let ca = t.path().join("proj/good-test-ca.crt").display().to_string();
    let script = format!(
        r#"
p=http://127.0.0.1:3128
code() {{ curl -s -o /dev/null -w '%{{http_code}}' -m 10 "$@"; }}
echo "handover=$(python3 -c '
import socket
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect("/run/aisb/net/proxy.sock")
socket.send_fds(s, [b"AISB-LISTEN * HTTP/1.1\r\n\r\n"], [l.fileno()])
print(s.recv(200).split(b"\r\n")[0].decode())')"
echo "handed=$(python3 -c '
import socket
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect("/run/aisb/net/proxy.sock")
socket.send_fds(s, [b"CONNECT good.test:{port} HTTP/1.1\r\nX-Aisb-Handed: tunnel\r\n\r\n"], [a.fileno()])
s.shutdown(socket.SHUT_WR)
print(s.recv(200).split(b"\r\n")[0].decode())')"
echo "http=$(curl -s -m 10 http://good.test:{port}/hello.txt)"
echo "connect=$(curl -s -m 10 -p http://good.test:{port}/hello.txt)"
echo "socks=$(curl -s -m 10 -x socks5h://127.0.0.1:3128 http://good.test:{port}/hello.txt)"
echo "blocked=$(code http://evil.test/)"
echo "blocked_header=$(curl -s -D - -o /dev/null -m 10 http://evil.test/ | tr -d '\r' | grep -i '^x-aisb-blocked' | cut -d' ' -f2-)"
echo "blocked_connect=$(curl -s -m 10 -p http://evil.test/ >/dev/null 2>&1; echo $?)"
echo "blocked_socks=$(curl -s -m 10 -x socks5h://127.0.0.1:3128 http://evil.test/ >/dev/null 2>&1; echo $?)"
echo "wild_apex=$(code http://sub.test:{port}/hello.txt)"
echo "denied=$(code http://bad.sub.test:{port}/hello.txt)"
echo "ip_literal=$(code -x $p --noproxy '' http://127.0.0.1:{port}/hello.txt)"
echo "rebind=$(code http://rebind.test:{port}/hello.txt)"
echo "smuggle=$(curl -s -m 10 -H 'Host: evil.test' http://good.test:{port}/echo)"
echo "connect_loopback=$(curl -s -m 10 -x $p --noproxy '' -p http://127.0.0.1:22/ >/dev/null 2>&1; echo $?)"
echo "localhost_port=$(curl -s -m 10 --noproxy '*' -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{db}/x)"
echo "direct=$(curl -s -m 5 --noproxy '*' http://127.0.0.1:{port}/hello.txt >/dev/null 2>&1; echo $?)"
echo "around=$(python3 -c 'import socket; socket.create_connection(("192.0.2.1", 443), timeout=5)' 2>&1 | tail -1)"
echo "dns=$(python3 -c 'import socket; socket.getaddrinfo("good.test", 80)' >/dev/null 2>&1; echo $?)"
echo "udp=$(python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("127.0.0.2", 53)); s.send(b"x"); s.recv(1)' >/dev/null 2>&1; echo $?)"
echo "vsock=$(python3 -c 'import socket; socket.socket(40, socket.SOCK_STREAM)' >/dev/null 2>&1; echo $?)"
echo "ifaces=$(awk -F: 'NR > 2 {{ gsub(/ /, "", $1); printf "%s ", $1 }}' /proc/net/dev)"
rm -rf /tmp/clone; git clone -q http://good.test:{port}/repo.git /tmp/clone 2>/tmp/git.err; echo "git=$?"
rm -rf /tmp/tls; git -c http.sslCAInfo={ca} clone -q https://good.test:{tls}/repo.git /tmp/tls 2>>/tmp/git.err; echo "git_https=$?"
echo "https=$(curl -s -m 10 --cacert {ca} https://good.test:{tls}/hello.txt)"
echo "ssh_tunnel=$(printf 'GET /hello.txt HTTP/1.0\r\n\r\n' | /run/aisb/init connect good.test {port} | tail -1)"
echo "ssh_blocked=$(/run/aisb/init connect evil.test 22 </dev/null 2>&1 | head -1)"
echo "cloned=$(cat /tmp/clone/README 2>/dev/null)"
echo "git_err=$(cat /tmp/git.err | tr '\n' ' ')"
"#
    );
    // Everyone may read the fixture (a temp dir is 0700); the callers write only their caches.
    std::fs::set_permissions(
        t.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let user = support::test_user();
    let cache = t.path().join(format!("cache-{}", user.0));
    std::fs::create_dir_all(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(user.0), Some(user.1)).unwrap();
    let callers = [None, Some(user)];
    for (backend, user) in BACKENDS
        .iter()
        .flat_map(|b| callers.iter().map(move |u| (*b, *u)))
    {
        let o = run(t.path(), backend, user, resolve, &script);
        let backend = format!("{backend} {user:?}");
        assert_eq!(o.code, 0, "[{backend}]\n{}\n{}", o.stdout, o.stderr);
        // The proxy took the init's listeners first; the workload cannot hand over its own.
        o.expect("handover", "HTTP/1.1 400 Bad Request");
        // Nor hand over a connection of its own: only the init's sockets are taken.
        o.expect("handed", "HTTP/1.1 400 Bad Request");
        o.expect("http", "hello from the host");
        o.expect("connect", "hello from the host");
        o.expect("socks", "hello from the host");
        o.expect("blocked", "403");
        o.expect("blocked_header", "not in the allowlist");
        o.expect_failed("blocked_connect", &format!("[{backend}] blocked_connect"));
        o.expect_failed("blocked_socks", &format!("[{backend}] blocked_socks"));
        o.expect("wild_apex", "403");
        o.expect("denied", "403");
        o.expect("ip_literal", "403");
        o.expect("rebind", "403");
        o.expect("smuggle", &format!("host=good.test:{port}"));
        o.expect_failed("connect_loopback", &format!("[{backend}] connect_loopback"));
        o.expect("localhost_port", "404");
        o.expect_failed("direct", &format!("[{backend}] direct TCP got out"));
        // A tool that ignores the proxy is told why (documentation address: never routed).
        o.expect("around", "PermissionError: [Errno 13] Permission denied");
        assert!(
            o.stderr.contains("aisb: refused a direct connection to 192.0.2.1:443: the network goes through the proxy only"),
            "[{backend}] {}",
            o.stderr
        );
        o.expect_failed("dns", &format!("[{backend}] DNS resolved"));
        o.expect_failed("udp", &format!("[{backend}] UDP answered"));
        o.expect_failed("vsock", &format!("[{backend}] AF_VSOCK"));
        o.expect("ifaces", "lo ");
        o.expect("git", "0");
        o.expect("cloned", "cloned through the proxy");
        o.expect("git_https", "0");
        o.expect("https", "hello from the host");
        o.expect("ssh_tunnel", "hello from the host");
        o.expect(
            "ssh_blocked",
            "aisb connect evil.test:22: aisb: blocked CONNECT evil.test:22: not in the allowlist",
        );
    }
    // Every decision is in the audit log, with the rule that made it.
    let logs: Vec<PathBuf> = walk(&t.path().join("cache-root/aisb"), "audit.jsonl");
    assert_eq!(logs.len(), 1, "{logs:?}");
    let mut text = String::new();
    std::fs::File::open(&logs[0])
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    for needle in [
        "\"action\":\"allow\",\"proto\":\"http\",\"host\":\"good.test\"",
        "\"action\":\"allow\",\"proto\":\"socks5\"",
        "\"action\":\"block\",\"proto\":\"http\",\"host\":\"evil.test\"",
        "\"rule\":\"deny \\\"bad.sub.test\\\"\"",
        "resolves to the internal address 127.0.0.1",
        &format!("\"rule\":\"localhost-port {db}\""),
        "\"proto\":\"direct\",\"host\":\"192.0.2.1\",\"port\":443,\"rule\":\"direct-connect-not-via-proxy\"",
        "\"event\":\"start\"",
        "\"event\":\"exit\"",
    ] {
        assert!(text.contains(needle), "audit log lacks {needle}:\n{text}");
    }
    let blocked = audit(t.path(), &["--blocked-only"]);
    assert!(blocked.lines().count() >= 2 * 9, "{blocked}");
    assert!(
        blocked.lines().all(|l| l.contains("  BLOCK  ")),
        "{blocked}"
    );
    assert!(
        blocked.contains("BLOCK  http evil.test:80  not in the allowlist"),
        "{blocked}"
    );
    let json = audit(t.path(), &["--json"]);
    assert_eq!(json.lines().count(), text.lines().count());
    assert!(json
        .lines()
        .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()));
}

/// `aisb audit` reads the same log back, for people and programs.
fn audit(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_aisb"))
        .arg("audit")
        .args(args)
        .current_dir(dir.join("proj"))
        .env("HOME", dir.join("home"))
        .env("XDG_CACHE_HOME", dir.join("cache-root"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn walk(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p, name));
            } else if p.file_name().is_some_and(|n| n == name) {
                out.push(p);
            }
        }
    }
    out
}

/// A server that speaks first, as sshd does: its banner, then it reads a little and closes.
fn serve_banner(limit: usize) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().take(limit).flatten() {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = conn.write_all(b"SSH-2.0-aisb_banner\r\n");
            let mut buf = [0u8; 256];
            let _ = conn.read(&mut buf);
        }
    });
    port
}

/// `git daemon` on the host's loopback serving `base` (killed with the guard).
fn serve_git(base: &Path) -> (u16, Killed) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("timeout")
        .args(["300", "git", "daemon", "--reuseaddr", "--export-all"])
        .arg("--listen=127.0.0.1")
        .arg(format!("--port={port}"))
        .arg(format!("--base-path={}", base.display()))
        .arg(base)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let guard = Killed(child);
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return (port, guard);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("git daemon did not start");
}

/// Transparent egress: tools that ignore the proxy variables (curl --noproxy, python's urllib
/// without proxies, Node's fetch, git://, plain ssh) reach allowed names through the same
/// proxy and audit log, learning the name from the stub's synthetic address, SNI or Host; the
/// attacks on it (a name fronted through another's address, a smuggled Host, raw IPs, other
/// ports, loopback, UDP, IPv6, a burst of unlisted names) are refused with a reason.
#[test]
fn transparent_egress_reaches_allowed_names_only() {
    if !privileged() {
        return;
    }
    for tool in ["python3", "node", "ssh", "openssl"] {
        if !support::tool_or_skip(tool, "the transparent egress test") {
            return;
        }
    }
    let t = tempfile::tempdir().unwrap();
    let www = t.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("hello.txt"), "hello from the host\n").unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    support::git_in(&src, &["init", "-q"]);
    std::fs::write(src.join("README"), "cloned over git://\n").unwrap();
    support::git_in(&src, &["add", "-A"]);
    support::git_in(&src, &["commit", "-qm", "one"]);
    std::fs::create_dir_all(t.path().join("git")).unwrap();
    support::git_in(t.path(), &["clone", "-q", "--bare", "src", "git/repo.git"]);

    let http = serve(www.clone(), 400);
    let (tls, _tls_server) = serve_tls(&www, t.path());
    let (git, _git_daemon) = serve_git(&t.path().join("git"));
    let ssh = serve_banner(50);
    for d in ["home", "proj"] {
        std::fs::create_dir_all(t.path().join(d)).unwrap();
    }
    support::git_in(&t.path().join("proj"), &["init", "-q"]);
    std::fs::write(
        t.path().join("proj/sandbox.kdl"),
        "network {\n    allow \"allowed.test\" \"good.test\" \"git.test:9418\" \"ssh.test\"\n}\n",
    )
    .unwrap();
    std::fs::copy(
        t.path().join("www/cert.pem"),
        t.path().join("proj/good-test-ca.crt"),
    )
    .unwrap();
    let ca = t.path().join("proj/good-test-ca.crt").display().to_string();
    // A JVM client (HttpURLConnection, no proxy), when Debian's JRE is installed.
    let java = Command::new("java").arg("-version").output().is_ok();
    std::fs::write(
        t.path().join("proj/Fetch.java"),
        "public class Fetch { public static void main(String[] a) throws Exception {\n\
         var c = (java.net.HttpURLConnection) new java.net.URL(a[0]).openConnection(java.net.Proxy.NO_PROXY);\n\
         c.setConnectTimeout(10000); c.setReadTimeout(10000);\n\
         System.out.println(new String(c.getInputStream().readAllBytes()).trim()); } }\n",
    )
    .unwrap();
    let pins = format!(
        "allowed.test=127.0.0.1:{http},good.test=127.0.0.1:{tls},git.test=127.0.0.1:{git},ssh.test=127.0.0.1:{ssh}"
    );
    let script = |burst: usize| {
        format!(
            r#"
unset HTTP_PROXY HTTPS_PROXY ALL_PROXY http_proxy https_proxy all_proxy NODE_USE_ENV_PROXY GIT_SSH_COMMAND
c() {{ curl -s -m 10 --noproxy '*' "$@"; }}
syn=$(getent hosts allowed.test | cut -d' ' -f1)
echo "synthetic=${{syn%.*.*}}"
echo "stable=$(test "$(getent hosts allowed.test | cut -d' ' -f1)" = "$syn"; echo $?)"
echo "getent_other=$(getent hosts other.test >/dev/null; echo $?)"
echo "resolv=$(grep nameserver /etc/resolv.conf)"
echo "http=$(c http://allowed.test/hello.txt)"
echo "https=$(c --cacert {ca} https://good.test/hello.txt)"
echo "sni_raw_ip=$(c --cacert {ca} --resolve good.test:443:192.0.2.7 https://good.test/hello.txt)"
echo "host_raw_ip=$(c -H 'Host: allowed.test' http://192.0.2.7/hello.txt)"
echo "python=$(python3 -c 'import urllib.request as u; print(u.build_opener(u.ProxyHandler({{}})).open("http://allowed.test/hello.txt", timeout=10).read().decode().strip())' 2>&1)"
echo "node=$(node -e 'fetch("http://allowed.test/hello.txt").then(r => r.text()).then(t => console.log(t.trim()), e => console.log("error", e.cause && e.cause.code))')"
[ {java} = true ] && echo "java=$(java Fetch.java http://allowed.test/hello.txt 2>&1 | tail -1)"
rm -rf /tmp/g; git clone -q git://git.test/repo.git /tmp/g 2>/tmp/git.err; echo "git=$?"
echo "cloned=$(cat /tmp/g/README 2>/dev/null)"
echo "ssh=$(ssh -v -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 ssh.test true 2>&1 | grep -o 'remote software version [a-z_]*' | head -1)"
echo "http_other=$(c http://other.test/ >/dev/null; echo $?)"
echo "ssh_other=$(ssh -o BatchMode=yes -o ConnectTimeout=5 other.test true 2>&1 | grep -c 'Could not resolve')"
echo "sni_mismatch=$(c --cacert {ca} --resolve good.test:443:$syn https://good.test/hello.txt >/dev/null; echo $?)"
echo "smuggle=$(c -D - -H 'Host: other.test' http://allowed.test/echo | tr -d '\r' | grep -c '^host=\|^X-Aisb-Blocked: transparent: the client named other.test to the address of allowed.test')"
# A second request kept alive on an allowed connection, naming another host: through the
# stub's address, and to a raw IP whose first request's Host named an allowed one.
for to in "$syn" 192.0.2.7; do
echo "pipelined_$to=$(python3 -c '
import socket, sys
s = socket.create_connection((sys.argv[1], 80), timeout=10)
s.sendall(b"GET /echo HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET /echo HTTP/1.1\r\nHost: other.test\r\n\r\n")
out = b""
try:
    while True:
        b = s.recv(4096)
        if not b:
            break
        out += b
except OSError:
    pass
print("answered" if b"host=other.test" in out else "refused")
' "$to" 2>&1 | tail -1)"
done
echo "unassigned=$(c http://198.18.200.1/hello.txt >/dev/null; echo $?)"
echo "raw_ip=$(python3 -c 'import socket; s = socket.create_connection(("192.0.2.1", 443), timeout=10); print("closed" if s.recv(1) == b"" else "open")' 2>&1 | tail -1)"
echo "ip_host=$(c http://192.0.2.9/hello.txt >/dev/null; echo $?)"
echo "loopback_port=$(c http://127.0.0.1:{http}/hello.txt >/dev/null; echo $?)"
echo "loopback_443=$(c -k https://127.0.0.1/ >/dev/null; echo $?)"
echo "other_port=$(c http://allowed.test:8080/hello.txt >/dev/null; echo $?)"
echo "ipv6=$(c -g 'http://[2001:db8::1]/hello.txt' >/dev/null; echo $?)"
echo "udp=$(python3 -c '
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
s.connect(("8.8.8.8", 53)); s.send(struct.pack(">HHHHHH", 1, 256, 1, 0, 0, 0) + b"\x07example\x03com\x00\x00\x01\x00\x01"); s.recv(512)
' >/dev/null 2>&1; echo $?)"
echo "burst=$(python3 -c '
import socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); s.connect(("127.0.0.53", 53))
nx = 0
for i in range({burst}):
    q = struct.pack(">HHHHHH", i & 0xffff, 256, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l for l in (b"n%d" % i, b"burst", b"test")) + b"\x00\x00\x01\x00\x01"
    s.send(q); r = s.recv(512); nx += (r[3] & 15) == 3
print(nx)
')"
echo "after_burst=$(getent hosts allowed.test | cut -d' ' -f1)"
"#
        )
    };
    std::fs::set_permissions(
        t.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let user = support::test_user();
    let cache = t.path().join(format!("cache-{}", user.0));
    std::fs::create_dir_all(&cache).unwrap();
    std::os::unix::fs::chown(&cache, Some(user.0), Some(user.1)).unwrap();
    let callers = [None, Some(user)];
    for (i, (backend, user)) in BACKENDS
        .iter()
        .flat_map(|b| callers.iter().map(move |u| (*b, *u)))
        .enumerate()
    {
        // The full burst once (root, the first backend: its audit log is checked below).
        let burst = if i == 0 { 10_000 } else { 300 };
        let o = run_with(
            t.path(),
            backend,
            user,
            &[("AISB_PROXY_PIN", &pins)],
            &script(burst),
        );
        let what = format!("[{backend} {user:?}]");
        assert_eq!(o.code, 0, "{what}\n{}\n{}", o.stdout, o.stderr);
        o.expect("synthetic", "198.18");
        o.expect("stable", "0");
        o.expect_failed("getent_other", &format!("{what} other.test resolved"));
        o.expect("resolv", "nameserver 127.0.0.53");
        for key in [
            "http",
            "https",
            "sni_raw_ip",
            "host_raw_ip",
            "python",
            "node",
        ] {
            o.expect(key, "hello from the host");
        }
        if java {
            o.expect("java", "hello from the host");
        }
        o.expect("git", "0");
        o.expect("cloned", "cloned over git://");
        o.expect("ssh", "remote software version aisb_banner");
        o.expect("http_other", "6"); // curl: could not resolve host
        o.expect("ssh_other", "1");
        for key in [
            "sni_mismatch",
            "unassigned",
            "ip_host",
            "loopback_port",
            "loopback_443",
            "other_port",
            "ipv6",
            "udp",
        ] {
            o.expect_failed(key, &format!("{what} {key} got through"));
        }
        o.expect("raw_ip", "closed");
        // Refused with the reason (the echo server's `host=` never came back).
        o.expect("smuggle", "1");
        for line in o.stdout.lines().filter(|l| l.starts_with("pipelined_")) {
            assert!(
                line.ends_with("=refused"),
                "{what} a kept-alive request smuggled another host: {line}\n{}",
                o.stderr
            );
        }
        assert_eq!(
            o.stdout
                .lines()
                .filter(|l| l.starts_with("pipelined_"))
                .count(),
            2,
            "{what}\n{}",
            o.stdout
        );
        o.expect("burst", &burst.to_string());
        o.value("after_burst")
            .filter(|v| v.starts_with("198.18."))
            .unwrap_or_else(|| {
                panic!(
                    "{what} the stub stopped answering after the burst\n{}",
                    o.stdout
                )
            });
        for reason in [
            "aisb: refused a connection to 192.0.2.1:443: 192.0.2.1:443: aisb: blocked CONNECT 192.0.2.1:443: an IP address",
            "the client named good.test to the address of allowed.test",
            "the client named other.test to the address of allowed.test",
            "198.18.200.1 is not an address this sandbox's DNS handed out",
        ] {
            assert!(o.stderr.contains(reason), "{what} stderr lacks {reason}:\n{}", o.stderr);
        }
    }
    // How each name was learned, and every refusal, is in the audit log; the burst is capped.
    let logs: Vec<PathBuf> = walk(&t.path().join("cache-root/aisb"), "audit.jsonl");
    assert_eq!(logs.len(), 1, "{logs:?}");
    let text = std::fs::read_to_string(&logs[0]).unwrap();
    for needle in [
        "\"action\":\"allow\",\"proto\":\"dns\",\"host\":\"allowed.test\"",
        "\"action\":\"block\",\"proto\":\"dns\",\"host\":\"other.test\"",
        "\"action\":\"allow\",\"proto\":\"transparent-dns\",\"host\":\"allowed.test\",\"port\":80",
        "\"action\":\"allow\",\"proto\":\"transparent-sni\",\"host\":\"good.test\",\"port\":443",
        "\"action\":\"allow\",\"proto\":\"transparent-host\",\"host\":\"allowed.test\",\"port\":80",
        "\"action\":\"allow\",\"proto\":\"transparent-dns\",\"host\":\"git.test\",\"port\":9418",
        "\"action\":\"allow\",\"proto\":\"transparent-dns\",\"host\":\"ssh.test\",\"port\":22",
        "\"action\":\"block\",\"proto\":\"transparent-ip\",\"host\":\"192.0.2.1\",\"port\":443",
        "\"rule\":\"transparent: the client named good.test to the address of allowed.test",
        "\"tool\":\"audit-limit\"",
    ] {
        assert!(text.contains(needle), "audit log lacks {needle}");
    }
    // Two root runs share the log: the first hits the cap of events from inside (10,000 per
    // run), the second adds its 300.
    let lines = text.lines().count();
    assert!(
        lines < 10_000 + 300 + 100,
        "the log grew past the cap: {lines} lines"
    );
    let shown = audit(t.path(), &[]);
    assert!(
        shown.contains("transparent-sni good.test:443"),
        "{}",
        &shown[..shown.len().min(4000)]
    );
}
