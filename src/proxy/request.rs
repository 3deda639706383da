//! What a sandbox sends the proxy, parsed without I/O: an HTTP request head (CONNECT,
//! absolute-URI or origin-form HTTP, and the init's own two reports) or a SOCKS5 greeting and
//! request. The server reads until a parser here stops answering `Partial`, then acts on the
//! answer; the bytes come from the sandbox, so every parser here is fuzzed
//! (fuzz/fuzz_targets/proxy_request.rs) and none may panic.

pub use crate::config::domain::split_authority;
use crate::vocab::{AGENT_EVENT_MAX, AGENT_METHOD, AGENT_RESULT_METHOD, DIRECT_METHOD};

/// Largest request head accepted (request line and headers).
pub const MAX_HEAD: usize = 64 * 1024;
/// Headers past this many make the head invalid (httparse's `TooManyHeaders`).
const MAX_HEADERS: usize = 96;

/// Headers that belong to one connection and are never forwarded; `Host` is rewritten.
const HOP_BY_HOP: [&str; 9] = [
    "host",
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// How far an HTTP request head is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    /// More bytes are needed (the caller stops reading at [`MAX_HEAD`]).
    Partial,
    /// The head is the first `n` bytes; what follows is body or tunnelled data.
    Complete(usize),
    /// Not HTTP: httparse's reason.
    Invalid(String),
}

pub fn http_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => Head::Complete(n),
        Ok(httparse::Status::Partial) => Head::Partial,
        Err(e) => Head::Invalid(e.to_string()),
    }
}

/// What a complete HTTP request head asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpRequest {
    /// The init saw the workload try to connect around the proxy (it was refused there).
    Direct { host: String, port: u16 },
    /// An agent's tool hook reporting a tool call: `body_len` bytes of JSON follow the head.
    AgentEvent { target: String, body_len: usize },
    /// An agent's post-tool hook asking what was refused during its call: `body_len` bytes
    /// (the call's id) follow the head.
    AgentResult { body_len: usize },
    /// A tunnel to `host:port`.
    Connect { host: String, port: u16 },
    /// Plain HTTP to forward, once the policy allows `host:port`.
    Forward(Forward),
    /// Answered before any policy decision.
    Refused {
        code: u16,
        reason: &'static str,
        body: &'static str,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub method: String,
    /// Origin-form: what goes on the upstream request line.
    pub path: String,
    pub host: String,
    pub port: u16,
    /// The authority as the request gave it (the absolute URI's, else Host's; no user info),
    /// for a check that tells a port given from one defaulted.
    pub authority: String,
    /// The body's length: exactly this many bytes are forwarded, whatever else the client sends.
    pub length: u64,
    /// End-to-end headers in their order (hop-by-hop ones and `Host` dropped).
    pub headers: Vec<(String, String)>,
}

impl Forward {
    /// The head sent upstream: `Host` says the name the policy checked (`checked_host`), the
    /// client's end-to-end headers follow, and the upstream closes after one response, so a
    /// second request on the client's connection can never ride on this one's check.
    pub fn upstream_head(&self, checked_host: &str) -> String {
        let host_header = if self.port == 80 {
            checked_host.to_string()
        } else {
            format!("{checked_host}:{}", self.port)
        };
        let mut head = format!(
            "{} {} HTTP/1.1\r\nHost: {host_header}\r\n",
            self.method, self.path
        );
        for (name, value) in &self.headers {
            head.push_str(name);
            head.push_str(": ");
            head.push_str(value);
            head.push_str("\r\n");
        }
        head.push_str("Connection: close\r\n\r\n");
        head
    }
}

