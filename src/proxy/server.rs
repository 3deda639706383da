//! The host-side proxy: HTTP CONNECT, absolute-URI HTTP and SOCKS5 (socks5h) on one Unix
//! socket (the first byte tells them apart), every decision taken by [`Policy`] and written to
//! the audit log.
//!
//! Plain HTTP is one request per upstream connection: the request line and headers are
//! checked, `Host` is rewritten to the checked name, hop-by-hop headers are dropped, the body
//! is forwarded by its `Content-Length` only, and the upstream is told `Connection: close`. A
//! second request on the same client connection is never forwarded, so it cannot ride on an
//! earlier request's check (no header smuggling).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

use super::policy::{Allowed, Blocked, Policy};
use crate::audit::{Kind, Log};

/// Largest request head accepted (request line and headers).
const MAX_HEAD: usize = 64 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Copy buffer per direction: tokio's default 8 KiB halves loopback throughput.
const BUF: usize = 256 * 1024;

pub struct Proxy {
    pub policy: Policy,
    pub audit: Option<Log>,
    /// Events the sandboxed side reported (agent tool calls, direct connection attempts).
    pub reported: std::sync::atomic::AtomicU64,
}

/// The most events one sandbox run may report from inside; past it they are dropped, once
/// noted, so a sandbox cannot fill the disk through its own audit log.
pub const MAX_REPORTED: u64 = 10_000;

/// Accept connections until the listener fails (the process is killed when the sandbox ends).
pub async fn serve(listener: UnixListener, proxy: Arc<Proxy>) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let p = Arc::clone(&proxy);
        tokio::spawn(async move {
            let _ = p.handle(stream).await;
        });
    }
}

struct Outcome {
    proto: &'static str,
    host: String,
    port: u16,
    result: Result<Allowed, Blocked>,
    addr: Option<std::net::SocketAddr>,
    up: u64,
    down: u64,
    start: Instant,
}

