//! Command line: clap structs, one file per subcommand.

mod attach_helper;
mod audit;
mod build;
mod check;
mod completions;
mod devcontainer;
mod doctor;
mod export;
mod init;
mod libcontainer_helper;
mod lsp;
mod man;
mod mask_helper;
mod plan;
mod presets;
mod proxy;
mod proxy_serve;
mod run;
mod sandboxes;
mod selftest;
mod setup_apparmor;
mod setup_user;
mod spec;
mod store;
mod suggest;
mod tasks;
mod tasks_export;
mod trust;
mod up;
mod why;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

pub use devcontainer::DevcontainerError;
pub use setup_apparmor::ApparmorError;

use crate::eval::{self, Host, Loaded, Request, Root};
use crate::Error;

const EXAMPLES: &str = "\
Examples:
  aisb up                        your shell in the sandbox
  aisb run -- make test          run a command in the sandbox
  aisb run --profile investigate -- claude -p \"review this\"
  aisb init                      write a commented sandbox.kdl
  aisb check                     validate sandbox.kdl (all profiles)
  aisb plan                      show mounts, masked paths, env and network
  aisb plan --profile investigate
  aisb spec > config.json        the OCI runtime spec
  aisb export bundle /tmp/b      a bundle any OCI runtime (runc) can run
  aisb audit --blocked-only      what the sandbox's network policy refused
  aisb why .env                  which rule masks it, where it is written, what changes it
  aisb suggest                   the sandbox.kdl lines the last run's refusals call for (a diff)
  aisb up fix-42                 a named sandbox: its own shared clone, synced both ways
  aisb ls                        this repository's named sandboxes
  aisb rm fix-42                 remove one (refused while it has unsynced commits)
  aisb gc                        remove what old and orphaned sandboxes left
  aisb test                      attack the sandbox from inside: expected vs observed
  aisb store ls                  the content-addressed store: entries, sizes, users

Exit status:
  0    success
  1    the configuration has errors (`aisb check` says which)
  2    usage error (a wrong command line)
  125  aisb could not do it: the sandbox could not start, nothing was run
  N    `run`, `up` and `exec` exit with their command's own status";

#[derive(Debug, Parser)]
#[command(name = "aisb", version, about = "Run AI coding agents and any command in a sandbox described by sandbox.kdl",
    after_help = EXAMPLES, propagate_version = true)]
pub struct Cli {
    /// The configuration file (default: sandbox.kdl in this directory or a parent, up to the
    /// repository root; the embedded default when there is none)
    #[arg(short = 'f', long = "file", global = true, value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// Run as if started in DIR
    #[arg(short = 'C', global = true, value_name = "DIR")]
    pub chdir: Option<PathBuf>,
    /// Rescan the project even when the cached scan is still valid
    #[arg(long, global = true)]
    pub no_cache: bool,
    /// Run even if sandbox.kdl loosens the defaults and has not been trusted yet (CI); on a
    /// terminal aisb asks once per version of the file instead
    #[arg(long, global = true)]
    pub trust: bool,
    /// How the allowlist combines the presets' domain lists with sandbox.kdl's own: strict
    /// (only the presets'), merge (both, the default), replace (only sandbox.kdl's);
    /// overrides `network domains=…`
    #[arg(long, global = true, value_name = "MODE")]
    pub domains: Option<crate::config::model::DomainsMode>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Init(init::Args),
    Run(run::Args),
    Up(up::Args),
    Check(check::Args),
    Plan(plan::Args),
    Trust(trust::Args),
    Build(build::Args),
    Spec(spec::Args),
    Export(export::Args),
    Tasks(tasks::Args),
    Presets(presets::Args),
    Doctor(doctor::Args),
    Audit(audit::Args),
    Why(why::Args),
    Suggest(suggest::Args),
    Ls(sandboxes::LsArgs),
    Rm(sandboxes::RmArgs),
    Gc(sandboxes::GcArgs),
    Exec(sandboxes::ExecArgs),
    #[command(name = "test")]
    Test(selftest::Args),
    Stop(sandboxes::StopArgs),
    Store(store::Args),
    SetupUser(setup_user::Args),
    SetupApparmor(setup_apparmor::Args),
    Completions(completions::Args),
    Man(man::Args),
    Lsp(lsp::Args),
    #[command(name = "proxy")]
    ProxyServe(proxy_serve::Args),
    #[command(name = "__attach", hide = true)]
    AttachHelper(attach_helper::Args),
    #[command(name = "__libcontainer", hide = true)]
    LibcontainerHelper(libcontainer_helper::Args),
    #[command(name = "__proxy", hide = true)]
    Proxy(proxy::Args),
    #[command(name = "__mask", hide = true)]
    MaskHelper(mask_helper::Args),
    /// Remove trees of an ordinary user's subordinate ids (`userns::remove_trees`)
    #[command(name = "__userns", hide = true)]
    Userns {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::path::PathBuf>,
    },
}

