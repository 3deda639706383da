//! Credential brokering (issue 31): the sandbox holds a placeholder, the proxy adds the real
//! value only in the declared header of requests to the credential's own hosts. Real clients
//! (curl, Python, Node) inside, TLS mock servers on the host's loopback (names pinned by the
//! proxy, never real DNS), on both backends, as root and as an ordinary user.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

mod support;

use support::Out;

const BACKENDS: &[&str] = &["bwrap", "libcontainer"];

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA of the test's own and a certificate from it for each name: (CA PEM, per name the
/// server configuration).
fn mock_pki(names: &[&str]) -> (String, Vec<Arc<rustls::ServerConfig>>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "aisb test upstream CA");
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = p.self_signed(&ca_key).unwrap();
    let configs = names
        .iter()
        .map(|n| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(vec![n.to_string()]).unwrap();
            p.distinguished_name.push(rcgen::DnType::CommonName, *n);
            let cert = p.signed_by(&key, &ca, &ca_key).unwrap();
            let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
            let cfg = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert.der().clone()], der)
                .unwrap();
            Arc::new(cfg)
        })
        .collect();
    (ca.pem(), configs)
}

/// An HTTPS server on 127.0.0.1 (at most 200 connections, each request answered in turn,
/// kept alive): `/check` says whether the real key arrived (`key=real`) or what came instead;
/// `/echo` answers with the `x-api-key` it got.
fn mock(cfg: Arc<rustls::ServerConfig>, real: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(200).flatten() {
            let cfg = Arc::clone(&cfg);
            let real = real.clone();
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
                let tls = rustls::ServerConnection::new(cfg).unwrap();
                let mut s = rustls::StreamOwned::new(tls, conn);
                let mut buf = Vec::new();
                for _ in 0..50 {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let header = |name: &str| {
                        head.lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.trim()
                                    .eq_ignore_ascii_case(name)
                                    .then(|| v.trim().to_string())
                            })
                            .unwrap_or_else(|| "none".into())
                    };
                    // A body: by its length, or chunked to its last chunk.
                    if let Ok(n) = header("content-length").parse::<usize>() {
                        while buf.len() < n {
                            let mut chunk = [0u8; 4096];
                            match s.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                            }
                        }
                        buf.drain(..n);
                    } else if header("transfer-encoding") == "chunked" {
                        while !buf.windows(5).any(|w| w == b"0\r\n\r\n") {
                            let mut chunk = [0u8; 4096];
                            match s.read(&mut chunk) {
                                Ok(0) | Err(_) => return,
                                Ok(k) => buf.extend_from_slice(&chunk[..k]),
                            }
                        }
                        let at = buf.windows(5).position(|w| w == b"0\r\n\r\n").unwrap();
                        buf.drain(..at + 5);
                    }
                    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                    let key = header("x-api-key");
                    let body = if path.starts_with("/echo") {
                        format!("x-api-key={key}")
                    } else if key == real {
                        "key=real".to_string()
                    } else if key.contains(&real[8..]) {
                        "key=mangled".to_string()
                    } else {
                        "key=other".to_string()
                    };
                    let msg = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{body}",
                        body.len()
                    );
                    if s.write_all(msg.as_bytes()).is_err() || s.flush().is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A key for the test: `sk-test-` and 32 random letters and digits.
fn canary() -> String {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let tail: String = b
        .iter()
        .map(|x| ALNUM[*x as usize % ALNUM.len()] as char)
        .collect();
    format!("sk-test-{tail}")
}