impl Proxy {
    async fn handle(&self, mut client: UnixStream) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(4096);
        if read_more(&mut client, &mut buf).await? == 0 {
            return Ok(());
        }
        let outcome = if buf[0] == 5 {
            self.socks5(&mut client, buf).await
        } else {
            self.http(&mut client, buf).await
        };
        if let Some(o) = outcome? {
            self.record(&o);
        }
        Ok(())
    }

    /// Whether one more event reported from inside may be logged (see [`MAX_REPORTED`]).
    fn may_report(&self, log: &Log) -> bool {
        let n = self
            .reported
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n == MAX_REPORTED {
            let _ = log.write(Kind::Agent {
                agent: "aisb".into(),
                tool: "audit-limit".into(),
                input: format!(
                    "{MAX_REPORTED} events reported from inside the sandbox: further ones are dropped"
                ),
            });
        }
        n < MAX_REPORTED
    }

    fn record(&self, o: &Outcome) {
        let Some(log) = &self.audit else { return };
        if o.proto == "direct" && !self.may_report(log) {
            return;
        }
        let (action, rule) = match &o.result {
            Ok(a) => ("allow", a.rule.clone()),
            Err(b) => ("block", b.rule.clone()),
        };
        let _ = log.write(Kind::Net {
            action: action.into(),
            proto: o.proto.into(),
            host: o.host.clone(),
            port: o.port,
            rule,
            addr: o.addr.map(|a| a.to_string()),
            bytes_up: o.up,
            bytes_down: o.down,
            duration_ms: o.start.elapsed().as_millis() as u64,
        });
    }

    /// Check, resolve and connect: the outcome so far (to be completed with the byte counts
    /// and logged), and the upstream when the request may go out.
    async fn open(
        &self,
        proto: &'static str,
        host: String,
        port: u16,
        start: Instant,
    ) -> (Outcome, Option<TcpStream>) {
        let mut o = Outcome {
            proto,
            host,
            port,
            result: Err(Blocked {
                rule: String::new(),
                hint: None,
            }),
            addr: None,
            up: 0,
            down: 0,
            start,
        };
        let allowed = match self.policy.check(&o.host, port) {
            Ok(a) => a,
            Err(b) => {
                o.result = Err(b);
                return (o, None);
            }
        };
        let addr = match self.policy.resolve(&allowed, port).await {
            Ok(a) => a,
            Err(b) => {
                o.result = Err(b);
                return (o, None);
            }
        };
        o.addr = Some(addr);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                o.result = Ok(allowed);
                (o, Some(s))
            }
            Ok(Err(e)) => {
                o.result = Err(Blocked {
                    rule: format!("{}, but connecting to {addr} failed: {e}", allowed.rule),
                    hint: None,
                });
                (o, None)
            }
            Err(_) => {
                o.result = Err(Blocked {
                    rule: format!("{}, but connecting to {addr} timed out", allowed.rule),
                    hint: None,
                });
                (o, None)
            }
        }
    }

    async fn http(
        &self,
        client: &mut UnixStream,
        mut buf: Vec<u8>,
    ) -> std::io::Result<Option<Outcome>> {
        let start = Instant::now();
        let head_len = loop {
            let mut headers = [httparse::EMPTY_HEADER; 96];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => break n,
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => {
                    if read_more(client, &mut buf).await? == 0 {
                        return Ok(None);
                    }
                }
                Ok(httparse::Status::Partial) => {
                    respond(
                        client,
                        431,
                        "Request Header Fields Too Large",
                        "the request head is larger than 64 KiB",
                        None,
                    )
                    .await?;
                    return Ok(None);
                }
                Err(e) => {
                    respond(
                        client,
                        400,
                        "Bad Request",
                        &format!("aisb proxy: not an HTTP request or SOCKS5 greeting ({e})"),
                        None,
                    )
                    .await?;
                    return Ok(None);
                }
            }
        };
        let mut headers = [httparse::EMPTY_HEADER; 96];
        let mut req = httparse::Request::new(&mut headers);
        let _ = req.parse(&buf[..head_len]);
        let method = req.method.unwrap_or("").to_string();
        let target = req.path.unwrap_or("").to_string();
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
        };

        if method == crate::init::relay::DIRECT_METHOD {
            // The init saw the workload try to connect around the proxy (it was refused).
            let (host, port) = split_authority(&target, None).unwrap_or((target.clone(), 0));
            client.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await?;
            return Ok(Some(Outcome {
                proto: "direct",
                host,
                port,
                result: Err(Blocked {
                    rule: "direct-connect-not-via-proxy".into(),
                    hint: None,
                }),
                addr: None,
                up: 0,
                down: 0,
                start,
            }));
        }
        if method == crate::init::relay::AGENT_METHOD {
            let want = header("content-length")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0)
                .min(crate::init::relay::AGENT_EVENT_MAX);
            let mut body = buf[head_len..].to_vec();
            while body.len() < want {
                if read_more(client, &mut body).await? == 0 {
                    break;
                }
            }
            body.truncate(want);
            client.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await?;
            if let Some(log) = self.audit.as_ref().filter(|l| self.may_report(l)) {
                let (tool, input) = crate::agents::summarise_tool_call(&body);
                let _ = log.write(Kind::Agent {
                    agent: crate::agents::clean_label(&target),
                    tool,
                    input,
                });
            }
            return Ok(None);
        }
        if method == "CONNECT" {
            let Some((host, port)) = split_authority(&target, None) else {
                respond(client, 400, "Bad Request", "CONNECT needs host:port", None).await?;
                return Ok(None);
            };
            let (mut o, upstream) = self.open("connect", host, port, start).await;
            match (&o.result, upstream) {
                (Ok(_), Some(mut up)) => {
                    client
                        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .await?;
                    let early = &buf[head_len..];
                    if !early.is_empty() {
                        up.write_all(early).await?;
                        o.up += early.len() as u64;
                    }
                    let (a, b) =
                        tokio::io::copy_bidirectional_with_sizes(client, &mut up, BUF, BUF)
                            .await
                            .unwrap_or((0, 0));
                    o.up += a;
                    o.down += b;
                }
                (Err(b), _) => blocked(client, "CONNECT", &o.host, o.port, b).await?,
                (Ok(_), None) => {}
            }
            return Ok(Some(o));
        }

        // Plain HTTP: absolute-URI (`GET http://host/path`), or origin-form with a Host header.
        let (authority, path) = if let Some(rest) = target.strip_prefix("http://") {
            match rest.find('/') {
                Some(i) => (rest[..i].to_string(), rest[i..].to_string()),
                None => (rest.to_string(), "/".to_string()),
            }
        } else if target.starts_with('/') {
            match header("host") {
                Some(h) => (h, target.clone()),
                None => {
                    respond(
                        client,
                        400,
                        "Bad Request",
                        "no Host header and no absolute URI",
                        None,
                    )
                    .await?;
                    return Ok(None);
                }
            }
        } else {
            respond(
                client,
                400,
                "Bad Request",
                "only http:// URIs are proxied in plain text; use https through CONNECT",
                None,
            )
            .await?;
            return Ok(None);
        };
        let authority = authority
            .rsplit_once('@')
            .map_or(authority.as_str(), |(_, a)| a)
            .to_string();
        let Some((host, port)) = split_authority(&authority, Some(80)) else {
            respond(client, 400, "Bad Request", "bad host in the request", None).await?;
            return Ok(None);
        };
        if header("transfer-encoding").is_some() {
            respond(
                client,
                501,
                "Not Implemented",
                "chunked request bodies are not proxied over plain HTTP; use https",
                None,
            )
            .await?;
            return Ok(None);
        }
        let length: u64 = match header("content-length").map(|v| v.parse::<u64>()) {
            None => 0,
            Some(Ok(n)) => n,
            Some(Err(_)) => {
                respond(client, 400, "Bad Request", "bad Content-Length", None).await?;
                return Ok(None);
            }
        };
        let (mut o, upstream) = self.open("http", host, port, start).await;
        let allowed = match (&o.result, upstream) {
            (Ok(a), Some(up)) => (a.clone(), up),
            (Err(b), _) => {
                blocked(client, &method, &o.host, o.port, b).await?;
                return Ok(Some(o));
            }
            (Ok(_), None) => return Ok(Some(o)),
        };
        let (checked, mut up) = allowed;
        let host_header = if port == 80 {
            checked.host.clone()
        } else {
            format!("{}:{port}", checked.host)
        };
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host_header}\r\n");
        const HOP: [&str; 9] = [
            "host",
            "connection",
            "proxy-connection",
            "keep-alive",
            "proxy-authorization",
            "proxy-authenticate",
            "te",
            "trailer",
            "upgrade",
        ];
        for h in req.headers.iter() {
            if HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
                continue;
            }
            head.push_str(h.name);
            head.push_str(": ");
            head.push_str(&String::from_utf8_lossy(h.value));
            head.push_str("\r\n");
        }
        head.push_str("Connection: close\r\n\r\n");
        up.write_all(head.as_bytes()).await?;
        // The body: exactly Content-Length bytes, whatever else the client sends.
        let early = &buf[head_len..];
        let first = early.len().min(length as usize);
        up.write_all(&early[..first]).await?;
        let mut left = length - first as u64;
        let mut chunk = vec![0u8; 64 * 1024];
        while left > 0 {
            let want = chunk.len().min(left as usize);
            let n = client.read(&mut chunk[..want]).await?;
            if n == 0 {
                break;
            }
            up.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
        o.up = length - left + head.len() as u64;
        let mut up = tokio::io::BufReader::with_capacity(BUF, up);
        o.down = tokio::io::copy_buf(&mut up, client).await.unwrap_or(0);
        let _ = client.shutdown().await;
        Ok(Some(o))
    }

    async fn socks5(
        &self,
        client: &mut UnixStream,
        mut buf: Vec<u8>,
    ) -> std::io::Result<Option<Outcome>> {
        let start = Instant::now();
        // Greeting: VER NMETHODS METHODS...; we take "no authentication".
        while buf.len() < 2 || buf.len() < 2 + buf[1] as usize {
            if read_more(client, &mut buf).await? == 0 {
                return Ok(None);
            }
        }
        let greeting = 2 + buf[1] as usize;
        if !buf[2..greeting].contains(&0) {
            client.write_all(&[5, 0xff]).await?;
            return Ok(None);
        }
        client.write_all(&[5, 0]).await?;
        buf.drain(..greeting);
        // Request: VER CMD RSV ATYP ADDR PORT.
        let need = |b: &[u8]| -> Option<usize> {
            if b.len() < 5 {
                return None;
            }
            let addr = match b[3] {
                1 => 4,
                4 => 16,
                3 => 1 + b[4] as usize,
                _ => 0,
            };
            Some(4 + addr + 2)
        };
        loop {
            match need(&buf) {
                Some(n) if buf.len() >= n => break,
                _ => {
                    if read_more(client, &mut buf).await? == 0 {
                        return Ok(None);
                    }
                }
            }
        }
        let reply = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
        if buf[1] != 1 {
            client.write_all(&reply(7)).await?; // command not supported: CONNECT only
            return Ok(None);
        }
        let (host, rest) = match buf[3] {
            1 => (
                std::net::Ipv4Addr::new(buf[4], buf[5], buf[6], buf[7]).to_string(),
                8,
            ),
            4 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&buf[4..20]);
                (format!("[{}]", std::net::Ipv6Addr::from(o)), 20)
            }
            3 => {
                let n = buf[4] as usize;
                (String::from_utf8_lossy(&buf[5..5 + n]).into_owned(), 5 + n)
            }
            _ => {
                client.write_all(&reply(8)).await?; // address type not supported
                return Ok(None);
            }
        };
        let port = u16::from_be_bytes([buf[rest], buf[rest + 1]]);
        let (mut o, upstream) = self.open("socks5", host, port, start).await;
        match (&o.result, upstream) {
            (Ok(_), Some(mut up)) => {
                client.write_all(&reply(0)).await?;
                let early = &buf[rest + 2..];
                if !early.is_empty() {
                    up.write_all(early).await?;
                }
                let (a, b) = tokio::io::copy_bidirectional_with_sizes(client, &mut up, BUF, BUF)
                    .await
                    .unwrap_or((0, 0));
                o.up = a + early.len() as u64;
                o.down = b;
            }
            // 2: connection not allowed by ruleset; 4: host unreachable.
            (Err(_), _) if o.addr.is_none() => client.write_all(&reply(2)).await?,
            _ => client.write_all(&reply(4)).await?,
        }
        Ok(Some(o))
    }
}

