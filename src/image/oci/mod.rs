//! Base images: an OCI image layout directory, a tar archive of one, or a registry reached over
//! the distribution API (anonymous bearer tokens). Every byte is checked against its digest:
//! the manifest against the digest it was asked by (or the registry's `Docker-Content-Digest`),
//! the config and each layer against the manifest's descriptors. Manifests, indexes, configs
//! and descriptors are `oci_spec::image`'s types (Docker's v2 manifest and manifest list have
//! the same shape); only sha256 digests are followed.
//!
//! `reference` parses image names, `manifest` reads the documents, `blobs` reads and verifies
//! content from a layout, an archive or a registry, `registry` speaks the distribution API;
//! this file resolves a source to its [`Base`].

mod blobs;
mod manifest;
pub mod reference;
mod registry;

use oci_spec::image::{Descriptor, ImageIndex};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Source;
pub use blobs::{Blobs, Verified};
use manifest::arch;
pub use manifest::{parse_config, parse_document, pick_platform, Document, RunConfig};
pub use reference::{is_digest, sha256_hex_of, Reference, ReferenceError};
pub use registry::Registry;

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

#[cfg(test)]
mod tests;
