//! The shared vocabulary: names both sides of the sandbox wall agree on. The host-side proxy,
//! the in-sandbox init, the spec and the agents' settings all speak it; none of them imports
//! another for it. This module imports nothing of aisb, so anything may import it.

use serde_json::Value;

/// Where the init binary appears inside every sandbox.
pub const INIT_PATH: &str = "/run/aisb/init";

/// The init's own binary, installed beside `aisb`: it links only what the init needs, so it
/// starts in a fraction of the time the full `aisb` takes. `aisb __init` is the fallback.
pub const INIT_BINARY: &str = "aisb-init";

/// Where the proxy's socket appears inside the sandbox.
pub const PROXY_DIR: &str = "/run/aisb/net";
pub const PROXY_SOCKET: &str = "/run/aisb/net/proxy.sock";
/// The loopback port the workload's `HTTP(S)_PROXY` points at.
pub const PROXY_PORT: u16 = 3128;

/// Where the masking file is mounted in a sandbox that has the live layer (see
/// `runtime::live::masker`).
pub const MASK_SOURCE: &str = "/run/aisb/masked";
/// An empty directory where the mask helper mounts the reporting layer of masks
/// (`runtime::live::deny`): one file per masked path, bound on top of its mask.
pub const DENY_DIR: &str = "/run/aisb/deny";

/// Where the list of paths the init masks is mounted (`--mask-list=`): one mount per mask,
/// made by the init, never a runtime argument or an OCI mount each.
pub const MASK_LIST: &str = "/run/aisb/mask-list";

/// The request method the init uses to report a direct connection attempt to the proxy.
pub const DIRECT_METHOD: &str = "AISB-DIRECT-CONNECT";
/// The request method the init's DNS stub uses to ask whether a name may be answered.
pub const RESOLVE_METHOD: &str = "AISB-RESOLVE";
/// On a `CONNECT` from the transparent relay: how it learned the name (`dns`, `sni`, `host`,
/// `ip`), for the audit log.
pub const LEARNED_HEADER: &str = "X-Aisb-Learned";
/// On a `CONNECT` from the transparent relay that carries the workload's connection itself
/// (SCM_RIGHTS): how the proxy serves it, [`HANDED_TUNNEL`] or [`HANDED_HTTP`].
pub const HANDED_HEADER: &str = "X-Aisb-Handed";
/// Both ways, as a tunnel (the relay checked what the client's first bytes name).
pub const HANDED_TUNNEL: &str = "tunnel";
/// Plain HTTP to the name connected to: one request, whose authority must be that name and
/// port, forwarded as the proxy forwards any (Host rewritten, `Connection: close`).
pub const HANDED_HTTP: &str = "http";
/// On a direct-connection report from the transparent relay: why it refused.
pub const REASON_HEADER: &str = "X-Aisb-Reason";
/// The whole request the init sends, with its proxy port's listening sockets attached
/// (SCM_RIGHTS), as the proxy's first connection: from then on the proxy accepts the
/// workload's connections to that port itself, with no relay in the sandbox between them.
pub const LISTEN_REQUEST: &[u8] = b"AISB-LISTEN * HTTP/1.1\r\n\r\n";
/// The most listening sockets one [`LISTEN_REQUEST`] carries (127.0.0.1 and [::1]).
pub const LISTEN_MAX: usize = 2;
/// The request method an agent's tool hook uses to put a tool call into the audit log.
pub const AGENT_METHOD: &str = "AISB-AGENT-EVENT";
/// The request method an agent's post-tool hook uses to ask what the sandbox refused during
/// its call (`proxy::feedback`); the body is the call's id.
pub const AGENT_RESULT_METHOD: &str = "AISB-AGENT-RESULT";
/// The most of what the post-tool hook hands the model (`proxy::feedback`).
pub const FEEDBACK_MAX: usize = 2000;

/// `id` as a tool call's key, for the agent hooks and the proxy alike: what agents use
/// (`toolu_…`, `call_…`), nothing else, at most 128 characters.
pub fn tool_call_id(id: &str) -> Option<String> {
    let id: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        .take(128)
        .collect();
    (!id.is_empty()).then_some(id)
}

