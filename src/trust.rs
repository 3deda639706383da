//! A checked-in `sandbox.kdl` is untrusted input: whoever wrote it may widen what the sandbox
//! can reach. Before a sandbox runs under a configuration that loosens the defaults (a network
//! allowlist or host network, host paths, a visible home, secret-looking variables passed
//! in, unmasking, a moved project root), aisb shows what it loosens and asks once. The answer
//! is pinned to what the plan loosens, per configuration file and profile, in
//! `$XDG_CONFIG_HOME/aisb/trust/`: an edit that loosens nothing new never asks, and one that
//! does lists only what is new. Without a terminal, or in CI (`CI` set), it refuses, unless `--trust` says
//! yes.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::eval::plan::{MountKind, NetMode, Plan};

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum TrustError {
    #[error("{file} loosens the sandbox and has not been trusted:\n{list}")]
    #[diagnostic(help(
        "review it (`aisb plan`), then run once on a terminal, or `aisb trust` to approve it; `--trust` runs it once without recording (CI)"
    ))]
    Untrusted { file: String, list: String },
    #[error("not trusted: nothing was run")]
    #[diagnostic(help("review {file}; `aisb plan` shows everything it does"))]
    Declined { file: String },
    #[error("cannot record the trust decision in {path}: {source}")]
    #[diagnostic(help("check that $XDG_CONFIG_HOME (default ~/.config) is writable"))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What `plan` allows beyond aisb's defaults, one line each.
pub fn loosenings(plan: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    match plan.network.mode {
        NetMode::Host => out.push("network \"host\": no network isolation at all".to_string()),
        NetMode::Allow if !plan.network.allow.is_empty() => out.push(format!(
            "network reaches {} domain rule(s): {}",
            plan.network.allow.len(),
            plan.network.allow.join(", ")
        )),
        _ => {}
    }
    if plan.rootfs != crate::eval::plan::Rootfs::Host {
        let default = crate::eval::default_build_network();
        let beyond: Vec<&str> = plan
            .build_network
            .iter()
            .filter(|r| !default.contains(r))
            .map(String::as_str)
            .collect();
        if !beyond.is_empty() {
            out.push(format!(
                "image build steps reach {} domain rule(s) beyond the package registries: {}",
                beyond.len(),
                beyond.join(", ")
            ));
        }
    }
    if !plan.network.localhost_ports.is_empty() {
        let ports: Vec<String> = plan
            .network
            .localhost_ports
            .iter()
            .map(u16::to_string)
            .collect();
        out.push(format!(
            "host loopback ports reachable: {}",
            ports.join(", ")
        ));
    }
    for m in &plan.mounts {
        if m.why.starts_with(crate::eval::deps::WRITE_THROUGH) {
            out.push(format!(
                "{} is written in place: what the sandbox installs or builds there, the host runs",
                m.target.display()
            ));
            continue;
        }
        let configured = m.why.starts_with("mount at ");
        let home = m.target == plan.identity.home && !matches!(m.kind, MountKind::Tmpfs { .. });
        if !(configured || home) {
            continue;
        }
        // The source is part of the line: the same target from another host path is another
        // loosening.
        let (access, source) = match &m.kind {
            MountKind::Bind {
                writable: true,
                source,
            } => ("read-write", source),
            MountKind::Bind { source, .. } => ("read-only", source),
            MountKind::Overlay { lower: source, .. } | MountKind::Copy { source, .. } => {
                ("copy-on-write", source)
            }
            MountKind::Tmpfs { .. }
            | MountKind::State { .. }
            | MountKind::Generated { .. }
            | MountKind::Git { .. } => continue,
        };
        // The source as the runtime will reach it: through any link (a link in the project,
        // which the sandbox can retarget, names another directory, and another loosening).
        let source = source.canonicalize().unwrap_or_else(|_| source.clone());
        out.push(format!(
            "{} visible {access} from {} ({})",
            m.target.display(),
            source.display(),
            m.why
        ));
    }
    // A tmpfs the configuration sized above the private /tmp's default: host memory.
    let tmp_default = crate::eval::plan::Limits::default_tmp_size();
    for m in plan
        .mounts
        .iter()
        .filter(|m| m.why.starts_with("tmpfs at "))
    {
        if let MountKind::Tmpfs {
            size: Some(size), ..
        } = m.kind
        {
            if size > tmp_default {
                out.push(format!(
                    "tmpfs {} of {} (its pages are the host's memory; default: a quarter of it) ({})",
                    m.target.display(),
                    crate::runtime::limits::human(size),
                    m.why
                ));
            }
        }
    }
    out.extend(plan.exposures.iter().cloned());
    out.extend(image_sources_outside(plan));
    if plan.limits.pids > crate::eval::plan::Limits::DEFAULT_PIDS {
        out.push(format!(
            "pids limit raised to {} (default {}): more room for a runaway process to crowd the host",
            plan.limits.pids,
            crate::eval::plan::Limits::DEFAULT_PIDS
        ));
    }
    if plan.limits.configured("memory") {
        let at = plan
            .limits
            .set_at
            .get("memory")
            .cloned()
            .unwrap_or_default();
        match (plan.limits.memory, crate::eval::plan::Limits::default_memory()) {
            (None, _) => out.push(format!(
                "memory limit lifted (`memory \"unlimited\"`): a runaway allocation may take the host's memory (at {at})"
            )),
            (Some(m), Some(d)) if m > d => out.push(format!(
                "memory limit raised to {} (aisb's default: half the host's memory) (at {at})",
                crate::runtime::limits::human(m)
            )),
            _ => {}
        }
    }
    if plan.limits.disk == crate::eval::plan::Disk::Unlimited {
        out.push(format!(
            "disk budget lifted (`disk \"unlimited\"`): the sandbox's copy-on-write layers may fill the host's disk (at {})",
            plan.limits.set_at.get("disk").cloned().unwrap_or_default()
        ));
    }
    let proxy_vars = crate::vocab::sandbox_env();
    let secrets: Vec<&str> = plan
        .env
        .vars
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| crate::eval::env::looks_secret(k))
        .filter(|k| !proxy_vars.iter().any(|(p, _)| p == k))
        .collect();
    if !secrets.is_empty() {
        out.push(format!(
            "secret-looking variables passed in: {}",
            secrets.join(", ")
        ));
    }
    out
}

