//! Where a registry may send aisb. A registry names other URLs (its token realm, redirects for
//! blobs) and a hostile one would name the host's own services: another port on loopback, the
//! cloud metadata service at 169.254.169.254, a database on the private network. aisb follows
//! such a URL only when it is https and every address it connects to is public; plain HTTP and
//! internal addresses are for the registry's own authority, the one named in `FROM` (plain
//! HTTP only when that is a loopback registry). The check is made on the addresses the
//! connection then uses (a [`ureq::Resolver`]), so a name that resolves differently the second
//! time gains nothing.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};

use crate::proxy::policy::is_internal;

use super::oci::reference::{is_loopback_host, split_authority, Reference};

/// The registry's own authority, lowercase, and whether it is this machine's loopback.
#[derive(Debug, Clone)]
pub struct Egress {
    host: String,
    port: u16,
    loopback: bool,
}

impl Egress {
    pub fn for_registry(r: &Reference) -> Egress {
        let loopback = r.is_loopback();
        let (host, port) = split_authority(r.api_authority());
        let default = if loopback { 80 } else { 443 };
        Egress {
            host: host.to_ascii_lowercase(),
            port: port.and_then(|p| p.parse().ok()).unwrap_or(default),
            loopback,
        }
    }

    fn is_own(&self, host: &str, port: u16) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host.eq_ignore_ascii_case(&self.host) && port == self.port
    }

    /// Why `url` (which the registry named) may not be requested, if it may not. Checked
    /// before any connection; the addresses are checked again as they are connected to.
    pub fn refuse(&self, url: &url::Url) -> Option<String> {
        let Some(host) = url.host_str() else {
            return Some(format!("{url} names no host"));
        };
        let port = url.port_or_known_default().unwrap_or(0);
        let own = self.is_own(host, port);
        match url.scheme() {
            "https" => {}
            "http" if own && self.loopback => {}
            "http" => {
                return Some(format!(
                    "{url} is plain HTTP: only https, or the loopback registry named in FROM itself"
                ))
            }
            other => return Some(format!("{url}: the scheme `{other}` is not https")),
        }
        let literal = match url.host() {
            Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
            _ => None,
        };
        let internal_name = literal.is_some_and(is_internal) || is_loopback_host(host);
        if internal_name && !own {
            return Some(format!(
                "{url} is an internal address: only the registry named in FROM may be one"
            ));
        }
        None
    }
}

impl ureq::Resolver for Egress {
    fn resolve(&self, netloc: &str) -> io::Result<Vec<SocketAddr>> {
        let (host, port) = split_authority(netloc);
        let port: u16 = port.and_then(|p| p.parse().ok()).unwrap_or(0);
        let addrs: Vec<SocketAddr> = netloc.to_socket_addrs()?.collect();
        if self.is_own(host, port) {
            return Ok(addrs);
        }
        let (public, internal): (Vec<SocketAddr>, Vec<SocketAddr>) =
            addrs.into_iter().partition(|a| !is_internal(a.ip()));
        if public.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{host} resolves to the internal address{} {}: aisb connects only to the registry named in FROM there",
                    if internal.len() > 1 { "es" } else { "" },
                    internal
                        .iter()
                        .map(|a| a.ip().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(public)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ureq::Resolver;

    fn egress(r: &str) -> Egress {
        Egress::for_registry(&Reference::parse(r).unwrap())
    }

    fn refused(e: &Egress, url: &str) -> bool {
        e.refuse(&url::Url::parse(url).unwrap()).is_some()
    }

    #[test]
    fn a_remote_registry_may_send_aisb_to_public_https_only() {
        let e = egress("ghcr.io/a/b");
        assert!(!refused(&e, "https://ghcr.io/token"));
        assert!(!refused(&e, "https://auth.example.com/token?x=1"));
        for url in [
            "http://auth.example.com/token",
            "http://169.254.169.254/latest/meta-data/",
            "https://169.254.169.254/",
            "https://[::ffff:169.254.169.254]/",
            "https://10.0.0.1/",
            "https://[fd00::1]/",
            "https://127.0.0.1/",
            "https://localhost/",
            "https://[::1]:443/",
            "ftp://example.com/",
            "file:///etc/passwd",
        ] {
            assert!(refused(&e, url), "{url}");
        }
    }

    #[test]
    fn a_loopback_registry_may_use_its_own_authority_only() {
        let e = egress("127.0.0.1:5000/a");
        assert!(!refused(&e, "http://127.0.0.1:5000/token"));
        assert!(refused(&e, "http://127.0.0.1:5001/token"));
        assert!(refused(&e, "https://127.0.0.1:5001/token"));
        assert!(refused(&e, "http://localhost:5000/token"));
        let e = egress("localhost:5000/a");
        assert!(!refused(&e, "http://LOCALHOST:5000/t"));
        assert!(refused(&e, "http://127.0.0.1:5000/t"));
    }

    /// The addresses a name resolves to are what is checked: a public name that resolves to
    /// loopback is refused, the registry's own name is not.
    #[test]
    fn resolving_refuses_internal_addresses_of_other_hosts() {
        let e = egress("localhost:5000/a");
        assert!(e.resolve("localhost:5000").is_ok());
        let err = e.resolve("localhost:5001").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.resolve("127.0.0.1:5000").is_err());
        assert!(e.resolve("[::1]:5000").is_err());
        let e = egress("[::1]:5000/a");
        assert!(e.resolve("[::1]:5000").is_ok());
    }
}
