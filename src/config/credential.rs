//! What a `credential` node says that both the configuration and the proxy read: where in a
//! request the real value goes ([`Scheme`]) and which requests may go at all ([`RequestRule`]).
//! Here, below both, so the proxy (which reads the configuration's domain rules) and the
//! decoder (which checks these at their span) each depend on it alone.

use serde::{Deserialize, Serialize};

/// Where in a request a credential goes: the whole value of its header, after `Bearer `, or
/// as the user name or password of `Basic` authentication (git over HTTPS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    Raw,
    Bearer,
    Basic,
}

impl Scheme {
    pub const NAMES: [&'static str; 3] = ["raw", "bearer", "basic"];
    pub fn parse(s: &str) -> Option<Scheme> {
        match s.to_ascii_lowercase().as_str() {
            "raw" | "none" => Some(Scheme::Raw),
            "bearer" => Some(Scheme::Bearer),
            "basic" => Some(Scheme::Basic),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

/// `METHOD PATH`: a request rule of a credential's hosts. `*` as the method is any method; in
/// the path, `*` is any run of characters (slashes too). Paths are matched as a server reads
/// them: percent-decoded, dot segments resolved, repeated slashes one, the query left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRule {
    pub method: String,
    pub path: String,
}

impl RequestRule {
    pub fn parse(rule: &str) -> Result<RequestRule, String> {
        let (method, path) = rule
            .trim()
            .split_once(' ')
            .ok_or("a method, a space, then a path")?;
        let path = path.trim();
        let token = !method.is_empty() && method.bytes().all(|b| b.is_ascii_uppercase());
        if method != "*" && !token {
            return Err(format!("`{method}` is not a method (upper case, or `*`)"));
        }
        if !(path.starts_with('/') || path.starts_with('*')) || path.contains(char::is_whitespace) {
            return Err("the path starts with `/` or `*` and has no spaces".into());
        }
        if path.contains(['%', '?']) || !path.is_ascii() {
            return Err("write the path decoded, in plain ASCII (a request's path is decoded before it is matched)".into());
        }
        Ok(RequestRule {
            method: method.to_string(),
            path: path.to_string(),
        })
    }

    pub fn matches(&self, method: &str, path: &str) -> bool {
        (self.method == "*" || self.method == method)
            && super::pattern::wildcard(self.path.as_bytes(), path.as_bytes())
    }
}
