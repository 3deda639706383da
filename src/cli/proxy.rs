use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use crate::audit::Log;
use crate::proxy::policy::{Policy, PolicyConfig};
use crate::proxy::server::{serve, Proxy};
use crate::Error;

/// The network proxy of one sandbox (started by `aisb run`/`up`; not for direct use)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The Unix socket to listen on (its directory must exist)
    #[arg(long)]
    pub socket: PathBuf,
    /// The policy, as JSON (`PolicyConfig`); `-` reads it from stdin
    #[arg(long)]
    pub policy: PathBuf,
    /// Append every decision to this audit log
    #[arg(long)]
    pub audit: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<i32, Error> {
    // Real credentials and the CA key may come over stdin: no core dump of this process (its
    // directory is the one the sandbox sees), no ptrace by another of the user's processes.
    // Before anything is read. (It forks nothing, so nothing else is changed by it.)
    let _ = nix::sys::prctl::set_dumpable(false);
    let io = |path: &PathBuf| {
        let path = path.clone();
        move |source| Error::Io { path, source }
    };
    let text = if a.policy.as_os_str() == "-" {
        let mut t = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut t).map_err(io(&a.policy))?;
        t
    } else {
        std::fs::read(&a.policy).map_err(io(&a.policy))?
    };
    let cfg: PolicyConfig = serde_json::from_slice(&text).map_err(|e| Error::Io {
        path: a.policy.clone(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    let audit = match &a.audit {
        Some(p) => Some(Log::open(p).map_err(io(p))?),
        None => None,
    };
    let broker = match &cfg.broker {
        Some(b) => Some(
            crate::proxy::broker::Broker::new(b).map_err(|why| Error::Io {
                path: a.policy.clone(),
                source: std::io::Error::other(format!("credential brokering: {why}")),
            })?,
        ),
        None => None,
    };
    // Attempts on masked paths reach the agent's feedback from the run's audit log.
    let feedback = match &a.audit {
        // Its parent is the run's aisb, as the mask helper's is.
        Some(p) => {
            crate::proxy::feedback::Feedback::with_log(p, nix::unistd::getppid().as_raw() as u32)
        }
        None => Default::default(),
    };
    let proxy = Arc::new(Proxy {
        broker,
        policy: Policy::new(&cfg),
        slots: Proxy::run_slots(),
        audit,
        reported: Default::default(),
        buffer: crate::proxy::server::RUN_BUFFER,
        feedback: Some(std::sync::Mutex::new(feedback)),
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io(&a.socket))?;
    rt.block_on(async {
        let _ = std::fs::remove_file(&a.socket);
        let listener = tokio::net::UnixListener::bind(&a.socket).map_err(io(&a.socket))?;
        // The caller waits for this line before it starts the sandbox.
        let mut out = std::io::stdout();
        let _ = writeln!(out, "ready");
        let _ = out.flush();
        serve(listener, proxy).await.map_err(io(&a.socket))
    })?;
    Ok(0)
}
