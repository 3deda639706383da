//! The in-sandbox end of the network: listeners on 127.0.0.1 and [::1] that relay to the
//! host-side proxy's Unix socket (bind-mounted at [`PROXY_SOCKET`](crate::vocab::PROXY_SOCKET)).
//!
//! The init binds them before the workload starts and keeps them: they are close-on-exec, so
//! the workload cannot accept on them, and the init is PID 1, which nothing inside can kill or
//! trace. Plain threads, no runtime: the init stays small. `connect` is the ProxyCommand for
//! SSH (`GIT_SSH_COMMAND`): it opens a CONNECT tunnel and pipes stdin/stdout through it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use crate::vocab::{AGENT_EVENT_MAX, AGENT_METHOD, DIRECT_METHOD, LEARNED_HEADER, PROXY_SOCKET};

/// What a listener relays: everything to the proxy, or one host loopback port through it.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    Proxy,
    /// `localhost-port N`: a tunnel to the host's 127.0.0.1:N, checked by the proxy.
    HostPort(u16),
}

/// Bind `port` on 127.0.0.1 and, where the kernel has IPv6, on [::1].
pub fn bind(port: u16) -> std::io::Result<Vec<TcpListener>> {
    let mut out = vec![TcpListener::bind(("127.0.0.1", port))?];
    match TcpListener::bind(("::1", port)) {
        Ok(l) => out.push(l),
        // No IPv6 on `lo` (disabled by the kernel): IPv4 only.
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {}
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {}
        Err(e) => return Err(e),
    }
    Ok(out)
}

/// Serve the listeners on their own threads, for as long as the process lives.
pub fn start(listeners: Vec<(TcpListener, Target)>) {
    for (listener, target) in listeners {
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let _ = relay(conn, target);
                });
            }
        });
    }
}

fn relay(tcp: TcpStream, target: Target) -> std::io::Result<()> {
    let _ = tcp.set_nodelay(true);
    let mut unix = UnixStream::connect(PROXY_SOCKET)?;
    if let Target::HostPort(port) = target {
        if let Err(e) = tunnel(&mut unix, &format!("127.0.0.1:{port}")) {
            let _ = tcp.shutdown(Shutdown::Both);
            return Err(e);
        }
    }
    pipe(tcp, unix)
}

/// Send CONNECT for `authority` and read the answer's head: Ok when the proxy said 200.
fn tunnel(s: &mut UnixStream, authority: &str) -> std::io::Result<()> {
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())?;
    tunnel_answer(s)
}

/// [`tunnel`] for the transparent relay, saying how it learned the name (for the audit log).
pub fn tunnel_learned(s: &mut UnixStream, authority: &str, how: &str) -> std::io::Result<()> {
    s.write_all(
        format!(
            "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{LEARNED_HEADER}: {how}\r\n\r\n"
        )
        .as_bytes(),
    )?;
    tunnel_answer(s)
}

fn tunnel_answer(s: &mut UnixStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 || head.len() > 16 * 1024 {
            return Err(std::io::Error::other("the proxy closed the tunnel"));
        }
        head.push(byte[0]);
    }
    let status = String::from_utf8_lossy(&head);
    if status.split(' ').nth(1) == Some("200") {
        return Ok(());
    }
    // The body says which rule blocked it.
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    Err(std::io::Error::other(body.trim().to_string()))
}

/// Copy both ways until each side ends, by splice(2) through a pipe (the bytes never enter
/// this process), or 256 KiB at a time where the kernel cannot splice.
pub fn pipe(tcp: TcpStream, unix: UnixStream) -> std::io::Result<()> {
    let (mut tcp_r, mut unix_w) = (tcp.try_clone()?, unix.try_clone()?);
    let up = std::thread::spawn(move || {
        let _ = forward(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(Shutdown::Write);
    });
    let (mut unix_r, mut tcp_w) = (unix, tcp);
    let _ = forward(&mut unix_r, &mut tcp_w);
    let _ = tcp_w.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

/// One direction of [`pipe`]: splice, falling back to [`copy`] before the first byte moved.
fn forward<R, W>(r: &mut R, w: &mut W) -> std::io::Result<u64>
where
    R: Read + std::os::fd::AsRawFd,
    W: Write + std::os::fd::AsRawFd,
{
    match splice_all(r.as_raw_fd(), w.as_raw_fd()) {
        Ok(n) => Ok(n),
        Err((0, e)) if e.raw_os_error() == Some(libc::EINVAL) => copy(r, w),
        Err((_, e)) => Err(e),
    }
}

/// Move everything from `from` to `to` through a pipe with splice(2) until `from` ends. On
/// error, how much had moved and the error.
fn splice_all(from: i32, to: i32) -> Result<u64, (u64, std::io::Error)> {
    const CHUNK: usize = 1 << 20;
    let (pr, pw) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| (0, std::io::Error::from(e)))?;
    // A bigger pipe moves more per call (the default is 64 KiB); best effort.
    let _ = nix::fcntl::fcntl(
        pw.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(CHUNK as i32),
    );
    let (pr, pw) = (pr.as_raw_fd(), pw.as_raw_fd());
    let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_MORE;
    let mut total = 0u64;
    loop {
        // SAFETY: plain splice(2) calls on descriptors this function holds open.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                pw,
                std::ptr::null_mut(),
                CHUNK,
                flags,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err((total, e));
        }
        if n == 0 {
            return Ok(total);
        }
        let mut left = n as usize;
        while left > 0 {
            // SAFETY: as above.
            let m = unsafe {
                libc::splice(
                    pr,
                    std::ptr::null_mut(),
                    to,
                    std::ptr::null_mut(),
                    left,
                    flags,
                )
            };
            if m < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err((total, e));
            }
            if m == 0 {
                return Err((total, std::io::ErrorKind::WriteZero.into()));
            }
            left -= m as usize;
            total += m as u64;
        }
    }
}