/// Per configuration file and profile: what one profile was approved for says nothing about
/// another.
fn trust_file(plan: &Plan, config_home: &std::path::Path) -> Option<PathBuf> {
    let file = plan.config_file.as_ref()?;
    let mut h = Sha256::new();
    h.update(file.as_os_str().as_encoded_bytes());
    h.update([0]);
    h.update(plan.profile.as_bytes());
    let key: String = h
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    Some(config_home.join("aisb/trust").join(key))
}

/// Refuse (or ask) before running `plan` when its configuration loosens the defaults and this
/// exact text has not been trusted. `assume_yes`: `--trust`.
pub fn check(
    plan: &Plan,
    config_home: &std::path::Path,
    assume_yes: bool,
) -> Result<(), TrustError> {
    if let Some(first) = plan.kept_masked.first() {
        eprintln!(
            "aisb: {} path(s) stay masked though the rules no longer mask them ({}{}): an earlier run masked them, and a sandbox can write .gitignore\n  help: `aisb plan` lists them; `aisb trust` unmasks them",
            plan.kept_masked.len(),
            first.display(),
            if plan.kept_masked.len() > 1 { ", …" } else { "" }
        );
    }
    let (Some(digest), Some(path)) = (&plan.config_digest, trust_file(plan, config_home)) else {
        return Ok(()); // the embedded default: nothing to trust
    };
    let list = loosenings(plan);
    if list.is_empty() || assume_yes {
        return Ok(());
    }
    // Pinned to what the plan exposes, not to the text: an edit that exposes nothing new
    // (or narrows) runs; anything not approved before asks, and only it is listed.
    let approved = approved(&path, digest, &list);
    let list: Vec<String> = list
        .into_iter()
        .filter(|l| !approved.iter().any(|a| key(a) == key(l)))
        .collect();
    if list.is_empty() {
        return Ok(());
    }
    let file = plan
        .config_file
        .as_ref()
        .map_or_else(String::new, |f| f.display().to_string());
    let listed: String = list.iter().map(|l| format!("  - {l}\n")).collect();
    let stdin = std::io::stdin();
    // In CI nobody answers: refuse with the list even on a terminal (a CI runner's pty).
    if !stdin.is_terminal() || crate::ci::is_ci() {
        return Err(TrustError::Untrusted {
            file,
            list: listed.trim_end().to_string(),
        });
    }
    let mut err = std::io::stderr();
    let _ = write!(
        err,
        "{file} loosens the sandbox:\n{listed}Trust this configuration (until it changes)? [y/N] "
    );
    let _ = err.flush();
    let mut answer = String::new();
    let _ = stdin.lock().read_line(&mut answer);
    if !matches!(answer.trim(), "y" | "Y" | "yes") {
        return Err(TrustError::Declined { file });
    }
    let all: Vec<String> = approved.into_iter().chain(list).collect();
    record(&path, &file, &all)
}

