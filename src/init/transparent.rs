//! Transparent egress: tools that ignore the proxy variables reach allowed names through the
//! same proxy, policy and audit log.
//!
//! Mechanism, chosen over nftables `REDIRECT`: the init (still holding CAP_NET_ADMIN) adds
//! `local default dev lo` and `local ::/0 dev lo` to the namespace's local table, so a
//! `connect()` to any address is delivered on `lo`; a listener bound to `[::]:PORT` accepts
//! it, and `getsockname()` on the accepted socket is the original destination. It needs no
//! netfilter module (the testbed's 6.1/6.12 kernels have nf_tables only as modules, which a
//! container cannot load), no packet rewriting and no per-packet rule evaluation; the price is
//! that only the ports the init listens on work (80, 443, 22 and the ports the allowlist
//! names), where `REDIRECT` would catch every port. Anything else gets "connection refused"
//! from the kernel (and the seccomp notifier's message). Nothing can leave: the namespace
//! still has `lo` only.
//!
//! Names: the DNS stub ([`super::dns`]) answers a name the proxy's policy could allow with a
//! synthetic address from 198.18.0.0/15 (stable for the run), anything else with NXDOMAIN. The
//! relay maps the destination back to the name; for any other address it learns the name from
//! the first bytes the client sends (TLS SNI, HTTP Host), and otherwise asks for the IP itself
//! (denied unless listed). The host proxy decides on `CONNECT name:port`, as for every client.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use std::os::fd::AsRawFd;

use super::relay;
use crate::vocab::{HANDED_HTTP, HANDED_TUNNEL, PROXY_SOCKET};

/// The synthetic pool: 198.18.0.0/15 (RFC 2544 benchmarking, never routed on the internet,
/// and internal to the proxy's policy, so a synthetic address is never a real destination).
const POOL_BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
const POOL_MASK: u32 = 0xfffe_0000;
/// Names one run may be given addresses for; past it the stub answers REFUSED, so a workload
/// looking up endless allowed subdomains (`*.example.com`) cannot grow the init's memory.
pub const MAX_NAMES: u32 = 65_536;
/// Denied names remembered (answered without asking the proxy again).
const MAX_DENIED: usize = 16_384;
/// The most of a first message read to find a name: a ClientHello or an HTTP head.
const MAX_FIRST: usize = 16 * 1024;
/// How long a connection to an address that is not synthetic may stay silent before the relay
/// gives up learning a name from it (an SSH client waits for the server to speak first).
const FIRST_WAIT: Duration = Duration::from_millis(1500);

#[derive(Default)]
struct Pool {
    by_name: HashMap<String, Ipv4Addr>,
    by_ip: HashMap<Ipv4Addr, String>,
    denied: HashSet<String>,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

/// Is `ip` inside the synthetic range (assigned or not)?
pub fn is_synthetic(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => u32::from(v4) & POOL_MASK == POOL_BASE,
        IpAddr::V6(_) => false,
    }
}

/// The name a synthetic address was handed out for.
pub fn name_of(ip: IpAddr) -> Option<String> {
    match canonical(ip) {
        IpAddr::V4(v4) => pool().lock().ok()?.by_ip.get(&v4).cloned(),
        IpAddr::V6(_) => None,
    }
}

/// What the stub answers for a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Address(Ipv4Addr),
    /// The policy refuses it (the reason is in the audit log).
    Denied,
    /// The pool is full, or the proxy cannot be asked.
    Unavailable,
}

/// The synthetic address for `name` (already normalised: lowercase, no trailing dot), asking
/// the host proxy the first time.
pub fn lookup(name: &str, ask: impl FnOnce(&str) -> Option<bool>) -> Answer {
    {
        let Ok(p) = pool().lock() else {
            return Answer::Unavailable;
        };
        if let Some(ip) = p.by_name.get(name) {
            return Answer::Address(*ip);
        }
        if p.denied.contains(name) {
            return Answer::Denied;
        }
    }
    // Asked without the lock: one slow answer does not hold up every other lookup.
    let allowed = ask(name);
    let Ok(mut p) = pool().lock() else {
        return Answer::Unavailable;
    };
    match allowed {
        Some(true) => {
            if let Some(ip) = p.by_name.get(name) {
                return Answer::Address(*ip);
            }
            let n = p.by_name.len() as u32;
            if n >= MAX_NAMES {
                return Answer::Unavailable;
            }
            let ip = Ipv4Addr::from(POOL_BASE + 1 + n);
            p.by_name.insert(name.to_string(), ip);
            p.by_ip.insert(ip, name.to_string());
            Answer::Address(ip)
        }
        Some(false) => {
            if p.denied.len() < MAX_DENIED {
                p.denied.insert(name.to_string());
            }
            Answer::Denied
        }
        None => Answer::Unavailable,
    }
}

/// Ask the host proxy whether `name` may be answered: Some(true) allowed, Some(false) denied,
/// None when the proxy cannot be reached (the stub answers SERVFAIL: fail closed).
pub fn ask_proxy(name: &str) -> Option<bool> {
    let mut s = UnixStream::connect(PROXY_SOCKET).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    s.write_all(format!("{} {name} HTTP/1.1\r\n\r\n", crate::vocab::RESOLVE_METHOD).as_bytes())
        .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    Some(&head[9..12] == b"200")
}

/// `ip route add local default dev lo` and `ip -6 route add local ::/0 dev lo`, by netlink.
/// IPv6 may be off in the kernel: then only IPv4 is routed (and IPv6 stays unreachable).
pub fn local_routes() -> std::io::Result<()> {
    add_local_default(false)?;
    if let Err(e) = add_local_default(true) {
        if !matches!(
            e.raw_os_error(),
            Some(libc::EAFNOSUPPORT) | Some(libc::EOPNOTSUPP)
        ) {
            return Err(e);
        }
    }
    Ok(())
}

