//! The workload: the shell, the command, where it starts, its rlimits and hostname, and the
//! cgroup limits.

use std::path::{Path, PathBuf};

use super::host::Scope;
use super::plan::{self, Process, Rlimit};
use super::{loc_line, Ctx};
use crate::config::model::RLIMITS;
use crate::config::Loc;

/// The shell: configured, else the caller's `$SHELL` when it exists, else bash or sh.
pub(super) fn shell(cx: &mut Ctx<'_>, sc: &Scope<'_>) -> PathBuf {
    let (s, host) = (sc.s, sc.host);
    let expand = |cx: &mut Ctx<'_>, v| sc.expand(cx, v);
    match &s.process.shell {
        Some(sh) => expand(cx, sh).map(PathBuf::from),
        None => None,
    }
    .or_else(|| {
        host.env
            .get("SHELL")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.exists())
    })
    .unwrap_or_else(|| {
        PathBuf::from(if Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        })
    })
}

/// The command (the request's, else the configured one, else the shell), its directory,
/// rlimits and hostname.
pub(super) fn resolve(cx: &mut Ctx<'_>, sc: &Scope<'_>, shell: PathBuf) -> Process {
    let (s, host, req, project) = (sc.s, sc.host, sc.req, &sc.project);
    let path = |cx: &mut Ctx<'_>, v| sc.path(cx, v);
    let cwd = match &s.process.cwd {
        Some(c) => path(cx, c).unwrap_or_else(|| project.clone()),
        None if host.cwd.starts_with(project) => host.cwd.clone(),
        None => project.clone(),
    };
    let args = if !req.command.is_empty() {
        req.command.clone()
    } else if let Some(c) = &s.process.command {
        c.value.clone()
    } else {
        vec![shell.to_string_lossy().into_owned()]
    };
    let mut rlimits: Vec<Rlimit> = Vec::new();
    for r in &s.process.rlimits {
        let kind = RLIMITS
            .iter()
            .find(|(n, _)| *n == r.resource.value)
            .map_or("", |(_, k)| k)
            .to_string();
        rlimits.retain(|x| x.kind != kind);
        rlimits.push(Rlimit {
            kind,
            soft: r.soft,
            hard: r.hard,
        });
    }
    let hostname = s
        .process
        .hostname
        .as_ref()
        .map_or_else(|| "aisb".to_string(), |h| h.value.clone());
    Process {
        args,
        cwd,
        shell,
        hostname,
        rlimits,
    }
}

/// The configured limits over aisb's defaults, each with where it was set.
pub(super) fn limits(cx: &Ctx<'_>, l: &crate::config::model::LimitsCfg) -> plan::Limits {
    let mut out = plan::Limits::default();
    let mut at = |name: &str, loc: Loc| {
        let (file, line) = loc_line(cx, loc);
        out.set_at
            .insert(name.to_string(), format!("{file}:{line}"));
    };
    if let Some(p) = &l.pids {
        at("pids", p.loc);
    }
    if let Some(m) = &l.memory {
        at("memory", m.loc);
    }
    if let Some(c) = &l.cpus {
        at("cpus", c.loc);
    }
    if let Some(d) = &l.disk {
        at("disk", d.loc);
    }
    if let Some(p) = &l.pids {
        out.pids = p.value;
    }
    out.memory = match &l.memory {
        Some(m) => m.value,
        // aisb's default; the runtime drops it where no memory cgroup can hold it for the
        // caller (`runtime::limits::held`).
        None => plan::Limits::default_memory(),
    };
    out.cpus_milli = l.cpus.as_ref().and_then(|c| c.value);
    out.disk = match &l.disk {
        Some(d) => d.value.map_or(plan::Disk::Unlimited, plan::Disk::Bytes),
        None => plan::Disk::Default,
    };
    out
}
