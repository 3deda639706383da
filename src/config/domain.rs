//! Domain allowlist rules: `example.com`, `*.example.com` (subdomains only), optional `:port`.
//!
//! Names are normalised the way the proxy will see them: lowercase, no trailing dot, IDNA
//! (punycode). `*` and `*.tld` are refused: they would allow (almost) everything.

use std::fmt;
use std::net::IpAddr;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Host {
    /// Exactly this name.
    Exact(String),
    /// Any strict subdomain of this name (`*.example.com` does not match `example.com`).
    Subdomains(String),
    /// An IP literal, allowed only when listed.
    Ip(IpAddr),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct DomainRule {
    pub host: Host,
    /// `None`: any port.
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainError {
    #[error("empty name")]
    Empty,
    #[error("a lone `*` would allow every host")]
    MatchAll,
    #[error("`*.{0}` would allow a whole top-level domain")]
    WholeTld(String),
    #[error("`*` is only allowed as the first label (`*.example.com`)")]
    BadWildcard,
    #[error("invalid port `{0}`")]
    BadPort(String),
    #[error("not a valid host name: {0}")]
    BadName(String),
}

impl DomainError {
    pub fn help(&self) -> &'static str {
        match self {
            DomainError::MatchAll | DomainError::WholeTld(_) => {
                "name the domains the tool needs, e.g. `api.github.com` or `*.githubusercontent.com`"
            }
            DomainError::BadPort(_) => "ports are 1-65535: `example.com:8443`",
            _ => "write a host name (`example.com`), subdomains (`*.example.com`), an IP, optionally `:port`",
        }
    }
}

impl DomainRule {
    pub fn parse(input: &str) -> Result<DomainRule, DomainError> {
        let input = input.trim();
        if input.is_empty() {
            return Err(DomainError::Empty);
        }
        let (host, port) = split_port(input)?;
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return Ok(DomainRule {
                host: Host::Ip(ip),
                port,
            });
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        if host == "*" {
            return Err(DomainError::MatchAll);
        }
        let (wild, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        if name.contains('*') {
            return Err(DomainError::BadWildcard);
        }
        let ascii = normalise_name(name)?;
        if wild && !ascii.contains('.') {
            return Err(DomainError::WholeTld(ascii));
        }
        let host = if wild {
            Host::Subdomains(ascii)
        } else {
            Host::Exact(ascii)
        };
        Ok(DomainRule { host, port })
    }

    /// Does this rule allow `host:port`? `host` must already be normalised.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.host {
            Host::Exact(n) => n == host,
            Host::Subdomains(n) => {
                host.len() > n.len() + 1
                    && host.ends_with(n.as_str())
                    && host.as_bytes()[host.len() - n.len() - 1] == b'.'
            }
            Host::Ip(ip) => {
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                    .ok()
                    == Some(*ip)
            }
        }
    }
}

/// Lowercase, IDNA to ASCII, and check the labels.
pub fn normalise_name(name: &str) -> Result<String, DomainError> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let ascii =
        idna::domain_to_ascii_strict(name).map_err(|_| DomainError::BadName(name.to_string()))?;
    if ascii.is_empty()
        || ascii.split('.').any(|l| l.is_empty() || l.len() > 63)
        || ascii.len() > 253
    {
        return Err(DomainError::BadName(name.to_string()));
    }
    Ok(ascii)
}

fn split_port(input: &str) -> Result<(&str, Option<u16>), DomainError> {
    // `[::1]:443`, `::1` (bare IPv6, no port), `host:443`, `host`.
    if let Some(rest) = input.strip_prefix('[') {
        if let Some((ip, tail)) = rest.split_once(']') {
            let port = match tail.strip_prefix(':') {
                Some(p) => Some(parse_port(p)?),
                None if tail.is_empty() => None,
                None => return Err(DomainError::BadName(input.to_string())),
            };
            return Ok((ip, port));
        }
    }
    if input.matches(':').count() > 1 {
        return Ok((input, None));
    }
    match input.rsplit_once(':') {
        Some((h, p)) => Ok((h, Some(parse_port(p)?))),
        None => Ok((input, None)),
    }
}

fn parse_port(p: &str) -> Result<u16, DomainError> {
    match p.parse::<u16>() {
        Ok(n) if n > 0 && p.chars().all(|c| c.is_ascii_digit()) => Ok(n),
        _ => Err(DomainError::BadPort(p.to_string())),
    }
}

