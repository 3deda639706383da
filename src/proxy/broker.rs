//! Credential brokering (issue 31): the sandbox holds a placeholder; the proxy, on the host,
//! puts the real credential in, and only in the one header the credential declares, only on
//! requests to the hosts it is bound to.
//!
//! A connection to a bound host on port 443 is terminated here: the client gets a leaf
//! certificate for that host from the user's CA ([`super::ca`]), the upstream is verified
//! against the host's roots. Every other connection stays an opaque tunnel. On a terminated
//! connection each request is read and checked before it goes on: its `Host` must be the name
//! the connection was opened to (domain fronting is answered `421`), and its body is passed
//! on by its declared framing, never searched. Responses are passed back as they come, their
//! framing followed only to know where the next request starts.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::ca::Ca;
use super::request::split_authority;
use crate::audit::{Kind, Log};
pub use crate::config::credential::{RequestRule, Scheme};

/// One credential as the proxy holds it: its real value, the placeholder the sandbox has
/// instead, and where the one may replace the other.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Brokered {
    pub name: String,
    /// Normalised host names (exact: a credential is never added to a name below them).
    pub hosts: Vec<String>,
    /// Which requests to its hosts may go at all: (`METHOD PATH` rule, where it was written).
    /// A deny wins; a non-empty allow list refuses what it does not name.
    #[serde(default)]
    pub allow_requests: Vec<(String, String)>,
    #[serde(default)]
    pub deny_requests: Vec<(String, String)>,
    /// The header, in lower case.
    pub header: String,
    pub scheme: Scheme,
    pub placeholder: String,
    pub real: String,
}

impl std::fmt::Debug for Brokered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Brokered")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("header", &self.header)
            .field("scheme", &self.scheme)
            .finish_non_exhaustive()
    }
}

/// What the proxy is handed for brokering (over its stdin, with the rest of its policy).
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct BrokerConfig {
    pub credentials: Vec<Brokered>,
    /// The user's CA key, PEM.
    pub ca_key: String,
}

impl std::fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// A request target's path as the request rules match it: percent-decoded, the query left
/// out. A target a server could read as another path is refused rather than guessed at: dot
/// segments (plain or encoded), an encoded `/` or `\`, a `\`, `//`, `;` parameters, a
/// fragment, anything not printable ASCII.
fn normal_path(target: &str) -> Result<String, &'static str> {
    let path = target.split('?').next().unwrap_or("");
    let lower = path.to_ascii_lowercase();
    if !path.bytes().all(|b| b.is_ascii_graphic())
        || ["%2f", "%5c", "%2e", "\\", "//", ";", "#"]
            .iter()
            .any(|bad| lower.contains(bad))
        || path.split('/').any(|seg| seg == "." || seg == "..")
    {
        return Err(
            "a path a server could read as another one (dot segments, encoded slashes, `;`, `//`)",
        );
    }
    let decoded =
        crate::vocab::percent_decode(path).ok_or("a path with a `%` that is not an escape")?;
    let text = String::from_utf8(decoded).map_err(|_| "a path that does not decode to text")?;
    // Decoded once, it must be plain: a `%` left (`%25…`) is another escape to a server that
    // decodes twice, a `;` a parameter, and anything not printable ASCII is read differently.
    if !text.bytes().all(|b| b.is_ascii_graphic()) || text.contains(['%', ';', '\\']) {
        return Err("a path that decodes to another escape, a `;`, or not printable ASCII");
    }
    Ok(text)
}

/// Whether the credentials' request rules let `method path` go to their host; the refusal
/// names the rule and where it was written. A deny rule matches whatever the case and a
/// trailing `/` (servers that ignore them are common); an allow rule matches exactly.
fn rules_allow(method: &str, target: &str, creds: &[&Brokered]) -> Result<(), Refusal> {
    if creds
        .iter()
        .all(|c| c.allow_requests.is_empty() && c.deny_requests.is_empty())
    {
        return Ok(());
    }
    let path = normal_path(target).map_err(|why| Refusal::new(400, why))?;
    // A method given in the query (`_method=DELETE`): Rails, Laravel, Express read it.
    let query = target
        .split_once('?')
        .map_or("", |(_, q)| q)
        .to_ascii_lowercase();
    if query
        .split('&')
        .any(|kv| kv.starts_with("_method=") || kv.starts_with("%5fmethod="))
    {
        return Err(Refusal::new(
            403,
            "a `_method` in the query would let the server run another method than the request rules checked",
        ));
    }
    let loose = path.trim_end_matches('/').to_ascii_lowercase();
    let hit = |list: &[(String, String)], loosely: bool| {
        list.iter()
            .find(|(r, _)| {
                RequestRule::parse(r).is_ok_and(|r| {
                    if loosely {
                        let lowered = RequestRule {
                            method: r.method.clone(),
                            path: r.path.trim_end_matches('/').to_ascii_lowercase(),
                        };
                        // HEAD runs GET's handler on most servers.
                        let methods: &[&str] = if method == "HEAD" {
                            &["HEAD", "GET"]
                        } else {
                            &[method]
                        };
                        methods.iter().any(|m| {
                            lowered.matches(m, &loose)
                                || lowered.matches(m, &path.to_ascii_lowercase())
                        })
                    } else {
                        r.matches(method, &path)
                    }
                })
            })
            .cloned()
    };
    for c in creds {
        if let Some((rule, at)) = hit(&c.deny_requests, true) {
            return Err(Refusal::new(
                403,
                format!(
                    "{method} {path} is refused by deny-request \"{rule}\" of credential `{}` ({at})",
                    c.name
                ),
            ));
        }
        if !c.allow_requests.is_empty() && hit(&c.allow_requests, false).is_none() {
            let at = &c.allow_requests[0].1;
            return Err(Refusal::new(
                403,
                format!(
                    "{method} {path} is not in the allow-request list of credential `{}` ({at})",
                    c.name
                ),
            ));
        }
    }
    Ok(())
}

