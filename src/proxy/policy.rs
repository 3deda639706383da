//! The proxy's decisions: may this host:port be reached, and at which address.
//!
//! Order: the deny list first, then the allowlist (first match names the rule); then the name is
//! resolved on the host (or by the override map, never by the sandbox), and every address that
//! is internal (loopback, private, link-local and cloud metadata, CGNAT, ULA, multicast,
//! IPv4-mapped forms of those) is refused unless the rule that allowed the request names that
//! exact host and port. The caller connects to the address returned here, never to a second
//! lookup of the name, so a name that rebinds between check and connect gains nothing.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use crate::config::domain::{normalise_name, DomainRule, Host};

/// Everything the proxy enforces, as the host-side `aisb` hands it over.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PolicyConfig {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    /// Host loopback ports the sandbox may reach (`localhost-port`).
    pub localhost_ports: Vec<u16>,
    /// Name -> addresses, used instead of DNS (tests, or pinning a name).
    pub resolve: Vec<(String, IpAddr)>,
    /// Name -> the one address to connect to for it, internal or not: set on the host by the
    /// caller (a local model gateway, a mock server), never by anything in the sandbox. The
    /// allow/deny decision is still made on the name.
    #[serde(default)]
    pub pins: Vec<(String, SocketAddr)>,
    /// Credentials the proxy adds for their hosts (`credential`), with the user's CA key:
    /// handed over the proxy's stdin only, never written to a file or an argument.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker: Option<super::broker::BrokerConfig>,
}

#[derive(Debug, Clone)]
pub struct Policy {
    allow: Vec<DomainRule>,
    deny: Vec<DomainRule>,
    localhost_ports: Vec<u16>,
    resolve: HashMap<String, Vec<IpAddr>>,
    pins: HashMap<String, SocketAddr>,
}

/// Where a request may go, and the rule that said so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The normalised host name (what the Host header is rewritten to).
    pub host: String,
    pub rule: String,
    /// Whether the rule names this exact host and port (then internal addresses are fine).
    explicit: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// What blocked it, for the 403 and the audit log.
    pub rule: String,
    /// What to write in sandbox.kdl to allow it (when allowing it is possible).
    pub hint: Option<String>,
}

impl Policy {
    pub fn new(cfg: &PolicyConfig) -> Policy {
        let rules = |list: &[String]| {
            list.iter()
                .filter_map(|r| DomainRule::parse(r).ok())
                .collect::<Vec<_>>()
        };
        let mut resolve: HashMap<String, Vec<IpAddr>> = HashMap::new();
        for (name, ip) in &cfg.resolve {
            if let Ok(n) = normalise_name(name) {
                resolve.entry(n).or_default().push(*ip);
            }
        }
        let pins = cfg
            .pins
            .iter()
            .filter_map(|(n, a)| Some((normalise_name(n).ok()?, *a)))
            .collect();
        Policy {
            allow: rules(&cfg.allow),
            deny: rules(&cfg.deny),
            localhost_ports: cfg.localhost_ports.clone(),
            resolve,
            pins,
        }
    }

