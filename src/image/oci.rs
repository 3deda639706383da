//! Base images: an OCI image layout directory, a tar archive of one, or a registry reached over
//! the distribution API (anonymous bearer tokens). Every byte is checked against its digest:
//! the manifest against the digest it was asked by (or the registry's `Docker-Content-Digest`),
//! the config and each layer against the manifest's descriptors.

use std::cell::RefCell;
use std::fs;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Source;

/// An image reference: `[HOST[:PORT]/]REPO[:TAG][@sha256:HEX]`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reference {
    pub registry: String,
    pub repo: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Reference {
    pub fn parse(s: &str) -> Result<Reference, String> {
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                if !is_digest(d) {
                    return Err(format!(
                        "`{d}` is not a sha256 digest (sha256:<64 hex digits>)"
                    ));
                }
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        let (name, tag) = match rest.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, Some(t.to_string())),
            _ => (rest, None),
        };
        let (registry, repo) = match name.split_once('/') {
            Some((h, r)) if h.contains('.') || h.contains(':') || h == "localhost" => {
                (h.to_string(), r.to_string())
            }
            _ if name.contains('/') => ("docker.io".to_string(), name.to_string()),
            _ => ("docker.io".to_string(), format!("library/{name}")),
        };
        let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c);
        if repo.is_empty() || !repo.chars().all(valid) {
            return Err(format!("`{s}` is not an image reference"));
        }
        let tag = if digest.is_none() && tag.is_none() {
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

    fn base_url(&self) -> String {
        let host = if self.registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            &self.registry
        };
        // Plain HTTP only for a registry on this machine (as Docker treats localhost).
        let local =
            host.starts_with("localhost") || host.starts_with("127.") || host.starts_with("[::1]");
        format!(
            "{}://{host}/v2/{}",
            if local { "http" } else { "https" },
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

pub fn is_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[error("{what}")]
#[diagnostic(help("{help}"))]
pub struct FetchError {
    pub what: String,
    pub help: String,
}

fn fail(what: impl Into<String>, help: impl Into<String>) -> FetchError {
    FetchError {
        what: what.into(),
        help: help.into(),
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
}

#[derive(Debug, Deserialize)]
struct ManifestDoc {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    #[serde(default)]
    manifests: Vec<Descriptor>,
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

/// What a base image's config says that a build and a sandbox use.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct RunConfig {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
}

/// A resolved base: its manifest's digest, config and layers.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct Base {
    pub digest: String,
    pub config: RunConfig,
    pub layers: Vec<Descriptor>,
}

/// Where blobs are read from.
pub enum Blobs {
    Layout(PathBuf),
    Archive(PathBuf),
    Registry(Registry),
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    }
}

/// Resolve a source to its manifest. `pinned`: the digest a lock file holds (used instead of
/// asking the registry what the tag points at).
pub fn resolve(source: &Source, pinned: Option<&str>) -> Result<(Base, Blobs), FetchError> {
    match source {
        Source::Scratch => Err(fail(
            "scratch has no manifest",
            "internal: scratch is resolved by the graph",
        )),
        Source::Layout { dir, tag } => {
            let blobs = Blobs::Layout(dir.clone());
            let base = from_index(&blobs, tag.as_deref(), pinned, &dir.display().to_string())?;
            Ok((base, blobs))
        }
        Source::Archive { file, tag } => {
            let blobs = Blobs::Archive(file.clone());
            let base = from_index(&blobs, tag.as_deref(), pinned, &file.display().to_string())?;
            Ok((base, blobs))
        }
        Source::Registry(r) => {
            let r = match pinned {
                Some(d) if r.digest.is_none() => r.pinned(d),
                _ => r.clone(),
            };
            let reg = Registry::new(&r);
            let reference = r
                .digest
                .clone()
                .or(r.tag.clone())
                .unwrap_or_else(|| "latest".into());
            let (bytes, digest) = reg.manifest(&reference)?;
            let blobs = Blobs::Registry(reg);
            let base = manifest(&blobs, &bytes, digest, &r.to_string())?;
            Ok((base, blobs))
        }
    }
}

/// Ask the registry (never a lock file or cache) which digest `r`'s tag points at now.
pub fn current_digest(r: &Reference) -> Result<String, FetchError> {
    let reg = Registry::new(r);
    let reference = r
        .digest
        .clone()
        .or(r.tag.clone())
        .unwrap_or_else(|| "latest".into());
    Ok(reg.manifest(&reference)?.1)
}

fn from_index(
    blobs: &Blobs,
    tag: Option<&str>,
    pinned: Option<&str>,
    what: &str,
) -> Result<Base, FetchError> {
    let index = blobs.read_file("index.json").map_err(|e| {
        fail(format!("{what}: cannot read index.json: {e}"), "an OCI image layout has oci-layout, index.json and blobs/ (`skopeo copy … oci:DIR:TAG` writes one)")
    })?;
    let doc: ManifestDoc = serde_json::from_slice(&index).map_err(|e| {
        fail(
            format!("{what}: index.json: {e}"),
            "is this an OCI image layout?",
        )
    })?;
    let wanted: Vec<&Descriptor> = doc
        .manifests
        .iter()
        .filter(|d| match (pinned, tag) {
            (Some(p), _) => d.digest == p,
            (None, Some(t)) => d
                .annotations
                .get("org.opencontainers.image.ref.name")
                .is_some_and(|n| n == t),
            (None, None) => true,
        })
        .collect();
    let desc = match wanted.as_slice() {
        [d] => *d,
        [] => {
            let names: Vec<&str> = doc
                .manifests
                .iter()
                .filter_map(|d| {
                    d.annotations
                        .get("org.opencontainers.image.ref.name")
                        .map(String::as_str)
                })
                .collect();
            return Err(fail(
                format!(
                    "{what}: no image {} in its index",
                    pinned.or(tag).unwrap_or("at all")
                ),
                format!(
                    "tags there: {}",
                    if names.is_empty() {
                        "none".into()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
        }
        _ => {
            return Err(fail(
                format!("{what}: its index holds several images"),
                "name one with a tag: oci:DIR:TAG",
            ))
        }
    };
    let bytes = blobs.blob_bytes(desc, what)?;
    manifest(blobs, &bytes, desc.digest.clone(), what)
}

/// A manifest (or an index, followed to this machine's platform) to a [`Base`].
fn manifest(blobs: &Blobs, bytes: &[u8], digest: String, what: &str) -> Result<Base, FetchError> {
    let doc: ManifestDoc = serde_json::from_slice(bytes).map_err(|e| {
        fail(
            format!("{what}: manifest: {e}"),
            "the registry or layout returned something that is not an image manifest",
        )
    })?;
    if !doc.manifests.is_empty()
        || doc.media_type.contains("index")
        || doc.media_type.contains("list")
    {
        let Some(d) = doc.manifests.iter().find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == arch())
        }) else {
            return Err(fail(
                format!("{what}: no image for linux/{}", arch()),
                "build or pull one for this machine's platform",
            ));
        };
        let inner = blobs.manifest_by_digest(d, what)?;
        return manifest(blobs, &inner, d.digest.clone(), what);
    }
    let config = doc.config.ok_or_else(|| {
        fail(
            format!("{what}: the manifest has no config"),
            "not an image manifest",
        )
    })?;
    let cfg_bytes = blobs.blob_bytes(&config, what)?;
    #[derive(Deserialize)]
    struct ConfigDoc {
        #[serde(default)]
        config: Option<RunConfig>,
    }
    let cfg: ConfigDoc = serde_json::from_slice(&cfg_bytes)
        .map_err(|e| fail(format!("{what}: image config: {e}"), "not an image config"))?;
    for l in &doc.layers {
        if !is_digest(&l.digest) {
            return Err(fail(
                format!("{what}: layer digest `{}` is not sha256", l.digest),
                "aisb verifies layers by sha256",
            ));
        }
    }
    Ok(Base {
        digest,
        config: cfg.config.unwrap_or_default(),
        layers: doc.layers,
    })
}

impl Blobs {
    fn read_file(&self, name: &str) -> io::Result<Vec<u8>> {
        match self {
            Blobs::Layout(dir) => fs::read(dir.join(name)),
            Blobs::Archive(file) => {
                let mut f = fs::File::open(file)?;
                let mut out = Vec::new();
                archive_entry(&mut f, name)?.read_to_end(&mut out)?;
                Ok(out)
            }
            Blobs::Registry(_) => Err(io::ErrorKind::Unsupported.into()),
        }
    }

    fn manifest_by_digest(&self, d: &Descriptor, what: &str) -> Result<Vec<u8>, FetchError> {
        match self {
            Blobs::Registry(r) => Ok(r.manifest(&d.digest)?.0),
            _ => self.blob_bytes(d, what),
        }
    }

    /// A manifest or config, read whole: never more than its descriptor's size, itself bounded.
    fn blob_bytes(&self, d: &Descriptor, what: &str) -> Result<Vec<u8>, FetchError> {
        let digest = d.digest.as_str();
        if d.size > MAX_JSON_BLOB {
            return Err(fail(
                format!("{what}: {digest} claims {} bytes, more than a manifest or config may have ({MAX_JSON_BLOB})", d.size),
                "the source is corrupt or hostile; nothing of it was used",
            ));
        }
        let mut out = Vec::new();
        self.open(digest, d.size, what)?
            .read_to_end(&mut out)
            .map_err(|e| {
                fail(
                    format!("{what}: reading {digest}: {e}"),
                    "is the source complete?",
                )
            })?;
        if sha256_hex(&out) != digest {
            return Err(fail(
                format!("{what}: blob {digest} does not match its digest"),
                "the source is corrupt or was tampered with; nothing of it was used",
            ));
        }
        Ok(out)
    }

    /// A reader of the blob's bytes (not verified: see [`Verified`]), cut one byte past the
    /// size its descriptor gives, so a source that sends more (forever) is stopped and caught.
    pub fn open(
        &self,
        digest: &str,
        size: u64,
        what: &str,
    ) -> Result<Box<dyn Read + '_>, FetchError> {
        Ok(Box::new(
            self.open_whole(digest, what)?.take(size.saturating_add(1)),
        ))
    }

    fn open_whole(&self, digest: &str, what: &str) -> Result<Box<dyn Read + '_>, FetchError> {
        if !is_digest(digest) {
            return Err(fail(
                format!("{what}: `{digest}` is not a sha256 digest"),
                "aisb verifies blobs by sha256",
            ));
        }
        let rel = format!("blobs/sha256/{}", &digest[7..]);
        let err = |e: io::Error| {
            fail(
                format!("{what}: cannot read blob {digest}: {e}"),
                "is the image layout complete?",
            )
        };
        match self {
            Blobs::Layout(dir) => Ok(Box::new(fs::File::open(dir.join(rel)).map_err(err)?)),
            Blobs::Archive(file) => {
                let mut f = fs::File::open(file).map_err(err)?;
                let (start, len) = archive_span(&mut f, &rel).map_err(err)?;
                f.seek(io::SeekFrom::Start(start)).map_err(err)?;
                Ok(Box::new(f.take(len)))
            }
            Blobs::Registry(r) => r.blob(digest),
        }
    }
}

