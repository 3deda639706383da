//! Base images: an OCI image layout directory, a tar archive of one, or a registry reached over
//! the distribution API (anonymous bearer tokens). Every byte is checked against its digest:
//! the manifest against the digest it was asked by (or the registry's `Docker-Content-Digest`),
//! the config and each layer against the manifest's descriptors. Manifests, indexes, configs
//! and descriptors are `oci_spec::image`'s types (Docker's v2 manifest and manifest list have
//! the same shape); only sha256 digests are followed.

use std::cell::RefCell;
use std::fs;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};

use oci_spec::image::{Arch, Descriptor, ImageConfiguration, ImageIndex, ImageManifest, Os};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::challenge;
use super::egress::Egress;
pub use super::reference::{is_digest, sha256_hex_of, Reference, ReferenceError};
use super::Source;

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

/// The hex digits of a descriptor's digest, when it is the sha256 digest aisb can verify.
pub fn descriptor_hex(d: &Descriptor) -> Option<&str> {
    sha256_hex_of(d.digest().as_ref())
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

/// A resolved base: its manifest's digest, config and layers (every layer's digest sha256).
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct Base {
    pub digest: String,
    pub config: RunConfig,
    pub layers: Vec<Descriptor>,
}

impl Base {
    /// Only a base that aisb could have made: a sha256 manifest digest and sha256 layers (a
    /// record read back from the store is checked again).
    pub fn is_valid(&self) -> bool {
        is_digest(&self.digest) && self.layers.iter().all(|l| descriptor_hex(l).is_some())
    }
}

/// A manifest blob: an index (or Docker manifest list) of manifests, or one image's manifest.
#[derive(Debug, Clone)]
pub enum Document {
    Index(Box<ImageIndex>),
    Manifest(Box<ImageManifest>),
}

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const MANIFEST_TYPES: [&str; 2] = [
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// What `bytes` are, by their media type, or by their shape when they name none (the OCI
/// spec makes `mediaType` optional).
pub fn parse_document(bytes: &[u8]) -> Result<Document, String> {
    #[derive(Deserialize)]
    struct Kind {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        manifests: Option<serde::de::IgnoredAny>,
        config: Option<serde::de::IgnoredAny>,
    }
    let kind: Kind = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let index = match kind.media_type.as_deref() {
        Some(t) if INDEX_TYPES.contains(&t) => true,
        Some(t) if MANIFEST_TYPES.contains(&t) => false,
        t => match (&kind.manifests, &kind.config) {
            (Some(_), None) => true,
            (None, Some(_)) => false,
            _ => {
                return Err(format!(
                    "neither an image index nor an image manifest (media type {})",
                    t.unwrap_or("not given")
                ))
            }
        },
    };
    if index {
        serde_json::from_slice(bytes)
            .map(|i| Document::Index(Box::new(i)))
            .map_err(|e| format!("image index: {e}"))
    } else {
        serde_json::from_slice(bytes)
            .map(|m| Document::Manifest(Box::new(m)))
            .map_err(|e| format!("image manifest: {e}"))
    }
}

/// The parts of an image config that aisb uses.
pub fn parse_config(bytes: &[u8]) -> Result<RunConfig, String> {
    let c: ImageConfiguration = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    Ok(c.config()
        .as_ref()
        .map(|c| RunConfig {
            env: c.env().clone(),
            working_dir: c.working_dir().clone(),
            user: c.user().clone(),
        })
        .unwrap_or_default())
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
        "arm" => "arm",
        a => a,
    }
}

/// The CPU variants this machine runs (`None`: the entry names none), best first.
fn variants() -> &'static [Option<&'static str>] {
    match arch() {
        "amd64" => &[None, Some("v1")],
        "arm64" => &[Some("v8"), None],
        "arm" => &[Some("v7"), Some("v6"), Some("v5"), None],
        _ => &[None],
    }
}

/// The index entry for this machine: linux, its architecture, the best CPU variant it runs.
pub fn pick_platform(index: &ImageIndex) -> Option<&Descriptor> {
    let this_arch = Arch::from(arch());
    let candidates: Vec<&Descriptor> = index
        .manifests()
        .iter()
        .filter(|d| {
            d.platform()
                .as_ref()
                .is_some_and(|p| p.os() == &Os::Linux && p.architecture() == &this_arch)
        })
        .collect();
    variants().iter().find_map(|want| {
        candidates
            .iter()
            .copied()
            .find(|d| d.platform().as_ref().and_then(|p| p.variant().as_deref()) == *want)
    })
}

