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
