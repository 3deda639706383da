//! The in-sandbox end of the network: listeners on 127.0.0.1 and [::1] that relay to the
//! host-side proxy's Unix socket (bind-mounted at [`PROXY_SOCKET`](crate::vocab::PROXY_SOCKET)).
//!
//! The init binds them before the workload starts and keeps them: they are close-on-exec, so
//! the workload cannot accept on them, and the init is PID 1, which nothing inside can kill or
//! trace. Plain threads (each accepts a connection and relays it, then waits for the next),
//! no runtime: the init stays small. `connect` is the ProxyCommand for
//! SSH (`GIT_SSH_COMMAND`): it opens a CONNECT tunnel and pipes stdin/stdout through it.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use crate::pipe::Pipe;
use crate::vocab::{
    AGENT_EVENT_MAX, AGENT_METHOD, DIRECT_METHOD, HANDED_HEADER, LEARNED_HEADER, LISTEN_MAX,
    LISTEN_REQUEST, PROXY_SOCKET,
};

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

/// Serve the listeners for as long as the process lives. The proxy port's go to the proxy
/// itself ([`hand_over`]); only if it does not take them are they relayed from here.
pub fn start(listeners: Vec<(TcpListener, Target)>) {
    let (proxy, others): (Vec<_>, Vec<_>) = listeners
        .into_iter()
        .partition(|(_, t)| matches!(t, Target::Proxy));
    let proxy: Vec<TcpListener> = proxy.into_iter().map(|(l, _)| l).collect();
    if !proxy.is_empty() {
        // Sent now, before the workload exists, so it is the proxy's first connection; the
        // answer is waited for on a thread of its own (start-up does not wait for it).
        let sent = send_listeners(&proxy);
        let _ = std::thread::Builder::new().spawn(move || {
            if let Err(e) = sent.and_then(|mut s| tunnel_answer(&mut s)) {
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    // No answer: the proxy may hold the listeners; never share them.
                    let _ = writeln!(
                        std::io::stderr(),
                        "aisb: the proxy did not answer the hand-over of the proxy port ({e})"
                    );
                    return;
                }
                // Refused: relayed from here instead, as before the hand-over existed.
                let _ = writeln!(
                    std::io::stderr(),
                    "aisb: the proxy did not take the proxy port ({e}); relaying it"
                );
                for l in proxy {
                    // The proxy may have made the shared listener non-blocking.
                    let _ = l.set_nonblocking(false);
                    serve(l, |conn| {
                        let _ = relay_one(conn, Target::Proxy);
                    });
                }
            }
        });
    }
    for (listener, target) in others {
        serve(listener, move |conn| {
            let _ = relay_one(conn, target);
        });
    }
}

/// Send the proxy port's listening sockets to the proxy ([`LISTEN_REQUEST`]); its answer is
/// to be read from the connection returned.
fn send_listeners(listeners: &[TcpListener]) -> std::io::Result<UnixStream> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    if listeners.len() > LISTEN_MAX {
        return Err(std::io::Error::other(
            "more listeners than one hand-over carries",
        ));
    }
    let s = UnixStream::connect(PROXY_SOCKET)?;
    // The proxy answers its first connection at once; never wait on it for ever.
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let fds: Vec<i32> = listeners.iter().map(|l| l.as_raw_fd()).collect();
    let iov = [std::io::IoSlice::new(LISTEN_REQUEST)];
    let sent = sendmsg::<()>(
        s.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )?;
    if sent != LISTEN_REQUEST.len() {
        return Err(std::io::Error::other("the hand-over request was cut short"));
    }
    Ok(s)
}

/// Serve `listener` with threads that each accept a connection and relay it themselves: no
/// hand-off from an accepting thread to a worker (a wake-up per connection, measured in the
/// per-request cost). One thread always waits in `accept`: the one that takes a connection
/// starts another when none is left waiting, and a thread that finishes while two others
/// wait ends. Out of threads (the sandbox's pids limit), the last one serves connections one
/// after another rather than dropping them.
pub fn serve(listener: TcpListener, handle: impl Fn(TcpStream) + Send + Sync + 'static) {
    let acceptors = std::sync::Arc::new(Acceptors {
        listener,
        waiting: std::sync::atomic::AtomicUsize::new(0),
        handle: Box::new(handle),
    });
    // The process's first acceptor: if even it cannot start, nothing is served (as before).
    let _ = spawn_acceptor(acceptors);
}