/// A request head larger than this is refused (`431`), as the proxy's own.
const MAX_HEAD: usize = 64 * 1024;
/// A line of a chunked body (a size, a trailer) longer than this ends the connection.
const MAX_LINE: usize = 4096;
/// Trailer lines after a chunked body, at most.
const MAX_TRAILERS: usize = 64;
/// A terminated connection with no request for this long is closed (and a client that sends
/// nothing of a body for as long).
const IDLE: Duration = Duration::from_secs(120);
/// An upstream silent for this long in an answer (a model streams for minutes, but not in
/// silence) ends the connection.
const UPSTREAM_IDLE: Duration = Duration::from_secs(600);
/// Refused requests on brokered connections written to the audit log per proxy, at most: a
/// sandbox cannot spend the run's log budget on them.
const MAX_LOGGED: u64 = 5_000;
/// A credential's uses written to the audit log per proxy, at most (within the run's budget).
const MAX_INJECTIONS_LOGGED: u64 = 20_000;
/// The TLS handshakes (the client's and the upstream's) must end within this.
const HANDSHAKE: Duration = Duration::from_secs(20);

pub struct Broker {
    creds: Vec<Brokered>,
    ca: Ca,
    /// The key of every leaf this proxy makes, made on first use (not before the proxy is
    /// ready: a run that never reaches a bound host pays nothing for it).
    leaf_key: std::sync::OnceLock<Result<(rcgen::KeyPair, PrivateKeyDer<'static>), String>>,
    /// Server configurations by host name, made on first use.
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    /// The upstream's TLS configuration with the host's roots, read on first use.
    upstream: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    /// Audit lines written (see [`MAX_LOGGED`], [`MAX_INJECTIONS_LOGGED`]).
    logged: std::sync::atomic::AtomicU64,
    injections_logged: std::sync::atomic::AtomicU64,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The roots the upstream is verified against: the host's bundle (`SSL_CERT_FILE` when the
/// caller sets it, as OpenSSL reads it; the system's otherwise).
pub fn host_roots_file() -> std::path::PathBuf {
    /// Where distributions keep theirs: Debian and Ubuntu, Fedora and RHEL, Alpine and
    /// Arch's link, openSUSE.
    const SYSTEM: [&str; 4] = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
        "/etc/ssl/ca-bundle.pem",
    ];
    std::env::var_os("SSL_CERT_FILE")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            SYSTEM
                .iter()
                .map(std::path::PathBuf::from)
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| SYSTEM[0].into())
}

/// The upstream's TLS configuration: the host's roots, HTTP/1.1.
fn upstream_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let file = host_roots_file();
    let mut roots = rustls::RootCertStore::empty();
    let certs = <CertificateDer as rustls::pki_types::pem::PemObject>::pem_file_iter(&file)
        .map_err(|e| format!("reading the host's roots {}: {e}", file.display()))?;
    roots.add_parsable_certificates(certs.flatten());
    if roots.is_empty() {
        return Err(format!(
            "no root certificate in {}: the broker cannot verify the hosts it adds credentials for",
            file.display()
        ));
    }
    let mut upstream = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(upstream))
}

impl Broker {
    pub fn new(cfg: &BrokerConfig) -> Result<Broker, String> {
        Ok(Broker {
            creds: cfg.credentials.clone(),
            ca: Ca::from_key_pem(&cfg.ca_key)?,
            leaf_key: std::sync::OnceLock::new(),
            leaves: Mutex::new(HashMap::new()),
            upstream: std::sync::OnceLock::new(),
            logged: Default::default(),
            injections_logged: Default::default(),
        })
    }

    /// Whether a connection to `host:port` is terminated (a credential is bound to the host;
    /// HTTPS's port only).
    pub fn bound(&self, host: &str, port: u16) -> bool {
        port == 443 && self.creds.iter().any(|c| c.hosts.iter().any(|h| h == host))
    }

    fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let mut leaves = self.leaves.lock().map_err(|_| "poisoned".to_string())?;
        if let Some(c) = leaves.get(host) {
            return Ok(Arc::clone(c));
        }
        let (key, der) = self
            .leaf_key
            .get_or_init(super::ca::leaf_key)
            .as_ref()
            .map_err(Clone::clone)?;
        let leaf = self.ca.leaf(host, key)?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![leaf, self.ca.cert_der()], der.clone_key())
            .map_err(|e| e.to_string())?;
        // HTTP/1.1 only: a client that offers h2 falls back (see the README).
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        if leaves.len() < 4096 {
            leaves.insert(host.to_string(), Arc::clone(&cfg));
        }
        Ok(cfg)
    }

    /// Serve a connection to a bound `host` (already allowed, `up` connected): TLS with the
    /// client (whose first bytes, read already, are `early`) and with the upstream, then the
    /// requests one by one. The bytes moved up and down.
    pub async fn serve<C: AsyncRead + AsyncWrite + Unpin>(
        &self,
        client: C,
        early: &[u8],
        host: &str,
        port: u16,
        up: TcpStream,
        audit: Option<&Log>,
    ) -> Result<(u64, u64), String> {
        let server = self.server_config(host)?;
        let client = Prefixed {
            early: early.to_vec(),
            at: 0,
            inner: client,
        };
        let accept = tokio_rustls::TlsAcceptor::from(server).accept(client);
        let client = tokio::time::timeout(HANDSHAKE, accept)
            .await
            .map_err(|_| "the client's TLS handshake timed out".to_string())?
            .map_err(|e| format!("the client's TLS handshake failed: {e}"))?;
        let name = ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
        let mut client = client;
        let upstream = match self.upstream.get_or_init(upstream_config) {
            Ok(u) => u,
            Err(why) => {
                let _ = answer(&mut client, 502, "Bad Gateway", &format!("aisb: {why}")).await;
                return Err(why.clone());
            }
        };
        let connect = tokio_rustls::TlsConnector::from(Arc::clone(upstream)).connect(name, up);
        let upstream = match tokio::time::timeout(HANDSHAKE, connect).await {
            Ok(Ok(u)) => u,
            Ok(Err(e)) => {
                let why = format!("aisb: {host} did not verify against the host's roots: {e}");
                let _ = answer(&mut client, 502, "Bad Gateway", &why).await;
                return Err(why);
            }
            Err(_) => {
                let why = format!("aisb: the TLS handshake with {host} timed out");
                let _ = answer(&mut client, 504, "Gateway Timeout", &why).await;
                return Err(why);
            }
        };
        let creds: Vec<&Brokered> = self
            .creds
            .iter()
            .filter(|c| c.hosts.iter().any(|h| h == host))
            .collect();
        let mut c = Side::new(timed(client, IDLE), IDLE);
        let mut u = Side::new(timed(upstream, UPSTREAM_IDLE), UPSTREAM_IDLE);
        let mut moved = (0u64, 0u64);
        // Refusals and injections each have a budget of their own: refused requests, cheap
        // to make, cannot crowd the record of a credential's uses out of the log.
        let log = |kind: Kind| {
            let Some(log) = audit else { return };
            let (counter, max, what) = match kind {
                Kind::Credential { .. } => (
                    &self.injections_logged,
                    MAX_INJECTIONS_LOGGED,
                    "uses of brokered credentials",
                ),
                _ => (
                    &self.logged,
                    MAX_LOGGED,
                    "refused requests on brokered connections",
                ),
            };
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n < max {
                let _ = log.write(kind);
            } else if n == max {
                let _ = log.write(Kind::Agent {
                    agent: "aisb".into(),
                    tool: "audit-limit".into(),
                    input: format!("{max} {what} logged: further ones are not"),
                });
            }
        };
        let result = exchange(&mut c, &mut u, host, port, &creds, &log, &mut moved).await;
        // Bounded: to a client that stopped reading, close_notify never flushes.
        let _ = tokio::time::timeout(Duration::from_secs(5), c.io.shutdown()).await;
        result.map(|()| moved)
    }
}