fn add_local_default(v6: bool) -> std::io::Result<()> {
    use netlink_packet_core::{
        NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
        NLM_F_REQUEST,
    };
    use netlink_packet_route::route::{
        RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
    };
    use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
    use netlink_sys::{protocols::NETLINK_ROUTE, Socket};

    /// RT_TABLE_LOCAL: where `ip route add local …` puts a route of type local.
    const TABLE_LOCAL: u8 = 255;
    let mut route = RouteMessage::default();
    route.header = RouteHeader {
        address_family: if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        },
        destination_prefix_length: 0,
        table: TABLE_LOCAL,
        protocol: RouteProtocol::Boot,
        scope: RouteScope::Host,
        kind: RouteType::Local,
        ..Default::default()
    };
    // SAFETY: a NUL-terminated name; the call reads it and returns an index or 0.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        return Err(std::io::Error::last_os_error());
    }
    route.attributes.push(RouteAttribute::Oif(lo));
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    let mut msg = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::NewRoute(route)),
    );
    msg.finalize();
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.send(&buf, 0)?;
    let mut answer = vec![0u8; 4096];
    let n = socket.recv(&mut &mut answer[..], 0)?;
    let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer[..n])
        .map_err(|e| std::io::Error::other(format!("netlink answer: {e}")))?;
    match reply.payload {
        NetlinkPayload::Error(e) => match e.code {
            None => Ok(()),
            Some(code) => Err(std::io::Error::from_raw_os_error(-code.get())),
        },
        _ => Ok(()),
    }
}

/// Bind `[::]:port` (both families), or `0.0.0.0:port` where the kernel has no IPv6.
pub fn bind(port: u16) -> std::io::Result<TcpListener> {
    match TcpListener::bind(("::", port)) {
        Ok(l) => Ok(l),
        Err(e)
            if e.kind() == std::io::ErrorKind::AddrNotAvailable
                || e.raw_os_error() == Some(libc::EAFNOSUPPORT) =>
        {
            TcpListener::bind(("0.0.0.0", port))
        }
        Err(e) => Err(e),
    }
}

/// Serve the transparent listeners, each connection on the thread that accepted it
/// ([`relay::serve`]).
pub fn start(listeners: Vec<TcpListener>) {
    for listener in listeners {
        relay::serve(listener, handle);
    }
}

/// How the relay learned a connection's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    Dns,
    Sni,
    Host,
    /// No name: the IP literal itself is asked for (allowed only when listed).
    Ip,
}

impl Learned {
    fn as_str(self) -> &'static str {
        match self {
            Learned::Dns => "dns",
            Learned::Sni => "sni",
            Learned::Host => "host",
            Learned::Ip => "ip",
        }
    }
}

fn handle(tcp: TcpStream) {
    let _ = tcp.set_nodelay(true);
    let Ok(dest) = tcp.local_addr() else { return };
    let dest = SocketAddr::new(canonical(dest.ip()), dest.port());
    if let Err(reason) = relay_one(tcp, dest) {
        refuse(dest, &reason);
    }
}

fn relay_one(mut tcp: TcpStream, dest: SocketAddr) -> Result<(), String> {
    let port = dest.port();
    let mut first = Vec::new();
    let (name, how) = if is_synthetic(dest.ip()) {
        let name = name_of(dest.ip()).ok_or_else(|| {
            format!(
                "{} is not an address this sandbox's DNS handed out",
                dest.ip()
            )
        })?;
        (name, Learned::Dns)
    } else {
        first = read_first(&mut tcp, FIRST_WAIT);
        match name_in(&first) {
            Found::Name(n, how) => (n, how),
            Found::None | Found::NeedMore | Found::Unreadable(_) => {
                (ip_authority(dest.ip()), Learned::Ip)
            }
        }
    };
    // Handed to the proxy, which then serves the connection itself (one hop, no relay here),
    // when its first bytes say how: a name from SNI or an address is a tunnel, one from Host
    // plain HTTP; to a synthetic address, whatever the client sends first decides, if it
    // speaks first and soon.
    let mode = match how {
        Learned::Dns => decide_soon(&tcp, &name, dest)?,
        Learned::Host => Some(HANDED_HTTP),
        Learned::Sni | Learned::Ip => Some(HANDED_TUNNEL),
    };
    if let Some(mode) = mode {
        return hand_over(tcp, &name, dest, how, mode, &first);
    }
    // A client to a synthetic address that has not decided (it waits for the server, as SSH
    // does): relayed from here, the server's side at once, the client's checked as it comes.
    let mut unix =
        UnixStream::connect(PROXY_SOCKET).map_err(|e| format!("no proxy to ask: {e}"))?;
    let authority = format!("{name}:{port}");
    // The answer is read by the relay (the proxy forwards nothing before it allowed the
    // tunnel).
    let relayed = match unix.write_all(&relay::connect_learned(&authority, how.as_str(), None)) {
        Err(e) => Err(relay::Refused::Proxy(e.to_string())),
        Ok(()) => pipe_checked(&tcp, &unix, &name, dest),
    };
    match relayed {
        Err(relay::Refused::Check(why)) => Err(why),
        Err(relay::Refused::Proxy(e)) => {
            let _ = tcp.shutdown(Shutdown::Both);
            // The proxy logged it; the workload's stderr gets the rule too.
            say(dest, &format!("{authority}: {e}"));
            Ok(())
        }
        _ => Ok(()),
    }
}

/// How long a client connected to a synthetic address has to send the bytes that decide how
/// its connection is served before the relay serves it itself (a client that waits for the
/// server to speak first: SSH, SMTP).
const HAND_WAIT: Duration = Duration::from_millis(20);

