//! The host-side proxy: HTTP CONNECT, absolute-URI HTTP and SOCKS5 (socks5h) on one Unix
//! socket (the first byte tells them apart), every decision taken by [`Policy`] and written to
//! the audit log.
//!
//! Plain HTTP is one request per upstream connection: the request line and headers are
//! checked, `Host` is rewritten to the checked name, hop-by-hop headers are dropped, the body
//! is forwarded by its `Content-Length` only, and the upstream is told `Connection: close`. A
//! second request on the same client connection is never forwarded, so it cannot ride on an
//! earlier request's check (no header smuggling).

use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

use super::listen::{self, LISTEN_REQUEST};
use super::policy::{Allowed, Blocked, Policy};
use super::request::{
    http_head, http_request, socks5_greeting, socks5_request, split_authority, Forward, Head,
    HttpRequest, Socks5Greeting, Socks5Request, MAX_HEAD,
};
use super::splice::Socket;
use crate::audit::{Kind, Log};
use crate::vocab::{
    HANDED_HEADER, HANDED_HTTP, HANDED_TUNNEL, LEARNED_HEADER, REASON_HEADER, RESOLVE_METHOD,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Copy buffer per direction for a run's own proxy (a few connections): tokio's default 8 KiB
/// halves loopback throughput. `aisb proxy serve`, with thousands of tunnels, picks its own.
pub const RUN_BUFFER: usize = 256 * 1024;

/// At most this many of a run's connections through its proxy at once (the Unix socket's and
/// the proxy port's together): each holds descriptors and a task in a process on the host.
/// Past it a connection is answered `503` and closed, until some end.
pub const RUN_MAX_CONNECTIONS: usize = 1024;
/// A connection that sends nothing at all for this long after it is accepted is closed: a
/// slot is not held by a client that never speaks.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Proxy {
    pub policy: Policy,
    /// The connection slots ([`RUN_MAX_CONNECTIONS`] for a run's proxy).
    pub slots: Arc<tokio::sync::Semaphore>,
    pub audit: Option<Log>,
    /// Events the sandboxed side reported (agent tool calls, direct connection attempts).
    pub reported: std::sync::atomic::AtomicU64,
    /// Copy buffer per direction per connection (bytes).
    pub buffer: usize,
    /// Brokered credentials (`credential`): connections to their hosts are terminated and
    /// their placeholders replaced ([`super::broker`]). None when no credential is bound.
    pub broker: Option<super::broker::Broker>,
    /// What was refused, for the tool call during which it was ([`super::feedback`]): a
    /// run's own proxy only (one sandbox's refusals; `aisb proxy serve` may have many clients,
    /// and none of them hears another's).
    pub feedback: Option<std::sync::Mutex<super::feedback::Feedback>>,
}

/// The most events one sandbox run may report from inside; past it they are dropped, once
/// noted, so a sandbox cannot fill the disk through its own audit log.
pub const MAX_REPORTED: u64 = 10_000;

/// A client connection. One that is a socket the proxy can splice(2) to and from (the run's
/// own proxy, over its Unix socket) has its tunnels and responses moved by the kernel; any
/// other (`aisb proxy serve`'s, under idle timeouts) is copied through buffers.
pub trait Conn: AsyncRead + AsyncWrite + Unpin {
    fn socket(&self) -> Option<Socket<'_>> {
        None
    }
}

impl Conn for UnixStream {
    fn socket(&self) -> Option<Socket<'_>> {
        Some(Socket::Unix(self))
    }
}

impl Conn for TcpStream {
    fn socket(&self) -> Option<Socket<'_>> {
        Some(Socket::Tcp(self))
    }
}

impl Conn for std::pin::Pin<Box<tokio_io_timeout::TimeoutStream<TcpStream>>> {}

/// Accept connections until the listener fails (the process is killed when the sandbox ends;
/// running out of descriptors is not failing).
/// The first one may be the init handing over the workload's proxy port ([`super::listen`]);
/// any may carry a connection the transparent relay hands over ([`HANDED_HEADER`]).
pub async fn serve(listener: UnixListener, proxy: Arc<Proxy>) -> std::io::Result<()> {
    // The process that made the first connection: the sandbox's init (the workload does not
    // exist before the init hands over its listeners). Only it may hand over sockets.
    let mut init: Option<Option<i32>> = None;
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            // Out of descriptors (connections the workload holds open): serve on as they end.
            Err(e) if super::serve::is_transient(&e) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let Some(slot) = proxy.slot(&stream) else {
            continue;
        };
        let p = Arc::clone(&proxy);
        let peer = stream.peer_cred().ok().and_then(|c| c.pid());
        let first = init.is_none();
        let from_init = *init.get_or_insert(peer) == peer && peer.is_some();
        tokio::spawn(async move {
            let _ = p.handle_unix(stream, first, from_init).await;
            drop(slot);
        });
    }
}