/// A client whose first bytes were read already: those first, then the connection.
struct Prefixed<C> {
    early: Vec<u8>,
    at: usize,
    inner: C,
}

impl<C: AsyncRead + Unpin> AsyncRead for Prefixed<C> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.early.len() {
            let n = buf.remaining().min(self.early.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.early[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for Prefixed<C> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One side of a terminated connection: the stream and what was read from it and not yet
/// passed on.
struct Side<S> {
    io: S,
    buf: Vec<u8>,
    /// What each read goes into first (allocated once per side).
    chunk: Vec<u8>,
    /// A read that waits longer than this ends the connection.
    idle: Duration,
}

/// `io` whose writes that make no progress for `limit` fail (`TimedOut`): a peer that stops
/// reading (a client in the sandbox that never reads its answer) ends the connection instead
/// of holding it, its buffers and a slot, for ever.
fn timed<S: AsyncRead + AsyncWrite>(
    io: S,
    limit: Duration,
) -> std::pin::Pin<Box<tokio_io_timeout::TimeoutStream<S>>> {
    let mut t = tokio_io_timeout::TimeoutStream::new(io);
    t.set_write_timeout(Some(limit));
    Box::pin(t)
}

impl<S: AsyncRead + AsyncWrite + Unpin> Side<S> {
    fn new(io: S, idle: Duration) -> Side<S> {
        Side {
            io,
            buf: Vec::new(),
            chunk: vec![0u8; 64 * 1024],
            idle,
        }
    }

    /// Read more into the buffer; 0 at the end.
    async fn fill(&mut self) -> std::io::Result<usize> {
        let n = tokio::time::timeout(self.idle, self.io.read(&mut self.chunk))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        self.buf.extend_from_slice(&self.chunk[..n]);
        Ok(n)
    }

    /// A whole head (to its blank line) taken from the buffer; None at a clean end before one.
    async fn head(&mut self) -> Result<Option<Vec<u8>>, Refusal> {
        // Where the search goes on from: bytes already searched are not searched again.
        let mut from = 0;
        loop {
            if let Some(end) = find(&self.buf[from..], b"\r\n\r\n") {
                return Ok(Some(self.buf.drain(..from + end + 4).collect()));
            }
            from = self.buf.len().saturating_sub(3);
            if self.buf.len() > MAX_HEAD {
                return Err(Refusal::new(431, "the request head is larger than 64 KiB"));
            }
            match self.fill().await {
                Ok(0) if self.buf.is_empty() => return Ok(None),
                Ok(0) => return Err(Refusal::new(400, "the connection ended inside a head")),
                Ok(_) => {}
                Err(_) => return Ok(None),
            }
        }
    }

    /// One line (with its CRLF) of at most [`MAX_LINE`] bytes.
    async fn line(&mut self) -> std::io::Result<Vec<u8>> {
        let mut from = 0;
        loop {
            if let Some(end) = find(&self.buf[from..], b"\r\n") {
                return Ok(self.buf.drain(..from + end + 2).collect());
            }
            from = self.buf.len().saturating_sub(1);
            if self.buf.len() > MAX_LINE {
                return Err(bad("a chunked body's line is too long"));
            }
            if self.fill().await? == 0 {
                return Err(bad("the connection ended inside a chunked body"));
            }
        }
    }

    /// Pass exactly `n` bytes on to `to`.
    async fn copy_exact<W: AsyncWrite + Unpin>(
        &mut self,
        mut n: u64,
        to: &mut W,
    ) -> std::io::Result<()> {
        while n > 0 {
            if self.buf.is_empty() && self.fill().await? == 0 {
                return Err(bad("the connection ended inside a body"));
            }
            let take = (self.buf.len() as u64).min(n) as usize;
            to.write_all(&self.buf[..take]).await?;
            self.buf.drain(..take);
            n -= take as u64;
        }
        Ok(())
    }

    /// A chunked body, read strictly (each size line as [`crate::vocab::chunk_size`] reads it,
    /// each chunk's data followed by CRLF), passed on as it came or, `anew`, chunked anew
    /// (extensions and trailers dropped: what goes upstream can be read only one way). Its
    /// length as passed on.
    async fn chunked<W: AsyncWrite + Unpin>(
        &mut self,
        to: &mut W,
        anew: bool,
    ) -> std::io::Result<u64> {
        let mut total = 0u64;
        loop {
            let line = self.line().await?;
            let size = crate::vocab::chunk_size(&line)
                .ok_or_else(|| bad("a chunk's size line is not one"))?;
            let out = if anew {
                format!("{size:x}\r\n").into_bytes()
            } else {
                line
            };
            if size == 0 {
                let mut end = out;
                for _ in 0..MAX_TRAILERS {
                    let t = self.line().await?;
                    let last = t == b"\r\n";
                    if last || !anew {
                        end.extend_from_slice(&t);
                    }
                    if last {
                        to.write_all(&end).await?;
                        return Ok(total + end.len() as u64);
                    }
                }
                return Err(bad("too many trailer lines"));
            }
            to.write_all(&out).await?;
            self.copy_exact(size, to).await?;
            while self.buf.len() < 2 {
                if self.fill().await? == 0 {
                    return Err(bad("the connection ended inside a chunked body"));
                }
            }
            if self.buf[..2] != *b"\r\n" {
                return Err(bad("a chunk's data is not followed by CRLF"));
            }
            self.buf.drain(..2);
            to.write_all(b"\r\n").await?;
            total += out.len() as u64 + size + 2;
        }
    }

    /// Pass a body framed as `framing` on to `to`; its length.
    async fn body<W: AsyncWrite + Unpin>(
        &mut self,
        framing: Framing,
        to: &mut W,
    ) -> std::io::Result<u64> {
        match framing {
            Framing::None => Ok(0),
            Framing::Length(n) => self.copy_exact(n, to).await.map(|()| n),
            Framing::Chunked => self.chunked(to, false).await,
            Framing::UntilClose => {
                let mut total = self.buf.len() as u64;
                to.write_all(&self.buf).await?;
                self.buf.clear();
                loop {
                    let n = self.fill().await?;
                    if n == 0 {
                        return Ok(total);
                    }
                    to.write_all(&self.buf).await?;
                    self.buf.clear();
                    total += n as u64;
                }
            }
        }
    }
}

fn bad(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// How a message's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilClose,
}

/// A request the broker answers itself, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refusal {
    code: u16,
    why: String,
}

impl Refusal {
    fn new(code: u16, why: impl Into<String>) -> Refusal {
        Refusal {
            code,
            why: why.into(),
        }
    }
    fn reason(&self) -> &'static str {
        match self.code {
            400 => "Bad Request",
            403 => "Forbidden",
            421 => "Misdirected Request",
            417 => "Expectation Failed",
            431 => "Request Header Fields Too Large",
            501 => "Not Implemented",
            _ => "Error",
        }
    }
}

/// A checked request, ready to go on.
#[derive(Debug)]
struct Checked {
    head: Vec<u8>,
    method: String,
    path: String,
    framing: Framing,
    /// The names of the credentials put in.
    injected: Vec<String>,
    close: bool,
    /// The client waits for `100 Continue` before its body (answered by the broker: the
    /// upstream is not told, so nothing it answers early can split the body from its head).
    expect_continue: bool,
    /// It asks for a protocol switch (`Upgrade`, a WebSocket): only then is a `101` followed.
    upgrade: bool,
}

/// A header value with HTTP's optional whitespace (space and tab, nothing else) cut off both
/// ends; None when it is not ASCII (a server may trim what this does not, and disagree).
fn ows_trim(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok().filter(|t| t.is_ascii())?;
    Some(text.trim_matches([' ', '\t']))
}

/// The body framing a message's headers declare, read strictly (ASCII digits only, exactly
/// `chunked`); a refusal for anything a server could read another way: both lengths, differing
/// lengths, a coding other than chunked, a length or coding not plain ASCII.
fn framing(headers: &[httparse::Header<'_>], request: bool) -> Result<Framing, Refusal> {
    let mut te: Vec<String> = Vec::new();
    let mut cl: Option<u64> = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let v = ows_trim(h.value)
                .ok_or_else(|| Refusal::new(400, "a Transfer-Encoding that is not plain ASCII"))?;
            te.extend(
                v.split(',')
                    .map(|c| c.trim_matches([' ', '\t']).to_ascii_lowercase()),
            );
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let v = ows_trim(h.value)
                .filter(|v| !v.is_empty() && v.len() <= 18 && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| Refusal::new(400, "a Content-Length that is not a number"))?;
            if cl.is_some_and(|c| c != v) {
                return Err(Refusal::new(400, "two different Content-Lengths"));
            }
            cl = Some(v);
        }
    }
    match (te.as_slice(), cl) {
        ([], Some(n)) => Ok(Framing::Length(n)),
        ([], None) if request => Ok(Framing::None),
        ([], None) => Ok(Framing::UntilClose),
        (_, Some(_)) if request => Err(Refusal::new(
            400,
            "both Transfer-Encoding and Content-Length",
        )),
        ([one], _) if one == "chunked" => Ok(Framing::Chunked),
        (codings, _) if request => Err(Refusal::new(
            501,
            format!(
                "a request body coded `{}` (only chunked is passed on)",
                crate::vocab::shorten(&codings.join(", "))
            ),
        )),
        (codings, _) if codings.last().is_some_and(|c| c == "chunked") => Ok(Framing::Chunked),
        _ => Ok(Framing::UntilClose),
    }
}