struct Acceptors {
    listener: TcpListener,
    /// Threads blocked in `accept` now.
    waiting: std::sync::atomic::AtomicUsize,
    handle: Box<dyn Fn(TcpStream) + Send + Sync>,
}

fn spawn_acceptor(a: std::sync::Arc<Acceptors>) -> bool {
    std::thread::Builder::new()
        .spawn(move || accept_loop(&a))
        .is_ok()
}

fn accept_loop(a: &std::sync::Arc<Acceptors>) {
    use std::sync::atomic::Ordering::SeqCst;
    loop {
        a.waiting.fetch_add(1, SeqCst);
        let conn = a.listener.accept();
        let others = a.waiting.fetch_sub(1, SeqCst) - 1;
        match conn {
            Ok((c, _)) => {
                if others == 0 {
                    spawn_acceptor(std::sync::Arc::clone(a));
                }
                (a.handle)(c)
            }
            // Out of descriptors or memory for a moment: not a busy loop.
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
        if a.waiting.load(SeqCst) >= 2 {
            return;
        }
    }
}

fn relay_one(tcp: TcpStream, target: Target) -> std::io::Result<()> {
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

/// The transparent relay's CONNECT for `authority`, saying how it learned the name (for the
/// audit log) and, when the connection itself goes with it, how the proxy is to serve it
/// (`handed`, [`HANDED_HEADER`]). Its answer is not waited for: [`relay_tunnel`] reads it.
pub fn connect_learned(authority: &str, how: &str, handed: Option<&str>) -> Vec<u8> {
    let mode = handed.map_or(String::new(), |m| format!("{HANDED_HEADER}: {m}\r\n"));
    format!(
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{LEARNED_HEADER}: {how}\r\n{mode}\r\n"
    )
    .into_bytes()
}

fn tunnel_answer(s: &mut UnixStream) -> std::io::Result<()> {
    let head = answer_head(s)?;
    let status = String::from_utf8_lossy(&head);
    if status.split(' ').nth(1) == Some("200") {
        return Ok(());
    }
    // The body says which rule blocked it.
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    Err(std::io::Error::other(body.trim().to_string()))
}

/// The proxy's answer head, read to its end and no further: what follows is the tunnel's (an
/// SSH server's banner may be right behind it). The proxy writes a head at once, so it is
/// peeked whole and read in one call; a head that arrives in pieces is read a byte at a time.
fn answer_head(s: &mut UnixStream) -> std::io::Result<Vec<u8>> {
    let closed = || std::io::Error::other("the proxy closed the tunnel");
    let mut peeked = [0u8; 1024];
    let n = nix::sys::socket::recv(
        s.as_raw_fd(),
        &mut peeked,
        nix::sys::socket::MsgFlags::MSG_PEEK,
    )
    .map_err(std::io::Error::from)?;
    if n == 0 {
        return Err(closed());
    }
    if let Some(end) = peeked[..n].windows(4).position(|w| w == b"\r\n\r\n") {
        let mut head = vec![0u8; end + 4];
        s.read_exact(&mut head)?;
        return Ok(head);
    }
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 || head.len() > 16 * 1024 {
            return Err(closed());
        }
        head.push(byte[0]);
    }
    Ok(head)
}

/// Copy both ways until each side ends (see [`relay_tunnel`]); nothing checks the bytes.
pub fn pipe(tcp: TcpStream, unix: UnixStream) -> std::io::Result<()> {
    relay(&tcp, &unix, First::Pass, false, |_| Check::Pass)
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// Relay both ways between `tcp` (the workload's connection) and `unix` (a tunnel whose
/// CONNECT was sent and not yet answered) until each side ends. The proxy's answer comes
/// first on `unix` and is not relayed: a refusal ends both with [`Refused::Proxy`]. Whatever
/// the client sends meanwhile waits in the proxy, which forwards it only once it allowed the
/// tunnel, as for any request. `first` says what `check` sees of the client's bytes; the
/// server's side flows at once (SSH speaks first).
pub fn relay_tunnel(
    tcp: &TcpStream,
    unix: &UnixStream,
    first: First,
    check: impl FnMut(&[u8]) -> Check,
) -> Result<(), Refused> {
    relay(tcp, unix, first, true, check)
}

/// How [`relay_tunnel`] starts with the client's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First {
    /// Moved unseen (splice).
    Pass,
    /// Read and held back until `check` decides: it sees every byte held so far, and says
    /// [`Check::NeedMore`], [`Check::Pass`], [`Check::Watch`] or [`Check::Refuse`]. Past
    /// [`MAX_HELD`] bytes undecided, the connection is refused; at the client's end of
    /// input, what was held is passed on (nothing can follow it).
    Hold,
    /// Read through this process, each piece shown to `check` (the new bytes only) before it
    /// is passed on; [`Check::Refuse`] ends both sides, [`Check::Pass`] stops watching.
    Watch,
}

/// Why [`relay_tunnel`] ended both sides early.
#[derive(Debug)]
pub enum Refused {
    /// The check refused the client's first bytes.
    Check(String),
    /// The proxy refused the tunnel: the body of its answer (the rule).
    Proxy(String),
    /// The relay itself failed.
    Io(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Check(why) | Refused::Proxy(why) | Refused::Io(why) => f.write_str(why),
        }
    }
}