/// How the proxy serves a connection the transparent relay handed over.
struct Handed {
    /// The name (and port) the relay learned; a plain HTTP request must name them.
    name: String,
    port: u16,
    proto: &'static str,
    /// Where the workload connected (told on its stderr with a refusal).
    dest: Option<std::net::SocketAddr>,
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
    /// Not a refusal of the policy's, when `result` is an error: an allowed host that could
    /// not be resolved or reached (not for the agent's feedback: allowing changes nothing).
    failed: bool,
}

impl Outcome {
    /// A decision on `host:port` with no address and no bytes moved yet.
    fn new(
        proto: &'static str,
        host: String,
        port: u16,
        result: Result<Allowed, Blocked>,
        start: Instant,
    ) -> Outcome {
        Outcome {
            proto,
            host,
            port,
            result,
            addr: None,
            up: 0,
            down: 0,
            start,
            failed: false,
        }
    }
}

impl Proxy {
    /// A run's proxy's connection slots.
    pub fn run_slots() -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(RUN_MAX_CONNECTIONS))
    }

    /// A slot for a connection just accepted, or None (the connection was answered `503` and
    /// is to be dropped; said once on stderr).
    pub fn slot<S: Conn>(&self, client: &S) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                if let Some(s) = client.socket() {
                    s.try_write(BUSY);
                }
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "aisb: the sandbox holds {RUN_MAX_CONNECTIONS} connections open through its proxy: more are refused until some end"
                    )
                });
                None
            }
        }
    }

    /// One client connection, whatever carries it (the run's Unix socket, `aisb proxy serve`'s
    /// TCP). One that sends nothing for [`FIRST_BYTE_TIMEOUT`] is closed.
    pub async fn handle<S: Conn>(&self, mut client: S) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(4096);
        match tokio::time::timeout(FIRST_BYTE_TIMEOUT, read_more(&mut client, &mut buf)).await {
            Ok(Ok(0)) | Err(_) => return Ok(()),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
        }
        self.handle_read(client, buf).await
    }

    /// A connection on the Unix socket: its first bytes are read with any descriptors sent
    /// along. With them it may be the init handing over the proxy port (the first connection
    /// only) or the transparent relay handing over a workload's connection.
    async fn handle_unix(
        self: Arc<Self>,
        mut client: UnixStream,
        may_listen: bool,
        from_init: bool,
    ) -> std::io::Result<()> {
        let (buf, fds) = match listen::read_with_fds(&client).await {
            Ok(got) => got,
            Err(e) => {
                return respond(&mut client, 400, "Bad Request", &e.to_string(), None).await;
            }
        };
        if buf.is_empty() {
            return Ok(());
        }
        if !fds.is_empty() && !from_init {
            listen::discard(fds);
            let why = "only the sandbox's init hands sockets to the proxy";
            return respond(&mut client, 400, "Bad Request", why, None).await;
        }
        if buf.starts_with(b"AISB-LISTEN") {
            let taken = match (may_listen, buf == LISTEN_REQUEST) {
                (false, _) => Err("only the proxy's first connection hands over listeners".into()),
                (true, false) => Err("the hand-over request must come whole in one message".into()),
                (true, true) => listen::listeners(fds),
            };
            return match taken {
                Ok(listeners) => {
                    for l in listeners {
                        tokio::spawn(listen::serve_port(l, Arc::clone(&self)));
                    }
                    client
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .await
                }
                Err(why) => respond(&mut client, 400, "Bad Request", &why, None).await,
            };
        }
        if fds.is_empty() {
            return self.handle_read(client, buf).await;
        }
        self.handed(client, buf, fds).await
    }

    /// A workload's connection the transparent relay handed over, with `CONNECT name:port`
    /// and [`HANDED_HEADER`] whole in the message that carried it, and what the relay read of
    /// the client's bytes behind, to the relay's end of writing. The relay waits for nothing
    /// (only a malformed hand-over is answered); the workload's connection is served from
    /// here, and a refusal is said on stderr (the workload's) as the relay says its own.
    async fn handed(
        &self,
        mut client: UnixStream,
        buf: Vec<u8>,
        mut fds: Vec<OwnedFd>,
    ) -> std::io::Result<()> {
        let start = Instant::now();
        let head_len = match http_head(&buf) {
            Head::Complete(n) => n,
            _ => {
                let why = "descriptors came with something other than a whole CONNECT";
                return respond(&mut client, 400, "Bad Request", why, None).await;
            }
        };
        // What the relay read of the client's bytes follows, to the relay's end of writing.
        let mut buf = buf;
        while read_more(&mut client, &mut buf).await? > 0 {
            if buf.len() > head_len + MAX_HEAD {
                let why = "more than 64 KiB of a client's bytes came with a hand-over";
                return respond(&mut client, 400, "Bad Request", why, None).await;
            }
        }
        let head = &buf[..head_len];
        let mode = header_of(head, HANDED_HEADER);
        let (host, port) = match (http_request(head), mode.as_deref(), fds.len()) {
            (HttpRequest::Connect { host, port }, Some(HANDED_TUNNEL | HANDED_HTTP), 1) => {
                (host, port)
            }
            _ => {
                let why =
                    "descriptors came with something other than a hand-over of one connection";
                return respond(&mut client, 400, "Bad Request", why, None).await;
            }
        };
        let mut tcp = match listen::connection(fds.remove(0)) {
            Ok(t) => t,
            Err(why) => return respond(&mut client, 400, "Bad Request", &why, None).await,
        };
        let proto = learned_proto(header_of(head, LEARNED_HEADER).as_deref());
        let early = &buf[head_len..];
        drop(client);
        // Where the workload connected (a listener on [::] sees IPv4 as mapped: unmapped).
        let dest = tcp.local_addr().ok().map(|d| match d.ip() {
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => std::net::SocketAddr::new(v4.into(), d.port()),
                None => d,
            },
            _ => d,
        });
        if mode.as_deref() == Some(HANDED_HTTP) {
            let handed = Handed {
                name: host,
                port,
                proto,
                dest,
            };
            if let Some(o) = self.http(&mut tcp, early.to_vec(), Some(handed)).await? {
                self.record(&o);
            }
            return Ok(());
        }
        let (mut o, upstream) = self.open(proto, host, port, start).await;
        match (&o.result, upstream) {
            (Ok(_), Some(up)) => {
                let to = Some((o.host.as_str(), o.port));
                (o.up, o.down) = self.carry(&mut tcp, up, early, to).await
            }
            (Err(b), _) => {
                let authority = format!("{}:{}", o.host, o.port);
                let text = blocked_text("CONNECT", &o.host, o.port, b);
                say_refused(dest, &format!("{authority}: {text}"));
            }
            (Ok(_), None) => {}
        }
        self.record(&o);
        Ok(())
    }

    /// A client connection whose first bytes were read into `buf` (not empty).
    async fn handle_read<S: Conn>(&self, mut client: S, buf: Vec<u8>) -> std::io::Result<()> {
        let outcome = if buf[0] == 5 {
            self.socks5(&mut client, buf).await
        } else {
            self.http(&mut client, buf, None).await
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
        self.feed_back(o);
        let Some(log) = &self.audit else { return };
        if matches!(o.proto, "direct" | "dns") && !self.may_report(log) {
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

    /// A refusal of the policy's, noted for the tool call during which it happened
    /// ([`super::feedback`]). The text is model input that the sandbox partly chose (the name
    /// it asked for, a direct-connection report it may send itself): a name is shown only
    /// when it is a host name or an address, and a direct connection's reason, which the
    /// report carries, never.
    fn feed_back(&self, o: &Outcome) {
        let (Some(feedback), Err(b)) = (&self.feedback, &o.result) else {
            return;
        };
        if o.failed {
            return;
        }
        if !is_host_name(&o.host) {
            if let Ok(mut f) = feedback.lock() {
                f.refused("a connection to a name that is no host name");
            }
            return;
        }
        let host = o.host.as_str();
        let mut line = match o.proto {
            "dns" => format!("a name lookup of {host} ({})", b.rule),
            "direct" => format!(
                "a connection to {host}:{} around the proxy (only connections through it leave the sandbox)",
                o.port
            ),
            _ => format!("a connection to {host}:{} ({})", o.port, b.rule),
        };
        if let Some(h) = &b.hint {
            line.push_str(&format!("; to allow it: {h}"));
        }
        if let Ok(mut f) = feedback.lock() {
            f.refused(&line);
        }
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
        let unchecked = Err(Blocked {
            rule: String::new(),
            hint: None,
        });
        let mut o = Outcome::new(proto, host, port, unchecked, start);
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
                // A name that does not resolve is no refusal; one that resolves to an
                // internal address is.
                o.failed = b.rule.starts_with("cannot resolve");
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
                o.failed = true;
                o.result = Err(Blocked {
                    rule: format!("{}, but connecting to {addr} failed: {e}", allowed.rule),
                    hint: None,
                });
                (o, None)
            }
            Err(_) => {
                o.failed = true;
                o.result = Err(Blocked {
                    rule: format!("{}, but connecting to {addr} timed out", allowed.rule),
                    hint: None,
                });
                (o, None)
            }
        }
    }

    /// An HTTP request on `client` (CONNECT, a plain one to forward, or the init's own), or
    /// with `handed`, only a plain request to the handed connection's name and port.
    async fn http<S: Conn>(
        &self,
        client: &mut S,
        mut buf: Vec<u8>,
        handed: Option<Handed>,
    ) -> std::io::Result<Option<Outcome>> {
        let start = Instant::now();
        let head_len = loop {
            match http_head(&buf) {
                Head::Complete(n) => break n,
                Head::Partial if buf.len() < MAX_HEAD => {
                    if read_more(client, &mut buf).await? == 0 {
                        return Ok(None);
                    }
                }
                Head::Partial => {
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
                Head::Invalid(e) => {
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
        if let Some(h) = handed {
            return self.http_handed(client, buf, head_len, h, start).await;
        }
        if buf.starts_with(RESOLVE_METHOD.as_bytes()) {
            return self.resolve_name(client, &buf[..head_len], start).await;
        }
        let learned = header_of(&buf[..head_len], LEARNED_HEADER);
        let forward = match http_request(&buf[..head_len]) {
            HttpRequest::Direct { host, port } => {
                // The init's reason, when its transparent relay refused the connection.
                let rule = header_of(&buf[..head_len], REASON_HEADER)
                    .map(|r| format!("transparent: {r}"))
                    .unwrap_or_else(|| "direct-connect-not-via-proxy".into());
                // The init saw the workload try to connect around the proxy (it was refused).
                client.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await?;
                let refused = Err(Blocked { rule, hint: None });
                return Ok(Some(Outcome::new("direct", host, port, refused, start)));
            }
            HttpRequest::AgentEvent { target, body_len } => {
                let body = read_body(client, &buf[head_len..], body_len).await?;
                client.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await?;
                // A call the hook let through begins; a refused one never runs.
                if crate::vocab::blocked_by(&body).is_none() {
                    let id = serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v.get("tool_use_id")?.as_str().map(str::to_string));
                    if let (Some(id), Some(Ok(mut f))) =
                        (id, self.feedback.as_ref().map(|f| f.lock()))
                    {
                        f.begin(&id);
                    }
                }
                if let Some(log) = self.audit.as_ref().filter(|l| self.may_report(l)) {
                    let (tool, input) = crate::vocab::summarise_tool_call(&body);
                    let agent = crate::vocab::clean_label(&target);
                    let _ = log.write(match crate::vocab::blocked_by(&body) {
                        Some((rule, at)) => Kind::AgentBlock {
                            agent,
                            tool,
                            input,
                            rule,
                            at,
                        },
                        None => Kind::Agent { agent, tool, input },
                    });
                }
                return Ok(None);
            }
            HttpRequest::AgentResult { body_len } => {
                let body = read_body(client, &buf[head_len..], body_len).await?;
                let body = String::from_utf8_lossy(&body).into_owned();
                let text = match self.feedback.as_ref().map(|f| f.lock()) {
                    // `end ID`: a call that ended with no result to hear about.
                    Some(Ok(mut f)) => match body.strip_prefix("end ") {
                        Some(id) => {
                            f.end(id);
                            String::new()
                        }
                        None => f.since(&body),
                    },
                    _ => String::new(),
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    text.len()
                );
                client.write_all(head.as_bytes()).await?;
                client.write_all(text.as_bytes()).await?;
                return Ok(None);
            }
            HttpRequest::Connect { host, port } => {
                let proto = learned_proto(learned.as_deref());
                let (mut o, upstream) = self.open(proto, host, port, start).await;
                match (&o.result, upstream) {
                    (Ok(_), Some(up)) => {
                        client
                            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                            .await?;
                        let to = Some((o.host.as_str(), o.port));
                        (o.up, o.down) = self.carry(client, up, &buf[head_len..], to).await;
                    }
                    (Err(b), _) => {
                        // Logged before the client hears it: a run may end as soon as it does.
                        self.record(&o);
                        blocked(client, "CONNECT", &o.host, o.port, b).await?;
                        return Ok(None);
                    }
                    (Ok(_), None) => {}
                }
                return Ok(Some(o));
            }
            HttpRequest::Refused { code, reason, body } => {
                respond(client, code, reason, body, None).await?;
                return Ok(None);
            }
            HttpRequest::Forward(f) => f,
        };
        let (o, upstream) = self
            .open("http", forward.host.clone(), forward.port, start)
            .await;
        self.forward(client, buf, head_len, forward, o, upstream)
            .await
    }

    /// A plain HTTP request on a connection the transparent relay handed over: it must be a
    /// request to forward, naming the host and port connected to (no other host through an
    /// allowed name's address); it goes to that name and port, and is the connection's only
    /// one (the upstream is told `Connection: close`, and so the client).
    async fn http_handed<S: Conn>(
        &self,
        client: &mut S,
        buf: Vec<u8>,
        head_len: usize,
        h: Handed,
        start: Instant,
    ) -> std::io::Result<Option<Outcome>> {
        let refused = |why: String| {
            say_refused(h.dest, &why);
            let rule = format!("transparent: {why}");
            let result = Err(Blocked { rule, hint: None });
            Outcome::new(h.proto, h.name.clone(), h.port, result, start)
        };
        let forward = match http_request(&buf[..head_len]) {
            HttpRequest::Forward(f) => f,
            _ => {
                let why = format!(
                    "not a plain HTTP request, sent to the address of {}",
                    h.name
                );
                self.record(&refused(why.clone()));
                respond(client, 400, "Bad Request", &why, Some(&why)).await?;
                return Ok(None);
            }
        };
        if let Err(why) = names_handed(&forward.authority, &h) {
            let o = refused(why);
            self.record(&o);
            if let Err(b) = &o.result {
                blocked(client, &forward.method, &h.name, h.port, b).await?;
            }
            return Ok(None);
        }
        let (o, upstream) = self.open(h.proto, h.name.clone(), h.port, start).await;
        self.forward(client, buf, head_len, forward, o, upstream)
            .await
    }

    /// Forward one checked plain HTTP request (`o` and `upstream`: what [`Proxy::open`] said)
    /// and its answer.
    async fn forward<S: Conn>(
        &self,
        client: &mut S,
        buf: Vec<u8>,
        head_len: usize,
        forward: Forward,
        mut o: Outcome,
        upstream: Option<TcpStream>,
    ) -> std::io::Result<Option<Outcome>> {
        let (checked, mut up) = match (&o.result, upstream) {
            (Ok(a), Some(up)) => (a.clone(), up),
            (Err(b), _) => {
                self.record(&o);
                blocked(client, &forward.method, &o.host, o.port, b).await?;
                return Ok(None);
            }
            (Ok(_), None) => return Ok(Some(o)),
        };
        let head = forward.upstream_head(&checked.host);
        up.write_all(head.as_bytes()).await?;
        // The body: exactly Content-Length bytes, whatever else the client sends.
        let length = forward.length;
        let early = &buf[head_len..];
        let first = early.len().min(length as usize);
        up.write_all(&early[..first]).await?;
        let mut left = length - first as u64;
        let mut chunk = if left > 0 {
            vec![0u8; 64 * 1024]
        } else {
            Vec::new()
        };
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
        if let Some(c) = client.socket() {
            // Shut for writing when the upstream ends, as below.
            o.down = super::splice::one_way(Socket::Tcp(&up), c).await;
            return Ok(Some(o));
        }
        let mut up = tokio::io::BufReader::with_capacity(self.buffer, up);
        o.down = tokio::io::copy_buf(&mut up, client).await.unwrap_or(0);
        let _ = client.shutdown().await;
        Ok(Some(o))
    }

    /// An open tunnel (CONNECT or SOCKS5, already answered): `early`, what the client sent
    /// behind its request, then both ways until each side ends. The bytes up and down.
    /// For a host a credential is bound to (`to`: its name and port), the broker's terminated
    /// connection instead.
    async fn carry<S: Conn>(
        &self,
        client: &mut S,
        mut up: TcpStream,
        early: &[u8],
        to: Option<(&str, u16)>,
    ) -> (u64, u64) {
        if let (Some(b), Some((host, port))) = (&self.broker, to) {
            if b.bound(host, port) {
                // Boxed: its state (two TLS sessions, a parsed head) would otherwise make every
                // connection's task as large, terminated or not, waiting for a first byte or not.
                let serve = Box::pin(b.serve(client, early, host, port, up, self.audit.as_ref()));
                return match serve.await {
                    Ok(moved) => moved,
                    Err(why) => {
                        // Once per host on the terminal (the sandbox can make many); each in
                        // the audit log.
                        static SAID: std::sync::Mutex<Vec<String>> =
                            std::sync::Mutex::new(Vec::new());
                        if first_time(&SAID, host.to_string(), 64) {
                            let why = crate::vocab::shorten(&why);
                            let _ = writeln!(std::io::stderr(), "aisb: {host}:{port}: {why}");
                        }
                        (0, 0)
                    }
                };
            }
        }
        if !early.is_empty() && up.write_all(early).await.is_err() {
            return (0, 0);
        }
        let (a, b) = match client.socket() {
            Some(c) => super::splice::both(c, Socket::Tcp(&up)).await,
            None => {
                tokio::io::copy_bidirectional_with_sizes(client, &mut up, self.buffer, self.buffer)
                    .await
                    .unwrap_or((0, 0))
            }
        };
        (a + early.len() as u64, b)
    }

    /// `AISB-RESOLVE name`: the sandbox's DNS stub asking whether to answer `name`. 200 when
    /// a rule could allow it (the stub then hands out a synthetic address; the connection is
    /// checked again, with its port, on `CONNECT`), 403 with the reason otherwise. Every answer
    /// is logged as `dns`, within the cap on events from inside: the stub asks once per name.
    async fn resolve_name<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        client: &mut S,
        head: &[u8],
        start: Instant,
    ) -> std::io::Result<Option<Outcome>> {
        let name = std::str::from_utf8(head)
            .ok()
            .and_then(|h| h.split(' ').nth(1))
            .unwrap_or("")
            .to_string();
        let result = self.policy.check_name(&name);
        let o = Outcome::new("dns", name, 53, result, start);
        self.record(&o);
        match &o.result {
            Ok(_) => {
                client
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                    .await?
            }
            Err(b) => blocked(client, "DNS", &o.host, 53, b).await?,
        }
        Ok(None)
    }

    async fn socks5<S: Conn>(
        &self,
        client: &mut S,
        mut buf: Vec<u8>,
    ) -> std::io::Result<Option<Outcome>> {
        let start = Instant::now();
        let greeting = loop {
            match socks5_greeting(&buf) {
                Socks5Greeting::Partial => {
                    if read_more(client, &mut buf).await? == 0 {
                        return Ok(None);
                    }
                }
                Socks5Greeting::NoAcceptableMethod => {
                    client.write_all(&[5, 0xff]).await?;
                    return Ok(None);
                }
                Socks5Greeting::NoAuth { len } => break len,
            }
        };
        client.write_all(&[5, 0]).await?;
        buf.drain(..greeting);
        let reply = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
        let (host, port, len) = loop {
            match socks5_request(&buf) {
                Socks5Request::Partial => {
                    if read_more(client, &mut buf).await? == 0 {
                        return Ok(None);
                    }
                }
                Socks5Request::Refused(code) => {
                    client.write_all(&reply(code)).await?;
                    return Ok(None);
                }
                Socks5Request::Connect { host, port, len } => break (host, port, len),
            }
        };
        let (mut o, upstream) = self.open("socks5", host, port, start).await;
        match (&o.result, upstream) {
            (Ok(_), Some(up)) => {
                client.write_all(&reply(0)).await?;
                let to = Some((o.host.as_str(), o.port));
                (o.up, o.down) = self.carry(client, up, &buf[len..], to).await;
            }
            // 2: connection not allowed by ruleset; 4: host unreachable. Logged first.
            (Err(_), _) if o.addr.is_none() => {
                self.record(&o);
                client.write_all(&reply(2)).await?;
                return Ok(None);
            }
            _ => {
                self.record(&o);
                client.write_all(&reply(4)).await?;
                return Ok(None);
            }
        }
        Ok(Some(o))
    }
}

/// Whether `key` is new to `said` (then remembered, up to `cap` keys; past them nothing is new):
/// what the sandbox can make many of is said on the terminal once each, within a bound.
fn first_time<T: PartialEq>(said: &std::sync::Mutex<Vec<T>>, key: T, cap: usize) -> bool {
    said.lock().is_ok_and(|mut said| {
        let new = said.len() < cap && !said.contains(&key);
        if new {
            said.push(key);
        }
        new
    })
}

/// A refusal of a handed connection, on stderr (the workload's, as the relay's refusals are),
/// once per destination.
fn say_refused(dest: Option<std::net::SocketAddr>, why: &str) {
    static SAID: std::sync::Mutex<Vec<Option<std::net::SocketAddr>>> =
        std::sync::Mutex::new(Vec::new());
    if first_time(&SAID, dest, 1024) {
        let to = dest.map_or("the network".to_string(), |d| d.to_string());
        // Not eprintln!, which panics when the caller's stderr is gone.
        let _ = writeln!(
            std::io::stderr(),
            "aisb: refused a connection to {to}: {}",
            why.trim()
        );
    }
}

/// The audit log's protocol for a CONNECT, by how the transparent relay learned its name.
fn learned_proto(learned: Option<&str>) -> &'static str {
    match learned {
        Some("dns") => "transparent-dns",
        Some("sni") => "transparent-sni",
        Some("host") => "transparent-host",
        Some("ip") => "transparent-ip",
        _ => "connect",
    }
}

/// Whether a handed connection's request names the host and port connected to: the port, when
/// the authority gives one, must be the one connected to; the host must be the name.
fn names_handed(authority: &str, h: &Handed) -> Result<(), String> {
    let other = || format!("the client named {authority} to the address of {}", h.name);
    let (host, port) = split_authority(authority, Some(h.port)).ok_or_else(other)?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match crate::config::domain::normalise_name(bare) {
        Ok(n) if n == h.name && port == h.port => Ok(()),
        _ => Err(other()),
    }
}

/// The value of header `name` in a complete request head.
fn header_of(head: &[u8], name: &str) -> Option<String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    let _ = req.parse(head);
    req.headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
}

