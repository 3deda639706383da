//! `aisb proxy serve`: the same proxy as a sandbox's (policy, deny-first, rebinding-safe,
//! audit), as a standalone TCP server — the egress of sandboxes running elsewhere, e.g. the
//! pods `aisb export k8s` writes, which reach it as a Service.
//!
//! What a network-facing server needs beyond the per-run proxy (whose one client is its own
//! sandbox, over a Unix socket):
//! - **Bounded**: at most `max_connections` at once; past that a client gets `503` and is
//!   closed at once, so a flood costs a descriptor for a moment, never memory that grows.
//! - **Timeouts**: a connection that sends or accepts nothing for `idle` is closed (slow
//!   headers, stalled tunnels); connecting upstream has the proxy's own 10 s.
//! - **Health**: `GET /healthz` (origin-form, which a proxy request never is) answers `200 ok`
//!   while the server accepts, for readiness and liveness probes.
//! - **Graceful shutdown**: on SIGTERM or SIGINT it stops accepting, and waits up to `drain` for
//!   open connections to finish before it returns.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_io_timeout::TimeoutStream;

use super::server::Proxy;

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    /// A connection idle this long (no byte either way) is closed.
    pub idle: Duration,
    /// How long shutdown waits for open connections.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 1024,
            idle: Duration::from_secs(300),
            drain: Duration::from_secs(30),
        }
    }
}

const HEALTH: &[u8] = b"GET /healthz ";
const BUSY: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
const OK: &[u8] = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n";

/// Whether the first bytes of a connection are a health check. Waits (up to `idle`) only as
/// long as they could still turn out to be one.
async fn is_health_check(stream: &TcpStream, idle: Duration) -> bool {
    let mut buf = [0u8; HEALTH.len()];
    let deadline = tokio::time::Instant::now() + idle;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 || buf[..n] != HEALTH[..n] {
            return false;
        }
        if n == HEALTH.len() {
            return true;
        }
        // A prefix of the health check so far: wait for more bytes to arrive.
        if tokio::time::timeout_at(deadline, stream.readable())
            .await
            .is_err()
        {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn connection(stream: TcpStream, proxy: Arc<Proxy>, idle: Duration) {
    let _ = stream.set_nodelay(true);
    if is_health_check(&stream, idle).await {
        let mut s = stream;
        let _ = s.write_all(OK).await;
        let _ = s.shutdown().await;
        return;
    }
    let mut s = TimeoutStream::new(stream);
    s.set_read_timeout(Some(idle));
    s.set_write_timeout(Some(idle));
    let _ = proxy.handle(Box::pin(s)).await;
}

/// Serve on `listener` until `shutdown` completes, then drain (see the module docs).
pub async fn serve_tcp(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let (mut stream, _) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                // Out of descriptors or a connection reset before accept: keep serving.
                Err(e) if is_transient(&e) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tokio::spawn(async move {
                let _ = stream.write_all(BUSY).await;
                let _ = stream.shutdown().await;
            });
            continue;
        };
        let p = Arc::clone(&proxy);
        tokio::spawn(async move {
            connection(stream, p, limits.idle).await;
            drop(permit);
        });
    }
    drop(listener);
    // Every permit back: every connection ended.
    let all = limits.max_connections as u32;
    let _ = tokio::time::timeout(limits.drain, slots.acquire_many(all)).await;
    Ok(())
}

pub(super) fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ECONNABORTED | libc::ENOBUFS | libc::ENOMEM)
    ) || e.kind() == std::io::ErrorKind::ConnectionAborted
}

/// Completes on SIGTERM or SIGINT (what Kubernetes and a terminal send).
pub async fn termination() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the default actions stop the process anyway.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}