/// What [`relay_tunnel`]'s check says of the client's bytes.
pub enum Check {
    /// Not decided yet: keep holding them back (up to [`MAX_HELD`] bytes).
    NeedMore,
    /// Forward them, and everything after, unchecked.
    Pass,
    /// Forward them, and show everything after to the check, piece by piece, before it is
    /// forwarded ([`First::Watch`]).
    Watch,
    /// Forward nothing more: both connections are shut, and this is the reason.
    Refuse(String),
}

/// The most of a client's first bytes held back for [`relay_tunnel`]'s check.
pub const MAX_HELD: usize = 16 * 1024;

/// Both ways on this one thread: splice(2) through a pipe per direction, so the bytes never
/// enter this process, and poll(2) for whichever side is ready. One thread per connection and
/// no other (no reader thread per direction), its pipes kept for the thread's next connection:
/// a short request costs no thread creation and no pipe setup. `first`: what `check` sees of
/// the client's bytes.
fn relay(
    tcp: &TcpStream,
    unix: &UnixStream,
    first: First,
    answer: bool,
    mut check: impl FnMut(&[u8]) -> Check,
) -> Result<(), Refused> {
    let io = |e: std::io::Error| Refused::Io(e.to_string());
    tcp.set_nonblocking(true).map_err(io)?;
    unix.set_nonblocking(true).map_err(io)?;
    let (t, u) = (tcp.as_raw_fd(), unix.as_raw_fd());
    let (p_up, p_down) = PIPES.with(|p| p.take()).unwrap_or_default();
    let mut up = Way::new(t, u, p_up, first == First::Hold);
    up.watching = first == First::Watch;
    let mut down = Way::new(u, t, p_down, false);
    down.answer = answer;
    let end = |e: Refused| {
        let _ = tcp.shutdown(Shutdown::Both);
        let _ = unix.shutdown(Shutdown::Both);
        e
    };
    // The client spoke first (its request is there by now); the proxy has yet to hear it.
    let (mut want_up, mut want_down) = (Want::Read, Want::Read);
    let mut step_up = true;
    let mut step_down = false;
    loop {
        if step_up {
            want_up = up.step(&mut check).map_err(end)?;
        }
        if step_down {
            want_down = down.step(&mut |_| Check::Pass).map_err(end)?;
        }
        if want_up == Want::Nothing && want_down == Want::Nothing {
            break;
        }
        // tcp: read for up, write for down; unix: the other way round.
        let events = |read: bool, write: bool| {
            (if read { libc::POLLIN } else { 0 }) | (if write { libc::POLLOUT } else { 0 })
        };
        let tcp_ev = events(want_up == Want::Read, want_down == Want::Write);
        let unix_ev = events(want_down == Want::Read, want_up == Want::Write);
        // A descriptor with nothing to wait for is left out (-1): its POLLHUP would spin.
        let mut fds = [
            libc::pollfd {
                fd: if tcp_ev == 0 { -1 } else { t },
                events: tcp_ev,
                revents: 0,
            },
            libc::pollfd {
                fd: if unix_ev == 0 { -1 } else { u },
                events: unix_ev,
                revents: 0,
            },
        ];
        // SAFETY: two pollfd structures this function owns.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(end(Refused::Io(e.to_string())));
        }
        let ready = |fd: &libc::pollfd| fd.revents != 0;
        step_up = match want_up {
            Want::Read => ready(&fds[0]),
            Want::Write => ready(&fds[1]),
            Want::Nothing => false,
        };
        step_down = match want_down {
            Want::Read => ready(&fds[1]),
            Want::Write => ready(&fds[0]),
            Want::Nothing => false,
        };
    }
    // Both pipes drained (every byte read was written): the next connection may use them.
    if let (Some(a), Some(b)) = (up.pipe.take(), down.pipe.take()) {
        if up.clean && down.clean {
            PIPES.with(|p| p.set(Some((Some(a), Some(b)))));
        }
    }
    Ok(())
}

