//! The terminal side of a console socket: receive the sandbox's pseudo-terminal master, put
//! our terminal in raw mode, copy bytes both ways and keep the window size in step.

use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use nix::sys::termios::{self, SetArg, Termios};

pub struct ConsoleSocket {
    listener: UnixListener,
    dir: PathBuf,
    pub path: PathBuf,
}

impl ConsoleSocket {
    /// Listen in a fresh private directory under the temp dir: a bundle path can be longer
    /// than a socket address allows.
    pub fn listen() -> std::io::Result<ConsoleSocket> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("aisb-console-{}-{nanos}", std::process::id()));
        // `create`, not `create_all`: fails if someone prepared the path for us.
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("sock");
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        Ok(ConsoleSocket {
            listener,
            dir,
            path,
        })
    }

    /// Wait for the runtime to send the master, or for `child` to exit without sending it.
    pub fn receive(&self, child: &mut Child) -> std::io::Result<Option<OwnedFd>> {
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if child.try_wait()?.is_some() {
                        return Ok(None);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_nonblocking(false)?;
        let mut buf = [0u8; 4096];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        for c in msg.cmsgs().map_err(std::io::Error::from)? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                if let Some(&fd) = fds.first() {
                    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
                    return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
        }
        Ok(None)
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Our terminal in raw mode until dropped.
pub struct RawMode(Option<Termios>);

impl RawMode {
    pub fn enter() -> RawMode {
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(&stdin) else {
            return RawMode(None);
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        let _ = termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw);
        RawMode(Some(saved))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, t);
        }
    }
}

/// Copy the window size of our terminal to the sandbox's (at start and on SIGWINCH).
pub fn sync_size(master: RawFd) {
    // SAFETY: TIOCGWINSZ/TIOCSWINSZ read and write one `winsize`.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        if libc::ioctl(0, libc::TIOCGWINSZ, &mut ws) == 0 {
            libc::ioctl(master, libc::TIOCSWINSZ, &ws);
        }
    }
}

/// Copy stdin -> master and master -> stdout on two threads; the output side ends when the
/// sandbox closes its terminal, which the caller waits for with the returned handle.
pub fn proxy(master: OwnedFd) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mut to_pty = std::fs::File::from(master.try_clone()?);
    let mut from_pty = std::fs::File::from(master);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin().lock();
        while let Ok(n) = stdin.read(&mut buf) {
            if n == 0 || to_pty.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    Ok(std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut out = std::io::stdout();
        while let Ok(n) = from_pty.read(&mut buf) {
            if n == 0 || out.write_all(&buf[..n]).and_then(|_| out.flush()).is_err() {
                break;
            }
        }
    }))
}
