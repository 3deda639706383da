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

/// Copy stdin -> master and master -> stdout on two threads, the output through a
/// [`Sanitizer`]; the output side ends when the sandbox closes its terminal, which the caller
/// waits for with the returned handle.
pub fn proxy(master: OwnedFd) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mut to_pty = std::fs::File::from(master.try_clone()?);
    let from_pty = std::fs::File::from(master);
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
        relay_out(from_pty, std::io::stdout())
    }))
}

/// Copy what the sandbox's terminal prints to `to`, made safe, until the terminal ends (its
/// last other side closed: EIO) or `to` fails.
fn relay_out(mut from: std::fs::File, mut to: impl Write) {
    let mut s = Sanitizer::default();
    let mut buf = [0u8; 8192];
    let mut clean = Vec::with_capacity(buf.len());
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        clean.clear();
        s.feed(&buf[..n], &mut clean);
        if to.write_all(&clean).and_then(|()| to.flush()).is_err() {
            return;
        }
    }
    clean.clear();
    s.end(&mut clean);
    let _ = to.write_all(&clean).and_then(|()| to.flush());
}

/// Wait for `h` at most `limit`: a process left behind may hold a terminal open.
pub fn join_for(h: std::thread::JoinHandle<()>, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while !h.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if h.is_finished() {
        let _ = h.join();
    }
}

/// How a [`TerminalGuard`] stands between the caller's terminal and the sandbox.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Relay {
    /// `aisb run`, `aisb exec`: the caller's terminal keeps its own mode (it edits lines,
    /// echoes and sends ^C to aisb, which forwards it); the sandbox's terminal only passes
    /// lines on (no echo, no signals, output unchanged), and ^D is an end of file there too.
    Lines,
    /// `aisb up` with bubblewrap: the caller's terminal raw, the sandbox's a full terminal
    /// (echo, signals, line editing) that the sandbox's first process must take as its
    /// controlling terminal (`setsid`, `TIOCSCTTY` on 0: [`take_controlling_terminal`]).
    Full,
}

/// While a sandbox runs, the caller's terminal is never one of its descriptors: each of the
/// standard descriptors it would inherit from aisb that is a terminal is instead a
/// pseudo-terminal of aisb's, whose output reaches the caller's terminal through a
/// [`Sanitizer`] and whose input is what the caller types. Writing to its input descriptor,
/// or to any descriptor the caller's terminal was open on, would otherwise reach the terminal
/// unfiltered. Output descriptors are write-only when the input is not the terminal (the
/// workload cannot read what the user types afterwards). aisb's own descriptors are left as
/// they are. [`TerminalGuard::finish`] (or dropping it) waits for the last output.
pub struct TerminalGuard {
    /// Which of 0, 1 and 2 the sandbox gets this terminal on.
    ttys: Vec<RawFd>,
    /// The sandbox's side, until it is handed over ([`TerminalGuard::spawned`]).
    slave: Option<OwnedFd>,
    master: OwnedFd,
    /// The caller's terminal the window size is read from.
    terminal: OwnedFd,
    output: Option<std::sync::mpsc::Receiver<()>>,
    stop_input: Option<OwnedFd>,
    raw: Option<RawMode>,
    relay: Relay,
}

/// The two terminals a [`TerminalGuard`] keeps the same size, by number: used from a signal
/// thread while the guard stands.
#[derive(Clone, Copy, Debug)]
pub struct Resizer {
    terminal: RawFd,
    master: RawFd,
}

impl Resizer {
    pub fn resize(self) {
        // SAFETY: TIOCGWINSZ/TIOCSWINSZ read and write one `winsize`.
        unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            if libc::ioctl(self.terminal, libc::TIOCGWINSZ, &mut ws) == 0 {
                libc::ioctl(self.master, libc::TIOCSWINSZ, &ws);
            }
        }
    }
}