thread_local! {
    /// The pipes of this thread's last clean connection, for its next one.
    static PIPES: std::cell::Cell<Option<(Option<Pipe>, Option<Pipe>)>> =
        const { std::cell::Cell::new(None) };
}

/// What a direction waits for before it can go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Read,
    Write,
    /// Finished: its source ended (or failed) and what it held was written (or cannot be).
    Nothing,
}

/// One direction of [`relay`].
struct Way {
    from: i32,
    to: i32,
    /// None: copied through `buf` (splice(2) refused these descriptors, or no pipe).
    pipe: Option<Pipe>,
    /// Bytes in the pipe not yet written.
    in_pipe: usize,
    /// Bytes read into this process and not yet written: the held first message, or the copy.
    buf: Vec<u8>,
    pos: usize,
    /// Reading the first message into `buf` for the check, forwarding nothing yet.
    holding: bool,
    /// Reading through `buf`, each piece checked before it is forwarded.
    watching: bool,
    /// Reading the proxy's answer to CONNECT into `buf`, to drop it (or end on a refusal).
    answer: bool,
    eof: bool,
    /// The last read was short: the next waits for poll.
    short: bool,
    done: bool,
    /// Ended with nothing left in its pipe (the pipe may serve another connection).
    clean: bool,
    moved: u64,
}

impl Way {
    fn new(from: i32, to: i32, pipe: Option<Pipe>, holding: bool) -> Way {
        Way {
            from,
            to,
            pipe: pipe.or_else(|| Pipe::new().ok()),
            in_pipe: 0,
            buf: Vec::new(),
            pos: 0,
            holding,
            watching: false,
            answer: false,
            eof: false,
            short: false,
            done: false,
            clean: false,
            moved: 0,
        }
    }

    /// Move what can be moved without blocking; what it waits for next. Err: refused.
    fn step(&mut self, check: &mut impl FnMut(&[u8]) -> Check) -> Result<Want, Refused> {
        if self.done {
            return Ok(Want::Nothing);
        }
        match self.run(check) {
            Ok(Some(want)) => Ok(want),
            Ok(None) => {
                self.finish(true);
                Ok(Want::Nothing)
            }
            Err(Stop::Refused(why)) => {
                self.finish(false);
                Err(why)
            }
            Err(Stop::Answer(why)) => {
                self.finish(false);
                Err(Refused::Proxy(why))
            }
            Err(Stop::Failed(_)) => {
                self.finish(false);
                Ok(Want::Nothing)
            }
        }
    }

    fn finish(&mut self, clean: bool) {
        self.done = true;
        self.clean = clean && self.in_pipe == 0;
        // SAFETY: shutdown(2) on a descriptor the caller holds open.
        unsafe { libc::shutdown(self.to, libc::SHUT_WR) };
    }