async fn read_more<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 4096];
    let n = r.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
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
    let body = blocked_text(what, host, port, b);
    respond(w, 403, "Forbidden", &body, Some(&b.rule)).await
}

/// What a refusal says: the rule, and what to add to allow it.
/// A host name (letters, digits, `-`, `_`, `.`; at most 253) or an IP address: nothing a
/// sandbox could write prose into.
fn is_host_name(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_ok()
        || (!host.is_empty()
            && host.len() <= 253
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
}

/// A request's body of `len` bytes (fewer when the client stops sending), `early` of which
/// came with its head.
async fn read_body<S: Conn>(client: &mut S, early: &[u8], len: usize) -> std::io::Result<Vec<u8>> {
    let mut body = early.to_vec();
    while body.len() < len {
        if read_more(client, &mut body).await? == 0 {
            break;
        }
    }
    body.truncate(len);
    Ok(body)
}

fn blocked_text(what: &str, host: &str, port: u16, b: &Blocked) -> String {
    let mut body = format!("aisb: blocked {what} {host}:{port}: {}\n", b.rule);
    if let Some(h) = &b.hint {
        body.push_str(&format!("to allow it: {h} (in sandbox.kdl)\n"));
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox cannot grow its audit log without bound through reported events.
    #[test]
    fn events_reported_from_inside_are_capped() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("audit.jsonl");
        let log = Log::open(&path).unwrap();
        let p = Proxy {
            policy: Policy::new(&crate::proxy::policy::PolicyConfig::default()),
            slots: Proxy::run_slots(),
            audit: None,
            reported: Default::default(),
            buffer: RUN_BUFFER,
            broker: None,
            feedback: None,
        };
        let allowed = (0..MAX_REPORTED + 5).filter(|_| p.may_report(&log)).count();
        assert_eq!(allowed as u64, MAX_REPORTED);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains("audit-limit"), "{text}");
    }
}
