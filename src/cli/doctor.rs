use serde::Serialize;

use crate::Error;

/// Check the kernel and host: which backend will work here, and why not
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  aisb doctor\n  aisb doctor --json")]
pub struct Args {
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

#[derive(Debug, Serialize)]
struct Backend {
    name: &'static str,
    works: bool,
    why: String,
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Try a namespace flag in a short-lived child (this process stays as it was).
fn can_unshare(flags: nix::sched::CloneFlags) -> Result<(), String> {
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    // SAFETY: the child only calls unshare(2) and _exit(2), both async-signal-safe, so it is
    // sound whatever threads this process runs.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let code = if nix::sched::unshare(flags).is_ok() {
                0
            } else {
                1
            };
            // SAFETY: _exit ends the child without running the parent's destructors.
            unsafe { nix::libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            _ => Err("refused".into()),
        },
        Err(e) => Err(e.to_string()),
    }
}

/// Whether an ordinary user's RUN steps work here: subordinate ids and the setuid mappers
/// (`userns::caller_maps`), bwrap, and overlayfs mounted in a user namespace of their own.
fn rootless_builds(root: bool) -> Check {
    let name = "rootless image builds";
    if root {
        return Check {
            name,
            ok: true,
            detail: "root builds with libcontainer (ids 0-65535 of its own); for an ordinary user run `aisb doctor` as them".into(),
        };
    }
    let fail = |detail: String| Check {
        name,
        ok: false,
        detail,
    };
    let maps = match crate::userns::caller_maps() {
        Ok(m) => m,
        Err(m) => {
            return fail(format!(
                "{m}: RUN steps need it (one-time, as root: `aisb setup-user {}`)",
                nix::unistd::User::from_uid(nix::unistd::getuid())
                    .ok()
                    .flatten()
                    .map_or_else(|| "USER".into(), |u| u.name)
            ))
        }
    };
    if let Err(e) = overlay_in_userns() {
        return fail(format!(
            "overlayfs cannot be mounted in a user namespace here ({e}; Linux 5.11+ allows it)"
        ));
    }
    let ids: u32 = maps.uid.iter().map(|r| r.2).sum();
    Check {
        name,
        ok: true,
        detail: format!("RUN steps run as root over {ids} of your subordinate ids (bwrap, overlayfs with userxattr)"),
    }
}

/// Mount an overlay of two empty directories in a user and mount namespace of a child's own.
fn overlay_in_userns() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("aisb-doctor-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["l", "u", "w", "m"] {
        std::fs::create_dir_all(dir.join(d)).map_err(|e| e.to_string())?;
    }
    let r = overlay_probe(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn overlay_probe(dir: &std::path::Path) -> Result<(), String> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let p = |d: &str| dir.join(d);
    let data = CString::new(format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        p("l").display(),
        p("u").display(),
        p("w").display()
    ))
    .map_err(|e| e.to_string())?;
    let target = CString::new(p("m").as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let maps = [
        (
            c"/proc/self/setgroups",
            CString::new("deny").unwrap_or_default(),
        ),
        (
            c"/proc/self/uid_map",
            CString::new(format!("{uid} {uid} 1")).unwrap_or_default(),
        ),
        (
            c"/proc/self/gid_map",
            CString::new(format!("{gid} {gid} 1")).unwrap_or_default(),
        ),
    ];
    // SAFETY: the child makes raw syscalls on strings prepared before the fork and _exits.
    unsafe {
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error().to_string()),
            0 => {
                let mut ok = libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0;
                for (file, text) in &maps {
                    let fd = libc::open(file.as_ptr(), libc::O_WRONLY);
                    let n = text.as_bytes().len();
                    ok = ok && fd >= 0 && libc::write(fd, text.as_ptr().cast(), n) == n as isize;
                    libc::close(fd);
                }
                ok = ok
                    && libc::mount(
                        c"overlay".as_ptr(),
                        target.as_ptr(),
                        c"overlay".as_ptr(),
                        0,
                        data.as_ptr().cast(),
                    ) == 0;
                libc::_exit(if ok {
                    0
                } else {
                    *libc::__errno_location() % 256
                })
            }
            child => {
                let mut status = 0;
                libc::waitpid(child, &mut status, 0);
                match libc::WEXITSTATUS(status) {
                    0 if libc::WIFEXITED(status) => Ok(()),
                    e => Err(std::io::Error::from_raw_os_error(e).to_string()),
                }
            }
        }
    }
}

