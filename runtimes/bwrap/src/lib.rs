//! The bubblewrap backend: a pure translation of an OCI runtime spec into a `bwrap` argv, tested
//! for its exact output, and a way to start it.
//!
//! Why the argv is ordered as it is:
//! - namespace and identity flags first (they apply to the whole sandbox);
//! - then the rootfs symlinks (merged /usr), because bwrap starts from an empty root;
//! - then every mount in the spec's order, which puts parents before children and the masks
//!   last, so nothing mounted later can uncover a masked path;
//! - then `/proc` masks, `--remount-ro /` (the read-only root) and the process settings;
//! - the command after `--`.
//!
//! Overlay mounts: bubblewrap 0.8 has no overlayfs support, so when the process is aisb's init
//! (`ARGS[1] == "__init"`) running as uid 0 (aisb started by root; an unprivileged bwrap puts
//! the process in a nested user namespace that cannot mount), its layers are bound under
//! [`OVERLAY_STAGE`] and the init mounts the
//! overlay itself (`--overlay=LOWER:UPPER:WORK:TARGET`, `LOWER` being one or more layers
//! joined by `:`, the top one first, with CAP_SYS_ADMIN in the sandbox's user
//! namespace, which it drops before the workload starts). The init mounts after bwrap has done
//! everything else, so a mount or mask inside such a directory would be covered: that, an
//! overlay for any other process, and unknown mount types are refused, never dropped. Two things are deliberately stricter than the
//! spec: `/sys` is not mounted at all, and `/dev/pts` comes from `--dev`. `readonlyPaths` under
//! `/proc` are left to the kernel, which refuses writes there from a user namespace.

use std::path::{Path, PathBuf};
use std::process::Command;

use oci_spec::runtime::{LinuxNamespaceType, Spec};

#[derive(Debug, thiserror::Error)]
pub enum BwrapError {
    #[error("the bwrap backend cannot express {what}: {why}")]
    Unsupported { what: String, why: &'static str },
    #[error("the spec has no {0}")]
    Missing(&'static str),
}

/// Where the layers of an overlay the init mounts are bound (`N/lower`, `N/upper`, `N/work`).
pub const OVERLAY_STAGE: &str = "/run/aisb/overlay";

/// Where the masking file is bound for the init, which binds it over masked files inside the
/// copy-on-write directories it mounts (`--mask=PATH`; `--mask-dir=PATH` for a directory).
pub const MASK_STAGE: &str = "/run/aisb/overlay-mask";

/// The capabilities the init gets for transparent egress (its init argument `--transparent=`):
/// routes on `lo`, and the DNS stub and relays on ports below 1024; CAP_SYS_ADMIN for a
/// network namespace of its own when bwrap, run by an ordinary user, leaves the sandbox's in a
/// parent user namespace. It drops them all (and empties the bounding set, hence CAP_SETPCAP)
/// before the workload starts.
pub const TRANSPARENT_CAPS: [&str; 4] = [
    "CAP_NET_ADMIN",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_ADMIN",
    "CAP_SETPCAP",
];

/// The capabilities the init gets to mount overlays (see [`OVERLAY_STAGE`]).
/// CAP_SETPCAP lets the init empty the bounding set again afterwards.
pub const OVERLAY_CAPS: [&str; 7] = [
    "CAP_SYS_ADMIN",
    "CAP_SETPCAP",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_CHOWN",
    "CAP_FSETID",
];

/// The capabilities the init gets to mount the masks it is given as a list
/// (`--mask-list=`), and to make a mount namespace of its own first where bwrap, run by an
/// ordinary user, leaves it in a user namespace that does not own bwrap's. It drops them
/// before the workload starts (CAP_SETPCAP: it empties the bounding set too).
pub const MASK_CAPS: [&str; 2] = ["CAP_SYS_ADMIN", "CAP_SETPCAP"];

/// Facts the translation needs from outside the spec, gathered by the caller.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// Relative mount sources are taken from here (the bundle directory).
    pub bundle: PathBuf,
    /// Top-level symlinks of the rootfs: (link path inside, target), e.g. (`/bin`, `usr/bin`).
    pub rootfs_symlinks: Vec<(PathBuf, PathBuf)>,
    /// Which `maskedPaths` exist inside and are directories (`Some(true)`), files
    /// (`Some(false)`); paths not listed do not exist and are skipped.
    pub masked_kinds: Vec<(PathBuf, bool)>,
    /// Put the workload in a new session (no controlling terminal: TIOCSTI cannot reach the
    /// user's terminal even without seccomp). Off for interactive sessions.
    pub new_session: bool,
    /// File descriptor bwrap writes `{"child-pid": N}` to.
    pub info_fd: Option<i32>,
    /// File descriptor bwrap reads one byte from before it goes on, once its user namespace
    /// exists: the caller writes the namespace's map meanwhile (bwrap writes none itself).
    /// Needs `info_fd` (the pid to map).
    pub userns_block_fd: Option<i32>,
    /// The empty mode-0000 file the spec binds over masked files: a mask inside a
    /// copy-on-write directory is the init's to mount (see [`OVERLAY_STAGE`]).
    pub mask_file: Option<PathBuf>,
}

fn opt_value<'a>(options: &'a [String], key: &str) -> Option<&'a str> {
    options
        .iter()
        .find_map(|o| o.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
}