/// The most of a hook's input forwarded (a Write tool's input holds the whole file).
pub const AGENT_EVENT_MAX: usize = 16 * 1024;

/// The most of a tool call's input kept in the audit log.
const MAX_INPUT: usize = 500;

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
        format!("ssh -o ProxyCommand='{} connect %h %p'", INIT_PATH),
    ));
    v
}

/// The tool and a one-line summary of its input, from a Claude Code hook's JSON input.
pub fn summarise_tool_call(body: &[u8]) -> (String, String) {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let tool = v
        .get("tool_name")
        .and_then(Value::as_str)
        .map_or_else(|| "unknown".to_string(), clean_label);
    let input = v.get("tool_input").cloned().unwrap_or(Value::Null);
    let field = |k: &str| input.get(k).and_then(Value::as_str).map(str::to_string);
    let text = field("summary")
        .or_else(|| field("command"))
        .or_else(|| field("file_path"))
        .or_else(|| field("notebook_path"))
        .or_else(|| field("url"))
        .or_else(|| field("pattern"))
        .unwrap_or_else(|| input.to_string());
    (tool, shorten(&text))
}

/// At most [`MAX_INPUT`] characters, control characters shown as spaces (one log line).
pub fn shorten(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_INPUT)
        .collect();
    if s.chars().count() > MAX_INPUT {
        out.push('…');
    }
    out
}

/// The rule and its place, when the hook's event says the call was refused (see
/// `init agent-event` and `crate::tools`), each cut to one bounded log line.
pub fn blocked_by(body: &[u8]) -> Option<(String, String)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let b = v.get("blocked")?;
    let field = |k: &str| shorten(b.get(k).and_then(Value::as_str).unwrap_or("?"));
    Some((field("rule"), field("at")))
}

/// A name from inside the sandbox, safe to log: letters, digits, `-`, `_`, at most 40.
pub fn clean_label(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(40)
        .collect()
}

/// `%XX` escapes decoded, strictly: a `%` not followed by two hex digits is not text of this
/// form (None). The scan cache's paths and the request rules' paths read it.
pub fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

/// A chunk-size line as RFC 9112 7.1 writes it and nothing looser: 1 to 16 hex digits, an
/// extension without control characters, CRLF. None: not one. The init's relay and the
/// proxy's credential broker both follow chunked bodies by it.
pub fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r\n")?;
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return None;
    }
    match line.get(digits) {
        None => {}
        Some(b';')
            if !line[digits..]
                .iter()
                .any(|&b| b.is_ascii_control() && b != b'\t') => {}
        Some(_) => return None,
    }
    u64::from_str_radix(std::str::from_utf8(&line[..digits]).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_calls_are_summarised_on_one_bounded_line() {
        let (tool, input) = summarise_tool_call(
            br#"{"tool_name":"Bash","tool_input":{"command":"cat ~/.ssh/id\nrm -rf /"}}"#,
        );
        assert_eq!(
            (tool.as_str(), input.as_str()),
            ("Bash", "cat ~/.ssh/id rm -rf /")
        );
        let (tool, input) =
            summarise_tool_call(br#"{"tool_name":"Read","tool_input":{"file_path":"/p/.env"}}"#);
        assert_eq!((tool.as_str(), input.as_str()), ("Read", "/p/.env"));
        let long = format!(
            r#"{{"tool_name":"Wr\u001bite","tool_input":{{"content":"{}"}}}}"#,
            "x".repeat(2000)
        );
        let (tool, input) = summarise_tool_call(long.as_bytes());
        assert_eq!(tool, "Write");
        assert_eq!(input.chars().count(), MAX_INPUT + 1);
        assert_eq!(summarise_tool_call(b"not json").0, "unknown");
    }
}

/// The sandbox's `/etc/resolv.conf` when the init's DNS stub answers (transparent egress):
/// eval generates it, spec binds it, the stub listens where it says.
pub const RESOLV_CONF: &str = "# aisb: names are answered by the sandbox's own stub (see `aisb plan`)\nnameserver 127.0.0.53\noptions edns0 trust-ad\n";
/// Where the generated `resolv.conf` is mounted (and bound from, over `/etc/resolv.conf`).
pub const RESOLV_DIR: &str = "/run/aisb/dns";