/// How many image indexes may stand above a manifest (an index of indexes is rare; a
/// registry cannot keep aisb following them).
const MAX_INDEX_DEPTH: usize = 2;

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
                Some(d) if r.digest.is_none() => {
                    if !is_digest(d) {
                        return Err(fail(
                            format!("{r}: the pin `{d}` is not a sha256 digest"),
                            "sandbox.lock pins bases by digest; delete the entry to resolve the tag again",
                        ));
                    }
                    r.pinned(d)
                }
                _ => r.clone(),
            };
            let reg = Registry::new(&r);
            let (bytes, digest) = reg.manifest(&manifest_reference(&r))?;
            let blobs = Blobs::Registry(reg);
            let base = manifest(&blobs, &bytes, digest, &r.to_string(), 0)?;
            Ok((base, blobs))
        }
    }
}

/// What a manifest is asked by: the digest when there is one, else the tag.
fn manifest_reference(r: &Reference) -> String {
    r.digest
        .clone()
        .or(r.tag.clone())
        .unwrap_or_else(|| "latest".into())
}

/// Ask the registry (never a lock file or cache) which digest `r`'s tag points at now.
pub fn current_digest(r: &Reference) -> Result<String, FetchError> {
    Ok(Registry::new(r).manifest(&manifest_reference(r))?.1)
}