/// `aisb trust`: record every loosening of `plan` as approved (the user's act, outside the
/// sandbox). `None` for the embedded default (nothing to trust).
pub fn approve(
    plan: &Plan,
    config_home: &std::path::Path,
) -> Result<Option<Vec<String>>, TrustError> {
    let Some(path) = trust_file(plan, config_home) else {
        return Ok(None);
    };
    let file = plan
        .config_file
        .as_ref()
        .map_or_else(String::new, |f| f.display().to_string());
    let list = loosenings(plan);
    if !list.is_empty() {
        record(&path, &file, &list)?;
    }
    Ok(Some(list))
}

fn record(path: &std::path::Path, file: &str, approved: &[String]) -> Result<(), TrustError> {
    let io = |source| TrustError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        if let Some(aisb) = dir.parent() {
            crate::private::ensure(aisb).map_err(io)?;
        }
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut text = format!("{FORMAT}\n{}\n", file.replace('\n', " "));
    for l in approved {
        text.push_str(&l.replace('\n', " "));
        text.push('\n');
    }
    crate::atomic::write_atomic(path, text.as_bytes()).map_err(io)
}

/// What identifies a loosening: its line without where it was written, so that moving a line
/// in the file asks nothing. Only the location aisb appended itself is cut: a final
/// parenthesis holding `at FILE:LINE` (or `mount at FILE:LINE`) and nothing else, so a value
/// the configuration chose (a mount target `/x (at y)`) never hides what follows it.
fn key(line: &str) -> &str {
    let Some(body) = line.strip_suffix(')') else {
        return line;
    };
    let Some(open) = body.rfind(" (") else {
        return line;
    };
    let inner = &body[open + 2..];
    let at = inner.strip_prefix("at ").or_else(|| {
        inner
            .split_once(" at ")
            .filter(|(word, _)| word.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            .map(|(_, rest)| rest)
    });
    let located = at.is_some_and(|loc| {
        !loc.contains([' ', '(', ')'])
            && loc
                .rsplit_once(':')
                .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if located {
        &line[..open]
    } else {
        line
    }
}

/// The first line of a trust record that lists the approved loosenings (after the file's
/// name, one a line). A record of the older format (the text's digest) approves what the
/// plan loosens today when the text is the one it pinned.
const FORMAT: &str = "aisb-trust v2";

fn approved(path: &std::path::Path, digest: &str, now: &[String]) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut lines = text.lines();
    match lines.next() {
        Some(FORMAT) => lines.skip(1).map(str::to_string).collect(),
        Some(d) if d == digest => now.to_vec(),
        _ => Vec::new(),
    }
}

/// Where the image's files come from, when that is outside the project: another directory's
/// Dockerfile (its directory is the build context, copied into the image), or an OCI layout
/// or archive elsewhere on the host named by `rootfs from=`, an `image`'s `from` or the
/// project Dockerfile's own `FROM`. One line each.
fn image_sources_outside(plan: &Plan) -> Vec<String> {
    use crate::eval::plan::Rootfs;
    use std::path::Path;
    let project = plan.project.as_path();
    let root = project
        .canonicalize()
        .unwrap_or_else(|_| project.to_path_buf());
    // Resolved as the builder will open it: through links where it exists, lexically where not.
    let outside = |p: &Path| {
        let p = p
            .canonicalize()
            .unwrap_or_else(|_| crate::git::lexical_join(project, p));
        !p.starts_with(&root)
    };
    // `oci:…` / `oci-archive:…` (a registry reference is the network's to allow).
    let froms = |base: &Path, from: &str, out: &mut Vec<String>, what: &str| {
        // A variable still unset may name any path when the image is built: said as written.
        if from.contains('$') {
            out.push(format!(
                "{what} is built from `{from}`, a path chosen when it is built"
            ));
            return;
        }
        if let Ok(
            crate::image::Source::Layout { dir: p, .. }
            | crate::image::Source::Archive { file: p, .. },
        ) = crate::image::Source::parse(from, base)
        {
            if outside(&p) {
                out.push(format!(
                    "{what} is built from {}, outside the project",
                    p.display()
                ));
            }
        }
    };
    let mut out = Vec::new();
    match &plan.rootfs {
        Rootfs::Host => {}
        Rootfs::From { source } => froms(project, source, &mut out, "the root filesystem"),
        Rootfs::Dockerfile { path } => {
            // Named by where it really is (a link in the project can be retargeted).
            let real = path.canonicalize().unwrap_or_else(|_| path.clone());
            if outside(path) {
                out.push(format!(
                    "the root filesystem is built from {}, outside the project",
                    real.display()
                ));
            }
            // Bounded: a Dockerfile is a page of text, not a data file.
            use std::io::Read;
            let mut text = String::new();
            let read =
                std::fs::File::open(&real).and_then(|f| f.take(1 << 20).read_to_string(&mut text));
            let name = path
                .strip_prefix(project)
                .unwrap_or(path)
                .display()
                .to_string();
            // The build context is the named path's directory (the link's, not its target's).
            let base = path.parent().unwrap_or(project);
            if read.is_ok() {
                let steps = crate::image::dockerfile::parse(&name, &text).unwrap_or_default();
                for from in expanded_froms(&steps) {
                    froms(base, &from, &mut out, &format!("{name}'s image"));
                }
            }
        }
        Rootfs::Image { name, steps } => {
            for from in expanded_froms(steps) {
                froms(project, &from, &mut out, &format!("image \"{name}\""));
            }
        }
    }
    out
}

/// Each `FROM` of `steps` as the builder reads it: the `ARG` defaults before it expanded
/// (`ARG B=oci:/elsewhere` then `FROM $B`).
fn expanded_froms(steps: &[crate::config::instr::Step]) -> Vec<String> {
    use crate::config::instr::Instr;
    let mut args = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for step in steps {
        match &step.instr {
            Instr::Arg(k, v) => {
                let v = v
                    .as_deref()
                    .map(|v| crate::image::expand(v, &args))
                    .unwrap_or_default();
                args.insert(k.clone(), v);
            }
            Instr::From(from) => out.push(crate::image::expand(from, &args)),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_location_aisb_appended_is_cut() {
        assert_eq!(
            key("allow \".env\": x (at sandbox.kdl:3)"),
            "allow \".env\": x"
        );
        assert_eq!(
            key("/data visible read-only from /p/data (mount at sandbox.kdl:2)"),
            "/data visible read-only from /p/data"
        );
        // A value the configuration chose never ends the key early.
        let evil = "/tmp/x (at y) visible read-write from /root/.ssh (mount at sandbox.kdl:1)";
        assert_eq!(
            key(evil),
            "/tmp/x (at y) visible read-write from /root/.ssh"
        );
        assert_ne!(
            key(evil),
            key("/tmp/x (at y) visible read-only from /p/data (mount at sandbox.kdl:1)")
        );
        for whole in [
            "network reaches 1 domain rule(s): a.com",
            "x (its directory is copied in)",
            "x (at y) visible read-write from /root/.ssh (at a b:1)",
            "x (mount at f:1a)",
        ] {
            assert_eq!(key(whole), whole);
        }
    }

    #[test]
    fn a_from_is_read_with_its_arg_defaults() {
        let steps = crate::image::dockerfile::parse(
            "Dockerfile",
            "ARG B=oci:/elsewhere\nARG C=${B}:v1\nFROM $C\n",
        )
        .unwrap();
        assert_eq!(expanded_froms(&steps), ["oci:/elsewhere:v1"]);
    }
}
