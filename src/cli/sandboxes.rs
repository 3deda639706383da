//! `aisb ls`, `aisb rm`, `aisb gc`: the named sandboxes of this repository (and, for gc, of
//! every repository) and their state under `$XDG_CACHE_HOME/aisb/`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::Global;
use crate::session::{self, SessionError};
use crate::Error;

/// List this repository's named sandboxes
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  aisb ls\n  aisb ls --json")]
pub struct LsArgs {
    #[arg(long)]
    pub json: bool,
}

/// Remove a named sandbox: its clone, state and the repository's `sandbox-NAME` remote
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb rm fix-42\n  aisb rm --force fix-42    # even with commits the repository does not have"
)]
pub struct RmArgs {
    pub name: String,
    /// Remove even when the sandbox has commits no branch of the repository has
    #[arg(long)]
    pub force: bool,
}

/// Remove what sandboxes left behind: state of deleted repositories, sandboxes unused for
/// longer than the TTL, bundles and proxy directories of runs that are gone, and store entries
/// no remaining sandbox uses
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  aisb gc\n  aisb gc --ttl 12 --dry-run")]
pub struct GcArgs {
    /// Hours a sandbox may go unused before it is removed (when it has no unsynced commits)
    #[arg(long, default_value_t = 48)]
    pub ttl: u64,
    /// Also remove sandboxes whose repository is gone (their commits go with them)
    #[arg(long)]
    pub force: bool,
    /// Say what would be removed, remove nothing
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Serialize)]
struct Row {
    name: String,
    state: &'static str,
    created: u64,
    last_used: u64,
    branch: String,
    unsynced: u64,
    disk_bytes: u64,
    path: PathBuf,
}

/// The directory holding this repository's sandboxes.
fn repo_dir(g: &Global) -> Result<PathBuf, Error> {
    let host = super::host()?;
    let plan = g.plan(&host, None, vec![])?;
    Ok(plan
        .state_dir
        .parent()
        .map_or_else(|| plan.state_dir.clone(), Path::to_path_buf))
}

fn running(state: &Path) -> bool {
    !session::is_free(&state.join("lock"))
}

fn ago(secs: u64) -> String {
    let d = session::now().saturating_sub(secs);
    match d {
        0..=89 => format!("{d} s ago"),
        90..=5399 => format!("{} min ago", d / 60),
        5400..=172_799 => format!("{} h ago", d / 3600),
        _ => format!("{} days ago", d / 86400),
    }
}

pub fn ls(g: &Global, a: LsArgs) -> Result<i32, Error> {
    let dir = repo_dir(g)?;
    let mut rows = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let state = e.path();
        let Some(st) = session::read_state(&state) else {
            continue;
        };
        let clone = state.join("clone");
        let branch = session::git(&clone, &["rev-parse", "--abbrev-ref", "HEAD"], &state)
            .unwrap_or_default();
        let unsynced = session::unsynced(&st.repo, &st.name, &state).unwrap_or(0);
        rows.push(Row {
            name: st.name,
            state: if running(&state) {
                "running"
            } else {
                "stopped"
            },
            created: st.created,
            last_used: st.last_used,
            branch,
            unsynced,
            disk_bytes: session::disk_use(&state),
            path: state,
        });
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return Ok(0);
    }
    if rows.is_empty() {
        eprintln!("no named sandboxes for this repository (`aisb up NAME` creates one)");
        return Ok(0);
    }
    println!(
        "{:<20} {:<8} {:<14} {:<14} {:<20} {:>9} {:>10}",
        "NAME", "STATE", "CREATED", "LAST USED", "BRANCH", "UNSYNCED", "DISK"
    );
    for r in rows {
        println!(
            "{:<20} {:<8} {:<14} {:<14} {:<20} {:>9} {:>10}",
            r.name,
            r.state,
            ago(r.created),
            ago(r.last_used),
            r.branch,
            r.unsynced,
            session::human_bytes(r.disk_bytes)
        );
    }
    Ok(0)
}

pub fn rm(g: &Global, a: RmArgs) -> Result<i32, Error> {
    if !session::valid_name(&a.name) {
        return Err(SessionError::BadName(a.name).into());
    }
    let state = repo_dir(g)?.join(&a.name);
    let bytes = session::disk_use(&state);
    session::remove(&state, &a.name, a.force)?;
    eprintln!(
        "removed sandbox `{}` ({})",
        a.name,
        session::human_bytes(bytes)
    );
    Ok(0)
}

/// Remove `run/<pid>` and `net/<pid>` directories whose aisb is gone.
fn orphans(sandbox: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["run", "net"] {
        for e in std::fs::read_dir(sandbox.join(sub))
            .into_iter()
            .flatten()
            .flatten()
        {
            let alive = e
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
                .is_some_and(|pid| {
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
                });
            if !alive {
                out.push(e.path());
            }
        }
    }
    out
}

