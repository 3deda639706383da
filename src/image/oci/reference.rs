//! Image references, parsed as the distribution project's reference grammar defines them
//! (`distribution/reference`: `reference.go`, `normalize.go`), since every part of one ends up
//! in a registry URL:
//!
//! ```text
//! reference  := name [ ":" tag ] [ "@" digest ]
//! name       := [ domain "/" ] path-component [ "/" path-component ]*  (path: 255 at most)
//! domain     := host [ ":" port ]       host := domain-name | IPv4 | "[" IPv6 "]"
//! path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"* ) [a-z0-9]+ )*
//! tag        := [A-Za-z0-9_] [A-Za-z0-9_.-]{0,127}
//! digest     := algorithm ":" hex       (aisb verifies by sha256: 64 lowercase hex digits)
//! ```
//!
//! The first component is a domain when it has a `.` or `:`, is `localhost`, or has an
//! uppercase letter; otherwise the image is Docker Hub's. Docker Hub's names (`docker.io`,
//! `index.docker.io`, `registry-1.docker.io`) are one, and a one-component name there is an
//! official image under `library/`.
//!
//! `oci_spec::distribution::Reference` implements the same grammar with a regex, but it takes
//! Unicode word characters for `\w` in tags, has no bracketed IPv6 hosts, keeps
//! `registry-1.docker.io` apart from Docker Hub and answers every mistake with one "invalid
//! format": this parser says which part is wrong.

use std::net::IpAddr;

use oci_spec::image::{Digest, DigestAlgorithm};

/// An image reference: `[HOST[:PORT]/]REPO[:TAG][@sha256:HEX]`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reference {
    /// As written (case kept), Docker Hub's names as `docker.io`.
    pub registry: String,
    pub repo: String,
    pub tag: Option<String>,
    /// `sha256:` and 64 lowercase hex digits.
    pub digest: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("an image reference is empty")]
    Empty,
    #[error("`{reference}`: {problem}")]
    Bad { reference: String, problem: String },
}

const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_ALIASES: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
/// Where Docker Hub's distribution API answers.
const DOCKER_HUB_API: &str = "registry-1.docker.io";
const NAME_MAX: usize = 255;
const TAG_MAX: usize = 128;

impl Reference {
    pub fn parse(s: &str) -> Result<Reference, ReferenceError> {
        if s.is_empty() {
            return Err(ReferenceError::Empty);
        }
        let bad = |problem: String| ReferenceError::Bad {
            reference: s.to_string(),
            problem,
        };
        let (rest, digest) = match s.split_once('@') {
            Some((rest, d)) => (rest, Some(parse_digest(d).map_err(bad)?)),
            None => (s, None),
        };
        // A tag is what follows a `:` after the last `/` (before it, a `:` is a port).
        let after_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest.get(after_slash..).and_then(|t| t.rfind(':')) {
            Some(i) => {
                let colon = after_slash + i;
                let tag = rest.get(colon + 1..).unwrap_or_default();
                check_tag(tag).map_err(bad)?;
                (rest.get(..colon).unwrap_or_default(), Some(tag.to_string()))
            }
            None => (rest, None),
        };
        let (registry, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains(['.', ':'])
                    || first == "localhost"
                    || first.bytes().any(|b| b.is_ascii_uppercase()) =>
            {
                check_domain(first).map_err(bad)?;
                (first, path)
            }
            _ => (DOCKER_HUB, name),
        };
        check_path(path).map_err(bad)?;
        // Compared exactly, as Docker does: `Docker.io` names a registry of that name.
        let docker_hub = DOCKER_HUB_ALIASES.contains(&registry);
        let (registry, repo) = if docker_hub && !path.contains('/') {
            (DOCKER_HUB.to_string(), format!("library/{path}"))
        } else if docker_hub {
            (DOCKER_HUB.to_string(), path.to_string())
        } else {
            (registry.to_string(), path.to_string())
        };
        // On the repository as the registry sees it (`library/` included), so a reference
        // and its printed form are judged alike.
        if repo.len() > NAME_MAX {
            return Err(bad(format!(
                "the repository name is {} characters long, more than the {NAME_MAX} a registry takes",
                repo.len()
            )));
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".into())
        } else {
            tag
        };
        Ok(Reference {
            registry,
            repo,
            tag,
            digest,
        })
    }

