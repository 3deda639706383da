//! One image build `RUN` step, run in aisb's own sandbox: the image's layers below an overlay
//! whose upper directory becomes the step's layer, root inside a user namespace, every other
//! namespace private, the network only through the proxy (default: the `registries` group).
//!
//! - root: libcontainer, a user namespace mapping ids 0–65535 to themselves (files keep the
//!   owners the step gives them).
//! - an ordinary user: bwrap, whose user namespace gets the caller's map over their
//!   subordinate ids ([`crate::userns`]) from `newuidmap` while bwrap waits
//!   (`--userns-block-fd`); the overlay (`userxattr`) is mounted into its mount namespace
//!   then, by a child that joins the namespace as its owner. The init becomes the step's user
//!   (`--user`): bwrap leaves the process at the caller's own id.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::rootmount::RootMount;
use super::RuntimeError;

/// What to run (the build's `StepRun`, as the runtime takes it).
pub struct Step<'a> {
    /// The layers below, top first (at least one).
    pub layers: &'a [PathBuf],
    /// The new layer (the overlay's upper directory).
    pub upper: &'a Path,
    /// A scratch directory on the store's filesystem (overlay work dir, bundle).
    pub scratch: &'a Path,
    pub argv: &'a [String],
    pub env: &'a [String],
    pub cwd: &'a str,
    pub user: (u32, u32),
    /// Domain rules the step may reach through the proxy; empty: no network at all.
    pub allow: &'a [String],
    /// Where the proxy's decisions are logged.
    pub audit: &'a Path,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

/// Run the step; every line it prints goes to `on_line`. Returns its exit code.
pub fn run(step: &Step, on_line: &mut dyn FnMut(&str)) -> Result<i32, RuntimeError> {
    let exe = std::env::current_exe().map_err(io("locating the aisb binary"))?;
    let work = step.scratch.join("work");
    let root = step.scratch.join("root");
    for d in [&work, &root] {
        std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
    }
    let proxy = if step.allow.is_empty() {
        None
    } else {
        // The caller's pins and resolutions apply as to a run (a local registry mirror, tests).
        let (resolve, pins) = super::net::caller_names()?;
        let policy = crate::proxy::policy::PolicyConfig {
            allow: step.allow.to_vec(),
            deny: Vec::new(),
            localhost_ports: Vec::new(),
            resolve,
            pins,
            broker: None,
        };
        Some(super::net::start_with(
            &policy,
            &step.scratch.join("net"),
            step.audit,
            &exe,
        )?)
    };
    let mut env = step.env.to_vec();
    if proxy.is_some() {
        let url = format!("http://127.0.0.1:{}", crate::vocab::PROXY_PORT);
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env.push(format!("{k}={url}"));
        }
    }
    let mount = RootMount::new(step.layers, Some((step.upper, &work)), &root)
        .map_err(io("preparing the step's root"))?;
    let init = crate::init::binary_beside(&exe);
    let proxy_dir = proxy.as_ref().map(|p| p.dir.as_path());
    // Close-on-exec: only the step's own stdout and stderr are made from it.
    let (r, w): (OwnedFd, OwnedFd) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
            what: "creating a pipe".into(),
            source: e.into(),
        })?;
    let prepared = Prepared {
        init: &init,
        proxy_dir,
        env: &env,
        root: &root,
        mount: &mount,
    };
    let mut child = if nix::unistd::geteuid().is_root() {
        rootful(step, &exe, &prepared, w)?
    } else {
        rootless(step, &prepared, w)?
    };
    let mut reader = BufReader::new(std::fs::File::from(r));
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => on_line(String::from_utf8_lossy(&line).trim_end_matches(['\n', '\r'])),
        }
    }
    let status = child.wait().map_err(io("waiting for the build step"))?;
    drop(proxy);
    // The runtime made mount points for its own files inside the image: not the step's. The
    // step wrote the upper dir: `run` there may be a link, never followed.
    remove_runtime_dirs(step.upper)?;
    Ok(super::exit_code(status))
}

/// What either runner starts a step with.
struct Prepared<'a> {
    init: &'a Path,
    proxy_dir: Option<&'a Path>,
    /// The step's environment with the proxy variables.
    env: &'a [String],
    /// Where the root is mounted.
    root: &'a Path,
    mount: &'a RootMount,
}

