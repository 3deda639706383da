//! `aisb proxy serve`: the per-run proxy's policy on TCP. The same cases as the network suite
//! (HTTP, CONNECT, SOCKS5, blocks with their reason, deny-first, IP literals, rebinding, Host
//! smuggling, loopback), then what a shared server adds: the health check, the connection
//! bound, idle timeouts, graceful shutdown, and 200 concurrent clients for 30 s with no request
//! lost and no descriptor leaked. Everything on loopback; test names are mapped by
//! `AISB_PROXY_RESOLVE`, never real DNS.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An HTTP/1.0-style server on 127.0.0.1: `/echo` answers the Host header it got, anything
/// else `hello`. One thread per connection, each with a read timeout.
fn origin() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut conn = conn;
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let path = line.split(' ').nth(1).unwrap_or("/").to_string();
                let mut host = String::new();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("host:") {
                        host = v.trim().to_string();
                    }
                }
                let body = if path == "/echo" {
                    format!("host={host}\n")
                } else {
                    "hello\n".to_string()
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

struct Server {
    child: Child,
    port: u16,
    stdout: Arc<std::sync::Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aisb"))
        .args(["proxy", "serve", "--listen", "127.0.0.1:0"])
        .args(extra)
        .current_dir(dir)
        .env(
            "AISB_PROXY_RESOLVE",
            "good.test=127.0.0.1,a.sub.test=127.0.0.1,bad.sub.test=127.0.0.1,rebind.test=127.0.0.1",
        )
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .split("serving on ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let port = addr.rsplit(':').next().unwrap().parse().unwrap();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
    });
    let stdout = Arc::new(std::sync::Mutex::new(String::new()));
    let sink = Arc::clone(&stdout);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        let mut l = String::new();
        while out.read_line(&mut l).unwrap_or(0) > 0 {
            sink.lock().unwrap().push_str(&l);
            l.clear();
        }
    });
    Server {
        child,
        port,
        stdout,
    }
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "-m", "10"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn code(args: &[&str]) -> String {
    let mut a = vec!["-o", "/dev/null", "-w", "%{http_code}"];
    a.extend_from_slice(args);
    curl(&a)
}

fn project(origin: u16) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(
        t.path().join("sandbox.kdl"),
        format!("network {{\n    allow \"good.test:{origin}\" \"*.sub.test\" \"rebind.test\"\n    deny \"bad.sub.test\"\n}}\n"),
    )
    .unwrap();
    t
}

#[test]
fn the_run_proxys_cases_hold_on_tcp() {
    let o = origin();
    let t = project(o);
    let s = start(t.path(), &[]);
    let p = format!("http://127.0.0.1:{}", s.port);
    let good = format!("http://good.test:{o}/hello");
    assert_eq!(curl(&["-x", &p, &good]), "hello\n", "absolute-URI HTTP");
    assert_eq!(curl(&["-x", &p, "-p", &good]), "hello\n", "CONNECT");
    let socks = format!("socks5h://127.0.0.1:{}", s.port);
    assert_eq!(curl(&["-x", &socks, &good]), "hello\n", "SOCKS5");
    assert_eq!(code(&["-x", &p, "http://evil.test/"]), "403");
    let head = curl(&["-x", &p, "-D", "-", "-o", "/dev/null", "http://evil.test/"]);
    assert!(
        head.to_ascii_lowercase()
            .contains("x-aisb-blocked: not in the allowlist"),
        "{head}"
    );
    assert_eq!(
        code(&["-x", &p, &format!("http://bad.sub.test:{o}/")]),
        "403",
        "deny first"
    );
    assert_eq!(
        code(&["-x", &p, &format!("http://127.0.0.1:{o}/")]),
        "403",
        "IP literal"
    );
    assert_eq!(
        code(&["-x", &p, &format!("http://rebind.test:{o}/")]),
        "403",
        "internal answer"
    );
    assert_eq!(
        curl(&[
            "-x",
            &p,
            "-H",
            "Host: evil.test",
            &format!("http://good.test:{o}/echo")
        ]),
        format!("host=good.test:{o}\n"),
        "Host header smuggling"
    );
    assert_ne!(
        curl(&[
            "-x",
            &p,
            "-p",
            "http://127.0.0.1:22/",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}"
        ]),
        "200"
    );
    // Audit events are JSON lines on stdout.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = s.stdout.lock().unwrap().clone();
        let lines: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let has = |action: &str, host: &str| {
            lines
                .iter()
                .any(|l| l["action"] == action && l["host"] == host)
        };
        if has("allow", "good.test") && has("block", "evil.test") && has("block", "bad.sub.test") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "audit on stdout lacks decisions:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn health_bound_idle_timeout_and_graceful_shutdown() {
    let o = origin();
    let t = project(o);
    let mut s = start(
        t.path(),
        &[
            "--max-connections",
            "2",
            "--idle-timeout",
            "1",
            "--drain",
            "5",
        ],
    );
    let addr = format!("127.0.0.1:{}", s.port);
    assert_eq!(curl(&[&format!("http://{addr}/healthz")]), "ok\n");
    // Two idle connections take both slots: a third is answered 503 at once.
    let a = TcpStream::connect(&addr).unwrap();
    let b = TcpStream::connect(&addr).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut c = TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    // Idle ones are closed (1 s here): the server ends them, a read sees the end.
    for mut idle in [a, b] {
        idle.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 16];
        let n = idle
            .read(&mut buf)
            .expect("closed by the server, not by our timeout");
        assert_eq!(n, 0);
    }
    // The slots are free again.
    assert_eq!(
        curl(&[
            "-x",
            &format!("http://{addr}"),
            &format!("http://good.test:{o}/x")
        ]),
        "hello\n"
    );
    // SIGTERM: it stops accepting and exits 0 once its connections are done.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(s.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "still running 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(
        TcpStream::connect(&addr).is_err(),
        "still accepting after shutdown"
    );
}