/// What a client's first bytes to the address of `name` decide.
enum Verdict {
    NeedMore,
    /// TLS naming `name` or nothing, or a protocol that names no host: both ways as they are.
    Tunnel,
    /// Plain HTTP: every request must name `name`.
    Http,
    Refuse(String),
}

/// The verdict on a client's first bytes (all of them so far) to the address of `name`: a TLS
/// ClientHello's SNI (reassembled across records) must be the name or absent; a first message
/// that looks like TLS or HTTP but cannot be read is refused; any other protocol names no host.
fn first_verdict(bytes: &[u8], name: &str, dest: SocketAddr) -> Verdict {
    if bytes.first() == Some(&0x16) {
        return match sni(bytes) {
            Found::NeedMore => Verdict::NeedMore,
            Found::Unreadable(why) => {
                Verdict::Refuse(format!("{why}, sent to the address of {name} ({dest})"))
            }
            Found::Name(other, _) if other != name => Verdict::Refuse(format!(
                "the client named {other} to the address of {name} ({dest})"
            )),
            _ => Verdict::Tunnel,
        };
    }
    match http_start(bytes) {
        Start::NeedMore => Verdict::NeedMore,
        Start::Other => Verdict::Tunnel,
        Start::Http => Verdict::Http,
    }
}