/// Spec -> bwrap arguments (without the `bwrap` program name).
pub fn argv(spec: &Spec, inputs: &Inputs) -> Result<Vec<String>, BwrapError> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    let linux = spec
        .linux()
        .as_ref()
        .ok_or(BwrapError::Missing("linux section"))?;
    let process = spec
        .process()
        .as_ref()
        .ok_or(BwrapError::Missing("process"))?;
    let namespaces = linux.namespaces().clone().unwrap_or_default();
    let has = |t: LinuxNamespaceType| namespaces.iter().any(|n| n.typ() == t);

    push(&["--die-with-parent"]);
    if has(LinuxNamespaceType::User) {
        push(&["--unshare-user"]);
    }
    if has(LinuxNamespaceType::Pid) {
        // Our init is PID 1: it reaps and forwards signals (bwrap's own reaper would not).
        push(&["--unshare-pid", "--as-pid-1"]);
    }
    if has(LinuxNamespaceType::Ipc) {
        push(&["--unshare-ipc"]);
    }
    if has(LinuxNamespaceType::Uts) {
        push(&["--unshare-uts"]);
    }
    if has(LinuxNamespaceType::Network) {
        push(&["--unshare-net"]);
    }
    if has(LinuxNamespaceType::Cgroup) {
        push(&["--unshare-cgroup-try"]);
    }
    let user = process.user();
    push(&[
        "--uid",
        &user.uid().to_string(),
        "--gid",
        &user.gid().to_string(),
    ]);
    if let Some(h) = spec.hostname() {
        push(&["--hostname", h]);
    }
    if inputs.new_session {
        push(&["--new-session"]);
    }
    if let Some(fd) = inputs.info_fd {
        push(&["--info-fd", &fd.to_string()]);
    }
    if let Some(fd) = inputs
        .userns_block_fd
        .filter(|_| has(LinuxNamespaceType::User))
    {
        push(&["--userns-block-fd", &fd.to_string()]);
    }
    // The init empties the bounding set itself; when bwrap runs as real root, start it with
    // nothing it could keep.
    push(&["--cap-drop", "ALL"]);

    for (link, target) in &inputs.rootfs_symlinks {
        push(&[
            "--symlink",
            &target.to_string_lossy(),
            &link.to_string_lossy(),
        ]);
    }

    let mounts = spec.mounts().clone().unwrap_or_default();
    let masked = linux.masked_paths().clone().unwrap_or_default();
    let mut overlays: Vec<String> = Vec::new();
    // Masks inside copy-on-write directories, for the init (their paths, skipped here).
    let mut init_masks: Vec<String> = Vec::new();
    let mut by_init_masks: std::collections::BTreeSet<String> = Default::default();
    for (i, m) in mounts.iter().enumerate() {
        let dest = m.destination().to_string_lossy().into_owned();
        if by_init_masks.contains(&dest) {
            continue;
        }
        let options = m.options().clone().unwrap_or_default();
        let ro = options.iter().any(|o| o == "ro");
        let source = m.source().as_ref().map(|s| {
            if s.is_relative() {
                inputs.bundle.join(s)
            } else {
                s.clone()
            }
        });
        match m.typ().as_deref().unwrap_or("bind") {
            "proc" => push(&["--proc", &dest]),
            "tmpfs" if dest == "/dev" => push(&["--dev", &dest]),
            "devpts" | "sysfs" | "mqueue" => {}
            "bind" => {
                let src = source.ok_or(BwrapError::Missing("bind mount source"))?;
                push(&[
                    if ro { "--ro-bind" } else { "--bind" },
                    &src.to_string_lossy(),
                    &dest,
                ]);
            }
            "tmpfs" => {
                if let Some(mode) = opt_value(&options, "mode") {
                    push(&["--perms", &format!("{:0>4}", mode)]);
                }
                if let Some(size) = opt_value(&options, "size").and_then(parse_size) {
                    push(&["--size", &size.to_string()]);
                }
                push(&["--tmpfs", &dest]);
                if ro {
                    push(&["--remount-ro", &dest]);
                }
            }
            "overlay" => {
                let what = || format!("the copy-on-write (overlay) mount at {dest}");
                let by_init = process
                    .args()
                    .as_ref()
                    .is_some_and(|a| a.get(1).is_some_and(|x| x == "__init"));
                if !by_init {
                    return Err(BwrapError::Unsupported {
                        what: what(),
                        why: "bubblewrap 0.8 cannot mount overlayfs, and the process is not \
                              aisb's init, which could; use the libcontainer backend",
                    });
                }
                // The init mounts the overlay after bwrap is done: masks inside it are the
                // init's to mount after it; anything else mounted inside is carried over it
                // by the init.
                let inside = |p: &Path| p != Path::new(&dest) && p.starts_with(&dest);
                for n in &mounts[i + 1..] {
                    // A mask on the overlay's own target too: mounted before it, the overlay
                    // would cover it.
                    let mask = mask_kind(n, inputs.mask_file.as_deref());
                    if !(inside(n.destination())
                        || (mask.is_some() && n.destination() == Path::new(&dest)))
                    {
                        continue;
                    }
                    // Anything else bwrap mounts now; the init clones it and moves it back
                    // on top of the overlay when it mounts that.
                    if let Some(dir) = mask {
                        if !dir && !init_masks.iter().any(|m| m.starts_with("--mask=")) {
                            let file = inputs
                                .mask_file
                                .as_ref()
                                .ok_or(BwrapError::Missing("masking file"))?;
                            push(&["--ro-bind", &file.to_string_lossy(), MASK_STAGE]);
                        }
                        let at = n.destination().to_string_lossy().into_owned();
                        by_init_masks.insert(at.clone());
                        init_masks.push(if dir {
                            format!("--mask-dir={at}")
                        } else {
                            format!("--mask={at}")
                        });
                    }
                }
                if masked.iter().any(|p| inside(Path::new(p))) {
                    return Err(BwrapError::Unsupported {
                        what: what(),
                        why: "a masked kernel path inside a copy-on-write directory",
                    });
                }
                let layer = |k: &str| opt_value(&options, k).map(str::to_string);
                let (Some(lower), Some(upper), Some(work)) =
                    (layer("lowerdir"), layer("upperdir"), layer("workdir"))
                else {
                    return Err(BwrapError::Missing("overlay lowerdir, upperdir or workdir"));
                };
                // `lowerdir=TOP:…:BOTTOM`: several lower layers, each bound apart.
                let lowers: Vec<&str> = lower.split(':').collect();
                if lowers.iter().any(|l| l.is_empty() || l.contains(','))
                    || [&upper, &work, &dest]
                        .iter()
                        .any(|p| p.contains([':', ',']))
                {
                    return Err(BwrapError::Unsupported {
                        what: what(),
                        why: "a layer path holds `:` or `,`",
                    });
                }
                // overlayfs wants the upper and work dirs on one mount: bind their common
                // parent (aisb keeps them side by side, `…/upper` and `…/work`).
                let (up, wp) = (Path::new(&upper), Path::new(&work));
                let (Some(parent), Some(un), Some(wn)) =
                    (up.parent(), up.file_name(), wp.file_name())
                else {
                    return Err(BwrapError::Missing("overlay upperdir"));
                };
                if wp.parent() != Some(parent) {
                    return Err(BwrapError::Unsupported {
                        what: what(),
                        why: "the upper and work dirs are not in one directory",
                    });
                }
                let stage = format!("{OVERLAY_STAGE}/{}", overlays.len());
                let rw = format!("{stage}/rw");
                let (u, w) = (
                    format!("{rw}/{}", un.to_string_lossy()),
                    format!("{rw}/{}", wn.to_string_lossy()),
                );
                // The bottom layer at `N/lower` (as with one), those above it at `N/lower-K`.
                let mut staged = Vec::new();
                for (k, layer) in lowers.iter().enumerate() {
                    let at = if k + 1 == lowers.len() {
                        format!("{stage}/lower")
                    } else {
                        format!("{stage}/lower-{k}")
                    };
                    push(&["--ro-bind", layer, &at]);
                    staged.push(at);
                }
                push(&["--bind", &parent.to_string_lossy(), &rw]);
                push(&["--dir", &dest]);
                overlays.push(format!("--overlay={}:{u}:{w}:{dest}", staged.join(":")));
            }
            other => {
                return Err(BwrapError::Unsupported {
                    what: format!("a `{other}` mount at {dest}"),
                    why: "unknown mount type",
                })
            }
        }
    }

    for path in masked {
        let p = Path::new(&path);
        match inputs.masked_kinds.iter().find(|(k, _)| k == p) {
            Some((_, true)) => push(&["--perms", "0555", "--tmpfs", &path, "--remount-ro", &path]),
            Some((_, false)) => push(&["--ro-bind", "/dev/null", &path]),
            None => {}
        }
    }
    if spec
        .root()
        .as_ref()
        .is_some_and(|r| r.readonly().unwrap_or(false))
    {
        push(&["--remount-ro", "/"]);
    }

    // Under an overlay the init mounts, the working directory may exist only in the overlay:
    // bwrap starts in `/` and the init enters it once its mounts are done.
    let cwd = process.cwd().to_string_lossy().into_owned();
    if overlays.is_empty() {
        push(&["--chdir", &cwd, "--clearenv"]);
    } else {
        push(&["--chdir", "/", "--clearenv"]);
        overlays.push(format!("--cwd={cwd}"));
    }
    for kv in process.env().clone().unwrap_or_default() {
        let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
        push(&["--setenv", k, v]);
    }
    push(&["--"]);
    let mut args = process
        .args()
        .clone()
        .ok_or(BwrapError::Missing("process args"))?;
    // Capabilities the init gets (after `--cap-drop ALL`), and drops before the workload.
    let add_caps = |a: &mut Vec<String>, caps: &[&str]| {
        let at = a
            .iter()
            .position(|x| x == "--cap-drop")
            .map_or(0, |i| i + 2);
        let caps = caps
            .iter()
            .flat_map(|c| ["--cap-add".to_string(), c.to_string()]);
        a.splice(at..at, caps);
    };
    if args.iter().any(|a| a.starts_with("--transparent=")) {
        add_caps(&mut a, &TRANSPARENT_CAPS);
    }
    if overlays.is_empty() && args.iter().any(|a| a.starts_with("--mask-list=")) {
        add_caps(&mut a, &MASK_CAPS);
    }
    if !overlays.is_empty() {
        // The init mounts them with these capabilities (in the sandbox's user namespace) and
        // drops them before the workload runs. overlayfs does its copy-ups with the mounter's
        // credentials: it needs to pass permission checks and keep owners, as on libcontainer,
        // where the init is root in its user namespace when it mounts.
        add_caps(&mut a, &OVERLAY_CAPS);
        overlays.extend(init_masks);
        args.splice(2..2, overlays);
    }
    a.extend(args);
    Ok(a)
}