impl TerminalGuard {
    /// `None` when none of aisb's 0, 1 and 2 is a terminal. `input`: whether the sandbox
    /// reads aisb's standard input (a sandbox that holds a named one's place reads nothing).
    pub fn install(relay: Relay, input: bool) -> std::io::Result<Option<TerminalGuard>> {
        use std::io::IsTerminal;
        let ttys: Vec<RawFd> = [0, 1, 2]
            .into_iter()
            .filter(|&fd| fd != 0 || input)
            .filter(|&fd| {
                // SAFETY: the standard descriptors, borrowed for the check.
                unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.is_terminal()
            })
            .collect();
        if ttys.is_empty() {
            return Ok(None);
        }
        let dup = |fd: RawFd| -> std::io::Result<OwnedFd> {
            let d = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3))?;
            // SAFETY: fcntl just made it; nothing else owns it.
            Ok(unsafe { OwnedFd::from_raw_fd(d) })
        };
        // Output goes where the caller sees it: standard output, else standard error, else
        // the terminal standard input is.
        let out_fd = [1, 2, 0]
            .into_iter()
            .find(|fd| ttys.contains(fd))
            .unwrap_or(0);
        let terminal = dup(out_fd)?;
        // SAFETY: TIOCGWINSZ reads one `winsize` into ours.
        let ws = unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            libc::ioctl(terminal.as_raw_fd(), libc::TIOCGWINSZ, &mut ws);
            ws
        };
        let winsize = nix::pty::Winsize {
            ws_row: ws.ws_row,
            ws_col: ws.ws_col,
            ws_xpixel: ws.ws_xpixel,
            ws_ypixel: ws.ws_ypixel,
        };
        let pty = nix::pty::openpty(Some(&winsize), None)?;
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(
                fd.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )?;
        }
        if relay == Relay::Lines {
            let mut t = termios::tcgetattr(&pty.slave)?;
            use termios::{InputFlags as I, LocalFlags as L, OutputFlags as O};
            t.local_flags
                .remove(L::ECHO | L::ECHOE | L::ECHOK | L::ECHONL | L::ISIG | L::IEXTEN);
            t.local_flags.insert(L::ICANON);
            t.input_flags
                .remove(I::ICRNL | I::IXON | I::INLCR | I::IGNCR);
            t.output_flags.remove(O::OPOST);
            termios::tcsetattr(&pty.slave, SetArg::TCSANOW, &t)?;
        }
        let raw = (relay == Relay::Full && ttys.contains(&0)).then(RawMode::enter);
        let to = std::fs::File::from(dup(out_fd)?);
        let from = std::fs::File::from(pty.master.try_clone()?);
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            quiet_thread();
            relay_out(from, to);
            let _ = done_tx.send(());
        });
        let stop_input = if ttys.contains(&0) {
            let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
            let input = std::fs::File::from(dup(0)?);
            let master = std::fs::File::from(pty.master.try_clone()?);
            std::thread::spawn(move || {
                quiet_thread();
                relay_in(input, master, stop_r, relay)
            });
            Some(stop_w)
        } else {
            None
        };
        Ok(Some(TerminalGuard {
            ttys,
            slave: Some(pty.slave),
            master: pty.master,
            terminal,
            output: Some(done),
            stop_input,
            raw,
            relay,
        }))
    }

    /// Give `cmd` this terminal in place of each of the caller's: read-write with the input,
    /// write-only (a new open, `O_NOCTTY`) for output alone.
    pub fn apply(&self, cmd: &mut std::process::Command) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let Some(slave) = &self.slave else {
            return Ok(());
        };
        let input = self.ttys.contains(&0);
        let side = || -> std::io::Result<std::fs::File> {
            if input {
                Ok(std::fs::File::from(slave.try_clone()?))
            } else {
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOCTTY)
                    .open(format!("/proc/self/fd/{}", slave.as_raw_fd()))
            }
        };
        for &fd in &self.ttys {
            match fd {
                0 => cmd.stdin(std::fs::File::from(slave.try_clone()?)),
                1 => cmd.stdout(side()?),
                _ => cmd.stderr(side()?),
            };
        }
        Ok(())
    }

    /// The sandbox has its side: aisb's copy closes, so that the output ends when the
    /// sandbox's does.
    pub fn spawned(&mut self) {
        self.slave = None;
    }

    /// What keeps the sandbox's window size in step with the caller's (at SIGWINCH).
    pub fn resizer(&self) -> Resizer {
        Resizer {
            terminal: self.terminal.as_raw_fd(),
            master: self.master.as_raw_fd(),
        }
    }

    /// Whether the sandbox's standard input is this terminal in [`Relay::Full`]: its first
    /// process must then take it as its controlling terminal.
    pub fn controls_input(&self) -> bool {
        self.relay == Relay::Full && self.ttys.contains(&0)
    }

    /// Wait (a few seconds at most) for the sandbox's last output to reach the caller's
    /// terminal, and give the terminal its mode back.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.slave = None;
        // What the user types from now on is theirs, not the sandbox's.
        self.stop_input.take();
        if let Some(done) = self.output.take() {
            let _ = done.recv_timeout(Duration::from_secs(5));
        }
        self.raw.take();
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        self.end();
    }
}