/// For a connection to the synthetic address of `name`: how the proxy is to serve it, from
/// what the client sends within [`HAND_WAIT`] (peeked, not read: nothing is consumed). None:
/// undecided by then; the relay serves it ([`pipe_checked`]).
fn decide_soon(
    tcp: &TcpStream,
    name: &str,
    dest: SocketAddr,
) -> Result<Option<&'static str>, String> {
    let deadline = Instant::now() + HAND_WAIT;
    let mut buf = vec![0u8; MAX_FIRST];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let mut fds = [libc::pollfd {
            fd: tcp.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: one pollfd this function owns.
        if unsafe { libc::poll(fds.as_mut_ptr(), 1, left.as_millis().max(1) as i32) } <= 0 {
            continue;
        }
        let n = match tcp.peek(&mut buf) {
            Ok(0) | Err(_) => return Ok(None),
            Ok(n) => n,
        };
        match first_verdict(&buf[..n], name, dest) {
            Verdict::Tunnel => return Ok(Some(HANDED_TUNNEL)),
            Verdict::Http => return Ok(Some(HANDED_HTTP)),
            Verdict::Refuse(why) => return Err(why),
            // More is on its way (poll would say readable at once for what is there).
            Verdict::NeedMore => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Hand the workload's connection to the proxy with `CONNECT name:port` (SCM_RIGHTS) and the
/// bytes already read from it, and leave it: the proxy serves it from then on, and says a
/// refusal itself. Nothing is waited for, so this thread is back in `accept` at once.
fn hand_over(
    tcp: TcpStream,
    name: &str,
    dest: SocketAddr,
    how: Learned,
    mode: &str,
    early: &[u8],
) -> Result<(), String> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let failed = |e: &dyn std::fmt::Display| format!("handing the connection to the proxy: {e}");
    let mut unix =
        UnixStream::connect(PROXY_SOCKET).map_err(|e| format!("no proxy to ask: {e}"))?;
    let authority = format!("{name}:{}", dest.port());
    let mut request = relay::connect_learned(&authority, how.as_str(), Some(mode));
    let head = request.len();
    request.extend_from_slice(early);
    let sent = sendmsg::<()>(
        unix.as_raw_fd(),
        &[std::io::IoSlice::new(&request)],
        &[ControlMessage::ScmRights(&[tcp.as_raw_fd()])],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| failed(&e))?;
    if sent < head {
        return Err(failed(&"cut short"));
    }
    // The rest, if any; then the proxy reads to the end (the connection's close).
    unix.write_all(&request[sent..]).map_err(|e| failed(&e))
}

/// Relay a connection whose name came from its address: the client must not name another
/// host (domain fronting through an allowed name's address, or a Host header smuggled past the
/// name that was checked). The server's side flows at once (SSH speaks first); the client's
/// first bytes are held until they are known not to name another host: a TLS ClientHello's
/// SNI (reassembled across records) must be the name or absent; plain HTTP is followed request
/// by request ([`HttpFollower`]); a first message that looks like either but cannot be read is
/// refused; any other protocol names no host and passes.
fn pipe_checked(
    tcp: &TcpStream,
    unix: &UnixStream,
    name: &str,
    dest: SocketAddr,
) -> Result<(), relay::Refused> {
    let mut follow: Option<HttpFollower> = None;
    relay::relay_tunnel(tcp, unix, relay::First::Hold, |bytes| {
        if let Some(f) = follow.as_mut() {
            return f.verdict(bytes);
        }
        match first_verdict(bytes, name, dest) {
            Verdict::NeedMore => relay::Check::NeedMore,
            Verdict::Refuse(why) => relay::Check::Refuse(why),
            Verdict::Tunnel => relay::Check::Pass,
            Verdict::Http => {
                let mut f = HttpFollower::new(name, dest);
                let verdict = f.verdict(bytes);
                follow = Some(f);
                verdict
            }
        }
    })
}

/// What a client's first bytes (not TLS) start.
#[derive(Debug, PartialEq, Eq)]
enum Start {
    /// An HTTP/1 request: a request line with `HTTP/` in it, or a method servers know
    /// followed by a space (HTTP/0.9's `GET /path` has no version).
    Http,
    /// Another protocol (SSH's banner, git's pkt-lines, a database's binary greeting).
    Other,
    NeedMore,
}

/// Methods servers act on, whatever follows them (RFC 9110, WebDAV, SSDP, caches).
const METHODS: &[&str] = &[
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "CONNECT",
    "OPTIONS",
    "TRACE",
    "PATCH",
    "QUERY",
    "PROPFIND",
    "PROPPATCH",
    "MKCOL",
    "COPY",
    "MOVE",
    "LOCK",
    "UNLOCK",
    "SEARCH",
    "REPORT",
    "MKACTIVITY",
    "CHECKOUT",
    "MERGE",
    "M-SEARCH",
    "NOTIFY",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "PURGE",
    "LINK",
    "UNLINK",
    "ACL",
    "BIND",
    "REBIND",
    "UNBIND",
    "MKCALENDAR",
    "SOURCE",
];

/// `buf` without the empty lines a server skips before a request line (RFC 9112 2.2).
fn skip_empty_lines(buf: &[u8]) -> &[u8] {
    &buf[buf
        .iter()
        .take_while(|b| matches!(b, b'\r' | b'\n'))
        .count()..]
}

/// A token character (RFC 9110 5.6.2).
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Whether the first bytes start an HTTP/1 request (empty lines before it skipped, as servers
/// skip them): any token and a space, then a line a server could take for a request line.
fn http_start(buf: &[u8]) -> Start {
    let buf = skip_empty_lines(buf);
    let n = buf.iter().take_while(|&&b| tchar(b)).count();
    if n == 0 || n > 32 {
        return if buf.is_empty() {
            Start::NeedMore
        } else {
            Start::Other
        };
    }
    match buf.get(n) {
        None => return Start::NeedMore,
        Some(b' ' | b'\t') => {}
        Some(_) => return Start::Other,
    }
    if std::str::from_utf8(&buf[..n]).is_ok_and(|m| METHODS.contains(&m)) {
        return Start::Http;
    }
    let rest = &buf[n..];
    let line_end = rest.iter().position(|&b| b == b'\n');
    let line = &rest[..line_end.unwrap_or(rest.len())];
    // A control character (git's pkt-lines end in NUL) is no request line.
    if line
        .iter()
        .any(|&b| b.is_ascii_control() && !matches!(b, b'\t' | b'\r'))
    {
        return Start::Other;
    }
    match line_end {
        Some(_) if line.windows(6).any(|w| w == b" HTTP/" || w == b"\tHTTP/") => Start::Http,
        Some(_) => Start::Other,
        None if buf.len() < MAX_FIRST => Start::NeedMore,
        None => Start::Http,
    }
}

/// Follows a plain-HTTP/1 request stream from a client whose connection goes to `name`: every
/// request's head must name `name` (its Host, and its target when absolute-form) or no name at
/// all, and the body's framing (Content-Length, or chunked) is tracked to find the next head.
/// A second request on a kept-alive connection cannot name another host than the first was
/// checked for; anything the relay cannot frame without guessing (a body framed two ways, an
/// encoding other than chunked, an Upgrade to another protocol, CONNECT) is refused.
struct HttpFollower {
    name: String,
    dest: SocketAddr,
    state: Framing,
    /// The head or line being read.
    line: Vec<u8>,
    /// Whether the line being read is blank so far (nothing, or a lone CR).
    blank: bool,
}

enum Framing {
    Head,
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data: how many of its bytes are still to come.
    ChunkEnd(u8),
    Trailers,
}

/// The longest chunk-size line (with its extensions) or trailer section followed.
const MAX_CHUNK_LINE: usize = 4096;

impl HttpFollower {
    fn new(name: &str, dest: SocketAddr) -> HttpFollower {
        HttpFollower {
            name: name.to_string(),
            dest,
            state: Framing::Head,
            line: Vec::new(),
            blank: false,
        }
    }

    /// Where the section being read (a head, trailers) ends in `bytes`: just past its first
    /// blank line, ended by LF or CRLF as servers take either (a server never acts on a head
    /// before it ends, so one passed on in pieces is checked before it can be used).
    fn section_end(&mut self, bytes: &[u8]) -> Option<usize> {
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                b'\n' if self.blank => return Some(i + 1),
                b'\n' => self.blank = true,
                b'\r' if self.blank => {}
                _ => self.blank = false,
            }
        }
        None
    }

    fn verdict(&mut self, bytes: &[u8]) -> relay::Check {
        match self.feed(bytes) {
            Ok(()) => relay::Check::Watch,
            Err(why) => relay::Check::Refuse(why),
        }
    }

    /// The next bytes the client sends, in order.
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while !bytes.is_empty() {
            match &mut self.state {
                Framing::Head => {
                    // Empty lines before a request line are allowed (RFC 9112 2.2).
                    if self.line.is_empty() && matches!(bytes[0], b'\r' | b'\n') {
                        bytes = &bytes[1..];
                        continue;
                    }
                    let Some(end) = self.section_end(bytes) else {
                        self.line.extend_from_slice(bytes);
                        if self.line.len() > MAX_FIRST {
                            return Err(format!(
                                "a request head larger than {MAX_FIRST} bytes to {}",
                                self.name
                            ));
                        }
                        // What is passed on before the head ends must already read as the
                        // start of an HTTP/1 head: a request line with no version (HTTP/0.9,
                        // which some servers answer at once) or anything else is refused.
                        let mut headers = [httparse::EMPTY_HEADER; 64];
                        if httparse::Request::new(&mut headers)
                            .parse(&self.line)
                            .is_err()
                        {
                            return Err(format!("a request to {} that is not HTTP/1", self.name));
                        }
                        return Ok(());
                    };
                    self.line.extend_from_slice(&bytes[..end]);
                    bytes = &bytes[end..];
                    let head = std::mem::take(&mut self.line);
                    self.blank = false;
                    self.state = self.check_head(&head)?;
                }
                Framing::Body(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        self.state = Framing::Head;
                    }
                }
                Framing::ChunkSize => {
                    let Some(end) = bytes.iter().position(|&b| b == b'\n').map(|i| i + 1) else {
                        self.line.extend_from_slice(bytes);
                        if self.line.len() > MAX_CHUNK_LINE {
                            return Err("a chunk-size line too long to follow".into());
                        }
                        return Ok(());
                    };
                    self.line.extend_from_slice(&bytes[..end]);
                    bytes = &bytes[end..];
                    let line = std::mem::take(&mut self.line);
                    let size = crate::vocab::chunk_size(&line).ok_or_else(|| {
                        format!(
                            "a chunk-size line that is not one: {:?}",
                            String::from_utf8_lossy(&line)
                        )
                    })?;
                    self.state = if size == 0 {
                        self.blank = true;
                        Framing::Trailers
                    } else {
                        Framing::ChunkData(size)
                    };
                }
                Framing::ChunkData(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        self.state = Framing::ChunkEnd(2);
                    }
                }
                Framing::ChunkEnd(left) => {
                    let want = if *left == 2 { b'\r' } else { b'\n' };
                    if bytes[0] != want {
                        return Err("a chunk not followed by CRLF".into());
                    }
                    bytes = &bytes[1..];
                    *left -= 1;
                    if *left == 0 {
                        self.state = Framing::ChunkSize;
                    }
                }
                Framing::Trailers => {
                    // Trailer lines until a blank one (at once when there are none).
                    let Some(end) = self.section_end(bytes) else {
                        self.line.extend_from_slice(bytes);
                        if self.line.len() > MAX_CHUNK_LINE {
                            return Err("a chunked body's trailers too long to follow".into());
                        }
                        return Ok(());
                    };
                    bytes = &bytes[end..];
                    self.line.clear();
                    self.blank = false;
                    self.state = Framing::Head;
                }
            }
        }
        Ok(())
    }

    /// One request head: the names it gives, and how its body is framed.
    fn check_head(&self, head: &[u8]) -> Result<Framing, String> {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(format!("a request to {} that is not HTTP/1", self.name)),
        }
        let method = req.method.unwrap_or("");
        if method == "CONNECT" {
            return Err(format!("CONNECT sent to {} itself", self.name));
        }
        let target = req.path.unwrap_or("");
        if !target.starts_with('/') && target != "*" {
            // Absolute form: its authority is a name too. Userinfo and backslashes, which
            // URL parsers disagree on, are refused rather than guessed.
            let rest = target.split_once("://").map_or("", |(_, r)| r);
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            if authority.contains(['@', '\\']) {
                return Err(format!(
                    "a request target with userinfo or a backslash sent to {}",
                    self.name
                ));
            }
            self.same_host(authority)?;
        }
        let headers: &[httparse::Header] = &*req.headers;
        let named = |n: &'static str| -> Vec<&str> {
            headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case(n))
                .map(|h| {
                    std::str::from_utf8(h.value)
                        .unwrap_or("\u{fffd}")
                        .trim_matches([' ', '\t'])
                })
                .collect()
        };
        let hosts = named("host");
        match hosts.as_slice() {
            [] => {}
            [host] => self.same_host(host)?,
            _ => return Err(format!("two Host headers in a request to {}", self.name)),
        }
        if !named("upgrade").is_empty() {
            return Err(format!(
                "an Upgrade over plain HTTP to {} (use wss:// or https://, or the proxy variables)",
                self.name
            ));
        }
        let te = named("transfer-encoding");
        let cl = named("content-length");
        let framing = match (te.as_slice(), cl.as_slice()) {
            ([], []) => Framing::Body(0),
            ([], [first, rest @ ..]) if rest.iter().all(|c| c == first) => Some(*first)
                .filter(|c| c.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|c| c.parse::<u64>().ok())
                .map(Framing::Body)
                .ok_or_else(|| format!("a Content-Length that is not a length: {first:?}"))?,
            ([coding], []) if coding.eq_ignore_ascii_case("chunked") => Framing::ChunkSize,
            _ => {
                return Err(format!(
                    "a request body to {} framed two ways, or by an encoding other than chunked",
                    self.name
                ))
            }
        };
        // Servers disagree on whether a GET or HEAD has a body at all; such a body could
        // hide the next request from the one reading it differently.
        let bodiless = matches!(framing, Framing::Body(0));
        if matches!(method, "GET" | "HEAD") && !bodiless {
            return Err(format!("a {method} with a body sent to {}", self.name));
        }
        Ok(framing)
    }

    /// An authority (Host's value, an absolute target's) names this connection's host, an
    /// address, or nothing readable (refused).
    fn same_host(&self, authority: &str) -> Result<(), String> {
        let other = || {
            format!(
                "the client named {authority} to the address of {} ({})",
                self.name, self.dest
            )
        };
        // The port, when given, is the one connected to.
        let (host, port) =
            crate::config::domain::split_authority(authority, Some(self.dest.port()))
                .ok_or_else(other)?;
        if port != self.dest.port() {
            return Err(other());
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        // An address names a host only when it is the one connected to.
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return match canonical(ip) == canonical(self.dest.ip()) {
                true => Ok(()),
                false => Err(other()),
            };
        }
        match crate::config::domain::normalise_name(bare) {
            Ok(n) if n == self.name => Ok(()),
            _ => Err(other()),
        }
    }
}