fn from_index(
    blobs: &Blobs,
    tag: Option<&str>,
    pinned: Option<&str>,
    what: &str,
) -> Result<Base, FetchError> {
    const REF_NAME: &str = "org.opencontainers.image.ref.name";
    let index = blobs.read_file("index.json").map_err(|e| {
        fail(format!("{what}: cannot read index.json: {e}"), "an OCI image layout has oci-layout, index.json and blobs/ (`skopeo copy … oci:DIR:TAG` writes one)")
    })?;
    let doc: ImageIndex = serde_json::from_slice(&index).map_err(|e| {
        fail(
            format!("{what}: index.json: {e}"),
            "is this an OCI image layout?",
        )
    })?;
    let ref_name = |d: &Descriptor| -> Option<String> {
        d.annotations()
            .as_ref()
            .and_then(|a| a.get(REF_NAME).cloned())
    };
    let wanted: Vec<&Descriptor> = doc
        .manifests()
        .iter()
        .filter(|d| match (pinned, tag) {
            (Some(p), _) => d.digest().as_ref() == p,
            (None, Some(t)) => ref_name(d).is_some_and(|n| n == t),
            (None, None) => true,
        })
        .collect();
    let desc = match wanted.as_slice() {
        [d] => *d,
        [] => {
            let names: Vec<String> = doc.manifests().iter().filter_map(ref_name).collect();
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
    manifest(blobs, &bytes, desc.digest().to_string(), what, 0)
}

/// A manifest (or an index, followed to this machine's platform, `depth` indexes down so far)
/// to a [`Base`].
fn manifest(
    blobs: &Blobs,
    bytes: &[u8],
    digest: String,
    what: &str,
    depth: usize,
) -> Result<Base, FetchError> {
    let doc = parse_document(bytes).map_err(|e| {
        fail(
            format!("{what}: manifest {digest}: {e}"),
            "the registry or layout returned something that is not an image manifest",
        )
    })?;
    let m = match doc {
        Document::Index(index) => {
            if depth >= MAX_INDEX_DEPTH {
                return Err(fail(
                    format!("{what}: image indexes nested more than {MAX_INDEX_DEPTH} deep"),
                    "an index names manifests (or, rarely, one more index); the source is corrupt or hostile",
                ));
            }
            let Some(d) = pick_platform(&index) else {
                return Err(fail(
                    format!("{what}: no image for linux/{}", arch()),
                    "build or pull one for this machine's platform",
                ));
            };
            check_sha256(d, what)?;
            let inner = blobs.manifest_by_digest(d, what)?;
            return manifest(blobs, &inner, d.digest().to_string(), what, depth + 1);
        }
        Document::Manifest(m) => m,
    };
    check_sha256(m.config(), what)?;
    let cfg_bytes = blobs.blob_bytes(m.config(), what)?;
    let config = parse_config(&cfg_bytes)
        .map_err(|e| fail(format!("{what}: image config: {e}"), "not an image config"))?;
    for l in m.layers() {
        check_sha256(l, what)?;
    }
    Ok(Base {
        digest,
        config,
        layers: m.layers().clone(),
    })
}

fn check_sha256(d: &Descriptor, what: &str) -> Result<(), FetchError> {
    match descriptor_hex(d) {
        Some(_) => Ok(()),
        None => Err(fail(
            format!("{what}: the digest `{}` is not sha256", d.digest()),
            "aisb verifies images by sha256",
        )),
    }
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
            Blobs::Registry(r) => Ok(r.manifest(d.digest().as_ref())?.0),
            _ => self.blob_bytes(d, what),
        }
    }

    /// A manifest or config, read whole: never more than its descriptor's size, itself bounded.
    fn blob_bytes(&self, d: &Descriptor, what: &str) -> Result<Vec<u8>, FetchError> {
        let digest: &str = d.digest().as_ref();
        if d.size() > MAX_JSON_BLOB {
            return Err(fail(
                format!("{what}: {digest} claims {} bytes, more than a manifest or config may have ({MAX_JSON_BLOB})", d.size()),
                "the source is corrupt or hostile; nothing of it was used",
            ));
        }
        let mut out = Vec::new();
        self.open(digest, d.size(), what)?
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
        let Some(hex) = sha256_hex_of(digest) else {
            return Err(fail(
                format!("{what}: `{digest}` is not a sha256 digest"),
                "aisb verifies blobs by sha256",
            ));
        };
        let rel = format!("blobs/sha256/{hex}");
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
/// The most a token answer or a registry's error body is read.
const MAX_SMALL_BODY: u64 = 1 << 20;
/// Redirects followed for one request (a blob goes to a CDN, rarely further).
const MAX_REDIRECTS: usize = 5;

const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";

/// A registry's distribution API for one repository. Every URL it is sent to besides its own
/// (token realm, redirects) is checked by [`Egress`] before the request, and every address
/// connected to as it is made.
pub struct Registry {
    agent: ureq::Agent,
    base: String,
    what: String,
    egress: Egress,
    token: RefCell<Option<String>>,
}

/// How one request (with its redirects) went.
enum Answer {
    Ok(Box<ureq::Response>),
    Status(u16, Box<ureq::Response>),
    Failed(String),
}

impl Registry {
    pub fn new(r: &Reference) -> Registry {
        let egress = Egress::for_registry(r);
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(std::time::Duration::from_secs(15))
            .timeout_read(std::time::Duration::from_secs(120))
            // Followed by `call`, each target checked first.
            .redirects(0)
            .resolver(egress.clone())
            .build();
        Registry {
            agent,
            base: r.base_url(),
            what: r.to_string(),
            egress,
            token: RefCell::new(None),
        }
    }

    /// GET `url`, following redirects that [`Egress`] allows. The token (`with_token`) goes to
    /// the registry's own URL only, never along a redirect.
    fn call(&self, url: &str, accept: &str, with_token: bool) -> Answer {
        let mut at = match url::Url::parse(url) {
            Ok(u) => u,
            Err(e) => return Answer::Failed(format!("{url}: {e}")),
        };
        for hop in 0..=MAX_REDIRECTS {
            let mut req = self.agent.request_url("GET", &at).set("Accept", accept);
            if hop == 0 && with_token {
                if let Some(t) = self.token.borrow().as_ref() {
                    req = req.set("Authorization", &format!("Bearer {t}"));
                }
            }
            let resp = match req.call() {
                Ok(r) => r,
                Err(ureq::Error::Status(code, r)) => return Answer::Status(code, Box::new(r)),
                Err(e) => return Answer::Failed(e.to_string()),
            };
            if !(300..400).contains(&resp.status()) {
                return Answer::Ok(Box::new(resp));
            }
            let Some(location) = resp.header("location") else {
                return Answer::Failed(format!(
                    "{at} answered {} without a Location",
                    resp.status()
                ));
            };
            let next = match at.join(location) {
                Ok(n) => n,
                Err(e) => return Answer::Failed(format!("{at} redirects to `{location}`: {e}")),
            };
            if let Some(why) = self.egress.refuse(&next) {
                return Answer::Failed(format!("refusing the redirect from {at}: {why}"));
            }
            at = next;
        }
        Answer::Failed(format!("{url}: more than {MAX_REDIRECTS} redirects"))
    }

    fn get(&self, path: &str, accept: &str) -> Result<ureq::Response, FetchError> {
        let url = format!("{}/{path}", self.base);
        for attempt in 0..2 {
            match self.call(&url, accept, true) {
                Answer::Ok(resp) => return Ok(*resp),
                Answer::Status(401, resp) if attempt == 0 => {
                    let challenges = resp.all("www-authenticate").join(", ");
                    *self.token.borrow_mut() = Some(self.token_for(&challenges)?);
                }
                Answer::Status(code, resp) => {
                    return Err(fail(
                        format!(
                            "{}: {url} answered {code}{}",
                            self.what,
                            registry_message(*resp)
                        ),
                        if code == 404 {
                            "check the name and tag (`skopeo list-tags docker://…` lists them)"
                        } else {
                            "is the registry reachable and the image public?"
                        },
                    ))
                }
                Answer::Failed(e) => {
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

    /// An anonymous token for the `Bearer` challenge among `header`'s (`realm`, `service`,
    /// `scope`). The realm is checked by [`Egress`] before it is asked.
    fn token_for(&self, header: &str) -> Result<String, FetchError> {
        let challenges = challenge::parse(header).map_err(|e| {
            fail(
                format!("{}: {e}", self.what),
                "the registry's answer is malformed; nothing was requested on its behalf",
            )
        })?;
        let Some(bearer) = challenges.iter().find(|c| c.scheme == "bearer") else {
            return Err(fail(
                format!(
                    "{}: the registry asks for credentials ({})",
                    self.what,
                    if header.is_empty() {
                        "no challenge"
                    } else {
                        header
                    }
                ),
                "aisb pulls public images anonymously",
            ));
        };
        let Some(realm) = bearer.param("realm") else {
            return Err(fail(
                format!(
                    "{}: the registry's Bearer challenge names no realm",
                    self.what
                ),
                "the registry's answer is malformed",
            ));
        };
        let mut url = url::Url::parse(realm).map_err(|e| {
            fail(
                format!("{}: the token realm `{realm}` is not a URL: {e}", self.what),
                "the registry's answer is malformed",
            )
        })?;
        if let Some(why) = self.egress.refuse(&url) {
            return Err(fail(
                format!("{}: refusing the token realm: {why}", self.what),
                "a registry's token service must be https on a public address (or the loopback registry named in FROM itself); nothing was requested there",
            ));
        }
        {
            let mut q = url.query_pairs_mut();
            if let Some(service) = bearer.param("service") {
                q.append_pair("service", service);
            }
            // Several scopes are separated by spaces; each is its own query parameter.
            for scope in bearer.param("scope").unwrap_or("").split(' ') {
                if !scope.is_empty() {
                    q.append_pair("scope", scope);
                }
            }
        }
        // Never with the registry's current token: a new one is asked for anonymously.
        let resp = match self.call(url.as_str(), "application/json", false) {
            Answer::Ok(r) => *r,
            Answer::Status(code, _) => {
                return Err(fail(
                    format!("{}: the token service {realm} answered {code}", self.what),
                    "is the image public?",
                ))
            }
            Answer::Failed(e) => {
                return Err(fail(
                    format!("{}: token from {realm}: {e}", self.what),
                    "is the registry's auth service reachable?",
                ))
            }
        };
        let mut body = Vec::new();
        let _ = resp
            .into_reader()
            .take(MAX_SMALL_BODY)
            .read_to_end(&mut body);
        #[derive(Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: Option<TokenAnswer> = serde_json::from_slice(&body).ok();
        answer
            .and_then(|a| a.token.or(a.access_token))
            // It goes into a header line: visible ASCII only.
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
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
        let resp = self.get(&format!("manifests/{reference}"), MANIFEST_ACCEPT)?;
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

/// The distribution API's error body (`{"errors":[{"code":…,"message":…}]}`) as
/// `: CODE message`, or nothing when the body is not one.
fn registry_message(resp: ureq::Response) -> String {
    let mut body = Vec::new();
    let _ = resp
        .into_reader()
        .take(MAX_SMALL_BODY)
        .read_to_end(&mut body);
    let Ok(e) = serde_json::from_slice::<oci_spec::distribution::ErrorResponse>(&body) else {
        return String::new();
    };
    let parts: Vec<String> = e
        .detail()
        .iter()
        .map(|i| {
            let text = format!("{} {}", i.code(), i.message().as_deref().unwrap_or(""));
            // Shown on a terminal: no control characters from the registry.
            let text: String = text.chars().filter(|c| !c.is_control()).take(200).collect();
            text.trim_end().to_string()
        })
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
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
        assert!(Reference::parse("upper/Case").is_err());
        // An uppercase first component is a registry's name (as Docker reads it).
        assert_eq!(Reference::parse("UPPER/case").unwrap().registry, "UPPER");
    }

    /// Plain HTTP is for a registry on this machine only: the name must be loopback exactly,
    /// not merely start like one.
    #[test]
    fn only_an_exactly_loopback_registry_gets_plain_http() {
        for local in [
            "localhost/x",
            "localhost:5000/x",
            "127.0.0.1/x",
            "127.1.2.3:80/x",
            "[::1]/x",
            "[::1]:5000/x",
        ] {
            let r = Reference::parse(local).unwrap();
            assert!(
                r.base_url().starts_with("http://"),
                "{local}: {}",
                r.base_url()
            );
        }
        for remote in [
            "localhost.evil.com/x",
            "localhost.evil.com:5000/x",
            "localhostx:5000/x",
            "127.0.0.1.nip.io/x",
            "127.evil.com/x",
            "[::1].evil.com/x",
        ] {
            match Reference::parse(remote) {
                Ok(r) => assert!(
                    r.base_url().starts_with("https://"),
                    "{remote}: {}",
                    r.base_url()
                ),
                Err(e) => assert!(remote.starts_with('['), "{remote}: {e}"),
            }
        }
    }

    /// Docker Hub's official images live under `library/`, whichever of its names is written.
    #[test]
    fn docker_hub_names_of_one_component_are_library_images() {
        for name in [
            "debian",
            "docker.io/debian",
            "index.docker.io/debian",
            "registry-1.docker.io/debian",
            "docker.io/library/debian",
        ] {
            let r = Reference::parse(name).unwrap();
            assert_eq!(
                (r.registry.as_str(), r.repo.as_str()),
                ("docker.io", "library/debian"),
                "{name}"
            );
            assert_eq!(
                r.base_url(),
                "https://registry-1.docker.io/v2/library/debian",
                "{name}"
            );
        }
        let r = Reference::parse("docker.io/team/tool:1").unwrap();
        assert_eq!(r.repo, "team/tool");
        // Compared exactly, as Docker does: another spelling is another registry's name.
        assert_eq!(
            Reference::parse("Docker.io/x").unwrap().registry,
            "Docker.io"
        );
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/image_reference.rs`): a reference prints as text
    /// that parses back to it, the length limit included.
    #[test]
    fn a_reference_parses_back_from_its_printed_form() {
        for text in [
            format!("{}/x", "a".repeat(240)),
            "a".repeat(240),
            "dockerSio/l:12".to_string(),
            "[::1]:5000/a".into(),
        ] {
            let r = Reference::parse(&text).unwrap();
            assert_eq!(Reference::parse(&r.to_string()), Ok(r), "{text}");
        }
    }

    /// Whatever a reference says ends up in a URL path: only the grammar's characters get
    /// there.
    #[test]
    fn references_outside_the_distribution_grammar_are_refused() {
        let hex = "a".repeat(64);
        for bad in [
            "x:a?b".to_string(),
            "x:a#b".into(),
            "x:a/../../b".into(),
            "x:".into(),
            "x:-a".into(),
            format!("x:{}", "a".repeat(129)),
            "x:tä".into(),
            "a//b".into(),
            "a/-b".into(),
            "a/b-".into(),
            "a..b".into(),
            "a___b".into(),
            "/a".into(),
            "a/".into(),
            "".into(),
            "ex ample.com/a".into(),
            "-bad.com/a".into(),
            "example.com:port/a".into(),
            format!("x@sha256:{}", hex.to_uppercase()),
            format!("x@sha256:{}", &hex[1..]),
            format!("x@sha512:{}", "a".repeat(128)),
            format!("x@{hex}"),
            format!("x@sha256:{hex}@sha256:{hex}"),
            format!("{}/x", "a".repeat(300)),
            format!("x/{}", "a".repeat(256)),
        ] {
            assert!(Reference::parse(&bad).is_err(), "`{bad}` was accepted");
        }
        for good in [
            "a__b/c.d/e-f/g---h:W_1.x-2",
            "my.registry.example:5000/a/b@sha256:AAAA",
            "Registry.Example/a",
        ] {
            let good = good.replace("AAAA", &hex);
            assert!(Reference::parse(&good).is_ok(), "`{good}` was refused");
        }
        let r = Reference::parse(&format!("h.io/a:t@sha256:{hex}")).unwrap();
        assert_eq!(
            (r.tag.as_deref(), r.digest.clone()),
            (Some("t"), Some(format!("sha256:{hex}")))
        );
    }

    /// The entry for this machine: linux, its architecture, a CPU variant it runs (an index
    /// lists arm64/v8 beside amd64, and attestations as unknown/unknown).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn an_index_entry_is_chosen_by_os_architecture_and_variant() {
        let entry = |os: &str, arch: &str, variant: Option<&str>, n: char| {
            let mut p = serde_json::json!({"os": os, "architecture": arch});
            if let Some(v) = variant {
                p["variant"] = v.into();
            }
            serde_json::json!({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{}", n.to_string().repeat(64)), "size": 1, "platform": p})
        };
        let index = |entries: Vec<serde_json::Value>| -> ImageIndex {
            serde_json::from_value(serde_json::json!({"schemaVersion": 2, "manifests": entries}))
                .unwrap()
        };
        let chosen = |i: &ImageIndex| pick_platform(i).map(|d| d.digest().to_string());
        let i = index(vec![
            entry("unknown", "unknown", None, '0'),
            entry("linux", "arm64", Some("v8"), '1'),
            entry("linux", "amd64", Some("v3"), '2'),
            entry("windows", "amd64", None, '3'),
            entry("linux", "amd64", None, '4'),
        ]);
        assert_eq!(chosen(&i), Some(format!("sha256:{}", "4".repeat(64))));
        let i = index(vec![entry("linux", "amd64", Some("v1"), '5')]);
        assert_eq!(chosen(&i), Some(format!("sha256:{}", "5".repeat(64))));
        // A CPU level this machine may not have is not taken for it.
        let i = index(vec![entry("linux", "amd64", Some("v3"), '6')]);
        assert_eq!(chosen(&i), None);
    }

    /// Manifests, indexes and configs are the spec's types: what a registry sends that is
    /// neither, or lacks what the spec requires, is an error, never a guess.
    #[test]
    fn documents_are_told_apart_by_media_type_or_shape() {
        let d = format!("sha256:{}", "a".repeat(64));
        let desc = serde_json::json!({"mediaType": "application/vnd.oci.image.config.v1+json", "digest": d, "size": 2});
        let manifest = serde_json::json!({"schemaVersion": 2, "config": desc, "layers": [desc]});
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [desc]});
        let bytes = |v: &serde_json::Value| serde_json::to_vec(v).unwrap();
        assert!(matches!(
            parse_document(&bytes(&manifest)),
            Ok(Document::Manifest(_))
        ));
        assert!(matches!(
            parse_document(&bytes(&index)),
            Ok(Document::Index(_))
        ));
        let mut docker_list = index.clone();
        docker_list["mediaType"] =
            "application/vnd.docker.distribution.manifest.list.v2+json".into();
        assert!(matches!(
            parse_document(&bytes(&docker_list)),
            Ok(Document::Index(_))
        ));
        let mut mislabelled = manifest.clone();
        mislabelled["mediaType"] = "application/vnd.oci.image.index.v1+json".into();
        for bad in [
            mislabelled,
            serde_json::json!({"schemaVersion": 1, "fsLayers": []}),
            serde_json::json!({"schemaVersion": 2, "config": desc, "layers": [{"digest": d}]}),
            serde_json::json!({"schemaVersion": 2, "config": desc, "layers": [], "manifests": []}),
            serde_json::json!({"schemaVersion": 2, "manifests": [{"mediaType": "x", "digest": "sha256:é", "size": 1}]}),
        ] {
            assert!(parse_document(&bytes(&bad)).is_err(), "{bad}");
        }
        assert!(parse_config(br#"{"config": {"Env": ["A=1"]}}"#).is_err());
        let c = parse_config(br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{"Env":["A=1"],"User":"u","WorkingDir":"/w","ExposedPorts":{"80/tcp":{}}}}"#).unwrap();
        assert_eq!(
            c,
            RunConfig {
                env: Some(vec!["A=1".into()]),
                working_dir: Some("/w".into()),
                user: Some("u".into())
            }
        );
    }

    /// An index's manifests may be indexes again, twice at most: a registry cannot keep aisb
    /// following them.
    #[test]
    fn an_index_nested_deeper_than_two_levels_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let ok = nested_layout(&t.path().join("two"), 2);
        let r = resolve(
            &Source::Layout {
                dir: ok.clone(),
                tag: None,
            },
            None,
        );
        assert!(r.is_ok(), "two nested indexes: {:?}", r.err());
        let deep = nested_layout(&t.path().join("three"), 3);
        let r = resolve(
            &Source::Layout {
                dir: deep,
                tag: None,
            },
            None,
        );
        let e = r.err().expect("three nested indexes were followed");
        assert!(e.what.contains("nested"), "{e}");
    }

    /// An OCI layout whose index.json names an image index that nests `depth` indexes in all
    /// above one manifest (no layers).
    fn nested_layout(dir: &Path, depth: usize) -> PathBuf {
        let blobs = dir.join("blobs/sha256");
        fs::create_dir_all(&blobs).unwrap();
        let put = |v: serde_json::Value| -> serde_json::Value {
            let b = serde_json::to_vec(&v).unwrap();
            let d = sha256_hex(&b);
            fs::write(blobs.join(&d[7..]), &b).unwrap();
            let media = if v.get("manifests").is_some() {
                "application/vnd.oci.image.index.v1+json"
            } else if v.get("layers").is_some() {
                "application/vnd.oci.image.manifest.v1+json"
            } else {
                "application/vnd.oci.image.config.v1+json"
            };
            serde_json::json!({"mediaType": media, "digest": d, "size": b.len(),
                "platform": {"os": "linux", "architecture": arch()}})
        };
        let config = put(serde_json::json!({"architecture": arch(), "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []}, "config": {"Env": ["A=1"]}}));
        let mut top = put(serde_json::json!({"schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config, "layers": []}));
        for _ in 0..depth {
            top = put(serde_json::json!({"schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [top]}));
        }
        fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        fs::write(
            dir.join("index.json"),
            serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": [top]}))
                .unwrap(),
        )
        .unwrap();
        dir.to_path_buf()
    }

    /// A loopback HTTP server for registry tests: answers each request with `answer(head)`
    /// (the request line and headers), records every head, and stops when dropped or after
    /// 30 s, whichever comes first.
    struct Loopback {
        port: u16,
        seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Loopback {
        fn start(answer: impl Fn(&str) -> String + Send + 'static) -> Loopback {
            use std::io::Write;
            use std::sync::atomic::Ordering;
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.set_nonblocking(true).unwrap();
            let port = listener.local_addr().unwrap().port();
            let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (seen2, stop2) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while !stop2.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                    let Ok((mut s, _)) = listener.accept() else {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        continue;
                    };
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
                        match s.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => break,
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let reply = answer(&head);
                    seen2.lock().unwrap().push(head);
                    let _ = s.write_all(reply.as_bytes());
                }
            });
            Loopback { port, seen, stop }
        }

        fn seen(&self) -> Vec<String> {
            self.seen.lock().unwrap().clone()
        }
    }

    impl Drop for Loopback {
        fn drop(&mut self) {
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn http(status: &str, headers: &[(&str, &str)], body: &str) -> String {
        let mut r = format!(
            "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            r.push_str(&format!("{k}: {v}\r\n"));
        }
        r.push_str("\r\n");
        r.push_str(body);
        r
    }

    /// A registry on 127.0.0.1 that asks for a token at `realm` (its `{self}` replaced by its
    /// own address) and serves `manifest` to a request carrying that token.
    fn token_registry(realm: &str, manifest: &'static str) -> Loopback {
        let realm = realm.to_string();
        let own = std::sync::Arc::new(std::sync::OnceLock::<u16>::new());
        let own2 = own.clone();
        let reg = Loopback::start(move |head| {
            let me = format!("127.0.0.1:{}", own2.get().copied().unwrap_or(0));
            let challenge = format!(
                "Bearer realm=\"{}\",service=\"svc\",scope=\"repository:a:pull,push\"",
                realm.replace("{self}", &me)
            );
            if head.starts_with("GET /token") {
                http("200 OK", &[], r#"{"token":"T0K"}"#)
            } else if head.contains("Bearer T0K") {
                http(
                    "200 OK",
                    &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
                    manifest,
                )
            } else {
                http("401 Unauthorized", &[("WWW-Authenticate", &challenge)], "")
            }
        });
        own.set(reg.port).unwrap();
        reg
    }

    /// A hostile registry's realm must not make aisb request another service on this machine:
    /// the other port never sees a connection.
    #[test]
    fn a_realm_on_another_loopback_port_is_refused_before_connecting() {
        let other = Loopback::start(|_| http("200 OK", &[], r#"{"token":"T0K"}"#));
        for realm in [
            format!("http://127.0.0.1:{}/token", other.port),
            format!("https://127.0.0.1:{}/token", other.port),
            format!("http://localhost:{}/token", other.port),
        ] {
            let reg = token_registry(&realm, "{}");
            let r = Reference::parse(&format!("127.0.0.1:{}/a:1", reg.port)).unwrap();
            let got = Registry::new(&r).manifest("1");
            let e = got
                .err()
                .unwrap_or_else(|| panic!("{realm}: a token was fetched"));
            assert!(e.what.contains("realm"), "{realm}: {e}");
            assert_eq!(other.seen(), Vec::<String>::new(), "{realm}: {e}");
        }
    }

    /// The cloud metadata service (or any internal address) as a realm is refused by looking
    /// at the URL: no connection is tried.
    #[test]
    fn a_realm_at_the_metadata_service_is_refused_without_a_request() {
        for realm in [
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
            "https://169.254.169.254/token",
            "https://[::ffff:169.254.169.254]/token",
            "https://[fd00:ec2::254]/token",
            "https://10.0.0.1/token",
            "file:///etc/passwd",
        ] {
            let reg = token_registry(realm, "{}");
            let r = Reference::parse(&format!("127.0.0.1:{}/a:1", reg.port)).unwrap();
            let e = Registry::new(&r).manifest("1").unwrap_err();
            assert!(e.what.contains("refusing the token realm"), "{realm}: {e}");
            // One request to the registry itself, none for a token.
            assert_eq!(reg.seen().len(), 1, "{realm}");
        }
    }

    /// A redirect is checked like a realm: a registry cannot bounce aisb to another port.
    #[test]
    fn a_redirect_to_another_loopback_port_is_refused_before_connecting() {
        let other = Loopback::start(|_| http("200 OK", &[], "{}"));
        let to = format!("http://127.0.0.1:{}/v2/a/manifests/1", other.port);
        let reg =
            Loopback::start(move |_| http("307 Temporary Redirect", &[("Location", &to)], ""));
        let r = Reference::parse(&format!("127.0.0.1:{}/a:1", reg.port)).unwrap();
        let e = Registry::new(&r).manifest("1").unwrap_err();
        assert!(e.what.contains("refusing the redirect"), "{e}");
        assert_eq!(other.seen(), Vec::<String>::new());
        // To its own authority, a redirect is followed.
        let own = Loopback::start(|head| {
            if head.starts_with("GET /v2/a/manifests/1 ") {
                http("302 Found", &[("Location", "/elsewhere")], "")
            } else {
                http("200 OK", &[], "moved")
            }
        });
        let r = Reference::parse(&format!("127.0.0.1:{}/a:1", own.port)).unwrap();
        assert_eq!(Registry::new(&r).manifest("1").unwrap().0, b"moved");
    }

    /// `scope="repository:a:pull,push"` is one parameter: its comma is inside quotes.
    #[test]
    fn a_quoted_comma_in_the_challenge_stays_in_the_scope() {
        let manifest = r#"{"schemaVersion":2}"#;
        let reg = token_registry("http://{self}/token", manifest);
        let r = Reference::parse(&format!("127.0.0.1:{}/a:1", reg.port)).unwrap();
        let (bytes, _) = Registry::new(&r).manifest("1").unwrap();
        assert_eq!(bytes, manifest.as_bytes());
        let token_request = reg
            .seen()
            .into_iter()
            .find(|h| h.starts_with("GET /token"))
            .unwrap();
        let line = token_request.lines().next().unwrap();
        assert!(
            line.contains("scope=repository%3Aa%3Apull%2Cpush") && line.contains("service=svc"),
            "{line}"
        );
    }
}
