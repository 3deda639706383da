//! What a sandboxed process may send the proxy: HTTP request heads (CONNECT, absolute-URI,
//! origin-form, the init's own report methods) and SOCKS5 greetings and requests, built from
//! the fuzzer's bytes with the protocol's own words, or raw bytes.

use arbitrary::Arbitrary;

#[derive(Arbitrary, Debug)]
pub enum Request {
    Http {
        method: Method,
        target: Target,
        version: Version,
        headers: Vec<(HeaderName, Text)>,
        /// After the head: body, tunnelled bytes, a second request.
        after: Vec<u8>,
    },
    Socks5 {
        methods: Vec<u8>,
        command: u8,
        address: Address,
        port: u16,
        after: Vec<u8>,
    },
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
pub enum Method {
    Get,
    Post,
    Connect,
    Direct,
    Agent,
    Any(String),
}

#[derive(Arbitrary, Debug)]
pub enum Target {
    Absolute {
        scheme: Scheme,
        userinfo: Option<Text>,
        host: Host,
        port: Option<Port>,
        path: Text,
    },
    Authority(Host, Option<Port>),
    Origin(Text),
    Any(String),
}

#[derive(Arbitrary, Debug)]
pub enum Scheme {
    Http,
    Https,
    Upper,
    Any(String),
}

#[derive(Arbitrary, Debug)]
pub enum Port {
    Number(u16),
    Any(String),
}

#[derive(Arbitrary, Debug)]
pub enum Host {
    Allowed,
    AllowedSub,
    Denied,
    Loopback,
    V6,
    Metadata,
    Upper,
    TrailingDot,
    Unicode,
    Any(String),
}

#[derive(Arbitrary, Debug)]
pub enum HeaderName {
    Host,
    ContentLength,
    TransferEncoding,
    Connection,
    ProxyAuthorization,
    Upgrade,
    Any(String),
}

#[derive(Arbitrary, Debug)]
pub enum Version {
    H11,
    H10,
    Any(String),
}

/// Text that is mostly what the field holds, sometimes anything.
#[derive(Arbitrary, Debug)]
pub enum Text {
    Host(Host),
    Number(u64),
    Word(String),
}

#[derive(Arbitrary, Debug)]
pub enum Address {
    V4([u8; 4]),
    V6([u8; 16]),
    Name(Host),
    /// A name with a declared length that may disagree with its bytes.
    Raw(u8, Vec<u8>),
    UnknownType(u8, Vec<u8>),
}

impl Host {
    fn text(&self) -> String {
        match self {
            Host::Allowed => "example.com".into(),
            Host::AllowedSub => "a.allowed.org".into(),
            Host::Denied => "bad.allowed.org".into(),
            Host::Loopback => "127.0.0.1".into(),
            Host::V6 => "[::1]".into(),
            Host::Metadata => "169.254.169.254".into(),
            Host::Upper => "EXAMPLE.COM".into(),
            Host::TrailingDot => "example.com.".into(),
            Host::Unicode => "ëxample.com".into(),
            Host::Any(s) => s.clone(),
        }
    }
}

impl Text {
    fn text(&self) -> String {
        match self {
            Text::Host(h) => h.text(),
            Text::Number(n) => n.to_string(),
            Text::Word(s) => s.clone(),
        }
    }
}

impl Port {
    fn text(&self) -> String {
        match self {
            Port::Number(n) => n.to_string(),
            Port::Any(s) => s.clone(),
        }
    }
}

impl Request {
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Request::Raw(b) => b.clone(),
            Request::Http {
                method,
                target,
                version,
                headers,
                after,
            } => {
                let method = match method {
                    Method::Get => "GET".into(),
                    Method::Post => "POST".into(),
                    Method::Connect => "CONNECT".into(),
                    Method::Direct => aisb::vocab::DIRECT_METHOD.into(),
                    Method::Agent => aisb::vocab::AGENT_METHOD.into(),
                    Method::Any(s) => s.clone(),
                };
                let target = match target {
                    Target::Absolute {
                        scheme,
                        userinfo,
                        host,
                        port,
                        path,
                    } => {
                        let scheme = match scheme {
                            Scheme::Http => "http".into(),
                            Scheme::Https => "https".into(),
                            Scheme::Upper => "HTTP".into(),
                            Scheme::Any(s) => s.clone(),
                        };
                        let user = userinfo.as_ref().map_or(String::new(), |u| u.text() + "@");
                        let port = port
                            .as_ref()
                            .map_or(String::new(), |p| ":".to_string() + &p.text());
                        format!("{scheme}://{user}{}{port}/{}", host.text(), path.text())
                    }
                    Target::Authority(h, p) => {
                        let port = p
                            .as_ref()
                            .map_or(String::new(), |p| ":".to_string() + &p.text());
                        h.text() + &port
                    }
                    Target::Origin(t) => "/".to_string() + &t.text(),
                    Target::Any(s) => s.clone(),
                };
                let version = match version {
                    Version::H11 => "HTTP/1.1".into(),
                    Version::H10 => "HTTP/1.0".into(),
                    Version::Any(s) => s.clone(),
                };
                let mut out = format!("{method} {target} {version}\r\n");
                for (name, value) in headers.iter().take(100) {
                    let name = match name {
                        HeaderName::Host => "Host".into(),
                        HeaderName::ContentLength => "Content-Length".into(),
                        HeaderName::TransferEncoding => "Transfer-Encoding".into(),
                        HeaderName::Connection => "Connection".into(),
                        HeaderName::ProxyAuthorization => "Proxy-Authorization".into(),
                        HeaderName::Upgrade => "Upgrade".into(),
                        HeaderName::Any(s) => s.clone(),
                    };
                    out.push_str(&format!("{name}: {}\r\n", value.text()));
                }
                out.push_str("\r\n");
                let mut out = out.into_bytes();
                out.extend_from_slice(after);
                out
            }
            Request::Socks5 {
                methods,
                command,
                address,
                port,
                after,
            } => {
                let mut out = vec![5, methods.len().min(255) as u8];
                out.extend(methods.iter().take(255));
                out.extend_from_slice(&[5, *command, 0]);
                match address {
                    Address::V4(a) => {
                        out.push(1);
                        out.extend_from_slice(a);
                    }
                    Address::V6(a) => {
                        out.push(4);
                        out.extend_from_slice(a);
                    }
                    Address::Name(h) => {
                        let t = h.text();
                        let b = &t.as_bytes()[..t.len().min(255)];
                        out.push(3);
                        out.push(b.len() as u8);
                        out.extend_from_slice(b);
                    }
                    Address::Raw(n, b) => {
                        out.push(3);
                        out.push(*n);
                        out.extend_from_slice(b);
                    }
                    Address::UnknownType(t, b) => {
                        out.push(*t);
                        out.extend_from_slice(b);
                    }
                }
                out.extend_from_slice(&port.to_be_bytes());
                out.extend_from_slice(after);
                out
            }
        }
    }
}