/// Where `name`'s data is inside an uncompressed tar.
fn archive_span(f: &mut fs::File, name: &str) -> io::Result<(u64, u64)> {
    f.seek(io::SeekFrom::Start(0))?;
    let mut a = tar::Archive::new(f);
    for e in a.entries_with_seek()? {
        let e = e?;
        let p = e.path()?.into_owned();
        let p = p.strip_prefix("./").unwrap_or(&p);
        if p == Path::new(name) {
            return Ok((e.raw_file_position(), e.size()));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("{name} is not in the archive"),
    ))
}

fn archive_entry<'f>(f: &'f mut fs::File, name: &str) -> io::Result<io::Take<&'f mut fs::File>> {
    let (start, len) = archive_span(f, name)?;
    f.seek(io::SeekFrom::Start(start))?;
    Ok(f.take(len))
}

/// A reader that hashes and counts what passes through; [`Verified::check`] compares at the
/// end.
pub struct Verified<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
}

impl<R: Read> Verified<R> {
    pub fn new(inner: R) -> Self {
        Verified {
            inner,
            hasher: Sha256::new(),
            read: 0,
        }
    }

    /// Read to the end (a tar reader may stop before the padding), then compare the size and
    /// the digest.
    pub fn check(mut self, digest: &str, size: u64) -> io::Result<()> {
        io::copy(&mut self, &mut io::sink())?;
        if self.read != size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "blob {digest} is not the {size} bytes its manifest says (read {}{}): corrupt or tampered with",
                    self.read,
                    if self.read > size { " or more" } else { "" }
                ),
            ));
        }
        let got = format!("sha256:{}", hex::encode(self.hasher.finalize()));
        if got != digest {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "blob {digest} does not match its digest (got {got}): corrupt or tampered with"
                ),
            ));
        }
        Ok(())
    }
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// The most a manifest, index or image config may weigh (real ones are a few KiB).
const MAX_JSON_BLOB: u64 = 16 << 20;