pub fn gc(a: GcArgs) -> Result<i32, Error> {
    let start = Instant::now();
    let host = super::host()?;
    let root = host.cache_home().join("aisb");
    let (mut pruned, mut freed) = (0usize, 0u64);
    let remove = |path: &Path, why: &str, freed: &mut u64| {
        let bytes = session::disk_use(path);
        println!(
            "{} {} ({why}, {})",
            if a.dry_run {
                "would remove"
            } else {
                "removing"
            },
            path.display(),
            session::human_bytes(bytes)
        );
        if !a.dry_run {
            let _ = crate::userns::remove_all(path);
        }
        *freed += bytes;
    };
    for repo_dir in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = repo_dir.file_name().to_string_lossy().into_owned();
        if matches!(name.as_str(), "store" | "scan" | "kdl" | "copy-hashes")
            || !repo_dir.path().is_dir()
        {
            continue;
        }
        for sandbox in std::fs::read_dir(repo_dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let state = sandbox.path();
            for o in orphans(&state) {
                remove(&o, "left by a run that is gone", &mut freed);
            }
            let Some(st) = session::read_state(&state) else {
                continue;
            };
            if running(&state) {
                continue;
            }
            let stale = session::now().saturating_sub(st.last_used) > a.ttl * 3600;
            if !st.repo.join(".git").exists() {
                if a.force {
                    remove(&state, "its repository is gone", &mut freed);
                    pruned += 1;
                } else {
                    println!("kept {} (its repository {} is gone; `aisb gc --force` removes it with its commits)", state.display(), st.repo.display());
                }
            } else if stale {
                match session::unsynced(&st.repo, &st.name, &state) {
                    Ok(0) => {
                        if !a.dry_run {
                            let _ = session::git(
                                &st.repo,
                                &["remote", "remove", &format!("sandbox-{}", st.name)],
                                &state,
                            );
                        }
                        remove(
                            &state,
                            &format!("unused for more than {} h", a.ttl),
                            &mut freed,
                        );
                        pruned += 1;
                    }
                    Ok(n) => println!(
                        "kept sandbox `{}` of {}: {n} unsynced commit(s)",
                        st.name,
                        st.repo.display()
                    ),
                    Err(e) => println!("kept sandbox `{}` of {}: {e}", st.name, st.repo.display()),
                }
            }
        }
    }
    // Decoded-config, scan and COPY-hash caches: entries older than the TTL (each is rebuilt
    // on demand, in a millisecond, a scan or a hash of the build context).
    let mut caches = 0usize;
    for sub in ["kdl", "scan", "copy-hashes"] {
        for e in std::fs::read_dir(root.join(sub))
            .into_iter()
            .flatten()
            .flatten()
        {
            let old = e
                .metadata()
                .ok()
                .filter(|m| m.is_file())
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age.as_secs() > a.ttl * 3600);
            if old {
                freed += e.metadata().map_or(0, |m| m.len());
                caches += 1;
                if !a.dry_run {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    if caches > 0 {
        println!(
            "{} {caches} cached decoded configs, scans and COPY hashes older than {} h",
            if a.dry_run { "would remove" } else { "removed" },
            a.ttl
        );
    }
    // Store entries only removed sandboxes (or superseded /etc snapshots) used.
    let store = root.join("store");
    let r = crate::graph::store::gc(
        &store,
        &root,
        &crate::image::lock::pinned_entries,
        a.dry_run,
    )
    .map_err(|source| Error::Io {
        path: store.clone(),
        source,
    })?;
    if !r.removed.is_empty() {
        println!(
            "{} {} unused store entries ({})",
            if a.dry_run { "would remove" } else { "removed" },
            r.removed.len(),
            session::human_bytes(r.bytes)
        );
    }
    freed += r.bytes;
    println!(
        "{} {pruned} sandbox{}, {} in {:.1} s",
        if a.dry_run { "Would prune" } else { "Pruned" },
        if pruned == 1 { "" } else { "es" },
        session::human_bytes(freed),
        start.elapsed().as_secs_f64()
    );
    Ok(0)
}

/// Run a command in a running named sandbox (non-interactive; stdio passed through)
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb exec fix-42 -- git log --oneline -3\n  aisb exec fix-42 -- make test"
)]
pub struct ExecArgs {
    pub name: String,
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Stop a running named sandbox (every session in it ends)
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  aisb stop fix-42")]
pub struct StopArgs {
    pub name: String,
}

/// The init pid of the running sandbox `name`, or why there is none.
fn running_pid(g: &Global, name: &str) -> Result<i32, Error> {
    if !session::valid_name(name) {
        return Err(SessionError::BadName(name.to_string()).into());
    }
    running_pid_in(&repo_dir(g)?.join(name), name)
}

fn running_pid_in(state: &Path, name: &str) -> Result<i32, Error> {
    if session::read_state(state).is_none() {
        return Err(SessionError::Missing(name.to_string()).into());
    }
    session::running_init(state).ok_or_else(|| SessionError::NotRunning(name.to_string()).into())
}

pub fn exec(g: &Global, a: ExecArgs) -> Result<i32, Error> {
    if !session::valid_name(&a.name) {
        return Err(SessionError::BadName(a.name).into());
    }
    // The plan gives the sandbox's directory and this caller's working directory inside.
    let host = super::host()?;
    let plan = g.plan(&host, None, vec![])?;
    let state = plan
        .state_dir
        .parent()
        .map_or_else(|| plan.state_dir.clone(), Path::to_path_buf)
        .join(&a.name);
    let pid = running_pid_in(&state, &a.name)?;
    let _hold = session::join(&state)?;
    Ok(session::attach::attach(pid, &a.command, &plan.process.cwd)?)
}

pub fn stop(g: &Global, a: StopArgs) -> Result<i32, Error> {
    let pid = running_pid(g, &a.name)?;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while session::attach::ready(pid) && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    eprintln!("stopped sandbox `{}`", a.name);
    Ok(0)
}
