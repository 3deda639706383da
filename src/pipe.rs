//! Moving bytes between two sockets with splice(2) through a pipe: they never enter the
//! process, and no buffer is allocated per connection. The init's relay drives it with
//! poll(2), the proxy with tokio's readiness (`proxy::splice`). Imports nothing of aisb.

use std::io::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// The most one splice(2) call moves, and the size asked of each pipe.
pub const CHUNK: usize = 1 << 20;

/// A pipe to splice through: what went in must come out before it serves another connection.
pub struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    pub fn new() -> Result<Pipe> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        // A bigger pipe moves more per call (the default is 64 KiB); best effort.
        let _ = nix::fcntl::fcntl(
            write.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETPIPE_SZ(CHUNK as i32),
        );
        Ok(Pipe { read, write })
    }

    /// From the socket `from` into the pipe (which must be empty): Ok(0) when `from` ended.
    pub fn fill(&self, from: RawFd) -> Result<usize> {
        splice(from, self.write.as_raw_fd(), CHUNK)
    }

    /// Up to `len` bytes from the pipe to the socket `to`.
    pub fn drain(&self, to: RawFd, len: usize) -> Result<usize> {
        splice(self.read.as_raw_fd(), to, len)
    }
}

/// One splice(2) call that never blocks on the pipe (the sockets' own O_NONBLOCK decides for
/// them); EINTR retried. No SPLICE_F_MORE: on a TCP socket it holds a short write back for up
/// to 200 ms (a tunnel's 39-byte `200 Connection established` waited that long).
fn splice(from: RawFd, to: RawFd, len: usize) -> Result<usize> {
    loop {
        // SAFETY: splice(2) between descriptors the caller holds open; no offsets.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// No more bytes will be written to `fd` (its peer reads an end).
pub fn shutdown_write(fd: RawFd) {
    // SAFETY: shutdown(2) on a descriptor the caller holds open.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
}