/// What runs inside: each client's answer on a line of its own, and a search for the real
/// key in every process's environment, command line and readable memory (but the search's
/// own: it holds the key, handed reversed so no other process's text has it) and in the
/// files the sandbox can write.
const SCRIPT: &str = r#"
k="$TEST_KEY"
echo "placeholder=$k"
echo "curl=$(curl -sS --max-time 20 https://api.broker.test/check -H "x-api-key: $k" 2>&1)"
echo "keepalive=$(curl -sS --max-time 20 https://api.broker.test/check https://api.broker.test/check -H "x-api-key: $k" 2>&1 | tr '\n' ' ')"
echo "chunked=$(printf abc | curl -sS --max-time 20 -X POST -H 'Transfer-Encoding: chunked' --data-binary @- https://api.broker.test/check -H "x-api-key: $k" 2>&1)"
echo "other_header=$(curl -sS --max-time 20 https://api.broker.test/check -H "x-other: $k" 2>&1)"
echo "echo=$(curl -sS --max-time 20 https://echo.broker.test/echo -H "x-api-key: $k" 2>&1)"
echo "fronting=$(curl -sS --max-time 20 -o /dev/null -w '%{http_code}' https://api.broker.test/echo -H 'Host: echo.broker.test' -H "x-api-key: $k" 2>&1)"
echo "python=$(python3 -c '
import os, urllib.request as u
r = u.Request("https://api.broker.test/check", headers={"x-api-key": os.environ["TEST_KEY"]})
print(u.urlopen(r, timeout=20).read().decode())' 2>&1 | tail -1)"
echo "node=$(node -e '
fetch("https://api.broker.test/check", {headers: {"x-api-key": process.env.TEST_KEY}})
  .then(r => r.text()).then(t => console.log(t), e => console.log("error", String(e.cause || e)))' 2>&1 | tail -1)"
echo "leaks=$(python3 - "$REVERSED" <<'PY'
import os, re, subprocess, sys
needle = sys.argv[1][::-1].encode()
assert len(needle) > 20, "no key to search for"
me = str(os.getpid())
# The search proves it can find the key: a process holding it must be found.
planted = subprocess.Popen(["sleep", "60"], env={"CANARY": needle.decode()})
found = []
for pid in [p for p in os.listdir("/proc") if p.isdigit() and p != me]:
    for what in ("environ", "cmdline"):
        try:
            if needle in open(f"/proc/{pid}/{what}", "rb").read():
                found.append(f"{pid}/{what}")
        except OSError:
            pass
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        continue
    for line in maps:
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
        if not m or "[vvar" in line or "[vsyscall" in line:
            continue
        a, b = int(m.group(1), 16), int(m.group(2), 16)
        if b - a > 256 << 20:
            continue
        try:
            mem.seek(a)
            if needle in mem.read(b - a):
                found.append(f"{pid}/mem")
        except (OSError, ValueError, OverflowError):
            pass
for top in ("/tmp", "/run", os.environ.get("HOME", "/"), os.getcwd()):
    for d, _, files in os.walk(top):
        for f in files:
            try:
                if needle in open(os.path.join(d, f), "rb").read(1 << 24):
                    found.append(os.path.join(d, f))
            except OSError:
                pass
planted.kill()
mine = f"{planted.pid}/environ"
if mine not in found:
    print("the search did not find the key planted in a process")
else:
    print(" ".join(f for f in found if not f.startswith(f"{planted.pid}/")) or "none")
PY
)"
"#;