/// `1.2.3.4` or `[2001:db8::1]`.
fn ip_authority(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => format!("[{v6}]"),
        v4 => v4.to_string(),
    }
}

/// Read what the client sends first, until a name can be found in it (or not), it stops, or
/// `wait` passes (a zero `wait`: as long as it takes for the first bytes, bounded by size).
fn read_first(tcp: &mut TcpStream, wait: Duration) -> Vec<u8> {
    let start = Instant::now();
    let limit = if wait.is_zero() {
        Duration::from_secs(30)
    } else {
        wait
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() || buf.len() >= MAX_FIRST {
            break;
        }
        let _ = tcp.set_read_timeout(Some(left));
        match tcp.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if !matches!(name_in(&buf), Found::NeedMore) {
            break;
        }
    }
    let _ = tcp.set_read_timeout(None);
    buf
}

/// A host name found in a client's first bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Name(String, Learned),
    /// A protocol that names no host (or a message without one).
    None,
    /// A ClientHello or an HTTP head that cannot be read whole (malformed, two Host headers,
    /// larger than [`MAX_FIRST`]): which name it gives a server is anybody's guess.
    Unreadable(String),
    NeedMore,
}

/// The name in a TLS ClientHello's SNI or an HTTP request's Host header.
pub fn name_in(buf: &[u8]) -> Found {
    if buf.is_empty() {
        return Found::NeedMore;
    }
    if buf[0] == 0x16 {
        return sni(buf);
    }
    match http_start(buf) {
        Start::NeedMore => return Found::NeedMore,
        Start::Other => return Found::None,
        Start::Http => {}
    }
    let buf = skip_empty_lines(buf);
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) if buf.len() < MAX_FIRST => return Found::NeedMore,
        Ok(httparse::Status::Partial) => {
            return Found::Unreadable(format!("a request head larger than {MAX_FIRST} bytes"))
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Found::Unreadable("a request head with more than 64 headers".into())
        }
        Err(_) => return Found::None,
    }
    let hosts: Vec<_> = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("host"))
        .collect();
    // Two Host headers: which one a server believes is its own business. Refused.
    let host = match hosts.as_slice() {
        [] => return Found::None,
        [host] => host,
        _ => return Found::Unreadable("two Host headers".into()),
    };
    let Ok(value) = std::str::from_utf8(host.value) else {
        return Found::None;
    };
    match crate::config::domain::split_authority(value.trim_matches([' ', '\t']), Some(80)) {
        Some((h, _)) => normalised(&h, Learned::Host),
        None => Found::None,
    }
}

