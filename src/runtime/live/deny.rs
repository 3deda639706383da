//! The reporting layer of masks: a tiny FUSE file system, served by the mask helper, whose
//! every file stands for one masked path and refuses every open with `EACCES` ("Permission
//! denied", as the mask below it does), and says so in the audit log: which path, what was
//! tried, by which process, under which rule.
//!
//! Why FUSE: the kernel refuses an open of the mask's mode-0000 file before any notification
//! (inotify and fanotify report only what their permission checks let through), and fanotify
//! permission events need the initial namespace's `CAP_SYS_ADMIN`; a FUSE file system can be
//! mounted by the owner of a user namespace (Linux 4.18), so it serves root and an ordinary user
//! alike, on both backends. Only masked paths are behind it: opens of anything else never reach
//! it (no cost for them).
//!
//! Where it sits: mounted on the sandbox's `/run/aisb/deny` (an empty directory made for it), its
//! file `N` is bound *on top of* mask N, whose own mount stays below. If this server dies, its
//! files answer `ENOTCONN`: still nothing readable (fail closed).
//!
//! Why not the `fuser` crate: it reads requests into a 16 MiB buffer per session (a sandbox's
//! whole host-side footprint is ~27 MiB), and this file system answers a dozen requests with
//! fixed replies; the protocol structs below are the kernel's (`include/uapi/linux/fuse.h`).
//!
//! What it cannot see: `execve` of a masked file is refused by the kernel from its mode alone,
//! before a request (reported as nothing); a process that opened a file before its mask landed
//! keeps reading it (see the live layer).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::io::Errno;

/// The root directory's inode (the kernel's `FUSE_ROOT_ID`).
const ROOT: u64 = 1;
/// Mask `N` is inode `FIRST + N`.
const FIRST: u64 = 2;

const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const DESTROY: u32 = 38;
    pub const BATCH_FORGET: u32 = 42;
    pub const RENAME2: u32 = 45;
    pub const TMPFILE: u32 = 51;
}

/// One masked path as the sandbox names it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: String,
    pub dir: bool,
    pub rule: String,
}

/// The masks, by index (shared with the helper's request loop, which adds them).
pub type Table = Arc<Mutex<Vec<Entry>>>;

/// One refused attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// `read`, `write`, `read-write`, `list`, `lookup`, `create`, `change`.
    pub op: &'static str,
    pub target: String,
    /// The mask's own path (`target` is a name below it for a directory's lookups).
    pub mask: String,
    pub rule: String,
    /// As the host sees it (the connection's pid namespace is the helper's, the host's).
    pub pid: u32,
    /// Its command line, read while it waits for the answer (filled in by [`serve`]).
    pub command: String,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_ne_bytes(a)
    })
}

/// The owner every node shows, as the mounter's user namespace numbers it (an id that
/// namespace does not map would make the kernel refuse writes before they reach us, unseen).
static OWNER: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// The process allowed to look names up in the root (the helper, which binds them): the
/// sandbox sees the directory, but opening its files would report attempts on paths it never
/// tried. Unset (the unit tests): anyone.
static BINDER: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// `struct fuse_attr` (88 bytes): a directory of mode 0555 or a file of mode 0000, empty,
/// owned by [`OWNER`].
fn attr(ino: u64, dir: bool) -> Vec<u8> {
    let (uid, gid) = OWNER.get().copied().unwrap_or((0, 0));
    let mut a = Vec::with_capacity(88);
    a.extend_from_slice(&ino.to_ne_bytes());
    a.extend_from_slice(&0u64.to_ne_bytes()); // size
    a.extend_from_slice(&0u64.to_ne_bytes()); // blocks
    a.extend_from_slice(&[0u8; 24]); // atime, mtime, ctime
    a.extend_from_slice(&[0u8; 12]); // their nanoseconds
    let mode: u32 = if dir { 0o040555 } else { 0o100000 };
    a.extend_from_slice(&mode.to_ne_bytes());
    a.extend_from_slice(&(if dir { 2u32 } else { 1 }).to_ne_bytes()); // nlink
    a.extend_from_slice(&uid.to_ne_bytes());
    a.extend_from_slice(&gid.to_ne_bytes());
    a.extend_from_slice(&0u32.to_ne_bytes()); // rdev
    a.extend_from_slice(&4096u32.to_ne_bytes()); // blksize
    a.extend_from_slice(&0u32.to_ne_bytes()); // flags
    a
}