async fn read_more<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 4096];
    let n = r.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

/// `host:port`, `[v6]:port`, or `host` with the default port.
pub fn split_authority(s: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, tail) = rest.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => default_port?,
            None => return None,
        };
        return Some((format!("[{ip}]"), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => {
            Some((h.to_string(), p.parse().ok().filter(|&p| p > 0)?))
        }
        Some(_) => None,
        None if !s.is_empty() => Some((s.to_string(), default_port?)),
        None => None,
    }
}

async fn respond<W: AsyncWrite + Unpin>(
    w: &mut W,
    code: u16,
    reason: &str,
    body: &str,
    blocked_by: Option<&str>,
) -> std::io::Result<()> {
    let extra = blocked_by.map_or(String::new(), |r| {
        format!("X-Aisb-Blocked: {}\r\n", r.replace(['\r', '\n'], " "))
    });
    let msg = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    w.write_all(msg.as_bytes()).await?;
    let _ = w.shutdown().await;
    Ok(())
}

async fn blocked<W: AsyncWrite + Unpin>(
    w: &mut W,
    what: &str,
    host: &str,
    port: u16,
    b: &Blocked,
) -> std::io::Result<()> {
    let mut body = format!("aisb: blocked {what} {host}:{port}: {}\n", b.rule);
    if let Some(h) = &b.hint {
        body.push_str(&format!("to allow it: {h} (in sandbox.kdl)\n"));
    }
    respond(w, 403, "Forbidden", &body, Some(&b.rule)).await
}

#[cfg(test)]
mod tests {

    /// A sandbox cannot grow its audit log without bound through reported events.
    #[test]
    fn events_reported_from_inside_are_capped() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("audit.jsonl");
        let log = Log::open(&path).unwrap();
        let p = Proxy {
            policy: Policy::new(&crate::proxy::policy::PolicyConfig::default()),
            audit: None,
            reported: Default::default(),
        };
        let allowed = (0..MAX_REPORTED + 5).filter(|_| p.may_report(&log)).count();
        assert_eq!(allowed as u64, MAX_REPORTED);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains("audit-limit"), "{text}");
    }

    use super::*;

    #[test]
    fn authorities() {
        assert_eq!(
            split_authority("a.com:443", None),
            Some(("a.com".into(), 443))
        );
        assert_eq!(
            split_authority("a.com", Some(80)),
            Some(("a.com".into(), 80))
        );
        assert_eq!(split_authority("a.com", None), None);
        assert_eq!(
            split_authority("[::1]:8080", None),
            Some(("[::1]".into(), 8080))
        );
        assert_eq!(split_authority("a.com:0", None), None);
        assert_eq!(split_authority("a.com:x", None), None);
        assert_eq!(split_authority("::1:80", None), None);
    }
}