fn normalised(name: &str, how: Learned) -> Found {
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return Found::None;
    }
    match crate::config::domain::normalise_name(bare) {
        Ok(n) => Found::Name(n, how),
        Err(_) => Found::None,
    }
}

/// The server_name of a ClientHello (RFC 8446 4.1.2, RFC 6066 3), its handshake message
/// reassembled from as many records as carry it (RFC 8446 5.1: a client may split it), every
/// length checked against what is there.
fn sni(buf: &[u8]) -> Found {
    let more = || {
        if buf.len() < MAX_FIRST {
            Found::NeedMore
        } else {
            Found::Unreadable(format!("a TLS ClientHello larger than {MAX_FIRST} bytes"))
        }
    };
    let mut hello = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = buf.get(at..at + 5) else {
            return more();
        };
        if header[0] != 0x16 {
            return Found::Unreadable("a TLS ClientHello interleaved with another record".into());
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if len == 0 {
            return Found::Unreadable("an empty TLS handshake record".into());
        }
        let Some(payload) = buf.get(at + 5..at + 5 + len) else {
            return more();
        };
        hello.extend_from_slice(payload);
        at += 5 + len;
        if hello.len() >= 4 {
            let whole =
                4 + ((hello[1] as usize) << 16 | (hello[2] as usize) << 8 | hello[3] as usize);
            if whole > MAX_FIRST {
                return Found::Unreadable(format!(
                    "a TLS ClientHello larger than {MAX_FIRST} bytes"
                ));
            }
            if hello.len() >= whole {
                hello.truncate(whole);
                break;
            }
        }
    }
    match sni_in_hello(Reader(&hello)) {
        Err(why) => Found::Unreadable(why.into()),
        Ok(None) => Found::None,
        Ok(Some(n)) => match normalised(&n, Learned::Sni) {
            // An address is no name; anything else that is no host name names nobody
            // readable (a server may still route on it).
            Found::None if n.trim_matches(['[', ']']).parse::<IpAddr>().is_err() => {
                Found::Unreadable(format!("a TLS server name that is no host name: {n:?}"))
            }
            found => found,
        },
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize)
    }
}

/// The ClientHello's server_name (None: it has none); Err: it cannot be read, names more
/// than one, or hides its real name (ECH).
fn sni_in_hello(r: Reader) -> Result<Option<String>, &'static str> {
    const UNREADABLE: &str = "a TLS ClientHello that cannot be read";
    let (seen, name) = hello_extensions(r).ok_or(UNREADABLE)?;
    let mut kinds = seen.clone();
    kinds.sort_unstable();
    kinds.dedup();
    if kinds.len() != seen.len() {
        return Err("a TLS ClientHello with an extension twice");
    }
    // encrypted_client_hello (RFC 9849): the outer SNI is a cover, the real name is inside.
    if seen.contains(&0xfe0d) {
        return Err("an encrypted ClientHello (ECH), whose real server name cannot be checked");
    }
    Ok(name)
}

/// Every extension type in the ClientHello, in order, and its server_name if it has one.
fn hello_extensions(mut r: Reader) -> Option<(Vec<usize>, Option<String>)> {
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.u24()?;
    let mut h = Reader(r.take(len)?);
    h.take(2 + 32)?; // version, random
    let n = h.u8()?;
    h.take(n)?; // session id
    let n = h.u16()?;
    h.take(n)?; // cipher suites
    let n = h.u8()?;
    h.take(n)?; // compression methods
    let mut kinds = Vec::new();
    let mut found = None;
    if h.0.is_empty() {
        return Some((kinds, found)); // no extensions at all
    }
    let n = h.u16()?;
    let mut ext = Reader(h.take(n)?);
    while !ext.0.is_empty() {
        let kind = ext.u16()?;
        let n = ext.u16()?;
        let mut body = Reader(ext.take(n)?);
        kinds.push(kind);
        if kind != 0 {
            continue;
        }
        let n = body.u16()?;
        let mut list = Reader(body.take(n)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let n = list.u16()?;
            let name = list.take(n)?;
            if name_type == 0 {
                if found.is_some() {
                    return None; // two host names
                }
                found = Some(std::str::from_utf8(name).ok()?.to_string());
            }
        }
    }
    Some((kinds, found))
}