/// Root's step: libcontainer (the helper mounts the root in its private mount namespace).
fn rootful(step: &Step, exe: &Path, p: &Prepared, out: OwnedFd) -> Result<Child, RuntimeError> {
    let (init, proxy_dir, env, root, mount) = (p.init, p.proxy_dir, p.env, p.root, p.mount);
    let bundle = step.scratch.join("bundle");
    std::fs::create_dir_all(&bundle).map_err(io(format!("creating {}", bundle.display())))?;
    let id = format!(
        "aisb-build-{}-{}",
        std::process::id(),
        step.scratch
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
    );
    let spec_err = |e: crate::spec::SpecError| RuntimeError::Io {
        what: "writing the step's spec".into(),
        source: std::io::Error::other(e.to_string()),
    };
    let spec = crate::spec::build_step(&crate::spec::StepSpec {
        root,
        init,
        proxy_dir,
        args: step.argv,
        env,
        cwd: step.cwd,
        user: step.user,
        cgroups_path: format!("/aisb/{id}"),
    })
    .map_err(spec_err)?;
    let json = crate::spec::to_json(&spec).map_err(spec_err)?;
    std::fs::write(bundle.join("config.json"), json).map_err(io("writing the step's spec"))?;
    let out2 = out.try_clone().map_err(io("creating a pipe"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("__libcontainer")
        .arg(&bundle)
        .arg(step.scratch.join("state"))
        .arg(&id)
        .arg("--root-mount")
        .arg(&mount.arg)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(out2));
    die_with_parent(&mut cmd);
    cmd.spawn().map_err(io("starting the build step"))
}

/// If aisb dies, the step goes too; nothing aisb inherited reaches it (no descriptor beyond
/// 0-2, no socket activation that youki would keep open into the container).
fn die_with_parent(cmd: &mut Command) {
    for var in ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] {
        cmd.env_remove(var);
    }
    // SAFETY: prctl and close_range (or fcntl) are async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)?;
            super::cloexec_from(3)?;
            Ok(())
        });
    }
}

/// The first component of `target` (absolute) that is a symbolic link in the merged view of
/// `layers` (overlay directories, top first), as a path relative to the root. Each layer is
/// looked into only as far as it holds directories on the way, so nothing is followed on this
/// side either; a layer that an opaque directory hides still counts, and so does a path this
/// side cannot look into (a refusal too many, never one too few).
fn link_on_the_way(layers: &[PathBuf], target: &Path) -> Option<PathBuf> {
    let rel = target.strip_prefix("/").unwrap_or(target);
    let mut live: Vec<&Path> = layers.iter().map(PathBuf::as_path).collect();
    let mut at = PathBuf::new();
    for c in rel.components() {
        at.push(c);
        let mut next = Vec::new();
        for l in live {
            match std::fs::symlink_metadata(l.join(&at)) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                // A directory this side cannot look into (a layer's 0700 of another id): what
                // bwrap, root over those ids, would find there is unknown. Refused.
                Err(_) => return Some(at),
                Ok(m) if m.file_type().is_symlink() && next.is_empty() => return Some(at),
                Ok(m) if m.is_dir() => next.push(l),
                // A file or a whiteout on top hides everything below it; below a directory,
                // it is hidden.
                Ok(_) => break,
            }
        }
        if next.is_empty() {
            return None;
        }
        live = next;
    }
    None
}