/// How long the kernel may keep a name's answer and an inode's attributes: they never change.
const VALID_SECS: u64 = 3600;

/// `struct fuse_entry_out` (128 bytes). The name is valid for no time: every later walk
/// through it asks again (and only the binder gets an answer).
fn entry_out(ino: u64, dir: bool) -> Vec<u8> {
    let mut e = Vec::with_capacity(128);
    e.extend_from_slice(&ino.to_ne_bytes());
    e.extend_from_slice(&0u64.to_ne_bytes()); // generation
    e.extend_from_slice(&0u64.to_ne_bytes()); // entry_valid
    e.extend_from_slice(&VALID_SECS.to_ne_bytes());
    e.extend_from_slice(&[0u8; 8]); // nanoseconds of both
    e.extend(attr(ino, dir));
    e
}

/// `struct fuse_dirent` entries `.` and `..` from `offset` on, within `size` bytes.
fn dot_entries(ino: u64, offset: u64, size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, name) in [(1u64, "."), (2, "..")] {
        if i <= offset {
            continue;
        }
        let mut d = Vec::new();
        d.extend_from_slice(&(if i == 1 { ino } else { ROOT }).to_ne_bytes());
        d.extend_from_slice(&i.to_ne_bytes());
        d.extend_from_slice(&(name.len() as u32).to_ne_bytes());
        d.extend_from_slice(&4u32.to_ne_bytes()); // DT_DIR
        d.extend_from_slice(name.as_bytes());
        while d.len() % 8 != 0 {
            d.push(0);
        }
        if out.len() + d.len() > size {
            break;
        }
        out.extend(d);
    }
    out
}

/// What a node is: the root, mask `i`, or nothing known.
enum Node {
    Root,
    Mask(Entry),
    Unknown,
}

fn node(table: &Table, nodeid: u64) -> Node {
    if nodeid == ROOT {
        return Node::Root;
    }
    let Some(i) = nodeid.checked_sub(FIRST) else {
        return Node::Unknown;
    };
    let t = table.lock().unwrap_or_else(|e| e.into_inner());
    usize::try_from(i)
        .ok()
        .and_then(|i| t.get(i).cloned())
        .map_or(Node::Unknown, Node::Mask)
}

/// The name a request carries (NUL-terminated), lossily.
fn name_in(body: &[u8]) -> String {
    let end = body.iter().position(|b| *b == 0).unwrap_or(body.len());
    String::from_utf8_lossy(&body[..end.min(4096)]).into_owned()
}

