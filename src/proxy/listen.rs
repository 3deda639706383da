//! The proxy port handed over: the init binds the workload's proxy port (`127.0.0.1:3128` and
//! `[::1]:3128`) in the sandbox's network namespace and sends the listening sockets to the
//! proxy as its first connection ([`LISTEN_REQUEST`], SCM_RIGHTS). The proxy then accepts the
//! workload's connections itself: one hop (workload -> proxy -> upstream), where a relay in
//! the init added a second one (a thread's accept, a Unix connection and a splice each way).
//!
//! What arrives is checked, because anything inside may connect to the proxy's socket: only
//! the first connection the proxy ever accepts may hand over, at most [`LISTEN_MAX`]
//! descriptors are taken (the kernel closes any past them, and the whole hand-over is then
//! refused), and each must be a listening TCP socket. A workload that won the race with its
//! own listener would gain nothing: the proxy would accept connections the workload could
//! have made to the proxy's socket directly, under the same policy.

use std::io::{Error, ErrorKind, IoSliceMut, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::io::Interest;
use tokio::net::{TcpListener, UnixStream};

use super::server::Proxy;
pub use crate::vocab::{LISTEN_MAX, LISTEN_REQUEST};

/// The first bytes of a connection and the descriptors that came with them (Err, with them
/// closed, when there are more than [`LISTEN_MAX`]).
pub async fn read_with_fds(s: &UnixStream) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 4096];
    loop {
        s.readable().await?;
        let got = s.try_io(Interest::READABLE, || {
            let mut iov = [IoSliceMut::new(&mut buf)];
            // Room for as many as one message can carry (the kernel's SCM_MAX_FD), so none
            // is ever dropped unowned; more than LISTEN_MAX is refused below.
            let mut space = nix::cmsg_space!([RawFd; 253]);
            let msg = recvmsg::<()>(
                s.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
            )
            .map_err(Error::from)?;
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(Error::from)? {
                if let ControlMessageOwned::ScmRights(received) = c {
                    // SAFETY: the kernel just installed these descriptors for us alone.
                    fds.extend(
                        received
                            .into_iter()
                            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                    );
                }
            }
            if fds.len() > LISTEN_MAX || msg.flags.contains(MsgFlags::MSG_CTRUNC) {
                discard(fds);
                return Err(Error::new(
                    ErrorKind::InvalidData,
                    format!("more than {LISTEN_MAX} descriptors sent to the proxy"),
                ));
            }
            Ok((msg.bytes, fds))
        });
        match got {
            Ok((n, fds)) => {
                buf.truncate(n);
                return Ok((buf, fds));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Close descriptors the proxy refused, off its one thread: a socket sent with a long
/// `SO_LINGER` and a full send buffer would block the close.
pub fn discard(fds: Vec<OwnedFd>) {
    if !fds.is_empty() {
        tokio::task::spawn_blocking(move || drop(fds));
    }
}

/// The handed-over descriptors as listeners, each checked to be a listening TCP socket.
pub fn listeners(fds: Vec<OwnedFd>) -> std::result::Result<Vec<TcpListener>, String> {
    if fds.is_empty() {
        return Err("no listening socket came with the request".into());
    }
    let mut out = Vec::new();
    for fd in fds {
        if !is_tcp(&fd, true)? {
            return Err("a descriptor sent is not a listening TCP socket".into());
        }
        let l = std::net::TcpListener::from(fd);
        l.set_nonblocking(true).map_err(|e| e.to_string())?;
        out.push(TcpListener::from_std(l).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

/// A workload's connection the transparent relay handed over: it must be a connected TCP
/// socket (anything else, a file or a netlink socket, is never written to by this process).
pub fn connection(fd: OwnedFd) -> std::result::Result<tokio::net::TcpStream, String> {
    if !is_tcp(&fd, false)? {
        return Err("the descriptor sent is not a TCP connection".into());
    }
    let s = std::net::TcpStream::from(fd);
    s.peer_addr()
        .map_err(|e| format!("the descriptor sent is not a TCP connection ({e})"))?;
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    tokio::net::TcpStream::from_std(s).map_err(|e| e.to_string())
}

/// Whether `fd` is an IPv4 or IPv6 TCP socket that is listening (or, `listening` false, not);
/// Err when it is no socket at all.
fn is_tcp(fd: &OwnedFd, listening: bool) -> std::result::Result<bool, String> {
    let domain = int_option(fd, libc::SO_DOMAIN)?;
    Ok(matches!(domain, libc::AF_INET | libc::AF_INET6)
        && int_option(fd, libc::SO_TYPE)? == libc::SOCK_STREAM
        && int_option(fd, libc::SO_PROTOCOL)? == libc::IPPROTO_TCP
        && int_option(fd, libc::SO_ACCEPTCONN)? == i32::from(listening))
}

fn int_option(fd: &OwnedFd, name: libc::c_int) -> std::result::Result<libc::c_int, String> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `value`, which lives across it.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(format!(
            "a descriptor sent is not a socket ({})",
            Error::last_os_error()
        ));
    }
    Ok(value)
}

/// Accept the workload's connections on a handed-over port for as long as the process
/// lives; each is served like one that came through the Unix socket.
pub async fn serve_port(listener: TcpListener, proxy: Arc<Proxy>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let Some(slot) = proxy.slot(&stream) else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let p = Arc::clone(&proxy);
                tokio::spawn(async move {
                    let _ = p.handle(stream).await;
                    drop(slot);
                });
            }
            // Out of descriptors or a connection reset before accept: keep serving.
            Err(e) if super::serve::is_transient(&e) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::policy::{Policy, PolicyConfig};
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream as StdUnix;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A proxy serving `dir/proxy.sock` on a thread of its own; upstream `up.test` is pinned
    /// to `upstream`.
    fn proxy(dir: &std::path::Path, upstream: std::net::SocketAddr) -> std::path::PathBuf {
        proxy_with(dir, upstream, Proxy::run_slots())
    }

    fn proxy_with(
        dir: &std::path::Path,
        upstream: std::net::SocketAddr,
        slots: Arc<tokio::sync::Semaphore>,
    ) -> std::path::PathBuf {
        let sock = dir.join("proxy.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let cfg = PolicyConfig {
            allow: vec!["up.test".into()],
            pins: vec![("up.test".into(), upstream)],
            ..Default::default()
        };
        std::thread::spawn(move || {
            runtime().block_on(async move {
                listener.set_nonblocking(true).unwrap();
                let l = tokio::net::UnixListener::from_std(listener).unwrap();
                let p = Arc::new(Proxy {
                    policy: Policy::new(&cfg),
                    slots,
                    audit: None,
                    reported: Default::default(),
                    buffer: 64 * 1024,
                    broker: None,
                    feedback: None,
                });
                let _ = super::super::server::serve(l, p).await;
            })
        });
        sock
    }

    /// Past its connection cap the proxy answers `503` at once and closes; a slot is free
    /// again when a connection ends, and a client that never speaks holds one only until
    /// [`super::super::server::FIRST_BYTE_TIMEOUT`].
    #[test]
    fn past_its_connection_cap_the_proxy_answers_503_until_one_ends() {
        let t = tempfile::tempdir().unwrap();
        let unused: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
        let sock = proxy_with(t.path(), unused, Arc::new(tokio::sync::Semaphore::new(2)));
        let status = |s: &mut StdUnix| {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut answer = String::new();
            let _ = s.read_to_string(&mut answer);
            answer.lines().next().unwrap_or("").to_string()
        };
        // Two silent clients take both slots (accepted in the order they connected).
        let a = StdUnix::connect(&sock).unwrap();
        let _b = StdUnix::connect(&sock).unwrap();
        let mut c = StdUnix::connect(&sock).unwrap();
        assert_eq!(status(&mut c), "HTTP/1.1 503 Service Unavailable");
        drop(a);
        // The slot comes back once the proxy sees the first client go.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut d = StdUnix::connect(&sock).unwrap();
            d.write_all(b"CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n")
                .unwrap();
            let got = status(&mut d);
            if got != "HTTP/1.1 503 Service Unavailable" {
                assert!(got.starts_with("HTTP/1.1 403"), "{got}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no slot came back");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Send `bytes` with `fds` attached; the answer's status line.
    fn hand_over(sock: &std::path::Path, bytes: &[u8], fds: &[RawFd]) -> String {
        use nix::sys::socket::{sendmsg, ControlMessage};
        let mut s = StdUnix::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let iov = [std::io::IoSlice::new(bytes)];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
        sendmsg::<()>(s.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).unwrap();
        // As the relay does: the proxy reads a hand-over to its end.
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.lines().next().unwrap_or("").to_string()
    }

    /// An HTTP/1.0 server on loopback answering `hello` once per connection.
    fn upstream() -> std::net::SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for c in l.incoming().take(16) {
                let Ok(mut c) = c else { continue };
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello");
            }
        });
        addr
    }

    fn get_through(port: std::net::SocketAddr, upstream: std::net::SocketAddr) -> String {
        let mut c = std::net::TcpStream::connect(port).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let target = format!("http://up.test:{}/", upstream.port());
        c.write_all(format!("GET {target} HTTP/1.1\r\nHost: up.test\r\n\r\n").as_bytes())
            .unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    }

    #[test]
    fn the_first_connection_hands_over_a_listener_and_the_proxy_serves_it() {
        let dir = tempfile::tempdir().unwrap();
        let up = upstream();
        let sock = proxy(dir.path(), up);
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = port.local_addr().unwrap();
        let status = hand_over(&sock, LISTEN_REQUEST, &[port.as_raw_fd()]);
        assert_eq!(status, "HTTP/1.1 200 OK");
        drop(port);
        let got = get_through(addr, up);
        assert!(got.ends_with("hello"), "{got}");

        // Later connections (anything inside can reach the socket) cannot hand over one more
        // listener: it is refused and never served.
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let status = hand_over(&sock, LISTEN_REQUEST, &[other.as_raw_fd()]);
        assert!(status.starts_with("HTTP/1.1 400"), "{status}");
        other.set_nonblocking(true).unwrap();
        let _c = std::net::TcpStream::connect(other.local_addr().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            other.accept().is_ok(),
            "the refused listener was accepted on"
        );
    }

    #[test]
    fn a_hand_over_with_too_many_descriptors_or_none_is_refused() {
        for n in [LISTEN_MAX + 1, 0] {
            let dir = tempfile::tempdir().unwrap();
            let sock = proxy(dir.path(), upstream());
            let ls: Vec<_> = (0..n)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
                .collect();
            let fds: Vec<RawFd> = ls.iter().map(|l| l.as_raw_fd()).collect();
            let status = hand_over(&sock, LISTEN_REQUEST, &fds);
            assert!(
                status.starts_with("HTTP/1.1 400"),
                "{n} descriptors: {status}"
            );
        }
    }

    #[test]
    fn a_hand_over_cut_in_two_is_refused_and_other_first_clients_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let sock = proxy(dir.path(), upstream());
        let status = hand_over(&sock, &LISTEN_REQUEST[..15], &[l.as_raw_fd()]);
        assert!(status.starts_with("HTTP/1.1 400"), "{status}");

        // A first client that is not a hand-over is an ordinary request; with descriptors,
        // it is refused (they are closed, not used).
        let dir = tempfile::tempdir().unwrap();
        let up = upstream();
        let sock = proxy(dir.path(), up);
        let req = format!(
            "GET http://up.test:{}/ HTTP/1.1\r\nHost: up.test\r\n\r\n",
            up.port()
        );
        let status = hand_over(&sock, req.as_bytes(), &[l.as_raw_fd()]);
        assert!(status.starts_with("HTTP/1.1 400"), "{status}");
        let dir = tempfile::tempdir().unwrap();
        let sock = proxy(dir.path(), up);
        let status = hand_over(&sock, req.as_bytes(), &[]);
        assert_eq!(status, "HTTP/1.0 200 OK");
    }

    /// A workload's connection (the proxy's end, and the workload's) over loopback.
    fn connection_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let workload = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        workload
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        (l.accept().unwrap().0, workload)
    }

    fn handed_request(mode: &str, port: u16) -> Vec<u8> {
        format!(
            "CONNECT up.test:{port} HTTP/1.1\r\nHost: up.test:{port}\r\nX-Aisb-Learned: dns\r\nX-Aisb-Handed: {mode}\r\n\r\n"
        )
        .into_bytes()
    }

    /// Hand a fresh connection over in `mode` with `early` (what the relay read), then send
    /// `then` from the workload's end: all it gets back.
    fn through_handed(
        sock: &std::path::Path,
        mode: &str,
        port: u16,
        early: &[u8],
        then: &[u8],
    ) -> String {
        let (theirs, mut workload) = connection_pair();
        let mut req = handed_request(mode, port);
        req.extend_from_slice(early);
        let status = hand_over(sock, &req, &[theirs.as_raw_fd()]);
        assert_eq!(status, "", "a hand-over is not answered");
        drop(theirs);
        workload.write_all(then).unwrap();
        let mut got = String::new();
        let _ = workload.read_to_string(&mut got);
        got
    }

    #[test]
    fn a_handed_connection_is_served_as_a_tunnel_or_as_one_checked_http_request() {
        let dir = tempfile::tempdir().unwrap();
        let up = upstream();
        let sock = proxy(dir.path(), up);
        let _ = hand_over(&sock, b"GET / HTTP/1.0\r\n\r\n", &[]); // the first connection

        // A tunnel: the relay's early bytes go first, then the workload's.
        let got = through_handed(&sock, "tunnel", up.port(), b"GET / HTTP/1.0\r\n", b"\r\n");
        assert!(got.ends_with("hello"), "{got}");

        // Plain HTTP naming the host and port connected to: forwarded.
        let head = format!("GET / HTTP/1.1\r\nHost: up.test:{}\r\n\r\n", up.port());
        let got = through_handed(&sock, "http", up.port(), b"", head.as_bytes());
        assert!(got.ends_with("hello"), "{got}");

        // Another host, another port, an absolute target naming another host, or a CONNECT
        // through the handed connection: refused, with the reason.
        for head in [
            "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n".to_string(),
            "GET / HTTP/1.1\r\nHost: up.test:1\r\n\r\n".to_string(),
            format!(
                "GET http://other.test:{}/ HTTP/1.1\r\nHost: up.test:{}\r\n\r\n",
                up.port(),
                up.port()
            ),
            format!("CONNECT up.test:{} HTTP/1.1\r\n\r\n", up.port()),
        ] {
            let got = through_handed(&sock, "http", up.port(), b"", head.as_bytes());
            assert!(got.starts_with("HTTP/1.1 4"), "{head}: {got}");
            assert!(!got.contains("hello"), "{head}: {got}");
        }
    }

    #[test]
    fn only_one_tcp_connection_may_be_handed_over() {
        let dir = tempfile::tempdir().unwrap();
        let up = upstream();
        let sock = proxy(dir.path(), up);
        let _ = hand_over(&sock, b"GET / HTTP/1.0\r\n\r\n", &[]);
        let req = handed_request("tunnel", up.port());
        let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, _wa) = connection_pair();
        let (b, _wb) = connection_pair();
        let (unix, _other) = StdUnix::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        for (what, fds) in [
            ("a listener", vec![listening.as_raw_fd()]),
            ("udp", vec![udp.as_raw_fd()]),
            ("a unix socket", vec![unix.as_raw_fd()]),
            ("a file", vec![file.as_raw_fd()]),
            ("two connections", vec![a.as_raw_fd(), b.as_raw_fd()]),
        ] {
            let status = hand_over(&sock, &req, &fds);
            assert!(status.starts_with("HTTP/1.1 400"), "{what}: {status}");
        }
        // A connection with no hand-over header, or something that is not a CONNECT.
        let plain = format!("CONNECT up.test:{} HTTP/1.1\r\n\r\n", up.port());
        let status = hand_over(&sock, plain.as_bytes(), &[a.as_raw_fd()]);
        assert!(status.starts_with("HTTP/1.1 400"), "{status}");
        let status = hand_over(
            &sock,
            b"GET / HTTP/1.1\r\nX-Aisb-Handed: http\r\n\r\n",
            &[a.as_raw_fd()],
        );
        assert!(status.starts_with("HTTP/1.1 400"), "{status}");
    }

    #[test]
    fn only_listening_tcp_sockets_are_taken() {
        let rt = runtime();
        let _guard = rt.enter();
        // SAFETY: dup(2) returns a new descriptor that nothing else owns.
        let fd = |f: &dyn AsRawFd| unsafe { OwnedFd::from_raw_fd(libc::dup(f.as_raw_fd())) };
        let listening = std::net::TcpListener::bind("[::1]:0")
            .or_else(|_| std::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        assert_eq!(listeners(vec![fd(&listening)]).unwrap().len(), 1);

        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let connected = std::net::TcpStream::connect(listening.local_addr().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let unix = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        for (what, bad) in [
            ("udp", fd(&udp)),
            ("connected tcp", fd(&connected)),
            ("unix listener", fd(&unix)),
            ("pipe", pipe_r),
            ("file", fd(&file)),
        ] {
            assert!(listeners(vec![bad]).is_err(), "{what} was taken");
        }
        assert!(listeners(Vec::new()).is_err());
    }
}