/// The bwrap command line of an ordinary user's step (the sandbox's namespaces, root, mounts,
/// capabilities and the init's arguments); `block` and `info` are bwrap's descriptors.
fn rootless_argv(
    step: &Step,
    init: &Path,
    proxy_dir: Option<&Path>,
    env: &[String],
    root: &Path,
    block: i32,
    info: i32,
) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = Vec::new();
    let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
        a.extend(items.iter().map(|i| i.as_ref().to_os_string()));
    };
    push(&[
        &"--unshare-user",
        &"--unshare-pid",
        &"--unshare-net",
        &"--unshare-ipc",
        &"--unshare-uts",
        &"--unshare-cgroup-try",
        &"--userns-block-fd",
        &block.to_string(),
        &"--info-fd",
        &info.to_string(),
        &"--die-with-parent",
        &"--new-session",
        &"--hostname",
        &"aisb-build",
        &"--bind",
        &root,
        &"/",
        &"--proc",
        &"/proc",
        &"--dev",
        &"/dev",
        &"--ro-bind",
        &init,
        &crate::vocab::INIT_PATH,
    ]);
    if let Some(dir) = proxy_dir {
        push(&[&"--ro-bind", &dir, &crate::vocab::PROXY_DIR]);
    }
    // /proc's kernel interfaces masked as the rootful step's spec masks them (what this
    // kernel has: a directory becomes an empty read-only tmpfs, a file /dev/null).
    // Only /proc's: the step has no /sys, and a mount point made below the image's /sys would
    // land in its layer.
    for p in crate::spec::MASKED_PROC
        .iter()
        .filter(|p| p.starts_with("/proc/"))
    {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => {
                push(&[&"--perms", &"0555", &"--tmpfs", p, &"--remount-ro", p]);
            }
            Ok(_) => push(&[&"--ro-bind", &"/dev/null", p]),
            Err(_) => {}
        }
    }
    // Root keeps Docker's default set; another USER gets none (the init drops them all). The
    // init needs CAP_NET_ADMIN (for `lo`) and CAP_SETUID/SETGID (to become the step's user).
    let root_user = step.user.0 == 0;
    let mut caps: Vec<&str> = if root_user {
        crate::spec::STEP_CAPS.to_vec()
    } else {
        vec!["CAP_SETPCAP", "CAP_SETUID", "CAP_SETGID"]
    };
    caps.push("CAP_NET_ADMIN");
    push(&[&"--cap-drop", &"ALL"]);
    for c in caps {
        push(&[&"--cap-add", &c]);
    }
    push(&[&"--chdir", &step.cwd, &"--clearenv"]);
    for kv in env {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        push(&[&"--setenv", &k, &v]);
    }
    push(&[
        &crate::vocab::INIT_PATH,
        &"__init",
        &"--loopback",
        &format!("--user={}:{}", step.user.0, step.user.1),
    ]);
    if root_user {
        push(&[&"--keep-caps"]);
    }
    if proxy_dir.is_some() {
        push(&[&"--relay-proxy"]);
    }
    push(&[&"--"]);
    a.extend(step.argv.iter().map(Into::into));
    a
}

/// An ordinary user's step: bwrap, waiting while its user namespace gets the caller's map and
/// its mount namespace the step's root.
fn rootless(step: &Step, p: &Prepared, out: OwnedFd) -> Result<Child, RuntimeError> {
    let (init, proxy_dir, env, root, mount) = (p.init, p.proxy_dir, p.env, p.root, p.mount);
    let maps = crate::userns::caller_maps().map_err(|m| RuntimeError::Userns {
        what: "an ordinary user's RUN steps run over their subordinate ids".into(),
        source: std::io::Error::other(m.to_string()),
    })?;
    // bwrap makes its mount points by plain path walks below the new root while the host's
    // root is still reachable: a mount point that the image (a layer, an earlier step) made a
    // symbolic link would lead them out. Refused before anything starts.
    let mut merged = vec![step.upper.to_path_buf()];
    merged.extend(step.layers.iter().cloned());
    for target in [
        Path::new("/proc"),
        Path::new("/dev"),
        Path::new(crate::vocab::INIT_PATH),
        Path::new(crate::vocab::PROXY_DIR),
    ] {
        if let Some(link) = link_on_the_way(&merged, target) {
            return Err(RuntimeError::Io {
                what: format!(
                    "the image's /{} is a symbolic link, and the build step mounts {} there; make it a directory in the Dockerfile (or the base image)",
                    link.display(),
                    target.display()
                ),
                source: std::io::ErrorKind::InvalidInput.into(),
            });
        }
    }
    // The new layer's root is the step's "/": root's, as in root's build (aisb made it, so it
    // is the caller's until then).
    let upper = std::path::absolute(step.upper).map_err(io("locating the step's layer"))?;
    crate::userns::spawn(&[
        "chown".into(),
        upper.into_os_string(),
        "0".into(),
        "0".into(),
    ])
    .and_then(|mut c| {
        drop(c.stdin.take());
        crate::userns::finish(c, "giving the step's root to root")
    })
    .map_err(|source| RuntimeError::Userns {
        what: "preparing an ordinary user's build step".into(),
        source,
    })?;
    let pipe = || {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
            what: "creating a pipe".into(),
            source: e.into(),
        })
    };
    let (info_r, info_w) = pipe()?;
    let (block_r, block_w) = pipe()?;
    let argv = rootless_argv(
        step,
        init,
        proxy_dir,
        env,
        root,
        block_r.as_raw_fd(),
        info_w.as_raw_fd(),
    );
    let out2 = out.try_clone().map_err(io("creating a pipe"))?;
    let mut cmd = Command::new("bwrap");
    cmd.args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(out2));
    let (b, i) = (block_r.as_raw_fd(), info_w.as_raw_fd());
    // SAFETY: fcntl and prctl are async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            // Only bwrap's two descriptors (and the output on 1-2) reach the step.
            super::cloexec_from(3)?;
            for fd in [b, i] {
                nix::fcntl::fcntl(
                    fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )?;
            }
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| RuntimeError::Spawn {
        program: "bwrap".into(),
        source,
    })?;
    drop((block_r, info_w));
    let prepared = (|| {
        let pid = super::bwrap::read_child_pid(info_r)?;
        crate::userns::write_maps(pid, &maps)?;
        mount.mount_into(pid).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("mounting the step's root (overlayfs in a user namespace): {e}"),
            )
        })
    })();
    if let Err(e) = prepared {
        // Killed before it is unblocked: nothing runs without its map and root.
        let _ = child.kill();
        let _ = child.wait();
        return Err(RuntimeError::Userns {
            what: "preparing an ordinary user's build step".into(),
            source: e,
        });
    }
    nix::unistd::write(&block_w, b"1").map_err(|e| RuntimeError::Io {
        what: "starting the build step".into(),
        source: e.into(),
    })?;
    Ok(child)
}