fn checks() -> Vec<Check> {
    use nix::sched::CloneFlags as F;
    let mut c = Vec::new();
    let root = nix::unistd::geteuid().is_root();
    let kernel = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    c.push(Check {
        name: "kernel",
        ok: true,
        detail: kernel,
    });
    c.push(Check {
        name: "caller",
        ok: true,
        detail: if root {
            "root".into()
        } else {
            "unprivileged user".into()
        },
    });
    let max = read("/proc/sys/user/max_user_namespaces").unwrap_or_else(|| "?".into());
    let userns = can_unshare(F::CLONE_NEWUSER);
    c.push(Check {
        name: "user namespaces",
        ok: userns.is_ok(),
        detail: match &userns {
            Ok(()) => format!("allowed (max_user_namespaces={max})"),
            Err(e) => format!(
                "{e}: max_user_namespaces={max}, unprivileged_userns_clone={}",
                read("/proc/sys/kernel/unprivileged_userns_clone").unwrap_or_else(|| "n/a".into())
            ),
        },
    });
    if let Some(v) = read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") {
        c.push(Check { name: "AppArmor userns restriction", ok: v == "0" || root, detail: if v == "0" {
            "off".into()
        } else {
            "on: unprivileged user namespaces need an AppArmor profile for bwrap/aisb (or sysctl kernel.apparmor_restrict_unprivileged_userns=0)".into()
        }});
    }
    let netns = can_unshare(F::CLONE_NEWUSER | F::CLONE_NEWNET);
    c.push(Check {
        name: "network namespaces",
        ok: netns.is_ok(),
        detail: netns.err().unwrap_or_else(|| "allowed".into()),
    });
    let overlay =
        read("/proc/filesystems").is_some_and(|f| f.lines().any(|l| l.ends_with("\toverlay")));
    c.push(Check {
        name: "overlayfs",
        ok: overlay,
        detail: if overlay {
            "available".into()
        } else {
            "not in /proc/filesystems (modprobe overlay); copy-on-write mounts will fail".into()
        },
    });
    let cg = if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "v2 (unified)"
    } else if std::path::Path::new("/sys/fs/cgroup/unified").exists() {
        "v1 + v2 (hybrid)"
    } else {
        "v1"
    };
    c.push(Check {
        name: "cgroups",
        ok: true,
        detail: cg.into(),
    });
    // Moving a thread group into a cgroup (`cgroup.procs`) waits for an RCU grace period
    // unless a hierarchy is mounted with `favordynmods` (the lock is shared by all
    // hierarchies): measured on a 2-core cgroup v1 host, 9 ms median per move. aisb's own moves
    // on v1 go through `tasks` (one thread, no such lock); youki's (libcontainer) and v2's
    // cannot.
    let mounts = read("/proc/mounts").unwrap_or_default();
    let fast = mounts
        .lines()
        .any(|l| l.contains(" cgroup") && l.contains("favordynmods"));
    let v2_at = if cg == "v2 (unified)" {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/unified"
    };
    c.push(Check {
        name: "cgroup migrations",
        ok: true,
        detail: {
            let who = if cg == "v2 (unified)" {
                "each sandbox start"
            } else {
                "bwrap sandboxes and sessions enter their cgroups at once (one thread, through `tasks`); each libcontainer start"
            };
            if fast {
                "fast (a cgroup hierarchy is mounted with favordynmods)".into()
            } else if std::path::Path::new(v2_at).exists() {
                format!("{who} waits for an RCU grace period to move a process into its cgroup (~9 ms measured on an idle 2-core host, more when the CPUs are busy); as root, `mount -o remount,favordynmods {v2_at}` removes that wait for every cgroup move on this host (at a small cost to fork and exit)")
            } else {
                format!("{who} waits for an RCU grace period to move a process into its cgroup (~9 ms measured on an idle 2-core host; no cgroup2 mount to set favordynmods on)")
            }
        },
    });
    let (ok, detail) = crate::runtime::limits::describe(&crate::eval::plan::Limits::default());
    c.push(Check {
        name: "resource limits",
        ok,
        detail,
    });
    let seccomp = read("/proc/self/status").is_some_and(|s| s.contains("Seccomp:"))
        && read("/proc/sys/kernel/seccomp/actions_avail").is_some_and(|a| a.contains("errno"));
    c.push(Check {
        name: "seccomp",
        ok: seccomp,
        detail: if seccomp {
            "filters with errno available".into()
        } else {
            "not available: aisb refuses to run without its seccomp filter".into()
        },
    });
    let bwrap = std::process::Command::new("bwrap")
        .arg("--version")
        .output();
    c.push(match bwrap {
        Ok(o) if o.status.success() => Check {
            name: "bwrap",
            ok: true,
            detail: String::from_utf8_lossy(&o.stdout).trim().into(),
        },
        _ => Check {
            name: "bwrap",
            ok: false,
            detail: "not found (Debian: apt-get install bubblewrap)".into(),
        },
    });
    c.push(rootless_builds(root));
    // Which binary the sandboxes' init is: either works; aisb-init starts faster.
    let detail = match std::env::current_exe().map(|e| crate::init::choose(&e)) {
        Ok(crate::init::InitChoice::Beside(p)) => format!("{} (this build's)", p.display()),
        Ok(crate::init::InitChoice::Missing) => {
            "aisb itself (no aisb-init beside it; `cargo build` or `cargo install` makes one, which starts faster)".into()
        }
        Ok(crate::init::InitChoice::Other(p)) => format!(
            "aisb itself ({} is from other sources, so it is not used; `cargo build` rebuilds it)",
            p.display()
        ),
        Err(e) => format!("aisb itself (cannot locate aisb: {e})"),
    };
    c.push(Check {
        name: "sandbox init",
        ok: true,
        detail,
    });
    c.push(toolchains());
    c
}