pub fn copy(r: &mut impl Read, w: &mut impl Write) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        w.write_all(&buf[..n])?;
        w.flush()?; // stdout is buffered: an SSH session must see every byte at once
        total += n as u64;
    }
}

/// `init connect HOST PORT`: an SSH ProxyCommand. Tunnels stdin/stdout to HOST:PORT through
/// the proxy (so the allowlist applies to SSH too); a refusal is printed with its rule.
pub fn connect_main(host: &str, port: &str) -> i32 {
    let authority = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut s = match UnixStream::connect(PROXY_SOCKET) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "aisb connect: no network proxy in this sandbox ({e}); is `network` set to allow?"
            );
            return 1;
        }
    };
    if let Err(e) = tunnel(&mut s, &authority) {
        eprintln!("aisb connect {authority}: {e}");
        return 1;
    }
    let mut from = match s.try_clone() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("aisb connect: {e}");
            return 1;
        }
    };
    std::thread::spawn(move || {
        let _ = copy(&mut std::io::stdin().lock(), &mut s);
        let _ = s.shutdown(Shutdown::Write);
    });
    let _ = copy(&mut from, &mut std::io::stdout().lock());
    0
}

/// Tell the proxy (for its audit log) that the workload tried to connect to `addr` directly.
pub fn report_direct(addr: std::net::SocketAddr) {
    if let Ok(mut s) = UnixStream::connect(PROXY_SOCKET) {
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(2)));
        let _ = s.write_all(format!("{DIRECT_METHOD} {addr} HTTP/1.1\r\n\r\n").as_bytes());
        let mut answer = [0u8; 64];
        let _ = s.read(&mut answer);
    }
}

/// `init agent-event AGENT`: an agent's pre-tool hook. Decides the call from the sandbox's
/// tool policy ([`crate::tools`], mounted read-only at `/etc/aisb/tools.json`) and forwards
/// the call and the decision to the proxy, which writes them to the audit log. A refused call
/// exits 2 with the reason on stderr (Claude Code and Gemini CLI both read that as "block this
/// call, tell the model why"), whatever the agent's own permission mode; an allowed one exits
/// 0 printing nothing, so the agent goes on as it would have. Without a proxy (network
/// "none") there is nowhere to log, and the decision still holds.
pub fn agent_event_main(agent: &str) -> i32 {
    // Read it all (the agent must not see a broken pipe), at most 64 MiB; forward the tool and
    // its one-line summary only, so a large Write keeps its name.
    let mut raw = Vec::new();
    let _ = std::io::stdin().take(64 << 20).read_to_end(&mut raw);
    // A hook that fails is not a refusal to the agent (only exit 2 is): a panic in deciding
    // refuses the call rather than letting it through.
    let refusal = std::panic::catch_unwind(|| decide(agent, &raw))
        .unwrap_or_else(|_| Some(broken("the hook failed deciding".into())));
    let (tool, summary) = crate::vocab::summarise_tool_call(&raw);
    let mut event = serde_json::json!({"tool_name": tool, "tool_input": {"summary": summary}});
    if let Some(r) = &refusal {
        event["blocked"] = serde_json::json!({"rule": r.rule, "at": r.at});
    }
    let mut input = event.to_string().into_bytes();
    input.truncate(AGENT_EVENT_MAX);
    if let Ok(mut s) = UnixStream::connect(PROXY_SOCKET) {
        // Well inside the agents' 5 s hook timeout (a timed-out hook lets the call through).
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(1)));
        let _ = s.set_write_timeout(Some(std::time::Duration::from_secs(1)));
        let head = format!(
            "{AGENT_METHOD} {agent} HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            input.len()
        );
        if s.write_all(head.as_bytes()).is_ok() && s.write_all(&input).is_ok() {
            let mut answer = [0u8; 64];
            let _ = s.read(&mut answer);
        }
    }
    match refusal {
        Some(r) => {
            eprintln!("{}", r.reason());
            2
        }
        None => 0,
    }
}

/// The policy's decision on the hook's input `raw`. No policy file: nothing to refuse. A
/// policy file that cannot be read, or a call that cannot be parsed, is refused (fail closed:
/// the file is aisb's own, so either means something is wrong).
fn decide(agent: &str, raw: &[u8]) -> Option<crate::tools::Refusal> {
    let path = std::path::Path::new(crate::tools::POLICY_DIR).join(crate::tools::POLICY_FILE);
    let policy: crate::tools::Policy = match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(broken(format!("cannot read {}: {e}", path.display()))),
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(p) => p,
            Err(e) => return Some(broken(format!("{} is not a policy: {e}", path.display()))),
        },
    };
    if policy.is_empty() {
        return None;
    }
    let Ok(call) = serde_json::from_slice::<serde_json::Value>(raw) else {
        return Some(broken("the hook's input is not JSON".into()));
    };
    let Some(tool) = call.get("tool_name").and_then(serde_json::Value::as_str) else {
        return Some(broken("the hook's input names no tool".into()));
    };
    let cwd = call
        .get("cwd")
        .and_then(serde_json::Value::as_str)
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| "/".into());
    let home = std::env::var_os("HOME").map_or_else(|| "/".into(), std::path::PathBuf::from);
    let input = call.get("tool_input").cloned().unwrap_or_default();
    policy.decide(&crate::tools::Call {
        agent,
        tool,
        input: &input,
        cwd: &cwd,
        home: &home,
    })
}

fn broken(why: String) -> crate::tools::Refusal {
    crate::tools::Refusal {
        rule: "policy unreadable".into(),
        at: why,
    }
}