    /// Check a name (or IP literal) and port against the rules, before any lookup.
    pub fn check(&self, host: &str, port: u16) -> Result<Allowed, Blocked> {
        let host = host.trim();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            let ip = canonical(ip);
            let shown = match ip {
                IpAddr::V6(v6) => format!("[{v6}]"),
                v4 => v4.to_string(),
            };
            if ip.is_loopback() && self.localhost_ports.contains(&port) {
                return Ok(Allowed {
                    host: shown,
                    rule: format!("localhost-port {port}"),
                    explicit: true,
                });
            }
            return self.decide(&shown, port, "an IP address (only listed IPs are allowed)");
        }
        let name = normalise_name(host).map_err(|_| Blocked {
            rule: format!("`{host}` is not a valid host name"),
            hint: None,
        })?;
        self.decide(&name, port, "not in the allowlist")
    }

    /// May `name` be reached on some port? What the sandbox's DNS stub asks before it hands out
    /// a synthetic address: a name no rule could ever allow gets NXDOMAIN, so a lookup alone
    /// tells the workload (and anything tunnelling through DNS) nothing. A deny without a port
    /// refuses the name outright; the port is decided later, on the connection's `CONNECT`.
    pub fn check_name(&self, name: &str) -> Result<Allowed, Blocked> {
        let name = normalise_name(name.trim()).map_err(|_| Blocked {
            rule: format!("`{name}` is not a valid host name"),
            hint: None,
        })?;
        if name.parse::<IpAddr>().is_ok() {
            return Err(Blocked {
                rule: "an IP address is not a name to look up".into(),
                hint: None,
            });
        }
        if let Some(r) = self
            .deny
            .iter()
            .find(|r| r.port.is_none() && r.matches(&name, 0))
        {
            return Err(Blocked {
                rule: format!("deny \"{r}\""),
                hint: Some(format!(
                    "remove `deny \"{r}\"` from the network block in sandbox.kdl"
                )),
            });
        }
        let any_port = |r: &&DomainRule| {
            DomainRule {
                host: r.host.clone(),
                port: None,
            }
            .matches(&name, 0)
        };
        match self.allow.iter().find(any_port) {
            Some(r) => Ok(Allowed {
                host: name,
                rule: format!("allow \"{r}\""),
                explicit: false,
            }),
            None => Err(Blocked {
                rule: "not in the allowlist".into(),
                hint: Some(format!("network {{ allow \"{name}\" }}")),
            }),
        }
    }

    fn decide(&self, host: &str, port: u16, otherwise: &str) -> Result<Allowed, Blocked> {
        if let Some(r) = self.deny.iter().find(|r| r.matches(host, port)) {
            return Err(Blocked {
                rule: format!("deny \"{r}\""),
                hint: Some(format!(
                    "remove `deny \"{r}\"` from the network block in sandbox.kdl"
                )),
            });
        }
        match self.allow.iter().find(|r| r.matches(host, port)) {
            Some(r) => Ok(Allowed {
                host: host.to_string(),
                rule: format!("allow \"{r}\""),
                explicit: r.port == Some(port) && !matches!(r.host, Host::Subdomains(_)),
            }),
            None => Err(Blocked {
                rule: otherwise.to_string(),
                hint: Some(format!("network {{ allow \"{host}\" }}")),
            }),
        }
    }

    /// The address to connect to: from the override map, the IP literal itself, or the host's
    /// resolver; the first one the rule permits.
    pub async fn resolve(&self, allowed: &Allowed, port: u16) -> Result<SocketAddr, Blocked> {
        if let Some(addr) = self.pins.get(&allowed.host) {
            return Ok(*addr);
        }
        let bare = allowed.host.trim_start_matches('[').trim_end_matches(']');
        let candidates: Vec<IpAddr> = if let Ok(ip) = bare.parse::<IpAddr>() {
            vec![ip]
        } else if let Some(ips) = self.resolve.get(&allowed.host) {
            ips.clone()
        } else {
            match tokio::net::lookup_host((allowed.host.as_str(), port)).await {
                Ok(addrs) => addrs.map(|a| a.ip()).collect(),
                Err(e) => {
                    return Err(Blocked {
                        rule: format!("cannot resolve {}: {e}", allowed.host),
                        hint: None,
                    })
                }
            }
        };
        self.pick(allowed, port, &candidates)
    }

    /// The first acceptable address among `candidates`.
    pub fn pick(
        &self,
        allowed: &Allowed,
        port: u16,
        candidates: &[IpAddr],
    ) -> Result<SocketAddr, Blocked> {
        let mut internal = None;
        for ip in candidates {
            let ip = canonical(*ip);
            if allowed.explicit || !is_internal(ip) {
                return Ok(SocketAddr::new(ip, port));
            }
            internal.get_or_insert(ip);
        }
        Err(Blocked {
            rule: match internal {
                Some(ip) => format!(
                    "{} resolves to the internal address {ip}",
                    allowed.host
                ),
                None => format!("{} has no address", allowed.host),
            },
            hint: internal.map(|_| {
                format!(
                    "only an exact rule reaches internal addresses: network {{ allow \"{}:{port}\" }}",
                    allowed.host
                )
            }),
        })
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Addresses a sandbox must not reach by name: the host itself, its networks, cloud metadata.
pub fn is_internal(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => is_internal_v6(v6),
    }
}

fn is_internal_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // includes 169.254.169.254, the cloud metadata service
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // CGNAT 100.64.0.0/10
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking 198.18.0.0/15
        || o[0] >= 240 // reserved
}