pub fn run(args: impl IntoIterator<Item = OsString>) -> Result<i32, Error> {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return Ok(code);
        }
    };
    if let Some(dir) = &cli.chdir {
        std::env::set_current_dir(dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
    }
    let g = Global {
        file: cli.file.clone(),
        no_cache: cli.no_cache,
        trust: cli.trust,
        domains: cli.domains,
    };
    match cli.command {
        Command::Init(a) => init::run(&g, a),
        Command::Run(a) => run::run(&g, a),
        Command::Up(a) => up::run(&g, a),
        Command::Check(a) => check::run(&g, a),
        Command::Plan(a) => plan::run(&g, a),
        Command::Trust(a) => trust::run(&g, a),
        Command::Build(a) => build::run(&g, a),
        Command::Spec(a) => spec::run(&g, a),
        Command::Export(a) => export::run(&g, a),
        Command::ProxyServe(a) => proxy_serve::run(&g, a),
        Command::Tasks(a) => tasks::run(&g, a),
        Command::Presets(a) => presets::run(a),
        Command::Store(a) => store::run(a),
        Command::Doctor(a) => doctor::run(a),
        Command::Audit(a) => audit::run(&g, a),
        Command::Why(a) => why::run(&g, a),
        Command::Suggest(a) => suggest::run(&g, a),
        Command::Ls(a) => sandboxes::ls(&g, a),
        Command::Rm(a) => sandboxes::rm(&g, a),
        Command::Gc(a) => sandboxes::gc(a),
        Command::Exec(a) => sandboxes::exec(&g, a),
        Command::Test(a) => selftest::run(&g, a),
        Command::Stop(a) => sandboxes::stop(&g, a),
        Command::SetupUser(a) => setup_user::run(a),
        Command::SetupApparmor(a) => setup_apparmor::run(a),
        Command::Completions(a) => completions::run(a),
        Command::Man(a) => man::run(a),
        Command::Lsp(a) => lsp::run(a),
        Command::AttachHelper(a) => attach_helper::run(a),
        Command::LibcontainerHelper(a) => libcontainer_helper::run(a),
        Command::Proxy(a) => proxy::run(a),
        Command::MaskHelper(a) => Ok(mask_helper::run(a)),
        Command::Userns { args } => Ok(userns_helper(&args)),
    }
}

/// Options every subcommand shares.
pub struct Global {
    pub file: Option<PathBuf>,
    pub no_cache: bool,
    /// `--trust`: a loosening sandbox.kdl may run without asking.
    pub trust: bool,
    /// `--domains`.
    pub domains: Option<crate::config::model::DomainsMode>,
}

/// The caller, as the evaluator sees it.
pub fn host() -> Result<Host, Error> {
    let host = Host::current(crate::graph::system::system_paths).map_err(|source| Error::Io {
        path: ".".into(),
        source,
    })?;
    // aisb's own directories: 0700 (the configuration's is made when a trust pin is written).
    let cache = host.cache_home().join("aisb");
    crate::private::ensure(&cache).map_err(|cause| Error::OwnDir {
        what: "cache",
        var: "XDG_CACHE_HOME",
        default: ".cache",
        path: cache.display().to_string(),
        cause,
    })?;
    let config = host.config_home().join("aisb");
    crate::private::tighten(&config).map_err(|cause| Error::OwnDir {
        what: "configuration",
        var: "XDG_CONFIG_HOME",
        default: ".config",
        path: config.display().to_string(),
        cause,
    })?;
    Ok(host)
}

/// The running aisb binary (the init binary and the libcontainer helper live beside it).
pub fn current_exe() -> Result<std::path::PathBuf, Error> {
    std::env::current_exe().map_err(|source| Error::Io {
        path: "/proc/self/exe".into(),
        source,
    })
}

/// The directory a project's root defaults to: the git work tree's top, else `start`.
pub fn project_dir(start: &Path) -> PathBuf {
    let mut cur = Some(start);
    while let Some(d) = cur {
        if d.join(".git").exists() {
            return d.to_path_buf();
        }
        cur = d.parent();
    }
    start.to_path_buf()
}

