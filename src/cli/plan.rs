use std::fmt::Write as _;
use std::path::Path;

use super::Global;
use crate::eval::plan::{MountKind, NetMode, Plan, SystemPath};
use crate::Error;

/// Show what the sandbox will be: mounts, masked paths and why, env names, network
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  aisb plan\n  aisb plan sandbox.kdl.example\n  aisb plan --profile investigate\n  aisb plan --sandbox fix-42\n  aisb plan --json | jq '.masks[].path'"
)]
pub struct Args {
    /// The configuration file (default: sandbox.kdl in this directory or a parent, or `-f`'s)
    #[arg(value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    #[arg(short, long)]
    pub profile: Option<String>,
    /// The named sandbox's plan (its state, its shared clone)
    #[arg(long, value_name = "NAME")]
    pub sandbox: Option<String>,
    /// Machine-readable output (env values are never included)
    #[arg(long)]
    pub json: bool,
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let g = &g.with_file(a.config.clone())?;
    let host = super::host()?;
    let plan = match &a.sandbox {
        None => g.plan(&host, a.profile, vec![])?,
        Some(name) => {
            if !crate::session::valid_name(name) {
                return Err(crate::session::SessionError::BadName(name.clone()).into());
            }
            let mut req = g.request(a.profile, vec![]);
            req.sandbox = Some(name.clone());
            let loaded = g.load_for(&host, &[])?;
            super::evaluated(crate::eval::evaluate(&loaded, &host, &req).map_err(Error::from)?)
        }
    };
    let image = crate::image::sandbox::graph_of(&plan);
    // On an image, the system paths are the image's once it is built (unknown before).
    let plan = match &image {
        None => plan,
        Some(g) => g
            .as_ref()
            .ok()
            .and_then(|g| crate::image::sandbox::as_built(&plan, g))
            .unwrap_or_else(|| Plan {
                system: Vec::new(),
                ..plan
            }),
    };
    if a.json {
        let mut v = serde_json::to_value(&plan).unwrap_or_default();
        v["host_nodes"] =
            serde_json::to_value(crate::graph::host_nodes(&plan, a.sandbox.is_some()))
                .unwrap_or_default();
        if let Some(g) = &image {
            v["image"] = match g {
                Ok(g) => serde_json::to_value(g).unwrap_or_default(),
                Err(e) => serde_json::json!({ "error": e.to_string() }),
            };
        }
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        print!("{}", render(&plan, &host.cwd, a.sandbox.is_some()));
        if let Some(g) = &image {
            print!("{}", render_image(g, &plan.build_network));
        }
    }
    Ok(0)
}

pub fn render_image(
    g: &Result<crate::image::graph::Graph, crate::image::graph::BuildError>,
    build_network: &[String],
) -> String {
    let mut o = String::new();
    let g = match g {
        Ok(g) => g,
        Err(e) => {
            let _ = writeln!(o, "\nimage: cannot plan it: {e}");
            return o;
        }
    };
    let todo = g.nodes.iter().filter(|n| !n.cached).count();
    let _ = writeln!(
        o,
        "\nimage {} (hash {}, {}; `aisb build` builds it)",
        g.name,
        &g.hash[..16],
        if g.cached {
            "cached".to_string()
        } else {
            format!("{todo} of {} nodes to build", g.nodes.len())
        }
    );
    if let Some((src, digest)) = &g.base {
        let _ = writeln!(o, "  base {src} = {digest}");
    }
    let reach = if build_network.is_empty() {
        "nothing (no network)".to_string()
    } else if build_network == crate::eval::default_build_network() {
        format!(
            "the groups {} ({} rules; `rootfs … {{ network … }}` says otherwise)",
            crate::eval::BUILD_GROUPS.join(", "),
            build_network.len()
        )
    } else {
        build_network.join(", ")
    };
    let _ = writeln!(o, "  RUN steps reach {reach}");
    for (i, n) in g.nodes.iter().enumerate() {
        let status = match (&n.entry, n.cached) {
            (None, _) => "",
            (Some(_), true) => "cached",
            (Some(_), false) => "to build",
        };
        let what: String = n.what.chars().take(60).collect();
        let _ = writeln!(
            o,
            "  {:>2} {:<16} {what:<60} {:<18} {status}",
            i + 1,
            &n.hash[..16.min(n.hash.len())],
            n.at
        );
    }
    o
}

