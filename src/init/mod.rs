//! The sandbox's own init: the first process inside, on every backend (our binary, bind-mounted
//! read-only at [`INIT_PATH`]). In order: bring `lo` up, apply rlimits, drop every capability,
//! set no_new_privs, install the seccomp filter, then start the workload and stay as its
//! parent: forward signals to it, reap zombies, and exit with its status (128+N for a signal).
//! Any step that fails stops the sandbox: it never runs the workload with less isolation.

pub mod dns;
pub mod exec;
pub mod notify;
pub mod probe;
pub mod relay;
pub mod seccomp;
pub mod transparent;

use std::ffi::OsString;

use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::vocab::{INIT_BINARY, INIT_PATH};

/// The section of every aisb binary that holds [`SOURCE_ID`].
pub const SOURCE_ID_SECTION: &str = ".aisb_source_id";

const fn source_id() -> [u8; 16] {
    let hex = env!("AISB_SOURCE_ID").as_bytes();
    let mut id = [0u8; 16];
    let mut i = 0;
    while i < 16 && i < hex.len() {
        id[i] = hex[i];
        i += 1;
    }
    id
}

/// The identity of the sources this binary was built from (build.rs), in a section of its
/// own so that `aisb` can read an `aisb-init`'s without running it. Both binaries refer to it
/// (`keep_source_id`), so that the linker keeps it.
#[used]
#[link_section = ".aisb_source_id"]
pub static SOURCE_ID: [u8; 16] = source_id();

/// A use of [`SOURCE_ID`] the linker cannot drop.
pub fn keep_source_id() {
    std::hint::black_box(&SOURCE_ID);
}

/// Which binary serves as the sandbox's init, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitChoice {
    /// `aisb-init` beside `aisb`, built from the same sources.
    Beside(std::path::PathBuf),
    /// `aisb` itself: no `aisb-init` beside it.
    Missing,
    /// `aisb` itself: the `aisb-init` beside it was built from other sources (or is not one).
    Other(std::path::PathBuf),
}

/// Whether `path` is an aisb binary built from the same sources as this one.
fn same_sources(path: &std::path::Path) -> bool {
    use object::{Object, ObjectSection};
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let cache = object::ReadCache::new(file);
    let Ok(obj) = object::File::parse(&cache) else {
        return false;
    };
    obj.section_by_name(SOURCE_ID_SECTION)
        .and_then(|s| s.data().ok())
        .is_some_and(|d| d == SOURCE_ID)
}

/// The `aisb-init` beside `exe`, if it is this build's.
pub fn choose(exe: &std::path::Path) -> InitChoice {
    let sibling = exe.with_file_name(INIT_BINARY);
    if !sibling.is_file() {
        InitChoice::Missing
    } else if same_sources(&sibling) {
        InitChoice::Beside(sibling)
    } else {
        InitChoice::Other(sibling)
    }
}

/// The host binary to mount at [`INIT_PATH`] for the running `aisb`: `aisb-init` beside it
/// when that was built from the same sources, else `aisb` itself (which serves every verb of
/// the init as well, only starts slower).
pub fn binary_beside(exe: &std::path::Path) -> std::path::PathBuf {
    match choose(exe) {
        InitChoice::Beside(p) => p,
        InitChoice::Missing | InitChoice::Other(_) => exe.to_path_buf(),
    }
}

/// Whether this process was started through [`INIT_PATH`] (argv\[0\]): inside a sandbox, where
/// whichever binary serves as the init answers every verb of [`main_from_args`].
pub fn called_as_init(argv0: Option<&OsString>) -> bool {
    argv0.is_some_and(|a| a == INIT_PATH)
}