/// `sandbox.kdl` in `start` or a parent, not above the repository root.
pub fn find_config(start: &Path) -> Option<PathBuf> {
    let mut cur = Some(start);
    while let Some(d) = cur {
        let f = d.join("sandbox.kdl");
        if f.is_file() {
            return Some(f);
        }
        if d.join(".git").exists() {
            return None;
        }
        cur = d.parent();
    }
    None
}

impl Global {
    /// These options with the configuration file a verb was given as its argument (`aisb check
    /// FILE`, `aisb plan FILE`); given both ways, which one is meant is unclear: refused.
    pub fn with_file(&self, file: Option<PathBuf>) -> Result<Global, Error> {
        if let (Some(flag), Some(arg)) = (&self.file, &file) {
            return Err(Error::Usage(format!(
                "two configuration files: `-f {}` and `{}`; give one",
                flag.display(),
                arg.display()
            )));
        }
        Ok(Global {
            file: file.or_else(|| self.file.clone()),
            no_cache: self.no_cache,
            trust: self.trust,
            domains: self.domains,
        })
    }

    pub fn root(&self, host: &Host, command: &[String]) -> Result<Root, Error> {
        match &self.file {
            Some(f) => {
                let f = if f.is_absolute() {
                    f.clone()
                } else {
                    host.cwd.join(f)
                };
                if !f.is_file() {
                    return Err(Error::NoConfig { path: f });
                }
                Ok(Root::File(f))
            }
            None => Ok(match find_config(&host.cwd) {
                Some(f) => Root::File(f),
                None => Root::Default {
                    dir: project_dir(&host.cwd),
                    agent: crate::presets::agent_for(command),
                },
            }),
        }
    }

    /// Load the configuration; syntax and decoding errors are returned all together.
    pub fn load(&self, host: &Host) -> Result<Loaded, Error> {
        self.load_for(host, &[])
    }

    /// [`Self::load`] for running `command`: with no sandbox.kdl, an agent's command brings
    /// its preset (`aisb up -- claude`).
    pub fn load_for(&self, host: &Host, command: &[String]) -> Result<Loaded, Error> {
        let (loaded, errors) = self.load_with_errors_for(host, command)?;
        errors.into_result().map_err(Error::Config)?;
        Ok(loaded)
    }

    /// Load what can be loaded; configuration errors are returned beside it, not raised
    /// (`aisb check` reports them with the evaluation's own).
    pub fn load_with_errors(&self, host: &Host) -> Result<(Loaded, crate::config::Errors), Error> {
        self.load_with_errors_for(host, &[])
    }

    fn load_with_errors_for(
        &self,
        host: &Host,
        command: &[String],
    ) -> Result<(Loaded, crate::config::Errors), Error> {
        let root = self.root(host, command)?;
        let mut errors = crate::config::Errors::default();
        let path = match &root {
            Root::File(p) | Root::Text { path: p, .. } => p.clone(),
            Root::Default { dir, .. } => dir.clone(),
        };
        let cache = (!self.no_cache).then(|| host.cache_home().join("aisb").join("kdl"));
        let mut loaded = eval::load_cached(root, &mut errors, cache)
            .map_err(|source| Error::Io { path, source })?;
        crate::graph::realise::memos(&std::mem::take(&mut loaded.memos));
        Ok((loaded, errors))
    }

    /// What to evaluate: a profile and a command, with this invocation's cache setting.
    pub fn request(&self, profile: Option<String>, command: Vec<String>) -> Request {
        Request {
            profile,
            command,
            domains: self.domains,
            use_cache: !self.no_cache,
            ..Request::default()
        }
    }

    pub fn plan(
        &self,
        host: &Host,
        profile: Option<String>,
        command: Vec<String>,
    ) -> Result<eval::Plan, Error> {
        let loaded = self.load_for(host, &command)?;
        eval::evaluate(&loaded, host, &self.request(profile, command))
            .map(evaluated)
            .map_err(Error::from)
    }
}