fn rel<'a>(p: &'a Path, base: &Path) -> std::borrow::Cow<'a, str> {
    match p.strip_prefix(base) {
        Ok(r) if !r.as_os_str().is_empty() => r.to_string_lossy(),
        _ => p.to_string_lossy(),
    }
}

pub fn render(plan: &Plan, _cwd: &Path, named: bool) -> String {
    let mut o = String::new();
    let source = match &plan.config_file {
        Some(f) => f.display().to_string(),
        None => "embedded default (no sandbox.kdl found; `aisb init` writes one)".into(),
    };
    let _ = writeln!(o, "config    {source}");
    let _ = writeln!(o, "profile   {}", plan.profile);
    let _ = writeln!(
        o,
        "project   {} ({})",
        plan.project.display(),
        plan.project_access.as_str()
    );
    let id = &plan.identity;
    let _ = writeln!(
        o,
        "user      {} (uid {}, gid {}), home {}",
        id.name,
        id.uid,
        id.gid,
        id.home.display()
    );
    let _ = writeln!(o, "state     {}", plan.state_dir.display());

    let _ = writeln!(o, "\nsystem (read-only)");
    let mut list = Vec::new();
    for sys in &plan.system {
        match sys {
            SystemPath::Bind { path } => list.push(path.display().to_string()),
            SystemPath::Symlink { path, target } => {
                list.push(format!("{} -> {}", path.display(), target.display()))
            }
            SystemPath::Snapshot { .. } => {}
            SystemPath::Image { path, .. } => list.push(format!("{} (image)", path.display())),
        }
    }
    if list.is_empty() && plan.rootfs != crate::eval::plan::Rootfs::Host {
        list.push("the image's top-level directories, once it is built (`aisb build`)".into());
    }
    let _ = writeln!(o, "  {}", list.join("  "));
    for sys in &plan.system {
        if let SystemPath::Snapshot { path, snapshot } = sys {
            let _ = writeln!(
                o,
                "  {}: the allowlisted, world-readable entries (passwd, hosts, ssl, …), \
                 snapshot {}; the rest is not visible",
                path.display(),
                snapshot.dir.display()
            );
        }
    }

    let _ = writeln!(
        o,
        "\nrealised on the host (store entries shared by content, `aisb store ls`; the rest this sandbox's)"
    );
    for n in crate::graph::host_nodes(plan, named) {
        let name = match n.path.strip_prefix(&plan.state_dir) {
            Ok(r) => r.display().to_string(),
            Err(_) => n
                .path
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned()),
        };
        let status = if n.ready {
            "ready"
        } else {
            "made at the next run"
        };
        let _ = writeln!(
            o,
            "  {:<20} {:<16} {:<44} {:<28} {status}",
            n.kind,
            &n.hash[..n.hash.len().min(16)],
            name,
            n.target.display()
        );
    }

    let _ = writeln!(o, "\nmounts");
    for m in &plan.mounts {
        let (kind, from) = match &m.kind {
            MountKind::Bind { source, writable } => (
                if *writable { "rw" } else { "ro" },
                if *source == m.target {
                    String::new()
                } else {
                    format!(" <- {}", source.display())
                },
            ),
            MountKind::Overlay { lower, upper, .. } => (
                "overlay",
                format!(
                    " <- {} (writes kept in {})",
                    lower.display(),
                    upper.display()
                ),
            ),
            MountKind::Copy { source, copy } => (
                "copy",
                format!(" <- {} (private copy {})", source.display(), copy.display()),
            ),
            MountKind::Git { writable, .. } => (if *writable { "rw" } else { "ro" }, String::new()),
            MountKind::Tmpfs { .. } => ("tmpfs", String::new()),
            MountKind::State { dir } => ("state", format!(" <- {}", dir.display())),
            MountKind::Generated { dir, files } => (
                "written",
                format!(
                    " <- {} ({})",
                    dir.display(),
                    files
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        };
        let _ = writeln!(o, "  {kind:<8} {}{from}   [{}]", m.target.display(), m.why);
        // The git objects a run shows there: decided at the run, from the history then.
        let private_git = matches!(&m.kind, MountKind::Overlay { upper, .. }
            if crate::git::back::is_git_layer(&plan.state_dir, upper));
        let read_only_project =
            m.target == plan.project && crate::runtime::read_only_git_dir(plan).is_some();
        if private_git || read_only_project {
            let _ = writeln!(
                o,
                "           its git objects: the host's without the blobs ever at a masked path (each reads as a line saying so), kept in {}/{}",
                plan.state_dir.display(),
                crate::git::store::STORE_DIR
            );
        }
    }

    if !plan.protected.is_empty() {
        let _ = writeln!(
            o,
            "\nprotected, not there yet (one the sandbox makes is moved aside when the run ends)"
        );
        // Names only, wrapped (`aisb why PATH` says what obeys each).
        let mut line = String::from(" ");
        for p in &plan.protected {
            let slash = if p.dir { "/" } else { "" };
            let name = format!(" {}{slash}", rel(&p.path, &plan.project));
            if line.len() + name.len() > 96 {
                let _ = writeln!(o, "{line}");
                line = String::from(" ");
            }
            line.push_str(&name);
        }
        let _ = writeln!(o, "{line}");
    }
    if !plan.unprotected.is_empty() {
        let _ = writeln!(
            o,
            "\nUNPROTECTED (`unprotect`: the sandbox may write them, and the host's tools obey them)"
        );
        for p in &plan.unprotected {
            let _ = writeln!(o, "  {}", rel(p, &plan.project));
        }
    }

    let s = &plan.scan;
    let how = format!(
        "{}{} entries scanned{}",
        if s.git { "git, " } else { "" },
        s.entries,
        if s.cached { ", cached" } else { "" }
    );
    let _ = writeln!(o, "\nmasked ({}; {how})", plan.masks.len());
    for m in &plan.masks {
        let p = rel(&m.path, &plan.project);
        let kind = if m.dir { "dir " } else { "file" };
        let slash = if m.dir { "/" } else { "" };
        let _ = writeln!(o, "  {kind} {p}{slash}   [{}]", m.rule);
    }
    for n in &s.notes {
        let _ = writeln!(o, "  note: {n}");
    }

    let names: Vec<&str> = plan.env.vars.iter().map(|(k, _)| k.as_str()).collect();
    let _ = writeln!(o, "\nenv (names only; values are never shown)");
    let _ = writeln!(o, "  kept ({}): {}", names.len(), names.join(" "));
    let mut by_reason: std::collections::BTreeMap<&str, Vec<&str>> =
        std::collections::BTreeMap::new();
    for d in &plan.env.dropped {
        by_reason
            .entry(d.reason.as_str())
            .or_default()
            .push(d.name.as_str());
    }
    let _ = writeln!(o, "  dropped ({}):", plan.env.dropped.len());
    for (reason, names) in by_reason {
        let _ = writeln!(o, "    {reason}: {}", names.join(" "));
    }

    let n = &plan.network;
    let _ = writeln!(o, "\nnetwork");
    match n.mode {
        NetMode::None => {
            let _ = writeln!(o, "  none: loopback only, no way out");
        }
        NetMode::Host => {
            let _ = writeln!(o, "  HOST: the sandbox shares the host's network; nothing is filtered (network \"host\")");
        }
        NetMode::Allow => {
            let _ = writeln!(
                o,
                "  allow (through the filtering proxy): {}",
                if n.allow.is_empty() {
                    "nothing".into()
                } else {
                    n.allow.join(" ")
                }
            );
            if n.domains != crate::eval::plan::DomainsMode::Merge {
                let why = match n.domains {
                    crate::eval::plan::DomainsMode::Strict => {
                        "only the presets' lists; sandbox.kdl's own ignored"
                    }
                    _ => "only sandbox.kdl's own lists; the presets' dropped",
                };
                let _ = writeln!(o, "  domains {}: {why}", n.domains.name());
                if !n.ignored.is_empty() {
                    let _ = writeln!(o, "  ignored: {}", n.ignored.join(", "));
                }
            }
            if !n.deny.is_empty() {
                let _ = writeln!(o, "  deny: {}", n.deny.join(" "));
            }
            if !n.localhost_ports.is_empty() {
                let ports: Vec<String> = n.localhost_ports.iter().map(u16::to_string).collect();
                let _ = writeln!(o, "  host loopback ports: {}", ports.join(" "));
            }
            if n.transparent_ports.is_empty() {
                let _ = writeln!(
                    o,
                    "  transparent: off (only clients that read the proxy variables get out)"
                );
            } else {
                let ports: Vec<String> = n.transparent_ports.iter().map(u16::to_string).collect();
                let _ = writeln!(
                    o,
                    "  transparent: DNS stub at 127.0.0.53 (allowed names get synthetic addresses, others NXDOMAIN); TCP to any address on ports {} goes through the same proxy (network transparent=#false turns it off)",
                    ports.join(" ")
                );
            }
        }
    }

    if !plan.credentials.is_empty() {
        let _ = writeln!(
            o,
            "\ncredentials (brokered: a placeholder inside, the real value added by the proxy)"
        );
        for c in &plan.credentials {
            let hosts = if c.hosts.is_empty() {
                "no host (the network allows none of its hosts)".to_string()
            } else {
                format!("https://{}", c.hosts.join(", https://"))
            };
            let _ = writeln!(
                o,
                "  {}  ${} inside; real value from {}; added to {} in header {} ({})   [{}]",
                c.name,
                c.env,
                c.source,
                hosts,
                c.header,
                c.scheme.name(),
                c.at
            );
            for (what, list) in [("allow", &c.allow_requests), ("deny", &c.deny_requests)] {
                for (rule, at) in list {
                    let _ = writeln!(o, "    {what}-request \"{rule}\"   [{at}]");
                }
            }
        }
    }

    let p = &plan.process;
    let _ = writeln!(o, "\nprocess");
    let _ = writeln!(o, "  command   {}", p.args.join(" "));
    let _ = writeln!(o, "  cwd       {}", p.cwd.display());
    let _ = writeln!(o, "  shell     {}", p.shell.display());
    for r in &p.rlimits {
        let _ = writeln!(o, "  rlimit    {} soft={} hard={}", r.kind, r.soft, r.hard);
    }
    if plan.read_only {
        let _ = writeln!(o, "  read-only: the project and every mount are read-only");
    }

    let l = &plan.limits;
    let at = |name: &str| match l.set_at.get(name) {
        Some(at) => format!("[{at}]"),
        None => "[aisb's default]".into(),
    };
    let _ = writeln!(
        o,
        "\nlimits (`limits {{ pids …; memory …; cpus …; disk … }}`)"
    );
    let _ = writeln!(
        o,
        "  pids      {} processes and threads   {}",
        l.pids,
        at("pids")
    );
    let _ = writeln!(
        o,
        "  memory    {}   {}",
        match l.memory {
            None => "unlimited".into(),
            // aisb's default needs a memory cgroup for the caller.
            Some(_)
                if !l.configured("memory") && !crate::runtime::limits::default_memory_held(l) =>
            {
                "unlimited (no memory cgroup here for aisb's default)".into()
            }
            Some(m) => format!("{}, swap included", crate::runtime::limits::human(m)),
        },
        at("memory")
    );
    let _ = writeln!(
        o,
        "  cpus      {}   {}",
        l.cpus_milli
            .map_or("unlimited".into(), |c| format!("{}", c as f64 / 1000.0)),
        at("cpus")
    );
    let _ = writeln!(
        o,
        "  disk      {}   {}",
        match l.disk {
            crate::eval::plan::Disk::Unlimited => "unlimited".into(),
            crate::eval::plan::Disk::Bytes(b) => format!(
                "{} in copy-on-write layers and private copies",
                crate::runtime::limits::human(b)
            ),
            crate::eval::plan::Disk::Default =>
                "half of what the layers hold plus what is free".into(),
        },
        at("disk")
    );
    if !plan.tools.is_empty() {
        let _ = writeln!(
            o,
            "\ntools (`tools {{ allow …; deny … }}`, per agent preset)"
        );
        for line in plan.tools.describe() {
            let _ = writeln!(o, "  {line}");
        }
    }
    if !plan.tasks.is_empty() {
        let names: Vec<&str> = plan.tasks.iter().map(|t| t.name.as_str()).collect();
        let _ = writeln!(o, "\ntasks     {}", names.join(" "));
    }
    o
}