/// Headers the broker writes itself on a terminated connection (the client's are dropped):
/// the Host (the name connected to), the body's framing (canonical), `Expect` (answered here).
const REWRITTEN: [&str; 4] = ["host", "content-length", "transfer-encoding", "expect"];
/// Headers some servers read as another method or path: refused where request rules apply.
const OVERRIDES: [&str; 6] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-original-url",
    "x-rewrite-url",
    "x-original-method",
];

/// Check one request head sent on a connection terminated for `host:port`, and put the
/// credentials bound to the host in their headers. The head that goes on is rebuilt: the
/// request line, a `Host` naming the host, the client's other headers with the credentials put
/// in, and a canonical framing header.
fn check_request(
    head: &[u8],
    host: &str,
    port: u16,
    creds: &[&Brokered],
) -> Result<Checked, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        // The whole head, to its CRLF CRLF, and nothing else (a bare-LF head ends earlier).
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        _ => return Err(Refusal::new(400, "not an HTTP/1.1 request")),
    }
    let method = req.method.unwrap_or("").to_string();
    let path = req.path.unwrap_or("").to_string();
    if req.version != Some(1) {
        return Err(Refusal::new(
            400,
            "only HTTP/1.1 is served on a brokered connection",
        ));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(Refusal::new(400, "a method that is not upper-case letters"));
    }
    // A server that echoes the request would send the credential back.
    if matches!(method.as_str(), "TRACE" | "TRACK") {
        return Err(Refusal::new(
            403,
            format!("{method} is refused on a connection a credential is added to"),
        ));
    }
    if method == "CONNECT" || !(path.starts_with('/') || (path == "*" && method == "OPTIONS")) {
        return Err(Refusal::new(
            421,
            format!(
                "the request names `{}`: on a connection to {host}, only a path on it may be asked for",
                crate::vocab::shorten(&path)
            ),
        ));
    }
    // The Host must be the name the connection was opened (and its certificate made) for.
    let hosts: Vec<&httparse::Header> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .collect();
    let named = match hosts.as_slice() {
        [one] => ows_trim(one.value)
            .and_then(|v| split_authority(v, Some(port)))
            .and_then(|(h, p)| Some((crate::config::domain::normalise_name(&h).ok()?, p))),
        _ => None,
    };
    if named.as_ref() != Some(&(host.to_string(), port)) {
        let shown = hosts
            .first()
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
            .unwrap_or_else(|| "none".into());
        return Err(Refusal::new(
            421,
            format!(
                "the request's Host ({}) is not {host}, the name this connection was opened to",
                crate::vocab::shorten(&shown)
            ),
        ));
    }
    let ruled = creds
        .iter()
        .any(|c| !c.allow_requests.is_empty() || !c.deny_requests.is_empty());
    for h in req.headers.iter() {
        // `Content_Length` is a Content-Length to a CGI or WSGI server.
        let dashed = h.name.replace('_', "-");
        if h.name.contains('_') && REWRITTEN.iter().any(|r| dashed.eq_ignore_ascii_case(r)) {
            return Err(Refusal::new(
                400,
                format!("a header named `{}`", crate::vocab::shorten(h.name)),
            ));
        }
        if ruled && OVERRIDES.iter().any(|o| dashed.eq_ignore_ascii_case(o)) {
            return Err(Refusal::new(
                403,
                format!(
                    "`{}` would let the server read another method or path than the request rules checked",
                    crate::vocab::shorten(h.name)
                ),
            ));
        }
    }
    rules_allow(&method, &path, creds)?;
    let framing = framing(req.headers, true)?;
    let mut expect_continue = false;
    for h in req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("expect"))
    {
        match ows_trim(h.value) {
            Some(v) if v.eq_ignore_ascii_case("100-continue") => expect_continue = true,
            _ => return Err(Refusal::new(417, "an Expect other than 100-continue")),
        }
    }
    let mut close = false;
    let mut injected = Vec::new();
    let mut out = Vec::with_capacity(head.len() + 64);
    out.extend_from_slice(format!("{method} {path} HTTP/1.1\r\n").as_bytes());
    match port {
        443 => out.extend_from_slice(format!("Host: {host}\r\n").as_bytes()),
        p => out.extend_from_slice(format!("Host: {host}:{p}\r\n").as_bytes()),
    }
    let mut upgrade = false;
    for h in req.headers.iter() {
        if REWRITTEN.iter().any(|r| h.name.eq_ignore_ascii_case(r))
            || h.name.eq_ignore_ascii_case("http2-settings")
        {
            continue;
        }
        let mut value = h.value.to_vec();
        if h.name.eq_ignore_ascii_case("upgrade") {
            // h2c through a proxy reaches what the proxy fronts; a WebSocket is fine.
            if String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("h2c")
            {
                continue;
            }
            upgrade = true;
        }
        if h.name.eq_ignore_ascii_case("connection") {
            // Only the tokens that say what happens to this connection: a header named here
            // would be dropped by a proxy in front of the upstream (the credential's, say).
            let tokens: Vec<String> = String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| matches!(t.as_str(), "close" | "keep-alive" | "upgrade"))
                .collect();
            close |= tokens.iter().any(|t| t == "close");
            if tokens.is_empty() {
                continue;
            }
            value = tokens.join(", ").into_bytes();
        }
        for c in creds
            .iter()
            .filter(|c| h.name.eq_ignore_ascii_case(&c.header))
        {
            if let Some(v) = put_in(&value, c) {
                if injected.contains(&c.name) {
                    return Err(Refusal::new(
                        400,
                        format!("two `{}` headers carry credential `{}`", c.header, c.name),
                    ));
                }
                value = v;
                injected.push(c.name.clone());
            }
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&value);
        out.extend_from_slice(b"\r\n");
    }
    // A credential put in is its header's only value: a second header of that name (or the
    // same with `_` for `-`) would be joined to it, or chosen instead, by some servers.
    for c in creds.iter().filter(|c| injected.contains(&c.name)) {
        let want = c.header.replace('_', "-");
        let same = req
            .headers
            .iter()
            .filter(|h| h.name.replace('_', "-").eq_ignore_ascii_case(&want))
            .count();
        if same > 1 {
            return Err(Refusal::new(
                400,
                format!(
                    "more than one `{}` header with credential `{}`",
                    c.header, c.name
                ),
            ));
        }
    }
    match framing {
        Framing::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        Framing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        Framing::None | Framing::UntilClose => {}
    }
    out.extend_from_slice(b"\r\n");
    Ok(Checked {
        head: out,
        method,
        path,
        framing,
        injected,
        close,
        expect_continue,
        upgrade,
    })
}