const MANIFEST_TYPES: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// A registry's distribution API for one repository.
pub struct Registry {
    agent: ureq::Agent,
    base: String,
    what: String,
    token: RefCell<Option<String>>,
}

impl Registry {
    pub fn new(r: &Reference) -> Registry {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(std::time::Duration::from_secs(15))
            .timeout_read(std::time::Duration::from_secs(120))
            .redirects(5)
            .build();
        Registry {
            agent,
            base: r.base_url(),
            what: r.to_string(),
            token: RefCell::new(None),
        }
    }

    fn get(&self, path: &str, accept: &str) -> Result<ureq::Response, FetchError> {
        let url = format!("{}/{path}", self.base);
        for attempt in 0..2 {
            let mut req = self.agent.get(&url).set("Accept", accept);
            if let Some(t) = self.token.borrow().as_ref() {
                req = req.set("Authorization", &format!("Bearer {t}"));
            }
            match req.call() {
                Ok(resp) => return Ok(resp),
                Err(ureq::Error::Status(401, resp)) if attempt == 0 => {
                    let challenge = resp
                        .header("www-authenticate")
                        .unwrap_or_default()
                        .to_string();
                    *self.token.borrow_mut() = Some(self.token_for(&challenge)?);
                }
                Err(ureq::Error::Status(code, _)) => {
                    return Err(fail(
                        format!("{}: {url} answered {code}", self.what),
                        if code == 404 {
                            "check the name and tag (`skopeo list-tags docker://…` lists them)"
                        } else {
                            "is the registry reachable and the image public?"
                        },
                    ))
                }
                Err(e) => {
                    return Err(fail(
                        format!("{}: {e}", self.what),
                        "is the registry reachable from this machine?",
                    ))
                }
            }
        }
        Err(fail(
            format!("{}: unauthorized", self.what),
            "aisb pulls public images anonymously",
        ))
    }

