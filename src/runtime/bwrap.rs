//! Start a bundle with bubblewrap, forwarding signals to the sandbox's init.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use oci_spec::runtime::Spec;

use super::{exit_code, RuntimeError};

/// `rootfs_symlinks`: (link inside, target), recreated on bwrap's empty root.
/// `cgroup_procs`: the `cgroup.procs` of the sandbox's cgroup (see `cgroup`), which bwrap's
/// process joins before it starts: bwrap has no cgroup support of its own.
pub fn run(
    spec: &Spec,
    rootfs_symlinks: Vec<(PathBuf, PathBuf)>,
    interactive: bool,
    pid_file: Option<&std::path::Path>,
    root_mount: Option<&super::rootmount::RootMount>,
    cgroup_procs: Vec<std::os::fd::RawFd>,
    mut live: Option<&mut super::live::Live>,
    mask_file: Option<&std::path::Path>,
) -> Result<i32, RuntimeError> {
    let root_mount = root_mount.cloned();
    // The init tells the live mask layer when the sandbox is complete (bwrap's info pipe
    // reports its pid before it has mounted anything).
    let ready = live.as_ref().and_then(|l| l.ready_fd());
    let mut spec = spec.clone();
    if let (Some(fd), Some(process)) = (ready, spec.process_mut()) {
        if let Some(mut args) = process.args().clone() {
            if args.get(1).is_some_and(|a| a == "__init") {
                args.insert(2, format!("--ready-fd={fd}"));
                process.set_args(Some(args));
            }
        }
    }
    let spec = &spec;
    let io = |what: &str| {
        let what = what.to_string();
        move |source| RuntimeError::Io { what, source }
    };
    let mut inputs = aisb_bwrap::inputs(spec, rootfs_symlinks);
    inputs.mask_file = mask_file.map(std::path::Path::to_path_buf);
    let (info_r, info_w): (OwnedFd, OwnedFd) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| RuntimeError::Io {
            what: "creating a pipe".into(),
            source: e.into(),
        })?;
    inputs.info_fd = Some(info_w.as_raw_fd());
    // Only an `aisb up` on a terminal keeps a session: its own pseudo-terminal (below) is the
    // controlling one. Any other run gets a new session, or /dev/tty inside would be the
    // caller's terminal, unfiltered.
    let input = !super::detached();
    let controlling = {
        use std::io::IsTerminal;
        interactive && input && std::io::stdin().is_terminal()
    };
    inputs.new_session = !controlling;
    // An ordinary user's image root, when they have subordinate ids: bwrap's user namespace
    // gets their map (as the image's RUN steps had, see `step`), so every file keeps the owner
    // the image gave it; bwrap waits while the map is written and the root mounted into its
    // mount namespace. Without subordinate ids: the root is mounted in a user namespace that
    // maps the caller alone (`RootMount::apply`), the image's other owners shown as nobody.
    let mapped = match &root_mount {
        Some(_) if !nix::unistd::geteuid().is_root() => crate::userns::caller_maps().ok(),
        _ => None,
    };
    let block = match mapped {
        Some(_) => Some(
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
                what: "creating a pipe".into(),
                source: e.into(),
            })?,
        ),
        None => None,
    };
    inputs.userns_block_fd = block.as_ref().map(|(r, _)| r.as_raw_fd());
    let block_r = inputs.userns_block_fd;
    let apply_mount = if mapped.is_some() {
        None
    } else {
        root_mount.clone()
    };
    let args = aisb_bwrap::argv(spec, &inputs)?;

    // Signals meant for the sandbox are taken here and sent to its init, which forwards them
    // to the workload; bwrap itself ignores the terminal's (it would die and SIGKILL everything).
    // The caller's terminal is never the sandbox's: aisb's own pseudo-terminal stands
    // between, and what the sandbox prints reaches the terminal filtered. With an `aisb up`
    // on a terminal it is the sandbox's controlling terminal and follows the window (only
    // then: another thread may be waiting for SIGWINCH, a session of a named sandbox while
    // this run holds its place). Signals are taken before the guard starts its threads, so
    // that none of them is where a SIGWINCH lands.
    let relay = if interactive {
        super::console::Relay::Full
    } else {
        super::console::Relay::Lines
    };
    let (blocked, set) = super::take_signals(interactive, controlling)?;
    let mut guard = match super::console::TerminalGuard::install(relay, input) {
        Ok(g) => g,
        Err(e) => {
            let _ = blocked.thread_unblock();
            return Err(io("giving the sandbox a terminal")(e));
        }
    };
    let resize = guard
        .as_ref()
        .filter(|g| g.controls_input())
        .map(super::console::TerminalGuard::resizer);
    let mut cmd = aisb_bwrap::command(&args);
    let w = info_w.as_raw_fd();
    // SAFETY: runs between fork and exec while other threads may run: only async-signal-safe
    // calls (write to cgroup.procs, fcntl, sigaction, and `RootMount::apply`'s unshare/open/write/mount on strings it
    // prepared before); nix's errors convert to io::Error without allocating.
    unsafe {
        cmd.pre_exec(move || {
            // First, so that nothing the sandbox starts is ever outside its limits.
            super::cgroup::join(&cgroup_procs)?;
            // Nothing aisb inherited reaches the sandbox: every descriptor but the ones bwrap
            // and the init are given below.
            super::cloexec_from(3)?;
            nix::fcntl::fcntl(
                w,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
            )?;
            for fd in [ready, block_r].into_iter().flatten() {
                nix::fcntl::fcntl(
                    fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
                )?;
            }
            for s in [Signal::SIGINT, Signal::SIGQUIT] {
                nix::sys::signal::signal(s, nix::sys::signal::SigHandler::SigIgn)?;
            }
            if let Some(m) = &apply_mount {
                m.apply()?;
            }
            if controlling {
                super::console::take_controlling_terminal()?;
            }
            Ok(())
        });
    }
    if let Some(g) = &guard {
        g.apply(&mut cmd)
            .map_err(io("giving the sandbox a terminal"))?;
    }
    if super::detached() {
        cmd.stdin(std::process::Stdio::null());
    }
    let spawned = cmd.spawn();
    // The command keeps its copies of the terminal's descriptors: gone with it, so that the
    // relay sees the end of the sandbox's output when the sandbox ends.
    drop(cmd);
    if let Some(g) = guard.as_mut() {
        g.spawned();
    }
    drop(info_w);
    if let Some(l) = live.as_mut() {
        l.spawned();
    }
    let mut child = match spawned {
        Ok(c) => c,
        Err(source) => {
            let _ = blocked.thread_unblock();
            return Err(RuntimeError::Spawn {
                program: "bwrap".into(),
                source,
            });
        }
    };
    let init_pid = match (block, &mapped, &root_mount) {
        (Some((block_r, block_w)), Some(maps), Some(m)) => {
            drop(block_r);
            let mut sandbox_pid = None;
            let prepared = read_child_pid(info_r).and_then(|pid| {
                sandbox_pid = Some(pid);
                crate::userns::write_maps(pid, maps)?;
                m.mount_into(pid).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("mounting the image's root (overlayfs in a user namespace): {e}"),
                    )
                })?;
                Ok(pid)
            });
            match prepared {
                Ok(pid) => {
                    nix::unistd::write(&block_w, b"1").map_err(|e| RuntimeError::Io {
                        what: "starting bwrap".into(),
                        source: e.into(),
                    })?;
                    Some(Pid::from_raw(pid))
                }
                Err(source) => {
                    // Killed while it waits, the sandbox's first process too (it would wait
                    // for its monitor forever): nothing runs without its map and root.
                    if let Some(pid) = sandbox_pid {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                    let _ = child.kill();
                    let _ = child.wait();
                    let _ = blocked.thread_unblock();
                    return Err(RuntimeError::Userns {
                        what: "preparing the sandbox's user namespace over the subordinate ids"
                            .into(),
                        source,
                    });
                }
            }
        }
        _ => {
            let mut info = String::new();
            let _ = std::fs::File::from(info_r).read_to_string(&mut info);
            serde_json::from_str::<serde_json::Value>(&info)
                .ok()
                .and_then(|v| v["child-pid"].as_i64())
                .map(|p| Pid::from_raw(p as i32))
        }
    };
    if let (Some(l), Some(pid)) = (&live, init_pid) {
        l.init_pid(pid.as_raw());
    }
    if let (Some(f), Some(pid)) = (pid_file, init_pid) {
        let _ = std::fs::write(f, pid.to_string());
    }
    let bwrap_pid = Pid::from_raw(child.id() as i32);
    std::thread::spawn(move || loop {
        match set.wait() {
            // Our window resized: the sandbox's terminal follows (and tells its foreground).
            Ok(Signal::SIGWINCH) => match resize {
                Some(r) => r.resize(),
                None => {
                    let _ = kill(init_pid.unwrap_or(bwrap_pid), Signal::SIGWINCH);
                }
            },
            Ok(sig) => {
                let _ = kill(init_pid.unwrap_or(bwrap_pid), sig);
            }
            Err(_) => {}
        }
    });
    let status = child.wait().map_err(io("waiting for bwrap"))?;
    if let Some(g) = guard {
        g.finish();
    }
    Ok(exit_code(status))
}

/// bwrap's `--info-fd` JSON (`{"child-pid": N, ...}`), read up to its closing brace (bwrap
/// keeps the descriptor open while it waits on `--userns-block-fd`), at most 4 KiB.
pub(crate) fn read_child_pid(info: OwnedFd) -> std::io::Result<i32> {
    let mut f = std::fs::File::from(info);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    while !buf.contains(&b'}') && buf.len() < 4096 {
        let n = f.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf);
    let end = text.find('}').map_or(text.len(), |e| e + 1);
    serde_json::from_str::<serde_json::Value>(&text[..end])
        .ok()
        .and_then(|v| v["child-pid"].as_i64())
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| std::io::Error::other("bwrap did not report its sandbox's pid"))
}