/// A header's value with the credential's placeholder replaced by the real value, where the
/// scheme puts it (for `basic`, the password only: a user name is logged and echoed); None
/// when the value does not carry the placeholder there.
fn put_in(value: &[u8], c: &Brokered) -> Option<Vec<u8>> {
    let text = ows_trim(value)?;
    match c.scheme {
        Scheme::Raw => (text == c.placeholder).then(|| c.real.as_bytes().to_vec()),
        Scheme::Bearer => {
            let (scheme, token) = text.split_once(' ')?;
            (scheme.eq_ignore_ascii_case("bearer") && token == c.placeholder)
                .then(|| format!("Bearer {}", c.real).into_bytes())
        }
        Scheme::Basic => {
            let (scheme, encoded) = text.split_once(' ')?;
            if !scheme.eq_ignore_ascii_case("basic") {
                return None;
            }
            let engine = base64::engine::general_purpose::STANDARD;
            let decoded = String::from_utf8(engine.decode(encoded).ok()?).ok()?;
            let (user, pass) = decoded.split_once(':')?;
            (pass == c.placeholder && !user.contains(&c.placeholder)).then(|| {
                let pair = format!("{user}:{}", c.real);
                format!("Basic {}", engine.encode(pair)).into_bytes()
            })
        }
    }
}

