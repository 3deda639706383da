//! Egress policy. The domain rules are shared by the configuration (validated at their span) and
//! by the host-side proxy that enforces them.

pub mod domain;
pub mod policy;
pub mod request;
pub mod server;

use crate::init::relay::PROXY_PORT;

/// What the workload's environment says when the network goes through the proxy: every
/// common client's proxy variable, loopback exempt, and SSH tunnelled by the init's `connect`.
pub fn sandbox_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let mut v: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        // npm, pip, cargo, yarn read their own names as well.
        "npm_config_proxy",
        "npm_config_https_proxy",
        "PIP_PROXY",
        "CARGO_HTTP_PROXY",
        "YARN_HTTP_PROXY",
        "YARN_HTTPS_PROXY",
    ]
    .iter()
    .map(|k| (k.to_string(), url.clone()))
    .collect();
    v.push(("NO_PROXY".into(), no_proxy.clone()));
    v.push(("no_proxy".into(), no_proxy));
    // Node 24+ honours HTTP(S)_PROXY for fetch() only when asked to.
    v.push(("NODE_USE_ENV_PROXY".into(), "1".into()));
    v.push((
        "GIT_SSH_COMMAND".into(),
        format!(
            "ssh -o ProxyCommand='{} connect %h %p'",
            crate::init::INIT_PATH
        ),
    ));
    v
}