/// Remove `run/aisb` (the mount points the runtime made for its own files) from a step's upper
/// directory, following no link the step may have put on that path. An ordinary user's steps
/// leave it in a directory owned by a subordinate id: removed from inside their namespace.
fn remove_runtime_dirs(upper: &Path) -> Result<(), RuntimeError> {
    let run = crate::beneath::Dir::open(upper).and_then(|d| d.dir(Path::new("run"), false));
    let Ok(run) = run else {
        return Ok(());
    };
    match run.remove_all(std::ffi::OsStr::new("aisb"), 64) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) if !nix::unistd::geteuid().is_root() => {
            // `run` is a real directory (opened above without following a link), so is its
            // path: the helper removes `run/aisb` beneath it, again following no link.
            crate::userns::remove_trees(&[upper.join("run").join("aisb")]).map_err(io(
                "removing the runtime's mount points from the step's layer",
            ))
        }
        Err(e) => Err(io(
            "removing the runtime's mount points from the step's layer",
        )(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    /// Mount points an image made links (in the new layer or a layer below, as a relative
    /// path out of the root or an absolute one) are found, however deep on the way; a link
    /// hidden below a directory of a higher layer is not one.
    #[test]
    fn a_mount_point_made_a_link_by_the_image_is_found() {
        use std::path::{Path, PathBuf};
        let t = tempfile::tempdir().unwrap();
        let (upper, lower) = (t.path().join("upper"), t.path().join("lower"));
        for d in [&upper, &lower] {
            std::fs::create_dir_all(d).unwrap();
        }
        let layers = [upper.clone(), lower.clone()];
        let init = Path::new(crate::vocab::INIT_PATH);
        assert_eq!(super::link_on_the_way(&layers, init), None);
        symlink("../oldroot/home/user", lower.join("run")).unwrap();
        assert_eq!(
            super::link_on_the_way(&layers, init),
            Some(PathBuf::from("run"))
        );
        // A directory above hides the lower layer's link.
        std::fs::create_dir_all(upper.join("run")).unwrap();
        assert_eq!(super::link_on_the_way(&layers, init), None);
        symlink("/oldroot/tmp", upper.join("run/aisb")).unwrap();
        assert_eq!(
            super::link_on_the_way(&layers, init),
            Some(PathBuf::from("run/aisb"))
        );
        symlink("/", upper.join("dev")).unwrap();
        assert_eq!(
            super::link_on_the_way(&layers, Path::new("/dev")),
            Some(PathBuf::from("dev"))
        );
        assert_eq!(super::link_on_the_way(&layers, Path::new("/proc")), None);
    }

    /// A step that made `/run` a link to a host directory: the cleanup removes nothing there.
    #[test]
    fn cleanup_never_follows_a_link_the_step_made() {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host");
        std::fs::create_dir_all(host.join("aisb")).unwrap();
        std::fs::write(host.join("aisb/keep"), "k").unwrap();
        let upper = t.path().join("upper");
        std::fs::create_dir_all(&upper).unwrap();
        symlink(&host, upper.join("run")).unwrap();
        super::remove_runtime_dirs(&upper).unwrap();
        assert!(host.join("aisb/keep").exists());
        // The real thing is removed.
        std::fs::remove_file(upper.join("run")).unwrap();
        std::fs::create_dir_all(upper.join("run/aisb/init")).unwrap();
        super::remove_runtime_dirs(&upper).unwrap();
        assert!(!upper.join("run/aisb").exists());
        assert!(upper.join("run").is_dir());
    }
}