fn is_internal_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x64 && s[1] == 0xff9b) // NAT64 64:ff9b::/96 can reach IPv4 internals
        || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
        || ip.to_ipv4().is_some_and(|v4| s[0..6] == [0; 6] && is_internal_v4(v4))
    // compatible
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        Policy::new(&PolicyConfig {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            localhost_ports: vec![5432],
            resolve: vec![
                ("rebind.test".into(), "127.0.0.1".parse().unwrap()),
                ("public.test".into(), "93.184.216.34".parse().unwrap()),
            ],
            pins: vec![("gateway.test".into(), "127.0.0.1:9999".parse().unwrap())],
            broker: None,
        })
    }

    /// A pin (set by the caller on the host) sends an allowed name to its address even when
    /// internal, and changes nothing about whether the name is allowed.
    #[tokio::test]
    async fn pins_route_allowed_names_only() {
        let p = policy(&["gateway.test"], &[]);
        let a = p.check("GATEWAY.test", 80).unwrap();
        assert_eq!(
            p.resolve(&a, 80).await.unwrap(),
            "127.0.0.1:9999".parse().unwrap()
        );
        let p = policy(&["other.test"], &[]);
        assert!(p.check("gateway.test", 80).is_err());
    }

    #[test]
    fn deny_first_then_allow_then_nothing() {
        let p = policy(&["*.example.com", "api.example.com"], &["evil.example.com"]);
        assert_eq!(
            p.check("API.Example.COM.", 443).unwrap().rule,
            "allow \"*.example.com\""
        );
        let b = p.check("evil.example.com", 443).unwrap_err();
        assert_eq!(b.rule, "deny \"evil.example.com\"");
        // `*.x` matches strict subdomains only.
        for host in ["example.com", "example.com.evil", "xexample.com"] {
            assert_eq!(
                p.check(host, 443).unwrap_err().rule,
                "not in the allowlist",
                "{host}"
            );
        }
    }

    #[test]
    fn ip_literals_only_when_listed_and_localhost_ports_only_when_named() {
        let p = policy(&["example.com", "10.1.2.3:8080"], &[]);
        assert!(p.check("93.184.216.34", 443).is_err());
        assert!(p.check("[::ffff:93.184.216.34]", 443).is_err());
        assert!(p.check("10.1.2.3", 8080).is_ok());
        assert!(p.check("10.1.2.3", 8081).is_err());
        assert_eq!(
            p.check("127.0.0.1", 5432).unwrap().rule,
            "localhost-port 5432"
        );
        assert!(p.check("127.0.0.1", 5433).is_err());
        assert!(p.check("[::ffff:127.0.0.1]", 22).is_err());
        assert!(p.check("bad host!", 80).is_err());
    }

    /// What the sandbox's DNS stub may answer: a name some rule allows on some port; a name
    /// denied outright, an unlisted name, an IP literal or garbage gets NXDOMAIN.
    #[test]
    fn names_for_the_dns_stub() {
        let p = policy(
            &["git.test:9418", "*.sub.test", "api.test"],
            &["bad.sub.test", "api.test:8443"],
        );
        assert_eq!(p.check_name("GIT.test.").unwrap().host, "git.test");
        assert!(p.check_name("a.sub.test").is_ok());
        assert!(p.check_name("sub.test").is_err());
        assert_eq!(
            p.check_name("bad.sub.test").unwrap_err().rule,
            "deny \"bad.sub.test\""
        );
        // A deny on one port leaves the name (its other ports are decided on CONNECT).
        assert!(p.check_name("api.test").is_ok());
        assert!(p.check("api.test", 8443).is_err());
        assert!(p.check_name("other.test").is_err());
        assert!(p.check_name("10.1.2.3").is_err());
        assert!(p.check_name("bad name!").is_err());
    }

    #[test]
    fn internal_addresses_need_an_exact_rule() {
        let p = policy(&["rebind.test", "public.test", "*.corp.test"], &[]);
        let a = p.check("rebind.test", 443).unwrap();
        let b = p
            .pick(&a, 443, &["127.0.0.1".parse().unwrap()])
            .unwrap_err();
        assert!(b.rule.contains("internal address 127.0.0.1"), "{}", b.rule);
        let a = p.check("public.test", 443).unwrap();
        assert_eq!(
            p.pick(&a, 443, &["93.184.216.34".parse().unwrap()])
                .unwrap(),
            "93.184.216.34:443".parse().unwrap()
        );
        for ip in [
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "2606:4700::1111", "8.8.8.8"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
        // An exact host:port rule reaches an internal address (a dev server on loopback).
        let p = policy(&["rebind.test:8443"], &[]);
        let a = p.check("rebind.test", 8443).unwrap();
        assert!(p.pick(&a, 8443, &["127.0.0.1".parse().unwrap()]).is_ok());
    }
}