/// An answer of the broker's own, closing the connection.
async fn answer<W: AsyncWrite + Unpin>(
    w: &mut W,
    code: u16,
    reason: &str,
    body: &str,
) -> std::io::Result<()> {
    let body = format!("{body}\n");
    let msg = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nX-Aisb-Blocked: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
        body.trim().replace(['\r', '\n'], " ")
    );
    w.write_all(msg.as_bytes()).await?;
    w.flush().await
}

/// Requests and their answers, one after another, until either side ends.
async fn exchange<C, U>(
    c: &mut Side<C>,
    u: &mut Side<U>,
    host: &str,
    port: u16,
    creds: &[&Brokered],
    log: &(dyn Fn(Kind) + Sync),
    moved: &mut (u64, u64),
) -> Result<(), String>
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        let head = match tokio::time::timeout(IDLE, c.head()).await {
            Err(_) | Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(h))) => h,
            Ok(Err(r)) => {
                let _ = answer(&mut c.io, r.code, r.reason(), &format!("aisb: {}", r.why)).await;
                return Err(r.why);
            }
        };
        let checked = match check_request(&head, host, port, creds) {
            Ok(ch) => ch,
            Err(r) => {
                let text = format!(
                    "aisb: refused a request on the connection to {host}: {}",
                    r.why
                );
                {
                    log(Kind::Net {
                        action: "block".into(),
                        proto: "https".into(),
                        host: host.to_string(),
                        port,
                        rule: r.why.clone(),
                        addr: None,
                        bytes_up: 0,
                        bytes_down: 0,
                        duration_ms: 0,
                    });
                }
                let _ = answer(&mut c.io, r.code, r.reason(), &text).await;
                return Err(r.why);
            }
        };
        {
            for name in &checked.injected {
                log(Kind::Credential {
                    credential: name.clone(),
                    host: host.to_string(),
                    method: checked.method.clone(),
                    path: crate::vocab::shorten(checked.path.split('?').next().unwrap_or("")),
                });
            }
        }
        let io = |e: std::io::Error| e.to_string();
        u.io.write_all(&checked.head).await.map_err(io)?;
        moved.0 += checked.head.len() as u64;
        if checked.expect_continue && checked.framing != Framing::None {
            c.io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .map_err(io)?;
            c.io.flush().await.map_err(io)?;
        }
        moved.0 += match checked.framing {
            Framing::Chunked => c.chunked(&mut u.io, true).await,
            other => c.body(other, &mut u.io).await,
        }
        .map_err(io)?;
        u.io.flush().await.map_err(io)?;
        // The answers: any 1xx before the final one, then its body.
        loop {
            let head = match u.head().await {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(()),
                Err(r) => return Err(format!("{host} answered with a bad head: {}", r.why)),
            };
            let mut headers = [httparse::EMPTY_HEADER; 128];
            let mut resp = httparse::Response::new(&mut headers);
            if !matches!(resp.parse(&head), Ok(httparse::Status::Complete(_))) {
                return Err(format!("{host} answered something other than HTTP/1.1"));
            }
            let code = resp.code.unwrap_or(0);
            // After a request with a body, this connection ends with its answer: were the
            // server to read part of the body as a request of its own (a path that ignores a
            // body), the next request, with a credential put in, would be joined to it. The
            // client is told, so it opens a new connection for its next request.
            let last = checked.framing != Framing::None && !(100..200).contains(&code);
            let mut sent = head.clone();
            if last {
                sent.truncate(sent.len() - 2);
                sent.extend_from_slice(b"Connection: close\r\n\r\n");
            }
            if code == 101 && !checked.upgrade {
                return Err(format!("{host} switched protocols unasked"));
            }
            c.io.write_all(&sent).await.map_err(io)?;
            moved.1 += sent.len() as u64;
            if code == 101 {
                // A protocol switch (a WebSocket): both ways as they are from here.
                c.io.write_all(&u.buf).await.map_err(io)?;
                u.io.write_all(&c.buf).await.map_err(io)?;
                let (a, b) = tokio::io::copy_bidirectional(&mut c.io, &mut u.io)
                    .await
                    .unwrap_or((0, 0));
                moved.0 += a;
                moved.1 += b;
                return Ok(());
            }
            if (100..200).contains(&code) {
                c.io.flush().await.map_err(io)?;
                continue;
            }
            let framing = if checked.method == "HEAD" || code == 204 || code == 304 {
                Framing::None
            } else {
                framing(resp.headers, false).unwrap_or(Framing::UntilClose)
            };
            let close = checked.close
                || last
                || framing == Framing::UntilClose
                || resp.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("connection")
                        && String::from_utf8_lossy(h.value)
                            .to_ascii_lowercase()
                            .contains("close")
                });
            moved.1 += u.body(framing, &mut c.io).await.map_err(io)?;
            c.io.flush().await.map_err(io)?;
            if close {
                return Ok(());
            }
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(scheme: Scheme, header: &str) -> Brokered {
        Brokered {
            name: "test".into(),
            hosts: vec!["api.example.test".into()],
            header: header.into(),
            scheme,
            placeholder: "sk-test-PLACEHOLDER0000".into(),
            real: "sk-test-REALREALREAL1234".into(),
            allow_requests: vec![],
            deny_requests: vec![],
        }
    }

    /// Read-only git and API: fetch allowed, push refused, however the path is spelt.
    #[test]
    fn request_rules_match_the_path_a_server_reads() {
        let mut c = cred(Scheme::Basic, "authorization");
        c.allow_requests = vec![
            ("GET *".into(), "sandbox.kdl:3".into()),
            ("HEAD *".into(), "sandbox.kdl:3".into()),
            ("POST */git-upload-pack".into(), "sandbox.kdl:4".into()),
        ];
        c.deny_requests = vec![("* /admin/*".into(), "sandbox.kdl:5".into())];
        let req = |m: &str, p: &str| {
            check(
                &format!("{m} {p} HTTP/1.1\r\nHost: api.example.test\r\n\r\n"),
                &c,
            )
            .map(|_| ())
        };
        assert!(req("GET", "/me/repo.git/info/refs?service=git-upload-pack").is_ok());
        assert!(req("POST", "/me/repo.git/git-upload-pack").is_ok());
        for (m, p) in [
            ("POST", "/me/repo.git/git-receive-pack"),
            ("POST", "/me/repo.git/git-upload-pack/../git-receive-pack"),
            ("POST", "/me/repo.git/git%2Dreceive-pack"),
            ("DELETE", "/repos/me/repo"),
            ("GET", "/admin/x"),
            ("GET", "//admin//x"),
            ("GET", "/x/%2e%2e/admin/x"),
            ("GET", "/a%ZZ"),
            ("GET", "/a%00b"),
        ] {
            let r = req(m, p).err().unwrap_or_else(|| panic!("{m} {p} passed"));
            assert!(matches!(r.code, 403 | 400), "{m} {p}: {r:?}");
            assert!(r.code == 400 || r.why.contains("sandbox.kdl:"), "{r:?}");
        }
        assert!(RequestRule::parse("get *").is_err());
        assert!(RequestRule::parse("GET").is_err());
        assert!(RequestRule::parse("GET x").is_err());
        let rule = |r: &str, m: &str, p: &str| RequestRule::parse(r).unwrap().matches(m, p);
        assert!(rule(
            "POST */git-upload-pack",
            "POST",
            "/a/b/git-upload-pack"
        ));
        assert!(!rule(
            "POST */git-upload-pack",
            "POST",
            "/a/b/git-upload-pack2"
        ));
        assert!(rule("* /a*b*c", "GET", "/abc") && !rule("* /a*b*c", "GET", "/acb"));
        assert!(RequestRule::parse("GET /a?b").is_err());
    }

    fn check(head: &str, c: &Brokered) -> Result<Checked, Refusal> {
        check_request(head.as_bytes(), "api.example.test", 443, &[c])
    }

    #[test]
    fn the_placeholder_is_replaced_only_in_the_declared_header() {
        let c = cred(Scheme::Raw, "x-api-key");
        let got = check(
            "POST /v1/messages HTTP/1.1\r\nHost: api.example.test\r\nx-api-key: sk-test-PLACEHOLDER0000\r\nx-other: sk-test-PLACEHOLDER0000\r\nContent-Length: 3\r\n\r\n",
            &c,
        )
        .unwrap();
        let head = String::from_utf8(got.head).unwrap();
        assert!(
            head.contains("x-api-key: sk-test-REALREALREAL1234\r\n"),
            "{head}"
        );
        assert!(
            head.contains("x-other: sk-test-PLACEHOLDER0000\r\n"),
            "{head}"
        );
        assert_eq!(got.injected, vec!["test".to_string()]);
        assert_eq!(got.framing, Framing::Length(3));
    }

    #[test]
    fn bearer_and_basic_carry_it_where_they_say() {
        let c = cred(Scheme::Bearer, "authorization");
        let got = check(
            "GET / HTTP/1.1\r\nHost: api.example.test:443\r\nAuthorization: bearer sk-test-PLACEHOLDER0000\r\n\r\n",
            &c,
        )
        .unwrap();
        assert!(String::from_utf8(got.head)
            .unwrap()
            .contains("Authorization: Bearer sk-test-REALREALREAL1234\r\n"));
        let c = cred(Scheme::Basic, "authorization");
        let engine = base64::engine::general_purpose::STANDARD;
        let sent = engine.encode("x-access-token:sk-test-PLACEHOLDER0000");
        let got = check(
            &format!("GET /repo.git/info/refs HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Basic {sent}\r\n\r\n"),
            &c,
        )
        .unwrap();
        let want = engine.encode("x-access-token:sk-test-REALREALREAL1234");
        assert!(String::from_utf8(got.head)
            .unwrap()
            .contains(&format!("Authorization: Basic {want}\r\n")));
        // Not the placeholder: passed as it is, nothing put in.
        let got = check(
            "GET / HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Basic Zm9vOmJhcg==\r\n\r\n",
            &c,
        )
        .unwrap();
        assert!(got.injected.is_empty());
    }

    #[test]
    fn another_host_or_a_smuggling_shape_is_refused() {
        let c = cred(Scheme::Raw, "x-api-key");
        for (head, code) in [
            ("GET / HTTP/1.1\r\nHost: echo.example.test\r\nx-api-key: sk-test-PLACEHOLDER0000\r\n\r\n", 421),
            ("GET / HTTP/1.1\r\nHost: api.example.test:8443\r\n\r\n", 421),
            ("GET / HTTP/1.1\r\n\r\n", 421),
            ("GET / HTTP/1.1\r\nHost: api.example.test\r\nHost: other.test\r\n\r\n", 421),
            ("GET https://other.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n", 421),
            ("CONNECT other.test:443 HTTP/1.1\r\nHost: api.example.test\r\n\r\n", 421),
            ("POST / HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: api.example.test\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
            ("GET / HTTP/1.0\r\nHost: api.example.test\r\n\r\n", 400),
        ] {
            let r = check(head, &c).err().unwrap_or_else(|| panic!("passed: {head:?}"));
            assert_eq!(r.code, code, "{head:?}: {}", r.why);
        }
    }

    /// What a server could read another way is refused, and what goes on is canonical.
    #[test]
    fn heads_go_on_canonical_and_ambiguity_is_refused() {
        let c = cred(Scheme::Raw, "x-api-key");
        let got = check(
            "POST /v1 HTTP/1.1\r\nhost: API.example.test.\r\nExpect: 100-continue\r\nContent-Length:  3 \r\nx-api-key: sk-test-PLACEHOLDER0000\r\n\r\n",
            &c,
        )
        .unwrap();
        let head = String::from_utf8(got.head).unwrap();
        assert!(
            head.starts_with("POST /v1 HTTP/1.1\r\nHost: api.example.test\r\n"),
            "{head}"
        );
        assert!(head.ends_with("Content-Length: 3\r\n\r\n"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("expect") && !head.contains("API."),
            "{head}"
        );
        assert!(got.expect_continue);
        let mut ruled = cred(Scheme::Raw, "x-api-key");
        ruled.deny_requests = vec![("DELETE /repos/me/prod".into(), "s.kdl:1".into())];
        for (head, code) in [
            ("POST / HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: \u{a0}5\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: api.example.test\r\nTransfer-Encoding: chunked\u{a0}\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: api.example.test\r\nContent_Length: 300\r\n\r\n", 400),
            ("POST / HTTP/1.1\r\nHost: api.example.test\r\nExpect: 200-ok\r\n\r\n", 417),
            ("TRACE / HTTP/1.1\r\nHost: api.example.test\r\nx-api-key: sk-test-PLACEHOLDER0000\r\n\r\n", 403),
            ("delete / HTTP/1.1\r\nHost: api.example.test\r\n\r\n", 400),
            ("GET / HTTP/1.1\r\nHost: api.example.test\r\nx-api-key: sk-test-PLACEHOLDER0000\r\nX-API-KEY: sk-test-PLACEHOLDER0000\r\n\r\n", 400),
            ("GET / HTTP/1.1\nHost: api.example.test\n\n\r\n\r\n", 400),
        ] {
            let r = check(head, &c).err().unwrap_or_else(|| panic!("passed: {head:?}"));
            assert_eq!(r.code, code, "{head:?}: {}", r.why);
        }
        let ruled_check =
            |head: &str| check_request(head.as_bytes(), "api.example.test", 443, &[&ruled]);
        for (head, code) in [
            ("DELETE /Repos/me/PROD/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n", 403),
            ("DELETE /repos/me/prod;x HTTP/1.1\r\nHost: api.example.test\r\n\r\n", 400),
            ("DELETE /repos/me/prod//.. HTTP/1.1\r\nHost: api.example.test\r\n\r\n", 400),
            ("POST /repos/me/prod HTTP/1.1\r\nHost: api.example.test\r\nX-HTTP-Method-Override: DELETE\r\n\r\n", 403),
        ] {
            let r = ruled_check(head).err().unwrap_or_else(|| panic!("passed: {head:?}"));
            assert_eq!(r.code, code, "{head:?}: {}", r.why);
        }
        let mut ruled2 = cred(Scheme::Raw, "x-api-key");
        ruled2.deny_requests = vec![("GET /admin/".into(), "s.kdl:2".into())];
        for head in [
            "HEAD /admin HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
            "GET /admin HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
            "GET /x?_method=GET&a=1 HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
            "GET /admin%252f HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
            "GET /admin%3bx HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
        ] {
            let r = check_request(head.as_bytes(), "api.example.test", 443, &[&ruled2]);
            assert!(r.is_err(), "passed: {head:?}");
        }
        assert!(RequestRule::parse("GET /a%2fb").is_err());
        // A second header of the credential's name, with anything in it.
        for extra in ["x-api-key: junk", "x_api_key: junk"] {
            let head = format!("GET / HTTP/1.1\r\nHost: api.example.test\r\nx-api-key: sk-test-PLACEHOLDER0000\r\n{extra}\r\n\r\n");
            let r = check(&head, &c)
                .err()
                .unwrap_or_else(|| panic!("passed: {head:?}"));
            assert_eq!(r.code, 400, "{}", r.why);
        }
        // Connection names only what happens to the connection; h2c is not asked for upstream.
        let got = check(
            "GET / HTTP/1.1\r\nHost: api.example.test\r\nConnection: x-api-key, close, Upgrade\r\nUpgrade: h2c\r\nHTTP2-Settings: AAA\r\n\r\n",
            &c,
        )
        .unwrap();
        let head = String::from_utf8(got.head).unwrap();
        assert!(head.contains("Connection: close, upgrade\r\n"), "{head}");
        assert!(!head.contains("h2c") && !head.contains("HTTP2"), "{head}");
        assert!(got.close && !got.upgrade);
        // Basic: the password only; a placeholder as the user name is left as it is.
        let b = cred(Scheme::Basic, "authorization");
        let engine = base64::engine::general_purpose::STANDARD;
        let sent = engine.encode("sk-test-PLACEHOLDER0000:x");
        let got = check(
            &format!(
                "GET / HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Basic {sent}\r\n\r\n"
            ),
            &b,
        )
        .unwrap();
        assert!(got.injected.is_empty());
    }

    /// A chunked request body goes on chunked anew; one a server could read another way ends
    /// the connection.
    #[tokio::test]
    async fn chunked_request_bodies_are_read_strictly() {
        for (body, want) in [
            (
                &b"3;ext\r\nabc\r\n0\r\nT: 1\r\n\r\n"[..],
                Some(&b"3\r\nabc\r\n0\r\n\r\n"[..]),
            ),
            (b"3\r\nabcX\n0\r\n\r\n", None),
            (b"+3\r\nabc\r\n0\r\n\r\n", None),
            (b"3;\nx\r\nabc\r\n0\r\n\r\n", None),
        ] {
            let (a, mut b) = tokio::io::duplex(1024);
            b.write_all(body).await.unwrap();
            drop(b);
            let mut side = Side::new(a, IDLE);
            let mut out = Vec::new();
            let got = side.chunked(&mut out, true).await;
            match want {
                Some(w) => {
                    got.unwrap();
                    assert_eq!(out, w);
                }
                None => assert!(got.is_err(), "{:?} passed", String::from_utf8_lossy(body)),
            }
        }
    }

    #[test]
    fn chunk_sizes_parse_with_a_bound() {
        use crate::vocab::chunk_size;
        assert_eq!(chunk_size(b"1a;ext=1\r\n"), Some(26));
        assert_eq!(chunk_size(b"0\r\n"), Some(0));
        assert_eq!(chunk_size(b"zz\r\n"), None);
        assert_eq!(chunk_size(b"ffffffffffffffffff\r\n"), None);
    }

    /// A chunked body passes whole, and what follows it is the next request's.
    #[tokio::test]
    async fn a_chunked_body_ends_where_it_says() {
        let (a, mut b) = tokio::io::duplex(1024);
        b.write_all(b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\nGET /next")
            .await
            .unwrap();
        drop(b);
        let mut side = Side::new(a, IDLE);
        let mut out = Vec::new();
        let n = side.body(Framing::Chunked, &mut out).await.unwrap();
        assert_eq!(out, b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n");
        assert_eq!(n, out.len() as u64);
        assert_eq!(side.buf, b"GET /next");
    }

    #[tokio::test]
    async fn a_peer_that_stops_reading_times_out_the_write() {
        let (a, _b) = tokio::io::duplex(1024);
        let mut side = Side::new(timed(a, Duration::from_millis(100)), IDLE);
        let started = std::time::Instant::now();
        let r = side.io.write_all(&vec![0u8; 1 << 20]).await;
        assert_eq!(r.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
