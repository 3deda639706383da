//! The proxy's side of moving bytes between two sockets with splice(2) through a pipe
//! ([`crate::pipe`]), driven by tokio's readiness ([`both`], [`one_way`]); the init's relay
//! drives the same pipes with poll(2).

use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, RawFd};

pub use crate::pipe::{shutdown_write, Pipe, CHUNK};

use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// Pipes of connections that ended cleanly (empty), for the next ones: a tunnel then costs
/// no pipe2/fcntl. Bounded: past [`KEPT`], a pipe is closed.
fn kept() -> &'static std::sync::Mutex<Vec<Pipe>> {
    static KEPT_PIPES: std::sync::Mutex<Vec<Pipe>> = std::sync::Mutex::new(Vec::new());
    &KEPT_PIPES
}

const KEPT: usize = 64;

fn take_pipe() -> Result<Pipe> {
    match kept().lock().ok().and_then(|mut k| k.pop()) {
        Some(p) => Ok(p),
        None => Pipe::new(),
    }
}

fn keep_pipe(p: Pipe) {
    if let Ok(mut k) = kept().lock() {
        if k.len() < KEPT {
            k.push(p);
        }
    }
}

/// A socket the proxy can splice to and from, with tokio's readiness for it.
#[derive(Clone, Copy)]
pub enum Socket<'a> {
    Unix(&'a UnixStream),
    Tcp(&'a TcpStream),
}

impl Socket<'_> {
    /// Write what fits without waiting (a refusal sent on the way out).
    pub fn try_write(self, bytes: &[u8]) {
        let _ = match self {
            Socket::Unix(s) => s.try_write(bytes),
            Socket::Tcp(s) => s.try_write(bytes),
        };
    }

    fn fd(self) -> RawFd {
        match self {
            Socket::Unix(s) => s.as_raw_fd(),
            Socket::Tcp(s) => s.as_raw_fd(),
        }
    }

    /// Run `op` when the socket is ready for `interest`, until it does not say WouldBlock.
    async fn when_ready(
        self,
        interest: Interest,
        mut op: impl FnMut() -> Result<usize>,
    ) -> Result<usize> {
        loop {
            let r = match self {
                Socket::Unix(s) => {
                    s.ready(interest).await?;
                    s.try_io(interest, &mut op)
                }
                Socket::Tcp(s) => {
                    s.ready(interest).await?;
                    s.try_io(interest, &mut op)
                }
            };
            match r {
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                r => return r,
            }
        }
    }
}

/// Both ways between `a` and `b` until each side ends (each end shuts the other's writing, as
/// `tokio::io::copy_bidirectional` does); the bytes moved a -> b and b -> a, counted as they
/// go, so an error still reports what passed. The first error ends both ways.
pub async fn both(a: Socket<'_>, b: Socket<'_>) -> (u64, u64) {
    let (mut ab, mut ba) = (0, 0);
    let (p, q) = match (take_pipe(), take_pipe()) {
        (Ok(p), Ok(q)) => (p, q),
        _ => return (0, 0),
    };
    let done = tokio::try_join!(way(a, b, &p, &mut ab), way(b, a, &q, &mut ba));
    if done.is_ok() {
        keep_pipe(p);
        keep_pipe(q);
    }
    (ab, ba)
}

/// One way, `from` to `to`, until `from` ends; then `to` is shut for writing. The bytes moved.
pub async fn one_way(from: Socket<'_>, to: Socket<'_>) -> u64 {
    let mut moved = 0;
    let Ok(p) = take_pipe() else {
        shutdown_write(to.fd());
        return 0;
    };
    match way(from, to, &p, &mut moved).await {
        Ok(()) => keep_pipe(p),
        Err(_) => shutdown_write(to.fd()),
    }
    moved
}

async fn way(from: Socket<'_>, to: Socket<'_>, pipe: &Pipe, moved: &mut u64) -> Result<()> {
    loop {
        let filled = from
            .when_ready(Interest::READABLE, || pipe.fill(from.fd()))
            .await;
        let n = match filled {
            Ok(n) => n,
            // Descriptors splice(2) cannot move between: copied instead, from the start.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && *moved == 0 => {
                return copy(from, to, moved).await;
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            shutdown_write(to.fd());
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            let m = to
                .when_ready(Interest::WRITABLE, || pipe.drain(to.fd(), left))
                .await?;
            if m == 0 {
                return Err(ErrorKind::WriteZero.into());
            }
            left -= m;
            *moved += m as u64;
        }
    }
}

/// [`way`] through a buffer, where the kernel cannot splice.
async fn copy(from: Socket<'_>, to: Socket<'_>, moved: &mut u64) -> Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: reads into `buf`, at most its length.
        let read = || cvt(unsafe { libc::read(from.fd(), buf.as_mut_ptr().cast(), buf.len()) });
        let n = from.when_ready(Interest::READABLE, read).await?;
        if n == 0 {
            shutdown_write(to.fd());
            return Ok(());
        }
        let mut at = 0;
        while at < n {
            let chunk = &buf[at..n];
            // SAFETY: writes from `chunk`, which lives across the call.
            let write = || cvt(unsafe { libc::write(to.fd(), chunk.as_ptr().cast(), chunk.len()) });
            let m = to.when_ready(Interest::WRITABLE, write).await?;
            if m == 0 {
                return Err(ErrorKind::WriteZero.into());
            }
            at += m;
            *moved += m as u64;
        }
    }
}

fn cvt(n: isize) -> Result<usize> {
    if n < 0 {
        Err(Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}