/// A relay thread takes no signal meant for the process: aisb waits for those on a thread of
/// its own (`sigwait`), and one landing here would act with its default (end aisb, or be lost).
fn quiet_thread() {
    let _ = nix::sys::signal::SigSet::all().thread_block();
}

/// In the sandbox's first process, between fork and exec: a session of its own whose
/// controlling terminal is the one on 0 ([`Relay::Full`]). Async-signal-safe.
pub fn take_controlling_terminal() -> std::io::Result<()> {
    nix::unistd::setsid()?;
    // SAFETY: TIOCSCTTY on descriptor 0 with no argument to steal.
    if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What the caller types, to the sandbox's terminal, until `stop` is closed. In
/// [`Relay::Lines`] an end of file typed on the caller's terminal (^D) is one there too.
fn relay_in(mut input: std::fs::File, mut master: std::fs::File, stop: OwnedFd, relay: Relay) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut buf = [0u8; 4096];
    loop {
        let mut fds = [
            PollFd::new(input.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
        if fds[1].any() != Some(false) {
            return;
        }
        // The caller's terminal went away: nothing more will be typed (and a read would end
        // at once, again and again).
        let hung_up = fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR));
        match input.read(&mut buf) {
            Ok(0) if relay == Relay::Lines => {
                // VEOF at the start of a line: the reader inside gets its end of file.
                if master.write_all(&[0x04]).is_err() || hung_up {
                    return;
                }
            }
            Ok(0) => return,
            Ok(n) => {
                if master.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// What the sandbox prints, made safe for the caller's terminal: the escape sequences that
/// write the host's clipboard (OSC 52, iTerm2's OSC 1337, kitty's OSC 5522), make the
/// terminal answer back with text the sandbox chose or the screen holds (title reports
/// `CSI 20 t`/`CSI 21 t`, DECRQCRA, colour queries, DECRQSS, XTGETTCAP), define keys
/// (DECUDK), reach the host's files (kitty graphics from a file or shared memory), or carry
/// any of these past the filter (tmux and screen pass-through) are dropped; everything a
/// full-screen program draws with (cursor movement, colours, modes, titles, hyperlinks, the
/// cursor position and device reports TUIs wait for, sixel and kitty graphics sent inline)
/// passes byte for byte.
///
/// An allowlist for the string sequences (OSC, DCS, APC; SOS and PM never pass), a denylist
/// for the rest. It parses as a terminal does (DEC's state machine): controls inside an escape
/// sequence are executed where they stand and do not end it, parameters are numbers, C1
/// controls raw or UTF-8 encoded are their 7-bit escapes, and a malformed UTF-8 sequence is
/// dropped (a terminal not in UTF-8 would read a C1 in it). Streaming: a sequence split
/// across reads is judged whole, and what it holds to judge is bounded ([`SEQ_MAX`]).
#[derive(Default)]
pub struct Sanitizer {
    st: St,
    /// A CSI's parameters, an OSC's number (and a colour OSC's payload), a DCS's parameters,
    /// an escape's intermediates, kitty graphics' control data.
    seq: Vec<u8>,
    /// A UTF-8 sequence being read, and how many more bytes it needs.
    utf8: [u8; 4],
    utf8_len: usize,
    utf8_need: usize,
    /// Whether anything but plain text passed (the terminal may be left in a mode).
    escaped: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum St {
    #[default]
    Ground,
    Esc,
    /// `ESC` and intermediates (`ESC ( B`, `ESC # 8`).
    EscInter,
    Csi,
    CsiDrop,
    OscNum,
    Dcs,
    Apc,
    /// kitty graphics' control data (`ESC _ G keys ;`).
    Kitty,
    Str(Keep),
    /// An ESC inside a string: `\` ends it (ST), anything else aborts it.
    StrEsc(Keep),
}

/// What happens to a string sequence's body.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Keep {
    Pass,
    /// Held until its end: passed unless it is a query (`?`).
    Hold,
    Drop,
}

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;
const DEL: u8 = 0x7f;
/// The most bytes held to judge one sequence; a longer one is dropped.
pub const SEQ_MAX: usize = 512;

/// What ends the output of a sandbox that used escapes: an open string aborted, then the
/// modes a program may leave on put back (attributes, character set, cursor shown, mouse
/// and bracketed paste off, kitty's keyboard flags popped, the main screen), so that what aisb
/// prints after it is seen as written.
pub const RESET: &[u8] =
    b"\x18\x1b[0m\x1b(B\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\x1b[<u\x1b[?1049l";

/// OSCs that pass as they stream: titles, the working directory, hyperlinks, notifications
/// and progress (9), shell integration marks.
fn osc_passes(n: u32) -> bool {
    matches!(n, 0 | 1 | 2 | 7 | 8 | 9 | 133 | 633)
}

/// Colour OSCs: setting and resetting pass, a query (`?`, answered into the sandbox's input)
/// does not.
fn osc_colour(n: u32) -> bool {
    matches!(n, 4 | 5 | 10..=19 | 104 | 105 | 110..=119)
}

/// A C0 control a terminal executes in the middle of an escape sequence.
fn executed(b: u8) -> bool {
    matches!(b, 0x00..=0x17 | 0x19 | 0x1c..=0x1f)
}

/// The first parameter of a CSI as a terminal reads it (decimal, leading zeros and
/// sub-parameters allowed, empty is 0), with whether it had a private marker (`<=>?`) or
/// intermediates.
fn csi_first(seq: &[u8]) -> (u64, bool, &[u8]) {
    let private = seq.first().is_some_and(|c| (0x3c..=0x3f).contains(c));
    let inter_at = seq
        .iter()
        .position(|c| (0x20..=0x2f).contains(c))
        .unwrap_or(seq.len());
    let params = &seq[usize::from(private)..inter_at];
    let first = params
        .split(|&c| c == b';')
        .next()
        .unwrap_or_default()
        .split(|&c| c == b':')
        .next()
        .unwrap_or_default();
    let n = first
        .iter()
        .filter(|d| d.is_ascii_digit())
        .fold(0u64, |n, d| {
            n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
        });
    (n, private, &seq[inter_at..])
}

/// kitty graphics with the image inline (`t=d`, the default) or none: a file, temporary file
/// or shared-memory name would have the terminal open (and remove) something on the host.
fn kitty_inline(keys: &[u8]) -> bool {
    keys.split(|&c| c == b',')
        .all(|kv| !kv.starts_with(b"t=") || kv == b"t=d")
}

impl Sanitizer {
    /// Append to `out` what of `input` may reach the terminal.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            if self.utf8_need > 0 {
                if (0x80..=0xbf).contains(&b) {
                    self.utf8[self.utf8_len] = b;
                    self.utf8_len += 1;
                    self.utf8_need -= 1;
                    if self.utf8_need == 0 {
                        let (bytes, len) = (self.utf8, self.utf8_len);
                        self.utf8_len = 0;
                        if len == 2 && bytes[0] == 0xc2 && bytes[1] <= 0x9f {
                            // U+0080..U+009F: a C1 control.
                            self.c1(bytes[1], out);
                        } else {
                            for &x in &bytes[..len] {
                                self.byte(x, out);
                            }
                        }
                    }
                    continue;
                }
                // Malformed: what it held is dropped.
                self.utf8_len = 0;
                self.utf8_need = 0;
            }
            let need = match b {
                0xc2..=0xdf => 1,
                0xe0..=0xef => 2,
                0xf0..=0xf4 => 3,
                _ => 0,
            };
            if need > 0 {
                self.utf8[0] = b;
                self.utf8_len = 1;
                self.utf8_need = need;
            } else if (0x80..=0x9f).contains(&b) {
                self.c1(b, out);
            } else if b < 0x80 {
                self.byte(b, out);
            }
            // Any other byte (a stray continuation byte, 0xc0, 0xc1, 0xf5..) is not UTF-8.
        }
    }

    /// After the last output: put the terminal back if the sandbox used escapes (see
    /// [`RESET`]).
    pub fn end(&mut self, out: &mut Vec<u8>) {
        if self.escaped || self.st != St::Ground {
            out.extend_from_slice(RESET);
        }
        *self = Sanitizer::default();
    }

    /// A C1 control is its 7-bit escape (0x9B is `ESC [`, 0x9C is ST).
    fn c1(&mut self, b: u8, out: &mut Vec<u8>) {
        self.byte(ESC, out);
        self.byte(b - 0x40, out);
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.st {
            St::Ground if b == ESC => {
                self.st = St::Esc;
                self.escaped = true;
            }
            St::Ground => out.push(b),
            St::Esc => {
                self.seq.clear();
                self.st = match b {
                    // Executed (or, DEL, ignored) without ending the escape.
                    _ if executed(b) => {
                        out.push(b);
                        St::Esc
                    }
                    DEL => St::Esc,
                    b'[' => St::Csi,
                    b']' => St::OscNum,
                    b'P' => St::Dcs,
                    b'_' => St::Apc,
                    b'X' | b'^' => St::Str(Keep::Drop),
                    ESC => St::Esc,
                    // A lone ST ends nothing (what it ended was dropped).
                    CAN | SUB | b'\\' => St::Ground,
                    0x20..=0x2f => {
                        self.seq.push(b);
                        St::EscInter
                    }
                    _ => {
                        out.extend([ESC, b]);
                        St::Ground
                    }
                };
            }
            St::EscInter => match b {
                _ if executed(b) => out.push(b),
                DEL => {}
                0x20..=0x2f if self.seq.len() < SEQ_MAX => self.seq.push(b),
                0x30..=0x7e => {
                    out.push(ESC);
                    out.extend_from_slice(&self.seq);
                    out.push(b);
                    self.st = St::Ground;
                }
                ESC => self.st = St::Esc,
                _ => self.st = St::Ground,
            },
            St::Csi => match b {
                0x40..=0x7e => {
                    self.st = St::Ground;
                    let (first, private, inter) = csi_first(&self.seq);
                    // Window title and icon label reports (the terminal types back text the
                    // sandbox set) and DECRQCRA (a checksum of any screen cell: the screen
                    // read back).
                    let report =
                        (b == b't' && !private && inter.is_empty() && matches!(first, 20 | 21))
                            || (b == b'y' && inter.contains(&b'*'));
                    if !report {
                        out.extend([ESC, b'[']);
                        out.extend_from_slice(&self.seq);
                        out.push(b);
                    }
                }
                ESC => self.st = St::Esc,
                CAN | SUB => self.st = St::Ground,
                // Executed where they stand, as the terminal would; DEL is ignored.
                _ if executed(b) => out.push(b),
                DEL => {}
                0x20..=0x3f if self.seq.len() < SEQ_MAX => self.seq.push(b),
                _ => self.st = St::CsiDrop,
            },
            St::CsiDrop => match b {
                0x40..=0x7e | CAN | SUB => self.st = St::Ground,
                ESC => self.st = St::Esc,
                _ => {}
            },
            St::OscNum => match b {
                b'0'..=b'9' if self.seq.len() < 6 => self.seq.push(b),
                _ => {
                    let n: u32 = std::str::from_utf8(&self.seq)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(u32::MAX);
                    if b == b';' {
                        self.seq.push(b);
                        self.st = if osc_passes(n) {
                            out.extend([ESC, b']']);
                            out.extend_from_slice(&self.seq);
                            St::Str(Keep::Pass)
                        } else if osc_colour(n) {
                            St::Str(Keep::Hold)
                        } else {
                            St::Str(Keep::Drop)
                        };
                    } else if matches!(b, BEL | ESC) && (osc_passes(n) || osc_colour(n)) {
                        // A number alone (`OSC 104 BEL` resets the colours).
                        out.extend([ESC, b']']);
                        out.extend_from_slice(&self.seq);
                        self.st = St::Str(Keep::Pass);
                        self.byte(b, out);
                    } else {
                        self.st = St::Str(Keep::Drop);
                        self.byte(b, out);
                    }
                }
            },
            St::Dcs => match b {
                0x20..=0x3f if self.seq.len() < SEQ_MAX => self.seq.push(b),
                // Sixel graphics alone: `DCS params q`, no intermediates.
                b'q' if !self.seq.iter().any(|c| (0x20..=0x2f).contains(c)) => {
                    out.extend([ESC, b'P']);
                    out.extend_from_slice(&self.seq);
                    out.push(b);
                    self.st = St::Str(Keep::Pass);
                }
                0x40..=0x7e => self.st = St::Str(Keep::Drop),
                _ => {
                    self.st = St::Str(Keep::Drop);
                    self.byte(b, out);
                }
            },
            // kitty's graphics protocol alone.
            St::Apc if b == b'G' => self.st = St::Kitty,
            St::Apc => {
                self.st = St::Str(Keep::Drop);
                self.byte(b, out);
            }
            St::Kitty => match b {
                b';' | BEL | ESC if kitty_inline(&self.seq) => {
                    out.extend([ESC, b'_', b'G']);
                    out.extend_from_slice(&self.seq);
                    self.st = St::Str(Keep::Pass);
                    self.byte(b, out);
                }
                b';' | BEL | ESC => {
                    self.st = St::Str(Keep::Drop);
                    self.byte(b, out);
                }
                _ if self.seq.len() < SEQ_MAX => self.seq.push(b),
                _ => self.st = St::Str(Keep::Drop),
            },
            St::Str(k) => match b {
                BEL => self.end_string(k, &[BEL], out),
                ESC => self.st = St::StrEsc(k),
                CAN | SUB => {
                    if k == Keep::Pass {
                        out.push(b);
                    }
                    self.st = St::Ground;
                }
                _ => match k {
                    Keep::Pass => out.push(b),
                    Keep::Hold if self.seq.len() < SEQ_MAX => self.seq.push(b),
                    Keep::Hold => self.st = St::Str(Keep::Drop),
                    Keep::Drop => {}
                },
            },
            St::StrEsc(k) if b == b'\\' => self.end_string(k, &[ESC, b'\\'], out),
            // Aborted: the terminal reads the ESC as the start of the next sequence.
            St::StrEsc(_) => {
                self.st = St::Esc;
                self.byte(b, out);
            }
        }
    }

    fn end_string(&mut self, k: Keep, terminator: &[u8], out: &mut Vec<u8>) {
        match k {
            Keep::Pass => out.extend_from_slice(terminator),
            Keep::Hold if !self.seq.contains(&b'?') => {
                out.extend([ESC, b']']);
                out.extend_from_slice(&self.seq);
                out.extend_from_slice(terminator);
            }
            Keep::Hold | Keep::Drop => {}
        }
        self.st = St::Ground;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(chunks: &[&[u8]]) -> Vec<u8> {
        let mut s = Sanitizer::default();
        let mut out = Vec::new();
        for c in chunks {
            s.feed(c, &mut out);
        }
        out
    }

    fn whole(b: &[u8]) -> Vec<u8> {
        clean(&[b])
    }

    /// Each of `seqs`, between two letters, leaves the two letters alone, however it is split.
    fn assert_dropped(seqs: &[&[u8]]) {
        for seq in seqs {
            assert_eq!(
                every_split(&[&b"a"[..], seq, b"b"].concat()),
                b"ab",
                "{seq:?}"
            );
        }
    }

    /// Every split of `b` into two reads judges it as a whole.
    fn every_split(b: &[u8]) -> Vec<u8> {
        let all = whole(b);
        for i in 0..=b.len() {
            assert_eq!(clean(&[&b[..i], &b[i..]]), all, "split at {i}: {b:?}");
        }
        all
    }

    #[test]
    fn the_clipboard_is_never_written() {
        assert_dropped(&[
            &b"\x1b]52;c;aGVsbG8=\x07"[..],
            b"\x1b]52;c;aGVsbG8=\x1b\\",
            b"\x1b]52;c;?\x07",
            b"\xc2\x9d52;c;aGVsbG8=\xc2\x9c",
            b"\x9d52;c;aGVsbG8=\x9c",
            b"\x1b]1337;Copy=;aGk=\x07",
            b"\x1b]5522;type=write\x07",
            // tmux's and screen's pass-through would carry it out whole.
            b"\x1bPtmux;\x1b\x1b]52;c;aGk=\x07\x1b\\",
        ]);
    }

    #[test]
    fn nothing_makes_the_terminal_type_back_chosen_text() {
        assert_dropped(&[
            &b"\x1b[21t"[..],
            b"\x1b[20t",
            b"\xc2\x9b21t",
            b"\x1b]11;?\x07",
            b"\x1b]4;1;?\x1b\\",
            b"\x1bP$qm\x1b\\",
            b"\x1bP+q544e\x1b\\",
            b"\x1bP0;1|17/ab\x1b\\",
            b"\x1bX anything \x1b\\",
            b"\x1b^ anything \x1b\\",
            b"\x1b_ not kitty \x1b\\",
        ]);
    }

    /// Every blocked sequence with a C0 control (executed by the terminal without ending the
    /// escape) or DEL (ignored) after each of its ESCs, and with parameters a terminal reads
    /// as the same number.
    #[test]
    fn controls_inside_an_escape_and_odd_parameters_change_nothing() {
        let blocked: &[&[u8]] = &[
            b"\x1b]52;c;aGk=\x07",
            b"\x1b]52;c;aGk=\x1b\\",
            b"\x1b]1337;Copy=;aGk=\x07",
            b"\x1b[21t",
            b"\x1b]11;?\x07",
            b"\x1bP$qm\x1b\\",
            b"\x1bP+q544e\x1b\\",
            b"\x1bX x \x1b\\",
            b"\x1b]0;x\x1b]52;c;aGk=\x07",
        ];
        let clean_of = |out: &[u8]| {
            !String::from_utf8_lossy(out).contains("52;c")
                && !String::from_utf8_lossy(out).contains("1337")
                && !String::from_utf8_lossy(out).contains("[21t")
                && !String::from_utf8_lossy(out).contains("11;?")
                && !String::from_utf8_lossy(out).contains("$q")
                && !String::from_utf8_lossy(out).contains("+q")
                && !String::from_utf8_lossy(out).contains(" x ")
        };
        let mut inserts: Vec<u8> = (0x00..=0x1fu8)
            .filter(|&c| !matches!(c, 0x18 | 0x1a | 0x1b))
            .collect();
        inserts.push(0x7f);
        for seq in blocked {
            for &c in &inserts {
                let mut bytes = Vec::new();
                for &b in *seq {
                    bytes.push(b);
                    if b == 0x1b {
                        bytes.push(c);
                    }
                }
                let out = every_split(&bytes);
                assert!(clean_of(&out), "{bytes:?} -> {out:?}");
            }
        }
        assert_dropped(&[
            &b"\x1b[021t"[..],
            b"\x1b[0021;0t",
            b"\x1b[2\x7f1t",
            b"\x1b[21:0t",
            b"\x1b[20;1t",
            b"\x1b[1;1;1;1;1;1*y",
            b"\x1b_Ga=t,t=s;L2Rldi9zaG0=\x1b\\",
            b"\x1b_Ga=T,t=f;L2V0Yy9wYXNzd2Q=\x1b\\",
            b"\x1b_Gt=t\x1b\\",
            b"\x1b]9999;x\x07",
        ]);
        // Not a report: the private form, and a size report.
        for seq in [&b"\x1b[?21t"[..], b"\x1b[18t"] {
            assert_eq!(every_split(seq), seq);
        }
    }

    #[test]
    fn malformed_utf8_never_hides_a_c1_control() {
        // 0x9D inside a malformed sequence is OSC to a terminal not in UTF-8.
        let out = every_split(b"\xe2\x9d52;c;aGk=\x07");
        assert!(!out.contains(&0x9d) && !out.contains(&0x1b), "{out:?}");
        assert_eq!(whole(b"a\xff\xc0\xbfb"), b"ab");
    }

    #[test]
    fn colour_resets_pass_and_the_end_puts_the_terminal_back() {
        for seq in [
            &b"\x1b]104\x07"[..],
            b"\x1b]112\x1b\\",
            b"\x1b]9;4;1;50\x07",
        ] {
            assert_eq!(every_split(seq), seq);
        }
        let mut s = Sanitizer::default();
        let mut out = Vec::new();
        s.feed(b"plain\n", &mut out);
        s.end(&mut out);
        assert_eq!(out, b"plain\n", "plain text needs no reset");
        let mut out = Vec::new();
        s.feed(b"\x1b[8m\x1b]2;open title", &mut out);
        s.end(&mut out);
        assert!(
            out.ends_with(RESET) && RESET.starts_with(b"\x18\x1b[0m"),
            "{out:?}"
        );
    }

    #[test]
    fn what_programs_draw_with_passes_unchanged() {
        let screen = [
            &b"plain text, UTF-8 \xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \xc2\xa0nbsp\r\n"[..],
            b"\x1b[2J\x1b[H\x1b[1;31mred\x1b[0m\x1b[?1049h\x1b[?25l\x1b[5;10H",
            b"\x1b[6n\x1b[c\x1b[>c\x1b[18t\x1b[22;2t\x1b[23;2t",
            b"\x1b]0;my title\x07\x1b]2;t\x1b\\\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\",
            b"\x1b]133;A\x07\x1b]11;#000000\x07\x1b]4;1;rgb:ff/00/00\x1b\\",
            b"\x1b(B\x1b)0\x1b7\x1b8\x1bM\x1b=\x1b>",
            b"\x1bPq#0;2;0;0;0#0~~@@vv@@~~\x1b\\",
            b"\x1b_Gf=100,a=T;AAAA\x1b\\",
        ]
        .concat();
        assert_eq!(every_split(&screen), screen);
    }

    #[test]
    fn an_aborted_or_endless_sequence_does_not_swallow_what_follows() {
        // An OSC 52 cut off by a new sequence: the new one still draws.
        assert_eq!(whole(b"\x1b]52;c;aGk=\x1b[1mB"), b"\x1b[1mB");
        // A title cut off by CAN: the terminal aborts it too.
        assert_eq!(whole(b"\x1b]0;t\x18x"), b"\x1b]0;t\x18x");
        // A held colour OSC or a CSI past the bound is dropped whole, and the bound holds.
        let long = [&b"\x1b]11;"[..], &[b'a'; 4 * SEQ_MAX], b"\x07ok"].concat();
        assert_eq!(whole(&long), b"ok");
        let long = [&b"\x1b["[..], &[b'1'; 4 * SEQ_MAX], b"mok"].concat();
        assert_eq!(whole(&long), b"ok");
        let mut s = Sanitizer::default();
        let mut out = Vec::new();
        s.feed(b"\x1b]11;", &mut out);
        for _ in 0..1000 {
            s.feed(&[b'x'; 1024], &mut out);
        }
        assert!(s.seq.len() <= SEQ_MAX && out.is_empty());
    }
}