/// A refusal: on the workload's stderr (once per destination) and in the audit log.
fn refuse(dest: SocketAddr, reason: &str) {
    say(dest, reason);
    if let Ok(mut s) = UnixStream::connect(PROXY_SOCKET) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let reason = reason.replace(['\r', '\n'], " ");
        let _ = s.write_all(
            format!(
                "{} {dest} HTTP/1.1\r\n{}: {reason}\r\n\r\n",
                crate::vocab::DIRECT_METHOD,
                crate::vocab::REASON_HEADER
            )
            .as_bytes(),
        );
        let mut answer = [0u8; 64];
        let _ = s.read(&mut answer);
    }
}

fn say(dest: SocketAddr, what: &str) {
    static SAID: OnceLock<Mutex<HashSet<SocketAddr>>> = OnceLock::new();
    let said = SAID.get_or_init(Default::default);
    let first = said
        .lock()
        .map(|mut s| s.len() < 1024 && s.insert(dest))
        .unwrap_or(false);
    if first {
        let _ = writeln!(
            std::io::stderr(),
            "aisb: refused a connection to {dest}: {}",
            what.trim()
        );
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS record holding a ClientHello with these extensions (type, body).
    fn hello_with(exts: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut ext = Vec::new();
        for (kind, body) in exts {
            ext.extend_from_slice(&kind.to_be_bytes());
            ext.extend_from_slice(&(body.len() as u16).to_be_bytes());
            ext.extend_from_slice(body);
        }
        let mut hello = vec![3, 3];
        hello.extend_from_slice(&[0u8; 32]);
        hello.push(0); // session id
        hello.extend_from_slice(&[0, 2, 0x13, 0x01]);
        hello.extend_from_slice(&[1, 0]);
        hello.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        hello.extend_from_slice(&ext);
        let mut hs = vec![1];
        hs.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&hello);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    /// A server_name extension's body naming `name`.
    fn sni_ext(name: &str) -> Vec<u8> {
        let mut b = ((name.len() + 3) as u16).to_be_bytes().to_vec();
        b.push(0);
        b.extend_from_slice(&(name.len() as u16).to_be_bytes());
        b.extend_from_slice(name.as_bytes());
        b
    }

    fn client_hello(name: &str) -> Vec<u8> {
        hello_with(&[(0, sni_ext(name))])
    }

    #[test]
    fn sni_is_found_and_every_truncation_asks_for_more_or_gives_up() {
        let rec = client_hello("Allowed.Test");
        assert_eq!(
            name_in(&rec),
            Found::Name("allowed.test".into(), Learned::Sni)
        );
        for cut in 1..rec.len() {
            assert_eq!(name_in(&rec[..cut]), Found::NeedMore, "cut at {cut}");
        }
        // A handshake longer than its record continues in the next record; one that another
        // kind of record interrupts, or whose inner lengths lie, names nobody readable.
        let mut huge = rec.clone();
        huge[6] = 0xff; // the handshake claims megabytes
        assert!(matches!(name_in(&huge), Found::Unreadable(_)));
        let mut bad = rec.clone();
        bad[8] += 10; // the handshake claims more than its record holds
        assert_eq!(name_in(&bad), Found::NeedMore);
        bad.extend_from_slice(&[0x17, 3, 3, 0, 1, 0]);
        assert!(
            matches!(name_in(&bad), Found::Unreadable(_)),
            "{:?}",
            name_in(&bad)
        );
        let mut lying = rec.clone();
        let at = lying.len() - 12; // inside the SNI extension: its length overruns
        lying[at] = 0xff;
        assert!(matches!(
            name_in(&lying),
            Found::Unreadable(_) | Found::None
        ));
        // An IP literal in SNI names nothing.
        assert_eq!(name_in(&client_hello("1.2.3.4")), Found::None);
    }

    /// A client may split its ClientHello over several records (RFC 8446 5.1): the name is
    /// found across them, and a record cut anywhere asks for more.
    #[test]
    fn sni_is_found_across_records() {
        let rec = client_hello("split.test");
        let hs = &rec[5..];
        for cut in [1, 4, 9, hs.len() - 1] {
            let mut two = vec![0x16, 3, 1];
            two.extend_from_slice(&(cut as u16).to_be_bytes());
            two.extend_from_slice(&hs[..cut]);
            two.extend_from_slice(&[0x16, 3, 1]);
            two.extend_from_slice(&((hs.len() - cut) as u16).to_be_bytes());
            two.extend_from_slice(&hs[cut..]);
            assert_eq!(
                name_in(&two),
                Found::Name("split.test".into(), Learned::Sni),
                "cut at {cut}"
            );
            for end in 1..two.len() {
                assert_eq!(
                    name_in(&two[..end]),
                    Found::NeedMore,
                    "cut {cut}, end {end}"
                );
            }
        }
    }

    fn follower() -> HttpFollower {
        HttpFollower::new("allowed.test", "198.18.0.1:80".parse().unwrap())
    }

    /// Every request on a plain-HTTP connection to an allowed name's address must name it:
    /// a second request kept alive, an absolute-form target, a head ended by bare LFs, a
    /// request after a body (sized or chunked) that itself reads like a request — each one
    /// naming another host is refused, whatever pieces it arrives in.
    #[test]
    fn every_request_on_a_kept_alive_connection_is_checked() {
        let ok = "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n";
        let evil = "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
        let body = "POST /up HTTP/1.1\r\nHost: Allowed.Test:80\r\nContent-Length: 35\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n";
        let chunked = "POST /up HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n23;x=y\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n\r\n0\r\nTrailer: t\r\n\r\n";
        let allowed: &[&str] = &[
            ok,
            body,
            chunked,
            "GET http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            "GET / HTTP/1.0\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: 198.18.0.1\r\n\r\n",
            "\r\nGET / HTTP/1.1\nHost: allowed.test\n\n",
        ];
        let refused: &[&str] = &[
            evil,
            "GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            "GET / HTTP/1.1\nHost: evil.test\n\n",
            "GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "CONNECT evil.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            // HTTP/0.9: no version, no headers; some servers answer at once.
            "GET http://evil.test/\r\n",
            "GET http://evil.test\\@allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: 10.0.0.5\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: allowed.test:6379\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: +3\r\n\r\nabc",
            "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\nhello",
        ];
        for first in allowed {
            for then in allowed {
                let stream = format!("{first}{then}");
                for piece in [1, 7, stream.len()] {
                    let mut f = follower();
                    for part in stream.as_bytes().chunks(piece) {
                        assert_eq!(f.feed(part), Ok(()), "{stream:?} in pieces of {piece}");
                    }
                }
            }
            for then in refused {
                let stream = format!("{first}{then}");
                for piece in [1, 7, stream.len()] {
                    let mut f = follower();
                    let r: Result<(), String> =
                        stream.as_bytes().chunks(piece).try_for_each(|p| f.feed(p));
                    assert!(r.is_err(), "{stream:?} in pieces of {piece} passed");
                }
            }
        }
        // A head that never ends is not followed for ever.
        let mut f = follower();
        assert!(f.feed(b"GET / HTTP/1.1\r\nX: ").is_ok());
        assert!(f.feed(&[b'a'; MAX_FIRST + 1]).is_err());
    }

    /// What is followed as HTTP: any request line with a version, a known method even
    /// without one, after empty lines too; SSH's banner, git's pkt-lines and other
    /// protocols' first words are not HTTP and pass.
    #[test]
    fn http_is_told_from_other_protocols() {
        for http in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"\r\n\r\nGET / HTTP/1.1\r\n",
            b"M-SEARCH * HTTP/1.1\r\n",
            b"FOO / HTTP/1.1\r\n",
            b"GET http://evil.test/\r\n",
            b"get / HTTP/1.1\r\n",
        ] {
            assert_eq!(
                http_start(http),
                Start::Http,
                "{:?}",
                String::from_utf8_lossy(http)
            );
        }
        for other in [
            &b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"[..],
            b"0032git-upload-pack /repo.git\0host=git.test\0",
            b"EHLO client.test\r\n",
            b"\x00\x00\x00\x08\x04\xd2\x16\x2f",
            b"*1\r\n$4\r\nPING\r\n",
        ] {
            assert_eq!(
                http_start(other),
                Start::Other,
                "{:?}",
                String::from_utf8_lossy(other)
            );
        }
        for partial in [&b"GE"[..], b"\r\n", b"FOO /path"] {
            assert_eq!(http_start(partial), Start::NeedMore);
        }
    }

    /// An encrypted ClientHello's outer name is a cover; two server names or an extension
    /// twice leave the real one unknown; a server name that is no host name names nobody.
    #[test]
    fn a_hello_that_hides_or_doubles_its_name_is_unreadable() {
        assert_eq!(
            name_in(&client_hello("allowed.test")),
            Found::Name("allowed.test".into(), Learned::Sni)
        );
        for (what, exts) in [
            (
                "ECH",
                vec![(0, sni_ext("allowed.test")), (0xfe0d, vec![0; 8])],
            ),
            (
                "two SNI",
                vec![(0, sni_ext("allowed.test")), (0, sni_ext("evil.test"))],
            ),
            (
                "an extension twice",
                vec![
                    (0, sni_ext("allowed.test")),
                    (10, vec![0, 0]),
                    (10, vec![0, 0]),
                ],
            ),
            ("no host name", vec![(0, sni_ext("evil_x.test!"))]),
        ] {
            assert!(
                matches!(name_in(&hello_with(&exts)), Found::Unreadable(_)),
                "{what}: {:?}",
                name_in(&hello_with(&exts))
            );
        }
        assert_eq!(name_in(&hello_with(&[(10, vec![0, 0])])), Found::None);
    }

    #[test]
    fn host_header_is_found_once_and_only_once() {
        let get = b"GET / HTTP/1.1\r\nHost: Allowed.Test:8080\r\n\r\n";
        assert_eq!(
            name_in(get),
            Found::Name("allowed.test".into(), Learned::Host)
        );
        assert_eq!(name_in(&get[..20]), Found::NeedMore);
        let two = b"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: other.test\r\n\r\n";
        assert!(matches!(name_in(two), Found::Unreadable(_)));
        assert_eq!(name_in(b"SSH-2.0-OpenSSH\r\n"), Found::None);
        assert_eq!(name_in(b"\x00\x0agit-upload-pack"), Found::None);
    }

    #[test]
    fn names_get_stable_synthetic_addresses_and_denials_are_remembered() {
        let a = lookup("stable.test", |_| Some(true));
        let Answer::Address(ip) = a else {
            panic!("{a:?}")
        };
        assert!(is_synthetic(IpAddr::V4(ip)));
        assert_eq!(
            lookup("stable.test", |_| panic!("asked twice")),
            Answer::Address(ip)
        );
        assert_eq!(name_of(IpAddr::V4(ip)).as_deref(), Some("stable.test"));
        assert_eq!(lookup("no.test", |_| Some(false)), Answer::Denied);
        assert_eq!(lookup("no.test", |_| panic!("asked twice")), Answer::Denied);
        assert_eq!(lookup("down.test", |_| None), Answer::Unavailable);
        assert!(!is_synthetic("198.20.0.1".parse().unwrap()));
        assert!(is_synthetic("198.19.255.255".parse().unwrap()));
    }
}
