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

/// What a mock answers a request head with: a status line's code and reason, extra headers,
/// and a body.
type Handler = dyn Fn(&str) -> (&'static str, String, Vec<u8>) + Send + Sync;

/// An HTTPS server on 127.0.0.1 (at most 200 connections, each request answered in turn,
/// kept alive; a body by its length or chunked is read and dropped), answering by `handler`.
fn serve(cfg: Arc<rustls::ServerConfig>, handler: Arc<Handler>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(200).flatten() {
            let cfg = Arc::clone(&cfg);
            let handler = Arc::clone(&handler);
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
                let tls = rustls::ServerConnection::new(cfg).unwrap();
                let mut s = rustls::StreamOwned::new(tls, conn);
                let mut buf = Vec::new();
                let more = |s: &mut rustls::StreamOwned<_, _>, buf: &mut Vec<u8>| {
                    let mut chunk = [0u8; 4096];
                    match Read::read(s, &mut chunk) {
                        Ok(0) | Err(_) => false,
                        Ok(n) => {
                            buf.extend_from_slice(&chunk[..n]);
                            true
                        }
                    }
                };
                for _ in 0..100 {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        if !more(&mut s, &mut buf) {
                            return;
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    if let Ok(n) = header(&head, "content-length").parse::<usize>() {
                        while buf.len() < n {
                            if !more(&mut s, &mut buf) {
                                return;
                            }
                        }
                        buf.drain(..n);
                    } else if header(&head, "transfer-encoding") == "chunked" {
                        let at = loop {
                            if let Some(at) = buf.windows(5).position(|w| w == b"0\r\n\r\n") {
                                break at;
                            }
                            if !more(&mut s, &mut buf) {
                                return;
                            }
                        };
                        buf.drain(..at + 5);
                    }
                    let (status, extra, body) = handler(&head);
                    let msg = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n{extra}\r\n",
                        body.len()
                    );
                    if s.write_all(msg.as_bytes()).is_err()
                        || s.write_all(&body).is_err()
                        || s.flush().is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A header's value in a request head (`none` when absent).
fn header(head: &str, name: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| "none".into())
}

/// The API mock: `/check` says whether the real key arrived in `x-api-key` (`key=real`) or
/// what came instead; `/echo` answers with the `x-api-key` it got.
fn mock(cfg: Arc<rustls::ServerConfig>, real: String) -> u16 {
    serve(
        cfg,
        Arc::new(move |head: &str| {
            let path = head.split(' ').nth(1).unwrap_or("/");
            let key = header(head, "x-api-key");
            let body = if path.starts_with("/echo") {
                format!("x-api-key={key}")
            } else if key == real {
                "key=real".to_string()
            } else if key.contains(&real[8..]) {
                "key=mangled".to_string()
            } else {
                "key=other".to_string()
            };
            ("200 OK", String::new(), body.into_bytes())
        }),
    )
}

/// A git server over dumb HTTP for the bare repositories below `root`, behind Basic
/// authentication whose password must be `real`: a `401` with a challenge without it, a `403`
/// with another.
fn git_mock(cfg: Arc<rustls::ServerConfig>, real: String, root: std::path::PathBuf) -> u16 {
    use base64::Engine as _;
    serve(
        cfg,
        Arc::new(move |head: &str| {
            let auth = header(head, "authorization");
            let Some(encoded) = auth.strip_prefix("Basic ") else {
                return (
                    "401 Unauthorized",
                    "WWW-Authenticate: Basic realm=\"git\"\r\n".into(),
                    b"who are you".to_vec(),
                );
            };
            let pair = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            if pair.split_once(':').map(|(_, p)| p) != Some(real.as_str()) {
                return ("403 Forbidden", String::new(), b"wrong password".to_vec());
            }
            let path = head.split(' ').nth(1).unwrap_or("/");
            let path = path.split('?').next().unwrap_or("/");
            if path.contains("..") {
                return ("404 Not Found", String::new(), Vec::new());
            }
            match std::fs::read(root.join(path.trim_start_matches('/'))) {
                Ok(b) => ("200 OK", String::new(), b),
                Err(_) => ("404 Not Found", String::new(), Vec::new()),
            }
        }),
    )
}

/// A key for the test: `prefix` and 32 random letters and digits.
fn canary(prefix: &str) -> String {
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
    format!("{prefix}{tail}")
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
git config --global credential.helper '!f() { echo username=x-access-token; echo "password=$GIT_TOKEN"; }; f'
echo "git_token=$GIT_TOKEN"
echo "clone=$(git clone -q https://git.broker.test/repo.git /tmp/clone 2>&1 && cat /tmp/clone/README)"
echo "push=$(curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -X POST -u "x-access-token:$GIT_TOKEN" --data x https://git.broker.test/repo.git/git-receive-pack 2>&1)"
echo "push_spelt=$(curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -X POST -u "x-access-token:$GIT_TOKEN" --data x https://git.broker.test/repo.git/git%2Dreceive-pack 2>&1)"
echo "delete=$(curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -X DELETE -u "x-access-token:$GIT_TOKEN" https://git.broker.test/repo.git 2>&1)"
echo "leaks=$(python3 - "$REVERSED" <<'PY'
import os, re, subprocess, sys
needles = [n[::-1].encode() for n in sys.argv[1].split()]
assert len(needles) == 2 and all(len(n) > 20 for n in needles), "no keys to search for"
needle = needles[0]
def has(data):
    return any(n in data for n in needles)
me = str(os.getpid())
# The search proves it can find the key: a process holding it must be found.
planted = subprocess.Popen(["sleep", "60"], env={"CANARY": needle.decode()})
found = []
for pid in [p for p in os.listdir("/proc") if p.isdigit() and p != me]:
    for what in ("environ", "cmdline"):
        try:
            if has(open(f"/proc/{pid}/{what}", "rb").read()):
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
            if has(mem.read(b - a)):
                found.append(f"{pid}/mem")
        except (OSError, ValueError, OverflowError):
            pass
for top in ("/tmp", "/run", os.environ.get("HOME", "/"), os.getcwd()):
    for d, _, files in os.walk(top):
        for f in files:
            try:
                if has(open(os.path.join(d, f), "rb").read(1 << 24)):
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

/// `script` in the project's sandbox on `backend`, by `exe` as root (`user` None) or as that
/// (uid, gid), with a clean environment: PATH, HOME and `env`.
fn run(
    dir: &Path,
    exe: &Path,
    backend: &str,
    user: Option<(u32, u32)>,
    script: &str,
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
            script,
        ])
        .current_dir(dir.join("proj"))
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir.join("home"))
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
    let real = canary("sk-proj-");
    let token = canary("ghp_");
    let (ca_pem, configs) = mock_pki(&["api.broker.test", "echo.broker.test", "git.broker.test"]);
    let api = mock(Arc::clone(&configs[0]), real.clone());
    let echo = mock(Arc::clone(&configs[1]), real.clone());
    // A bare repository served over dumb HTTP, for `git clone` with a brokered password.
    let repos = tempfile::tempdir().unwrap();
    let src = repos.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    support::git_in(&src, &["init", "-q"]);
    std::fs::write(src.join("README"), "cloned with a brokered token\n").unwrap();
    support::git_in(&src, &["add", "-A"]);
    support::git_in(&src, &["commit", "-qm", "one"]);
    support::git_in(repos.path(), &["clone", "-q", "--bare", "src", "repo.git"]);
    support::git_in(&repos.path().join("repo.git"), &["update-server-info"]);
    let git = git_mock(
        Arc::clone(&configs[2]),
        token.clone(),
        repos.path().to_path_buf(),
    );
    let pins = format!(
        "api.broker.test=127.0.0.1:{api},echo.broker.test=127.0.0.1:{echo},git.broker.test=127.0.0.1:{git}"
    );
    let reversed: String = format!(
        "{} {}",
        real.chars().rev().collect::<String>(),
        token.chars().rev().collect::<String>()
    );
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
    allow "api.broker.test" "echo.broker.test" "git.broker.test"
}
env {
    pass "REVERSED"
}
credential "test-key" env="TEST_KEY" {
    from env="REAL_TEST_KEY"
    hosts "api.broker.test"
    header "x-api-key"
}
// git over HTTPS: fetch only.
credential "git" env="GIT_TOKEN" {
    from env="REAL_GIT_TOKEN"
    hosts "git.broker.test"
    header "Authorization" scheme="basic"
    allow-request "GET *" "HEAD *" "POST */git-upload-pack"
    deny-request "POST */git-receive-pack"
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
                SCRIPT,
                &[
                    ("XDG_CACHE_HOME", dir.join("cache").display().to_string()),
                    ("AISB_PROXY_PIN", pins.clone()),
                    ("REAL_TEST_KEY", real.clone()),
                    ("REAL_GIT_TOKEN", token.clone()),
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
                placeholder.starts_with("sk-proj-") && placeholder.len() == real.len() && placeholder != real,
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
            // git: a clone with the brokered password; push and other writes refused.
            let git_token = o.value("git_token").unwrap_or_default();
            assert!(
                git_token.starts_with("ghp_") && git_token != token,
                "{what} {git_token}"
            );
            o.expect("clone", "cloned with a brokered token");
            for key in ["push", "push_spelt", "delete"] {
                o.expect(key, "403");
            }
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
            assert!(
                log.contains("deny-request \"POST */git-receive-pack\" of credential `git`"),
                "{what} audit:\n{log}"
            );
            assert!(
                log.contains(
                    "CREDENTIAL git put in GET https://git.broker.test/repo.git/info/refs"
                ),
                "{what} audit:\n{log}"
            );
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

/// With the home visible (`home "ro"`), nothing that holds a real value is: aisb's state with
/// the CA key, a `from file=` credential's file; the variable a real value is read from is not
/// passed, nor one whose value was made from it. The file's value still reaches its host.
#[test]
fn a_visible_home_shows_no_real_value() {
    if !support::root_or_skip("credential brokering")
        || !support::tool_or_skip("curl", "credential brokering")
    {
        return;
    }
    let real = canary("sk-file-");
    let token = canary("ghp_");
    let (ca_pem, configs) = mock_pki(&["api.broker.test"]);
    let api = mock(Arc::clone(&configs[0]), real.clone());
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    for d in ["home/.config/tok", "proj"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let file = dir.join("home/.config/tok/token");
    std::fs::write(&file, format!("{real}\n")).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::write(dir.join("upstream-ca.pem"), &ca_pem).unwrap();
    support::git_in(&dir.join("proj"), &["init", "-q"]);
    std::fs::write(
        dir.join("proj/sandbox.kdl"),
        r#"home "ro"
network {
    allow "api.broker.test"
}
env {
    pass "GITHUB_TOKEN"
    set "COPY" "copied-${GITHUB_TOKEN}"
}
credential "file-key" env="FILE_KEY" {
    from file="~/.config/tok/token"
    hosts "api.broker.test"
    header "x-api-key"
}
credential "gh" env="GH_TOKEN" {
    from env="GITHUB_TOKEN"
    hosts "api.broker.test"
    header "Authorization" scheme="bearer"
}
"#,
    )
    .unwrap();
    let script = r#"
echo "ca=$(cat ~/.cache/aisb/ca/key.pem >/dev/null 2>&1; echo $?)"
echo "cache=$(ls -A ~/.cache/aisb 2>/dev/null | wc -l)"
echo "file=$(cat ~/.config/tok/token >/dev/null 2>&1; echo $?)"
echo "github=${GITHUB_TOKEN:-unset}"
echo "copy=${COPY:-unset}"
echo "gh=$GH_TOKEN"
echo "check=$(curl -sS --max-time 20 https://api.broker.test/check -H "x-api-key: $FILE_KEY" 2>&1)"
"#;
    for backend in BACKENDS {
        let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_aisb"));
        let o = run(
            dir,
            &exe,
            backend,
            None,
            script,
            &[
                ("AISB_PROXY_PIN", format!("api.broker.test=127.0.0.1:{api}")),
                (
                    "SSL_CERT_FILE",
                    dir.join("upstream-ca.pem").display().to_string(),
                ),
                ("GITHUB_TOKEN", token.clone()),
            ],
        );
        let what = format!("[{backend}]");
        assert_eq!(o.code, 0, "{what}\n{}\n{}", o.stdout, o.stderr);
        assert!(
            dir.join("home/.cache/aisb/ca/key.pem").exists(),
            "{what} no CA made"
        );
        o.expect_failed("ca", "the CA key is readable inside");
        o.expect("cache", "0");
        o.expect_failed("file", "the credential's file is readable inside");
        o.expect("github", "unset");
        o.expect("copy", "unset");
        let gh = o.value("gh").unwrap_or_default();
        assert!(gh.starts_with("ghp_") && gh != token, "{what} {gh}");
        o.expect("check", "key=real");
        assert!(
            !o.stdout.contains(&real) && !o.stdout.contains(&token),
            "{what}\n{}",
            o.stdout
        );
        assert!(
            o.stderr.contains("$COPY is kept out"),
            "{what}\n{}",
            o.stderr
        );
    }
}

/// A `mount` of a directory that holds aisb's state (`mount "~/.cache"`, home empty) shows
/// none of it: not the CA key, not the trust records or other sandboxes' layers.
#[test]
fn a_mount_of_the_cache_shows_no_state() {
    if !support::root_or_skip("credential brokering") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    for d in ["home/.cache", "home/.config", "proj"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    support::git_in(&dir.join("proj"), &["init", "-q"]);
    std::fs::write(
        dir.join("proj/sandbox.kdl"),
        "mount \"~/.cache\" access=\"ro\"\nmount \"~/.config\" access=\"overlay\"\nnetwork {\n    allow \"api.broker.test\"\n}\ncredential \"k\" env=\"K\" {\n    from env=\"REAL_K\"\n    hosts \"api.broker.test\"\n    header \"x-api-key\"\n}\n",
    )
    .unwrap();
    let script = "echo \"cache=$(ls -A ~/.cache/aisb 2>/dev/null | wc -l)\"; echo \"config=$(ls -A ~/.config/aisb 2>/dev/null | wc -l)\"; echo \"key=$(cat ~/.cache/aisb/ca/key.pem >/dev/null 2>&1; echo $?)\"";
    for backend in BACKENDS {
        let exe = std::path::PathBuf::from(env!("CARGO_BIN_EXE_aisb"));
        let o = run(
            dir,
            &exe,
            backend,
            None,
            script,
            &[(
                "REAL_K",
                "sk-proj-0123456789abcdefghij0123456789".to_string(),
            )],
        );
        let what = format!("[{backend}]");
        assert_eq!(o.code, 0, "{what}\n{}\n{}", o.stdout, o.stderr);
        assert!(
            dir.join("home/.cache/aisb/ca/key.pem").exists(),
            "{what} no CA made"
        );
        o.expect("cache", "0");
        o.expect("config", "0");
        o.expect_failed("key", "the CA key is readable through the mount");
    }
}
