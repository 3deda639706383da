//! One `RUN` step in aisb's own sandbox: libcontainer, root inside a user namespace, the
//! image's layers below an overlay whose upper directory becomes the step's layer, the network
//! only through the proxy (default: the `registries` group).

use std::io::{BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::rootmount::RootMount;

pub struct StepRun<'a> {
    /// The layers below, top first (at least one: an empty directory for `FROM scratch`).
    pub layers: &'a [PathBuf],
    /// The new layer (the overlay's upper directory).
    pub upper: &'a Path,
    /// A scratch directory on the store's filesystem (overlay work dir, bundle).
    pub scratch: &'a Path,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub user: (u32, u32),
    /// Domain rules the step may reach through the proxy; empty: no network at all.
    pub allow: Vec<String>,
    /// Where the proxy's decisions are logged.
    pub audit: PathBuf,
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum StepError {
    #[error("building an image's RUN steps needs root for now (they run as root in a user namespace mapping 65,536 ids)")]
    #[diagnostic(help("build it as root (in CI, say) and push it to a registry, then use it as it is: `rootfs from=\"REF\"` (an ordinary user can pull and run images)"))]
    NotRoot,
    #[error("{what}: {source}")]
    #[diagnostic(help("`aisb doctor` checks the host"))]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    #[diagnostic(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StepError {
    let what = what.into();
    move |source| StepError::Io { what, source }
}

/// Run the step; every line it prints goes to `on_line`. Returns its exit code.
pub fn run(step: &StepRun, on_line: &mut dyn FnMut(&str)) -> Result<i32, StepError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(StepError::NotRoot);
    }
    let exe = std::env::current_exe().map_err(io("locating the aisb binary"))?;
    let work = step.scratch.join("work");
    let bundle = step.scratch.join("bundle");
    let root = bundle.join("rootfs");
    for d in [&work, &root] {
        std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
    }
    let proxy = if step.allow.is_empty() {
        None
    } else {
        // The caller's pins and resolutions apply as to a run (a local registry mirror, tests).
        let (resolve, pins) = crate::runtime::net::caller_names()?;
        let policy = crate::proxy::policy::PolicyConfig {
            allow: step.allow.clone(),
            deny: Vec::new(),
            localhost_ports: Vec::new(),
            resolve,
            pins,
        };
        Some(crate::runtime::net::start_with(
            &policy,
            &step.scratch.join("net"),
            &step.audit,
            &exe,
        )?)
    };
    let mut env = step.env.clone();
    if proxy.is_some() {
        let url = format!("http://127.0.0.1:{}", crate::vocab::PROXY_PORT);
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env.push(format!("{k}={url}"));
        }
    }
    let id = format!(
        "aisb-build-{}-{}",
        std::process::id(),
        step.scratch
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
    );
    let spec = crate::spec::build_step(&crate::spec::StepSpec {
        root: &root,
        init: &crate::init::binary_beside(&exe),
        proxy_dir: proxy.as_ref().map(|p| p.dir.as_path()),
        args: &step.argv,
        env: &env,
        cwd: &step.cwd,
        user: step.user,
        cgroups_path: format!("/aisb/{id}"),
    })
    .map_err(|e| StepError::Io {
        what: "writing the step's spec".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let json = crate::spec::to_json(&spec).map_err(|e| StepError::Io {
        what: "writing the step's spec".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    std::fs::write(bundle.join("config.json"), json).map_err(io("writing the step's spec"))?;
    let mount = RootMount::new(step.layers, Some((step.upper, &work)), &root)
        .map_err(io("preparing the step's root"))?;

    let (r, w): (OwnedFd, OwnedFd) = nix::unistd::pipe().map_err(|e| StepError::Io {
        what: "creating a pipe".into(),
        source: e.into(),
    })?;
    let w2 = w.try_clone().map_err(io("creating a pipe"))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("__libcontainer")
        .arg(&bundle)
        .arg(step.scratch.join("state"))
        .arg(&id)
        .arg("--root-mount")
        .arg(&mount.arg)
        .stdin(Stdio::null())
        .stdout(Stdio::from(w))
        .stderr(Stdio::from(w2));
    // SAFETY: prctl is async-signal-safe. If aisb dies, the step goes too.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(io("starting the build step"))?;
    drop(cmd);
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
    remove_runtime_dirs(&step.upper);
    Ok(crate::runtime::exit_code(status))
}

/// Remove `run/aisb` (the mount points the runtime made for its own files) from a step's upper
/// directory, following no link the step may have put on that path.
fn remove_runtime_dirs(upper: &std::path::Path) {
    let run =
        crate::beneath::Dir::open(upper).and_then(|d| d.dir(std::path::Path::new("run"), false));
    if let Ok(run) = run {
        let _ = run.remove_all(std::ffi::OsStr::new("aisb"), 64);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

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
        super::remove_runtime_dirs(&upper);
        assert!(host.join("aisb/keep").exists());
        // The real thing is removed.
        std::fs::remove_file(upper.join("run")).unwrap();
        std::fs::create_dir_all(upper.join("run/aisb/init")).unwrap();
        super::remove_runtime_dirs(&upper);
        assert!(!upper.join("run/aisb").exists());
        assert!(upper.join("run").is_dir());
    }
}