    /// The same image, pinned by digest.
    pub fn pinned(&self, digest: &str) -> Reference {
        Reference {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// `HOST[:PORT]` where the registry's API answers.
    pub fn api_authority(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// Whether the registry is named as this machine's own loopback (`localhost`,
    /// 127.0.0.0/8, `[::1]`, with or without a port): only such a one is spoken to in plain
    /// HTTP, as Docker does. A name that merely starts like one (`localhost.example.com`) is
    /// not.
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(split_authority(self.api_authority()).0)
    }

    /// The repository's API root, `http(s)://HOST[:PORT]/v2/REPO`.
    pub fn base_url(&self) -> String {
        format!(
            "{}://{}/v2/{}",
            if self.is_loopback() { "http" } else { "https" },
            self.api_authority(),
            self.repo
        )
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repo)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// `host` (no brackets) is this machine's loopback, exactly.
pub fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `HOST[:PORT]` or `[IPV6][:PORT]` -> (host without brackets, the port as written). Total:
/// anything unparsable comes back whole as the host.
pub fn split_authority(authority: &str) -> (&str, Option<&str>) {
    if let Some(rest) = authority.strip_prefix('[') {
        if let Some((host, after)) = rest.split_once(']') {
            return (host, after.strip_prefix(':'));
        }
        return (authority, None);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    }
}

/// `d` as a sha256 digest (the only kind aisb verifies), or why it is not one.
pub fn parse_digest(d: &str) -> Result<String, String> {
    let parsed = Digest::try_from(d).map_err(|e| {
        format!("`{d}` is not a digest (ALGORITHM:HEX, e.g. sha256:<64 hex digits>): {e}")
    })?;
    if parsed.algorithm() != &DigestAlgorithm::Sha256 {
        return Err(format!(
            "`{d}`: aisb verifies images by sha256 digests only, not {}",
            parsed.algorithm()
        ));
    }
    Ok(d.to_string())
}

/// `d` is `sha256:` and 64 lowercase hex digits.
pub fn is_digest(d: &str) -> bool {
    sha256_hex_of(d).is_some()
}

/// The 64 hex digits of a sha256 digest, None for anything else.
pub fn sha256_hex_of(d: &str) -> Option<&str> {
    d.strip_prefix("sha256:").filter(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn check_tag(tag: &str) -> Result<(), String> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut bytes = tag.bytes();
    match bytes.next() {
        None => return Err("the tag after `:` is empty".into()),
        Some(first) if !word(first) => {
            return Err(format!(
                "the tag `{tag}` must start with a letter, digit or `_`"
            ))
        }
        Some(_) => {}
    }
    if !bytes.all(|b| word(b) || b == b'.' || b == b'-') {
        return Err(format!(
            "the tag `{tag}` may hold only letters, digits, `_`, `.` and `-`"
        ));
    }
    if tag.len() > TAG_MAX {
        return Err(format!(
            "the tag is {} characters long, more than {TAG_MAX}",
            tag.len()
        ));
    }
    Ok(())
}

fn check_domain(domain: &str) -> Result<(), String> {
    let (host, port) = split_authority(domain);
    if let Some(port) = port {
        if port.is_empty()
            || !port.bytes().all(|b| b.is_ascii_digit())
            || port.parse::<u16>().is_err()
        {
            return Err(format!(
                "`{domain}`: the port `{port}` is not a port number"
            ));
        }
    }
    if domain.starts_with('[') {
        let exact = match port {
            Some(p) => domain == format!("[{host}]:{p}"),
            None => domain == format!("[{host}]"),
        };
        return match host.parse::<std::net::Ipv6Addr>() {
            Ok(_) if exact => Ok(()),
            _ => Err(format!("`{domain}` is not a bracketed IPv6 address")),
        };
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!(
            "the registry `{domain}` is not a host name (letters, digits and `-` between dots) or address"
        ))
    }
}

fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("the repository name is empty".into());
    }
    for component in path.split('/') {
        check_component(component)
            .map_err(|why| format!("the repository `{path}` is not a valid name: {why}"))?;
    }
    Ok(())
}

/// `[a-z0-9]+ ( ( "." | "_" | "__" | "-"* ) [a-z0-9]+ )*`
fn check_component(c: &str) -> Result<(), String> {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let b = c.as_bytes();
    match (b.first(), b.last()) {
        (None, _) => return Err("an empty component (`//`, or `/` at an end)".into()),
        (Some(&f), Some(&l)) if !alnum(f) || !alnum(l) => {
            return Err(format!(
                "`{c}` must start and end with a lowercase letter or digit"
            ))
        }
        _ => {}
    }
    for sep in c.split(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit()) {
        let ok = sep.is_empty()
            || sep == "."
            || sep == "_"
            || sep == "__"
            || sep.bytes().all(|b| b == b'-');
        if !ok {
            return Err(format!(
                "`{c}`: `{sep}` is not a separator (`.`, `_`, `__` or dashes; lowercase letters and digits between them)"
            ));
        }
    }
    Ok(())
}