/// `head`: the bytes [`http_head`] found complete.
pub fn http_request(head: &[u8]) -> HttpRequest {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let _ = req.parse(head);
    let method = req.method.unwrap_or("");
    let target = req.path.unwrap_or("");
    let header = |name: &str| {
        req.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
    };
    let refused = |code, reason, body| HttpRequest::Refused { code, reason, body };

    if method == DIRECT_METHOD {
        let (host, port) = split_authority(target, None).unwrap_or((target.to_string(), 0));
        return HttpRequest::Direct { host, port };
    }
    if method == AGENT_METHOD {
        let body_len = header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
            .min(AGENT_EVENT_MAX);
        return HttpRequest::AgentEvent {
            target: target.to_string(),
            body_len,
        };
    }
    if method == AGENT_RESULT_METHOD {
        let body_len = header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0)
            .min(256);
        return HttpRequest::AgentResult { body_len };
    }
    if method == "CONNECT" {
        return match split_authority(target, None) {
            Some((host, port)) => HttpRequest::Connect { host, port },
            None => refused(400, "Bad Request", "CONNECT needs host:port"),
        };
    }

    // Plain HTTP: absolute-URI (`GET http://host/path`), or origin-form with a Host header.
    let (authority, path) = if let Some(rest) = target.strip_prefix("http://") {
        match rest.split_once('/') {
            Some((authority, _)) => (authority.to_string(), rest[authority.len()..].to_string()),
            None => (rest.to_string(), "/".to_string()),
        }
    } else if target.starts_with('/') {
        match header("host") {
            Some(h) => (h, target.to_string()),
            None => return refused(400, "Bad Request", "no Host header and no absolute URI"),
        }
    } else {
        return refused(
            400,
            "Bad Request",
            "only http:// URIs are proxied in plain text; use https through CONNECT",
        );
    };
    let authority = authority
        .rsplit_once('@')
        .map_or(authority.as_str(), |(_, a)| a);
    let Some((host, port)) = split_authority(authority, Some(80)) else {
        return refused(400, "Bad Request", "bad host in the request");
    };
    if header("transfer-encoding").is_some() {
        return refused(
            501,
            "Not Implemented",
            "chunked request bodies are not proxied over plain HTTP; use https",
        );
    }
    // One Content-Length, digits only (`+3`, two values or two headers would let the upstream
    // frame the body differently from the proxy).
    let lengths = req
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("content-length"))
        .count();
    let length: u64 = match header("content-length") {
        None => 0,
        Some(v) if lengths == 1 && !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => {
            match v.parse::<u64>() {
                Ok(n) => n,
                Err(_) => return refused(400, "Bad Request", "bad Content-Length"),
            }
        }
        Some(_) => return refused(400, "Bad Request", "bad Content-Length"),
    };
    let headers = req
        .headers
        .iter()
        .filter(|h| !HOP_BY_HOP.iter().any(|n| h.name.eq_ignore_ascii_case(n)))
        .map(|h| {
            (
                h.name.to_string(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    HttpRequest::Forward(Forward {
        method: method.to_string(),
        path,
        host,
        port,
        authority: authority.to_string(),
        length,
        headers,
    })
}

/// A SOCKS5 greeting: VER NMETHODS METHODS…
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Socks5Greeting {
    Partial,
    /// "No authentication" is not among the methods offered: answer 0xff and close.
    NoAcceptableMethod,
    /// "No authentication" offered (the one method the proxy takes); the greeting is `len`
    /// bytes long.
    NoAuth {
        len: usize,
    },
}

pub fn socks5_greeting(buf: &[u8]) -> Socks5Greeting {
    let Some(&n) = buf.get(1) else {
        return Socks5Greeting::Partial;
    };
    let len = 2 + n as usize;
    match buf.get(2..len) {
        None => Socks5Greeting::Partial,
        Some(methods) if methods.contains(&0) => Socks5Greeting::NoAuth { len },
        Some(_) => Socks5Greeting::NoAcceptableMethod,
    }
}

/// A SOCKS5 request after the greeting: VER CMD RSV ATYP ADDR PORT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Socks5Request {
    Partial,
    /// Answered with this reply code and closed: 7 command not supported (CONNECT only),
    /// 8 address type not supported.
    Refused(u8),
    /// CONNECT to `host:port`; the request is `len` bytes long (what follows is tunnelled).
    Connect {
        host: String,
        port: u16,
        len: usize,
    },
}

pub fn socks5_request(buf: &[u8]) -> Socks5Request {
    if buf.len() < 5 {
        return Socks5Request::Partial;
    }
    let addr_len = match buf[3] {
        1 => 4,
        4 => 16,
        3 => 1 + buf[4] as usize,
        _ => 0,
    };
    let len = 4 + addr_len + 2;
    if buf.len() < len {
        return Socks5Request::Partial;
    }
    if buf[1] != 1 {
        return Socks5Request::Refused(7);
    }
    let addr = &buf[4..4 + addr_len];
    let host = match buf[3] {
        1 => std::net::Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]).to_string(),
        4 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(addr);
            format!("[{}]", std::net::Ipv6Addr::from(o))
        }
        3 => String::from_utf8_lossy(&addr[1..]).into_owned(),
        _ => return Socks5Request::Refused(8),
    };
    let port = u16::from_be_bytes([buf[len - 2], buf[len - 1]]);
    Socks5Request::Connect { host, port, len }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str) -> HttpRequest {
        match http_head(text.as_bytes()) {
            Head::Complete(n) => http_request(&text.as_bytes()[..n]),
            other => panic!("{other:?} for {text:?}"),
        }
    }

    fn refused_code(r: HttpRequest) -> u16 {
        match r {
            HttpRequest::Refused { code, .. } => code,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn heads_partial_complete_invalid() {
        assert_eq!(
            http_head(b"GET http://a.com/ HTTP/1.1\r\nHost: a"),
            Head::Partial
        );
        assert_eq!(
            http_head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nbody"),
            Head::Complete(27)
        );
        assert!(matches!(http_head(b"\x16\x03\x01"), Head::Invalid(_)));
    }

    #[test]
    fn connect_and_the_inits_reports() {
        assert_eq!(
            request("CONNECT a.com:443 HTTP/1.1\r\n\r\n"),
            HttpRequest::Connect {
                host: "a.com".into(),
                port: 443
            }
        );
        assert_eq!(refused_code(request("CONNECT a.com HTTP/1.1\r\n\r\n")), 400);
        assert_eq!(
            request("AISB-DIRECT-CONNECT 10.0.0.1:22 HTTP/1.1\r\n\r\n"),
            HttpRequest::Direct {
                host: "10.0.0.1".into(),
                port: 22
            }
        );
        assert_eq!(
            request("AISB-AGENT-EVENT claude HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n"),
            HttpRequest::AgentEvent {
                target: "claude".into(),
                body_len: AGENT_EVENT_MAX
            }
        );
    }

    #[test]
    fn absolute_uri_loses_its_userinfo_and_hop_by_hop_headers() {
        let HttpRequest::Forward(f) = request(
            "POST http://user:pw@a.com:8080/x?y HTTP/1.1\r\nHost: evil.com\r\n\
             Proxy-Authorization: secret\r\nContent-Length: 3\r\nX-A: 1\r\n\r\n",
        ) else {
            panic!("not forwarded")
        };
        assert_eq!(
            (f.host.as_str(), f.port, f.path.as_str(), f.length),
            ("a.com", 8080, "/x?y", 3)
        );
        assert_eq!(
            f.upstream_head("a.com"),
            "POST /x?y HTTP/1.1\r\nHost: a.com:8080\r\nContent-Length: 3\r\nX-A: 1\r\n\
             Connection: close\r\n\r\n"
        );
    }

    #[test]
    fn origin_form_needs_a_host_header() {
        let HttpRequest::Forward(f) = request("GET /p HTTP/1.1\r\nhost:  b.org \r\n\r\n") else {
            panic!("not forwarded")
        };
        assert_eq!(
            (f.host.as_str(), f.port, f.path.as_str()),
            ("b.org", 80, "/p")
        );
        assert_eq!(
            f.upstream_head("b.org"),
            "GET /p HTTP/1.1\r\nHost: b.org\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(refused_code(request("GET /p HTTP/1.1\r\n\r\n")), 400);
        assert_eq!(
            refused_code(request("GET https://a.com/ HTTP/1.1\r\n\r\n")),
            400
        );
        assert_eq!(
            refused_code(request("GET http://a.com:x/ HTTP/1.1\r\n\r\n")),
            400
        );
    }

    #[test]
    fn bodies_only_by_content_length() {
        let chunked = "POST http://a.com/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(refused_code(request(chunked)), 501);
        let bad = "POST http://a.com/ HTTP/1.1\r\nContent-Length: -1\r\n\r\n";
        assert_eq!(refused_code(request(bad)), 400);
    }

    #[test]
    fn authorities() {
        assert_eq!(
            split_authority("a.com:443", None),
            Some(("a.com".into(), 443))
        );
        assert_eq!(
            split_authority("a.com", Some(80)),
            Some(("a.com".into(), 80))
        );
        assert_eq!(split_authority("a.com", None), None);
        assert_eq!(
            split_authority("[::1]:8080", None),
            Some(("[::1]".into(), 8080))
        );
        assert_eq!(split_authority("a.com:0", None), None);
        assert_eq!(split_authority("a.com:x", None), None);
        assert_eq!(split_authority("::1:80", None), None);
    }

    #[test]
    fn socks5_greetings() {
        assert_eq!(socks5_greeting(&[5]), Socks5Greeting::Partial);
        assert_eq!(socks5_greeting(&[5, 2, 0]), Socks5Greeting::Partial);
        assert_eq!(
            socks5_greeting(&[5, 2, 2, 0, 9]),
            Socks5Greeting::NoAuth { len: 4 }
        );
        assert_eq!(
            socks5_greeting(&[5, 1, 2]),
            Socks5Greeting::NoAcceptableMethod
        );
        assert_eq!(socks5_greeting(&[5, 0]), Socks5Greeting::NoAcceptableMethod);
    }

    #[test]
    fn socks5_requests() {
        let name = [5, 1, 0, 3, 5, b'a', b'.', b'c', b'o', b'm', 1, 187, b'x'];
        assert_eq!(socks5_request(&name[..11]), Socks5Request::Partial);
        assert_eq!(
            socks5_request(&name),
            Socks5Request::Connect {
                host: "a.com".into(),
                port: 443,
                len: 12
            }
        );
        assert_eq!(
            socks5_request(&[5, 1, 0, 1, 127, 0, 0, 1, 0, 80]),
            Socks5Request::Connect {
                host: "127.0.0.1".into(),
                port: 80,
                len: 10
            }
        );
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&[0, 22]);
        assert_eq!(
            socks5_request(&v6),
            Socks5Request::Connect {
                host: "[::1]".into(),
                port: 22,
                len: 22
            }
        );
        assert_eq!(
            socks5_request(&[5, 2, 0, 1, 1, 2, 3, 4, 0, 80]),
            Socks5Request::Refused(7)
        );
        assert_eq!(
            socks5_request(&[5, 1, 0, 9, 0, 0]),
            Socks5Request::Refused(8)
        );
        assert_eq!(socks5_request(&[5, 1, 0, 9, 0]), Socks5Request::Partial);
    }
}

#[cfg(test)]
mod length_tests {
    use super::*;

    /// A body the upstream could frame differently from the proxy is refused.
    #[test]
    fn content_length_is_one_header_of_digits() {
        let req = |cl: &str| {
            http_request(
                format!("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\n{cl}\r\n").as_bytes(),
            )
        };
        assert!(matches!(req("Content-Length: 3\r\n"), HttpRequest::Forward(f) if f.length == 3));
        for bad in [
            "Content-Length: +3\r\n",
            "Content-Length: 3, 3\r\n",
            "Content-Length: 3\r\nContent-Length: 40\r\n",
            "Content-Length: \r\n",
            "Content-Length: 0x3\r\n",
        ] {
            assert!(
                matches!(req(bad), HttpRequest::Refused { code: 400, .. }),
                "{bad:?} was taken"
            );
        }
    }
}
