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
//! What bwrap cannot express is refused, never dropped: overlay mounts (bubblewrap 0.8 has no
//! overlayfs support) and unknown mount types. Two things are deliberately stricter than the
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

    for m in spec.mounts().clone().unwrap_or_default() {
        let dest = m.destination().to_string_lossy().into_owned();
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
                return Err(BwrapError::Unsupported {
                    what: format!("the copy-on-write (overlay) mount at {dest}"),
                    why: "bubblewrap 0.8 cannot mount overlayfs; use the libcontainer backend",
                })
            }
            other => {
                return Err(BwrapError::Unsupported {
                    what: format!("a `{other}` mount at {dest}"),
                    why: "unknown mount type",
                })
            }
        }
    }

    for path in linux.masked_paths().clone().unwrap_or_default() {
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

    push(&["--chdir", &process.cwd().to_string_lossy(), "--clearenv"]);
    for kv in process.env().clone().unwrap_or_default() {
        let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), ""));
        push(&["--setenv", k, v]);
    }
    push(&["--"]);
    a.extend(
        process
            .args()
            .clone()
            .ok_or(BwrapError::Missing("process args"))?,
    );
    Ok(a)
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