/// Parse `__init [--loopback] [--rlimit=NAME=SOFT:HARD]... -- COMMAND...` (the arguments the
/// spec gives the init; argv[0] excluded), run, and return the exit code: 125 when the sandbox
/// could not be set up, so it never runs the workload with less isolation.
pub fn main_from_args(args: impl IntoIterator<Item = OsString>) -> i32 {
    keep_source_id();
    let mut opts = Options::default();
    let mut args = args.into_iter().peekable();
    if args.peek().is_some_and(|a| a == "hold") {
        // The placeholder workload of a named sandbox: sessions join it; the init's SIGTERM
        // (forwarded by the init) ends it, and with it the sandbox.
        loop {
            nix::unistd::pause();
        }
    }
    if args.peek().is_some_and(|a| a == "connect") {
        let rest: Vec<String> = args
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if let [host, port] = rest.as_slice() {
            return relay::connect_main(host, port);
        }
        eprintln!("usage: {INIT_PATH} connect HOST PORT");
        return 2;
    }
    if args.peek().is_some_and(|a| a == "probe") {
        // `aisb test`'s attempts at the kernel surface, from inside whatever image runs.
        let rest: Vec<String> = args
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if let [name] = rest.as_slice() {
            return probe::main(name);
        }
        eprintln!("usage: {INIT_PATH} probe NAME");
        return 127;
    }
    if args.peek().is_some_and(|a| a == "agent-event") {
        let rest: Vec<String> = args
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if let [agent] = rest.as_slice() {
            return relay::agent_event_main(agent);
        }
        eprintln!("usage: {INIT_PATH} agent-event AGENT  (the hook's JSON on stdin)");
        return 2;
    }
    if args.peek().is_some_and(|a| a == "agent-result") {
        let rest: Vec<String> = args
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if let [agent] = rest.as_slice() {
            return relay::agent_result_main(agent);
        }
        eprintln!("usage: {INIT_PATH} agent-result AGENT  (the hook's JSON on stdin)");
        return 0;
    }
    let mut ok = args.next().is_some_and(|a| a == "__init");
    while ok {
        let Some(a) = args.next() else {
            ok = false;
            break;
        };
        let a = a.to_string_lossy().into_owned();
        if a == "--" {
            break;
        } else if a == "--loopback" {
            opts.loopback = true;
        } else if a == "--relay-proxy" {
            opts.relay_proxy = true;
        } else if a == "--keep-caps" {
            opts.keep_caps = true;
        } else if let Some(ids) = a.strip_prefix("--user=") {
            match ids
                .split_once(':')
                .map(|(u, g)| (u.parse::<u32>(), g.parse::<u32>()))
            {
                Some((Ok(u), Ok(g))) => opts.user = Some((u, g)),
                _ => ok = false,
            }
        } else if let Some(o) = a.strip_prefix("--overlay=") {
            // `LOWER[:LOWER…]:UPPER:WORK:TARGET`, the top lower layer first.
            let parts: Vec<&str> = o.split(':').collect();
            match parts.as_slice() {
                [lowers @ .., u, w, d]
                    if !lowers.is_empty()
                        && lowers.len() <= 8
                        && parts.iter().all(|p| p.starts_with('/')) =>
                {
                    opts.overlays.push(Overlay {
                        lower: lowers.iter().map(|l| l.to_string()).collect(),
                        upper: u.to_string(),
                        work: w.to_string(),
                        target: d.to_string(),
                    })
                }
                _ => ok = false,
            }
        } else if let Some(p) = a.strip_prefix("--mask=").filter(|p| p.starts_with('/')) {
            opts.masks.push((p.to_string(), false));
        } else if let Some(p) = a.strip_prefix("--mask-dir=").filter(|p| p.starts_with('/')) {
            opts.masks.push((p.to_string(), true));
        } else if let Some(p) = a
            .strip_prefix("--mask-list=")
            .filter(|p| p.starts_with('/'))
        {
            opts.mask_list = Some(p.to_string());
        } else if let Some(p) = a.strip_prefix("--cwd=").filter(|p| p.starts_with('/')) {
            opts.cwd = Some(p.into());
        } else if let Some(fd) = a.strip_prefix("--ready-fd=") {
            match fd.parse::<i32>() {
                Ok(fd) if fd > 2 => opts.ready_fd = Some(fd),
                _ => ok = false,
            }
        } else if let Some(p) = a.strip_prefix("--relay-port=") {
            match p.parse::<u16>() {
                Ok(p) if p > 0 => opts.relay_ports.push(p),
                _ => ok = false,
            }
        } else if let Some(list) = a.strip_prefix("--transparent=") {
            for p in list.split(',') {
                match p.parse::<u16>() {
                    Ok(p) if p > 0 => opts.transparent_ports.push(p),
                    _ => ok = false,
                }
            }
        } else if let Some(r) = a.strip_prefix("--rlimit=") {
            match parse_rlimit(r) {
                Some(r) => opts.rlimits.push(r),
                None => ok = false,
            }
        } else {
            ok = false;
        }
    }
    if !ok {
        eprintln!(
            "aisb-init: usage: __init [--loopback] [--rlimit=NAME=SOFT:HARD]... -- COMMAND..."
        );
        return 125;
    }
    opts.command = args.collect();
    match run(&opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("aisb: the sandbox could not start: {e}\n  help: nothing was run; `aisb doctor` checks the host");
            125
        }
    }
}