/// Run `plan` on `backend`; in the named sandbox `sandbox` when given (see `session`).
///
/// A named sandbox runs a placeholder as its workload, and every session, the first one
/// included, joins it: the first `aisb` to start it owns it (its network proxy, the sync
/// watcher) and stops it once no session is left; later ones just join.
pub fn run_plan(
    g: &Global,
    host: &Host,
    mut plan: eval::Plan,
    sandbox: Option<&str>,
    backend: Option<crate::runtime::Backend>,
    interactive: bool,
) -> Result<crate::runtime::Summary, Error> {
    use nix::sys::signal::{signal, SigHandler, Signal};
    crate::trust::check(&plan, &host.config_home(), g.trust)?;
    let backend = match (backend, plan.backend.as_deref()) {
        // An ordinary user's sandbox on an image: only bwrap mounts it rootless.
        (None, None)
            if plan.rootfs != crate::eval::plan::Rootfs::Host
                && !nix::unistd::geteuid().is_root() =>
        {
            crate::runtime::Backend::Bwrap
        }
        (flag, configured) => crate::runtime::Backend::choose(flag, configured),
    };
    let Some(name) = sandbox else {
        // On an image: realise it (build what is missing) before anything runs.
        let imaged = prepare_image(&plan, backend)?;
        let (plan, root) = match &imaged {
            Some((p, m)) => (p, Some(m)),
            None => (&plan, None),
        };
        return Ok(crate::runtime::run(plan, root, backend, interactive)?);
    };
    let start = std::time::Instant::now();
    let summary = |exit_code: i32, plan: &eval::Plan| {
        crate::runtime::Summary::new(plan, backend, exit_code, start)
    };
    // While a session runs, the terminal's ^C and ^\ are for its command only.
    for sig in [Signal::SIGINT, Signal::SIGQUIT] {
        // SAFETY: installing SIG_IGN; the session's command gets the default back.
        let _ = unsafe { signal(sig, SigHandler::SigIgn) };
    }
    let s = match crate::session::prepare(&mut plan, name) {
        Ok(s) => s,
        Err(e @ crate::session::SessionError::Busy(..)) => {
            let Some(pid) = crate::session::running_init(&plan.state_dir) else {
                return Err(e.into());
            };
            let _hold = crate::session::join(&plan.state_dir)?;
            let code = crate::session::attach::attach(pid, &plan.process.args, &plan.process.cwd)?;
            return Ok(summary(code, &plan));
        }
        Err(e) => return Err(e.into()),
    };
    let pid_file = plan.state_dir.join(crate::runtime::INIT_PID_FILE);
    let _ = std::fs::remove_file(&pid_file);
    // SIGWINCH is for the session's terminal (`attach` waits for it): blocked before any
    // thread starts, so that no other thread takes it and drops it (its default is to ignore).
    let mut winch = nix::sys::signal::SigSet::empty();
    winch.add(Signal::SIGWINCH);
    let _ = winch.thread_block();
    let watcher = crate::session::sync::watch(
        s.repo.clone(),
        s.clone.clone(),
        s.name.clone(),
        s.state.clone(),
        s.history.clone(),
    );
    // The sandbox: the init with a placeholder workload, on a thread of its own. SIGTERM and
    // SIGHUP are blocked here first, so they reach that thread, which passes them on to the
    // sandbox: it ends, and with it every session.
    let mut hold = plan.clone();
    hold.process.args = vec![crate::vocab::INIT_PATH.into(), "hold".into()];
    // On an image: realise it here, before the sandbox's start is waited for (a build can
    // take minutes; the wait below is for the start alone).
    let (hold, root) = match prepare_image(&hold, backend) {
        Ok(Some((p, m))) => (p, Some(m)),
        Ok(None) => (hold, None),
        Err(e) => {
            drop(watcher);
            return Err(e);
        }
    };
    let mut forwarded = nix::sys::signal::SigSet::empty();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        forwarded.add(sig);
    }
    let _ = forwarded.thread_block();
    let sandbox =
        std::thread::spawn(move || crate::runtime::run_detached(&hold, root.as_ref(), backend));
    const START_SECS: u64 = 60;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(START_SECS);
    let pid = loop {
        if let Some(pid) = crate::session::running_init(&plan.state_dir) {
            break pid;
        }
        if sandbox.is_finished() {
            drop(watcher);
            return Err(match sandbox.join() {
                Ok(Err(e)) => e.into(),
                Ok(Ok(s)) => crate::session::SessionError::Ended {
                    name: name.to_string(),
                    code: s.exit_code,
                }
                .into(),
                Err(_) => crate::session::SessionError::Ended {
                    name: name.to_string(),
                    code: crate::exit::COULD_NOT_START,
                }
                .into(),
            });
        }
        if std::time::Instant::now() > deadline {
            drop(watcher);
            return Err(crate::session::SessionError::StartTimeout {
                name: name.to_string(),
                secs: START_SECS,
            }
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let code = {
        let _hold = crate::session::join(&plan.state_dir)?;
        crate::session::attach::attach(pid, &plan.process.args, &plan.process.cwd)?
    };
    // Other sessions may still be in it: it stops when the last one ends.
    while !sandbox.is_finished() && !crate::session::no_sessions(&plan.state_dir) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
    // What stopped the sandbox (its disk budget, a mask that could not land) is said here.
    let ended = sandbox.join();
    drop(watcher);
    if let Ok(Err(e)) = ended {
        eprintln!("{:?}", miette::Report::new(e));
    }
    if let Ok(branch) =
        crate::session::git(&s.clone, &["rev-parse", "--abbrev-ref", "HEAD"], &s.state)
    {
        eprintln!(
            "aisb: sandbox `{name}`: its commits are in this repository as `sandbox-{name}/{branch}` (and its other branches)"
        );
    }
    Ok(summary(code, &plan))
}

/// Before a run on an image: the image built (RUN steps on the runtime) and the mount of its
/// root the runtime process makes.
fn prepare_image(
    plan: &eval::Plan,
    backend: crate::runtime::Backend,
) -> Result<Option<(eval::Plan, crate::runtime::rootmount::RootMount)>, Error> {
    use crate::image::graph::BuildError;
    if crate::image::sandbox::def_of(plan)?.is_none() {
        return Ok(None);
    }
    if backend == crate::runtime::Backend::Libcontainer && !nix::unistd::geteuid().is_root() {
        // The helper mounts the image in a user namespace with the caller's whole map.
        if let Err(missing) = crate::userns::caller_maps() {
            return Err(BuildError::Step {
                at: "rootfs".into(),
                message: format!("an ordinary user's sandbox on an image runs with libcontainer over their subordinate ids: {missing}"),
                help: "one-time, as root: `aisb setup-user NAME`; or add `--backend bwrap` (or `backend \"bwrap\"` in sandbox.kdl)".into(),
            }
            .into());
        }
    }
    let Some((plan, layers, mountpoint)) =
        crate::image::sandbox::prepare_run(plan, &build::Runner)?
    else {
        return Ok(None);
    };
    let mount = crate::runtime::rootmount::RootMount::new(&layers, None, &mountpoint).map_err(
        |source| BuildError::Io {
            what: "preparing the image's root".into(),
            source,
        },
    )?;
    Ok(Some((plan, mount)))
}

/// `aisb __userns rm PATH...`, `aisb __userns unpack DEST` (the layer's bytes on stdin,
/// after the handshake) and `aisb __userns tar DIR OUT` (a layer for a push): work on an ordinary user's files of their subordinate ids, from
/// inside a user namespace with their map (`userns::spawn`).
fn userns_helper(args: &[std::path::PathBuf]) -> i32 {
    match args.split_first() {
        Some((cmd, paths)) if cmd.as_os_str() == "rm" => crate::userns::remove_main(paths),
        Some((cmd, rest)) if cmd.as_os_str() == "chown" => crate::userns::chown_main(rest),
        Some((cmd, [dest])) if cmd.as_os_str() == "unpack" && dest.is_absolute() => {
            if let Err(e) = crate::userns::enter() {
                eprintln!("cannot enter a user namespace over the subordinate ids: {e}");
                return 1;
            }
            // As root of the namespace: the entries keep their owners (mapped into the
            // caller's subordinate ids).
            let unpacked = crate::image::layer::unpack(std::io::stdin().lock(), dest);
            // The layer's root is "/": root's, as in root's store (aisb made the directory,
            // so it is still the caller's).
            let own = || std::os::unix::fs::lchown(dest, Some(0), Some(0));
            match unpacked.and_then(|()| own()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("{e}");
                    1
                }
            }
        }
        Some((cmd, [dir, out])) if cmd.as_os_str() == "tar" && out.is_absolute() => {
            if let Err(e) = crate::userns::enter() {
                eprintln!("cannot enter a user namespace over the subordinate ids: {e}");
                return 1;
            }
            // Every file readable, `stat` giving the ids inside: the tar's owners are the
            // image's. Prints `DIGEST LENGTH`.
            match crate::image::push::layer_tar(dir, out) {
                Ok((digest, len)) => {
                    println!("{digest} {len}");
                    0
                }
                Err(e) => {
                    eprintln!("{}", e.what);
                    1
                }
            }
        }
        _ => {
            eprintln!("usage: aisb __userns rm PATH... | unpack DEST | tar DIR OUT | chown LAYER UID GID DEST...");
            2
        }
    }
}

/// A plan as evaluation returned it, its caches stored (evaluating writes nothing itself).
pub(crate) fn evaluated(mut plan: eval::Plan) -> eval::Plan {
    crate::graph::realise::memos(&std::mem::take(&mut plan.memos));
    plan
}
