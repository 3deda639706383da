//! A registry's distribution API: anonymous bearer tokens, redirects checked before they
//! are followed, bounded bodies.

use std::cell::RefCell;
use std::io::Read;

use serde::Deserialize;

use super::super::challenge;
use super::super::egress::Egress;
use super::reference::{is_digest, Reference};
use super::{fail, sha256_hex, FetchError};

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

    pub(super) fn blob(&self, digest: &str) -> Result<Box<dyn Read + '_>, FetchError> {
        Ok(self.get(&format!("blobs/{digest}"), "*/*")?.into_reader())
    }

    /// A request that writes to the registry (`aisb build --push`): `method` on `url` (the
    /// repository's own API, or an upload location it answered with), no redirect followed.
    /// The token goes to the registry's own origin only; any other URL is checked by
    /// [`Egress`] first. On a 401 an anonymous token for the challenge's scope (push) is asked
    /// for once.
    fn write(
        &self,
        method: &str,
        url: &url::Url,
        content_type: &str,
        body: Body<'_>,
    ) -> Result<ureq::Response, FetchError> {
        let own = url::Url::parse(&self.base).map(|b| b.origin() == url.origin());
        if own != Ok(true) {
            if let Some(why) = self.egress.refuse(url) {
                return Err(fail(
                    format!("{}: refusing the upload location {url}: {why}", self.what),
                    "the registry sent the upload elsewhere; nothing was sent there",
                ));
            }
        }
        for attempt in 0..2 {
            let mut req = self
                .agent
                .request_url(method, url)
                .set("Content-Type", content_type);
            if own == Ok(true) {
                if let Some(t) = self.token.borrow().as_ref() {
                    req = req.set("Authorization", &format!("Bearer {t}"));
                }
            }
            let sent = match body {
                Body::Empty => req.set("Content-Length", "0").call(),
                Body::Bytes(b) => req.send_bytes(b),
                Body::File(path, len) => match std::fs::File::open(path) {
                    Ok(f) => req.set("Content-Length", &len.to_string()).send(f),
                    Err(e) => {
                        return Err(fail(
                            format!("{}: {}: {e}", self.what, path.display()),
                            "the layer written for the push is gone; run the build again",
                        ))
                    }
                },
            };
            match sent {
                Ok(r) => return Ok(r),
                Err(ureq::Error::Status(401, r)) if attempt == 0 && own == Ok(true) => {
                    let challenges = r.all("www-authenticate").join(", ");
                    *self.token.borrow_mut() = Some(self.token_for(&challenges)?);
                }
                // A blob that is not there yet: the answer, not a failure.
                Err(ureq::Error::Status(404, r)) if method == "HEAD" => return Ok(r),
                Err(ureq::Error::Status(code, r)) => {
                    return Err(fail(
                        format!(
                            "{}: {method} {url} answered {code}{}",
                            self.what,
                            registry_message(r)
                        ),
                        if code == 401 || code == 403 {
                            "aisb pushes anonymously: the registry must accept anonymous pushes to this repository (a CI registry with a token service that grants push)"
                        } else {
                            "is the registry reachable and the repository name right?"
                        },
                    ))
                }
                Err(e) => {
                    return Err(fail(
                        format!("{}: {method} {url}: {e}", self.what),
                        "is the registry reachable from this machine?",
                    ))
                }
            }
        }
        Err(fail(
            format!("{}: unauthorized", self.what),
            "aisb pushes anonymously",
        ))
    }

    fn url(&self, path: &str) -> Result<url::Url, FetchError> {
        url::Url::parse(&format!("{}/{path}", self.base))
            .map_err(|e| fail(format!("{}: {e}", self.what), "check the image reference"))
    }

    /// Whether the repository already holds the blob `digest`.
    pub fn has_blob(&self, digest: &str) -> Result<bool, FetchError> {
        let r = self.write(
            "HEAD",
            &self.url(&format!("blobs/{digest}"))?,
            "*/*",
            Body::Empty,
        )?;
        Ok(r.status() == 200)
    }

    /// Upload the file `path` (`len` bytes) as the blob `digest`: POST for a session, then one
    /// PUT of the whole blob to the location the registry gave (monolithic upload).
    pub fn upload_blob(
        &self,
        digest: &str,
        path: &std::path::Path,
        len: u64,
    ) -> Result<(), FetchError> {
        let start = self.write(
            "POST",
            &self.url("blobs/uploads/")?,
            "application/octet-stream",
            Body::Empty,
        )?;
        let Some(location) = start.header("location").map(str::to_string) else {
            return Err(fail(
                format!(
                    "{}: the registry started an upload without a Location",
                    self.what
                ),
                "the registry's answer is malformed",
            ));
        };
        let mut at = self.url("blobs/uploads/")?.join(&location).map_err(|e| {
            fail(
                format!("{}: upload location `{location}`: {e}", self.what),
                "the registry's answer is malformed",
            )
        })?;
        at.query_pairs_mut().append_pair("digest", digest);
        self.write(
            "PUT",
            &at,
            "application/octet-stream",
            Body::File(path, len),
        )?;
        Ok(())
    }

    /// Put the manifest `bytes` (of `media_type`) under `tag`; the registry's digest for it
    /// must be ours.
    pub fn put_manifest(
        &self,
        tag: &str,
        bytes: &[u8],
        media_type: &str,
    ) -> Result<String, FetchError> {
        let digest = sha256_hex(bytes);
        let resp = self.write(
            "PUT",
            &self.url(&format!("manifests/{tag}"))?,
            media_type,
            Body::Bytes(bytes),
        )?;
        if let Some(theirs) = resp.header("docker-content-digest") {
            if theirs != digest {
                return Err(fail(
                    format!(
                        "{}: the registry stored the manifest as {theirs}, not {digest}",
                        self.what
                    ),
                    "the registry changed the manifest; do not use this push",
                ));
            }
        }
        Ok(digest)
    }
}

/// What a write request sends.
#[derive(Clone, Copy)]
enum Body<'a> {
    Empty,
    Bytes(&'a [u8]),
    File(&'a std::path::Path, u64),
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
