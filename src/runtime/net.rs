//! The network proxy of one run: started before the sandbox (when its network is `allow`),
//! stopped after it. Its socket lives in a fresh 0700 directory under the sandbox's state,
//! which the spec mounts read-only at `/run/aisb/net`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::RuntimeError;
use crate::eval::plan::NetMode;
use crate::eval::Plan;
use crate::proxy::policy::PolicyConfig;

/// Names the proxy resolves without DNS: `name=ip,name=ip` (tests, or pinning a host).
pub const RESOLVE_ENV: &str = "AISB_PROXY_RESOLVE";
/// Names the proxy sends to one fixed address, internal or not: `name=ip:port,…` (a local
/// model gateway or mock server for an agent's API host). Only the caller's environment sets it.
pub const PIN_ENV: &str = "AISB_PROXY_PIN";

pub struct ProxyProcess {
    pub dir: PathBuf,
    child: Child,
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> RuntimeError {
    move |source| RuntimeError::Io { what, source }
}

/// `NAME=VALUE,…` from the caller's environment variable `var` (empty when unset); a bad item
/// is an error naming the variable and the form (`form`) it should have.
fn name_map<T: std::str::FromStr>(var: &str, form: &str) -> Result<Vec<(String, T)>, RuntimeError> {
    let Ok(spec) = std::env::var(var) else {
        return Ok(Vec::new());
    };
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            item.split_once('=')
                .and_then(|(n, v)| Some((n.to_string(), v.trim().parse().ok()?)))
                .ok_or_else(|| RuntimeError::Io {
                    what: format!("{var}: `{item}` is not {form}"),
                    source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
                })
        })
        .collect()
}

/// The caller's [`RESOLVE_ENV`] and [`PIN_ENV`].
pub type CallerNames = (
    Vec<(String, std::net::IpAddr)>,
    Vec<(String, std::net::SocketAddr)>,
);

/// What the caller's environment says about names: [`RESOLVE_ENV`] and [`PIN_ENV`].
pub fn caller_names() -> Result<CallerNames, RuntimeError> {
    Ok((
        name_map(RESOLVE_ENV, "NAME=IP")?,
        name_map(PIN_ENV, "NAME=IP:PORT")?,
    ))
}

/// The policy the proxy enforces for this plan.
pub fn policy(plan: &Plan) -> Result<PolicyConfig, RuntimeError> {
    let (resolve, pins) = caller_names()?;
    Ok(PolicyConfig {
        allow: plan.network.allow.clone(),
        deny: plan.network.deny.clone(),
        localhost_ports: plan.network.localhost_ports.clone(),
        resolve,
        pins,
        broker: None,
    })
}

/// A started proxy, and what the sandbox's environment gets for the credentials it brokers
/// (each one's placeholder, and the variables that point the ecosystems at the CA bundle).
pub struct Started {
    pub proxy: Option<ProxyProcess>,
    pub env: Vec<(String, String)>,
    /// Variables kept out: their values hold a brokered credential's real value.
    pub withheld: Vec<String>,
}

/// Start the proxy when the plan's network needs one; wait until it listens. With brokered
/// credentials, their real values are read here, on the host, and go to the proxy alone.
pub fn start(plan: &Plan, exe: &Path) -> Result<Started, RuntimeError> {
    if plan.network.mode != NetMode::Allow {
        return Ok(Started {
            proxy: None,
            env: Vec::new(),
            withheld: Vec::new(),
        });
    }
    let mut policy = policy(plan)?;
    let brokering = super::broker::prepare(plan)?;
    policy.broker = brokering.as_ref().map(|b| b.config.clone());
    let proxy = start_with(
        &policy,
        &plan.state_dir.join("net"),
        &plan.state_dir.join("audit.jsonl"),
        exe,
    )?;
    let (env, withheld) = match brokering {
        Some(b) => {
            let withheld = b.withheld.clone();
            (b.finish(&proxy.dir)?, withheld)
        }
        None => (Vec::new(), Vec::new()),
    };
    Ok(Started {
        proxy: Some(proxy),
        env,
        withheld,
    })
}

/// Start a proxy enforcing `policy`, its socket in a fresh 0700 directory under `parent`, its
/// decisions logged to `audit`; wait until it listens.
pub fn start_with(
    policy: &PolicyConfig,
    parent: &Path,
    audit: &Path,
    exe: &Path,
) -> Result<ProxyProcess, RuntimeError> {
    let policy = serde_json::to_vec(policy).map_err(|e| RuntimeError::Io {
        what: "encoding the network policy".into(),
        source: e.into(),
    })?;
    std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    let dir = parent.join(std::process::id().to_string());
    if dir.exists() {
        // Left by a crashed run with our pid: stale by construction.
        let _ = std::fs::remove_dir_all(&dir);
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(io(format!("creating {}", dir.display())))?;
    let mut cmd = Command::new(exe);
    // Bound by a relative name from inside its directory: a socket's path is limited to 107
    // bytes, and the state directory's alone can be longer.
    cmd.arg("__proxy")
        .current_dir(&dir)
        .arg("--socket")
        .arg("proxy.sock")
        .arg("--policy")
        .arg("-")
        .arg("--audit")
        .arg(audit)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // Its own process group: the terminal's ^C is for the sandbox, not for its network.
        .process_group(0);
    // SAFETY: prctl is async-signal-safe. If aisb dies, so does its proxy.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|source| RuntimeError::Spawn {
        program: format!("{} __proxy", exe.display()),
        source,
    })?;
    let mut stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let proc = ProxyProcess { dir, child };
    if let Some(mut s) = stdin.take() {
        s.write_all(&policy)
            .map_err(io("sending the network policy to the proxy".into()))?;
    }
    let mut line = String::new();
    if let Some(out) = stdout {
        let _ = BufReader::new(out).read_line(&mut line);
    }
    if line.trim() != "ready" {
        return Err(RuntimeError::Io {
            what: "the network proxy did not start (see its message above)".into(),
            source: std::io::Error::from(std::io::ErrorKind::BrokenPipe),
        });
    }
    Ok(proc)
}