/// The answer to one request: `None` for those that get none (forget, interrupt); the errno
/// (positive) or the payload; and the denial to report.
fn answer(
    table: &Table,
    opcode: u32,
    nodeid: u64,
    pid: u32,
    body: &[u8],
) -> (Option<Result<Vec<u8>, i32>>, Option<Denial>) {
    let deny = |e: &Entry, op: &'static str, child: Option<&str>| Denial {
        op,
        target: match child {
            Some(c) => format!("{}/{c}", e.path.trim_end_matches('/')),
            None => e.path.clone(),
        },
        mask: e.path.clone(),
        rule: e.rule.clone(),
        pid,
        command: String::new(),
    };
    let n = node(table, nodeid);
    let eacces = libc::EACCES;
    match opcode {
        op::FORGET | op::BATCH_FORGET | op::INTERRUPT => (None, None),
        op::INIT => {
            let kernel_minor = u32_at(body, 4);
            let readahead = u32_at(body, 8);
            let mut o = Vec::with_capacity(64);
            o.extend_from_slice(&7u32.to_ne_bytes());
            o.extend_from_slice(&kernel_minor.min(31).to_ne_bytes());
            o.extend_from_slice(&readahead.to_ne_bytes());
            o.extend_from_slice(&0u32.to_ne_bytes()); // flags: nothing asked for
            o.extend_from_slice(&16u16.to_ne_bytes()); // max_background
            o.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
            o.extend_from_slice(&4096u32.to_ne_bytes()); // max_write
            o.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
            o.resize(64, 0);
            (Some(Ok(o)), None)
        }
        op::LOOKUP => {
            let name = name_in(body);
            match n {
                Node::Root if BINDER.get().is_some_and(|b| *b != pid) => {
                    (Some(Err(libc::ENOENT)), None)
                }
                Node::Root => {
                    let found = name
                        .parse::<u64>()
                        .ok()
                        .filter(|_| !name.starts_with('0') || name == "0")
                        .and_then(|i| {
                            let t = table.lock().unwrap_or_else(|e| e.into_inner());
                            usize::try_from(i)
                                .ok()
                                .and_then(|j| t.get(j).map(|e| (i, e.dir)))
                        });
                    match found {
                        Some((i, dir)) => (Some(Ok(entry_out(FIRST + i, dir))), None),
                        None => (Some(Err(libc::ENOENT)), None),
                    }
                }
                // A name below a masked directory: it holds nothing, and the attempt is told.
                Node::Mask(e) if e.dir => (
                    Some(Err(libc::ENOENT)),
                    Some(deny(&e, "lookup", Some(&name))),
                ),
                Node::Mask(_) => (Some(Err(libc::ENOTDIR)), None),
                Node::Unknown => (Some(Err(libc::ENOENT)), None),
            }
        }
        op::GETATTR => match n {
            Node::Root => {
                let mut o = Vec::with_capacity(104);
                o.extend_from_slice(&VALID_SECS.to_ne_bytes());
                o.extend_from_slice(&[0u8; 8]);
                o.extend(attr(ROOT, true));
                (Some(Ok(o)), None)
            }
            Node::Mask(e) => {
                let mut o = Vec::with_capacity(104);
                o.extend_from_slice(&VALID_SECS.to_ne_bytes());
                o.extend_from_slice(&[0u8; 8]);
                o.extend(attr(nodeid, e.dir));
                (Some(Ok(o)), None)
            }
            Node::Unknown => (Some(Err(libc::ENOENT)), None),
        },
        op::OPEN => match n {
            Node::Mask(e) if !e.dir => {
                let flags = u32_at(body, 0) as i32;
                let what = match flags & libc::O_ACCMODE {
                    libc::O_RDONLY => "read",
                    libc::O_WRONLY => "write",
                    _ => "read-write",
                };
                (Some(Err(eacces)), Some(deny(&e, what, None)))
            }
            Node::Unknown => (Some(Err(libc::ENOENT)), None),
            _ => (Some(Err(libc::EISDIR)), None),
        },
        op::OPENDIR => match n {
            Node::Root => (Some(Ok(vec![0u8; 16])), None),
            // Listed as empty (as the mask below it is), and told.
            Node::Mask(e) if e.dir => (Some(Ok(vec![0u8; 16])), Some(deny(&e, "list", None))),
            Node::Mask(_) => (Some(Err(libc::ENOTDIR)), None),
            Node::Unknown => (Some(Err(libc::ENOENT)), None),
        },
        op::READDIR => {
            let offset = u64_at(body, 8);
            let size = u32_at(body, 16) as usize;
            (Some(Ok(dot_entries(nodeid, offset, size))), None)
        }
        op::RELEASE | op::RELEASEDIR | op::FLUSH | op::FSYNC | op::FSYNCDIR => {
            (Some(Ok(Vec::new())), None)
        }
        op::ACCESS => {
            let mask = u32_at(body, 0) as i32;
            let refused = match &n {
                Node::Mask(e) if !e.dir => mask != libc::F_OK,
                _ => mask & libc::W_OK != 0,
            };
            (
                Some(if refused { Err(eacces) } else { Ok(Vec::new()) }),
                None,
            )
        }
        op::STATFS => {
            let mut o = vec![0u8; 80];
            o[40..44].copy_from_slice(&4096u32.to_ne_bytes()); // bsize
            o[44..48].copy_from_slice(&255u32.to_ne_bytes()); // namelen
            o[48..52].copy_from_slice(&4096u32.to_ne_bytes()); // frsize
            (Some(Ok(o)), None)
        }
        op::SETATTR => match n {
            Node::Mask(e) => (Some(Err(eacces)), Some(deny(&e, "change", None))),
            _ => (Some(Err(eacces)), None),
        },
        op::CREATE | op::MKNOD | op::MKDIR | op::SYMLINK | op::LINK | op::TMPFILE => {
            // The name is last in each of these requests' bodies but for `symlink` (name,
            // then target) and `link` (its old node, then the name): the first NUL-ended
            // string after the fixed part is close enough for a report.
            let fixed = match opcode {
                op::CREATE | op::MKNOD | op::TMPFILE => 16,
                op::MKDIR => 8,
                op::LINK => 8,
                _ => 0,
            };
            let name = name_in(body.get(fixed..).unwrap_or_default());
            match n {
                Node::Mask(e) if e.dir => {
                    (Some(Err(eacces)), Some(deny(&e, "create", Some(&name))))
                }
                _ => (Some(Err(eacces)), None),
            }
        }
        op::UNLINK | op::RMDIR | op::RENAME | op::RENAME2 => match n {
            Node::Mask(e) if e.dir => (Some(Err(eacces)), Some(deny(&e, "change", None))),
            _ => (Some(Err(eacces)), None),
        },
        op::READLINK => (Some(Err(libc::EINVAL)), None),
        op::DESTROY => (Some(Ok(Vec::new())), None),
        _ => (Some(Err(libc::ENOSYS)), None),
    }
}