#[test]
fn policy_files_are_checked() {
    let t = tempfile::tempdir().unwrap();
    for (text, why) in [
        ("{\"alow\": [\"a.test\"]}", "unknown field"),
        ("{\"allow\": [\"*.*\"]}", "*.*"),
        (
            "{\"allow\": [], \"pins\": [[\"a.test\", \"10.0.0.1:80\"]]}",
            "AISB_PROXY_PIN",
        ),
    ] {
        let file = t.path().join("policy.json");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_aisb"))
            .args(["proxy", "serve", "--listen", "127.0.0.1:0", "--policy"])
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}");
        assert!(err.contains(why), "{text}: {err}");
    }
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn two_hundred_clients_for_thirty_seconds_lose_nothing_and_leak_nothing() {
    let o = origin();
    let t = project(o);
    let s = start(t.path(), &[]);
    let addr = format!("127.0.0.1:{}", s.port);
    // Warm up the runtime's threads, then take the baseline.
    assert_eq!(
        curl(&[
            "-x",
            &format!("http://{addr}"),
            &format!("http://good.test:{o}/x")
        ]),
        "hello\n"
    );
    std::thread::sleep(Duration::from_millis(300));
    let before = fds(s.child.id());
    let secs: u64 = std::env::var("AISB_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let until = Instant::now() + Duration::from_secs(secs);
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..200)
        .map(|_| {
            let (ok, failed, addr) = (Arc::clone(&ok), Arc::clone(&failed), addr.clone());
            std::thread::spawn(move || {
                while Instant::now() < until {
                    let result = (|| -> std::io::Result<bool> {
                        let mut c = TcpStream::connect(&addr)?;
                        c.set_read_timeout(Some(Duration::from_secs(20)))?;
                        write!(c, "GET http://good.test:{o}/x HTTP/1.1\r\nHost: good.test:{o}\r\nConnection: close\r\n\r\n")?;
                        let mut r = String::new();
                        c.read_to_string(&mut r)?;
                        Ok(r.starts_with("HTTP/1.1 200") && r.ends_with("hello\n"))
                    })();
                    match result {
                        Ok(true) => ok.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("soak: {ok} requests in {secs} s through 200 clients, {failed} failed");
    assert_eq!(failed, 0, "{failed} of {} requests failed", ok + failed);
    assert!(ok >= 200, "only {ok} requests");
    // Every connection closed: the descriptors come back to the baseline.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = fds(s.child.id());
        if now <= before + 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "descriptors: {before} before, {now} after"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A sandbox's own proxy (`aisb __proxy`, on its Unix socket) that runs out of descriptors
/// because the workload holds connections open keeps serving once they close (it used to
/// exit at the first failed accept, cutting the sandbox off for the rest of its run).
#[test]
fn the_run_proxy_serves_on_after_running_out_of_descriptors() {
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt;
    let t = tempfile::tempdir().unwrap();
    let sock = t.path().join("proxy.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_aisb"));
    cmd.args(["__proxy", "--socket"])
        .arg(&sock)
        .args(["--policy", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 32, 32)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"allow":[],"deny":[],"localhost_ports":[],"resolve":[]}"#)
        .unwrap();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready.trim(), "ready");
    // More connections than the proxy has descriptors, all silent.
    let held: Vec<UnixStream> = (0..64)
        .filter_map(|_| UnixStream::connect(&sock).ok())
        .collect();
    assert!(held.len() > 32, "only {} connections", held.len());
    std::thread::sleep(Duration::from_millis(300));
    drop(held);
    std::thread::sleep(Duration::from_millis(300));
    let mut c = UnixStream::connect(&sock).expect("the proxy stopped listening");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET http://x.test/ HTTP/1.1\r\nHost: x.test\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    let _ = c.read_to_string(&mut answer);
    let _ = child.kill();
    let _ = child.wait();
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer:?}");
}