fn parse_rlimit(s: &str) -> Option<(String, u64, u64)> {
    let (name, limits) = s.split_once('=')?;
    let (soft, hard) = limits.split_once(':')?;
    Some((name.to_string(), soft.parse().ok()?, hard.parse().ok()?))
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("cannot bring the loopback interface up: {0}")]
    Loopback(std::io::Error),
    #[error("cannot set {name}: {source}")]
    Rlimit { name: String, source: nix::Error },
    #[error("unknown rlimit `{0}`")]
    BadRlimit(String),
    #[error("cannot drop capability {cap}: {source}")]
    Caps {
        cap: String,
        source: caps::errors::CapsError,
    },
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(nix::Error),
    #[error("cannot become {uid}:{gid} ({call}): {source}")]
    User {
        uid: u32,
        gid: u32,
        call: &'static str,
        source: nix::Error,
    },
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("cannot start the workload: {0}")]
    Fork(nix::Error),
    #[error("no command to run")]
    NoCommand,
    #[error("cannot mount the copy-on-write directory {target}: {source}")]
    Overlay { target: String, source: nix::Error },
    #[error("cannot mask {target}: {source}")]
    Mask { target: String, source: nix::Error },
    #[error("cannot read the list of masks {path}: {source}")]
    MaskList {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot listen on 127.0.0.1:{port} for the network relay: {source}")]
    Relay { port: u16, source: std::io::Error },
    #[error("cannot set up transparent egress ({what}): {source}\n  help: `network transparent=#false` in sandbox.kdl turns it off (proxy-aware clients keep working)")]
    Transparent {
        what: &'static str,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Bring `lo` up (a fresh network namespace starts with it down).
    pub loopback: bool,
    /// (`RLIMIT_NOFILE`, soft, hard)
    pub rlimits: Vec<(String, u64, u64)>,
    /// Relay 127.0.0.1:[`crate::vocab::PROXY_PORT`] (and [::1]) to the host's proxy.
    pub relay_proxy: bool,
    /// Relay these loopback ports to the host's own 127.0.0.1:PORT, through the proxy.
    pub relay_ports: Vec<u16>,
    /// Transparent egress: local routes, the DNS stub, and relays on these ports for any
    /// address (see [`transparent`]). Empty: off.
    pub transparent_ports: Vec<u16>,
    /// Copy-on-write directories to mount (bwrap cannot): layers already bound in by bwrap.
    pub overlays: Vec<Overlay>,
    /// Masks inside those directories, mounted after them: (path, is a directory).
    pub masks: Vec<(String, bool)>,
    /// A file of paths to mask (each ended by NUL), mounted after the overlays: every mask of
    /// the sandbox, so that their number costs one mount each and never a runtime argument
    /// (bubblewrap caps those at 9,000; libcontainer re-reads the mount table for each).
    pub mask_list: Option<String>,
    /// An image build step (root in its user namespace, installing packages): keep the
    /// capabilities the runtime gave, except CAP_NET_ADMIN (only the init needed it, for `lo`).
    pub keep_caps: bool,
    /// Become this (uid, gid) before the capabilities go (an ordinary user's build step: bwrap
    /// leaves the init at the caller's own id in a namespace mapping many).
    pub user: Option<(u32, u32)>,
    /// Written to (one byte) and closed once the sandbox is complete (the runtime's mounts and
    /// the init's overlays): the host's live mask layer enters the mount namespace only then.
    pub ready_fd: Option<i32>,
    /// The workload's working directory, entered once the init's mounts are done (bwrap
    /// started the init in `/`: below an overlay it may not exist).
    pub cwd: Option<std::path::PathBuf>,
    pub command: Vec<OsString>,
}

#[derive(Debug, Clone, Default)]
pub struct Overlay {
    /// The lower layers, the top one first.
    pub lower: Vec<String>,
    pub upper: String,
    pub work: String,
    pub target: String,
}

/// Clones of the outermost mounts strictly below `target` (from the mount table `table`),
/// each with what is mounted below it, and where they go back.
fn carry_submounts(
    table: &[u8],
    target: &str,
) -> Result<Vec<(std::ffi::CString, std::os::fd::OwnedFd)>, nix::Error> {
    use rustix::mount::{open_tree, OpenTreeFlags};
    let prefix = format!("{}/", target.trim_end_matches('/'));
    let mut points: Vec<Vec<u8>> = table
        .split(|b| *b == b'\n')
        .filter_map(|l| l.split(|b| *b == b' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|p| p.starts_with(prefix.as_bytes()))
        .collect();
    points.sort();
    points.dedup();
    let mut out: Vec<(std::ffi::CString, std::os::fd::OwnedFd)> = Vec::new();
    for p in points {
        if out.iter().any(|(o, _)| {
            let o = o.as_bytes();
            p.starts_with(o) && p.get(o.len()) == Some(&b'/')
        }) {
            continue;
        }
        let Ok(at) = std::ffi::CString::new(p) else {
            continue;
        };
        let tree = open_tree(
            rustix::fs::CWD,
            at.as_c_str(),
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_RECURSIVE
                | OpenTreeFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(errno)?;
        out.push((at, tree));
    }
    Ok(out)
}

/// A mount point as /proc/self/mountinfo writes it (space, tab, newline and backslash as
/// `\ooo`), unescaped.
fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' && field.len() - i >= 4 {
            let oct = &field[i + 1..i + 4];
            if (b'0'..=b'3').contains(&oct[0]) && oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                out.push((oct[0] - b'0') * 64 + (oct[1] - b'0') * 8 + (oct[2] - b'0'));
                i += 4;
                continue;
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// Mount an overlay from layers bound at staging paths (the lower dir, and the directory
/// holding the upper and work dirs, which overlayfs wants on one mount).
fn mount_overlay(o: &Overlay) -> Result<(), nix::Error> {
    use nix::mount::{mount, MsFlags};
    let data = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        o.lower.join(":"),
        o.upper,
        o.work
    );
    mount(
        Some("overlay"),
        o.target.as_str(),
        Some("overlay"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
}

/// The copy-on-write directories, then every mask (the listed ones and those inside the
/// copy-on-write directories), then the staging mounts made unreachable: an upper dir is
/// reachable through its overlay and a lower dir only through the masks.
///
/// bwrap run by an ordinary user leaves the init in a user namespace nested below the one
/// that owns the mount namespace: no mounting there. The init then makes a mount namespace of
/// its own, owned by its user namespace (overlayfs mounts in a user namespace since Linux
/// 5.11); the mounts it inherits are locked there, so the stages are covered by an empty
/// read-only tmpfs instead of unmounted.
fn mount_layers(opts: &Options) -> Result<(), InitError> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let list = match &opts.mask_list {
        Some(path) => std::fs::read(path).map_err(|source| InitError::MaskList {
            path: path.clone(),
            source,
        })?,
        None => Vec::new(),
    };
    let listed = list.split(|b| *b == 0).filter(|p| !p.is_empty());
    if opts.overlays.is_empty() && opts.masks.is_empty() && opts.mask_list.is_none() {
        return Ok(());
    }
    // bwrap entered the working directory before these mounts: a directory the init then
    // covers (the project under its copy-on-write overlay, a masked directory) would stay the
    // workload's through the old inode, below what covers it. Entered again, by its name.
    let cwd = opts.cwd.clone().or_else(|| std::env::current_dir().ok());
    if !owns_mount_namespace() {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).map_err(|source| {
            InitError::Mask {
                target: "a mount namespace of its own".into(),
                source,
            }
        })?;
    }
    let overlay_err = |o: &Overlay| {
        let target = o.target.clone();
        move |source| InitError::Overlay { target, source }
    };
    // What bwrap mounted inside an overlay's target (the git directory's read-only guards and
    // its configuration's view) would be covered by the overlay: each is cloned first and
    // moved back on top of it.
    let table = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    for o in &opts.overlays {
        let carried = carry_submounts(&table, &o.target).map_err(overlay_err(o))?;
        mount_overlay(o).map_err(overlay_err(o))?;
        for (at, tree) in carried {
            use rustix::mount::{move_mount, MoveMountFlags};
            move_mount(
                &tree,
                c"",
                rustix::fs::CWD,
                at.as_c_str(),
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
            .map_err(errno)
            .map_err(overlay_err(o))?;
        }
    }
    // The stages first: a mask that followed a planted link onto a stage would otherwise be
    // what the clean-up below unmounts, leaving the stage (the host's lower dir) in place.
    let ro_empty = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    for o in &opts.overlays {
        let rw = std::path::Path::new(&o.upper)
            .parent()
            .map_or_else(|| o.upper.clone(), |p| p.to_string_lossy().into_owned());
        for stage in o.lower.iter().chain([&rw]) {
            match umount2(stage.as_str(), MntFlags::MNT_DETACH) {
                Ok(()) => {}
                Err(nix::Error::EINVAL | nix::Error::EPERM) => mount(
                    Some("tmpfs"),
                    stage.as_str(),
                    Some("tmpfs"),
                    ro_empty,
                    Some("mode=000,size=4k"),
                )
                .map_err(overlay_err(o))?,
                Err(e) => return Err(overlay_err(o)(e)),
            }
        }
    }
    let mut masker = Masker::new(if opts.mask_list.is_some() {
        crate::vocab::MASK_SOURCE
    } else {
        aisb_bwrap::MASK_STAGE
    });
    let mask_err = |target: &[u8]| {
        let target = String::from_utf8_lossy(target).into_owned();
        move |source| InitError::Mask { target, source }
    };
    for target in opts.masks.iter().map(|(p, _)| p.as_bytes()).chain(listed) {
        masker.mask(target).map_err(mask_err(target))?;
    }
    // The list names only what is masked (which the sandbox sees anyway), but it is ours:
    // gone, or covered where it is locked in place.
    if let Some(path) = &opts.mask_list {
        match umount2(path.as_str(), MntFlags::MNT_DETACH) {
            Ok(()) => {}
            Err(nix::Error::EINVAL | nix::Error::EPERM) => masker
                .mask(path.as_bytes())
                .map_err(mask_err(path.as_bytes()))?,
            Err(e) => return Err(mask_err(path.as_bytes())(e)),
        }
    }
    // Its name unknown (removed meanwhile): `/`, never the old inode.
    let cwd = cwd.unwrap_or_else(|| std::path::PathBuf::from("/"));
    {
        if std::env::set_current_dir(&cwd).is_err() {
            // Masked (a mode-0000 tmpfs): never the directory below the mask.
            eprintln!(
                "aisb: the working directory {} is masked in the sandbox; starting in /",
                cwd.display()
            );
            std::env::set_current_dir("/").map_err(|e| InitError::Mask {
                target: "/".into(),
                source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            })?;
        }
    }
    Ok(())
}

/// Whether the init's user namespace owns its mount namespace (it can mount there).
fn owns_mount_namespace() -> bool {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;
    /// `ioctl(NS_GET_USERNS)`: the user namespace that owns a namespace (`_IO(0xb7, 0x1)`).
    const NS_GET_USERNS: libc::c_ulong = 0xb701;
    let (Ok(mnt), Ok(own)) = (
        std::fs::File::open("/proc/self/ns/mnt"),
        std::fs::metadata("/proc/self/ns/user"),
    ) else {
        return true;
    };
    // SAFETY: an ioctl on a namespace descriptor we hold; on success it returns a new
    // descriptor, which we take ownership of.
    let fd = unsafe { libc::ioctl(mnt.as_raw_fd(), NS_GET_USERNS) };
    if fd < 0 {
        // EPERM: the owner is an ancestor of our user namespace, not ours.
        return false;
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    let owner = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    owner
        .metadata()
        .is_ok_and(|m| m.ino() == own.ino() && m.dev() == own.dev())
}

/// Masks, as the runtimes make them: over a file, a bind of the empty mode-0000 file (already
/// bound read-only at `source`: reading fails with EACCES, and the clone is read-only like
/// it); over a directory, an empty read-only tmpfs of mode 0555, made once and bound over the
/// others. One open, one stat, one clone and one move per mask; the target is pinned by a descriptor
/// between the check and the mount.
struct Masker {
    source: &'static str,
    file: Option<std::os::fd::OwnedFd>,
    dir: Option<std::os::fd::OwnedFd>,
}

impl Masker {
    fn new(source: &'static str) -> Masker {
        Masker {
            source,
            file: None,
            dir: None,
        }
    }

    /// The masking file, checked once: never bind anything readable over a secret.
    fn file_source(&mut self) -> Result<std::os::fd::BorrowedFd<'_>, nix::Error> {
        use rustix::fs::{
            fstatvfs, openat2, FileType, Mode, OFlags, ResolveFlags, StatVfsMountFlags, CWD,
        };
        use std::os::fd::AsFd;
        if self.file.is_none() {
            let fd = openat2(
                CWD,
                self.source,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            )
            .map_err(errno)?;
            let st = rustix::fs::fstat(&fd).map_err(errno)?;
            let ro = fstatvfs(&fd)
                .map_err(errno)?
                .f_flag
                .contains(StatVfsMountFlags::RDONLY);
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile
                || st.st_size != 0
                || st.st_mode & 0o7777 != 0
                || !ro
            {
                return Err(nix::Error::EPERM);
            }
            self.file = Some(fd);
        }
        Ok(self.file.as_ref().expect("set above").as_fd())
    }

    /// Mask `target` (an absolute path inside). Gone since the scan, or a symbolic link that
    /// leads nowhere: nothing to hide. A link that leads somewhere is followed, as the
    /// runtimes follow it (never through /proc's magic links): what it names is hidden.
    fn mask(&mut self, target: &[u8]) -> Result<(), nix::Error> {
        use rustix::fs::{openat2, FileType, Mode, OFlags, ResolveFlags, CWD};
        use rustix::io::Errno;
        use rustix::mount::{move_mount, open_tree, MoveMountFlags, OpenTreeFlags};
        use std::os::fd::{AsFd, AsRawFd};
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::OsStr::from_bytes(target);
        let open = |resolve| {
            openat2(
                CWD,
                path,
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                resolve,
            )
        };
        // Most targets are reached without a link: then what was opened is what the list
        // names, and it is under /run/aisb only if the list says so.
        let fd = match open(ResolveFlags::NO_SYMLINKS) {
            Ok(fd) => fd,
            Err(Errno::LOOP) => {
                let fd = match open(ResolveFlags::NO_MAGICLINKS) {
                    Ok(fd) => fd,
                    // A loop, or a link through a magic link (what it names has its own mask).
                    Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(()),
                    Err(e) => return Err(errno(e)),
                };
                // Never over aisb's own paths through a link (a planted link into /run/aisb:
                // the masking file, the list, a stage): nothing there is the project's to hide.
                if !target.starts_with(b"/run/aisb/")
                    && std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
                        .is_ok_and(|p| p.starts_with("/run/aisb"))
                {
                    return Ok(());
                }
                fd
            }
            Err(Errno::NOENT | Errno::NOTDIR) => return Ok(()),
            Err(e) => return Err(errno(e)),
        };
        // A clone of the mount behind `src`, moved over the target: both by descriptor, no
        // path walked twice (cheaper than a bind through /proc/self/fd, which walks two magic
        // links per mask).
        let bind = |src: std::os::fd::BorrowedFd<'_>| {
            let tree = open_tree(
                src,
                c"",
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | OpenTreeFlags::AT_EMPTY_PATH,
            )
            .map_err(errno)?;
            move_mount(
                &tree,
                c"",
                &fd,
                c"",
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
            )
            .map_err(errno)
        };
        if FileType::from_raw_mode(rustix::fs::fstat(&fd).map_err(errno)?.st_mode)
            != FileType::Directory
        {
            return bind(self.file_source()?);
        }
        if let Some(dir) = &self.dir {
            return bind(dir.as_fd());
        }
        let empty = empty_tmpfs().map_err(errno)?;
        move_mount(
            &empty,
            c"",
            &fd,
            c"",
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )
        .map_err(errno)?;
        // Attached now, in this namespace: the others are clones of it.
        self.dir = Some(empty);
        Ok(())
    }
}

/// What a masked directory shows: an empty tmpfs of mode 0555, read-only, nosuid, nodev,
/// noexec, detached (the caller attaches it). The init's masks and the live masker's both.
pub fn empty_tmpfs() -> rustix::io::Result<std::os::fd::OwnedFd> {
    use rustix::mount::{
        fsconfig_create, fsconfig_set_string, fsmount, fsopen, FsMountFlags, FsOpenFlags,
        MountAttrFlags,
    };
    let fs = fsopen(c"tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)?;
    fsconfig_set_string(&fs, c"mode", c"555")?;
    fsconfig_set_string(&fs, c"size", c"4k")?;
    fsconfig_create(&fs)?;
    fsmount(
        &fs,
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_RDONLY
            | MountAttrFlags::MOUNT_ATTR_NOSUID
            | MountAttrFlags::MOUNT_ATTR_NODEV
            | MountAttrFlags::MOUNT_ATTR_NOEXEC,
    )
}

fn errno(e: rustix::io::Errno) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error())
}

/// Everything up to the exec, in the order that keeps each step possible: the loopback needs
/// CAP_NET_ADMIN and a relay on a port below 1024 CAP_NET_BIND_SERVICE, so both come before
/// the capabilities go; seccomp comes last because it forbids calls the earlier steps make.
/// Returns the relay listeners, bound; the caller serves them (threads started after this
/// inherit the seccomp filter).
pub fn harden(opts: &Options) -> Result<Bound, InitError> {
    mount_layers(opts)?;
    if opts.loopback {
        loopback_up().map_err(InitError::Loopback)?;
    }
    // Routes first: a namespace of our own, when we need one, must come before any listener.
    let routed = !opts.transparent_ports.is_empty() && route_everything_to_lo()?;
    let mut listeners = Vec::new();
    let ports = opts
        .relay_proxy
        .then_some((crate::vocab::PROXY_PORT, relay::Target::Proxy))
        .into_iter()
        .chain(
            opts.relay_ports
                .iter()
                .map(|&p| (p, relay::Target::HostPort(p))),
        );
    for (port, target) in ports {
        let bound = relay::bind(port).map_err(|source| InitError::Relay { port, source })?;
        listeners.extend(bound.into_iter().map(|l| (l, target)));
    }
    let mut transparent = Vec::new();
    let mut transparent_ports = Vec::new();
    let mut dns = None;
    if routed {
        let err = |what| move |source| InitError::Transparent { what, source };
        dns = Some(dns::bind().map_err(err("the DNS stub on 127.0.0.53:53"))?);
        transparent_ports = opts.transparent_ports.clone();
        for &port in &opts.transparent_ports {
            // A port relayed to the host's own loopback (`localhost-port`) keeps that meaning.
            if port == crate::vocab::PROXY_PORT || opts.relay_ports.contains(&port) {
                continue;
            }
            transparent
                .push(transparent::bind(port).map_err(|source| InitError::Relay { port, source })?);
        }
    }
    for (name, soft, hard) in &opts.rlimits {
        set_rlimit(name, *soft, *hard)?;
    }
    if let Some((uid, gid)) = opts.user {
        become_user(uid, gid)?;
    }
    if opts.keep_caps {
        use caps::{CapSet, Capability};
        for set in [
            CapSet::Ambient,
            CapSet::Bounding,
            CapSet::Inheritable,
            CapSet::Effective,
            CapSet::Permitted,
        ] {
            caps::drop(None, set, Capability::CAP_NET_ADMIN).map_err(|source| InitError::Caps {
                cap: "CAP_NET_ADMIN".into(),
                source,
            })?;
        }
    } else {
        drop_capabilities()?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(InitError::NoNewPrivs)?;
    seccomp::apply(opts.keep_caps)?;
    Ok(Bound {
        relays: listeners,
        transparent,
        transparent_ports,
        dns,
    })
}

/// What [`harden`] bound while it still could (ports below 1024, routes).
pub struct Bound {
    pub relays: Vec<(std::net::TcpListener, relay::Target)>,
    pub transparent: Vec<std::net::TcpListener>,
    /// The ports transparent egress serves (empty when it is off or unavailable).
    pub transparent_ports: Vec<u16>,
    pub dns: Option<dns::Stub>,
}

/// Transparent egress's routes (see [`transparent`]): true when in place, false when this
/// sandbox cannot have them (said on stderr; nothing gets out without the proxy either way).
///
/// bwrap run by an ordinary user nests one more user namespace below the one that owns the
/// network namespace, so the init's CAP_NET_ADMIN does not reach it (EPERM). The init then
/// makes a network namespace of its own, owned by its user namespace: loopback only, like the
/// one it leaves (the proxy is reached through a Unix socket on the filesystem, which does not
/// depend on the network namespace).
fn route_everything_to_lo() -> Result<bool, InitError> {
    let err = |source| InitError::Transparent {
        what: "local routes on lo",
        source,
    };
    match transparent::local_routes() {
        Ok(()) => return Ok(true),
        Err(e) if e.raw_os_error() != Some(libc::EPERM) => return Err(err(e)),
        Err(_) => {}
    }
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET) {
        eprintln!("aisb: transparent egress is unavailable in this sandbox (no network namespace of its own: {e}): only clients that use the proxy variables get out\n  help: `network transparent=#false` silences this");
        return Ok(false);
    }
    loopback_up().map_err(InitError::Loopback)?;
    transparent::local_routes().map_err(err)?;
    Ok(true)
}

/// Run as the sandbox's init; returns the exit code for the caller to exit with.
pub fn run(opts: &Options) -> Result<i32, InitError> {
    if opts.command.is_empty() {
        return Err(InitError::NoCommand);
    }
    // What the runtime left open (bwrap keeps its `--userns-block-fd` in the sandbox's first
    // process) never reaches the workload.
    cloexec_inherited();
    let listeners = harden(opts)?;
    if let Some(fd) = opts.ready_fd {
        // SAFETY: the runtime passed this descriptor for us alone; nothing else owns it, and
        // it is closed here, before the workload exists.
        let ready = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let _ = nix::unistd::write(&ready, b"\n");
    }
    let forwarded = [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGWINCH,
        Signal::SIGCONT,
    ];
    let mut set = SigSet::empty();
    for s in forwarded {
        // An ignored signal is discarded before sigwait could see it: start from the defaults
        // (the runtime may have been started with SIGINT ignored).
        // SAFETY: installing SIG_DFL has no handler to be unsafe about.
        let _ = unsafe { nix::sys::signal::signal(s, nix::sys::signal::SigHandler::SigDfl) };
        set.add(s);
    }
    set.add(Signal::SIGCHLD);
    set.thread_block().map_err(InitError::Fork)?;
    // Relay threads start with every forwarded signal blocked, so signals reach `supervise`.
    let transparent_ports = listeners.transparent_ports.clone();
    relay::start(listeners.relays);
    transparent::start(listeners.transparent);
    if let Some(stub) = listeners.dns {
        dns::start(stub, transparent::ask_proxy);
    }
    // Found and laid out before the fork: the child must not allocate (a relay thread could
    // hold the allocator's lock at that instant).
    let program = match exec::Exec::prepare(&opts.command, exec::Exec::own_environment()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("aisb: cannot run the command: {e}");
            return Ok(126);
        }
    };
    // Direct connections around the proxy: reported, refused with a reason. (Without a proxy,
    // `network "none"`, the kernel's "Network is unreachable" says it all, and the ~0.3 ms
    // this costs per start is saved.)
    let notify = opts.relay_proxy.then(notify::prepare).flatten();
    // SAFETY: relay threads run, so the child may call only async-signal-safe functions until
    // it execs or exits: it unblocks signals (pthread_sigmask), installs a prepared filter and
    // sends a descriptor (`notify::install_in_child`: seccomp, sendmsg, close), then
    // `Exec::run` (execve, write, _exit), all on memory prepared above.
    match unsafe { fork() }.map_err(InitError::Fork)? {
        ForkResult::Child => {
            let _ = set.thread_unblock();
            if let Some(n) = &notify {
                notify::install_in_child(n);
            }
            program.run()
        }
        ForkResult::Parent { child } => {
            drop(program);
            if let Some(fd) = notify.and_then(notify::receive) {
                notify::serve(fd, opts.relay_proxy, transparent_ports);
            }
            Ok(supervise(child, &set))
        }
    }
}

/// Wait for signals: forward the workload's, reap every child, return the workload's status.
fn supervise(child: Pid, set: &SigSet) -> i32 {
    loop {
        let Ok(sig) = set.wait() else { continue };
        if sig != Signal::SIGCHLD {
            let _ = kill(child, sig);
            continue;
        }
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => return code,
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => return 128 + sig as i32,
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }
}

fn set_rlimit(name: &str, soft: u64, hard: u64) -> Result<(), InitError> {
    use nix::sys::resource::{setrlimit, Resource};
    let r = match name {
        "RLIMIT_AS" => Resource::RLIMIT_AS,
        "RLIMIT_CORE" => Resource::RLIMIT_CORE,
        "RLIMIT_CPU" => Resource::RLIMIT_CPU,
        "RLIMIT_DATA" => Resource::RLIMIT_DATA,
        "RLIMIT_FSIZE" => Resource::RLIMIT_FSIZE,
        "RLIMIT_MEMLOCK" => Resource::RLIMIT_MEMLOCK,
        "RLIMIT_NOFILE" => Resource::RLIMIT_NOFILE,
        "RLIMIT_NPROC" => Resource::RLIMIT_NPROC,
        "RLIMIT_STACK" => Resource::RLIMIT_STACK,
        "RLIMIT_SIGPENDING" => Resource::RLIMIT_SIGPENDING,
        other => return Err(InitError::BadRlimit(other.to_string())),
    };
    setrlimit(r, soft, hard).map_err(|source| InitError::Rlimit {
        name: name.to_string(),
        source,
    })
}

/// setgroups, setresgid, setresuid, in that order (each later one forbids the earlier). The
/// capabilities stay (none of these ids was 0 before) for [`harden`] to keep or drop.
fn become_user(uid: u32, gid: u32) -> Result<(), InitError> {
    use nix::unistd::{setgroups, setresgid, setresuid, Gid};
    let err = |call| {
        move |source| InitError::User {
            uid,
            gid,
            call,
            source,
        }
    };
    setgroups(&[Gid::from_raw(gid)]).map_err(err("setgroups"))?;
    setresgid(gid.into(), gid.into(), gid.into()).map_err(err("setresgid"))?;
    setresuid(uid.into(), uid.into(), uid.into()).map_err(err("setresuid"))?;
    Ok(())
}

/// Every descriptor from 3 up close-on-exec (`close_range`, else one `fcntl` each).
fn cloexec_inherited() {
    // SAFETY: raw syscalls on integers.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) == 0
        {
            return;
        }
        for fd in 3..4096 {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// Clear the bounding set first (so no later exec can regain anything), then the others.
/// Dropping from the bounding set needs CAP_SETPCAP; without it, a non-root workload is still
/// safe (with no_new_privs nothing can grant it capabilities), but a uid-0 workload would get
/// the bounding set back at exec, so that is refused.
fn drop_capabilities() -> Result<(), InitError> {
    use caps::{CapSet, Capability};
    let err = |cap: String| move |source| InitError::Caps { cap, source };
    caps::clear(None, CapSet::Ambient).map_err(err("ambient".into()))?;
    let bounding = caps::read(None, CapSet::Bounding).map_err(err("bounding".into()))?;
    let can_drop = caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false);
    if can_drop || nix::unistd::geteuid().is_root() {
        // CAP_SETPCAP last: dropping a capability from the bounding set needs it.
        let mut bounding: Vec<Capability> = bounding.into_iter().collect();
        bounding.sort_by_key(|c| *c == Capability::CAP_SETPCAP);
        for cap in bounding {
            caps::drop(None, CapSet::Bounding, cap).map_err(err(cap.to_string()))?;
        }
    }
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        caps::clear(None, set).map_err(err(format!("{set:?}")))?;
    }
    Ok(())
}

/// `ip link set lo up`, with the classic ioctls (no netlink needed for one flag).
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket/ioctl calls on a zeroed `ifreq` whose name we fill in.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        let mut result = Ok(());
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            result = Err(std::io::Error::last_os_error());
        } else if req.ifr_ifru.ifru_flags & libc::IFF_UP as libc::c_short == 0 {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
                result = Err(std::io::Error::last_os_error());
            }
        }
        libc::close(fd);
        result
    }
}