impl fmt::Display for DomainRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Exact(n) => write!(f, "{n}")?,
            Host::Subdomains(n) => write!(f, "*.{n}")?,
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
            Host::Ip(ip) => write!(f, "{ip}")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// The ports listened on when the allowlist names none: HTTP, HTTPS, SSH.
pub const DEFAULT_PORTS: [u16; 3] = [80, 443, 22];
/// The most ports the relay takes.
const MAX_PORTS: usize = 64;

/// The ports transparent egress's relay (in the init) listens on for an allowlist: HTTP, HTTPS, SSH and every port a rule
/// names (`example.com:8443`), except the host loopback ports (`localhost-port`, which keep
/// meaning the host's loopback), the DNS stub's and the proxy relay's.
pub fn transparent_ports<'a>(
    allow: impl IntoIterator<Item = &'a String>,
    localhost: &[u16],
) -> Vec<u16> {
    let named = allow
        .into_iter()
        .filter_map(|r| DomainRule::parse(r).ok()?.port);
    let mut ports: Vec<u16> = DEFAULT_PORTS
        .into_iter()
        .chain(named)
        .filter(|p| !localhost.contains(p) && *p != 53 && *p != crate::vocab::PROXY_PORT)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports.truncate(MAX_PORTS);
    ports
}

/// `host:port`, `[v6]:port`, or `host` with the default port.
pub fn split_authority(s: &str, default_port: Option<u16>) -> Option<(String, u16)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (ip, tail) = rest.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => default_port?,
            None => return None,
        };
        return Some((format!("[{ip}]"), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => {
            Some((h.to_string(), p.parse().ok().filter(|&p| p > 0)?))
        }
        Some(_) => None,
        None if !s.is_empty() => Some((s.to_string(), default_port?)),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalises() {
        let r = DomainRule::parse("API.GitHub.com.").unwrap();
        assert_eq!(r.host, Host::Exact("api.github.com".into()));
        assert_eq!(r.port, None);
        let r = DomainRule::parse("*.example.com:8443").unwrap();
        assert_eq!(r.host, Host::Subdomains("example.com".into()));
        assert_eq!(r.port, Some(8443));
        let r = DomainRule::parse("bücher.example").unwrap();
        assert_eq!(r.host, Host::Exact("xn--bcher-kva.example".into()));
        assert_eq!(
            DomainRule::parse("[::1]:5432").unwrap().to_string(),
            "[::1]:5432"
        );
        assert_eq!(
            DomainRule::parse("127.0.0.1").unwrap().host,
            Host::Ip("127.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn refuses_overbroad_and_malformed() {
        assert_eq!(DomainRule::parse("*"), Err(DomainError::MatchAll));
        assert_eq!(
            DomainRule::parse("*.com"),
            Err(DomainError::WholeTld("com".into()))
        );
        assert_eq!(DomainRule::parse("a.*.com"), Err(DomainError::BadWildcard));
        assert_eq!(
            DomainRule::parse("x.com:0"),
            Err(DomainError::BadPort("0".into()))
        );
        assert_eq!(
            DomainRule::parse("x.com:99999"),
            Err(DomainError::BadPort("99999".into()))
        );
        assert!(DomainRule::parse("a..b").is_err());
        assert!(DomainRule::parse("").is_err());
    }

    #[test]
    fn subdomain_rule_matches_only_subdomains() {
        let r = DomainRule::parse("*.example.com").unwrap();
        assert!(r.matches("a.example.com", 443));
        assert!(r.matches("a.b.example.com", 80));
        assert!(!r.matches("example.com", 443));
        assert!(!r.matches("badexample.com", 443));
        let p = DomainRule::parse("example.com:443").unwrap();
        assert!(p.matches("example.com", 443));
        assert!(!p.matches("example.com", 80));
    }
    #[test]
    fn ports_are_the_defaults_and_the_allowlists_minus_host_loopback_ones() {
        let allow: Vec<String> = ["a.test:8443", "git.test:9418", "b.test", "c.test:53"]
            .map(String::from)
            .to_vec();
        assert_eq!(transparent_ports(&allow, &[80]), [22, 443, 8443, 9418]);
        assert_eq!(transparent_ports(&[], &[]), [22, 80, 443]);
    }
}