/// Whether `m` is one of the spec's masks: `Some(true)` an empty read-only tmpfs over a
/// directory, `Some(false)` the masking file bound over a file.
fn mask_kind(m: &oci_spec::runtime::Mount, mask_file: Option<&Path>) -> Option<bool> {
    let options = m.options().clone().unwrap_or_default();
    let has = |o: &str| options.iter().any(|x| x == o);
    if !(has("ro") && has("noexec")) {
        return None;
    }
    match m.typ().as_deref() {
        Some("tmpfs") if has("mode=555") => Some(true),
        Some("bind") if mask_file.is_some() && m.source().as_deref() == mask_file => Some(false),
        _ => None,
    }
}

/// `65536k`, `4k`, `1048576`: bwrap wants bytes.
fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// [`Inputs`] for `spec`: the rootfs symlinks the caller knows, and which of the spec's
/// `/proc` masked paths exist on this kernel (read from the host's /proc).
pub fn inputs(spec: &Spec, rootfs_symlinks: Vec<(PathBuf, PathBuf)>) -> Inputs {
    let masked_kinds = spec
        .linux()
        .as_ref()
        .and_then(|l| l.masked_paths().clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.starts_with("/proc/"))
        .filter_map(|p| {
            std::fs::metadata(&p)
                .ok()
                .map(|m| (PathBuf::from(&p), m.is_dir()))
        })
        .collect();
    Inputs {
        bundle: PathBuf::from("/"),
        rootfs_symlinks,
        masked_kinds,
        new_session: false,
        info_fd: None,
        userns_block_fd: None,
        mask_file: None,
    }
}