fn run(
    dir: &Path,
    exe: &Path,
    backend: &str,
    user: Option<(u32, u32)>,
    env: &[(&str, String)],
) -> Out {
    let mut cmd = Command::new(exe);
    if let Some((uid, gid)) = user {
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
    }
    let out = cmd
        .args([
            "--trust",
            "run",
            "--backend",
            backend,
            "--",
            "/bin/sh",
            "-c",
            SCRIPT,
        ])
        .current_dir(dir.join("proj"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir.join("home"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    Out::from(out)
}

#[test]
fn only_placeholders_inside_and_the_real_key_reaches_its_own_host_alone() {
    if !support::root_or_skip("credential brokering")
        || !support::tool_or_skip("curl", "credential brokering")
        || !support::tool_or_skip("node", "credential brokering")
    {
        return;
    }
    let real = canary();
    let (ca_pem, configs) = mock_pki(&["api.broker.test", "echo.broker.test"]);
    let api = mock(Arc::clone(&configs[0]), real.clone());
    let echo = mock(Arc::clone(&configs[1]), real.clone());
    let pins = format!("api.broker.test=127.0.0.1:{api},echo.broker.test=127.0.0.1:{echo}");
    let reversed: String = real.chars().rev().collect();
    let user = support::test_user();
    for caller in [None, Some(user)] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        for d in ["home", "proj", "cache"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        support::git_in(&dir.join("proj"), &["init", "-q"]);
        std::fs::write(
            dir.join("proj/sandbox.kdl"),
            r#"network {
    allow "api.broker.test" "echo.broker.test"
}
env {
    pass "REVERSED"
}
credential "test-key" env="TEST_KEY" {
    from env="REAL_TEST_KEY"
    hosts "api.broker.test"
    header "x-api-key"
}
"#,
        )
        .unwrap();
        // The host's roots, as the proxy verifies the upstream against them: the mock's CA.
        std::fs::write(dir.join("upstream-ca.pem"), &ca_pem).unwrap();
        let exe = match caller {
            Some((uid, gid)) => support::hand_to_user(dir, uid, gid),
            None => std::path::PathBuf::from(env!("CARGO_BIN_EXE_aisb")),
        };
        for backend in BACKENDS {
            let what = format!("[{backend} {caller:?}]");
            let o = run(
                dir,
                &exe,
                backend,
                caller,
                &[
                    ("AISB_PROXY_PIN", pins.clone()),
                    ("REAL_TEST_KEY", real.clone()),
                    (
                        "SSL_CERT_FILE",
                        dir.join("upstream-ca.pem").display().to_string(),
                    ),
                    ("REVERSED", reversed.clone()),
                ],
            );
            assert_eq!(o.code, 0, "{what}\n{}\n{}", o.stdout, o.stderr);
            let placeholder = o.value("placeholder").unwrap_or_default().to_string();
            assert!(
                placeholder.starts_with("sk-test-") && placeholder.len() == real.len() && placeholder != real,
                "{what} the sandbox's variable is not a placeholder of the key's shape: {placeholder:?}"
            );
            assert!(
                !o.stdout.contains(&real),
                "{what} the real key is printed inside:\n{}",
                o.stdout
            );
            for key in ["curl", "python", "node", "chunked"] {
                o.expect(key, "key=real");
            }
            o.expect("keepalive", "key=realkey=real");
            // Only the declared header carries it: elsewhere it stays a placeholder.
            o.expect("other_header", "key=other");
            // An allowed host it is not bound to gets the placeholder, on an opaque tunnel.
            o.expect("echo", &format!("x-api-key={placeholder}"));
            // A request on the bound host's connection naming another host is refused.
            o.expect("fronting", "421");
            o.expect("leaks", "none");
            // Each injection is in the audit log, by name; the value never.
            let log = Command::new(&exe)
                .arg("audit")
                .current_dir(dir.join("proj"))
                .env("HOME", dir.join("home"))
                .env("XDG_CACHE_HOME", dir.join("cache"))
                .output()
                .unwrap();
            let log = String::from_utf8_lossy(&log.stdout).into_owned();
            assert!(
                log.contains("CREDENTIAL test-key put in GET https://api.broker.test/check"),
                "{what} audit:\n{log}"
            );
            assert!(
                log.contains("421") || log.contains("not api.broker.test"),
                "{what} audit:\n{log}"
            );
            assert!(!log.contains(&real), "{what} the audit log holds the key");
        }
        // The CA's key is the user's alone, outside anything the sandbox sees.
        let key = dir.join("cache/aisb/ca/key.pem");
        let meta = std::fs::metadata(&key).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o600
        );
    }
}