/// Repeats of one denial (same target and operation) within [`QUIET`] are counted, not
/// written; the count goes with the next one written, or alone once the quiet time is over.
const QUIET: Duration = Duration::from_secs(1);
/// How many distinct denials are tracked for that at once (a sandbox probing a million names
/// in a masked directory is then written in full, within the audit log's byte budget).
const TRACKED: usize = 4096;

struct Repeats {
    seen: HashMap<(String, &'static str), (Instant, u64, Denial)>,
}

impl Repeats {
    /// Whether `d` is to be written now, and how many attempts it then stands for (itself
    /// and the repeats counted before it).
    fn note(&mut self, d: &Denial) -> Option<u64> {
        // By mask and operation: names probed below a masked directory gather in one (a
        // million distinct names must not crowd everything else out of the log).
        let key = (d.mask.clone(), d.op);
        let now = Instant::now();
        match self.seen.get_mut(&key) {
            Some((at, n, _)) if now.duration_since(*at) < QUIET => {
                *n += 1;
                None
            }
            Some((at, n, last)) => {
                let with = *n + 1;
                *at = now;
                *n = 0;
                *last = d.clone();
                Some(with)
            }
            None => {
                if self.seen.len() >= TRACKED {
                    self.seen.retain(|_, (_, n, _)| *n > 0);
                    if self.seen.len() >= TRACKED {
                        return Some(1);
                    }
                }
                self.seen.insert(key, (now, 0, d.clone()));
                Some(1)
            }
        }
    }