/// Which PATH entries below the home the embedded default shows (known toolchain managers,
/// read-only) and which it hides: a command found there on the host is "not found" inside.
fn toolchains() -> Check {
    use crate::eval::toolchains::{below_home, hidden_path_entries, manager_for};
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    let path = std::env::var("PATH").unwrap_or_default();
    let mut shown: Vec<&str> = path
        .split(':')
        .filter(|e| below_home(&home, e).is_some())
        .filter_map(|e| manager_for(&home, e).map(|m| m.name))
        .collect();
    shown.dedup();
    let hidden = hidden_path_entries(&home, &path);
    let mut detail = if shown.is_empty() {
        "none of PATH is below the home".to_string()
    } else {
        format!("read-only inside: {}", shown.join(", "))
    };
    if !hidden.is_empty() {
        detail.push_str(&format!(
            "; hidden inside (no known toolchain there): {} — `mount \"{}\" access=\"ro\"` in sandbox.kdl shows one",
            hidden.join(", "),
            hidden[0]
        ));
    }
    Check {
        name: "toolchains in the home",
        ok: true,
        detail,
    }
}

fn backends(c: &[Check]) -> Vec<Backend> {
    let ok = |n: &str| c.iter().find(|x| x.name == n).is_none_or(|x| x.ok);
    let root = nix::unistd::geteuid().is_root();
    let base = [
        "user namespaces",
        "network namespaces",
        "seccomp",
        "AppArmor userns restriction",
    ];
    let missing: Vec<&str> = base.iter().copied().filter(|n| !ok(n)).collect();
    let bwrap = if !ok("bwrap") {
        Backend {
            name: "bwrap",
            works: false,
            why: "bwrap is not installed".into(),
        }
    } else if !missing.is_empty() {
        Backend {
            name: "bwrap",
            works: false,
            why: format!("missing: {}", missing.join(", ")),
        }
    } else {
        // bubblewrap itself mounts no overlayfs; aisb's init mounts them when it may.
        let cow = if ok("overlayfs") && root {
            "copy-on-write directories are overlayfs, mounted by aisb's init"
        } else if ok("overlayfs") {
            "copy-on-write directories are overlayfs, mounted by aisb's init in a mount namespace of its own"
        } else {
            "a copy-on-write directory is refused: no overlayfs on this kernel"
        };
        Backend {
            name: "bwrap",
            works: true,
            why: format!("all checks pass ({cow})"),
        }
    };
    let rootless = if root {
        Ok(())
    } else {
        crate::runtime::rootless::prepare_for_caller().map(|_| ())
    };
    let lc = if let Err(e) = rootless {
        let help = miette::Diagnostic::help(&e)
            .map(|h| format!(" ({h})"))
            .unwrap_or_default();
        Backend {
            name: "libcontainer",
            works: false,
            why: format!("rootless: {e}{help}"),
        }
    } else if !missing.is_empty() {
        Backend {
            name: "libcontainer",
            works: false,
            why: format!("missing: {}", missing.join(", ")),
        }
    } else {
        Backend {
            name: "libcontainer",
            works: true,
            why: if root {
                "all checks pass".into()
            } else {
                "all checks pass (rootless: subordinate ids for container root, delegated cgroup)"
                    .into()
            },
        }
    };
    vec![bwrap, lc]
}

pub fn run(a: Args) -> Result<i32, Error> {
    let c = checks();
    let b = backends(&c);
    if a.json {
        println!("{}", serde_json::json!({ "checks": c, "backends": b }));
    } else {
        for x in &c {
            println!(
                "{:<5} {:<28} {}",
                if x.ok { "ok" } else { "FAIL" },
                x.name,
                x.detail
            );
        }
        println!();
        for x in &b {
            println!(
                "{:<14} {}  {}",
                x.name,
                if x.works { "works" } else { "WILL NOT WORK" },
                x.why
            );
        }
    }
    if !a.json {
        let chosen = crate::runtime::Backend::default_for_caller();
        println!(
            "\ndefault backend: {} (choose with --backend or `backend` in sandbox.kdl)",
            clap::ValueEnum::to_possible_value(&chosen)
                .map_or_else(String::new, |v| v.get_name().to_string())
        );
    }
    Ok(if b.iter().any(|x| x.works) { 0 } else { 1 })
}
