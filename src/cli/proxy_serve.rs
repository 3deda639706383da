use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::Global;
use crate::audit::Log;
use crate::proxy::policy::{Policy, PolicyConfig};
use crate::proxy::serve::{serve_tcp, termination, Limits};
use crate::proxy::server::Proxy;
use crate::Error;

/// The egress proxy on its own (for sandboxes running elsewhere, e.g. on Kubernetes)
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(Debug, clap::Subcommand)]
pub enum What {
    /// Serve the proxy on TCP with a sandbox's allowlist: the policy, deny-first checks,
    /// rebinding protection and audit of `aisb run`'s own proxy
    #[command(
        after_help = "Examples:\n  aisb proxy serve --listen 127.0.0.1:3128                 sandbox.kdl's default profile\n  aisb proxy serve --listen 0.0.0.0:3128 --profile investigate\n  aisb proxy serve --listen 0.0.0.0:3128 --policy /etc/aisb/policy.json   (as `aisb export k8s` deploys it)\n\nAudit events go to stdout as JSON lines (or --audit FILE); `GET /healthz` answers 200 while it serves; SIGTERM stops accepting and drains."
    )]
    Serve(ServeArgs),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address and port to listen on
    #[arg(long, value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// The policy as JSON (`allow`, `deny` lists: the ConfigMap `aisb export k8s` writes);
    /// without it, the network allowlist of sandbox.kdl's profile
    #[arg(long, value_name = "FILE", conflicts_with = "profile")]
    policy: Option<PathBuf>,
    /// The profile whose allowlist to serve (with sandbox.kdl)
    #[arg(short, long)]
    profile: Option<String>,
    /// Append audit events to this file instead of writing them to stdout
    #[arg(long, value_name = "FILE")]
    audit: Option<PathBuf>,
    /// Connections served at once; more are answered 503
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: u32,
    /// Seconds a connection may stay idle (nothing sent either way) before it is closed
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    idle_timeout: u64,
    /// Copy buffer per direction per connection, in KiB: memory per open tunnel against
    /// throughput per tunnel (bench/fleet.sh measures both; docs/scale.md)
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(4..=4096))]
    buffer_kib: u32,
    /// Seconds shutdown waits for open connections
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3_600))]
    drain: u64,
}

fn bad_policy(path: &std::path::Path, why: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a proxy policy ({{\"allow\": [...], \"deny\": [...]}}): {why}"),
        ),
    }
}

fn policy(g: &Global, a: &ServeArgs) -> Result<PolicyConfig, Error> {
    // Names the operator pins or resolves (AISB_PROXY_PIN, AISB_PROXY_RESOLVE), as for a run.
    let (resolve, pins) = crate::runtime::net::caller_names()?;
    let mut cfg = policy_rules(g, a)?;
    cfg.resolve = resolve;
    cfg.pins = pins;
    Ok(cfg)
}

fn policy_rules(g: &Global, a: &ServeArgs) -> Result<PolicyConfig, Error> {
    if let Some(path) = &a.policy {
        let text = std::fs::read(path).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
        if text.len() > 4 << 20 {
            return Err(bad_policy(path, "larger than 4 MiB"));
        }
        /// The file's shape: the rules; what else `PolicyConfig` holds (loopback ports, name
        /// overrides) is the operator's, never a file's. Unknown fields are refused (a
        /// misspelt `deny` must not pass as an empty one).
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct PolicyFile {
            allow: Vec<String>,
            #[serde(default)]
            deny: Vec<String>,
            #[serde(default)]
            localhost_ports: Vec<u16>,
            #[serde(default)]
            resolve: Vec<serde_json::Value>,
            #[serde(default)]
            pins: Vec<serde_json::Value>,
        }
        let file: PolicyFile = serde_json::from_slice(&text).map_err(|e| bad_policy(path, e))?;
        if !(file.localhost_ports.is_empty() && file.resolve.is_empty() && file.pins.is_empty()) {
            return Err(bad_policy(
                path,
                "localhost_ports, resolve and pins are not taken from a file (set AISB_PROXY_RESOLVE / AISB_PROXY_PIN where the proxy runs)",
            ));
        }
        let cfg = PolicyConfig {
            allow: file.allow,
            deny: file.deny,
            localhost_ports: Vec::new(),
            resolve: Vec::new(),
            pins: Vec::new(),
            broker: None,
        };
        // Each rule must be one the configuration language accepts: a policy file is input.
        for rule in cfg.allow.iter().chain(&cfg.deny) {
            crate::config::domain::DomainRule::parse(rule)
                .map_err(|e| bad_policy(path, format!("`{rule}`: {e}")))?;
        }
        return Ok(cfg);
    }
    let host = super::host()?;
    let plan = g.plan(&host, a.profile.clone(), Vec::new())?;
    if plan.network.mode != crate::eval::plan::NetMode::Allow {
        return Err(Error::Usage(format!(
            "profile `{}` has no allowlist (network \"{}\"): nothing to serve",
            plan.profile,
            serde_json::to_value(plan.network.mode)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        )));
    }
    Ok(PolicyConfig {
        allow: plan.network.allow,
        deny: plan.network.deny,
        localhost_ports: Vec::new(),
        resolve: Vec::new(),
        pins: Vec::new(),
        broker: None,
    })
}

pub fn run(g: &Global, a: Args) -> Result<i32, Error> {
    let What::Serve(a) = a.what;
    let cfg = policy(g, &a)?;
    let audit = match &a.audit {
        Some(p) => Log::open(p),
        None => Log::stdout(),
    }
    .map_err(|source| Error::Io {
        path: a.audit.clone().unwrap_or_else(|| "/dev/stdout".into()),
        source,
    })?;
    let proxy = Arc::new(Proxy {
        policy: Policy::new(&cfg),
        slots: Proxy::run_slots(),
        audit: Some(audit),
        reported: Default::default(),
        buffer: a.buffer_kib as usize * 1024,
        broker: None,
        feedback: None,
    });
    let limits = Limits {
        max_connections: a.max_connections as usize,
        idle: Duration::from_secs(a.idle_timeout),
        drain: Duration::from_secs(a.drain),
    };
    let io = |source| Error::Io {
        path: PathBuf::from(a.listen.to_string()),
        source,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(io)?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(a.listen).await.map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let _ = writeln!(
            std::io::stderr(),
            "aisb proxy: serving on {addr} ({} allow, {} deny rules; at most {} connections)",
            cfg.allow.len(),
            cfg.deny.len(),
            a.max_connections
        );
        serve_tcp(listener, proxy, limits, termination())
            .await
            .map_err(io)
    })?;
    let _ = writeln!(std::io::stderr(), "aisb proxy: stopped");
    Ok(0)
}