    /// An anonymous token for a `Bearer realm=…,service=…,scope=…` challenge.
    fn token_for(&self, challenge: &str) -> Result<String, FetchError> {
        let params = challenge.strip_prefix("Bearer ").ok_or_else(|| {
            fail(
                format!(
                    "{}: the registry asks for credentials ({challenge})",
                    self.what
                ),
                "aisb pulls public images anonymously",
            )
        })?;
        let mut realm = String::new();
        let mut query = Vec::new();
        for part in params.split(',') {
            if let Some((k, v)) = part.trim().split_once('=') {
                let v = v.trim_matches('"').to_string();
                if k == "realm" {
                    realm = v;
                } else {
                    query.push((k.to_string(), v));
                }
            }
        }
        let mut req = self.agent.get(&realm);
        for (k, v) in &query {
            req = req.query(k, v);
        }
        let body = req
            .call()
            .map_err(|e| {
                fail(
                    format!("{}: token from {realm}: {e}", self.what),
                    "is the registry's auth service reachable?",
                )
            })?
            .into_string()
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["token"]
            .as_str()
            .or(v["access_token"].as_str())
            .map(str::to_string)
            .ok_or_else(|| {
                fail(
                    format!("{}: no token from {realm}", self.what),
                    "is the image public?",
                )
            })
    }

    /// The manifest `reference` (tag or digest) names, and its digest (verified when asked by
    /// digest, and against the registry's own header otherwise).
    pub fn manifest(&self, reference: &str) -> Result<(Vec<u8>, String), FetchError> {
        let resp = self.get(&format!("manifests/{reference}"), MANIFEST_TYPES)?;
        let header = resp.header("docker-content-digest").map(str::to_string);
        let mut bytes = Vec::new();
        resp.into_reader()
            .take(4 << 20)
            .read_to_end(&mut bytes)
            .map_err(|e| fail(format!("{}: {e}", self.what), "retry"))?;
        let digest = sha256_hex(&bytes);
        let expected = if is_digest(reference) {
            Some(reference.to_string())
        } else {
            header
        };
        if let Some(e) = expected.filter(|e| e.starts_with("sha256:")) {
            if e != digest {
                return Err(fail(
                    format!(
                        "{}: the manifest does not match its digest {e} (got {digest})",
                        self.what
                    ),
                    "the registry or something between is serving other content; nothing was used",
                ));
            }
        }
        Ok((bytes, digest))
    }

    fn blob(&self, digest: &str) -> Result<Box<dyn Read + '_>, FetchError> {
        Ok(self.get(&format!("blobs/{digest}"), "*/*")?.into_reader())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = Reference::parse("debian").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repo.as_str(), r.tag.as_deref()),
            ("docker.io", "library/debian", Some("latest"))
        );
        let r = Reference::parse("127.0.0.1:5000/team/base:1").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repo.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "team/base", Some("1"))
        );
        assert_eq!(r.base_url(), "http://127.0.0.1:5000/v2/team/base");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("ghcr.io/o/i@{d}")).unwrap();
        assert_eq!(
            (r.tag.clone(), r.digest.as_deref()),
            (None, Some(d.as_str()))
        );
        assert!(r.base_url().starts_with("https://ghcr.io/"));
        assert!(Reference::parse("x@sha256:12").is_err());
        assert!(Reference::parse("UPPER/case").is_err());
    }
}
