//! libFuzzer target: what a sandbox sends the host-side proxy, through the proxy's own parsers
//! (`aisb::proxy::request`) and policy, as the server uses them. Invariants: no panic; a
//! parser never claims more bytes than it was given; a request is only forwarded to a host the
//! policy allowed, and the head sent upstream is one complete request whose only `Host` is the
//! checked name (no header smuggling past the check); an agent's report is logged as one
//! bounded line.
//!   RUSTC_BOOTSTRAP=1 cargo fuzz run -s none proxy_request -- -max_total_time=60
#![no_main]

use std::sync::OnceLock;

use aisb::proxy::policy::{Allowed, Policy, PolicyConfig};
use aisb::proxy::request::{
    http_head, http_request, socks5_greeting, socks5_request, Head, HttpRequest, Socks5Greeting,
    Socks5Request, MAX_HEAD,
};
use aisb_fuzz::proxy_gen::Request;
use libfuzzer_sys::fuzz_target;

fn policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| {
        Policy::new(&PolicyConfig {
            allow: vec![
                "example.com".into(),
                "*.allowed.org".into(),
                "api.test:8443".into(),
            ],
            deny: vec!["bad.allowed.org".into()],
            localhost_ports: vec![5432],
            ..Default::default()
        })
    })
}

/// `localhost-port` opens the port on the host's loopback, whichever loopback address names it.
fn loopback(h: &str) -> bool {
    h.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// What the policy may allow, said independently of how it says it.
fn check(host: &str, port: u16) -> Option<Allowed> {
    let a = policy().check(host, port).ok()?;
    let h = a.host.as_str();
    let by_rule = h == "example.com"
        || (h.ends_with(".allowed.org") && h != "bad.allowed.org")
        || (h == "api.test" && port == 8443)
        || (port == 5432 && loopback(h));
    assert!(by_rule, "{host:?}:{port} allowed as {h:?} ({})", a.rule);
    assert!(
        h.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-[]:".contains(&b)),
        "the checked name {h:?} (from {host:?}) is not a plain host name"
    );
    Some(a)
}

fn http(bytes: &[u8]) {
    // The server stops reading at MAX_HEAD (plus one read).
    let buf = &bytes[..bytes.len().min(MAX_HEAD + 4096)];
    let Head::Complete(n) = http_head(buf) else {
        return;
    };
    assert!(n <= buf.len());
    match http_request(&buf[..n]) {
        HttpRequest::Forward(f) => {
            let Some(allowed) = check(&f.host, f.port) else {
                return;
            };
            let head = f.upstream_head(&allowed.host);
            let mut headers = [httparse::EMPTY_HEADER; 128];
            let mut req = httparse::Request::new(&mut headers);
            let parsed = req.parse(head.as_bytes());
            assert!(
                matches!(parsed, Ok(httparse::Status::Complete(m)) if m == head.len()),
                "the upstream head is not one complete request: {parsed:?}\n{head:?}"
            );
            assert_eq!(req.method, Some(f.method.as_str()));
            assert_eq!(req.path, Some(f.path.as_str()));
            let hosts: Vec<_> = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
                .collect();
            let want = if f.port == 80 {
                allowed.host.clone()
            } else {
                format!("{}:{}", allowed.host, f.port)
            };
            assert_eq!(hosts, vec![want], "{head:?}");
        }
        HttpRequest::Connect { host, port } => {
            let _ = check(&host, port);
        }
        HttpRequest::AgentResult { body_len } => {
            assert!(body_len <= 256);
            let body = &buf[n..];
            let id = String::from_utf8_lossy(&body[..body.len().min(body_len)]).into_owned();
            if let Some(id) = aisb::vocab::tool_call_id(&id) {
                assert!(id.len() <= 128);
                assert!(id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')));
            }
        }
        HttpRequest::AgentEvent { target, body_len } => {
            assert!(body_len <= aisb::vocab::AGENT_EVENT_MAX);
            let body = &buf[n..];
            let (tool, input) = aisb::vocab::summarise_tool_call(&body[..body.len().min(body_len)]);
            let label = aisb::vocab::clean_label(&target);
            for l in [&tool, &label] {
                assert!(l.chars().count() <= 40 || l == "unknown");
                assert!(
                    l.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                    "{l:?}"
                );
            }
            assert!(!input.chars().any(char::is_control), "{input:?}");
        }
        HttpRequest::Direct { .. } | HttpRequest::Refused { .. } => {}
    }
}

fn socks5(bytes: &[u8]) {
    let Socks5Greeting::NoAuth { len } = socks5_greeting(bytes) else {
        return;
    };
    assert!(len <= bytes.len());
    let rest = &bytes[len..];
    if let Socks5Request::Connect { host, port, len } = socks5_request(rest) {
        assert!(len <= rest.len());
        let _ = check(&host, port);
    }
}

fuzz_target!(init: aisb_fuzz::overflow::install(), |req: Request| {
    let bytes = req.bytes();
    // The server's sniff: SOCKS5 starts with its version byte.
    match bytes.first() {
        None => {}
        Some(5) => socks5(&bytes),
        Some(_) => http(&bytes),
    }
});