/// The `bwrap` command for these arguments: the first `bwrap` on `PATH`, found with `stat`
/// (an exec-per-directory search costs ~0.1 ms on a long PATH, on every start).
pub fn command(args: &[String]) -> Command {
    let mut c = Command::new(program(std::env::var_os("PATH").as_deref()));
    c.args(args);
    c
}

/// The first executable `bwrap` in `path`, or the bare name (spawning then fails with
/// "not found", as it would have).
pub fn program(path: Option<&std::ffi::OsStr>) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    path.into_iter()
        .flat_map(std::env::split_paths)
        .filter(|d| d.is_absolute())
        .map(|d| d.join("bwrap"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .unwrap_or_else(|| PathBuf::from("bwrap"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_is_found_with_stat_in_path_order() {
        let bin = std::env::temp_dir().join(format!("aisb-bwrap-path-{}", std::process::id()));
        let (a, b) = (bin.join("a"), bin.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        // Not executable in a: skipped; executable in b: found.
        std::fs::write(a.join("bwrap"), "").unwrap();
        std::fs::write(b.join("bwrap"), "").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(b.join("bwrap"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path =
            std::env::join_paths(["relative", a.to_str().unwrap(), b.to_str().unwrap()]).unwrap();
        assert_eq!(program(Some(&path)), b.join("bwrap"));
        assert_eq!(
            program(Some(std::ffi::OsStr::new("/nonexistent"))),
            PathBuf::from("bwrap")
        );
        assert_eq!(program(None), PathBuf::from("bwrap"));
        std::fs::remove_dir_all(&bin).unwrap();
    }
}