    /// Denials whose quiet time is over (`all`: every one) with repeats not written yet.
    fn due(&mut self, all: bool) -> Vec<(Denial, u64)> {
        let now = Instant::now();
        let mut out = Vec::new();
        for (at, n, d) in self.seen.values_mut() {
            if *n > 0 && (all || now.duration_since(*at) >= QUIET) {
                out.push((d.clone(), *n));
                *n = 0;
                *at = now;
            }
        }
        self.seen
            .retain(|_, (at, n, _)| *n > 0 || now.duration_since(*at) < QUIET * 4);
        out
    }
}

/// Where denials go: written through `sink` (each with how many attempts it stands for, and
/// whether it gathers repeats after the fact), repeats counted in between.
/// Writes one event: a denial, how many attempts it stands for, whether it gathers repeats
/// after the fact.
type Sink = dyn Fn(&Denial, u64, bool) + Send + Sync;

/// `count` is how many attempts an event stands for: 1 for the first of its kind, then the
/// repeats of a quiet second gathered in one.
pub struct Reporter {
    repeats: Mutex<Repeats>,
    sink: Box<Sink>,
    describe: Box<dyn Fn(u32) -> String + Send + Sync>,
}

impl Reporter {
    /// `describe`: a process's command line from its pid (read before it gets its answer).
    pub fn new(
        sink: impl Fn(&Denial, u64, bool) + Send + Sync + 'static,
        describe: impl Fn(u32) -> String + Send + Sync + 'static,
    ) -> Arc<Reporter> {
        Arc::new(Reporter {
            repeats: Mutex::new(Repeats {
                seen: HashMap::new(),
            }),
            sink: Box::new(sink),
            describe: Box::new(describe),
        })
    }
    /// `d` is written now (its command line read first: the process still waits for its
    /// answer) or counted.
    fn note(&self, d: &mut Denial) {
        let write = self
            .repeats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(d);
        if let Some(n) = write {
            d.command = (self.describe)(d.pid);
            (self.sink)(d, n, false);
        }
    }
    fn due(&self, all: bool) {
        let due = self
            .repeats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .due(all);
        for (d, n) in due {
            (self.sink)(&d, n, true);
        }
    }
    /// Write the repeats counted and not written yet (the run is ending).
    pub fn flush(&self) {
        self.due(true);
    }
}

/// Serve the file system on `fuse` until it is unmounted (or the connection aborted); each
/// denial goes to `reporter`. `owner`: the ids it was mounted with (`user_id`, `group_id`).
pub fn serve(
    fuse: OwnedFd,
    table: Table,
    reporter: Arc<Reporter>,
    owner: (u32, u32),
) -> std::io::Result<()> {
    let _ = OWNER.set(owner);
    let _ = BINDER.set(std::process::id());
    use rustix::event::{poll, PollFd, PollFlags};
    // FUSE_MIN_READ_BUFFER is 8 KiB; writes never come (every open is refused).
    let mut buf = vec![0u8; 64 << 10];
    let tick = rustix::time::Timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    loop {
        let mut fds = [PollFd::new(&fuse, PollFlags::IN)];
        match poll(&mut fds, Some(&tick)) {
            Ok(0) => {
                reporter.due(false);
                continue;
            }
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        let n = match rustix::io::read(&fuse, &mut buf) {
            Ok(n) => n,
            // ENOENT: the request was interrupted meanwhile.
            Err(Errno::INTR | Errno::AGAIN | Errno::NOENT) => continue,
            // Unmounted, or the sandbox's namespace is gone.
            Err(Errno::NODEV) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        if n < IN_HEADER {
            continue;
        }
        let req = &buf[..n];
        let opcode = u32_at(req, 4);
        let unique = u64_at(req, 8);
        let nodeid = u64_at(req, 16);
        let pid = u32_at(req, 32);
        let (reply, denial) = answer(&table, opcode, nodeid, pid, &req[IN_HEADER..]);
        // Told before the answer: the process waits for it, so its command line is still
        // there to read.
        if let Some(mut d) = denial {
            reporter.note(&mut d);
        }
        if let Some(reply) = reply {
            let (error, payload) = match reply {
                Ok(p) => (0i32, p),
                Err(e) => (-e, Vec::new()),
            };
            let mut out = Vec::with_capacity(OUT_HEADER + payload.len());
            out.extend_from_slice(&((OUT_HEADER + payload.len()) as u32).to_ne_bytes());
            out.extend_from_slice(&error.to_ne_bytes());
            out.extend_from_slice(&unique.to_ne_bytes());
            out.extend(payload);
            match rustix::io::write(fuse.as_fd(), &out) {
                // ENOENT: the request was interrupted and is gone.
                Ok(_) | Err(Errno::NOENT) => {}
                Err(Errno::NODEV) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        if opcode == op::DESTROY {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        Arc::new(Mutex::new(vec![
            Entry {
                path: "/p/.env".into(),
                dir: false,
                rule: "secrets.defaults \".env*\"".into(),
            },
            Entry {
                path: "/p/secrets".into(),
                dir: true,
                rule: "block \"secrets/\" at sandbox.kdl:1".into(),
            },
        ]))
    }

    #[test]
    fn opens_of_a_masked_file_are_refused_and_told() {
        let t = table();
        let (r, d) = answer(
            &t,
            op::OPEN,
            FIRST,
            42,
            &(libc::O_RDONLY as u32).to_ne_bytes(),
        );
        assert_eq!(r, Some(Err(libc::EACCES)));
        let d = d.unwrap();
        assert_eq!((d.op, d.target.as_str(), d.pid), ("read", "/p/.env", 42));
        let (_, d) = answer(
            &t,
            op::OPEN,
            FIRST,
            1,
            &((libc::O_WRONLY | libc::O_TRUNC) as u32).to_ne_bytes(),
        );
        assert_eq!(d.unwrap().op, "write");
    }

    #[test]
    fn a_masked_directory_lists_empty_and_tells_each_name_asked_for() {
        let t = table();
        let (r, d) = answer(&t, op::OPENDIR, FIRST + 1, 7, &[0u8; 8]);
        assert!(matches!(r, Some(Ok(_))));
        assert_eq!(d.unwrap().op, "list");
        let (r, d) = answer(&t, op::LOOKUP, FIRST + 1, 7, b"key.pem\0");
        assert_eq!(r, Some(Err(libc::ENOENT)));
        assert_eq!(d.unwrap().target, "/p/secrets/key.pem");
    }

    #[test]
    fn the_root_names_masks_by_index_only() {
        let t = table();
        let (r, _) = answer(&t, op::LOOKUP, ROOT, 1, b"1\0");
        let e = r.unwrap().unwrap();
        assert_eq!(u64_at(&e, 0), FIRST + 1);
        for bad in [&b"2\0"[..], b"01\0", b"-1\0", b"x\0", b"\0"] {
            assert_eq!(
                answer(&t, op::LOOKUP, ROOT, 1, bad).0,
                Some(Err(libc::ENOENT))
            );
        }
        // Unknown nodes and short bodies answer, never panic.
        assert_eq!(answer(&t, op::OPEN, 999, 1, &[]).0, Some(Err(libc::ENOENT)));
        assert!(answer(&t, op::READDIR, ROOT, 1, &[]).0.is_some());
    }

    #[test]
    fn repeats_within_a_second_are_counted_not_written() {
        let mut r = Repeats {
            seen: HashMap::new(),
        };
        let d = Denial {
            op: "read",
            target: "/p/.env".into(),
            mask: "/p/.env".into(),
            rule: "r".into(),
            pid: 1,
            command: "cat .env".into(),
        };
        assert_eq!(r.note(&d), Some(1));
        for _ in 0..5 {
            assert_eq!(r.note(&d), None);
        }
        assert!(r.due(false).is_empty(), "not before the quiet time");
        let all = r.due(true);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].1, 5);
    }
}