    /// Ok(None): the source ended and everything was written.
    fn run(&mut self, check: &mut impl FnMut(&[u8]) -> Check) -> Result<Option<Want>, Stop> {
        loop {
            if !self.holding && !self.answer && self.pos < self.buf.len() {
                match retry(|| unsafe {
                    // SAFETY: writes from a live buffer of at least this many bytes.
                    libc::write(
                        self.to,
                        self.buf[self.pos..].as_ptr().cast(),
                        self.buf.len() - self.pos,
                    )
                })? {
                    None => return Ok(Some(Want::Write)),
                    Some(n) => self.pos += n,
                }
                if self.pos == self.buf.len() {
                    self.buf.clear();
                    self.pos = 0;
                    // What was read is passed on (a first message, at most a chunk): poll
                    // rather than a read saying EAGAIN.
                    if !self.eof {
                        return Ok(Some(Want::Read));
                    }
                }
                continue;
            }
            if let (Some(p), true) = (&self.pipe, self.in_pipe > 0) {
                match would_block(p.drain(self.to, self.in_pipe))? {
                    None => return Ok(Some(Want::Write)),
                    Some(0) => return Err(Stop::Failed(std::io::ErrorKind::WriteZero.into())),
                    Some(n) => {
                        self.in_pipe -= n;
                        self.moved += n as u64;
                    }
                }
                // A short read took what there was: poll rather than a read saying EAGAIN.
                if self.in_pipe == 0 && self.short && !self.eof {
                    return Ok(Some(Want::Read));
                }
                continue;
            }
            if self.eof {
                return Ok(None);
            }
            if self.holding || self.answer || self.watching || self.pipe.is_none() {
                let mut chunk = [0u8; 16 * 1024];
                let max = if self.holding || self.answer {
                    (MAX_HELD - self.buf.len()).min(chunk.len())
                } else {
                    chunk.len()
                };
                // SAFETY: reads into a live stack buffer of at least `max` bytes.
                let read =
                    retry(|| unsafe { libc::read(self.from, chunk.as_mut_ptr().cast(), max) })?;
                match read {
                    None => return Ok(Some(Want::Read)),
                    Some(0) => self.eof = true,
                    Some(n) if self.watching && !self.holding => {
                        match check(&chunk[..n]) {
                            Check::Refuse(why) => return Err(Stop::Refused(Refused::Check(why))),
                            Check::Pass => self.watching = false,
                            Check::NeedMore | Check::Watch => {}
                        }
                        self.buf.extend_from_slice(&chunk[..n]);
                    }
                    Some(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
                if self.answer {
                    let full = self.eof || self.buf.len() >= MAX_HELD;
                    match answer_in(&self.buf) {
                        None if !full => {}
                        None => return Err(Stop::Answer("the proxy closed the tunnel".into())),
                        Some((len, true)) => {
                            self.buf.drain(..len);
                            self.answer = false;
                        }
                        // A refusal: its body, read to its end, says which rule.
                        Some((len, false)) if full => {
                            let body = String::from_utf8_lossy(&self.buf[len..]);
                            return Err(Stop::Answer(body.trim().to_string()));
                        }
                        Some(_) => {}
                    }
                    continue;
                }
                if self.holding {
                    let verdict = match check(&self.buf) {
                        // Nothing can follow: what there is goes on.
                        Check::NeedMore if self.eof => Check::Pass,
                        Check::NeedMore if self.buf.len() >= MAX_HELD => Check::Refuse(format!(
                            "the client's first {MAX_HELD} bytes could not be checked for the name they send"
                        )),
                        other => other,
                    };
                    match verdict {
                        Check::NeedMore => {}
                        Check::Pass => self.holding = false,
                        Check::Watch => {
                            self.holding = false;
                            self.watching = true;
                        }
                        Check::Refuse(why) => return Err(Stop::Refused(Refused::Check(why))),
                    }
                }
                continue;
            }
            let p = self.pipe.as_ref().expect("checked above");
            let spliced = would_block(p.fill(self.from));
            match spliced {
                Ok(None) => return Ok(Some(Want::Read)),
                Ok(Some(0)) => self.eof = true,
                Ok(Some(n)) => {
                    self.in_pipe = n;
                    self.short = n < crate::pipe::CHUNK / 16;
                }
                // These descriptors cannot splice: copy instead, before anything moved.
                Err(Stop::Failed(e))
                    if e.raw_os_error() == Some(libc::EINVAL) && self.moved == 0 =>
                {
                    self.pipe = None
                }
                Err(e) => return Err(e),
            }
        }
    }
}

enum Stop {
    Refused(Refused),
    /// The proxy's answer was not 200: its body.
    Answer(String),
    Failed(std::io::Error),
}

/// The length of the proxy's answer head in `buf`, and whether it said 200.
fn answer_in(buf: &[u8]) -> Option<(usize, bool)> {
    let len = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let ok = buf[..len].split(|&b| b == b' ').nth(1) == Some(b"200".as_slice());
    Some((len, ok))
}

/// A count, or None when the call would block.
fn would_block(r: std::io::Result<usize>) -> Result<Option<usize>, Stop> {
    match r {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(Stop::Failed(e)),
    }
}

/// A system call's count; None when it would block; EINTR retried.
fn retry(mut call: impl FnMut() -> isize) -> Result<Option<usize>, Stop> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(Stop::Failed(e)),
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
    // The call's id, so that its post-tool hook can ask what was refused during it.
    if let Some(id) = tool_use_id(&raw) {
        event["tool_use_id"] = serde_json::json!(id);
    }
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

/// The id of the tool call a hook's input `raw` describes: Claude Code's `tool_use_id`.
/// Gemini CLI gives none: its session, tool and input, hashed, are the same before and after
/// the call.
fn tool_use_id(raw: &[u8]) -> Option<String> {
    use sha2::Digest;
    let v: serde_json::Value = serde_json::from_slice(raw).ok()?;
    if let Some(id) = v.get("tool_use_id").and_then(serde_json::Value::as_str) {
        return crate::vocab::tool_call_id(id);
    }
    let event = v.get("hook_event_name")?.as_str()?;
    if !matches!(event, "BeforeTool" | "AfterTool") {
        return None;
    }
    let mut h = sha2::Sha256::new();
    for key in ["session_id", "tool_name", "tool_input"] {
        h.update(v.get(key).map(|x| x.to_string()).unwrap_or_default());
        h.update([0u8]);
    }
    let hex: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(format!("gemini-{hex}"))
}

/// `init agent-result AGENT`: an agent's post-tool hook. Asks the proxy what the sandbox
/// refused during this call (`proxy::feedback`) and hands it to the agent as context for the
/// model, in the form Claude Code reads from a post-tool hook; prints nothing when nothing was
/// refused or there is no proxy. Always exits 0: it never changes what the tool did.
pub fn agent_result_main(agent: &str) -> i32 {
    let _ = agent;
    let mut raw = Vec::new();
    let _ = std::io::stdin().take(64 << 20).read_to_end(&mut raw);
    let Some(id) = tool_use_id(&raw) else {
        return 0;
    };
    let event = serde_json::from_slice::<serde_json::Value>(&raw)
        .ok()
        .and_then(|v| v.get("hook_event_name")?.as_str().map(str::to_string))
        .filter(|e| {
            matches!(
                e.as_str(),
                "PostToolUse" | "PostToolUseFailure" | "PermissionDenied" | "AfterTool"
            )
        })
        .unwrap_or_else(|| "PostToolUse".into());
    // Refused by the agent's own permission layer after the pre-tool hook: the call ends
    // with nothing to hear about.
    let ending = event == "PermissionDenied";
    let body = if ending { format!("end {id}") } else { id };
    let Ok(mut s) = UnixStream::connect(PROXY_SOCKET) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(1)));
    let _ = s.set_write_timeout(Some(std::time::Duration::from_secs(1)));
    let head = format!(
        "{} * HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        crate::vocab::AGENT_RESULT_METHOD,
        body.len()
    );
    if s.write_all(head.as_bytes()).is_err() || s.write_all(body.as_bytes()).is_err() {
        return 0;
    }
    let mut answer = Vec::new();
    let limit = (crate::vocab::FEEDBACK_MAX + 256) as u64;
    let _ = (&mut s).take(limit).read_to_end(&mut answer);
    // The proxy's own answer only (a 400's text is no context for the model).
    if ending || !answer.starts_with(b"HTTP/1.1 200 ") {
        return 0;
    }
    let Some(at) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return 0;
    };
    // Model input: printable lines only, bounded (the proxy's text is so already).
    let text: String = String::from_utf8_lossy(&answer[at + 4..])
        .chars()
        .filter(|c| !c.is_control() || *c == '\n')
        .take(crate::vocab::FEEDBACK_MAX)
        .collect();
    if text.trim().is_empty() {
        return 0;
    }
    let out = serde_json::json!({
        "hookSpecificOutput": {
            "hookEventName": event,
            "additionalContext": text,
        }
    });
    println!("{out}");
    0
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
